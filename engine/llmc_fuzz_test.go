package engine

import (
	"bytes"
	"encoding/binary"
	"errors"
	"github.com/gptui/gptui/arch"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gptui/gptui/internal/allocbound"
)

// FuzzLoadLLMC feeds arbitrary bytes to the llm.c model file reader. It
// must not panic, every error must be a one-line *FormatError, and it must
// never allocate more than allocbound.Limit of the file's size: a header
// whose shape the file cannot hold is refused before the model is
// allocated. The nil backend allocates with make, which the measure counts.
func FuzzLoadLLMC(f *testing.F) {
	small := ModelConfig{Shape: arch.Shape{MaxT: 8, V: 10, Vp: 128, L: 2, NH: 2, C: 8, F: 32}}
	m, err := NewModel(nil, small, 0.02, 1)
	if err != nil {
		f.Fatal(err)
	}
	path := filepath.Join(f.TempDir(), "model.bin")
	if err := m.SaveLLMC(path); err != nil {
		f.Fatal(err)
	}
	good, err := os.ReadFile(path)
	if err != nil {
		f.Fatal(err)
	}
	// header returns good with header ints i set to v.
	header := func(kv ...int32) []byte {
		b := bytes.Clone(good)
		for i := 0; i < len(kv); i += 2 {
			binary.LittleEndian.PutUint32(b[4*kv[i]:], uint32(kv[i+1]))
		}
		return b
	}
	f.Add(good)
	f.Add(header(6, 262144))            // C = 262144: 1.1e12 parameters
	f.Add(header(6, 2048, 4, 8))        // 400M parameters in a 20 KB file
	f.Add(header(4, 1000000000))        // L = 1e9
	f.Add(header(2, 1<<30))             // maxT = 2^30
	f.Add(header(3, 65536, 7, 1<<31-1)) // Vp = 2^31-1
	f.Add(header(6, -8))
	f.Add(good[:100])
	f.Add(good[:len(good)-4])
	f.Fuzz(func(t *testing.T, b []byte) {
		var err error
		used := allocbound.Measure(func() {
			_, err = loadLLMC(nil, "model.bin", bytes.NewReader(b), int64(len(b)), ModelConfig{}, 1)
		})
		if limit := allocbound.Limit(len(b)); used > limit {
			t.Errorf("allocated %d bytes for a %d-byte file (limit %d); error %v", used, len(b), limit, err)
		}
		if err == nil {
			return
		}
		var fe *FormatError
		if !errors.As(err, &fe) || fe.File != "model.bin" || strings.Contains(err.Error(), "\n") {
			t.Errorf("error %q (%T) is not a one-line FormatError naming the file", err, err)
		}
	})
}

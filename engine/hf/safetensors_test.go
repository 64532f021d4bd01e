package hf

import (
	"encoding/binary"
	"math"
	"path/filepath"
	"testing"
)

func TestHeaderPadding(t *testing.T) {
	for _, name := range []string{"a", "ab", "abc", "abcd", "abcde", "abcdef", "abcdefg", "abcdefgh"} {
		hdr, err := encodeHeader([]stHeader{{Name: name, Dtype: "F32", Shape: []int{2}}})
		if err != nil {
			t.Fatal(err)
		}
		if len(hdr)%8 != 0 {
			t.Errorf("%s: header of %d bytes", name, len(hdr))
		}
		path := filepath.Join(t.TempDir(), "x.safetensors")
		data := binary.LittleEndian.AppendUint32(binary.LittleEndian.AppendUint32(nil, math.Float32bits(1.5)), math.Float32bits(-2))
		writeBytes(t, filepath.Dir(path), filepath.Base(path), append(append(binary.LittleEndian.AppendUint64(nil, uint64(len(hdr))), hdr...), data...))
		st, err := openSafetensors(path)
		if err != nil {
			t.Fatal(err)
		}
		got := make([]float32, 2)
		err = st.readFloat32(st.entries[0], got)
		st.Close()
		if err != nil || st.entries[0].Name != name || got[0] != 1.5 || got[1] != -2 {
			t.Errorf("%s: read %s %v, %v", name, st.entries[0].Name, got, err)
		}
	}
}

package engine

import (
	"encoding/binary"
	"fmt"
	"io"
	"math"
	"os"

	"github.com/gptui/gptui/badinput"

	"github.com/gptui/gptui/kernels"
)

// llm.c's GPT-2 model file: a header of 256 little-endian int32 — magic
// 20240326, version, maxT, V, L, NH, C, Vp — then the float32 parameters in
// Layout order. Version 3 is fp32 with a padded vocabulary (the only one read
// here); version 5 is bf16.
const (
	llmcModelMagic   = 20240326
	llmcModelVersion = 3
	llmcHeaderInts   = 256
)

// FormatError is a malformed or unsupported input file.
type FormatError struct {
	File string
	Msg  string
}

func (e *FormatError) Error() string { return e.File + ": " + e.Msg }

// Is reports that a FormatError is bad input (badinput.Err).
func (e *FormatError) Is(target error) bool { return badinput.Is(target) }

// llmcNames name the sizes of an llm.c header by their field and place.
var llmcNames = ShapeNames{MaxT: "maxT (header[2])", V: "V (header[3])", L: "L (header[4])", NH: "NH (header[5])", C: "C (header[6])", F: "4·C"}

// readLLMCHeader reads the header of the llm.c model file of size bytes
// that r reads from its start; path is used in errors. The shape must be
// valid and its parameters must fit the file (checked before anything of
// that size is allocated).
func readLLMCHeader(path string, r io.Reader, size int64) (ModelConfig, error) {
	var h [llmcHeaderInts]int32
	if err := binary.Read(r, binary.LittleEndian, &h); err != nil {
		return ModelConfig{}, &FormatError{path, fmt.Sprintf("truncated header (%v): not an llm.c model file", err)}
	}
	if h[0] != llmcModelMagic {
		return ModelConfig{}, &FormatError{path, fmt.Sprintf("bad magic %d (want %d): not an llm.c GPT-2 model file", h[0], llmcModelMagic)}
	}
	if h[1] != llmcModelVersion {
		return ModelConfig{}, &FormatError{path, fmt.Sprintf("version %d not supported (want %d, fp32 with padded vocab); re-export it as fp32", h[1], llmcModelVersion)}
	}
	cfg := ModelConfig{MaxT: int(h[2]), V: int(h[3]), L: int(h[4]), NH: int(h[5]), C: int(h[6]), Vp: int(h[7])}
	cfg.F = 4 * cfg.C
	if err := cfg.ValidateNamed(llmcNames); err != nil {
		return ModelConfig{}, &FormatError{path, err.Error()}
	}
	// Validate bounds the shape, so the layout's count cannot overflow.
	_, n := Layout(cfg)
	if have := size - 4*llmcHeaderInts; int64(n) > have/4 {
		return ModelConfig{}, &FormatError{path, fmt.Sprintf("truncated or corrupt header: its shape (L %d, C %d, Vp %d, maxT %d) has %d parameters, %d bytes, but the file holds %d bytes after the header",
			cfg.L, cfg.C, cfg.Vp, cfg.MaxT, n, 4*int64(n), max(have, 0))}
	}
	return cfg, nil
}

// LoadLLMC builds a model from an llm.c model file, taking the shape from its
// header. Dropout rates come from drop (its shape fields are ignored).
func LoadLLMC(be kernels.Backend, path string, drop ModelConfig, seed uint64) (*Model, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, badinput.Wrap(fmt.Errorf("model file: %w", err))
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, badinput.Wrap(fmt.Errorf("model file: %w", err))
	}
	return loadLLMC(be, path, f, fi.Size(), drop, seed)
}

// loadLLMC reads the llm.c model file of size bytes that r reads from its
// start; path is used in errors.
func loadLLMC(be kernels.Backend, path string, r io.Reader, size int64, drop ModelConfig, seed uint64) (*Model, error) {
	cfg, err := readLLMCHeader(path, r, size)
	if err != nil {
		return nil, err
	}
	cfg.HiddenDropout, cfg.AttnDropout = drop.HiddenDropout, drop.AttnDropout
	m, err := newModel(be, cfg, WholePart(cfg))
	if err != nil {
		return nil, err
	}
	m.seed = seed
	// In chunks: the parameters cost their buffer, not a second copy.
	buf := make([]byte, 4*min(len(m.Params), 1<<18))
	for done := 0; done < len(m.Params); {
		k := min(len(m.Params)-done, len(buf)/4)
		if _, err := io.ReadFull(r, buf[:4*k]); err != nil {
			return nil, &FormatError{path, fmt.Sprintf("truncated: holds %d of %d parameter bytes for its header's shape", 4*done, 4*len(m.Params))}
		}
		for i := range k {
			m.Params[done+i] = math.Float32frombits(binary.LittleEndian.Uint32(buf[4*i:]))
		}
		done += k
	}
	return m, nil
}

// SaveLLMC writes the model as an llm.c fp32 model file (version 3).
func (m *Model) SaveLLMC(path string) error {
	c := m.Cfg
	var h [llmcHeaderInts]int32
	h[0], h[1], h[2], h[3], h[4], h[5], h[6], h[7] = llmcModelMagic, llmcModelVersion, int32(c.MaxT), int32(c.V), int32(c.L), int32(c.NH), int32(c.C), int32(c.Vp)
	buf := make([]byte, 4*llmcHeaderInts+4*len(m.Params))
	for i, v := range h {
		binary.LittleEndian.PutUint32(buf[4*i:], uint32(v))
	}
	for i, v := range m.Params {
		binary.LittleEndian.PutUint32(buf[4*llmcHeaderInts+4*i:], math.Float32bits(v))
	}
	return os.WriteFile(path, buf, 0o644)
}

package engine

import (
	"encoding/binary"
	"fmt"
	"io"
	"math"
	"os"

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

// LLMCHeader reads the shape out of an llm.c model file header.
func LLMCHeader(path string) (ModelConfig, error) {
	f, err := os.Open(path)
	if err != nil {
		return ModelConfig{}, fmt.Errorf("model file: %w", err)
	}
	defer f.Close()
	return readLLMCHeader(path, f)
}

func readLLMCHeader(path string, r io.Reader) (ModelConfig, error) {
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
	if err := cfg.Validate(); err != nil {
		return ModelConfig{}, &FormatError{path, err.Error()}
	}
	return cfg, nil
}

// LoadLLMC builds a model from an llm.c model file, taking the shape from its
// header. Dropout rates come from drop (its shape fields are ignored).
func LoadLLMC(be kernels.Backend, path string, drop ModelConfig, seed uint64) (*Model, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("model file: %w", err)
	}
	defer f.Close()
	cfg, err := readLLMCHeader(path, f)
	if err != nil {
		return nil, err
	}
	cfg.HiddenDropout, cfg.AttnDropout = drop.HiddenDropout, drop.AttnDropout
	m, err := newModel(be, cfg, WholePart(cfg))
	if err != nil {
		return nil, err
	}
	m.seed = seed
	buf := make([]byte, 4*len(m.Params))
	if n, err := io.ReadFull(f, buf); err != nil {
		return nil, &FormatError{path, fmt.Sprintf("truncated: holds %d of %d parameter bytes for its header's shape", n, len(buf))}
	}
	for i := range m.Params {
		m.Params[i] = math.Float32frombits(binary.LittleEndian.Uint32(buf[4*i:]))
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

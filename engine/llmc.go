package engine

import (
	"encoding/binary"
	"fmt"
	"github.com/gptui/gptui/arch"
	"io"
	"math"
	"os"

	"github.com/gptui/gptui/badinput"

	"github.com/gptui/gptui/kernels"
)

// llm.c's GPT-2 model file: a header of 256 little-endian int32 — magic
// 20240326, version, maxT, V, L, NH, C, Vp — then the float32 parameters in
// Tensors order. Version 3 is fp32 with a padded vocabulary (the only one read
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
	cfg := ModelConfig{Shape: arch.Shape{MaxT: int(h[2]), V: int(h[3]), L: int(h[4]), NH: int(h[5]), C: int(h[6]), Vp: int(h[7])}}
	cfg.F = 4 * cfg.C
	if err := cfg.ValidateNamed(llmcNames); err != nil {
		return ModelConfig{}, &FormatError{path, err.Error()}
	}
	// Validate bounds the shape, so the layout's count cannot overflow.
	_, n := Tensors(cfg)
	if have := size - 4*llmcHeaderInts; int64(n) > have/4 {
		return ModelConfig{}, &FormatError{path, fmt.Sprintf("truncated or corrupt header: its shape (L %d, C %d, Vp %d, maxT %d) has %d parameters, %d bytes, but the file holds %d bytes after the header",
			cfg.L, cfg.C, cfg.Vp, cfg.MaxT, n, 4*int64(n), max(have, 0))}
	}
	return cfg, nil
}

// LoadLLMC builds a model from an llm.c model file, taking the shape from its
// header. Dropout rates come from drop (its shape fields are ignored).
func LoadLLMC(be kernels.Backend, path string, drop ModelConfig, seed uint64) (*Model, error) {
	return LoadLLMCChecked(be, path, drop, seed, nil)
}

// LoadLLMCChecked is [LoadLLMC] calling check, if not nil, with the shape
// of the file's header once the file is seen to hold it, before anything
// of the model's size is allocated (a caller's memory check); an error
// from check is returned as it is.
func LoadLLMCChecked(be kernels.Backend, path string, drop ModelConfig, seed uint64, check func(ModelConfig) error) (*Model, error) {
	f, err := openLLMC(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	if check != nil {
		if err := check(f.cfg); err != nil {
			return nil, err
		}
	}
	return f.load(be, drop, seed)
}

// LLMCShape returns the shape of the llm.c model file at path, from its
// header, once the file is seen to hold a model of that shape; nothing of
// the model's size is allocated or read. Errors are those of [LoadLLMC].
func LLMCShape(path string) (ModelConfig, error) {
	f, err := openLLMC(path)
	if err != nil {
		return ModelConfig{}, err
	}
	defer f.Close()
	return f.cfg, nil
}

// loadLLMC reads the llm.c model file of size bytes that r reads; path is
// used in errors.
func loadLLMC(be kernels.Backend, path string, r io.ReaderAt, size int64, drop ModelConfig, seed uint64) (*Model, error) {
	f, err := newLLMCFile(path, r, size)
	if err != nil {
		return nil, err
	}
	return f.load(be, drop, seed)
}

// llmcFile is an llm.c model file whose header has been read: a rank reads
// the blocks of the tensors it holds from it (block), not the whole model.
type llmcFile struct {
	path string
	r    io.ReaderAt
	cfg  ModelConfig    // the header's shape
	at   map[string]int // each tensor's first element after the header
	file *os.File       // closed by Close, if opened by openLLMC
}

// openLLMC opens the llm.c model file at path and reads its header.
func openLLMC(path string) (*llmcFile, error) {
	fh, err := os.Open(path)
	if err != nil {
		return nil, badinput.Wrap(fmt.Errorf("model file: %w", err))
	}
	fi, err := fh.Stat()
	if err != nil {
		fh.Close()
		return nil, badinput.Wrap(fmt.Errorf("model file: %w", err))
	}
	f, err := newLLMCFile(path, fh, fi.Size())
	if err != nil {
		fh.Close()
		return nil, err
	}
	f.file = fh
	return f, nil
}

func newLLMCFile(path string, r io.ReaderAt, size int64) (*llmcFile, error) {
	cfg, err := readLLMCHeader(path, io.NewSectionReader(r, 0, size), size)
	if err != nil {
		return nil, err
	}
	ts, _ := Tensors(cfg)
	f := &llmcFile{path: path, r: r, cfg: cfg, at: make(map[string]int, len(ts))}
	for _, t := range ts {
		f.at[t.Name] = t.Offset
	}
	return f, nil
}

// Close closes the file openLLMC opened.
func (f *llmcFile) Close() error {
	if f.file == nil {
		return nil
	}
	return f.file.Close()
}

// load builds the whole model from f.
func (f *llmcFile) load(be kernels.Backend, drop ModelConfig, seed uint64) (*Model, error) {
	cfg := f.cfg
	cfg.HiddenDropout, cfg.AttnDropout = drop.HiddenDropout, drop.AttnDropout
	m, err := newModel(be, cfg, WholePart(cfg))
	if err != nil {
		return nil, err
	}
	m.seed = seed
	if err := fillSpans(be, m.Tensors, m.whole(), m.Params, f.block); err != nil {
		return nil, err
	}
	return m, nil
}

// llmcWindow is the most bytes of the file one read takes in: the runs of
// a block (rows of whole tensors, or of a tensor-parallel slice) are read
// through a window this size, so a block costs few reads, a buffer of at
// most this size, and no more of the file than its span.
const llmcWindow = 1 << 20

// block is a blockSource of the file's tensors.
func (f *llmcFile) block(t Tensor, start, shape []int, dst []float32, dstShape, dstAt []int) error {
	base := int64(4*llmcHeaderInts) + 4*int64(f.at[t.Name])
	// The block spans the file from its first element to its last.
	first, last := 0, 1
	for i, s := range strides(t.Global) {
		first += start[i] * s
		last += (start[i] + shape[i] - 1) * s
	}
	var win []byte
	var wlo int64 // the file offset of win[0]
	var err error
	eachRun(t.Global, start, shape, dstShape, dstAt, 0, numRuns(shape), func(k, g, n int) bool {
		lo, hi := base+4*int64(g), base+4*int64(g+n)
		if win == nil || lo < wlo || hi > wlo+int64(len(win)) {
			if win == nil {
				win = make([]byte, max(min(llmcWindow, 4*(last-first)), 4*n))
			}
			win = win[:min(int64(cap(win)), base+4*int64(last)-lo)] // not past the block
			wlo = lo
			m, rerr := f.r.ReadAt(win, lo)
			if m < 4*n {
				err = &FormatError{f.path, fmt.Sprintf("truncated: no %s values at byte %d (%v)", t.Name, lo, rerr)}
				return false
			}
			win = win[:m]
		}
		b := win[lo-wlo : hi-wlo]
		for i := range n {
			dst[k+i] = math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:]))
		}
		return true
	})
	return err
}

// llmcReadValues is the most values WriteLLMC asks its reader for at once.
const llmcReadValues = 1 << 22

// SaveLLMC writes the model as an llm.c fp32 model file (version 3), a
// GPT-2's.
func (m *Model) SaveLLMC(path string) error {
	var buf []float32 // a device's range, downloaded
	return WriteLLMC(path, m.Cfg, func(off, n int) ([]float32, error) { return hostFloats(m.be, m.Params[off:off+n], &buf) })
}

// WriteLLMC writes the model of shape c whose parameters read returns,
// range by range, laid out by [Tensors] (llm.c's order), as an llm.c fp32
// model file (version 3): a GPT-2's. It asks read for at most
// llmcReadValues values at a time and writes through a window of
// llmcWindow bytes, so a model is written from a checkpoint
// ([ModelSource.Read]) without being loaded whole.
func WriteLLMC(path string, c ModelConfig, read func(off, n int) ([]float32, error)) error {
	if c.Family != arch.GPT2 {
		return badinput.New("llm.c's model file holds a GPT-2, and the model is a Llama; export it with --to hf (a LlamaForCausalLM folder)")
	}
	var h [llmcHeaderInts]int32
	h[0], h[1], h[2], h[3], h[4], h[5], h[6], h[7] = llmcModelMagic, llmcModelVersion, int32(c.MaxT), int32(c.V), int32(c.L), int32(c.NH), int32(c.C), int32(c.Vp)
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	buf := make([]byte, 4*llmcHeaderInts, llmcWindow)
	for i, v := range h {
		binary.LittleEndian.PutUint32(buf[4*i:], uint32(v))
	}
	flush := func() error {
		_, err := f.Write(buf)
		buf = buf[:0]
		return err
	}
	_, total := Tensors(c)
	for off := 0; off < total; off += llmcReadValues {
		p, err := read(off, min(llmcReadValues, total-off))
		for err == nil && len(p) > 0 {
			n := min(len(p), (cap(buf)-len(buf))/4)
			for _, v := range p[:n] {
				buf = binary.LittleEndian.AppendUint32(buf, math.Float32bits(v))
			}
			p = p[n:]
			if len(buf) == cap(buf) {
				err = flush()
			}
		}
		if err != nil {
			f.Close()
			return err
		}
	}
	if err := flush(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

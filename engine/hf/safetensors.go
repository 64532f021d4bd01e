package hf

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/gptui/gptui/engine"
	"github.com/gptui/gptui/half"
)

// A safetensors file is an 8-byte little-endian header length N, N bytes of
// JSON mapping each tensor name to its dtype, shape and [begin, end) byte
// range in the data section (plus an optional "__metadata__" map of
// strings), then the data section: each tensor row-major, little-endian.

// maxHeader bounds the JSON header, as the reference implementation does.
const maxHeader = 100 << 20

// dtypeSize is the element size of each safetensors dtype.
var dtypeSize = map[string]int{
	"BOOL": 1, "U8": 1, "I8": 1, "F8_E5M2": 1, "F8_E4M3": 1,
	"I16": 2, "U16": 2, "F16": 2, "BF16": 2,
	"I32": 4, "U32": 4, "F32": 4,
	"I64": 8, "U64": 8, "F64": 8,
}

// stHeader describes one tensor to write.
type stHeader struct {
	Name  string
	Dtype string
	Shape []int
}

// bytes is the size of the tensor's data.
func (h stHeader) bytes() int64 {
	n := int64(dtypeSize[h.Dtype])
	for _, d := range h.Shape {
		n *= int64(d)
	}
	return n
}

// encodeHeader returns the JSON header for ts, tensors in the given order,
// padded with spaces to a multiple of 8 bytes so that the data section is
// aligned. The encoding is fixed: the same tensors give the same bytes.
func encodeHeader(ts []stHeader) ([]byte, error) {
	var b bytes.Buffer
	b.WriteString(`{"__metadata__":{"format":"pt"}`)
	var off int64
	for _, t := range ts {
		if _, ok := dtypeSize[t.Dtype]; !ok {
			return nil, fmt.Errorf("tensor %s: unknown dtype %q", t.Name, t.Dtype)
		}
		name, err := json.Marshal(t.Name)
		if err != nil {
			return nil, err
		}
		b.WriteByte(',')
		b.Write(name)
		b.WriteString(`:{"dtype":"`)
		b.WriteString(t.Dtype)
		b.WriteString(`","shape":[`)
		for i, d := range t.Shape {
			if i > 0 {
				b.WriteByte(',')
			}
			b.WriteString(strconv.Itoa(d))
		}
		end := off + t.bytes()
		fmt.Fprintf(&b, `],"data_offsets":[%d,%d]}`, off, end)
		off = end
	}
	b.WriteByte('}')
	for b.Len()%8 != 0 {
		b.WriteByte(' ')
	}
	return b.Bytes(), nil
}

// writeSafetensors writes a safetensors file at path atomically. data(i, w)
// must write exactly the bytes of tensor ts[i].
func writeSafetensors(path string, ts []stHeader, data func(i int, w io.Writer) error) error {
	hdr, err := encodeHeader(ts)
	if err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	return writeFileAtomic(path, func(w io.Writer) error {
		var n [8]byte
		binary.LittleEndian.PutUint64(n[:], uint64(len(hdr)))
		if _, err := w.Write(n[:]); err != nil {
			return err
		}
		if _, err := w.Write(hdr); err != nil {
			return err
		}
		for i, t := range ts {
			cw := &countingWriter{w: w}
			if err := data(i, cw); err != nil {
				return err
			}
			if cw.n != t.bytes() {
				return fmt.Errorf("tensor %s: wrote %d bytes, want %d", t.Name, cw.n, t.bytes())
			}
		}
		return nil
	})
}

type countingWriter struct {
	w io.Writer
	n int64
}

func (c *countingWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}

// writeFileAtomic writes path through a temporary file in the same
// directory, renamed over path only once it is complete and synced.
func writeFileAtomic(path string, write func(w io.Writer) error) (err error) {
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp*")
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			f.Close()
			os.Remove(f.Name())
		}
	}()
	bw := bufio.NewWriterSize(f, 1<<20)
	if err := write(bw); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	if err := bw.Flush(); err != nil {
		return err
	}
	if err := f.Chmod(0o644); err != nil {
		return err
	}
	if err := f.Sync(); err != nil {
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(f.Name(), path)
}

// stEntry is one tensor of an opened safetensors file.
type stEntry struct {
	Name        string
	Dtype       string
	Shape       []int
	Begin, End  int64 // byte range within the data section
	numElements int
}

// stFile is an opened safetensors file whose header has been checked: every
// tensor's byte range lies in the file and matches its dtype and shape.
type stFile struct {
	path    string
	f       *os.File
	data    int64     // file offset of the data section
	size    int64     // file size
	entries []stEntry // sorted by name
}

// openSafetensors opens path and parses its header.
func openSafetensors(path string) (*stFile, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	st, err := parseSafetensors(path, f)
	if err != nil {
		f.Close()
		return nil, err
	}
	return st, nil
}

func parseSafetensors(path string, f *os.File) (*stFile, error) {
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	size := fi.Size()
	bad := func(format string, args ...any) error {
		return &engine.FormatError{File: path, Msg: fmt.Sprintf(format, args...)}
	}
	var lenBuf [8]byte
	if _, err := io.ReadFull(f, lenBuf[:]); err != nil {
		return nil, bad("truncated: %d bytes, shorter than the 8-byte header length of a safetensors file", size)
	}
	n := binary.LittleEndian.Uint64(lenBuf[:])
	if n > maxHeader || int64(n) > size-8 {
		return nil, bad("truncated header: header length %d exceeds the file (%d bytes) or the %d-byte limit", n, size, maxHeader)
	}
	hdr := make([]byte, n)
	if _, err := io.ReadFull(f, hdr); err != nil {
		return nil, bad("reading header: %v", err)
	}
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(hdr, &raw); err != nil {
		return nil, bad("header is not a JSON object: %v", err)
	}
	st := &stFile{path: path, f: f, data: 8 + int64(n), size: size}
	dataLen := size - st.data
	for name, msg := range raw {
		if name == "__metadata__" {
			var meta map[string]string
			if err := json.Unmarshal(msg, &meta); err != nil {
				return nil, bad("__metadata__ is not a map of strings: %v", err)
			}
			continue
		}
		var e struct {
			Dtype       string  `json:"dtype"`
			Shape       []int   `json:"shape"`
			DataOffsets []int64 `json:"data_offsets"`
		}
		if err := json.Unmarshal(msg, &e); err != nil {
			return nil, bad("tensor %s: bad header entry: %v", name, err)
		}
		es, ok := dtypeSize[e.Dtype]
		if !ok {
			return nil, bad("tensor %s: unknown dtype %q", name, e.Dtype)
		}
		if len(e.DataOffsets) != 2 || e.DataOffsets[0] < 0 || e.DataOffsets[0] > e.DataOffsets[1] || e.DataOffsets[1] > dataLen {
			return nil, bad("tensor %s: data_offsets %v outside the %d-byte data section", name, e.DataOffsets, dataLen)
		}
		count := int64(1)
		for _, d := range e.Shape {
			if d < 0 || (d > 0 && count > dataLen/int64(d)) {
				return nil, bad("tensor %s: shape %v does not fit the file", name, e.Shape)
			}
			count *= int64(d)
		}
		if got := e.DataOffsets[1] - e.DataOffsets[0]; got != count*int64(es) {
			return nil, bad("tensor %s: %d data bytes for %s shape %v (want %d)", name, got, e.Dtype, e.Shape, count*int64(es))
		}
		st.entries = append(st.entries, stEntry{
			Name: name, Dtype: e.Dtype, Shape: e.Shape,
			Begin: e.DataOffsets[0], End: e.DataOffsets[1], numElements: int(count),
		})
	}
	slices.SortFunc(st.entries, func(a, b stEntry) int { return strings.Compare(a.Name, b.Name) })
	return st, nil
}

// dataLen is the size of the data section in bytes.
func (st *stFile) dataLen() int64 { return st.size - st.data }

// Close closes the underlying file.
func (st *stFile) Close() error { return st.f.Close() }

// readFloat32 reads tensor e into dst (len(dst) == its element count),
// converting F16 and BF16 to float32 exactly.
func (st *stFile) readFloat32(e stEntry, dst []float32) error {
	if len(dst) != e.numElements {
		return fmt.Errorf("tensor %s: %d elements, destination holds %d", e.Name, e.numElements, len(dst))
	}
	buf := make([]byte, e.End-e.Begin)
	if _, err := st.f.ReadAt(buf, st.data+e.Begin); err != nil {
		return &engine.FormatError{File: st.path, Msg: fmt.Sprintf("tensor %s: reading data: %v", e.Name, err)}
	}
	switch e.Dtype {
	case "F32":
		for i := range dst {
			dst[i] = math.Float32frombits(binary.LittleEndian.Uint32(buf[4*i:]))
		}
	case "F16":
		for i := range dst {
			dst[i] = half.F16ToF32(binary.LittleEndian.Uint16(buf[2*i:]))
		}
	case "BF16":
		for i := range dst {
			dst[i] = math.Float32frombits(uint32(binary.LittleEndian.Uint16(buf[2*i:])) << 16)
		}
	default:
		return &engine.FormatError{File: st.path, Msg: fmt.Sprintf("tensor %s: dtype %s not supported (want F32, F16 or BF16)", e.Name, e.Dtype)}
	}
	return nil
}

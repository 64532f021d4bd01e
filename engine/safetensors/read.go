package safetensors

import (
	"bytes"
	"cmp"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"slices"

	"github.com/gptui/gptui/half"
)

// Entry is one tensor's entry in a safetensors header.
type Entry struct {
	Name  string
	Dtype string // "F32", "BF16", "F16", "I64", … as the file says
	Shape []int
	// Begin and End are the byte offsets of the tensor's data, relative to
	// the first byte after the header.
	Begin, End int64
}

// File is the parsed and checked header of a safetensors file. Tensor data
// is read on demand, through an io.ReaderAt of the file.
type File struct {
	Path     string
	Metadata map[string]string // the __metadata__ entry; nil when absent
	Tensors  []Entry           // in the order of their data

	dataStart int64 // file offset of the data: 8 + header length
	index     map[string]int
}

// Parse parses and checks the header of the safetensors file of size bytes
// that r reads: the header length fits the file, the header is a JSON
// object without duplicate names, every dtype is known, every tensor's
// byte range matches its shape and dtype, and the ranges tile the data
// exactly (no overlaps, no gaps, nothing missing or trailing). Only the
// header is allocated, once its length is seen to fit in size. name is the
// File's Path and is named in errors; errors about the content are
// *[FormatError]s.
func Parse(name string, r io.ReaderAt, size int64) (*File, error) {
	bad := func(format string, args ...any) error {
		return &FormatError{File: name, Msg: fmt.Sprintf(format, args...)}
	}
	var lenBuf [8]byte
	if size < 8 {
		return nil, bad("%d bytes is too short for a safetensors file (truncated?)", size)
	}
	if _, err := r.ReadAt(lenBuf[:], 0); err != nil {
		return nil, &FormatError{File: name, Msg: "reading the header length", Err: err}
	}
	n := binary.LittleEndian.Uint64(lenBuf[:])
	switch {
	case n > MaxHeaderLen:
		return nil, bad("header length %d exceeds the %d-byte limit; not a safetensors file?", n, MaxHeaderLen)
	case int64(n) > size-8:
		return nil, bad("truncated header: its length %d exceeds the %d bytes that follow it", n, size-8)
	case n < 2:
		return nil, bad("header length %d is too short for a JSON object", n)
	}
	hdr := make([]byte, n)
	if _, err := r.ReadAt(hdr, 8); err != nil {
		return nil, &FormatError{File: name, Msg: "reading the header", Err: err}
	}
	if hdr[0] != '{' {
		return nil, bad("header is not a JSON object: it does not start with '{'; not a safetensors file?")
	}
	s := &File{Path: name, dataStart: 8 + int64(n), index: make(map[string]int)}
	dec := json.NewDecoder(bytes.NewReader(hdr))
	if _, err := dec.Token(); err != nil { // '{', checked above
		return nil, &FormatError{File: name, Msg: "invalid header", Err: err}
	}
	sawMetadata := false
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil, &FormatError{File: name, Msg: "invalid header", Err: err}
		}
		key, _ := tok.(string) // an object key is always a string
		if key == metadataKey {
			if sawMetadata {
				return nil, bad("header has two %s entries", metadataKey)
			}
			sawMetadata = true
			if err := dec.Decode(&s.Metadata); err != nil {
				return nil, &FormatError{File: name, Msg: metadataKey + " is not an object of strings", Err: err}
			}
			continue
		}
		if _, dup := s.index[key]; dup {
			return nil, bad("tensor %q appears twice in the header", key)
		}
		var e struct {
			Dtype       *string  `json:"dtype"`
			Shape       *[]int   `json:"shape"`
			DataOffsets *[]int64 `json:"data_offsets"`
		}
		if err := dec.Decode(&e); err != nil {
			return nil, &FormatError{File: name, Msg: fmt.Sprintf("tensor %q: invalid entry", key), Err: err}
		}
		if e.Dtype == nil || e.Shape == nil || e.DataOffsets == nil {
			return nil, bad("tensor %q: entry needs dtype, shape and data_offsets", key)
		}
		h := Entry{Name: key, Dtype: *e.Dtype, Shape: *e.Shape}
		size := DtypeSize(h.Dtype)
		if size == 0 {
			return nil, bad("tensor %q: unknown dtype %q", key, h.Dtype)
		}
		count, err := Elements(h.Shape, 0)
		if err != nil {
			return nil, bad("tensor %q: shape %v: %v", key, h.Shape, err)
		}
		if len(*e.DataOffsets) != 2 {
			return nil, bad("tensor %q: data_offsets %v is not [begin, end]", key, *e.DataOffsets)
		}
		h.Begin, h.End = (*e.DataOffsets)[0], (*e.DataOffsets)[1]
		if h.Begin < 0 || h.End < h.Begin || h.End-h.Begin != count*int64(size) {
			return nil, bad("tensor %q: data_offsets [%d, %d] (%d data bytes) do not hold %d %s values", key, h.Begin, h.End, h.End-h.Begin, count, h.Dtype)
		}
		s.index[key] = len(s.Tensors)
		s.Tensors = append(s.Tensors, h)
	}
	if _, err := dec.Token(); err != nil { // '}'
		return nil, &FormatError{File: name, Msg: "invalid header", Err: err}
	}
	for _, c := range hdr[dec.InputOffset():] {
		if c != ' ' && c != '\t' && c != '\n' && c != '\r' {
			return nil, bad("header has data after its JSON object")
		}
	}

	slices.SortStableFunc(s.Tensors, func(a, b Entry) int {
		return cmp.Or(cmp.Compare(a.Begin, b.Begin), cmp.Compare(a.End, b.End))
	})
	var end int64
	for i, h := range s.Tensors {
		s.index[h.Name] = i
		switch {
		case h.Begin > end:
			return nil, bad("tensor %q: gap in the data before offset %d", h.Name, h.Begin)
		case h.Begin < end:
			return nil, bad("tensor %q: data at offset %d overlaps the tensor before it", h.Name, h.Begin)
		}
		end = h.End
	}
	switch data := size - s.dataStart; {
	case end > data:
		last := s.Tensors[len(s.Tensors)-1]
		return nil, bad("header describes %d bytes of data, to the end of tensor %q (data_offsets [%d, %d]), but the file holds %d (truncated?)",
			end, last.Name, last.Begin, last.End, data)
	case end < data:
		return nil, bad("%d bytes of data after the last tensor", data-end)
	}
	return s, nil
}

// Tensor returns the header entry of the named tensor.
func (s *File) Tensor(name string) (Entry, bool) {
	i, ok := s.index[name]
	if !ok {
		return Entry{}, false
	}
	return s.Tensors[i], true
}

// DataLen returns the size of the data in bytes: the file's size less the
// header, all of it tensor data.
func (s *File) DataLen() int64 {
	if len(s.Tensors) == 0 {
		return 0
	}
	return s.Tensors[len(s.Tensors)-1].End
}

// Read reads the whole of tensor e of s, through r, into dst, whose length
// must be the tensor's element count.
func (s *File) Read(r io.ReaderAt, e Entry, dst []float32) error {
	if n, _ := Elements(e.Shape, 0); int64(len(dst)) != n { // e was checked by Parse
		return fmt.Errorf("%s: tensor %q of shape %v has %d values, dst holds %d", s.Path, e.Name, e.Shape, n, len(dst))
	}
	zero := make([]int, len(e.Shape))
	return s.ReadBlock(r, e, zero, e.Shape, dst, e.Shape, zero)
}

// ReadBlock copies the block of extent ext that starts at srcLo in tensor
// e of s (row-major, read through r) into dst, a row-major array of shape
// dstShape, at dstLo, converting F16 and BF16 values to float32. The
// caller guarantees that both blocks are in bounds. A dtype that is not
// read as float32 (see [Float]), and a file that no longer holds the
// data its header described, are *[FormatError]s.
func (s *File) ReadBlock(r io.ReaderAt, e Entry, srcLo, ext []int, dst []float32, dstShape, dstLo []int) error {
	decode := decoder(e.Dtype)
	if decode == nil {
		return &FormatError{File: s.Path, Msg: fmt.Sprintf("tensor %q: cannot read dtype %s as float32", e.Name, e.Dtype)}
	}
	for _, n := range ext {
		if n == 0 {
			return nil
		}
	}
	es := int64(DtypeSize(e.Dtype))
	n := len(ext)
	srcStride, dstStride := strides(e.Shape), strides(dstShape)
	// The innermost dimensions that both arrays hold whole form one
	// contiguous run together with the next dimension out.
	run, k := 1, n
	for k > 0 {
		d := k - 1
		run *= ext[d]
		k = d
		if ext[d] != e.Shape[d] || ext[d] != dstShape[d] {
			break
		}
	}
	buf := make([]byte, int64(min(run, chunkElems))*es)
	idx := make([]int, k) // position in the outer k dimensions of the block
	for {
		var so, do int64
		for d := range n {
			i := 0
			if d < k {
				i = idx[d]
			}
			so += int64(srcLo[d]+i) * srcStride[d]
			do += int64(dstLo[d]+i) * dstStride[d]
		}
		off := s.dataStart + e.Begin + so*es
		out := dst[do : do+int64(run)]
		for len(out) > 0 {
			m := min(len(out), chunkElems)
			b := buf[:int64(m)*es]
			if _, err := r.ReadAt(b, off); err != nil {
				if errors.Is(err, io.EOF) {
					err = io.ErrUnexpectedEOF
				}
				return &FormatError{File: s.Path, Msg: fmt.Sprintf("reading tensor %q", e.Name), Err: err}
			}
			decode(out[:m], b)
			out = out[m:]
			off += int64(len(b))
		}
		d := k - 1
		for ; d >= 0; d-- {
			if idx[d]++; idx[d] < ext[d] {
				break
			}
			idx[d] = 0
		}
		if d < 0 {
			return nil
		}
	}
}

// strides returns the row-major element strides of shape.
func strides(shape []int) []int64 {
	st := make([]int64, len(shape))
	acc := int64(1)
	for d := len(shape) - 1; d >= 0; d-- {
		st[d] = acc
		acc *= int64(shape[d])
	}
	return st
}

// decoder returns the function that converts little-endian values of dtype
// dt to float32, or nil if dt is not read as float32.
func decoder(dt string) func(dst []float32, src []byte) {
	switch dt {
	case "F32":
		return func(dst []float32, src []byte) {
			for i := range dst {
				dst[i] = math.Float32frombits(binary.LittleEndian.Uint32(src[4*i:]))
			}
		}
	case "BF16":
		return func(dst []float32, src []byte) {
			for i := range dst {
				dst[i] = half.BF16ToF32(binary.LittleEndian.Uint16(src[2*i:]))
			}
		}
	case "F16":
		return func(dst []float32, src []byte) {
			for i := range dst {
				dst[i] = half.F16ToF32(binary.LittleEndian.Uint16(src[2*i:]))
			}
		}
	}
	return nil
}

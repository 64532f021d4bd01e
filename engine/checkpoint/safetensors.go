package checkpoint

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"slices"
	"strconv"
	"unicode/utf8"

	"github.com/gptui/gptui/half"
)

// maxHeaderLen bounds the JSON header of a safetensors file (100 MiB, the
// limit of the reference implementation).
const maxHeaderLen = 100 << 20

// metadataKey is the reserved header entry holding string metadata.
const metadataKey = "__metadata__"

// chunkElems is how many elements are converted per write or read call.
const chunkElems = 1 << 16

// NamedTensor is a float32 tensor to be written to a safetensors file.
type NamedTensor struct {
	Name  string
	Shape []int
	Data  []float32 // row-major; len(Data) is the product of Shape
}

// TensorHeader is one tensor's entry in a safetensors header.
type TensorHeader struct {
	Name  string
	Dtype string // "F32", "BF16", "F16", "I64", … as the file says
	Shape []int
	// Begin and End are the byte offsets of the tensor's data, relative to
	// the first byte after the header.
	Begin, End int64
}

// Safetensors is the parsed header of a safetensors file. Tensor data is
// read on demand.
type Safetensors struct {
	Path     string
	Metadata map[string]string // the __metadata__ entry; nil when absent
	Tensors  []TensorHeader    // in the order of their data

	dataStart int64 // file offset of the data: 8 + header length
	index     map[string]int
}

// WriteSafetensors writes tensors as F32 to a new safetensors file at path,
// with metadata (may be nil) as the __metadata__ entry, and fsyncs it. The
// output is a function of the arguments alone: tensors are stored in the
// order given, the header is compact JSON (metadata keys sorted) padded
// with spaces to a multiple of 8 bytes, so the data is 8-byte aligned.
// A file that could not be written completely is removed.
func WriteSafetensors(path string, tensors []NamedTensor, metadata map[string]string) error {
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("checkpoint: %w", err)
	}
	bw := bufio.NewWriterSize(f, 1<<20)
	err = encodeSafetensors(bw, tensors, metadata, nil)
	if err == nil {
		err = bw.Flush()
	}
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(path)
		return fmt.Errorf("checkpoint: writing %s: %w", path, err)
	}
	return nil
}

// encodeSafetensors writes a safetensors file of tensors to w. If halfway
// is not nil it is called once, as soon as at least half of the tensor
// bytes have been written.
func encodeSafetensors(w io.Writer, tensors []NamedTensor, metadata map[string]string, halfway func() error) error {
	hdr, total, err := safetensorsHeader(tensors, metadata)
	if err != nil {
		return err
	}
	var n [8]byte
	binary.LittleEndian.PutUint64(n[:], uint64(len(hdr)))
	if _, err := w.Write(n[:]); err != nil {
		return err
	}
	if _, err := w.Write(hdr); err != nil {
		return err
	}
	buf := make([]byte, 4*chunkElems)
	var done int64
	for _, t := range tensors {
		for i := 0; i < len(t.Data); i += chunkElems {
			part := t.Data[i:min(i+chunkElems, len(t.Data))]
			for j, v := range part {
				binary.LittleEndian.PutUint32(buf[4*j:], math.Float32bits(v))
			}
			if _, err := w.Write(buf[:4*len(part)]); err != nil {
				return err
			}
			before := done
			done += 4 * int64(len(part))
			if halfway != nil && 2*before < total && 2*done >= total {
				if err := halfway(); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

// safetensorsHeader returns the padded JSON header for tensors stored as
// F32 in order, and the size of their data in bytes.
func safetensorsHeader(tensors []NamedTensor, metadata map[string]string) ([]byte, int64, error) {
	var b bytes.Buffer
	b.WriteByte('{')
	if len(metadata) > 0 {
		for k, v := range metadata {
			if !utf8.ValidString(k) || !utf8.ValidString(v) {
				return nil, 0, fmt.Errorf("metadata %q: not valid UTF-8", k)
			}
		}
		md, err := json.Marshal(metadata) // keys sorted
		if err != nil {
			return nil, 0, err
		}
		b.WriteString(`"` + metadataKey + `":`)
		b.Write(md)
	}
	seen := make(map[string]bool, len(tensors))
	var off int64
	for _, t := range tensors {
		switch {
		case t.Name == "" || t.Name == metadataKey:
			return nil, 0, fmt.Errorf("invalid tensor name %q", t.Name)
		case !utf8.ValidString(t.Name):
			return nil, 0, fmt.Errorf("tensor name %q is not valid UTF-8", t.Name)
		case seen[t.Name]:
			return nil, 0, fmt.Errorf("tensor %q appears twice", t.Name)
		}
		seen[t.Name] = true
		n, msg := elements(t.Shape, 0)
		if msg != "" {
			return nil, 0, fmt.Errorf("tensor %q: shape %v: %s", t.Name, t.Shape, msg)
		}
		if int64(len(t.Data)) != n {
			return nil, 0, fmt.Errorf("tensor %q: shape %v needs %d values, have %d", t.Name, t.Shape, n, len(t.Data))
		}
		if b.Len() > 1 {
			b.WriteByte(',')
		}
		name, err := json.Marshal(t.Name)
		if err != nil {
			return nil, 0, err
		}
		b.Write(name)
		b.WriteString(`:{"dtype":"F32","shape":[`)
		for i, d := range t.Shape {
			if i > 0 {
				b.WriteByte(',')
			}
			b.WriteString(strconv.Itoa(d))
		}
		fmt.Fprintf(&b, `],"data_offsets":[%d,%d]}`, off, off+4*n)
		off += 4 * n
	}
	b.WriteByte('}')
	for b.Len()%8 != 0 {
		b.WriteByte(' ')
	}
	return b.Bytes(), off, nil
}

// ReadSafetensors opens a safetensors file and parses and validates its
// header: the header length fits the file, the header is a JSON object
// without duplicate names, every dtype is known, every tensor's byte range
// matches its shape and dtype, and the ranges tile the data exactly (no
// overlaps, no gaps, nothing missing or trailing). Tensor data is read
// later, by [Safetensors.ReadF32]. Errors about the content are
// *[FormatError]s naming the file.
func ReadSafetensors(path string) (*Safetensors, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("checkpoint: %w", err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("checkpoint: %w", err)
	}
	return parseSafetensors(path, f, fi.Size())
}

// parseSafetensors parses the header of the safetensors file of size bytes
// that r reads; name is used in errors and as the Path of the result.
func parseSafetensors(name string, r io.ReaderAt, size int64) (*Safetensors, error) {
	bad := func(format string, args ...any) error {
		return &FormatError{File: name, Msg: fmt.Sprintf(format, args...)}
	}
	var lenBuf [8]byte
	if size < 8 {
		return nil, bad("%d bytes is too short for a safetensors file (truncated?)", size)
	}
	if _, err := r.ReadAt(lenBuf[:], 0); err != nil {
		return nil, fmt.Errorf("checkpoint: %s: %w", name, err)
	}
	n := binary.LittleEndian.Uint64(lenBuf[:])
	switch {
	case n > maxHeaderLen:
		return nil, bad("header length %d exceeds the %d-byte limit; not a safetensors file?", n, maxHeaderLen)
	case int64(n) > size-8:
		return nil, bad("header length %d exceeds the %d bytes that follow it (truncated?)", n, size-8)
	case n < 2:
		return nil, bad("header length %d is too short for a JSON object", n)
	}
	hdr := make([]byte, n)
	if _, err := r.ReadAt(hdr, 8); err != nil {
		return nil, fmt.Errorf("checkpoint: %s: %w", name, err)
	}
	if hdr[0] != '{' {
		return nil, bad("header does not start with '{'; not a safetensors file?")
	}
	s := &Safetensors{Path: name, dataStart: 8 + int64(n), index: make(map[string]int)}
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
		h := TensorHeader{Name: key, Dtype: *e.Dtype, Shape: *e.Shape}
		size := dtypeSize(h.Dtype)
		if size == 0 {
			return nil, bad("tensor %q: unknown dtype %q", key, h.Dtype)
		}
		count, msg := elements(h.Shape, 0)
		if msg != "" {
			return nil, bad("tensor %q: shape %v: %s", key, h.Shape, msg)
		}
		if len(*e.DataOffsets) != 2 {
			return nil, bad("tensor %q: data_offsets %v is not [begin, end]", key, *e.DataOffsets)
		}
		h.Begin, h.End = (*e.DataOffsets)[0], (*e.DataOffsets)[1]
		if h.Begin < 0 || h.End < h.Begin || h.End-h.Begin != count*int64(size) {
			return nil, bad("tensor %q: data_offsets [%d, %d] do not hold %d %s values", key, h.Begin, h.End, count, h.Dtype)
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

	slices.SortStableFunc(s.Tensors, func(a, b TensorHeader) int {
		if a.Begin != b.Begin {
			return cmpInt64(a.Begin, b.Begin)
		}
		return cmpInt64(a.End, b.End)
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
		return nil, bad("header describes %d bytes of data but the file holds %d (truncated?)", end, data)
	case end < data:
		return nil, bad("%d bytes of data after the last tensor", data-end)
	}
	return s, nil
}

func cmpInt64(a, b int64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// Tensor returns the header entry of the named tensor.
func (s *Safetensors) Tensor(name string) (TensorHeader, bool) {
	i, ok := s.index[name]
	if !ok {
		return TensorHeader{}, false
	}
	return s.Tensors[i], true
}

// ReadF32 reads the named tensor from the file, converting BF16 and F16
// values to float32. Other dtypes are recognised but not read.
func (s *Safetensors) ReadF32(name string) ([]float32, error) {
	h, ok := s.Tensor(name)
	if !ok {
		return nil, fmt.Errorf("checkpoint: %s: no tensor %q", s.Path, name)
	}
	f, err := os.Open(s.Path)
	if err != nil {
		return nil, fmt.Errorf("checkpoint: %w", err)
	}
	defer f.Close()
	return s.readAll(f, h)
}

// readAll reads the whole tensor h through r.
func (s *Safetensors) readAll(r io.ReaderAt, h TensorHeader) ([]float32, error) {
	n, _ := elements(h.Shape, 0) // validated by parseSafetensors
	dst := make([]float32, n)
	zero := make([]int, len(h.Shape))
	if err := s.readBlock(r, h, zero, h.Shape, dst, h.Shape, zero); err != nil {
		return nil, err
	}
	return dst, nil
}

// readBlock copies the block of extent ext that starts at srcLo in tensor
// h (row-major, read through r) into dst, a row-major array of shape
// dstShape, at dstLo. The caller guarantees that both blocks are in bounds.
func (s *Safetensors) readBlock(r io.ReaderAt, h TensorHeader, srcLo, ext []int, dst []float32, dstShape, dstLo []int) error {
	decode := decoder(h.Dtype)
	if decode == nil {
		return fmt.Errorf("checkpoint: %s: tensor %q: cannot read dtype %s as float32", s.Path, h.Name, h.Dtype)
	}
	for _, e := range ext {
		if e == 0 {
			return nil
		}
	}
	es := int64(dtypeSize(h.Dtype))
	n := len(ext)
	srcStride, dstStride := strides(h.Shape), strides(dstShape)
	// The innermost dimensions that both arrays hold whole form one
	// contiguous run together with the next dimension out.
	run, k := 1, n
	for k > 0 {
		d := k - 1
		run *= ext[d]
		k = d
		if ext[d] != h.Shape[d] || ext[d] != dstShape[d] {
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
		off := s.dataStart + h.Begin + so*es
		out := dst[do : do+int64(run)]
		for len(out) > 0 {
			m := min(len(out), chunkElems)
			b := buf[:int64(m)*es]
			if _, err := r.ReadAt(b, off); err != nil {
				if errors.Is(err, io.EOF) {
					err = io.ErrUnexpectedEOF
				}
				return fmt.Errorf("checkpoint: %s: reading tensor %q: %w", s.Path, h.Name, err)
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

// dtypeSize returns the size in bytes of one element of the safetensors
// dtype dt, or 0 for an unknown dtype.
func dtypeSize(dt string) int {
	switch dt {
	case "BOOL", "U8", "I8", "F8_E4M3", "F8_E5M2":
		return 1
	case "U16", "I16", "F16", "BF16":
		return 2
	case "U32", "I32", "F32":
		return 4
	case "U64", "I64", "F64":
		return 8
	}
	return 0
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
				dst[i] = math.Float32frombits(uint32(binary.LittleEndian.Uint16(src[2*i:])) << 16)
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

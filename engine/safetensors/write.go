package safetensors

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"strconv"
	"unicode/utf8"
)

// Tensor names a tensor to write and gives its shape; its values are
// written as F32.
type Tensor struct {
	Name  string
	Shape []int
}

// A Writer writes a safetensors file of F32 tensors to an io.Writer:
// [NewWriter] writes the header, [Writer.Write] the values of the tensors,
// in their order, in as many calls as the caller likes, and [Writer.Close]
// checks that every value the header declared was written.
type Writer struct {
	w       io.Writer
	tensors []Tensor
	counts  []int64 // the element count of each tensor
	cur     int     // the tensor being written
	have    int64   // its values written so far
	written int64   // data bytes written
	size    int64   // data bytes the header declares
	buf     []byte
}

// NewWriter writes the header of a safetensors file of tensors, stored as
// F32 in the order given, with metadata (may be nil) as the __metadata__
// entry, to w. It refuses an empty, reserved, duplicate or non-UTF-8
// tensor name, a negative dimension and non-UTF-8 metadata, before it
// writes anything.
func NewWriter(w io.Writer, tensors []Tensor, metadata map[string]string) (*Writer, error) {
	sw := &Writer{w: w, tensors: tensors, counts: make([]int64, len(tensors))}
	hdr, err := sw.header(metadata)
	if err != nil {
		return nil, err
	}
	var n [8]byte
	binary.LittleEndian.PutUint64(n[:], uint64(len(hdr)))
	if _, err := w.Write(n[:]); err != nil {
		return nil, err
	}
	if _, err := w.Write(hdr); err != nil {
		return nil, err
	}
	sw.skipEmpty()
	return sw, nil
}

// header returns the padded JSON header, and sets counts and size.
func (sw *Writer) header(metadata map[string]string) ([]byte, error) {
	var b bytes.Buffer
	b.WriteByte('{')
	if len(metadata) > 0 {
		for k, v := range metadata {
			if !utf8.ValidString(k) || !utf8.ValidString(v) {
				return nil, fmt.Errorf("metadata %q: not valid UTF-8", k)
			}
		}
		md, err := json.Marshal(metadata) // keys sorted
		if err != nil {
			return nil, err
		}
		b.WriteString(`"` + metadataKey + `":`)
		b.Write(md)
	}
	seen := make(map[string]bool, len(sw.tensors))
	for i, t := range sw.tensors {
		switch {
		case t.Name == "" || t.Name == metadataKey:
			return nil, fmt.Errorf("invalid tensor name %q", t.Name)
		case !utf8.ValidString(t.Name):
			return nil, fmt.Errorf("tensor name %q is not valid UTF-8", t.Name)
		case seen[t.Name]:
			return nil, fmt.Errorf("tensor %q appears twice", t.Name)
		}
		seen[t.Name] = true
		n, err := Elements(t.Shape, 0)
		if err != nil {
			return nil, fmt.Errorf("tensor %q: shape %v: %w", t.Name, t.Shape, err)
		}
		sw.counts[i] = n
		if b.Len() > 1 {
			b.WriteByte(',')
		}
		name, err := json.Marshal(t.Name)
		if err != nil {
			return nil, err
		}
		b.Write(name)
		b.WriteString(`:{"dtype":"` + DtypeF32 + `","shape":[`)
		for i, d := range t.Shape {
			if i > 0 {
				b.WriteByte(',')
			}
			b.WriteString(strconv.Itoa(d))
		}
		fmt.Fprintf(&b, `],"data_offsets":[%d,%d]}`, sw.size, sw.size+4*n)
		sw.size += 4 * n
	}
	b.WriteByte('}')
	for b.Len()%8 != 0 {
		b.WriteByte(' ')
	}
	return b.Bytes(), nil
}

// skipEmpty moves past the tensors that are complete.
func (sw *Writer) skipEmpty() {
	for sw.cur < len(sw.tensors) && sw.have == sw.counts[sw.cur] {
		sw.cur++
		sw.have = 0
	}
}

// Write writes values, continuing the tensor being written and going on
// into the next ones. Writing more values than the header declares is an
// error.
func (sw *Writer) Write(values []float32) error {
	if n := 4 * min(len(values), chunkElems); len(sw.buf) < n {
		sw.buf = make([]byte, n) // grows to chunkElems values at most
	}
	for len(values) > 0 {
		if sw.cur == len(sw.tensors) {
			return fmt.Errorf("%d values past the last tensor", len(values))
		}
		part := values[:min(int64(len(values)), sw.counts[sw.cur]-sw.have, int64(len(sw.buf)/4))]
		for j, v := range part {
			binary.LittleEndian.PutUint32(sw.buf[4*j:], math.Float32bits(v))
		}
		if _, err := sw.w.Write(sw.buf[:4*len(part)]); err != nil {
			return err
		}
		values = values[len(part):]
		sw.have += int64(len(part))
		sw.written += 4 * int64(len(part))
		sw.skipEmpty()
	}
	return nil
}

// Written returns the bytes of tensor data written so far.
func (sw *Writer) Written() int64 { return sw.written }

// Size returns the bytes of tensor data the header declares.
func (sw *Writer) Size() int64 { return sw.size }

// Close checks that every value the header declares was written. It does
// not close the underlying writer.
func (sw *Writer) Close() error {
	if sw.cur < len(sw.tensors) {
		t := sw.tensors[sw.cur]
		return fmt.Errorf("tensor %q: shape %v needs %d values, have %d", t.Name, t.Shape, sw.counts[sw.cur], sw.have)
	}
	return nil
}

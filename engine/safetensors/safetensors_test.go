package safetensors

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/gptui/gptui/internal/allocbound"
)

// stFile assembles a safetensors file from a header and data.
func stFile(header string, data []byte) []byte {
	b := binary.LittleEndian.AppendUint64(nil, uint64(len(header)))
	return append(append(b, header...), data...)
}

// specials are float32 values whose bits a round trip must keep.
var specials = []float32{0, float32(math.Copysign(0, -1)), 1, -2.5, math.MaxFloat32, math.SmallestNonzeroFloat32,
	float32(math.Inf(1)), float32(math.Inf(-1)), math.Float32frombits(0x7fc00001), math.Float32frombits(0xffbfffff)}

func sameBits(a, b []float32) bool {
	return slices.EqualFunc(a, b, func(x, y float32) bool { return math.Float32bits(x) == math.Float32bits(y) })
}

// tensor is a tensor to encode with its values.
type tensor struct {
	name  string
	shape []int
	data  []float32
}

// encode writes tensors with a Writer, handing it each tensor's values in
// pieces of at most piece values, and returns the file's bytes.
func encode(tensors []tensor, metadata map[string]string, piece int) ([]byte, error) {
	var buf bytes.Buffer
	ts := make([]Tensor, len(tensors))
	for i, t := range tensors {
		ts[i] = Tensor{Name: t.name, Shape: t.shape}
	}
	w, err := NewWriter(&buf, ts, metadata)
	if err != nil {
		return nil, err
	}
	for _, t := range tensors {
		for i := 0; i < len(t.data); i += piece {
			if err := w.Write(t.data[i:min(i+piece, len(t.data))]); err != nil {
				return nil, err
			}
		}
	}
	if err := w.Close(); err != nil {
		return nil, err
	}
	if w.Written() != w.Size() {
		return nil, errors.New("Written and Size differ after Close")
	}
	return buf.Bytes(), nil
}

// readAll reads the whole of tensor name of the file b.
func readAll(st *File, b []byte, name string) ([]float32, error) {
	e, ok := st.Tensor(name)
	if !ok {
		return nil, errors.New("no tensor " + name)
	}
	n, _ := Elements(e.Shape, 0)
	dst := make([]float32, n)
	return dst, st.Read(bytes.NewReader(b), e, dst)
}

func TestRoundTrip(t *testing.T) {
	big := make([]float32, 3*chunkElems+5) // several write and read chunks
	for i := range big {
		big[i] = float32(i) * 0.25
	}
	tensors := []tensor{
		{"specials", []int{2, 5}, specials},
		{"big", []int{len(big)}, big},
		{"scalar", []int{}, []float32{42}},
		{"empty", []int{0, 3}, nil},
		{"ünïcode \"quoted\" <&>", []int{1}, []float32{-1}},
	}
	md := map[string]string{"b": "2", "a": "1"}
	raw, err := encode(tensors, md, 1<<30)
	if err != nil {
		t.Fatal(err)
	}
	if n := binary.LittleEndian.Uint64(raw); n%8 != 0 {
		t.Errorf("header length %d is not a multiple of 8", n)
	}

	st, err := Parse("x.safetensors", bytes.NewReader(raw), int64(len(raw)))
	if err != nil {
		t.Fatal(err)
	}
	if len(st.Metadata) != 2 || st.Metadata["a"] != "1" || st.Metadata["b"] != "2" {
		t.Errorf("metadata %v", st.Metadata)
	}
	var off int64
	for i, want := range tensors {
		h := st.Tensors[i]
		if h.Name != want.name || h.Dtype != "F32" || !slices.Equal(h.Shape, want.shape) ||
			h.Begin != off || h.End != off+4*int64(len(want.data)) {
			t.Errorf("tensor %d: header %+v", i, h)
		}
		off = h.End
		got, err := readAll(st, raw, want.name)
		if err != nil {
			t.Fatalf("reading %q: %v", want.name, err)
		}
		if len(got) != len(want.data) || !sameBits(got, want.data) {
			t.Errorf("%q = %v…, want %v…", want.name, got[:min(len(got), 10)], want.data[:min(len(want.data), 10)])
		}
	}
	if st.DataLen() != off {
		t.Errorf("DataLen %d, want %d", st.DataLen(), off)
	}
	if _, ok := st.Tensor("absent"); ok {
		t.Error("an absent tensor was found")
	}

	// The output depends on the arguments alone, not on how the values
	// were handed to the Writer.
	for _, piece := range []int{1, 7, chunkElems + 1} {
		raw2, err := encode(tensors, map[string]string{"a": "1", "b": "2"}, piece)
		if err != nil || !bytes.Equal(raw, raw2) {
			t.Errorf("values in pieces of %d: a different file (%v)", piece, err)
		}
	}
}

func TestWriterExactBytes(t *testing.T) {
	got, err := encode([]tensor{{"a", []int{2}, []float32{1, -2}}}, nil, 1)
	if err != nil {
		t.Fatal(err)
	}
	hdr := `{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}`
	hdr += strings.Repeat(" ", (8-len(hdr)%8)%8)
	want := stFile(hdr, []byte{0, 0, 0x80, 0x3f, 0, 0, 0, 0xc0})
	if !bytes.Equal(got, want) {
		t.Errorf("file is\n%q\nwant\n%q", got, want)
	}
}

// TestHeaderPadding: whatever the length of a name, the header is padded
// to a multiple of 8 bytes and the file reads back.
func TestHeaderPadding(t *testing.T) {
	for _, name := range []string{"a", "ab", "abc", "abcd", "abcde", "abcdef", "abcdefg", "abcdefgh"} {
		b, err := encode([]tensor{{name, []int{2}, []float32{1.5, -2}}}, map[string]string{"format": "pt"}, 2)
		if err != nil {
			t.Fatal(err)
		}
		if n := binary.LittleEndian.Uint64(b); n%8 != 0 {
			t.Errorf("%s: header of %d bytes", name, n)
		}
		st, err := Parse(name, bytes.NewReader(b), int64(len(b)))
		if err != nil {
			t.Fatal(err)
		}
		got, err := readAll(st, b, name)
		if err != nil || st.Tensors[0].Name != name || got[0] != 1.5 || got[1] != -2 {
			t.Errorf("%s: read %s %v, %v", name, st.Tensors[0].Name, got, err)
		}
	}
}

func TestWriterErrors(t *testing.T) {
	tests := []struct {
		name    string
		tensors []tensor
		md      map[string]string
		errHas  string
	}{
		{"duplicate", []tensor{{"a", []int{1}, []float32{1}}, {"a", []int{1}, []float32{2}}}, nil, `"a" appears twice`},
		{"short data", []tensor{{"a", []int{2, 2}, []float32{1, 2, 3}}}, nil, "needs 4 values, have 3"},
		{"long data", []tensor{{"a", []int{2}, []float32{1, 2, 3}}}, nil, "1 values past the last tensor"},
		{"negative dim", []tensor{{"a", []int{-1}, nil}}, nil, "dimension -1 is below 0"},
		{"reserved name", []tensor{{"__metadata__", []int{1}, []float32{1}}}, nil, "invalid tensor name"},
		{"no name", []tensor{{"", []int{1}, []float32{1}}}, nil, "invalid tensor name"},
		{"bad utf-8", []tensor{{"a\xff", []int{1}, []float32{1}}}, nil, "not valid UTF-8"},
		{"bad metadata", nil, map[string]string{"k": "\xff"}, "not valid UTF-8"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := encode(tt.tensors, tt.md, 1<<30)
			if err == nil || !strings.Contains(err.Error(), tt.errHas) {
				t.Fatalf("error %v, want one containing %q", err, tt.errHas)
			}
		})
	}
	// A header that is refused writes nothing.
	var buf bytes.Buffer
	if _, err := NewWriter(&buf, []Tensor{{Name: "a"}, {Name: "a"}}, nil); err == nil || buf.Len() != 0 {
		t.Errorf("a refused header: error %v, %d bytes written", err, buf.Len())
	}
}

func TestParseValidation(t *testing.T) {
	f32 := func(n int) []byte { return make([]byte, 4*n) }
	tests := []struct {
		name   string
		file   []byte
		errHas string
	}{
		{"empty file", nil, "too short"},
		{"short length", []byte{1, 0, 0}, "too short"},
		{"header past end", stFile(`{}`, nil)[:9], "exceeds the 1 bytes that follow it"},
		{"huge header", binary.LittleEndian.AppendUint64(nil, 1<<40), "exceeds the 104857600-byte limit"},
		{"tiny header", stFile(`{`, nil), "too short for a JSON object"},
		{"not an object", stFile(`[1,2]   `, nil), "does not start with '{'"},
		{"bad JSON", stFile(`{"a":{"dtype":"F32",}}`, nil), `tensor "a": invalid entry`},
		{"unterminated", stFile(`{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}`, f32(1)), "invalid header"},
		{"trailing garbage", stFile(`{} x`, nil), "data after its JSON object"},
		{"duplicate tensor", stFile(`{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}`, f32(2)),
			`"a" appears twice`},
		{"duplicate metadata", stFile(`{"__metadata__":{},"__metadata__":{}}`, nil), "two __metadata__"},
		{"metadata not strings", stFile(`{"__metadata__":{"a":1}}`, nil), "not an object of strings"},
		{"missing field", stFile(`{"a":{"dtype":"F32","shape":[1]}}`, f32(1)), "needs dtype, shape and data_offsets"},
		{"entry not object", stFile(`{"a":"F32"}`, nil), `tensor "a": invalid entry`},
		{"unknown dtype", stFile(`{"a":{"dtype":"F31","shape":[1],"data_offsets":[0,4]}}`, f32(1)), `unknown dtype "F31"`},
		{"negative dim", stFile(`{"a":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}}`, f32(1)), "dimension -1"},
		{"huge shape", stFile(`{"a":{"dtype":"F32","shape":[1073741824,1073741824,1073741824],"data_offsets":[0,4]}}`, f32(1)), "too many elements"},
		{"fractional dim", stFile(`{"a":{"dtype":"F32","shape":[1.5],"data_offsets":[0,4]}}`, f32(1)), "invalid entry"},
		{"three offsets", stFile(`{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4,8]}}`, f32(1)), "is not [begin, end]"},
		{"size mismatch", stFile(`{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,4]}}`, f32(1)), "do not hold 2 F32 values"},
		{"reversed offsets", stFile(`{"a":{"dtype":"F32","shape":[0],"data_offsets":[4,0]}}`, f32(1)), "do not hold 0 F32 values"},
		{"gap", stFile(`{"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}`, f32(2)), "gap in the data before offset 4"},
		{"overlap", stFile(`{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}`, f32(2)),
			"overlaps the tensor before it"},
		{"truncated data", stFile(`{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}`, f32(1)), `tensor "a" (data_offsets [0, 8]), but the file holds 4 (truncated?)`},
		{"trailing data", stFile(`{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}`, f32(2)), "4 bytes of data after the last tensor"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "bad.safetensors")
			if err := os.WriteFile(path, tt.file, 0o666); err != nil {
				t.Fatal(err)
			}
			f, err := os.Open(path)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			_, err = Parse(path, f, int64(len(tt.file)))
			if err == nil {
				t.Fatalf("accepted; want an error containing %q", tt.errHas)
			}
			var fe *FormatError
			if !errors.As(err, &fe) || fe.File != path {
				t.Errorf("error %v (%T) is not a *FormatError naming %s", err, err, path)
			}
			if !strings.Contains(err.Error(), tt.errHas) {
				t.Errorf("error %q does not contain %q", err, tt.errHas)
			}
			if strings.Contains(err.Error(), "\n") {
				t.Errorf("error %q spans lines", err)
			}
		})
	}
}

func TestReadDtypes(t *testing.T) {
	// Files by other writers: BF16 and F16 are read as float32, other
	// dtypes are recognised, and the order of the header does not matter.
	hdr := `{"i":{"dtype":"I64","shape":[1],"data_offsets":[12,20]},` +
		`"h":{"dtype":"F16","shape":[9],"data_offsets":[20,38]},` +
		`"b":{"dtype":"BF16","shape":[2,3],"data_offsets":[0,12]}}`
	var data []byte
	for _, v := range []uint16{0x3f80, 0xc049, 0x0000, 0x8000, 0x7f80, 0x0001} { // BF16
		data = binary.LittleEndian.AppendUint16(data, v)
	}
	data = binary.LittleEndian.AppendUint64(data, 7)                                                     // I64
	for _, v := range []uint16{0x3c00, 0xc000, 0x7bff, 0x0001, 0x03ff, 0x0400, 0x8000, 0x7c00, 0xfc00} { // F16
		data = binary.LittleEndian.AppendUint16(data, v)
	}
	b := stFile(hdr, data)
	st, err := Parse("d", bytes.NewReader(b), int64(len(b)))
	if err != nil {
		t.Fatal(err)
	}
	if names := []string{st.Tensors[0].Name, st.Tensors[1].Name, st.Tensors[2].Name}; !slices.Equal(names, []string{"b", "i", "h"}) {
		t.Errorf("tensors in data order: %v", names)
	}
	tests := []struct {
		name string
		want []float32
	}{
		{"b", []float32{1, -3.140625, 0, float32(math.Copysign(0, -1)), float32(math.Inf(1)), math.Float32frombits(1 << 16)}},
		{"h", []float32{1, -2, 65504, 1.0 / (1 << 24), 1023.0 / (1 << 24), 1.0 / (1 << 14),
			float32(math.Copysign(0, -1)), float32(math.Inf(1)), float32(math.Inf(-1))}},
	}
	for _, tt := range tests {
		got, err := readAll(st, b, tt.name)
		if err != nil {
			t.Fatalf("reading %q: %v", tt.name, err)
		}
		if !sameBits(got, tt.want) {
			t.Errorf("%q = %v, want %v", tt.name, got, tt.want)
		}
	}
	var fe *FormatError
	if _, err := readAll(st, b, "i"); !errors.As(err, &fe) || !strings.Contains(err.Error(), "cannot read dtype I64") {
		t.Errorf("reading I64: %v", err)
	}
	if h, ok := st.Tensor("i"); !ok || h.Dtype != "I64" || h.Begin != 12 || h.End != 20 {
		t.Errorf("Tensor(i) = %+v, %v", h, ok)
	}
	if !Float("F32") || !Float("F16") || !Float("BF16") || Float("I64") || Float("F64") {
		t.Error("Float does not name F32, F16 and BF16 alone")
	}
	// A file cut short after its header was parsed is a FormatError too.
	if _, err := readAll(st, b[:30], "h"); !errors.As(err, &fe) || !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Errorf("reading a truncated file: %v", err)
	}
}

// TestReadBlock reads every block of a 3-dimensional tensor into a larger
// array at an offset.
func TestReadBlock(t *testing.T) {
	shape := []int{3, 4, 5}
	data := make([]float32, 60)
	for i := range data {
		data[i] = float32(i)
	}
	raw, err := encode([]tensor{{"x", shape, data}}, nil, 60)
	if err != nil {
		t.Fatal(err)
	}
	st, err := Parse("x", bytes.NewReader(raw), int64(len(raw)))
	if err != nil {
		t.Fatal(err)
	}
	e, _ := st.Tensor("x")
	at := func(i, j, k int) float32 { return data[(i*4+j)*5+k] }
	for _, b := range []struct{ lo, ext []int }{
		{[]int{0, 0, 0}, []int{3, 4, 5}}, {[]int{1, 0, 0}, []int{2, 4, 5}}, {[]int{0, 1, 0}, []int{3, 2, 5}},
		{[]int{1, 1, 2}, []int{2, 3, 3}}, {[]int{2, 3, 4}, []int{1, 1, 1}}, {[]int{0, 0, 0}, []int{3, 0, 5}},
	} {
		dstShape := []int{b.ext[0] + 1, b.ext[1] + 2, b.ext[2] + 1}
		dstLo := []int{1, 2, 0}
		dst := make([]float32, dstShape[0]*dstShape[1]*dstShape[2])
		if err := st.ReadBlock(bytes.NewReader(raw), e, b.lo, b.ext, dst, dstShape, dstLo); err != nil {
			t.Fatal(err)
		}
		for i := range b.ext[0] {
			for j := range b.ext[1] {
				for k := range b.ext[2] {
					got := dst[((dstLo[0]+i)*dstShape[1]+dstLo[1]+j)*dstShape[2]+dstLo[2]+k]
					if want := at(b.lo[0]+i, b.lo[1]+j, b.lo[2]+k); got != want {
						t.Fatalf("block %v %v: [%d %d %d] = %g, want %g", b.lo, b.ext, i, j, k, got, want)
					}
				}
			}
		}
	}
}

// FuzzParse feeds arbitrary bytes to Parse. Nothing may panic; every error
// is a one-line *FormatError naming the file; an accepted header describes
// data that is all there, every readable tensor reads without error; and
// parsing and reading together never allocate more than allocbound.Limit
// of the file's size.
func FuzzParse(f *testing.F) {
	b, err := encode([]tensor{
		{"a", []int{2, 3}, []float32{1, 2, 3, 4, 5, 6}},
		{"s", []int{}, []float32{7}},
		{"z", []int{0}, nil},
	}, map[string]string{"k": "v"}, 2)
	if err != nil {
		f.Fatal(err)
	}
	f.Add(b)
	f.Add(stFile(`{"b":{"dtype":"BF16","shape":[2],"data_offsets":[0,4]},"h":{"dtype":"F16","shape":[1],"data_offsets":[4,6]}}`, make([]byte, 6)))
	f.Add(stFile(`{"u":{"dtype":"U8","shape":[3],"data_offsets":[0,3]}}`, []byte{1, 2, 3}))
	f.Add(stFile(`{"a":{"dtype":"F32","shape":[1073741824],"data_offsets":[0,4294967296]}}`, nil))
	f.Add(binary.LittleEndian.AppendUint64(nil, 1<<62))
	f.Add(stFile(`{}`, nil))
	f.Fuzz(func(t *testing.T, b []byte) {
		used := allocbound.Measure(func() {
			st, err := Parse("f", bytes.NewReader(b), int64(len(b)))
			if err != nil {
				var fe *FormatError
				if !errors.As(err, &fe) || fe.File != "f" || strings.Contains(err.Error(), "\n") {
					t.Fatalf("error %q (%T) is not a one-line *FormatError naming the file", err, err)
				}
				return
			}
			var end int64
			for _, h := range st.Tensors {
				if h.Begin != end {
					t.Fatalf("tensor %q starts at %d, previous ended at %d", h.Name, h.Begin, end)
				}
				end = h.End
				if !Float(h.Dtype) {
					continue
				}
				got, err := readAll(st, b, h.Name)
				if err != nil {
					t.Fatalf("reading %q: %v", h.Name, err)
				}
				if n, _ := Elements(h.Shape, 0); int64(len(got)) != n {
					t.Fatalf("read %d values of %q, shape %v", len(got), h.Name, h.Shape)
				}
			}
			if st.dataStart+end != int64(len(b)) || st.DataLen() != end {
				t.Fatalf("data ends at %d of %d bytes (DataLen %d)", st.dataStart+end, len(b), st.DataLen())
			}
		})
		if limit := allocbound.Limit(len(b)); used > limit {
			t.Errorf("Parse and reading allocated %d bytes for %d bytes (limit %d)", used, len(b), limit)
		}
	})
}

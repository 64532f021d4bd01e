package checkpoint

import (
	"bytes"
	"encoding/binary"
	"errors"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/gptui/gptui/half"
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

func TestSafetensorsRoundTrip(t *testing.T) {
	big := make([]float32, 3*chunkElems+5) // several write and read chunks
	for i := range big {
		big[i] = float32(i) * 0.25
	}
	tensors := []NamedTensor{
		{Name: "specials", Shape: []int{2, 5}, Data: specials},
		{Name: "big", Shape: []int{len(big)}, Data: big},
		{Name: "scalar", Shape: []int{}, Data: []float32{42}},
		{Name: "empty", Shape: []int{0, 3}, Data: nil},
		{Name: "ünïcode \"quoted\" <&>", Shape: []int{1}, Data: []float32{-1}},
	}
	md := map[string]string{"b": "2", "a": "1"}
	path := filepath.Join(t.TempDir(), "x.safetensors")
	if err := WriteSafetensors(path, tensors, md); err != nil {
		t.Fatal(err)
	}
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if n := binary.LittleEndian.Uint64(raw); n%8 != 0 {
		t.Errorf("header length %d is not a multiple of 8", n)
	}

	st, err := ReadSafetensors(path)
	if err != nil {
		t.Fatal(err)
	}
	if len(st.Metadata) != 2 || st.Metadata["a"] != "1" || st.Metadata["b"] != "2" {
		t.Errorf("metadata %v", st.Metadata)
	}
	var off int64
	for i, want := range tensors {
		h := st.Tensors[i]
		if h.Name != want.Name || h.Dtype != "F32" || !slices.Equal(h.Shape, want.Shape) ||
			h.Begin != off || h.End != off+4*int64(len(want.Data)) {
			t.Errorf("tensor %d: header %+v", i, h)
		}
		off = h.End
		got, err := st.ReadF32(want.Name)
		if err != nil {
			t.Fatalf("ReadF32(%q): %v", want.Name, err)
		}
		if len(got) != len(want.Data) || !sameBits(got, want.Data) {
			t.Errorf("ReadF32(%q) = %v…, want %v…", want.Name, got[:min(len(got), 10)], want.Data[:min(len(want.Data), 10)])
		}
	}
	if _, err := st.ReadF32("absent"); err == nil {
		t.Error("ReadF32 of an absent tensor succeeded")
	}

	// The output depends on the arguments alone.
	path2 := filepath.Join(t.TempDir(), "y.safetensors")
	if err := WriteSafetensors(path2, tensors, map[string]string{"a": "1", "b": "2"}); err != nil {
		t.Fatal(err)
	}
	if raw2, _ := os.ReadFile(path2); !bytes.Equal(raw, raw2) {
		t.Error("writing the same tensors twice gave different files")
	}
}

func TestWriteSafetensorsExactBytes(t *testing.T) {
	path := filepath.Join(t.TempDir(), "a.safetensors")
	if err := WriteSafetensors(path, []NamedTensor{{Name: "a", Shape: []int{2}, Data: []float32{1, -2}}}, nil); err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(path)
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

func TestWriteSafetensorsErrors(t *testing.T) {
	tests := []struct {
		name    string
		tensors []NamedTensor
		md      map[string]string
		errHas  string
	}{
		{"duplicate", []NamedTensor{{"a", []int{1}, []float32{1}}, {"a", []int{1}, []float32{2}}}, nil, `"a" appears twice`},
		{"short data", []NamedTensor{{"a", []int{2, 2}, []float32{1, 2, 3}}}, nil, "needs 4 values, have 3"},
		{"negative dim", []NamedTensor{{"a", []int{-1}, nil}}, nil, "dimension -1 is below 0"},
		{"reserved name", []NamedTensor{{"__metadata__", []int{1}, []float32{1}}}, nil, "invalid tensor name"},
		{"no name", []NamedTensor{{"", []int{1}, []float32{1}}}, nil, "invalid tensor name"},
		{"bad utf-8", []NamedTensor{{"a\xff", []int{1}, []float32{1}}}, nil, "not valid UTF-8"},
		{"bad metadata", nil, map[string]string{"k": "\xff"}, "not valid UTF-8"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "x.safetensors")
			err := WriteSafetensors(path, tt.tensors, tt.md)
			if err == nil || !strings.Contains(err.Error(), tt.errHas) {
				t.Fatalf("error %v, want one containing %q", err, tt.errHas)
			}
			if _, err := os.Stat(path); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("a failed write left %s behind", path)
			}
		})
	}
}

func TestReadSafetensorsValidation(t *testing.T) {
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
		{"fractional dim", stFile(`{"a":{"dtype":"F32","shape":[1.5],"data_offsets":[0,4]}}`, f32(1)), "invalid entry"},
		{"three offsets", stFile(`{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4,8]}}`, f32(1)), "is not [begin, end]"},
		{"size mismatch", stFile(`{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,4]}}`, f32(1)), "do not hold 2 F32 values"},
		{"reversed offsets", stFile(`{"a":{"dtype":"F32","shape":[0],"data_offsets":[4,0]}}`, f32(1)), "do not hold 0 F32 values"},
		{"gap", stFile(`{"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}`, f32(2)), "gap in the data before offset 4"},
		{"overlap", stFile(`{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}`, f32(2)),
			"overlaps the tensor before it"},
		{"truncated data", stFile(`{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}`, f32(1)), "holds 4 (truncated?)"},
		{"trailing data", stFile(`{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}`, f32(2)), "4 bytes of data after the last tensor"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "bad.safetensors")
			if err := os.WriteFile(path, tt.file, 0o666); err != nil {
				t.Fatal(err)
			}
			_, err := ReadSafetensors(path)
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
		})
	}
}

func TestReadSafetensorsDtypes(t *testing.T) {
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
	path := filepath.Join(t.TempDir(), "d.safetensors")
	if err := os.WriteFile(path, stFile(hdr, data), 0o666); err != nil {
		t.Fatal(err)
	}
	st, err := ReadSafetensors(path)
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
		got, err := st.ReadF32(tt.name)
		if err != nil {
			t.Fatalf("ReadF32(%q): %v", tt.name, err)
		}
		if !sameBits(got, tt.want) {
			t.Errorf("ReadF32(%q) = %v, want %v", tt.name, got, tt.want)
		}
	}
	if _, err := st.ReadF32("i"); err == nil || !strings.Contains(err.Error(), "cannot read dtype I64") {
		t.Errorf("ReadF32 of I64: %v", err)
	}
	if h, ok := st.Tensor("i"); !ok || h.Dtype != "I64" || h.Begin != 12 || h.End != 20 {
		t.Errorf("Tensor(i) = %+v, %v", h, ok)
	}
	if half.F16ToF32(0x7e00) == half.F16ToF32(0x7e00) {
		t.Error("F16 NaN did not convert to NaN")
	}
}

func FuzzReadSafetensors(f *testing.F) {
	var buf bytes.Buffer
	err := encodeSafetensors(&buf, []NamedTensor{
		{Name: "a", Shape: []int{2, 3}, Data: []float32{1, 2, 3, 4, 5, 6}},
		{Name: "s", Shape: []int{}, Data: []float32{7}},
		{Name: "z", Shape: []int{0}},
	}, map[string]string{"k": "v"}, nil)
	if err != nil {
		f.Fatal(err)
	}
	f.Add(buf.Bytes())
	f.Add(stFile(`{"b":{"dtype":"BF16","shape":[2],"data_offsets":[0,4]},"h":{"dtype":"F16","shape":[1],"data_offsets":[4,6]}}`, make([]byte, 6)))
	f.Add(stFile(`{"u":{"dtype":"U8","shape":[3],"data_offsets":[0,3]}}`, []byte{1, 2, 3}))
	f.Add(stFile(`{}`, nil))
	f.Fuzz(func(t *testing.T, b []byte) {
		st, err := parseSafetensors("f", bytes.NewReader(b), int64(len(b)))
		if err != nil {
			var fe *FormatError
			if !errors.As(err, &fe) || fe.File != "f" {
				t.Fatalf("error %v (%T) is not a *FormatError naming the file", err, err)
			}
			return
		}
		// An accepted header describes data that is all there: every
		// readable tensor reads without error.
		var end int64
		for _, h := range st.Tensors {
			if h.Begin != end {
				t.Fatalf("tensor %q starts at %d, previous ended at %d", h.Name, h.Begin, end)
			}
			end = h.End
			if decoder(h.Dtype) == nil {
				continue
			}
			got, err := st.readAll(bytes.NewReader(b), h)
			if err != nil {
				t.Fatalf("reading %q: %v", h.Name, err)
			}
			if n, _ := elements(h.Shape, 0); int64(len(got)) != n {
				t.Fatalf("read %d values of %q, shape %v", len(got), h.Name, h.Shape)
			}
		}
		if st.dataStart+end != int64(len(b)) {
			t.Fatalf("data ends at %d of %d bytes", st.dataStart+end, len(b))
		}
	})
}

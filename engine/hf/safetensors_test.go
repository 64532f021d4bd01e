package hf

import (
	"encoding/binary"
	"math"
	"path/filepath"
	"testing"
)

func TestF16ToF32(t *testing.T) {
	tests := []struct {
		h    uint16
		want float32
	}{
		{0x0000, 0},
		{0x3c00, 1},
		{0xc000, -2},
		{0x3555, 0.333251953125},
		{0x7bff, 65504},                 // largest finite
		{0x0400, 1.0 / (1 << 14)},       // smallest normal
		{0x0001, 1.0 / (1 << 24)},       // smallest subnormal
		{0x83ff, -1023.0 / (1 << 24)},   // largest subnormal, negative
		{0x7c00, float32(math.Inf(1))},  // +Inf
		{0xfc00, float32(math.Inf(-1))}, // -Inf
	}
	for _, tt := range tests {
		if got := f16ToF32(tt.h); got != tt.want {
			t.Errorf("f16ToF32(%#04x) = %g, want %g", tt.h, got, tt.want)
		}
	}
	if got := f16ToF32(0x8000); got != 0 || !math.Signbit(float64(got)) {
		t.Errorf("f16ToF32(0x8000) = %g, want -0", got)
	}
	if got := f16ToF32(0x7e00); !math.IsNaN(float64(got)) {
		t.Errorf("f16ToF32(0x7e00) = %g, want NaN", got)
	}
	// Monotonic over the positive finite halves: no value is misplaced.
	for h := uint16(1); h < 0x7c00; h++ {
		if f16ToF32(h) <= f16ToF32(h-1) {
			t.Fatalf("f16ToF32(%#04x) = %g ≤ f16ToF32(%#04x) = %g", h, f16ToF32(h), h-1, f16ToF32(h-1))
		}
	}
}

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

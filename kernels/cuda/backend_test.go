package cuda

import (
	"errors"
	"strings"
	"testing"
)

func TestExtent(t *testing.T) {
	tests := []struct {
		trans    bool
		r, c, ld int
		want     int
	}{
		{false, 3, 4, 4, 12},  // dense 3×4
		{false, 3, 4, 10, 24}, // rows 10 apart: the last row starts at 20
		{true, 3, 4, 3, 12},   // stored 4×3
		{true, 3, 4, 8, 27},   // stored 4×3, rows 8 apart
		{false, 0, 4, 4, 0},
	}
	for _, tt := range tests {
		if got := extent(tt.trans, tt.r, tt.c, tt.ld); got != tt.want {
			t.Errorf("extent(%v, %d, %d, %d) = %d, want %d", tt.trans, tt.r, tt.c, tt.ld, got, tt.want)
		}
	}
}

func TestParsePrecision(t *testing.T) {
	for in, want := range map[string]Precision{"fp32": PrecisionFP32, "float32": PrecisionFP32, "bf16": PrecisionBF16, "bfloat16": PrecisionBF16, "fp16": PrecisionFP16, "float16": PrecisionFP16} {
		if got, err := ParsePrecision(in); err != nil || got != want {
			t.Errorf("ParsePrecision(%q) = %v, %v; want %v", in, got, err, want)
		}
		if got, _ := ParsePrecision(in); got.String() != map[Precision]string{PrecisionFP32: "fp32", PrecisionBF16: "bf16", PrecisionFP16: "fp16"}[want] {
			t.Errorf("%v.String() = %q", got, got.String())
		}
	}
	if _, err := ParsePrecision("fp8"); err == nil {
		t.Error("ParsePrecision(fp8) succeeded")
	}
}

// TestPrecisionOn: bf16 becomes fp16 before compute capability 8.0 (V100,
// T4), and stays bf16 from Ampere on; fp32 and fp16 stay what they are.
func TestPrecisionOn(t *testing.T) {
	for _, tt := range []struct {
		p     Precision
		major int
		want  Precision
	}{
		{PrecisionBF16, 7, PrecisionFP16},
		{PrecisionBF16, 8, PrecisionBF16},
		{PrecisionBF16, 9, PrecisionBF16},
		{PrecisionFP32, 7, PrecisionFP32},
		{PrecisionFP16, 7, PrecisionFP16},
		{PrecisionFP16, 9, PrecisionFP16},
	} {
		if got := PrecisionOn(tt.p, tt.major); got != tt.want {
			t.Errorf("PrecisionOn(%v, %d) = %v, want %v", tt.p, tt.major, got, tt.want)
		}
	}
}

// TestNewWithoutGPU: where there is no driver (CI), New fails with an
// error naming the library and where it was looked for — the line the CLI
// prints before exiting 2 — and never panics.
func TestNewWithoutGPU(t *testing.T) {
	if _, _, err := Find(LibCUDA, SystemEnv()); err == nil {
		t.Skip("this machine has a CUDA driver: New would open the GPU") // never so in CI
	}
	b, err := New(Options{Precision: PrecisionBF16})
	if err == nil {
		b.Close()
		t.Fatal("New succeeded without a driver")
	}
	if !errors.Is(err, ErrNotFound) || !strings.Contains(err.Error(), "libcuda.so") || strings.Contains(err.Error(), "\n") {
		t.Errorf("New: %v; want one line naming libcuda.so (errors.Is ErrNotFound)", err)
	}
}

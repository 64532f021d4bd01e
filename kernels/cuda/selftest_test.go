package cuda

import (
	"bytes"
	"context"
	"math"
	"strings"
	"testing"
)

func TestBF16(t *testing.T) {
	for _, tc := range []struct {
		f    float32
		want uint16
	}{
		{1, 0x3f80},
		{-2, 0xc000},
		{math.Float32frombits(0x3f808000), 0x3f80}, // halfway, to even (down)
		{math.Float32frombits(0x3f818000), 0x3f82}, // halfway, to even (up)
		{math.Float32frombits(0x3f808001), 0x3f81}, // above halfway
		{float32(math.Inf(1)), 0x7f80},
		{math.MaxFloat32, 0x7f80}, // rounds up to infinity
	} {
		if got := toBF16(tc.f); got != tc.want {
			t.Errorf("toBF16(%g) = %#04x, want %#04x", tc.f, got, tc.want)
		}
	}
	if !math.IsNaN(float64(fromBF16(toBF16(float32(math.NaN()))))) {
		t.Error("NaN did not stay NaN")
	}
	for h := 0; h < 1<<16; h++ {
		f := fromBF16(uint16(h))
		if f != f {
			continue
		}
		if got := toBF16(f); got != uint16(h) {
			t.Fatalf("bf16 %#04x → %g → %#04x", h, f, got)
		}
	}
}

func TestF16(t *testing.T) {
	for _, tc := range []struct {
		f    float32
		want uint16
	}{
		{1, 0x3c00},
		{-2, 0xc000},
		{0.1, 0x2e66},
		{65504, 0x7bff},
		{65520, 0x7c00},         // halfway to the next power: rounds to infinity
		{6.1035156e-05, 0x0400}, // the smallest normal
		{5.9604645e-08, 0x0001}, // the smallest subnormal
		{2.9802322e-08, 0x0000}, // half of it: ties to even, zero
		{4.4703484e-08, 0x0001}, // three quarters of it: up
		{float32(math.Inf(-1)), 0xfc00},
		{1e-10, 0},
	} {
		if got := toF16(tc.f); got != tc.want {
			t.Errorf("toF16(%g) = %#04x, want %#04x", tc.f, got, tc.want)
		}
	}
	for h := 0; h < 1<<16; h++ {
		f := fromF16(uint16(h))
		if f != f {
			continue
		}
		if got := toF16(f); got != uint16(h) {
			t.Fatalf("f16 %#04x → %g → %#04x", h, f, got)
		}
	}
	// Ties between neighbours round to the even one.
	for h := uint16(0x3c00); h < 0x3c10; h++ {
		mid := (fromF16(h) + fromF16(h+1)) / 2
		want := h
		if h&1 == 1 {
			want = h + 1
		}
		if got := toF16(mid); got != want {
			t.Errorf("toF16(midpoint of %#04x and %#04x) = %#04x, want %#04x", h, h+1, got, want)
		}
	}
}

func TestRefGemm(t *testing.T) {
	// Row-major matrices written out by hand: opA (2×3), opB (3×2).
	opA := [2][3]float64{{1, 2, 3}, {4, 5, 6}}
	opB := [3][2]float64{{7, 8}, {9, 10}, {11, 12}}
	want := [2][2]float64{{58, 64}, {139, 154}}
	for _, tc := range []struct{ transA, transB bool }{{false, false}, {true, false}, {false, true}, {true, true}} {
		// Store op(A) as cuBLAS would see A: column-major, transposed when transA.
		var a, b []float64
		lda, ldb := 2, 3
		if tc.transA { // A is 3×2 column-major holding opAᵀ
			lda = 3
			for j := range 2 {
				for i := range 3 {
					a = append(a, opA[j][i])
				}
			}
		} else {
			for j := range 3 {
				for i := range 2 {
					a = append(a, opA[i][j])
				}
			}
		}
		if tc.transB { // B is 2×3 column-major holding opBᵀ
			ldb = 2
			for j := range 3 {
				for i := range 2 {
					b = append(b, opB[j][i])
				}
			}
		} else {
			for j := range 2 {
				for i := range 3 {
					b = append(b, opB[i][j])
				}
			}
		}
		c := []float64{1, 1, 1, 1}
		refGemm(tc.transA, tc.transB, 2, 2, 3, 2, a, lda, b, ldb, 0.5, c, 2)
		for i := range 2 {
			for j := range 2 {
				if got, w := c[i+j*2], 2*want[i][j]+0.5; got != w {
					t.Errorf("transA=%v transB=%v: C[%d][%d] = %g, want %g", tc.transA, tc.transB, i, j, got, w)
				}
			}
		}
	}
	if e := relErr([]float64{1, 2.002}, []float64{1, 2}); math.Abs(e-0.001) > 1e-12 {
		t.Errorf("relErr = %g, want 0.001", e)
	}
	if g := geluTanh(1); math.Abs(g-0.8411920) > 1e-6 {
		t.Errorf("geluTanh(1) = %g", g)
	}
	if geluTanh(0) != 0 || math.Abs(geluTanh(10)-10) > 1e-9 || math.Abs(geluTanh(-10)) > 1e-9 {
		t.Error("geluTanh's limits are wrong")
	}
}

// TestSelfTestHere runs the self-test on this machine: without a GPU it
// must fail with a line naming the driver library and where it looked,
// report the other checks as not run, and return an error.
func TestSelfTestHere(t *testing.T) {
	var out bytes.Buffer
	err := SelfTest(context.Background(), &out)
	t.Logf("\n%s", out.String())
	if err == nil {
		return // a machine with a GPU: every check passed
	}
	text := out.String()
	if strings.Contains(text, "FAIL  open device 0") {
		if !strings.Contains(text, "libcuda.so") {
			t.Errorf("the failed open does not name libcuda.so:\n%s", text)
		}
		if !strings.Contains(text, "FAIL  NCCL") || !strings.Contains(text, "not run: no device") {
			t.Errorf("the checks after a failed open are not reported as not run:\n%s", text)
		}
		if !strings.Contains(err.Error(), "open device 0") {
			t.Errorf("error %q does not name the failed check", err)
		}
	}
	if !strings.Contains(text, "self-test: ") {
		t.Errorf("no summary line:\n%s", text)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := SelfTest(ctx, &out); err == nil {
		t.Error("a cancelled self-test passed")
	}
}

package cudacheck

import (
	"bytes"
	"context"
	"math"
	"strings"
	"testing"
)

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

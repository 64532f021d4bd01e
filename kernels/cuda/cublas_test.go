package cuda

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"unsafe"
)

func TestDataTypes(t *testing.T) {
	for _, tc := range []struct {
		t    DataType
		size int
		name string
		nccl int32
	}{
		{F32, 4, "f32", ncclFloat32},
		{F16, 2, "f16", ncclFloat16},
		{BF16, 2, "bf16", ncclBfloat16},
		{F64, 8, "f64", ncclFloat64},
		{I32, 4, "i32", ncclInt32},
	} {
		if tc.t.Size() != tc.size || tc.t.String() != tc.name {
			t.Errorf("%d: size %d name %s, want %d %s", int(tc.t), tc.t.Size(), tc.t, tc.size, tc.name)
		}
		if n, err := ncclType(tc.t); err != nil || n != tc.nccl {
			t.Errorf("ncclType(%s) = %d, %v; want %d", tc.t, n, err, tc.nccl)
		}
	}
	if _, err := ncclType(DataType(3)); err == nil {
		t.Error("ncclType of an unknown type should fail")
	}
	if DataType(3).Size() != 0 {
		t.Error("an unknown type has a size")
	}
}

func TestGemmCompute(t *testing.T) {
	for _, tc := range []struct {
		a, b  DataType
		exact bool
		want  int32
	}{
		{F32, F32, true, cublasCompute32FPedantic},
		{F32, F32, false, cublasCompute32FFastTF32},
		{BF16, BF16, true, cublasCompute32F},
		{BF16, BF16, false, cublasCompute32F},
		{F16, F16, false, cublasCompute32F},
	} {
		if got := gemmCompute(tc.a, tc.b, tc.exact); got != tc.want {
			t.Errorf("gemmCompute(%s, %s, exact=%v) = %d, want %d", tc.a, tc.b, tc.exact, got, tc.want)
		}
	}
}

func TestCheckGemm(t *testing.T) {
	for _, tc := range []struct {
		name          string
		ta, tb        bool
		m, n, k       int
		at, bt, ct    DataType
		lda, ldb, ldc int
		want          string // "" for valid
	}{
		{"plain", false, false, 256, 128, 64, F32, F32, F32, 256, 64, 256, ""},
		{"transposed A", true, false, 256, 128, 64, BF16, BF16, F32, 64, 64, 256, ""},
		{"transposed B", false, true, 256, 128, 64, F16, F16, F16, 256, 128, 256, ""},
		{"zero m", false, false, 0, 1, 1, F32, F32, F32, 1, 1, 1, "GEMM of 0×1×1"},
		{"lda too small", false, false, 256, 128, 64, F32, F32, F32, 64, 64, 256, "lda=64"},
		{"lda transposed", true, false, 256, 128, 64, F32, F32, F32, 63, 64, 256, "lda=63"},
		{"ldc too small", false, false, 256, 128, 64, F32, F32, F32, 256, 64, 128, "ldc=128"},
		{"mixed inputs", false, false, 4, 4, 4, F32, BF16, F32, 4, 4, 4, "must match"},
		{"f64", false, false, 4, 4, 4, F64, F64, F64, 4, 4, 4, "GEMM on f64"},
		{"huge", false, false, 1 << 31, 1, 1, F32, F32, F32, 1 << 31, 1, 1 << 31, "exceeds cuBLAS's int"},
	} {
		err := checkGemm(tc.ta, tc.tb, tc.m, tc.n, tc.k, tc.at, tc.lda, tc.bt, tc.ldb, tc.ct, tc.ldc)
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%s: %v", tc.name, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%s: %v, want an error with %q", tc.name, err, tc.want)
		}
	}
}

func TestEpilogues(t *testing.T) {
	for _, tc := range []struct {
		ep   Epilogue
		lt   uint32
		bias bool
	}{
		{EpilogueNone, ltEpilogueDefault, false},
		{EpilogueBias, ltEpilogueBias, true},
		{EpilogueGelu, ltEpilogueGelu, false},
		{EpilogueGeluBias, ltEpilogueGeluBias, true},
		{EpilogueBiasGrad, ltEpilogueBGradB, true},
		{EpilogueBiasGradA, ltEpilogueBGradA, true},
	} {
		lt, ok := tc.ep.lt()
		if !ok || lt != tc.lt || tc.ep.usesBias() != tc.bias {
			t.Errorf("%s: cublasLtEpilogue_t %d (ok %v), bias %v; want %d, %v", tc.ep, lt, ok, tc.ep.usesBias(), tc.lt, tc.bias)
		}
	}
	if _, ok := Epilogue(99).lt(); ok {
		t.Error("an unknown epilogue maps to cuBLASLt")
	}
	// GELU_BIAS is GELU | BIAS in cublasLt.h.
	if ltEpilogueGeluBias != ltEpilogueGelu|ltEpilogueBias {
		t.Error("CUBLASLT_EPILOGUE_GELU_BIAS is not GELU|BIAS")
	}
}

func TestAlignment(t *testing.T) {
	for p, want := range map[Ptr]uint32{0x7f0000000000: 256, 0x7f0000000100: 256, 0x7f0000000080: 128, 0x7f0000000010: 16, 0x7f0000000004: 4, 0x7f0000000002: 2, 0x7f0000000001: 1} {
		if got := alignment(p); got != want {
			t.Errorf("alignment(%#x) = %d, want %d", uintptr(p), got, want)
		}
	}
}

func TestCStructSizes(t *testing.T) {
	for _, tc := range []struct {
		name      string
		got, want uintptr
	}{
		// cublasLtMatmulHeuristicResult_t: uint64_t[8] algo, size_t, status, float, int[4].
		{"cublasLtMatmulHeuristicResult_t", unsafe.Sizeof(ltHeuristic{}), 96},
		// CUmemLocation: CUmemLocationType type; int id.
		{"CUmemLocation", unsafe.Sizeof(memLocation{}), 8},
		// ncclUniqueId: char internal[NCCL_UNIQUE_ID_BYTES = 128].
		{"ncclUniqueId", unsafe.Sizeof(ncclUniqueID{}), 128},
	} {
		if tc.got != tc.want {
			t.Errorf("%s is %d bytes, want %d", tc.name, tc.got, tc.want)
		}
	}
}

// TestMatmulRefused: the backend does an epilogue's work itself only for
// what cuBLASLt answered before it queued anything — no algorithm, a
// combination it does not support, arguments it takes as invalid — and
// never for a failure of the driver or a kernel.
func TestMatmulRefused(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want bool
	}{
		{fmt.Errorf("cuda: matmul 8×8×8 (dgelu): %w", errNoAlgorithm), true},
		{&Error{Op: "cublasLtMatmulAlgoGetHeuristic", Code: cublasStatusNotSupported}, true},
		{fmt.Errorf("cuda: matmul: %w", &Error{Op: "cublasLtMatmul", Code: cublasStatusInvalidValue}), true},
		{&Error{Op: "cublasLtMatmul", Code: 13}, false},                      // CUBLAS_STATUS_EXECUTION_FAILED
		{&Error{Op: "cuMemAlloc_v2", Code: cublasStatusInvalidValue}, false}, // CUDA_ERROR_... 7, the driver's
		{&Error{Op: "cublasGemmEx", Code: cublasStatusNotSupported}, false},  // not cuBLASLt's
		{errors.New("cuda: launching cast_f32_bf16: too many resources"), false},
		{nil, false},
	} {
		if got := matmulRefused(tc.err); got != tc.want {
			t.Errorf("matmulRefused(%v) = %v, want %v", tc.err, got, tc.want)
		}
	}
}

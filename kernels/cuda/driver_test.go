package cuda

import (
	"errors"
	"fmt"
	"strings"
	"testing"
)

func TestErrorText(t *testing.T) {
	for _, tc := range []struct {
		err  *Error
		want string
	}{
		{&Error{Op: "cuMemAlloc_v2", Code: 2, Name: "CUDA_ERROR_OUT_OF_MEMORY", Msg: "out of memory"},
			"cuMemAlloc_v2: CUDA_ERROR_OUT_OF_MEMORY (2): out of memory"},
		{&Error{Op: "nvrtcCompileProgram", Code: 6, Name: "NVRTC_ERROR_COMPILATION"},
			"nvrtcCompileProgram: NVRTC_ERROR_COMPILATION (6)"},
		{&Error{Op: "cublasGemmEx", Code: 15, Name: "CUBLAS_STATUS_NOT_SUPPORTED", Msg: "CUBLAS_STATUS_NOT_SUPPORTED"},
			"cublasGemmEx: CUBLAS_STATUS_NOT_SUPPORTED (15)"},
		{&Error{Op: "cuInit", Code: 999},
			"cuInit: error (999)"},
	} {
		if got := tc.err.Error(); got != tc.want {
			t.Errorf("Error() = %q, want %q", got, tc.want)
		}
		wrapped := fmt.Errorf("cuda: device 0: alloc: %w", tc.err)
		var e *Error
		if !errors.As(wrapped, &e) || e != tc.err {
			t.Errorf("errors.As did not find the *Error in %v", wrapped)
		}
	}
}

func TestLibraryErrorNames(t *testing.T) {
	var noLib *blasAPI // no cublasGetStatusName: the table names it
	for code, want := range map[int32]string{
		7:  "CUBLAS_STATUS_INVALID_VALUE",
		13: "CUBLAS_STATUS_EXECUTION_FAILED",
		15: "CUBLAS_STATUS_NOT_SUPPORTED",
	} {
		err := noLib.check("cublasGemmEx", code)
		var e *Error
		if !errors.As(err, &e) || e.Name != want || e.Code != int(code) || !strings.Contains(err.Error(), want) {
			t.Errorf("cuBLAS status %d: %v, want %s", code, err, want)
		}
	}
	if err := noLib.check("cublasGemmEx", 0); err != nil {
		t.Errorf("CUBLAS_STATUS_SUCCESS gave %v", err)
	}
	for code, want := range map[int]string{1: "ncclUnhandledCudaError", 5: "ncclInvalidUsage", 6: "ncclRemoteError", 7: "ncclInProgress", 8: "ncclTimeout"} {
		if ncclResultNames[code] != want {
			t.Errorf("ncclResult_t %d named %q, want %q", code, ncclResultNames[code], want)
		}
	}
	d := &driverAPI{} // no cuGetErrorName bound: the code still shows
	if err := d.check("cuCtxSetCurrent", 201); err == nil || err.Error() != "cuCtxSetCurrent: error (201)" {
		t.Errorf("driver error without names: %v", err)
	}
}

func TestLibraryNames(t *testing.T) {
	for lib, want := range map[Library]string{
		LibCUDA: "libcuda.so", LibNVRTC: "libnvrtc.so", LibCUBLAS: "libcublas.so",
		LibCUBLASLt: "libcublasLt.so", LibNCCL: "libnccl.so", Library(9): "Library(9)",
	} {
		if got := lib.String(); got != want {
			t.Errorf("Library(%d) = %s, want %s", int(lib), got, want)
		}
	}
}

func TestIsELF(t *testing.T) {
	if !isELF([]byte("\x7fELF\x02\x01")) || isELF([]byte("//\n.version 8.0")) || isELF(nil) {
		t.Error("isELF tells CUBIN from PTX wrongly")
	}
}

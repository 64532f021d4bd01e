package cuda

import (
	"errors"
	"fmt"
	"runtime"
	"strings"
	"unsafe"
)

// DataType is an element type. Its values are CUDA's cudaDataType_t
// (library_types.h), which cuBLAS takes as is; NCCL gets its own codes.
type DataType int

// The element types (library_types.h, enum cudaDataType_t).
const (
	F32  DataType = 0  // CUDA_R_32F = 0
	F64  DataType = 1  // CUDA_R_64F = 1
	F16  DataType = 2  // CUDA_R_16F = 2
	I32  DataType = 10 // CUDA_R_32I = 10
	BF16 DataType = 14 // CUDA_R_16BF = 14
)

// Size returns the bytes of one element, or 0 for an unknown type.
func (t DataType) Size() int {
	switch t {
	case F32, I32:
		return 4
	case F64:
		return 8
	case F16, BF16:
		return 2
	}
	return 0
}

// String returns "f32", "bf16" and so on.
func (t DataType) String() string {
	switch t {
	case F32:
		return "f32"
	case F64:
		return "f64"
	case F16:
		return "f16"
	case I32:
		return "i32"
	case BF16:
		return "bf16"
	}
	return fmt.Sprintf("DataType(%d)", int(t))
}

// cuBLAS and cuBLASLt constants (cublas_api.h, cublasLt.h; checked
// against the CUDA 12/13 headers and cuBLAS documentation).
const (
	cublasStatusSuccess = 0 // CUBLAS_STATUS_SUCCESS = 0

	cublasOpN = 0 // CUBLAS_OP_N = 0
	cublasOpT = 1 // CUBLAS_OP_T = 1

	cublasDefaultMath = 0 // CUBLAS_DEFAULT_MATH = 0 (no TF32 for fp32 routines)

	cublasCompute32F         = 68 // CUBLAS_COMPUTE_32F = 68
	cublasCompute32FPedantic = 69 // CUBLAS_COMPUTE_32F_PEDANTIC = 69: no tensor cores, no TF32, no emulation, fp32 reductions
	cublasCompute32FFastTF32 = 77 // CUBLAS_COMPUTE_32F_FAST_TF32 = 77

	cublasGemmDefault = -1 // CUBLAS_GEMM_DEFAULT = -1

	ltDescTransA       = 3  // CUBLASLT_MATMUL_DESC_TRANSA = 3 (int32_t, cublasOperation_t)
	ltDescTransB       = 4  // CUBLASLT_MATMUL_DESC_TRANSB = 4 (int32_t)
	ltDescEpilogue     = 7  // CUBLASLT_MATMUL_DESC_EPILOGUE = 7 (uint32_t)
	ltDescBiasPointer  = 8  // CUBLASLT_MATMUL_DESC_BIAS_POINTER = 8 (void *)
	ltDescAuxPointer   = 11 // CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER = 11 (void *)
	ltDescAuxLD        = 12 // CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD = 12 (int64_t)
	ltPrefMaxWorkspace = 1  // CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES = 1 (uint64_t)
	ltPrefMinAlignA    = 5  // CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES = 5 (uint32_t, default 256)
	ltPrefMinAlignB    = 6  // CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES = 6
	ltPrefMinAlignC    = 7  // CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES = 7
	ltPrefMinAlignD    = 8  // CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES = 8

	ltEpilogueDefault     = 1   // CUBLASLT_EPILOGUE_DEFAULT = 1
	ltEpilogueBias        = 4   // CUBLASLT_EPILOGUE_BIAS = 4
	ltEpilogueGelu        = 32  // CUBLASLT_EPILOGUE_GELU = 32
	ltEpilogueGeluBias    = 36  // CUBLASLT_EPILOGUE_GELU_BIAS = CUBLASLT_EPILOGUE_GELU | CUBLASLT_EPILOGUE_BIAS
	ltEpilogueGeluAuxBias = 164 // CUBLASLT_EPILOGUE_GELU_AUX_BIAS = (CUBLASLT_EPILOGUE_GELU | 128) | CUBLASLT_EPILOGUE_BIAS
	ltEpilogueDGelu       = 192 // CUBLASLT_EPILOGUE_DGELU = 64 | 128
	ltEpilogueBGradA      = 256 // CUBLASLT_EPILOGUE_BGRADA = 256
	ltEpilogueBGradB      = 512 // CUBLASLT_EPILOGUE_BGRADB = 512
)

// WorkspaceBytes is the workspace a BLAS gives cuBLAS and cuBLASLt.
const WorkspaceBytes = 32 << 20

// cublasStatusNames names cublasStatus_t values, for libraries too old
// to have cublasGetStatusName.
var cublasStatusNames = map[int]string{
	0:  "CUBLAS_STATUS_SUCCESS",
	1:  "CUBLAS_STATUS_NOT_INITIALIZED",
	3:  "CUBLAS_STATUS_ALLOC_FAILED",
	7:  "CUBLAS_STATUS_INVALID_VALUE",
	8:  "CUBLAS_STATUS_ARCH_MISMATCH",
	11: "CUBLAS_STATUS_MAPPING_ERROR",
	13: "CUBLAS_STATUS_EXECUTION_FAILED",
	14: "CUBLAS_STATUS_INTERNAL_ERROR",
	15: "CUBLAS_STATUS_NOT_SUPPORTED",
	16: "CUBLAS_STATUS_LICENSE_ERROR",
}

// ltHeuristic is cublasLtMatmulHeuristicResult_t: { cublasLtMatmulAlgo_t
// algo (uint64_t data[8]); size_t workspaceSize; cublasStatus_t state;
// float wavesCount; int reserved[4]; } (96 bytes).
type ltHeuristic struct {
	Algo          [8]uint64
	WorkspaceSize uint64
	State         int32
	WavesCount    float32
	Reserved      [4]int32
}

// blasAPI is libcublas's and libcublasLt's functions; each binding's
// declaration (cublas_api.h, cublasLt.h) is beside it. Handles and
// descriptors are pointers.
type blasAPI struct {
	path, ltPath string

	// cublasStatus_t cublasCreate_v2(cublasHandle_t *handle);
	create func(h *uintptr) int32
	// cublasStatus_t cublasDestroy_v2(cublasHandle_t handle);
	destroy func(h uintptr) int32
	// cublasStatus_t cublasSetStream_v2(cublasHandle_t handle, cudaStream_t streamId);
	setStream func(h, s uintptr) int32
	// cublasStatus_t cublasSetMathMode(cublasHandle_t handle, cublasMath_t mode);
	setMathMode func(h uintptr, mode int32) int32
	// cublasStatus_t cublasSetWorkspace_v2(cublasHandle_t handle, void *workspace, size_t workspaceSizeInBytes); (optional)
	setWorkspace func(h uintptr, ws uintptr, n uint64) int32
	// cublasStatus_t cublasGetVersion_v2(cublasHandle_t handle, int *version);
	getVersion func(h uintptr, v *int32) int32
	// const char *cublasGetStatusName(cublasStatus_t status); (optional)
	statusName func(s int32) string
	// const char *cublasGetStatusString(cublasStatus_t status); (optional)
	statusString func(s int32) string
	// cublasStatus_t cublasGemmEx(cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb,
	//   int m, int n, int k, const void *alpha, const void *A, cudaDataType_t Atype, int lda,
	//   const void *B, cudaDataType_t Btype, int ldb, const void *beta, void *C, cudaDataType_t Ctype, int ldc,
	//   cublasComputeType_t computeType, cublasGemmAlgo_t algo);
	gemmEx func(h uintptr, ta, tb int32, m, n, k int32, alpha unsafe.Pointer, a uintptr, at int32, lda int32,
		b uintptr, bt int32, ldb int32, beta unsafe.Pointer, c uintptr, ct int32, ldc int32, compute int32, algo int32) int32
	// cublasStatus_t cublasGemmStridedBatchedEx(cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb,
	//   int m, int n, int k, const void *alpha, const void *A, cudaDataType_t Atype, int lda, long long int strideA,
	//   const void *B, cudaDataType_t Btype, int ldb, long long int strideB, const void *beta,
	//   void *C, cudaDataType_t Ctype, int ldc, long long int strideC, int batchCount,
	//   cublasComputeType_t computeType, cublasGemmAlgo_t algo);
	gemmStridedBatchedEx func(h uintptr, ta, tb int32, m, n, k int32, alpha unsafe.Pointer, a uintptr, at int32, lda int32, sa int64,
		b uintptr, bt int32, ldb int32, sb int64, beta unsafe.Pointer, c uintptr, ct int32, ldc int32, sc int64, batch int32,
		compute int32, algo int32) int32

	// cublasStatus_t cublasLtCreate(cublasLtHandle_t *lightHandle);
	ltCreate func(h *uintptr) int32
	// cublasStatus_t cublasLtDestroy(cublasLtHandle_t lightHandle);
	ltDestroy func(h uintptr) int32
	// cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t *matmulDesc, cublasComputeType_t computeType, cudaDataType_t scaleType);
	ltDescCreate func(d *uintptr, compute, scale int32) int32
	// cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t matmulDesc);
	ltDescDestroy func(d uintptr) int32
	// cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t matmulDesc, cublasLtMatmulDescAttributes_t attr, const void *buf, size_t sizeInBytes);
	ltDescSetAttr func(d uintptr, attr int32, buf unsafe.Pointer, n uint64) int32
	// cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t *matLayout, cudaDataType type, uint64_t rows, uint64_t cols, int64_t ld);
	ltLayoutCreate func(l *uintptr, t int32, rows, cols uint64, ld int64) int32
	// cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t matLayout);
	ltLayoutDestroy func(l uintptr) int32
	// cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t *pref);
	ltPrefCreate func(p *uintptr) int32
	// cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t pref);
	ltPrefDestroy func(p uintptr) int32
	// cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t pref, cublasLtMatmulPreferenceAttributes_t attr, const void *buf, size_t sizeInBytes);
	ltPrefSetAttr func(p uintptr, attr int32, buf unsafe.Pointer, n uint64) int32
	// cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t lightHandle, cublasLtMatmulDesc_t operationDesc,
	//   cublasLtMatrixLayout_t Adesc, cublasLtMatrixLayout_t Bdesc, cublasLtMatrixLayout_t Cdesc, cublasLtMatrixLayout_t Ddesc,
	//   cublasLtMatmulPreference_t preference, int requestedAlgoCount,
	//   cublasLtMatmulHeuristicResult_t heuristicResultsArray[], int *returnAlgoCount);
	ltHeuristic func(h, desc, a, b, c, d, pref uintptr, requested int32, results *ltHeuristic, returned *int32) int32
	// cublasStatus_t cublasLtMatmul(cublasLtHandle_t lightHandle, cublasLtMatmulDesc_t computeDesc,
	//   const void *alpha, const void *A, cublasLtMatrixLayout_t Adesc, const void *B, cublasLtMatrixLayout_t Bdesc,
	//   const void *beta, const void *C, cublasLtMatrixLayout_t Cdesc, void *D, cublasLtMatrixLayout_t Ddesc,
	//   const cublasLtMatmulAlgo_t *algo, void *workspace, size_t workspaceSizeInBytes, cudaStream_t stream);
	ltMatmul func(h, desc uintptr, alpha unsafe.Pointer, a, aL, b, bL uintptr, beta unsafe.Pointer, c, cL, d, dL uintptr,
		algo *[8]uint64, ws uintptr, wsBytes uint64, s uintptr) int32
}

// check turns a cublasStatus_t into nil or an *Error.
func (a *blasAPI) check(op string, r int32) error {
	if r == cublasStatusSuccess {
		return nil
	}
	return &Error{Op: op, Code: int(r), Name: a.name(r), Msg: a.msg(r)}
}

func (a *blasAPI) name(r int32) string {
	if a != nil && a.statusName != nil {
		if s := a.statusName(r); s != "" {
			return s
		}
	}
	return cublasStatusNames[int(r)]
}

func (a *blasAPI) msg(r int32) string {
	if a != nil && a.statusString != nil {
		return a.statusString(r)
	}
	return ""
}

// loadBLAS loads cuBLASLt and cuBLAS (from the same folder) and binds them.
func loadBLAS() (*blasAPI, error) {
	h, err := load(LibCUBLAS)
	if err != nil {
		return nil, fmt.Errorf("cuda: %w", err)
	}
	loadMu.Lock()
	lt := loaded[LibCUBLASLt]
	loadMu.Unlock()
	if lt == nil {
		return nil, fmt.Errorf("cuda: %s was loaded without %s", h.path, LibCUBLASLt)
	}
	a := &blasAPI{path: h.path, ltPath: lt.path}
	for _, b := range []struct {
		h     *handle
		fn    any
		names []string
	}{
		{h, &a.create, []string{"cublasCreate_v2"}},
		{h, &a.destroy, []string{"cublasDestroy_v2"}},
		{h, &a.setStream, []string{"cublasSetStream_v2"}},
		{h, &a.setMathMode, []string{"cublasSetMathMode"}},
		{h, &a.getVersion, []string{"cublasGetVersion_v2"}},
		{h, &a.gemmEx, []string{"cublasGemmEx"}},
		{h, &a.gemmStridedBatchedEx, []string{"cublasGemmStridedBatchedEx"}},
		{lt, &a.ltCreate, []string{"cublasLtCreate"}},
		{lt, &a.ltDestroy, []string{"cublasLtDestroy"}},
		{lt, &a.ltDescCreate, []string{"cublasLtMatmulDescCreate"}},
		{lt, &a.ltDescDestroy, []string{"cublasLtMatmulDescDestroy"}},
		{lt, &a.ltDescSetAttr, []string{"cublasLtMatmulDescSetAttribute"}},
		{lt, &a.ltLayoutCreate, []string{"cublasLtMatrixLayoutCreate"}},
		{lt, &a.ltLayoutDestroy, []string{"cublasLtMatrixLayoutDestroy"}},
		{lt, &a.ltPrefCreate, []string{"cublasLtMatmulPreferenceCreate"}},
		{lt, &a.ltPrefDestroy, []string{"cublasLtMatmulPreferenceDestroy"}},
		{lt, &a.ltPrefSetAttr, []string{"cublasLtMatmulPreferenceSetAttribute"}},
		{lt, &a.ltHeuristic, []string{"cublasLtMatmulAlgoGetHeuristic"}},
		{lt, &a.ltMatmul, []string{"cublasLtMatmul"}},
	} {
		if err := b.h.sym(b.fn, b.names...); err != nil {
			return nil, fmt.Errorf("cuda: %w", err)
		}
	}
	if !h.optSym(&a.setWorkspace, "cublasSetWorkspace_v2") {
		a.setWorkspace = nil
	}
	if !h.optSym(&a.statusName, "cublasGetStatusName") {
		a.statusName = nil
	}
	if !h.optSym(&a.statusString, "cublasGetStatusString") {
		a.statusString = nil
	}
	return a, nil
}

// BLAS runs GEMMs on one stream of a device with cuBLAS and cuBLASLt. It
// is not safe for concurrent use; give each stream its own.
type BLAS struct {
	d      *Device
	api    *blasAPI
	h, lt  uintptr
	s      Stream
	ws     Ptr
	tf32   bool
	plans  map[ltKey]*ltPlan
	closed bool
}

// NewBLAS creates cuBLAS and cuBLASLt handles (cublasCreate_v2,
// cublasLtCreate) that queue their work on stream s, with a workspace of
// WorkspaceBytes shared by both (they run in stream order).
func (d *Device) NewBLAS(s Stream) (*BLAS, error) {
	api, err := loadBLAS()
	if err != nil {
		return nil, err
	}
	ws, err := d.Alloc(WorkspaceBytes)
	if err != nil {
		return nil, err
	}
	defer runtime.UnlockOSThread()
	if err := d.enter(); err != nil {
		d.Free(ws)
		return nil, err
	}
	b := &BLAS{d: d, api: api, s: s, ws: ws, plans: map[ltKey]*ltPlan{}}
	fail := func(op string, r int32) (*BLAS, error) {
		err := api.check(op, r)
		b.release()
		return nil, fmt.Errorf("cuda: %s: %w", api.path, err)
	}
	if r := api.create(&b.h); r != cublasStatusSuccess {
		return fail("cublasCreate_v2", r)
	}
	if r := api.setStream(b.h, uintptr(s)); r != cublasStatusSuccess {
		return fail("cublasSetStream_v2", r)
	}
	if r := api.setMathMode(b.h, cublasDefaultMath); r != cublasStatusSuccess {
		return fail("cublasSetMathMode", r)
	}
	if api.setWorkspace != nil {
		if r := api.setWorkspace(b.h, uintptr(ws), WorkspaceBytes); r != cublasStatusSuccess {
			return fail("cublasSetWorkspace_v2", r)
		}
	}
	if r := api.ltCreate(&b.lt); r != cublasStatusSuccess {
		return fail("cublasLtCreate", r)
	}
	return b, nil
}

// release frees what the handle holds, with the context current.
func (b *BLAS) release() error {
	var errs []error
	a := b.api
	for k, p := range b.plans {
		p.destroy(a)
		delete(b.plans, k)
	}
	if b.lt != 0 {
		errs = append(errs, a.check("cublasLtDestroy", a.ltDestroy(b.lt)))
		b.lt = 0
	}
	if b.h != 0 {
		errs = append(errs, a.check("cublasDestroy_v2", a.destroy(b.h)))
		b.h = 0
	}
	if b.ws != 0 {
		errs = append(errs, b.d.api.check("cuMemFree_v2", b.d.api.memFree(uint64(b.ws))))
		b.ws = 0
	}
	return errors.Join(errs...)
}

// Close destroys the handles and frees the workspace, after the stream's
// queued work is done.
func (b *BLAS) Close() error {
	if b.closed {
		return nil
	}
	b.closed = true
	defer runtime.UnlockOSThread()
	if err := b.d.enter(); err != nil {
		return err
	}
	if err := b.d.api.check("cuStreamSynchronize", b.d.api.streamSynchronize(uintptr(b.s))); err != nil {
		return errors.Join(fmt.Errorf("cuda: closing BLAS: %w", err), b.release())
	}
	if err := b.release(); err != nil {
		return fmt.Errorf("cuda: closing BLAS: %w", err)
	}
	return nil
}

// Version returns cuBLAS's version (cublasGetVersion_v2), such as 130000.
func (b *BLAS) Version() (int, error) {
	defer runtime.UnlockOSThread()
	if err := b.d.enter(); err != nil {
		return 0, err
	}
	var v int32
	if err := b.api.check("cublasGetVersion_v2", b.api.getVersion(b.h, &v)); err != nil {
		return 0, fmt.Errorf("cuda: %w", err)
	}
	return int(v), nil
}

// Stream returns the stream b queues its work on.
func (b *BLAS) Stream() Stream { return b.s }

// Paths returns where cuBLAS and cuBLASLt were loaded from.
func (b *BLAS) Paths() (cublas, cublasLt string) { return b.api.path, b.api.ltPath }

// AllowTF32 lets Matmul with fp32 inputs use TF32 tensor cores
// (CUBLAS_COMPUTE_32F_FAST_TF32); off by default, when fp32 matmuls are
// IEEE fp32. Gemm decides per call with its exact argument.
func (b *BLAS) AllowTF32(on bool) { b.tf32 = on }

func blasOp(trans bool) int32 {
	if trans {
		return cublasOpT
	}
	return cublasOpN
}

// gemmCompute picks cuBLAS's compute type: fp32 accumulation always;
// for fp32 inputs, exact forbids TF32 and any other shortcut
// (CUBLAS_COMPUTE_32F_PEDANTIC, which no math mode or environment
// override such as NVIDIA_TF32_OVERRIDE turns into TF32), and !exact
// allows TF32 (CUBLAS_COMPUTE_32F_FAST_TF32).
func gemmCompute(at, bt DataType, exact bool) int32 {
	if at == F32 && bt == F32 {
		if exact {
			return cublasCompute32FPedantic
		}
		return cublasCompute32FFastTF32
	}
	return cublasCompute32F
}

// checkGemm validates a GEMM's shapes in cuBLAS's column-major terms.
func checkGemm(transA, transB bool, m, n, k int, at DataType, lda int, bt DataType, ldb int, ct DataType, ldc int) error {
	if m <= 0 || n <= 0 || k <= 0 {
		return fmt.Errorf("cuda: GEMM of %d×%d×%d", m, n, k)
	}
	for _, t := range []DataType{at, bt, ct} {
		if t != F32 && t != F16 && t != BF16 {
			return fmt.Errorf("cuda: GEMM on %s; use f32, f16 or bf16", t)
		}
	}
	if at != bt {
		return fmt.Errorf("cuda: GEMM with A in %s and B in %s; they must match", at, bt)
	}
	rowsA := m
	if transA {
		rowsA = k
	}
	rowsB := k
	if transB {
		rowsB = n
	}
	if lda < rowsA || ldb < rowsB || ldc < m {
		return fmt.Errorf("cuda: GEMM leading dimensions lda=%d ldb=%d ldc=%d below the rows %d, %d, %d", lda, ldb, ldc, rowsA, rowsB, m)
	}
	const maxInt32 = 1<<31 - 1
	for _, v := range []int{m, n, k, lda, ldb, ldc} {
		if v > maxInt32 {
			return fmt.Errorf("cuda: GEMM dimension %d exceeds cuBLAS's int", v)
		}
	}
	return nil
}

// Gemm computes C(m,n) = alpha·op(A)·op(B) + beta·C with cublasGemmEx in
// cuBLAS's column-major convention: op(A) is m×k, op(B) k×n, lda, ldb and
// ldc are the column strides in elements. A and B share a type; C may be
// another (f32 output of bf16 inputs). Accumulation is fp32; with exact,
// fp32 inputs are multiplied in IEEE fp32, never TF32.
func (b *BLAS) Gemm(transA, transB bool, m, n, k int, alpha float32, a Ptr, at DataType, lda int, bm Ptr, bt DataType, ldb int, beta float32, c Ptr, ct DataType, ldc int, exact bool) error {
	if err := checkGemm(transA, transB, m, n, k, at, lda, bt, ldb, ct, ldc); err != nil {
		return err
	}
	defer runtime.UnlockOSThread()
	if err := b.d.enter(); err != nil {
		return err
	}
	r := b.api.gemmEx(b.h, blasOp(transA), blasOp(transB), int32(m), int32(n), int32(k),
		unsafe.Pointer(&alpha), uintptr(a), int32(at), int32(lda),
		uintptr(bm), int32(bt), int32(ldb),
		unsafe.Pointer(&beta), uintptr(c), int32(ct), int32(ldc),
		gemmCompute(at, bt, exact), cublasGemmDefault)
	if err := b.api.check("cublasGemmEx", r); err != nil {
		return fmt.Errorf("cuda: GEMM %d×%d×%d %s→%s: %w", m, n, k, at, ct, err)
	}
	return nil
}

// GemmStridedBatched is Gemm over batch matrices at strides sa, sb and sc
// elements apart (cublasGemmStridedBatchedEx).
func (b *BLAS) GemmStridedBatched(transA, transB bool, m, n, k int, alpha float32, a Ptr, at DataType, lda int, sa int64, bm Ptr, bt DataType, ldb int, sb int64, beta float32, c Ptr, ct DataType, ldc int, sc int64, batch int, exact bool) error {
	if err := checkGemm(transA, transB, m, n, k, at, lda, bt, ldb, ct, ldc); err != nil {
		return err
	}
	if batch <= 0 || batch > 1<<31-1 {
		return fmt.Errorf("cuda: batched GEMM of %d matrices", batch)
	}
	defer runtime.UnlockOSThread()
	if err := b.d.enter(); err != nil {
		return err
	}
	r := b.api.gemmStridedBatchedEx(b.h, blasOp(transA), blasOp(transB), int32(m), int32(n), int32(k),
		unsafe.Pointer(&alpha), uintptr(a), int32(at), int32(lda), sa,
		uintptr(bm), int32(bt), int32(ldb), sb,
		unsafe.Pointer(&beta), uintptr(c), int32(ct), int32(ldc), sc, int32(batch),
		gemmCompute(at, bt, exact), cublasGemmDefault)
	if err := b.api.check("cublasGemmStridedBatchedEx", r); err != nil {
		return fmt.Errorf("cuda: batched GEMM %d×(%d×%d×%d) %s→%s: %w", batch, m, n, k, at, ct, err)
	}
	return nil
}

// Epilogue is what cuBLASLt's Matmul does to the product before storing it.
type Epilogue int

// The epilogues. Bias vectors have C's element type.
const (
	// EpilogueNone stores the product.
	EpilogueNone Epilogue = iota
	// EpilogueBias adds bias[i] to row i of D (column-major), that is
	// per output feature when D holds one token per column
	// (CUBLASLT_EPILOGUE_BIAS).
	EpilogueBias
	// EpilogueGelu applies GELU (cuBLASLt's, the tanh form) to the
	// product (CUBLASLT_EPILOGUE_GELU).
	EpilogueGelu
	// EpilogueGeluBias adds the bias, then applies GELU
	// (CUBLASLT_EPILOGUE_GELU_BIAS).
	EpilogueGeluBias
	// EpilogueBiasGrad also writes to bias the sums over k of op(B):
	// one per column of D (CUBLASLT_EPILOGUE_BGRADB). It fits the weight
	// gradient GEMM of a linear layer out = in·Wᵀ + b stored row-major:
	// dW (C×OC column-major) = in (C×N) · doutᵀ (N×OC), with m=C, n=OC,
	// k=N tokens, transB set, and db[o] = Σ_tokens dout[token][o], the
	// sum over k of op(B)'s column o.
	EpilogueBiasGrad
	// EpilogueBiasGradA writes to bias the sums over k of op(A): one per
	// row of D (CUBLASLT_EPILOGUE_BGRADA), for the transposed layout.
	EpilogueBiasGradA
	// EpilogueGeluAuxBias adds the bias, stores the sum into the
	// auxiliary matrix (GELU's input, for the backward pass), then
	// applies GELU into D (CUBLASLT_EPILOGUE_GELU_AUX_BIAS).
	EpilogueGeluAuxBias
	// EpilogueDGelu multiplies the product by GELU's derivative at the
	// auxiliary matrix, GELU's input of the forward pass
	// (CUBLASLT_EPILOGUE_DGELU).
	EpilogueDGelu
)

// AuxAlign is the multiple of elements an auxiliary matrix's leading
// dimension has to be (CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD: "must be
// divisible by 8" for GELU's input).
const AuxAlign = 8

// lt returns cuBLASLt's cublasLtEpilogue_t for e.
func (e Epilogue) lt() (uint32, bool) {
	switch e {
	case EpilogueNone:
		return ltEpilogueDefault, true
	case EpilogueBias:
		return ltEpilogueBias, true
	case EpilogueGelu:
		return ltEpilogueGelu, true
	case EpilogueGeluBias:
		return ltEpilogueGeluBias, true
	case EpilogueBiasGrad:
		return ltEpilogueBGradB, true
	case EpilogueBiasGradA:
		return ltEpilogueBGradA, true
	case EpilogueGeluAuxBias:
		return ltEpilogueGeluAuxBias, true
	case EpilogueDGelu:
		return ltEpilogueDGelu, true
	}
	return 0, false
}

// usesBias reports whether e reads or writes the bias vector.
func (e Epilogue) usesBias() bool {
	return e != EpilogueNone && e != EpilogueGelu && e != EpilogueDGelu
}

// usesAux reports whether e writes or reads the auxiliary matrix.
func (e Epilogue) usesAux() bool { return e == EpilogueGeluAuxBias || e == EpilogueDGelu }

// String names the epilogue.
func (e Epilogue) String() string {
	switch e {
	case EpilogueNone:
		return "none"
	case EpilogueBias:
		return "bias"
	case EpilogueGelu:
		return "gelu"
	case EpilogueGeluBias:
		return "gelu+bias"
	case EpilogueBiasGrad:
		return "bgradb"
	case EpilogueBiasGradA:
		return "bgrada"
	case EpilogueGeluAuxBias:
		return "gelu_aux+bias"
	case EpilogueDGelu:
		return "dgelu"
	}
	return fmt.Sprintf("Epilogue(%d)", int(e))
}

// ltKey identifies a Matmul shape; its plan (descriptors and the
// heuristic's algorithm) is made once and reused.
type ltKey struct {
	transA, transB bool
	m, n, k        int
	at, bt, ct     DataType
	lda, ldb, ldc  int
	ep             Epilogue
	compute        int32
	align          [5]uint32 // of A, B, C, the bias and the auxiliary matrix, in bytes (at most 256)
}

// alignment returns the largest power of two up to 256 that divides p,
// which cuBLASLt's heuristic needs to know (it assumes 256 otherwise).
func alignment(p Ptr) uint32 {
	a := uint32(256)
	for a > 1 && uint64(p)%uint64(a) != 0 {
		a >>= 1
	}
	return a
}

// ltPlan is a Matmul shape's descriptors and chosen algorithm.
type ltPlan struct {
	desc, aL, bL, cL, pref uintptr
	algo                   [8]uint64
}

func (p *ltPlan) destroy(a *blasAPI) {
	for _, l := range []uintptr{p.aL, p.bL, p.cL} {
		if l != 0 {
			a.ltLayoutDestroy(l)
		}
	}
	if p.desc != 0 {
		a.ltDescDestroy(p.desc)
	}
	if p.pref != 0 {
		a.ltPrefDestroy(p.pref)
	}
}

// plan makes (or finds) the descriptors and algorithm for key, with the
// context current.
func (b *BLAS) plan(key ltKey) (*ltPlan, error) {
	if p, ok := b.plans[key]; ok {
		return p, nil
	}
	a := b.api
	p := &ltPlan{}
	fail := func(op string, r int32) (*ltPlan, error) {
		p.destroy(a)
		return nil, a.check(op, r)
	}
	if r := a.ltDescCreate(&p.desc, key.compute, int32(F32)); r != cublasStatusSuccess {
		return fail("cublasLtMatmulDescCreate", r)
	}
	ta, tb := blasOp(key.transA), blasOp(key.transB)
	ep, _ := key.ep.lt()
	for _, at := range []struct {
		attr int32
		buf  unsafe.Pointer
		n    uint64
	}{
		{ltDescTransA, unsafe.Pointer(&ta), 4},
		{ltDescTransB, unsafe.Pointer(&tb), 4},
		{ltDescEpilogue, unsafe.Pointer(&ep), 4},
	} {
		if r := a.ltDescSetAttr(p.desc, at.attr, at.buf, at.n); r != cublasStatusSuccess {
			return fail("cublasLtMatmulDescSetAttribute", r)
		}
	}
	rowsA, colsA := key.m, key.k
	if key.transA {
		rowsA, colsA = key.k, key.m
	}
	rowsB, colsB := key.k, key.n
	if key.transB {
		rowsB, colsB = key.n, key.k
	}
	for _, l := range []struct {
		to         *uintptr
		t          DataType
		rows, cols int
		ld         int
	}{
		{&p.aL, key.at, rowsA, colsA, key.lda},
		{&p.bL, key.bt, rowsB, colsB, key.ldb},
		{&p.cL, key.ct, key.m, key.n, key.ldc},
	} {
		if r := a.ltLayoutCreate(l.to, int32(l.t), uint64(l.rows), uint64(l.cols), int64(l.ld)); r != cublasStatusSuccess {
			return fail("cublasLtMatrixLayoutCreate", r)
		}
	}
	if key.ep.usesBias() {
		// The heuristic looks at the bias pointer's alignment: an address
		// of the same alignment as the real one (set before each call)
		// stands for it.
		dummy := uint64(b.ws) + uint64(key.align[3]%256)
		if r := a.ltDescSetAttr(p.desc, ltDescBiasPointer, unsafe.Pointer(&dummy), 8); r != cublasStatusSuccess {
			return fail("cublasLtMatmulDescSetAttribute", r)
		}
	}
	if key.ep.usesAux() {
		// The auxiliary matrix has D's layout; its pointer, like the
		// bias's, stands in by its alignment.
		dummy, ld := uint64(b.ws)+uint64(key.align[4]%256), int64(key.ldc)
		if r := a.ltDescSetAttr(p.desc, ltDescAuxPointer, unsafe.Pointer(&dummy), 8); r != cublasStatusSuccess {
			return fail("cublasLtMatmulDescSetAttribute", r)
		}
		if r := a.ltDescSetAttr(p.desc, ltDescAuxLD, unsafe.Pointer(&ld), 8); r != cublasStatusSuccess {
			return fail("cublasLtMatmulDescSetAttribute", r)
		}
	}
	if r := a.ltPrefCreate(&p.pref); r != cublasStatusSuccess {
		return fail("cublasLtMatmulPreferenceCreate", r)
	}
	wsBytes := uint64(WorkspaceBytes)
	if r := a.ltPrefSetAttr(p.pref, ltPrefMaxWorkspace, unsafe.Pointer(&wsBytes), 8); r != cublasStatusSuccess {
		return fail("cublasLtMatmulPreferenceSetAttribute", r)
	}
	for i, attr := range []int32{ltPrefMinAlignA, ltPrefMinAlignB, ltPrefMinAlignC, ltPrefMinAlignD} {
		al := key.align[min(i, 2)] // D is C
		if r := a.ltPrefSetAttr(p.pref, attr, unsafe.Pointer(&al), 4); r != cublasStatusSuccess {
			return fail("cublasLtMatmulPreferenceSetAttribute", r)
		}
	}
	var res ltHeuristic
	var got int32
	if r := a.ltHeuristic(b.lt, p.desc, p.aL, p.bL, p.cL, p.cL, p.pref, 1, &res, &got); r != cublasStatusSuccess {
		return fail("cublasLtMatmulAlgoGetHeuristic", r)
	}
	if got == 0 || res.State != cublasStatusSuccess {
		p.destroy(a)
		return nil, errNoAlgorithm
	}
	p.algo = res.Algo
	b.plans[key] = p
	return p, nil
}

// errNoAlgorithm is a Matmul that cuBLASLt's heuristic has no algorithm
// for.
var errNoAlgorithm = errors.New("cuBLASLt has no algorithm for this matmul (alignment of the pointers or leading dimensions?)")

const (
	cublasStatusInvalidValue = 7  // CUBLAS_STATUS_INVALID_VALUE
	cublasStatusNotSupported = 15 // CUBLAS_STATUS_NOT_SUPPORTED
)

// matmulRefused reports whether err is a Matmul that cuBLASLt refused
// before it launched anything: no algorithm for it, a combination of
// types or an epilogue it does not support, or arguments it takes as
// invalid (a version checking an epilogue's attributes more strictly
// than the documentation says) — its calls answer those synchronously,
// before they queue work. The caller may do the work another way; the
// stand-in cuBLASLt's tests, which refuse nothing, catch arguments of
// gptui's that are wrong (TestBF16OnStandin).
func matmulRefused(err error) bool {
	var e *Error
	if errors.Is(err, errNoAlgorithm) {
		return true
	}
	return errors.As(err, &e) && strings.HasPrefix(e.Op, "cublasLt") &&
		(e.Code == cublasStatusNotSupported || e.Code == cublasStatusInvalidValue)
}

// Matmul computes D = alpha·op(A)·op(B) + beta·C with cuBLASLt, then the
// epilogue, in the column-major terms of Gemm; D is stored over C (C and
// D are the same matrix, of type ct). bias is the epilogue's vector (of
// type ct), 0 when the epilogue has none; aux its auxiliary matrix, of
// D's type and layout (leading dimension ldc, a multiple of AuxAlign),
// 0 when it has none. For fp32 inputs the product is
// IEEE fp32 unless AllowTF32 is on. Each distinct shape is planned once
// (descriptors and cuBLASLt's heuristic) and reused.
func (b *BLAS) Matmul(transA, transB bool, m, n, k int, alpha float32, a Ptr, at DataType, lda int, bm Ptr, bt DataType, ldb int, beta float32, c Ptr, ct DataType, ldc int, ep Epilogue, bias, aux Ptr) error {
	if err := checkGemm(transA, transB, m, n, k, at, lda, bt, ldb, ct, ldc); err != nil {
		return err
	}
	if _, ok := ep.lt(); !ok {
		return fmt.Errorf("cuda: unknown epilogue %d", int(ep))
	}
	if ep.usesBias() && bias == 0 {
		return fmt.Errorf("cuda: matmul epilogue %s needs a bias vector", ep)
	}
	if ep.usesAux() && aux == 0 {
		return fmt.Errorf("cuda: matmul epilogue %s needs an auxiliary matrix", ep)
	}
	if ep.usesAux() && ldc%AuxAlign != 0 {
		// cuBLASLt takes no other; the caller may do the work another way.
		return fmt.Errorf("cuda: matmul %d×%d×%d (%s): %w: the auxiliary matrix's leading dimension %d is not a multiple of %d",
			m, n, k, ep, errNoAlgorithm, ldc, AuxAlign)
	}
	compute := int32(cublasCompute32F)
	if at == F32 && b.tf32 {
		compute = cublasCompute32FFastTF32
	}
	key := ltKey{transA, transB, m, n, k, at, bt, ct, lda, ldb, ldc, ep, compute,
		[5]uint32{alignment(a), alignment(bm), alignment(c), 256, 256}}
	if ep.usesBias() {
		key.align[3] = alignment(bias)
	}
	if ep.usesAux() {
		key.align[4] = alignment(aux)
	}
	defer runtime.UnlockOSThread()
	if err := b.d.enter(); err != nil {
		return err
	}
	p, err := b.plan(key)
	if err != nil {
		return fmt.Errorf("cuda: matmul %d×%d×%d %s→%s (%s): %w", m, n, k, at, ct, ep, err)
	}
	if ep.usesBias() {
		bp := uint64(bias)
		if r := b.api.ltDescSetAttr(p.desc, ltDescBiasPointer, unsafe.Pointer(&bp), 8); r != cublasStatusSuccess {
			return fmt.Errorf("cuda: matmul bias: %w", b.api.check("cublasLtMatmulDescSetAttribute", r))
		}
	}
	if ep.usesAux() {
		ap := uint64(aux)
		if r := b.api.ltDescSetAttr(p.desc, ltDescAuxPointer, unsafe.Pointer(&ap), 8); r != cublasStatusSuccess {
			return fmt.Errorf("cuda: matmul auxiliary matrix: %w", b.api.check("cublasLtMatmulDescSetAttribute", r))
		}
	}
	r := b.api.ltMatmul(b.lt, p.desc, unsafe.Pointer(&alpha), uintptr(a), p.aL, uintptr(bm), p.bL,
		unsafe.Pointer(&beta), uintptr(c), p.cL, uintptr(c), p.cL, &p.algo, uintptr(b.ws), WorkspaceBytes, uintptr(b.s))
	if err := b.api.check("cublasLtMatmul", r); err != nil {
		return fmt.Errorf("cuda: matmul %d×%d×%d %s→%s (%s): %w", m, n, k, at, ct, ep, err)
	}
	return nil
}

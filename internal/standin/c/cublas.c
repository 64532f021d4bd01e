/*
 * cublas.c: a stand-in libcublas.so.12 and libcublasLt.so.12 for the tests
 * of gptui's BLAS path on a machine without a GPU. The one source is built
 * twice: without STANDIN_CUBLASLT it exports the cuBLAS functions package
 * kernels/cuda binds (cublas.go: cublasCreate_v2 … cublasGemmEx,
 * cublasGemmStridedBatchedEx), with it the cuBLASLt ones (cublasLtCreate …
 * cublasLtMatmul), so that cuda.NewBLAS loads the pair through the same
 * purego path as NVIDIA's libraries, and runs their GEMMs on the CPU:
 *
 *   - column-major BLAS: D(m×n) = alpha·op(A)·op(B) + beta·C, op(X) = X or
 *     Xᵀ (CUBLAS_OP_C is CUBLAS_OP_T for real types), with A and B of one
 *     type (CUDA_R_32F, CUDA_R_16F or CUDA_R_16BF) and C/D of that type or
 *     CUDA_R_32F, the combinations cuBLAS's tables give for the fp32
 *     compute types; each element is a float sum over k in ascending order
 *     of float products, scaled by alpha in float, plus beta·C in float
 *     (C is not read when beta is 0, nor A and B when alpha or k is 0
 *     but for a bias gradient),
 *     then the epilogue in float, then one rounding into D's type:
 *     bfloat16 and half to nearest even (half with its subnormals and
 *     overflow to infinity; NaNs stay NaNs). A GPU sums in another order,
 *     with FMAs: results agree to rounding, not bit for bit;
 *   - the compute types that allow reduced precision do reduce it: with
 *     CUBLAS_COMPUTE_32F_FAST_TF32 (and, for cublasGemmEx, CUBLAS_COMPUTE_32F
 *     under CUBLAS_TF32_TENSOR_OP_MATH) the fp32 inputs are rounded to TF32
 *     (10 bits of mantissa, to nearest, ties away, as cvt.rna.tf32.f32)
 *     before they are multiplied, with CUBLAS_COMPUTE_32F_FAST_16F and
 *     _16BF to half and bfloat16, so that a test passes here only with a
 *     tolerance that passes on a GPU; CUBLAS_COMPUTE_32F_PEDANTIC never;
 *   - cuBLASLt's epilogues, per the cuBLAS documentation's
 *     cublasLtEpilogue_t and cublasLtMatmulDescAttributes_t (CUDA 12.8/13):
 *     BIAS adds bias[i] to row i of D (the bias has m elements, "the number
 *     of rows of D"); GELU is the tanh form the documentation gives,
 *     0.5x(1+tanh(sqrt(2/pi)(x+0.044715x³))), computed in float with
 *     sqrt(2/pi) = 0.7978845608f; GELU_BIAS adds the bias, then GELU;
 *     BGRADA writes bias[i] = Σ_k op(A)[i,k] (m elements, "the number of
 *     rows of D", reduced "over the GEMM's k dimension"), BGRADB writes
 *     bias[j] = Σ_k op(B)[k,j] (n elements, "the number of columns of D"),
 *     each a float sum in ascending k of the inputs as stored (not scaled
 *     by alpha, not accumulated into the bias: it is overwritten), while D
 *     gets the plain product. The bias's type is
 *     CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, whose default (-1) is D's type,
 *     as the documentation says; this stand-in takes only D's type (other
 *     types are CUBLAS_STATUS_NOT_SUPPORTED);
 *   - the GELU epilogues with an auxiliary matrix, per the same pages:
 *     GELU_AUX_BIAS (GELU_AUX without the bias) stores the sum, bias
 *     added, into the auxiliary matrix ("GELU input matrix") and GELU of
 *     it into D; DGELU multiplies the product by GELU's derivative at the
 *     auxiliary matrix (the forward pass's GELU input), the derivative of
 *     the tanh form above, 0.5(1+t) + 0.5x(1-t²)·sqrt(2/pi)(1+3·0.044715x²)
 *     with t = tanh(sqrt(2/pi)(x+0.044715x³)), in float. The auxiliary
 *     matrix is CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, of D's shape,
 *     its leading dimension CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD ("must be
 *     divisible by 8 and be no less than the number of rows in the output
 *     matrix": CUBLAS_STATUS_INVALID_VALUE otherwise), its type
 *     CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE, D's by default (the
 *     only one taken here); it is stored, or read, as D is;
 *   - the work runs on the handle's stream (cublasSetStream_v2) or, for
 *     cublasLtMatmul, on the stream argument, after the work queued there
 *     before it, through the stand-in libcuda.so.1's gptuiStandinEnqueue
 *     (standin.h); the host call returns at once (stream 0, the legacy
 *     stream, runs it on the calling thread after every stream's work).
 *     Everything the work needs is copied at the call: alpha and beta
 *     (host pointer mode), the shapes, the descriptors' attributes; the
 *     caller may free or change them as soon as the call returns;
 *   - cublasLtMatmulAlgoGetHeuristic answers one algorithm (state
 *     CUBLAS_STATUS_SUCCESS) that needs the whole workspace the
 *     preference allows (CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, 0 by
 *     default) and assumes the pointers of A, B, C and D aligned as the
 *     preference's CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_*_BYTES say (256 by
 *     default), and the bias and auxiliary matrix as the pointers set when
 *     it was asked; none (a count of 0) for a preference below an
 *     operand's element size, and none for an epilogue with an auxiliary
 *     matrix while the environment has GPTUI_STANDIN_CUBLASLT_NO_AUX
 *     (standin.NoAuxEpilogueEnv), as a library without such a kernel for
 *     the shape answers.
 *
 * Where it fails, it fails as cuBLAS documents, at the call:
 * CUBLAS_STATUS_NOT_INITIALIZED for a handle that cublasCreate_v2 (or
 * cublasLtCreate) did not make, or that was destroyed;
 * CUBLAS_STATUS_INVALID_VALUE for m, n, k or batchCount < 0, a transpose
 * other than N, T or C, lda < max(1, rows of A as stored), ldb likewise,
 * ldc < max(1, m), NULL alpha or beta, cuBLASLt layouts whose shapes do
 * not make one product (or C's differing from D's), a descriptor or
 * preference that is not one, a workspace smaller than the algorithm needs
 * (it needs what the preference allowed) or not 256-byte aligned, a
 * requestedAlgoCount < 1, an attribute of the wrong size;
 * CUBLAS_STATUS_NOT_SUPPORTED for a combination of types cuBLAS does not
 * have (A and B of different types, D of a type other than A's or fp32,
 * an fp32-only compute type with 16-bit inputs, a scale type other than
 * fp32) and for an algo cublasGemmEx does not know.
 *
 * Where a GPU would fail later, it fails at the call with
 * CUBLAS_STATUS_INVALID_VALUE, rather than read or write what it should
 * not: every operand's whole extent (each matrix of a batch, the bias)
 * must lie in one allocation of the stand-in driver's cuMemAlloc
 * (gptuiStandinIsDevice), where a GPU faults in the kernel (illegal
 * address) on host or freed memory; an operand must be aligned to its
 * element size, and for cublasLtMatmul to what the algorithm assumed
 * (the preference's alignment), where a GPU faults with a misaligned
 * address.
 *
 * What it does not do: the other compute types (16F, 32I, 64F) and types
 * (fp64, int8, fp8, complex), CUBLASLT_POINTER_MODE other than host,
 * TRANSC, the ReLU epilogues, DGELU_BGRAD, scale pointers and
 * batched cuBLASLt layouts (CUBLAS_STATUS_NOT_SUPPORTED). It is not fast:
 * a plain triple loop on the stream's thread.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "standin.h"

#define EXPORT __attribute__((visibility("default")))

typedef int cublasStatus_t;

/* cublasStatus_t values (cublas_api.h). */
enum {
	ST_SUCCESS = 0,
	ST_NOT_INITIALIZED = 1,
	ST_ALLOC_FAILED = 3,
	ST_INVALID_VALUE = 7,
	ST_ARCH_MISMATCH = 8,
	ST_MAPPING_ERROR = 11,
	ST_EXECUTION_FAILED = 13,
	ST_INTERNAL_ERROR = 14,
	ST_NOT_SUPPORTED = 15,
	ST_LICENSE_ERROR = 16,
};

/* cudaDataType_t values (library_types.h). */
enum { R_32F = 0, R_16F = 2, R_16BF = 14 };

/* cublasOperation_t. */
enum { OP_N = 0, OP_T = 1, OP_C = 2 };

/* cublasComputeType_t (cublas_api.h). */
enum {
	COMPUTE_16F = 64,
	COMPUTE_16F_PEDANTIC = 65,
	COMPUTE_32F = 68,
	COMPUTE_32F_PEDANTIC = 69,
	COMPUTE_64F = 70,
	COMPUTE_64F_PEDANTIC = 71,
	COMPUTE_32I = 72,
	COMPUTE_32I_PEDANTIC = 73,
	COMPUTE_32F_FAST_16F = 74,
	COMPUTE_32F_FAST_16BF = 75,
	COMPUTE_32F_FAST_TF32 = 77,
	COMPUTE_32F_EMULATED_16BFX9 = 78,
	COMPUTE_64F_EMULATED_FIXEDPOINT = 79,
};

/* cublasMath_t. */
enum { MATH_DEFAULT = 0, MATH_TENSOR_OP = 1, MATH_PEDANTIC = 2, MATH_TF32 = 3, MATH_DISALLOW_REDUCED_REDUCTION = 16 };

/* cublasLtEpilogue_t. */
enum {
	EPI_DEFAULT = 1,
	EPI_RELU = 2,
	EPI_BIAS = 4,
	EPI_RELU_BIAS = 6,
	EPI_GELU = 32,
	EPI_GELU_BIAS = 36,
	EPI_RELU_AUX = 130,
	EPI_RELU_AUX_BIAS = 134,
	EPI_DRELU = 136,
	EPI_DRELU_BGRAD = 152,
	EPI_GELU_AUX = 160,
	EPI_GELU_AUX_BIAS = 164,
	EPI_DGELU = 192,
	EPI_DGELU_BGRAD = 208,
	EPI_BGRADA = 256,
	EPI_BGRADB = 512,
};

/* cublasLtMatmulDescAttributes_t. */
enum {
	DESC_COMPUTE_TYPE = 0,
	DESC_SCALE_TYPE = 1,
	DESC_POINTER_MODE = 2,
	DESC_TRANSA = 3,
	DESC_TRANSB = 4,
	DESC_TRANSC = 5,
	DESC_FILL_MODE = 6,
	DESC_EPILOGUE = 7,
	DESC_BIAS_POINTER = 8,
	DESC_AUX_POINTER = 11,
	DESC_AUX_LD = 12,
	DESC_AUX_DATA_TYPE = 22,
	DESC_BIAS_DATA_TYPE = 26,
	DESC_MAX = 38,
};

/* cublasLtMatmulPreferenceAttributes_t. */
enum {
	PREF_SEARCH_MODE = 0,
	PREF_MAX_WORKSPACE_BYTES = 1,
	PREF_REDUCTION_SCHEME_MASK = 3,
	PREF_MIN_ALIGNMENT_A = 5,
	PREF_MIN_ALIGNMENT_D = 8,
	PREF_MAX_WAVES_COUNT = 9,
	PREF_IMPL_MASK = 12,
	PREF_SM_COUNT_TARGET = 13,
};

/* How the inputs are rounded before they are multiplied. */
enum { RND_NONE, RND_TF32, RND_F16, RND_BF16 };

#define VERSION 120800 /* cuBLAS 12.8.0, beside the stand-in driver's CUDA 12.8 */
#define ALGO_MAGIC 0x67707475696c7431ULL /* "gptuilt1" */

typedef struct {
	uint64_t data[8];
} cublasLtMatmulAlgo_t;

typedef struct {
	cublasLtMatmulAlgo_t algo;
	size_t workspaceSize;
	cublasStatus_t state;
	float wavesCount;
	int reserved[4];
} cublasLtMatmulHeuristicResult_t;

/* ---- the stand-in driver ---- */

static gptuiStandinEnqueueFn enq;
static gptuiStandinIsDeviceFn isdev;
static pthread_once_t bindOnce = PTHREAD_ONCE_INIT;

static void bindCUDA(void) {
	void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
	if (h == NULL)
		return;
	void *e = dlsym(h, "gptuiStandinEnqueue");
	void *d = dlsym(h, "gptuiStandinIsDevice");
	if (e == NULL || d == NULL)
		return;
	isdev = (gptuiStandinIsDeviceFn)d;
	enq = (gptuiStandinEnqueueFn)e;
}

/* bound reports whether the stand-in driver is there: the stand-in runs
 * only beside it (a real libcuda has no gptuiStandinEnqueue). */
static int bound(void) {
	pthread_once(&bindOnce, bindCUDA);
	if (enq == NULL) {
		fprintf(stderr, "stand-in cuBLAS: it runs only on the stand-in libcuda.so.1, which is not loaded\n");
		return 0;
	}
	return 1;
}

/* ---- the objects the caller holds ---- */

/* Every handle, descriptor, layout and preference is in one list, so that
 * one the stand-in did not make (or freed) is told apart without reading
 * it. */
enum { K_HANDLE = 1, K_LTHANDLE, K_DESC, K_LAYOUT, K_PREF };

struct obj {
	struct obj *next;
	int kind;
};

static pthread_mutex_t omu = PTHREAD_MUTEX_INITIALIZER;
static struct obj *objs;

static void *newObj(size_t size, int kind) {
	struct obj *o = calloc(1, size);
	if (o == NULL)
		return NULL;
	o->kind = kind;
	pthread_mutex_lock(&omu);
	o->next = objs;
	objs = o;
	pthread_mutex_unlock(&omu);
	return o;
}

static int isObj(const void *p, int kind) {
	if (p == NULL)
		return 0;
	pthread_mutex_lock(&omu);
	int ok = 0;
	for (struct obj *o = objs; o != NULL; o = o->next)
		if (o == p) {
			ok = o->kind == kind;
			break;
		}
	pthread_mutex_unlock(&omu);
	return ok;
}

/* freeObj unlinks and frees p if it is one of kind; it reports whether it was. */
static int freeObj(void *p, int kind) {
	pthread_mutex_lock(&omu);
	for (struct obj **q = &objs; *q != NULL; q = &(*q)->next)
		if (*q == p && (*q)->kind == kind) {
			*q = (*q)->next;
			pthread_mutex_unlock(&omu);
			free(p);
			return 1;
		}
	pthread_mutex_unlock(&omu);
	return 0;
}

struct handle {
	struct obj o;
	void *stream;
	int math;
	void *ws;
	size_t wsSize;
};

struct desc {
	struct obj o;
	int32_t compute, scale, pointerMode, transa, transb, transc;
	uint32_t epilogue;
	const void *bias;
	int32_t biasType;
	const void *aux;
	int64_t auxLd;
	int32_t auxType;
	uint64_t unsupported; /* attributes set to what the stand-in does not do, a bit each */
};

struct layout {
	struct obj o;
	int32_t type;
	uint64_t rows, cols;
	int64_t ld;
};

struct pref {
	struct obj o;
	uint64_t maxWorkspace;
	uint32_t align[4]; /* A, B, C, D */
};

/* ---- numbers ---- */

static float bitsFloat(uint32_t u) {
	float f;
	memcpy(&f, &u, 4);
	return f;
}

static uint32_t floatBits(float f) {
	uint32_t u;
	memcpy(&u, &f, 4);
	return u;
}

static float bf16ToFloat(uint16_t h) { return bitsFloat((uint32_t)h << 16); }

/* floatToBF16 rounds to nearest even; a NaN stays a (quiet) NaN of its sign. */
static uint16_t floatToBF16(float f) {
	uint32_t u = floatBits(f);
	if ((u & 0x7fffffffu) > 0x7f800000u)
		return (uint16_t)((u >> 16) | 0x40);
	u += 0x7fffu + ((u >> 16) & 1);
	return (uint16_t)(u >> 16);
}

static float halfToFloat(uint16_t h) {
	uint32_t sign = (uint32_t)(h & 0x8000) << 16;
	uint32_t exp = (h >> 10) & 0x1f, mant = h & 0x3ff;
	if (exp == 0x1f)
		return bitsFloat(sign | 0x7f800000u | (mant << 13));
	if (exp != 0)
		return bitsFloat(sign | ((exp + 112) << 23) | (mant << 13));
	float f = (float)mant * 0x1p-24f; /* zero or subnormal: exact */
	return bitsFloat(sign | floatBits(f));
}

/* floatToHalf rounds to nearest even, to half's subnormals and to
 * infinity past 65504 (from 65520 up); a NaN stays a (quiet) NaN. */
static uint16_t floatToHalf(float f) {
	uint32_t u = floatBits(f);
	uint16_t sign = (uint16_t)((u >> 16) & 0x8000);
	uint32_t a = u & 0x7fffffffu;
	if (a > 0x7f800000u)
		return sign | 0x7e00 | (uint16_t)((a >> 13) & 0x3ff);
	if (a >= 0x477ff000u) /* 65520 and up, and infinity */
		return sign | 0x7c00;
	if (a >= 0x38800000u) { /* 2^-14: a normal half */
		uint32_t h = ((a >> 23) - 112) << 10 | ((a >> 13) & 0x3ff);
		uint32_t rem = a & 0x1fff;
		if (rem > 0x1000 || (rem == 0x1000 && (h & 1)))
			h++; /* may carry into the exponent: still right */
		return sign | (uint16_t)h;
	}
	if (a < 0x33000000u) /* below 2^-25 (half of the least subnormal): zero */
		return sign;
	/* A subnormal half q·2^-24 from a = m·2^(e-150), m with its leading
	 * bit: q = m·2^(e-126), a shift right by 126-e (14 to 24). */
	uint32_t e = a >> 23, m = (a & 0x7fffff) | 0x800000;
	uint32_t shift = 126 - e;
	uint32_t q = m >> shift, rem = m & ((1u << shift) - 1), half = 1u << (shift - 1);
	if (rem > half || (rem == half && (q & 1)))
		q++; /* 0x400 is the least normal: still right */
	return sign | (uint16_t)q;
}

/* toTF32 rounds to 10 bits of mantissa, to nearest with ties away from
 * zero (cvt.rna.tf32.f32); infinities and NaNs pass. */
static float toTF32(float f) {
	uint32_t u = floatBits(f);
	if ((u & 0x7f800000u) == 0x7f800000u)
		return f;
	u += 0x1000u;
	u &= 0xffffe000u;
	return bitsFloat(u);
}

static float roundIn(float f, int rnd) {
	switch (rnd) {
	case RND_TF32:
		return toTF32(f);
	case RND_F16:
		return halfToFloat(floatToHalf(f));
	case RND_BF16:
		return bf16ToFloat(floatToBF16(f));
	}
	return f;
}

static size_t typeSize(int t) {
	switch (t) {
	case R_32F:
		return 4;
	case R_16F:
	case R_16BF:
		return 2;
	}
	return 0;
}

static float load(const char *p, int t, int64_t i) {
	switch (t) {
	case R_32F: {
		float f;
		memcpy(&f, p + 4 * i, 4);
		return f;
	}
	case R_16F: {
		uint16_t h;
		memcpy(&h, p + 2 * i, 2);
		return halfToFloat(h);
	}
	default: {
		uint16_t h;
		memcpy(&h, p + 2 * i, 2);
		return bf16ToFloat(h);
	}
	}
}

static void store(char *p, int t, int64_t i, float v) {
	switch (t) {
	case R_32F:
		memcpy(p + 4 * i, &v, 4);
		break;
	case R_16F: {
		uint16_t h = floatToHalf(v);
		memcpy(p + 2 * i, &h, 2);
		break;
	}
	default: {
		uint16_t h = floatToBF16(v);
		memcpy(p + 2 * i, &h, 2);
	}
	}
}

/* The GELU of the cuBLAS documentation's cublasLtEpilogue_t, and its
 * derivative. */
static float gelu(float x) { return 0.5f * x * (1.0f + tanhf(0.7978845608f * (x + 0.044715f * x * x * x))); }
static float dgelu(float x) {
	float t = tanhf(0.7978845608f * (x + 0.044715f * x * x * x));
	return 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * 0.7978845608f * (1.0f + 3.0f * 0.044715f * x * x);
}

/* ---- the work ---- */

/* mat is one operand: its elements, type, leading dimension, and the
 * elements between the matrices of a batch. */
struct mat {
	const char *p;
	int type;
	int64_t ld, stride;
};

/* job is one call's GEMM, copied at the call: it owns nothing of the
 * caller's but the memory its operands point at. */
struct job {
	int ta, tb;
	int64_t m, n, k;
	int batch;
	float alpha, beta;
	struct mat a, b, c, d;
	int rnd;
	uint32_t epi;
	char *bias;
	int biasType;
	char *aux;
	int64_t auxLd;
	float *opA, *opB; /* scratch: op(A) by rows, op(B) by columns, k floats each */
};

/* opAt is op(A)[i,p] of batch member b's A. */
static float opAt(const struct mat *x, int trans, int64_t b, int64_t i, int64_t p) {
	const char *base = x->p + b * x->stride * (int64_t)typeSize(x->type);
	return load(base, x->type, trans == OP_N ? i + p * x->ld : p + i * x->ld);
}

static void runJob(void *arg) {
	struct job *j = arg;
	int64_t m = j->m, n = j->n, k = j->k;
	int product = k > 0 && j->alpha != 0;
	for (int64_t b = 0; b < j->batch; b++) {
		if (product || j->epi == EPI_BGRADA)
			for (int64_t i = 0; i < m; i++)
				for (int64_t p = 0; p < k; p++)
					j->opA[i * k + p] = opAt(&j->a, j->ta, b, i, p);
		if (product || j->epi == EPI_BGRADB)
			for (int64_t c = 0; c < n; c++)
				for (int64_t p = 0; p < k; p++)
					j->opB[c * k + p] = opAt(&j->b, j->tb, b, p, c);
		/* The bias gradients, of the inputs as they are stored. */
		if (j->epi == EPI_BGRADA || j->epi == EPI_BGRADB) {
			int64_t len = j->epi == EPI_BGRADA ? m : n;
			const float *x = j->epi == EPI_BGRADA ? j->opA : j->opB;
			for (int64_t r = 0; r < len; r++) {
				float s = 0;
				for (int64_t p = 0; p < k; p++)
					s += x[r * k + p];
				store(j->bias, j->biasType, r, s);
			}
		}
		if (product && j->rnd != RND_NONE) {
			for (int64_t i = 0; i < m * k; i++)
				j->opA[i] = roundIn(j->opA[i], j->rnd);
			for (int64_t i = 0; i < n * k; i++)
				j->opB[i] = roundIn(j->opB[i], j->rnd);
		}
		const char *cb = j->c.p == NULL ? NULL : j->c.p + b * j->c.stride * (int64_t)typeSize(j->c.type);
		char *db = (char *)j->d.p + b * j->d.stride * (int64_t)typeSize(j->d.type);
		for (int64_t c = 0; c < n; c++) {
			for (int64_t i = 0; i < m; i++) {
				float v = 0;
				if (product) {
					const float *x = j->opA + i * k, *y = j->opB + c * k;
					float acc = 0;
					for (int64_t p = 0; p < k; p++)
						acc += x[p] * y[p];
					v = j->alpha * acc;
				}
				if (j->beta != 0)
					v += j->beta * load(cb, j->c.type, i + c * j->c.ld);
				if (j->epi == EPI_BIAS || j->epi == EPI_GELU_BIAS || j->epi == EPI_GELU_AUX_BIAS)
					v += load(j->bias, j->biasType, i);
				if (j->epi == EPI_GELU_AUX || j->epi == EPI_GELU_AUX_BIAS)
					store(j->aux, j->d.type, i + c * j->auxLd, v);
				if (j->epi == EPI_DGELU)
					v *= dgelu(load(j->aux, j->d.type, i + c * j->auxLd));
				if (j->epi == EPI_GELU || j->epi == EPI_GELU_BIAS || j->epi == EPI_GELU_AUX || j->epi == EPI_GELU_AUX_BIAS)
					v = gelu(v);
				store(db, j->d.type, i + c * j->d.ld, v);
			}
		}
	}
	free(j->opA);
	free(j->opB);
	free(j);
}

/* ---- checks ---- */

/* span returns the elements a rows×cols matrix with leading dimension ld
 * spans, or -1 when that overflows. */
static int64_t span(int64_t rows, int64_t cols, int64_t ld) {
	if (rows == 0 || cols == 0)
		return 0;
	int64_t s;
	if (__builtin_mul_overflow(cols - 1, ld, &s) || __builtin_add_overflow(s, rows, &s))
		return -1;
	return s;
}

/* onDevice checks that each matrix of a batch of rows×cols ones at p
 * lies in device memory, aligned to align bytes (at least its element's):
 * the stand-in's check where a GPU would fault. */
static int onDevice(const void *p, int type, int64_t rows, int64_t cols, int64_t ld, int64_t stride, int batch, uint32_t align) {
	int64_t n = span(rows, cols, ld);
	int64_t es = (int64_t)typeSize(type);
	if (n == 0)
		return 1;
	if (n < 0 || p == NULL || __builtin_mul_overflow(n, es, &n))
		return 0;
	if (align < es)
		align = (uint32_t)es;
	for (int64_t b = 0; b < batch; b++) {
		int64_t off;
		if (__builtin_mul_overflow(b, stride, &off) || __builtin_mul_overflow(off, es, &off))
			return 0;
		const char *q = (const char *)p + off;
		if ((uintptr_t)q % align != 0 || !isdev(q, (size_t)n))
			return 0;
	}
	return 1;
}

/* inputRounding returns how a compute type rounds fp32 inputs, or -1 for
 * a compute type that is not one. */
static int inputRounding(int compute) {
	switch (compute) {
	case COMPUTE_32F:
	case COMPUTE_32F_PEDANTIC:
		return RND_NONE;
	case COMPUTE_32F_FAST_TF32:
		return RND_TF32;
	case COMPUTE_32F_FAST_16F:
		return RND_F16;
	case COMPUTE_32F_FAST_16BF:
		return RND_BF16;
	}
	return -1;
}

/* checkTypes is the type table of cublasGemmEx and cublasLtMatmul for the
 * fp32 compute types: CUBLAS_COMPUTE_32F and _PEDANTIC take A = B of fp32,
 * half or bfloat16 and C of A's type or fp32 (fp32 only for fp32); the
 * FAST ones fp32 only. Another known compute type is one the stand-in
 * does not do. */
static cublasStatus_t checkTypes(int compute, int at, int bt, int ct) {
	switch (compute) {
	case COMPUTE_32F:
	case COMPUTE_32F_PEDANTIC:
		if (at != bt || typeSize(at) == 0 || (ct != at && ct != R_32F))
			return ST_NOT_SUPPORTED;
		return ST_SUCCESS;
	case COMPUTE_32F_FAST_TF32:
	case COMPUTE_32F_FAST_16F:
	case COMPUTE_32F_FAST_16BF:
		if (at != R_32F || bt != R_32F || ct != R_32F)
			return ST_NOT_SUPPORTED;
		return ST_SUCCESS;
	case COMPUTE_16F:
	case COMPUTE_16F_PEDANTIC:
	case COMPUTE_64F:
	case COMPUTE_64F_PEDANTIC:
	case COMPUTE_32I:
	case COMPUTE_32I_PEDANTIC:
	case COMPUTE_32F_EMULATED_16BFX9:
	case COMPUTE_64F_EMULATED_FIXEDPOINT:
		return ST_NOT_SUPPORTED;
	}
	return ST_INVALID_VALUE;
}

static int validOp(int op) { return op == OP_N || op == OP_T || op == OP_C; }

static int64_t max1(int64_t x) { return x > 1 ? x : 1; }

/* scratch gives j the floats of op(A) and op(B) it needs. */
static cublasStatus_t scratch(struct job *j) {
	size_t na, nb;
	if (j->k == 0)
		return ST_SUCCESS;
	if (__builtin_mul_overflow((size_t)j->m, (size_t)j->k, &na) || __builtin_mul_overflow((size_t)j->n, (size_t)j->k, &nb) ||
	    na > SIZE_MAX / 4 || nb > SIZE_MAX / 4)
		return ST_ALLOC_FAILED;
	j->opA = malloc(na * 4 + 4);
	j->opB = malloc(nb * 4 + 4);
	if (j->opA == NULL || j->opB == NULL) {
		free(j->opA);
		free(j->opB);
		j->opA = j->opB = NULL;
		return ST_ALLOC_FAILED;
	}
	return ST_SUCCESS;
}

/* launch queues j on stream s. A stream that is not one fails as a
 * kernel launch on it does: CUBLAS_STATUS_EXECUTION_FAILED. */
static cublasStatus_t launch(struct job *j, void *s) {
	cublasStatus_t r = scratch(j);
	if (r == ST_SUCCESS && enq(s, runJob, j) != 0)
		r = ST_EXECUTION_FAILED;
	if (r != ST_SUCCESS) {
		free(j->opA);
		free(j->opB);
		free(j);
	}
	return r;
}

#ifndef STANDIN_CUBLASLT

/* ---- cuBLAS (libcublas.so.12) ---- */

static const char *statusName(cublasStatus_t s) {
	switch (s) {
	case ST_SUCCESS:
		return "CUBLAS_STATUS_SUCCESS";
	case ST_NOT_INITIALIZED:
		return "CUBLAS_STATUS_NOT_INITIALIZED";
	case ST_ALLOC_FAILED:
		return "CUBLAS_STATUS_ALLOC_FAILED";
	case ST_INVALID_VALUE:
		return "CUBLAS_STATUS_INVALID_VALUE";
	case ST_ARCH_MISMATCH:
		return "CUBLAS_STATUS_ARCH_MISMATCH";
	case ST_MAPPING_ERROR:
		return "CUBLAS_STATUS_MAPPING_ERROR";
	case ST_EXECUTION_FAILED:
		return "CUBLAS_STATUS_EXECUTION_FAILED";
	case ST_INTERNAL_ERROR:
		return "CUBLAS_STATUS_INTERNAL_ERROR";
	case ST_NOT_SUPPORTED:
		return "CUBLAS_STATUS_NOT_SUPPORTED";
	case ST_LICENSE_ERROR:
		return "CUBLAS_STATUS_LICENSE_ERROR";
	}
	return "<unknown>";
}

static const char *statusString(cublasStatus_t s) {
	switch (s) {
	case ST_SUCCESS:
		return "the operation completed successfully";
	case ST_NOT_INITIALIZED:
		return "the library was not initialized";
	case ST_ALLOC_FAILED:
		return "the resource allocation failed";
	case ST_INVALID_VALUE:
		return "an invalid numeric value was used as an argument";
	case ST_ARCH_MISMATCH:
		return "an absent device architectural feature is required";
	case ST_MAPPING_ERROR:
		return "an access to GPU memory space failed";
	case ST_EXECUTION_FAILED:
		return "the GPU program failed to execute";
	case ST_INTERNAL_ERROR:
		return "an internal operation failed";
	case ST_NOT_SUPPORTED:
		return "the functionality requested is not supported";
	case ST_LICENSE_ERROR:
		return "error detected trying to check the license";
	}
	return "<unknown>";
}

EXPORT cublasStatus_t cublasCreate_v2(struct handle **out) {
	if (out == NULL)
		return ST_INVALID_VALUE;
	if (!bound())
		return ST_NOT_INITIALIZED;
	struct handle *h = newObj(sizeof *h, K_HANDLE);
	if (h == NULL)
		return ST_ALLOC_FAILED;
	*out = h;
	return ST_SUCCESS;
}

EXPORT cublasStatus_t cublasDestroy_v2(struct handle *h) {
	/* The queued work holds nothing of the handle's. */
	return freeObj(h, K_HANDLE) ? ST_SUCCESS : ST_NOT_INITIALIZED;
}

EXPORT cublasStatus_t cublasSetStream_v2(struct handle *h, void *s) {
	if (!isObj(h, K_HANDLE))
		return ST_NOT_INITIALIZED;
	h->stream = s;
	/* cuBLAS 12 goes back to its default workspace on a new stream. */
	h->ws = NULL;
	h->wsSize = 0;
	return ST_SUCCESS;
}

EXPORT cublasStatus_t cublasSetMathMode(struct handle *h, int mode) {
	if (!isObj(h, K_HANDLE))
		return ST_NOT_INITIALIZED;
	int base = mode & ~MATH_DISALLOW_REDUCED_REDUCTION;
	if (base != MATH_DEFAULT && base != MATH_TENSOR_OP && base != MATH_PEDANTIC && base != MATH_TF32)
		return ST_INVALID_VALUE;
	h->math = mode;
	return ST_SUCCESS;
}

EXPORT cublasStatus_t cublasGetVersion_v2(struct handle *h, int *v) {
	if (!isObj(h, K_HANDLE))
		return ST_NOT_INITIALIZED;
	if (v == NULL)
		return ST_INVALID_VALUE;
	*v = VERSION;
	return ST_SUCCESS;
}

EXPORT cublasStatus_t cublasSetWorkspace_v2(struct handle *h, void *ws, size_t n) {
	if (!isObj(h, K_HANDLE))
		return ST_NOT_INITIALIZED;
	/* cuBLAS: the workspace must be aligned to 256 bytes. */
	if (n > 0 && (ws == NULL || (uintptr_t)ws % 256 != 0 || !isdev(ws, n)))
		return ST_INVALID_VALUE;
	h->ws = ws;
	h->wsSize = n;
	return ST_SUCCESS;
}

EXPORT const char *cublasGetStatusName(cublasStatus_t s) { return statusName(s); }

EXPORT const char *cublasGetStatusString(cublasStatus_t s) { return statusString(s); }

/* gemm is cublasGemmStridedBatchedEx, and cublasGemmEx as one matrix. */
static cublasStatus_t gemm(struct handle *h, int ta, int tb, int m, int n, int k, const float *alpha, const void *A, int at, int lda,
                           long long sa, const void *B, int bt, int ldb, long long sb, const float *beta, void *C, int ct, int ldc,
                           long long sc, int batch, int compute, int algo) {
	if (!isObj(h, K_HANDLE))
		return ST_NOT_INITIALIZED;
	if (!validOp(ta) || !validOp(tb) || m < 0 || n < 0 || k < 0 || batch < 0)
		return ST_INVALID_VALUE;
	int64_t rowsA = ta == OP_N ? m : k, colsA = ta == OP_N ? k : m;
	int64_t rowsB = tb == OP_N ? k : n, colsB = tb == OP_N ? n : k;
	if (lda < max1(rowsA) || ldb < max1(rowsB) || ldc < max1(m))
		return ST_INVALID_VALUE;
	if (alpha == NULL || beta == NULL)
		return ST_INVALID_VALUE;
	cublasStatus_t r = checkTypes(compute, at, bt, ct);
	if (r != ST_SUCCESS)
		return r;
	/* CUBLAS_GEMM_DEFAULT (-1), CUBLAS_GEMM_ALGO0..23, and
	 * CUBLAS_GEMM_DEFAULT_TENSOR_OP (99), ALGO0..15_TENSOR_OP. */
	if (!((algo >= -1 && algo <= 23) || (algo >= 99 && algo <= 115)))
		return ST_NOT_SUPPORTED;
	if (m == 0 || n == 0 || batch == 0)
		return ST_SUCCESS;
	float al = *alpha, be = *beta;
	int product = k > 0 && al != 0;
	if (product && (!onDevice(A, at, rowsA, colsA, lda, sa, batch, 0) || !onDevice(B, bt, rowsB, colsB, ldb, sb, batch, 0)))
		return ST_INVALID_VALUE;
	if (!onDevice(C, ct, m, n, ldc, sc, batch, 0))
		return ST_INVALID_VALUE;
	struct job *j = calloc(1, sizeof *j);
	if (j == NULL)
		return ST_ALLOC_FAILED;
	j->ta = ta, j->tb = tb;
	j->m = m, j->n = n, j->k = k;
	j->batch = batch;
	j->alpha = al, j->beta = be;
	j->a = (struct mat){A, at, lda, sa};
	j->b = (struct mat){B, bt, ldb, sb};
	j->c = (struct mat){be != 0 ? C : NULL, ct, ldc, sc};
	j->d = (struct mat){C, ct, ldc, sc};
	j->rnd = inputRounding(compute);
	/* CUBLAS_COMPUTE_32F lets CUBLAS_TF32_TENSOR_OP_MATH use TF32 for fp32
	 * inputs; _PEDANTIC never. */
	if (compute == COMPUTE_32F && at == R_32F && (h->math & ~MATH_DISALLOW_REDUCED_REDUCTION) == MATH_TF32)
		j->rnd = RND_TF32;
	j->epi = EPI_DEFAULT;
	if (!product)
		j->k = 0;
	return launch(j, h->stream);
}

EXPORT cublasStatus_t cublasGemmEx(struct handle *h, int ta, int tb, int m, int n, int k, const float *alpha, const void *A, int at, int lda,
                                   const void *B, int bt, int ldb, const float *beta, void *C, int ct, int ldc, int compute, int algo) {
	return gemm(h, ta, tb, m, n, k, alpha, A, at, lda, 0, B, bt, ldb, 0, beta, C, ct, ldc, 0, 1, compute, algo);
}

EXPORT cublasStatus_t cublasGemmStridedBatchedEx(struct handle *h, int ta, int tb, int m, int n, int k, const float *alpha, const void *A, int at,
                                                 int lda, long long sa, const void *B, int bt, int ldb, long long sb, const float *beta,
                                                 void *C, int ct, int ldc, long long sc, int batch, int compute, int algo) {
	return gemm(h, ta, tb, m, n, k, alpha, A, at, lda, sa, B, bt, ldb, sb, beta, C, ct, ldc, sc, batch, compute, algo);
}

#else

/* ---- cuBLASLt (libcublasLt.so.12) ---- */

EXPORT cublasStatus_t cublasLtCreate(struct obj **out) {
	if (out == NULL)
		return ST_INVALID_VALUE;
	if (!bound())
		return ST_NOT_INITIALIZED;
	struct obj *h = newObj(sizeof *h, K_LTHANDLE);
	if (h == NULL)
		return ST_ALLOC_FAILED;
	*out = h;
	return ST_SUCCESS;
}

EXPORT cublasStatus_t cublasLtDestroy(struct obj *h) { return freeObj(h, K_LTHANDLE) ? ST_SUCCESS : ST_NOT_INITIALIZED; }

EXPORT cublasStatus_t cublasLtMatmulDescCreate(struct desc **out, int compute, int scale) {
	if (out == NULL)
		return ST_INVALID_VALUE;
	struct desc *d = newObj(sizeof *d, K_DESC);
	if (d == NULL)
		return ST_ALLOC_FAILED;
	d->compute = compute;
	d->scale = scale;
	d->epilogue = EPI_DEFAULT;
	d->biasType = -1;
	d->auxType = -1;
	*out = d;
	return ST_SUCCESS;
}

/* Destroying NULL is nothing, as free's; anything else not made here is
 * CUBLAS_STATUS_INVALID_VALUE. */
EXPORT cublasStatus_t cublasLtMatmulDescDestroy(struct desc *d) {
	return d == NULL || freeObj(d, K_DESC) ? ST_SUCCESS : ST_INVALID_VALUE;
}

/* descAttrSize is the size of each attribute of cublasLtMatmulDesc_t
 * (cublasLt.h, CUDA 12.8), 0 for numbers that are none. */
static size_t descAttrSize(int attr) {
	switch (attr) {
	case 0: case 1: case 2: case 3: case 4: case 5: case 6: case 7: /* compute … epilogue */
	case 15: case 22: case 26: case 27: case 28:                     /* SM count, aux type, bias type, atomic chunks */
	case 31: case 32: case 33: case 34: case 35: case 37:            /* scale modes */
		return 4;
	case 8: case 10: case 11: case 12: case 13: case 14:             /* bias pointer, strides, aux pointer and ld */
	case 17: case 18: case 19: case 20: case 21: case 23: case 24:   /* scale and amax pointers */
	case 29: case 30: case 36:                                       /* atomic counters, D out scale */
		return 8;
	case 25: /* FAST_ACCUM, int8_t */
		return 1;
	}
	return 0;
}

EXPORT cublasStatus_t cublasLtMatmulDescSetAttribute(struct desc *d, int attr, const void *buf, size_t n) {
	if (!isObj(d, K_DESC))
		return ST_INVALID_VALUE;
	size_t want = descAttrSize(attr);
	if (want == 0 || buf == NULL || n != want)
		return ST_INVALID_VALUE;
	int32_t i32 = 0;
	uint64_t u64 = 0;
	if (n == 4)
		memcpy(&i32, buf, 4);
	if (n == 8)
		memcpy(&u64, buf, 8);
	switch (attr) {
	case DESC_COMPUTE_TYPE:
		d->compute = i32;
		break;
	case DESC_SCALE_TYPE:
		d->scale = i32;
		break;
	case DESC_POINTER_MODE:
		d->pointerMode = i32;
		break;
	case DESC_TRANSA:
	case DESC_TRANSB:
	case DESC_TRANSC:
		if (!validOp(i32))
			return ST_INVALID_VALUE;
		*(attr == DESC_TRANSA ? &d->transa : attr == DESC_TRANSB ? &d->transb : &d->transc) = i32;
		break;
	case DESC_EPILOGUE:
		d->epilogue = (uint32_t)i32;
		break;
	case DESC_BIAS_POINTER:
		d->bias = (const void *)(uintptr_t)u64;
		break;
	case DESC_BIAS_DATA_TYPE:
		d->biasType = i32;
		break;
	case DESC_AUX_POINTER:
		d->aux = (const void *)(uintptr_t)u64;
		break;
	case DESC_AUX_LD:
		d->auxLd = (int64_t)u64;
		break;
	case DESC_AUX_DATA_TYPE:
		d->auxType = i32;
		break;
	case DESC_FILL_MODE: /* not read by a GEMM */
	case 10: /* BIAS_BATCH_STRIDE, ALPHA_VECTOR_BATCH_STRIDE and the */
	case 14: /* auxiliary matrix's batch stride: read only with batches */
	case 13: /* or vector alpha, which the stand-in does not do */
	case 15: /* SM_COUNT_TARGET: a hint */
	case 25: /* FAST_ACCUM: fp8 only */
		break;
	default: /* pointers, scale modes, atomic synchronisation */
		if (i32 != 0 || u64 != 0)
			d->unsupported |= 1ULL << attr;
		else
			d->unsupported &= ~(1ULL << attr);
	}
	return ST_SUCCESS;
}

EXPORT cublasStatus_t cublasLtMatrixLayoutCreate(struct layout **out, int type, uint64_t rows, uint64_t cols, int64_t ld) {
	if (out == NULL)
		return ST_INVALID_VALUE;
	struct layout *l = newObj(sizeof *l, K_LAYOUT);
	if (l == NULL)
		return ST_ALLOC_FAILED;
	l->type = type;
	l->rows = rows;
	l->cols = cols;
	l->ld = ld;
	*out = l;
	return ST_SUCCESS;
}

EXPORT cublasStatus_t cublasLtMatrixLayoutDestroy(struct layout *l) {
	return l == NULL || freeObj(l, K_LAYOUT) ? ST_SUCCESS : ST_INVALID_VALUE;
}

EXPORT cublasStatus_t cublasLtMatmulPreferenceCreate(struct pref **out) {
	if (out == NULL)
		return ST_INVALID_VALUE;
	struct pref *p = newObj(sizeof *p, K_PREF);
	if (p == NULL)
		return ST_ALLOC_FAILED;
	for (int i = 0; i < 4; i++)
		p->align[i] = 256;
	*out = p;
	return ST_SUCCESS;
}

EXPORT cublasStatus_t cublasLtMatmulPreferenceDestroy(struct pref *p) {
	return p == NULL || freeObj(p, K_PREF) ? ST_SUCCESS : ST_INVALID_VALUE;
}

EXPORT cublasStatus_t cublasLtMatmulPreferenceSetAttribute(struct pref *p, int attr, const void *buf, size_t n) {
	if (!isObj(p, K_PREF))
		return ST_INVALID_VALUE;
	size_t want = 0;
	switch (attr) {
	case PREF_SEARCH_MODE:
	case PREF_REDUCTION_SCHEME_MASK:
	case PREF_MIN_ALIGNMENT_A:
	case PREF_MIN_ALIGNMENT_A + 1:
	case PREF_MIN_ALIGNMENT_A + 2:
	case PREF_MIN_ALIGNMENT_D:
	case PREF_MAX_WAVES_COUNT:
	case PREF_SM_COUNT_TARGET:
		want = 4;
		break;
	case PREF_MAX_WORKSPACE_BYTES:
	case PREF_IMPL_MASK:
		want = 8;
		break;
	}
	if (want == 0 || buf == NULL || n != want)
		return ST_INVALID_VALUE;
	if (attr == PREF_MAX_WORKSPACE_BYTES)
		memcpy(&p->maxWorkspace, buf, 8);
	if (attr >= PREF_MIN_ALIGNMENT_A && attr <= PREF_MIN_ALIGNMENT_D)
		memcpy(&p->align[attr - PREF_MIN_ALIGNMENT_A], buf, 4);
	return ST_SUCCESS;
}

/* problem is a matmul's descriptors, checked and read. */
struct problem {
	struct job j;
	int bias;     /* the epilogue reads or writes the bias */
	int64_t nbias; /* its elements */
	int aux;      /* … the auxiliary matrix */
	const struct layout *la, *lb, *lc, *ld;
};

/* epilogueOK: 0 for one the stand-in does, ST_NOT_SUPPORTED for one of
 * cuBLASLt's it does not, ST_INVALID_VALUE for a number that is none. */
static cublasStatus_t epilogueOK(uint32_t e) {
	switch (e) {
	case EPI_DEFAULT:
	case EPI_BIAS:
	case EPI_GELU:
	case EPI_GELU_BIAS:
	case EPI_BGRADA:
	case EPI_BGRADB:
	case EPI_GELU_AUX:
	case EPI_GELU_AUX_BIAS:
	case EPI_DGELU:
		return ST_SUCCESS;
	case EPI_RELU:
	case EPI_RELU_BIAS:
	case EPI_RELU_AUX:
	case EPI_RELU_AUX_BIAS:
	case EPI_DRELU:
	case EPI_DRELU_BGRAD:
	case EPI_DGELU_BGRAD:
		return ST_NOT_SUPPORTED;
	}
	return ST_INVALID_VALUE;
}

/* describe checks a matmul's descriptors and fills pr from them. */
static cublasStatus_t describe(const struct desc *d, const struct layout *la, const struct layout *lb, const struct layout *lc,
                               const struct layout *ld, struct problem *pr) {
	if (!isObj(d, K_DESC) || !isObj(la, K_LAYOUT) || !isObj(lb, K_LAYOUT) || !isObj(ld, K_LAYOUT))
		return ST_INVALID_VALUE;
	if (lc == NULL)
		lc = ld; /* cuBLASLt: an omitted Cdesc is Ddesc */
	else if (!isObj(lc, K_LAYOUT))
		return ST_INVALID_VALUE;
	memset(pr, 0, sizeof *pr);
	pr->la = la, pr->lb = lb, pr->lc = lc, pr->ld = ld;
	struct job *j = &pr->j;
	const uint64_t big = 1ULL << 40;
	if (la->rows > big || la->cols > big || lb->rows > big || lb->cols > big || ld->rows > big || ld->cols > big)
		return ST_INVALID_VALUE;
	j->ta = d->transa, j->tb = d->transb;
	j->m = (int64_t)ld->rows, j->n = (int64_t)ld->cols;
	int64_t am = j->ta == OP_N ? (int64_t)la->rows : (int64_t)la->cols;
	j->k = j->ta == OP_N ? (int64_t)la->cols : (int64_t)la->rows;
	int64_t bk = j->tb == OP_N ? (int64_t)lb->rows : (int64_t)lb->cols;
	int64_t bn = j->tb == OP_N ? (int64_t)lb->cols : (int64_t)lb->rows;
	if (am != j->m || bk != j->k || bn != j->n || lc->rows != ld->rows || lc->cols != ld->cols || lc->type != ld->type)
		return ST_INVALID_VALUE;
	if (la->ld < max1((int64_t)la->rows) || lb->ld < max1((int64_t)lb->rows) || ld->ld < max1((int64_t)ld->rows))
		return ST_INVALID_VALUE;
	/* C's ld may be 0 (a column broadcast) when C is not D. */
	if (lc->ld < (lc == ld ? max1((int64_t)lc->rows) : 0) || (lc->ld > 0 && lc->ld < (int64_t)lc->rows))
		return ST_INVALID_VALUE;
	cublasStatus_t r = checkTypes(d->compute, la->type, lb->type, ld->type);
	if (r != ST_SUCCESS)
		return r;
	if (d->scale != R_32F)
		return ST_NOT_SUPPORTED;
	if ((r = epilogueOK(d->epilogue)) != ST_SUCCESS)
		return r;
	/* Host pointer mode only; TRANSC is N (cuBLASLt has nothing else). */
	if (d->pointerMode != 0 || d->transc != OP_N || d->unsupported != 0)
		return ST_NOT_SUPPORTED;
	j->rnd = inputRounding(d->compute);
	j->epi = d->epilogue;
	j->batch = 1;
	j->a = (struct mat){NULL, la->type, la->ld, 0};
	j->b = (struct mat){NULL, lb->type, lb->ld, 0};
	j->c = (struct mat){NULL, lc->type, lc->ld, 0};
	j->d = (struct mat){NULL, ld->type, ld->ld, 0};
	pr->bias = j->epi != EPI_DEFAULT && j->epi != EPI_GELU && j->epi != EPI_GELU_AUX && j->epi != EPI_DGELU;
	pr->aux = j->epi == EPI_GELU_AUX || j->epi == EPI_GELU_AUX_BIAS || j->epi == EPI_DGELU;
	if (pr->aux) {
		if ((d->auxType != -1 && d->auxType != ld->type))
			return ST_NOT_SUPPORTED;
		if (d->auxLd < (int64_t)ld->rows || d->auxLd % 8 != 0)
			return ST_INVALID_VALUE;
		j->auxLd = d->auxLd;
	}
	pr->nbias = j->epi == EPI_BGRADB ? j->n : j->m;
	j->biasType = d->biasType == -1 ? ld->type : d->biasType;
	if (pr->bias && j->biasType != ld->type)
		return ST_NOT_SUPPORTED;
	return ST_SUCCESS;
}

static uint32_t alignOf(const void *p) {
	uint32_t a = 256;
	while (a > 1 && (uintptr_t)p % a != 0)
		a >>= 1;
	return a;
}

EXPORT cublasStatus_t cublasLtMatmulAlgoGetHeuristic(struct obj *h, struct desc *d, struct layout *la, struct layout *lb, struct layout *lc,
                                                     struct layout *ld, struct pref *p, int requested,
                                                     cublasLtMatmulHeuristicResult_t *results, int *returned) {
	if (!isObj(h, K_LTHANDLE))
		return ST_NOT_INITIALIZED;
	if (requested < 1 || results == NULL || returned == NULL || !isObj(p, K_PREF))
		return ST_INVALID_VALUE;
	struct problem pr;
	cublasStatus_t r = describe(d, la, lb, lc, ld, &pr);
	if (r != ST_SUCCESS)
		return r;
	*returned = 0;
	if (pr.aux && getenv("GPTUI_STANDIN_CUBLASLT_NO_AUX") != NULL)
		return ST_SUCCESS; /* as a library without such a kernel answers */
	const int types[4] = {la->type, lb->type, (lc == NULL ? ld : lc)->type, ld->type};
	for (int i = 0; i < 4; i++)
		if (p->align[i] < typeSize(types[i]))
			return ST_SUCCESS; /* no kernel reads elements that are not aligned */
	cublasLtMatmulHeuristicResult_t *res = &results[0];
	memset(res, 0, sizeof *res);
	res->algo.data[0] = ALGO_MAGIC;
	res->algo.data[1] = p->maxWorkspace;
	for (int i = 0; i < 4; i++)
		res->algo.data[2] |= (uint64_t)(p->align[i] > 256 ? 256 : p->align[i]) << (16 * i);
	res->algo.data[3] = pr.bias && d->bias != NULL ? alignOf(d->bias) : 0;
	res->algo.data[4] = pr.aux && d->aux != NULL ? alignOf(d->aux) : 0;
	res->workspaceSize = p->maxWorkspace;
	res->state = ST_SUCCESS;
	res->wavesCount = 1.0f;
	*returned = 1;
	return ST_SUCCESS;
}

EXPORT cublasStatus_t cublasLtMatmul(struct obj *h, struct desc *d, const float *alpha, const void *A, struct layout *la, const void *B,
                                     struct layout *lb, const float *beta, const void *C, struct layout *lc, void *D, struct layout *ld,
                                     const cublasLtMatmulAlgo_t *algo, void *ws, size_t wsBytes, void *stream) {
	if (!isObj(h, K_LTHANDLE))
		return ST_NOT_INITIALIZED;
	struct problem pr;
	cublasStatus_t r = describe(d, la, lb, lc, ld, &pr);
	if (r != ST_SUCCESS)
		return r;
	if (alpha == NULL || beta == NULL)
		return ST_INVALID_VALUE;
	/* What the algorithm needs: the workspace and alignment it was
	 * chosen for (an implicit heuristic, for a NULL algo, takes no
	 * workspace and the pointers as they are). */
	uint64_t need = 0;
	uint32_t align[4] = {0, 0, 0, 0}, biasAlign = 0, auxAlign = 0;
	if (algo != NULL) {
		if (algo->data[0] != ALGO_MAGIC)
			return ST_INVALID_VALUE;
		need = algo->data[1];
		for (int i = 0; i < 4; i++)
			align[i] = (uint32_t)(algo->data[2] >> (16 * i)) & 0xffff;
		biasAlign = (uint32_t)algo->data[3];
		auxAlign = (uint32_t)algo->data[4];
	}
	if (wsBytes < need)
		return ST_INVALID_VALUE;
	if (wsBytes > 0 && (ws == NULL || (uintptr_t)ws % 256 != 0 || !isdev(ws, wsBytes)))
		return ST_INVALID_VALUE;
	struct job *j = &pr.j;
	float al = *alpha, be = *beta;
	if (j->m == 0 || j->n == 0)
		return ST_SUCCESS;
	int product = j->k > 0 && al != 0;
	const void *Cp = lc == NULL ? D : C;
	const struct layout *lcc = pr.lc;
	if ((product || j->epi == EPI_BGRADA) && !onDevice(A, la->type, (int64_t)la->rows, (int64_t)la->cols, la->ld, 0, 1, align[0]))
		return ST_INVALID_VALUE;
	if ((product || j->epi == EPI_BGRADB) && !onDevice(B, lb->type, (int64_t)lb->rows, (int64_t)lb->cols, lb->ld, 0, 1, align[1]))
		return ST_INVALID_VALUE;
	if (be != 0 && !onDevice(Cp, lcc->type, (int64_t)lcc->rows, (int64_t)lcc->cols, lcc->ld, 0, 1, align[2]))
		return ST_INVALID_VALUE;
	if (!onDevice(D, ld->type, (int64_t)ld->rows, (int64_t)ld->cols, ld->ld, 0, 1, align[3]))
		return ST_INVALID_VALUE;
	if (pr.bias && !onDevice(d->bias, j->biasType, pr.nbias, 1, pr.nbias, 0, 1, biasAlign))
		return ST_INVALID_VALUE;
	if (pr.aux && !onDevice(d->aux, ld->type, (int64_t)ld->rows, (int64_t)ld->cols, d->auxLd, 0, 1, auxAlign))
		return ST_INVALID_VALUE;
	struct job *q = malloc(sizeof *q);
	if (q == NULL)
		return ST_ALLOC_FAILED;
	*q = *j;
	q->alpha = al, q->beta = be;
	q->a.p = A, q->b.p = B, q->c.p = be != 0 ? Cp : NULL, q->d.p = D;
	q->bias = pr.bias ? (char *)d->bias : NULL;
	q->aux = pr.aux ? (char *)d->aux : NULL;
	q->opA = q->opB = NULL;
	return launch(q, stream);
}

#endif

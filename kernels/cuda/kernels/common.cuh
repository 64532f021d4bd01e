// common.cuh: what every kernel family shares. NVRTC compiles all families
// as one program with no #include (see source.go), so this prelude defines
// its own integer, bf16 and fp16 types, the dropout hash of kernels/cpu,
// CPU-exact exponentials, and warp and block reductions.
//
// Conventions of every kernel:
//   - extern "C" __global__, so names are unmangled; fp32 in and out;
//   - element counts are long long, row and column counts int;
//   - `vec` arguments say the pointers are 16-byte aligned (8 for 16-bit
//     data), so the kernel may use float4 loads; the tail n % 4 is scalar;
//   - row-wise work: one warp per row (or one block per long row);
//   - loops are grid-stride, so any grid covers any n.
//
// The emulator (emu/) compiles this same text as C++20; nothing here
// depends on which compiler reads it.

typedef unsigned short bf16_t; // bfloat16 bits
typedef unsigned short f16_t;  // IEEE binary16 bits

#define FULL_MASK 0xffffffffu

// GRID_STRIDE loops i over [0, n) across the whole grid.
#define GRID_STRIDE(i, n) \
	for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < (n); i += (long long)gridDim.x * blockDim.x)

// ---- dropout mask (kernels/cpu/dropout.go) ----

// mix64 is the splitmix64 finaliser.
__device__ __forceinline__ unsigned long long mix64(unsigned long long x) {
	x ^= x >> 30;
	x *= 0xbf58476d1ce4e5b9ULL;
	x ^= x >> 27;
	x *= 0x94d049bb133111ebULL;
	x ^= x >> 31;
	return x;
}

// dropout_keep is Dropout.Keep: whether element i of the site key's stream
// survives dropout with probability p.
__device__ __forceinline__ bool dropout_keep(unsigned long long key, unsigned long long i, float p) {
	unsigned long long h = mix64(key ^ mix64(i + 0x9e3779b97f4a7c15ULL));
	return (float)(h >> 40) * (1.0f / 16777216.0f) >= p;
}

// ---- exponentials, as kernels/cpu/exp.go computes them ----

// exp_poly is eˣ for −87.3 ≤ x ≤ 88: x = k·ln2 + r, eʳ by a degree-6
// polynomial, 2ᵏ built in the exponent bits. Every operation is rounded on
// its own (__fmul_rn and friends, which NVRTC never fuses into an FMA), in
// kernels/cpu's order, so the result has the CPU's bits: a plain a·b + c
// here is contracted into one rounding and differs in the last bit for a
// few inputs in a thousand (seen on an H200, 2026-11-28).
__device__ __forceinline__ float exp_poly(float x) {
	float t = __fadd_rn(__fmul_rn(x, 1.44269504088896341f), 12582912.0f);
	int k = __float_as_int(t) - 0x4b400000;
	float kf = __fsub_rn(t, 12582912.0f);
	float r = __fsub_rn(__fsub_rn(x, __fmul_rn(kf, 0.693359375f)), __fmul_rn(kf, -2.12194440e-4f));
	float p = __fadd_rn(1.0f / 120, __fmul_rn(r, 1.0f / 720));
	p = __fadd_rn(1.0f / 24, __fmul_rn(r, p));
	p = __fadd_rn(1.0f / 6, __fmul_rn(r, p));
	p = __fadd_rn(1.0f / 2, __fmul_rn(r, p));
	p = __fadd_rn(1.0f, __fmul_rn(r, p));
	p = __fadd_rn(1.0f, __fmul_rn(r, p));
	return __fmul_rn(p, __int_as_float((k + 127) << 23));
}

// exp32 is kernels/cpu's exp32.
__device__ __forceinline__ float exp32(float x) {
	if (x < -87.3f) return 0.0f;
	if (x > 88.0f) return (float)exp((double)x);
	return exp_poly(x);
}

// ---- bf16 and fp16, round to nearest even ----

__device__ __forceinline__ bf16_t f32_to_bf16(float f) {
	unsigned int u = __float_as_uint(f);
	if ((u & 0x7fffffffu) > 0x7f800000u) return (bf16_t)((u >> 16) | 0x40u); // NaN stays NaN, quiet
	u += 0x7fffu + ((u >> 16) & 1u);
	return (bf16_t)(u >> 16);
}

__device__ __forceinline__ float bf16_to_f32(bf16_t h) { return __uint_as_float((unsigned int)h << 16); }

// f32_to_f16 rounds to nearest even with integer arithmetic only, so flush-
// to-zero compiler modes do not touch half denormals. NaN becomes a quiet
// NaN of the same sign (payload dropped); beyond 65520 becomes infinity.
__device__ __forceinline__ f16_t f32_to_f16(float f) {
	unsigned int u = __float_as_uint(f);
	unsigned int sign = (u >> 16) & 0x8000u;
	unsigned int a = u & 0x7fffffffu;
	if (a > 0x7f800000u) return (f16_t)(sign | 0x7e00u);
	if (a >= 0x477ff000u) return (f16_t)(sign | 0x7c00u); // rounds to ≥ 65536: infinity
	if (a >= 0x38800000u) {                                // normal half
		unsigned int r = a - 0x38000000u;                 // rebias 127 → 15
		r += 0xfffu + ((r >> 13) & 1u);
		return (f16_t)(sign | (r >> 13));
	}
	if (a <= 0x33000000u) return (f16_t)sign; // at most half the least denormal: ±0
	unsigned int e = a >> 23;                 // 102 … 112
	unsigned int m = (a & 0x7fffffu) | 0x800000u;
	unsigned int shift = 126u - e; // 14 … 24
	unsigned int q = m >> shift;
	unsigned int rem = m & ((1u << shift) - 1u);
	unsigned int half = 1u << (shift - 1u);
	if (rem > half || (rem == half && (q & 1u))) q++;
	return (f16_t)(sign | q);
}

__device__ __forceinline__ float f16_to_f32(f16_t h) {
	unsigned int sign = ((unsigned int)h & 0x8000u) << 16;
	unsigned int e = ((unsigned int)h >> 10) & 0x1fu;
	unsigned int m = (unsigned int)h & 0x3ffu;
	if (e == 0x1fu) return __uint_as_float(sign | 0x7f800000u | (m << 13)); // inf, NaN
	if (e != 0) return __uint_as_float(sign | ((e + 112u) << 23) | (m << 13));
	if (m == 0) return __uint_as_float(sign);
	// Denormal: m·2⁻²⁴, normalised by hand (no float multiply under FTZ).
	unsigned int s = 0;
	while (!(m & 0x400u)) {
		m <<= 1;
		s++;
	}
	return __uint_as_float(sign | ((113u - s) << 23) | ((m & 0x3ffu) << 13));
}

// ---- activations: float32, or bfloat16 under bf16 (kernels/activations.go) ----
//
// A kernel argument that may hold activations is a void* with a bit of the
// kernel's `bf` mask (bit k for its k-th such argument, in the order the
// kernel's comment lists them): set, its elements are bfloat16, read
// widened to float and stored rounded to nearest even, as kernels/cpu
// rounds what it stores; clear, float32. The arithmetic is float32 either
// way, so a kernel stores the CPU's bits whenever its float32 result has
// them. The float4 paths (`vec`) run only when bf is 0.

// BF is whether argument k of the mask bf is bfloat16.
#define BF(bf, k) (((bf) >> (k)) & 1)

__device__ __forceinline__ float ldx(const void* p, long long i, int isbf) {
	return isbf ? bf16_to_f32(((const bf16_t*)p)[i]) : ((const float*)p)[i];
}

__device__ __forceinline__ void stx(void* p, long long i, float v, int isbf) {
	if (isbf)
		((bf16_t*)p)[i] = f32_to_bf16(v);
	else
		((float*)p)[i] = v;
}

// ld8 widens the eight bfloat16s at p (16-byte aligned) to v; st8 stores
// v there rounded, as stx does.
__device__ __forceinline__ void ld8(float (&v)[8], const bf16_t* p) {
	const uint4 u = *(const uint4*)p;
	const unsigned w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
	for (int k = 0; k < 4; k++) {
		v[2 * k] = __uint_as_float(w[k] << 16);
		v[2 * k + 1] = __uint_as_float(w[k] & 0xffff0000u);
	}
}

__device__ __forceinline__ void st8(bf16_t* p, const float (&v)[8]) {
	uint4 u;
	u.x = (unsigned)f32_to_bf16(v[0]) | (unsigned)f32_to_bf16(v[1]) << 16;
	u.y = (unsigned)f32_to_bf16(v[2]) | (unsigned)f32_to_bf16(v[3]) << 16;
	u.z = (unsigned)f32_to_bf16(v[4]) | (unsigned)f32_to_bf16(v[5]) << 16;
	u.w = (unsigned)f32_to_bf16(v[6]) | (unsigned)f32_to_bf16(v[7]) << 16;
	*(uint4*)p = u;
}

// stored is v as stx stores it: rounded to bfloat16 when isbf.
__device__ __forceinline__ float stored(float v, int isbf) { return isbf ? bf16_to_f32(f32_to_bf16(v)) : v; }

// ---- reductions ----

__device__ __forceinline__ float warp_sum(float v) {
	for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(FULL_MASK, v, o);
	return v;
}

__device__ __forceinline__ double warp_sum_d(double v) {
	for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(FULL_MASK, v, o);
	return v;
}

__device__ __forceinline__ float warp_max(float v) {
	for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(FULL_MASK, v, o));
	return v;
}

// block_sum_d, block_sum and block_max return the reduction over the whole
// block to every thread. Every thread of the block must call them (they
// hold __syncthreads); blockDim.x is a multiple of 32; the order is fixed,
// so the result is the same on every run.
__device__ __forceinline__ double block_sum_d(double v) {
	__shared__ double part[32];
	int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
	v = warp_sum_d(v);
	__syncthreads(); // an earlier call's readers are done with part
	if (lane == 0) part[w] = v;
	__syncthreads();
	v = lane < (int)(blockDim.x >> 5) ? part[lane] : 0.0;
	return warp_sum_d(v);
}

__device__ __forceinline__ float block_sum(float v) {
	__shared__ float part[32];
	int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
	v = warp_sum(v);
	__syncthreads();
	if (lane == 0) part[w] = v;
	__syncthreads();
	v = lane < (int)(blockDim.x >> 5) ? part[lane] : 0.0f;
	return warp_sum(v);
}

__device__ __forceinline__ float block_max(float v) {
	__shared__ float part[32];
	int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
	v = warp_max(v);
	__syncthreads();
	if (lane == 0) part[w] = v;
	__syncthreads();
	v = lane < (int)(blockDim.x >> 5) ? part[lane] : -__int_as_float(0x7f800000);
	return warp_max(v);
}

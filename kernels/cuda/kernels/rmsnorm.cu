// rmsnorm.cu: RMSNorm over the last dimension, the Llama family's norm
// (kernels/cpu/rmsnorm.go): no centring, no bias.

// rmsnorm_row is the rest of a warp's row of rmsnorm_forward once each
// lane has summed the squares of its share of the row (elements base …
// base+C−1 of x) into q: rstd, the output (the same elements of o) and the
// row's rstd (may be null). It is residual_rmsnorm_forward's (fused.cu)
// too; x may alias what the caller writes. obf, xbf: whether o and x are
// bfloat16 (vec only when neither is).
__device__ __forceinline__ void rmsnorm_row(void* __restrict__ o, float* __restrict__ rstd, const void* x,
                                            long long base, const float* __restrict__ w, double q, int row, int C,
                                            float eps, int vec, int lane, int obf, int xbf) {
	float r = (float)(1.0 / sqrt(warp_sum_d(q) / (double)C + (double)eps));
	if (vec) {
		for (int i = lane; i < C / 4; i += 32) {
			float4 v = ((const float4*)((const float*)x + base))[i], g = ((const float4*)w)[i];
			float4 y;
			y.x = v.x * r * g.x;
			y.y = v.y * r * g.y;
			y.z = v.z * r * g.z;
			y.w = v.w * r * g.w;
			((float4*)((float*)o + base))[i] = y;
		}
	} else {
		for (int i = lane; i < C; i += 32) stx(o, base + i, ldx(x, base + i, xbf) * r * w[i], obf);
	}
	if (lane == 0 && rstd) rstd[row] = r;
}

// rmsnorm_forward normalises each of N rows of C, one warp per row:
// out = x·rstd·w, rstd = 1/√(mean(x²) + eps), and rstd (N) for the backward
// pass (may be null: not kept). As on the CPU, the sum of squares is taken
// in double, so the result matches the CPU's up to the order of that sum.
// vec: C % 4 == 0 and inp, out, w 16-byte aligned. bf: out, inp.
extern "C" __global__ void rmsnorm_forward(void* __restrict__ out, float* __restrict__ rstd,
                                           const void* __restrict__ inp, const float* __restrict__ w, int N, int C,
                                           float eps, int bf, int vec) {
	int lane = threadIdx.x & 31;
	int row = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
	if (row >= N) return; // the whole warp
	long long base = (long long)row * C;
	double q = 0.0;
	if (vec) {
		const float* x = (const float*)inp + base;
		for (int i = lane; i < C / 4; i += 32) {
			float4 v = ((const float4*)x)[i];
			double a = v.x, b = v.y, c = v.z, d = v.w;
			q += (a * a + b * b) + (c * c + d * d);
		}
	} else {
		for (int i = lane; i < C; i += 32) {
			double a = ldx(inp, base + i, BF(bf, 1));
			q += a * a;
		}
	}
	rmsnorm_row(out, rstd, inp, base, w, q, row, C, eps, vec, lane, BF(bf, 0), BF(bf, 1));
}

// rmsnorm_backward accumulates dinp (N,C) and dw (C), one warp per row, the
// block's dw partial sums in C floats of dynamic shared memory (shared
// atomics), added to dw with one global atomic per column and block at the
// end:
//
//	n = x·rstd, dn = dout·w
//	dinp += rstd·(dn − n·mean(dn·n)); dw += Σ dout·n
//
// Launched with 512 threads, as layernorm_backward (kernels.go lnbThreads).
// bf: dinp, dout, inp.
extern "C" __global__ void __launch_bounds__(512)
    rmsnorm_backward(void* __restrict__ dinp, float* __restrict__ dw, const void* __restrict__ dout,
                     const void* __restrict__ inp, const float* __restrict__ w, const float* __restrict__ rstd, int N,
                     int C, int bf) {
	extern __shared__ float rms_smem[];
	for (int i = threadIdx.x; i < C; i += blockDim.x) rms_smem[i] = 0.0f;
	__syncthreads();
	int lane = threadIdx.x & 31, warps = blockDim.x >> 5;
	for (int row = blockIdx.x * warps + (threadIdx.x >> 5); row < N; row += gridDim.x * warps) {
		long long base = (long long)row * C;
		float s = rstd[row];
		float dnm = 0.0f;
		for (int i = lane; i < C; i += 32)
			dnm += ldx(dout, base + i, BF(bf, 1)) * w[i] * (ldx(inp, base + i, BF(bf, 2)) * s);
		dnm = warp_sum(dnm) / (float)C;
		for (int i = lane; i < C; i += 32) {
			float g = ldx(dout, base + i, BF(bf, 1));
			float n = ldx(inp, base + i, BF(bf, 2)) * s;
			atomicAdd(&rms_smem[i], n * g);
			stx(dinp, base + i, ldx(dinp, base + i, BF(bf, 0)) + (g * w[i] - n * dnm) * s, BF(bf, 0));
		}
	}
	__syncthreads();
	for (int i = threadIdx.x; i < C; i += blockDim.x) atomicAdd(&dw[i], rms_smem[i]);
}

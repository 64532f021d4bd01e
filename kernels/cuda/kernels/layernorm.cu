// layernorm.cu: LayerNorm over the last dimension (kernels/cpu/layernorm.go).

#define LN_EPS 1e-5 // GPT-2's variance epsilon, as kernels/cpu: the double nearest 1e-5

// layernorm_row is the rest of a warp's row of layernorm_forward once each
// lane has summed its share of the row (elements base … base+C−1 of x)
// into s: the mean, the variance (a second pass, in double), the output
// (the same elements of o) and the row's mean and rstd (either may be
// null). It is residual_layernorm_forward's (fused.cu) too; x may alias
// what the caller writes. obf, xbf: whether o and x are bfloat16 (vec only
// when neither is).
__device__ __forceinline__ void layernorm_row(void* __restrict__ o, float* __restrict__ mean, float* __restrict__ rstd,
                                              const void* x, long long base, const float* __restrict__ w,
                                              const float* __restrict__ bias, double s, int row, int C, int vec,
                                              int lane, int obf, int xbf) {
	double md = warp_sum_d(s) / (double)C;
	double q = 0.0;
	if (vec) {
		for (int i = lane; i < C / 4; i += 32) {
			float4 v = ((const float4*)((const float*)x + base))[i];
			double a = v.x - md, b = v.y - md, c = v.z - md, d = v.w - md;
			q += (a * a + b * b) + (c * c + d * d);
		}
	} else {
		for (int i = lane; i < C; i += 32) {
			double d = ldx(x, base + i, xbf) - md;
			q += d * d;
		}
	}
	float r = (float)(1.0 / sqrt(warp_sum_d(q) / (double)C + (double)LN_EPS));
	float m = (float)md;
	if (vec) {
		for (int i = lane; i < C / 4; i += 32) {
			float4 v = ((const float4*)((const float*)x + base))[i], g = ((const float4*)w)[i], b = ((const float4*)bias)[i];
			float4 y;
			y.x = (v.x - m) * r * g.x + b.x;
			y.y = (v.y - m) * r * g.y + b.y;
			y.z = (v.z - m) * r * g.z + b.z;
			y.w = (v.w - m) * r * g.w + b.w;
			((float4*)((float*)o + base))[i] = y;
		}
	} else {
		for (int i = lane; i < C; i += 32) stx(o, base + i, (ldx(x, base + i, xbf) - m) * r * w[i] + bias[i], obf);
	}
	if (lane == 0) {
		if (mean) mean[row] = m;
		if (rstd) rstd[row] = r;
	}
}

// layernorm_forward normalises each of N rows of C, one warp per row:
// out = (x − mean)·rstd·w + bias, and mean, rstd (N) for the backward pass
// (either may be null: not kept). As on the CPU, the mean and the variance
// (two passes over the row) are summed in double, and the mean rounded to
// float before it is subtracted, so the result matches the CPU's up to the
// order of the double sums. vec: C % 4 == 0 and inp, out, w, bias 16-byte
// aligned. bf: out, inp.
extern "C" __global__ void layernorm_forward(void* __restrict__ out, float* __restrict__ mean, float* __restrict__ rstd,
                                             const void* __restrict__ inp, const float* __restrict__ w,
                                             const float* __restrict__ bias, int N, int C, int bf, int vec) {
	int lane = threadIdx.x & 31;
	int row = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
	if (row >= N) return; // the whole warp
	long long base = (long long)row * C;
	double s = 0.0;
	if (vec) {
		const float* x = (const float*)inp + base;
		for (int i = lane; i < C / 4; i += 32) {
			float4 v = ((const float4*)x)[i];
			s += ((double)v.x + (double)v.y) + ((double)v.z + (double)v.w);
		}
	} else {
		for (int i = lane; i < C; i += 32) s += (double)ldx(inp, base + i, BF(bf, 1));
	}
	layernorm_row(out, mean, rstd, inp, base, w, bias, s, row, C, vec, lane, BF(bf, 0), BF(bf, 1));
}

// layernorm_backward accumulates dinp (N,C), dw and dbias (C), one warp per
// row, the block's dw and dbias partial sums in 2·C floats of dynamic
// shared memory (shared atomics), added to dw and dbias with one global
// atomic per column and block at the end:
//
//	n = (x − mean)·rstd, dn = dout·w
//	dinp += rstd·(dn − mean(dn) − n·mean(dn·n)); dbias += Σ dout; dw += Σ dout·n
//
// Launched with 512 threads (kernels.go lnbThreads). bf: dinp, dout, inp.
extern "C" __global__ void __launch_bounds__(512)
    layernorm_backward(void* __restrict__ dinp, float* __restrict__ dw, float* __restrict__ dbias,
                       const void* __restrict__ dout, const void* __restrict__ inp, const float* __restrict__ w,
                       const float* __restrict__ mean, const float* __restrict__ rstd, int N, int C, int bf) {
	extern __shared__ float ln_smem[];
	float* sdw = ln_smem;
	float* sdb = ln_smem + C;
	for (int i = threadIdx.x; i < 2 * C; i += blockDim.x) ln_smem[i] = 0.0f;
	__syncthreads();
	int lane = threadIdx.x & 31, warps = blockDim.x >> 5;
	for (int row = blockIdx.x * warps + (threadIdx.x >> 5); row < N; row += gridDim.x * warps) {
		long long base = (long long)row * C;
		float m = mean[row], s = rstd[row];
		float dm = 0.0f, dnm = 0.0f;
		for (int i = lane; i < C; i += 32) {
			float n = (ldx(inp, base + i, BF(bf, 2)) - m) * s;
			float dn = ldx(dout, base + i, BF(bf, 1)) * w[i];
			dm += dn;
			dnm += dn * n;
		}
		dm = warp_sum(dm) / (float)C;
		dnm = warp_sum(dnm) / (float)C;
		for (int i = lane; i < C; i += 32) {
			float g = ldx(dout, base + i, BF(bf, 1));
			float n = (ldx(inp, base + i, BF(bf, 2)) - m) * s;
			float dn = g * w[i];
			atomicAdd(&sdb[i], g);
			atomicAdd(&sdw[i], n * g);
			stx(dinp, base + i, ldx(dinp, base + i, BF(bf, 0)) + (dn - dm - n * dnm) * s, BF(bf, 0));
		}
	}
	__syncthreads();
	for (int i = threadIdx.x; i < C; i += blockDim.x) {
		atomicAdd(&dw[i], sdw[i]);
		atomicAdd(&dbias[i], sdb[i]);
	}
}

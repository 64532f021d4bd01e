// fused.cu: the residual add fused with the norm that reads it, as llm.c's
// fused_residual_forward (kernels/cpu/fused.go): one launch and one read of
// x and y instead of residual_forward then layernorm_forward (or
// rmsnorm_forward).
//
// Each kernel is its norm's kernel (layernorm.cu, rmsnorm.cu) with the
// first pass over the row also adding res = x + y and storing it, then the
// norm's own rest of the row (layernorm_row, rmsnorm_row): one warp per
// row, no shared memory, the later passes reading back the res elements
// the same lane stored (cached). The sums are the norm kernel's, in its
// order, so the results are residual_forward's then the norm's.
// res may alias x or y (so none of the three is __restrict__); out, mean
// and rstd alias nothing. vec: C % 4 == 0 and res, out, x, y, w (and bias)
// 16-byte aligned. bf: res, out, x, y; the norm reads res as it is stored
// (rounded to bfloat16 when res is), as the unfused pair would.

// residual_row stores row (elements base … base+C−1) of res = x + y, a
// warp's lanes sharing it as the norms do, and returns the lane's share of
// the row's sum (of the sum of squares when square) of res as stored, in
// double, in the order of the norm it feeds (layernorm_forward's sum,
// rmsnorm_forward's sum of squares).
__device__ __forceinline__ double residual_row(void* res, const void* x, const void* y, long long base, int C, int bf,
                                               int vec, int lane, int square) {
	double s = 0.0;
	if (vec) {
		const float4* xr = (const float4*)((const float*)x + base);
		const float4* yr = (const float4*)((const float*)y + base);
		float4* rr = (float4*)((float*)res + base);
		for (int i = lane; i < C / 4; i += 32) {
			float4 a = xr[i], b = yr[i];
			float4 v;
			v.x = a.x + b.x;
			v.y = a.y + b.y;
			v.z = a.z + b.z;
			v.w = a.w + b.w;
			rr[i] = v;
			double e = v.x, f = v.y, g = v.z, h = v.w;
			s += square ? (e * e + f * f) + (g * g + h * h) : (e + f) + (g + h);
		}
	} else {
		for (int i = lane; i < C; i += 32) {
			float v = stored(ldx(x, base + i, BF(bf, 2)) + ldx(y, base + i, BF(bf, 3)), BF(bf, 0));
			stx(res, base + i, v, BF(bf, 0));
			double a = v;
			s += square ? a * a : a;
		}
	}
	return s;
}

// residual_layernorm_forward: res = x + y, then out = (res − mean)·rstd·w +
// bias and mean, rstd (N) kept (either may be null), as layernorm_forward.
extern "C" __global__ void residual_layernorm_forward(void* res, void* __restrict__ out, float* __restrict__ mean,
                                                      float* __restrict__ rstd, const void* x, const void* y,
                                                      const float* __restrict__ w, const float* __restrict__ bias,
                                                      int N, int C, int bf, int vec) {
	int lane = threadIdx.x & 31;
	int row = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
	if (row >= N) return; // the whole warp
	long long base = (long long)row * C;
	double s = residual_row(res, x, y, base, C, bf, vec, lane, 0);
	layernorm_row(out, mean, rstd, res, base, w, bias, s, row, C, vec, lane, BF(bf, 1), BF(bf, 0));
}

// residual_rmsnorm_forward: res = x + y, then out = res·rstd·w, rstd =
// 1/√(mean(res²) + eps) kept (may be null), as rmsnorm_forward.
extern "C" __global__ void residual_rmsnorm_forward(void* res, void* __restrict__ out, float* __restrict__ rstd,
                                                    const void* x, const void* y, const float* __restrict__ w, int N,
                                                    int C, float eps, int bf, int vec) {
	int lane = threadIdx.x & 31;
	int row = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
	if (row >= N) return; // the whole warp
	long long base = (long long)row * C;
	double q = residual_row(res, x, y, base, C, bf, vec, lane, 1);
	rmsnorm_row(out, rstd, res, base, w, q, row, C, eps, vec, lane, BF(bf, 1), BF(bf, 0));
}

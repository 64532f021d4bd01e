// fused.cu: the residual add fused with the norm that reads it, as llm.c's
// fused_residual_forward (kernels/cpu/fused.go): one launch and one read of
// x and y instead of residual_forward then layernorm_forward (or
// rmsnorm_forward).
//
// Each kernel is its norm's kernel (layernorm.cu, rmsnorm.cu) with the
// first pass over the row also adding res = x + y and storing it: one warp
// per row, no shared memory, the later passes reading back the res
// elements the same lane stored (cached). The sums are the norm kernel's,
// in its order, so the results are residual_forward's then the norm's.
// res may alias x or y (so none of the three is __restrict__); out, mean
// and rstd alias nothing. vec: C % 4 == 0 and res, out, x, y, w (and bias)
// 16-byte aligned.

// residual_layernorm_forward: res = x + y, then out = (res − mean)·rstd·w +
// bias and mean, rstd (N) kept (either may be null), as layernorm_forward.
extern "C" __global__ void residual_layernorm_forward(float* res, float* __restrict__ out, float* __restrict__ mean,
                                                      float* __restrict__ rstd, const float* x, const float* y,
                                                      const float* __restrict__ w, const float* __restrict__ bias,
                                                      int N, int C, int vec) {
	int lane = threadIdx.x & 31;
	int row = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
	if (row >= N) return; // the whole warp
	long long base = (long long)row * C;
	const float* xr = x + base;
	const float* yr = y + base;
	float* rr = res + base;
	float* o = out + base;
	double s = 0.0;
	if (vec) {
		for (int i = lane; i < C / 4; i += 32) {
			float4 a = ((const float4*)xr)[i], b = ((const float4*)yr)[i];
			float4 v;
			v.x = a.x + b.x;
			v.y = a.y + b.y;
			v.z = a.z + b.z;
			v.w = a.w + b.w;
			((float4*)rr)[i] = v;
			s += ((double)v.x + (double)v.y) + ((double)v.z + (double)v.w);
		}
	} else {
		for (int i = lane; i < C; i += 32) {
			float v = xr[i] + yr[i];
			rr[i] = v;
			s += (double)v;
		}
	}
	double md = warp_sum_d(s) / (double)C;
	double q = 0.0;
	if (vec) {
		for (int i = lane; i < C / 4; i += 32) {
			float4 v = ((const float4*)rr)[i];
			double a = v.x - md, b = v.y - md, c = v.z - md, d = v.w - md;
			q += (a * a + b * b) + (c * c + d * d);
		}
	} else {
		for (int i = lane; i < C; i += 32) {
			double d = rr[i] - md;
			q += d * d;
		}
	}
	float r = (float)(1.0 / sqrt(warp_sum_d(q) / (double)C + (double)LN_EPS));
	float m = (float)md;
	if (vec) {
		for (int i = lane; i < C / 4; i += 32) {
			float4 v = ((const float4*)rr)[i], g = ((const float4*)w)[i], b = ((const float4*)bias)[i];
			float4 z;
			z.x = (v.x - m) * r * g.x + b.x;
			z.y = (v.y - m) * r * g.y + b.y;
			z.z = (v.z - m) * r * g.z + b.z;
			z.w = (v.w - m) * r * g.w + b.w;
			((float4*)o)[i] = z;
		}
	} else {
		for (int i = lane; i < C; i += 32) o[i] = (rr[i] - m) * r * w[i] + bias[i];
	}
	if (lane == 0) {
		if (mean) mean[row] = m;
		if (rstd) rstd[row] = r;
	}
}

// residual_rmsnorm_forward: res = x + y, then out = res·rstd·w, rstd =
// 1/√(mean(res²) + eps) kept (may be null), as rmsnorm_forward.
extern "C" __global__ void residual_rmsnorm_forward(float* res, float* __restrict__ out, float* __restrict__ rstd,
                                                    const float* x, const float* y, const float* __restrict__ w,
                                                    int N, int C, float eps, int vec) {
	int lane = threadIdx.x & 31;
	int row = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
	if (row >= N) return; // the whole warp
	long long base = (long long)row * C;
	const float* xr = x + base;
	const float* yr = y + base;
	float* rr = res + base;
	float* o = out + base;
	double q = 0.0;
	if (vec) {
		for (int i = lane; i < C / 4; i += 32) {
			float4 a = ((const float4*)xr)[i], b = ((const float4*)yr)[i];
			float4 v;
			v.x = a.x + b.x;
			v.y = a.y + b.y;
			v.z = a.z + b.z;
			v.w = a.w + b.w;
			((float4*)rr)[i] = v;
			double e = v.x, f = v.y, g = v.z, h = v.w;
			q += (e * e + f * f) + (g * g + h * h);
		}
	} else {
		for (int i = lane; i < C; i += 32) {
			float v = xr[i] + yr[i];
			rr[i] = v;
			double a = v;
			q += a * a;
		}
	}
	float r = (float)(1.0 / sqrt(warp_sum_d(q) / (double)C + (double)eps));
	if (vec) {
		for (int i = lane; i < C / 4; i += 32) {
			float4 v = ((const float4*)rr)[i], g = ((const float4*)w)[i];
			float4 z;
			z.x = v.x * r * g.x;
			z.y = v.y * r * g.y;
			z.z = v.z * r * g.z;
			z.w = v.w * r * g.w;
			((float4*)o)[i] = z;
		}
	} else {
		for (int i = lane; i < C; i += 32) o[i] = rr[i] * r * w[i];
	}
	if (lane == 0 && rstd) rstd[row] = r;
}

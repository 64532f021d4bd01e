// adamw.cu: AdamW on fp32 master weights (kernels/cpu/adamw.go), in the
// CPU's operation order with every product and sum rounded on its own
// (__fmul_rn and friends are never contracted into FMAs), so a GPU step
// matches the CPU backend's bit for bit. rc1 = 1/(1−β1^step) and
// rc2 = 1/(1−β2^step) come from the host, computed as the CPU does.
//
//	g = gscale·grad; m = β1·m + (1−β1)·g; v = β2·v + (1−β2)·g·g
//	p −= lr·(m·rc1/(√(v·rc2) + ε) + wd·p)

__device__ __forceinline__ void adamw_one(float& p, float g, float& m, float& v, float lr, float b1, float c1, float b2,
                                          float c2, float eps, float wd, float gscale, float rc1, float rc2) {
	float gi = __fmul_rn(g, gscale);
	float mi = __fadd_rn(__fmul_rn(b1, m), __fmul_rn(c1, gi));
	float vi = __fadd_rn(__fmul_rn(b2, v), __fmul_rn(__fmul_rn(c2, gi), gi));
	m = mi;
	v = vi;
	float den = __fadd_rn(__fsqrt_rn(__fmul_rn(vi, rc2)), eps);
	p = __fsub_rn(p, __fmul_rn(lr, __fadd_rn(__fdiv_rn(__fmul_rn(mi, rc1), den), __fmul_rn(wd, p))));
}

// adamw updates n parameters; vec: all four pointers 16-byte aligned.
extern "C" __global__ void adamw(float* __restrict__ params, const float* __restrict__ grads, float* __restrict__ m,
                                 float* __restrict__ v, long long n, float lr, float beta1, float beta2, float eps,
                                 float wd, float gscale, float rc1, float rc2, int vec) {
	float c1 = 1.0f - beta1, c2 = 1.0f - beta2;
	long long n4 = vec ? n / 4 : 0;
	GRID_STRIDE(i, n4) {
		float4 p = ((float4*)params)[i], g = ((const float4*)grads)[i];
		float4 mm = ((float4*)m)[i], vv = ((float4*)v)[i];
		adamw_one(p.x, g.x, mm.x, vv.x, lr, beta1, c1, beta2, c2, eps, wd, gscale, rc1, rc2);
		adamw_one(p.y, g.y, mm.y, vv.y, lr, beta1, c1, beta2, c2, eps, wd, gscale, rc1, rc2);
		adamw_one(p.z, g.z, mm.z, vv.z, lr, beta1, c1, beta2, c2, eps, wd, gscale, rc1, rc2);
		adamw_one(p.w, g.w, mm.w, vv.w, lr, beta1, c1, beta2, c2, eps, wd, gscale, rc1, rc2);
		((float4*)params)[i] = p;
		((float4*)m)[i] = mm;
		((float4*)v)[i] = vv;
	}
	GRID_STRIDE(j, n - 4 * n4) {
		long long i = 4 * n4 + j;
		adamw_one(params[i], grads[i], m[i], v[i], lr, beta1, c1, beta2, c2, eps, wd, gscale, rc1, rc2);
	}
}

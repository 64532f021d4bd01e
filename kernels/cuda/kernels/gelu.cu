// gelu.cu: GELU, tanh approximation (kernels/cpu/gelu.go), in the CPU's
// arithmetic: tanh u = 1 − 2/(e²ᵘ + 1), e²ᵘ by exp_poly with |u| ≤ 9,
// every operation rounded on its own (no FMA), so the bits are the CPU's.

#define GELU_K 0.7978845608028654f // √(2/π)

// gelu_tanh is tanh u, u = √(2/π)·(v + 0.044715·v³) (kernels/cpu's geluTanh).
__device__ __forceinline__ float gelu_tanh(float v) {
	float u = __fmul_rn(GELU_K, __fadd_rn(v, __fmul_rn(__fmul_rn(__fmul_rn(0.044715f, v), v), v)));
	return __fsub_rn(1.0f, __fdiv_rn(2.0f, __fadd_rn(exp_poly(__fmul_rn(2.0f, fminf(fmaxf(u, -9.0f), 9.0f))), 1.0f)));
}

__device__ __forceinline__ float gelu(float v) { return __fmul_rn(__fmul_rn(0.5f, v), __fadd_rn(1.0f, gelu_tanh(v))); }

// gelu_dth is g times the derivative at v, from th = tanh u (kernels/cpu's
// geluGrad), each operation rounded on its own in the CPU's order.
__device__ __forceinline__ float gelu_dth(float v, float th, float g) {
	float a = __fmul_rn(0.5f, __fadd_rn(1.0f, th));
	float b = __fmul_rn(__fmul_rn(__fmul_rn(0.5f, v), __fsub_rn(1.0f, __fmul_rn(th, th))), GELU_K);
	float c = __fadd_rn(1.0f, __fmul_rn(__fmul_rn(0.134145f, v), v));
	return __fmul_rn(g, __fadd_rn(a, __fmul_rn(b, c)));
}

// gelu_grad is the derivative times g, with tanh u recovered from the
// forward output y = ½·x·(1 + tanh u) (GeluBackward's way).
__device__ __forceinline__ float gelu_grad(float v, float y, float g) {
	float th = (v > 1e-6f || v < -1e-6f) ? __fsub_rn(__fdiv_rn(__fmul_rn(2.0f, y), v), 1.0f) : __fmul_rn(GELU_K, v);
	return gelu_dth(v, th, g);
}

// gelu_grad_of is the derivative times g, tanh u computed from v
// (MatmulBackwardGelu's way, as cuBLASLt's DGELU epilogue has only v),
// with out NULL; from y otherwise.
__device__ __forceinline__ float gelu_grad_of(float v, const void* out, float y, float g) {
	return out ? gelu_grad(v, y, g) : gelu_dth(v, gelu_tanh(v), g);
}

// gelu_forward: out = gelu(inp), n elements; out may alias inp. bf: out,
// inp.
extern "C" __global__ void gelu_forward(void* out, const void* inp, long long n, int bf, int vec) {
	long long n4 = vec ? n / 4 : 0;
	GRID_STRIDE(i, n4) {
		float4 v = ((const float4*)inp)[i];
		v.x = gelu(v.x);
		v.y = gelu(v.y);
		v.z = gelu(v.z);
		v.w = gelu(v.w);
		((float4*)out)[i] = v;
	}
	GRID_STRIDE(j, n - 4 * n4) {
		long long i = 4 * n4 + j;
		stx(out, i, gelu(ldx(inp, i, BF(bf, 1))), BF(bf, 0));
	}
}

// gelu_backward: dinp = gelu'(inp)·dout (overwritten), tanh u recovered
// from the forward output out, or computed from inp when out is NULL;
// dinp may alias dout. bf: dinp, inp, out, dout.
extern "C" __global__ void gelu_backward(void* dinp, const void* inp, const void* out, const void* dout, long long n,
                                         int bf, int vec) {
	long long n4 = vec ? n / 4 : 0;
	GRID_STRIDE(i, n4) {
		float4 x = ((const float4*)inp)[i], g = ((const float4*)dout)[i];
		float4 y = out ? ((const float4*)out)[i] : x;
		float4 d;
		d.x = gelu_grad_of(x.x, out, y.x, g.x);
		d.y = gelu_grad_of(x.y, out, y.y, g.y);
		d.z = gelu_grad_of(x.z, out, y.z, g.z);
		d.w = gelu_grad_of(x.w, out, y.w, g.w);
		((float4*)dinp)[i] = d;
	}
	GRID_STRIDE(j, n - 4 * n4) {
		long long i = 4 * n4 + j;
		float x = ldx(inp, i, BF(bf, 1));
		float y = out ? ldx(out, i, BF(bf, 2)) : x;
		stx(dinp, i, gelu_grad_of(x, out, y, ldx(dout, i, BF(bf, 3))), BF(bf, 0));
	}
}

// bias_gelu_store: pre (N,OC) = v = in (N,OC) + bias (OC) and out (N,OC)
// = gelu(v), from the float32 product in of a GEMM whose GELU epilogue
// (cuBLASLt's GELU_AUX_BIAS) is not to be had: as the epilogue and
// kernels/cpu's MatmulGeluForward do, the bias (none when NULL) is read
// as a bfloat16 when pre is bfloat16, GELU is taken of the float32 sum,
// and pre and out are each rounded once. bf: out, pre.
extern "C" __global__ void bias_gelu_store(void* out, void* pre, const float* in, const float* __restrict__ bias, int N, int OC,
                                           int bf) {
	GRID_STRIDE(i, (long long)N * OC) {
		float v = in[i];
		if (bias) v += stored(bias[i % OC], BF(bf, 1));
		stx(pre, i, v, BF(bf, 1));
		stx(out, i, gelu(v), BF(bf, 0));
	}
}

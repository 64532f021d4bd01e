// gelu.cu: GELU, tanh approximation (kernels/cpu/gelu.go), in the CPU's
// arithmetic: tanh u = 1 − 2/(e²ᵘ + 1), e²ᵘ by exp_poly with |u| ≤ 9,
// every operation rounded on its own (no FMA), so the bits are the CPU's.

#define GELU_K 0.7978845608028654f // √(2/π)

__device__ __forceinline__ float gelu(float v) {
	float u = __fmul_rn(GELU_K, __fadd_rn(v, __fmul_rn(__fmul_rn(__fmul_rn(0.044715f, v), v), v)));
	float th = __fsub_rn(1.0f, __fdiv_rn(2.0f, __fadd_rn(exp_poly(__fmul_rn(2.0f, fminf(fmaxf(u, -9.0f), 9.0f))), 1.0f)));
	return __fmul_rn(__fmul_rn(0.5f, v), __fadd_rn(1.0f, th));
}

// gelu_grad is the derivative times g, with tanh u recovered from the
// forward output y = ½·x·(1 + tanh u). Each operation rounded on its own,
// in the CPU's order, as in gelu.
__device__ __forceinline__ float gelu_grad(float v, float y, float g) {
	float th = (v > 1e-6f || v < -1e-6f) ? __fsub_rn(__fdiv_rn(__fmul_rn(2.0f, y), v), 1.0f) : __fmul_rn(GELU_K, v);
	float a = __fmul_rn(0.5f, __fadd_rn(1.0f, th));
	float b = __fmul_rn(__fmul_rn(__fmul_rn(0.5f, v), __fsub_rn(1.0f, __fmul_rn(th, th))), GELU_K);
	float c = __fadd_rn(1.0f, __fmul_rn(__fmul_rn(0.134145f, v), v));
	return __fmul_rn(g, __fadd_rn(a, __fmul_rn(b, c)));
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

// gelu_backward: dinp = gelu'(inp)·dout (overwritten), from the forward
// output out; dinp may alias dout. bf: dinp, inp, out, dout.
extern "C" __global__ void gelu_backward(void* dinp, const void* inp, const void* out, const void* dout, long long n,
                                         int bf, int vec) {
	long long n4 = vec ? n / 4 : 0;
	GRID_STRIDE(i, n4) {
		float4 x = ((const float4*)inp)[i], y = ((const float4*)out)[i], g = ((const float4*)dout)[i];
		float4 d;
		d.x = gelu_grad(x.x, y.x, g.x);
		d.y = gelu_grad(x.y, y.y, g.y);
		d.z = gelu_grad(x.z, y.z, g.z);
		d.w = gelu_grad(x.w, y.w, g.w);
		((float4*)dinp)[i] = d;
	}
	GRID_STRIDE(j, n - 4 * n4) {
		long long i = 4 * n4 + j;
		stx(dinp, i, gelu_grad(ldx(inp, i, BF(bf, 1)), ldx(out, i, BF(bf, 2)), ldx(dout, i, BF(bf, 3))), BF(bf, 0));
	}
}

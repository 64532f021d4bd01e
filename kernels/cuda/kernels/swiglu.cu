// swiglu.cu: the Llama MLP's gated activation (kernels/cpu/swiglu.go) on
// the fused gate and up projections, inp (N,2F): each row the gate g (F),
// then the up projection u (F). e⁻ᵍ by exp32, as the CPU computes it.

// swiglu_forward: out (N,F) = silu(g)·u, silu(g) = g/(1 + e⁻ᵍ). Grid-stride
// over N·F, or over N·F/4 float4s when vec (F % 4 == 0, out and inp 16-byte
// aligned). bf: out, inp.
extern "C" __global__ void swiglu_forward(void* __restrict__ out, const void* __restrict__ inp, long long N, int F,
                                          int bf, int vec) {
	if (vec) {
		const int F4 = F / 4;
		GRID_STRIDE(i, N * F4) {
			const long long r = i / F4, c = i - r * F4;
			const float4 g = ((const float4*)inp)[2 * r * F4 + c], u = ((const float4*)inp)[(2 * r + 1) * F4 + c];
			float4 y;
			y.x = g.x / (1.0f + exp32(-g.x)) * u.x;
			y.y = g.y / (1.0f + exp32(-g.y)) * u.y;
			y.z = g.z / (1.0f + exp32(-g.z)) * u.z;
			y.w = g.w / (1.0f + exp32(-g.w)) * u.w;
			((float4*)out)[i] = y;
		}
		return;
	}
	GRID_STRIDE(i, N * F) {
		const long long r = i / F, c = i - r * F;
		const float g = ldx(inp, 2 * r * F + c, BF(bf, 1)), u = ldx(inp, (2 * r + 1) * F + c, BF(bf, 1));
		stx(out, i, g / (1.0f + exp32(-g)) * u, BF(bf, 0));
	}
}

// swiglu_backward writes dinp (N,2F), overwritten, from dout (N,F) and inp:
// σ = 1/(1 + e⁻ᵍ), dgate = dout·u·σ·(1 + g·(1 − σ)), dup = dout·g·σ.
// Grid-stride over N·F. bf: dinp, inp, dout.
extern "C" __global__ void swiglu_backward(void* __restrict__ dinp, const void* __restrict__ inp,
                                           const void* __restrict__ dout, long long N, int F, int bf) {
	GRID_STRIDE(i, N * F) {
		const long long r = i / F, c = i - r * F;
		const long long gi = 2 * r * F + c, ui = gi + F;
		const float g = ldx(inp, gi, BF(bf, 1)), u = ldx(inp, ui, BF(bf, 1)), d = ldx(dout, i, BF(bf, 2));
		const float s = 1.0f / (1.0f + exp32(-g));
		stx(dinp, gi, d * u * s * (1.0f + g * (1.0f - s)), BF(bf, 0));
		stx(dinp, ui, d * g * s, BF(bf, 0));
	}
}

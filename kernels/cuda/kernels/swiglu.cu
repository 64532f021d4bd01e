// swiglu.cu: the Llama MLP's gated activation (kernels/cpu/swiglu.go) on
// the fused gate and up projections, inp (N,2F): each row the gate g (F),
// then the up projection u (F). e⁻ᵍ by exp32, as the CPU computes it.

// swiglu_forward: out (N,F) = silu(g)·u, silu(g) = g/(1 + e⁻ᵍ). Grid-stride
// over N·F, or over N·F/4 float4s when vec (F % 4 == 0, out and inp 16-byte
// aligned).
extern "C" __global__ void swiglu_forward(float* __restrict__ out, const float* __restrict__ inp, long long N,
                                          int F, int vec) {
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
		const float g = inp[2 * r * F + c], u = inp[(2 * r + 1) * F + c];
		out[i] = g / (1.0f + exp32(-g)) * u;
	}
}

// swiglu_backward writes dinp (N,2F), overwritten, from dout (N,F) and inp:
// σ = 1/(1 + e⁻ᵍ), dgate = dout·u·σ·(1 + g·(1 − σ)), dup = dout·g·σ.
// Grid-stride over N·F.
extern "C" __global__ void swiglu_backward(float* __restrict__ dinp, const float* __restrict__ inp,
                                           const float* __restrict__ dout, long long N, int F) {
	GRID_STRIDE(i, N * F) {
		const long long r = i / F, c = i - r * F;
		const long long gi = 2 * r * F + c, ui = gi + F;
		const float g = inp[gi], u = inp[ui], d = dout[i];
		const float s = 1.0f / (1.0f + exp32(-g));
		dinp[gi] = d * u * s * (1.0f + g * (1.0f - s));
		dinp[ui] = d * g * s;
	}
}

// dropout.cu: dropout with kernels/cpu's counter-based mask.

// dropout_forward: out[i] = in[i]·keep(off+i)·pscale, n elements, where
// keep draws the CPU backend's mask bit for bit and pscale = 1/(1−p); with
// p = 0 a copy. out may alias in. Also the backward pass (dinp from dout).
// bf: out, in.
extern "C" __global__ void dropout_forward(void* out, const void* in, long long n, float p, float pscale,
                                           unsigned long long key, unsigned long long off, int bf, int vec) {
	long long n4 = vec ? n / 4 : 0;
	GRID_STRIDE(i, n4) {
		float4 v = ((const float4*)in)[i];
		if (p > 0.0f) {
			unsigned long long e = off + 4 * (unsigned long long)i;
			v.x = dropout_keep(key, e, p) ? v.x * pscale : 0.0f;
			v.y = dropout_keep(key, e + 1, p) ? v.y * pscale : 0.0f;
			v.z = dropout_keep(key, e + 2, p) ? v.z * pscale : 0.0f;
			v.w = dropout_keep(key, e + 3, p) ? v.w * pscale : 0.0f;
		}
		((float4*)out)[i] = v;
	}
	GRID_STRIDE(j, n - 4 * n4) {
		long long i = 4 * n4 + j;
		float v = ldx(in, i, BF(bf, 1));
		if (p > 0.0f) v = dropout_keep(key, off + (unsigned long long)i, p) ? v * pscale : 0.0f;
		stx(out, i, v, BF(bf, 0));
	}
}

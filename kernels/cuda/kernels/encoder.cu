// encoder.cu: token and position embeddings (kernels/cpu/encoder.go).

// encoder_forward writes out (BT,C) = [vlo ≤ tok < vlo+rows]·wte[tok−vlo] +
// wpe[t] for tok = inp[bt], t = bt mod T. wpe may be null (no position
// embedding: another rank of a tensor-parallel group adds it). vec: C is a
// multiple of 4 and out, wte, wpe are 16-byte aligned. bf: out.
extern "C" __global__ void encoder_forward(void* __restrict__ out, const int* __restrict__ inp,
                                           const float* __restrict__ wte, int vlo, int rows,
                                           const float* __restrict__ wpe, int BT, int T, int C, int bf, int vec) {
	if (vec) {
		int C4 = C / 4;
		GRID_STRIDE(i, (long long)BT * C4) {
			int bt = (int)(i / C4), c4 = (int)(i % C4);
			int v = inp[bt] - vlo;
			float4 o = {0.0f, 0.0f, 0.0f, 0.0f};
			if (v >= 0 && v < rows) o = ((const float4*)wte)[(long long)v * C4 + c4];
			if (wpe) {
				float4 p = ((const float4*)wpe)[(long long)(bt % T) * C4 + c4];
				o.x += p.x;
				o.y += p.y;
				o.z += p.z;
				o.w += p.w;
			}
			((float4*)out)[i] = o;
		}
		return;
	}
	GRID_STRIDE(i, (long long)BT * C) {
		int bt = (int)(i / C), c = (int)(i % C);
		int v = inp[bt] - vlo;
		float o = 0.0f;
		if (v >= 0 && v < rows) o = wte[(long long)v * C + c];
		if (wpe) o += wpe[(long long)(bt % T) * C + c];
		stx(out, i, o, bf & 1);
	}
}

// encoder_backward accumulates dwte[tok−vlo] += dout[bt] for the tokens in
// this rank's rows and, unless dwpe is null, dwpe[t] += dout[bt]. One
// thread per (t, c) walks the batch: dwpe's sum runs in the CPU's order;
// dwte takes atomics, since a token may repeat anywhere (its last bits may
// differ from run to run). bf: dout.
extern "C" __global__ void encoder_backward(float* __restrict__ dwte, int vlo, int rows, float* __restrict__ dwpe,
                                            const void* __restrict__ dout, const int* __restrict__ inp, int B, int T,
                                            int C, int bf) {
	GRID_STRIDE(i, (long long)T * C) {
		int t = (int)(i / C), c = (int)(i % C);
		float acc = dwpe ? dwpe[i] : 0.0f;
		for (int b = 0; b < B; b++) {
			int bt = b * T + t;
			float g = ldx(dout, (long long)bt * C + c, bf & 1);
			acc += g;
			int v = inp[bt] - vlo;
			if (v >= 0 && v < rows) atomicAdd(&dwte[(long long)v * C + c], g);
		}
		if (dwpe) dwpe[i] = acc;
	}
}

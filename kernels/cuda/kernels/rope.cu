// rope.cu: rotary position embeddings (kernels/cpu/rope.go), Hugging Face's
// rotate_half layout: in each head of hd channels, channel i pairs with
// channel i + hd/2.

// rope rotates the first heads·hd channels of N = B·T rows of C by the
// angles of table (maxT,hd) — row p: cos of the hd/2 angles, then their
// sines — at position p = pos0 + row % T, times sign (1 forward, −1 for the
// backward pass's inverse rotation):
//
//	out[i]      = x[i]·cos − x[i+hd/2]·sin
//	out[i+hd/2] = x[i+hd/2]·cos + x[i]·sin
//
// and, when copy_rest is set (out is not inp), copies the other channels.
// Grid-stride over the N·heads·hd/2 pairs, then over the copied channels.
// bf: out, inp.
extern "C" __global__ void rope(void* out, const void* inp, const float* __restrict__ table, int N, int T, int C,
                                int heads, int hd, int pos0, float sign, int copy_rest, int bf) {
	const int h = hd / 2;
	const long long pairs = (long long)N * heads * h;
	GRID_STRIDE(i, pairs) {
		const long long r = i / ((long long)heads * h);
		const int rem = (int)(i - r * heads * h);
		const int k = rem / h, j = rem - k * h;
		const float* trow = table + (long long)(pos0 + (int)(r % T)) * hd;
		const float c = trow[j], s = sign * trow[h + j];
		const long long at = r * C + (long long)k * hd + j;
		const float a = ldx(inp, at, BF(bf, 1)), b = ldx(inp, at + h, BF(bf, 1));
		stx(out, at, a * c - b * s, BF(bf, 0));
		stx(out, at + h, b * c + a * s, BF(bf, 0));
	}
	if (!copy_rest) return;
	const int rest = C - heads * hd;
	GRID_STRIDE(i, (long long)N * rest) {
		const long long r = i / rest;
		const long long at = r * C + heads * hd + (i - r * rest);
		stx(out, at, ldx(inp, at, BF(bf, 1)), BF(bf, 0));
	}
}

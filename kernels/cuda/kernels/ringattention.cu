// ringattention.cu: ring attention for context parallelism (kernels/cpu's
// ringattention.go, kernels.Backend's Ring* methods).
//
// A rank r of cp ranks holds, of each of the B sequences, two chunks of c
// positions, chunk r and chunk 2·cp−1−r, in rows = 2·B·c rows laid out
// sequence-major (B,2c): row i = b·2c + half·c + t holds position
// chunk(half)·c + t of sequence b, chunk(0) = r, chunk(1) = 2·cp−1−r, so
// each sequence's 2c rows are contiguous. A block of keys and values of
// rank kr is laid out the same way.
//
// Layouts (fp32, row-major; hd channels per head, query head h reads
// key/value head h/G, G = NH/NKV, as attention.cu):
//   qkv   (rows, (NH+2·NKV)·hd)  NH query heads, NKV key heads, NKV value heads
//   kv    (rows, 2·NKV·hd)       NKV key heads, NKV value heads
//   out   (rows, NH·hd)
//   stats (rows, NH, 2)          the running max m and sum l of the online softmax
//   lse, delta (rows, NH)
// Scale 1/√hd; a query at position p attends the keys at positions ≤ p.
//
// The attention kernels are simple, not tiled: a warp per query row and head
// (forward, dq) or per key row and key/value head (dk, dv), RA_WARPS warps a
// block, head columns lane+32·k in registers (hd ≤ RA_MAXHD), the warp's own
// row in static shared memory (16 KiB at most a block: within the 48 KiB
// every GPU gives without opting in). The other side's rows are walked 32 at
// a time, a row per lane: the lane's dot products read its row from global
// memory, and the warp then broadcasts each lane's weight by a shuffle to
// accumulate the weighted rows column by column. Each output is owned by one
// warp, which adds into it: no atomics, the same bits on every run.

#define RA_WARPS 8   // warps per block of the attention kernels
#define RA_MAXHD 256 // largest head size
#define RA_NC (RA_MAXHD / 32)
#define RA_NEG_INF (-__int_as_float(0x7f800000))

// ra_chunk is the chunk of positions that half (0 or 1) of rank r's rows hold.
__device__ __forceinline__ int ra_chunk(int half, int cp, int r) { return half == 0 ? r : 2 * cp - 1 - r; }

// ra_row0 is the first of the c rows holding half (0 or 1) of sequence b:
// row b·2c + half·c.
__device__ __forceinline__ long long ra_row0(int b, int half, int c) { return (2LL * b + half) * c; }

// ra_dot is Σ_d a[d]·b[d] over hd channels, a in shared memory.
__device__ __forceinline__ float ra_dot(const float* a, const float* __restrict__ b, int hd) {
	float s = 0.0f;
	for (int d = 0; d < hd; d++) s += a[d] * b[d];
	return s;
}

// ra_dotx is ra_dot with b the hd elements from element at of x (bfloat16
// when bf).
__device__ __forceinline__ float ra_dotx(const float* a, const void* __restrict__ x, long long at, int bf, int hd) {
	float s = 0.0f;
	for (int d = 0; d < hd; d++) s += a[d] * ldx(x, at + d, bf);
	return s;
}

// ring_kv copies the key and value heads of qkv into kv: kv[r, j] =
// qkv[r, NH·hd + j], j < 2·NKV·hd. Grid-stride over rows·2·NKV·hd.
extern "C" __global__ void ring_kv(float* __restrict__ kv, const void* __restrict__ qkv, int rows, int NH, int NKV,
                                   int hd, int bf) {
	const long long w = 2LL * NKV * hd, ld = (long long)(NH + 2 * NKV) * hd, q = (long long)NH * hd;
	GRID_STRIDE(i, (long long)rows * w) {
		const long long r = i / w, j = i - r * w;
		kv[i] = ldx(qkv, r * ld + q + j, bf & 1);
	}
}

// ring_kv_grad overwrites the key and value parts of dqkv with dkv: the
// inverse copy of ring_kv.
extern "C" __global__ void ring_kv_grad(float* __restrict__ dqkv, const float* __restrict__ dkv, int rows, int NH,
                                        int NKV, int hd) {
	const long long w = 2LL * NKV * hd, ld = (long long)(NH + 2 * NKV) * hd, q = (long long)NH * hd;
	GRID_STRIDE(i, (long long)rows * w) {
		const long long r = i / w, j = i - r * w;
		dqkv[r * ld + q + j] = dkv[i];
	}
}

// ring_forward folds the key/value block of rank kr into the online softmax
// of rank qr's queries. Grid (⌈rows/RA_WARPS⌉, NH), block 32·RA_WARPS: warp w
// of block (x, h) owns query row x·RA_WARPS + w of head h. first: start from
// out = 0, m = −∞, l = 0 instead of reading them. out stays unnormalised
// (ring_finish divides by l).
extern "C" __global__ void __launch_bounds__(32 * RA_WARPS)
    ring_forward(float* __restrict__ out, float* __restrict__ stats, const void* __restrict__ qkv,
                 const float* __restrict__ kv, int B, int c, int NH, int NKV, int hd, int cp, int qr, int kr,
                 float scale, int first, int bf) {
	__shared__ float qs[RA_WARPS][RA_MAXHD];
	const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
	const int h = blockIdx.y;
	const long long rows = 2LL * B * c;
	const long long i = (long long)blockIdx.x * RA_WARPS + w;
	if (i >= rows) return; // the whole warp
	const int b = (int)(i / (2LL * c)), half = (int)((i / c) % 2), t = (int)(i % c);
	const int pq = ra_chunk(half, cp, qr) * c + t;
	const long long ld = (long long)(NH + 2 * NKV) * hd, ldkv = 2LL * NKV * hd;
	const long long kofs = (long long)(h / (NH / NKV)) * hd, vofs = kofs + (long long)NKV * hd;

	const long long qrow = i * ld + (long long)h * hd;
	for (int d = lane; d < hd; d += 32) qs[w][d] = ldx(qkv, qrow + d, bf & 1);
	__syncwarp();

	float* orow = out + i * (long long)NH * hd + (long long)h * hd;
	float* st = stats + (i * NH + h) * 2;
	float o[RA_NC];
	float m = RA_NEG_INF, l = 0.0f;
	if (!first) m = st[0], l = st[1];
#pragma unroll
	for (int k = 0; k < RA_NC; k++) {
		const int col = lane + 32 * k;
		o[k] = !first && col < hd ? orow[col] : 0.0f;
	}

	for (int kh = 0; kh < 2; kh++) {
		const int k0 = ra_chunk(kh, cp, kr) * c;                // the chunk's first position
		const int n = pq < k0 ? 0 : (pq - k0 + 1 < c ? pq - k0 + 1 : c); // its keys at positions ≤ pq
		const float* kvrow0 = kv + ra_row0(b, kh, c) * ldkv;
		for (int j0 = 0; j0 < n; j0 += 32) {
			const int j = j0 + lane;
			const bool valid = j < n;
			const float s = valid ? ra_dot(qs[w], kvrow0 + (long long)j * ldkv + kofs, hd) * scale : RA_NEG_INF;
			const float mnew = fmaxf(m, warp_max(s)); // finite: lane 0 is valid
			const float corr = expf(m - mnew);        // 0 while m = −∞
			const float e = valid ? expf(s - mnew) : 0.0f;
			m = mnew;
			l = l * corr + warp_sum(e);
#pragma unroll
			for (int k = 0; k < RA_NC; k++) o[k] *= corr;
			const int nj = n - j0 < 32 ? n - j0 : 32;
			for (int jj = 0; jj < nj; jj++) {
				const float ej = __shfl_sync(FULL_MASK, e, jj);
				const float* vrow = kvrow0 + (long long)(j0 + jj) * ldkv + vofs;
#pragma unroll
				for (int k = 0; k < RA_NC; k++) {
					const int col = lane + 32 * k;
					if (col < hd) o[k] += ej * vrow[col];
				}
			}
		}
	}

#pragma unroll
	for (int k = 0; k < RA_NC; k++) {
		const int col = lane + 32 * k;
		if (col < hd) orow[col] = o[k];
	}
	if (lane == 0) st[0] = m, st[1] = l;
}

// ring_finish divides out (rows, NH·hd) by l and writes lse (rows, NH) =
// m + ln l. Grid-stride over rows·NH·hd. A row that met no key (l = 0)
// gets out = 0 and lse = −∞.
extern "C" __global__ void ring_finish(float* __restrict__ out, float* __restrict__ lse, const float* __restrict__ stats,
                                       int rows, int NH, int hd) {
	GRID_STRIDE(i, (long long)rows * NH * hd) {
		const long long rh = i / hd; // row·NH + head
		const float m = stats[2 * rh], l = stats[2 * rh + 1];
		out[i] = l > 0.0f ? out[i] / l : 0.0f;
		if (i - rh * hd == 0) lse[rh] = l > 0.0f ? m + logf(l) : RA_NEG_INF;
	}
}

// ring_delta writes delta (rows, NH) = Σ over each head's hd channels of
// dout·out. A warp per (row, head), RA_WARPS a block, grid-stride.
extern "C" __global__ void ring_delta(float* __restrict__ delta, const void* __restrict__ dout,
                                      const void* __restrict__ out, int rows, int NH, int hd, int bf) {
	const int lane = threadIdx.x & 31;
	const long long n = (long long)rows * NH;
	const long long nw = (long long)gridDim.x * (blockDim.x >> 5);
	for (long long rh = (long long)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5); rh < n; rh += nw) {
		float s = 0.0f;
		for (int d = lane; d < hd; d += 32) s += ldx(dout, rh * hd + d, BF(bf, 0)) * ldx(out, rh * hd + d, BF(bf, 1));
		s = warp_sum(s);
		if (lane == 0) delta[rh] = s;
	}
}

// ring_backward_dq adds the queries' gradient over the key/value block of
// rank kr into the query heads of dqkv: dq += scale·Σ_j dS_j·k_j, dS =
// P∘(dP − delta), P = exp(S − lse), dP = dout·v. Grid (⌈rows/RA_WARPS⌉,
// NH), block 32·RA_WARPS, a warp per query row and head as ring_forward.
extern "C" __global__ void __launch_bounds__(32 * RA_WARPS)
    ring_backward_dq(float* __restrict__ dqkv, const void* __restrict__ dout, const void* __restrict__ qkv,
                     const float* __restrict__ kv, const float* __restrict__ lse, const float* __restrict__ delta,
                     int B, int c, int NH, int NKV, int hd, int cp, int qr, int kr, float scale, int bf) {
	__shared__ float qs[RA_WARPS][RA_MAXHD];
	__shared__ float gs[RA_WARPS][RA_MAXHD];
	const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
	const int h = blockIdx.y;
	const long long rows = 2LL * B * c;
	const long long i = (long long)blockIdx.x * RA_WARPS + w;
	if (i >= rows) return;
	const int b = (int)(i / (2LL * c)), half = (int)((i / c) % 2), t = (int)(i % c);
	const int pq = ra_chunk(half, cp, qr) * c + t;
	const long long ld = (long long)(NH + 2 * NKV) * hd, ldkv = 2LL * NKV * hd;
	const long long kofs = (long long)(h / (NH / NKV)) * hd, vofs = kofs + (long long)NKV * hd;

	const long long qrow = i * ld + (long long)h * hd, grow = i * (long long)NH * hd + (long long)h * hd;
	for (int d = lane; d < hd; d += 32) qs[w][d] = ldx(qkv, qrow + d, BF(bf, 1)), gs[w][d] = ldx(dout, grow + d, BF(bf, 0));
	__syncwarp();
	const float rl = lse[i * NH + h], rd = delta[i * NH + h];

	float dq[RA_NC];
#pragma unroll
	for (int k = 0; k < RA_NC; k++) dq[k] = 0.0f;
	for (int kh = 0; kh < 2; kh++) {
		const int k0 = ra_chunk(kh, cp, kr) * c;
		const int n = pq < k0 ? 0 : (pq - k0 + 1 < c ? pq - k0 + 1 : c);
		const float* kvrow0 = kv + ra_row0(b, kh, c) * ldkv;
		for (int j0 = 0; j0 < n; j0 += 32) {
			const int j = j0 + lane;
			float ds = 0.0f;
			if (j < n) {
				const float* row = kvrow0 + (long long)j * ldkv;
				const float p = expf(ra_dot(qs[w], row + kofs, hd) * scale - rl);
				ds = p * (ra_dot(gs[w], row + vofs, hd) - rd);
			}
			const int nj = n - j0 < 32 ? n - j0 : 32;
			for (int jj = 0; jj < nj; jj++) {
				const float dsj = __shfl_sync(FULL_MASK, ds, jj);
				const float* krow = kvrow0 + (long long)(j0 + jj) * ldkv + kofs;
#pragma unroll
				for (int k = 0; k < RA_NC; k++) {
					const int col = lane + 32 * k;
					if (col < hd) dq[k] += dsj * krow[col];
				}
			}
		}
	}
	float* drow = dqkv + i * ld + (long long)h * hd;
#pragma unroll
	for (int k = 0; k < RA_NC; k++) {
		const int col = lane + 32 * k;
		if (col < hd) drow[col] += scale * dq[k];
	}
}

// ring_backward_dkv adds the gradient of the key/value block of rank kr
// over rank qr's queries into dkv (rows, 2·NKV·hd): dv += Σ_i P_i·dout_i,
// dk += scale·Σ_i dS_i·q_i over the queries i of the group's query heads
// (in head order) at positions ≥ the key's. Grid (⌈rows/RA_WARPS⌉, NKV),
// block 32·RA_WARPS: warp w of block (x, g) owns key row x·RA_WARPS + w of
// key/value head g.
extern "C" __global__ void __launch_bounds__(32 * RA_WARPS)
    ring_backward_dkv(float* __restrict__ dkv, const void* __restrict__ dout, const void* __restrict__ qkv,
                      const float* __restrict__ kv, const float* __restrict__ lse, const float* __restrict__ delta,
                      int B, int c, int NH, int NKV, int hd, int cp, int qr, int kr, float scale, int bf) {
	__shared__ float ks[RA_WARPS][RA_MAXHD];
	__shared__ float vs[RA_WARPS][RA_MAXHD];
	const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
	const int g = blockIdx.y, G = NH / NKV;
	const long long rows = 2LL * B * c;
	const long long j = (long long)blockIdx.x * RA_WARPS + w;
	if (j >= rows) return;
	const int b = (int)(j / (2LL * c)), half = (int)((j / c) % 2), t = (int)(j % c);
	const int pk = ra_chunk(half, cp, kr) * c + t;
	const long long ld = (long long)(NH + 2 * NKV) * hd, ldkv = 2LL * NKV * hd, C = (long long)NH * hd;
	const long long kofs = (long long)g * hd, vofs = kofs + (long long)NKV * hd;

	const float* kvrow = kv + j * ldkv;
	for (int d = lane; d < hd; d += 32) ks[w][d] = kvrow[kofs + d], vs[w][d] = kvrow[vofs + d];
	__syncwarp();

	float dk[RA_NC], dv[RA_NC];
#pragma unroll
	for (int k = 0; k < RA_NC; k++) dk[k] = 0.0f, dv[k] = 0.0f;
	for (int h = g * G; h < (g + 1) * G; h++) {
		for (int qh = 0; qh < 2; qh++) {
			const int q0 = ra_chunk(qh, cp, qr) * c; // the chunk's first position
			const int tq = pk <= q0 ? 0 : pk - q0;   // its first query at a position ≥ pk (c: none)
			const long long base = ra_row0(b, qh, c);
			for (int i0 = tq; i0 < c; i0 += 32) {
				const int ti = i0 + lane;
				float p = 0.0f, ds = 0.0f;
				if (ti < c) {
					const long long i = base + ti;
					p = expf(ra_dotx(ks[w], qkv, i * ld + (long long)h * hd, BF(bf, 1), hd) * scale - lse[i * NH + h]);
					ds = p * (ra_dotx(vs[w], dout, i * C + (long long)h * hd, BF(bf, 0), hd) - delta[i * NH + h]);
				}
				const int ni = c - i0 < 32 ? c - i0 : 32;
				for (int ii = 0; ii < ni; ii++) {
					const float pi = __shfl_sync(FULL_MASK, p, ii), dsi = __shfl_sync(FULL_MASK, ds, ii);
					const long long i = base + i0 + ii;
					const long long qrow = i * ld + (long long)h * hd, grow = i * C + (long long)h * hd;
#pragma unroll
					for (int k = 0; k < RA_NC; k++) {
						const int col = lane + 32 * k;
						if (col < hd)
							dv[k] += pi * ldx(dout, grow + col, BF(bf, 0)), dk[k] += dsi * ldx(qkv, qrow + col, BF(bf, 1));
					}
				}
			}
		}
	}
	float* drow = dkv + j * ldkv;
#pragma unroll
	for (int k = 0; k < RA_NC; k++) {
		const int col = lane + 32 * k;
		if (col < hd) drow[kofs + col] += scale * dk[k], drow[vofs + col] += dv[k];
	}
}

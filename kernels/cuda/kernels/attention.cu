// attention.cu: causal grouped-query self-attention without the T×T matrix.
// Multi-head attention (GPT-2's) is the case of one key/value head per
// query head, NKV = NH.
//
// Layouts (fp32, row-major), as kernels/cpu/attention.go:
//   qkv (B,T,ld), ld = (NH+2·NKV)·hs: per position NH query heads, then NKV
//                 key heads, then NKV value heads, hs channels each; query
//                 head h reads key/value head h/G, G = NH/NKV (with NKV =
//                 NH: q (C), k (C), v (C), C = NH·hs)
//   out (B,T,C)   dropout(softmax(q·kᵀ·scale, causal))·v, query heads side
//                 by side, C = NH·hs
//   lse (B,NH,T)  log Σ_j exp(q·k_j·scale) over the causal row: all the
//                 backward pass needs of the probabilities
//
// The forward and backward kernels are flash-style: a block of 256 threads
// works on a 64×64 tile of scores (64 query rows against 64 keys) held in
// registers, 4×4 per thread. Thread (ty, tx) = (tid/16, tid%16) owns tile
// rows ty+16·i and tile columns tx+16·j (i, j < 4), so the 16 threads of a
// row are one half-warp and row reductions are four xor-shuffles. Head-size
// columns of the output-shaped accumulators are owned in groups of VW
// adjacent columns, group tx+16·g, so the shared-memory reads of a warp are
// float4 (or float2) and conflict-free. Shared rows of q, k, v and dout are
// padded to a stride whose float4 count is odd: the 16 different k rows a
// warp reads at once then fall in different banks. The 64×64 tiles of
// probabilities have rows of 80 floats: the two rows a warp touches at once
// (ty, ty+1) then sit in opposite halves of the banks, for the scalar
// writes and the float4 reads alike.
//
// Shared-memory traffic per multiply-add is what bounds fp32 tiles on a
// GPU, so every inner product reads float4s: per four steps of a 4×4
// register tile (hs 64) a warp issues 12 shared-memory wavefronts (one per
// cycle per SM) against 64 multiply-add instructions (four per cycle). The
// backward pass's dk and dv accumulators are owned by key rows 4ty … 4ty+3,
// so their products read the probability tiles' columns as float4 too.
//
// Dropout draws exactly the mask of the CPU backend (kernels/cpu/dropout.go):
// probability (b, local head h, row t, column j) has stream index
//   off + ((b·Hg + h0 + h)·T + t)·T + j
// where Hg and h0 place a tensor-parallel rank's heads (Hg = NH, h0 = 0 on a
// single rank), and is kept when the counter-based hash says so; kept values
// are scaled by pscale = 1/(1−p). The hash is common.cuh's dropout_keep.
//
// Names: the forward and backward kernels come in one instantiation per
// common head size (32, 64, 80, 128), whose loops the compiler unrolls, and a
// generic one for any hs ≤ 128.
//
// Tile variants: the 64×64 tiles above are the kernels named
// attention_{forward,backward}_<hs>, and they fit the 227 KiB of dynamic
// shared memory a block of an H100 may use. Smaller GPUs (A100: 163 KiB;
// V100, L40S, L4, A10, RTX 4090: 96–99 KiB) get the same code on smaller
// tiles, kernels named with a suffix _q<BQ>k<BK>: BQ query rows against BK
// keys, BQ and BK each 32 or 64. Thread (ty, tx) then owns tile rows
// ty+16·i (i < BQ/16) and columns tx+16·j (j < BK/16), the backward pass's
// dk and dv rows (BK/16)·ty … (BK/16)·ty+BK/16−1, and a probability tile's
// rows are BK+16 floats (80 for 64 keys, 48 for 32: the rows ty and ty+1
// still fall in opposite halves of the banks). The arithmetic of each
// product, its order of summation over the head dimension and the online
// softmax are those of the 64×64 kernels; only the number of key tiles a
// row's sums run over differs. kernels/cuda/variants.go chooses a variant
// per kernel from the device's shared-memory limit.

#define ATT_TILE 64       // query rows and keys per tile of the default kernels
#define ATT_THREADS 256   // threads per block of the tiled kernels
#define ATT_MAXHS 128     // largest head size of the generic kernels
#define ATT_PLD 80        // row stride of the 64×64 probability tiles (see above)
#define ATT_NEG (-3.0e38f) // score of a masked entry: exp(ATT_NEG − m) is 0

// AttTile is the compile-time shape of a tile of BQ query rows against BK
// keys: RI rows and RJ columns of scores per thread, probability rows of PLD
// floats (BK + 16, so PLD = ATT_PLD for 64 keys).
template <int BQ, int BK>
struct AttTile {
    static_assert((BQ == 32 || BQ == 64) && (BK == 32 || BK == 64), "tiles of 32 or 64");
    static constexpr int RI = BQ / 16;
    static constexpr int RJ = BK / 16;
    static constexpr int PLD = BK + 16;
};
static_assert(AttTile<ATT_TILE, ATT_TILE>::PLD == ATT_PLD, "the 64×64 tiles' probability rows");

// att_rowsum16 and att_rowmax16 reduce over the 16 lanes of a half-warp.
__device__ __forceinline__ float att_rowsum16(float v) {
    v += __shfl_xor_sync(0xffffffffu, v, 8);
    v += __shfl_xor_sync(0xffffffffu, v, 4);
    v += __shfl_xor_sync(0xffffffffu, v, 2);
    v += __shfl_xor_sync(0xffffffffu, v, 1);
    return v;
}

__device__ __forceinline__ float att_rowmax16(float v) {
    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 8));
    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 4));
    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 2));
    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1));
    return v;
}

// AttGeom is the compile-time shape of the tiled kernels for head size HS
// (0: the generic kernel, hs given at run time, at most ATT_MAXHS).
template <int HS>
struct AttGeom {
    static constexpr int MAXHS = HS > 0 ? HS : ATT_MAXHS;
    // VEC: shared rows are read as float4 along the head dimension.
    static constexpr bool VEC = HS > 0 && HS % 4 == 0;
    // VW adjacent head-size columns per group; NG groups per thread.
    static constexpr int VW = (HS > 0 && HS % 64 == 0) ? 4 : (HS > 0 && HS % 32 == 0) ? 2 : 1;
    static constexpr int NG = (MAXHS + 16 * VW - 1) / (16 * VW);
    static constexpr int NC = NG * VW; // head-size columns per thread
};

// att_ld is the padded row stride (floats) of a shared tile of head size hs.
__device__ __forceinline__ int att_ld(int hs, bool vec) {
    return vec ? 4 * ((hs / 4) | 1) : (hs | 1);
}

// att_col is the head-size column of a thread's accumulator c.
template <int HS>
__device__ __forceinline__ int att_col(int tx, int c) {
    typedef AttGeom<HS> G;
    return (tx + 16 * (c / G::VW)) * G::VW + c % G::VW;
}

// att_load_rows copies rows r0 … r0+ROWS−1 of one head (hs columns from
// element at of src, row stride ld elements; bfloat16 when bf) into a
// shared tile of stride lds, zeros past row T.
template <int ROWS>
__device__ __forceinline__ void att_load_rows(float* dst, int lds, const void* __restrict__ src, long long at, int bf,
                                              long long ld, int r0, int T, int hs) {
    for (int i = threadIdx.x; i < ROWS * hs; i += ATT_THREADS) {
        int r = i / hs, d = i - r * hs;
        int t = r0 + r;
        dst[r * lds + d] = t < T ? ldx(src, at + (long long)t * ld + d, bf) : 0.0f;
    }
}

// att_dot accumulates s[i][j] += a[rows ty+16i] · b[rows tx+16j] over the
// head dimension (i < RI, j < RJ), a and b shared tiles of stride ld.
template <int HS, int RI, int RJ>
__device__ __forceinline__ void att_dot(float s[RI][RJ], const float* a, const float* b, int ld, int hs, int ty,
                                        int tx) {
    typedef AttGeom<HS> G;
    if constexpr (G::VEC) {
#pragma unroll 4
        for (int d = 0; d < HS; d += 4) {
            float4 av[RI], bv[RJ];
#pragma unroll
            for (int i = 0; i < RI; i++) av[i] = *reinterpret_cast<const float4*>(&a[(ty + 16 * i) * ld + d]);
#pragma unroll
            for (int j = 0; j < RJ; j++) bv[j] = *reinterpret_cast<const float4*>(&b[(tx + 16 * j) * ld + d]);
#pragma unroll
            for (int i = 0; i < RI; i++)
#pragma unroll
                for (int j = 0; j < RJ; j++) {
                    // One multiply-add per term (a sum of products first
                    // would cost a multiply and an add more).
                    s[i][j] += av[i].x * bv[j].x;
                    s[i][j] += av[i].y * bv[j].y;
                    s[i][j] += av[i].z * bv[j].z;
                    s[i][j] += av[i].w * bv[j].w;
                }
        }
    } else {
        for (int d = 0; d < hs; d++) {
            float av[RI], bv[RJ];
#pragma unroll
            for (int i = 0; i < RI; i++) av[i] = a[(ty + 16 * i) * ld + d];
#pragma unroll
            for (int j = 0; j < RJ; j++) bv[j] = b[(tx + 16 * j) * ld + d];
#pragma unroll
            for (int i = 0; i < RI; i++)
#pragma unroll
                for (int j = 0; j < RJ; j++) s[i][j] += av[i] * bv[j];
        }
    }
}

// att_row_load reads row r of a shared tile m (stride ld) at the thread's
// head-size columns att_col(tx, c) into mv.
template <int HS>
__device__ __forceinline__ void att_row_load(float mv[AttGeom<HS>::NC], const float* m, int r, int ld, int hs,
                                             int tx) {
    typedef AttGeom<HS> G;
#pragma unroll
    for (int g = 0; g < G::NG; g++) {
        const int col = (tx + 16 * g) * G::VW;
        if constexpr (G::VW == 4) {
            float4 v = *reinterpret_cast<const float4*>(&m[r * ld + col]);
            mv[4 * g] = v.x, mv[4 * g + 1] = v.y, mv[4 * g + 2] = v.z, mv[4 * g + 3] = v.w;
        } else if constexpr (G::VW == 2) {
            float2 v = *reinterpret_cast<const float2*>(&m[r * ld + col]);
            mv[2 * g] = v.x, mv[2 * g + 1] = v.y;
        } else {
            mv[g] = col < hs ? m[r * ld + col] : 0.0f;
        }
    }
}

// att_row_times accumulates acc[i][c] += Σ_j w[rows ty+16i][j] · m[j][col c]
// for i < RI, j < BK: w is a tile of BK columns and stride PLD, read four
// columns at a time, m a tile of stride ld; the thread's columns are
// att_col(tx, c).
template <int HS, int RI, int BK, int PLD>
__device__ __forceinline__ void att_row_times(float acc[RI][AttGeom<HS>::NC], const float* w, const float* m,
                                              int ld, int hs, int ty, int tx) {
    typedef AttGeom<HS> G;
    for (int j = 0; j < BK; j += 4) {
        float wv[RI][4];
#pragma unroll
        for (int i = 0; i < RI; i++) {
            float4 v = *reinterpret_cast<const float4*>(&w[(ty + 16 * i) * PLD + j]);
            wv[i][0] = v.x, wv[i][1] = v.y, wv[i][2] = v.z, wv[i][3] = v.w;
        }
#pragma unroll
        for (int jj = 0; jj < 4; jj++) {
            float mv[G::NC];
            att_row_load<HS>(mv, m, j + jj, ld, hs, tx);
#pragma unroll
            for (int i = 0; i < RI; i++)
#pragma unroll
                for (int c = 0; c < G::NC; c++) acc[i][c] += wv[i][jj] * mv[c];
        }
    }
}

// att_col_times accumulates acc[a][c] += Σ_r w[r][RJ·ty+a] · m[r][col c]
// for r < BQ, a < RJ: the transposed product of att_row_times. The thread's
// rows of acc are the RJ adjacent columns RJ·ty … RJ·ty+RJ−1 of w (stride
// PLD), read as one float4 (RJ 4) or float2 (RJ 2).
template <int HS, int RJ, int BQ, int PLD>
__device__ __forceinline__ void att_col_times(float acc[RJ][AttGeom<HS>::NC], const float* w, const float* m,
                                              int ld, int hs, int ty, int tx) {
    typedef AttGeom<HS> G;
#pragma unroll 2
    for (int r = 0; r < BQ; r++) {
        float wv[RJ];
        if constexpr (RJ == 4) {
            const float4 v = *reinterpret_cast<const float4*>(&w[r * PLD + 4 * ty]);
            wv[0] = v.x, wv[1] = v.y, wv[2] = v.z, wv[3] = v.w;
        } else {
            const float2 v = *reinterpret_cast<const float2*>(&w[r * PLD + 2 * ty]);
            wv[0] = v.x, wv[1] = v.y;
        }
        float mv[G::NC];
        att_row_load<HS>(mv, m, r, ld, hs, tx);
#pragma unroll
        for (int a = 0; a < RJ; a++)
#pragma unroll
            for (int c = 0; c < G::NC; c++) acc[a][c] += wv[a] * mv[c];
    }
}

// att_forward: grid (NH, B, ⌈T/BQ⌉), block 256, dynamic shared memory
// ((BQ + 2·BK)·ld + BQ·PLD)·4 bytes (q, k, v tiles and the probabilities;
// (3·64·ld + 64·ATT_PLD)·4 for 64×64 tiles). Block z takes query tile
// ⌈T/BQ⌉−1−z: blocks start in grid order, x fastest, so the longest rows
// of every head start first and the short ones fill the tail.
template <int HS, int BQ, int BK>
__device__ __forceinline__ void att_forward(void* __restrict__ out, float* __restrict__ lse,
                                            const void* __restrict__ qkv, int T, int NH, int NKV, int hs_arg,
                                            float scale, float p, float pscale, unsigned long long key, int Hg,
                                            int h0, unsigned long long off, int bf) {
    typedef AttGeom<HS> G;
    typedef AttTile<BQ, BK> W;
    constexpr int RI = W::RI, RJ = W::RJ, PLD = W::PLD;
    extern __shared__ __align__(16) float att_smem[]; // float4 reads
    const int hs = HS > 0 ? HS : hs_arg;
    const int ld = att_ld(hs, G::VEC);
    const int tid = threadIdx.x, tx = tid & 15, ty = tid >> 4;
    const int nt = (T + BQ - 1) / BQ;
    const int qt = nt - 1 - (int)blockIdx.z;
    const int h = blockIdx.x, b = blockIdx.y;
    const int kvh = h / (NH / NKV); // the key/value head of query head h
    const int q0 = qt * BQ;
    const int klast = (min(q0 + BQ, T) - 1) / BK; // the last key tile a row of the tile sees
    const long long C = (long long)NH * hs, ld3 = (long long)(NH + 2 * NKV) * hs;
    const long long base = (long long)b * T * ld3 + (long long)h * hs; // elements of qkv
    const long long kbase = (long long)b * T * ld3 + (long long)(NH + kvh) * hs;
    const long long vbase = kbase + (long long)NKV * hs;
    const int qb = BF(bf, 1);
    float* qs = att_smem;
    float* ks = qs + BQ * ld;
    float* vs = ks + BK * ld;
    float* ps = vs + BK * ld;
    const bool drop = p > 0.0f;
    const unsigned long long hbase = off + (unsigned long long)(b * Hg + h0 + h) * T * T;

    att_load_rows<BQ>(qs, ld, qkv, base, qb, ld3, q0, T, hs);

    float m[RI], l[RI], o[RI][G::NC];
#pragma unroll
    for (int i = 0; i < RI; i++) {
        m[i] = ATT_NEG, l[i] = 0.0f;
#pragma unroll
        for (int c = 0; c < G::NC; c++) o[i][c] = 0.0f;
    }

    for (int kt = 0; kt <= klast; kt++) {
        const int k0 = kt * BK;
        __syncthreads(); // the previous tile's k, v and p are consumed
        att_load_rows<BK>(ks, ld, qkv, kbase, qb, ld3, k0, T, hs);
        att_load_rows<BK>(vs, ld, qkv, vbase, qb, ld3, k0, T, hs);
        __syncthreads();

        float s[RI][RJ];
#pragma unroll
        for (int i = 0; i < RI; i++)
#pragma unroll
            for (int j = 0; j < RJ; j++) s[i][j] = 0.0f;
        att_dot<HS, RI, RJ>(s, qs, ks, ld, hs, ty, tx);

#pragma unroll
        for (int i = 0; i < RI; i++) {
            const int t = q0 + ty + 16 * i;
            float mx = ATT_NEG;
#pragma unroll
            for (int j = 0; j < RJ; j++) {
                const int col = k0 + tx + 16 * j;
                s[i][j] = col <= t ? s[i][j] * scale : ATT_NEG;
                mx = fmaxf(mx, s[i][j]);
            }
            mx = att_rowmax16(mx);
            const float mnew = fmaxf(m[i], mx);
            const float corr = expf(m[i] - mnew);
            m[i] = mnew;
            l[i] *= corr;
#pragma unroll
            for (int c = 0; c < G::NC; c++) o[i][c] *= corr;
            const unsigned long long rbase = hbase + (unsigned long long)t * T + k0;
#pragma unroll
            for (int j = 0; j < RJ; j++) {
                float e = expf(s[i][j] - mnew);
                l[i] += e;
                if (drop) e = (t < T && dropout_keep(key, rbase + tx + 16 * j, p)) ? e * pscale : 0.0f;
                ps[(ty + 16 * i) * PLD + tx + 16 * j] = e;
            }
        }
        __syncthreads();
        att_row_times<HS, RI, BK, PLD>(o, ps, vs, ld, hs, ty, tx);
    }

#pragma unroll
    for (int i = 0; i < RI; i++) {
        const int t = q0 + ty + 16 * i;
        const float sum = att_rowsum16(l[i]);
        if (t >= T) continue;
        const float inv = 1.0f / sum;
        const long long orow = ((long long)b * T + t) * C + (long long)h * hs;
#pragma unroll
        for (int c = 0; c < G::NC; c++) {
            const int col = att_col<HS>(tx, c);
            if (col < hs) stx(out, orow + col, o[i][c] * inv, BF(bf, 0));
        }
        if (tx == 0) lse[((long long)b * NH + h) * T + t] = m[i] + logf(sum);
    }
}

// att_backward: grid (NKV, B, ⌈T/BK⌉), block 256, dynamic shared memory
// (2·(BK + BQ)·ld + 2·BQ·PLD)·4 bytes (k, v, q, dout tiles, the dropped
// probabilities and the score gradients; (4·64·ld + 2·64·ATT_PLD)·4 for
// 64×64 tiles). Block (x, z) owns key tile z of key/value head x (the
// first keys, which the most rows see, start first): it keeps that tile's
// k and v in shared memory and dk, dv in registers, walks, for each query
// head of the group in turn, the query tiles from the one holding row
// z·BK to ⌈T/BQ⌉−1 recomputing the probabilities from q, k and lse, and adds each
// query tile's share of dq into the float32 accumulator dqacc with atomics
// (row stride dqld: dqkv itself when it is float32, else a buffer of
// (B·T, NH·hs) that attention_dq_store rounds into dqkv; zero beforehand:
// attention_zero_dq). dk and dv sum the group's heads in head order in
// registers and are written once. D = rowsum(dout ⊙ out) is computed here
// from out, the forward output, a 1/(2·64) share of a tile's work. bf:
// dqkv, dout, out, qkv.
template <int HS, int BQ, int BK>
__device__ __forceinline__ void att_backward(void* __restrict__ dqkv, const void* __restrict__ dout,
                                             const void* __restrict__ out, const void* __restrict__ qkv,
                                             const float* __restrict__ lse, int T, int NH, int NKV, int hs_arg,
                                             float scale, float p, float pscale, unsigned long long key, int Hg,
                                             int h0, unsigned long long off, float* __restrict__ dqacc, long long dqld,
                                             int bf) {
    typedef AttGeom<HS> G;
    typedef AttTile<BQ, BK> W;
    constexpr int RI = W::RI, RJ = W::RJ, PLD = W::PLD;
    extern __shared__ __align__(16) float att_smem[]; // float4 reads
    const int hs = HS > 0 ? HS : hs_arg;
    const int ld = att_ld(hs, G::VEC);
    const int tid = threadIdx.x, tx = tid & 15, ty = tid >> 4;
    const int nt = (T + BQ - 1) / BQ;
    const int kt = blockIdx.z;
    const int kvh = blockIdx.x, b = blockIdx.y;
    const int group = NH / NKV;
    const int k0 = kt * BK;
    const int qfirst = k0 / BQ; // the first query tile with a row that sees key k0
    const long long C = (long long)NH * hs, ld3 = (long long)(NH + 2 * NKV) * hs;
    const long long kofs = (long long)(NH + kvh) * hs, vofs = kofs + (long long)NKV * hs;
    const long long row0 = (long long)b * T * ld3; // elements of qkv and dqkv
    float* dqrow0 = dqacc + (long long)b * T * dqld;
    const int qb = BF(bf, 3);
    float* ks = att_smem;
    float* vs = ks + BK * ld;
    float* qs = vs + BK * ld;
    float* gs = qs + BQ * ld;
    float* ps = gs + BQ * ld;
    float* dss = ps + BQ * PLD;
    const bool drop = p > 0.0f;

    att_load_rows<BK>(ks, ld, qkv, row0 + kofs, qb, ld3, k0, T, hs);
    att_load_rows<BK>(vs, ld, qkv, row0 + vofs, qb, ld3, k0, T, hs);

    float dk[RJ][G::NC], dv[RJ][G::NC];
#pragma unroll
    for (int a = 0; a < RJ; a++)
#pragma unroll
        for (int c = 0; c < G::NC; c++) dk[a][c] = 0.0f, dv[a][c] = 0.0f;

    for (int h = kvh * group; h < (kvh + 1) * group; h++) {
        const long long base = row0 + (long long)h * hs;
        const long long gbase = (long long)b * T * C + (long long)h * hs; // elements of dout and out
        const float* lrow = lse + ((long long)b * NH + h) * T;
        float* dbase = dqrow0 + (long long)h * hs;
        const unsigned long long hbase = off + (unsigned long long)(b * Hg + h0 + h) * T * T;
        for (int qt = qfirst; qt < nt; qt++) {
            const int q0 = qt * BQ;
            __syncthreads(); // the previous query tile is consumed
            att_load_rows<BQ>(qs, ld, qkv, base, qb, ld3, q0, T, hs);
            att_load_rows<BQ>(gs, ld, dout, gbase, BF(bf, 1), (long long)C, q0, T, hs);
            __syncthreads();

            // Each row's lse and D = dout·out.
            float rl[RI], rd[RI];
#pragma unroll
            for (int i = 0; i < RI; i++) {
                const int r = ty + 16 * i, t = q0 + r;
                float d = 0.0f;
                if (t < T) {
                    const long long orow = gbase + (long long)t * C;
                    for (int col = tx; col < hs; col += 16) d += gs[r * ld + col] * ldx(out, orow + col, BF(bf, 2));
                }
                rd[i] = att_rowsum16(d);
                rl[i] = t < T ? lrow[t] : 0.0f;
            }

            float s[RI][RJ], dp[RI][RJ];
#pragma unroll
            for (int i = 0; i < RI; i++)
#pragma unroll
                for (int j = 0; j < RJ; j++) s[i][j] = 0.0f, dp[i][j] = 0.0f;
            att_dot<HS, RI, RJ>(s, qs, ks, ld, hs, ty, tx);
            att_dot<HS, RI, RJ>(dp, gs, vs, ld, hs, ty, tx);

#pragma unroll
            for (int i = 0; i < RI; i++) {
                const int r = ty + 16 * i, t = q0 + r;
                const unsigned long long rbase = hbase + (unsigned long long)t * T + k0;
#pragma unroll
                for (int j = 0; j < RJ; j++) {
                    const int col = k0 + tx + 16 * j;
                    const bool valid = t < T && col <= t;
                    const float pr = valid ? expf(s[i][j] * scale - rl[i]) : 0.0f;
                    float pk = pr, g = dp[i][j];
                    if (drop) {
                        if (valid && dropout_keep(key, rbase + tx + 16 * j, p)) {
                            pk = pr * pscale, g = g * pscale;
                        } else {
                            pk = 0.0f, g = 0.0f;
                        }
                    }
                    ps[r * PLD + tx + 16 * j] = pk;
                    dss[r * PLD + tx + 16 * j] = pr * (g - rd[i]) * scale;
                }
            }
            __syncthreads();

            att_col_times<HS, RJ, BQ, PLD>(dv, ps, gs, ld, hs, ty, tx);
            att_col_times<HS, RJ, BQ, PLD>(dk, dss, qs, ld, hs, ty, tx);

            float dq[RI][G::NC];
#pragma unroll
            for (int i = 0; i < RI; i++)
#pragma unroll
                for (int c = 0; c < G::NC; c++) dq[i][c] = 0.0f;
            att_row_times<HS, RI, BK, PLD>(dq, dss, ks, ld, hs, ty, tx);
#pragma unroll
            for (int i = 0; i < RI; i++) {
                const int t = q0 + ty + 16 * i;
                if (t >= T) continue;
                float* drow = dbase + (long long)t * dqld;
#pragma unroll
                for (int c = 0; c < G::NC; c++) {
                    const int col = att_col<HS>(tx, c);
                    if (col < hs) atomicAdd(&drow[col], dq[i][c]);
                }
            }
        }
    } // the group's query heads

#pragma unroll
    for (int a = 0; a < RJ; a++) {
        const int t = k0 + RJ * ty + a;
        if (t >= T) continue;
        const long long drow = row0 + (long long)t * ld3;
#pragma unroll
        for (int c = 0; c < G::NC; c++) {
            const int col = att_col<HS>(tx, c);
            if (col < hs) stx(dqkv, drow + kofs + col, dk[a][c], BF(bf, 0)), stx(dqkv, drow + vofs + col, dv[a][c], BF(bf, 0));
        }
    }
}

// ATT_FORWARD and ATT_BACKWARD stamp out the kernels of head size HS (0:
// generic) on BQ×BK tiles as attention_forward_NAME and
// attention_backward_NAME.
#define ATT_FORWARD(NAME, HS, BQ, BK)                                                                           \
    extern "C" __global__ void __launch_bounds__(ATT_THREADS)                                                  \
        attention_forward_##NAME(void* out, float* lse, const void* qkv, int T, int NH, int NKV, int hs,      \
                                 float scale, float p, float pscale, unsigned long long key, int Hg, int h0,  \
                                 unsigned long long off, int bf) {                                             \
        att_forward<HS, BQ, BK>(out, lse, qkv, T, NH, NKV, hs, scale, p, pscale, key, Hg, h0, off, bf);       \
    }
#define ATT_BACKWARD(NAME, HS, BQ, BK)                                                                          \
    extern "C" __global__ void __launch_bounds__(ATT_THREADS)                                                  \
        attention_backward_##NAME(void* dqkv, const void* dout, const void* out, const void* qkv,             \
                                  const float* lse, int T, int NH, int NKV, int hs, float scale, float p,     \
                                  float pscale, unsigned long long key, int Hg, int h0,                       \
                                  unsigned long long off, float* dqacc, long long dqld, int bf) {              \
        att_backward<HS, BQ, BK>(dqkv, dout, out, qkv, lse, T, NH, NKV, hs, scale, p, pscale, key, Hg, h0,   \
                                 off, dqacc, dqld, bf);                                                        \
    }
#define ATT_KERNELS(NAME, HS)                    \
    ATT_FORWARD(NAME, HS, ATT_TILE, ATT_TILE)   \
    ATT_BACKWARD(NAME, HS, ATT_TILE, ATT_TILE)

// The 64×64 kernels (an H100's).
ATT_KERNELS(hs32, 32)
ATT_KERNELS(hs64, 64)
ATT_KERNELS(hs80, 80)
ATT_KERNELS(hs128, 128)
ATT_KERNELS(any, 0)

// Smaller tiles for smaller shared memories; the list is variants.go's
// attKernels, whose comment gives each one's bytes. A device that runs
// only the 64×64 kernels (an H100) compiles without them.
#ifndef GPTUI_ATT_DEFAULT_ONLY
ATT_FORWARD(hs128_q64k32, 128, 64, 32)
ATT_FORWARD(any_q64k32, 0, 64, 32)
ATT_BACKWARD(hs64_q32k64, 64, 32, 64)
ATT_BACKWARD(hs80_q32k64, 80, 32, 64)
ATT_BACKWARD(hs128_q32k64, 128, 32, 64)
ATT_BACKWARD(any_q32k64, 0, 32, 64)
ATT_BACKWARD(hs128_q32k32, 128, 32, 32)
ATT_BACKWARD(any_q32k32, 0, 32, 32)
#endif

// attention_zero_dq zeros the dq accumulator, the first C channels of N =
// B·T rows of ld (the query heads of a float32 dqkv, or a float32 buffer of
// rows of C), which the backward kernels then accumulate into.
// Grid-stride over N·C.
extern "C" __global__ void attention_zero_dq(float* dqkv, int N, int C, int ld) {
    const long long n = (long long)N * C;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
        const long long r = i / C, c = i - r * C;
        dqkv[r * ld + c] = 0.0f;
    }
}

// attention_dq_store writes the float32 dq accumulator (N,C) into the query
// heads of dqkv (N rows of ld), rounded to bfloat16 when bf (bit 0), once
// the backward kernels have summed it. Grid-stride over N·C.
extern "C" __global__ void attention_dq_store(void* dqkv, const float* dq, int N, int C, int ld, int bf) {
    const long long n = (long long)N * C;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
        const long long r = i / C, c = i - r * C;
        stx(dqkv, r * ld + c, dq[i], bf & 1);
    }
}

#define ATT_DEC_WARPS 8 // warps per block of attention_decode
#define ATT_DEC_NC 8    // head-size columns per lane: hs ≤ 256

// attention_decode: one new position per sequence against a grouped
// key/value cache. q (B,C) at position pos, C = NH·hs; kc and vc
// (B,maxT,CKV), CKV = NKV·hs, filled for rows 0 … pos; out (B,C); query head
// h reads cached head h/(NH/NKV). Grid (NH, B), block 32·ATT_DEC_WARPS. Warp
// w walks the cached rows w, w+8, … with an online softmax (lane owns head
// columns lane+32·c); the warps' partial results are merged at the end. bf:
// out, q (the caches stay float32).
extern "C" __global__ void __launch_bounds__(32 * ATT_DEC_WARPS)
    attention_decode(void* out, const void* q, const float* kc, const float* vc, int pos, int maxT, int NH, int NKV,
                     int hs, float scale, int bf) {
    __shared__ float dm[ATT_DEC_WARPS], dl[ATT_DEC_WARPS];
    __shared__ float dov[ATT_DEC_WARPS][32 * ATT_DEC_NC];
    const int h = blockIdx.x, b = blockIdx.y;
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    const long long C = (long long)NH * hs, CKV = (long long)NKV * hs;
    const long long kvofs = (long long)(h / (NH / NKV)) * hs;
    const long long qrow = (long long)b * C + (long long)h * hs;
    float qv[ATT_DEC_NC], o[ATT_DEC_NC];
#pragma unroll
    for (int c = 0; c < ATT_DEC_NC; c++) {
        const int col = lane + 32 * c;
        qv[c] = col < hs ? ldx(q, qrow + col, BF(bf, 1)) : 0.0f;
        o[c] = 0.0f;
    }
    float m = ATT_NEG, l = 0.0f;
    for (int t = w; t <= pos; t += ATT_DEC_WARPS) {
        const long long row = ((long long)b * maxT + t) * CKV + kvofs;
        float d = 0.0f;
#pragma unroll
        for (int c = 0; c < ATT_DEC_NC; c++) {
            const int col = lane + 32 * c;
            if (col < hs) d += qv[c] * kc[row + col];
        }
        d += __shfl_xor_sync(0xffffffffu, d, 16);
        d += __shfl_xor_sync(0xffffffffu, d, 8);
        d += __shfl_xor_sync(0xffffffffu, d, 4);
        d += __shfl_xor_sync(0xffffffffu, d, 2);
        d += __shfl_xor_sync(0xffffffffu, d, 1);
        const float s = d * scale;
        const float mnew = fmaxf(m, s);
        const float corr = expf(m - mnew), e = expf(s - mnew);
        m = mnew;
        l = l * corr + e;
#pragma unroll
        for (int c = 0; c < ATT_DEC_NC; c++) {
            const int col = lane + 32 * c;
            if (col < hs) o[c] = o[c] * corr + e * vc[row + col];
        }
    }
    if (lane == 0) dm[w] = m, dl[w] = l;
#pragma unroll
    for (int c = 0; c < ATT_DEC_NC; c++) dov[w][lane + 32 * c] = o[c];
    __syncthreads();
    float mx = ATT_NEG;
    for (int i = 0; i < ATT_DEC_WARPS; i++) mx = fmaxf(mx, dm[i]);
    float sum = 0.0f;
    for (int i = 0; i < ATT_DEC_WARPS; i++) sum += dl[i] * expf(dm[i] - mx);
    const float inv = 1.0f / sum;
    const long long orow = (long long)b * C + (long long)h * hs;
    for (int col = threadIdx.x; col < hs; col += 32 * ATT_DEC_WARPS) {
        float acc = 0.0f;
        for (int i = 0; i < ATT_DEC_WARPS; i++) acc += dov[i][col] * expf(dm[i] - mx);
        stx(out, orow + col, acc * inv, BF(bf, 0));
    }
}

// flashattention.cu: causal grouped-query self-attention on tensor cores,
// FlashAttention-2's tiling (online softmax; no T×T matrix in memory),
// for head sizes 64 and 128. attention.cu's kernels stay the fallback (other
// head sizes, dropout, devices without bf16 tensor cores, fp32 GEMMs).
//
// Layouts are attention.cu's, so either family's backward pass takes either
// forward pass's output:
//   qkv (B,T,ld), ld = (NH+2·NKV)·HD: NH query heads, NKV key heads, NKV
//                 value heads; query head h reads key/value head h/(NH/NKV)
//   out (B,T,NH·HD)
//   lse (B,NH,T)  log Σ_j exp(q·k_j·scale) over the causal row
//
// Numerics: q, k, v (and in the backward pass dout) are rounded from fp32
// to bf16 (round to nearest even) as a tile is copied to shared memory; the
// products QKᵀ, PV, dO·Vᵀ, Pᵀ·dO, dSᵀ·Q and dS·K run on tensor cores (WMMA,
// 16×16×16 bf16 with fp32 accumulation); P and dS are rounded to bf16 as
// the second operand of a product. The softmax (scale, mask, running max,
// exponentials, row sums), lse, delta = rowsum(dO∘O), the rescaling of the
// output and every accumulator stay fp32; dq is summed over key tiles in
// fp32 with atomics, dk and dv over query tiles and a group's query heads
// in tensor-core accumulators. Errors are therefore bf16's (a few 1e-3
// relative), not fp32's: kernels/cuda/flashattention_test.go measures them.
//
// Forward, flash_attn_forward_hs<HD>_q<BR>k<BC>: grid (NH, B, ⌈T/BR⌉),
// block 2·BR threads (a warp per 16 query rows), dynamic shared memory
// FaFwd<HD,BR,BC>::SHARED bytes. Block z takes query tile ⌈T/BR⌉−1−z (the
// longest rows first). The q tile is loaded once; for each key tile up to
// the diagonal (later ones are skipped: causal) the block loads k and v,
// and each warp, on its own 16 rows: S = Q·Kᵀ (16×BC, key blocks wholly
// past the warp's last row skipped) into its shared rows, the online
// softmax row by row (a lane per 32nd column; the running max m and the
// lane's partial row sums in registers, the output rows rescaled), P to
// bf16, then P·V (16×HD) into its shared rows, added to the output rows it
// holds in registers (lane: columns lane+32c). A warp needs __syncwarp
// only between these steps: its rows are its own.
//
// Backward, flash_attn_backward_hs<HD>_q<BR>k<BC>: grid (NKV, B,
// ⌈T/BC⌉), block 256 threads, FaBwd<HD,BR,BC>::SHARED bytes. Block (x, z)
// owns key tile z of key/value head x: k and v in shared memory, dk and dv
// in tensor-core accumulators (warp w: key block w mod BC/16, head columns
// of part w/(BC/16)). For each query head of the group, each query tile
// from the diagonal on: load q and dout (bf16), lse and delta; (1) each
// warp computes its blocks of Sᵀ = K·Qᵀ and dPᵀ = V·dOᵀ, and from them
// Pᵀ = exp(Sᵀ·scale − lse) and dSᵀ = Pᵀ∘(dPᵀ − delta)·scale (masked: 0) as
// bf16; (2) dv += Pᵀ·dO, dk += dSᵀ·Q on the warp's blocks, and the tile's
// dq = dS·K, a 16×16 block a warp in turn, into shared memory; (3) dq is
// added to dqkv with atomics. dk and dv are written once at the end.
// flash_attn_prep runs first: delta = rowsum(dout∘out) (B,NH,T) into
// a scratch buffer, and dq zeroed.
//
// Tensor cores: the kernels are written against nvcuda::wmma's API under
// the name fa_wmma. NVRTC gets no headers (the program has no #include, see
// source.go), so mma.h is not there: for NVRTC the subset used is defined
// below with the PTX wmma instructions it stands for (wmma.load.a/b .bf16,
// wmma.mma .f32.bf16.bf16.f32, wmma.store.d .f32, shape m16n16k16), which
// need sm_80; below sm_80 the kernels compile to nothing and are never
// launched (the backend selects them only with bf16 GEMMs, which need
// sm_80). The emulator (emu/src/cuda_emu.h) provides nvcuda::wmma itself.

#define FA_NEG (-3.0e38f) // a masked score: exp(FA_NEG − m) is 0

#if defined(__CUDACC_RTC__)
#if __CUDA_ARCH__ >= 800
#define FA_TC 1
#else
#define FA_TC 0
#endif
struct __align__(2) fa_bf16 {
    unsigned short x;
};
__device__ __forceinline__ fa_bf16 fa_to_bf16(float f) {
    fa_bf16 h;
    h.x = f32_to_bf16(f);
    return h;
}
#if FA_TC
namespace fa_wmma {
struct matrix_a {};
struct matrix_b {};
struct accumulator {};
struct row_major {};
struct col_major {};
enum layout_t { mem_row_major, mem_col_major };
template <class Use, int M, int N, int K, class T, class Layout = void>
struct fragment;
// bf16 operands of m16n16k16: four .b32 registers, two bf16 each.
template <class Use, class L>
struct fragment<Use, 16, 16, 16, fa_bf16, L> {
    unsigned x[4];
};
// fp32 accumulators of m16n16k16: eight .f32 registers.
template <>
struct fragment<accumulator, 16, 16, 16, float, void> {
    static constexpr int num_elements = 8;
    float x[8];
};
typedef fragment<accumulator, 16, 16, 16, float, void> fa_acc_t;

__device__ __forceinline__ void fill_fragment(fa_acc_t& f, float v) {
#pragma unroll
    for (int i = 0; i < 8; i++) f.x[i] = v;
}

#define FA_WMMA_LOAD(USE, AB, LAYOUT, LNAME)                                                                   \
    __device__ __forceinline__ void load_matrix_sync(fragment<USE, 16, 16, 16, fa_bf16, LAYOUT>& f,            \
                                                     const fa_bf16* p, unsigned ldm) {                         \
        asm volatile("wmma.load." AB ".sync.aligned." LNAME ".m16n16k16.bf16 {%0,%1,%2,%3}, [%4], %5;"        \
                     : "=r"(f.x[0]), "=r"(f.x[1]), "=r"(f.x[2]), "=r"(f.x[3])                                  \
                     : "l"(p), "r"(ldm)                                                                        \
                     : "memory");                                                                              \
    }
FA_WMMA_LOAD(matrix_a, "a", row_major, "row")
FA_WMMA_LOAD(matrix_a, "a", col_major, "col")
FA_WMMA_LOAD(matrix_b, "b", row_major, "row")
FA_WMMA_LOAD(matrix_b, "b", col_major, "col")

__device__ __forceinline__ void store_matrix_sync(float* p, const fa_acc_t& f, unsigned ldm, layout_t layout) {
    if (layout == mem_row_major) {
        asm volatile("wmma.store.d.sync.aligned.row.m16n16k16.f32 [%0], {%1,%2,%3,%4,%5,%6,%7,%8}, %9;"
                     :
                     : "l"(p), "f"(f.x[0]), "f"(f.x[1]), "f"(f.x[2]), "f"(f.x[3]), "f"(f.x[4]), "f"(f.x[5]),
                       "f"(f.x[6]), "f"(f.x[7]), "r"(ldm)
                     : "memory");
    } else {
        asm volatile("wmma.store.d.sync.aligned.col.m16n16k16.f32 [%0], {%1,%2,%3,%4,%5,%6,%7,%8}, %9;"
                     :
                     : "l"(p), "f"(f.x[0]), "f"(f.x[1]), "f"(f.x[2]), "f"(f.x[3]), "f"(f.x[4]), "f"(f.x[5]),
                       "f"(f.x[6]), "f"(f.x[7]), "r"(ldm)
                     : "memory");
    }
}

#define FA_WMMA_MMA(LA, LB, LANAME, LBNAME)                                                                    \
    __device__ __forceinline__ void mma_sync(fa_acc_t& d, const fragment<matrix_a, 16, 16, 16, fa_bf16, LA>& a, \
                                             const fragment<matrix_b, 16, 16, 16, fa_bf16, LB>& b,             \
                                             const fa_acc_t& c) {                                              \
        asm volatile("wmma.mma.sync.aligned." LANAME "." LBNAME ".m16n16k16.f32.bf16.bf16.f32 "               \
                     "{%0,%1,%2,%3,%4,%5,%6,%7}, {%8,%9,%10,%11}, {%12,%13,%14,%15}, "                         \
                     "{%16,%17,%18,%19,%20,%21,%22,%23};"                                                      \
                     : "=f"(d.x[0]), "=f"(d.x[1]), "=f"(d.x[2]), "=f"(d.x[3]), "=f"(d.x[4]), "=f"(d.x[5]),     \
                       "=f"(d.x[6]), "=f"(d.x[7])                                                              \
                     : "r"(a.x[0]), "r"(a.x[1]), "r"(a.x[2]), "r"(a.x[3]), "r"(b.x[0]), "r"(b.x[1]),          \
                       "r"(b.x[2]), "r"(b.x[3]), "f"(c.x[0]), "f"(c.x[1]), "f"(c.x[2]), "f"(c.x[3]),           \
                       "f"(c.x[4]), "f"(c.x[5]), "f"(c.x[6]), "f"(c.x[7]));                                    \
    }
FA_WMMA_MMA(row_major, col_major, "row", "col")
FA_WMMA_MMA(row_major, row_major, "row", "row")
FA_WMMA_MMA(col_major, row_major, "col", "row")
FA_WMMA_MMA(col_major, col_major, "col", "col")
} // namespace fa_wmma
#endif // FA_TC
#else  // the emulator: cuda_emu.h's nvcuda::wmma and __nv_bfloat16
#define FA_TC 1
typedef __nv_bfloat16 fa_bf16;
__device__ __forceinline__ fa_bf16 fa_to_bf16(float f) { return __float2bfloat16(f); }
namespace fa_wmma = nvcuda::wmma;
#endif

// fa_round rounds a region of shared memory up to 128 bytes, so every
// region (and every 16-row block of it) is 32-byte aligned for WMMA.
__host__ __device__ constexpr int fa_round(int n) { return (n + 127) / 128 * 128; }
__host__ __device__ constexpr int fa_max(int a, int b) { return a > b ? a : b; }

// FaFwd is the forward kernel's shape: BR query rows (16 a warp) against
// BC keys, head size HD. The q, k and v tiles are bf16 rows padded by 8
// elements (16 bytes), so that the eight rows a fragment's 32-bit loads
// touch fall in different banks (a row is 4 banks apart from the last),
// and every row starts 16-byte aligned for the tiles' 16-byte copies.
// Scores, probabilities and the output stay in registers.
// kernels/cuda/flashattention.go's FlashForwardShared is SHARED.
template <int HD, int BR, int BC>
struct FaFwd {
    static_assert(HD % 16 == 0 && BR % 16 == 0 && BC % 16 == 0, "tile shape");
    static constexpr int WARPS = BR / 16, THREADS = 32 * WARPS;
    static constexpr int LDH = HD + 8; // bf16 rows of q, k, v
    static constexpr int Q_BYTES = fa_round(BR * LDH * 2);
    static constexpr int KV_BYTES = fa_round(BC * LDH * 2);
    static constexpr int SHARED = Q_BYTES + 2 * KV_BYTES;
};

// FaBwd is the backward kernel's shape: BC keys per block against BR query
// rows at a time, head size HD, 8 warps. The warps' 16×16 scratch (two
// blocks each, stride LDW) and the tile's dq (stride LDO) share a region.
// kernels/cuda/flashattention.go's FlashBackwardShared is SHARED.
template <int HD, int BR, int BC>
struct FaBwd {
    static constexpr int WARPS = 8, THREADS = 32 * WARPS;
    static constexpr int KB = BC / 16;         // key blocks
    static constexpr int SPLIT = WARPS / KB;   // warps per key block
    static_assert(HD % 32 == 0 && BR % 16 == 0 && WARPS % KB == 0 && (HD / 16) % SPLIT == 0, "tile shape");
    static constexpr int HW = HD / SPLIT;      // dk, dv columns per warp
    static constexpr int LDH = HD + 8;         // bf16 rows of k, v, q, dout
    static constexpr int LDT = BR + 8;         // bf16 rows of Pᵀ and dSᵀ (a row per key)
    static constexpr int LDO = HD + 4;         // fp32 rows of dq
    static constexpr int LDW = 20;             // fp32 rows of a warp's scratch
    static constexpr int KV_BYTES = fa_round(BC * LDH * 2);
    static constexpr int QD_BYTES = fa_round(BR * LDH * 2);
    static constexpr int T_BYTES = fa_round(BC * LDT * 2);
    static constexpr int X_BYTES = fa_round(fa_max(BR * LDO * 4, WARPS * 2 * 16 * LDW * 4));
    static constexpr int ROW_BYTES = fa_round(BR * 4);
    static constexpr int SHARED = 2 * KV_BYTES + 2 * QD_BYTES + 2 * T_BYTES + X_BYTES + 2 * ROW_BYTES;
};

// fa_load_tile rounds rows r0 … r0+ROWS−1 of one head (HD elements from
// element at of src, row stride ld; float32, or bfloat16 when bf, which
// rounding leaves as they are) to bf16 into a shared tile of stride LDH;
// rows at or past T are zeros.
template <int ROWS, int HD, int LDH, int THREADS>
__device__ __forceinline__ void fa_load_tile(fa_bf16* dst, const void* __restrict__ src, long long at, int bf,
                                             long long ld, int r0, int T) {
    // bf16 rows that start 16-byte aligned are copied 16 bytes at a time
    // (the same bits: rounding leaves bf16 values as they are).
    if (bf && (((unsigned long long)src + 2ull * (unsigned long long)at) & 15) == 0 && (ld & 7) == 0) {
        constexpr int V = HD / 8; // 16-byte pieces a row
        const bf16_t* s = reinterpret_cast<const bf16_t*>(src) + at;
        for (int i = threadIdx.x; i < ROWS * V; i += THREADS) {
            const int r = i / V, c = i - r * V;
            const int t = r0 + r;
            uint4 x = {0u, 0u, 0u, 0u};
            if (t < T) x = *reinterpret_cast<const uint4*>(s + (long long)t * ld + 8 * c);
            *reinterpret_cast<uint4*>(dst + r * LDH + 8 * c) = x;
        }
        return;
    }
    for (int i = threadIdx.x; i < ROWS * HD; i += THREADS) {
        const int r = i / HD, d = i - r * HD;
        const int t = r0 + r;
        dst[r * LDH + d] = fa_to_bf16(t < T ? ldx(src, at + (long long)t * ld + d, bf) : 0.0f);
    }
}

// fa_u32 reads two adjacent bf16 elements of shared memory, the lower
// index in the lower half (an mma fragment register).
__device__ __forceinline__ unsigned fa_u32(const fa_bf16* p) { return *reinterpret_cast<const unsigned*>(p); }

// fa_u32x2 packs two bf16 elements that are not adjacent, lo in the lower half.
__device__ __forceinline__ unsigned fa_u32x2(const fa_bf16* lo, const fa_bf16* hi) {
    return (unsigned)*reinterpret_cast<const unsigned short*>(lo) |
           ((unsigned)*reinterpret_cast<const unsigned short*>(hi) << 16);
}

// fa_pack rounds lo and hi to bf16 (to nearest even) and packs them, lo in
// the lower half.
__device__ __forceinline__ unsigned fa_pack(float lo, float hi) {
#if defined(__CUDACC_RTC__) && FA_TC
    unsigned r;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
#else
    return (unsigned)f32_to_bf16(lo) | ((unsigned)f32_to_bf16(hi) << 16);
#endif
}

// fa_mma is D += A·B for one warp on a 16×8×16 block, bf16 operands and
// fp32 accumulators (mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32),
// in PTX's fragment layout: lane 4g+t holds a[0] = A[g][2t,2t+1], a[1] =
// A[g+8][2t,2t+1], a[2] = A[g][2t+8,2t+9], a[3] = A[g+8][2t+8,2t+9];
// b0 = B[2t,2t+1][g], b1 = B[2t+8,2t+9][g]; d[0], d[1] = D[g][2t,2t+1],
// d[2], d[3] = D[g+8][2t,2t+1]. The emulator's emu_mma_m16n8k16_bf16 is
// the same operation.
__device__ __forceinline__ void fa_mma(float (&d)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
#if defined(__CUDACC_RTC__)
#if FA_TC
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#endif
#else
    emu_mma_m16n8k16_bf16(d, a, b0, b1);
#endif
}

// fa_forward: see the file's comment. Warp w owns the tile's rows 16w …
// 16w+15; lane 4g+t of it holds, in PTX's accumulator layout, rows g and
// g+8 of its scores (columns 8j+2t, 8j+2t+1 of key block j) and of its
// output (columns 8d+2t, 8d+2t+1). The probabilities go from the score
// registers into the A fragments of P·V without leaving registers (an
// accumulator pair of key blocks 2k and 2k+1 is the A fragment of keys
// 16k … 16k+15). Each row's running max m (in log2 units) is the same on
// the four lanes of a group; each lane sums its own share of the row's
// probabilities, and the four shares are added at the end.
template <int HD, int BR, int BC>
__device__ __forceinline__ void fa_forward(void* __restrict__ out, float* __restrict__ lse,
                                           const void* __restrict__ qkv, int T, int NH, int NKV, float scale, int bf) {
#if FA_TC
    typedef FaFwd<HD, BR, BC> G;
    constexpr int LDH = G::LDH, NJ = BC / 8, ND = HD / 8, NK = HD / 16;
    extern __shared__ __align__(128) float fa_smem[];
    fa_bf16* qs = reinterpret_cast<fa_bf16*>(fa_smem);
    fa_bf16* ks = reinterpret_cast<fa_bf16*>(reinterpret_cast<char*>(fa_smem) + G::Q_BYTES);
    fa_bf16* vs = reinterpret_cast<fa_bf16*>(reinterpret_cast<char*>(ks) + G::KV_BYTES);

    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int g = lane >> 2, tg = lane & 3;
    const int nt = (T + BR - 1) / BR;
    const int q0 = (nt - 1 - (int)blockIdx.z) * BR;
    const int h = blockIdx.x, b = blockIdx.y;
    const int kvh = h / (NH / NKV);
    const int klast = (min(q0 + BR, T) - 1) / BC; // the last key tile a row of the tile sees
    const long long ld3 = (long long)(NH + 2 * NKV) * HD, C = (long long)NH * HD;
    const long long qbase = (long long)b * T * ld3 + (long long)h * HD; // elements of qkv
    const long long kbase = (long long)b * T * ld3 + (long long)(NH + kvh) * HD;
    const long long vbase = kbase + (long long)NKV * HD;
    const int qb = BF(bf, 1);
    const float sl2 = scale * 1.4426950408889634f; // scores to log2 units

    fa_load_tile<BR, HD, LDH, G::THREADS>(qs, qkv, qbase, qb, ld3, q0, T);
    __syncthreads();

    const int r0 = 16 * warp;           // the warp's first row of the tile
    const int rlast = q0 + r0 + 15;     // the position of its last row
    const bool live = q0 + r0 < T;      // some of its rows are positions
    const int t0 = q0 + r0 + g, t1 = t0 + 8; // the positions of the lane's two rows

    // The warp's rows of q as A fragments, loaded once.
    unsigned qf[NK][4];
#pragma unroll
    for (int kk = 0; kk < NK; kk++) {
        const fa_bf16* p = qs + (r0 + g) * LDH + 16 * kk + 2 * tg;
        qf[kk][0] = fa_u32(p);
        qf[kk][1] = fa_u32(p + 8 * LDH);
        qf[kk][2] = fa_u32(p + 8);
        qf[kk][3] = fa_u32(p + 8 * LDH + 8);
    }

    float m0 = FA_NEG, m1 = FA_NEG, l0 = 0.0f, l1 = 0.0f;
    float o[ND][4];
#pragma unroll
    for (int d = 0; d < ND; d++) o[d][0] = o[d][1] = o[d][2] = o[d][3] = 0.0f;

    for (int kt = 0; kt <= klast; kt++) {
        const int k0 = kt * BC;
        __syncthreads(); // the previous tile's k and v are consumed
        fa_load_tile<BC, HD, LDH, G::THREADS>(ks, qkv, kbase, qb, ld3, k0, T);
        fa_load_tile<BC, HD, LDH, G::THREADS>(vs, qkv, vbase, qb, ld3, k0, T);
        __syncthreads();
        if (!live || k0 > rlast) continue; // every key of the tile is past the warp's rows

        // S = Q·Kᵀ on the warp's rows; key blocks wholly past its last row
        // stay 0 and are masked below.
        float s[NJ][4];
#pragma unroll
        for (int j = 0; j < NJ; j++) {
            s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.0f;
            if (k0 + 8 * j <= rlast) {
                const fa_bf16* kp = ks + (8 * j + g) * LDH + 2 * tg;
#pragma unroll
                for (int kk = 0; kk < NK; kk++) fa_mma(s[j], qf[kk], fa_u32(kp + 16 * kk), fa_u32(kp + 16 * kk + 8));
            }
        }

        // The online softmax of the lane's two rows.
        const bool diag = k0 + BC - 1 > q0 + r0; // some key of the tile is past some row of the warp
        float mx0 = m0, mx1 = m1;
#pragma unroll
        for (int j = 0; j < NJ; j++) {
#pragma unroll
            for (int e = 0; e < 2; e++) {
                const int key = k0 + 8 * j + 2 * tg + e;
                s[j][e] = diag && key > t0 ? FA_NEG : s[j][e] * sl2;
                s[j][2 + e] = diag && key > t1 ? FA_NEG : s[j][2 + e] * sl2;
                mx0 = fmaxf(mx0, s[j][e]);
                mx1 = fmaxf(mx1, s[j][2 + e]);
            }
        }
        mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 1));
        mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 2));
        mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 1));
        mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 2));
        const float c0 = exp2f(m0 - mx0), c1 = exp2f(m1 - mx1);
        m0 = mx0, m1 = mx1;
        l0 *= c0, l1 *= c1;
#pragma unroll
        for (int d = 0; d < ND; d++) o[d][0] *= c0, o[d][1] *= c0, o[d][2] *= c1, o[d][3] *= c1;
        unsigned pf[NJ / 2][4];
#pragma unroll
        for (int j = 0; j < NJ; j++) {
            // A masked score is FA_NEG: exp2 of it less the max is 0.
            const float p0 = exp2f(s[j][0] - m0), p1 = exp2f(s[j][1] - m0);
            const float p2 = exp2f(s[j][2] - m1), p3 = exp2f(s[j][3] - m1);
            l0 += p0 + p1, l1 += p2 + p3;
            pf[j / 2][2 * (j & 1)] = fa_pack(p0, p1);
            pf[j / 2][2 * (j & 1) + 1] = fa_pack(p2, p3);
        }

        // O += P·V: B = V[keys][columns], rows 2t, 2t+1 (and +8) of a key block.
#pragma unroll
        for (int kk = 0; kk < NJ / 2; kk++) {
            if (k0 + 16 * kk > rlast) continue; // probabilities all 0
            const fa_bf16* vp = vs + (16 * kk + 2 * tg) * LDH + g;
#pragma unroll
            for (int d = 0; d < ND; d++)
                fa_mma(o[d], pf[kk], fa_u32x2(vp + 8 * d, vp + LDH + 8 * d),
                       fa_u32x2(vp + 8 * LDH + 8 * d, vp + 9 * LDH + 8 * d));
        }
    }

    if (!live) return;
    l0 += __shfl_xor_sync(0xffffffffu, l0, 1);
    l0 += __shfl_xor_sync(0xffffffffu, l0, 2);
    l1 += __shfl_xor_sync(0xffffffffu, l1, 1);
    l1 += __shfl_xor_sync(0xffffffffu, l1, 2);
    const int ob = BF(bf, 0);
#pragma unroll
    for (int half = 0; half < 2; half++) {
        const int t = half ? t1 : t0;
        if (t >= T) continue;
        const float l = half ? l1 : l0, inv = 1.0f / l;
        const long long orow = ((long long)b * T + t) * C + (long long)h * HD + 2 * tg;
#pragma unroll
        for (int d = 0; d < ND; d++) {
            stx(out, orow + 8 * d, o[d][2 * half] * inv, ob);
            stx(out, orow + 8 * d + 1, o[d][2 * half + 1] * inv, ob);
        }
        if (tg == 0) lse[((long long)b * NH + h) * T + t] = ((half ? m1 : m0) + log2f(l)) * 0.6931471805599453f;
    }
#endif
}

template <int HD, int BR, int BC>
__device__ __forceinline__ void fa_backward(void* __restrict__ dqkv, const void* __restrict__ dout,
                                            const void* __restrict__ qkv, const float* __restrict__ lse,
                                            const float* __restrict__ delta, int T, int NH, int NKV, float scale,
                                            float* __restrict__ dqacc, long long dqld, int bf) {
#if FA_TC
    typedef FaBwd<HD, BR, BC> G;
    using namespace fa_wmma;
    typedef fragment<accumulator, 16, 16, 16, float> acc_t;
    constexpr int LDH = G::LDH, LDT = G::LDT, LDO = G::LDO, LDW = G::LDW, KB = G::KB, HW = G::HW;
    extern __shared__ __align__(128) float fa_smem[];
    char* base = reinterpret_cast<char*>(fa_smem);
    fa_bf16* ks = reinterpret_cast<fa_bf16*>(base);
    fa_bf16* vs = reinterpret_cast<fa_bf16*>(base + G::KV_BYTES);
    fa_bf16* qs = reinterpret_cast<fa_bf16*>(base + 2 * G::KV_BYTES);
    fa_bf16* gs = reinterpret_cast<fa_bf16*>(base + 2 * G::KV_BYTES + G::QD_BYTES);
    fa_bf16* pt = reinterpret_cast<fa_bf16*>(base + 2 * G::KV_BYTES + 2 * G::QD_BYTES);
    fa_bf16* dst = reinterpret_cast<fa_bf16*>(base + 2 * G::KV_BYTES + 2 * G::QD_BYTES + G::T_BYTES);
    float* xs = reinterpret_cast<float*>(base + 2 * G::KV_BYTES + 2 * G::QD_BYTES + 2 * G::T_BYTES);
    float* lrow = reinterpret_cast<float*>(reinterpret_cast<char*>(xs) + G::X_BYTES);
    float* drow = reinterpret_cast<float*>(reinterpret_cast<char*>(lrow) + G::ROW_BYTES);

    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int nt = (T + BR - 1) / BR;
    const int kvh = blockIdx.x, b = blockIdx.y;
    const int k0 = blockIdx.z * BC;
    const int group = NH / NKV;
    const int qfirst = k0 / BR; // the first query tile with a row that sees key k0
    const long long ld3 = (long long)(NH + 2 * NKV) * HD, C = (long long)NH * HD;
    const long long kofs = (long long)(NH + kvh) * HD, vofs = kofs + (long long)NKV * HD;
    const long long row0 = (long long)b * T * ld3; // elements of qkv and dqkv
    float* dqrow0 = dqacc + (long long)b * T * dqld;
    const int qb = BF(bf, 2);

    const int kb = warp % KB, part = warp / KB; // the warp's key block and part of the head columns
    const int key0 = k0 + 16 * kb;              // its first key
    const int c0 = part * HW;                   // its first head column of dk and dv
    float* wscr = xs + warp * 2 * 16 * LDW;     // its two 16×16 scratch blocks

    fa_load_tile<BC, HD, LDH, G::THREADS>(ks, qkv, row0 + kofs, qb, ld3, k0, T);
    fa_load_tile<BC, HD, LDH, G::THREADS>(vs, qkv, row0 + vofs, qb, ld3, k0, T);

    acc_t dk[HW / 16], dv[HW / 16];
#pragma unroll
    for (int j = 0; j < HW / 16; j++) fill_fragment(dk[j], 0.0f), fill_fragment(dv[j], 0.0f);

    for (int h = kvh * group; h < (kvh + 1) * group; h++) {
        const long long qbase = row0 + (long long)h * HD;
        const long long gbase = (long long)b * T * C + (long long)h * HD; // elements of dout
        const float* lbase = lse + ((long long)b * NH + h) * T;
        const float* dbase = delta + ((long long)b * NH + h) * T;
        float* dqbase = dqrow0 + (long long)h * HD;
        for (int qt = qfirst; qt < nt; qt++) {
            const int q0 = qt * BR;
            __syncthreads(); // the previous query tile is consumed
            fa_load_tile<BR, HD, LDH, G::THREADS>(qs, qkv, qbase, qb, ld3, q0, T);
            fa_load_tile<BR, HD, LDH, G::THREADS>(gs, dout, gbase, BF(bf, 1), C, q0, T);
            for (int r = tid; r < BR; r += G::THREADS) {
                const int t = q0 + r;
                lrow[r] = t < T ? lbase[t] : 0.0f;
                drow[r] = t < T ? dbase[t] : 0.0f;
            }
            __syncthreads();

            // (1) Pᵀ and dSᵀ on the warp's key block, query blocks part, part+SPLIT, ….
            for (int j = part; j < BR / 16; j += G::SPLIT) {
                fa_bf16* ptb = pt + 16 * kb * LDT + 16 * j;
                fa_bf16* dsb = dst + 16 * kb * LDT + 16 * j;
                if (key0 > q0 + 16 * j + 15) { // every key past every row: zeros
                    for (int e = lane; e < 256; e += 32) {
                        ptb[(e >> 4) * LDT + (e & 15)] = fa_to_bf16(0.0f);
                        dsb[(e >> 4) * LDT + (e & 15)] = fa_to_bf16(0.0f);
                    }
                    continue;
                }
                acc_t s, dp;
                fill_fragment(s, 0.0f);
                fill_fragment(dp, 0.0f);
#pragma unroll
                for (int kk = 0; kk < HD / 16; kk++) {
                    fragment<matrix_a, 16, 16, 16, fa_bf16, row_major> a;
                    fragment<matrix_b, 16, 16, 16, fa_bf16, col_major> bt;
                    load_matrix_sync(a, ks + 16 * kb * LDH + 16 * kk, LDH);
                    load_matrix_sync(bt, qs + 16 * j * LDH + 16 * kk, LDH);
                    mma_sync(s, a, bt, s);
                    load_matrix_sync(a, vs + 16 * kb * LDH + 16 * kk, LDH);
                    load_matrix_sync(bt, gs + 16 * j * LDH + 16 * kk, LDH);
                    mma_sync(dp, a, bt, dp);
                }
                store_matrix_sync(wscr, s, LDW, mem_row_major);
                store_matrix_sync(wscr + 16 * LDW, dp, LDW, mem_row_major);
                __syncwarp();
                for (int e = lane; e < 256; e += 32) {
                    const int kr = e >> 4, qc = e & 15;
                    const int qi = 16 * j + qc, t = q0 + qi;
                    const bool valid = key0 + kr <= t && t < T;
                    const float p = valid ? expf(wscr[kr * LDW + qc] * scale - lrow[qi]) : 0.0f;
                    const float ds = p * (wscr[16 * LDW + kr * LDW + qc] - drow[qi]) * scale;
                    ptb[kr * LDT + qc] = fa_to_bf16(p);
                    dsb[kr * LDT + qc] = fa_to_bf16(ds);
                }
                __syncwarp(); // the scratch is read before the next block's store
            }
            __syncthreads();

            // (2) dv += Pᵀ·dO and dk += dSᵀ·Q on the warp's blocks.
#pragma unroll
            for (int kk = 0; kk < BR / 16; kk++) {
                if (q0 + 16 * kk + 15 < key0 || q0 + 16 * kk >= T) continue; // no row of the block sees a key
                fragment<matrix_a, 16, 16, 16, fa_bf16, row_major> ap, ad;
                load_matrix_sync(ap, pt + 16 * kb * LDT + 16 * kk, LDT);
                load_matrix_sync(ad, dst + 16 * kb * LDT + 16 * kk, LDT);
#pragma unroll
                for (int j = 0; j < HW / 16; j++) {
                    fragment<matrix_b, 16, 16, 16, fa_bf16, row_major> bm;
                    load_matrix_sync(bm, gs + 16 * kk * LDH + c0 + 16 * j, LDH);
                    mma_sync(dv[j], ap, bm, dv[j]);
                    load_matrix_sync(bm, qs + 16 * kk * LDH + c0 + 16 * j, LDH);
                    mma_sync(dk[j], ad, bm, dk[j]);
                }
            }
            // … and the tile's dq = dS·K, block by block, into xs.
            for (int blk = warp; blk < (BR / 16) * (HD / 16); blk += G::WARPS) {
                const int i = blk / (HD / 16), j = blk % (HD / 16);
                acc_t acc;
                fill_fragment(acc, 0.0f);
#pragma unroll
                for (int kk = 0; kk < KB; kk++) {
                    if (k0 + 16 * kk > q0 + 16 * i + 15) break; // this key block and the later ones are masked
                    fragment<matrix_a, 16, 16, 16, fa_bf16, col_major> a;
                    fragment<matrix_b, 16, 16, 16, fa_bf16, row_major> bk;
                    load_matrix_sync(a, dst + 16 * kk * LDT + 16 * i, LDT);
                    load_matrix_sync(bk, ks + 16 * kk * LDH + 16 * j, LDH);
                    mma_sync(acc, a, bk, acc);
                }
                store_matrix_sync(xs + 16 * i * LDO + 16 * j, acc, LDO, mem_row_major);
            }
            __syncthreads();

            // (3) dq += the tile's share, for the rows that see a key of the tile.
            for (int e = tid; e < BR * HD; e += G::THREADS) {
                const int r = e / HD, c = e - r * HD;
                const int t = q0 + r;
                if (t >= k0 && t < T) atomicAdd(&dqbase[(long long)t * dqld + c], xs[r * LDO + c]);
            }
        }
    }

    // dk and dv, each block through the warp's scratch.
    __syncthreads(); // xs is no longer read as dq
#pragma unroll
    for (int j = 0; j < HW / 16; j++) {
#pragma unroll
        for (int w = 0; w < 2; w++) {
            store_matrix_sync(wscr, w == 0 ? dk[j] : dv[j], LDW, mem_row_major);
            __syncwarp();
            const long long ofs = (w == 0 ? kofs : vofs) + c0 + 16 * j;
            for (int e = lane; e < 256; e += 32) {
                const int kr = e >> 4, c = e & 15;
                const int t = key0 + kr;
                if (t < T) stx(dqkv, row0 + (long long)t * ld3 + ofs + c, wscr[kr * LDW + c], BF(bf, 0));
            }
            __syncwarp();
        }
    }
#endif
}

// FA_FORWARD and FA_BACKWARD stamp out the kernels of head size HD on
// BR×BC tiles (variants.go's sizes; flashattention.go chooses).
#define FA_FORWARD(HD, BR, BC)                                                                                 \
    extern "C" __global__ void __launch_bounds__(2 * BR) flash_attn_forward_hs##HD##_q##BR##k##BC(       \
        void* out, float* lse, const void* qkv, int T, int NH, int NKV, float scale, int bf) {                 \
        fa_forward<HD, BR, BC>(out, lse, qkv, T, NH, NKV, scale, bf);                                          \
    }
#define FA_BACKWARD(HD, BR, BC)                                                                                \
    extern "C" __global__ void __launch_bounds__(256) flash_attn_backward_hs##HD##_q##BR##k##BC(         \
        void* dqkv, const void* dout, const void* qkv, const float* lse, const float* delta, int T, int NH,   \
        int NKV, float scale, float* dqacc, long long dqld, int bf) {                                          \
        fa_backward<HD, BR, BC>(dqkv, dout, qkv, lse, delta, T, NH, NKV, scale, dqacc, dqld, bf);              \
    }

FA_FORWARD(64, 128, 64)
FA_FORWARD(128, 128, 64)
FA_BACKWARD(64, 64, 64)
FA_BACKWARD(128, 64, 64)
FA_BACKWARD(128, 32, 64)

// The bytes flashattention.go's FlashForwardShared and FlashBackwardShared
// give (and its comment lists): the launch must ask for what the kernel uses.
static_assert(FaFwd<64, 128, 64>::SHARED == 36864 && FaFwd<128, 128, 64>::SHARED == 69632,
              "flashattention.go's FlashForwardShared");
static_assert(FaBwd<64, 64, 64>::SHARED == 76288 && FaBwd<128, 64, 64>::SHARED == 122368 &&
                  FaBwd<128, 32, 64>::SHARED == 83200,
              "flashattention.go's FlashBackwardShared");

// flash_attn_prep: delta (B,NH,T) = rowsum(dout∘out) per query row
// and head, and the float32 dq accumulator zeroed (the backward kernel adds
// into it): dqkv's query heads (dqld its row stride) when dqkv is float32,
// else a buffer of (N, NH·hs). A warp per (position n = b·T + t, head h),
// grid-stride; block 256. N = B·T. bf: dout, out.
extern "C" __global__ void flash_attn_prep(float* delta, float* dqacc, long long dqld, const void* dout,
                                           const void* out, int N, int T, int NH, int NKV, int hs, int bf) {
    const long long C = (long long)NH * hs;
    const int lane = threadIdx.x & 31;
    const long long warps = (long long)gridDim.x * (blockDim.x >> 5);
    for (long long w = (long long)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5); w < (long long)N * NH;
         w += warps) {
        const long long n = w / NH;
        const int h = (int)(w - n * NH);
        const long long g = n * C + (long long)h * hs; // elements of dout and out
        float* dq = dqacc + n * dqld + (long long)h * hs;
        float d = 0.0f;
        for (int c = lane; c < hs; c += 32) {
            d += ldx(dout, g + c, BF(bf, 0)) * ldx(out, g + c, BF(bf, 1));
            dq[c] = 0.0f;
        }
        d = warp_sum(d);
        if (lane == 0) {
            const long long b = n / T, t = n - b * T;
            delta[(b * NH + h) * T + t] = d;
        }
    }
}

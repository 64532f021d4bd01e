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
// products QKᵀ, PV, K·Qᵀ, V·dOᵀ, Pᵀ·dO, dSᵀ·Q and dS·K run on tensor cores
// (mma.m16n8k16, bf16 with fp32 accumulation); P and dS are rounded to bf16
// as the first operand of a product. The softmax (scale, mask, running
// max, exponentials, row sums), lse, delta = rowsum(dO∘O), the rescaling
// of the output and every accumulator stay fp32; dq is summed over key
// tiles in fp32 with atomics, dk and dv over query tiles and a group's
// query heads in tensor-core accumulators. Errors are therefore bf16's (a
// few 1e-3 relative), not fp32's: kernels/cuda/flashattention_test.go
// measures them.
//
// Forward, flash_attn_forward_hs<HD>_q<BR>k<BC>: grid (NH, B, ⌈T/BR⌉),
// block 2·BR threads (a warp per 16 query rows), dynamic shared memory
// FaFwd<HD,BR,BC>::SHARED bytes. Block z takes query tile ⌈T/BR⌉−1−z (the
// longest rows first). The q tile is loaded once (each warp keeps its rows
// as A fragments); for each key tile up to the diagonal (later ones are
// skipped: causal) the block loads k and v, and each warp, on its own 16
// rows and in registers: S = Q·Kᵀ (key blocks wholly past the warp's last
// row skipped), the online softmax (the running max of a row shared by the
// four lanes that hold it, each lane's share of the row sums, the output
// rescaled), P to bf16 A fragments, O += P·V. Warps share only the tiles.
//
// Backward, flash_attn_backward_hs<HD>_q<BR>k<BC>: grid (NKV, B, ⌈T/BC⌉),
// block 2·BC threads (a warp per 16 keys), FaBwd<HD,BR,BC>::SHARED bytes.
// Block (x, z) owns key tile z of key/value head x: k and v in shared
// memory, each warp's dk and dv in registers. For each query head of the
// group, each query tile from the diagonal on: load q and dout (bf16), lse
// and delta; (1) each warp computes Sᵀ = K·Qᵀ and dPᵀ = V·dOᵀ on its keys,
// (2) from them Pᵀ = exp(Sᵀ·scale − lse) and dSᵀ = Pᵀ∘(dPᵀ − delta)·scale
// (masked: 0) as bf16 A fragments, dSᵀ also into shared memory, (3) dv +=
// Pᵀ·dO, dk += dSᵀ·Q; then (4) each warp takes 16 query rows of the tile:
// dq = dS·K over the block's keys, added to the float32 dq accumulator
// with atomics. dk and dv are written once at the end. flash_attn_prep
// runs first: delta = rowsum(dout∘out) (B,NH,T) into a scratch buffer, and
// dq zeroed.
//
// Tensor cores and copies: PTX's
// mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 and
// ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16, whose fragments are laid
// out lane by lane in the PTX ISA, so the kernels compute on their
// elements (fa_mma, fa_ldsm_t below), and cp.async for the tiles (fa_cp,
// fa_cp_commit, fa_cp_wait). They need sm_80; below it the kernels
// compile to nothing and are never launched (the backend selects them
// only with bf16 GEMMs, which need sm_80). The emulator
// (emu/src/cuda_emu.h) runs the same instructions as
// emu_mma_m16n8k16_bf16, emu_ldmatrix_x4 and emu_cp_async*, with those
// layouts and cp.async's two extremes of timing.

#define FA_NEG (-3.0e38f) // a masked score: exp(FA_NEG − m) is 0
#define FA_LOG2E 1.4426950408889634f // log₂ e: natural-log units to log₂ units
#define FA_LN2 0.6931471805599453f   // ln 2: back

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
#else  // the emulator: cuda_emu.h's __nv_bfloat16
#define FA_TC 1
typedef __nv_bfloat16 fa_bf16;
__device__ __forceinline__ fa_bf16 fa_to_bf16(float f) { return __float2bfloat16(f); }
#endif

// fa_round rounds a region of shared memory up to 128 bytes, so every
// region starts 128-byte aligned.
__host__ __device__ constexpr int fa_round(int n) { return (n + 127) / 128 * 128; }

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
    // The next key tile's k and v are copied in during the current one
    // (STAGES 2) where both fit 96 KiB (hs 64), else one at a time.
    static constexpr int STAGES = Q_BYTES + 4 * KV_BYTES <= 96 * 1024 ? 2 : 1;
    static constexpr int SHARED = Q_BYTES + STAGES * 2 * KV_BYTES;
};

// FaBwd is the backward kernel's shape: BC keys a block (16 a warp)
// against BR = BC query rows at a time, head size HD. The k, v, q and dout
// tiles are bf16 rows padded as FaFwd's; dSᵀ is bf16 (a row per key,
// padded by 8); lse and delta a float per query row. The q, dout, lse and
// delta of the next query tile are copied in while the block works on the
// current one (STAGES 2) where both fit 96 KiB, the least any device with
// bf16 tensor cores has (hs 64); else (hs 128) one at a time (STAGES 1).
// kernels/cuda/flashattention.go's FlashBackwardShared is SHARED.
template <int HD, int BR, int BC>
struct FaBwd {
    static_assert(HD % 16 == 0 && BC % 16 == 0 && BR == BC, "tile shape");
    static constexpr int WARPS = BC / 16, THREADS = 32 * WARPS;
    static constexpr int LDH = HD + 8; // bf16 rows of k, v, q, dout
    static constexpr int LDT = BR + 8; // bf16 rows of dSᵀ (a row per key)
    static constexpr int KV_BYTES = fa_round(BC * LDH * 2);
    static constexpr int QD_BYTES = fa_round(BR * LDH * 2);
    static constexpr int T_BYTES = fa_round(BC * LDT * 2);
    static constexpr int ROW_BYTES = fa_round(BR * 4);
    static constexpr int STAGE_BYTES = 2 * QD_BYTES + 2 * ROW_BYTES; // q, dout, lse, delta
    static constexpr int STAGES = 2 * KV_BYTES + 2 * STAGE_BYTES + T_BYTES <= 96 * 1024 ? 2 : 1;
    static constexpr int SHARED = 2 * KV_BYTES + STAGES * STAGE_BYTES + T_BYTES;
};

#if defined(__CUDACC_RTC__) && FA_TC
// fa_saddr is p's address in the shared-memory window, as the PTX
// instructions that name shared memory (.shared) take it.
__device__ __forceinline__ unsigned fa_saddr(const void* p) {
    unsigned long long a;
    asm("cvta.to.shared.u64 %0, %1;" : "=l"(a) : "l"(p));
    return (unsigned)a;
}
#endif

// fa_cp<N> copies N (4 or 16) bytes from global to shared memory
// asynchronously (cp.async.ca, .cg for 16; sm_80); fa_cp_commit closes
// the thread's group of copies, and fa_cp_wait<N> waits until all but the
// newest N of its groups have landed (a __syncthreads after it makes every
// thread's visible). The emulator's emu_cp_async* are the same.
template <int N>
__device__ __forceinline__ void fa_cp(void* dst, const void* src) {
    static_assert(N == 4 || N == 16, "cp.async of 4 or 16 bytes");
#if defined(__CUDACC_RTC__)
#if FA_TC
    if (N == 16)
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(fa_saddr(dst)), "l"(src) : "memory");
    else
        asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"(fa_saddr(dst)), "l"(src) : "memory");
#endif
#else
    emu_cp_async(dst, src, N);
#endif
}

__device__ __forceinline__ void fa_cp_commit() {
#if defined(__CUDACC_RTC__)
#if FA_TC
    asm volatile("cp.async.commit_group;" ::: "memory");
#endif
#else
    emu_cp_async_commit();
#endif
}

template <int N>
__device__ __forceinline__ void fa_cp_wait() {
#if defined(__CUDACC_RTC__)
#if FA_TC
    asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
#endif
#else
    emu_cp_async_wait(N);
#endif
}

// fa_tile_async rounds rows r0 … r0+ROWS−1 of one head (HD elements from
// element at of src, row stride ld; float32, or bfloat16 when bf, which
// rounding leaves as they are) to bf16 into a shared tile of stride LDH;
// rows at or past T are zeros. bf16 rows that start 16-byte aligned are
// copied with fa_cp<16>, in the thread's open group of copies (the caller
// commits and waits); the rest is stored at once.
template <int ROWS, int HD, int LDH, int THREADS>
__device__ __forceinline__ void fa_tile_async(fa_bf16* dst, const void* __restrict__ src, long long at, int bf,
                                              long long ld, int r0, int T) {
    if (bf && (((unsigned long long)src + 2ull * (unsigned long long)at) & 15) == 0 && (ld & 7) == 0) {
        constexpr int V = HD / 8; // 16-byte pieces a row
        const bf16_t* s = reinterpret_cast<const bf16_t*>(src) + at;
        for (int i = threadIdx.x; i < ROWS * V; i += THREADS) {
            const int r = i / V, c = i - r * V;
            const int t = r0 + r;
            if (t < T)
                fa_cp<16>(dst + r * LDH + 8 * c, s + (long long)t * ld + 8 * c);
            else
                *reinterpret_cast<uint4*>(dst + r * LDH + 8 * c) = uint4{0u, 0u, 0u, 0u};
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

// fa_ldsm_t is ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16: lane
// 8m + i gives row i of 8×8 matrix m (16 bytes of shared memory, 16-byte
// aligned), and lane 4g + t gets in r[m] rows 2t and 2t+1 of its column
// g, the lower row in the lower half: an mma fragment register of the
// matrix's transpose. The emulator's emu_ldmatrix_x4 is the same.
__device__ __forceinline__ void fa_ldsm_t(unsigned (&r)[4], const fa_bf16* row) {
#if defined(__CUDACC_RTC__)
#if FA_TC
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(fa_saddr(row)));
#endif
#else
    emu_ldmatrix_x4(r, row, true);
#endif
}

// fa_ldsm_b reads the B fragments of the 16×16 block at p of a row-major
// bf16 tile of row stride LD whose rows are the mma's k and columns its n:
// b[0], b[1] for columns 0-7, b[2], b[3] for columns 8-15.
template <int LD>
__device__ __forceinline__ void fa_ldsm_b(unsigned (&b)[4], const fa_bf16* p) {
    const int lane = threadIdx.x & 31, m = lane >> 3;
    fa_ldsm_t(b, p + ((m & 1) * 8 + (lane & 7)) * LD + (m >> 1) * 8);
}

// fa_ldsm_a reads the A fragment of the transpose of the 16×16 block at p
// of a row-major bf16 tile of row stride LD whose rows are the mma's k and
// columns its m.
template <int LD>
__device__ __forceinline__ void fa_ldsm_a(unsigned (&a)[4], const fa_bf16* p) {
    const int lane = threadIdx.x & 31, m = lane >> 3;
    fa_ldsm_t(a, p + ((m >> 1) * 8 + (lane & 7)) * LD + (m & 1) * 8);
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

// fa_mma_b adds a times the two 8-column halves of the 16×16 block at p
// (fa_ldsm_b's) into d0 (columns 0-7) and d1 (columns 8-15).
template <int LD>
__device__ __forceinline__ void fa_mma_b(float (&d0)[4], float (&d1)[4], const unsigned (&a)[4], const fa_bf16* p) {
    unsigned b[4];
    fa_ldsm_b<LD>(b, p);
    fa_mma(d0, a, b[0], b[1]);
    fa_mma(d1, a, b[2], b[3]);
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
    char* stage0 = reinterpret_cast<char*>(fa_smem) + G::Q_BYTES; // STAGES of k, v

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
    const float sl2 = scale * FA_LOG2E; // scores to log2 units

    fa_tile_async<BR, HD, LDH, G::THREADS>(qs, qkv, qbase, qb, ld3, q0, T);
    fa_tile_async<BC, HD, LDH, G::THREADS>(reinterpret_cast<fa_bf16*>(stage0), qkv, kbase, qb, ld3, 0, T);
    fa_tile_async<BC, HD, LDH, G::THREADS>(reinterpret_cast<fa_bf16*>(stage0 + G::KV_BYTES), qkv, vbase, qb, ld3, 0,
                                           T);
    fa_cp_commit();
    fa_cp_wait<0>();
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
        if (kt > 0) __syncthreads(); // every warp is done with tile kt−1's stage
        const int next = G::STAGES == 2 ? kt + 1 : kt; // the tile whose copies start now (tile 0's are in)
        if (next > 0 && next <= klast) {
            char* st = stage0 + (next % G::STAGES) * 2 * G::KV_BYTES;
            fa_tile_async<BC, HD, LDH, G::THREADS>(reinterpret_cast<fa_bf16*>(st), qkv, kbase, qb, ld3, next * BC, T);
            fa_tile_async<BC, HD, LDH, G::THREADS>(reinterpret_cast<fa_bf16*>(st + G::KV_BYTES), qkv, vbase, qb, ld3,
                                                   next * BC, T);
        }
        fa_cp_commit(); // perhaps empty: one group a tile
        if (G::STAGES == 2)
            fa_cp_wait<1>(); // this thread's copies of tile kt are in
        else
            fa_cp_wait<0>();
        __syncthreads(); // and every thread's
        const fa_bf16* ks = reinterpret_cast<const fa_bf16*>(stage0 + (kt % G::STAGES) * 2 * G::KV_BYTES);
        const fa_bf16* vs = ks + G::KV_BYTES / 2;
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

        // O += P·V (B = V[keys][columns], by ldmatrix.trans).
#pragma unroll
        for (int kk = 0; kk < NJ / 2; kk++) {
            if (k0 + 16 * kk > rlast) continue; // probabilities all 0
#pragma unroll
            for (int d = 0; d < ND; d += 2) fa_mma_b<LDH>(o[d], o[d + 1], pf[kk], vs + 16 * kk * LDH + 8 * d);
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
        if (tg == 0) lse[((long long)b * NH + h) * T + t] = ((half ? m1 : m0) + log2f(l)) * FA_LN2;
    }
#endif
}

// fa_bwd_issue starts the copies of iteration it of fa_backward (query
// head h0 + it / per, query tile qfirst + it % per) into the stage at st:
// q and dout (bf16 tiles), lse and delta (a float a row; 0 past T).
template <class G>
__device__ __forceinline__ void fa_bwd_issue(char* st, int it, const void* __restrict__ qkv,
                                             const void* __restrict__ dout, const float* __restrict__ lse,
                                             const float* __restrict__ delta, int T, int NH, int h0, int qfirst,
                                             int per, long long row0, int b, long long C, long long ld3, int qb, int gb) {
    constexpr int HD = G::LDH - 8, BR = G::WARPS * 16;
    const int h = h0 + it / per, q0 = (qfirst + it % per) * BR;
    fa_tile_async<BR, HD, G::LDH, G::THREADS>(reinterpret_cast<fa_bf16*>(st), qkv, row0 + (long long)h * HD, qb, ld3,
                                              q0, T);
    fa_tile_async<BR, HD, G::LDH, G::THREADS>(reinterpret_cast<fa_bf16*>(st + G::QD_BYTES), dout,
                                              (long long)b * T * C + (long long)h * HD, gb, C, q0, T);
    float* lrow = reinterpret_cast<float*>(st + 2 * G::QD_BYTES);
    float* drow = reinterpret_cast<float*>(st + 2 * G::QD_BYTES + G::ROW_BYTES);
    const long long at = ((long long)b * NH + h) * T;
    for (int r = threadIdx.x; r < BR; r += G::THREADS) {
        const int t = q0 + r;
        if (t < T) {
            fa_cp<4>(lrow + r, lse + at + t);
            fa_cp<4>(drow + r, delta + at + t);
        } else {
            lrow[r] = drow[r] = 0.0f;
        }
    }
}

// fa_backward: see the file's comment. Warp w owns keys 16w … 16w+15 of
// the block's tile: lane 4g+t holds keys g and g+8 of its Sᵀ, dPᵀ, Pᵀ and
// dSᵀ (query columns 8j+2t, 8j+2t+1 of query block j) and of its dk and dv
// (head columns 8d+2t, 8d+2t+1), all in PTX's accumulator layout; Pᵀ and
// dSᵀ go from there into the A fragments of Pᵀ·dO and dSᵀ·Q. dSᵀ is also
// stored to shared memory, and warp w then takes the tile's query rows
// 16w … 16w+15 for dq = dS·K over the block's keys (dS's A fragments and
// K's B fragments by ldmatrix.trans), added to dqacc with atomics.
template <int HD, int BR, int BC>
__device__ __forceinline__ void fa_backward(void* __restrict__ dqkv, const void* __restrict__ dout,
                                            const void* __restrict__ qkv, const float* __restrict__ lse,
                                            const float* __restrict__ delta, int T, int NH, int NKV, float scale,
                                            float* __restrict__ dqacc, long long dqld, int bf) {
#if FA_TC
    typedef FaBwd<HD, BR, BC> G;
    constexpr int LDH = G::LDH, LDT = G::LDT, NJ = BR / 8, ND = HD / 8, NK = HD / 16;
    extern __shared__ __align__(128) float fa_smem[];
    char* base = reinterpret_cast<char*>(fa_smem);
    fa_bf16* ks = reinterpret_cast<fa_bf16*>(base);
    fa_bf16* vs = reinterpret_cast<fa_bf16*>(base + G::KV_BYTES);
    fa_bf16* dst = reinterpret_cast<fa_bf16*>(base + 2 * G::KV_BYTES);
    char* stage0 = base + 2 * G::KV_BYTES + G::T_BYTES; // then STAGES of q, dout, lse, delta

    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int g = lane >> 2, tg = lane & 3;
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
    const float sl2 = scale * FA_LOG2E; // scores to log2 units

    const int kw = k0 + 16 * warp;     // the warp's first key
    const int kr0 = kw + g, kr1 = kr0 + 8; // the lane's two keys

    // Iteration it is query head kvh·group + it / per, query tile
    // qfirst + it % per; its q, dout, lse and delta go to stage it % STAGES.
    const int per = nt - qfirst, iters = group * per;
    fa_tile_async<BC, HD, LDH, G::THREADS>(ks, qkv, row0 + kofs, qb, ld3, k0, T);
    fa_tile_async<BC, HD, LDH, G::THREADS>(vs, qkv, row0 + vofs, qb, ld3, k0, T);
    fa_bwd_issue<G>(stage0, 0, qkv, dout, lse, delta, T, NH, kvh * group, qfirst, per, row0, b, C, ld3, qb, BF(bf, 1));
    fa_cp_commit();

    float dk[ND][4], dv[ND][4];
#pragma unroll
    for (int d = 0; d < ND; d++)
#pragma unroll
        for (int i = 0; i < 4; i++) dk[d][i] = dv[d][i] = 0.0f;

    for (int it = 0; it < iters; it++) {
        const int h = kvh * group + it / per;
        const int q0 = (qfirst + it % per) * BR;
        float* dqbase = dqrow0 + (long long)h * HD;
        char* stage = stage0 + (it % G::STAGES) * G::STAGE_BYTES;
        const fa_bf16* qs = reinterpret_cast<const fa_bf16*>(stage);
        const fa_bf16* gs = reinterpret_cast<const fa_bf16*>(stage + G::QD_BYTES);
        const float* lrow = reinterpret_cast<const float*>(stage + 2 * G::QD_BYTES);
        const float* drow = reinterpret_cast<const float*>(stage + 2 * G::QD_BYTES + G::ROW_BYTES);
        // A stage is read only in (1)-(3), before the barrier ahead of (4):
        // the stage iteration it−1 read can take new copies from here on.
        if (G::STAGES == 2) {
            if (it + 1 < iters)
                fa_bwd_issue<G>(stage0 + ((it + 1) % 2) * G::STAGE_BYTES, it + 1, qkv, dout, lse, delta, T, NH,
                                kvh * group, qfirst, per, row0, b, C, ld3, qb, BF(bf, 1));
            fa_cp_commit();  // empty at the last iteration: the count stays one a tile
            fa_cp_wait<1>(); // this thread's copies of iteration it are in
        } else {
            if (it > 0) {
                fa_bwd_issue<G>(stage0, it, qkv, dout, lse, delta, T, NH, kvh * group, qfirst, per, row0, b, C, ld3,
                                qb, BF(bf, 1));
                fa_cp_commit();
            }
            fa_cp_wait<0>();
        }
        __syncthreads(); // every thread's copies are in, and iteration it−1's (4) is done with dSᵀ

        // (1) Sᵀ = K·Qᵀ and dPᵀ = V·dOᵀ on the warp's keys; query
        // blocks wholly before its first key, or past T, stay 0.
        float s[NJ][4], dp[NJ][4];
#pragma unroll
        for (int j = 0; j < NJ; j++)
#pragma unroll
            for (int i = 0; i < 4; i++) s[j][i] = dp[j][i] = 0.0f;
#pragma unroll
        for (int kk = 0; kk < NK; kk++) {
            unsigned ak[4], av[4];
            const fa_bf16* kp = ks + (16 * warp + g) * LDH + 16 * kk + 2 * tg;
            const fa_bf16* vp = vs + (16 * warp + g) * LDH + 16 * kk + 2 * tg;
            ak[0] = fa_u32(kp), ak[1] = fa_u32(kp + 8 * LDH), ak[2] = fa_u32(kp + 8), ak[3] = fa_u32(kp + 8 * LDH + 8);
            av[0] = fa_u32(vp), av[1] = fa_u32(vp + 8 * LDH), av[2] = fa_u32(vp + 8), av[3] = fa_u32(vp + 8 * LDH + 8);
#pragma unroll
            for (int j = 0; j < NJ; j++) {
                if (q0 + 8 * j + 7 < kw || q0 + 8 * j >= T) continue;
                const fa_bf16* qp = qs + (8 * j + g) * LDH + 16 * kk + 2 * tg;
                const fa_bf16* gp = gs + (8 * j + g) * LDH + 16 * kk + 2 * tg;
                fa_mma(s[j], ak, fa_u32(qp), fa_u32(qp + 8));
                fa_mma(dp[j], av, fa_u32(gp), fa_u32(gp + 8));
            }
        }

        // (2) Pᵀ = exp(Sᵀ·scale − lse) and dSᵀ = Pᵀ∘(dPᵀ − delta)·scale,
        // 0 where the query is before the key or past T; into A
        // fragments (and dSᵀ into shared memory).
        unsigned pf[NJ / 2][4], df[NJ / 2][4];
#pragma unroll
        for (int j = 0; j < NJ; j++) {
            float p[4], ds[4];
#pragma unroll
            for (int i = 0; i < 4; i++) {
                const int qi = 8 * j + 2 * tg + (i & 1), t = q0 + qi;
                const int key = i < 2 ? kr0 : kr1;
                p[i] = t >= key && t < T ? exp2f(s[j][i] * sl2 - lrow[qi] * FA_LOG2E) : 0.0f;
                ds[i] = p[i] * (dp[j][i] - drow[qi]) * scale;
            }
            pf[j / 2][2 * (j & 1)] = fa_pack(p[0], p[1]);
            pf[j / 2][2 * (j & 1) + 1] = fa_pack(p[2], p[3]);
            df[j / 2][2 * (j & 1)] = fa_pack(ds[0], ds[1]);
            df[j / 2][2 * (j & 1) + 1] = fa_pack(ds[2], ds[3]);
            *reinterpret_cast<unsigned*>(dst + (16 * warp + g) * LDT + 8 * j + 2 * tg) = df[j / 2][2 * (j & 1)];
            *reinterpret_cast<unsigned*>(dst + (16 * warp + g + 8) * LDT + 8 * j + 2 * tg) = df[j / 2][2 * (j & 1) + 1];
        }

        // (3) dv += Pᵀ·dO and dk += dSᵀ·Q (B = dO, Q [queries][columns],
        // by ldmatrix.trans), over the query blocks that see a key of the warp.
#pragma unroll
        for (int kk = 0; kk < BR / 16; kk++) {
            if (q0 + 16 * kk + 15 < kw || q0 + 16 * kk >= T) continue;
#pragma unroll
            for (int d = 0; d < ND; d += 2) {
                fa_mma_b<LDH>(dv[d], dv[d + 1], pf[kk], gs + 16 * kk * LDH + 8 * d);
                fa_mma_b<LDH>(dk[d], dk[d + 1], df[kk], qs + 16 * kk * LDH + 8 * d);
            }
        }
        __syncthreads(); // dSᵀ is whole

        // (4) dq += dS·K on the tile's rows 16w … 16w+15 (A = dS, the
        // transpose of dSᵀ, and B = K [keys][columns], by ldmatrix.trans),
        // over the key blocks some of those rows see.
        const int qw = q0 + 16 * warp;
        if (qw < T && qw + 15 >= k0) {
            float dq[ND][4];
#pragma unroll
            for (int d = 0; d < ND; d++) dq[d][0] = dq[d][1] = dq[d][2] = dq[d][3] = 0.0f;
#pragma unroll
            for (int kk = 0; kk < BC / 16; kk++) {
                if (k0 + 16 * kk > qw + 15) break; // this key block and the later ones are masked
                unsigned a[4];
                fa_ldsm_a<LDT>(a, dst + 16 * kk * LDT + 16 * warp);
#pragma unroll
                for (int d = 0; d < ND; d += 2) fa_mma_b<LDH>(dq[d], dq[d + 1], a, ks + 16 * kk * LDH + 8 * d);
            }
#pragma unroll
            for (int half = 0; half < 2; half++) {
                const int t = qw + g + 8 * half;
                if (t >= T) continue;
                float* dqr = dqbase + (long long)t * dqld + 2 * tg;
#pragma unroll
                for (int d = 0; d < ND; d++) {
                    atomicAdd(dqr + 8 * d, dq[d][2 * half]);
                    atomicAdd(dqr + 8 * d + 1, dq[d][2 * half + 1]);
                }
            }
        }
    }

    // dk and dv of the lane's two keys.
#pragma unroll
    for (int half = 0; half < 2; half++) {
        const int t = half ? kr1 : kr0;
        if (t >= T) continue;
        const long long r = row0 + (long long)t * ld3 + 2 * tg;
#pragma unroll
        for (int d = 0; d < ND; d++) {
#pragma unroll
            for (int e = 0; e < 2; e++) {
                stx(dqkv, r + kofs + 8 * d + e, dk[d][2 * half + e], BF(bf, 0));
                stx(dqkv, r + vofs + 8 * d + e, dv[d][2 * half + e], BF(bf, 0));
            }
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
    extern "C" __global__ void __launch_bounds__(2 * BC) flash_attn_backward_hs##HD##_q##BR##k##BC(      \
        void* dqkv, const void* dout, const void* qkv, const float* lse, const float* delta, int T, int NH,   \
        int NKV, float scale, float* dqacc, long long dqld, int bf) {                                          \
        fa_backward<HD, BR, BC>(dqkv, dout, qkv, lse, delta, T, NH, NKV, scale, dqacc, dqld, bf);              \
    }

FA_FORWARD(64, 128, 64)
FA_FORWARD(128, 128, 64)
FA_BACKWARD(64, 64, 64)
FA_BACKWARD(128, 64, 64)

// The bytes flashattention.go's FlashForwardShared and FlashBackwardShared
// give (and its comment lists): the launch must ask for what the kernel uses.
static_assert(FaFwd<64, 128, 64>::SHARED == 55296 && FaFwd<64, 128, 64>::STAGES == 2 &&
                  FaFwd<128, 128, 64>::SHARED == 69632 && FaFwd<128, 128, 64>::STAGES == 1,
              "flashattention.go's FlashForwardShared");
static_assert(FaBwd<64, 64, 64>::SHARED == 65536 && FaBwd<64, 64, 64>::STAGES == 2 &&
                  FaBwd<128, 64, 64>::SHARED == 79360 && FaBwd<128, 64, 64>::STAGES == 1,
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

/* ── short-sequence tensor-core attention (Skv <= KMAX) ───────────────────
 * For encoder shapes (BERT / MiniLM: at most a few hundred keys, head_dim 32 or 64) the keys of one (batch, head)
 * fit in shared memory whole. rlx_attn_fa loads a K/V tile, computes, waits at a barrier, loads the next tile:
 * each block pays the global-memory latency once per tile with nothing in flight. Here every load of a block
 * (its Q rows, all of K and V, the key mask) is issued at once with cp.async, one wait and one barrier follow,
 * and the warps then run the same FlashAttention-2 register math as rlx_attn_fa over 64-key chunks with no
 * further barrier. A block has 1..8 warps (16 query rows each, chosen by the host from the grid size), so at
 * large batch one block covers up to 128 queries of a head and K/V are read from L2 once per block.
 * Needs: D a multiple of 16 (<= 64), 16-byte aligned rows (the VEC case of rlx_attn_fa), f16 or bf16.
 * Uses RlxAttn, RlxMma, rlx_ld32, rlx_ldmatrix_x2_trans and rlx_attn_block from attention.cuh. */

/* The key rows rlx_attn_short2's warps read for keys [0, kv_end): the key count its warp code is compiled for
 * (16, 32, 64 or KMAX), zero rows masked. */
template <int KMAX>
__device__ __forceinline__ int rlx_short_nk(int64_t kv_end) {
    return kv_end <= 16 ? 16 : kv_end <= 32 ? 32 : kv_end <= 64 ? 64 : KMAX;
}

template <int D, int KMAX> struct RlxShortSmem {
    static constexpr int LDK = D + 8; /* halves per row: conflict-free fragment and ldmatrix loads */
    static constexpr size_t k_off = 0;
    static constexpr size_t v_off = k_off + (size_t)KMAX * LDK * 2;
    static constexpr size_t m_off = v_off + (size_t)KMAX * LDK * 2;
    static constexpr size_t q_off = m_off + (size_t)KMAX * 4;
    /* bytes for a block of nw warps (16 query rows each) */
    static __host__ __device__ constexpr size_t total(int nw) { return q_off + (size_t)16 * nw * LDK * 2; }
};

__device__ __forceinline__ void rlx_cp_async16(void *smem, const void *gmem) {
    const uint32_t s = (uint32_t)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(s), "l"(gmem));
}

/* rows [r0, r0 + rows) of a [*, D] matrix with row stride rs into smem rows of D + 8 elements, 16 bytes per
 * copy, asynchronously (cp.async); rows at or past rmax are zero-filled with plain stores. */
template <typename T, int D>
__device__ __forceinline__ void rlx_short_rows(T *dst, const T *src, int64_t rs, int64_t r0, int64_t rmax, int rows) {
    constexpr int LD = D + 8, CHUNKS = D / 8;
    for (int e = threadIdx.x; e < rows * CHUNKS; e += blockDim.x) {
        const int r = e / CHUNKS, c = (e % CHUNKS) * 8;
        T *d = dst + r * LD + c;
        if (r0 + r < rmax) rlx_cp_async16(d, src + (r0 + r) * rs + c);
        else *reinterpret_cast<int4 *>(d) = make_int4(0, 0, 0, 0);
    }
}

/* The additive key mask of a block (0 or -inf per key, into madd_s) and whether a key the warps read (< nk) is
 * hidden. `pre`: thread t's own key-mask value is already in `mv` (blocks of >= KMAX threads: one key each). */
template <typename MT, int MASK, int KMAX>
__device__ __forceinline__ int rlx_short_key_mask(float *madd_s, const MT *mask, int64_t b, int64_t Skv, int nk,
                                                  bool pre, MT mv) {
    int masked = 0;
    for (int t = threadIdx.x; t < KMAX; t += blockDim.x) {
        bool ok = t < Skv;
        if (MASK == RLX_MASK_PADDING && ok) ok = rlx_f(pre ? mv : mask[b * Skv + t]) != 0;
        madd_s[t] = ok ? 0.f : -INFINITY;
        masked |= !ok && t < nk;
    }
    return masked;
}

template <typename T, typename MT, int D, int MASK, int KMAX>
__global__ void __launch_bounds__(256, D <= 32 ? 3 : 1) rlx_attn_short(const T *__restrict__ q, const T *__restrict__ k,
                                                                      const T *__restrict__ v, const MT *__restrict__ mask,
                                                                      T *__restrict__ out, RlxAttn p) {
    typedef RlxShortSmem<D, KMAX> L;
    typedef RlxMma<T> MMA;
    constexpr int BK = 64; /* keys per chunk of the online softmax: 32 score registers per thread */
    static_assert(D % 16 == 0 && D <= 64 && KMAX % BK == 0, "rlx_attn_short: D % 16 == 0, D <= 64, KMAX % 64 == 0");
    extern __shared__ __align__(128) unsigned char rlx_smem_short[];
    T *k_s = reinterpret_cast<T *>(rlx_smem_short + L::k_off);
    T *v_s = reinterpret_cast<T *>(rlx_smem_short + L::v_off);
    float *madd_s = reinterpret_cast<float *>(rlx_smem_short + L::m_off);
    T *q_s = reinterpret_cast<T *>(rlx_smem_short + L::q_off);

    const int nw = blockDim.x >> 5;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int g = lane >> 2, tq = lane & 3; /* fragment row group and column pair */
    const int h = blockIdx.y;
    const int64_t b = blockIdx.z;
    const int64_t q0 = (int64_t)blockIdx.x * (16 * nw);
    const RlxAttnBlock<T> blk = rlx_attn_block<T, D, MASK>(p, q, k, v, b, h, q0, 16 * nw);
    const T *qb = blk.qb, *kb = blk.kb, *vb = blk.vb;
    const int64_t kv_end = blk.kv_end; /* <= Skv <= KMAX */
    const int kv_rows = (int)((kv_end + 15) / 16 * 16);     /* rows the mma loops read */
    rlx_pdl_trigger(); rlx_pdl_wait(); /* may start early (rlx_launch_pdl): wait before touching data */
    /* Everything the block reads, in flight at once. */
    rlx_short_rows<T, D>(q_s, qb, p.q_rs, q0, p.Sq, 16 * nw);
    rlx_short_rows<T, D>(k_s, kb, p.kv_rs, 0, p.Skv, kv_rows);
    rlx_short_rows<T, D>(v_s, vb, p.v_rs, 0, p.Skv, kv_rows);
    rlx_short_key_mask<MT, MASK, KMAX>(madd_s, mask, b, p.Skv, kv_rows, false, MT(0));
    asm volatile("cp.async.wait_all;\n" ::);
    __syncthreads();
    if (q0 + warp * 16 >= p.Sq) return; /* no barrier follows */

    uint32_t qa[D / 16][4];
    const T *qw = q_s + warp * 16 * L::LDK;
#pragma unroll
    for (int kt = 0; kt < D / 16; ++kt) {
        qa[kt][0] = rlx_ld32(qw + g * L::LDK + kt * 16 + tq * 2);
        qa[kt][1] = rlx_ld32(qw + (g + 8) * L::LDK + kt * 16 + tq * 2);
        qa[kt][2] = rlx_ld32(qw + g * L::LDK + kt * 16 + 8 + tq * 2);
        qa[kt][3] = rlx_ld32(qw + (g + 8) * L::LDK + kt * 16 + 8 + tq * 2);
    }
    float o[D / 8][4];
#pragma unroll
    for (int dt = 0; dt < D / 8; ++dt) o[dt][0] = o[dt][1] = o[dt][2] = o[dt][3] = 0.f;
    float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.f, l1 = 0.f;
    const int64_t i0 = q0 + warp * 16 + g, i1 = i0 + 8;
    const float sl2 = p.scale * 1.4426950408889634f; /* scores in log2 units: exp2f below */

    for (int j0 = 0; j0 < kv_rows; j0 += BK) {
        const int rows = kv_rows - j0 < BK ? kv_rows - j0 : BK;
        float s[BK / 8][4];
#pragma unroll
        for (int nt = 0; nt < BK / 8; ++nt) {
            s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.f;
            if (nt * 8 >= rows) continue; /* past the keys: masked below */
            const T *kr = k_s + (j0 + nt * 8 + g) * L::LDK + tq * 2;
#pragma unroll
            for (int kt = 0; kt < D / 16; ++kt) MMA::mma(s[nt], qa[kt], rlx_ld32(kr + kt * 16), rlx_ld32(kr + kt * 16 + 8));
        }
        float mx0 = -INFINITY, mx1 = -INFINITY;
#pragma unroll
        for (int nt = 0; nt < BK / 8; ++nt) {
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                const int col = j0 + nt * 8 + tq * 2 + e;
                const int64_t key = col;
                const float ad = madd_s[col];
                float a0 = s[nt][e] * sl2 + ad, a1 = s[nt][2 + e] * sl2 + ad;
                if (MASK == RLX_MASK_CAUSAL) {
                    if (key > i0 + p.causal_off) a0 = -INFINITY;
                    if (key > i1 + p.causal_off) a1 = -INFINITY;
                }
                if (MASK == RLX_MASK_BIAS && key < p.Skv) {
                    const MT *bb = mask + b * p.bs_b + (int64_t)h * p.bs_h + key * p.bs_k;
                    if (i0 < p.Sq) a0 += rlx_f(bb[i0 * p.bs_q]) * 1.4426950408889634f;
                    if (i1 < p.Sq) a1 += rlx_f(bb[i1 * p.bs_q]) * 1.4426950408889634f;
                }
                s[nt][e] = a0;
                s[nt][2 + e] = a1;
                mx0 = rlx_max(mx0, a0);
                mx1 = rlx_max(mx1, a1);
            }
        }
#pragma unroll
        for (int off = 1; off <= 2; off <<= 1) {
            mx0 = rlx_max(mx0, __shfl_xor_sync(0xffffffffu, mx0, off));
            mx1 = rlx_max(mx1, __shfl_xor_sync(0xffffffffu, mx1, off));
        }
        const float mn0 = rlx_max(m0, mx0), mn1 = rlx_max(m1, mx1);
        const float al0 = (m0 == -INFINITY) ? 0.f : exp2f(m0 - mn0);
        const float al1 = (m1 == -INFINITY) ? 0.f : exp2f(m1 - mn1);
        float sum0 = 0.f, sum1 = 0.f;
#pragma unroll
        for (int nt = 0; nt < BK / 8; ++nt) {
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                const float p0 = s[nt][e] == -INFINITY ? 0.f : exp2f(s[nt][e] - mn0);
                const float p1 = s[nt][2 + e] == -INFINITY ? 0.f : exp2f(s[nt][2 + e] - mn1);
                s[nt][e] = p0;
                s[nt][2 + e] = p1;
                sum0 += p0;
                sum1 += p1;
            }
        }
#pragma unroll
        for (int off = 1; off <= 2; off <<= 1) {
            sum0 += __shfl_xor_sync(0xffffffffu, sum0, off);
            sum1 += __shfl_xor_sync(0xffffffffu, sum1, off);
        }
        l0 = l0 * al0 + sum0;
        l1 = l1 * al1 + sum1;
        m0 = mn0;
        m1 = mn1;
        rlx_mma_rescale<D>(o, al0, al1);
#pragma unroll
        for (int kc = 0; kc < BK / 16; ++kc) {
            if (kc * 16 >= rows) break; /* their probabilities are zero */
            uint32_t pa[4];
            pa[0] = MMA::pack(s[2 * kc][0], s[2 * kc][1]);
            pa[1] = MMA::pack(s[2 * kc][2], s[2 * kc][3]);
            pa[2] = MMA::pack(s[2 * kc + 1][0], s[2 * kc + 1][1]);
            pa[3] = MMA::pack(s[2 * kc + 1][2], s[2 * kc + 1][3]);
            const T *vrow = v_s + (j0 + kc * 16 + (lane & 15)) * L::LDK;
#pragma unroll
            for (int dt = 0; dt < D / 8; ++dt) {
                uint32_t b0, b1;
                rlx_ldmatrix_x2_trans(b0, b1, vrow + dt * 8);
                MMA::mma(o[dt], pa, b0, b1);
            }
        }
    }
    const float inv0 = l0 > 0.f ? 1.f / l0 : 0.f, inv1 = l1 > 0.f ? 1.f / l1 : 0.f;
    T *ob = out + b * p.Sq * p.o_rs + (int64_t)h * D + tq * 2;
#pragma unroll
    for (int dt = 0; dt < D / 8; ++dt) {
        if (i0 < p.Sq) *reinterpret_cast<uint32_t *>(ob + i0 * p.o_rs + dt * 8) = MMA::pack(o[dt][0] * inv0, o[dt][1] * inv0);
        if (i1 < p.Sq) *reinterpret_cast<uint32_t *>(ob + i1 * p.o_rs + dt * 8) = MMA::pack(o[dt][2] * inv1, o[dt][3] * inv1);
    }
}

/* ── rlx_attn_short2: the same one-batch load, fewer instructions per score ──────────────────────────────────
 * rlx_attn_short is issue-bound on MiniLM shapes (head_dim 32: a few FLOPs per byte, so the per-score work of
 * the softmax, not the MMAs, sets the time). This kernel keeps its structure (all of K/V and the block's Q rows
 * in shared memory through one cp.async batch, 16 query rows per warp, P from the score registers straight into
 * the P V product) and cuts the instructions around each score:
 *  - the keys a block reads are rounded up to NK = 16, 32, 64 or KMAX (zero rows, masked) and the warp's work
 *    is compiled once per NK: every loop is unrolled with no per-tile bounds checks (those kept 64 score
 *    registers and the loads around them live together and spilled);
 *  - keys in chunks of BK (64 or 128; 128 is one pass with no online rescale), the first chunk's rescale of
 *    zero accumulators folded away;
 *  - key masks (padding, keys past Skv) start the score accumulators at 0 or -inf instead of an add per score;
 *    scores stay raw (the row max of raw scores times the positive scale is the scaled max) and each
 *    probability is one FFMA and one ex2.approx. Causal and bias masks (and a non-positive scale) take the
 *    exact path: scaled scores adjusted one by one, as rlx_attn_short does;
 *  - the row sums of P come from one more MMA per 16 keys (P times a ones tile: the f16/bf16-rounded P that the
 *    P V product uses, summed in f32) instead of an FADD per score and a shuffle reduction;
 *  - Q, K and V fragments through ldmatrix.x4 (four 8x8 tiles per instruction);
 *  - the output staged in the warp's own Q rows of shared memory and stored as 16-byte pieces of rows.
 * Rows with every key masked give zeros, as rlx_attn_short. Needs what rlx_attn_short needs. */

__device__ __forceinline__ void rlx_ldsm_x4(uint32_t (&r)[4], const void *row) {
    const uint32_t a = (uint32_t)__cvta_generic_to_shared(row);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(a));
}
__device__ __forceinline__ void rlx_ldsm_x4_trans(uint32_t (&r)[4], const void *row) {
    const uint32_t a = (uint32_t)__cvta_generic_to_shared(row);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(a));
}
/* 2^x, denormal results flushed to zero (the probabilities end as f16/bf16 anyway); 2^-inf = 0 */
__device__ __forceinline__ float rlx_ex2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}

/* Blocks per SM that the register budget is sized for (launch bounds with 256 threads): the score registers
 * grow with BK, the output and Q fragments with D. */
template <int D, int BK> struct RlxShort2Occ {
    static constexpr int value = D <= 32 ? (BK <= 32 ? 4 : BK <= 64 ? 3 : 2) : (BK <= 64 ? 2 : 1);
};

/* What one warp of rlx_attn_short2 reads besides its template arguments. */
template <typename T, typename MT> struct RlxShort2Warp {
    T *qw;                  /* the warp's 16 Q rows in shared memory; its output is staged there */
    const T *k_s, *v_s;     /* all keys / values of the head, NK rows (zero past Skv) */
    const float *madd_s;    /* 0 or -inf per key */
    const MT *mask;         /* the bias (MASK == RLX_MASK_BIAS) */
    T *out;                 /* the output's (batch, head) base */
    int64_t b, i0;          /* batch; query row of lane group g */
    int h;
    bool keyed, exact;
};

/* One warp's 16 query rows against NK keys (see rlx_attn_short2). */
template <typename T, typename MT, int D, int MASK, int KMAX, int BK, int NK>
__device__ __forceinline__ void rlx_short2_warp(const RlxShort2Warp<T, MT> &w, const RlxAttn &p) {
    typedef RlxShortSmem<D, KMAX> L;
    typedef RlxMma<T> MMA;
    constexpr int CB = BK < NK ? BK : NK; /* keys per chunk */
    const int lane = threadIdx.x & 31, g = lane >> 2, tq = lane & 3;
    uint32_t qa[D / 16][4];
#pragma unroll
    for (int kt = 0; kt < D / 16; ++kt) rlx_ldsm_x4(qa[kt], w.qw + (lane & 15) * L::LDK + kt * 16 + (lane >> 4) * 8);
    float o[D / 8][4], l[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
    for (int dt = 0; dt < D / 8; ++dt) o[dt][0] = o[dt][1] = o[dt][2] = o[dt][3] = 0.f;
    float m0 = -INFINITY, m1 = -INFINITY; /* running row maxima, log2 units */
    const int64_t i0 = w.i0, i1 = i0 + 8;
    const float sl2 = p.scale * 1.4426950408889634f; /* scores in log2 units: ex2 below */
    const float c = w.exact ? 1.f : sl2;              /* the exact path scales while masking */
    const uint32_t ones = MMA::pack(1.f, 1.f);

#pragma unroll
    for (int j0 = 0; j0 < NK; j0 += CB) {
        float s[CB / 8][4];
#pragma unroll
        for (int nt = 0; nt < CB / 8; ++nt) {
            if (w.keyed && !w.exact) { /* 0 or -inf per key: -inf plus a finite product stays -inf */
                const float2 ad = *reinterpret_cast<const float2 *>(w.madd_s + j0 + nt * 8 + tq * 2);
                s[nt][0] = s[nt][2] = ad.x;
                s[nt][1] = s[nt][3] = ad.y;
            } else {
                s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.f;
            }
            if (D % 32 == 0) {
                const T *kr = w.k_s + (j0 + nt * 8 + (lane & 7)) * L::LDK + (lane >> 3) * 8;
#pragma unroll
                for (int kk = 0; kk < D / 32; ++kk) {
                    uint32_t kf[4];
                    rlx_ldsm_x4(kf, kr + kk * 32); /* d 0-7, 8-15, 16-23, 24-31 of 8 keys */
                    MMA::mma(s[nt], qa[2 * kk], kf[0], kf[1]);
                    MMA::mma(s[nt], qa[2 * kk + 1], kf[2], kf[3]);
                }
            } else {
                const T *kq = w.k_s + (j0 + nt * 8 + g) * L::LDK + tq * 2;
#pragma unroll
                for (int kt = 0; kt < D / 16; ++kt) MMA::mma(s[nt], qa[kt], rlx_ld32(kq + kt * 16), rlx_ld32(kq + kt * 16 + 8));
            }
        }
        if (w.exact) {
#pragma unroll
            for (int nt = 0; nt < CB / 8; ++nt) {
#pragma unroll
                for (int e = 0; e < 2; ++e) {
                    const int col = j0 + nt * 8 + tq * 2 + e;
                    const int64_t key = col;
                    const float ad = w.madd_s[col];
                    float a0 = s[nt][e] * sl2 + ad, a1 = s[nt][2 + e] * sl2 + ad;
                    if (MASK == RLX_MASK_CAUSAL) {
                        if (key > i0 + p.causal_off) a0 = -INFINITY;
                        if (key > i1 + p.causal_off) a1 = -INFINITY;
                    }
                    if (MASK == RLX_MASK_BIAS && key < p.Skv) {
                        const MT *bb = w.mask + w.b * p.bs_b + (int64_t)w.h * p.bs_h + key * p.bs_k;
                        if (i0 < p.Sq) a0 += rlx_f(bb[i0 * p.bs_q]) * 1.4426950408889634f;
                        if (i1 < p.Sq) a1 += rlx_f(bb[i1 * p.bs_q]) * 1.4426950408889634f;
                    }
                    s[nt][e] = a0;
                    s[nt][2 + e] = a1;
                }
            }
        }
        float mx0 = -INFINITY, mx1 = -INFINITY;
#pragma unroll
        for (int nt = 0; nt < CB / 8; ++nt) {
            mx0 = fmaxf(mx0, fmaxf(s[nt][0], s[nt][1]));
            mx1 = fmaxf(mx1, fmaxf(s[nt][2], s[nt][3]));
        }
#pragma unroll
        for (int off = 1; off <= 2; off <<= 1) {
            mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, off));
            mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, off));
        }
        /* new maxima in log2 units; -inf (every key so far masked) subtracts as 0 so that ex2 gives 0, not NaN */
        const float mn0 = fmaxf(m0, mx0 * c), mn1 = fmaxf(m1, mx1 * c);
        const float z0 = mn0 == -INFINITY ? 0.f : mn0, z1 = mn1 == -INFINITY ? 0.f : mn1;
        if (j0 > 0) { /* rescale what earlier chunks accumulated */
            const float al0 = rlx_ex2(m0 - z0), al1 = rlx_ex2(m1 - z1);
            rlx_mma_rescale<D>(o, al0, al1);
            l[0] *= al0;
            l[1] *= al0;
            l[2] *= al1;
            l[3] *= al1;
        }
        m0 = mn0;
        m1 = mn1;
#pragma unroll
        for (int kc = 0; kc < CB / 16; ++kc) {
            uint32_t pa[4];
            pa[0] = MMA::pack(rlx_ex2(fmaf(s[2 * kc][0], c, -z0)), rlx_ex2(fmaf(s[2 * kc][1], c, -z0)));
            pa[1] = MMA::pack(rlx_ex2(fmaf(s[2 * kc][2], c, -z1)), rlx_ex2(fmaf(s[2 * kc][3], c, -z1)));
            pa[2] = MMA::pack(rlx_ex2(fmaf(s[2 * kc + 1][0], c, -z0)), rlx_ex2(fmaf(s[2 * kc + 1][1], c, -z0)));
            pa[3] = MMA::pack(rlx_ex2(fmaf(s[2 * kc + 1][2], c, -z1)), rlx_ex2(fmaf(s[2 * kc + 1][3], c, -z1)));
            MMA::mma(l, pa, ones, ones); /* row sums of P (every column of the product holds them) */
            const T *vr = w.v_s + (j0 + kc * 16 + (lane & 15)) * L::LDK + (lane >> 4) * 8;
#pragma unroll
            for (int dt = 0; dt < D / 8; dt += 2) {
                uint32_t vf[4];
                rlx_ldsm_x4_trans(vf, vr + dt * 8); /* keys 0-15 of d tiles dt and dt + 1 */
                MMA::mma(o[dt], pa, vf[0], vf[1]);
                MMA::mma(o[dt + 1], pa, vf[2], vf[3]);
            }
        }
    }
    const float inv0 = l[0] > 0.f ? 1.f / l[0] : 0.f, inv1 = l[2] > 0.f ? 1.f / l[2] : 0.f;
    /* stage the 16 x D output in this warp's Q rows (read only by this warp, into qa above), then store
     * 16-byte pieces of whole rows */
    __syncwarp();
#pragma unroll
    for (int dt = 0; dt < D / 8; ++dt) {
        *reinterpret_cast<uint32_t *>(w.qw + g * L::LDK + dt * 8 + tq * 2) = MMA::pack(o[dt][0] * inv0, o[dt][1] * inv0);
        *reinterpret_cast<uint32_t *>(w.qw + (g + 8) * L::LDK + dt * 8 + tq * 2) = MMA::pack(o[dt][2] * inv1, o[dt][3] * inv1);
    }
    __syncwarp();
#pragma unroll
    for (int e = lane; e < 16 * (D / 8); e += 32) {
        const int r = e / (D / 8), cc = (e % (D / 8)) * 8;
        const int64_t i = i0 - g + r;
        if (i < p.Sq)
            *reinterpret_cast<int4 *>(w.out + i * p.o_rs + cc) = *reinterpret_cast<const int4 *>(w.qw + r * L::LDK + cc);
    }
}

/* Whether the warps take the exact softmax path (causal or bias masks, or a non-positive scale). */
template <int MASK> __device__ __forceinline__ bool rlx_short2_exact(const RlxAttn &p) {
    return MASK == RLX_MASK_CAUSAL || MASK == RLX_MASK_BIAS || !(p.scale > 0.f);
}

/* A warp's work, compiled for the key count it reads (16, 32, 64 or KMAX: rlx_short_nk). */
template <typename T, typename MT, int D, int MASK, int KMAX, int BK>
__device__ __forceinline__ void rlx_short2_run(const RlxShort2Warp<T, MT> &w, const RlxAttn &p, int nk) {
    if (nk == 16) rlx_short2_warp<T, MT, D, MASK, KMAX, BK, 16>(w, p);
    else if (nk == 32) rlx_short2_warp<T, MT, D, MASK, KMAX, BK, 32>(w, p);
    else if (nk == 64) rlx_short2_warp<T, MT, D, MASK, KMAX, BK, 64>(w, p);
    else rlx_short2_warp<T, MT, D, MASK, KMAX, BK, KMAX>(w, p);
}

template <typename T, typename MT, int D, int MASK, int KMAX, int BK>
__global__ void __launch_bounds__(256, (RlxShort2Occ<D, BK>::value))
rlx_attn_short2(const T *__restrict__ q, const T *__restrict__ k, const T *__restrict__ v, const MT *__restrict__ mask,
                T *__restrict__ out, RlxAttn p) {
    typedef RlxShortSmem<D, KMAX> L;
    static_assert(D % 16 == 0 && D <= 64 && (BK == 32 || BK == 64 || BK == 128) && KMAX % BK == 0 && KMAX >= 64,
                  "rlx_attn_short2: D % 16 == 0, D <= 64, BK 64 or 128 dividing KMAX");
    extern __shared__ __align__(128) unsigned char rlx_smem_short2[];
    T *k_s = reinterpret_cast<T *>(rlx_smem_short2 + L::k_off);
    T *v_s = reinterpret_cast<T *>(rlx_smem_short2 + L::v_off);
    float *madd_s = reinterpret_cast<float *>(rlx_smem_short2 + L::m_off);
    T *q_s = reinterpret_cast<T *>(rlx_smem_short2 + L::q_off);

    const int nw = blockDim.x >> 5;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int h = blockIdx.y;
    const int64_t b = blockIdx.z;
    const int64_t q0 = (int64_t)blockIdx.x * (16 * nw);
    const RlxAttnBlock<T> blk = rlx_attn_block<T, D, MASK>(p, q, k, v, b, h, q0, 16 * nw);
    const T *qb = blk.qb, *kb = blk.kb, *vb = blk.vb;
    const int64_t kv_end = blk.kv_end; /* <= Skv <= KMAX */
    const int nk = rlx_short_nk<KMAX>(kv_end); /* rows the warps read */
    rlx_pdl_trigger(); rlx_pdl_wait(); /* may start early (rlx_launch_pdl): wait before touching data */
    /* Everything the block reads, in flight at once. */
    rlx_short_rows<T, D>(q_s, qb, p.q_rs, q0, p.Sq, 16 * nw);
    rlx_short_rows<T, D>(k_s, kb, p.kv_rs, 0, p.Skv, nk);
    rlx_short_rows<T, D>(v_s, vb, p.v_rs, 0, p.Skv, nk);
    const int masked = rlx_short_key_mask<MT, MASK, KMAX>(madd_s, mask, b, p.Skv, nk, false, MT(0));
    asm volatile("cp.async.wait_all;\n" ::);
    const bool keyed = __syncthreads_or(masked) != 0; /* also the barrier after the loads */
    if (q0 + warp * 16 >= p.Sq) return;                 /* no barrier follows */

    const RlxShort2Warp<T, MT> w{q_s + warp * 16 * L::LDK, k_s, v_s, madd_s, mask,
                                 out + b * p.Sq * p.o_rs + (int64_t)h * D, b, q0 + warp * 16 + (lane >> 2), h, keyed,
                                 rlx_short2_exact<MASK>(p)};
    rlx_short2_run<T, MT, D, MASK, KMAX, BK>(w, p, nk);
}

/* ── rlx_attn_short2p: rlx_attn_short2, persistent and double-buffered ───────────────────────────────────────
 * At 2 blocks of 8 warps per SM (the score registers of a 128-key pass), a block of rlx_attn_short2 waits for
 * its loads with nothing to compute, and the SM's other block may be waiting too. Here a grid of as many
 * blocks as fit at once walks the (query block, head, batch) tiles with a stride of the grid, each block
 * with two shared-memory stages: the cp.async loads of its next tile (and that tile's key-mask values, into
 * registers) are issued before it computes the current one, so the memory system always has a tile in flight
 * per block. The warps' work is rlx_short2_warp, unchanged. */

template <int D, int KMAX, int BK> struct RlxShort2Pipe {
    /* bytes of one stage for nw warps (128-byte aligned) and of the block's two */
    static __host__ __device__ constexpr size_t stage(int nw) { return (RlxShortSmem<D, KMAX>::total(nw) + 127) / 128 * 128; }
    static __host__ __device__ constexpr size_t smem(int nw) { return 2 * stage(nw); }
    /* blocks that fit on the GPU at once (launch bounds' blocks of 8 warps per SM, shared memory with the 1 KB
     * the SM reserves per block, out of 227 KB), no more than the tiles */
    static __host__ int64_t grid(const RlxAttn &p, int nw, int sms) {
        const int64_t tiles = (p.Sq + 16 * nw - 1) / (16 * nw) * p.H * p.B;
        int per = RlxShort2Occ<D, BK>::value * 8 / nw;
        const int fit = (int)((size_t)227 * 1024 / (smem(nw) + 1024));
        per = per < fit ? per : fit;
        per = per < 1 ? 1 : per;
        const int64_t most = (int64_t)per * sms;
        return tiles < most ? tiles : most;
    }
};

template <typename T, typename MT, int D, int MASK, int KMAX, int BK>
__global__ void __launch_bounds__(256, (RlxShort2Occ<D, BK>::value))
rlx_attn_short2p(const T *__restrict__ q, const T *__restrict__ k, const T *__restrict__ v, const MT *__restrict__ mask,
                 T *__restrict__ out, RlxAttn p) {
    typedef RlxShortSmem<D, KMAX> L;
    static_assert(D % 16 == 0 && D <= 64 && (BK == 32 || BK == 64 || BK == 128) && KMAX % BK == 0 && KMAX >= 64,
                  "rlx_attn_short2p: D % 16 == 0, D <= 64, BK 64 or 128 dividing KMAX");
    extern __shared__ __align__(128) unsigned char rlx_smem_short2p[];
    const int nw = blockDim.x >> 5;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const size_t stage = RlxShort2Pipe<D, KMAX, BK>::stage(nw);
    const int64_t qblocks = (p.Sq + 16 * nw - 1) / (16 * nw);
    const int64_t tiles = qblocks * p.H * p.B;
    struct Tile {
        int64_t b, q0;
        int h, nk;
    };
    /* tile t: query block fastest, then head, then batch (as rlx_attn_short2's grid) */
    auto tile_at = [&](int64_t t) -> Tile {
        Tile tl;
        tl.q0 = t % qblocks * (16 * nw);
        tl.h = (int)(t / qblocks % p.H);
        tl.b = t / qblocks / p.H;
        tl.nk = rlx_short_nk<KMAX>(rlx_attn_block<T, D, MASK>(p, q, k, v, tl.b, tl.h, tl.q0, 16 * nw).kv_end);
        return tl;
    };
    /* the key-mask value of thread t's key of the tile whose loads are in flight (blocks of >= KMAX threads;
     * smaller blocks read the mask when they use it) */
    const bool pre = blockDim.x >= KMAX;
    MT mv = MT(0);
    auto issue = [&](const Tile &tl, unsigned char *st) {
        const RlxAttnBlock<T> blk = rlx_attn_block<T, D, MASK>(p, q, k, v, tl.b, tl.h, tl.q0, 16 * nw);
        rlx_short_rows<T, D>(reinterpret_cast<T *>(st + L::q_off), blk.qb, p.q_rs, tl.q0, p.Sq, 16 * nw);
        rlx_short_rows<T, D>(reinterpret_cast<T *>(st + L::k_off), blk.kb, p.kv_rs, 0, p.Skv, tl.nk);
        rlx_short_rows<T, D>(reinterpret_cast<T *>(st + L::v_off), blk.vb, p.v_rs, 0, p.Skv, tl.nk);
        asm volatile("cp.async.commit_group;\n" ::);
        if (MASK == RLX_MASK_PADDING && pre && threadIdx.x < p.Skv) mv = mask[tl.b * p.Skv + threadIdx.x];
    };

    rlx_pdl_trigger(); rlx_pdl_wait(); /* may start early (rlx_launch_pdl): wait before touching data */
    int64_t t = blockIdx.x;
    if (t >= tiles) return; /* block-uniform, before any barrier */
    Tile cur = tile_at(t);
    issue(cur, rlx_smem_short2p);
    for (int i = 0;; ++i) {
        unsigned char *st = rlx_smem_short2p + (i & 1) * stage;
        float *madd_s = reinterpret_cast<float *>(st + L::m_off);
        const int masked = rlx_short_key_mask<MT, MASK, KMAX>(madd_s, mask, cur.b, p.Skv, cur.nk, pre, mv);
        const int64_t tn = t + gridDim.x;
        Tile nxt = cur;
        if (tn < tiles) {
            nxt = tile_at(tn);
            issue(nxt, rlx_smem_short2p + ((i + 1) & 1) * stage); /* the other stage: freed by the last barrier */
        } else {
            asm volatile("cp.async.commit_group;\n" ::); /* an empty group keeps the wait below uniform */
        }
        asm volatile("cp.async.wait_group 1;\n" ::); /* the current tile's loads (this thread's) have landed */
        const bool keyed = __syncthreads_or(masked) != 0;
        if (cur.q0 + warp * 16 < p.Sq) {
            T *q_s = reinterpret_cast<T *>(st + L::q_off);
            const RlxShort2Warp<T, MT> w{q_s + warp * 16 * L::LDK, reinterpret_cast<const T *>(st + L::k_off),
                                         reinterpret_cast<const T *>(st + L::v_off), madd_s, mask,
                                         out + cur.b * p.Sq * p.o_rs + (int64_t)cur.h * D, cur.b,
                                         cur.q0 + warp * 16 + (lane >> 2), cur.h, keyed, rlx_short2_exact<MASK>(p)};
            rlx_short2_run<T, MT, D, MASK, KMAX, BK>(w, p, cur.nk);
        }
        if (tn >= tiles) break;
        __syncthreads(); /* this stage is refilled next iteration (the tile after next) */
        t = tn;
        cur = nxt;
    }
}

/* ── fused attention ──────────────────────────────────────────────────────
 * q [B, Sq, H*D], k/v [B, Skv, Hkv*D] -> out [B, Sq, H*D]. Every kernel runs an online softmax over KV tiles,
 * so memory per head is one tile of scores, never Sq x Skv. A fully masked row yields zeros (as the reference).
 *   rlx_attn_rows   any dtype: a warp owns RLX_ATTN_R query rows, a lane scores one key of a 32-key tile.
 *   rlx_attn_mma    f16/bf16: 64x64 tiles on tensor cores (WMMA), f32 scores, softmax and accumulators.
 *   rlx_attn_decode Sq == 1 against a long KV: the keys are split over blocks (flash-decoding), partial
 *                   (max, sum, acc) triples merged by rlx_attn_combine. */

enum { RLX_MASK_NONE = 0, RLX_MASK_CAUSAL = 1, RLX_MASK_PADDING = 2, RLX_MASK_BIAS = 3 };

struct RlxAttn {
    int64_t B, Sq, Skv;
    int H, Hkv;
    int64_t q_rs, kv_rs, v_rs, o_rs;   /* row strides in elements (kv_rs: K's) */
    float scale;
    int64_t causal_off;                /* key j is visible to query i when j <= i + causal_off */
    int64_t bs_b, bs_h, bs_q, bs_k;    /* bias strides over [B, H, Sq, Skv]; 0 where broadcast */
    int splits;                        /* decode: KV splits per (b, h) */
};

/* The score adjustments every kernel shares: masking and additive bias; -inf means "not visible". */
template <int MASK, typename MT>
__device__ __forceinline__ float rlx_attn_adjust(float s, const RlxAttn &p, const MT *mask, int64_t b,
                                                        int h, int64_t i, int64_t j) {
    if (j >= p.Skv || i >= p.Sq) return -INFINITY;
    if (MASK == RLX_MASK_CAUSAL && j > i + p.causal_off) return -INFINITY;
    if (MASK == RLX_MASK_PADDING && !(rlx_f(mask[b * p.Skv + j]) != 0)) return -INFINITY;
    if (MASK == RLX_MASK_BIAS) s += (float)rlx_f(mask[b * p.bs_b + (int64_t)h * p.bs_h + i * p.bs_q + j * p.bs_k]);
    return s;
}
template <int MASK, typename MT>
__device__ __forceinline__ double rlx_attn_adjust(double s, const RlxAttn &p, const MT *mask, int64_t b,
                                                         int h, int64_t i, int64_t j) {
    if (j >= p.Skv || i >= p.Sq) return -INFINITY;
    if (MASK == RLX_MASK_CAUSAL && j > i + p.causal_off) return -INFINITY;
    if (MASK == RLX_MASK_PADDING && !(rlx_f(mask[b * p.Skv + j]) != 0)) return -INFINITY;
    if (MASK == RLX_MASK_BIAS) s += (double)rlx_f(mask[b * p.bs_b + (int64_t)h * p.bs_h + i * p.bs_q + j * p.bs_k]);
    return s;
}

/* Last key (exclusive) any of the query rows [q0, q1) can see. */
template <int MASK>
__device__ __forceinline__ int64_t rlx_attn_kv_end(const RlxAttn &p, int64_t q1) {
    if (MASK != RLX_MASK_CAUSAL) return p.Skv;
    int64_t e = q1 + p.causal_off; /* (q1 - 1) + off + 1 */
    return e < 0 ? 0 : (e > p.Skv ? p.Skv : e);
}

/* What one block of a query-tiled kernel reads: batch b, head h, query rows [q0, qlast) (qlast <= Sq); qb, kb, vb
 * the head's Q rows and its KV group's K and V rows; kv_end the last key (exclusive) those queries can see. */
template <typename T>
struct RlxAttnBlock {
    const T *qb, *kb, *vb;
    int64_t qlast, kv_end;
};

template <typename T, int D, int MASK>
__device__ __forceinline__ RlxAttnBlock<T> rlx_attn_block(const RlxAttn &p, const T *q, const T *k, const T *v,
                                                          int64_t b, int h, int64_t q0, int64_t rows) {
    const int kvh = h / (p.H / p.Hkv);
    RlxAttnBlock<T> blk;
    blk.qb = q + b * p.Sq * p.q_rs + (int64_t)h * D;
    blk.kb = k + b * p.Skv * p.kv_rs + (int64_t)kvh * D;
    blk.vb = v + b * p.Skv * p.v_rs + (int64_t)kvh * D;
    blk.qlast = q0 + rows < p.Sq ? q0 + rows : p.Sq;
    blk.kv_end = rlx_attn_kv_end<MASK>(p, blk.qlast);
    return blk;
}

#define RLX_ATTN_R 4   /* query rows per warp in rlx_attn_rows */
#define RLX_ATTN_KT 32 /* keys per tile in rlx_attn_rows */

template <typename T, typename MT, int D, int MASK>
__global__ void __launch_bounds__(128) rlx_attn_rows(const T *__restrict__ q, const T *__restrict__ k,
                                                      const T *__restrict__ v, const MT *__restrict__ mask,
                                                      T *__restrict__ out, RlxAttn p) {
    typedef typename rlx_acc<T>::type A;
    constexpr int DPL = (D + 31) / 32; /* output dims per lane */
    constexpr int ROWS = 4 * RLX_ATTN_R;
    extern __shared__ __align__(16) unsigned char rlx_smem_rows[];
    A *q_s = (A *)rlx_smem_rows;             /* [ROWS][D] */
    A *k_s = q_s + ROWS * D;                 /* [KT][D + 1]: odd stride, lane-per-key reads hit 32 banks */
    A *v_s = k_s + RLX_ATTN_KT * (D + 1);    /* [KT][D] */
    A *p_s = v_s + RLX_ATTN_KT * D;          /* [4 warps][R][KT] */

    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int h = blockIdx.y;
    const int64_t b = blockIdx.z;
    const int64_t q0 = (int64_t)blockIdx.x * ROWS;
    const RlxAttnBlock<T> blk = rlx_attn_block<T, D, MASK>(p, q, k, v, b, h, q0, ROWS);
    const T *qb = blk.qb, *kb = blk.kb, *vb = blk.vb;

    for (int e = threadIdx.x; e < ROWS * D; e += blockDim.x) {
        int64_t i = q0 + e / D;
        q_s[e] = i < p.Sq ? (A)rlx_f(qb[i * p.q_rs + e % D]) : (A)0;
    }
    A acc[RLX_ATTN_R][DPL];
    A m[RLX_ATTN_R], l[RLX_ATTN_R];
#pragma unroll
    for (int r = 0; r < RLX_ATTN_R; ++r) {
        m[r] = -INFINITY;
        l[r] = 0;
#pragma unroll
        for (int c = 0; c < DPL; ++c) acc[r][c] = 0;
    }
    const int64_t row0 = q0 + warp * RLX_ATTN_R;
    const int64_t kv_end = blk.kv_end;
    for (int64_t j0 = 0; j0 < kv_end; j0 += RLX_ATTN_KT) {
        __syncthreads();
        for (int e = threadIdx.x; e < RLX_ATTN_KT * D; e += blockDim.x) {
            int64_t j = j0 + e / D;
            int d = e % D;
            A kv = 0, vv = 0;
            if (j < p.Skv) {
                kv = rlx_f(kb[j * p.kv_rs + d]);
                vv = rlx_f(vb[j * p.v_rs + d]);
            }
            k_s[(e / D) * (D + 1) + d] = kv;
            v_s[e] = vv;
        }
        __syncthreads();
        if (row0 >= p.Sq) continue;
        A s[RLX_ATTN_R];
#pragma unroll
        for (int r = 0; r < RLX_ATTN_R; ++r) s[r] = 0;
        const A *kr = k_s + lane * (D + 1);
        for (int d = 0; d < D; ++d) {
            A kd = kr[d];
#pragma unroll
            for (int r = 0; r < RLX_ATTN_R; ++r) s[r] += q_s[(warp * RLX_ATTN_R + r) * D + d] * kd;
        }
        A *pw = p_s + warp * RLX_ATTN_R * RLX_ATTN_KT;
#pragma unroll
        for (int r = 0; r < RLX_ATTN_R; ++r) {
            A sc = rlx_attn_adjust<MASK, MT>(s[r] * (A)p.scale, p, mask, b, h, row0 + r, j0 + lane);
            A mt = rlx_warp_max(sc);
            A mn = rlx_max(m[r], mt);
            A pr = (sc == -INFINITY) ? (A)0 : exp(sc - mn);
            A alpha = (m[r] == -INFINITY) ? (A)0 : exp(m[r] - mn);
            l[r] = l[r] * alpha + rlx_warp_sum(pr);
            m[r] = mn;
#pragma unroll
            for (int c = 0; c < DPL; ++c) acc[r][c] *= alpha;
            pw[r * RLX_ATTN_KT + lane] = pr;
        }
        __syncwarp();
        for (int jj = 0; jj < RLX_ATTN_KT; ++jj) {
#pragma unroll
            for (int c = 0; c < DPL; ++c) {
                int d = lane + 32 * c;
                A vd = (d < D) ? v_s[jj * D + (d < D ? d : 0)] : (A)0;
#pragma unroll
                for (int r = 0; r < RLX_ATTN_R; ++r) acc[r][c] += pw[r * RLX_ATTN_KT + jj] * vd;
            }
        }
        __syncwarp();
    }
    T *ob = out + b * p.Sq * p.o_rs + (int64_t)h * D;
#pragma unroll
    for (int r = 0; r < RLX_ATTN_R; ++r) {
        int64_t i = row0 + r;
        if (i >= p.Sq) continue;
        A inv = l[r] > 0 ? (A)1 / l[r] : (A)0;
#pragma unroll
        for (int c = 0; c < DPL; ++c) {
            int d = lane + 32 * c;
            if (d < D) ob[i * p.o_rs + d] = rlx_cvt<T>(acc[r][c] * inv);
        }
    }
}

template <typename T, int D>
static size_t rlx_attn_rows_smem() {
    typedef typename rlx_acc<T>::type A;
    return sizeof(A) * ((size_t)4 * RLX_ATTN_R * D + (size_t)RLX_ATTN_KT * (D + 1) + (size_t)RLX_ATTN_KT * D +
                        (size_t)4 * RLX_ATTN_R * RLX_ATTN_KT);
}

/* Decode: one query row per (b, qi, h), its keys split over gridDim.x blocks of 4 warps. Each warp takes
 * 32-key tiles round-robin; a lane scores one key (reading its K row directly), then the warp accumulates
 * p * V with lanes spread over the head dims (coalesced V reads). Partials go to `part` when splits > 1. */
template <typename T, typename MT, int D, int MASK>
__global__ void __launch_bounds__(128) rlx_attn_decode(const T *__restrict__ q, const T *__restrict__ k,
                                                        const T *__restrict__ v, const MT *__restrict__ mask,
                                                        T *__restrict__ out, float *__restrict__ part, RlxAttn p) {
    typedef typename rlx_acc<T>::type A;
    constexpr int DPL = (D + 31) / 32;
    __shared__ A q_s[D];
    __shared__ A p_s[4][32];
    __shared__ A wm[4], wl[4];
    __shared__ A wacc[4][D];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int split = blockIdx.x, h = blockIdx.y;
    const int64_t b = blockIdx.z / p.Sq, i = blockIdx.z % p.Sq;
    const int kvh = h / (p.H / p.Hkv);
    const T *qr = q + (b * p.Sq + i) * p.q_rs + (int64_t)h * D;
    const T *kb = k + b * p.Skv * p.kv_rs + (int64_t)kvh * D;
    const T *vb = v + b * p.Skv * p.v_rs + (int64_t)kvh * D;
    for (int d = threadIdx.x; d < D; d += blockDim.x) q_s[d] = rlx_f(qr[d]);
    __syncthreads();

    const int64_t kv_end = rlx_attn_kv_end<MASK>(p, i + 1);
    const int64_t per = (((kv_end + p.splits - 1) / p.splits) + 31) / 32 * 32;
    const int64_t lo = (int64_t)split * per;
    const int64_t hi = lo + per < kv_end ? lo + per : kv_end;
    A m = -INFINITY, l = 0, acc[DPL];
#pragma unroll
    for (int c = 0; c < DPL; ++c) acc[c] = 0;
    for (int64_t j0 = lo + warp * 32; j0 < hi; j0 += 4 * 32) {
        const int64_t j = j0 + lane;
        A s = -INFINITY;
        if (j < hi) {
            const T *kr = kb + j * p.kv_rs;
            A dot = 0;
#pragma unroll 8
            for (int d = 0; d < D; ++d) dot += q_s[d] * (A)rlx_f(kr[d]);
            s = rlx_attn_adjust<MASK, MT>(dot * (A)p.scale, p, mask, b, h, i, j);
        }
        A mn = rlx_max(m, rlx_warp_max(s));
        A pr = (s == -INFINITY) ? (A)0 : exp(s - mn);
        A alpha = (m == -INFINITY) ? (A)0 : exp(m - mn);
        l = l * alpha + rlx_warp_sum(pr);
        m = mn;
        p_s[warp][lane] = pr;
        __syncwarp();
#pragma unroll
        for (int c = 0; c < DPL; ++c) acc[c] *= alpha;
        const int64_t nk = hi - j0 < 32 ? hi - j0 : 32;
        for (int jj = 0; jj < nk; ++jj) {
            const A pj = p_s[warp][jj];
            const T *vr = vb + (j0 + jj) * p.v_rs;
#pragma unroll
            for (int c = 0; c < DPL; ++c) {
                int d = lane + 32 * c;
                if (d < D) acc[c] += pj * (A)rlx_f(vr[d]);
            }
        }
        __syncwarp();
    }
    if (lane == 0) { wm[warp] = m; wl[warp] = l; }
#pragma unroll
    for (int c = 0; c < DPL; ++c) {
        int d = lane + 32 * c;
        if (d < D) wacc[warp][d] = acc[c];
    }
    __syncthreads();
    if (warp != 0) return;
    A M = rlx_max(rlx_max(wm[0], wm[1]), rlx_max(wm[2], wm[3]));
    A L = 0, f[4];
#pragma unroll
    for (int w = 0; w < 4; ++w) {
        f[w] = (wm[w] == -INFINITY) ? (A)0 : exp(wm[w] - M);
        L += wl[w] * f[w];
    }
    const int64_t slot = ((b * p.Sq + i) * p.H + h) * p.splits + split;
    for (int d = lane; d < D; d += 32) {
        A o = wacc[0][d] * f[0] + wacc[1][d] * f[1] + wacc[2][d] * f[2] + wacc[3][d] * f[3];
        if (p.splits == 1) {
            out[(b * p.Sq + i) * p.o_rs + (int64_t)h * D + d] = rlx_cvt<T>(L > 0 ? o / L : (A)0);
        } else {
            part[slot * (D + 2) + 2 + d] = (float)o;
        }
    }
    if (p.splits > 1 && lane == 0) {
        part[slot * (D + 2)] = (float)M;
        part[slot * (D + 2) + 1] = (float)L;
    }
}

/* Merge the splits of rlx_attn_decode: one warp per (b, i, h). */
template <typename T, int D>
__global__ void rlx_attn_combine(const float *__restrict__ part, T *__restrict__ out, RlxAttn p) {
    const int64_t w = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    const int lane = threadIdx.x & 31;
    const int64_t total = p.B * p.Sq * p.H;
    if (w >= total) return;
    const float *pp = part + w * p.splits * (D + 2);
    float M = -INFINITY;
    for (int s = 0; s < p.splits; ++s) M = rlx_max(M, pp[s * (D + 2)]);
    float L = 0;
    for (int s = 0; s < p.splits; ++s) {
        float ms = pp[s * (D + 2)];
        L += ms == -INFINITY ? 0.f : pp[s * (D + 2) + 1] * expf(ms - M);
    }
    const int h = (int)(w % p.H);
    const int64_t bi = w / p.H;
    for (int d = lane; d < D; d += 32) {
        float o = 0;
        for (int s = 0; s < p.splits; ++s) {
            float ms = pp[s * (D + 2)];
            if (ms != -INFINITY) o += pp[s * (D + 2) + 2 + d] * expf(ms - M);
        }
        out[bi * p.o_rs + (int64_t)h * D + d] = rlx_cvt<T>(L > 0 ? o / L : 0.f);
    }
}

/* Tensor-core prefill for f16/bf16 (D a multiple of 16, at most 128), FlashAttention-2 style: each warp owns 16
 * query rows; per BK-key tile (64 keys; 128 selectable for D <= 64) it computes S = Q K^T with mma.sync m16n8k16 (f32 accumulators in registers), runs
 * the online softmax on those registers (a row's values live in the 4 lanes of a quad), reuses the score
 * accumulators directly as the A operand of P V (the C fragment layout of two n-tiles is the A fragment layout),
 * and rescales O in registers. Shared memory holds only the Q, K and V tiles (V read transposed by ldmatrix). NW warps per block (1 for short
 * query blocks, 4 otherwise). */

/* Scale a warp's m16n8 output fragments (D / 8 of them) by the online softmax's correction: its row g by al0,
 * its row g + 8 by al1 (the fragment layout of mma.sync m16n8k16). */
template <int D>
__device__ __forceinline__ void rlx_mma_rescale(float (&o)[D / 8][4], float al0, float al1) {
#pragma unroll
    for (int dt = 0; dt < D / 8; ++dt) {
        o[dt][0] *= al0;
        o[dt][1] *= al0;
        o[dt][2] *= al1;
        o[dt][3] *= al1;
    }
}

template <typename T> struct RlxMma;
template <> struct RlxMma<__half> {
    static __device__ __forceinline__ void mma(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                     "{%0,%1,%2,%3};\n"
                     : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    }
    static __device__ __forceinline__ uint32_t pack(float lo, float hi) {
        __half2 v = __floats2half2_rn(lo, hi);
        return *reinterpret_cast<uint32_t *>(&v);
    }
};
template <> struct RlxMma<rlx_bf16> {
    static __device__ __forceinline__ void mma(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                     "{%0,%1,%2,%3};\n"
                     : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    }
    static __device__ __forceinline__ uint32_t pack(float lo, float hi) {
        __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
        return *reinterpret_cast<uint32_t *>(&v);
    }
};


template <int D, int NW, int BK> struct RlxFaSmem {
    static constexpr int LDK = D + 8; /* halves per Q/K/V row: conflict-free fragment and ldmatrix loads */
    static constexpr size_t q_off = 0;
    static constexpr size_t k_off = q_off + (size_t)16 * NW * LDK * 2;
    static constexpr size_t v_off = k_off + (size_t)BK * LDK * 2;
    static constexpr size_t m_off = v_off + (size_t)BK * LDK * 2;
    static constexpr size_t total = m_off + (size_t)BK * 4;
};

/* B operand of P V straight from row-major V in shared memory: two 8x8 tiles, transposed by ldmatrix. */
__device__ __forceinline__ void rlx_ldmatrix_x2_trans(uint32_t &r0, uint32_t &r1, const void *row) {
    const uint32_t a = (uint32_t)__cvta_generic_to_shared(row);
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0,%1}, [%2];\n" : "=r"(r0), "=r"(r1) : "r"(a));
}

template <typename T>
__device__ __forceinline__ uint32_t rlx_ld32(const T *p) { return *reinterpret_cast<const uint32_t *>(p); }

/* rows [r0, r0 + rows) of a [*, D] tile with row stride rs into smem rows of ld elements (zero past rmax).
 * VEC reads 16 bytes at a time. */
template <typename T, bool VEC>
__device__ __forceinline__ void rlx_fa_load(T *dst, int ld, const T *src, int64_t rs, int64_t r0, int64_t rmax,
                                            int rows, int D) {
    if (VEC) {
        const int chunks = D / 8;
        for (int e = threadIdx.x; e < rows * chunks; e += blockDim.x) {
            const int r = e / chunks, c = (e % chunks) * 8;
            int4 val = make_int4(0, 0, 0, 0);
            if (r0 + r < rmax) val = *reinterpret_cast<const int4 *>(src + (r0 + r) * rs + c);
            *reinterpret_cast<int4 *>(dst + r * ld + c) = val;
        }
    } else {
        const T zero = rlx_to<T>(0.f);
        for (int e = threadIdx.x; e < rows * D; e += blockDim.x) {
            const int r = e / D, c = e % D;
            dst[r * ld + c] = (r0 + r < rmax) ? src[(r0 + r) * rs + c] : zero;
        }
    }
}

/* The additive key mask of a tile: 0 for visible keys, -inf past Skv or where the padding mask is 0. */
template <int MASK, typename MT>
__device__ __forceinline__ void rlx_fa_key_mask(float *madd, const RlxAttn &p, const MT *mask, int64_t b, int64_t j0,
                                                int BK) {
    for (int t = threadIdx.x; t < BK; t += blockDim.x) {
        const int64_t key = j0 + t;
        bool ok = key < p.Skv;
        if (MASK == RLX_MASK_PADDING && ok) ok = rlx_f(mask[b * p.Skv + key]) != 0;
        madd[t] = ok ? 0.f : -INFINITY;
    }
}

template <typename T, typename MT, int D, int MASK, bool VEC, int NW, int BK>
__global__ void __launch_bounds__(NW * 32, (NW == 4 && D <= 32) ? 6 : 1) rlx_attn_fa(const T *__restrict__ q, const T *__restrict__ k,
                                                        const T *__restrict__ v, const MT *__restrict__ mask,
                                                        T *__restrict__ out, RlxAttn p) {
    typedef RlxFaSmem<D, NW, BK> L;
    typedef RlxMma<T> MMA;
    extern __shared__ __align__(128) unsigned char rlx_smem_fa[];
    T *q_s = reinterpret_cast<T *>(rlx_smem_fa + L::q_off);
    T *k_s = reinterpret_cast<T *>(rlx_smem_fa + L::k_off);
    T *v_s = reinterpret_cast<T *>(rlx_smem_fa + L::v_off);
    float *madd_s = reinterpret_cast<float *>(rlx_smem_fa + L::m_off);

    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int g = lane >> 2, tq = lane & 3; /* fragment row group and column pair */
    const int h = blockIdx.y;
    const int64_t b = blockIdx.z;
    const int64_t q0 = (int64_t)blockIdx.x * (16 * NW);
    const RlxAttnBlock<T> blk = rlx_attn_block<T, D, MASK>(p, q, k, v, b, h, q0, 16 * NW);
    const T *qb = blk.qb, *kb = blk.kb, *vb = blk.vb;
    const int64_t kv_end = blk.kv_end;
    /* Rows of a tile that are read at all: keys past the end are skipped 16 at a time. */
    auto tile_rows = [&](int64_t j0) -> int {
        const int64_t left = kv_end - j0;
        return left >= BK ? BK : (int)((left + 15) / 16 * 16);
    };
    /* Q, the first K/V tile and its key mask arrive together, behind one barrier. */
    rlx_fa_load<T, VEC>(q_s, L::LDK, qb, p.q_rs, q0, p.Sq, 16 * NW, D);
    if (kv_end > 0) {
        rlx_fa_load<T, VEC>(k_s, L::LDK, kb, p.kv_rs, 0, p.Skv, tile_rows(0), D);
        rlx_fa_load<T, VEC>(v_s, L::LDK, vb, p.v_rs, 0, p.Skv, tile_rows(0), D);
        rlx_fa_key_mask<MASK, MT>(madd_s, p, mask, b, 0, BK);
    }
    __syncthreads();
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

    for (int64_t j0 = 0; j0 < kv_end; j0 += BK) {
        const int rows = tile_rows(j0);
        const int64_t jn = j0 + BK;
        float s[BK / 8][4];
#pragma unroll
        for (int nt = 0; nt < BK / 8; ++nt) {
            s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.f;
            if (nt * 8 >= rows) continue; /* past the keys: masked below */
            const T *kr = k_s + (nt * 8 + g) * L::LDK + tq * 2;
#pragma unroll
            for (int kt = 0; kt < D / 16; ++kt) MMA::mma(s[nt], qa[kt], rlx_ld32(kr + kt * 16), rlx_ld32(kr + kt * 16 + 8));
        }
        float mx0 = -INFINITY, mx1 = -INFINITY;
#pragma unroll
        for (int nt = 0; nt < BK / 8; ++nt) {
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                const int col = nt * 8 + tq * 2 + e;
                const int64_t key = j0 + col;
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
            const T *vrow = v_s + (kc * 16 + (lane & 15)) * L::LDK;
#pragma unroll
            for (int dt = 0; dt < D / 8; ++dt) {
                uint32_t b0, b1;
                rlx_ldmatrix_x2_trans(b0, b1, vrow + dt * 8);
                MMA::mma(o[dt], pa, b0, b1);
            }
        }
        if (jn < kv_end) {
            __syncthreads(); /* every warp is done with this tile */
            /* (Prefetching the next tile into registers measured slower here: fewer blocks fit per SM.) */
            rlx_fa_load<T, VEC>(k_s, L::LDK, kb, p.kv_rs, jn, p.Skv, tile_rows(jn), D);
            rlx_fa_load<T, VEC>(v_s, L::LDK, vb, p.v_rs, jn, p.Skv, tile_rows(jn), D);
            rlx_fa_key_mask<MASK, MT>(madd_s, p, mask, b, jn, BK);
            __syncthreads();
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

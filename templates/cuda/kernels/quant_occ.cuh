/* ── rlx_qgemv_occ: the one-row decode GEMV built for occupancy (q4_k, q4_0, q4_1, q8_0; after quant.cuh) ─────────
 * The register walk (rlx_qgemv_xr) holds a lane's x and 8 weight rows' loads (105-128 registers) and stages all of
 * x in shared memory (up to 66 KB a block): 8-16 warps an SM, each issuing an item's loads only after the previous
 * item's products, so the GEMVs are latency-bound (ncu: DRAM at 16-32%, the memory pipes at 6-9%). Here latency is
 * hidden by warps instead:
 *   - split K across the warps of a block: warp w owns slab s = w % nslab (32 units, lane l unit 32 s + l) for the
 *     whole kernel, so its x stays in registers from the start (34 floats for q4_k), read straight from global
 *     memory (no staging in shared memory at all: no 66 KB, no staging pass before the first product);
 *   - the block's R = 16 / nslab replicas of the slabs deal the tile's weight rows between them, G rows an item
 *     (loads of the G rows issued before any product); the item's sums go to shared memory per (slab, row) and
 *     after a barrier one thread per output row adds them in slab order and applies the epilogue;
 *   - at most 512 threads a block and __launch_bounds__(512, 2) for G <= 2: at most 64 registers, so two blocks
 *     (28-32 warps) an SM; the host sizes the tiles (rows a block) so that the grid is one wave;
 *   - the warp's first item's weights are prefetched into L2 before griddepcontrol.wait (weights are never written
 *     by a kernel), while the kernel before drains (loading them into registers there spilled at 64 registers;
 *     prefetching a whole tile would fetch a GEMV's every weight at once, more than the L2 holds at gate/up). Not
 *     the norm's gamma into L1 as well: measured (benchmarks/qgemv_probe.py, one H200, 29 Nov) that made a layer's
 *     four GEMVs 118 us instead of 96 (the norm's 1.7x slower, and the residual ones too);
 *   - q4_k's unit products take 2 instructions a value (RlxQOccQ4K, rlx_qocc_bytes: subnormal bytes; measured against
 *     3 a value in the same call: a layer 96 us against 103), its scales a shift and a mask a pair.
 * The terms are rlx_qgemv_xr's (the same unit dot products, q4_k's rounded identically, and x sums, the same
 * slab-ordered sum of warp sums); only the order of a warp's sum (one butterfly for the item's G rows) and, with the
 * norm, of the sum of squares differ.
 * `tr` output rows a tile; dynamic shared memory: nslab * TW floats (TW = tr, or 2 tr with SwiGLU). PF (walk "occp")
 * also prefetches the warp's next item into L2 while the current one's loads fly (more bytes in flight an SM, no
 * registers; with the register walk's fewer warps such a prefetch measured slower). ACT = 1 (act="q8"): x quantized
 * to int8 per block of 32 in the lanes' registers at the start, integer unit products (RlxQOccQ8X / RlxQOccQ8Dot
 * below): 12 registers of x instead of 34, so 4 rows an item still fit 64 registers (two blocks an SM). */
#ifndef RLX_QOCC_THREADS
#define RLX_QOCC_THREADS 512
#endif
/* Most output rows a tile (the host's tiles are one wave's share of the rows, up to this) */
#define RLX_QOCC_MAX_TR 64

/* Value offset of chunk i (0..3: 8 values each) of unit u: q4_k's unit u takes values 16h .. 16h + 15 of sub-blocks
   2g and 2g + 1 of block u / 8 (chunks 0, 1 and 2, 3), the 32-value formats' unit is their block. */
template <int FMT>
__device__ __forceinline__ int64_t rlx_qocc_chunk(int64_t u, int i) {
    if (FMT == RLX_Q4_K)
        return 256 * (u >> 3) + 64 * ((u >> 1) & 3) + 16 * (u & 1) + 32 * (i >> 1) + 8 * (i & 1);
    return 32 * u + 8 * i;
}

/* x of unit u as xload reads it from rlx_qgemv_body's staging: v the 32 values in chunk order, cs the chunks' sums. */
template <int FMT>
__device__ __forceinline__ void rlx_qocc_frag(const float v[32], const float cs[4], typename RlxQUnit<FMT>::XFrag &x) {
    if constexpr (FMT == RLX_Q4_K) {
#pragma unroll
        for (int e = 0; e < 16; e++) {
            x.a[e] = v[e];
            x.b[e] = v[16 + e];
        }
        x.s0 = cs[0] + cs[1];
        x.s1 = cs[2] + cs[3];
    } else {
#pragma unroll
        for (int e = 0; e < 32; e++)
            x.a[e] = v[e];
        if constexpr (FMT == RLX_Q4_0 || FMT == RLX_Q4_1)
            x.s = FMT == RLX_Q4_1 ? (cs[0] + cs[1]) + (cs[2] + cs[3]) : 0.0f;
    }
}

/* Weight row i of item p of tile t (G rows; SwiGLU: G / 2 gate rows and the same up rows), clamped to the last row
   (a row past the tile or the weight is loaded, never stored). 32-bit row arithmetic: fewer registers. */
template <int EPI, int G>
__device__ __forceinline__ const uint8_t *rlx_qocc_row(const RlxQMembers &mem, int t, int p, int i, int tr, int rows,
                                                       int RB) {
    const int ti = EPI == 2 ? p * (G / 2) + i % (G / 2) : p * G + i;
    int r = t * tr + ti;
    r = r < rows ? r : rows - 1;
    if (EPI == 2)
        return (i < G / 2 ? mem.w[0] : mem.w[1]) + (int64_t)r * RB;
    if (EPI == 1)  /* the residual's group has one member */
        return mem.w[0] + (int64_t)r * RB;
    /* selects, no branches: the item's rows' addresses all come before its loads */
    const int n0 = (int)mem.n[0], n1 = (int)mem.n[1], n2 = (int)mem.n[2];
    const bool c1 = mem.count > 1 && r >= n0;
    r -= c1 ? n0 : 0;
    const bool c2 = c1 && mem.count > 2 && r >= n1;
    r -= c2 ? n1 : 0;
    const bool c3 = c2 && mem.count > 3 && r >= n2;
    r -= c3 ? n2 : 0;
    return (c3 ? mem.w[3] : c2 ? mem.w[2] : c1 ? mem.w[1] : mem.w[0]) + (int64_t)r * RB;
}

/* The dot product of 16 small unsigned bytes with x, 2 instructions a value instead of 3: a byte b moved into an
 * otherwise zero word (one byte permute) is the subnormal float b 2^-149, and the FFMA multiplies it by x 2^E
 * (E = RLX_QOCC_XEXP, the lane's x scaled once): the product and every partial sum are the unscaled ones times the
 * power of two 2^(E - 149), so they round exactly as rlx_qf_bytes_r's x (2^23 + b - 2^23) terms do, as long as they
 * stay normal floats (|x b| >= 2^(126 + E - 149) = 2^-77 at E = 100) and x 2^E finite (|x| < 2^28). The caller's
 * scale takes the 2^(149 - E) back (RLX_QOCC_DSCALE, folded into the block's d: exact). The FMA pipe takes
 * subnormal operands at full rate (in hardware since Fermi); the FMA is PTX's fma.rn.f32, which never flushes them,
 * even in a build with -ftz=true or --use_fast_math. */
#define RLX_QOCC_XEXP 100
#define RLX_QOCC_XSCALE 0x1p100f
#define RLX_QOCC_DSCALE 0x1p49f
#ifndef RLX_QOCC_FMA
#define RLX_QOCC_FMA(a, b, c) rlx_qocc_fma_rn(a, b, c)
__device__ __forceinline__ float rlx_qocc_fma_rn(float a, float b, float c) {
    float d;
    asm("fma.rn.f32 %0, %1, %2, %3;" : "=f"(d) : "f"(a), "f"(b), "f"(c));
    return d;
}
#endif
__device__ __forceinline__ float rlx_qocc_bytes(const float *x, const uint32_t w[4]) {
    float a = 0.0f;
#pragma unroll
    for (int j = 0; j < 4; j++) {
#pragma unroll
        for (int k = 0; k < 4; k++)
            a = RLX_QOCC_FMA(x[4 * j + k], __uint_as_float(__byte_perm(w[j], 0u, 0x4440u + k)), a);
    }
    return a;
}

/* q4_k's scales of a lane's unit u (sub-blocks 2g and 2g + 1) from the block header, with the lane's constants
   computed once: the 16-bit half (g & 1) of the header words holds both sub-blocks' 6-bit fields, so one shift and
   mask give both (sub-blocks 0-3: scale y, min z; 4-7: the low / high nibbles of w and the top 2 bits of y / z).
   The same values as rlx_q4k_scales, in about half its instructions. */
struct RlxQOccQ4K {
    int sh;             /* 16 * (g & 1) */
    uint32_t mlo, mhi;  /* 0x3F3F, 0 (g < 2) or 0x0F0F, 0x3030 */
    bool hi;            /* g >= 2 */
    __device__ __forceinline__ explicit RlxQOccQ4K(int u) {
        const int g = (u >> 1) & 3;
        sh = 16 * (g & 1);
        hi = g >= 2;
        mlo = hi ? 0x0F0Fu : 0x3F3Fu;
        mhi = hi ? 0x3030u : 0u;
    }
    /* x.a, x.b times 2^RLX_QOCC_XEXP (the kernel scales them once), x.s0, x.s1 unscaled. The high nibbles are taken
       in place (the bytes 16 q: one mask, no shift), and their 16 folded into sub-block 2g + 1's scale (exact). */
    __device__ __forceinline__ float dot(const RlxQUnit<RLX_Q4_K> &a, const RlxQUnit<RLX_Q4_K>::XFrag &x) const {
        const uint4 &hd = a.hd, &q = a.q;
        const float dh = __half2float(__ushort_as_half((unsigned short)(hd.x & 0xFFFF)));
        const float d = dh * RLX_QOCC_DSCALE, d16 = dh * (RLX_QOCC_DSCALE / 16.0f);
        const float dmin = __half2float(__ushort_as_half((unsigned short)(hd.x >> 16)));
        const uint32_t A = hi ? hd.w : hd.y, B = hi ? hd.w >> 4 : hd.z;
        const uint32_t sc = ((A >> sh) & mlo) | ((hd.y >> (sh + 2)) & mhi);
        const uint32_t mn = ((B >> sh) & mlo) | ((hd.z >> (sh + 2)) & mhi);
        const float ds0 = d * (__uint_as_float(__byte_perm(sc, 0x4B000000u, 0x7540u)) - 8388608.0f);
        const float ds1 = d16 * (__uint_as_float(__byte_perm(sc, 0x4B000000u, 0x7541u)) - 8388608.0f);
        const float dm0 = dmin * (__uint_as_float(__byte_perm(mn, 0x4B000000u, 0x7540u)) - 8388608.0f);
        const float dm1 = dmin * (__uint_as_float(__byte_perm(mn, 0x4B000000u, 0x7541u)) - 8388608.0f);
        const uint32_t lo[4] = {q.x & 0x0F0F0F0Fu, q.y & 0x0F0F0F0Fu, q.z & 0x0F0F0F0Fu, q.w & 0x0F0F0F0Fu};
        const uint32_t hi4[4] = {q.x & 0xF0F0F0F0u, q.y & 0xF0F0F0F0u, q.z & 0xF0F0F0F0u, q.w & 0xF0F0F0F0u};
        const float p0 = rlx_qocc_bytes(x.a, lo), p1 = rlx_qocc_bytes(x.b, hi4);
        return ds0 * p0 - dm0 * x.s0 + ds1 * p1 - dm1 * x.s1;
    }
};

/* The lane's dot product of unit u of a loaded row with its x: q4_k through RlxQOccQ4K, the others their own. */
template <int FMT>
struct RlxQOccDot {
    __device__ __forceinline__ explicit RlxQOccDot(int) {}
    __device__ __forceinline__ float operator()(const RlxQUnit<FMT> &a, const typename RlxQUnit<FMT>::XFrag &x,
                                                int u) const {
        return a.dot(x, u);
    }
};
template <>
struct RlxQOccDot<RLX_Q4_K> {
    RlxQOccQ4K c;
    __device__ __forceinline__ explicit RlxQOccDot(int u) : c(u) {}
    __device__ __forceinline__ float operator()(const RlxQUnit<RLX_Q4_K> &a, const RlxQUnit<RLX_Q4_K>::XFrag &x,
                                                int) const {
        return c.dot(a, x);
    }
};

/* ── Int8 activations (ACT = 1: dequant_matmul act="q8", the semantics of kernels/quant_q8.cuh) ──────────────────
 * Each lane quantizes its own unit's x once at kernel start (after the norm), exactly as rlx_q8_quantize does
 * (d = max|x| / 127 by __fdiv_rn, q = rint(x * __frcp_rn(d)) clipped to [-127, 127]), and keeps it as packed int8
 * words (8 registers instead of 32 floats) with the block's dx and dx * sum(q). q4_0 / q4_1 / q8_0: the unit is one
 * 32-value block (the lane alone); q4_k: 16 values of sub-block 2g and 16 of 2g + 1 (rlx_qocc_chunk), each sub-block
 * shared with the partner lane u ^ 1, whose max |x| and sum(q) come through one __shfl_xor_sync(.., 1) each.
 * A unit's products are integer (__dp4a, 4 values an instruction): q8_0's bytes directly, the nibble formats' low
 * nibbles as q & 0x0F0F0F0F and high ones in place as q & 0xF0F0F0F0 (16 nibble: an unsigned-by-signed dp4a; the
 * integer dot divided by 16 exactly, or q4_k's 1/16 folded into sub-block 2g + 1's scale, exact), and the scales
 * applied once per block as the reference's terms: (dw * dx) * dot + mw * (dx * sum(q)) (q4_0: dot of nibble - 8).
 * q4_k's sub-block dot is split over the two lanes of a pair ((dw * dx) * dot of each half), its min term added by
 * the even lane only. */
#ifndef RLX_QOCC_DP4A_US
#define RLX_QOCC_DP4A_US(a, b, c) rlx_qocc_dp4a_us(a, b, c)
/* c + the 4 products of a's unsigned bytes and b's signed bytes */
__device__ __forceinline__ int rlx_qocc_dp4a_us(uint32_t a, int b, int c) {
    int d;
    asm("dp4a.u32.s32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
    return d;
}
#endif

/* x of a lane's unit as int8: 32-value formats (the block's values in order, 4 a word) */
template <int FMT>
struct RlxQOccQ8X {
    uint32_t q[8];
    float d;  /* dx */
    float s;  /* q4_1: dx * sum(q) (f32, as the reference) */
    int c;    /* q4_0: 8 sum(q) (the weights' offset of 8, taken from the integer dot) */
};
/* q4_k: a's words sub-block 2g's 16 values of the unit, b's sub-block 2g + 1's */
template <>
struct RlxQOccQ8X<RLX_Q4_K> {
    uint32_t a[4], b[4];
    float d0, d1;  /* dx of sub-blocks 2g, 2g + 1 */
    float s0, s1;  /* dx * sum(q) over each whole sub-block in the even lane of the pair, 0 in the odd one */
};

/* q = rint(x * inv) clipped to [-127, 127] (rlx_q8_quantize's rounding), 4 values packed into a word; sum += them */
__device__ __forceinline__ uint32_t rlx_qocc_q8_pack(const float *v, float inv, int &sum) {
    uint32_t w = 0;
#pragma unroll
    for (int k = 0; k < 4; k++) {
        int q = __float2int_rn(__fmul_rn(v[k], inv));
        q = q > 127 ? 127 : (q < -127 ? -127 : q);
        sum += q;
        w |= ((uint32_t)q & 0xFFu) << (8 * k);
    }
    return w;
}

/* d = max|x| / 127 and 1 / d (0 where d = 0), as rlx_q8_quantize */
__device__ __forceinline__ float rlx_qocc_q8_scale(float amax, float *inv) {
    const float d = __fdiv_rn(amax, 127.0f);
    *inv = d != 0.0f ? __frcp_rn(d) : 0.0f;
    return d;
}

/* The lane's unit of x (v: 32 values in chunk order, rlx_qocc_chunk) quantized. The whole warp calls (q4_k's pairs
   exchange their halves' max |x| and sum(q)). */
template <int FMT>
__device__ __forceinline__ void rlx_qocc_q8(const float v[32], int lane, RlxQOccQ8X<FMT> &x) {
    if constexpr (FMT == RLX_Q4_K) {
        float a0 = 0.0f, a1 = 0.0f;
#pragma unroll
        for (int e = 0; e < 16; e++) {
            a0 = fmaxf(a0, fabsf(v[e]));
            a1 = fmaxf(a1, fabsf(v[16 + e]));
        }
        a0 = fmaxf(a0, __shfl_xor_sync(0xffffffffu, a0, 1));
        a1 = fmaxf(a1, __shfl_xor_sync(0xffffffffu, a1, 1));
        float inv0, inv1;
        x.d0 = rlx_qocc_q8_scale(a0, &inv0);
        x.d1 = rlx_qocc_q8_scale(a1, &inv1);
        int s0 = 0, s1 = 0;
#pragma unroll
        for (int j = 0; j < 4; j++) {
            x.a[j] = rlx_qocc_q8_pack(v + 4 * j, inv0, s0);
            x.b[j] = rlx_qocc_q8_pack(v + 16 + 4 * j, inv1, s1);
        }
        s0 += __shfl_xor_sync(0xffffffffu, s0, 1);
        s1 += __shfl_xor_sync(0xffffffffu, s1, 1);
        x.s0 = (lane & 1) ? 0.0f : __fmul_rn(x.d0, (float)s0);
        x.s1 = (lane & 1) ? 0.0f : __fmul_rn(x.d1, (float)s1);
    } else {
        float a = 0.0f;
#pragma unroll
        for (int e = 0; e < 32; e++)
            a = fmaxf(a, fabsf(v[e]));
        float inv;
        x.d = rlx_qocc_q8_scale(a, &inv);
        int s = 0;
#pragma unroll
        for (int j = 0; j < 8; j++)
            x.q[j] = rlx_qocc_q8_pack(v + 4 * j, inv, s);
        x.s = __fmul_rn(x.d, (float)s); /* |sum| <= 32 * 127: exact in f32 */
        x.c = 8 * s;
    }
}

/* The lane's term of unit u of a loaded row against its int8 x (see above). */
template <int FMT>
struct RlxQOccQ8Dot {
    __device__ __forceinline__ explicit RlxQOccQ8Dot(int) {}
    __device__ __forceinline__ float operator()(const RlxQUnit<FMT> &a, const RlxQOccQ8X<FMT> &x, int) const {
        const float dw = __half2float(__ushort_as_half((unsigned short)(a.hd & 0xFFFF)));
        int dot = 0;
        if constexpr (FMT == RLX_Q8_0) {
#pragma unroll
            for (int j = 0; j < 8; j++)
                dot = __dp4a((int)a.q[j], (int)x.q[j], dot);
        } else {
            int hi = 0;
#pragma unroll
            for (int j = 0; j < 4; j++) {
                dot = __dp4a((int)(a.q[j] & 0x0F0F0F0Fu), (int)x.q[j], dot);
                hi = RLX_QOCC_DP4A_US(a.q[j] & 0xF0F0F0F0u, (int)x.q[j + 4], hi);
            }
            dot += hi >> 4; /* 16 times the high nibbles' dot: exact */
            if constexpr (FMT == RLX_Q4_0)
                dot -= x.c;
        }
        /* |dot| <= 32 * 128 * 127 < 2^24: exact as a float */
        float t = __fmul_rn(dw, x.d) * (float)dot;
        if constexpr (FMT == RLX_Q4_1)
            t = fmaf(__half2float(__ushort_as_half((unsigned short)(a.hd >> 16))), x.s, t);
        return t;
    }
};
template <>
struct RlxQOccQ8Dot<RLX_Q4_K> {
    RlxQOccQ4K c;
    __device__ __forceinline__ explicit RlxQOccQ8Dot(int u) : c(u) {}
    /* sub-block 2g's scale ds0 = d sc0, 2g + 1's taken as ds1 / 16 (its nibbles read as 16 q); mins dm = dmin m
       (all exact: an f16 times a 6-bit integer), the reference's weight_ints */
    __device__ __forceinline__ float operator()(const RlxQUnit<RLX_Q4_K> &a, const RlxQOccQ8X<RLX_Q4_K> &x,
                                                int) const {
        const uint4 &hd = a.hd, &q = a.q;
        const float dh = __half2float(__ushort_as_half((unsigned short)(hd.x & 0xFFFF)));
        const float dmin = __half2float(__ushort_as_half((unsigned short)(hd.x >> 16)));
        const uint32_t A = c.hi ? hd.w : hd.y, B = c.hi ? hd.w >> 4 : hd.z;
        const uint32_t sc = ((A >> c.sh) & c.mlo) | ((hd.y >> (c.sh + 2)) & c.mhi);
        const uint32_t mn = ((B >> c.sh) & c.mlo) | ((hd.z >> (c.sh + 2)) & c.mhi);
        const float ds0 = dh * (__uint_as_float(__byte_perm(sc, 0x4B000000u, 0x7540u)) - 8388608.0f);
        const float ds1 = (dh * 0.0625f) * (__uint_as_float(__byte_perm(sc, 0x4B000000u, 0x7541u)) - 8388608.0f);
        const float dm0 = dmin * (__uint_as_float(__byte_perm(mn, 0x4B000000u, 0x7540u)) - 8388608.0f);
        const float dm1 = dmin * (__uint_as_float(__byte_perm(mn, 0x4B000000u, 0x7541u)) - 8388608.0f);
        const uint32_t w[4] = {q.x, q.y, q.z, q.w};
        int lo = 0, hi = 0;
#pragma unroll
        for (int j = 0; j < 4; j++) {
            lo = __dp4a((int)(w[j] & 0x0F0F0F0Fu), (int)x.a[j], lo);
            hi = RLX_QOCC_DP4A_US(w[j] & 0xF0F0F0F0u, (int)x.b[j], hi);
        }
        return __fmul_rn(ds0, x.d0) * (float)lo + __fmul_rn(ds1, x.d1) * (float)hi - (dm0 * x.s0 + dm1 * x.s1);
    }
};

/* What the kernel holds of x and how it takes a unit's product: ACT 0 f32 (RlxQUnit's XFrag, RlxQOccDot), 1 int8 */
template <int FMT, int ACT>
struct RlxQOccAct {
    using X = typename RlxQUnit<FMT>::XFrag;
    using Dot = RlxQOccDot<FMT>;
};
template <int FMT>
struct RlxQOccAct<FMT, 1> {
    using X = RlxQOccQ8X<FMT>;
    using Dot = RlxQOccQ8Dot<FMT>;
};

/* The warp sums of G per-lane values (G a power of two, <= 32) in one butterfly: at each of the first log2(G) steps
   a lane keeps half of its values (the upper half where its lane bit is set) and adds the partner's copy of them,
   so G sums take 5 + G - 2 shuffles instead of 5 G (shuffles issue at a quarter of the SM's instruction rate).
   Returns the sum of value (lane / (32 / G)) in every lane. */
template <int G>
__device__ __forceinline__ float rlx_qocc_warp_sums(float v[G], int lane) {
#pragma unroll
    for (int n = G, o = 16; n > 1; n >>= 1, o >>= 1) {
        const bool up = lane & o;
#pragma unroll
        for (int i = 0; i < n / 2; i++) {
            const float keep = up ? v[i + n / 2] : v[i], send = up ? v[i] : v[i + n / 2];
            v[i] = keep + __shfl_xor_sync(0xffffffffu, send, o);
        }
    }
    float a = v[0];
#pragma unroll
    for (int o = 16 / G; o > 0; o >>= 1)
        a += __shfl_xor_sync(0xffffffffu, a, o);
    return a;
}

/* A block of q8_0 (34 bytes) or q4_0 (18 bytes) at `b`, only 2-byte aligned: its half scale into hd and its NW words
   of quants into q, from NW aligned 32-bit loads and one 16-bit load (instead of 2 NW + 1 16-bit loads, as
   rlx_q_u32_2 reads them: half the load instructions, and half the registers an item's loads hold in flight). With b
   4-byte aligned the words are b + 0 .. 4 NW - 1 (the scale in the low half of the first) and the 16-bit load the
   last 2 bytes of quants; with b = 2 mod 4 the words are the quants themselves and the 16-bit load the scale. Every
   byte read is the block's. */
template <int NW>
__device__ __forceinline__ void rlx_qocc_load_a2(const uint8_t *b, uint32_t &hd, uint32_t q[NW]) {
    const bool odd = ((uintptr_t)b & 2) != 0;
    const uint32_t *w = (const uint32_t *)(b + (odd ? 2 : 0));
    uint32_t v[NW + 1];
#pragma unroll
    for (int j = 0; j < NW; j++)
        v[j] = w[j];
    v[NW] = *(const unsigned short *)(odd ? b : b + 4 * NW);
    const uint32_t sh = odd ? 0u : 16u;
    hd = odd ? v[NW] : v[0] & 0xFFFFu;
#pragma unroll
    for (int j = 0; j < NW; j++)
        q[j] = __funnelshift_r(v[j], v[j + 1], sh);
}

/* The byte offsets of a lane's unit u in a weight row, computed once: its block (q4_k: the block's header) and, for
   q4_k, its 16 bytes of quants. A2 (the int8 walk): q8_0's and q4_0's blocks through rlx_qocc_load_a2. */
template <int FMT, int QB, bool A2 = false>
struct RlxQOccOff {
    int h, q;
    __device__ __forceinline__ explicit RlxQOccOff(int u) {
        h = FMT == RLX_Q4_K ? (u >> 3) * 144 : u * QB;
        q = FMT == RLX_Q4_K ? h + 16 + 16 * (u & 7) : h;
    }
    /* the lane's unit of `row` (RlxQUnit::load's bytes, from the offsets) */
    __device__ __forceinline__ void load(RlxQUnit<FMT> &a, const uint8_t *row) const {
        if constexpr (FMT == RLX_Q4_K) {
            a.hd = *(const uint4 *)(row + h);
            a.q = *(const uint4 *)(row + q);
        } else if constexpr (A2 && (FMT == RLX_Q8_0 || FMT == RLX_Q4_0)) {
            rlx_qocc_load_a2<FMT == RLX_Q8_0 ? 8 : 4>(row + h, a.hd, a.q);
        } else {
            a.load(row + h, 0);
        }
    }
    /* its bytes into L2 (no registers held; a warp's lanes cover its 32 units' contiguous bytes). HD false: q4_k's
       quants only, one address a lane (their 128-byte lines hold most of the headers too). */
    template <bool HD = true>
    __device__ __forceinline__ void prefetch(const uint8_t *row) const {
        if (FMT == RLX_Q4_K && HD)
            RLX_Q_PREFETCH(row + h);
        RLX_Q_PREFETCH(row + q);
    }
};

/* Blocks an SM __launch_bounds__ asks for (at most 64 registers a thread for 2): f32 x (34 registers) with G <= 2
   rows an item, int8 x (12) with G <= 4 */
#define RLX_QOCC_MIN_BLOCKS(G, ACT) ((G) <= 2 || ((ACT) && (G) <= 4) ? 2 : 1)

template <typename T, int FMT, int QK, int QB, bool NORM, int EPI, int G, bool PF = false, int ACT = 0>
__global__ void __launch_bounds__(RLX_QOCC_THREADS, RLX_QOCC_MIN_BLOCKS(G, ACT))
rlx_qgemv_occ(const T *__restrict__ X, const T *__restrict__ gamma, float eps, const __grid_constant__ RlxQMembers mem,
              const T *res, int64_t K, int64_t RB, int64_t rows, int64_t tr64) {
    static_assert(EPI != 2 || G % 2 == 0, "SwiGLU items take gate and up rows in pairs");
    using Unit = RlxQUnit<FMT>;
    RLX_DYNAMIC_SHARED(float4, rlx_qocc_smem4);
    float *part = (float *)rlx_qocc_smem4; /* [slab][TW] warp sums */
    __shared__ float red[RLX_QOCC_THREADS / 32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int nsub = (int)(K / 32), tr = (int)tr64, nrows = (int)rows, rb = (int)RB;
    const int nslab = (nsub + 31) / 32, R = (int)(blockDim.x >> 5) / nslab;
    const int s = warp % nslab, r = warp / nslab, u = 32 * s + lane;
    const int tiles = (nrows + tr - 1) / tr;
    constexpr int H = EPI == 2 ? G / 2 : G; /* output rows an item */
    const int TW = EPI == 2 ? 2 * tr : tr, items = (tr + H - 1) / H;
    const bool has = u < nsub;
    const RlxQOccOff<FMT, QB, ACT == 1> off(u);
    if (has && (int)blockIdx.x < tiles && r < items) {  /* the first item's weights into L2 while the kernel before ends */
#pragma unroll
        for (int i = 0; i < G; i++) {
            off.prefetch(rlx_qocc_row<EPI, G>(mem, blockIdx.x, r, i, tr, nrows, rb));
        }
    }
    rlx_pdl_wait();
    rlx_pdl_trigger(); /* the next kernel may launch and prefetch its weights */
    /* x of this lane's unit, as rlx_qgemv_body stages it (chunk sums: sequential without the norm, pairwise with),
       or (ACT) quantized to int8 */
    typename RlxQOccAct<FMT, ACT>::X x;
    {
        float v[32], cs[4];
#pragma unroll
        for (int i = 0; i < 4; i++) {
            if (has)
                rlx_load8(X + rlx_qocc_chunk<FMT>(u, i), v + 8 * i);
            else
#pragma unroll
                for (int e = 0; e < 8; e++)
                    v[8 * i + e] = 0.0f;
        }
        if constexpr (NORM) {
            float q = 0.0f;
#pragma unroll
            for (int e = 0; e < 32; e++)
                q = fmaf(v[e], v[e], q);
            q = rlx_warp_sum(q);
            if (lane == 0)
                red[warp] = q;
            __syncthreads();
            float tot = 0.0f;
            for (int w = 0; w < nslab; w++)
                tot += red[w];
            const float scale = rsqrtf(tot / (float)K + eps);
#pragma unroll
            for (int i = 0; i < 4; i++) {
                float g[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
                if (has)
                    rlx_load8(gamma + rlx_qocc_chunk<FMT>(u, i), g);
                float *c = v + 8 * i;
#pragma unroll
                for (int e = 0; e < 8; e++)
                    c[e] *= scale * g[e];
                cs[i] = ((c[0] + c[1]) + (c[2] + c[3])) + ((c[4] + c[5]) + (c[6] + c[7]));
            }
        } else {
#pragma unroll
            for (int i = 0; i < 4; i++) {
                float c = 0.0f;
#pragma unroll
                for (int e = 0; e < 8; e++)
                    c += v[8 * i + e];
                cs[i] = c;
            }
        }
        if constexpr (ACT) {
            rlx_qocc_q8<FMT>(v, lane, x);
        } else {
            rlx_qocc_frag<FMT>(v, cs, x);
        }
        if constexpr (FMT == RLX_Q4_K && !ACT) {  /* for rlx_qocc_bytes (the sums s0, s1 stay unscaled) */
#pragma unroll
            for (int e = 0; e < 16; e++) {
                x.a[e] *= RLX_QOCC_XSCALE;
                x.b[e] *= RLX_QOCC_XSCALE;
            }
        }
    }
    const typename RlxQOccAct<FMT, ACT>::Dot dot(u);
    for (int t = blockIdx.x; t < tiles; t += gridDim.x) {
        for (int p = r; p < items; p += R) {
            float acc[G];
            if (has) {
                if (PF && p + R < items) {  /* PF: the warp's next item into L2, before this item's loads take the
                                               registers (the prefetch holds none) */
#pragma unroll
                    for (int i = 0; i < G; i++)
                        off.template prefetch<false>(rlx_qocc_row<EPI, G>(mem, t, p + R, i, tr, nrows, rb));
                }
                Unit a[G];
#pragma unroll
                for (int i = 0; i < G; i++) {  /* the item's loads, all before any product */
                    off.load(a[i], rlx_qocc_row<EPI, G>(mem, t, p, i, tr, nrows, rb));
                }
#pragma unroll
                for (int i = 0; i < G; i++)
                    acc[i] = dot(a[i], x, u);
            } else {
#pragma unroll
                for (int i = 0; i < G; i++)
                    acc[i] = 0.0f;
            }
            const float sum = rlx_qocc_warp_sums<G>(acc, lane);
            const int i = lane / (32 / G), ti = EPI == 2 ? p * H + i % H : p * G + i;  /* lane 32 i / G stores row i */
            if (lane % (32 / G) == 0 && ti < tr && t * tr + ti < nrows)
                part[s * TW + ti + (EPI == 2 && i >= H ? tr : 0)] = sum;
        }
        __syncthreads();
        for (int i = threadIdx.x; i < tr; i += blockDim.x) {
            const int64_t rr = (int64_t)t * tr + i;
            if (rr >= rows)
                break;
            int64_t n;
            const int j = rlx_qf_member<EPI>(mem, rr, &n);
            float out = 0.0f, up = 0.0f;
            for (int w = 0; w < nslab; w++) {
                out += part[w * TW + i];
                if (EPI == 2)
                    up += part[w * TW + tr + i];
            }
            rlx_qf_store<T, EPI>((T *)rlx_qf_out(mem, EPI == 0 ? j : 0), n, out, up, res, n);
        }
        __syncthreads();
    }
}

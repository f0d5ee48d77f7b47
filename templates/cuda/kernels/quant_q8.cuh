/* ── Int8 activations for block-format weights (dequant_matmul act="q8"; follows kernels/quant.cuh) ──────────
 * x is quantized per block of 32 values exactly as rlx.ir.quant.quantize_act defines it (the reference's
 * semantics): d = max|x| / 127 (f32), q = rint(x * (1 / d)) clipped to [-127, 127] (0 where d = 0). A weight
 * block's integers (q8_0: q; q4_0: nibble - 8; q4_1 and each 32-value sub-block of q4_k: nibble; rlx.ir.quant's
 * weight_ints) are dotted with q in exact integer arithmetic, four products an instruction (__dp4a), and its scales
 * applied once per block:
 *     y += (dw * dx) * dot + mw * (dx * sum(q))      (dw * dx and dx * sum(q) rounded to f32, as the reference)
 * so only the f32 scaling and the order of the f32 sum over blocks differ from the reference.
 *
 * A quantized block is a record of 32-bit words: words 0-7 the 32 int8 values, 8 = d (f32 bits), 9 = d * sum(q)
 * (f32 bits), 10 = sum(q) (int). Records are REC words apart: RLX_Q8_REC in global memory (rlx_q8_act writes them,
 * rlx_q8_gemv reads them), RLX_QFUSED_PAD in rlx_qgemv_fused's shared memory, where rlx_q8_stage quantizes each
 * staged f32 sub-block in place (its 36-float slot), so a lane's three 16-byte loads of a record hit distinct banks
 * for the 8 lanes of a load phase, as the f32 staging does.
 *   rlx_q8_act    X [M, K] (compute type) -> records, or -> x' = q * d (the compute type: the prefill path
 *                 multiplies that with the dequantized weight, as the CPU's does)
 *   rlx_q8_gemv   decode (M <= RLX_QGEMV_MAX_M rows, outside a fused group): one warp per weight row over records
 *   rlx_q8_stage / rlx_q8_row  the fused decode GEMV's ACT = 1 path (kernels/quant.cuh's rlx_qgemv_fused). */

#define RLX_Q8_REC 12 /* words of a record in global memory (48 bytes: 16-byte aligned) */

/* One 32-value block held one value a lane (`x` is value `lane`; the whole warp calls): returns q, and d and
   sum(q) through the pointers (every lane gets them). The maximum and the sum are exact in any order. */
__device__ __forceinline__ int rlx_q8_quantize(float x, float *d_out, int *sum_out) {
    float a = fabsf(x);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        a = fmaxf(a, __shfl_xor_sync(0xffffffffu, a, o));
    const float d = __fdiv_rn(a, 127.0f);
    const float inv = d != 0.0f ? __frcp_rn(d) : 0.0f;
    int q = __float2int_rn(__fmul_rn(x, inv));
    q = q > 127 ? 127 : (q < -127 ? -127 : q);
    float s = (float)q; /* |sum| <= 32 * 127: exact in f32 */
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        s += __shfl_xor_sync(0xffffffffu, s, o);
    *d_out = d;
    *sum_out = (int)s;
    return q;
}

/* The record at `rec` of one block (the warp's values already read: the caller has called rlx_q8_quantize). */
__device__ __forceinline__ void rlx_q8_put(uint32_t *rec, int lane, int q, float d, int sum) {
    ((int8_t *)rec)[lane] = (int8_t)q;
    if (lane == 0) {
        rec[8] = __float_as_uint(d);
        rec[9] = __float_as_uint(__fmul_rn(d, (float)sum));
        rec[10] = (uint32_t)sum;
    }
}

/* Records (rec != nullptr, [M, K / 32] of RLX_Q8_REC words) or x' = q * d (xd != nullptr) of X [M, K]: one warp per
   block of 32 values. */
template <typename T>
__global__ void rlx_q8_act(const T *__restrict__ X, int64_t M, int64_t K, uint32_t *__restrict__ rec,
                           T *__restrict__ xd) {
    const int lane = threadIdx.x & 31;
    const int64_t blocks = M * (K / 32), warps = (int64_t)gridDim.x * (blockDim.x >> 5);
    for (int64_t b = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5; b < blocks; b += warps) {
        float d;
        int sum;
        const int q = rlx_q8_quantize(rlx_f(X[b * 32 + lane]), &d, &sum);
        if (rec != nullptr)
            rlx_q8_put(rec + b * RLX_Q8_REC, lane, q, d, sum);
        if (xd != nullptr)
            xd[b * 32 + lane] = rlx_to<T>(__fmul_rn((float)q, d));
    }
}

/* rlx_qgemv_fused's staged f32 rows [MR][nsub slots of RLX_QFUSED_PAD floats] -> records in the same slots: one warp
   per block (each warp reads its block's 32 floats before any lane writes into the slot). */
template <int MR>
__device__ void rlx_q8_stage(float *xs, int64_t stride, int64_t nsub) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    for (int64_t i = warp; i < MR * nsub; i += warps) {
        float *slot = xs + (i / nsub) * stride + (i % nsub) * RLX_QFUSED_PAD;
        float d;
        int sum;
        const int q = rlx_q8_quantize(slot[lane], &d, &sum);
        __syncwarp();
        rlx_q8_put((uint32_t *)slot, lane, q, d, sum);
    }
}

/* acc[m] += the block of weight unit `w` (a 32-value block of q8_0 / q4_0 / q4_1, as loaded by RlxQUnit) against the
   record at x + m * stride. */
template <int FMT, int MR>
__device__ __forceinline__ void rlx_q8_block(const RlxQUnit<FMT> &w, const uint32_t *x, int64_t stride,
                                             float acc[MR]) {
    const float dw = __half2float(__ushort_as_half((unsigned short)(w.hd & 0xFFFF)));
    int wq[8]; /* the weight's integers as bytes, in the order of the record's words */
    if constexpr (FMT == RLX_Q8_0) {
#pragma unroll
        for (int j = 0; j < 8; j++)
            wq[j] = (int)w.q[j];
    } else { /* word j: the low nibbles are values 4j..4j+3, the high ones 16+4j..16+4j+3 */
#pragma unroll
        for (int j = 0; j < 4; j++) {
            wq[j] = (int)(w.q[j] & 0x0F0F0F0Fu);
            wq[j + 4] = (int)((w.q[j] >> 4) & 0x0F0F0F0Fu);
        }
    }
#pragma unroll
    for (int m = 0; m < MR; m++) {
        const uint4 *r = (const uint4 *)(x + m * stride);
        const uint4 a = r[0], b = r[1], h = r[2];
        int dot = __dp4a(wq[0], (int)a.x, 0);
        dot = __dp4a(wq[1], (int)a.y, dot);
        dot = __dp4a(wq[2], (int)a.z, dot);
        dot = __dp4a(wq[3], (int)a.w, dot);
        dot = __dp4a(wq[4], (int)b.x, dot);
        dot = __dp4a(wq[5], (int)b.y, dot);
        dot = __dp4a(wq[6], (int)b.z, dot);
        dot = __dp4a(wq[7], (int)b.w, dot);
        if constexpr (FMT == RLX_Q4_0)
            dot -= 8 * (int)h.z;
        /* |dot| <= 32 * 128 * 127 < 2^24: exact as a float */
        float t = __fmul_rn(dw, __uint_as_float(h.x)) * (float)dot;
        if constexpr (FMT == RLX_Q4_1)
            t = fmaf(__half2float(__ushort_as_half((unsigned short)(w.hd >> 16))), __uint_as_float(h.y), t);
        acc[m] += t;
    }
}

/* One unit of a weight row for int8 activations, loaded (load) and then dotted with the records (add): a 32-value
   block of q8_0 / q4_0 / q4_1 (RlxQUnit's loads). */
template <int FMT> struct RlxQ8Unit {
    RlxQUnit<FMT> w;
    static __device__ __forceinline__ int64_t count(int64_t K) { return K / 32; }
    __device__ __forceinline__ void load(const uint8_t *__restrict__ row, int64_t u) { w.load(row, u); }
    template <int MR, int REC>
    __device__ __forceinline__ void add(const uint32_t *x, int64_t stride, int64_t u, float acc[MR]) const {
        rlx_q8_block<FMT, MR>(w, x + u * REC, stride, acc);
    }
};

/* q4_k: 32 bytes of quants, whose low nibbles are sub-block 2g and high nibbles sub-block 2g + 1 of a block (unit u:
   block u / 4, group g = u % 4, so sub-blocks 2u and 2u + 1 of the row), and the block's 16-byte header (d, dmin,
   the 6-bit scales and mins), shared by its 4 units. Sub-block j: scale ds = d * sc_j, min dm = dmin * m_j (f32, as
   GGUF dequantizes: value = ds * q - dm), so y += (ds * dx) * dot - dm * (dx * sum(q)). */
template <> struct RlxQ8Unit<RLX_Q4_K> {
    uint4 hd, lo, hi;
    static __device__ __forceinline__ int64_t count(int64_t K) { return K / 64; }
    __device__ __forceinline__ void load(const uint8_t *__restrict__ row, int64_t u) {
        const uint8_t *b = row + (u >> 2) * 144;
        hd = *(const uint4 *)b;
        const uint4 *q = (const uint4 *)(b + 16 + 32 * (u & 3));
        lo = q[0];
        hi = q[1];
    }
    template <int MR, int REC>
    __device__ __forceinline__ void add(const uint32_t *x, int64_t stride, int64_t u, float acc[MR]) const {
        const int g = (int)(u & 3);
        float ds[2], dm[2];
        rlx_q4k_scales(hd, g, ds, dm);  /* sub-blocks 2g and 2g + 1 (kernels/quant.cuh) */
        const uint32_t qw[8] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
        int wl[8], wh[8]; /* word k: values 4k..4k+3 of sub-block 2g (low nibbles) and of 2g + 1 (high) */
#pragma unroll
        for (int k = 0; k < 8; k++) {
            wl[k] = (int)(qw[k] & 0x0F0F0F0Fu);
            wh[k] = (int)((qw[k] >> 4) & 0x0F0F0F0Fu);
        }
#pragma unroll
        for (int m = 0; m < MR; m++) {
            const uint32_t *s0 = x + (2 * u) * REC + m * stride;
            const uint4 *r0 = (const uint4 *)s0, *r1 = (const uint4 *)(s0 + REC);
            const uint4 a0 = r0[0], b0 = r0[1], h0 = r0[2], a1 = r1[0], b1 = r1[1], h1 = r1[2];
            int d0 = __dp4a(wl[0], (int)a0.x, 0), d1 = __dp4a(wh[0], (int)a1.x, 0);
            d0 = __dp4a(wl[1], (int)a0.y, d0);
            d1 = __dp4a(wh[1], (int)a1.y, d1);
            d0 = __dp4a(wl[2], (int)a0.z, d0);
            d1 = __dp4a(wh[2], (int)a1.z, d1);
            d0 = __dp4a(wl[3], (int)a0.w, d0);
            d1 = __dp4a(wh[3], (int)a1.w, d1);
            d0 = __dp4a(wl[4], (int)b0.x, d0);
            d1 = __dp4a(wh[4], (int)b1.x, d1);
            d0 = __dp4a(wl[5], (int)b0.y, d0);
            d1 = __dp4a(wh[5], (int)b1.y, d1);
            d0 = __dp4a(wl[6], (int)b0.z, d0);
            d1 = __dp4a(wh[6], (int)b1.z, d1);
            d0 = __dp4a(wl[7], (int)b0.w, d0);
            d1 = __dp4a(wh[7], (int)b1.w, d1);
            const float t0 = fmaf(-dm[0], __uint_as_float(h0.y), __fmul_rn(ds[0], __uint_as_float(h0.x)) * (float)d0);
            const float t1 = fmaf(-dm[1], __uint_as_float(h1.y), __fmul_rn(ds[1], __uint_as_float(h1.x)) * (float)d1);
            acc[m] += t0 + t1;
        }
    }
};

/* acc[m] (per lane; the caller sums the warp) += this lane's units of one weight row against record row m (records
   REC words apart, rows `stride` words apart); RLX_QF_INFLIGHT units loaded before any is used. */
template <int FMT, int MR, int REC>
__device__ void rlx_q8_row(const uint8_t *__restrict__ row, const uint32_t *x, int64_t stride, int64_t K, int lane,
                           float acc[MR]) {
    rlx_q_walk<RlxQ8Unit<FMT>>(row, K, lane,
                               [&](const RlxQ8Unit<FMT> &a, int64_t u) { a.template add<MR, REC>(x, stride, u, acc); });
}

/* Y[m, n] = sum over blocks of X[m]'s records (rlx_q8_act) against weight row n, m < MR: one warp per weight row. */
template <typename T, int FMT, int MR>
__global__ void __launch_bounds__(32 * RLX_QGEMV_WARPS)
rlx_q8_gemv(const uint32_t *__restrict__ XQ, const uint8_t *__restrict__ W, T *__restrict__ Y, int64_t N, int64_t K,
            int64_t RB) {
    const int lane = threadIdx.x & 31;
    const int64_t n = (int64_t)blockIdx.x * RLX_QGEMV_WARPS + (threadIdx.x >> 5);
    if (n >= N)
        return; /* the whole warp: n is per warp */
    float acc[MR];
#pragma unroll
    for (int m = 0; m < MR; m++)
        acc[m] = 0.0f;
    rlx_q8_row<FMT, MR, RLX_Q8_REC>(W + n * RB, XQ, (K / 32) * RLX_Q8_REC, K, lane, acc);
    rlx_q_warp_store<T, MR>(acc, Y, N, n, lane);
}

/* ── Int8 activations for block-format weights (dequant_matmul act="q8"; follows kernels/quant.cuh) ──────────
 * x is quantized per block of 32 values exactly as rlx.ir.quant.quantize_act defines it (the reference's
 * semantics): d = max|x| / 127 (f32), q = rint(x * (1 / d)) clipped to [-127, 127] (0 where d = 0). A weight
 * block's integers (q8_0: q; q4_0: nibble - 8; q4_1: nibble) are dotted with q in exact integer arithmetic, four
 * products an instruction (__dp4a), and its scales applied once per block:
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

/* acc[m] (per lane; the caller sums the warp) += this lane's blocks of one weight row against record row m
   (records REC words apart, rows `stride` words apart); RLX_QF_INFLIGHT blocks loaded before any is used. */
template <int FMT, int MR, int REC>
__device__ void rlx_q8_row(const uint8_t *__restrict__ row, const uint32_t *x, int64_t stride, int64_t K, int lane,
                           float acc[MR]) {
    const int64_t units = K / 32;
    int64_t u = lane;
    for (; u + 32 * (RLX_QF_INFLIGHT - 1) < units; u += 32 * RLX_QF_INFLIGHT) {
        RlxQUnit<FMT> a[RLX_QF_INFLIGHT];
#pragma unroll
        for (int i = 0; i < RLX_QF_INFLIGHT; i++)
            a[i].load(row, u + 32 * i);
#pragma unroll
        for (int i = 0; i < RLX_QF_INFLIGHT; i++)
            rlx_q8_block<FMT, MR>(a[i], x + (u + 32 * i) * REC, stride, acc);
    }
    for (; u < units; u += 32) {
        RlxQUnit<FMT> a;
        a.load(row, u);
        rlx_q8_block<FMT, MR>(a, x + u * REC, stride, acc);
    }
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
#pragma unroll
    for (int m = 0; m < MR; m++) {
        float a = acc[m];
        for (int o = 16; o > 0; o >>= 1)
            a += __shfl_xor_sync(0xffffffffu, a, o);
        if (lane == 0)
            Y[m * N + n] = rlx_to<T>(a);
    }
}

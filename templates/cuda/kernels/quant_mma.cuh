/* ── Batched decode steps on quantized weights through the tensor cores (rlx_qmma, f16 / bf16) ──────────────
 * Y[M, N] = X[M, K] W[N, K]^T for steps of 2..64 rows of X (the rows a `QuantMma` decision names), W in q4_k,
 * q4_0, q4_1 or q8_0 blocks. The paths it replaces dequantized every weight into an f16 copy in device memory and ran
 * cuBLASLt on it (an 8B model: 16 GB written and read again per step), or walked each weight row per warp with
 * 32 FMAs per value and row of X (rlx_qgemv: 8 rows took 6x one). Here the weights cross device memory once, as
 * blocks, and are dequantized in registers straight into the mma's fragments:
 *  - a block owns 16 consecutive weight rows (the m16n8k16 product's M side); its RLX_QMMA_WARPS warps deal the
 *    rows' units between them (a unit: 64 values of q4_k, the two sub-blocks sharing their bytes, or one 32-value
 *    block), warp w taking units w, w + WARPS, ...: at any time the block reads a contiguous run of each row;
 *  - K's order inside a unit is permuted the same way for both operands, which a dot product allows: lane
 *    (g, t) takes the 4 consecutive values 16 s + 4 t .. + 3 of mma step s, so its weights come from one 32-bit
 *    word of quants a row and its X fragment (rows of X are the product's N side, 8 per fragment) is one 8-byte
 *    load, X[m, 16 s + 4 t ..];
 *  - each value is GGUF's arithmetic in f32 (scale * q - min), rounded to T once, as rlx_qdequant_t rounds it;
 *    f32 accumulators; the warps' partial sums meet in shared memory, in warp order, and are rounded to T once.
 * K is a multiple of the block size, rows of X start on 8-byte boundaries. Uses rlx_q_half, rlx_q_u32(_2),
 * rlx_q4k_scales (quant.cuh) and RlxGemmMmaOp (gemm_mma.cuh). */

#define RLX_QMMA_MAX_M 64  /* the most rows of X a launch takes (8 fragments of 8); which steps take it: QuantMma */
#ifndef RLX_QMMA_WARPS
#define RLX_QMMA_WARPS 8
#endif

/* One unit of one weight row for lane (g, t): the words it needs, then its 4 values of each mma step. */
template <int FMT> struct RlxQmmaUnit;
template <> struct RlxQmmaUnit<RLX_Q4_K> {  /* sub-blocks 2p and 2p + 1 of a 256-value block: steps 0-1, 2-3 */
    static constexpr int VALS = 64, STEPS = 4;
    float ds[2], dm[2];
    uint32_t w[2];
    __device__ __forceinline__ void load(const uint8_t *__restrict__ row, int64_t u, int t) {
        const uint8_t *b = row + (u >> 2) * 144;
        const int p = (int)(u & 3);
        rlx_q4k_scales(*reinterpret_cast<const uint4 *>(b), p, ds, dm);
        w[0] = rlx_q_u32(b + 16 + 32 * p + 4 * t);
        w[1] = rlx_q_u32(b + 16 + 32 * p + 16 + 4 * t);
    }
    __device__ __forceinline__ void vals(int s, float v[4]) const {
        const uint32_t q = (w[s & 1] >> (s >= 2 ? 4 : 0)) & 0x0F0F0F0Fu;
        const float d = ds[s >> 1], m = dm[s >> 1];
#pragma unroll
        for (int i = 0; i < 4; i++)
            v[i] = d * (float)((q >> (8 * i)) & 0xFF) - m;
    }
};
template <int FMT> struct RlxQmmaUnit32 {  /* q4_0 / q4_1: values i and i + 16 share byte i */
    static constexpr int VALS = 32, STEPS = 2;
    float d, m;
    uint32_t w;
    __device__ __forceinline__ void load(const uint8_t *__restrict__ row, int64_t u, int t) {
        if (FMT == RLX_Q4_1) {
            const uint8_t *b = row + u * 20;
            d = rlx_q_half(b);
            m = rlx_q_half(b + 2);
            w = rlx_q_u32(b + 4 + 4 * t);
        } else {
            const uint8_t *b = row + u * 18;
            d = rlx_q_half(b);
            m = -8.0f * d;
            w = rlx_q_u32_2(b + 2 + 4 * t);
        }
    }
    __device__ __forceinline__ void vals(int s, float v[4]) const {
        const uint32_t q = (w >> (4 * s)) & 0x0F0F0F0Fu;
#pragma unroll
        for (int i = 0; i < 4; i++)
            v[i] = FMT == RLX_Q4_1 ? d * (float)((q >> (8 * i)) & 0xFF) + m : d * (float)((int)((q >> (8 * i)) & 0xFF) - 8);
    }
};
template <> struct RlxQmmaUnit<RLX_Q4_0> : RlxQmmaUnit32<RLX_Q4_0> {};
template <> struct RlxQmmaUnit<RLX_Q4_1> : RlxQmmaUnit32<RLX_Q4_1> {};
template <> struct RlxQmmaUnit<RLX_Q8_0> {  /* a half scale, then 32 signed bytes */
    static constexpr int VALS = 32, STEPS = 2;
    float d;
    uint32_t w[2];
    __device__ __forceinline__ void load(const uint8_t *__restrict__ row, int64_t u, int t) {
        const uint8_t *b = row + u * 34;
        d = rlx_q_half(b);
        w[0] = rlx_q_u32_2(b + 2 + 4 * t);
        w[1] = rlx_q_u32_2(b + 2 + 16 + 4 * t);
    }
    __device__ __forceinline__ void vals(int s, float v[4]) const {
#pragma unroll
        for (int i = 0; i < 4; i++)
            v[i] = (float)(int8_t)((w[s] >> (8 * i)) & 0xFF) * d;
    }
};

/* acc[j] += the unit's 16 weight rows (a0: row g, a1: row g + 8) times X's fragment j at columns k0 + .. */
template <typename T, typename Unit, int NT>
__device__ __forceinline__ void rlx_qmma_unit(float (&acc)[NT][4], const Unit &a0, const Unit &a1,
                                              const T *const (&xr)[NT], int64_t k0) {
    uint2 xb[NT][Unit::STEPS];
#pragma unroll
    for (int j = 0; j < NT; j++)
#pragma unroll
        for (int s = 0; s < Unit::STEPS; s++)
            xb[j][s] = *reinterpret_cast<const uint2 *>(xr[j] + k0 + 16 * s);
#pragma unroll
    for (int s = 0; s < Unit::STEPS; s++) {
        float v0[4], v1[4];
        a0.vals(s, v0);
        a1.vals(s, v1);
        const uint32_t a[4] = {RlxGemmMmaOp<T>::pack(v0[0], v0[1]), RlxGemmMmaOp<T>::pack(v1[0], v1[1]),
                               RlxGemmMmaOp<T>::pack(v0[2], v0[3]), RlxGemmMmaOp<T>::pack(v1[2], v1[3])};
#pragma unroll
        for (int j = 0; j < NT; j++)
            RlxGemmMmaOp<T>::mma(acc[j], a, xb[j][s].x, xb[j][s].y);
    }
}

/* NT: 8-row fragments of X (1, 2, 4 or 8 launched); the fragment rows from M on read row 0 and are not stored. */
template <typename T, int FMT, int NT>
__global__ void __launch_bounds__(32 * RLX_QMMA_WARPS)
rlx_qmma(const T *__restrict__ X, const uint8_t *__restrict__ W, T *__restrict__ Y, int64_t M, int64_t N, int64_t K,
         int64_t RB) {
    using Unit = RlxQmmaUnit<FMT>;
    constexpr int WARPS = RLX_QMMA_WARPS;
    __shared__ float red[WARPS][NT * 4][32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    const int64_t n0 = (int64_t)blockIdx.x * 16;
    /* rows past N (the last block) read row N - 1 and are not stored */
    const uint8_t *row0 = W + (n0 + g < N ? n0 + g : N - 1) * RB;
    const uint8_t *row1 = W + (n0 + g + 8 < N ? n0 + g + 8 : N - 1) * RB;
    const T *xr[NT];
#pragma unroll
    for (int j = 0; j < NT; j++)
        xr[j] = X + (j * 8 + g < M ? j * 8 + g : 0) * K + 4 * t;
    float acc[NT][4];
#pragma unroll
    for (int j = 0; j < NT; j++)
        acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.0f;
    const int64_t units = K / Unit::VALS;
    /* two units of each row in flight a warp: their words are loaded before either is multiplied */
    for (int64_t u = warp; u < units; u += 2 * WARPS) {
        const bool two = u + WARPS < units;
        Unit a0, a1, b0, b1;
        a0.load(row0, u, t);
        a1.load(row1, u, t);
        if (two) {
            b0.load(row0, u + WARPS, t);
            b1.load(row1, u + WARPS, t);
        }
        rlx_qmma_unit<T, Unit, NT>(acc, a0, a1, xr, u * Unit::VALS);
        if (two)
            rlx_qmma_unit<T, Unit, NT>(acc, b0, b1, xr, (u + WARPS) * Unit::VALS);
    }
#pragma unroll
    for (int j = 0; j < NT; j++)
#pragma unroll
        for (int e = 0; e < 4; e++)
            red[warp][j * 4 + e][lane] = acc[j][e];
    __syncthreads();
    /* output (m, r): row n0 + r, fragment j = m / 8, its lane (g, t) = (r % 8, (m % 8) / 2), element
       e = 2 (r / 8) + m % 2; consecutive threads store consecutive weight rows of one row of Y */
    for (int o = threadIdx.x; o < NT * 8 * 16; o += 32 * WARPS) {
        const int m = o >> 4, r = o & 15;
        const int j = m >> 3, e = 2 * (r >> 3) + (m & 1), l = (r & 7) * 4 + ((m & 7) >> 1);
        float sum = 0.0f;
#pragma unroll
        for (int w = 0; w < WARPS; w++)
            sum += red[w][j * 4 + e][l];
        if (m < M && n0 + r < N)
            Y[(int64_t)m * N + n0 + r] = rlx_to<T>(sum);
    }
}

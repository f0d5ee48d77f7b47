/* ── Weights in GGUF block formats (q8_0, q4_0, q4_1, q5_0, q5_1, q4_k, q6_k) ─────────────────────────
 * A weight W[N, K] is stored as GGUF does: row n is K / QK blocks of QB bytes (rlx/ir/quant.py documents every
 * layout). Every block, and every field inside one, starts at an even byte offset (QB and the header fields are
 * even), so 16-bit loads are always aligned; formats whose QB is a multiple of 4 use 32-bit loads.
 *
 * Kernels work on 32-value sub-blocks (a whole block of the 32-value formats, an eighth of a k-quant block):
 *   rlx_qgemv       decode, M <= RLX_QGEMV_MAX_M rows of X: one warp per weight row, lanes take consecutive
 *                   sub-blocks (a warp reads a contiguous run of the row), each sub-block dequantized in registers
 *                   and dotted with every row of X; f32 accumulation, one warp-shuffle sum per output.
 *   rlx_qgemv_short one row of X, K < 1024: a warp deals the sub-blocks of 16 consecutive rows to its lanes.
 *   rlx_qdequant_t  prefill: a tile of weight rows dequantized into a [K, nt] matrix of the compute type (the
 *                   right operand of a row-major GEMM), then cuBLASLt (tensor cores in f16/bf16) or the built-in
 *                   tiled GEMM multiplies it; rlx_q_put_cols places a tile's columns when N is split.
 *   rlx_qdequant_rows  rows of blocks to values (a gathered embedding row).
 * Dequantization is GGUF's float arithmetic (d * q + m has an exact product, so a fused multiply-add rounds it
 * the same way). */

enum { RLX_Q8_0 = 0, RLX_Q4_0 = 1, RLX_Q4_1 = 2, RLX_Q5_0 = 3, RLX_Q5_1 = 4, RLX_Q4_K = 5, RLX_Q6_K = 6 };
/* Rows of X up to which decode runs rlx_qgemv (beyond: dequantized tiles + GEMM). 8, measured on an H100 with
 * the 8B shape: 8 rows a step took 27.2 ms as dequantize + GEMM (every weight written and read again as f16),
 * see docs/perf-h100.md. */
#define RLX_QGEMV_MAX_M 8
#define RLX_QGEMV_WARPS 4

__device__ __forceinline__ float rlx_q_half(const uint8_t *p) {
    return __half2float(__ushort_as_half(*(const unsigned short *)p));
}

__device__ __forceinline__ uint32_t rlx_q_u32(const uint8_t *p) { return *(const uint32_t *)p; }

__device__ __forceinline__ uint32_t rlx_q_u32_2(const uint8_t *p) {  /* 2-byte aligned 32-bit word */
    const unsigned short *h = (const unsigned short *)p;
    return (uint32_t)h[0] | ((uint32_t)h[1] << 16);
}

/* v[0..31] = values 32*sub .. 32*sub+31 of the block at `b`. */
template <int FMT>
__device__ __forceinline__ void rlx_q_sub(const uint8_t *__restrict__ b, int sub, float v[32]) {
    if (FMT == RLX_Q8_0) {
        const float d = rlx_q_half(b);
        const unsigned short *q = (const unsigned short *)(b + 2);
#pragma unroll
        for (int j = 0; j < 16; j++) {
            const unsigned short u = q[j];
            v[2 * j] = (float)(int8_t)(u & 0xFF) * d;
            v[2 * j + 1] = (float)(int8_t)(u >> 8) * d;
        }
    } else if (FMT == RLX_Q4_0 || FMT == RLX_Q4_1) {
        const float d = rlx_q_half(b);
        const float m = FMT == RLX_Q4_1 ? rlx_q_half(b + 2) : 0.0f;
        const uint8_t *qs = b + (FMT == RLX_Q4_1 ? 4 : 2);
#pragma unroll
        for (int j = 0; j < 4; j++) {
            const uint32_t u = FMT == RLX_Q4_1 ? rlx_q_u32(qs + 4 * j) : rlx_q_u32_2(qs + 4 * j);
#pragma unroll
            for (int t = 0; t < 4; t++) {
                const int byte = (u >> (8 * t)) & 0xFF;
                if (FMT == RLX_Q4_1) {
                    v[4 * j + t] = d * (float)(byte & 0x0F) + m;
                    v[4 * j + t + 16] = d * (float)(byte >> 4) + m;
                } else {
                    v[4 * j + t] = d * (float)((byte & 0x0F) - 8);
                    v[4 * j + t + 16] = d * (float)((byte >> 4) - 8);
                }
            }
        }
    } else if (FMT == RLX_Q5_0 || FMT == RLX_Q5_1) {
        const int one = FMT == RLX_Q5_1;
        const float d = rlx_q_half(b);
        const float m = one ? rlx_q_half(b + 2) : 0.0f;
        const uint32_t qh = one ? rlx_q_u32(b + 4) : rlx_q_u32_2(b + 2);
        const uint8_t *qs = b + (one ? 8 : 6);
#pragma unroll
        for (int j = 0; j < 4; j++) {
            const uint32_t u = one ? rlx_q_u32(qs + 4 * j) : rlx_q_u32_2(qs + 4 * j);
#pragma unroll
            for (int t = 0; t < 4; t++) {
                const int i = 4 * j + t, byte = (u >> (8 * t)) & 0xFF;
                const int lo = (byte & 0x0F) | (int)((qh >> i) & 1u) << 4;
                const int hi = (byte >> 4) | (int)((qh >> (i + 16)) & 1u) << 4;
                if (one) {
                    v[i] = d * (float)lo + m;
                    v[i + 16] = d * (float)hi + m;
                } else {
                    v[i] = d * (float)(lo - 16);
                    v[i + 16] = d * (float)(hi - 16);
                }
            }
        }
    } else if (FMT == RLX_Q4_K) {
        /* sub-block j: the low (j even) or high (j odd) nibbles of the 32 bytes at 16 + 32 * (j / 2) */
        const float d = rlx_q_half(b), dmin = rlx_q_half(b + 2);
        const uint8_t *s = b + 4;
        const int j = sub;
        const int sc = j < 4 ? s[j] & 63 : (s[j + 4] & 0x0F) | ((s[j - 4] >> 6) << 4);
        const int mn = j < 4 ? s[j + 4] & 63 : (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
        const float ds = d * (float)sc, dm = dmin * (float)mn;
        const uint8_t *qs = b + 16 + 32 * (j / 2);
        const int shift = (j & 1) * 4;
#pragma unroll
        for (int w = 0; w < 8; w++) {
            const uint32_t u = rlx_q_u32(qs + 4 * w);
#pragma unroll
            for (int t = 0; t < 4; t++)
                v[4 * w + t] = ds * (float)((u >> (8 * t + shift)) & 0x0F) - dm;
        }
    } else {  /* RLX_Q6_K: sub-block s is group g = s % 4 of half s / 4 */
        const int half = sub / 4, g = sub % 4;
        const float d = rlx_q_half(b + 208);
        const uint8_t *ql = b + 64 * half + (g & 1) * 32, *qh = b + 128 + 32 * half;
        const int8_t *sc = (const int8_t *)(b + 192 + 8 * half);
        const int nib = (g >> 1) * 4, hs = 2 * g;
        const float d0 = d * (float)sc[2 * g], d1 = d * (float)sc[2 * g + 1];
#pragma unroll
        for (int l = 0; l < 32; l++) {
            const int q = (((ql[l] >> nib) & 0x0F) | (((qh[l] >> hs) & 3) << 4)) - 32;
            v[l] = (l < 16 ? d0 : d1) * (float)q;
        }
    }
}

/* Y[m * N + n] = the warp's sum of its lanes' acc[m], for m < MR (lane 0 stores). */
template <typename T, int MR>
__device__ __forceinline__ void rlx_q_warp_store(const float acc[MR], T *__restrict__ Y, int64_t N, int64_t n,
                                                 int lane) {
#pragma unroll
    for (int m = 0; m < MR; m++) {
        float a = acc[m];
        for (int o = 16; o > 0; o >>= 1)
            a += __shfl_xor_sync(0xffffffffu, a, o);
        if (lane == 0)
            Y[m * N + n] = rlx_to<T>(a);
    }
}

/* Y[m, n] = X[m, :] . W[n, :] for m < MR: one warp per weight row. */
template <typename T, int FMT, int QK, int QB, int MR>
__global__ void __launch_bounds__(32 * RLX_QGEMV_WARPS)
rlx_qgemv(const T *__restrict__ X, const uint8_t *__restrict__ W, T *__restrict__ Y, int64_t N, int64_t K,
          int64_t RB) {
    const int lane = threadIdx.x & 31;
    const int64_t n = (int64_t)blockIdx.x * RLX_QGEMV_WARPS + (threadIdx.x >> 5);
    if (n >= N)
        return;  /* the whole warp: n is per warp */
    const uint8_t *row = W + n * RB;
    const int64_t nsub = K / 32;
    float acc[MR];
#pragma unroll
    for (int m = 0; m < MR; m++)
        acc[m] = 0.0f;
    for (int64_t s = lane; s < nsub; s += 32) {
        float v[32];
        rlx_q_sub<FMT>(row + (s / (QK / 32)) * QB, (int)(s % (QK / 32)), v);
        /* the sub-block's 32 values of each row of X in 16-byte loads (K is a multiple of 32 and rows of X start
           on 16-byte boundaries, so every load is aligned) */
        constexpr int PER = 16 / (int)sizeof(T);
#pragma unroll
        for (int m = 0; m < MR; m++) {
            const uint4 *x = reinterpret_cast<const uint4 *>(X + m * K + s * 32);
            float p = 0.0f;
#pragma unroll
            for (int c = 0; c < 32 / PER; c++) {
                const uint4 raw = x[c];
                const T *e = reinterpret_cast<const T *>(&raw);
#pragma unroll
                for (int t = 0; t < PER; t++)
                    p = fmaf(rlx_f(e[t]), v[c * PER + t], p);
            }
            acc[m] += p;
        }
    }
    rlx_q_warp_store<T, MR>(acc, Y, N, n, lane);
}

/* Wt[k, j] = W[j, k] for the nt rows of W at `W` (a [K, nt] row-major matrix): one thread per (row, sub-block),
 * consecutive threads on consecutive rows so the stores of a warp are contiguous. */
template <typename T, int FMT, int QK, int QB>
__global__ void rlx_qdequant_t(const uint8_t *__restrict__ W, int64_t RB, int64_t K, int64_t nt, T *__restrict__ Wt) {
    const int64_t nsub = K / 32, total = nt * nsub;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t j = i % nt, s = i / nt;
        float v[32];
        rlx_q_sub<FMT>(W + j * RB + (s / (QK / 32)) * QB, (int)(s % (QK / 32)), v);
#pragma unroll
        for (int t = 0; t < 32; t++)
            Wt[(s * 32 + t) * nt + j] = rlx_to<T>(v[t]);
    }
}

/* Y[r, :] = the values of row r of blocks (rows of RB bytes, K values). */
template <typename T, int FMT, int QK, int QB>
__global__ void rlx_qdequant_rows(const uint8_t *__restrict__ X, int64_t RB, int64_t K, int64_t rows,
                                  T *__restrict__ Y) {
    const int64_t nsub = K / 32, total = rows * nsub;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t r = i / nsub, s = i % nsub;
        float v[32];
        rlx_q_sub<FMT>(X + r * RB + (s / (QK / 32)) * QB, (int)(s % (QK / 32)), v);
#pragma unroll
        for (int t = 0; t < 32; t++)
            Y[r * K + s * 32 + t] = rlx_to<T>(v[t]);
    }
}

/* Y[m, 0:nt] (row stride N) = C[m, 0:nt] (dense): one tile of a product whose N was split. */
template <typename T>
__global__ void rlx_q_put_cols(const T *__restrict__ C, T *__restrict__ Y, int64_t M, int64_t nt, int64_t N) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < M * nt; i += (int64_t)gridDim.x * blockDim.x)
        Y[(i / nt) * N + i % nt] = C[i];
}

/* ── Decode steps: a group of quantized projections in one launch (rlx_qgemv_fused; see DecodeGemv) ────────
 * Each block stages the step's MR rows of X in shared memory as f32, padded by 4 floats per 32 values so that
 * the lanes of a warp (each on its own sub-block) read different banks with 16-byte loads. With NORM the
 * block also computes each row's RMS and applies x / rms * gamma there: recomputing a 1-2k-value norm per
 * block costs less than a launch. Warps then walk the weight rows of up to 4 members as rlx_qgemv does. The
 * epilogue EPI: 0 each member's row into its output; 1 (one member) plus the residual `res` (which may be the
 * output itself: each element is read, then written, by one lane); 2 (two members, gate and up) silu of the
 * gate row times the up row. Accumulation in f32; the epilogue sees the unrounded products. */
#ifndef RLX_QFUSED_WARPS
#define RLX_QFUSED_WARPS 8
#endif
#ifndef RLX_Q_PREFETCH
#define RLX_Q_PREFETCH(p) asm volatile("prefetch.global.L2 [%0];" ::"l"(p))
#endif
#ifndef RLX_DYNAMIC_SHARED
#define RLX_DYNAMIC_SHARED(type, name) extern __shared__ type name[]
#endif
#define RLX_QFUSED_PAD 36 /* floats per staged 32-value sub-block */

struct RlxQMembers {
    const uint8_t *w[4];
    void *y[4];
    int64_t n[4];
    int count;
};

/* Weight row r of the members' rows laid end to end: its member (returned) and its row *n in that member.
 * With SwiGLU (EPI 2) row r is row r of both members, gate and up. The members are read with constant indices
 * only (a runtime index would copy the launch's parameter struct into local memory in every thread). */
template <int EPI>
__device__ __forceinline__ int rlx_qf_member(const RlxQMembers &mem, int64_t r, int64_t *n) {
    int j = 0;
    if (EPI != 2) {
#pragma unroll
        for (int i = 0; i < 3; i++) {
            const int64_t ni = mem.n[i];
            if (j == i && i + 1 < mem.count && r >= ni) {
                r -= ni;
                j = i + 1;
            }
        }
    }
    *n = r;
    return j;
}

__device__ __forceinline__ const uint8_t *rlx_qf_weights(const RlxQMembers &mem, int j) {
    return j == 0 ? mem.w[0] : j == 1 ? mem.w[1] : j == 2 ? mem.w[2] : mem.w[3];
}

__device__ __forceinline__ void *rlx_qf_out(const RlxQMembers &mem, int j) {
    return j == 0 ? mem.y[0] : j == 1 ? mem.y[1] : j == 2 ? mem.y[2] : mem.y[3];
}

/* A fused GEMV's output value from its row sum `out`: EPI 1 adds the residual res[r], EPI 2 is SwiGLU's
 * silu(out) * up (the up row's sum); then rounded once into y[at]. */
template <typename T, int EPI>
__device__ __forceinline__ void rlx_qf_store(T *y, int64_t at, float out, float up, const T *res, int64_t r) {
    if (EPI == 1)
        out += rlx_f(res[r]);
    if (EPI == 2)
        out = out / (1.0f + __expf(-out)) * up;
    y[at] = rlx_to<T>(out);
}

__device__ __forceinline__ int64_t rlx_qf_rows(const RlxQMembers &mem, int j) {
    return j == 0 ? mem.n[0] : j == 1 ? mem.n[1] : j == 2 ? mem.n[2] : mem.n[3];
}

template <int MR>
__device__ __forceinline__ void rlx_qf_dot(const float *__restrict__ xs, int64_t stride, const float v[32],
                                           float acc[MR]) {
#pragma unroll
    for (int m = 0; m < MR; m++) {
        const float4 *xv = (const float4 *)(xs + m * stride);
        float p = 0.0f;
#pragma unroll
        for (int q = 0; q < 8; q++) {
            const float4 a = xv[q];
            p = fmaf(a.x, v[4 * q], p);
            p = fmaf(a.y, v[4 * q + 1], p);
            p = fmaf(a.z, v[4 * q + 2], p);
            p = fmaf(a.w, v[4 * q + 3], p);
        }
        acc[m] += p;
    }
}

/* ── The decode GEMV's inner loop for q4_k, q4_0, q4_1 and q8_0 (rlx_qf_row) ───────────────────────────────
 * Bound by memory only if it issues few instructions per weight byte: at the HBM rate a q4 weight delivers ~6e12
 * values a second, so a loop of the general rlx_q_sub kind (an int-to-float conversion, a quarter-rate
 * instruction, and a scale multiply per value) runs at a fraction of the bandwidth. Here
 *   - a lane's unit of work is 16 bytes of quants (one 128-bit load; q4_k's block header is a second, shared by the
 *     8 lanes of its block) or one whole 32-value block (q4_0, q4_1, q8_0);
 *   - a byte b becomes the float 2^23 + b by placing it in the mantissa of 2^23 (one byte permute), and one
 *     exact subtraction gives b, b - 8 (q4_0) or b - 128 (q8_0, whose bytes are flipped to unsigned first);
 *   - the block's scale multiplies the dot product of x with the small integers, and the min term of q4_1 / q4_k
 *     uses the sum of x over the same 16 values, which the staging wrote into the padding of each 32-value
 *     sub-block (floats 32 and 33: the sums over values 0-15 and 16-31);
 *   - each lane loads two units before it computes either, so two loads per lane are in flight.
 * The products are the same terms as `abs_terms` documents (scale times an integer dot, plus min times a sum of x),
 * accumulated in f32. */
#define RLX_QFAST(FMT) ((FMT) == RLX_Q4_K || (FMT) == RLX_Q4_0 || (FMT) == RLX_Q4_1 || (FMT) == RLX_Q8_0)
#define RLX_QSUMS(FMT) ((FMT) == RLX_Q4_K || (FMT) == RLX_Q4_1)

/* p[m] += sum over the 4 * NW bytes b_i of w (each < 256): x_m[i] * (b_i - OFF). */
template <int MR, int NW, int OFF>
__device__ __forceinline__ void rlx_qf_bytes(const float *__restrict__ x, int64_t stride, const uint32_t *w,
                                             float p[MR]) {
    float v[4 * NW];
#pragma unroll
    for (int j = 0; j < NW; j++) {
#pragma unroll
        for (int k = 0; k < 4; k++)
            v[4 * j + k] = __uint_as_float(__byte_perm(w[j], 0x4B000000u, 0x7540u + k)) - (8388608.0f + (float)OFF);
    }
#pragma unroll
    for (int m = 0; m < MR; m++) {
        const float4 *xv = (const float4 *)(x + m * stride);
        float a = 0.0f;
#pragma unroll
        for (int j = 0; j < NW; j++) {
            const float4 t = xv[j];
            a = fmaf(t.x, v[4 * j], a);
            a = fmaf(t.y, v[4 * j + 1], a);
            a = fmaf(t.z, v[4 * j + 2], a);
            a = fmaf(t.w, v[4 * j + 3], a);
        }
        p[m] = a;
    }
}

/* v[0..N) = p[0..N) (staged floats, 16-byte aligned, N a multiple of 4) in 16-byte loads. */
template <int N>
__device__ __forceinline__ void rlx_qf_load(const float *__restrict__ p, float *v) {
#pragma unroll
    for (int q = 0; q < N / 4; q++) {
        const float4 a = ((const float4 *)p)[q];
        v[4 * q] = a.x;
        v[4 * q + 1] = a.y;
        v[4 * q + 2] = a.z;
        v[4 * q + 3] = a.w;
    }
}

/* sum over the 4 * NW bytes b_i of w (each < 256) of x[i] * (b_i - OFF), x in registers: rlx_qf_bytes' terms in its
   order, for one row of X held by the lane (rlx_qf_rows1). */
template <int NW, int OFF>
__device__ __forceinline__ float rlx_qf_bytes_r(const float *x, const uint32_t *w) {
    float a = 0.0f;
#pragma unroll
    for (int j = 0; j < NW; j++) {
#pragma unroll
        for (int k = 0; k < 4; k++)
            a = fmaf(x[4 * j + k],
                     __uint_as_float(__byte_perm(w[j], 0x4B000000u, 0x7540u + k)) - (8388608.0f + (float)OFF), a);
    }
    return a;
}

/* q4_k: the scales d * sc and mins dmin * m of sub-blocks 2g and 2g + 1, from a block's 16-byte header (d, dmin,
 * then the 6-bit scales and mins in GGUF's packing). */
static __device__ __forceinline__ void rlx_q4k_scales(const uint4 &hd, int g, float ds[2], float dm[2]) {
    const float d = __half2float(__ushort_as_half((unsigned short)(hd.x & 0xFFFF)));
    const float dmin = __half2float(__ushort_as_half((unsigned short)(hd.x >> 16)));
#pragma unroll
    for (int e = 0; e < 2; e++) {
        const int j = 2 * g + e, jj = j & 3;
        const uint32_t a = (hd.y >> (8 * jj)) & 0xFF, bz = (hd.z >> (8 * jj)) & 0xFF, cw = (hd.w >> (8 * jj)) & 0xFF;
        const uint32_t sc = j < 4 ? a & 63 : (cw & 0x0F) | ((a >> 6) << 4);
        const uint32_t mn = j < 4 ? bz & 63 : (cw >> 4) | ((bz >> 6) << 4);
        ds[e] = d * (float)sc;
        dm[e] = dmin * (float)mn;
    }
}

/* One unit of a weight row, loaded (load) and then dotted with the staged rows (add). */
template <int FMT> struct RlxQUnit;

template <> struct RlxQUnit<RLX_Q4_K> {  /* 16 bytes of quants: 16 values each of sub-blocks 2g and 2g + 1 */
    uint4 hd, q;
    static __device__ __forceinline__ int64_t count(int64_t K) { return K / 32; }
    __device__ __forceinline__ void load(const uint8_t *__restrict__ row, int64_t u) {
        const uint8_t *b = row + (u >> 3) * 144;
        hd = *(const uint4 *)b;
        q = *(const uint4 *)(b + 16 + 16 * (u & 7));  /* group g = (u & 7) / 2, half h = u & 1 */
    }
    template <int MR>
    __device__ __forceinline__ void add(const float *__restrict__ xs, int64_t stride, int64_t u, float acc[MR]) const {
        const int g = (int)((u >> 1) & 3), h = (int)(u & 1);
        float ds[2], dm[2];
        rlx_q4k_scales(hd, g, ds, dm);
        const uint32_t lo[4] = {q.x & 0x0F0F0F0Fu, q.y & 0x0F0F0F0Fu, q.z & 0x0F0F0F0Fu, q.w & 0x0F0F0F0Fu};
        const uint32_t hi[4] = {(q.x >> 4) & 0x0F0F0F0Fu, (q.y >> 4) & 0x0F0F0F0Fu, (q.z >> 4) & 0x0F0F0F0Fu,
                                (q.w >> 4) & 0x0F0F0F0Fu};
        const float *x0 = xs + ((u >> 3) * 8 + 2 * g) * RLX_QFUSED_PAD + 16 * h, *x1 = x0 + RLX_QFUSED_PAD;
        float p0[MR], p1[MR];
        rlx_qf_bytes<MR, 4, 0>(x0, stride, lo, p0);
        rlx_qf_bytes<MR, 4, 0>(x1, stride, hi, p1);
#pragma unroll
        for (int m = 0; m < MR; m++) {
            const float s0 = xs[m * stride + ((u >> 3) * 8 + 2 * g) * RLX_QFUSED_PAD + 32 + h];
            const float s1 = xs[m * stride + ((u >> 3) * 8 + 2 * g + 1) * RLX_QFUSED_PAD + 32 + h];
            acc[m] += ds[0] * p0[m] - dm[0] * s0 + ds[1] * p1[m] - dm[1] * s1;
        }
    }
    /* The staged values unit u multiplies (one row of X), read once for every weight row walked with it. */
    struct XFrag {
        float a[16], b[16], s0, s1;
    };
    /* x staged by unit (rlx_qf_xoff<true>): unit u's values of sub-block 2g in floats 0-15 of slot u, of 2g + 1 in
       16-31, their sums in 32 and 33 */
    static __device__ __forceinline__ void xload(const float *__restrict__ xs, int64_t u, XFrag &x) {
        const float *x0 = xs + u * RLX_QFUSED_PAD;
#pragma unroll
        for (int q = 0; q < 4; q++) {  /* the two halves' loads interleaved, as measured (docs/perf-h100.md) */
            const float4 a = ((const float4 *)x0)[q], b = ((const float4 *)(x0 + 16))[q];
            x.a[4 * q] = a.x; x.a[4 * q + 1] = a.y; x.a[4 * q + 2] = a.z; x.a[4 * q + 3] = a.w;
            x.b[4 * q] = b.x; x.b[4 * q + 1] = b.y; x.b[4 * q + 2] = b.z; x.b[4 * q + 3] = b.w;
        }
        x.s0 = x0[32];
        x.s1 = x0[33];
    }
    __device__ __forceinline__ float dot(const XFrag &x, int64_t u) const {
        const int g = (int)((u >> 1) & 3);
        float ds[2], dm[2];
        rlx_q4k_scales(hd, g, ds, dm);
        const uint32_t lo[4] = {q.x & 0x0F0F0F0Fu, q.y & 0x0F0F0F0Fu, q.z & 0x0F0F0F0Fu, q.w & 0x0F0F0F0Fu};
        const uint32_t hi[4] = {(q.x >> 4) & 0x0F0F0F0Fu, (q.y >> 4) & 0x0F0F0F0Fu, (q.z >> 4) & 0x0F0F0F0Fu,
                                (q.w >> 4) & 0x0F0F0F0Fu};
        const float p0 = rlx_qf_bytes_r<4, 0>(x.a, lo), p1 = rlx_qf_bytes_r<4, 0>(x.b, hi);
        return ds[0] * p0 - dm[0] * x.s0 + ds[1] * p1 - dm[1] * x.s1;
    }
};

template <int FMT> struct RlxQUnit32 {  /* q4_0 / q4_1: one 32-value block */
    uint32_t hd, q[4];
    static __device__ __forceinline__ int64_t count(int64_t K) { return K / 32; }
    __device__ __forceinline__ void load(const uint8_t *__restrict__ row, int64_t u) {
        const uint8_t *b = row + u * (FMT == RLX_Q4_1 ? 20 : 18);
        if (FMT == RLX_Q4_1) {
            hd = rlx_q_u32(b);
#pragma unroll
            for (int j = 0; j < 4; j++)
                q[j] = rlx_q_u32(b + 4 + 4 * j);
        } else {
            hd = *(const unsigned short *)b;
#pragma unroll
            for (int j = 0; j < 4; j++)
                q[j] = rlx_q_u32_2(b + 2 + 4 * j);
        }
    }
    template <int MR>
    __device__ __forceinline__ void add(const float *__restrict__ xs, int64_t stride, int64_t u, float acc[MR]) const {
        const float d = __half2float(__ushort_as_half((unsigned short)(hd & 0xFFFF)));
        const uint32_t lo[4] = {q[0] & 0x0F0F0F0Fu, q[1] & 0x0F0F0F0Fu, q[2] & 0x0F0F0F0Fu, q[3] & 0x0F0F0F0Fu};
        const uint32_t hi[4] = {(q[0] >> 4) & 0x0F0F0F0Fu, (q[1] >> 4) & 0x0F0F0F0Fu, (q[2] >> 4) & 0x0F0F0F0Fu,
                                (q[3] >> 4) & 0x0F0F0F0Fu};
        const float *x = xs + u * RLX_QFUSED_PAD;
        float p0[MR], p1[MR];
        constexpr int OFF = FMT == RLX_Q4_0 ? 8 : 0;
        rlx_qf_bytes<MR, 4, OFF>(x, stride, lo, p0);
        rlx_qf_bytes<MR, 4, OFF>(x + 16, stride, hi, p1);
#pragma unroll
        for (int m = 0; m < MR; m++) {
            float t = d * (p0[m] + p1[m]);
            if (FMT == RLX_Q4_1) {
                const float mn = __half2float(__ushort_as_half((unsigned short)(hd >> 16)));
                t = fmaf(mn, x[m * stride + 32] + x[m * stride + 33], t);
            }
            acc[m] += t;
        }
    }
    struct XFrag {
        float a[32], s;
    };
    static __device__ __forceinline__ void xload(const float *__restrict__ xs, int64_t u, XFrag &x) {
        rlx_qf_load<32>(xs + u * RLX_QFUSED_PAD, x.a);
        x.s = FMT == RLX_Q4_1 ? xs[u * RLX_QFUSED_PAD + 32] + xs[u * RLX_QFUSED_PAD + 33] : 0.0f;
    }
    __device__ __forceinline__ float dot(const XFrag &x, int64_t) const {
        const float d = __half2float(__ushort_as_half((unsigned short)(hd & 0xFFFF)));
        const uint32_t lo[4] = {q[0] & 0x0F0F0F0Fu, q[1] & 0x0F0F0F0Fu, q[2] & 0x0F0F0F0Fu, q[3] & 0x0F0F0F0Fu};
        const uint32_t hi[4] = {(q[0] >> 4) & 0x0F0F0F0Fu, (q[1] >> 4) & 0x0F0F0F0Fu, (q[2] >> 4) & 0x0F0F0F0Fu,
                                (q[3] >> 4) & 0x0F0F0F0Fu};
        constexpr int OFF = FMT == RLX_Q4_0 ? 8 : 0;
        float t = d * (rlx_qf_bytes_r<4, OFF>(x.a, lo) + rlx_qf_bytes_r<4, OFF>(x.a + 16, hi));
        if (FMT == RLX_Q4_1)
            t = fmaf(__half2float(__ushort_as_half((unsigned short)(hd >> 16))), x.s, t);
        return t;
    }
};
template <> struct RlxQUnit<RLX_Q4_0> : RlxQUnit32<RLX_Q4_0> {};
template <> struct RlxQUnit<RLX_Q4_1> : RlxQUnit32<RLX_Q4_1> {};

template <> struct RlxQUnit<RLX_Q8_0> {  /* one 32-value block: a half scale, then 32 signed bytes */
    uint32_t hd, q[8];
    static __device__ __forceinline__ int64_t count(int64_t K) { return K / 32; }
    __device__ __forceinline__ void load(const uint8_t *__restrict__ row, int64_t u) {
        const uint8_t *b = row + u * 34;
        hd = *(const unsigned short *)b;
#pragma unroll
        for (int j = 0; j < 8; j++)
            q[j] = rlx_q_u32_2(b + 2 + 4 * j);
    }
    template <int MR>
    __device__ __forceinline__ void add(const float *__restrict__ xs, int64_t stride, int64_t u, float acc[MR]) const {
        const float d = __half2float(__ushort_as_half((unsigned short)hd));
        uint32_t w[8];
#pragma unroll
        for (int j = 0; j < 8; j++)
            w[j] = q[j] ^ 0x80808080u;  /* int8 q as the byte q + 128 */
        float p[MR];
        rlx_qf_bytes<MR, 8, 128>(xs + u * RLX_QFUSED_PAD, stride, w, p);
#pragma unroll
        for (int m = 0; m < MR; m++)
            acc[m] += d * p[m];
    }
    struct XFrag {
        float a[32];
    };
    static __device__ __forceinline__ void xload(const float *__restrict__ xs, int64_t u, XFrag &x) {
        rlx_qf_load<32>(xs + u * RLX_QFUSED_PAD, x.a);
    }
    __device__ __forceinline__ float dot(const XFrag &x, int64_t) const {
        uint32_t w[8];
#pragma unroll
        for (int j = 0; j < 8; j++)
            w[j] = q[j] ^ 0x80808080u;
        return __half2float(__ushort_as_half((unsigned short)hd)) * rlx_qf_bytes_r<8, 128>(x.a, w);
    }
};

/* v[0..7] = p[0..7] as floats, in one 16-byte load (f16 / bf16) or two (f32); p is 16- or 32-byte aligned. */
__device__ __forceinline__ void rlx_load8(const float *p, float v[8]) {
    const float4 a = ((const float4 *)p)[0], b = ((const float4 *)p)[1];
    v[0] = a.x; v[1] = a.y; v[2] = a.z; v[3] = a.w; v[4] = b.x; v[5] = b.y; v[6] = b.z; v[7] = b.w;
}

template <typename H>
__device__ __forceinline__ void rlx_load8(const H *p, float v[8]) {
    const uint4 u = *(const uint4 *)p;
    const H *h = (const H *)&u;
#pragma unroll
    for (int e = 0; e < 8; e++)
        v[e] = rlx_f(h[e]);
}

/* Where rlx_qgemv_fused stages chunk c of a row of X (its values 8c .. 8c + 7: rlx_qf_xoff) and the sum of the 16
 * values that chunks c and c ^ 1 make (rlx_qf_soff).
 *   by sub-block (UNIT false): sub-block c / 4 in slot c / 4 (RLX_QFUSED_PAD floats), its half sums in floats 32, 33;
 *   by q4_k unit (UNIT true, the one-row walk rlx_qf_rows1): unit u = 8 * block + 2g + h takes values 16h .. 16h + 15
 *     of sub-blocks 2g and 2g + 1, and its 32 values sit in slot u (sums in 32, 33). The 8 lanes of a 16-byte load
 *     phase then read 8 slots 36 floats apart, 8 distinct groups of 4 banks; by sub-block, their offsets 72g + 16h
 *     fell on 4 groups only (two lanes each: every load of x took two shared-memory wavefronts). */
__device__ __forceinline__ int64_t rlx_qf_unit_of_chunk(int64_t c) {
    return (c >> 5) * 8 + ((c >> 3) & 3) * 2 + ((c >> 1) & 1);
}
template <bool UNIT>
__device__ __forceinline__ int64_t rlx_qf_xoff(int64_t c) {
    return UNIT ? rlx_qf_unit_of_chunk(c) * RLX_QFUSED_PAD + ((c >> 2) & 1) * 16 + (c & 1) * 8
                : (c >> 2) * RLX_QFUSED_PAD + (c & 3) * 8;
}
template <bool UNIT>
__device__ __forceinline__ int64_t rlx_qf_soff(int64_t c) {
    return UNIT ? rlx_qf_unit_of_chunk(c) * RLX_QFUSED_PAD + 32 + ((c >> 2) & 1)
                : (c >> 2) * RLX_QFUSED_PAD + 32 + ((c >> 1) & 1);
}

/* Units of a weight row each lane loads before it computes any of them (loads in flight per lane). */
#ifndef RLX_QF_INFLIGHT
#define RLX_QF_INFLIGHT 2
#endif

/* This lane's units (of type Unit) of one weight row, lanes 32 units apart: RLX_QF_INFLIGHT units loaded before
   any is used, each then handed to add(unit, index). */
template <typename Unit, typename Add>
__device__ __forceinline__ void rlx_q_walk(const uint8_t *__restrict__ row, int64_t K, int lane, Add add) {
    const int64_t units = Unit::count(K);
    int64_t u = lane;
    for (; u + 32 * (RLX_QF_INFLIGHT - 1) < units; u += 32 * RLX_QF_INFLIGHT) {
        Unit a[RLX_QF_INFLIGHT];
#pragma unroll
        for (int i = 0; i < RLX_QF_INFLIGHT; i++)
            a[i].load(row, u + 32 * i);
#pragma unroll
        for (int i = 0; i < RLX_QF_INFLIGHT; i++)
            add(a[i], u + 32 * i);
    }
    for (; u < units; u += 32) {
        Unit a;
        a.load(row, u);
        add(a, u);
    }
}

/* acc[m] (per lane; the caller sums the warp) += this lane's units of one weight row against staged row m. */
template <int FMT, int MR>
__device__ __forceinline__ void rlx_qf_row(const uint8_t *__restrict__ row, const float *__restrict__ xs,
                                           int64_t stride, int64_t K, int lane, float acc[MR]) {
    rlx_q_walk<RlxQUnit<FMT>>(row, K, lane,
                              [&](const RlxQUnit<FMT> &a, int64_t u) { a.template add<MR>(xs, stride, u, acc); });
}

/* One row of X (MR = 1, f32 activations, a RLX_QFAST format): a warp walks NWR weight rows together. Each lane
   loads its unit of every row, then reads the unit's staged x from shared memory once for all of them: the shared
   reads of x, not the weights, held the one-row walk (rlx_qf_row) to ~1.3 TB/s on an H200 (ncu: L1 84% busy, short
   scoreboard the first stall), and NWR rows in flight also multiply the weight bytes a lane has in flight.
   acc[i] (per lane) += the lane's units of row wr[i]; the terms and their order are rlx_qf_row's. */
#ifndef RLX_QF_ROWS_INFLIGHT
#define RLX_QF_ROWS_INFLIGHT 1 /* units of each row a lane loads before it computes any (2: no faster at 8B) */
#endif
template <typename Unit, int NWR>
__device__ __forceinline__ void rlx_qf_rows1(const uint8_t *const *wr, const float *__restrict__ xs, int64_t K,
                                             int lane, float *acc) {
    const int64_t units = Unit::count(K);
    int64_t u = lane;
#if RLX_QF_ROWS_INFLIGHT > 1
    for (; u + 32 * (RLX_QF_ROWS_INFLIGHT - 1) < units; u += 32 * RLX_QF_ROWS_INFLIGHT) {
        Unit a[RLX_QF_ROWS_INFLIGHT][NWR];
#pragma unroll
        for (int f = 0; f < RLX_QF_ROWS_INFLIGHT; f++)
#pragma unroll
            for (int i = 0; i < NWR; i++)
                a[f][i].load(wr[i], u + 32 * f);
#pragma unroll
        for (int f = 0; f < RLX_QF_ROWS_INFLIGHT; f++) {
            typename Unit::XFrag x;
            Unit::xload(xs, u + 32 * f, x);
#pragma unroll
            for (int i = 0; i < NWR; i++)
                acc[i] += a[f][i].dot(x, u + 32 * f);
        }
    }
#endif
    for (; u < units; u += 32) {
        Unit a[NWR];
#pragma unroll
        for (int i = 0; i < NWR; i++)
            a[i].load(wr[i], u);
        typename Unit::XFrag x;
        Unit::xload(xs, u, x);
#pragma unroll
        for (int i = 0; i < NWR; i++)
            acc[i] += a[i].dot(x, u);
    }
}

/* Weight rows a warp of rlx_qgemv_fused walks together (RLX_QF_ROWS, where rlx_qf_rows1 applies; else 1). */
#ifndef RLX_QF_ROWS
#define RLX_QF_ROWS 2
#endif
/* Minimum blocks an SM for the kernels that take rlx_qf_rows1 (__launch_bounds__): 3 caps them at 80 registers, which
   measured slower at 8B (288.7 -> 277.6 tok/s on an H200) and faster at SmolLM2's shape (1497 -> 1549). */
#ifndef RLX_QF_MIN_BLOCKS
#define RLX_QF_MIN_BLOCKS 1
#endif
/* Output rows a warp of rlx_qgemv_fused takes per pass (SwiGLU's output row reads two weight rows, gate and up). */
template <int FMT, int MR, int EPI, int ACT = 0>
__host__ __device__ constexpr int rlx_qf_warp_rows() {
    return (MR == 1 && ACT == 0 && RLX_QFAST(FMT)) ? (EPI == 2 ? (RLX_QF_ROWS + 1) / 2 : RLX_QF_ROWS) : 1;
}

/* ACT 1 (dequant_matmul act="q8"): the staged rows are then quantized to int8 blocks in place and the rows walked
   with integer dot products (kernels/quant_q8.cuh, which defines these two and must follow this header then). */
template <int MR>
__device__ void rlx_q8_stage(float *xs, int64_t stride, int64_t nsub);
template <int FMT, int MR, int REC>
__device__ void rlx_q8_row(const uint8_t *__restrict__ row, const uint32_t *x, int64_t stride, int64_t K, int lane,
                           float acc[MR]);

/* ── rlx_qgemv_xr: the one-row decode GEMV with x held in registers (q4_k, q4_0, q4_1, q8_0; +3-4% at 8B on an H200) ──────────
 * rlx_qf_rows1 reads a unit's 34 staged floats from shared memory for every NWR = 2 weight rows: the L1/shared pipe,
 * not HBM, was the busy unit. Here K is cut into slabs of 32 units (lane l owns unit 32s + l of slab s) and a block
 * takes a tile of XG groups of RLX_QXR_G weight rows (SwiGLU: RLX_QXR_G / 2 gate rows and the same up rows). A work
 * item is (slab, group): each lane loads its unit's x into registers once, issues the group's RLX_QXR_G 16-byte
 * quant loads (and headers) before any product, and accumulates one value per row; a warp's loads of a row are 32
 * consecutive units (contiguous bytes). The items' warp sums go to shared memory (per slab and row), and after a
 * barrier one thread per output row adds its slabs in slab order (a fixed order: reproducible) and applies the
 * epilogue. XG is chosen on the host (DecodeGemv.xr_groups) so that the items of a tile are a multiple of the warps. */
#ifndef RLX_QXR_G
#define RLX_QXR_G 8
#endif
/* Weight row wi (0 .. XG * RLX_QXR_G) of tile t: its member (*j) and row *n there; *ok false past the rows. */
template <int EPI, int XG>
__device__ __forceinline__ const uint8_t *rlx_qxr_row(const RlxQMembers &mem, int64_t t, int wi, int64_t rows,
                                                      int64_t RB, int64_t *n, int *j, bool *ok) {
    constexpr int H = RLX_QXR_G / 2;
    const int64_t r = EPI == 2 ? t * (XG * H) + (wi / RLX_QXR_G) * H + wi % H : t * (XG * RLX_QXR_G) + wi;
    *ok = r < rows;
    *j = rlx_qf_member<EPI>(mem, r < rows ? r : rows - 1, n);
    return (EPI == 2 ? ((wi % RLX_QXR_G) < H ? mem.w[0] : mem.w[1]) : rlx_qf_weights(mem, *j)) + *n * RB;
}

template <typename T, int FMT, int QK, int QB, int MR, bool NORM, int EPI, int ACT, int XG>
__device__ __forceinline__ void rlx_qgemv_body(const T *__restrict__ X, const T *__restrict__ gamma, float eps,
                                               const RlxQMembers &mem, const T *res, int64_t K, int64_t RB,
                                               int64_t rows) {
    RLX_DYNAMIC_SHARED(float4, rlx_qf_smem4);
    float *xs = (float *)rlx_qf_smem4;
    __shared__ float red[RLX_QFUSED_WARPS][MR];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int64_t nsub = K / 32, stride = nsub * RLX_QFUSED_PAD;
    {
        /* Weights are never written by a kernel: fetch this warp's first row into L2 while the kernel before
           this one finishes (programmatic dependent launch), then wait for it. */
        constexpr int RW = rlx_qf_warp_rows<FMT, MR, EPI, ACT>();
        if constexpr (XG > 0) {  /* the block's first tile */
            for (int i = warp; i < XG * RLX_QXR_G; i += RLX_QFUSED_WARPS) {
                int64_t n;
                int j;
                bool ok;
                const uint8_t *w = rlx_qxr_row<EPI, XG>(mem, blockIdx.x, i, rows, RB, &n, &j, &ok);
                for (int64_t off = (int64_t)lane * 128; ok && off < RB; off += 32 * 128)
                    RLX_Q_PREFETCH(w + off);
            }
        }
        for (int i = 0; i < (XG > 0 ? 0 : RW); i++) {
            const int64_t r0 = ((int64_t)blockIdx.x * RLX_QFUSED_WARPS + warp) * RW + i;
            if (r0 >= rows)
                break;
            int64_t n;
            const int j = rlx_qf_member<EPI>(mem, r0, &n);
            for (int64_t off = (int64_t)lane * 128; off < RB; off += 32 * 128) {
                RLX_Q_PREFETCH(rlx_qf_weights(mem, j) + n * RB + off);
                if (EPI == 2)
                    RLX_Q_PREFETCH(mem.w[1] + n * RB + off);
            }
        }
    }
    rlx_pdl_wait();
    rlx_pdl_trigger();  /* the next kernel may launch and prefetch its weights */
    /* Staging: a thread takes chunks of 8 consecutive values (16- or 32-byte loads, every chunk's load issued
       before any is used: the prologue costs one round trip to L2 per pass, not one per value). The loop bound
       is the warp's first chunk, so every lane of a warp runs the same iterations (the half sums shuffle). */
    const int64_t chunks = K / 8;
    constexpr bool XU = MR == 1 && ACT == 0 && FMT == RLX_Q4_K;  /* staged by unit (rlx_qf_xoff) */
    float ss[MR];
#pragma unroll
    for (int m = 0; m < MR; m++)
        ss[m] = 0.0f;
#pragma unroll 4
    for (int64_t c0 = (int64_t)warp * 32; c0 < chunks; c0 += blockDim.x) {
        const int64_t c = c0 + lane;
        const bool valid = c < chunks;
        float *dst = xs + rlx_qf_xoff<XU>(c);
#pragma unroll
        for (int m = 0; m < MR; m++) {
            float v[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
            if (valid) {
                rlx_load8(X + m * K + c * 8, v);
                ((float4 *)(dst + m * stride))[0] = make_float4(v[0], v[1], v[2], v[3]);
                ((float4 *)(dst + m * stride))[1] = make_float4(v[4], v[5], v[6], v[7]);
            }
            float t = 0.0f, q = 0.0f;
#pragma unroll
            for (int e = 0; e < 8; e++) {
                q = fmaf(v[e], v[e], q);
                t += v[e];
            }
            ss[m] += q;
            if (!NORM && !ACT && RLX_QSUMS(FMT)) {  /* chunks 2h and 2h + 1 make a half sub-block: lanes l and l ^ 1 */
                t += __shfl_xor_sync(0xffffffffu, t, 1);
                if (valid && !(c & 1))
                    xs[m * stride + rlx_qf_soff<XU>(c)] = t;
            }
        }
    }
    if (NORM) {
#pragma unroll
        for (int m = 0; m < MR; m++) {
            float a = ss[m];
            for (int o = 16; o > 0; o >>= 1)
                a += __shfl_xor_sync(0xffffffffu, a, o);
            if (lane == 0)
                red[warp][m] = a;
        }
        __syncthreads();
        float scale[MR];
#pragma unroll
        for (int m = 0; m < MR; m++) {
            float t = 0.0f;
            for (int w = 0; w < RLX_QFUSED_WARPS; w++)
                t += red[w][m];
            scale[m] = rsqrtf(t / (float)K + eps);
        }
        /* each thread rescales the chunks it staged itself (no barrier needed before this), and sums halves */
#pragma unroll 4
        for (int64_t c0 = (int64_t)warp * 32; c0 < chunks; c0 += blockDim.x) {
            const int64_t c = c0 + lane;
            const bool valid = c < chunks;
            float g[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
            if (valid)
                rlx_load8(gamma + c * 8, g);
            float *src = xs + rlx_qf_xoff<XU>(c);
#pragma unroll
            for (int m = 0; m < MR; m++) {
                float t = 0.0f;
                if (valid) {
                    float4 *p = (float4 *)(src + m * stride);
                    float4 a = p[0], b = p[1];
                    a.x *= scale[m] * g[0]; a.y *= scale[m] * g[1]; a.z *= scale[m] * g[2]; a.w *= scale[m] * g[3];
                    b.x *= scale[m] * g[4]; b.y *= scale[m] * g[5]; b.z *= scale[m] * g[6]; b.w *= scale[m] * g[7];
                    p[0] = a;
                    p[1] = b;
                    t = ((a.x + a.y) + (a.z + a.w)) + ((b.x + b.y) + (b.z + b.w));
                }
                if (!ACT && RLX_QSUMS(FMT)) {
                    t += __shfl_xor_sync(0xffffffffu, t, 1);
                    if (valid && !(c & 1))
                        xs[m * stride + rlx_qf_soff<XU>(c)] = t;
                }
            }
        }
    }
    __syncthreads();
    if constexpr (ACT != 0) {
        rlx_q8_stage<MR>(xs, stride, nsub);
        __syncthreads();
    }
    if constexpr (XG > 0 && MR == 1 && ACT == 0 && RLX_QFAST(FMT)) {
        using Unit = RlxQUnit<FMT>;
        constexpr int G = RLX_QXR_G, TW = XG * G, TR = EPI == 2 ? TW / 2 : TW;  /* weight / output rows a tile */
        float *part = xs + nsub * RLX_QFUSED_PAD;  /* [slab][TW] warp sums */
        const int64_t nslab = (nsub + 31) / 32, tiles = (rows + TR - 1) / TR;
        for (int64_t t = blockIdx.x; t < tiles; t += gridDim.x) {
            for (int64_t it = warp; it < nslab * XG; it += RLX_QFUSED_WARPS) {
                const int64_t s = it % nslab, u = 32 * s + lane;
                const int gi = (int)(it / nslab);
                float acc[G];
#pragma unroll
                for (int g = 0; g < G; g++)
                    acc[g] = 0.0f;
                if (u < nsub) {
                    Unit a[G];
#pragma unroll
                    for (int g = 0; g < G; g++) {
                        int64_t n;
                        int j;
                        bool ok;
                        a[g].load(rlx_qxr_row<EPI, XG>(mem, t, gi * G + g, rows, RB, &n, &j, &ok), u);
                    }
                    typename Unit::XFrag x;
                    Unit::xload(xs, u, x);
#pragma unroll
                    for (int g = 0; g < G; g++)
                        acc[g] = a[g].dot(x, u);
                }
#pragma unroll
                for (int g = 0; g < G; g++)
                    acc[g] = rlx_warp_sum(acc[g]);
                if (lane == 0) {
#pragma unroll
                    for (int g = 0; g < G; g++)
                        part[s * TW + gi * G + g] = acc[g];
                }
            }
            __syncthreads();
            for (int i = threadIdx.x; i < TR; i += blockDim.x) {
                const int wi = EPI == 2 ? (i / (G / 2)) * G + i % (G / 2) : i;
                int64_t n;
                int j;
                bool ok;
                rlx_qxr_row<EPI, XG>(mem, t, wi, rows, RB, &n, &j, &ok);
                if (!ok)
                    continue;
                float out = 0.0f, up = 0.0f;
                for (int64_t s = 0; s < nslab; s++) {
                    out += part[s * TW + wi];
                    if (EPI == 2)
                        up += part[s * TW + wi + G / 2];
                }
                rlx_qf_store<T, EPI>((T *)rlx_qf_out(mem, EPI == 0 ? j : 0), n, out, up, res, n);
            }
            __syncthreads();
        }
    } else if constexpr (MR == 1 && ACT == 0 && RLX_QFAST(FMT)) {
        /* RW output rows a pass (NWR weight rows), walked together (rlx_qf_rows1) */
        constexpr int RW = rlx_qf_warp_rows<FMT, MR, EPI, ACT>(), NWR = EPI == 2 ? 2 * RW : RW;
        for (int64_t r0 = ((int64_t)blockIdx.x * RLX_QFUSED_WARPS + warp) * RW; r0 < rows;
             r0 += (int64_t)gridDim.x * RLX_QFUSED_WARPS * RW) {
            const uint8_t *wr[NWR];
            int64_t ns[RW];
            int js[RW];
#pragma unroll
            for (int i = 0; i < RW; i++) {
                js[i] = rlx_qf_member<EPI>(mem, r0 + i < rows ? r0 + i : rows - 1, &ns[i]);
                wr[i] = rlx_qf_weights(mem, js[i]) + ns[i] * RB;
                if (EPI == 2)
                    wr[(RW + i) % NWR] = mem.w[1] + ns[i] * RB;
            }
            float acc[NWR];
#pragma unroll
            for (int i = 0; i < NWR; i++)
                acc[i] = 0.0f;
            rlx_qf_rows1<RlxQUnit<FMT>, NWR>(wr, xs, K, lane, acc);
#pragma unroll
            for (int i = 0; i < NWR; i++) {
                for (int o = 16; o > 0; o >>= 1)
                    acc[i] += __shfl_xor_sync(0xffffffffu, acc[i], o);
            }
            if (lane == 0) {
#pragma unroll
                for (int i = 0; i < RW; i++) {
                    if (r0 + i >= rows)
                        break;
                    rlx_qf_store<T, EPI>((T *)rlx_qf_out(mem, EPI == 0 ? js[i] : 0), ns[i], acc[i], acc[(RW + i) % NWR],
                                         res, ns[i]);
                }
            }
        }
    } else {
        for (int64_t r = (int64_t)blockIdx.x * RLX_QFUSED_WARPS + warp; r < rows;
             r += (int64_t)gridDim.x * RLX_QFUSED_WARPS) {
            int64_t n;
            const int j = rlx_qf_member<EPI>(mem, r, &n);
            const uint8_t *row = rlx_qf_weights(mem, j) + n * RB;
            const uint8_t *row2 = rlx_qf_weights(mem, EPI == 2 ? 1 : j) + n * RB;
            float acc[MR], acc2[MR];
#pragma unroll
            for (int m = 0; m < MR; m++)
                acc[m] = acc2[m] = 0.0f;
            if constexpr (ACT != 0) {
                rlx_q8_row<FMT, MR, RLX_QFUSED_PAD>(row, (const uint32_t *)xs, stride, K, lane, acc);
                if (EPI == 2)
                    rlx_q8_row<FMT, MR, RLX_QFUSED_PAD>(row2, (const uint32_t *)xs, stride, K, lane, acc2);
            } else if (RLX_QFAST(FMT)) {
                rlx_qf_row<RLX_QFAST(FMT) ? FMT : RLX_Q8_0, MR>(row, xs, stride, K, lane, acc);
                if (EPI == 2)
                    rlx_qf_row<RLX_QFAST(FMT) ? FMT : RLX_Q8_0, MR>(row2, xs, stride, K, lane, acc2);
            } else {
                for (int64_t s = lane; s < nsub; s += 32) {
                    float v[32];
                    rlx_q_sub<FMT>(row + (s / (QK / 32)) * QB, (int)(s % (QK / 32)), v);
                    rlx_qf_dot<MR>(xs + s * RLX_QFUSED_PAD, stride, v, acc);
                    if (EPI == 2) {
                        rlx_q_sub<FMT>(row2 + (s / (QK / 32)) * QB, (int)(s % (QK / 32)), v);
                        rlx_qf_dot<MR>(xs + s * RLX_QFUSED_PAD, stride, v, acc2);
                    }
                }
            }
#pragma unroll
            for (int m = 0; m < MR; m++) {
                for (int o = 16; o > 0; o >>= 1) {
                    acc[m] += __shfl_xor_sync(0xffffffffu, acc[m], o);
                    if (EPI == 2)
                        acc2[m] += __shfl_xor_sync(0xffffffffu, acc2[m], o);
                }
            }
            if (lane == 0) {
                const int64_t N = rlx_qf_rows(mem, j);
                T *y = (T *)rlx_qf_out(mem, EPI == 0 ? j : 0);
#pragma unroll
                for (int m = 0; m < MR; m++) {
                    rlx_qf_store<T, EPI>(y, m * N + n, acc[m], EPI == 2 ? acc2[m] : 0.0f, res, m * N + n);
                }
            }
        }
    }
}

template <typename T, int FMT, int QK, int QB, int MR, bool NORM, int EPI, int ACT = 0>
__global__ void __launch_bounds__(32 * RLX_QFUSED_WARPS, (MR == 1 && ACT == 0 && RLX_QFAST(FMT)) ? RLX_QF_MIN_BLOCKS : 1)
rlx_qgemv_fused(const T *__restrict__ X, const T *__restrict__ gamma, float eps, const __grid_constant__ RlxQMembers mem,
                const T *res, int64_t K, int64_t RB, int64_t rows) {
    rlx_qgemv_body<T, FMT, QK, QB, MR, NORM, EPI, ACT, 0>(X, gamma, eps, mem, res, K, RB, rows);
}

/* One row of X, f32 activations, a RLX_QFAST format; dynamic shared memory: the staged x, then (K / 32 + 31) / 32 * XG * RLX_QXR_G
   floats of warp sums. */
template <typename T, int FMT, int QK, int QB, bool NORM, int EPI, int XG>
__global__ void __launch_bounds__(32 * RLX_QFUSED_WARPS, 2)
rlx_qgemv_xr(const T *__restrict__ X, const T *__restrict__ gamma, float eps, const __grid_constant__ RlxQMembers mem,
             const T *res, int64_t K, int64_t RB, int64_t rows) {
    rlx_qgemv_body<T, FMT, QK, QB, 1, NORM, EPI, 0, XG>(X, gamma, eps, mem, res, K, RB, rows);
}

/* ── One row of X against short weight rows (K / 32 < 32 sub-blocks: a vocabulary projection, K = 576) ─────
 * rlx_qgemv's warp per row would leave lanes idle (18 of 32 at K = 576) and keep few bytes in flight. Here a
 * warp takes RLX_QSHORT_ROWS consecutive rows, which are contiguous bytes, and deals their sub-blocks to its lanes
 * in order: every lane loads a whole sub-block per turn. X is staged once per block in shared memory as f32
 * (padded as in rlx_qgemv_fused, so lanes on consecutive sub-blocks read different banks); each lane's sub-block
 * dot product goes to shared memory, then one lane per row adds its row's products in sub-block order (a fixed
 * order: results are reproducible). Launched with programmatic dependent launch: the warp's rows are fetched
 * into L2 while the kernel before drains. */
#define RLX_QSHORT_WARPS 8
#define RLX_QSHORT_ROWS 16

template <typename T, int FMT, int QK, int QB>
__global__ void __launch_bounds__(32 * RLX_QSHORT_WARPS)
rlx_qgemv_short(const T *__restrict__ X, const uint8_t *__restrict__ W, T *__restrict__ Y, int64_t N, int64_t K,
                int64_t RB) {
    RLX_DYNAMIC_SHARED(float4, rlx_qs_smem4);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int nsub = (int)(K / 32);
    float *xs = (float *)rlx_qs_smem4;                                        /* nsub * RLX_QFUSED_PAD floats */
    float *part = xs + nsub * RLX_QFUSED_PAD + warp * RLX_QSHORT_ROWS * nsub;  /* this warp's products */
    const int64_t step = (int64_t)gridDim.x * RLX_QSHORT_WARPS * RLX_QSHORT_ROWS;
    int64_t r0 = ((int64_t)blockIdx.x * RLX_QSHORT_WARPS + warp) * RLX_QSHORT_ROWS;
    if (r0 < N) {
        const int64_t end = (N - r0 < RLX_QSHORT_ROWS ? N - r0 : RLX_QSHORT_ROWS) * RB;
        for (int64_t off = (int64_t)lane * 128; off < end; off += 32 * 128)
            RLX_Q_PREFETCH(W + r0 * RB + off);
    }
    rlx_pdl_wait();
    rlx_pdl_trigger();  /* the next kernel may launch and prefetch its weights */
    for (int64_t i = threadIdx.x; i < K; i += blockDim.x)
        xs[(i >> 5) * RLX_QFUSED_PAD + (i & 31)] = rlx_f(X[i]);
    __syncthreads();
    for (; r0 < N; r0 += step) {
        const int rows = (int)(N - r0 < RLX_QSHORT_ROWS ? N - r0 : RLX_QSHORT_ROWS);
        const uint8_t *chunk = W + r0 * RB;
        for (int g = lane; g < rows * nsub; g += 32) {
            const int r = g / nsub, s = g - r * nsub;
            float v[32], acc[1] = {0.0f};
            rlx_q_sub<FMT>(chunk + r * RB + (s / (QK / 32)) * QB, s % (QK / 32), v);
            rlx_qf_dot<1>(xs + s * RLX_QFUSED_PAD, 0, v, acc);
            part[g] = acc[0];
        }
        __syncwarp();
        if (lane < rows) {
            float a = 0.0f;
            for (int s = 0; s < nsub; s++)
                a += part[lane * nsub + s];
            Y[r0 + lane] = rlx_to<T>(a);
        }
        __syncwarp();
    }
}

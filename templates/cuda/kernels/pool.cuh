/* rlx_pool_tail: a sentence-embedding tail in one kernel (the PoolTail decision, rlx/opt/lowering_cuda_pool.py).
 *
 *   mean[b, h] = sum_s mask[b, s] * x[b, s, h] / max(sum_s mask[b, s], eps_count)
 *   out[b, h]  = NORM ? mean[b, h] / max(sqrt(sum_h mean[b, h]^2), eps_norm) : mean[b, h]
 *
 * One block per sentence b (blockDim.x = 256). The hidden row is split into chunks of VEC elements (one 16-byte
 * load each when VEC > 1); W = min(chunks, blockDim.x) threads cover a row and G = blockDim.x / W groups of them
 * take every G-th token, so a short sentence still spreads over the block. Partial sums (f32) meet in shared
 * memory, G x H floats (host: rlx_pool_tail_smem). Everything is accumulated in f32 and rounded once, into OUT (the
 * output's ABI type when the kernel writes the graph output directly, else the device type). */

#ifndef RLX_DYNAMIC_SHARED
#define RLX_DYNAMIC_SHARED(type, name) extern __shared__ type name[]
#endif

template <typename T, int VEC> struct rlx_pool_vec;
template <typename T> struct rlx_pool_vec<T, 1> {
    static __device__ __forceinline__ void add(float *acc, const T *p, float w) { acc[0] += w * rlx_cvt<float>(p[0]); }
};
template <typename T, int VEC> struct rlx_pool_vec {
    static __device__ __forceinline__ void add(float *acc, const T *p, float w) {
        const uint4 raw = __ldg(reinterpret_cast<const uint4 *>(p));
        const T *v = reinterpret_cast<const T *>(&raw);
#pragma unroll
        for (int j = 0; j < VEC; ++j) acc[j] += w * rlx_cvt<float>(v[j]);
    }
};

/* Block-wide sum of one float per thread (blockDim.x a multiple of 32, at most 1024); every thread gets it. */
__device__ __forceinline__ float rlx_pool_block_sum(float v, float *red) {
    v = rlx_warp_sum(v);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    __syncthreads();  /* red may still be read by a previous call */
    if (lane == 0) red[warp] = v;
    __syncthreads();
    return rlx_warp_sum(lane < nw ? red[lane] : 0.0f);
}

/* The end of both pooling kernels: the token count summed over the block (its barriers also publish `part`), the
 * G partial rows of `part` summed and divided by it, then (NORM) the L2 normalization; one rounding, into ob. */
template <typename OUT, bool NORM>
__device__ __forceinline__ void rlx_pool_finish(float *part, float *red, int G, int hidden, float cnt,
                                                OUT *__restrict__ ob, float eps_count, float eps_norm) {
    cnt = rlx_pool_block_sum(cnt, red);
    const float inv = 1.0f / rlx_max(cnt, eps_count);
    float sq = 0.0f;
    for (int h = threadIdx.x; h < hidden; h += blockDim.x) {
        float v = 0.0f;
        for (int k = 0; k < G; ++k) v += part[(size_t)k * hidden + h];
        v *= inv;
        part[h] = v;  /* row 0 of part holds the mean (each h is read and written by one thread) */
        sq += v * v;
    }
    float scale = 1.0f;
    if (NORM) scale = 1.0f / rlx_max(sqrtf(rlx_pool_block_sum(sq, red)), eps_norm);
    for (int h = threadIdx.x; h < hidden; h += blockDim.x) ob[h] = rlx_cvt<OUT>(part[h] * scale);
}

static inline size_t rlx_pool_tail_smem(int hidden, int vec, int threads) {
    const int chunks = hidden / vec, w = chunks < threads ? chunks : threads, g = threads / w;
    return (size_t)g * (size_t)hidden * sizeof(float) + 32 * sizeof(float);
}

template <typename T, typename M, typename OUT, int VEC, bool NORM>
__global__ void rlx_pool_tail(const T *__restrict__ x, const M *__restrict__ mask, OUT *__restrict__ out,
                              int64_t seq, int hidden, float eps_count, float eps_norm) {
    rlx_pdl_trigger(); rlx_pdl_wait(); /* may start early (rlx_launch_pdl): wait before touching data */
    RLX_DYNAMIC_SHARED(float, rlx_pool_sm);
    const int chunks = hidden / VEC;
    const int W = chunks < (int)blockDim.x ? chunks : (int)blockDim.x, G = (int)blockDim.x / W;
    float *part = rlx_pool_sm, *red = rlx_pool_sm + (size_t)G * hidden;
    const int64_t b = blockIdx.x;
    const T *xb = x + b * seq * hidden;
    const M *mb = mask + b * seq;
    const int g = threadIdx.x / W, c0 = threadIdx.x % W;
    /* the count, while the row loads below are in flight */
    float cnt = 0.0f;
    for (int64_t s = threadIdx.x; s < seq; s += blockDim.x) cnt += rlx_cvt<float>(mb[s]);
    if (g < G) {
        for (int c = c0; c < chunks; c += W) {
            float acc[VEC];
#pragma unroll
            for (int j = 0; j < VEC; ++j) acc[j] = 0.0f;
#pragma unroll 4
            for (int64_t s = g; s < seq; s += G) {
                const float w = rlx_cvt<float>(mb[s]);
                rlx_pool_vec<T, VEC>::add(acc, xb + s * hidden + (int64_t)c * VEC, w);
            }
#pragma unroll
            for (int j = 0; j < VEC; ++j) part[(size_t)g * hidden + c * VEC + j] = acc[j];
        }
    }
    rlx_pool_finish<OUT, NORM>(part, red, G, hidden, cnt, out + b * hidden, eps_count, eps_norm);
}

/* ── rlx_pool_tail_norm: the same tail computing the normalization that produces x in its prologue ───────────────
 *
 *   y[s, :] = NK == 1 ? (v - mean(v)) / sqrt(var(v) + eps) * gamma + beta : v / sqrt(mean(v^2) + eps) * gamma,
 *   v = nx[b, s, :] (+ nres[b, s, :] when RES)
 *
 * y rounded to T as the norm's own kernel stores it, then pooled as rlx_pool_tail pools x. For short sentences
 * (seq <= RLX_POOL_NORM_MAX_SEQ, the launch decides): the norm's kernel (one more dependent launch at the end of the
 * step) then runs only for longer ones. One block per sentence; warp w normalizes the tokens w, w + nwarps, ... (one
 * row per pass, its VEC-element chunks spread over the lanes, CPT per lane, f32 statistics) and keeps its masked
 * sum in registers; the warps' sums meet in shared memory (nwarps x H floats: rlx_pool_tail_norm_smem). */

#define RLX_POOL_NORM_MAX_SEQ 64

static inline size_t rlx_pool_tail_norm_smem(int hidden, int threads) {
    return (size_t)(threads / 32) * (size_t)hidden * sizeof(float) + 32 * sizeof(float);
}

/* VEC elements of p (16-byte aligned when VEC > 1) into f32. */
template <typename T, int VEC>
__device__ __forceinline__ void rlx_pool_load(float *dst, const T *__restrict__ p) {
    if constexpr (VEC == 1) {
        dst[0] = rlx_cvt<float>(p[0]);
    } else {
        const uint4 raw = __ldg(reinterpret_cast<const uint4 *>(p));
        const T *v = reinterpret_cast<const T *>(&raw);
#pragma unroll
        for (int j = 0; j < VEC; ++j) dst[j] = rlx_cvt<float>(v[j]);
    }
}

template <typename T, typename M, typename OUT, int VEC, bool NORM, int NK, bool RES, int CPT>
__global__ void rlx_pool_tail_norm(const T *__restrict__ nx, const T *__restrict__ nres,
                                   const T *__restrict__ gamma, const T *__restrict__ beta, float eps,
                                   const M *__restrict__ mask, OUT *__restrict__ out, int64_t seq, int hidden,
                                   float eps_count, float eps_norm) {
    rlx_pdl_trigger(); rlx_pdl_wait(); /* may start early (rlx_launch_pdl): wait before touching data */
    RLX_DYNAMIC_SHARED(float, rlx_pool_sm);
    const int chunks = hidden / VEC, lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    float *part = rlx_pool_sm, *red = rlx_pool_sm + (size_t)nw * hidden;
    const int64_t b = blockIdx.x;
    const M *mb = mask + b * seq;
    float g[CPT][VEC], be[CPT][VEC], acc[CPT][VEC];
#pragma unroll
    for (int k = 0; k < CPT; ++k) {
        const int c = lane + k * 32;
#pragma unroll
        for (int j = 0; j < VEC; ++j) g[k][j] = be[k][j] = acc[k][j] = 0.0f;
        if (c < chunks) {
            rlx_pool_load<T, VEC>(g[k], gamma + (int64_t)c * VEC);
            if (NK == 1) rlx_pool_load<T, VEC>(be[k], beta + (int64_t)c * VEC);
        }
    }
    float cnt = 0.0f;
    for (int64_t s = threadIdx.x; s < seq; s += blockDim.x) cnt += rlx_cvt<float>(mb[s]);
    for (int64_t s = warp; s < seq; s += nw) {
        const float w = rlx_cvt<float>(mb[s]);
        const T *xr = nx + (b * seq + s) * hidden;
        const T *rr = RES ? nres + (b * seq + s) * hidden : nullptr;
        float v[CPT][VEC];
        float sum = 0.0f;
#pragma unroll
        for (int k = 0; k < CPT; ++k) {
            const int c = lane + k * 32;
#pragma unroll
            for (int j = 0; j < VEC; ++j) v[k][j] = 0.0f;
            if (c < chunks) {
                rlx_pool_load<T, VEC>(v[k], xr + (int64_t)c * VEC);
                if (RES) {
                    float r[VEC];
                    rlx_pool_load<T, VEC>(r, rr + (int64_t)c * VEC);
#pragma unroll
                    for (int j = 0; j < VEC; ++j) v[k][j] += r[j];
                }
            }
#pragma unroll
            for (int j = 0; j < VEC; ++j) sum += NK == 2 ? v[k][j] * v[k][j] : v[k][j];
        }
        float mean = 0.0f, var;
        if (NK == 2) {
            var = rlx_warp_sum(sum) / (float)hidden;
        } else {
            mean = rlx_warp_sum(sum) / (float)hidden;
            float q = 0.0f;
#pragma unroll
            for (int k = 0; k < CPT; ++k) {
                if (lane + k * 32 < chunks) {
#pragma unroll
                    for (int j = 0; j < VEC; ++j) q += (v[k][j] - mean) * (v[k][j] - mean);
                }
            }
            var = rlx_warp_sum(q) / (float)hidden;
        }
        const float inv = 1.0f / sqrtf(var + eps);
#pragma unroll
        for (int k = 0; k < CPT; ++k) {
#pragma unroll
            for (int j = 0; j < VEC; ++j) {
                float y = (v[k][j] - mean) * inv * g[k][j];
                if (NK != 2) y += be[k][j];
                acc[k][j] += w * rlx_cvt<float>(rlx_to<T>(y)); /* rounded as the norm's kernel stores it */
            }
        }
    }
#pragma unroll
    for (int k = 0; k < CPT; ++k) {
        const int c = lane + k * 32;
        if (c < chunks) {
#pragma unroll
            for (int j = 0; j < VEC; ++j) part[(size_t)warp * hidden + c * VEC + j] = acc[k][j];
        }
    }
    rlx_pool_finish<OUT, NORM>(part, red, nw, hidden, cnt, out + b * hidden, eps_count, eps_norm);
}

/* ── small-M tensor-core GEMM, bias and activation in its epilogue (f16 / bf16) ───────────────────────────
 * C[M,N] = act(A[M,K] B[K,N] + bias[N]) for the few rows of a short sequence (M <= RLX_GSM_MAX_M): there a
 * library GEMM's fixed cost (and a separate bias/activation pass) outweighs the arithmetic, and the weights
 * (B) are the bytes that matter. A block owns 16 rows and RLX_GSM_BN columns: it copies its whole K x BN slab
 * of B into shared memory with cp.async BEFORE waiting on the kernel before it (weights are never written by a
 * kernel, so under programmatic dependent launch that fetch overlaps the previous kernel), then its 16 x K rows
 * of A; each of its RLX_GSM_WARPS warps multiplies every RLX_GSM_WARPS-th 16-deep step of K (WMMA 16x16x16, f32
 * accumulators), and the warps' partial tiles are summed through shared memory in the epilogue, which adds the
 * bias, applies the activation (erf GELU included) in f32 and rounds once.
 * Needs K % 16 == 0, K <= RLX_GSM_KMAX, N % 8 == 0, A/B/C/bias 16-byte aligned, dense rows (A: K, B and C: N).
 *
 * NORM (1: layer norm, 2: RMS norm) fuses the normalization that produces A into this kernel (a norm kernel of
 * its own would cost a launch and a dependency for 16 rows): instead of copying A, each block normalizes its 16
 * rows of nx [+ nres] (f32 statistics, the same arithmetic as rlx_norm_vec, CPT 16-byte chunks per lane) into
 * shared memory, and the blocks of column 0 also store them to nout (A itself, which later nodes read). */

#define RLX_GSM_MAX_M 64
#define RLX_GSM_KMAX 1536
#define RLX_GSM_BN 16
#define RLX_GSM_WARPS 8

/* Shared memory of one block: B slab [K][BN + 8], A rows [16][K + 8] (rows padded by 16 bytes against bank
 * conflicts), the warps' f32 partial tiles [WARPS][16][BN]. */
__host__ __device__ constexpr size_t rlx_gemm_small_smem(int64_t K) {
    return (size_t)K * (RLX_GSM_BN + 8) * 2 + (size_t)16 * (K + 8) * 2 + (size_t)RLX_GSM_WARPS * 16 * RLX_GSM_BN * 4;
}

/* 16 bytes global -> shared, asynchronously; zero-filled (nothing read) when !full. */
__device__ __forceinline__ void rlx_gsm_cp16(void *smem, const void *gmem, bool full) {
    const uint32_t s = (uint32_t)__cvta_generic_to_shared(smem);
    const int n = full ? 16 : 0;
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem), "r"(n));
}

/* One row of the fused normalization: nx [+ nres] -> (f32 statistics) -> T, into shared memory (and nout). */
template <typename T, int NORM, bool RES, int CPT>
__device__ __forceinline__ void rlx_gsm_norm_row(const T *__restrict__ xr, const T *__restrict__ rr,
                                                 const T *__restrict__ gamma, const T *__restrict__ beta,
                                                 T *__restrict__ srow, T *__restrict__ orow, int K, float eps) {
    const int lane = threadIdx.x & 31, nc = K / 8;
    float v[CPT][8];
    float s = 0.0f;
#pragma unroll
    for (int k = 0; k < CPT; ++k) {
        const int c = lane + k * 32;
#pragma unroll
        for (int e = 0; e < 8; ++e) v[k][e] = 0.0f;
        if (c < nc) {
            int4 raw = reinterpret_cast<const int4 *>(xr)[c];
            const T *xe = reinterpret_cast<const T *>(&raw);
#pragma unroll
            for (int e = 0; e < 8; ++e) v[k][e] = rlx_f(xe[e]);
            if (RES) {
                int4 rraw = reinterpret_cast<const int4 *>(rr)[c];
                const T *re = reinterpret_cast<const T *>(&rraw);
#pragma unroll
                for (int e = 0; e < 8; ++e) v[k][e] += rlx_f(re[e]);
            }
        }
#pragma unroll
        for (int e = 0; e < 8; ++e) s += NORM == 2 ? v[k][e] * v[k][e] : v[k][e];
    }
    float mean = 0.0f, var;
    if (NORM == 2) {
        var = rlx_warp_sum(s) / (float)K;
    } else {
        mean = rlx_warp_sum(s) / (float)K;
        float q = 0.0f;
#pragma unroll
        for (int k = 0; k < CPT; ++k) {
            if (lane + k * 32 < nc) {
#pragma unroll
                for (int e = 0; e < 8; ++e) q += (v[k][e] - mean) * (v[k][e] - mean);
            }
        }
        var = rlx_warp_sum(q) / (float)K;
    }
    const float inv = 1.0f / sqrtf(var + eps);
#pragma unroll
    for (int k = 0; k < CPT; ++k) {
        const int c = lane + k * 32;
        if (c >= nc) continue;
        int4 graw = reinterpret_cast<const int4 *>(gamma)[c];
        int4 braw = make_int4(0, 0, 0, 0);
        if (NORM != 2) braw = reinterpret_cast<const int4 *>(beta)[c];
        const T *ge = reinterpret_cast<const T *>(&graw);
        const T *be = reinterpret_cast<const T *>(&braw);
        int4 oraw;
        T *oe = reinterpret_cast<T *>(&oraw);
#pragma unroll
        for (int e = 0; e < 8; ++e) {
            float y = (v[k][e] - mean) * inv * rlx_f(ge[e]);
            if (NORM != 2) y += rlx_f(be[e]);
            oe[e] = rlx_to<T>(y);
        }
        reinterpret_cast<int4 *>(srow)[c] = oraw;
        if (orow) reinterpret_cast<int4 *>(orow)[c] = oraw;
    }
}

template <typename T, int ACT, bool BIAS, int NORM, bool RES, int CPT>
__global__ void __launch_bounds__(RLX_GSM_WARPS * 32) rlx_gemm_small(const T *__restrict__ A,
                                                                     const T *__restrict__ B,
                                                                     const T *__restrict__ bias, T *__restrict__ C,
                                                                     int M, int N, int K, const T *__restrict__ nx,
                                                                     const T *__restrict__ nres,
                                                                     const T *__restrict__ ngamma,
                                                                     const T *__restrict__ nbeta, T *__restrict__ nout,
                                                                     float eps) {
    using namespace nvcuda;
    extern __shared__ __align__(128) unsigned char rlx_gsm_smem[];
    constexpr int BN = RLX_GSM_BN, CH = BN / 8; /* 16-byte chunks per slab row */
    const int LDB = BN + 8, LDA = K + 8;
    T *bs = reinterpret_cast<T *>(rlx_gsm_smem);
    T *as = bs + (size_t)K * LDB;
    float *part = reinterpret_cast<float *>(as + (size_t)16 * LDA);
    const int tid = threadIdx.x, warp = tid >> 5;
    const int n0 = blockIdx.x * BN, m0 = blockIdx.y * 16;

    /* the weight slab first: no kernel writes weights, so this needs no wait */
    for (int i = tid; i < K * CH; i += blockDim.x) {
        const int r = i / CH, col = n0 + (i % CH) * 8;
        const bool in = col < N;
        rlx_gsm_cp16(bs + (size_t)r * LDB + (i % CH) * 8, B + (size_t)r * N + (in ? col : 0), in);
    }
    asm volatile("cp.async.commit_group;\n" ::);
    rlx_pdl_trigger();
    rlx_pdl_wait(); /* A (or the norm's input) is the previous kernels' output */
    const int kc = K / 8;
    if (NORM) {
        for (int r = warp; r < 16; r += RLX_GSM_WARPS) {
            T *srow = as + (size_t)r * LDA;
            if (m0 + r >= M) {
                for (int c = tid & 31; c < kc; c += 32) reinterpret_cast<int4 *>(srow)[c] = make_int4(0, 0, 0, 0);
                continue;
            }
            const size_t row = (size_t)(m0 + r) * K;
            rlx_gsm_norm_row<T, NORM, RES, CPT>(nx + row, RES ? nres + row : nullptr, ngamma, nbeta, srow,
                                                blockIdx.x == 0 ? nout + row : nullptr, K, eps);
        }
    } else {
        for (int i = tid; i < 16 * kc; i += blockDim.x) {
            const int r = i / kc, c8 = (i % kc) * 8;
            const bool in = m0 + r < M;
            rlx_gsm_cp16(as + (size_t)r * LDA + c8, A + (size_t)(in ? m0 + r : 0) * K + c8, in);
        }
        asm volatile("cp.async.commit_group;\n" ::);
    }
    asm volatile("cp.async.wait_all;\n" ::);
    __syncthreads();

    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
    wmma::fill_fragment(acc, 0.0f);
#pragma unroll 4
    for (int k = warp * 16; k < K; k += RLX_GSM_WARPS * 16) {
        wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major> fa;
        wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::row_major> fb;
        wmma::load_matrix_sync(fa, as + k, LDA);
        wmma::load_matrix_sync(fb, bs + (size_t)k * LDB, LDB);
        wmma::mma_sync(acc, fa, fb, acc);
    }
    wmma::store_matrix_sync(part + warp * 16 * BN, acc, BN, wmma::mem_row_major);
    __syncthreads();

    /* epilogue: sum the warps' partial tiles, bias, activation, one rounding */
    for (int i = tid; i < 16 * BN; i += blockDim.x) {
        const int r = i / BN, col = i % BN;
        if (m0 + r >= M || n0 + col >= N) continue;
        float y = 0.0f;
#pragma unroll
        for (int w = 0; w < RLX_GSM_WARPS; ++w)
            y += part[w * 16 * BN + i];
        if (BIAS) y += rlx_f(bias[n0 + col]);
        C[(size_t)(m0 + r) * N + n0 + col] = rlx_to<T>(rlx_act<ACT>(y));
    }
}

/* ── A transformer FFN in one kernel: Y = gelu(X W1 + b1) W2 + b2, the intermediate kept on chip (f16 / bf16) ──
 * X [M, D], W1 [D, I], W2 [I, D] row-major, b1 [I], b2 [D]; f32 accumulation; gelu the erf form
 * (rlx_gelu_erfc). The intermediate H = gelu(X W1 + b1) is rounded to T as the two-kernel form stores it, so
 * the values are those of FFN1 (bias + GELU in its epilogue) followed by FFN2 (bias in its epilogue), up to the
 * order of FFN2's K sum (here chunk by chunk of BI, k16 steps in order inside each).
 *
 * A block owns BM = 64 rows of X (in shared memory for the whole kernel) and all D columns of Y (f32
 * accumulators in registers: 8 warps as 2 x 4, a warp 32 rows x D / 4 columns). It walks the intermediate
 * in chunks of BI columns; for each chunk
 *   (1) H_c [64, BI] = gelu(X W1[:, c] + b1[c]), W1's chunk streamed in P1 slices of D / P1 rows,
 *       rounded to T into shared memory (a warp 32 rows x BI / 4 columns);
 *   (2) Y += H_c W2[c, :], W2's chunk streamed in slices of 32 rows x D.
 * Both kinds of slice go through one cp.async ring of STAGES buffers (a slice a stage, each about 26 KB at D =
 * 384; P1 = BI / 32 so that a warp runs the same number of mma.sync products on either kind), so W2's slices
 * load while W1's are multiplied and the reverse. Per block the weights cross L2 once (2 D I elements), the
 * intermediate never reaches device memory: for MiniLM at 128 x 128 that is 2 x 50 MB a layer not written and
 * read back, against 256 blocks x 2.4 MB of weights read from L2.
 *
 * Needs D % 64 == 0, D % (16 * P1) == 0, I % BI == 0 and 16-byte aligned operands; rows past M are zero-filled
 * and not stored. Uses RlxGemmMmaOp and rlx_gemm_cp16 of gemm_mma.cuh. */
#ifndef RLX_FFN_FUSED_CUH
#define RLX_FFN_FUSED_CUH

#include "gelu_erfc.cuh"

template <int D, int BI> struct RlxFfnFused {
    static constexpr int BM = 64, WARPS_M = 2, WARPS_N = 4, THREADS = 256, STAGES = 4;
    static constexpr int P1 = BI / 32;                /* W1 slices a chunk */
    static constexpr int KS1 = D / P1, KS2 = 32;      /* rows of a W1 slice, of a W2 slice */
    static constexpr int P2 = BI / KS2;               /* W2 slices a chunk */
    static constexpr int SPC = P1 + P2;               /* stages a chunk */
    static constexpr int LDX = D + 8, LDH = BI + 8;   /* shared rows padded by 16 bytes: conflict-free ldmatrix */
    static constexpr int LD1 = BI + 8, LD2 = D + 8;
    static constexpr int WM = BM / WARPS_M, MT = WM / 16;         /* a warp's rows, its m16 fragments */
    static constexpr int NT1 = BI / WARPS_N / 8, NT2 = D / WARPS_N / 8; /* its n8 fragments in (1) and (2) */
    static constexpr size_t x_bytes = (size_t)BM * LDX * 2, h_bytes = (size_t)BM * LDH * 2;
    static constexpr size_t s1_bytes = (size_t)KS1 * LD1 * 2, s2_bytes = (size_t)KS2 * LD2 * 2;
    static constexpr size_t stage_bytes = ((s1_bytes > s2_bytes ? s1_bytes : s2_bytes) + 127) / 128 * 128;
    static constexpr size_t total = x_bytes + h_bytes + STAGES * stage_bytes;
    static_assert(D % 64 == 0 && D % (16 * P1) == 0 && BI % 64 == 0, "whole fragments in every slice");
    static_assert(NT1 % 2 == 0 && NT2 % 2 == 0, "B fragments come in pairs from one ldmatrix.x4");
    static_assert(x_bytes % 128 == 0 && h_bytes % 128 == 0, "stages start on 128-byte boundaries");
    static_assert((size_t)BM * LD2 * 2 <= STAGES * stage_bytes, "the output tile is staged in the ring");
};

/* A warp's products of one k16 step: acc[MT][NT] += A rows (ldmatrix from a_row0, row stride lda) times B
 * columns (ldmatrix.trans from b_row0, row stride ldb), the fragment layouts of rlx_gemm_mma. */
template <typename T, int MT, int NT>
__device__ __forceinline__ void rlx_ffn_k16(float (&acc)[MT][NT][4], const T *a_row0, int lda, const T *b_row0,
                                            int ldb, int lane) {
    typedef RlxGemmMmaOp<T> OP;
    uint32_t af[MT][4], bf[NT][2];
#pragma unroll
    for (int i = 0; i < MT; ++i) {
        const T *p = a_row0 + (i * 16 + (lane & 15)) * lda + (lane >> 4) * 8;
        const uint32_t addr = (uint32_t)__cvta_generic_to_shared(p);
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                     : "=r"(af[i][0]), "=r"(af[i][1]), "=r"(af[i][2]), "=r"(af[i][3])
                     : "r"(addr));
    }
#pragma unroll
    for (int j = 0; j < NT; j += 2) {
        const T *p = b_row0 + (lane & 15) * ldb + j * 8 + (lane >> 4) * 8;
        const uint32_t addr = (uint32_t)__cvta_generic_to_shared(p);
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                     : "=r"(bf[j][0]), "=r"(bf[j][1]), "=r"(bf[j + 1][0]), "=r"(bf[j + 1][1])
                     : "r"(addr));
    }
#pragma unroll
    for (int i = 0; i < MT; ++i)
#pragma unroll
        for (int j = 0; j < NT; ++j) OP::mma(acc[i][j], af[i], bf[j][0], bf[j][1]);
}

template <typename T, int D, int BI>
__global__ void __launch_bounds__(256, 1)
    rlx_ffn_fused(const T *__restrict__ X, const T *__restrict__ W1, const T *__restrict__ b1,
                  const T *__restrict__ W2, const T *__restrict__ b2, T *__restrict__ Y, int64_t M, int64_t I) {
    typedef RlxFfnFused<D, BI> F;
    typedef RlxGemmMmaOp<T> OP;
    constexpr int STAGES = F::STAGES, THREADS = F::THREADS, SPC = F::SPC, P1 = F::P1;
    extern __shared__ __align__(128) unsigned char rlx_smem_ffn[];
    T *x_s = reinterpret_cast<T *>(rlx_smem_ffn);
    T *h_s = reinterpret_cast<T *>(rlx_smem_ffn + F::x_bytes);
    unsigned char *ring = rlx_smem_ffn + F::x_bytes + F::h_bytes;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int wm = warp / F::WARPS_N, wn = warp % F::WARPS_N;
    const int g = lane >> 2, tq = lane & 3;
    const int64_t m0 = (int64_t)blockIdx.x * F::BM;
    const int nstages = (int)(I / BI) * SPC;

    /* stage s: chunk s / SPC; its first P1 stages are W1 slices [p KS1, (p + 1) KS1) x chunk columns, the rest
     * W2 slices chunk rows [(p - P1) KS2, ...) x all D columns */
    auto load = [&](int s) {
        T *st = reinterpret_cast<T *>(ring + (s % STAGES) * F::stage_bytes);
        const int64_t c0 = (int64_t)(s / SPC) * BI;
        const int p = s % SPC;
        if (p < P1) {
#pragma unroll 2
            for (int e = tid; e < F::KS1 * (BI / 8); e += THREADS) {
                const int r = e / (BI / 8), c = (e % (BI / 8)) * 8;
                rlx_gemm_cp16(st + r * F::LD1 + c, W1 + (int64_t)(p * F::KS1 + r) * I + c0 + c, true);
            }
        } else {
#pragma unroll 2
            for (int e = tid; e < F::KS2 * (D / 8); e += THREADS) {
                const int r = e / (D / 8), c = (e % (D / 8)) * 8;
                rlx_gemm_cp16(st + r * F::LD2 + c, W2 + (c0 + (p - P1) * F::KS2 + r) * D + c, true);
            }
        }
    };

    /* X's rows, in the first commit group with stage 0 */
    for (int e = tid; e < F::BM * (D / 8); e += THREADS) {
        const int r = e / (D / 8), c = (e % (D / 8)) * 8;
        const bool ok = m0 + r < M;
        rlx_gemm_cp16(x_s + r * F::LDX + c, ok ? X + (m0 + r) * D + c : X, ok);
    }
#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) {
        if (s < nstages) load(s);
        asm volatile("cp.async.commit_group;\n" ::);
    }

    float acc1[F::MT][F::NT1][4], acc2[F::MT][F::NT2][4];
#pragma unroll
    for (int i = 0; i < F::MT; ++i)
#pragma unroll
        for (int j = 0; j < F::NT2; ++j) acc2[i][j][0] = acc2[i][j][1] = acc2[i][j][2] = acc2[i][j][3] = 0.f;

    for (int s = 0; s < nstages; ++s) {
        asm volatile("cp.async.wait_group %0;\n" ::"n"(STAGES - 2));
        __syncthreads(); /* stage s has landed; the buffer refilled below was last read in stage s - 1; h_s is
                            written (end of the last W1 slice) only after every warp left the chunk before */
        if (s + STAGES - 1 < nstages) load(s + STAGES - 1);
        asm volatile("cp.async.commit_group;\n" ::);
        const T *st = reinterpret_cast<const T *>(ring + (s % STAGES) * F::stage_bytes);
        const int p = s % SPC;
        if (p < P1) {
            if (p == 0) {
#pragma unroll
                for (int i = 0; i < F::MT; ++i)
#pragma unroll
                    for (int j = 0; j < F::NT1; ++j) acc1[i][j][0] = acc1[i][j][1] = acc1[i][j][2] = acc1[i][j][3] = 0.f;
            }
            const T *a0 = x_s + (wm * F::WM) * F::LDX + p * F::KS1;
            const T *b0 = st + wn * (BI / F::WARPS_N);
#pragma unroll
            for (int kk = 0; kk < F::KS1; kk += 16)
                rlx_ffn_k16<T, F::MT, F::NT1>(acc1, a0 + kk, F::LDX, b0 + kk * F::LD1, F::LD1, lane);
            if (p == P1 - 1) { /* the chunk's bias + GELU, rounded to T into h_s (read after the next barrier) */
                const int64_t c0 = (int64_t)(s / SPC) * BI;
#pragma unroll
                for (int j = 0; j < F::NT1; ++j) {
                    const int cl = wn * (BI / F::WARPS_N) + j * 8 + tq * 2;
                    const float bb0 = (float)b1[c0 + cl], bb1 = (float)b1[c0 + cl + 1];
#pragma unroll
                    for (int i = 0; i < F::MT; ++i) {
                        const int rl = wm * F::WM + i * 16 + g;
                        *reinterpret_cast<uint32_t *>(h_s + rl * F::LDH + cl) =
                            OP::pack(rlx_gelu_erfc(acc1[i][j][0] + bb0), rlx_gelu_erfc(acc1[i][j][1] + bb1));
                        *reinterpret_cast<uint32_t *>(h_s + (rl + 8) * F::LDH + cl) =
                            OP::pack(rlx_gelu_erfc(acc1[i][j][2] + bb0), rlx_gelu_erfc(acc1[i][j][3] + bb1));
                    }
                }
            }
        } else {
            const T *a0 = h_s + (wm * F::WM) * F::LDH + (p - P1) * F::KS2;
            const T *b0 = st + wn * (D / F::WARPS_N);
#pragma unroll
            for (int kk = 0; kk < F::KS2; kk += 16)
                rlx_ffn_k16<T, F::MT, F::NT2>(acc2, a0 + kk, F::LDH, b0 + kk * F::LD2, F::LD2, lane);
        }
    }
    asm volatile("cp.async.wait_group 0;\n" ::);
    __syncthreads(); /* the ring is free: it holds the output tile */

    T *c_s = reinterpret_cast<T *>(ring);
#pragma unroll
    for (int j = 0; j < F::NT2; ++j) {
        const int cl = wn * (D / F::WARPS_N) + j * 8 + tq * 2;
        const float bb0 = (float)b2[cl], bb1 = (float)b2[cl + 1];
#pragma unroll
        for (int i = 0; i < F::MT; ++i) {
            const int rl = wm * F::WM + i * 16 + g;
            *reinterpret_cast<uint32_t *>(c_s + rl * F::LD2 + cl) = OP::pack(acc2[i][j][0] + bb0, acc2[i][j][1] + bb1);
            *reinterpret_cast<uint32_t *>(c_s + (rl + 8) * F::LD2 + cl) =
                OP::pack(acc2[i][j][2] + bb0, acc2[i][j][3] + bb1);
        }
    }
    __syncthreads();
    for (int e = tid; e < F::BM * (D / 8); e += THREADS) {
        const int r = e / (D / 8), c = (e % (D / 8)) * 8;
        if (m0 + r < M)
            *reinterpret_cast<int4 *>(Y + (m0 + r) * D + c) = *reinterpret_cast<const int4 *>(c_s + r * F::LD2 + c);
    }
}

#endif /* RLX_FFN_FUSED_CUH */

/* ── GEMM on 8 x 8 simdgroup matrices ──────────────────────────────────── */
/* A threadgroup of 128 threads (4 simdgroups, 2 x 2) computes a 32 x 32 block of C: each K step of 8 the
 * threads stage an A block [32 x 8] and a B block [8 x 32] in threadgroup memory as float (zero outside
 * the matrix, so edges need no special case), then every simdgroup multiplies its 16 x 16 quarter as
 * 2 x 2 simdgroup_float8x8 tiles. The epilogue goes through threadgroup memory so bias, activation and
 * the bounds check are per element. SWIGLU: a second B and accumulator set; out = silu(A B) * (A B2). */

#define RLX_GEMM_BM 32
#define RLX_GEMM_BN 32
#define RLX_GEMM_BK 8
#define RLX_GEMM_THREADS 128

template <typename T, int ACT, bool BIAS, bool SWIGLU, typename SA, typename SB, typename SC>
inline void rlx_gemm_block(device const T *A, device const T *B, device const T *B2, device const T *bias,
                           device T *C, long M, long N, long K, long row0, long col0, SA As, SB Bs, SB Bs2,
                           SC Cs, SC Cs2, uint tid, uint sg)
{
    const uint sr = (sg / 2) * 16, sc = (sg % 2) * 16;  /* this simdgroup's quarter of the block */
    simdgroup_float8x8 acc[2][2], acc2[2][2];
    for (int i = 0; i < 2; ++i)
        for (int j = 0; j < 2; ++j) {
            acc[i][j] = make_filled_simdgroup_matrix<float, 8, 8>(0.0f);
            acc2[i][j] = make_filled_simdgroup_matrix<float, 8, 8>(0.0f);
        }
    for (long k0 = 0; k0 < K; k0 += RLX_GEMM_BK) {
        for (uint e = tid; e < RLX_GEMM_BM * RLX_GEMM_BK; e += RLX_GEMM_THREADS) {
            const long r = row0 + e / RLX_GEMM_BK, k = k0 + e % RLX_GEMM_BK;
            As[e] = (r < M && k < K) ? rlx_f(A[r * K + k]) : 0.0f;
        }
        for (uint e = tid; e < RLX_GEMM_BK * RLX_GEMM_BN; e += RLX_GEMM_THREADS) {
            const long k = k0 + e / RLX_GEMM_BN, c = col0 + e % RLX_GEMM_BN;
            const bool in = k < K && c < N;
            Bs[e] = in ? rlx_f(B[k * N + c]) : 0.0f;
            if (SWIGLU) Bs2[e] = in ? rlx_f(B2[k * N + c]) : 0.0f;
        }
        threadgroup_barrier(mem_flags::mem_threadgroup);
        for (int i = 0; i < 2; ++i) {
            simdgroup_float8x8 a;
            simdgroup_load(a, As + (sr + 8 * i) * RLX_GEMM_BK, RLX_GEMM_BK);
            for (int j = 0; j < 2; ++j) {
                simdgroup_float8x8 b;
                simdgroup_load(b, Bs + sc + 8 * j, RLX_GEMM_BN);
                simdgroup_multiply_accumulate(acc[i][j], a, b, acc[i][j]);
                if (SWIGLU) {
                    simdgroup_float8x8 b2;
                    simdgroup_load(b2, Bs2 + sc + 8 * j, RLX_GEMM_BN);
                    simdgroup_multiply_accumulate(acc2[i][j], a, b2, acc2[i][j]);
                }
            }
        }
        threadgroup_barrier(mem_flags::mem_threadgroup);  /* before the next K step overwrites the blocks */
    }
    for (int i = 0; i < 2; ++i)
        for (int j = 0; j < 2; ++j) {
            simdgroup_store(acc[i][j], Cs + (sr + 8 * i) * RLX_GEMM_BN + sc + 8 * j, RLX_GEMM_BN);
            if (SWIGLU) simdgroup_store(acc2[i][j], Cs2 + (sr + 8 * i) * RLX_GEMM_BN + sc + 8 * j, RLX_GEMM_BN);
        }
    threadgroup_barrier(mem_flags::mem_threadgroup);
    for (uint e = tid; e < RLX_GEMM_BM * RLX_GEMM_BN; e += RLX_GEMM_THREADS) {
        const long r = row0 + e / RLX_GEMM_BN, c = col0 + e % RLX_GEMM_BN;
        if (r >= M || c >= N) continue;
        float v = Cs[e];
        if (SWIGLU) {
            v = rlx_silu(v) * Cs2[e];
        } else {
            if (BIAS) v += rlx_f(bias[c]);
            v = rlx_act<ACT>(v);
        }
        C[r * N + c] = rlx_to<T>(v);
    }
}

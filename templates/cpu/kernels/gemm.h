/* Single-threaded SGEMM per OpenMP thread: BLAS when RLX_BLAS is defined, else a C fallback.
 * A fixed RLX kernel header: no template code; included by generated files that need it. */
#ifndef RLX_KERNELS_GEMM_H
#define RLX_KERNELS_GEMM_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* ── GEMM: C[m,n] = op(A)[m,k] @ op(B)[k,n], row-major, beta = 0 ───────────
 *
 * Thread policy: all parallelism comes from OpenMP. A GEMM is split into one
 * block of rows (or, for short M, of columns) per OpenMP thread, and each
 * thread calls a single-threaded sgemm on its block, then runs the epilogue
 * on that block while it is still in cache. BLAS is pinned to one thread, so
 * there is one thread pool: OpenBLAS's own workers, spinning after a call,
 * would otherwise fight libgomp's spinning workers for the cores (measured:
 * 4x slower FFN blocks on 2 cores with both pools active).
 */

/* The [m0,m1) x [n0,n1) block of C that thread `t` of `nt` computes. */
static void rlx_gemm_block(int64_t m, int64_t n, int t, int nt, int64_t *m0, int64_t *m1, int64_t *n0, int64_t *n1)
{
    if (m >= 16 * (int64_t)nt || n < 64 * (int64_t)nt) {
        const int64_t step = (m + nt - 1) / nt;
        *m0 = t * step < m ? t * step : m;
        *m1 = *m0 + step < m ? *m0 + step : m;
        *n0 = 0;
        *n1 = n;
    } else {  /* few rows (decode): split columns in multiples of 16 */
        const int64_t step = ((n + nt - 1) / nt + 15) / 16 * 16;
        *m0 = 0;
        *m1 = m;
        *n0 = t * step < n ? t * step : n;
        *n1 = *n0 + step < n ? *n0 + step : n;
    }
}

/* Threads worth using for an m x n x k GEMM: below ~64K multiply-adds per thread forking costs more. */
static int rlx_gemm_threads(int nt, int64_t m, int64_t n, int64_t k)
{
    const int64_t work = m * n * (k > 0 ? k : 1);
    const int64_t useful = work / (1 << 16);
    return useful < 1 ? 1 : (useful < nt ? (int)useful : nt);
}
#ifdef RLX_BLAS

/* Declared here rather than through cblas.h: only the int (LP64) interface is used, and the
 * provider's symbol prefix comes from RLX_BLAS_FN, which the generated file defines. */
void RLX_BLAS_FN(cblas_sgemm)(int order, int transa, int transb, int m, int n, int k, float alpha,
        const float *a, int lda, const float *b, int ldb, float beta, float *c, int ldc);
#ifdef RLX_BLAS_THREADS
void RLX_BLAS_FN(openblas_set_num_threads)(int n);
int RLX_BLAS_FN(openblas_get_num_threads)(void);
#endif

/* Keep the BLAS single-threaded (process-wide for this BLAS library): see the thread policy above. */
static void rlx_blas_single_thread(void)
{
#ifdef RLX_BLAS_THREADS
    if (RLX_BLAS_FN(openblas_get_num_threads)() != 1)
        RLX_BLAS_FN(openblas_set_num_threads)(1);
#endif
}

/* One single-threaded GEMM on the calling thread. */
static void rlx_sgemm1(int ta, int tb, int64_t m, int64_t n, int64_t k,
                       const float *a, int64_t lda, const float *b, int64_t ldb, float *c, int64_t ldc)
{
    if (m <= 0 || n <= 0)
        return;
    if (k <= 0) {
        for (int64_t i = 0; i < m; i++)
            memset(c + i * ldc, 0, (size_t)n * sizeof(float));
        return;
    }
    RLX_BLAS_FN(cblas_sgemm)(101, ta ? 112 : 111, tb ? 112 : 111, (int)m, (int)n, (int)k, 1.0f,
        a, (int)(lda > 0 ? lda : 1), b, (int)(ldb > 0 ? ldb : 1), 0.0f, c, (int)(ldc > 0 ? ldc : 1));
}
#else

static void rlx_blas_single_thread(void) {}

/* No BLAS: a cache-blocked C GEMM on the calling thread. The inner loops are written
 * so the compiler vectorizes along n (or along k for a transposed B). */
static void rlx_sgemm1(int ta, int tb, int64_t m, int64_t n, int64_t k,
                       const float *a, int64_t lda, const float *b, int64_t ldb, float *c, int64_t ldc)
{
    const int64_t NB = 512, KB = 256;
    for (int64_t i = 0; i < m; i++) {
        float *restrict ci = c + i * ldc;
        for (int64_t j0 = 0; j0 < n; j0 += NB) {
            const int64_t j1 = j0 + NB < n ? j0 + NB : n;
            for (int64_t j = j0; j < j1; j++)
                ci[j] = 0.0f;
            for (int64_t p0 = 0; p0 < k; p0 += KB) {
                const int64_t p1 = p0 + KB < k ? p0 + KB : k;
                if (tb) {
                    for (int64_t j = j0; j < j1; j++) {
                        const float *restrict bj = b + j * ldb;
                        float acc = 0.0f;
                        if (ta) {
                            for (int64_t p = p0; p < p1; p++)
                                acc += a[p * lda + i] * bj[p];
                        } else {
                            const float *restrict ai = a + i * lda;
                            #pragma omp simd reduction(+:acc)
                            for (int64_t p = p0; p < p1; p++)
                                acc += ai[p] * bj[p];
                        }
                        ci[j] += acc;
                    }
                } else {
                    for (int64_t p = p0; p < p1; p++) {
                        const float aip = ta ? a[p * lda + i] : a[i * lda + p];
                        const float *restrict bp = b + p * ldb;
                        #pragma omp simd
                        for (int64_t j = j0; j < j1; j++)
                            ci[j] += aip * bp[j];
                    }
                }
            }
        }
    }
}
#endif

/* The block of a partitioned GEMM that thread t of nt computes: C[m0:m1, n0:n1]. */
static void rlx_sgemm_part(int ta, int tb, int64_t m, int64_t n, int64_t k, const float *a, int64_t lda,
                           const float *b, int64_t ldb, float *c, int64_t ldc, int t, int nt,
                           int64_t *m0, int64_t *m1, int64_t *n0, int64_t *n1)
{
    rlx_gemm_block(m, n, t, nt, m0, m1, n0, n1);
    rlx_sgemm1(ta, tb, *m1 - *m0, *n1 - *n0, k, a + (ta ? *m0 : *m0 * lda), lda, b + (tb ? *n0 * ldb : *n0), ldb,
               c + *m0 * ldc + *n0, ldc);
}

#endif /* RLX_KERNELS_GEMM_H */

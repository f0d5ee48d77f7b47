/* Layer norm rows on AVX-512, four at a time (templates/cpu/norm.c.j2: norm_rows).
 * A fixed RLX kernel header: no template code; included by generated files that need it.
 *
 * The generated loops compute a row's statistics in double, and gcc's tuning for AVX-512 CPUs vectorizes
 * their reductions 4 doubles at a time even when asked for 16 lanes: every double operation then takes two
 * instructions. These are the same loops on 8-double vectors: the same operations on each element (the sums
 * kept as 16 partial sums, element i in partial i % 16, as the 16-lane loops keep them), so the same values up
 * to the order in which the 16 partial sums are added at the end. */
#ifndef RLX_KERNELS_NORM_ROWS_H
#define RLX_KERNELS_NORM_ROWS_H

#include <math.h>
#include <stdint.h>

#if defined(__AVX512F__)
#include <immintrin.h>
#define RLX_LN_ROWS4_512 1

/* 16 floats widened: lanes 0-7 into *lo, 8-15 into *hi. */
static inline void rlx_ln_widen16(__m512 v, __m512d *lo, __m512d *hi)
{
    *lo = _mm512_cvtps_pd(_mm512_castps512_ps256(v));
    *hi = _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
}

/* y[j] = LN(x[j] (+ res[j] (+ bias))) for the 4 rows x[j] = x + j * n (res, bias may be NULL; y may be x or res):
 * n a multiple of 16; g64 / b64 gamma and beta widened; dx 4 * n doubles of scratch. */
static void rlx_ln_rows4_512(float *y, const float *x, const float *res, const float *bias, const double *g64,
                             const double *b64, int64_t n, double eps, double *restrict dx)
{
    __m512d slo[4], shi[4];
    for (int j = 0; j < 4; j++)
        slo[j] = shi[j] = _mm512_setzero_pd();
    for (int64_t i = 0; i < n; i += 16)
        for (int j = 0; j < 4; j++) {
            __m512 v = _mm512_loadu_ps(x + j * n + i);
            if (res) {  /* the residual sum in float, as the row loops form it */
                v = _mm512_add_ps(v, _mm512_loadu_ps(res + j * n + i));
                if (bias)
                    v = _mm512_add_ps(v, _mm512_loadu_ps(bias + i));
            }
            __m512d lo, hi;
            rlx_ln_widen16(v, &lo, &hi);
            _mm512_storeu_pd(dx + j * n + i, lo);
            _mm512_storeu_pd(dx + j * n + i + 8, hi);
            slo[j] = _mm512_add_pd(slo[j], lo);
            shi[j] = _mm512_add_pd(shi[j], hi);
        }
    __m512d mean[4], vlo[4], vhi[4];
    for (int j = 0; j < 4; j++) {
        mean[j] = _mm512_set1_pd(_mm512_reduce_add_pd(_mm512_add_pd(slo[j], shi[j])) / (double)n);
        vlo[j] = vhi[j] = _mm512_setzero_pd();
    }
    for (int64_t i = 0; i < n; i += 16)
        for (int j = 0; j < 4; j++) {
            const __m512d d0 = _mm512_sub_pd(_mm512_loadu_pd(dx + j * n + i), mean[j]);
            const __m512d d1 = _mm512_sub_pd(_mm512_loadu_pd(dx + j * n + i + 8), mean[j]);
            vlo[j] = _mm512_fmadd_pd(d0, d0, vlo[j]);
            vhi[j] = _mm512_fmadd_pd(d1, d1, vhi[j]);
        }
    for (int j = 0; j < 4; j++) {
        const __m512d inv = _mm512_set1_pd(1.0 / sqrt(_mm512_reduce_add_pd(_mm512_add_pd(vlo[j], vhi[j])) / (double)n + eps));
        float *yr = y + j * n;
        const double *d = dx + j * n;
        for (int64_t i = 0; i < n; i += 16) {
            /* ((x - mean) * inv) * gamma + beta, the multiply-add fused as gcc contracts the row loops' */
            const __m512d o0 = _mm512_fmadd_pd(_mm512_mul_pd(_mm512_sub_pd(_mm512_loadu_pd(d + i), mean[j]), inv),
                                               _mm512_loadu_pd(g64 + i), _mm512_loadu_pd(b64 + i));
            const __m512d o1 = _mm512_fmadd_pd(_mm512_mul_pd(_mm512_sub_pd(_mm512_loadu_pd(d + i + 8), mean[j]), inv),
                                               _mm512_loadu_pd(g64 + i + 8), _mm512_loadu_pd(b64 + i + 8));
            _mm512_storeu_ps(yr + i, _mm512_insertf32x8(_mm512_castps256_ps512(_mm512_cvtpd_ps(o0)),
                                                        _mm512_cvtpd_ps(o1), 1));
        }
    }
}
#endif

#endif /* RLX_KERNELS_NORM_ROWS_H */

/* Fused attention building blocks on the packed GEMM kernel (needs kernels/packed_gemm.h).
 * A fixed RLX kernel header: no template code; included by generated files that need it. */
#ifndef RLX_KERNELS_ATTENTION_H
#define RLX_KERNELS_ATTENTION_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#if (defined(__x86_64__) || defined(__i386__)) && (defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__)))
#include <immintrin.h>  /* the AVX-512 / AVX2 softmax below */
#endif


/* ── attention building blocks: scores and weighted sums on the packed kernel ──
 *
 * A fused attention task owns one (batch row, kv head): it packs that head's K
 * (transposed) and V once into its scratch, in the micro-kernel's panel layout,
 * and every query block of the heads sharing them multiplies against the packed
 * copies. Packing costs a pass over K and V, so it is skipped when few query rows
 * share them (decoding one token): then the BLAS / C GEMM reads K and V in place.
 */

/* Query rows (times heads sharing the kv head) from which packing K and V pays off. */
#define RLX_ATTN_PACK_ROWS 8

static inline int rlx_attn_packs(int64_t rows)
{
#ifdef RLX_NR
    return rows >= RLX_ATTN_PACK_ROWS;
#else
    (void)rows;
    return 0;
#endif
}

/* kp <- K[0:skv, 0:hd]^T and vp <- V[0:skv, 0:hd] packed (rows of K and V are kw apart). */
static void rlx_attn_pack(float *kp, float *vp, const float *K, const float *V, int64_t skv, int64_t hd, int64_t kw)
{
#ifdef RLX_NR
    rlx_pack_b(kp, K, hd, skv, 1, kw);
    rlx_pack_b(vp, V, skv, hd, kw, 1);
#else
    (void)kp; (void)vp; (void)K; (void)V; (void)skv; (void)hd; (void)kw;
#endif
}

/* S[0:rows, 0:jb] = Q[0:rows, 0:hd] @ K[0:jb, 0:hd]^T, from the packed kp when `packed`. */
static void rlx_attn_scores(float *S, int64_t lds, const float *Q, int64_t ldq, int64_t rows, int64_t jb,
                            int64_t hd, const float *kp, const float *K, int64_t kw, int packed)
{
#ifdef RLX_NR
    if (packed) {
        for (int64_t j0 = 0; j0 < jb; j0 += RLX_NR) {
            const int64_t nr = jb - j0 < RLX_NR ? jb - j0 : RLX_NR;
            for (int64_t i = 0; i < rows; i += RLX_MR)
                rlx_kernel(rows - i < RLX_MR ? rows - i : RLX_MR, 0, hd, Q + i * ldq, ldq, kp + j0 * hd,
                           S + i * lds + j0, lds, nr, NULL, 0);
        }
        return;
    }
#else
    (void)kp; (void)packed;
#endif
    rlx_sgemm1(0, 1, rows, jb, hd, Q, ldq, K, kw, S, lds);
}

/* O[0:rows, 0:hd] = P[0:rows, 0:jb] @ V[0:jb, 0:hd], from the packed vp (skv rows) when `packed`. */
static void rlx_attn_values(float *O, int64_t ldo, const float *P, int64_t ldp, int64_t rows, int64_t jb,
                            int64_t hd, const float *vp, int64_t skv, const float *V, int64_t kw, int packed)
{
#ifdef RLX_NR
    if (packed) {
        for (int64_t d0 = 0; d0 < hd; d0 += RLX_NR) {
            const int64_t nr = hd - d0 < RLX_NR ? hd - d0 : RLX_NR;
            for (int64_t i = 0; i < rows; i += RLX_MR)
                rlx_kernel(rows - i < RLX_MR ? rows - i : RLX_MR, 0, jb, P + i * ldp, ldp, vp + d0 * skv,
                           O + i * ldo + d0, ldo, nr, NULL, 0);
        }
        return;
    }
#else
    (void)vp; (void)skv; (void)packed;
#endif
    rlx_sgemm1(0, 0, rows, hd, jb, P, ldp, V, kw, O, ldo);
}

#if defined(RLX_NR) && RLX_NR == 32
#include "vexp16.h"  /* rlx_exp16_nonpos: rlx_expf on 16 lanes, x <= 0 */

static inline __mmask16 rlx_tail_mask(int64_t left)
{
    return left >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << left) - 1u);
}
#elif defined(RLX_NR) && RLX_NR == 16
#include "vexp8.h"  /* rlx_exp8_nonpos: rlx_expf on 8 lanes, x <= 0 */

static inline float rlx_hmax8(__m256 v)
{
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    m = _mm_max_ss(m, _mm_movehdup_ps(m));
    return _mm_cvtss_f32(m);
}
#endif

/* One row of attention scores to softmax weights, in place, without the division:
 * v_j = s[j] * scale (+ add[j]), or -inf where keep[j] == 0 (add, keep may be NULL);
 * s[j] <- exp(v_j - max v) for j < jn, 0 for jn <= j < jb. Returns 1 / sum of the exps
 * (summed in double), or 0 with the row zeroed when every key is masked. The AVX-512
 * version runs ~3x faster than the loops gcc vectorizes from the portable one; the AVX2 one
 * ~1.2x (1.31 -> 1.07 ns a score on Zen 3, one thread's CPU time, MiniLM's 128-key rows), and its exp
 * pass ~1.2x more with rlx_exp8_nonpos (2.39 -> 1.94 TSC ticks a score, the same values). */
static float rlx_softmax_row(float *restrict s, int64_t jn, int64_t jb, float scale, const float *restrict add,
                             const float *restrict keep)
{
#if defined(RLX_NR) && RLX_NR == 32
    const __m512 vscale = _mm512_set1_ps(scale), ninf = _mm512_set1_ps(-INFINITY);
    __m512 vmax = ninf;
    for (int64_t j = 0; j < jn; j += 16) {
        const __mmask16 m = rlx_tail_mask(jn - j);
        __m512 v = _mm512_mul_ps(_mm512_maskz_loadu_ps(m, s + j), vscale);
        if (add)
            v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(m, add + j));
        if (keep)
            v = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(_mm512_maskz_loadu_ps(m, keep + j), _mm512_setzero_ps(),
                                                        _CMP_NEQ_UQ), ninf, v);
        _mm512_mask_storeu_ps(s + j, m, v);
        vmax = _mm512_mask_max_ps(vmax, m, v, vmax);
    }
    const float mx = _mm512_reduce_max_ps(vmax);
    if (mx == -INFINITY) {  /* every key masked (or jn == 0): the row is zeros */
        memset(s, 0, (size_t)jb * sizeof(float));
        return 0.0f;
    }
    const __m512 vmx = _mm512_set1_ps(mx);
    __m512d lo = _mm512_setzero_pd(), hi = _mm512_setzero_pd();
    for (int64_t j = 0; j < jn; j += 16) {
        const __mmask16 m = rlx_tail_mask(jn - j);
        /* v_j - max v is <= 0 (a NaN v never becomes the max) or NaN */
        const __m512 e = _mm512_maskz_mov_ps(m, rlx_exp16_nonpos(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, s + j), vmx)));
        _mm512_mask_storeu_ps(s + j, m, e);
        lo = _mm512_add_pd(lo, _mm512_cvtps_pd(_mm512_castps512_ps256(e)));
        hi = _mm512_add_pd(hi, _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(e), 1))));
    }
    const double sum = _mm512_reduce_add_pd(_mm512_add_pd(lo, hi));
#elif defined(RLX_NR) && RLX_NR == 16
    /* AVX2: the portable loops below written 8 lanes wide, same values: v_j as the portable
       expression computes it, exp by rlx_exp8_nonpos (= rlx_expf), the sum in double */
    const __m256 vscale = _mm256_set1_ps(scale), ninf = _mm256_set1_ps(-INFINITY);
    __m256 vmax = ninf;
    const int64_t jv = jn / 8 * 8;  /* the 8-lane part; the rest as the portable loops */
    for (int64_t j = 0; j < jv; j += 8) {
        const __m256 sv = _mm256_loadu_ps(s + j);
        __m256 v = add ? _mm256_fmadd_ps(sv, vscale, _mm256_loadu_ps(add + j)) : _mm256_mul_ps(sv, vscale);
        if (keep)
            v = _mm256_blendv_ps(ninf, v, _mm256_cmp_ps(_mm256_loadu_ps(keep + j), _mm256_setzero_ps(), _CMP_NEQ_UQ));
        _mm256_storeu_ps(s + j, v);
        vmax = _mm256_max_ps(v, vmax);  /* a NaN v keeps the max, as `v > mx ? v : mx` */
    }
    float mx = rlx_hmax8(vmax);
    for (int64_t j = jv; j < jn; j++) {
        float v = s[j] * scale + (add ? add[j] : 0.0f);
        v = keep && keep[j] == 0.0f ? -INFINITY : v;
        s[j] = v;
        mx = v > mx ? v : mx;
    }
    if (mx == -INFINITY) {
        memset(s, 0, (size_t)jb * sizeof(float));
        return 0.0f;
    }
    const __m256 vmx = _mm256_set1_ps(mx);
    __m256d acc = _mm256_setzero_pd();
    for (int64_t j = 0; j < jv; j += 8) {
        /* v_j - max v is <= 0 (a NaN v never becomes the max) or NaN */
        const __m256 e = rlx_exp8_nonpos(_mm256_sub_ps(_mm256_loadu_ps(s + j), vmx));
        _mm256_storeu_ps(s + j, e);
        acc = _mm256_add_pd(acc, _mm256_add_pd(_mm256_cvtps_pd(_mm256_castps256_ps128(e)),
                                               _mm256_cvtps_pd(_mm256_extractf128_ps(e, 1))));
    }
    double tail = 0.0;
    for (int64_t j = jv; j < jn; j++) {
        const float e = rlx_expf(s[j] - mx);
        s[j] = e;
        tail += (double)e;
    }
    const __m128d half = _mm_add_pd(_mm256_castpd256_pd128(acc), _mm256_extractf128_pd(acc, 1));
    const double sum = _mm_cvtsd_f64(_mm_add_sd(half, _mm_unpackhi_pd(half, half))) + tail;
#else
    float mx = -INFINITY;
    #pragma omp simd reduction(max:mx)
    for (int64_t j = 0; j < jn; j++) {
        float v = s[j] * scale + (add ? add[j] : 0.0f);
        v = keep && keep[j] == 0.0f ? -INFINITY : v;
        s[j] = v;
        mx = v > mx ? v : mx;
    }
    if (mx == -INFINITY) {
        memset(s, 0, (size_t)jb * sizeof(float));
        return 0.0f;
    }
    const double sum = rlx_exp_shifted_sum(s, jn, mx);
#endif
    for (int64_t j = jn; j < jb; j++)
        s[j] = 0.0f;
    return (float)(1.0 / sum);
}

#endif /* RLX_KERNELS_ATTENTION_H */

/* exp on 16 AVX-512 lanes, the vector form of rlx_expf (kernels/scalar.h): a Cody-Waite reduction
 * x = n ln2 + r, a degree-7 Taylor polynomial in r, and 2^n applied with vscalefps.
 * A fixed RLX kernel header, included by the kernels that need it (AVX-512 builds only). */
#ifndef RLX_KERNELS_VEXP16_H
#define RLX_KERNELS_VEXP16_H

#include <immintrin.h>

/* exp(x) for x already within the range where the result is a normal float (about [-87, 88.7]):
 * no clamping and no special values, for callers that bound x themselves. */
static inline __m512 rlx_exp16_in_range(__m512 x)
{
    const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                          _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693145751953125f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(1.428606765330187045e-06f), r);
    __m512 p = _mm512_set1_ps(1.98412698412698413e-4f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.38888888888888889e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.33333333333333333e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.16666666666666667e-2f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.66666666666666667e-1f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    return _mm512_scalef_ps(p, n);
}

/* exp(x) on any input: overflow gives +inf, underflow 0, NaN stays NaN (as rlx_expf). */
static inline __m512 rlx_exp16(__m512 x)
{
    const __m512 hi = _mm512_set1_ps(88.72283935546875f), lo = _mm512_set1_ps(-103.97207708f);
    __m512 out = rlx_exp16_in_range(_mm512_min_ps(_mm512_max_ps(x, lo), hi));
    out = _mm512_mask_mov_ps(out, _mm512_cmp_ps_mask(x, hi, _CMP_GT_OQ), _mm512_set1_ps(INFINITY));
    out = _mm512_mask_mov_ps(out, _mm512_cmp_ps_mask(x, lo, _CMP_LT_OQ), _mm512_setzero_ps());
    return _mm512_mask_mov_ps(out, _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q), x);  /* NaN stays NaN */
}

/* exp(x) for x <= 0 or NaN (a softmax's scores less their max): rlx_exp16's values without its overflow
 * clamp and +inf case. */
static inline __m512 rlx_exp16_nonpos(__m512 x)
{
    const __m512 lo = _mm512_set1_ps(-103.97207708f);
    __m512 out = rlx_exp16_in_range(_mm512_max_ps(x, lo));
    out = _mm512_mask_mov_ps(out, _mm512_cmp_ps_mask(x, lo, _CMP_LT_OQ), _mm512_setzero_ps());
    return _mm512_mask_mov_ps(out, _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q), x);  /* NaN stays NaN */
}

/* 2^y for y <= 0, -inf or NaN on 16 lanes (a softmax's log2-scaled scores less their max: rlx_attn_rows):
 * y = n + f with n = round(y), |f| <= 1/2, 2^f by a degree-6 polynomial (RLX's own fit, Lawson-weighted least
 * squares of the relative error: <= 2.7e-9 on [-1/2, 1/2] in exact arithmetic; as evaluated, <= 1.32 ulps over 24M
 * arguments in [-160, 0] where 2^y is normal, under one subnormal step below; tests/codegen/test_cpu_vector_forms.py
 * bounds it by 2 ulps), and 2^n applied with vscalefps (one rounding, so results in the subnormal range round once). y is clamped at -200 first (2^-200 rounds to +0): -inf
 * gives +0; NaN stays NaN (vmaxps returns its second operand when either is NaN). 10 instructions (the clamp, the
 * rounding, f, 6 multiply-adds, vscalefps) where rlx_exp16_in_range takes 12 behind rlx_attn_rows' former range
 * test (a compare and a branch): no Cody-Waite step (y - round(y) is exact), one polynomial term fewer. */
static inline __m512 rlx_exp2_16_nonpos(__m512 y)
{
    y = _mm512_max_ps(_mm512_set1_ps(-200.0f), y);
    const __m512 n = _mm512_roundscale_ps(y, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __m512 f = _mm512_sub_ps(y, n);
    __m512 p = _mm512_set1_ps(1.534579205326736e-4f);
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.3399929739534855e-3f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(9.618489071726799e-3f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(5.550328642129898e-2f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(0.24022646248340607f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(0.6931471824645996f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f));
    return _mm512_scalef_ps(p, n);
}

#endif /* RLX_KERNELS_VEXP16_H */

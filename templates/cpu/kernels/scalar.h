/* Scalar functions of the IR's activations and binary ops, float and double.
 * A fixed RLX kernel header: no template code; included by generated files that need it. */
#ifndef RLX_KERNELS_SCALAR_H
#define RLX_KERNELS_SCALAR_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* Longest norm row (floats) the layer norm kernels widen once into a double buffer on the stack (templates/cpu/
 * norm.c.j2: norm_rows); longer rows convert in every pass. */
#define RLX_NORM_BUF 1024

/* ── scalar functions (activation names of the IR), float and double ──── */

/* exp for float that gcc can vectorize: Cody-Waite reduction by ln2, degree-7
 * polynomial on [-ln2/2, ln2/2], exponent put back with integer arithmetic.
 * Max error about 1 ulp; overflow gives inf, underflow 0, NaN stays NaN. */
static inline float rlx_expf(float x)
{
    const float hi = 88.72283935546875f, lo = -103.97207708f;
    float xc = x > hi ? hi : x;
    xc = xc < lo ? lo : xc;
    const float n = rintf(xc * 1.44269504088896341f);  /* nearest even: default rounding mode */
    float r = xc - n * 0.693145751953125f;
    r = r - n * 1.428606765330187045e-06f;
    float p = 1.98412698412698413e-4f;
    p = p * r + 1.38888888888888889e-3f;
    p = p * r + 8.33333333333333333e-3f;
    p = p * r + 4.16666666666666667e-2f;
    p = p * r + 1.66666666666666667e-1f;
    p = p * r + 0.5f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    /* 2^n in two halves so n down to -150 (subnormal results) stays exact */
    const int32_t ni = (int32_t)n;
    const int32_t n1 = ni / 2, n2 = ni - n1;
    const float s1 = rlx_bits_f((uint32_t)(n1 + 127) << 23);
    const float s2 = rlx_bits_f((uint32_t)(n2 + 127) << 23);
    float out = p * s1 * s2;
    out = x > hi ? INFINITY : out;
    out = x < lo ? 0.0f : out;
    out = x != x ? x : out;
    return out;
}

/* s[j] <- exp(s[j] - mx) for j < n (a softmax's numerators, in place); returns their sum in double. */
static inline double rlx_exp_shifted_sum(float *restrict s, int64_t n, float mx)
{
    double sum = 0.0;
    #pragma omp simd reduction(+:sum)
    for (int64_t j = 0; j < n; j++) {
        const float e = rlx_expf(s[j] - mx);
        s[j] = e;
        sum += (double)e;
    }
    return sum;
}

/* exp of a double argument, to float accuracy: range reduction in double (so a large
 * argument loses nothing), the polynomial in float. Arguments below -110 give 0. */
static inline float rlx_exp_dtof(double a)
{
    a = a < -110.0 ? -110.0 : a;
    const double n = rint(a * 1.4426950408889634);
    const float r = (float)(a - n * 0.6931471805599453);
    float p = 1.98412698412698413e-4f;
    p = p * r + 1.38888888888888889e-3f;
    p = p * r + 8.33333333333333333e-3f;
    p = p * r + 4.16666666666666667e-2f;
    p = p * r + 1.66666666666666667e-1f;
    p = p * r + 0.5f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    const int32_t ni = (int32_t)n;
    const int32_t n1 = ni / 2, n2 = ni - n1;
    const float out = p * rlx_bits_f((uint32_t)(n1 + 127) << 23) * rlx_bits_f((uint32_t)(n2 + 127) << 23);
    return a <= -110.0 ? 0.0f : out;
}

/* gelu(x) = x * Phi(x), in float so it vectorizes 16 wide (libm's erfcf does not vectorize;
 * a double-precision version costs ~1.7x more). Two ranges, both computed, one selected:
 *  |x| < 0.75:  Phi(x) = 1/2 + x S(x^2), S the Taylor series of (Phi(x) - 1/2)/x to x^14.
 *  |x| >= 0.75: Phi(-|x|) = erfc(z)/2 = t/2 exp(h(t) - z^2), z = |x|/sqrt2, t = 1/(1 + z),
 *               h a degree-10 polynomial in w = (t - mid)/half fitted (Chebyshev least squares,
 *               RLX's own fit, |error| < 4e-9) to log(erfc(z) e^{z^2} / t) for |x| in [0.75, 16].
 *               z^2 = x^2/2 is carried as an exact float pair (FMA or Dekker's split) and its
 *               high part cancels against n ln2 exactly, so the exponent loses nothing at large
 *               |x| where exp magnifies argument error by z^2. Phi(x) = 1 - Phi(-x) for x > 0.
 * Max relative error 2.84e-7 (4.8 x 2^-24) with FMA, 3.26e-7 (5.5 x 2^-24) without, over every float in
 * [-13.5, 13.5], negative tail included (measured against double erfc; an earlier sampled sweep said 2.7e-7); |x| >= 16 with x < 0 gives -0 (the true value underflows), -inf gives NaN
 * (-inf * 0, as the reference computes it), +inf gives +inf, NaN stays NaN. */
static inline float rlx_gelu_f(float x)
{
    const float ax0 = fabsf(x);
    const float ax = ax0 < 16.0f ? ax0 : 16.0f;
    const float u = ax * ax;
    float s = -4.122667414862689e-08f;
    s = s * u + 6.659693516316651e-07f;
    s = s * u + -9.444656259503615e-06f;
    s = s * u + 0.00011543468761615529f;
    s = s * u + -0.0011873282154804545f;
    s = s * u + 0.009973557010035817f;
    s = s * u + -0.06649038006690546f;
    s = s * u + 0.3989422804014327f;
    const float center = x * (0.5f + x * s);
#ifdef __FMA__
    const float ul = fmaf(ax, ax, -u);  /* x^2 = u + ul exactly */
#else
    const float sp = ax * 4097.0f;
    const float ah = sp - (sp - ax), al = ax - ah;
    const float ul = ((ah * ah - u) + 2.0f * ah * al) + al * al;
#endif
    const float zh = 0.5f * u, zl = 0.5f * ul;
    const float t = 1.0f / (1.0f + ax * 0.7071067811865475f);
    const float w = (t - 0.36733204834304223f) * 3.4950157293916932f;
    float h = 1.683793321515001e-05f;
    h = h * w + -2.2788486425323783e-05f;
    h = h * w + -7.848074125589645e-05f;
    h = h * w + 0.0002717089228258263f;
    h = h * w + -0.00019594916379078533f;
    h = h * w + -0.0012014791054828333f;
    h = h * w + 0.00466812349090375f;
    h = h * w + -0.0019064835421005238f;
    h = h * w + -0.05137337787841167f;
    h = h * w + 0.2063431175792425f;
    h = h * w + -0.24108881987180167f;
    /* exp(h - z^2) = 2^n exp(r); n rounded to nearest by the 1.5 * 2^23 trick (no rint call) */
    const float n = ((h - zh) * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
    float r = -zh - n * 0.693145751953125f;  /* exact: n * ln2_hi has few bits; Sterbenz */
    r = r + h;
    r = r - n * 1.428606765330187045e-06f;
    r = r - zl;
    float p = 1.98412698412698413e-4f;
    p = p * r + 1.38888888888888889e-3f;
    p = p * r + 8.33333333333333333e-3f;
    p = p * r + 4.16666666666666667e-2f;
    p = p * r + 1.66666666666666667e-1f;
    p = p * r + 0.5f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    /* 2^n in two factors, applied last, so a result near the subnormal range rounds only once */
    const int32_t ni = (int32_t)n;
    const int32_t n1 = ni / 2, n2 = ni - n1;
    const float s1 = rlx_bits_f((uint32_t)(n1 + 127) << 23), s2 = rlx_bits_f((uint32_t)(n2 + 127) << 23);
    const float m = 0.5f * t * p;
    const float tails = x >= 0.0f ? x * (1.0f - m * s1 * s2) : ((x * m) * s1) * s2;
    const float out = ax0 < 0.75f ? center : tails;
    return ax0 >= 16.0f && x < 0.0f ? x * 0.0f : out;
}
static inline double rlx_gelu_d(double x) { return 0.5 * x * erfc(x * -0.70710678118654752); }
/* tanh that vectorizes (libm's tanhf does not): an odd polynomial below |x| = 0.625 (fitted,
 * <= 1.5 ulp), 1 - 2/(exp(2|x|) + 1) above, where nothing cancels (<= 3 ulp). */
static inline float rlx_tanh_f(float x)
{
    const float ax = fabsf(x);
    const float u = ax * ax;
    float p = -0.006104925201623863f;
    p = p * u + 0.02100362117327442f;
    p = p * u + -0.05385249159525543f;
    p = p * u + 0.13332782200266305f;
    p = p * u + -0.333333290977501f;
    const float small = ax + ax * u * p;
    const float big = 1.0f - 2.0f / (rlx_expf(2.0f * ax) + 1.0f);
    const float t = copysignf(ax < 0.625f ? small : big, x);
    return x != x ? x : t;
}
static inline double rlx_tanh_d(double x) { return tanh(x); }
/* sigmoid from exp(-|x|) so neither tail overflows: 1/(1+e) for x >= 0, e/(1+e) below */
static inline float rlx_sigmoid_f(float x)
{
    const float e = rlx_expf(-fabsf(x));
    const float r = 1.0f / (1.0f + e);
    return x >= 0.0f ? r : e * r;
}
static inline double rlx_sigmoid_d(double x)
{
    const double e = exp(-fabs(x));
    return x >= 0.0 ? 1.0 / (1.0 + e) : e / (1.0 + e);
}
/* log(1 + e^x) as max(x, 0) + log1p(e^-|x|): no overflow for large x, no cancellation for small. */
static inline float rlx_softplus_f(float x) { return (x > 0.0f ? x : 0.0f) + log1pf(rlx_expf(-fabsf(x))); }
static inline double rlx_softplus_d(double x) { return (x > 0.0 ? x : 0.0) + log1p(exp(-fabs(x))); }
static inline float rlx_silu_f(float x) { return x * rlx_sigmoid_f(x); }
static inline double rlx_silu_d(double x) { return x * rlx_sigmoid_d(x); }
/* tanh-approximated gelu, using (1 + tanh(u)) / 2 = sigmoid(2u) to avoid cancellation. u is
 * formed in double: exp(2u) magnifies u's relative error by |2u|, which reaches ~20 in the tail. */
static inline float rlx_gelu_tanh_f(float x)
{
    const double xd = (double)x;
    const double u2 = 1.5957691216057308 * (xd + 0.044715 * xd * xd * xd);
    const double e = (double)rlx_exp_dtof(-fabs(u2));
    const double s = u2 >= 0.0 ? 1.0 / (1.0 + e) : e / (1.0 + e);
    return (float)(xd * s);
}
static inline double rlx_gelu_tanh_d(double x)
{
    const double u = 0.79788456080286536 * (x + 0.044715 * x * x * x);
    return x * rlx_sigmoid_d(2.0 * u);
}
static inline float rlx_relu_f(float x) { return x > 0.0f ? x : (x != x ? x : 0.0f); }
static inline double rlx_relu_d(double x) { return x > 0.0 ? x : (x != x ? x : 0.0); }
static inline float rlx_exp_f(float x) { return rlx_expf(x); }
static inline double rlx_exp_d(double x) { return exp(x); }
static inline float rlx_log_f(float x) { return logf(x); }
static inline double rlx_log_d(double x) { return log(x); }
static inline float rlx_sqrt_f(float x) { return sqrtf(x); }
static inline double rlx_sqrt_d(double x) { return sqrt(x); }
static inline float rlx_rsqrt_f(float x) { return 1.0f / sqrtf(x); }
static inline double rlx_rsqrt_d(double x) { return 1.0 / sqrt(x); }
static inline float rlx_neg_f(float x) { return -x; }
static inline double rlx_neg_d(double x) { return -x; }
static inline float rlx_abs_f(float x) { return fabsf(x); }
static inline double rlx_abs_d(double x) { return fabs(x); }
static inline float rlx_sin_f(float x) { return sinf(x); }
static inline double rlx_sin_d(double x) { return sin(x); }
static inline float rlx_cos_f(float x) { return cosf(x); }
static inline double rlx_cos_d(double x) { return cos(x); }
/* max/min propagate NaN from either side, like numpy.maximum */
static inline float rlx_max_f(float a, float b) { return ((a > b) | (a != a)) ? a : b; }
static inline double rlx_max_d(double a, double b) { return (a > b || a != a) ? a : b; }
static inline float rlx_min_f(float a, float b) { return ((a < b) | (a != a)) ? a : b; }
static inline double rlx_min_d(double a, double b) { return (a < b || a != a) ? a : b; }
static inline float rlx_pow_f(float a, float b) { return powf(a, b); }
static inline double rlx_pow_d(double a, double b) { return pow(a, b); }
/* C's remainder of a / b truncated toward zero (the sign of a): rlx `binary fmod`, ONNX Mod with fmod=1 */
static inline float rlx_fmod_f(float a, float b) { return fmodf(a, b); }
static inline double rlx_fmod_d(double a, double b) { return fmod(a, b); }

/* Integer power with wrap-around (callers flag negative exponents as errors). */
static inline int64_t rlx_ipow(int64_t base, int64_t e)
{
    uint64_t result = 1, b = (uint64_t)base;
    while (e > 0) {
        if (e & 1)
            result *= b;
        b *= b;
        e >>= 1;
    }
    return (int64_t)result;
}

#endif /* RLX_KERNELS_SCALAR_H */

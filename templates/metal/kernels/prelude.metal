/* ── prelude: conversions, scalar functions, block reductions ──────────── */
#include <metal_stdlib>
using namespace metal;

/* A typed pointer `off` bytes into the program buffer (every tensor lives in buffer(0)). */
#define RLX_P(T, off) ((device T *)(rlx_mem + (off)))

/* Every float storage type is computed in float. */
inline float rlx_f(float x) { return x; }
inline float rlx_f(half x) { return float(x); }
inline float rlx_f(bfloat x) { return float(x); }
/* Integer and bool values (padding masks, casts) read as float. */
inline float rlx_f(long x) { return float(x); }
inline float rlx_f(int x) { return float(x); }
inline float rlx_f(char x) { return float(x); }
inline float rlx_f(uchar x) { return float(x); }

template <typename T> inline T rlx_to(float x) { return T(x); }

/* Rounding a float value to the precision a narrower float type keeps (explicit casts). */
inline float rlx_round_f16(float x) { return float(half(x)); }
inline float rlx_round_bf16(float x) { return float(bfloat(x)); }

/* max / min propagating NaN like the reference (fmax would drop it). */
template <typename V> inline V rlx_max(V a, V b) { return (a != a || a > b) ? a : b; }
template <typename V> inline V rlx_min(V a, V b) { return (a != a || a < b) ? a : b; }

/* exp(h - z) for the gelu tail (see rlx_gelu): 2^n exp(r), the 2^n applied as two factors. */
inline float rlx_pow2i(int n) { return as_type<float>((uint)(n + 127) << 23); }

/* gelu(x) = x Phi(x) in float, without erf (MSL has none): the same two-range evaluation as the CPU
 * backend's rlx_gelu_f (templates/cpu/kernels/scalar.h), where the fit and its error are documented.
 *  |x| < 0.75: Phi(x) = 1/2 + x S(x^2);  |x| >= 0.75: Phi(-|x|) = t/2 exp(h(t) - x^2/2). */
inline float rlx_gelu(float x)
{
    const float ax0 = fabs(x);
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
    const float ul = fma(ax, ax, -u);  /* x^2 = u + ul exactly */
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
    const float n = rint((h - zh) * 1.44269504088896341f);
    float r = -zh - n * 0.693145751953125f;
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
    const int ni = int(n);
    const int n1 = ni / 2, n2 = ni - n1;
    const float s1 = rlx_pow2i(n1), s2 = rlx_pow2i(n2);
    const float m = 0.5f * t * p;
    const float tails = x >= 0.0f ? x * (1.0f - m * s1 * s2) : ((x * m) * s1) * s2;
    const float out = ax0 < 0.75f ? center : tails;
    return ax0 >= 16.0f && x < 0.0f ? x * 0.0f : out;
}
/* sigmoid from exp(-|x|) so neither tail overflows */
inline float rlx_sigmoid(float x)
{
    const float e = exp(-fabs(x));
    const float r = 1.0f / (1.0f + e);
    return x >= 0.0f ? r : e * r;
}
/* tanh-approximated gelu as x sigmoid(2u): no cancellation where tanh(u) is near -1 */
inline float rlx_gelu_tanh(float x)
{
    return x * rlx_sigmoid(1.5957691216057308f * (x + 0.044715f * x * x * x));
}
inline float rlx_silu(float x) { return x * rlx_sigmoid(x); }
/* log1p(e) for e in [0, 1] without a log1p function: log(u) * e / (u - 1), u = 1 + e (exact ratio). */
inline float rlx_log1p(float e)
{
    const float u = 1.0f + e;
    return u == 1.0f ? e : log(u) * (e / (u - 1.0f));
}
/* log(1 + e^x) as max(x, 0) + log1p(e^-|x|): no overflow for large x, no cancellation for small. */
inline float rlx_softplus(float x) { return (x > 0.0f ? x : 0.0f) + rlx_log1p(exp(-fabs(x))); }
template <typename V> inline V rlx_relu(V x) { return x > V(0) ? x : (x != x ? x : V(0)); }
inline float rlx_rsqrt(float x) { return 1.0f / sqrt(x); }
template <typename V> inline V rlx_abs(V x) { return x < V(0) ? V(-x) : x; }
inline float rlx_abs(float x) { return fabs(x); }

/* Integer division truncates toward zero like C; a zero divisor sets the run's error flag. */
template <typename V> inline V rlx_idiv(V a, V b, device int *flag)
{
    if (b == V(0)) { *flag = 2; return V(0); }
    return V(a / b);
}
template <typename V> inline V rlx_ipow(V a, V b)
{
    V r = V(1);
    if (b < V(0)) return (a == V(1)) ? V(1) : (a == V(-1) ? ((b & V(1)) ? V(-1) : V(1)) : V(0));
    while (b > V(0)) { if (b & V(1)) r = V(r * a); a = V(a * a); b = V(b >> 1); }
    return r;
}

/* (the activations of templates/activations.toml given by a formula, their RLX_ACT_* ids and rlx_act<ACT>
 * follow this prelude: metal/activations.metal.j2) */

/* Sum / max of one value per thread over the threadgroup: simd_sum within each simdgroup, then the
 * simdgroups' partials through `scratch` (threadgroup memory, one float per simdgroup). Every thread of
 * the threadgroup must call it (it has barriers) and gets the same total, summed in the same order. */
template <typename S> inline float rlx_tg_sum(float v, S scratch, uint tid, uint nthreads, uint lane, uint sg)
{
    v = simd_sum(v);
    if (lane == 0) scratch[sg] = v;
    threadgroup_barrier(mem_flags::mem_threadgroup);
    float total = 0.0f;
    for (uint s = 0; s < (nthreads + 31) / 32; ++s) total += scratch[s];
    threadgroup_barrier(mem_flags::mem_threadgroup);  /* scratch is reused by the next reduction */
    return total;
}
template <typename S> inline float rlx_tg_max(float v, S scratch, uint tid, uint nthreads, uint lane, uint sg)
{
    v = simd_max(v);
    if (lane == 0) scratch[sg] = v;
    threadgroup_barrier(mem_flags::mem_threadgroup);
    float total = scratch[0];
    for (uint s = 1; s < (nthreads + 31) / 32; ++s) total = rlx_max(total, scratch[s]);
    threadgroup_barrier(mem_flags::mem_threadgroup);
    return total;
}

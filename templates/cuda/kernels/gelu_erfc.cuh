/* ── GELU, erf form, in 12 FP32 instructions and one ex2: for epilogues whose result is rounded to f16/bf16 ──
 * gelu(x) = x * Phi(x), Phi the normal CDF. With e = Phi(-|x|) = erfc(|x| / sqrt 2) / 2:
 *   gelu(x) = max(x, 0) - |x| * e          (x >= 0: x (1 - e); x < 0: x e)
 * and e = 2^(-x^2 log2(e) / 2 + Q(|x|)), where Q(v) = log2(erfcx(v / sqrt 2) / 2) is smooth and slowly varying
 * (erfcx(u) = e^(u^2) erfc(u), from 1 down to ~1 / (u sqrt pi)). Q is a degree-7 polynomial fitted on [0, 5.5]
 * (Lawson's iteration toward the minimax fit; coefficients rounded to f32): |Q error| <= 5.2e-6 evaluated in
 * f32, so e is within 3.6e-6 of its value (relative), and gelu(x) with the f32 roundings of x^2 and the final
 * product within 5e-6 of the exact one (measured: 4.6e-6), far below f16's and bf16's rounding (2.4e-4 and
 * 2.0e-3 relative at worst). The libm form
 * 0.5 x (1 + erff(x / sqrt 2)) costs ~25 instructions in erff alone, and cancels for x < 0: its relative error
 * grows to 2e-3 at x = -4 and to 100% (0) at x = -5.5, where this one stays exact to 3.6e-6.
 *
 * Beyond |x| = 5.5 the polynomial is held at Q(5.5) and the product uses v = min(|x|, 5.5) for |x| as well:
 * erfcx(u) ~ 1 / (u sqrt pi), so the two errors cancel to first order (the tail stays within ~3% down to e's
 * underflow at |x| ~ 13.2, where gelu(x) ~ 1e-37 for x < 0). Why it matters: an f16 result is 0 below
 * |gelu| = 3e-8 (x < -5.4), a bf16 one is not.
 *
 * Special values: NaN -> NaN; +inf -> +inf; -inf -> 0 (the limit; the libm form gives inf * 0 = NaN).
 * tests/codegen/test_cuda_gelu_erfc.py checks every f16 input and a dense f32 grid on the host against the
 * exact value; the CUTLASS unit (gemm_cutlass.cu) applies it to its f32 accumulators. */
#ifndef RLX_GELU_ERFC_CUH
#define RLX_GELU_ERFC_CUH

#include <math.h>

#if defined(__CUDACC__)
#define RLX_GELU_HD __host__ __device__ __forceinline__
#else
#define RLX_GELU_HD inline
#endif

/* 2^a: one MUFU.EX2 on the GPU (relative error ~2^-22, subnormal results flushed to 0); exp2f on the host. */
RLX_GELU_HD float rlx_ex2_fast(float a) {
#if defined(__CUDA_ARCH__)
    float r;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(a));
    return r;
#else
    return exp2f(a);
#endif
}

RLX_GELU_HD float rlx_gelu_erfc(float x) {
    const float v = fminf(fabsf(x), 5.5f); /* NaN -> 5.5 here; x * x below carries the NaN */
    float q = -1.7934545439857175e-06f;   /* Q(v), Horner from the top coefficient */
    q = fmaf(q, v, 6.090415990911424e-05f);
    q = fmaf(q, v, -0.0009260289371013641f);
    q = fmaf(q, v, 0.008493756875395775f);
    q = fmaf(q, v, -0.053937844932079315f);
    q = fmaf(q, v, 0.2628670036792755f);
    q = fmaf(q, v, -1.1512467861175537f);
    q = fmaf(q, v, -0.9999954700469971f);
    const float e = rlx_ex2_fast(fmaf(x * x, -0.72134752044448170f, q)); /* -log2(e) / 2 */
    return fmaf(-v, e, fmaxf(x, 0.0f));
}

#undef RLX_GELU_HD
#endif /* RLX_GELU_ERFC_CUH */

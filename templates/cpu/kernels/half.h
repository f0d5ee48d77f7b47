/* f16 / bf16 storage conversions.
 * A fixed RLX kernel header: no template code; included by generated files that need it. */
#ifndef RLX_KERNELS_HALF_H
#define RLX_KERNELS_HALF_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* ── 16-bit float storage: round to nearest even, exactly like numpy ───── */

static inline float rlx_bits_f(uint32_t b) { float f; memcpy(&f, &b, 4); return f; }
static inline uint32_t rlx_f_bits(float f) { uint32_t b; memcpy(&b, &f, 4); return b; }

static inline float rlx_h2f(uint16_t h)
{
    const uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    const uint32_t exp = (h >> 10) & 0x1fu, man = h & 0x3ffu;
    if (exp == 0)  /* zero or subnormal: man * 2^-24, exact in float */
        return rlx_bits_f(rlx_f_bits((float)man * 5.9604644775390625e-8f) | sign);
    if (exp == 31)
        return rlx_bits_f(sign | 0x7f800000u | (man << 13));
    return rlx_bits_f(sign | ((exp + 112u) << 23) | (man << 13));
}

static inline uint16_t rlx_f2h(float f)
{
    const uint32_t x = rlx_f_bits(f);
    const uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
    uint32_t ax = x & 0x7fffffffu;
    if (ax > 0x7f800000u)  /* NaN stays a quiet NaN */
        return (uint16_t)(sign | 0x7e00u | ((ax >> 13) & 0x3ffu));
    if (ax >= 0x477ff000u)  /* rounds to infinity */
        return (uint16_t)(sign | 0x7c00u);
    if (ax < 0x38800000u) {  /* subnormal half: let the FPU round in units of 2^-24 */
        const float t = rlx_bits_f(ax) + 0.5f;
        return (uint16_t)(sign | (rlx_f_bits(t) - 0x3f000000u));
    }
    ax += 0xc8000fffu + ((ax >> 13) & 1u);  /* rebias exponent, round to nearest even */
    return (uint16_t)(sign | (ax >> 13));
}

static inline float rlx_bf2f(uint16_t b) { return rlx_bits_f((uint32_t)b << 16); }

static inline uint16_t rlx_f2bf(float f)
{
    const uint32_t x = rlx_f_bits(f);
    if ((x & 0x7fffffffu) > 0x7f800000u)
        return 0x7fc0u;
    return (uint16_t)((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

static inline float rlx_round_f16(float v) { return rlx_h2f(rlx_f2h(v)); }
static inline float rlx_round_bf16(float v) { return rlx_bf2f(rlx_f2bf(v)); }

#endif /* RLX_KERNELS_HALF_H */

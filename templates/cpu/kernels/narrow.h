/* Storage formats of 8 bits or fewer (DType.is_narrow): float8 (e4m3fn, e4m3fnuz, e5m2, e5m2fnuz), float4
 * (e2m1) and int4/uint4/int2/uint2, one value per byte in its low bits (as numpy's ml_dtypes holds them).
 * Values are only cast to and from these formats; rlx_from_<fmt> reads one exactly (into a double),
 * rlx_to_<fmt> writes one as rlx.reference's cast does (ONNX's Cast with saturate=1):
 *   float formats: round to nearest even; inf and values beyond the largest finite one become the largest
 *     (with their sign); NaN stays NaN; the fnuz formats have no -0 (it becomes +0).
 *   integer formats: the low bits of the value (a float is truncated toward zero first, by the caller's
 *     (int64_t) conversion), two's complement for the signed ones.
 * A fixed RLX kernel header: no template code. */
#ifndef RLX_KERNELS_NARROW_H
#define RLX_KERNELS_NARROW_H

#include <math.h>
#include <stdint.h>

/* How a float format spends its top codes: IEEE (e5m2: inf and NaNs at the top exponent), FN (e4m3fn,
 * e2m1: no inf, S.1111.111 is NaN (e2m1 has no NaN at all)), UZ (the fnuz formats: no inf, no -0, NaN is
 * the negative-zero code 0x80). */
enum { RLX_NARROW_IEEE = 0, RLX_NARROW_FN = 1, RLX_NARROW_UZ = 2 };

static inline double rlx_narrow_decode(unsigned bits, int ebits, int mbits, int bias, int style, int has_nan)
{
    const unsigned sign_bit = 1u << (ebits + mbits), top_e = (1u << ebits) - 1, top_m = (1u << mbits) - 1;
    bits &= (sign_bit << 1) - 1;
    const unsigned e = (bits >> mbits) & top_e, m = bits & top_m;
    const int negative = (bits & sign_bit) != 0;
    if (style == RLX_NARROW_UZ && bits == sign_bit)
        return -NAN;  /* the NaN code has the sign bit set: read as a negative NaN, as ml_dtypes reads it */
    if (style == RLX_NARROW_FN && has_nan && e == top_e && m == top_m)
        return negative ? -NAN : NAN;
    if (style == RLX_NARROW_IEEE && e == top_e)
        return m ? (negative ? -NAN : NAN) : (negative ? -INFINITY : INFINITY);
    const double v = e ? ldexp(1.0 + (double)m / (double)(1u << mbits), (int)e - bias)
                       : ldexp((double)m / (double)(1u << mbits), 1 - bias);
    return negative ? -v : v;
}

/* `max_code`: the largest finite magnitude's code; `nan_code`: a positive NaN's code. */
static inline uint8_t rlx_narrow_encode(double v, int ebits, int mbits, int bias, int style, unsigned max_code,
                                        unsigned nan_code)
{
    const unsigned sign_bit = 1u << (ebits + mbits);
    if (isnan(v))
        return (uint8_t)(style == RLX_NARROW_UZ ? sign_bit : (signbit(v) ? sign_bit | nan_code : nan_code));
    const unsigned sign = signbit(v) ? sign_bit : 0u;
    const double a = fabs(v);
    const double max_value = rlx_narrow_decode(max_code, ebits, mbits, bias, style, 0);  /* finite by definition */
    unsigned code;
    if (a >= max_value) {
        code = max_code;  /* saturate: inf and every value beyond the largest finite one */
    } else if (a < ldexp(1.0, 1 - bias)) {  /* subnormal: multiples of 2^(1 - bias - mbits) */
        code = (unsigned)rint(ldexp(a, bias - 1 + mbits));  /* rint: nearest even (default rounding mode) */
    } else {
        int k;
        const double f = frexp(a, &k);  /* a = f * 2^k, f in [0.5, 1): exponent k - 1, significand 2f */
        const unsigned m = (unsigned)rint(ldexp(2.0 * f - 1.0, mbits));  /* 2^mbits carries into the exponent */
        code = ((unsigned)(k - 1 + bias) << mbits) + m;
        if (code > max_code)
            code = max_code;
    }
    if (style == RLX_NARROW_UZ && code == 0)
        return 0;  /* no negative zero */
    return (uint8_t)(sign | code);
}

static inline double rlx_from_f8e4m3fn(uint8_t b) { return rlx_narrow_decode(b, 4, 3, 7, RLX_NARROW_FN, 1); }
static inline double rlx_from_f8e4m3fnuz(uint8_t b) { return rlx_narrow_decode(b, 4, 3, 8, RLX_NARROW_UZ, 1); }
static inline double rlx_from_f8e5m2(uint8_t b) { return rlx_narrow_decode(b, 5, 2, 15, RLX_NARROW_IEEE, 1); }
static inline double rlx_from_f8e5m2fnuz(uint8_t b) { return rlx_narrow_decode(b, 5, 2, 16, RLX_NARROW_UZ, 1); }
static inline double rlx_from_f4e2m1(uint8_t b) { return rlx_narrow_decode(b, 2, 1, 1, RLX_NARROW_FN, 0); }

static inline uint8_t rlx_to_f8e4m3fn(double v) { return rlx_narrow_encode(v, 4, 3, 7, RLX_NARROW_FN, 0x7E, 0x7F); }
static inline uint8_t rlx_to_f8e4m3fnuz(double v) { return rlx_narrow_encode(v, 4, 3, 8, RLX_NARROW_UZ, 0x7F, 0); }
static inline uint8_t rlx_to_f8e5m2(double v) { return rlx_narrow_encode(v, 5, 2, 15, RLX_NARROW_IEEE, 0x7B, 0x7E); }
static inline uint8_t rlx_to_f8e5m2fnuz(double v) { return rlx_narrow_encode(v, 5, 2, 16, RLX_NARROW_UZ, 0x7F, 0); }
/* e2m1 has no NaN: ONNX's reference (ml_dtypes) writes +NaN as -0 and -NaN as +0, and so does RLX */
static inline uint8_t rlx_to_f4e2m1(double v)
{
    return isnan(v) ? (signbit(v) ? 0x0 : 0x8) : rlx_narrow_encode(v, 2, 1, 1, RLX_NARROW_FN, 0x7, 0x7);
}

static inline double rlx_from_i4(uint8_t b) { return (double)((int)(b & 0xF) - ((b & 0x8) ? 16 : 0)); }
static inline double rlx_from_u4(uint8_t b) { return (double)(b & 0xF); }
static inline double rlx_from_i2(uint8_t b) { return (double)((int)(b & 0x3) - ((b & 0x2) ? 4 : 0)); }
static inline double rlx_from_u2(uint8_t b) { return (double)(b & 0x3); }

static inline uint8_t rlx_to_i4(int64_t v) { return (uint8_t)((uint64_t)v & 0xF); }
static inline uint8_t rlx_to_u4(int64_t v) { return (uint8_t)((uint64_t)v & 0xF); }
static inline uint8_t rlx_to_i2(int64_t v) { return (uint8_t)((uint64_t)v & 0x3); }
static inline uint8_t rlx_to_u2(int64_t v) { return (uint8_t)((uint64_t)v & 0x3); }

#endif /* RLX_KERNELS_NARROW_H */

/* Non-finite value checks of a NaN-checked build (RLX_CHECK_NANS=1 / Session(check_nans=True));
 * never included otherwise. A fixed RLX kernel header: no template code.
 * Each returns the flat index of the first NaN or infinity among n values, or -1. */
#ifndef RLX_KERNELS_NAN_CHECK_H
#define RLX_KERNELS_NAN_CHECK_H

#include <math.h>
#include <stdint.h>

static int64_t rlx_first_nonfinite_f32(const float *x, int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        if (!isfinite(x[i]))
            return i;
    return -1;
}

static int64_t rlx_first_nonfinite_f64(const double *x, int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        if (!isfinite(x[i]))
            return i;
    return -1;
}

/* f16 and bf16 as their bit patterns: non-finite when every exponent bit is set. */
static int64_t rlx_first_nonfinite_f16(const uint16_t *x, int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        if ((x[i] & 0x7c00u) == 0x7c00u)
            return i;
    return -1;
}

static int64_t rlx_first_nonfinite_bf16(const uint16_t *x, int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        if ((x[i] & 0x7f80u) == 0x7f80u)
            return i;
    return -1;
}

/* What the non-finite value is, for the error message. */
static const char *rlx_nonfinite_kind(double v)
{
    return isnan(v) ? "NaN" : (v > 0 ? "+inf" : "-inf");
}

#endif /* RLX_KERNELS_NAN_CHECK_H */

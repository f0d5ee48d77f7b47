/* argmax along one axis (rlx `argmax`): x viewed as [outer, n, inner] -> y [outer, inner] int32 indices.
 * The first index wins ties, and a NaN counts as larger than any number, the first NaN winning (numpy's
 * argmax); NaN is tested on the bits, so the result does not depend on floating-point compiler flags. */

static inline int rlx_isnan_f32(float v) {
    uint32_t u;
    memcpy(&u, &v, sizeof(u));
    return (u & 0x7fffffffu) > 0x7f800000u;
}

static inline int rlx_isnan_f64(double v) {
    uint64_t u;
    memcpy(&u, &v, sizeof(u));
    return (u & 0x7fffffffffffffffull) > 0x7ff0000000000000ull;
}

#define RLX_ARGMAX_DEFINE(SUFFIX, T)                                                                     \
    static void rlx_argmax_##SUFFIX(const T *restrict x, int32_t *restrict y, int64_t outer, int64_t n,   \
                                    int64_t inner, int nt) {                                              \
        (void)nt;                                                                                         \
        _Pragma("omp parallel for num_threads(nt) schedule(static) if(outer * inner * n >= 262144)")      \
        for (int64_t t = 0; t < outer * inner; t++) {                                                     \
            const T *restrict xs = x + (t / inner) * n * inner + t % inner;                               \
            T best = xs[0];                                                                               \
            int64_t at = 0;                                                                               \
            for (int64_t j = 1; j < n && !rlx_isnan_##SUFFIX(best); j++) {                                \
                const T v = xs[j * inner];                                                                \
                if (rlx_isnan_##SUFFIX(v) || v > best) {                                                  \
                    best = v;                                                                             \
                    at = j;                                                                               \
                }                                                                                         \
            }                                                                                             \
            y[t] = (int32_t)at;                                                                           \
        }                                                                                                 \
    }

RLX_ARGMAX_DEFINE(f32, float)
RLX_ARGMAX_DEFINE(f64, double)

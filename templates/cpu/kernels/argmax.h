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

#if defined(__AVX2__)
#include <immintrin.h> /* rlx_argmax_row_f32's block pass */
#endif

/* The argmax of one contiguous row of n >= 1 floats, with the semantics above. A decoder's vocabulary row (49152
 * values, 16 of them a step when serving) went through the scalar loop at ~1 ns a value; here one pass in blocks
 * of RLX_ARGMAX_BLOCK values finds each block's largest number and whether it holds a NaN (AVX2: max and
 * unordered compares, 8 lanes; their lane order does not matter, a maximum is exact), and only the block that
 * decides is scanned in index order:
 *   - the first block holding a NaN: its first NaN (a NaN beats every number, and no earlier block has one);
 *   - else the first block whose maximum is strictly above the earlier blocks': its first value equal to it
 *     (+0 and -0 compare equal, as they tie in the scalar loop). */
#define RLX_ARGMAX_BLOCK 256
static inline int64_t rlx_argmax_row_f32(const float *restrict x, int64_t n) {
    float best = 0.0f;
    int64_t best_block = -1;
    for (int64_t b0 = 0; b0 < n; b0 += RLX_ARGMAX_BLOCK) {
        const int64_t e = b0 + RLX_ARGMAX_BLOCK < n ? b0 + RLX_ARGMAX_BLOCK : n;
        int64_t j = b0;
        float m = -INFINITY;
        int nan = 0;
#if defined(__AVX2__)
        __m256 vm = _mm256_set1_ps(-INFINITY), vn = _mm256_setzero_ps();
        for (; j + 8 <= e; j += 8) {
            const __m256 v = _mm256_loadu_ps(x + j);
            vn = _mm256_or_ps(vn, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
            vm = _mm256_max_ps(vm, v); /* a NaN lane of v leaves vm's lane as it was */
        }
        nan = _mm256_movemask_ps(vn) != 0;
        float lanes[8];
        _mm256_storeu_ps(lanes, vm);
        for (int l = 0; l < 8; l++)
            m = lanes[l] > m ? lanes[l] : m;
#endif
        for (; j < e; j++) {
            nan |= rlx_isnan_f32(x[j]);
            m = x[j] > m ? x[j] : m;
        }
        if (nan) {
            for (j = b0; !rlx_isnan_f32(x[j]); j++) {
            }
            return j;
        }
        if (best_block < 0 || m > best) {
            best = m;
            best_block = b0;
        }
    }
    int64_t j = best_block;
    while (!(x[j] == best)) j++;
    return j;
}

#define RLX_ARGMAX_DEFINE(SUFFIX, T)                                                                     \
    static void rlx_argmax_##SUFFIX(const T *restrict x, int32_t *restrict y, int64_t outer, int64_t n,   \
                                    int64_t inner, int nt) {                                              \
        (void)nt;                                                                                         \
        _Pragma("omp parallel for num_threads(nt) schedule(static) if(outer * inner * n >= 262144)")      \
        for (int64_t t = 0; t < outer * inner; t++) {                                                     \
            const T *restrict xs = x + (t / inner) * n * inner + t % inner;                               \
            if (RLX_ARGMAX_ROW_##SUFFIX && inner == 1) {                                                  \
                y[t] = (int32_t)RLX_ARGMAX_ROW_CALL_##SUFFIX(xs, n);                                      \
                continue;                                                                                 \
            }                                                                                             \
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

/* contiguous f32 rows take rlx_argmax_row_f32 (f64 rows the loop) */
#define RLX_ARGMAX_ROW_f32 1
#define RLX_ARGMAX_ROW_CALL_f32(xs, n) rlx_argmax_row_f32((const float *)(xs), n)
#define RLX_ARGMAX_ROW_f64 0
#define RLX_ARGMAX_ROW_CALL_f64(xs, n) 0
RLX_ARGMAX_DEFINE(f32, float)
RLX_ARGMAX_DEFINE(f64, double)

/* gelu(x) = x Phi(x) on 8 AVX2 lanes (rlx_gelu8) and 16 AVX-512 lanes (rlx_gelu16): the vector forms
 * of rlx_gelu_f (kernels/scalar.h), operation for operation (the same two ranges, both computed, the
 * same polynomials, the exact float pair for z^2, 2^n applied last, the FMAs where gcc contracts the
 * scalar form; AVX-512 scales by 2^n with vscalefps, see TAIL_POS): the same results bit for bit
 * (checked over a dense sweep of [-14, 14] and the special values), so rlx_gelu_f's error bound and
 * special values hold (x <= -16 gives -0, -inf NaN, +inf +inf, NaN stays NaN, -0 stays -0).
 *
 * Why not the scalar function under `#pragma omp simd`: gcc does vectorize it, but a loop over one
 * 16-column tile row runs two vectors, and one vector's chain (a division, three polynomials of
 * dependent FMAs) is ~130 cycles of latency: the core overlaps about two such chains and waits.
 * rlx_gelu8x6 / rlx_gelu16x4 evaluate several vectors step by step in lockstep (independent
 * chains side by side in program order), so the FMA pipes stay busy. On AVX-512 the GEMM epilogue
 * (rlx_gelu_block, kernels/packed_core.c) sorts a tile's lanes by range first and gives each lane only its
 * range's operations (RLX_GELU_CENTER / RLX_GELU_TAIL: the body's two halves, the same values).
 * A fixed RLX kernel header (no template code), included by kernels built for AVX2+FMA or AVX-512. */
#ifndef RLX_KERNELS_VGELU_H
#define RLX_KERNELS_VGELU_H

#include <immintrin.h>
#include <stdint.h>

/* The constants of rlx_gelu_f, shared by both widths (see kernels/scalar.h for their origin). */
#define RLX_GELU_S {-4.122667414862689e-08f, 6.659693516316651e-07f, -9.444656259503615e-06f,          \
                    0.00011543468761615529f, -0.0011873282154804545f, 0.009973557010035817f,          \
                    -0.06649038006690546f, 0.3989422804014327f}
#define RLX_GELU_H {1.683793321515001e-05f, -2.2788486425323783e-05f, -7.848074125589645e-05f,         \
                    0.0002717089228258263f, -0.00019594916379078533f, -0.0012014791054828333f,         \
                    0.00466812349090375f, -0.0019064835421005238f, -0.05137337787841167f,              \
                    0.2063431175792425f, -0.24108881987180167f}
#define RLX_GELU_E {1.98412698412698413e-4f, 1.38888888888888889e-3f, 8.33333333333333333e-3f,         \
                    4.16666666666666667e-2f, 1.66666666666666667e-1f, 0.5f, 1.0f, 1.0f}

/* The steps both tails share (RLX_GELU_BODY, RLX_GELU_TAIL): from w (the h polynomial's argument), u and ul
 * (x^2 = u + ul) to acc = exp(r) and n, with 2^n exp(r) = exp(h - z^2), z^2 = zh + zl = u/2 + ul/2; the caller
 * declares u, acc, ul, w, n, r (L vectors of V each) and the tables ch, ce, and sets acc to ch[0] first. */
#define RLX_GELU_EXP_STEPS(L, V)                                                                      \
    do {                                                                                          \
        _Pragma("GCC unroll 11") for (int i = 1; i < 11; i++)                                         \
            _Pragma("GCC unroll 8") for (int q = 0; q < L; q++)                                       \
                acc[q] = FMA(acc[q], w[q], SET1(ch[i]));                                              \
        /* exp(h - z^2) = 2^n exp(r), z^2 = zh + zl = u/2 + ul/2 */                                   \
        _Pragma("GCC unroll 8") for (int q = 0; q < L; q++) {                                         \
            const V zh = MUL(SET1(0.5f), u[q]);                                                       \
            n[q] = SUB(FMA(SUB(acc[q], zh), SET1(1.44269504088896341f), SET1(12582912.0f)),           \
                       SET1(12582912.0f));                                                            \
            r[q] = FNMS(n[q], SET1(0.693145751953125f), zh); /* -zh - n ln2hi, one rounding */        \
            r[q] = ADD(r[q], acc[q]);                                                                 \
            r[q] = FNMA(n[q], SET1(1.428606765330187045e-06f), r[q]);                                 \
            r[q] = SUB(r[q], MUL(SET1(0.5f), ul[q]));                                                 \
            acc[q] = SET1(ce[0]);                                                                     \
        }                                                                                             \
        _Pragma("GCC unroll 8") for (int i = 1; i < 8; i++)                                           \
            _Pragma("GCC unroll 8") for (int q = 0; q < L; q++)                                       \
                acc[q] = FMA(acc[q], r[q], SET1(ce[i]));                                              \
    } while (0)

/* One GELU over `L` vectors of type V in lockstep: every step below is a loop over the L lanes-vectors
 * (fully unrolled), so L independent dependency chains are interleaved. The ISA's operations come in
 * as macros: SET1, ADD, SUB, MUL, DIV, FMA (a*b+c), FNMA (c-a*b), FMS (a*b-c), FNMS (-a*b-c), MIN, ABS,
 * the selects (SEL_LT(a, b, x, y): a < b ? x : y; SEL_GE0(a, x, y): a >= 0 ? x : y; SEL_LEM16(x, z, y):
 * x <= -16 ? z : y), and the tails TAIL_POS(x, m, n) = x (1 - m 2^n) and TAIL_NEG(x, m, n) = (x m) 2^n for
 * an integer-valued float n. Each is the scalar form's operation (its negations folded into FMS / FNMS, its
 * `ax0 >= 16 && x < 0` one compare), so the values are the same. */
#define RLX_GELU_BODY(L, V, v)                                                                        \
    do {                                                                                              \
        static const float cs[8] = RLX_GELU_S, ch[11] = RLX_GELU_H, ce[8] = RLX_GELU_E;               \
        V x[L], ax0[L], ax[L], u[L], acc[L], center[L], ul[L], t[L], w[L], n[L], r[L];                \
        _Pragma("GCC unroll 8") for (int q = 0; q < L; q++) {                                         \
            x[q] = v[q];                                                                              \
            ax0[q] = ABS(x[q]);                                                                       \
            ax[q] = MIN(ax0[q], SET1(16.0f));                                                         \
            u[q] = MUL(ax[q], ax[q]);                                                                 \
            t[q] = DIV(SET1(1.0f), FMA(ax[q], SET1(0.7071067811865475f), SET1(1.0f)));                \
            acc[q] = SET1(cs[0]);                                                                     \
        }                                                                                             \
        _Pragma("GCC unroll 8") for (int i = 1; i < 8; i++)                                           \
            _Pragma("GCC unroll 8") for (int q = 0; q < L; q++)                                       \
                acc[q] = FMA(acc[q], u[q], SET1(cs[i]));                                              \
        _Pragma("GCC unroll 8") for (int q = 0; q < L; q++) {                                         \
            center[q] = MUL(x[q], FMA(x[q], acc[q], SET1(0.5f)));                                     \
            ul[q] = FMS(ax[q], ax[q], u[q]); /* x^2 = u + ul exactly */                                \
            w[q] = MUL(SUB(t[q], SET1(0.36733204834304223f)), SET1(3.4950157293916932f));             \
            acc[q] = SET1(ch[0]);                                                                     \
        }                                                                                             \
        RLX_GELU_EXP_STEPS(L, V);                                                                     \
        _Pragma("GCC unroll 8") for (int q = 0; q < L; q++) {                                         \
            const V m = MUL(MUL(SET1(0.5f), t[q]), acc[q]);                                           \
            const V pos = TAIL_POS(x[q], m, n[q]);                                                    \
            const V neg = TAIL_NEG(x[q], m, n[q]);                                                    \
            const V out = SEL_LT(ax0[q], SET1(0.75f), center[q], SEL_GE0(x[q], pos, neg));            \
            /* x <= -16: -0 (the true value underflows); -inf: -inf * 0 = NaN, as the reference */    \
            v[q] = SEL_LEM16(x[q], MUL(x[q], SETZ()), out);                                           \
        }                                                                                             \
    } while (0)

/* The two ranges of RLX_GELU_BODY apart, for a caller that has sorted its lanes by range (rlx_gelu_block on
 * AVX-512: ~half of MiniLM's FFN activations have |x| < 0.75): RLX_GELU_CENTER is the body's result on lanes
 * with |x| < 0.75 (its `center`, operation for operation), RLX_GELU_TAIL on every other lane (|x| >= 0.75, NaN:
 * the body's tail select), each without the other range's operations; other lanes get values of no use. */
#define RLX_GELU_CENTER(L, V, v)                                                                      \
    do {                                                                                              \
        static const float cs[8] = RLX_GELU_S;                                                        \
        V x[L], u[L], acc[L];                                                                         \
        _Pragma("GCC unroll 8") for (int q = 0; q < L; q++) {                                         \
            x[q] = v[q];                                                                              \
            const V ax = MIN(ABS(x[q]), SET1(16.0f));                                                 \
            u[q] = MUL(ax, ax);                                                                       \
            acc[q] = SET1(cs[0]);                                                                     \
        }                                                                                             \
        _Pragma("GCC unroll 8") for (int i = 1; i < 8; i++)                                           \
            _Pragma("GCC unroll 8") for (int q = 0; q < L; q++)                                       \
                acc[q] = FMA(acc[q], u[q], SET1(cs[i]));                                              \
        _Pragma("GCC unroll 8") for (int q = 0; q < L; q++)                                           \
            v[q] = MUL(x[q], FMA(x[q], acc[q], SET1(0.5f)));                                          \
    } while (0)

#define RLX_GELU_TAIL(L, V, v)                                                                        \
    do {                                                                                              \
        static const float ch[11] = RLX_GELU_H, ce[8] = RLX_GELU_E;                                   \
        V x[L], ax[L], u[L], acc[L], ul[L], t[L], w[L], n[L], r[L];                                   \
        _Pragma("GCC unroll 8") for (int q = 0; q < L; q++) {                                         \
            x[q] = v[q];                                                                              \
            ax[q] = MIN(ABS(x[q]), SET1(16.0f));                                                      \
            u[q] = MUL(ax[q], ax[q]);                                                                 \
            t[q] = DIV(SET1(1.0f), FMA(ax[q], SET1(0.7071067811865475f), SET1(1.0f)));                \
            ul[q] = FMS(ax[q], ax[q], u[q]); /* x^2 = u + ul exactly */                                \
            w[q] = MUL(SUB(t[q], SET1(0.36733204834304223f)), SET1(3.4950157293916932f));             \
            acc[q] = SET1(ch[0]);                                                                     \
        }                                                                                             \
        RLX_GELU_EXP_STEPS(L, V);                                                                     \
        _Pragma("GCC unroll 8") for (int q = 0; q < L; q++) {                                         \
            const V m = MUL(MUL(SET1(0.5f), t[q]), acc[q]);                                           \
            const V out = SEL_GE0(x[q], TAIL_POS(x[q], m, n[q]), TAIL_NEG(x[q], m, n[q]));            \
            v[q] = SEL_LEM16(x[q], MUL(x[q], SETZ()), out);                                           \
        }                                                                                             \
    } while (0)

#if defined(__AVX512F__)
#define SET1 _mm512_set1_ps
#define SETZ _mm512_setzero_ps
#define ADD _mm512_add_ps
#define SUB _mm512_sub_ps
#define MUL _mm512_mul_ps
#define DIV _mm512_div_ps
#define FMA _mm512_fmadd_ps
#define FNMA _mm512_fnmadd_ps
#define MIN _mm512_min_ps
#define ABS(a) _mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(a), _mm512_set1_epi32(0x7fffffff)))
#define SEL_LT(a, b, x, y) _mm512_mask_blend_ps(_mm512_cmp_ps_mask(a, b, _CMP_LT_OQ), y, x)
#define SEL_GE0(a, x, y) _mm512_mask_blend_ps(_mm512_cmp_ps_mask(a, SETZ(), _CMP_GE_OQ), y, x)
/* x <= -16 ? z : y: the scalar's `ax0 >= 16 && x < 0` (false for NaN either way) */
#define SEL_LEM16(x, z, y) _mm512_mask_blend_ps(_mm512_cmp_ps_mask(x, SET1(-16.0f), _CMP_LE_OQ), y, z)
#define FMS _mm512_fmsub_ps
#define FNMS _mm512_fnmsub_ps
/* The tails, x (1 - m 2^n) and (x m) 2^n, with vscalefps (f 2^n, one rounding): the same values as the scalar
 * form's two factors (m 2^n1 and x m 2^n1 are exact, normal numbers for every n the tails reach, n >= -185,
 * so their product with 2^n2 rounds once, as scalef does; 1 - m 2^n is one rounding of the exact difference
 * in both: the scalar's fused multiply-add, here an exact m 2^n, or a tiny one where 1 is the result either way)
 * in 2 operations instead of ~12 integer ones (the whole GELU ~9% faster, Sapphire Rapids). */
#define TAIL_POS(x, m, n) MUL(x, SUB(SET1(1.0f), _mm512_scalef_ps(m, n)))
#define TAIL_NEG(x, m, n) _mm512_scalef_ps(MUL(x, m), n)

/* name(v): `form` (RLX_GELU_BODY, RLX_GELU_CENTER or RLX_GELU_TAIL) on L vectors of 16 lanes, in place. */
#define RLX_GELU16_FN(name, form, L) \
    static inline __attribute__((always_inline)) void name(__m512 *v) { form(L, __m512, v); }

/* gelu on L = 4 / 2 vectors of 16 lanes each, in place (4: a 12 x 32 tile's two rows). */
RLX_GELU16_FN(rlx_gelu16x4, RLX_GELU_BODY, 4)
RLX_GELU16_FN(rlx_gelu16x2, RLX_GELU_BODY, 2)
/* The ranges apart (RLX_GELU_CENTER / RLX_GELU_TAIL) on L = 4, 2, 1 vectors, in place. */
RLX_GELU16_FN(rlx_gelu16_center4, RLX_GELU_CENTER, 4)
RLX_GELU16_FN(rlx_gelu16_tail4, RLX_GELU_TAIL, 4)
RLX_GELU16_FN(rlx_gelu16_tail2, RLX_GELU_TAIL, 2)
RLX_GELU16_FN(rlx_gelu16_tail1, RLX_GELU_TAIL, 1)

#elif defined(__AVX2__) && defined(__FMA__)
#define SET1 _mm256_set1_ps
#define SETZ _mm256_setzero_ps
#define ADD _mm256_add_ps
#define SUB _mm256_sub_ps
#define MUL _mm256_mul_ps
#define DIV _mm256_div_ps
#define FMA _mm256_fmadd_ps
#define FNMA _mm256_fnmadd_ps
#define MIN _mm256_min_ps
#define ABS(a) _mm256_and_ps(a, _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff)))
#define SEL_LT(a, b, x, y) _mm256_blendv_ps(y, x, _mm256_cmp_ps(a, b, _CMP_LT_OQ))
#define SEL_GE0(a, x, y) _mm256_blendv_ps(y, x, _mm256_cmp_ps(a, SETZ(), _CMP_GE_OQ))
#define SEL_LEM16(x, z, y) _mm256_blendv_ps(y, z, _mm256_cmp_ps(x, SET1(-16.0f), _CMP_LE_OQ))
#define FMS _mm256_fmsub_ps
#define FNMS _mm256_fnmsub_ps
#define RLX_G8_N1(n) _mm256_srai_epi32(_mm256_add_epi32(_mm256_cvttps_epi32(n),                         \
                                        _mm256_srli_epi32(_mm256_cvttps_epi32(n), 31)), 1)
#define RLX_G8_P2(k) _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(k, _mm256_set1_epi32(127)), 23))
#define POW2A(n, f) MUL(f, RLX_G8_P2(RLX_G8_N1(n)))
#define POW2B(n) RLX_G8_P2(_mm256_sub_epi32(_mm256_cvttps_epi32(n), RLX_G8_N1(n)))
#define POW2(n, f) MUL(POW2A(n, f), POW2B(n))
/* the tails as the scalar form computes them: x (1 - (m 2^n1) 2^n2), ((x m) 2^n1) 2^n2 */
#define TAIL_POS(x, m, n) MUL(x, FNMA(POW2A(n, m), POW2B(n), SET1(1.0f)))
#define TAIL_NEG(x, m, n) POW2(n, MUL(x, m))

/* gelu on L = 6 / 4 vectors of 8 lanes each, in place (6: ~5% faster than 4 and ~30% than 2 on Zen 3,
 * a 6 x 16 tile's three rows; 16 ymm registers hold fewer chains than that, the rest spills to L1). */
static inline __attribute__((always_inline)) void rlx_gelu8x6(__m256 *v)
{
    RLX_GELU_BODY(6, __m256, v);
}

static inline __attribute__((always_inline)) void rlx_gelu8x4(__m256 *v)
{
    RLX_GELU_BODY(4, __m256, v);
}
#endif

#undef RLX_GELU16_FN
#undef SET1
#undef SETZ
#undef ADD
#undef SUB
#undef MUL
#undef DIV
#undef FMA
#undef FNMA
#undef MIN
#undef ABS
#undef SEL_LT
#undef SEL_GE0
#undef SEL_LEM16
#undef FMS
#undef FNMS
#undef POW2A
#undef POW2B
#undef POW2
#undef TAIL_POS
#undef TAIL_NEG

#endif /* RLX_KERNELS_VGELU_H */

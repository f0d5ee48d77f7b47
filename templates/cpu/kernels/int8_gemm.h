/* Dynamic int8 GEMM: C = act(dynq(X) @ q(W) + bias), W quantized per output channel at set_param.
 * (needs kernels/threads.h, kernels/scalar.h and kernels/packed_gemm.h: rlx_split, rlx_gelu_f, the activation epilogue).
 * A fixed RLX kernel header: no template code; included by generated files that need it.
 *
 * The arithmetic is rlx.ir.ops_int8's, bit for bit in the integers:
 *   sw[n] = max|W[:, n]| / 127,  wq = rint(W * (127 / max|W[:, n]|))   (rlx_i8_quantize_param, at set)
 *   sx[m] = max|X[m]| / 127,     xq = rint(X * (127 / max|X[m]|))      (rlx_i8_quantize_row, per run)
 *   acc = xq[m] . wq[:, n] (int32);  C = fma(f32(acc) * sx[m], sw[n], bias[n]), then act.
 *
 * Stored weight (rlx.ir.decisions_int8): ceil(N/32) panels of 32 columns; panel p is ceil(K/4)
 * groups of 128 bytes, the 4 consecutive k of one column adjacent (one int32 lane of vpdpbusd),
 * zero padded; then f32 sw[Np] and int32 comp[Np] = 128 * sum_k wq[k, n].
 *
 * Kernels, picked by the instruction set this file is compiled for:
 *   AVX-512 VNNI: 12 x 32 tiles, vpdpbusd (u8 x s8): the activations are stored as u8 = xq + 128
 *                 while they are quantized, and comp[n] takes the 128 back out in the epilogue;
 *   AVX2:         2 x 32 tiles, pmaddubsw on |xq| and sign(wq, xq) (never saturates: |xq|, |wq| <= 127),
 *                 then pmaddwd into int32;
 *   otherwise:    plain C over the same layout.
 * The epilogue dequantizes, adds the bias and, for `gelu` (the kernel's own GELU, not the graph's
 * activation epilogue), applies GELU while the tile is still in registers: rlx_i8_gelu16 on AVX-512,
 * rlx_gelu_f (kernels/scalar.h) in the other kernels. Other activations go through the generated
 * rlx_epilogue_act after each block.
 * Each thread quantizes the rows it multiplies into its own scratch (the A "packing" is the
 * quantization), a block of RLX_I8_MC rows at a time; threads split the rows when there are
 * enough of them, else the panels (the few rows are then quantized once, shared by the team). */
#ifndef RLX_KERNELS_INT8_GEMM_H
#define RLX_KERNELS_INT8_GEMM_H

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define RLX_I8_NR 32 /* columns per panel */
#define RLX_I8_KG 4  /* k per int32 lane */
#define RLX_I8_MC 48 /* rows quantized and multiplied per block (a multiple of every RLX_I8_MR) */
#define RLX_I8_PF_BYTES 8192 /* how far ahead of the VNNI kernel weights are prefetched (as packed_gemm.h) */

#if (defined(__x86_64__) || defined(__i386__)) && defined(__AVX512F__) && defined(__AVX512BW__) && \
    defined(__AVX512VNNI__)
#include <immintrin.h>
#define RLX_I8_VNNI 1
#include "vexp16.h"
#define RLX_I8_MR 12
#define RLX_I8_ABIAS 128 /* activations stored as u8 = xq + 128 */
#elif (defined(__x86_64__) || defined(__i386__)) && defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define RLX_I8_AVX2 1
#define RLX_I8_MR 2 /* 2 x 4 ymm accumulators: the 16 ymm registers also hold B and two forms of A */
#define RLX_I8_ABIAS 0
#else
#define RLX_I8_MR 4
#define RLX_I8_ABIAS 0
#endif

static inline int64_t rlx_i8_round4(int64_t k) { return (k + 3) / 4 * 4; }

/* Bytes of the stored weight (kept equal to rlx.ir.decisions_int8.Int8Param.storage_bytes). */
static inline int64_t rlx_i8_weight_bytes(int64_t K, int64_t N)
{
    const int64_t np = (N + RLX_I8_NR - 1) / RLX_I8_NR * RLX_I8_NR;
    return np * rlx_i8_round4(K) + 8 * np;
}

/* q = rint(v * inv) clamped to [-127, 127] (round half to even: the default rounding mode). */
static inline int32_t rlx_i8_q(float v, float inv)
{
    const float t = nearbyintf(v * inv);
    return t > 127.0f ? 127 : t < -127.0f ? -127 : (int32_t)t;
}

/* set_param: W[k, n] = src[k * sk + n * sn] (dims = {K, N}, strides = {sk, sn}) into the stored form. */
static void rlx_i8_quantize_param(char *dst, const float *src, const int64_t *dims, const int64_t *strides)
{
    const int64_t K = dims[0], N = dims[1], sk = strides[0], sn = strides[1];
    const int64_t kp = rlx_i8_round4(K), np = (N + RLX_I8_NR - 1) / RLX_I8_NR * RLX_I8_NR;
    int8_t *panels = (int8_t *)dst;
    float *sw = (float *)(dst + np * kp);
    int32_t *comp = (int32_t *)(sw + np);
    memset(dst, 0, (size_t)rlx_i8_weight_bytes(K, N));
    for (int64_t n = 0; n < N; n++) {
        float amax = 0.0f, chk = 0.0f;
        for (int64_t k = 0; k < K; k++) {
            const float v = src[k * sk + n * sn];
            chk += v * 0.0f; /* NaN once any value is inf or NaN */
            amax = fabsf(v) > amax ? fabsf(v) : amax;
        }
        const int bad = chk != chk;
        const float inv = bad || amax == 0.0f ? 0.0f : 127.0f / amax;
        int8_t *col = panels + n / RLX_I8_NR * (RLX_I8_NR * kp) + n % RLX_I8_NR * RLX_I8_KG;
        int32_t sum = 0;
        for (int64_t k = 0; k < K && !bad; k++) {
            const int32_t q = rlx_i8_q(src[k * sk + n * sn], inv);
            col[k / RLX_I8_KG * (RLX_I8_NR * RLX_I8_KG) + k % RLX_I8_KG] = (int8_t)q;
            sum += q;
        }
        sw[n] = bad ? NAN : amax / 127.0f;
        comp[n] = 128 * sum;
    }
}

/* One row of activations: scale sx = max|x| / 127 and xq + RLX_I8_ABIAS as bytes, K padded to kp
 * with the bias value (zero after the unbias; the weight's padding is zero anyway). */
static void rlx_i8_quantize_row(const float *restrict x, int64_t K, int64_t kp, uint8_t *restrict dst,
                                float *restrict sx)
{
    float amax = 0.0f, chk = 0.0f;
    int64_t k = 0;
#ifdef RLX_I8_VNNI
    /* max |x| as integers: |x|'s bits order like its values, and NaN's above inf's, so one unsigned
     * max finds both the scale and whether any value is not finite (bits above FLT_MAX's). */
    const __m512i abs_bits = _mm512_set1_epi32(0x7fffffff);
    __m512i vmax = _mm512_setzero_si512(), vmax2 = vmax;  /* 64 at a time on two chains */
    for (; k + 64 <= K; k += 64) {
        const __m512i a0 = _mm512_and_si512(_mm512_loadu_si512((const void *)(x + k)), abs_bits);
        const __m512i a1 = _mm512_and_si512(_mm512_loadu_si512((const void *)(x + k + 16)), abs_bits);
        const __m512i a2 = _mm512_and_si512(_mm512_loadu_si512((const void *)(x + k + 32)), abs_bits);
        const __m512i a3 = _mm512_and_si512(_mm512_loadu_si512((const void *)(x + k + 48)), abs_bits);
        vmax = _mm512_max_epu32(vmax, _mm512_max_epu32(a0, a1));
        vmax2 = _mm512_max_epu32(vmax2, _mm512_max_epu32(a2, a3));
    }
    vmax = _mm512_max_epu32(vmax, vmax2);
    for (; k + 16 <= K; k += 16)
        vmax = _mm512_max_epu32(vmax, _mm512_and_si512(_mm512_loadu_si512((const void *)(x + k)), abs_bits));
    const uint32_t bits = (uint32_t)_mm512_reduce_max_epu32(vmax);
    if (bits > 0x7f7fffffu)
        chk = NAN;  /* an inf or NaN among them */
    else
        memcpy(&amax, &bits, 4);
#endif
    for (; k < K; k++) {
        chk += x[k] * 0.0f;
        amax = fabsf(x[k]) > amax ? fabsf(x[k]) : amax;
    }
    const int bad = chk != chk;
    const float inv = bad || amax == 0.0f ? 0.0f : 127.0f / amax;
    *sx = bad ? NAN : amax / 127.0f;
    k = 0;
    if (!bad) {
#ifdef RLX_I8_VNNI
        const __m512 vinv = _mm512_set1_ps(inv);
        const __m512i lo = _mm512_set1_epi32(-127), hi = _mm512_set1_epi32(127), off = _mm512_set1_epi32(128);
        /* 64 at a time: the saturating packs narrow to bytes (|q| <= 127 already: |x| * (127 / max|x|)
         * rounds to at most 127), leaving in each 128-bit lane i the dwords q0[4i:4i+4], q1[..], q2[..],
         * q3[..]; the permutation puts them back in order, the xor adds the 128 (two's complement). */
        const __m512i order = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
        const __m512i bias8 = _mm512_set1_epi8((char)0x80);
        for (; k + 64 <= K; k += 64) {
            const __m512i q0 = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(x + k), vinv));
            const __m512i q1 = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(x + k + 16), vinv));
            const __m512i q2 = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(x + k + 32), vinv));
            const __m512i q3 = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(x + k + 48), vinv));
            const __m512i b = _mm512_packs_epi16(_mm512_packs_epi32(q0, q1), _mm512_packs_epi32(q2, q3));
            _mm512_storeu_si512((void *)(dst + k), _mm512_xor_si512(_mm512_permutexvar_epi32(order, b), bias8));
        }
        for (; k + 16 <= K; k += 16) {
            __m512i q = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(x + k), vinv)); /* rounds to even */
            q = _mm512_add_epi32(_mm512_min_epi32(_mm512_max_epi32(q, lo), hi), off);
            _mm_storeu_si128((__m128i *)(dst + k), _mm512_cvtepi32_epi8(q));
        }
#endif
        for (; k < K; k++)
            dst[k] = (uint8_t)(rlx_i8_q(x[k], inv) + RLX_I8_ABIAS);
    }
    for (; k < kp; k++)
        dst[k] = (uint8_t)RLX_I8_ABIAS;
}

/* The dequantizing epilogue of one row of a tile, scalar (tails and the portable kernel). */
static inline void rlx_i8_store_row(const int32_t *acc, int64_t nr, float sx, const float *sw, const int32_t *comp,
                                    const float *bias, float *restrict c, int gelu)
{
    for (int64_t j = 0; j < nr; j++) {
        const float t = (float)(acc[j] - (RLX_I8_ABIAS ? comp[j] : 0)) * sx;
        c[j] = bias ? fmaf(t, sw[j], bias[j]) : t * sw[j];
    }
    if (gelu) {  /* a loop of its own: this one vectorizes (a select in the loop above does not) */
        #pragma omp simd
        for (int64_t j = 0; j < nr; j++)
            c[j] = rlx_gelu_f(c[j]);
    }
}

#if defined(RLX_I8_VNNI)

/* gelu(x) = x Phi(x) on 16 lanes, for the int8 epilogue: Phi(x) = 1 - q for x > 0, q otherwise, with
 * q = Phi(-|x|) = erfc(z) / 2, z = |x| / sqrt2, from Abramowitz & Stegun 7.1.26:
 *   erfc(z) ~= (a1 t + a2 t^2 + a3 t^3 + a4 t^4 + a5 t^5) exp(-z^2),  t = 1 / (1 + p z),
 * (|error| <= 1.5e-7), exp by rlx_exp16_in_range (kernels/vexp16.h).
 * About 30 vector operations, a third of rlx_gelu_f's two-range evaluation; the error is absolute,
 * not relative: |gelu - exact| <= 4.3e-7 and <= 0.21 * (1e-6 + 4e-6 |exact|) over [-30, 30]
 * (measured against double erfc on a 1e-4 grid), far below the int8 product's own rounding, so
 * the negative tail (|gelu| < 1e-6 below x = -5) is accurate to absolute, not relative, precision.
 * +inf gives +inf, -inf NaN (-inf * 0, as the reference), NaN stays NaN. */
static inline __m512 rlx_i8_gelu16(__m512 x)
{
    const __m512 one = _mm512_set1_ps(1.0f);
    const __m512 a = _mm512_abs_ps(x);
    const __m512 t = _mm512_div_ps(one, _mm512_fmadd_ps(a, _mm512_set1_ps(0.3275911f * 0.70710678118654752f), one));
    __m512 p = _mm512_set1_ps(0.5f * 1.061405429f); /* the a_i halved: q = erfc / 2 */
    p = _mm512_fmadd_ps(p, t, _mm512_set1_ps(0.5f * -1.453152027f));
    p = _mm512_fmadd_ps(p, t, _mm512_set1_ps(0.5f * 1.421413741f));
    p = _mm512_fmadd_ps(p, t, _mm512_set1_ps(0.5f * -0.284496736f));
    p = _mm512_fmadd_ps(p, t, _mm512_set1_ps(0.5f * 0.254829592f));
    p = _mm512_mul_ps(p, t);
    /* exp(u), u = -x^2/2 clamped to -87 (a normal result: q is then far below any rounding of x Phi) */
    const __m512 u = _mm512_max_ps(_mm512_mul_ps(_mm512_mul_ps(a, a), _mm512_set1_ps(-0.5f)), _mm512_set1_ps(-87.0f));
    const __m512 q = _mm512_mul_ps(p, rlx_exp16_in_range(u));
    const __mmask16 pos = _mm512_cmp_ps_mask(x, _mm512_setzero_ps(), _CMP_GT_OQ);
    return _mm512_mul_ps(x, _mm512_mask_sub_ps(q, pos, one, q));
}

/* A panel's epilogue operands: the column masks of its nr columns, comp, sw and the bias as vectors. */
typedef struct {
    __mmask16 m0, m1;
    __m512i k0, k1;
    __m512 s0, s1, z0, z1;
} RlxI8Epi;

static inline __attribute__((always_inline)) RlxI8Epi rlx_i8_epi(int64_t nr, const float *sw, const int32_t *comp,
                                                                  const float *bias)
{
    RlxI8Epi e;
    e.m0 = nr >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << nr) - 1);
    e.m1 = nr >= 32 ? (__mmask16)0xFFFF : nr <= 16 ? 0 : (__mmask16)((1u << (nr - 16)) - 1);
    e.k0 = _mm512_loadu_si512((const void *)comp);
    e.k1 = _mm512_loadu_si512((const void *)(comp + 16));
    e.s0 = _mm512_loadu_ps(sw);
    e.s1 = _mm512_loadu_ps(sw + 16);
    e.z0 = bias ? _mm512_maskz_loadu_ps(e.m0, bias) : _mm512_setzero_ps();
    e.z1 = bias ? _mm512_maskz_loadu_ps(e.m1, bias + 16) : _mm512_setzero_ps();
    return e;
}

/* One row's 32 int32 sums (c0: columns 0-15, c1: 16-31) dequantized, the bias added, GELU, stored: the
 * epilogue of both the vector tile and the AMX path (the same operations, so the same bits). */
static inline __attribute__((always_inline)) void rlx_i8_store2(const RlxI8Epi *e, __m512i c0, __m512i c1, float sxr,
                                                                int has_bias, int gelu, float *Crow)
{
    const __m512 x = _mm512_set1_ps(sxr);
    __m512 v0 = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(c0, e->k0)), x);
    __m512 v1 = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(c1, e->k1)), x);
    v0 = has_bias ? _mm512_fmadd_ps(v0, e->s0, e->z0) : _mm512_mul_ps(v0, e->s0);
    v1 = has_bias ? _mm512_fmadd_ps(v1, e->s1, e->z1) : _mm512_mul_ps(v1, e->s1);
    if (gelu) {
        v0 = rlx_i8_gelu16(v0);
        v1 = rlx_i8_gelu16(v1);
    }
    _mm512_mask_storeu_ps(Crow, e->m0, v0);
    _mm512_mask_storeu_ps(Crow + 16, e->m1, v1);
}

/* mr x 32 tile: kg groups of 4 k; A rows (u8) lda bytes apart, B one panel. The accumulators are
 * named variables (not an array), one pair per row, so they stay in zmm registers: 24 + 2 for B
 * + 1 broadcast of A. `mr` is a constant in every caller, so the rows past it compile away. */
/* acc += u8 a . s8 b per int32 lane. Written as asm with an in-out operand: GCC 12 copies and
 * spills the accumulator around every _mm512_dpbusd_epi32 in a loop like the one below. */
#define RLX_I8_DPBUSD(acc, a, b) __asm__("vpdpbusd %2, %1, %0" : "+v"(acc) : "v"(a), "v"(b))
#define RLX_I8_ROWS(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7) X(8) X(9) X(10) X(11)
static inline __attribute__((always_inline)) void rlx_i8_tile(const int mr, const int prefetch, int64_t kg,
                                                               const uint8_t *A, int64_t lda, const int8_t *B, float *C,
                                                               int64_t ldc, int64_t nr, const float *sx, const float *sw,
                                                               const int32_t *comp, const float *bias, int gelu)
{
#define RLX_I8_DECL(r) __m512i c0_##r = _mm512_setzero_si512(), c1_##r = _mm512_setzero_si512();
    RLX_I8_ROWS(RLX_I8_DECL)
#undef RLX_I8_DECL
    for (int64_t g = 0; g < kg; g++) {
        if (prefetch) {
            _mm_prefetch((const char *)(B + g * 128) + RLX_I8_PF_BYTES, _MM_HINT_T0);
            _mm_prefetch((const char *)(B + g * 128) + RLX_I8_PF_BYTES + 64, _MM_HINT_T0);
        }
        const __m512i b0 = _mm512_loadu_si512((const void *)(B + g * 128));
        const __m512i b1 = _mm512_loadu_si512((const void *)(B + g * 128 + 64));
        const uint8_t *a = A + g * 4;
#define RLX_I8_FMA(r)                                                              \
        if (mr > r) {                                                              \
            int32_t a4;                                                            \
            memcpy(&a4, a + r * lda, 4);                                           \
            const __m512i av = _mm512_set1_epi32(a4);                              \
            RLX_I8_DPBUSD(c0_##r, av, b0);                                         \
            RLX_I8_DPBUSD(c1_##r, av, b1);                                         \
        }
        RLX_I8_ROWS(RLX_I8_FMA)
#undef RLX_I8_FMA
    }
    const RlxI8Epi e = rlx_i8_epi(nr, sw, comp, bias);
#define RLX_I8_STORE(r)                                                                                \
    if (mr > r)                                                                                        \
        rlx_i8_store2(&e, c0_##r, c1_##r, sx[r], bias != NULL, gelu, C + r * ldc);
    RLX_I8_ROWS(RLX_I8_STORE)
#undef RLX_I8_STORE
}
#undef RLX_I8_ROWS
#undef RLX_I8_DPBUSD

#include "kernels/amx.h"
#if defined(RLX_AMX_TILE) && defined(__AMX_INT8__)
/* ── the AMX tile unit (AMX-INT8), for blocks of 16 rows and more ──────────────────────
 * TDPBUSD is vpdpbusd on tiles (u8 x s8 into exact int32 sums), so its sums are the vector tile's and the
 * epilogue is rlx_i8_store2: the same bits whichever path a row takes. 32 rows x 32 columns at a time as four
 * 16 x 16 int32 tiles (16 rows: two), A's quantized rows (16 rows x 64 k a tile), the panel read in place (a
 * group row's columns 0-15 and 16-31 are two B tiles' rows, 128 bytes apart). K a multiple of 64; a block's
 * whole 16-row chunks (a rest of fewer rows takes the vector tile). */
#define RLX_I8_AMX 1

/* C[0:mr, 0:nr] of one panel, mr a multiple of 16; A rows (u8) kp bytes apart, kp a multiple of 64. */
static void rlx_i8_amx_rows(int64_t mr, int64_t kp, const uint8_t *A, const int8_t *B, float *C, int64_t ldc,
                            int64_t nr, const float *sx, const float *sw, const int32_t *comp, const float *bias,
                            int gelu)
{
    int32_t cb[32 * 32] __attribute__((aligned(64)));
    const RlxI8Epi e = rlx_i8_epi(nr, sw, comp, bias);
    for (int64_t r0 = 0; r0 < mr; r0 += 32) {
        const int two = mr - r0 >= 32;
        /* k in steps of 64: 64 bytes of A's rows, 16 group rows (128 bytes each) of the panel */
        rlx_amx_block(RLX_AMX_U8S8, two, kp / 64, (const char *)(A + r0 * kp), kp, 64, (const char *)B, 128, 16 * 128,
                      64, cb);
        for (int i = 0; i < (two ? 32 : 16); i++)
            rlx_i8_store2(&e, _mm512_load_si512((const void *)(cb + 32 * i)),
                          _mm512_load_si512((const void *)(cb + 32 * i + 16)), sx[r0 + i], bias != NULL, gelu,
                          C + (r0 + i) * ldc);
    }
}
#endif /* AMX-INT8 */

#elif defined(RLX_I8_AVX2)

/* acc += |a| * sign(b, a) over pairs of bytes, summed into int32 lanes (exact: |a|, |b| <= 127). */
#define RLX_I8_MADD(acc, ua, a, b) \
    acc = _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(ua, _mm256_sign_epi8(b, a)), ones))

/* mr (1 or 2) x 32 tile; A holds xq as s8. Named accumulators, as in the VNNI tile. */
static inline __attribute__((always_inline)) void rlx_i8_tile(const int mr, const int prefetch, int64_t kg,
                                                               const uint8_t *A, int64_t lda, const int8_t *B, float *C,
                                                               int64_t ldc, int64_t nr, const float *sx, const float *sw,
                                                               const int32_t *comp, const float *bias, int gelu)
{
    (void)prefetch;  /* the AVX2 and C fallbacks leave the streaming to the hardware prefetcher */
    const __m256i ones = _mm256_set1_epi16(1);
    __m256i p0 = _mm256_setzero_si256(), p1 = p0, p2 = p0, p3 = p0, q0 = p0, q1 = p0, q2 = p0, q3 = p0;
    for (int64_t g = 0; g < kg; g++) {
        const int8_t *b = B + g * 128;
        const __m256i b0 = _mm256_loadu_si256((const __m256i *)b), b1 = _mm256_loadu_si256((const __m256i *)(b + 32));
        const __m256i b2 = _mm256_loadu_si256((const __m256i *)(b + 64)), b3 = _mm256_loadu_si256((const __m256i *)(b + 96));
        int32_t a4;
        memcpy(&a4, A + g * 4, 4);
        __m256i a = _mm256_set1_epi32(a4), ua = _mm256_abs_epi8(a);
        RLX_I8_MADD(p0, ua, a, b0);
        RLX_I8_MADD(p1, ua, a, b1);
        RLX_I8_MADD(p2, ua, a, b2);
        RLX_I8_MADD(p3, ua, a, b3);
        if (mr > 1) {
            memcpy(&a4, A + lda + g * 4, 4);
            a = _mm256_set1_epi32(a4);
            ua = _mm256_abs_epi8(a);
            RLX_I8_MADD(q0, ua, a, b0);
            RLX_I8_MADD(q1, ua, a, b1);
            RLX_I8_MADD(q2, ua, a, b2);
            RLX_I8_MADD(q3, ua, a, b3);
        }
    }
    int32_t row[RLX_I8_NR];
    _mm256_storeu_si256((__m256i *)row, p0);
    _mm256_storeu_si256((__m256i *)(row + 8), p1);
    _mm256_storeu_si256((__m256i *)(row + 16), p2);
    _mm256_storeu_si256((__m256i *)(row + 24), p3);
    rlx_i8_store_row(row, nr, sx[0], sw, comp, bias, C, gelu);
    if (mr > 1) {
        _mm256_storeu_si256((__m256i *)row, q0);
        _mm256_storeu_si256((__m256i *)(row + 8), q1);
        _mm256_storeu_si256((__m256i *)(row + 16), q2);
        _mm256_storeu_si256((__m256i *)(row + 24), q3);
        rlx_i8_store_row(row, nr, sx[1], sw, comp, bias, C + ldc, gelu);
    }
}
#undef RLX_I8_MADD

#else

static inline void rlx_i8_tile(const int mr, const int prefetch, int64_t kg, const uint8_t *A, int64_t lda,
                               const int8_t *B, float *C, int64_t ldc, int64_t nr, const float *sx, const float *sw,
                               const int32_t *comp, const float *bias, int gelu)
{
    (void)prefetch;
    for (int r = 0; r < mr; r++) {
        int32_t row[RLX_I8_NR] = {0};
        const int8_t *a = (const int8_t *)(A + r * lda);
        for (int64_t g = 0; g < kg; g++)
            for (int j = 0; j < RLX_I8_NR; j++)
                for (int q = 0; q < RLX_I8_KG; q++)
                    row[j] += (int32_t)a[g * 4 + q] * (int32_t)B[g * 128 + j * 4 + q];
        rlx_i8_store_row(row, nr, sx[r], sw, comp, bias, C + r * ldc, gelu);
    }
}

#endif

#define RLX_I8_CASE(R)                                                                           \
    case R:                                                                                      \
        if (prefetch)                                                                            \
            rlx_i8_tile(R, 1, kg, A, lda, B, C, ldc, nr, sx, sw, comp, bias, gelu);              \
        else                                                                                     \
            rlx_i8_tile(R, 0, kg, A, lda, B, C, ldc, nr, sx, sw, comp, bias, gelu);              \
        break;

/* mr rows (any count) of one panel, in pieces the tile kernel has a case for. The first piece
 * brings the panel in from memory: it prefetches RLX_I8_PF_BYTES ahead (into the next panel at
 * its end, which is the next this thread multiplies). */
static void rlx_i8_rows(int64_t mr, int64_t kg, const uint8_t *A, int64_t lda, const int8_t *B, float *C, int64_t ldc,
                        int64_t nr, const float *sx, const float *sw, const int32_t *comp, const float *bias, int gelu)
{
    int prefetch = 1;
    while (mr > 0) {
        const int64_t r = mr >= RLX_I8_MR ? RLX_I8_MR : mr >= 8 ? 8 : mr >= 4 ? 4 : mr >= 2 ? 2 : 1;  /* <= MR */
        switch (r) {
#if RLX_I8_MR == 12
        RLX_I8_CASE(12)
        RLX_I8_CASE(8)
#endif
#if RLX_I8_MR >= 4
        RLX_I8_CASE(4)
#endif
        RLX_I8_CASE(2)
        default:
        RLX_I8_CASE(1)
        }
        A += r * lda;
        C += r * ldc;
        sx += r;
        mr -= r;
        prefetch = 0;
    }
}
#undef RLX_I8_CASE

/* Scratch bytes one thread needs for K (a block of quantized rows and their scales). */
static inline int64_t rlx_i8_scratch_bytes(int64_t K)
{
    return (RLX_I8_MC * rlx_i8_round4(K) + 63) / 64 * 64 + RLX_I8_MC * 4;
}

/* Threads for an M x N x K int8 product. An int8 multiply-add costs a quarter of an f32 one, while
 * waking a sleeping OpenMP team (RLX_OMP_WAIT=passive) costs tens of microseconds, about what one
 * core multiplies in 8M int8 multiply-adds: below that per thread the product runs on the calling
 * thread (every linear layer of a short sentence). With spinning threads (RLX's default bounded
 * spin, or OMP_WAIT_POLICY=active) a fork is cheap: 256K per thread pays.
 * `spins` is the context's wait policy (rlx_set_team: the runtime's, rlx.runtime.team). */
#define RLX_I8_MACS_PER_THREAD ((int64_t)1 << 23)
#define RLX_I8_MACS_PER_SPINNING_THREAD ((int64_t)1 << 18)
static inline int rlx_i8_threads(int nt, int spins, int64_t m, int64_t n, int64_t k)
{
    const int64_t per = spins ? RLX_I8_MACS_PER_SPINNING_THREAD : RLX_I8_MACS_PER_THREAD;
    const int64_t useful = m * n * k / per;
    return useful < 1 ? 1 : (useful < nt ? (int)useful : nt);
}

/* One out-of-line copy: cloned per constant shape it would multiply the compile time of a graph.
 * GCC's noipa, not just noinline + noclone: the constants and activations its callers pass still
 * reach the body through interprocedural propagation, and with them GCC 12 spills the 12 x 32
 * tile's accumulators to the stack in its inner loop (a third of the multiply rate lost). */
#if defined(__clang__)
#define RLX_I8_NOINLINE __attribute__((noinline))
#else
#define RLX_I8_NOINLINE __attribute__((noipa))
#endif

/* Rows [i0, i0 + mc) of X quantized into aq (kp bytes a row) and sx. */
static inline void rlx_i8_quantize_rows(const float *X, int64_t K, int64_t kp, int64_t i0, int64_t mc, uint8_t *aq,
                                        float *sx)
{
    for (int64_t r = 0; r < mc; r++)
        rlx_i8_quantize_row(X + (i0 + r) * K, K, kp, aq + r * kp, sx + r);
}

/* Thread t of nt: its share of C[M, N] = act(dynq(X[M, K]) @ W + bias), W stored (see above);
 * `gelu` 1: GELU in the tile epilogue (then act is RLX_EPI_NONE), else `act` after each block.
 * `team_scratch` holds one block of `per_thread` bytes per thread of the team, thread 0's first.
 * Many rows: each thread its rows, every panel, quantized into its own scratch. Few rows (a short
 * sentence): each thread its panels, every row; the rows are then quantized once, each thread a
 * share of them into thread 0's scratch, with a team barrier before the multiply reads them (and
 * after it, before the next block overwrites them): every thread calls this with the same M. */
RLX_I8_NOINLINE static void rlx_i8gemm(int64_t M, int64_t N, int64_t K, const float *X, const char *W, const float *bias, float *C,
                       int act, int gelu, char *team_scratch, int64_t per_thread, int t, int nt)
{
    const int64_t kp = rlx_i8_round4(K), kg = kp / RLX_I8_KG;
    const int64_t np = (N + RLX_I8_NR - 1) / RLX_I8_NR;
    const int8_t *panels = (const int8_t *)W;
    const float *sw = (const float *)(W + np * RLX_I8_NR * kp);
    const int32_t *comp = (const int32_t *)(sw + np * RLX_I8_NR);
    const int by_rows = nt == 1 || M >= (int64_t)nt * RLX_I8_MC / 2 || np < nt;
    char *scratch = team_scratch + (by_rows ? (int64_t)t * per_thread : 0);
    uint8_t *aq = (uint8_t *)scratch;
    float *sx = (float *)(scratch + (RLX_I8_MC * kp + 63) / 64 * 64);
    int64_t m0 = 0, m1 = M, p0 = 0, p1 = np;
#ifdef RLX_I8_AMX
    /* whole 16-row chunks of a block on the tile unit (the same bits as the vector tile) */
    const int amx = K > 0 && K % 64 == 0 && M >= 16 && rlx_amx_begin(16);
#endif
    if (by_rows)
        rlx_split(M, t, nt, &m0, &m1);
    else
        rlx_split(np, t, nt, &p0, &p1);
    for (int64_t i0 = m0; i0 < m1; i0 += RLX_I8_MC) {
        const int64_t mc = m1 - i0 < RLX_I8_MC ? m1 - i0 : RLX_I8_MC;
        if (by_rows) {
            rlx_i8_quantize_rows(X, K, kp, i0, mc, aq, sx);
        } else {
            int64_t r0, r1;
            rlx_split(mc, t, nt, &r0, &r1);
            rlx_i8_quantize_rows(X, K, kp, i0 + r0, r1 - r0, aq + r0 * kp, sx + r0);
            #pragma omp barrier
        }
        for (int64_t p = p0; p < p1; p++) {
            const int64_t j0 = p * RLX_I8_NR, nr = N - j0 < RLX_I8_NR ? N - j0 : RLX_I8_NR;
            float *c = C + i0 * N + j0;
            int64_t done = 0;
#ifdef RLX_I8_AMX
            if (amx && mc >= 16) {
                done = mc / 16 * 16;
                rlx_i8_amx_rows(done, kp, aq, panels + j0 * kp, c, N, nr, sx, sw + j0, comp + j0,
                                bias ? bias + j0 : NULL, gelu);
            }
#endif
            if (mc > done)
                rlx_i8_rows(mc - done, kg, aq + done * kp, kp, panels + j0 * kp, c + done * N, N, nr, sx + done, sw + j0,
                            comp + j0, bias ? bias + j0 : NULL, gelu);
            if (act != RLX_EPI_NONE)
                rlx_epilogue_act(c, N, mc, nr, act);
        }
        if (!by_rows && i0 + RLX_I8_MC < m1) {
            #pragma omp barrier
        }
    }
#ifdef RLX_I8_AMX
    if (amx)
        _tile_release();  /* a thread without tile state saves none at its context switches */
#endif
}

#endif /* RLX_KERNELS_INT8_GEMM_H */

/* The quantized-matmul kernels (GGUF block formats q8_0, q4_0, q4_1, q5_0, q5_1, q4_k, q6_k): the
 * implementation of the kernel unit kernels/quant.c. Included by that unit only (and by C tests of the
 * kernels), never by a generated program: programs include kernels/quant.h, which declares the unit's
 * entry points, one per format (and activation mode) with the format a compile-time constant here.
 * Needs kernels/half.h.
 *
 * A weight W[N, K] is stored as GGUF does: row n is K / QK blocks of QB bytes (rlx/ir/quant.py
 * documents every layout). Y[M, N] = X[M, K] @ W^T is computed two ways:
 *
 *   few rows (decode, M <= RLX_QDECODE_MAX_M): each thread takes a range of weight rows and reads
 *     their blocks once, multiplying them with every row of X while the block sits in registers.
 *     For q8_0 / q4_0 / q4_1 the AVX-512 kernel unpacks the 8/4-bit values in registers and
 *     accumulates their products with X in f32; the AVX2 kernel dequantizes 8 weight rows at a time,
 *     a chunk of blocks at a time, into an L1 buffer once per step and runs a register-blocked
 *     micro-kernel (up to 6 rows of X x 2 weight rows) over it. Other formats (and builds without
 *     AVX2) dequantize one weight row into an L1-resident f32 buffer and take dot products with it.
 *   many rows (prefill): each thread takes a range of panels of RLX_QP weight rows, dequantizes a
 *     panel into the packed layout of kernels/packed_gemm.h (per-thread scratch, K x RLX_QP floats;
 *     rlx_q_dequant_panel here) and the program multiplies it with the packed-GEMM micro-kernel
 *     (kernels/qgemm_panels.h), so prefill runs at f32 GEMM speed without ever holding more than one
 *     panel of the weight in f32.
 *
 * Dequantization reproduces GGUF's float32 arithmetic exactly (same operations, same order; the
 * only fused multiply-adds a compiler may form, d * q + m, have an exact product since d is a
 * half and q has at most 6 bits), so rlx_q_dequant_row equals rlx.ir.quant.dequantize bit for bit.
 */
#ifndef RLX_KERNELS_QUANT_KERNELS_H
#define RLX_KERNELS_QUANT_KERNELS_H

#include <math.h>
#include <stdlib.h>
#include <stdint.h>
#include <string.h>

#if (defined(__x86_64__) || defined(__i386__)) && (defined(__AVX2__) || defined(__AVX512F__) || defined(__F16C__))
#include <immintrin.h>
#endif

/* The format ids, RLX_QGEMV_MAX_M, RLX_QDECODE_MAX_M, RLX_QP and the unit's declarations. */
#include "kernels/quant.h"

static inline float rlx_q_half(const uint8_t *p)
{
    uint16_t h;
    memcpy(&h, p, 2);
#ifdef __F16C__
    return _cvtsh_ss(h);  /* exact, subnormals included */
#else
    return rlx_h2f(h);
#endif
}

/* ── exact dequantization of one block (QK values) ────────────────────── */

static inline __attribute__((always_inline)) void rlx_q_dequant_block(const int fmt, const uint8_t *restrict b,
                                                                        float *restrict y)
{
    switch (fmt) {
    case RLX_Q8_0: {
        const float d = rlx_q_half(b);
        for (int j = 0; j < 32; j++)
            y[j] = (float)(int8_t)b[2 + j] * d;
        break;
    }
    case RLX_Q4_0: {
        const float d = rlx_q_half(b);
        for (int j = 0; j < 16; j++) {
            y[j] = d * (float)((b[2 + j] & 0x0F) - 8);
            y[j + 16] = d * (float)((b[2 + j] >> 4) - 8);
        }
        break;
    }
    case RLX_Q4_1: {
        const float d = rlx_q_half(b), m = rlx_q_half(b + 2);
        for (int j = 0; j < 16; j++) {
            y[j] = d * (float)(b[4 + j] & 0x0F) + m;
            y[j + 16] = d * (float)(b[4 + j] >> 4) + m;
        }
        break;
    }
    case RLX_Q5_0:
    case RLX_Q5_1: {
        const int one = fmt == RLX_Q5_1;  /* q5_1 has a min after d */
        const float d = rlx_q_half(b), m = one ? rlx_q_half(b + 2) : 0.0f;
        uint32_t qh;
        memcpy(&qh, b + 2 + 2 * one, 4);
        const uint8_t *qs = b + 6 + 2 * one;
        for (int j = 0; j < 16; j++) {
            const int lo = (qs[j] & 0x0F) | (int)((qh >> j) & 1u) << 4;
            const int hi = (qs[j] >> 4) | (int)((qh >> (j + 16)) & 1u) << 4;
            if (one) {
                y[j] = d * (float)lo + m;
                y[j + 16] = d * (float)hi + m;
            } else {
                y[j] = d * (float)(lo - 16);
                y[j + 16] = d * (float)(hi - 16);
            }
        }
        break;
    }
    case RLX_Q4_K: {
        const float d = rlx_q_half(b), dmin = rlx_q_half(b + 2);
        const uint8_t *s = b + 4, *qs = b + 16;
        for (int g = 0; g < 4; g++) {  /* 32 bytes: sub-block 2g in low nibbles, 2g+1 in high */
            for (int h = 0; h < 2; h++) {
                const int j = 2 * g + h;
                const int sc = j < 4 ? s[j] & 63 : (s[j + 4] & 0x0F) | ((s[j - 4] >> 6) << 4);
                const int mn = j < 4 ? s[j + 4] & 63 : (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
                const float ds = d * (float)sc, dm = dmin * (float)mn;
                for (int l = 0; l < 32; l++)
                    y[32 * j + l] = ds * (float)(h ? qs[32 * g + l] >> 4 : qs[32 * g + l] & 0x0F) - dm;
            }
        }
        break;
    }
    case RLX_Q6_K: {
        const float d = rlx_q_half(b + 208);
        for (int half = 0; half < 2; half++) {
            const uint8_t *ql = b + 64 * half, *qh = b + 128 + 32 * half;
            const int8_t *sc = (const int8_t *)(b + 192 + 8 * half);
            float *out = y + 128 * half;
            for (int l = 0; l < 32; l++) {
                const int is = l / 16;
                const int q1 = ((ql[l] & 0x0F) | ((qh[l] >> 0) & 3) << 4) - 32;
                const int q2 = ((ql[l + 32] & 0x0F) | ((qh[l] >> 2) & 3) << 4) - 32;
                const int q3 = ((ql[l] >> 4) | ((qh[l] >> 4) & 3) << 4) - 32;
                const int q4 = ((ql[l + 32] >> 4) | ((qh[l] >> 6) & 3) << 4) - 32;
                out[l] = (d * (float)sc[is + 0]) * (float)q1;
                out[l + 32] = (d * (float)sc[is + 2]) * (float)q2;
                out[l + 64] = (d * (float)sc[is + 4]) * (float)q3;
                out[l + 96] = (d * (float)sc[is + 6]) * (float)q4;
            }
        }
        break;
    }
    default:
        break;
    }
}

/* One row of K values: K / qk blocks of qb bytes. */
static inline __attribute__((always_inline)) void rlx_q_dequant_row(const int fmt, const int qk, const int qb,
                                                                      const uint8_t *restrict row, int64_t K,
                                                                      float *restrict y)
{
    for (int64_t b = 0; b < K / qk; b++)
        rlx_q_dequant_block(fmt, row + b * qb, y + b * qk);
}

/* ── GEMV: out[i] = X[i, :] . W[n, :] for one weight row, i < mr ─────── */

#if ((defined(__x86_64__) || defined(__i386__)) && defined(__AVX512F__)) || defined(RLX_QGEMV_VEC16)
#define RLX_QSIMD 1
/* The AVX-512 kernel, in GCC vector types of 16 floats (RLX_QGEMV_VEC16 builds the same source on any
 * target, two AVX2 registers a vector, so its arithmetic is checked on machines without AVX-512).
 * Each block is dequantized once into two vectors of floats (rlx_q_dequant_block's values: d * q (+ m),
 * the product exact) and multiplied with up to RLX_QF32_TILE rows of X: per row two fused
 * multiply-adds a block into the row's two accumulators (values 0-15 and 16-31 of its blocks), nothing
 * else, so a row costs about one cycle a block where unpacking is shared by 8 rows (16 of the 32 zmm
 * registers hold the accumulators). A row's arithmetic does not depend on the tile it is in. */
#define RLX_QF32_TILE 8
typedef float rlx_qv16f __attribute__((vector_size(64)));
typedef float rlx_qv8f __attribute__((vector_size(32)));
typedef float rlx_qv4f __attribute__((vector_size(16)));
typedef uint8_t rlx_qv16u8 __attribute__((vector_size(16)));
typedef int8_t rlx_qv16s8 __attribute__((vector_size(16)));
typedef int32_t rlx_qv16i __attribute__((vector_size(64)));
#ifdef __AVX512F__
#define RLX_QV16_FMA(a, b, c) ((rlx_qv16f)_mm512_fmadd_ps((__m512)(a), (__m512)(b), (__m512)(c)))
/* 16 bytes to 16 floats (vpmovzxbd / vpmovsxbd, vcvtdq2ps) */
#define RLX_QV16_U8(v) ((rlx_qv16f)_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32((__m128i)(v))))
#define RLX_QV16_S8(v) ((rlx_qv16f)_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32((__m128i)(v))))
#else  /* (a test build: GCC contracts the product and sum into fused multiply-adds where the target has them) */
#define RLX_QV16_FMA(a, b, c) ((a) * (b) + (c))
#define RLX_QV16_U8(v) __builtin_convertvector(__builtin_convertvector((v), rlx_qv16i), rlx_qv16f)
#define RLX_QV16_S8(v) __builtin_convertvector(__builtin_convertvector((v), rlx_qv16i), rlx_qv16f)
#endif

static inline rlx_qv16f rlx_qv16_load(const float *p)
{
    rlx_qv16f v;
    memcpy(&v, p, sizeof v);
    return v;
}

/* The 16 lanes' sum, in a fixed tree order. */
static inline float rlx_qv16_sum(rlx_qv16f v)
{
    const rlx_qv8f h = __builtin_shufflevector(v, v, 0, 1, 2, 3, 4, 5, 6, 7) +
                       __builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15);
    const rlx_qv4f q = __builtin_shufflevector(h, h, 0, 1, 2, 3) + __builtin_shufflevector(h, h, 4, 5, 6, 7);
    return (q[0] + q[2]) + (q[1] + q[3]);
}

/* One q8_0 / q4_0 / q4_1 block's 32 dequantized values: w[0] = values 0-15, w[1] = 16-31. */
static inline __attribute__((always_inline)) void rlx_qblk_v16(const int fmt, const uint8_t *restrict blk,
                                                                rlx_qv16f *w)
{
    const rlx_qv16f d = (rlx_qv16f){0} + rlx_q_half(blk);
    rlx_qv16f q0, q1;
    if (fmt == RLX_Q8_0) {
        rlx_qv16s8 a, b;
        memcpy(&a, blk + 2, 16);
        memcpy(&b, blk + 18, 16);
        q0 = RLX_QV16_S8(a);
        q1 = RLX_QV16_S8(b);
    } else {
        rlx_qv16u8 raw;
        memcpy(&raw, blk + (fmt == RLX_Q4_1 ? 4 : 2), 16);
        q0 = RLX_QV16_U8(raw & 0x0F);
        q1 = RLX_QV16_U8(raw >> 4);
        if (fmt == RLX_Q4_0) {  /* q - 8, exact */
            q0 -= 8.0f;
            q1 -= 8.0f;
        }
    }
    if (fmt == RLX_Q4_1) {
        const rlx_qv16f m = (rlx_qv16f){0} + rlx_q_half(blk + 2);
        w[0] = RLX_QV16_FMA(d, q0, m);
        w[1] = RLX_QV16_FMA(d, q1, m);
    } else {
        w[0] = d * q0;
        w[1] = d * q1;
    }
}

/* q8_0 / q4_0 / q4_1 row w (nb blocks) against mr (<= RLX_QF32_TILE) rows of X. */
static inline __attribute__((always_inline)) void rlx_qdot_simd(const int fmt, const int mr, int64_t nb,
        const float *restrict X, int64_t K, const uint8_t *restrict w, float *out)
{
    const int qb = fmt == RLX_Q8_0 ? 34 : fmt == RLX_Q4_0 ? 18 : 20;  /* q4_1's min is in the dequantized values */
    rlx_qv16f lo[RLX_QF32_TILE], hi[RLX_QF32_TILE];
    for (int i = 0; i < RLX_QF32_TILE; i++)
        if (i < mr)
            lo[i] = hi[i] = (rlx_qv16f){0};
    const float *xr[RLX_QF32_TILE];  /* the rows' starts, computed once: K is a runtime value in the unit */
    for (int i = 0; i < RLX_QF32_TILE; i++)
        xr[i] = X + (i < mr ? i : 0) * K;
    for (int64_t b = 0; b < nb; b++) {
        rlx_qv16f wv[2];
        rlx_qblk_v16(fmt, w + b * qb, wv);
        for (int i = 0; i < RLX_QF32_TILE; i++)
            if (i < mr) {
                const float *x = xr[i] + b * 32;
                lo[i] = RLX_QV16_FMA(rlx_qv16_load(x), wv[0], lo[i]);
                hi[i] = RLX_QV16_FMA(rlx_qv16_load(x + 16), wv[1], hi[i]);
            }
    }
    for (int i = 0; i < RLX_QF32_TILE; i++)
        if (i < mr)
            out[i] = rlx_qv16_sum(lo[i] + hi[i]);
}
#elif (defined(__x86_64__) || defined(__i386__)) && defined(__AVX2__) && defined(__FMA__)
/* The AVX2 kernel, a register-blocked micro-kernel over several rows of X and several weight rows.
 * A row's arithmetic, whatever tile it sits in: one 8-float accumulator per (row of X, weight row),
 * into which every block adds its four fused products x[8j : 8j+8] * w[8j : 8j+8] (j = 0..3, blocks
 * in order), w the block's exactly dequantized values (rlx_q_dequant_block's: d * q (+ m), the
 * product exact); then the 8 lanes' sum (rlx_q_hsum256). Nothing of it depends on the other rows
 * of X, so a decode row's result is the same alone or among 15 others (batch-invariant).
 * RLX_QF32_COLS weight rows are dequantized together, RLX_QF32_KC blocks at a time, into a small
 * buffer that stays in L1 (as does the chunk of X), and every tile of rows reads them from there:
 * each weight block is unpacked once per step, not once per tile of rows, and each load of X feeds
 * several weight rows (tiles of up to 6 rows x 2 weight rows). The accumulators wait in memory
 * between chunks (a float's store and load are exact, so chunking leaves the arithmetic as is). */
#define RLX_QF32_AVX2 1
#define RLX_QF32_COLS 8  /* weight rows dequantized together */
#define RLX_QF32_KC 8    /* blocks of each per chunk (8 x 32 x 8 floats: 8 KB) */
static inline float rlx_q_hsum256(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* One q8_0 / q4_0 / q4_1 block's 32 values into y, exactly as rlx_q_dequant_block. */
static inline __attribute__((always_inline)) void rlx_q_dequant_block_ymm(const int fmt, const uint8_t *restrict blk,
                                                                           float *restrict y)
{
    const __m256 d = _mm256_set1_ps(rlx_q_half(blk));
    __m256 q[4];
    if (fmt == RLX_Q8_0) {
        for (int j = 0; j < 4; j++)
            q[j] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(blk + 2 + 8 * j))));
    } else {
        const __m128i low4 = _mm_set1_epi8(0x0F);
        const __m128i raw = _mm_loadu_si128((const __m128i *)(blk + (fmt == RLX_Q4_1 ? 4 : 2)));
        const __m128i l = _mm_and_si128(raw, low4), h = _mm_and_si128(_mm_srli_epi16(raw, 4), low4);
        __m256i v[4] = {_mm256_cvtepu8_epi32(l), _mm256_cvtepu8_epi32(_mm_srli_si128(l, 8)),
                        _mm256_cvtepu8_epi32(h), _mm256_cvtepu8_epi32(_mm_srli_si128(h, 8))};
        for (int j = 0; j < 4; j++) {
            if (fmt == RLX_Q4_0)
                v[j] = _mm256_sub_epi32(v[j], _mm256_set1_epi32(8));
            q[j] = _mm256_cvtepi32_ps(v[j]);
        }
    }
    if (fmt == RLX_Q4_1) {  /* d * q exact, so the fused d * q + m rounds as the scalar one */
        const __m256 m = _mm256_set1_ps(rlx_q_half(blk + 2));
        for (int j = 0; j < 4; j++)
            _mm256_storeu_ps(y + 8 * j, _mm256_fmadd_ps(d, q[j], m));
    } else {
        for (int j = 0; j < 4; j++)
            _mm256_storeu_ps(y + 8 * j, _mm256_mul_ps(d, q[j]));
    }
}

/* The tile: rows i < R of X (rows K apart) against weight rows c < C of the buffer (rows ld apart), kn
 * values (whole blocks). acc[i * RLX_QF32_COLS + c]: the (row, weight row) accumulators, in memory
 * between chunks (`first`: the first chunk, which starts them at zero). The weights' 8 values stay in registers while each row's 8 values are loaded once
 * and meet all of them (6 x 2: 12 accumulators, 8 loads per 12 fused multiply-adds). */
static inline __attribute__((always_inline)) void rlx_qf32_tile(const int R, const int C, int first, int64_t kn,
        const float *restrict X, int64_t K, const float *restrict wb, int64_t ld, __m256 *acc)
{
    __m256 a[6][RLX_QF32_COLS];
    for (int i = 0; i < R; i++)
        for (int c = 0; c < C; c++)
            a[i][c] = first ? _mm256_setzero_ps() : acc[i * RLX_QF32_COLS + c];
    for (int64_t k = 0; k < kn; k += 8) {
        __m256 w[RLX_QF32_COLS];
        for (int c = 0; c < C; c++) {
            w[c] = _mm256_load_ps(wb + c * ld + k);
            if (R > 1)  /* one load into a register: GCC would fold it into every product, R loads */
                __asm__("" : "+x"(w[c]));
        }
        for (int i = 0; i < R; i++) {
            __m256 x = _mm256_loadu_ps(X + i * K + k);
            if (C > 1)  /* as w: one load, not C */
                __asm__("" : "+x"(x));
            for (int c = 0; c < C; c++)
                a[i][c] = _mm256_fmadd_ps(x, w[c], a[i][c]);
        }
    }
    for (int i = 0; i < R; i++)
        for (int c = 0; c < C; c++)
            acc[i * RLX_QF32_COLS + c] = a[i][c];
}

/* Rows i < R (2..6) of X against the buffer's weight rows, two at a time. */
static inline __attribute__((always_inline)) void rlx_qf32_rows(const int R, int first, int64_t kn,
        const float *restrict X, int64_t K, const float *restrict wb, int64_t ld, __m256 *acc)
{
    for (int c = 0; c < RLX_QF32_COLS; c += 2)
        rlx_qf32_tile(R, 2, first, kn, X, K, wb + c * ld, ld, acc + c);
}

/* Y[i, n] for i < M (<= RLX_QDECODE_MAX_M), n in [n0, n1): RLX_QF32_COLS weight rows at a time (a
 * short last group padded with zeros, its padding's results dropped). */
static inline __attribute__((always_inline)) void rlx_qgemv_avx2(const int fmt, int64_t M, int64_t N, int64_t K,
        const float *restrict X, const uint8_t *restrict W, int64_t rb, float *restrict Y, int64_t n0, int64_t n1)
{
    const int qb = fmt == RLX_Q8_0 ? 34 : fmt == RLX_Q4_0 ? 18 : 20;
    const int64_t nb = K / 32, ld = RLX_QF32_KC * 32;
    float wb[RLX_QF32_COLS * RLX_QF32_KC * 32] __attribute__((aligned(32)));
    __m256 acc[RLX_QDECODE_MAX_M * RLX_QF32_COLS];
    for (int64_t g = n0; g < n1; g += RLX_QF32_COLS) {
        const int nc = n1 - g < RLX_QF32_COLS ? (int)(n1 - g) : RLX_QF32_COLS;
        for (int64_t b0 = 0; b0 < nb; b0 += RLX_QF32_KC) {
            const int64_t kb = nb - b0 < RLX_QF32_KC ? nb - b0 : RLX_QF32_KC, kn = 32 * kb;
            for (int c = 0; c < RLX_QF32_COLS; c++) {
                float *restrict y = wb + c * ld;
                if (c < nc) {
                    const uint8_t *row = W + (g + c) * rb + b0 * qb;
                    /* the next group's blocks of this chunk: DRAM works while this group computes */
                    if (g + RLX_QF32_COLS + c < n1)
                        for (int64_t o = 0; o < kb * qb; o += 64)
                            __builtin_prefetch(row + RLX_QF32_COLS * rb + o, 0, 3);
                    for (int64_t b = 0; b < kb; b++)
                        rlx_q_dequant_block_ymm(fmt, row + b * qb, y + 32 * b);
                } else {
                    for (int64_t k = 0; k < kn; k++)
                        y[k] = 0.0f;
                }
            }
            const float *Xc = X + b0 * 32;
            const int first = b0 == 0;
            int64_t i = 0;
            /* 16 rows: 6 + 6 + 4, 13: 6 + 4 + 3, 8: 4 + 4 (the more rows a tile, the fewer loads a product) */
            for (; M - i >= 6 && M - i != 7 && M - i != 8; i += 6)
                rlx_qf32_rows(6, first, kn, Xc + i * K, K, wb, ld, acc + i * RLX_QF32_COLS);
            for (; M - i >= 4 && M - i != 5; i += 4)
                rlx_qf32_rows(4, first, kn, Xc + i * K, K, wb, ld, acc + i * RLX_QF32_COLS);
            switch (M - i) {
            case 5: rlx_qf32_rows(5, first, kn, Xc + i * K, K, wb, ld, acc + i * RLX_QF32_COLS); break;
            case 3: rlx_qf32_rows(3, first, kn, Xc + i * K, K, wb, ld, acc + i * RLX_QF32_COLS); break;
            case 2: rlx_qf32_rows(2, first, kn, Xc + i * K, K, wb, ld, acc + i * RLX_QF32_COLS); break;
            case 1:  /* eight independent accumulators hide the FMA latency */
                rlx_qf32_tile(1, 8, first, kn, Xc + i * K, K, wb, ld, acc + i * RLX_QF32_COLS); break;
            default: break;
            }
        }
        for (int64_t i = 0; i < M; i++)
            for (int c = 0; c < nc; c++)
                Y[i * N + g + c] = rlx_q_hsum256(acc[i * RLX_QF32_COLS + c]);
    }
}
#endif

/* Any format: dequantize the row into `wrow` (K floats, stays in L1) and dot it with X's rows. */
static inline __attribute__((always_inline)) void rlx_qdot_generic(const int fmt, const int qk, const int qb,
        int64_t mr, const float *restrict X, int64_t K, const uint8_t *restrict w, float *restrict wrow,
        float *out)
{
    rlx_q_dequant_row(fmt, qk, qb, w, K, wrow);
    for (int64_t i = 0; i < mr; i++) {
        const float *restrict x = X + i * K;
        float s = 0.0f;
        #pragma omp simd reduction(+:s)
        for (int64_t k = 0; k < K; k++)
            s += x[k] * wrow[k];
        out[i] = s;
    }
}

/* Y[i, n] for i < M (<= RLX_QDECODE_MAX_M), n in [n0, n1): weight rows of rb bytes, each multiplied
 * with RLX_QF32_TILE rows of X at a time (the SIMD kernels; RLX_QGEMV_MAX_M for the others) while it
 * sits in L1. */
static inline __attribute__((always_inline)) void rlx_qgemv(const int fmt, const int qk, const int qb, int64_t M,
        int64_t N, int64_t K, const float *X, const uint8_t *W, int64_t rb, float *Y,
        int64_t n0, int64_t n1, float *wrow)
{
    const int64_t nb = K / 32;
#ifdef RLX_QF32_AVX2
    if (fmt == RLX_Q8_0 || fmt == RLX_Q4_0 || fmt == RLX_Q4_1) {
        rlx_qgemv_avx2(fmt, M, N, K, X, W, rb, Y, n0, n1);
        return;
    }
#endif
#ifdef RLX_QSIMD
    if (fmt == RLX_Q8_0 || fmt == RLX_Q4_0 || fmt == RLX_Q4_1) {
        float out[RLX_QF32_TILE];
        for (int64_t n = n0; n < n1; n++)
            for (int64_t i0 = 0; i0 < M; i0 += RLX_QF32_TILE) {
                const int64_t mr = M - i0 < RLX_QF32_TILE ? M - i0 : RLX_QF32_TILE;
                const float *Xi = X + i0 * K;
                switch (mr) {  /* one instance per row count, so unused rows cost nothing */
#if RLX_QF32_TILE > 4
                case 8: rlx_qdot_simd(fmt, 8, nb, Xi, K, W + n * rb, out); break;
                case 7: rlx_qdot_simd(fmt, 7, nb, Xi, K, W + n * rb, out); break;
                case 6: rlx_qdot_simd(fmt, 6, nb, Xi, K, W + n * rb, out); break;
                case 5: rlx_qdot_simd(fmt, 5, nb, Xi, K, W + n * rb, out); break;
#endif
                case 4: rlx_qdot_simd(fmt, 4, nb, Xi, K, W + n * rb, out); break;
                case 3: rlx_qdot_simd(fmt, 3, nb, Xi, K, W + n * rb, out); break;
                case 2: rlx_qdot_simd(fmt, 2, nb, Xi, K, W + n * rb, out); break;
                default: rlx_qdot_simd(fmt, 1, nb, Xi, K, W + n * rb, out); break;
                }
                for (int64_t i = 0; i < mr; i++)
                    Y[(i0 + i) * N + n] = out[i];
            }
        return;
    }
#endif
    float out[RLX_QGEMV_MAX_M];
    (void)nb;
    for (int64_t n = n0; n < n1; n++)
        for (int64_t i0 = 0; i0 < M; i0 += RLX_QGEMV_MAX_M) {
            const int64_t mr = M - i0 < RLX_QGEMV_MAX_M ? M - i0 : RLX_QGEMV_MAX_M;
            rlx_qdot_generic(fmt, qk, qb, mr, X + i0 * K, K, W + n * rb, wrow, out);
            for (int64_t i = 0; i < mr; i++)
                Y[(i0 + i) * N + n] = out[i];
        }
}

/* ── prefill: one panel of RLX_QP weight rows, dequantized for the GEMM kernel ─ */

/* panel <- the nr (<= RLX_QP) weight rows at W (rb bytes apart), dequantized into the packed layout
 * (K rows of RLX_NR columns, zero-padded; without a micro-kernel row-major K x nr). `wrow`: K floats. */
static inline __attribute__((always_inline)) void rlx_q_dequant_panel(const int fmt, const int qk, const int qb,
        const uint8_t *W, int64_t rb, int64_t K, int64_t nr, float *restrict panel, float *restrict wrow)
{
#ifdef RLX_NR
    const int64_t ld = RLX_NR;  /* the packed layout: K rows of RLX_NR columns, zero-padded */
#else
    const int64_t ld = nr;  /* the fallback's row-major K x nr matrix */
#endif
    for (int64_t j = 0; j < ld; j++) {
        if (j < nr)
            rlx_q_dequant_row(fmt, qk, qb, W + j * rb, K, wrow);
        for (int64_t k = 0; k < K; k++)
            panel[k * ld + j] = j < nr ? wrow[k] : 0.0f;
    }
}

/* ── int8 activations (dequant_matmul act="q8"), as llama.cpp multiplies its quantized weights ──
 *
 * X is quantized once per call, per block of 32 values: d = max|x| / 127, q = rint(x / d) (round half
 * to even), exactly as rlx.ir.quant.quantize_act_q8. A block of the product is then the integer dot
 * product of the weight's 4/8-bit values with q (vpdpbusd with AVX-512 VNNI, pmaddubsw with AVX2),
 * scaled by dw * dx; q4_1's min adds m * (dx * sum q), q4_0's offset -8 subtracts 8 * dw * (dx * sum q).
 *
 * act="q16" (a16 below) quantizes to int16 instead (d = max|x| / 32767) and stores each q as two byte
 * planes, hi = q >> 8 (s8) and lo = q & 255 (u8): a block's dot product is 256 * (w . hi) + (w . lo),
 * two int8 dot products on the same unpacked weights, so it runs at nearly int8 speed with errors
 * 258x smaller (what the exact-math accuracy checks of the decoders need).
 *
 * Layout of the quantized rows (Xq: M rows of K bytes, or for q16 of 2K: the hi plane then the lo
 * plane; xds: M rows of nb (dx, dx * sum q) pairs):
 * with AVX-512 VNNI (RLX_Q8_ZMM) one 512-bit register holds two blocks, so the bytes are stored in the
 * order the weights unpack into: for q4_0 / q4_1, blocks 2p and 2p+1 as [2p: 0..15, 2p+1: 0..15,
 * 2p: 16..31, 2p+1: 16..31] (the low nibbles of both blocks, then the high ones; an odd last block
 * stays in order), and for q8_0 q + 128 as u8 (q16: hi + 128; vpdpbusd multiplies u8 by s8, the weights
 * are the signed side, and 128 * sum(w) is taken off again). Otherwise each block's 32 values in order. */

#if (defined(__x86_64__) || defined(__i386__)) && defined(__AVX512F__) && defined(__AVX512BW__) && \
    defined(__AVX512VL__) && defined(__AVX512VNNI__)
#define RLX_Q8_ZMM 1
#endif

/* Where value j (0..31) of block b (of nb) sits in a row of Xq for format fmt (plain: in order, for the
 * interleaved weights' kernels, kernels/quant_interleaved.h). */
static inline int64_t rlx_q8_pos(const int fmt, const int plain, int64_t b, int64_t nb, int j)
{
#ifdef RLX_Q8_ZMM
    if (!plain && fmt != RLX_Q8_0 && (b | 1) < nb)  /* a block of a complete pair */
        return (b & ~(int64_t)1) * 32 + (j < 16 ? 0 : 32) + (b & 1) * 16 + (j & 15);
#else
    (void)fmt;
    (void)plain;
    (void)nb;
#endif
    return b * 32 + j;
}

/* Xq (int8 [M, K], or for q16 (a16) [M, 2K], laid out as above, or in order if plain), xds[2 * (i * nb + b)] =
 * block scale, [... + 1] = scale * sum of the block's q. Plain q16 stores the low bytes minus 128 (signed). */
static void rlx_q8_quantize_rows(const int fmt, const int plain, const int a16, int64_t M, int64_t K, const float *restrict X,
                                 int8_t *restrict Xq, float *restrict xds)
{
    const int64_t nb = K / 32;
    const int lim = a16 ? 32767 : 127;
    for (int64_t i = 0; i < M; i++)
        for (int64_t b = 0; b < nb; b++) {
            const float *restrict x = X + i * K + b * 32;
            int8_t *restrict row = Xq + i * K * (a16 ? 2 : 1);
            int8_t *restrict lo = row + K;  /* q16's low bytes */
            const int64_t p0 = rlx_q8_pos(fmt, plain, b, nb, 0), p1 = rlx_q8_pos(fmt, plain, b, nb, 16);
#ifdef RLX_Q8_ZMM
            const __m512 x0 = _mm512_loadu_ps(x), x1 = _mm512_loadu_ps(x + 16);
            const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(x0), _mm512_abs_ps(x1)));
            const float d = amax / (float)lim, id = d != 0.0f ? 1.0f / d : 0.0f;
            const __m512i hi = _mm512_set1_epi32(lim), nlo = _mm512_set1_epi32(-lim);
            /* cvtps rounds to nearest even (the default MXCSR mode), as nearbyintf */
            __m512i q0 = _mm512_cvtps_epi32(_mm512_mul_ps(x0, _mm512_set1_ps(id)));
            __m512i q1 = _mm512_cvtps_epi32(_mm512_mul_ps(x1, _mm512_set1_ps(id)));
            q0 = _mm512_max_epi32(_mm512_min_epi32(q0, hi), nlo);
            q1 = _mm512_max_epi32(_mm512_min_epi32(q1, hi), nlo);
            const int sum = _mm512_reduce_add_epi32(_mm512_add_epi32(q0, q1));
            if (a16) {  /* vpmovdb truncates: the low bytes as they are (plain: minus 128), the high bytes from q >> 8 */
                const __m128i bias = _mm_set1_epi8(plain ? (char)0x80 : 0);
                _mm_storeu_si128((__m128i *)(lo + p0), _mm_xor_si128(_mm512_cvtepi32_epi8(q0), bias));
                _mm_storeu_si128((__m128i *)(lo + p1), _mm_xor_si128(_mm512_cvtepi32_epi8(q1), bias));
                q0 = _mm512_srai_epi32(q0, 8);
                q1 = _mm512_srai_epi32(q1, 8);
            }
            __m128i s0 = _mm512_cvtepi32_epi8(q0), s1 = _mm512_cvtepi32_epi8(q1);
            if (fmt == RLX_Q8_0) {  /* the u8 side of vpdpbusd: (high part of) q + 128 */
                s0 = _mm_xor_si128(s0, _mm_set1_epi8((char)0x80));
                s1 = _mm_xor_si128(s1, _mm_set1_epi8((char)0x80));
            }
            _mm_storeu_si128((__m128i *)(row + p0), s0);
            _mm_storeu_si128((__m128i *)(row + p1), s1);
#else
            float amax = 0.0f;
            for (int j = 0; j < 32; j++)
                amax = fmaxf(amax, fabsf(x[j]));
            const float d = amax / (float)lim, id = d != 0.0f ? 1.0f / d : 0.0f;
            int sum = 0;
            for (int j = 0; j < 32; j++) {
                float v = nearbyintf(x[j] * id);
                v = v > (float)lim ? (float)lim : (v < (float)-lim ? (float)-lim : v);
                const int q = (int)v, at = j < 16 ? (int)p0 + j : (int)p1 + j - 16;
                if (a16) {
                    row[at] = (int8_t)((q - (q & 255)) / 256);  /* floor(q / 256) */
                    lo[at] = (int8_t)(uint8_t)((q & 255) ^ (plain ? 0x80 : 0));
                } else {
                    row[at] = (int8_t)q;
                }
                sum += q;
            }
#endif
            xds[2 * (i * nb + b)] = d;
            xds[2 * (i * nb + b) + 1] = d * (float)sum;
        }
}

/* X' = the values the integer activation modes see, as floats: per block of 32, q * d with q and d
 * as rlx_q8_quantize_rows computes them (many rows take the dequantized-panel GEMM on X', so prefill
 * keeps f32 GEMM speed; the products are those of the quantized activations, with f32 rounding). */
void rlx_q_act_round_trip(const int a16, int64_t M, int64_t K, const float *restrict X, float *restrict XF)
{
    const float lim = a16 ? 32767.0f : 127.0f;
    for (int64_t r = 0; r < M * (K / 32); r++) {
        const float *restrict x = X + r * 32;  /* rows are dense, so block r of the flat array */
        float *restrict y = XF + r * 32;
#if (defined(__x86_64__) || defined(__i386__)) && defined(__AVX512F__)
        const __m512 x0 = _mm512_loadu_ps(x), x1 = _mm512_loadu_ps(x + 16);
        const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(x0), _mm512_abs_ps(x1)));
        const float d = amax / lim, id = d != 0.0f ? 1.0f / d : 0.0f;
        const __m512 vd = _mm512_set1_ps(d), vid = _mm512_set1_ps(id), hi = _mm512_set1_ps(lim);
        const __m512 lo = _mm512_set1_ps(-lim);
        /* round to nearest even, as nearbyintf; the clamp as in rlx_q8_quantize_rows */
        const __m512 q0 = _mm512_roundscale_ps(_mm512_mul_ps(x0, vid), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        const __m512 q1 = _mm512_roundscale_ps(_mm512_mul_ps(x1, vid), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        _mm512_storeu_ps(y, _mm512_mul_ps(_mm512_max_ps(_mm512_min_ps(q0, hi), lo), vd));
        _mm512_storeu_ps(y + 16, _mm512_mul_ps(_mm512_max_ps(_mm512_min_ps(q1, hi), lo), vd));
#else
        float amax = 0.0f;
        for (int j = 0; j < 32; j++)
            amax = fmaxf(amax, fabsf(x[j]));
        const float d = amax / lim, id = d != 0.0f ? 1.0f / d : 0.0f;
        for (int j = 0; j < 32; j++) {
            float v = nearbyintf(x[j] * id);
            v = v > lim ? lim : (v < -lim ? -lim : v);
            y[j] = v * d;
        }
#endif
    }
}

#ifdef RLX_Q8_ZMM
/* Blocks b and b+1 of row w into the accumulators (see rlx_q8dot_zmm). */
static inline __attribute__((always_inline)) void rlx_q8pair_zmm(const int fmt, const int a16, const int mr,
        int64_t b, int64_t nb, const int8_t *restrict Xq, int64_t K, const float *restrict xds,
        const uint8_t *restrict w, __m512 *acc, __m128 *macc)
{
    const int qb = fmt == RLX_Q8_0 ? 34 : fmt == RLX_Q4_0 ? 18 : 20;
    const int qo = fmt == RLX_Q4_1 ? 4 : 2;  /* where the quants start in a block */
    const __m512i low4 = _mm512_set1_epi8(0x0F), c128 = _mm512_set1_epi8((char)0x80);
    /* lane -> which float of [dw0 * dx0, ., dw1 * dx1, .] scales it */
    const __m512i spread = fmt == RLX_Q8_0
        ? _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 2, 2, 2, 2, 2, 2, 2, 2)
        : _mm512_setr_epi32(0, 0, 0, 0, 2, 2, 2, 2, 0, 0, 0, 0, 2, 2, 2, 2);
    const uint8_t *b0 = w + b * qb, *b1 = b0 + qb;
    /* the halves [dw0, mw0, dw1, mw1] (q4_1), [dw0, dw0, dw1, dw1] (q4_0), [dw0, -, dw1, -] (q8_0) */
    uint32_t h0, h1;
    memcpy(&h0, b0, 4);
    memcpy(&h1, b1, 4);
    if (fmt != RLX_Q4_1) {
        h0 = (h0 & 0xFFFFu) * (fmt == RLX_Q4_0 ? 0x10001u : 1u);
        h1 = (h1 & 0xFFFFu) * (fmt == RLX_Q4_0 ? 0x10001u : 1u);
    }
    const __m128 dm = _mm_cvtph_ps(_mm_setr_epi32((int)h0, (int)h1, 0, 0));
    __m512i wv;
    if (fmt == RLX_Q8_0) {
        wv = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(b0 + 2))),
                                _mm256_loadu_si256((const __m256i *)(b1 + 2)), 1);
    } else {
        const __m256i r = _mm256_inserti128_si256(
            _mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)(b0 + qo))),
            _mm_loadu_si128((const __m128i *)(b1 + qo)), 1);
        wv = _mm512_and_si512(_mm512_inserti64x4(_mm512_castsi256_si512(r), _mm256_srli_epi16(r, 4), 1), low4);
    }
    for (int i = 0; i < RLX_QGEMV_MAX_M; i++)
        if (i < mr) {
            const int8_t *xr = Xq + i * K * (a16 ? 2 : 1) + b * 32;
            const __m512i xq = _mm512_loadu_si512((const void *)xr);
            /* [dw0 * dx0, mw0 * sx0, dw1 * dx1, mw1 * sx1] (q4_0: dw * sx in the odd lanes) */
            const __m128 s = _mm_mul_ps(dm, _mm_loadu_ps(xds + 2 * (i * nb + b)));
            __m512i dot;
            if (fmt == RLX_Q8_0)  /* (q + 128) . w - 128 . w */
                dot = _mm512_sub_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), xq, wv),
                                       _mm512_dpbusd_epi32(_mm512_setzero_si512(), c128, wv));
            else
                dot = _mm512_dpbusd_epi32(_mm512_setzero_si512(), wv, xq);
            if (a16)  /* 256 * (w . hi) + (lo . w): lo is the u8 side, the weights (q4_x: 0..15) the s8 side */
                dot = _mm512_dpbusd_epi32(_mm512_slli_epi32(dot, 8), _mm512_loadu_si512((const void *)(xr + K)), wv);
            const __m512 sc = _mm512_permutexvar_ps(spread, _mm512_castps128_ps512(s));
            acc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), sc, acc[i]);
            if (fmt != RLX_Q8_0)
                macc[i] = _mm_add_ps(macc[i], s);
        }
}
#endif

#if (defined(__x86_64__) || defined(__i386__)) && defined(__AVX2__)
/* One q8_0/q4_0/q4_1 block's 32 quants as bytes (q4_x nibbles widened to u8 0..15, q8_0 as s8), its
 * scale dw and the factor of its min term cw (q4_1's m, q4_0's -8 * dw: exact, a power of two). */
static inline __attribute__((always_inline)) __m256i rlx_q_block_ymm(const int fmt, const uint8_t *blk, float *dw,
                                                                     float *cw)
{
    *dw = rlx_q_half(blk);
    *cw = fmt == RLX_Q4_1 ? rlx_q_half(blk + 2) : -8.0f * *dw;
    if (fmt == RLX_Q8_0)
        return _mm256_loadu_si256((const __m256i *)(blk + 2));
    const __m128i low4 = _mm_set1_epi8(0x0F);
    const __m128i raw = _mm_loadu_si128((const __m128i *)(blk + (fmt == RLX_Q4_1 ? 4 : 2)));
    return _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(raw, 4), low4), _mm_and_si128(raw, low4));
}
#endif

#ifdef RLX_Q8_ZMM
/* Row w (nb blocks) against activation rows i < mr, two blocks per 512-bit register: the weight's
 * 64 values (u8 nibbles for q4_x, s8 for q8_0) meet 64 activation bytes in one vpdpbusd, whose 16
 * int32 lanes hold 4-product partial sums of one block each (q4_x: lanes 0-3 and 8-11 block 2p,
 * 4-7 and 12-15 block 2p+1; q8_0: 0-7 and 8-15). The lanes are scaled by their block's dw * dx
 * (f32) and accumulated in f32; the min terms accumulate in a 4-float vector beside it. */
static inline __attribute__((always_inline)) void rlx_q8dot_zmm(const int fmt, const int a16, const int mr,
        int64_t nb, const int8_t *restrict Xq, int64_t K, const float *restrict xds, const uint8_t *restrict w,
        float *out)
{
    const int qb = fmt == RLX_Q8_0 ? 34 : fmt == RLX_Q4_0 ? 18 : 20;
    const __m256i c128 = _mm256_set1_epi8((char)0x80);
    __m512 acc[RLX_QGEMV_MAX_M], acc2[RLX_QGEMV_MAX_M];
    __m128 macc[RLX_QGEMV_MAX_M];
    for (int i = 0; i < RLX_QGEMV_MAX_M; i++)
        if (i < mr) {
            acc[i] = acc2[i] = _mm512_setzero_ps();
            macc[i] = _mm_setzero_ps();
        }
    int64_t b = 0;
    for (; b + 3 < nb; b += 4) {  /* alternate pairs: two dependency chains */
        rlx_q8pair_zmm(fmt, a16, mr, b, nb, Xq, K, xds, w, acc, macc);
        rlx_q8pair_zmm(fmt, a16, mr, b + 2, nb, Xq, K, xds, w, acc2, macc);
    }
    if (b + 1 < nb) {
        rlx_q8pair_zmm(fmt, a16, mr, b, nb, Xq, K, xds, w, acc, macc);
        b += 2;
    }
    float tail[RLX_QGEMV_MAX_M];
    for (int i = 0; i < RLX_QGEMV_MAX_M; i++)
        if (i < mr)
            tail[i] = 0.0f;
    if (b < nb) {  /* an odd last block, its activations in order */
        float dw, cw;
        const __m256i wq = rlx_q_block_ymm(fmt, w + b * qb, &dw, &cw);
        for (int i = 0; i < RLX_QGEMV_MAX_M; i++)
            if (i < mr) {
                const int8_t *xr = Xq + i * K * (a16 ? 2 : 1) + b * 32;
                const __m256i xq = _mm256_loadu_si256((const __m256i *)xr);
                __m256i dot;
                if (fmt == RLX_Q8_0)
                    dot = _mm256_sub_epi32(_mm256_dpbusd_epi32(_mm256_setzero_si256(), xq, wq),
                                           _mm256_dpbusd_epi32(_mm256_setzero_si256(), c128, wq));
                else
                    dot = _mm256_dpbusd_epi32(_mm256_setzero_si256(), wq, xq);
                if (a16)
                    dot = _mm256_dpbusd_epi32(_mm256_slli_epi32(dot, 8), _mm256_loadu_si256((const __m256i *)(xr + K)), wq);
                const __m128i d4 = _mm_add_epi32(_mm256_castsi256_si128(dot), _mm256_extracti128_si256(dot, 1));
                const __m128i d2 = _mm_add_epi32(d4, _mm_unpackhi_epi64(d4, d4));
                const int isum = _mm_cvtsi128_si32(_mm_add_epi32(d2, _mm_shuffle_epi32(d2, 1)));
                tail[i] = (float)isum * (dw * xds[2 * (i * nb + b)]);
                if (fmt != RLX_Q8_0)
                    tail[i] += cw * xds[2 * (i * nb + b) + 1];
            }
    }
    for (int i = 0; i < RLX_QGEMV_MAX_M; i++)
        if (i < mr) {
            float r = _mm512_reduce_add_ps(_mm512_add_ps(acc[i], acc2[i])) + tail[i];
            if (fmt != RLX_Q8_0) {
                float m4[4];
                _mm_storeu_ps(m4, macc[i]);
                r += fmt == RLX_Q4_1 ? m4[1] + m4[3] : -8.0f * (m4[1] + m4[3]);
            }
            out[i] = r;
        }
}
#endif

#if (defined(__x86_64__) || defined(__i386__)) && defined(__AVX2__)
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
#define RLX_DPBUSD(acc, u, s) _mm256_dpbusd_epi32((acc), (u), (s))
#elif defined(__AVXVNNI__)
#define RLX_DPBUSD(acc, u, s) _mm256_dpbusd_avx_epi32((acc), (u), (s))
#else  /* pairs of u8 x s8 products fit int16 here: |w| <= 128 and |q| <= 127 */
#define RLX_DPBUSD(acc, u, s) _mm256_add_epi32((acc), _mm256_madd_epi16(_mm256_maddubs_epi16((u), (s)), \
                                                                         _mm256_set1_epi16(1)))
#endif
static inline float rlx_q8_hsum(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* Block b of row w into the accumulators: the integer dot product scaled by dw * dx per lane (acc),
 * the min term (sacc). */
static inline __attribute__((always_inline)) void rlx_q8blk(const int fmt, const int mr, int64_t b, int64_t nb,
        const int8_t *restrict Xq, int64_t K, const float *restrict xds, const uint8_t *restrict w, __m256 *acc,
        float *sacc)
{
    const int qb = fmt == RLX_Q8_0 ? 34 : fmt == RLX_Q4_0 ? 18 : 20;
    float dw, cw;
    const __m256i wq = rlx_q_block_ymm(fmt, w + b * qb, &dw, &cw);
    /* u8 x s8: q8_0's signed weights as |w| with their sign moved onto the activations */
    const __m256i u = fmt == RLX_Q8_0 ? _mm256_sign_epi8(wq, wq) : wq;
    for (int i = 0; i < RLX_QGEMV_MAX_M; i++)
        if (i < mr) {
            const __m256i xq = _mm256_loadu_si256((const __m256i *)(Xq + i * K + b * 32));
            const __m256i s = fmt == RLX_Q8_0 ? _mm256_sign_epi8(xq, wq) : xq;
            const __m256i dot = RLX_DPBUSD(_mm256_setzero_si256(), u, s);
            acc[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), _mm256_set1_ps(dw * xds[2 * (i * nb + b)]), acc[i]);
            if (fmt != RLX_Q8_0)
                sacc[i] += cw * xds[2 * (i * nb + b) + 1];
        }
}
#endif

/* out[i] = row w (nb blocks) . activation rows i < mr (quantized: Xq rows of K, block scales and sums
 * xds); even and odd blocks in separate accumulators (two dependency chains). */
static inline __attribute__((always_inline)) void rlx_q8dot(const int fmt, const int a16, const int mr, int64_t nb,
        const int8_t *restrict Xq, int64_t K, const float *restrict xds, const uint8_t *restrict w, float *out)
{
#if defined(RLX_Q8_ZMM)
    rlx_q8dot_zmm(fmt, a16, mr, nb, Xq, K, xds, w, out);
#else
#if (defined(__x86_64__) || defined(__i386__)) && defined(__AVX2__)
    if (!a16) {  /* q16 without AVX-512 VNNI takes the portable loop below */
    __m256 acc[RLX_QGEMV_MAX_M], acc2[RLX_QGEMV_MAX_M];
    float sacc[RLX_QGEMV_MAX_M], sacc2[RLX_QGEMV_MAX_M];
    for (int i = 0; i < RLX_QGEMV_MAX_M; i++)
        if (i < mr) {
            acc[i] = acc2[i] = _mm256_setzero_ps();
            sacc[i] = sacc2[i] = 0.0f;
        }
    int64_t b = 0;
    for (; b + 1 < nb; b += 2) {
        rlx_q8blk(fmt, mr, b, nb, Xq, K, xds, w, acc, sacc);
        rlx_q8blk(fmt, mr, b + 1, nb, Xq, K, xds, w, acc2, sacc2);
    }
    if (b < nb)
        rlx_q8blk(fmt, mr, b, nb, Xq, K, xds, w, acc, sacc);
    for (int i = 0; i < RLX_QGEMV_MAX_M; i++)
        if (i < mr)
            out[i] = rlx_q8_hsum(_mm256_add_ps(acc[i], acc2[i])) + (sacc[i] + sacc2[i]);
    return;
    }
#endif
    const int qb = fmt == RLX_Q8_0 ? 34 : fmt == RLX_Q4_0 ? 18 : 20;
    float facc[RLX_QGEMV_MAX_M], sacc[RLX_QGEMV_MAX_M];
    for (int i = 0; i < mr; i++)
        facc[i] = sacc[i] = 0.0f;
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *blk = w + b * qb;
        const float dw = rlx_q_half(blk);
        const float cw = fmt == RLX_Q4_1 ? rlx_q_half(blk + 2) : -8.0f * dw;
        int wq[32];
        for (int j = 0; j < 16; j++) {
            if (fmt == RLX_Q8_0) {
                wq[j] = (int8_t)blk[2 + j];
                wq[j + 16] = (int8_t)blk[18 + j];
            } else {
                const uint8_t byte = blk[(fmt == RLX_Q4_1 ? 4 : 2) + j];
                wq[j] = byte & 0x0F;
                wq[j + 16] = byte >> 4;
            }
        }
        for (int i = 0; i < mr; i++) {
            const int8_t *xq = Xq + i * K * (a16 ? 2 : 1) + b * 32;
            int dot = 0;
            for (int j = 0; j < 32; j++)
                dot += wq[j] * (a16 ? (int)xq[j] * 256 + (int)(uint8_t)xq[K + j] : (int)xq[j]);
            facc[i] += (float)dot * (dw * xds[2 * (i * nb + b)]);
            if (fmt != RLX_Q8_0)
                sacc[i] += cw * xds[2 * (i * nb + b) + 1];
        }
    }
    for (int i = 0; i < mr; i++)
        out[i] = facc[i] + sacc[i];
#endif
}

/* Y[:, n0:n1] with int8 activations: blocks of up to RLX_Q8_ROWS rows of Xq stay in L1 while the
 * thread's weight rows pass by, four rows of Xq at a time per weight row. */
#define RLX_Q8_ROWS 32
/* How far ahead of the row being multiplied the weight is prefetched, in bytes (the GEMV streams the
 * weight once; without it a row's loads wait on DRAM: the hardware prefetcher stays behind). */
#define RLX_Q8_PREFETCH_BYTES 4096
static inline __attribute__((always_inline)) void rlx_q8gemm(const int fmt, const int a16, int64_t M, int64_t N, int64_t K,
        const int8_t *Xq, const float *xds, const uint8_t *W, int64_t rb, float *Y, int64_t n0, int64_t n1)
{
    const int64_t nb = K / 32, ahead = (RLX_Q8_PREFETCH_BYTES + rb - 1) / rb;
    float out[RLX_QGEMV_MAX_M];
    for (int64_t r0 = 0; r0 < M; r0 += RLX_Q8_ROWS) {
        const int64_t r1 = r0 + RLX_Q8_ROWS < M ? r0 + RLX_Q8_ROWS : M;
        for (int64_t n = n0; n < n1; n++) {
            if (n + ahead < n1)  /* keep DRAM busy while the integer products run */
                for (int64_t o = 0; o < rb; o += 64)
                    __builtin_prefetch(W + (n + ahead) * rb + o, 0, 3);
            for (int64_t i = r0; i < r1; i += RLX_QGEMV_MAX_M) {
                const int64_t mr = r1 - i < RLX_QGEMV_MAX_M ? r1 - i : RLX_QGEMV_MAX_M;
                const int8_t *xq = Xq + i * K * (a16 ? 2 : 1);
                const float *ds = xds + 2 * i * nb;
                switch (mr) {
                case 4: rlx_q8dot(fmt, a16, 4, nb, xq, K, ds, W + n * rb, out); break;
                case 3: rlx_q8dot(fmt, a16, 3, nb, xq, K, ds, W + n * rb, out); break;
                case 2: rlx_q8dot(fmt, a16, 2, nb, xq, K, ds, W + n * rb, out); break;
                default: rlx_q8dot(fmt, a16, 1, nb, xq, K, ds, W + n * rb, out); break;
                }
                for (int64_t j = 0; j < mr; j++)
                    Y[(i + j) * N + n] = out[j];
            }
        }
    }
}

#endif /* RLX_KERNELS_QUANT_KERNELS_H */

/* f32 GEMMs on weights kept in bf16 / f16: C = A @ B (+ bias, act), A and C f32, B a param stored
 * packed in its own precision (needs kernels/half.h, kernels/gemm.h, kernels/threads.h and
 * kernels/packed_gemm.h, whose f32 micro-kernel and epilogue it reuses).
 * A fixed RLX kernel header: no template code; included by generated files that need it.
 *
 * Packed layout of one K x N matrix (Kp = K rounded up to even): ceil(N / 32) panels of 32 columns,
 * Kp x 32 values each (64 bytes per k row, so panels stay cache-line aligned), zeros past K and N.
 *
 *   bf16: pairs of k interleaved, as vdpbf16ps reads them: element (k, j) of a panel at
 *         (k / 2) * 64 + 2 * j + k % 2, so 32-bit lane j of a 64-byte row is (B[k+1][j], B[k][j]).
 *   f16:  row by row: element (k, j) at k * 32 + j.
 *
 * Kernels, picked by the instruction set this file is compiled for:
 *
 *   bf16 with AVX512_BF16: the rows of A a tile needs are rounded to bf16 once per thread (round to
 *     nearest even: bf16 compute), and a 12 x 32 micro-kernel multiplies pairs of k with
 *     vdpbf16ps, accumulating in f32 (each bf16 x bf16 product is exact in f32; the instruction
 *     treats subnormal inputs and results as zero).
 *   f16 with AVX-512, tiles of few rows: the f32 12 x 32 micro-kernel, each k row of the panel
 *     widened in registers (vcvtph2ps, exact): the f32 GEMM on the stored weights.
 *   otherwise (taller f16 tiles; bf16 without AVX512_BF16): each tile's panel is widened exactly to f32
 *     (F16C vcvtph2ps for f16, a 16-bit shift for bf16) into the thread's scratch, in packed_gemm.h's
 *     panel layout, and the f32 micro-kernel multiplies it; A stays f32, so the result is the f32
 *     GEMM on the stored weights. Without AVX2 the widened panel goes to rlx_sgemm1.
 *
 * Threads take contiguous ranges of tiles (up to `mc` rows x one 32-column panel, row blocks
 * outermost), as the f32 packed GEMM does. */
#ifndef RLX_KERNELS_GEMM_BF16_H
#define RLX_KERNELS_GEMM_BF16_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#if defined(__AVX512F__) || defined(__AVX2__) || defined(__F16C__)
#include <immintrin.h>
#endif

/* Columns per half panel: RLX_PACK_NR_MAX, whatever kernel the ISA has (storage is ISA-free). */
#define RLX_HNR 32

#if defined(RLX_NR) && RLX_NR == 32 && defined(__AVX512BF16__) && defined(__AVX512BW__) && defined(__AVX512VL__)
#define RLX_BF16_DOT 1
#endif

/* dst <- B (K x N, B[k, n] = src[k * sk + n * sn]) in the layout above; `pairs`: the bf16 layout. */
static void rlx_pack_b_half(uint16_t *restrict dst, const uint16_t *restrict src, int64_t K, int64_t N, int64_t sk,
                            int64_t sn, int pairs)
{
    const int64_t Kp = (K + 1) & ~(int64_t)1;
    for (int64_t p0 = 0; p0 < N; p0 += RLX_HNR, dst += Kp * RLX_HNR) {
        const int64_t w = N - p0 < RLX_HNR ? N - p0 : RLX_HNR;
        memset(dst, 0, (size_t)(Kp * RLX_HNR) * sizeof(uint16_t));
        for (int64_t k = 0; k < K; k++) {
            const uint16_t *restrict in = src + k * sk + p0 * sn;
            uint16_t *restrict out = pairs ? dst + (k >> 1) * (2 * RLX_HNR) + (k & 1) : dst + k * RLX_HNR;
            const int step = pairs ? 2 : 1;
            for (int64_t j = 0; j < w; j++)
                out[j * step] = in[j * sn];
        }
    }
}

/* set_param of a packed f16/bf16 param: `batch` matrices, each K x N read with strides (sk, sn) and
 * the batch axes' strides (elements of the user array), stored Kp x round_up(N, 32) apart. */
static void rlx_pack_param_half(uint16_t *dst, const uint16_t *src, int nbatch_axes, const int64_t *dims,
                                const int64_t *strides, int pairs)
{
    const int64_t K = dims[nbatch_axes], N = dims[nbatch_axes + 1];
    const int64_t stride = (N + RLX_HNR - 1) / RLX_HNR * RLX_HNR * ((K + 1) & ~(int64_t)1);
    const int64_t count = rlx_batch_count(nbatch_axes, dims);
    for (int64_t b = 0; b < count; b++)
        rlx_pack_b_half(dst + b * stride, src + rlx_batch_offset(b, nbatch_axes, dims, strides), K, N,
                        strides[nbatch_axes], strides[nbatch_axes + 1], pairs);
}

/* Work units of an M x N product: tiles of `mc` rows x one half panel, row blocks outermost. */
static inline int64_t rlx_hgemm_tiles(int64_t M, int64_t N, int64_t mc)
{
    return (M + mc - 1) / mc * ((N + RLX_HNR - 1) / RLX_HNR);
}

/* ── the exact path: a panel widened to f32, multiplied by the f32 kernel ─────────── */

#ifdef RLX_NR
#define RLX_WNR RLX_NR
#else
#define RLX_WNR RLX_HNR
#endif

/* 16 columns [c, c + 16) of k row(s) of a panel, widened. f16: row k into out0. bf16: the pair row
 * holding k and k + 1 into out0 and out1 (out1 NULL when k + 1 == K). */
static inline void rlx_widen16(float *restrict out0, float *restrict out1, const uint16_t *restrict in, int pairs)
{
    if (pairs) {
#if defined(__AVX512F__)
        const __m512i v = _mm512_loadu_si512((const void *)in);
        _mm512_storeu_ps(out0, _mm512_castsi512_ps(_mm512_slli_epi32(v, 16)));
        if (out1)
            _mm512_storeu_ps(out1, _mm512_castsi512_ps(_mm512_and_si512(v, _mm512_set1_epi32((int)0xffff0000u))));
#elif defined(__AVX2__)
        for (int h = 0; h < 2; h++) {
            const __m256i v = _mm256_loadu_si256((const __m256i *)(in + 16 * h));
            _mm256_storeu_ps(out0 + 8 * h, _mm256_castsi256_ps(_mm256_slli_epi32(v, 16)));
            if (out1)
                _mm256_storeu_ps(out1 + 8 * h,
                                 _mm256_castsi256_ps(_mm256_and_si256(v, _mm256_set1_epi32((int)0xffff0000u))));
        }
#else
        for (int j = 0; j < 16; j++) {
            out0[j] = rlx_bf2f(in[2 * j]);
            if (out1)
                out1[j] = rlx_bf2f(in[2 * j + 1]);
        }
#endif
    } else {
#if defined(__AVX512F__)
        _mm512_storeu_ps(out0, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)in)));
#elif defined(__F16C__)
        _mm256_storeu_ps(out0, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)in)));
        _mm256_storeu_ps(out0 + 8, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(in + 8))));
#else
        for (int j = 0; j < 16; j++)
            out0[j] = rlx_h2f(in[j]);
#endif
    }
}

/* One 32-column half panel as f32 in the f32 kernel's layout: 32 / RLX_WNR panels of K x RLX_WNR. */
static void rlx_widen_panel(float *restrict dst, const uint16_t *restrict panel, int64_t K, int pairs)
{
    for (int c = 0; c < RLX_HNR; c += 16) {
        float *restrict sub = dst + (int64_t)(c / RLX_WNR) * K * RLX_WNR + c % RLX_WNR;
        if (pairs) {
            for (int64_t k = 0; k < K; k += 2)
                rlx_widen16(sub + k * RLX_WNR, k + 1 < K ? sub + (k + 1) * RLX_WNR : NULL,
                            panel + (k >> 1) * (2 * RLX_HNR) + 2 * c, 1);
        } else {
            for (int64_t k = 0; k < K; k++)
                rlx_widen16(sub + k * RLX_WNR, NULL, panel + k * RLX_HNR + c, 0);
        }
    }
}

#if defined(RLX_NR) && RLX_NR == 32
#include "kernels/tile_store.h"

/* ── the half micro-kernels: f16 widened in registers, bf16 pairs on vdpbf16ps ──────── */

#define RLX_F16_DIRECT 1
/* Up to this many rows a tile widens f16 in registers (each 12-row piece converts the panel again);
 * taller tiles widen the panel once into scratch, then run the f32 kernel: at 1024 rows that
 * took ~1.1x the f32 weights' time where converting in registers took ~1.17x, at 16 rows the
 * registers are as fast as f32 (2 Zen 4 cores; benchmarks/half_gemm.py). */
#define RLX_F16_DIRECT_ROWS 24

/* c + a * b: an f32 FMA (f16: a an f32 broadcast, b a widened f16 row), or with `bf16`
 * vdpbf16ps (a a broadcast bf16 pair of A, b a pair row of the panel; exact products, f32 sums). */
static inline __attribute__((always_inline)) __m512 rlx_half_madd(const int bf16, __m512 a, __m512 b, __m512 c)
{
#ifdef RLX_BF16_DOT
    if (bf16)
        return _mm512_dpbf16_ps(c, (__m512bh)a, (__m512bh)b);
#else
    (void)bf16;
#endif
    return _mm512_fmadd_ps(a, b, c);
}

/* C[0:mr, 0:nr] (+)= A[0:mr, :] @ panel (+ bias), `steps` steps of the panel: the contract of
 * packed_gemm.h's rlx_kernel_tile.
 *   f16 (bf16 == 0): A f32, one k per step; each panel row of 32 f16 widened (vcvtph2ps: exact),
 *     so this is the f32 GEMM on the stored weights without a widened copy.
 *   bf16: A bf16 rows, one pair of k per step (a 64-byte pair row of the panel, 2 x 32 values),
 *     multiplied with vdpbf16ps. */
static inline __attribute__((always_inline)) void rlx_half_tile(const int bf16, const int mr, const int prefetch,
        int64_t steps, const void *restrict A, int64_t lda, const uint16_t *restrict Bp, float *restrict C,
        int64_t ldc, int64_t nr, const float *restrict bias, int accumulate)
{
    __m512 c0[RLX_MR], c1[RLX_MR];
    #pragma GCC unroll 12
    for (int i = 0; i < RLX_MR; i++)
        if (i < mr) {
            c0[i] = _mm512_setzero_ps();
            c1[i] = _mm512_setzero_ps();
        }
    for (int64_t p = 0; p < steps; p++) {
        const uint16_t *row = Bp + p * (bf16 ? 2 * RLX_HNR : RLX_HNR);
        __m512 b0, b1;
        if (prefetch)
            _mm_prefetch((const char *)row + RLX_PF_BYTES, _MM_HINT_T0);
        if (bf16) {
            if (prefetch)
                _mm_prefetch((const char *)row + RLX_PF_BYTES + 64, _MM_HINT_T0);
            b0 = _mm512_castsi512_ps(_mm512_load_si512((const void *)row));
            b1 = _mm512_castsi512_ps(_mm512_load_si512((const void *)(row + RLX_HNR)));
        } else {
            b0 = _mm512_cvtph_ps(_mm256_load_si256((const __m256i *)row));
            b1 = _mm512_cvtph_ps(_mm256_load_si256((const __m256i *)(row + 16)));
        }
        #pragma GCC unroll 12
        for (int i = 0; i < RLX_MR; i++)
            if (i < mr) {
                __m512 a;
                if (bf16) {
                    int32_t pair;
                    memcpy(&pair, (const uint16_t *)A + i * lda + 2 * p, sizeof pair);
                    a = _mm512_castsi512_ps(_mm512_set1_epi32(pair));
                } else {
                    a = _mm512_set1_ps(((const float *)A)[i * lda + p]);
                }
                c0[i] = rlx_half_madd(bf16, a, b0, c0[i]);
                c1[i] = rlx_half_madd(bf16, a, b1, c1[i]);
            }
    }
    rlx_tile_store_512(mr, c0, c1, C, ldc, nr, bias, accumulate);
}

/* mr rows as pieces of 12, 8, 4, 2 and 1 (as rlx_kernel: the tile's instances), A rows of floats
 * (f16) or bf16 values (bf16); only the first piece prefetches (it brings the panel in). */
static inline __attribute__((always_inline)) void rlx_half_pieces(const int bf16, int64_t mr, int prefetch,
        int64_t steps, const void *A, int64_t lda, const uint16_t *Bp, float *C, int64_t ldc, int64_t nr,
        const float *bias, int accumulate)
{
#define RLX_HALF_CASE(R)                                                                       \
    case R:                                                                                    \
        if (prefetch)                                                                          \
            rlx_half_tile(bf16, R, 1, steps, A, lda, Bp, C, ldc, nr, bias, accumulate);        \
        else                                                                                   \
            rlx_half_tile(bf16, R, 0, steps, A, lda, Bp, C, ldc, nr, bias, accumulate);        \
        break;
    while (mr > 0) {
        const int64_t r = mr >= 12 ? 12 : mr >= 8 ? 8 : mr >= 4 ? 4 : mr >= 2 ? 2 : 1;
        switch (r) {
        RLX_HALF_CASE(12)
        RLX_HALF_CASE(8)
        RLX_HALF_CASE(4)
        RLX_HALF_CASE(2)
        default:
        RLX_HALF_CASE(1)
        }
        A = bf16 ? (const void *)((const uint16_t *)A + r * lda) : (const void *)((const float *)A + r * lda);
        C += r * ldc;
        mr -= r;
        prefetch = 0;
    }
#undef RLX_HALF_CASE
}

static void rlx_f16_kernel(int64_t mr, int prefetch, int64_t kc, const float *A, int64_t lda, const uint16_t *Bp,
                           float *C, int64_t ldc, int64_t nr, const float *bias, int accumulate)
{
    rlx_half_pieces(0, mr, prefetch, kc, A, lda, Bp, C, ldc, nr, bias, accumulate);
}

#ifdef RLX_BF16_DOT
/* kp pairs of k: A the bf16 rows of rlx_round_rows_bf16. */
static void rlx_bf16_kernel(int64_t mr, int prefetch, int64_t kp, const uint16_t *A, int64_t lda,
                            const uint16_t *Bp, float *C, int64_t ldc, int64_t nr, const float *bias, int accumulate)
{
    rlx_half_pieces(1, mr, prefetch, kp, A, lda, Bp, C, ldc, nr, bias, accumulate);
}

/* rows x K of A rounded to bf16 (nearest even) into dst, ld = Kp (a zero pads an odd K). */
static void rlx_round_rows_bf16(uint16_t *restrict dst, int64_t Kp, const float *restrict A, int64_t lda,
                                int64_t rows, int64_t K)
{
    for (int64_t i = 0; i < rows; i++) {
        const float *restrict a = A + i * lda;
        uint16_t *restrict d = dst + i * Kp;
        for (int64_t k = 0; k < K; k += 16) {
            const __mmask16 m = K - k >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (K - k)) - 1u);
            const __m256bh h = _mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(m, a + k));
            _mm256_mask_storeu_epi16((void *)(d + k), m, (__m256i)h);
        }
        if (K & 1)
            d[K] = 0;
    }
}

#include "kernels/amx.h"
#if defined(RLX_AMX_TILE) && defined(__AMX_BF16__)
/* ── bf16 products on the AMX tile unit ──────────────────────────────────────────────
 * Where the build has AMX-BF16 and Linux grants the tile state, every bf16 GEMM whose K is a multiple of 32
 * multiplies on the tile unit, whatever its row count (so a row's values never depend on how many rows a call
 * has): 32 x 32 blocks of C as four 16 x 16 f32 tiles, A's bf16 rows (rlx_round_rows_bf16's, 16 rows x 32 k a
 * tile) against the packed panel read in place (a pair row is 128 bytes: columns 0-15 are a B tile's row with
 * a 128-byte stride, columns 16-31 the next 64 bytes), K accumulated in the tiles. TDPBF16PS rounds as
 * vdpbf16ps does (nearest even, subnormals as zero) but adds a pair's two products in the other order, so its
 * sums differ from the vector path's in the last bits. */
#define RLX_BF16_AMX 1

/* C[0:rows, 0:nr] = A[0:rows, 0:Kp] @ panel (+ bias[0:nr]), then act. A: bf16 rows Kp apart, zeros from row
 * `rows` to the next multiple of 32 (read, never stored); Kp a multiple of 32. `few`: the tiles configured for
 * rows < 16 (rlx_amx_begin), so one chunk on tiles 0, 1, 4, 6 and 7. */
static void rlx_bf16_amx_rows(int64_t rows, int64_t nr, int64_t Kp, const uint16_t *A, const uint16_t *panel,
                              float *C, int64_t ldc, const float *bias, int act, int few)
{
    float cb[32 * 32] __attribute__((aligned(64)));
    const __mmask16 m0 = rlx_panel_mask(nr, 0), m1 = rlx_panel_mask(nr, 1);
    const __m512 b0 = bias ? _mm512_maskz_loadu_ps(m0, bias) : _mm512_setzero_ps();
    const __m512 b1 = bias && m1 ? _mm512_maskz_loadu_ps(m1, bias + 16) : _mm512_setzero_ps();
    for (int64_t r0 = 0; r0 < rows; r0 += 32) {
        /* k in steps of 32: 64 bytes of A's rows, 16 pair rows (128 bytes each) of the panel */
        rlx_amx_block(RLX_AMX_BF16, !few, Kp / 32, (const char *)(A + r0 * Kp), Kp * 2, 64, (const char *)panel,
                      4 * RLX_HNR, 16 * 4 * RLX_HNR, 2 * RLX_HNR, cb);
        const int64_t mr = rows - r0 < 32 ? rows - r0 : 32;
        float *c = C + r0 * ldc;
        for (int64_t i = 0; i < mr; i++) {  /* the sum, then the bias (as rlx_tile_store_512) */
            _mm512_mask_storeu_ps(c + i * ldc, m0, _mm512_add_ps(_mm512_load_ps(cb + 32 * i), b0));
            if (m1)
                _mm512_mask_storeu_ps(c + i * ldc + 16, m1, _mm512_add_ps(_mm512_load_ps(cb + 32 * i + 16), b1));
        }
        if (act != RLX_EPI_NONE)
            rlx_epilogue_act(c, ldc, mr, nr, act);
    }
}
#endif /* AMX-BF16 */
#endif /* RLX_BF16_DOT */
#endif /* RLX_NR == 32 */

#ifdef RLX_NR
/* Micro-kernels the tile loop below runs. */
enum { RLX_HK_F32 = 0, RLX_HK_F16 = 1, RLX_HK_BF16 = 2 };

/* C[i0:i1, j0:j0+nr] (+ bias[j0:], then act) of one tile: RLX_MR rows at a time, K in slices of
 * RLX_KC (partial sums through C, the bias with the last slice) — the loop every path shares.
 * `kind`: RLX_HK_F32, rlx_kernel on an f32 panel (RLX_NR wide, K x RLX_NR); RLX_HK_F16, the f16
 * panel under f32 rows of A; RLX_HK_BF16, the bf16 pair panel under bf16 rows of A, K then Kp.
 * A points at row i0 (floats, or bf16 values for RLX_HK_BF16), lda its row step. */
static void rlx_hgemm_rows(int kind, int64_t i0, int64_t i1, int64_t j0, int64_t nr, int64_t K, const void *A,
                           int64_t lda, const void *panel, float *C, int64_t ldc, const float *bias, int act)
{
    const float *bs = bias ? bias + j0 : NULL;
    for (int64_t i = i0; i < i1; i += RLX_MR) {
        const int64_t mr = i1 - i < RLX_MR ? i1 - i : RLX_MR;
        float *c = C + i * ldc + j0;
        /* the half kernels prefetch the panel on each tile's first rows; the widened one is hot already */
        const int prefetch = kind != RLX_HK_F32 && i == i0;
        /* K = 0 runs one empty slice: C = bias (or 0) */
        for (int64_t k0 = 0; k0 < K || (K == 0 && k0 == 0); k0 += RLX_KC) {
            const int64_t kc = K - k0 < RLX_KC ? K - k0 : RLX_KC;
            const float *bk = k0 + kc >= K ? bs : NULL;
            const int acc = k0 > 0;
            switch (kind) {
#ifdef RLX_BF16_DOT
            case RLX_HK_BF16:
                rlx_bf16_kernel(mr, prefetch && kc, kc / 2, (const uint16_t *)A + (i - i0) * lda + k0, lda,
                                (const uint16_t *)panel + k0 * RLX_HNR, c, ldc, nr, bk, acc);
                break;
#endif
#ifdef RLX_F16_DIRECT
            case RLX_HK_F16:
                rlx_f16_kernel(mr, prefetch && kc, kc, (const float *)A + (i - i0) * lda + k0, lda,
                               (const uint16_t *)panel + k0 * RLX_HNR, c, ldc, nr, bk, acc);
                break;
#endif
            default:
                rlx_kernel(mr, 0, kc, (const float *)A + (i - i0) * lda + k0, lda, (const float *)panel + k0 * RLX_NR,
                           c, ldc, nr, bk, acc);
            }
        }
        if (act != RLX_EPI_NONE)
            rlx_epilogue_act(c, ldc, mr, nr, act);
    }
}
#endif /* RLX_NR */

/* C[i0:i1, j0:j0+nr] of the tile whose panel `bw` was widened. */
static void rlx_hgemm_wide_tile(int64_t i0, int64_t i1, int64_t j0, int64_t nr, int64_t K, const float *A, int64_t lda,
                                const float *bw, float *C, int64_t ldc, const float *bias, int act)
{
#ifdef RLX_NR
    for (int64_t s = 0; s * RLX_NR < nr; s++) {
        const int64_t ns = nr - s * RLX_NR < RLX_NR ? nr - s * RLX_NR : RLX_NR;
        rlx_hgemm_rows(RLX_HK_F32, i0, i1, j0 + s * RLX_NR, ns, K, A + i0 * lda, lda, bw + s * K * RLX_NR, C, ldc,
                       bias, act);
    }
#else
    float *c = C + i0 * ldc + j0;
    rlx_sgemm1(0, 0, i1 - i0, nr, K, A + i0 * lda, lda, bw, RLX_HNR, c, ldc);
    for (int64_t i = 0; i < i1 - i0; i++) {
        float *restrict row = c + i * ldc;
        if (bias)
            for (int64_t j = 0; j < nr; j++)
                row[j] += bias[j0 + j];
    }
    if (act != RLX_EPI_NONE)
        rlx_epilogue_act(c, ldc, i1 - i0, nr, act);
#endif
}

/* Tiles [t0, t1) of C[M, N] = A[M, K] @ Bh (+ bias), then act; Bh packed as above (`pairs`: bf16).
 * Scratch of the calling thread: `a16` (mc x Kp bf16, the bf16 path) and `bw` (K x 32 floats,
 * 64-byte aligned, the widening path). */
static void rlx_hgemm(int64_t M, int64_t N, int64_t K, const float *A, int64_t lda, const uint16_t *Bh, float *C,
                      int64_t ldc, const float *bias, int act, int pairs, int64_t mc, uint16_t *a16, float *bw,
                      int64_t t0, int64_t t1)
{
    const int64_t Kp = (K + 1) & ~(int64_t)1, np = (N + RLX_HNR - 1) / RLX_HNR;
    int64_t rounded = -1;  /* the row block a16 holds */
    (void)a16;
    (void)rounded;
#ifdef RLX_BF16_AMX
    /* the tile unit for every row count (mc a multiple of 32: a block's last 32-row chunk stays in a16); fewer than
       16 rows: the C and A tiles configured for that many, one chunk (a tile product's time goes with its rows:
       one row as fast as vdpbf16ps) */
    const int amx = pairs && K > 0 && K % 32 == 0 && mc % 32 == 0 && t0 < t1 && rlx_amx_begin(M < 16 ? (int)M : 16);
#endif
    for (int64_t t = t0; t < t1; t++) {
        const int64_t i0 = t / np * mc, j0 = t % np * RLX_HNR;
        const int64_t i1 = i0 + mc < M ? i0 + mc : M;
        const int64_t nr = N - j0 < RLX_HNR ? N - j0 : RLX_HNR;
        const uint16_t *panel = Bh + j0 * Kp;  /* panel t % np starts after (t % np) * 32 * Kp values */
#ifdef RLX_BF16_DOT
        if (pairs) {
            if (rounded != i0) {
                rlx_round_rows_bf16(a16, Kp, A + i0 * lda, lda, i1 - i0, K);
#ifdef RLX_BF16_AMX
                const int64_t pad = (i1 - i0 + 31) / 32 * 32;
                if (amx && pad > i1 - i0)  /* the last chunk's rows past the block: zeros, not stale values */
                    memset(a16 + (i1 - i0) * Kp, 0, (size_t)((pad - (i1 - i0)) * Kp) * sizeof(uint16_t));
#endif
                rounded = i0;
            }
#ifdef RLX_BF16_AMX
            if (amx) {
                rlx_bf16_amx_rows(i1 - i0, nr, Kp, a16, panel, C + i0 * ldc + j0, ldc, bias ? bias + j0 : NULL, act,
                                  M < 16);
                continue;
            }
#endif
            rlx_hgemm_rows(RLX_HK_BF16, i0, i1, j0, nr, Kp, a16, Kp, panel, C, ldc, bias, act);
            continue;
        }
#endif
#ifdef RLX_F16_DIRECT
        if (!pairs && i1 - i0 <= RLX_F16_DIRECT_ROWS) {
            rlx_hgemm_rows(RLX_HK_F16, i0, i1, j0, nr, K, A + i0 * lda, lda, panel, C, ldc, bias, act);
            continue;
        }
#endif
        rlx_widen_panel(bw, panel, K, pairs);
        rlx_hgemm_wide_tile(i0, i1, j0, nr, K, A, lda, bw, C, ldc, bias, act);
    }
#ifdef RLX_BF16_AMX
    if (amx)
        _tile_release();  /* a thread without tile state saves none at its context switches */
#endif
}

#endif /* RLX_KERNELS_GEMM_BF16_H */

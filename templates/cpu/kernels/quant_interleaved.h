/* Decode GEMVs on q8_0 / q4_0 / q4_1 weights stored interleaved by 16 rows (an InterleavedQuantParam of the LIR),
 * with int8 / int16 activations. Part of the kernel unit kernels/quant.c (entry points rlx_qi_* declared in
 * kernels/quant.h); needs kernels/quant_kernels.h (rlx_q_half, rlx_q8_quantize_rows, rlx_q_dequant_block)
 * and kernels/scalar.h (rlx_silu_f).
 *
 * Why: the row-wise kernels (rlx_q8dot) put one weight row's blocks in the vector lanes, so every row of
 * activations pays a horizontal layout of partial sums (a scale permuted onto the lanes, a conversion and
 * an FMA per 64 products): ~11 instructions per 64 products and row, and a 16-row decode step cost ~8
 * one-row steps. Here the lanes are 16 weight rows (output columns): a block of 32 values of 16 rows is 8
 * vpdpbusd against 4 broadcast activation bytes each, and the scaling is one conversion and two FMAs per
 * 16 x 32 products and row, so the integer products dominate (issue 28: batched decode).
 *
 * The layout (same bytes as GGUF's, reordered by rlx_qi_interleave at rlx_set_param): the weight's rows
 * in groups of 16 (N % 16 == 0), each group's blocks in order; block b of group g at
 * W + (g * nb + b) * 16 * QB holds
 *   q4_1: the 16 rows' d (f16), then their m (f16), then 256 bytes of quants;
 *   q4_0 / q8_0: the 16 rows' d (f16), then 256 (q8_0: 512) bytes of quants;
 * q8_0's quant byte 64 j + 4 c + t (j < 8, t < 4, c < 16) is value 4 j + t of row c's block, and q4_x's byte
 * 64 p + 4 c + t (p, t < 4) is byte 4 p + t of row c's block: its low nibble is value
 * 4 p + t of the block, its high nibble value 16 + 4 p + t (GGUF's order), so one 64-byte load and a mask
 * give values 4p..4p+3 of the 16 rows as vpdpbusd wants them, a shift and a mask values 16+4p...
 *
 * Arithmetic of an output y[i, n] (the same whatever the number of rows, so batch-invariant): per block, the
 * exact integer dot product q_w . q_x (int16 activations: 256 * (q_w . hi) + (q_w . lo), < 2^24 in
 * magnitude for q4_x, so its float is exact; q8_0's may round), then acc = fma(dot, d_w * d_x, acc) and (q4_x)
 * acc = fma(c_w, d_x * sum q_x, acc) in block order, c_w being q4_1's m or q4_0's -8 d_w. The portable loop
 * computes the same values. */
#ifndef RLX_KERNELS_QUANT_INTERLEAVED_H
#define RLX_KERNELS_QUANT_INTERLEAVED_H

#include <math.h>
#include <stdint.h>
#include <string.h>

/* Weight rows per interleaved group (rlx.ir.decisions_quant.INTERLEAVE_ROWS). */
#define RLX_QI_ROWS 16
/* Activation rows one pass over a group's blocks multiplies (their accumulators stay in registers). */
#define RLX_QI_TILE 8
/* Bytes of a block, of its header (d, and q4_1's m) and 4-byte words of its quants, per format. */
#define RLX_QI_QB(fmt) ((fmt) == RLX_Q8_0 ? 34 : (fmt) == RLX_Q4_1 ? 20 : 18)
#define RLX_QI_HB(fmt) ((fmt) == RLX_Q4_1 ? 4 : 2)
#define RLX_QI_WORDS(fmt) ((fmt) == RLX_Q8_0 ? 8 : 4)

/* dst <- the GGUF rows of src (N rows of rb bytes, q8_0 / q4_0 / q4_1), interleaved by 16 rows as above. */
static void rlx_qi_interleave(const int fmt, uint8_t *restrict dst, const uint8_t *restrict src, int64_t N,
                              int64_t rb)
{
    const int qb = RLX_QI_QB(fmt), hb = RLX_QI_HB(fmt);
    const int64_t nb = rb / qb;
    for (int64_t g = 0; g < N / RLX_QI_ROWS; g++)
        for (int64_t b = 0; b < nb; b++) {
            uint8_t *out = dst + (g * nb + b) * RLX_QI_ROWS * qb;
            for (int c = 0; c < RLX_QI_ROWS; c++) {
                const uint8_t *blk = src + (g * RLX_QI_ROWS + c) * rb + b * qb;
                memcpy(out + 2 * c, blk, 2);  /* d */
                if (fmt == RLX_Q4_1)
                    memcpy(out + 32 + 2 * c, blk + 2, 2);  /* m */
                for (int p = 0; p < RLX_QI_WORDS(fmt); p++)
                    memcpy(out + RLX_QI_ROWS * hb + 64 * p + 4 * c, blk + hb + 4 * p, 4);
            }
        }
}

/* Row c of the group at G (its blocks 16 * qb apart) back as the GGUF block b, into blk. */
static inline void rlx_qi_block(const int fmt, const uint8_t *restrict G, int64_t b, int c, uint8_t *restrict blk)
{
    const int qb = RLX_QI_QB(fmt), hb = RLX_QI_HB(fmt);
    const uint8_t *in = G + b * RLX_QI_ROWS * qb;
    memcpy(blk, in + 2 * c, 2);
    if (fmt == RLX_Q4_1)
        memcpy(blk + 2, in + 32 + 2 * c, 2);
    for (int p = 0; p < RLX_QI_WORDS(fmt); p++)
        memcpy(blk + hb + 4 * p, in + RLX_QI_ROWS * hb + 64 * p + 4 * c, 4);
}

/* A prefill panel (rlx_q_dequant_panel's layout) of nr (a multiple of 16) interleaved rows at W: every value
 * exactly as rlx_q_dequant_row computes it from the GGUF rows. */
static inline __attribute__((always_inline)) void rlx_qi_dequant_panel(const int fmt, const uint8_t *W, int64_t rb,
        int64_t K, int64_t nr, float *restrict panel, float *restrict wrow)
{
#ifdef RLX_NR
    const int64_t ld = RLX_NR;
#else
    const int64_t ld = nr;
#endif
    const int64_t nb = K / 32;
    uint8_t blk[34];
    for (int64_t j = 0; j < ld; j++) {
        if (j < nr)
            for (int64_t b = 0; b < nb; b++) {
                rlx_qi_block(fmt, W + (j / RLX_QI_ROWS) * RLX_QI_ROWS * rb, b, (int)(j % RLX_QI_ROWS), blk);
                rlx_q_dequant_block(fmt, blk, wrow + b * 32);
            }
        for (int64_t k = 0; k < K; k++)
            panel[k * ld + j] = j < nr ? wrow[k] : 0.0f;
    }
}

static inline int32_t rlx_qi_load32(const int8_t *p)
{
    int32_t v;
    memcpy(&v, p, 4);
    return v;
}

#ifdef RLX_Q8_ZMM
/* w[j] <- values 4j..4j+3 of the group's 16 rows in block `quants` (q8_0: as stored; q4_x: unpacked nibbles). */
static inline __attribute__((always_inline)) void rlx_qi_weights(const int fmt, const uint8_t *restrict quants,
                                                                 __m512i *w)
{
    const __m512i low4 = _mm512_set1_epi8(0x0F);
    if (fmt == RLX_Q8_0) {
        for (int j = 0; j < 8; j++)
            w[j] = _mm512_loadu_si512((const void *)(quants + 64 * j));
    } else {
        for (int p = 0; p < 4; p++) {
            const __m512i packed = _mm512_loadu_si512((const void *)(quants + 64 * p));
            w[p] = _mm512_and_si512(packed, low4);
            w[p + 4] = _mm512_and_si512(_mm512_srli_epi16(packed, 4), low4);
        }
    }
}

/* What the biased side of a block's products adds, to take off (or start from) once a block for every row:
 * q4_x: the int16 activations' low bytes are stored as lo - 128 (signed) so that they are the broadcast signed
 * side too: w . lo = w . (lo - 128) + 128 sum(w). q8_0: the weights are signed, so the activations are the
 * unsigned side, their (high) bytes stored as q + 128: (q + 128) . w = q . w + 128 sum(w), which the high
 * bytes' 256 scales to 32768 sum(w). */
static inline __attribute__((always_inline)) __m512i rlx_qi_bias(const int fmt, const int a16, const __m512i *w)
{
    const __m512i ones = _mm512_set1_epi8(1);
    __m512i bias = _mm512_setzero_si512();
    if (!a16 && fmt != RLX_Q8_0)
        return bias;
    for (int j = 0; j < 8; j++)
        bias = fmt == RLX_Q8_0 ? _mm512_dpbusd_epi32(bias, ones, w[j]) : _mm512_dpbusd_epi32(bias, w[j], ones);
    return fmt == RLX_Q8_0 ? _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_slli_epi32(bias, a16 ? 15 : 7))
                           : _mm512_slli_epi32(bias, 7);
}

/* start + the block's integer products of one plane of a row's activations x (32 bytes) with w. Two chains:
 * vpdpbusd's latency is ~4x its throughput. q4_x: the weights (0..15) are the unsigned side, the activations'
 * 4 bytes a broadcast signed operand; q8_0 the other way round. */
static inline __attribute__((always_inline)) __m512i rlx_qi_plane(const int fmt, const __m512i *w, const int8_t *x,
                                                                  __m512i start)
{
    __m512i h0 = start, h1 = _mm512_setzero_si512();
    for (int j = 0; j < 8; j += 2) {
        const __m512i x0 = _mm512_set1_epi32(rlx_qi_load32(x + 4 * j));
        const __m512i x1 = _mm512_set1_epi32(rlx_qi_load32(x + 4 * j + 4));
        h0 = fmt == RLX_Q8_0 ? _mm512_dpbusd_epi32(h0, x0, w[j]) : _mm512_dpbusd_epi32(h0, w[j], x0);
        h1 = fmt == RLX_Q8_0 ? _mm512_dpbusd_epi32(h1, x1, w[j + 1]) : _mm512_dpbusd_epi32(h1, w[j + 1], x1);
    }
    return _mm512_add_epi32(h0, h1);
}

/* acc <- block b's scaling of the exact integer product `dot` of one row (xds: the row's pairs of floats),
 * in the order every path takes: fma(dot, dw * dx, acc), then (q4_x) fma(cw, dx * sum q, acc). */
static inline __attribute__((always_inline)) __m512 rlx_qi_scale(const int fmt, __m512i dot, __m512 dw, __m512 cw,
                                                                 const float *ds, __m512 acc)
{
    acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), _mm512_mul_ps(dw, _mm512_set1_ps(ds[0])), acc);
    if (fmt != RLX_Q8_0)
        acc = _mm512_fmadd_ps(cw, _mm512_set1_ps(ds[1]), acc);
    return acc;
}

/* The group's 16 rows' d (and c_w: q4_1's m, q4_0's -8 d) of the block at blk. */
static inline __attribute__((always_inline)) void rlx_qi_scales(const int fmt, const uint8_t *blk, __m512 *dw,
                                                                __m512 *cw)
{
    *dw = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)blk));
    *cw = fmt == RLX_Q4_1 ? _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(blk + 32)))
                          : _mm512_mul_ps(*dw, _mm512_set1_ps(-8.0f));
}
#endif

/* Y[i, 0:16] (rows i < R, ldy apart) = activation rows i of Xq (xrow bytes apart; int16: the low plane, as
 * lo - 128, K bytes after the high one) times the 16 rows of the group at G. */
static inline __attribute__((always_inline)) void rlx_qi_tile(const int fmt, const int a16, const int R, int64_t nb,
        int64_t K, const int8_t *restrict Xq, int64_t xrow, const float *restrict xds, const uint8_t *restrict G,
        float *restrict Y, int64_t ldy)
{
    const int qb = RLX_QI_QB(fmt), hb = RLX_QI_HB(fmt);
#ifdef RLX_Q8_ZMM
    __m512 acc[RLX_QI_TILE];
    #pragma GCC unroll 8
    for (int i = 0; i < RLX_QI_TILE; i++)
        if (i < R)
            acc[i] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *blk = G + b * RLX_QI_ROWS * qb;
        __m512i w[8];  /* w[j]: values 4j..4j+3 of the 16 rows */
        rlx_qi_weights(fmt, blk + RLX_QI_ROWS * hb, w);
        __m512 dw, cw;
        rlx_qi_scales(fmt, blk, &dw, &cw);
        const __m512i bias = rlx_qi_bias(fmt, a16, w);
        #pragma GCC unroll 8  /* every row's accumulator in a register */
        for (int i = 0; i < RLX_QI_TILE; i++)
            if (i < R) {
                const int8_t *x = Xq + i * xrow + b * 32;
                const __m512i dot = a16 ? _mm512_add_epi32(_mm512_slli_epi32(rlx_qi_plane(fmt, w, x, _mm512_setzero_si512()), 8),
                                                           rlx_qi_plane(fmt, w, x + K, bias))
                                        : rlx_qi_plane(fmt, w, x, bias);
                acc[i] = rlx_qi_scale(fmt, dot, dw, cw, xds + 2 * (i * nb + b), acc[i]);
            }
    }
    #pragma GCC unroll 8
    for (int i = 0; i < RLX_QI_TILE; i++)
        if (i < R)
            _mm512_storeu_ps(Y + i * ldy, acc[i]);
#else
    /* the activations as rlx_q8_quantize_rows stores them without AVX-512 VNNI: high bytes signed, the low
       ones unsigned (plain q4_x: minus 128) */
    float acc[RLX_QI_TILE][RLX_QI_ROWS];
    for (int i = 0; i < R; i++)
        for (int c = 0; c < RLX_QI_ROWS; c++)
            acc[i][c] = 0.0f;
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *blk = G + b * RLX_QI_ROWS * qb;
        for (int c = 0; c < RLX_QI_ROWS; c++) {
            const float dw = rlx_q_half(blk + 2 * c);
            const float cw = fmt == RLX_Q4_1 ? rlx_q_half(blk + 32 + 2 * c) : dw * -8.0f;
            int q[32];
            for (int p = 0; p < RLX_QI_WORDS(fmt); p++)
                for (int t = 0; t < 4; t++) {
                    const uint8_t byte = blk[RLX_QI_ROWS * hb + 64 * p + 4 * c + t];
                    if (fmt == RLX_Q8_0) {
                        q[4 * p + t] = (int8_t)byte;
                    } else {
                        q[4 * p + t] = byte & 0x0F;
                        q[16 + 4 * p + t] = byte >> 4;
                    }
                }
            for (int i = 0; i < R; i++) {
                const int8_t *x = Xq + i * xrow + b * 32;
                const int lo_bias = fmt == RLX_Q8_0 ? 0 : 128;
                int32_t dot = 0;
                for (int k = 0; k < 32; k++)
                    dot += q[k] * (a16 ? (int32_t)x[k] * 256 + ((fmt == RLX_Q8_0 ? (int32_t)(uint8_t)x[K + k]
                                                                                 : (int32_t)x[K + k]) + lo_bias)
                                       : (int32_t)x[k]);
                const float *ds = xds + 2 * (i * nb + b);
                acc[i][c] = fmaf((float)dot, dw * ds[0], acc[i][c]);
                if (fmt != RLX_Q8_0)
                    acc[i][c] = fmaf(cw, ds[1], acc[i][c]);
            }
        }
    }
    for (int i = 0; i < R; i++)
        for (int c = 0; c < RLX_QI_ROWS; c++)
            Y[i * ldy + c] = acc[i][c];
#endif
}


/* ── AMX (Sapphire Rapids' tile unit): steps of RLX_QI_AMX_ROWS rows or more ──
 *
 * A block's integer products of up to 16 activation rows with a group's 16 weight rows are one tile product
 * (A: the rows' 32 bytes of the block; B: the 8 words of 4 bytes of the 16 weight rows, the layout above
 * unpacked; C: 16 x 16 int32), two for int16 activations (high and low bytes). The tile unit computes the same
 * exact integers as vpdpbusd, and the scaling below is rlx_qi_tile's operations in its order, so a row's
 * bits are the same whichever path a step takes: a step's row count picks the path, never its results.
 * Linux hands the tile state to a process that asks (arch_prctl); where it refuses, the vector path runs. */
#if defined(RLX_Q8_ZMM) && defined(__AMX_TILE__) && defined(__AMX_INT8__) && defined(__linux__)
#define RLX_QI_AMX 1
#include "kernels/amx.h"

/* Rows of activations from which a step takes the tile unit (fewer: its fixed cost per block is larger than
 * the vector path's products). */
#define RLX_QI_AMX_ROWS 10

/* Configure this thread's tiles for M activation rows: 0 A (high bytes), 1 A (low bytes), 2 B, 3 to 6 C.
 * Returns 0 (vector path) for fewer than RLX_QI_AMX_ROWS rows or without the tile state. */
static inline int rlx_qi_amx_begin(int64_t M)
{
    if (M < RLX_QI_AMX_ROWS || !rlx_amx_granted())
        return 0;
    rlx_amx_tilecfg c;
    memset(&c, 0, sizeof c);
    c.palette = 1;
    c.rows[0] = c.rows[1] = (uint8_t)M;
    c.colsb[0] = c.colsb[1] = 32;
    c.rows[2] = 8;
    c.colsb[2] = 64;
    c.rows[3] = c.rows[4] = c.rows[5] = c.rows[6] = (uint8_t)M;
    c.colsb[3] = c.colsb[4] = c.colsb[5] = c.colsb[6] = 64;
    _tile_loadconfig(&c);
    return 1;
}

static inline void rlx_qi_amx_end(int on)
{
    if (on)
        _tile_release();  /* a thread without tile state saves none at its context switches */
}

/* Block b's tile products into C tiles 3 and 4 (par 0) or 5 and 6 (par 1), stored to chi / clo; returns the
 * block's bias (as rlx_qi_tile's). wbuf: 512 bytes for q4_x's unpacked weights (B's source). */
static inline __attribute__((always_inline)) __m512i rlx_qi_amx_issue(const int fmt, const int a16, const int par,
        int64_t K, const int8_t *restrict Xq, int64_t xrow, const uint8_t *restrict blk, int64_t b,
        uint8_t *restrict wbuf, int32_t *restrict chi, int32_t *restrict clo)
{
    const uint8_t *quants = blk + RLX_QI_ROWS * RLX_QI_HB(fmt);
    __m512i w[8];
    rlx_qi_weights(fmt, quants, w);
    if (fmt == RLX_Q8_0) {
        _tile_loadd(2, quants, 64);
    } else {  /* B's rows are the unpacked values: through L1 */
        for (int j = 0; j < 8; j++)
            _mm512_store_si512((void *)(wbuf + 64 * j), w[j]);
        _tile_loadd(2, wbuf, 64);
    }
    /* the high (or only) bytes: q4_x signed activations x unsigned weights, q8_0 the other way round */
    _tile_loadd(0, Xq + b * 32, xrow);
    if (a16)
        _tile_loadd(1, Xq + K + b * 32, xrow);
#define RLX_QI_AMX_PRODUCTS(CH, CL)                                    \
    do {                                                               \
        _tile_zero(CH);                                                \
        if (fmt == RLX_Q8_0)                                           \
            _tile_dpbusd(CH, 0, 2);                                    \
        else                                                           \
            _tile_dpbsud(CH, 0, 2);                                    \
        _tile_stored(CH, chi, 64);                                     \
        if (a16) {                                                     \
            _tile_zero(CL);                                            \
            if (fmt == RLX_Q8_0)                                       \
                _tile_dpbusd(CL, 1, 2);                                \
            else                                                       \
                _tile_dpbsud(CL, 1, 2);                                \
            _tile_stored(CL, clo, 64);                                 \
        }                                                              \
    } while (0)
    if (par)
        RLX_QI_AMX_PRODUCTS(5, 6);
    else
        RLX_QI_AMX_PRODUCTS(3, 4);
#undef RLX_QI_AMX_PRODUCTS
    return rlx_qi_bias(fmt, a16, w);
}

/* Y[i, 0:16] for the M (RLX_QI_AMX_ROWS..16) activation rows and the group at G, on configured tiles. The
 * products of block b + 1 are issued before block b's scaling reads its stored tiles (two sets of C tiles and
 * buffers), so the tile unit and the vector units overlap and a tile's stores have landed when read. */
static inline __attribute__((always_inline)) void rlx_qi_group_amx(const int fmt, const int a16, int64_t M,
        int64_t K, const int8_t *restrict Xq, const float *restrict xds, const uint8_t *restrict G,
        float *restrict Y, int64_t ldy)
{
    const int qb = RLX_QI_QB(fmt);
    const int64_t nb = K / 32, xrow = K * (a16 ? 2 : 1);
    float acc[RLX_QDECODE_MAX_M * RLX_QI_ROWS] __attribute__((aligned(64)));
    int32_t chi[2][RLX_QDECODE_MAX_M * RLX_QI_ROWS] __attribute__((aligned(64)));
    int32_t clo[2][RLX_QDECODE_MAX_M * RLX_QI_ROWS] __attribute__((aligned(64)));
    uint8_t wbuf[2][8 * 64] __attribute__((aligned(64)));
    __m512i bias[2];
    for (int64_t i = 0; i < M; i++)
        _mm512_store_ps(acc + i * RLX_QI_ROWS, _mm512_setzero_ps());
    bias[0] = rlx_qi_amx_issue(fmt, a16, 0, K, Xq, xrow, G, 0, wbuf[0], chi[0], clo[0]);
    for (int64_t b = 0; b < nb; b++) {
        const int par = (int)(b & 1);
        if (b + 1 < nb) {
            const uint8_t *next = G + (b + 1) * RLX_QI_ROWS * qb;
            if (par)
                bias[0] = rlx_qi_amx_issue(fmt, a16, 0, K, Xq, xrow, next, b + 1, wbuf[0], chi[0], clo[0]);
            else
                bias[1] = rlx_qi_amx_issue(fmt, a16, 1, K, Xq, xrow, next, b + 1, wbuf[1], chi[1], clo[1]);
        }
        __m512 dw, cw;
        rlx_qi_scales(fmt, G + b * RLX_QI_ROWS * qb, &dw, &cw);
        const int32_t *hi = chi[par], *lo = clo[par];
        for (int64_t i = 0; i < M; i++) {
            __m512i dot = _mm512_load_si512((const void *)(hi + i * RLX_QI_ROWS));
            dot = a16 ? _mm512_add_epi32(_mm512_slli_epi32(dot, 8),
                                         _mm512_add_epi32(_mm512_load_si512((const void *)(lo + i * RLX_QI_ROWS)), bias[par]))
                      : _mm512_add_epi32(dot, bias[par]);  /* as rlx_qi_tile: q4_x's bias is 0 here */
            _mm512_store_ps(acc + i * RLX_QI_ROWS, rlx_qi_scale(fmt, dot, dw, cw, xds + 2 * (i * nb + b),
                                                                _mm512_load_ps(acc + i * RLX_QI_ROWS)));
        }
    }
    for (int64_t i = 0; i < M; i++)
        _mm512_storeu_ps(Y + i * ldy, _mm512_load_ps(acc + i * RLX_QI_ROWS));
}
#else
static inline int rlx_qi_amx_begin(int64_t M)
{
    (void)M;
    return 0;
}
static inline void rlx_qi_amx_end(int on)
{
    (void)on;
}
#endif

/* Y[i, 16 g : 16 g + 16] for the M (<= RLX_QDECODE_MAX_M) activation rows, one group at G; amx: the tiles are
 * configured for M rows (rlx_qi_amx_begin). */
static inline __attribute__((always_inline)) void rlx_qi_group(const int fmt, const int a16, int64_t M, int64_t K,
        const int8_t *Xq, const float *xds, const uint8_t *G, float *Y, int64_t ldy, int amx)
{
#ifdef RLX_QI_AMX
    if (amx) {
        rlx_qi_group_amx(fmt, a16, M, K, Xq, xds, G, Y, ldy);
        return;
    }
#else
    (void)amx;
#endif
    const int64_t nb = K / 32, xrow = K * (a16 ? 2 : 1);
    for (int64_t i0 = 0; i0 < M; i0 += RLX_QI_TILE) {
        const int64_t mr = M - i0 < RLX_QI_TILE ? M - i0 : RLX_QI_TILE;
        const int8_t *xq = Xq + i0 * xrow;
        const float *ds = xds + 2 * i0 * nb;
        float *y = Y + i0 * ldy;
        switch (mr) {  /* one instance per row count */
        case 8: rlx_qi_tile(fmt, a16, 8, nb, K, xq, xrow, ds, G, y, ldy); break;
        case 7: rlx_qi_tile(fmt, a16, 7, nb, K, xq, xrow, ds, G, y, ldy); break;
        case 6: rlx_qi_tile(fmt, a16, 6, nb, K, xq, xrow, ds, G, y, ldy); break;
        case 5: rlx_qi_tile(fmt, a16, 5, nb, K, xq, xrow, ds, G, y, ldy); break;
        case 4: rlx_qi_tile(fmt, a16, 4, nb, K, xq, xrow, ds, G, y, ldy); break;
        case 3: rlx_qi_tile(fmt, a16, 3, nb, K, xq, xrow, ds, G, y, ldy); break;
        case 2: rlx_qi_tile(fmt, a16, 2, nb, K, xq, xrow, ds, G, y, ldy); break;
        default: rlx_qi_tile(fmt, a16, 1, nb, K, xq, xrow, ds, G, y, ldy); break;
        }
    }
}

/* Prefetch the group at G (gb bytes) while the current one is multiplied (the weights stream once a step). */
static inline void rlx_qi_prefetch(const uint8_t *G, int64_t gb)
{
    for (int64_t o = 0; o < gb; o += 64)
        __builtin_prefetch(G + o, 0, 3);
}

/* Y[:, 16 g0 : 16 g1] = Xq @ W^T over groups [g0, g1) of the interleaved weight W (rb bytes a row). */
static inline __attribute__((always_inline)) void rlx_qi_gemm(const int fmt, const int a16, int64_t M, int64_t N,
        int64_t K, const int8_t *Xq, const float *xds, const uint8_t *W, int64_t rb, float *Y, int64_t g0,
        int64_t g1)
{
    const int64_t gb = RLX_QI_ROWS * rb;
    const int amx = rlx_qi_amx_begin(M);
    for (int64_t g = g0; g < g1; g++) {
        if (g + 1 < g1)
            rlx_qi_prefetch(W + (g + 1) * gb, gb);
        rlx_qi_group(fmt, a16, M, K, Xq, xds, W + g * gb, Y + g * RLX_QI_ROWS, N, amx);
    }
    rlx_qi_amx_end(amx);
}

/* out[i, n] = silu(x_i . Wg[n]) * (x_i . Wu[n]) for the groups [g0, g1) (rlx_qgroup_swiglu, interleaved). */
static inline __attribute__((always_inline)) void rlx_qi_group_swiglu(const int fmt, const int a16, int64_t M,
        int64_t N, int64_t K, const int8_t *Xq, const float *xds, const uint8_t *Wg, const uint8_t *Wu,
        int64_t rb, float *out, int64_t g0, int64_t g1)
{
    const int64_t gb = RLX_QI_ROWS * rb;
    float gt[RLX_QDECODE_MAX_M * RLX_QI_ROWS], ut[RLX_QDECODE_MAX_M * RLX_QI_ROWS];
    const int amx = rlx_qi_amx_begin(M);
    for (int64_t g = g0; g < g1; g++) {
        if (g + 1 < g1) {
            rlx_qi_prefetch(Wg + (g + 1) * gb, gb);
            rlx_qi_prefetch(Wu + (g + 1) * gb, gb);
        }
        rlx_qi_group(fmt, a16, M, K, Xq, xds, Wg + g * gb, gt, RLX_QI_ROWS, amx);
        rlx_qi_group(fmt, a16, M, K, Xq, xds, Wu + g * gb, ut, RLX_QI_ROWS, amx);
        for (int64_t i = 0; i < M; i++) {
            float *restrict o = out + i * N + g * RLX_QI_ROWS;
            const float *restrict gi = gt + i * RLX_QI_ROWS, *restrict ui = ut + i * RLX_QI_ROWS;
            #pragma omp simd
            for (int c = 0; c < RLX_QI_ROWS; c++)
                o[c] = rlx_silu_f(gi[c]) * ui[c];
        }
    }
    rlx_qi_amx_end(amx);
}

#endif /* RLX_KERNELS_QUANT_INTERLEAVED_H */

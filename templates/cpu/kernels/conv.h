/* Convolution and pooling on channels-first planes (rlx/codegen/cpu/conv.py, templates/cpu/conv.c.j2).
 * A fixed RLX kernel header: no template code; included by generated files that need it.
 *
 * Implicit GEMM: the output pixels of one image and group are cut into tiles of RLX_CONV_MC; a
 * thread gathers a tile's receptive fields into a pixel-major block A[mc, Cg*KH*KW] of its scratch
 * (k ordered c, kh, kw: ONNX's weight order), multiplies it by the weights and stores the result
 * channels-first. The whole im2col matrix never exists; a tile's block stays in L2.
 * 1-D convolutions are 2-D ones with H = KH = 1. */
#ifndef RLX_KERNELS_CONV_H
#define RLX_KERNELS_CONV_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* Output pixels per implicit-GEMM tile (CONV_TILE_PIXELS in rlx/ir/decisions_conv.py): a multiple
 * of every micro-kernel's rows (12 with AVX-512, 6 with AVX2). */
#define RLX_CONV_MC 96

typedef struct {
    int64_t C, H, W;        /* input channels per group, input plane */
    int64_t OH, OW;         /* output plane */
    int64_t KH, KW, SH, SW, DH, DW, PH, PW;  /* window, strides, dilations, begin pads */
} rlx_conv_geom;

/* A[i, (c*KH + kh)*KW + kw] = x[c, oh*SH - PH + kh*DH, ow*SW - PW + kw*DW] (0 outside the plane)
 * for the mc output pixels p0 .. p0+mc-1 (row-major over OH x OW); x is one group's [C, H, W]. */
static void rlx_conv_gather(const float *restrict x, const rlx_conv_geom *g, int64_t p0, int64_t mc,
                            float *restrict A)
{
    const int64_t K = g->C * g->KH * g->KW, HW = g->H * g->W;
    if (g->KH == 1 && g->KW == 1 && g->SH == 1 && g->SW == 1 && g->PH == 0 && g->PW == 0
            && g->OH == g->H && g->OW == g->W) {
        /* pointwise: the tile is a transposed block of the planes */
        for (int64_t c = 0; c < g->C; c++) {
            const float *restrict xc = x + c * HW + p0;
            for (int64_t i = 0; i < mc; i++)
                A[i * K + c] = xc[i];
        }
        return;
    }
    int64_t oh = p0 / g->OW, ow = p0 % g->OW;
    for (int64_t i = 0; i < mc; i++) {
        float *restrict a = A + i * K;
        const int64_t ih0 = oh * g->SH - g->PH, iw0 = ow * g->SW - g->PW;
        if (g->DW == 1) {
            /* the window's columns are one run of each input row: the taps inside the plane, [kh_lo, kh_hi) x
               [kw_lo, kw_hi), found once per pixel (no test per element: 4x faster on ResNet's 7-wide stage) */
            int64_t kh_lo = 0, kh_hi = g->KH;
            while (kh_lo < g->KH && ih0 + kh_lo * g->DH < 0)
                kh_lo++;
            while (kh_hi > kh_lo && ih0 + (kh_hi - 1) * g->DH >= g->H)
                kh_hi--;
            const int64_t kw_lo = iw0 < 0 ? (-iw0 < g->KW ? -iw0 : g->KW) : 0;
            const int64_t kw_hi = g->W - iw0 < g->KW ? (g->W - iw0 > kw_lo ? g->W - iw0 : kw_lo) : g->KW;
            if (kh_lo > 0 || kh_hi < g->KH || kw_lo > 0 || kw_hi < g->KW)
                memset(a, 0, (size_t)K * sizeof(float));
            if (kw_lo == 0 && kw_hi == 3 && g->KW == 3) {
                for (int64_t c = 0; c < g->C; c++)
                    for (int64_t kh = kh_lo; kh < kh_hi; kh++) {
                        const float *restrict src = x + c * HW + (ih0 + kh * g->DH) * g->W + iw0;
                        float *restrict dst = a + (c * g->KH + kh) * 3;
                        dst[0] = src[0];
                        dst[1] = src[1];
                        dst[2] = src[2];
                    }
            } else {
                for (int64_t c = 0; c < g->C; c++)
                    for (int64_t kh = kh_lo; kh < kh_hi; kh++) {
                        const float *restrict src = x + c * HW + (ih0 + kh * g->DH) * g->W + iw0;
                        float *restrict dst = a + (c * g->KH + kh) * g->KW;
                        for (int64_t kw = kw_lo; kw < kw_hi; kw++)
                            dst[kw] = src[kw];
                    }
            }
        } else {
            for (int64_t c = 0; c < g->C; c++) {
                const float *restrict xc = x + c * HW;
                for (int64_t kh = 0; kh < g->KH; kh++) {
                    const int64_t ih = ih0 + kh * g->DH;
                    float *restrict ak = a + (c * g->KH + kh) * g->KW;
                    if (ih < 0 || ih >= g->H) {
                        for (int64_t kw = 0; kw < g->KW; kw++)
                            ak[kw] = 0.0f;
                        continue;
                    }
                    const float *restrict row = xc + ih * g->W;
                    for (int64_t kw = 0; kw < g->KW; kw++) {
                        const int64_t iw = iw0 + kw * g->DW;
                        ak[kw] = iw >= 0 && iw < g->W ? row[iw] : 0.0f;
                    }
                }
            }
        }
        if (++ow == g->OW) {
            ow = 0;
            oh++;
        }
    }
}

/* Channels-first tiles: B[k, i] = x[c, oh*SH - PH + kh*DH, ow*SW - PW + kw*DW] (0 outside the plane) for
 * k = (c, kh, kw) and the mc output pixels p0 .. p0+mc-1 (row-major over OH x OW); B is [K, mc]. With
 * SW == 1 each output row's pixels read one contiguous run of an input row. */
static void rlx_conv_gather_kmajor(const float *restrict x, const rlx_conv_geom *g, int64_t p0, int64_t mc,
                                   float *restrict B)
{
    const int64_t HW = g->H * g->W;
    for (int64_t c = 0; c < g->C; c++)
        for (int64_t kh = 0; kh < g->KH; kh++)
            for (int64_t kw = 0; kw < g->KW; kw++) {
                float *restrict b = B + ((c * g->KH + kh) * g->KW + kw) * mc;
                const float *restrict xc = x + c * HW;
                int64_t i = 0;
                while (i < mc) {
                    const int64_t p = p0 + i, oh = p / g->OW, ow0 = p % g->OW;
                    const int64_t n = g->OW - ow0 < mc - i ? g->OW - ow0 : mc - i;  /* pixels left in this row */
                    const int64_t ih = oh * g->SH - g->PH + kh * g->DH;
                    float *restrict bi = b + i;
                    if (ih < 0 || ih >= g->H) {
                        memset(bi, 0, (size_t)n * sizeof(float));
                    } else {
                        const float *restrict row = xc + ih * g->W;
                        const int64_t off = kw * g->DW - g->PW;
                        /* ow in [lo, hi) reads inside the row: 0 <= ow*SW + off < W */
                        int64_t lo = off >= 0 ? 0 : (-off + g->SW - 1) / g->SW;
                        int64_t hi = g->W - 1 - off < 0 ? 0 : (g->W - 1 - off) / g->SW + 1;
                        lo = lo < ow0 ? ow0 : lo;
                        hi = hi > ow0 + n ? ow0 + n : hi;
                        if (hi < lo)
                            hi = lo;
                        for (int64_t ow = ow0; ow < lo; ow++)
                            bi[ow - ow0] = 0.0f;
                        if (g->SW == 1)
                            memcpy(bi + (lo - ow0), row + lo + off, (size_t)(hi - lo) * sizeof(float));
                        else
                            for (int64_t ow = lo; ow < hi; ow++)
                                bi[ow - ow0] = row[ow * g->SW + off];
                        for (int64_t ow = hi; ow < ow0 + n; ow++)
                            bi[ow - ow0] = 0.0f;
                    }
                    i += n;
                }
            }
}

/* Output channels [j0, j1) of C[mc, N] = A[mc, K] @ W, W the conv weight packed at set_param as K / D blocks of
 * D rows, each a [D, N] matrix of kernels/packed_gemm.h's panels (RLX_PACK_NR_MAX-padded apart; row-major where
 * this ISA has no micro-kernel); j0 is a multiple of the panel width. C is overwritten (no bias: the conv's store
 * adds it). One block at a time over every panel: a block's slice of a panel (D x 16 floats, D <= 256: at most
 * 16 KiB with AVX2) stays in L1 while the tile's row groups pass over it, and the weights stream in storage order
 * (multiplying whole K-deep panels instead read a 512-channel stage's 295 KiB panels from L2, its tile from L3). */
static void rlx_conv_packed_tile(int64_t mc, int64_t K, int64_t D, const float *A, const float *W, int64_t N,
                                 int64_t j0, int64_t j1, float *C, int64_t ldc)
{
    /* each panel is multiplied by every row of the tile while the next one streams in (rlx_kernel_next) */
    const int64_t block = D * ((N + RLX_PACK_NR_MAX - 1) / RLX_PACK_NR_MAX * RLX_PACK_NR_MAX);
    if (j1 <= j0 || mc <= 0)
        return;
    for (int64_t k0 = 0; k0 < K; k0 += D) {
        const float *Wb = W + k0 / D * block;
#ifdef RLX_NR
        for (int64_t j = j0; j < j1; j += RLX_NR) {
            const int64_t nr = j1 - j < RLX_NR ? j1 - j : RLX_NR;
            /* the panel multiplied next (this block's, or the next block's first), asked for while this one is */
            const float *next = j + RLX_NR < j1 ? Wb + (j + RLX_NR) * D : k0 + D < K ? Wb + block + j0 * D : NULL;
            rlx_kernel_next(mc, D, A + k0, K, Wb + j * D, C + j, ldc, nr, k0 > 0, next);
        }
#else
        for (int64_t i = 0; i < mc; i++) {
            float *restrict c = C + i * ldc;
            if (k0 == 0)
                for (int64_t j = j0; j < j1; j++)
                    c[j] = 0.0f;
            for (int64_t k = 0; k < D; k++) {
                const float a = A[i * K + k0 + k];
                const float *restrict w = Wb + k * N;
                #pragma omp simd
                for (int64_t j = j0; j < j1; j++)
                    c[j] += a * w[j];
            }
        }
#endif
    }
}

/* Fewest weights (output channels x K) of a pointwise conv on one pixel a plane that the team shares (conv.c.j2): the
 * product is bound by the weight's stream from memory, which every core fetches into its own cache (MobileNetV3-small's
 * 576 x 144 squeeze-excite convs, in the model: 10-12 -> 7.3-8.6 us; its 288 x 72 ones, 3.0-3.5 us alone, were no
 * faster shared). */
#define RLX_GEMV_TEAM_MIN 32768

/* y[o * ldy] = w[o, :] . x (x's K values ldx apart) for the m rows of w[m, K]: a pointwise conv's product on one
 * output pixel (a squeeze-excite block's 1x1 conv on a pooled vector), where a BLAS sgemm with n == 1 packed the
 * whole weight on every call (MobileNetV3's 576 x 144 ones took 65-80 us instead of ~15). */
static void rlx_conv_gemv(int64_t m, int64_t K, const float *restrict w, const float *restrict x, int64_t ldx,
                          float *restrict y, int64_t ldy)
{
    int64_t o = 0;
    /* four rows at a time: four independent sums (one row's sum is a chain of dependent multiply-adds), x read
       once for them */
    if (ldx == 1)
        for (; o + 4 <= m; o += 4) {
            const float *restrict w0 = w + o * K, *restrict w1 = w0 + K, *restrict w2 = w1 + K, *restrict w3 = w2 + K;
            float a0 = 0.0f, a1 = 0.0f, a2 = 0.0f, a3 = 0.0f;
            #pragma omp simd reduction(+:a0, a1, a2, a3)
            for (int64_t i = 0; i < K; i++) {
                const float v = x[i];
                a0 += w0[i] * v;
                a1 += w1[i] * v;
                a2 += w2[i] * v;
                a3 += w3[i] * v;
            }
            y[o * ldy] = a0;
            y[(o + 1) * ldy] = a1;
            y[(o + 2) * ldy] = a2;
            y[(o + 3) * ldy] = a3;
        }
    for (; o < m; o++) {
        const float *restrict wo = w + o * K;
        float acc = 0.0f;
        if (ldx == 1) {
            #pragma omp simd reduction(+:acc)
            for (int64_t i = 0; i < K; i++)
                acc += wo[i] * x[i];
        } else {
            for (int64_t i = 0; i < K; i++)
                acc += wo[i] * x[i * ldx];
        }
        y[o * ldy] = acc;
    }
}

/* Whether a conv's input plane is its own GEMM operand (1x1 window, stride 1, no pads): no gather. */
static inline int rlx_conv_pointwise(const rlx_conv_geom *g)
{
    return g->KH == 1 && g->KW == 1 && g->SH == 1 && g->SW == 1 && g->PH == 0 && g->PW == 0
        && g->OH == g->H && g->OW == g->W;
}

/* Depthwise convolution, one plane at a time, through a padded copy split by stride phase.
 *
 * The plane is copied (zeros in the pads) into SH*SW phase planes q[a*SW + b] of HQ x WQ (rlx_conv_dw_hq, _wq) floats,
 * q[a*SW + b][r, c] = x[r*SH + a - PH, c*SW + b - PW]. Window tap (kh, kw) of output pixel (oh, ow) is then
 * phase ((kh*DH) % SH, (kw*DW) % SW) at (oh + kh*DH / SH, ow + kw*DW / SW): with the output laid out WQ
 * wide (columns OW .. WQ-1 are computed and dropped), every tap is one contiguous, bounds-free run
 * acc[i] += w * q[i + offset] over the whole plane, accumulated RLX_DW_VEC outputs at a time in registers
 * across all taps. Scratch floats per thread: rlx_conv_dw_scratch (rlx/codegen/cpu/conv.py computes the same). */
#define RLX_DW_VEC 32
typedef float rlx_dw_v8 __attribute__((vector_size(32)));
/* the same, at any float's address (unaligned loads and stores; may alias other floats) */
typedef float rlx_dw_v8u __attribute__((vector_size(32), aligned(4), may_alias));
/* 16 floats: one AVX-512 register (split in two by the compiler where the target has none) */
typedef float rlx_cv16 __attribute__((vector_size(64)));
typedef float rlx_cv16u __attribute__((vector_size(64), aligned(4), may_alias));

static inline int64_t rlx_conv_dw_wq(const rlx_conv_geom *g) { return g->OW + (g->KW - 1) * g->DW / g->SW; }
static inline int64_t rlx_conv_dw_hq(const rlx_conv_geom *g) { return g->OH + (g->KH - 1) * g->DH / g->SH; }
/* floats of one phase plane: one spare row and a vector of slack for the dropped columns' reads */
static inline int64_t rlx_conv_dw_phase(const rlx_conv_geom *g)
{
    return (rlx_conv_dw_hq(g) + 1) * rlx_conv_dw_wq(g) + RLX_DW_VEC;
}

/* The SH*SW stride-phase planes of one input plane x[H, W] (rlx_conv_dw_phase floats apart from q on; zeros in the
 * pads, one spare row and RLX_DW_VEC floats of slack after each): q[a*SW + b][r, c] = x[r*SH + a - PH, c*SW + b - PW].
 * Row by row of the input: the columns whose SW inputs all lie inside the row ([clo, chi)) are split into the SW
 * column phases by one loop (stride 1: a copy; 2 and 4: a vectorized de-interleave), the few others one by one.
 * (Phase by phase with a strided loop each, MobileNetV3's stride-2 depthwise convs spent 80% of their time here.) */
static inline __attribute__((always_inline)) void rlx_conv_phase_fill(const float *restrict x, const rlx_conv_geom *g,
                                                                      float *restrict q, const float fill)
{
    const int64_t HQ = rlx_conv_dw_hq(g), WQ = rlx_conv_dw_wq(g), PL = rlx_conv_dw_phase(g), SW = g->SW;
    /* columns c whose inputs c*SW + b - PW, b < SW, all lie in [0, W) */
    int64_t clo = (g->PW + SW - 1) / SW, chi = g->W + g->PW - SW < 0 ? 0 : (g->W + g->PW - SW) / SW + 1;
    clo = clo > WQ ? WQ : clo;
    chi = chi > WQ ? WQ : (chi < clo ? clo : chi);
    for (int64_t a = 0; a < g->SH; a++) {
        float *restrict qa = q + a * SW * PL;
        for (int64_t r = 0; r <= HQ; r++) {
            const int64_t ih = r * g->SH + a - g->PH;
            if (r == HQ || ih < 0 || ih >= g->H) {
                for (int64_t b = 0; b < SW; b++)
                    for (int64_t c = 0; c < WQ; c++)
                        qa[b * PL + r * WQ + c] = fill;
                continue;
            }
            const float *restrict xr = x + ih * g->W - g->PW;  /* input column iw at xr[iw + PW] */
            for (int64_t b = 0; b < SW; b++) {  /* the edge columns */
                float *restrict qr = qa + b * PL + r * WQ;
                for (int64_t c = 0; c < clo; c++) {
                    const int64_t iw = c * SW + b - g->PW;
                    qr[c] = iw >= 0 && iw < g->W ? xr[c * SW + b] : fill;
                }
                for (int64_t c = chi; c < WQ; c++) {
                    const int64_t iw = c * SW + b - g->PW;
                    qr[c] = iw >= 0 && iw < g->W ? xr[c * SW + b] : fill;
                }
            }
            float *restrict q0 = qa + r * WQ;
            if (SW == 1) {
                #pragma omp simd
                for (int64_t c = clo; c < chi; c++)
                    q0[c] = xr[c];
            } else if (SW == 2) {
                float *restrict q1 = q0 + PL;
                #pragma omp simd
                for (int64_t c = clo; c < chi; c++) {
                    q0[c] = xr[2 * c];
                    q1[c] = xr[2 * c + 1];
                }
            } else if (SW == 4) {
                float *restrict q1 = q0 + PL, *restrict q2 = q0 + 2 * PL, *restrict q3 = q0 + 3 * PL;
                #pragma omp simd
                for (int64_t c = clo; c < chi; c++) {
                    q0[c] = xr[4 * c];
                    q1[c] = xr[4 * c + 1];
                    q2[c] = xr[4 * c + 2];
                    q3[c] = xr[4 * c + 3];
                }
            } else {
                for (int64_t b = 0; b < SW; b++) {
                    float *restrict qr = q0 + b * PL;
                    for (int64_t c = clo; c < chi; c++)
                        qr[c] = xr[c * SW + b];
                }
            }
        }
        for (int64_t b = 0; b < SW; b++)
            for (int64_t c = 0; c < RLX_DW_VEC; c++)
                qa[b * PL + (HQ + 1) * WQ + c] = fill;
    }
}

/* rlx_conv_phase_fill with zeros in the pads (convolutions). */
static inline __attribute__((always_inline)) void rlx_conv_phase_copy(const float *restrict x, const rlx_conv_geom *g,
                                                                      float *restrict q)
{
    rlx_conv_phase_fill(x, g, q, 0.0f);
}

/* The max over the window of one plane x[H, W] (pads never win: -inf in them; NaN propagates, as rlx_pool_plane's),
 * returned WQ wide (output row oh at oh * WQ, columns OW .. WQ-1 dropped) inside q, which holds rlx_conv_dw_scratch
 * floats: the plane's stride-phase planes, then every tap one contiguous run over the whole output, as the depthwise
 * conv's (tap: rlx/codegen/cpu/conv.py's tap_offsets). On output rows the strided reads of a stride-2 window did not
 * vectorize (ResNet-18's 3 x 3 max pool: 0.37 ms at batch 1 on 2 threads). */
static inline __attribute__((always_inline)) const float *rlx_pool_max_phases(const float *restrict x,
        const rlx_conv_geom *g, const int64_t *restrict tap, float *restrict q)
{
    const int64_t L = g->OH * rlx_conv_dw_wq(g);
    float *restrict acc = q + g->SH * g->SW * rlx_conv_dw_phase(g);
    rlx_conv_phase_fill(x, g, q, -INFINITY);
    const int64_t taps = g->KH * g->KW;
    for (int64_t i = 0; i < L; i++)
        acc[i] = q[tap[0] + i];
    for (int64_t t = 1; t < taps; t++) {
        const float *restrict src = q + tap[t];
        /* a NaN taken stays (no number compares greater), a NaN met is taken */
        #pragma omp simd
        for (int64_t i = 0; i < L; i++) {
            const float v = src[i], a = acc[i];
            acc[i] = v > a || v != v ? v : a;
        }
    }
    return acc;
}

/* Floats of scratch rlx_conv_dw_plane<V> (kernels/conv_tile.h) needs: the phase planes, the WQ-wide output. */
static inline int64_t rlx_conv_dw_scratch(const rlx_conv_geom *g)
{
    const int64_t L = g->OH * rlx_conv_dw_wq(g);
    return g->SH * g->SW * rlx_conv_dw_phase(g) + (L + RLX_DW_VEC - 1) / RLX_DW_VEC * RLX_DW_VEC;
}

/* Direct convolution (groups == 1) on the stride-phase planes of every input channel.
 *
 * An image's channels are first copied, by the whole team, into their phase planes (rlx_conv_phase_copy; channel c
 * at c * CS floats, CS = SH*SW*rlx_conv_dw_phase) in the shared scratch. As in the depthwise conv, with the output
 * laid out WQ wide every tap (c, kh, kw) of a run of output pixels is then one contiguous run of a phase plane: a
 * tile of RLX_CONV_OR output channels x 2 vectors of consecutive (WQ-wide) output pixels is accumulated in 12
 * vector registers over every (c, tap), each step two unaligned loads of the plane, one broadcast of a weight per
 * channel (the weight [O, C*KH*KW] as stored: each tile row streams its own row) and twelve FMAs, the GEMM
 * micro-kernel's ratio, with no gathered copy of the receptive fields (nine times the input for a 3 x 3 window).
 * A thread's work unit is a block of output channels x a run of pixel panels; tiles land in its scratch (`stage`),
 * and the unit's store drops the columns OW .. WQ-1 and adds bias and activation on the way to the output. */
#define RLX_CONV_OR 6
#define RLX_CONV_CB 32

/* The register tile and the work unit come in two vector widths (ConvPlan.vector, decided from the target's
 * instruction set by rlx/opt/lowering_conv.py): kernels/conv_tile.h, included once per width, defines
 * rlx_conv_direct_tile<V> and rlx_conv_direct_unit<V> on GCC/Clang vectors of V floats, the tile RLX_CONV_OR output
 * channels x 2 V pixels (a panel: RLX_CONV_PX<V> pixels, below). 8 floats: one AVX2 register per vector; 16: one
 * AVX-512 register (twice the multiply-adds per instruction; where the target has no AVX-512 the compiler splits
 * each vector in two, the same sums). */
#define RLX_CONV_PX8 16
#define RLX_CONV_PX16 32

#define RLX_CONV_TILE_V 8
#define RLX_CONV_TILE_T rlx_dw_v8
#define RLX_CONV_TILE_TU rlx_dw_v8u
#include "conv_tile.h"
#define RLX_CONV_TILE_V 16
#define RLX_CONV_TILE_T rlx_cv16
#define RLX_CONV_TILE_TU rlx_cv16u
#include "conv_tile.h"

/* Winograd F(2x2, 3x3) convolution (3 x 3 window, stride 1, dilation 1, groups 1): each 2 x 2 block of output
 * pixels (a tile) is Y = A^T [ sum_c (G w G^T) .* (B^T d B) ] A, d the tile's 4 x 4 input patch. The 16 elements
 * e of the transformed tiles are 16 independent products M[e] = U[e] V[e] over the input channels (U[e]: [O, C], the
 * weight transformed once at set_param; V[e]: [C, tiles]), 16 multiply-adds per tile and channel pair instead of the
 * direct window's 36 (4 pixels x 9 taps). Transforms with exact coefficients (0, +-1, +-1/2): within a few ulps of
 * the direct sum.
 *
 * A tile's patch starts at input (2 th - PH, 2 tw - PW): the phase planes of a 4 x 4, stride-2 window
 * (rlx_conv_phase_copy with OH, OW = TH, TW tiles) make patch row a, column b one contiguous run along a row of
 * tiles (phase (a % 2, b % 2), offset (a / 2, b / 2)). The products run on the tiles numbered th * TW + tw, in
 * panels of PX (the register tile's pixels). */
#define RLX_WINO_E 16

/* U[e][o][c] (e = 4 xi + nu) = (G w[o, c] G^T)[xi][nu] of a weight w[O, C, 3, 3]; dims[0..1] = O, C. */
static void rlx_conv_winograd_weight(float *restrict U, const float *restrict w, const int64_t *dims)
{
    const int64_t O = dims[0], C = dims[1];
    for (int64_t o = 0; o < O; o++)
        for (int64_t c = 0; c < C; c++) {
            const float *g = w + (o * C + c) * 9;
            float t[4][3];  /* G g: rows of the 4 x 3 product */
            for (int j = 0; j < 3; j++) {
                t[0][j] = g[j];
                t[1][j] = 0.5f * (g[j] + g[3 + j] + g[6 + j]);
                t[2][j] = 0.5f * (g[j] - g[3 + j] + g[6 + j]);
                t[3][j] = g[6 + j];
            }
            for (int i = 0; i < 4; i++) {
                const float u[4] = {t[i][0], 0.5f * (t[i][0] + t[i][1] + t[i][2]),
                                    0.5f * (t[i][0] - t[i][1] + t[i][2]), t[i][2]};
                for (int j = 0; j < 4; j++)
                    U[((int64_t)(i * 4 + j) * O + o) * C + c] = u[j];
            }
        }
}

/* V[e] (e = 4 xi + nu, ldv floats apart) of one channel's TH x TW tiles, numbered i = th * TW + tw and laid out
 * panel by panel: (B^T d_i B)[xi][nu] at V + e * ldv + (i / PX) * lpan + i % PX (panels of PX tiles: the products then read each
 * panel's channels as one contiguous run); the last panel's tiles past TH * TW are zeros. q: the channel's phase planes
 * (PL floats apart, WQ wide: rlx_conv_phase_copy of the 4 x 4, stride-2 window). A panel is one or a few runs of
 * consecutive tiles of a row, each transformed straight into it (vectorized along the run). */
static inline __attribute__((always_inline)) void rlx_conv_winograd_input(const float *restrict q, int64_t PL,
        int64_t WQ, int64_t TH, int64_t TW, float *restrict V, int64_t ldv, int64_t lpan, const int64_t PX)
{
    const float *restrict q00 = q, *restrict q01 = q + PL, *restrict q10 = q + 2 * PL, *restrict q11 = q + 3 * PL;
    const int64_t L = TH * TW, npan = (L + PX - 1) / PX;
    for (int64_t p = 0; p < npan; p++) {
        const int64_t i0 = p * PX, end = L - i0 < PX ? L : i0 + PX;
        float *restrict vp = V + p * lpan - i0;
        for (int64_t i = i0; i < end;) {
            const int64_t th = i / TW, tw = i % TW, n = end - i < TW - tw ? end - i : TW - tw;
            const int64_t at = th * WQ + tw;  /* the run's first patch in the phase planes */
            float *restrict vi = vp + i;
            #pragma omp simd
            for (int64_t m = 0; m < n; m++) {
                float r[4][4];  /* B^T d, d[a][b] = patch row a, column b */
                for (int b = 0; b < 4; b++) {
                    const float *restrict qe = (b & 1 ? q01 : q00) + (b >> 1) + at + m;  /* rows 0 and 2 of column b */
                    const float *restrict qo = (b & 1 ? q11 : q10) + (b >> 1) + at + m;  /* rows 1 and 3 */
                    const float d0 = qe[0], d1 = qo[0], d2 = qe[WQ], d3 = qo[WQ];
                    r[0][b] = d0 - d2;
                    r[1][b] = d1 + d2;
                    r[2][b] = d2 - d1;
                    r[3][b] = d1 - d3;
                }
                for (int a = 0; a < 4; a++) {  /* (B^T d) B */
                    vi[(a * 4 + 0) * ldv + m] = r[a][0] - r[a][2];
                    vi[(a * 4 + 1) * ldv + m] = r[a][1] + r[a][2];
                    vi[(a * 4 + 2) * ldv + m] = r[a][2] - r[a][1];
                    vi[(a * 4 + 3) * ldv + m] = r[a][1] - r[a][3];
                }
            }
            i += n;
        }
        for (int e = 0; e < RLX_WINO_E; e++)  /* the last panel's tiles past L */
            for (int64_t i = end; i < i0 + PX; i++)
                vp[e * ldv + i] = 0.0f;
    }
}

/* The 2 x 2 outputs A^T m A of the TW tiles of one tile row: m[e] at M + e * ldm (tile tw at tw), output row 0 of
 * the tiles into r0[2 tw .. 2 tw + 1], row 1 into r1. */
static inline __attribute__((always_inline)) void rlx_conv_winograd_output(const float *restrict M, int64_t ldm,
        int64_t TW, float *restrict r0, float *restrict r1)
{
    #pragma omp simd
    for (int64_t i = 0; i < TW; i++) {
        float t[2][4];  /* A^T m */
        for (int b = 0; b < 4; b++) {
            const float m0 = M[b * ldm + i], m1 = M[(4 + b) * ldm + i];
            const float m2 = M[(8 + b) * ldm + i], m3 = M[(12 + b) * ldm + i];
            t[0][b] = m0 + m1 + m2;
            t[1][b] = m1 - m2 - m3;
        }
        r0[2 * i] = t[0][0] + t[0][1] + t[0][2];
        r0[2 * i + 1] = t[0][1] - t[0][2] - t[0][3];
        r1[2 * i] = t[1][0] + t[1][1] + t[1][2];
        r1[2 * i + 1] = t[1][1] - t[1][2] - t[1][3];
    }
}

/* Winograd F(4x4, 3x3) (Lavin and Gray's points 0, +-1, +-2 and infinity): each 4 x 4 block of output pixels is
 * Y = A^T [ sum_c (G w G^T) .* (B^T d B) ] A, d the block's 6 x 6 input patch; 36 products M[e] = U[e] V[e]
 * (e = 6 xi + nu), 36 multiply-adds per tile and channel pair for 16 output pixels (2.25 per pixel against
 * F(2x2)'s 4 and the direct window's 9). The patches start 4 apart: the phase planes of a 6 x 6, stride-4 window
 * (rlx_conv_phase_copy: 16 planes) make patch row a, column b one contiguous run along a row of tiles (phase
 * (a % 4, b % 4), offset (a / 4, b / 4)). Tiles, panels and V, M as F(2x2)'s. */
#define RLX_WINO4_E 36

/* U[e][o][c] (e = 6 xi + nu) = (G w[o, c] G^T)[xi][nu] of a weight w[O, C, 3, 3]; dims[0..1] = O, C. */
static void rlx_conv_winograd4_weight(float *restrict U, const float *restrict w, const int64_t *dims)
{
    const int64_t O = dims[0], C = dims[1];
    for (int64_t o = 0; o < O; o++)
        for (int64_t c = 0; c < C; c++) {
            const float *g = w + (o * C + c) * 9;
            float t[6][3];  /* G g: rows of the 6 x 3 product */
            for (int j = 0; j < 3; j++) {
                const float g0 = g[j], g1 = g[3 + j], g2 = g[6 + j];
                t[0][j] = g0 / 4.0f;
                t[1][j] = -(g0 + g1 + g2) / 6.0f;
                t[2][j] = -(g0 - g1 + g2) / 6.0f;
                t[3][j] = g0 / 24.0f + g1 / 12.0f + g2 / 6.0f;
                t[4][j] = g0 / 24.0f - g1 / 12.0f + g2 / 6.0f;
                t[5][j] = g2;
            }
            for (int i = 0; i < 6; i++) {
                const float g0 = t[i][0], g1 = t[i][1], g2 = t[i][2];
                const float u[6] = {g0 / 4.0f, -(g0 + g1 + g2) / 6.0f, -(g0 - g1 + g2) / 6.0f,
                                    g0 / 24.0f + g1 / 12.0f + g2 / 6.0f, g0 / 24.0f - g1 / 12.0f + g2 / 6.0f, g2};
                for (int j = 0; j < 6; j++)
                    U[((int64_t)(i * 6 + j) * O + o) * C + c] = u[j];
            }
        }
}

/* V[e] (e = 6 xi + nu, ldv floats apart) of one channel's TH x TP tiles, numbered i = th * TP + tw (TP = TW, or
 * WQ: then the tiles of column TW are computed and dropped, tile i's patch starts at phase-plane offset i and a
 * panel's tiles are one contiguous run): (B^T d_i B)[xi][nu] at V + e * ldv + (i / PX) * lpan + i % PX, zeros
 * past TH * TP in the last panel. q: the channel's 16 phase planes (PL floats apart, WQ wide: rlx_conv_phase_copy
 * of the 6 x 6, stride-4 window). */
static inline __attribute__((always_inline)) void rlx_conv_winograd4_input(const float *restrict q, int64_t PL,
        int64_t WQ, int64_t TH, int64_t TP, float *restrict V, int64_t ldv, int64_t lpan, const int64_t PX)
{
    const int64_t L = TH * TP, npan = (L + PX - 1) / PX;
    for (int64_t p = 0; p < npan; p++) {
        const int64_t i0 = p * PX, end = L - i0 < PX ? L : i0 + PX;
        float *restrict vp = V + p * lpan - i0;
        for (int64_t i = i0; i < end;) {
            const int64_t th = i / TP, tw = i % TP;
            const int64_t n = TP == WQ || end - i < TP - tw ? end - i : TP - tw;  /* runs of patches */
            const int64_t at = th * WQ + tw;  /* the run's first patch in the phase planes */
            float *restrict vi = vp + i;
            #pragma omp simd
            for (int64_t m = 0; m < n; m++) {
                float r[6][6];  /* B^T d, d[a][b] = patch row a, column b */
                #pragma GCC unroll 6
                for (int b = 0; b < 6; b++) {
                    const float *restrict qb = q + (b & 3) * PL + (b >> 2) + at + m;  /* phase row 0, column b */
                    const float d0 = qb[0], d1 = qb[4 * PL], d2 = qb[8 * PL], d3 = qb[12 * PL];
                    const float d4 = qb[WQ], d5 = qb[4 * PL + WQ];
                    r[0][b] = 4.0f * d0 - 5.0f * d2 + d4;
                    r[1][b] = -4.0f * (d1 + d2) + d3 + d4;
                    r[2][b] = 4.0f * (d1 - d2) - d3 + d4;
                    r[3][b] = 2.0f * (d3 - d1) - d2 + d4;
                    r[4][b] = 2.0f * (d1 - d3) - d2 + d4;
                    r[5][b] = 4.0f * d1 - 5.0f * d3 + d5;
                }
                #pragma GCC unroll 6
                for (int a = 0; a < 6; a++) {  /* (B^T d) B */
                    const float s0 = r[a][0], s1 = r[a][1], s2 = r[a][2], s3 = r[a][3], s4 = r[a][4], s5 = r[a][5];
                    vi[(a * 6 + 0) * ldv + m] = 4.0f * s0 - 5.0f * s2 + s4;
                    vi[(a * 6 + 1) * ldv + m] = -4.0f * (s1 + s2) + s3 + s4;
                    vi[(a * 6 + 2) * ldv + m] = 4.0f * (s1 - s2) - s3 + s4;
                    vi[(a * 6 + 3) * ldv + m] = 2.0f * (s3 - s1) - s2 + s4;
                    vi[(a * 6 + 4) * ldv + m] = 2.0f * (s1 - s3) - s2 + s4;
                    vi[(a * 6 + 5) * ldv + m] = 4.0f * s1 - 5.0f * s3 + s5;
                }
            }
            i += n;
        }
        for (int e = 0; e < RLX_WINO4_E; e++)  /* the last panel's tiles past L */
            for (int64_t i = end; i < i0 + PX; i++)
                vp[e * ldv + i] = 0.0f;
    }
}

/* The 4 x 4 outputs A^T m A of L tiles, tile-major: m[e] of tile i at M + e * ldm + i, its output pixel (h, j) at
 * R + (4 h + j) * ldr + i (one vector loop over every tile of an image, however short its rows). */
static inline __attribute__((always_inline)) void rlx_conv_winograd4_output(const float *restrict M, int64_t ldm,
        int64_t L, float *restrict R, int64_t ldr)
{
    #pragma omp simd
    for (int64_t i = 0; i < L; i++) {
        float t[4][6];  /* A^T m */
        #pragma GCC unroll 6
        for (int b = 0; b < 6; b++) {
            const float m0 = M[b * ldm + i], m1 = M[(6 + b) * ldm + i], m2 = M[(12 + b) * ldm + i];
            const float m3 = M[(18 + b) * ldm + i], m4 = M[(24 + b) * ldm + i], m5 = M[(30 + b) * ldm + i];
            const float p12 = m1 + m2, n12 = m1 - m2, p34 = m3 + m4, n34 = m3 - m4;
            t[0][b] = m0 + p12 + p34;
            t[1][b] = n12 + 2.0f * n34;
            t[2][b] = p12 + 4.0f * p34;
            t[3][b] = n12 + 8.0f * n34 + m5;
        }
        #pragma GCC unroll 4
        for (int h = 0; h < 4; h++) {
            const float p12 = t[h][1] + t[h][2], n12 = t[h][1] - t[h][2];
            const float p34 = t[h][3] + t[h][4], n34 = t[h][3] - t[h][4];
            R[(4 * h + 0) * ldr + i] = t[h][0] + p12 + p34;
            R[(4 * h + 1) * ldr + i] = n12 + 2.0f * n34;
            R[(4 * h + 2) * ldr + i] = p12 + 4.0f * p34;
            R[(4 * h + 3) * ldr + i] = n12 + 8.0f * n34 + t[h][5];
        }
    }
}

/* One output row of TW tiles from rlx_conv_winograd4_output's R: r[4 tw + j] = R[j * ldr + tw] (R at the row's
 * first tile of its (4 h)-th stream). */
static inline __attribute__((always_inline)) void rlx_conv_winograd4_row(const float *restrict R, int64_t ldr,
        int64_t TW, float *restrict r)
{
    #pragma omp simd
    for (int64_t tw = 0; tw < TW; tw++) {
        r[4 * tw] = R[tw];
        r[4 * tw + 1] = R[ldr + tw];
        r[4 * tw + 2] = R[2 * ldr + tw];
        r[4 * tw + 3] = R[3 * ldr + tw];
    }
}

/* Cells of window `o` along one axis that fall in [lo_bound, hi_bound) of input coordinates. */
static inline int64_t rlx_pool_cells(int64_t o, int64_t S, int64_t P, int64_t K, int64_t D, int64_t lo_bound,
                                     int64_t hi_bound)
{
    int64_t n = 0;
    for (int64_t k = 0; k < K; k++) {
        const int64_t i = o * S - P + k * D;
        n += i >= lo_bound && i < hi_bound;
    }
    return n;
}

/* Max (is_max) or average pooling of one plane x[H, W] into y[OH, OW]. Padding never wins a max;
 * an average divides by the window's cells inside the input, or (count_pad) inside the input and
 * its declared pads (PE* are the end pads). NaN propagates through a max. The window is walked row
 * by row over whole output rows (the inner loop runs along ow and vectorizes). */
static void rlx_pool_plane(const float *restrict x, float *restrict y, const rlx_conv_geom *g, int64_t PEH,
                           int64_t PEW, int is_max, int count_pad)
{
    for (int64_t oh = 0; oh < g->OH; oh++) {
        float *restrict yr = y + oh * g->OW;
        for (int64_t ow = 0; ow < g->OW; ow++)
            yr[ow] = is_max ? -INFINITY : 0.0f;
        for (int64_t kh = 0; kh < g->KH; kh++) {
            const int64_t ih = oh * g->SH - g->PH + kh * g->DH;
            if (ih < 0 || ih >= g->H)
                continue;
            const float *restrict xr = x + ih * g->W;
            for (int64_t kw = 0; kw < g->KW; kw++) {
                const int64_t off = kw * g->DW - g->PW;
                int64_t lo = off >= 0 ? 0 : (-off + g->SW - 1) / g->SW;
                int64_t hi = g->W - 1 - off < 0 ? 0 : (g->W - 1 - off) / g->SW + 1;
                if (hi > g->OW)
                    hi = g->OW;
                if (is_max) {
                    #pragma omp simd
                    for (int64_t ow = lo; ow < hi; ow++) {
                        const float v = xr[ow * g->SW + off], a = yr[ow];
                        yr[ow] = a != a ? a : (v > a || v != v ? v : a);
                    }
                } else {
                    #pragma omp simd
                    for (int64_t ow = lo; ow < hi; ow++)
                        yr[ow] += xr[ow * g->SW + off];
                }
            }
        }
        if (!is_max) {
            const int64_t nh = count_pad ? rlx_pool_cells(oh, g->SH, g->PH, g->KH, g->DH, -g->PH, g->H + PEH)
                                         : rlx_pool_cells(oh, g->SH, g->PH, g->KH, g->DH, 0, g->H);
            for (int64_t ow = 0; ow < g->OW; ow++) {
                const int64_t nw = count_pad ? rlx_pool_cells(ow, g->SW, g->PW, g->KW, g->DW, -g->PW, g->W + PEW)
                                             : rlx_pool_cells(ow, g->SW, g->PW, g->KW, g->DW, 0, g->W);
                yr[ow] /= (float)(nh * nw);
            }
        }
    }
}

#endif /* RLX_KERNELS_CONV_H */

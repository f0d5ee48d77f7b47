/* Convolution and pooling on channels-first planes (rlx/codegen/c_conv.py, templates/cpu/conv.c.j2).
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
        if (++ow == g->OW) {
            ow = 0;
            oh++;
        }
    }
}

/* y[OH, OW] = sum over the window of w[KH, KW] * x[H, W] on one plane (depthwise), no bias. */
static void rlx_conv_dw_plane(const float *restrict x, const float *restrict w, float *restrict y,
                              const rlx_conv_geom *g)
{
    for (int64_t oh = 0; oh < g->OH; oh++) {
        float *restrict yr = y + oh * g->OW;
        for (int64_t ow = 0; ow < g->OW; ow++)
            yr[ow] = 0.0f;
        for (int64_t kh = 0; kh < g->KH; kh++) {
            const int64_t ih = oh * g->SH - g->PH + kh * g->DH;
            if (ih < 0 || ih >= g->H)
                continue;
            const float *restrict xr = x + ih * g->W;
            for (int64_t kw = 0; kw < g->KW; kw++) {
                const float wv = w[kh * g->KW + kw];
                const int64_t off = kw * g->DW - g->PW;
                /* ow range whose input column ow*SW + off lies inside [0, W) */
                int64_t lo = off >= 0 ? 0 : (-off + g->SW - 1) / g->SW;
                int64_t hi = g->W - 1 - off < 0 ? 0 : (g->W - 1 - off) / g->SW + 1;
                if (hi > g->OW)
                    hi = g->OW;
                if (g->SW == 1) {
                    const float *restrict xs = xr + off;
                    #pragma omp simd
                    for (int64_t ow = lo; ow < hi; ow++)
                        yr[ow] += wv * xs[ow];
                } else {
                    for (int64_t ow = lo; ow < hi; ow++)
                        yr[ow] += wv * xr[ow * g->SW + off];
                }
            }
        }
    }
}

/* Max (is_max) or average pooling of one plane x[H, W] into y[OH, OW]. Padding never wins a max;
 * an average divides by the window's cells inside the input, or (count_pad) inside the input and
 * its declared pads (PE* are the end pads). NaN propagates through a max. */
static void rlx_pool_plane(const float *restrict x, float *restrict y, const rlx_conv_geom *g, int64_t PEH,
                           int64_t PEW, int is_max, int count_pad)
{
    for (int64_t oh = 0; oh < g->OH; oh++)
        for (int64_t ow = 0; ow < g->OW; ow++) {
            const int64_t ih0 = oh * g->SH - g->PH, iw0 = ow * g->SW - g->PW;
            float acc = is_max ? -INFINITY : 0.0f;
            int64_t n = 0, npad = 0;
            for (int64_t kh = 0; kh < g->KH; kh++) {
                const int64_t ih = ih0 + kh * g->DH;
                const int in_h = ih >= 0 && ih < g->H, pad_h = ih >= -g->PH && ih < g->H + PEH;
                for (int64_t kw = 0; kw < g->KW; kw++) {
                    const int64_t iw = iw0 + kw * g->DW;
                    if (pad_h && iw >= -g->PW && iw < g->W + PEW)
                        npad++;
                    if (!in_h || iw < 0 || iw >= g->W)
                        continue;
                    const float v = x[ih * g->W + iw];
                    n++;
                    if (is_max)
                        acc = (v > acc || v != v) && acc == acc ? v : acc;
                    else
                        acc += v;
                }
            }
            y[oh * g->OW + ow] = is_max ? acc : acc / (float)(count_pad ? npad : n);
        }
}

#endif /* RLX_KERNELS_CONV_H */

/* The AVX-512 f32 decode GEMV of kernels/quant_kernels.h (rlx_qdot_simd in 16-float vectors), built from the
 * same source on any x86-64 with -DRLX_QGEMV_VEC16 (each vector two AVX2 registers, or four SSE ones),
 * so machines without AVX-512 check its arithmetic; built with -march=x86-64-v3 alone, the AVX2 kernel
 * (tiles of 3 rows x 4 weight rows, 2 x 4 and 1 x 8 over 8 weight rows dequantized together)
 * (tests/codegen/test_c_qgemv_vec16.py):
 *   - every row of a step of M <= 16 rows at any place has the bits it has in the 16-row step
 *     (batch invariance: every tile gives a row the same arithmetic), and so has every weight row of
 *     a thread's range that starts or ends anywhere (a short last group of weight rows);
 *   - every result is within (K + 4) u sum|x w| + u |y| of the float64 product of X and the exactly
 *     dequantized weight (rlx_q_dequant_row, equal to rlx.ir.quant.dequantize bit for bit).
 * Prints VEC16-OK, or the first failures and FAIL. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { RLX_EPI_NONE = 0 };
static inline void rlx_epilogue_act(float *restrict c, int64_t ldc, int64_t mr, int64_t nc, int act)
{
    (void)c; (void)ldc; (void)mr; (void)nc; (void)act;
}
#include "kernels/threads.h"
#include "kernels/half.h"
#include "kernels/gemm.h"
#include "kernels/packed_gemm.h"
#include "kernels/quant_kernels.h"

#if !defined(RLX_QF32_AVX2) && RLX_QF32_TILE != 8
#error "not an 8-row SIMD kernel"
#endif

static uint32_t state = 12345u;
static uint32_t next(void)
{
    state = state * 1664525u + 1013904223u;
    return state >> 8;
}

int main(void)
{
    const double u = 5.9604644775390625e-8;
    const int fmts[3] = {RLX_Q8_0, RLX_Q4_0, RLX_Q4_1}, qbs[3] = {34, 18, 20};
    int fails = 0;
    for (int f = 0; f < 3; f++)
        for (int64_t K = 96; K <= 576; K += 480) {
            const int64_t N = 37, nb = K / 32, rb = nb * qbs[f];
            uint8_t *W = malloc((size_t)(N * rb));
            float *X = malloc(sizeof(float) * 16 * K), *Y = malloc(sizeof(float) * 16 * N);
            float *Ym = malloc(sizeof(float) * 16 * N);
            float *wrow = malloc(sizeof(float) * K), *deq = malloc(sizeof(float) * K);
            for (int64_t i = 0; i < N * rb; i++)
                W[i] = (uint8_t)next();
            for (int64_t n = 0; n < N; n++)
                for (int64_t b = 0; b < nb; b++) {  /* scales ~2^-7..2^-6 (d > 0), q4_1 mins < 0 */
                    uint16_t h = (uint16_t)(0x2000 + (next() & 0x3ff));
                    memcpy(W + n * rb + b * qbs[f], &h, 2);
                    if (fmts[f] == RLX_Q4_1) {
                        h = (uint16_t)(0xa000 + (next() & 0x3ff));
                        memcpy(W + n * rb + b * qbs[f] + 2, &h, 2);
                    }
                }
            for (int64_t i = 0; i < 16 * K; i++)
                X[i] = (float)((int)(next() % 20001) - 10000) / 3000.0f;
            rlx_qgemv(fmts[f], 32, qbs[f], 16, N, K, X, W, rb, Y, 0, N, wrow);
            for (int64_t M = 1; M <= 16; M++)
                for (int64_t at = 0; at + M <= 16; at += 3) {
                    rlx_qgemv(fmts[f], 32, qbs[f], M, N, K, X + at * K, W, rb, Ym, 0, N, wrow);
                    for (int64_t i = 0; i < M * N; i++)
                        if (memcmp(&Ym[i], &Y[at * N + i], sizeof(float)) && fails++ < 5)
                            printf("fmt %d K %ld: row %ld of a %ld-row step at %ld differs\n", f, (long)K,
                                   (long)(at + i / N), (long)M, (long)at);
                }
            for (int64_t cut = 1; cut < N; cut += 6) {  /* two threads' ranges [0, cut) and [cut, N) */
                rlx_qgemv(fmts[f], 32, qbs[f], 16, N, K, X, W, rb, Ym, 0, cut, wrow);
                rlx_qgemv(fmts[f], 32, qbs[f], 16, N, K, X, W, rb, Ym, cut, N, wrow);
                for (int64_t i = 0; i < 16 * N; i++)
                    if (memcmp(&Ym[i], &Y[i], sizeof(float)) && fails++ < 5)
                        printf("fmt %d K %ld: y[%ld, %ld] differs split at %ld\n", f, (long)K, (long)(i / N),
                               (long)(i % N), (long)cut);
            }
            for (int64_t n = 0; n < N; n++) {
                rlx_q_dequant_row(fmts[f], 32, qbs[f], W + n * rb, K, deq);
                for (int64_t i = 0; i < 16; i++) {
                    double exact = 0.0, terms = 0.0;
                    for (int64_t k = 0; k < K; k++) {
                        exact += (double)X[i * K + k] * (double)deq[k];
                        terms += fabs((double)X[i * K + k] * (double)deq[k]);
                    }
                    const double err = fabs((double)Y[i * N + n] - exact);
                    const double bound = (double)(K + 4) * u * terms + u * fabs(exact);
                    if (!(err <= bound) && fails++ < 5)
                        printf("fmt %d K %ld: y[%ld, %ld] = %.9g, exact %.9g, |err| %.3g > %.3g\n", f, (long)K,
                               (long)i, (long)n, Y[i * N + n], exact, err, bound);
                }
            }
            free(W); free(X); free(Y); free(Ym); free(wrow); free(deq);
        }
    puts(fails ? "FAIL" : "VEC16-OK");
    return fails != 0;
}

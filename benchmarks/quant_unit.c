/* The quantized decode GEMV through the kernel unit (kernels/quant.c, a separate object: runtime sizes, one
 * call per weight matrix) against the same kernels inlined with K, N and the row bytes as constants, as a
 * program compiled them before the unit (benchmarks/quant_unit.py builds and runs this). SmolLM2-135M's
 * q4_1 shapes (K = 576; N = 576, 1536, 192 in turn), weights cycled through ~70 MB so they stream from
 * memory as in decode; f32 activations (rlx_qgemv) and int16 ones (rlx_q8gemm, q16), 1 and 4 rows.
 * One thread; times are the thread's CPU time (robust to other processes), the best of `rounds`.
 * Prints one line per case; "inline runtime K" is the inlined kernel with K unknown to the compiler. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
/* the bench TU defines its own copies of the format-free helpers (quant_kernels.h defines them) */
#define rlx_q_act_round_trip bench_act_round_trip
#include "kernels/half.h"
#include "kernels/scalar.h"
#include "kernels/quant_kernels.h"

#define K 576
#define NB (K / 32)
#define RB (NB * 20)
#define NMAT 128
static const int64_t Ns[3] = {576, 1536, 192};

static double now(void) { struct timespec t; clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t); return t.tv_sec + 1e-9 * t.tv_nsec; }

__attribute__((noipa)) static void inl_f32(int64_t M, int64_t N, const float *X, const uint8_t *W, float *Y, float *wrow)
{   /* N is one of three constants in the generated code: switch so the compiler sees it */
    switch (N) {
    case 576: rlx_qgemv(RLX_Q4_1, 32, 20, M, 576, K, X, W, RB, Y, 0, 576, wrow); break;
    case 1536: rlx_qgemv(RLX_Q4_1, 32, 20, M, 1536, K, X, W, RB, Y, 0, 1536, wrow); break;
    default: rlx_qgemv(RLX_Q4_1, 32, 20, M, 192, K, X, W, RB, Y, 0, 192, wrow); break;
    }
}
__attribute__((noipa)) static void inl_q16(int64_t M, int64_t N, const int8_t *Xq, const float *xds, const uint8_t *W, float *Y)
{
    switch (N) {
    case 576: rlx_q8gemm(RLX_Q4_1, 1, M, 576, K, Xq, xds, W, RB, Y, 0, 576); break;
    case 1536: rlx_q8gemm(RLX_Q4_1, 1, M, 1536, K, Xq, xds, W, RB, Y, 0, 1536); break;
    default: rlx_q8gemm(RLX_Q4_1, 1, M, 192, K, Xq, xds, W, RB, Y, 0, 192); break;
    }
}

/* the inlined kernel with K a runtime value (what the unit sees) */
__attribute__((noipa)) static void inl_f32_rtk(int64_t M, int64_t N, int64_t k, const float *X, const uint8_t *W, float *Y, float *wrow)
{
    rlx_qgemv(RLX_Q4_1, 32, 20, M, N, k, X, W, k / 32 * 20, Y, 0, N, wrow);
}
volatile int64_t vk = K;

int main(int argc, char **argv)
{
    const int rounds = argc > 1 ? atoi(argv[1]) : 5;
    uint8_t *W = malloc((size_t)NMAT * 1536 * RB);
    for (size_t i = 0; i < (size_t)NMAT * 1536 * RB; i++) W[i] = (uint8_t)(i * 2654435761u >> 13);
    for (size_t r = 0; r < (size_t)NMAT * 1536; r++) for (int b = 0; b < NB; b++) {
        uint16_t h = 0x2000 + (r + b) % 1000; memcpy(W + r * RB + b * 20, &h, 2); h = 0xa000 + (r * 7 + b) % 1000; memcpy(W + r * RB + b * 20 + 2, &h, 2); }
    float X[16 * K], Y[16 * 1536], wrow[K], xds[2 * 16 * NB];
    int8_t Xq[16 * 2 * K];
    for (int i = 0; i < 16 * K; i++) X[i] = (float)((i * 37) % 200 - 100) / 50.0f;
    rlx_q8_quantize_rows_q4_1_q16(16, K, X, Xq, xds);
    double best[2][3][2];  /* [f32|q16][inline|unit][M=1|M=4] */
    for (int a = 0; a < 2; a++) for (int v = 0; v < 3; v++) for (int m = 0; m < 2; m++) best[a][v][m] = 1e9;
    double check = 0;
    for (int r = 0; r < rounds; r++)
        for (int a = 0; a < 2; a++) for (int m = 0; m < 2; m++) for (int v = 0; v < (a ? 2 : 3); v++) {
            const int64_t M = m ? 4 : 1;
            const double t0 = now();
            for (int j = 0; j < NMAT * 3; j++) {
                const int64_t N = Ns[j % 3];
                const uint8_t *w = W + (size_t)(j % NMAT) * 1536 * RB;
                if (a == 0) { if (v == 0) inl_f32(M, N, X, w, Y, wrow); else if (v == 1) rlx_qgemv_q4_1(M, N, K, X, w, RB, Y, 0, N, wrow); else inl_f32_rtk(M, N, vk, X, w, Y, wrow); }
                else { if (v == 0) inl_q16(M, N, Xq, xds, w, Y); else rlx_q8gemm_q4_1_q16(M, N, K, Xq, xds, w, RB, Y, 0, N); }
                check += Y[0];  /* keeps the products live */
            }
            const double t = (now() - t0) / (NMAT * 3) * 1e6;
            if (t < best[a][v][m]) best[a][v][m] = t;
        }
    for (int a = 0; a < 2; a++) for (int m = 0; m < 2; m++)
    {
        printf("%s M=%d: inline %.2f us/matrix, unit %.2f us/matrix (unit/inline %.3f)", a ? "q16" : "f32", m ? 4 : 1,
               best[a][0][m], best[a][1][m], best[a][1][m] / best[a][0][m]);
        if (a == 0)
            printf(", inline runtime K %.2f", best[a][2][m]);
        printf("\n");
    }
    fprintf(stderr, "check %g\n", check);
    return 0;
}

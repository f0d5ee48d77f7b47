/* Prefill with quantized weights: panels [p0, p1) of RLX_QP weight rows, each dequantized by the kernel
 * unit (kernels/quant.h: rlx_q_dequant_panel_<fmt>) into per-thread scratch, then multiplied by the
 * packed GEMM (kernels/packed_gemm.h, whose micro-kernel is the kernel unit kernels/packed_core.c).
 * Needs kernels/packed_gemm.h and kernels/quant.h. Here, not in the unit: without a micro-kernel
 * the GEMM is the program's BLAS (the provider's symbols are the program's).
 * A fixed RLX kernel header: no template code; included by generated files that need it. */
#ifndef RLX_KERNELS_QGEMM_PANELS_H
#define RLX_KERNELS_QGEMM_PANELS_H

#include <stdint.h>

/* Y[:, panel columns] = X @ (the panel's rows)^T for panels [p0, p1). `panel`: K * RLX_QP floats
 * (64-byte aligned), `wrow`: K floats. One call of `dequant` per panel. */
static void rlx_qgemm_panels(rlx_q_panel_fn dequant, int64_t M, int64_t N, int64_t K, const float *X,
                             const uint8_t *W, int64_t rb, float *Y, int64_t p0, int64_t p1, float *restrict panel,
                             float *restrict wrow)
{
    for (int64_t p = p0; p < p1; p++) {
        const int64_t j0 = p * RLX_QP, nr = N - j0 < RLX_QP ? N - j0 : RLX_QP;
        dequant(W + j0 * rb, rb, K, nr, panel, wrow);
        rlx_pgemm(M, nr, K, X, K, panel, Y + j0, N, NULL, RLX_EPI_NONE, 0, rlx_pgemm_tiles(M, nr));
    }
}

#endif /* RLX_KERNELS_QGEMM_PANELS_H */

/* The CUDA token feedback kernels (templates/cuda/kernels/feedback.cuh) on the CPU through cuda_shim.h, launched
 * as templates/cuda/feedback.cu.j2 launches them, with grids smaller than the rows so the grid-stride loops wrap
 * (tests/codegen/test_cuda_feedback_emulated.py). */
#include "cuda_shim.h"

#include "feedback.cuh"

extern "C" {

int emu_token_feed(const int32_t *x, const int32_t *src, const int32_t *last, int32_t *y, int64_t rows, int64_t seq,
                   int64_t slots, unsigned grid, unsigned threads) {
    rlx_emu_launch(grid, threads, [&] { rlx_token_feed(x, src, last, y, rows, seq, slots); });
    return 0;
}

int emu_token_store(const int32_t *x, const int32_t *dst, int32_t *last, int32_t *y, int64_t rows, int64_t slots,
                    unsigned grid, unsigned threads) {
    rlx_emu_launch(grid, threads, [&] { rlx_token_store(x, dst, last, y, rows, slots); });
    return 0;
}
}

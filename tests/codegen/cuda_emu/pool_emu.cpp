/* The CUDA pooling-tail kernel (templates/cuda/kernels/pool.cuh) on the CPU through cuda_shim.h, launched as
 * templates/cuda/pool.cu.j2 launches it (tests/codegen/test_cuda_pool_emulated.py). f32 data: VEC 4 (16-byte
 * loads) or 1. */
#include "cuda_shim.h"

struct uint4 {
    unsigned x, y, z, w;
};
template <typename T> inline T __ldg(const T *p) { return *p; }
template <typename TO, typename TI> inline TO rlx_cvt(TI x) { return (TO)x; }
template <typename V> inline V rlx_max(V a, V b) { return (a != a || a > b) ? a : b; }
#include "pool.cuh"

extern "C" {

int emu_pool_tail(const float *x, const float *mask, float *out, int64_t batch, int64_t seq, int hidden, int vec,
                  int norm, int threads, float eps_count, float eps_norm) {
    if (vec != 1 && vec != 4) return -1;
    RlxDim3 grid;
    grid.x = (unsigned)batch;
    const size_t smem = rlx_pool_tail_smem(hidden, vec, threads);
    rlx_emu_launch3(grid, (unsigned)threads, smem, [&] {
        if (vec == 4 && norm) rlx_pool_tail<float, float, float, 4, true>(x, mask, out, seq, hidden, eps_count, eps_norm);
        else if (vec == 4) rlx_pool_tail<float, float, float, 4, false>(x, mask, out, seq, hidden, eps_count, eps_norm);
        else if (norm) rlx_pool_tail<float, float, float, 1, true>(x, mask, out, seq, hidden, eps_count, eps_norm);
        else rlx_pool_tail<float, float, float, 1, false>(x, mask, out, seq, hidden, eps_count, eps_norm);
    });
    return 0;
}

/* rlx_pool_tail_norm (CPT 2: at most 64 chunks of VEC elements) for f32 data: nk 1 layer norm, 2 RMS norm. */
int emu_pool_tail_norm(const float *nx, const float *nres, const float *gamma, const float *beta, float eps,
                       const float *mask, float *out, int64_t batch, int64_t seq, int hidden, int vec, int nk,
                       int res, int threads, float eps_count, float eps_norm) {
    if ((vec != 1 && vec != 4) || hidden % vec || hidden / vec > 64) return -1;
    RlxDim3 grid;
    grid.x = (unsigned)batch;
    const size_t smem = rlx_pool_tail_norm_smem(hidden, threads);
#define RLX_EMU_NORM(V, NK, RES) \
    rlx_pool_tail_norm<float, float, float, V, true, NK, RES, 2>(nx, nres, gamma, beta, eps, mask, out, seq, hidden, \
                                                                  eps_count, eps_norm)
    rlx_emu_launch3(grid, (unsigned)threads, smem, [&] {
        if (vec == 4 && nk == 1 && res) RLX_EMU_NORM(4, 1, true);
        else if (vec == 4 && nk == 1) RLX_EMU_NORM(4, 1, false);
        else if (vec == 4 && res) RLX_EMU_NORM(4, 2, true);
        else if (vec == 4) RLX_EMU_NORM(4, 2, false);
        else if (nk == 1 && res) RLX_EMU_NORM(1, 1, true);
        else if (nk == 1) RLX_EMU_NORM(1, 1, false);
        else if (res) RLX_EMU_NORM(1, 2, true);
        else RLX_EMU_NORM(1, 2, false);
    });
#undef RLX_EMU_NORM
    return 0;
}

}  // extern "C"

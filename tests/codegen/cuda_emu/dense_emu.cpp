/* Entry points running the one-row dense 16-bit decode GEMV (templates/cuda/kernels/dense_gemv.cuh, rlx_dgemv) on the
 * CPU through cuda_shim.h / quant_shim.h (tests/codegen/test_cuda_dense_emulated.py), with f32 activations and
 * outputs, f16 or bf16 weights as their bits. The launch arithmetic of templates/cuda/dense.cu.j2, except that the
 * tile width (lg) and a cap on the grid are the caller's. */
#include "quant_shim.h"

#define RLX_DGEMV_LDG(p) (*(p))

#include "quant.cuh"
#include "dense_gemv.cuh"

template <bool BF, bool NORM, int EPI, bool VEC>
static void d_gemv(const float *X, const float *gamma, float eps, const RlxQMembers &mem, const float *res, int64_t K,
                   int lg, unsigned max_grid) {
    const int C = 8 << lg;
    int64_t tiles = (mem.n[0] + C - 1) / C;
    if (EPI == 0)
        for (int j = 1; j < mem.count; j++)
            tiles += (mem.n[j] + C - 1) / C;
    RlxDim3 grid;
    grid.x = (unsigned)(tiles < (int64_t)max_grid ? tiles : max_grid);
    const size_t smem = (size_t)rlx_dgemv_smem(K, lg, EPI == 2 ? 2 : 1) * sizeof(float);
    rlx_emu_launch3(grid, RLX_DGEMV_THREADS, smem,
                    [&] { rlx_dgemv<float, BF, NORM, EPI, VEC>(X, gamma, eps, mem, res, K, lg); });
}

template <bool BF, bool VEC>
static void d_kind(int kind, const float *X, const float *gamma, float eps, const RlxQMembers &mem, const float *res,
                   int64_t K, int lg, unsigned max_grid) {
    switch (kind) {
    case 0: d_gemv<BF, false, 0, VEC>(X, gamma, eps, mem, res, K, lg, max_grid); break;
    case 1: d_gemv<BF, true, 2, VEC>(X, gamma, eps, mem, res, K, lg, max_grid); break;
    case 2: d_gemv<BF, false, 1, VEC>(X, gamma, eps, mem, res, K, lg, max_grid); break;
    default: d_gemv<BF, true, 0, VEC>(X, gamma, eps, mem, res, K, lg, max_grid); break;
    }
}

extern "C" {
/* rlx_dgemv over `count` (1..4) members [K, n_j] (16-bit bits, bf16 if `bf` else f16), outputs ys[j], one row of X.
   kind: 0 plain, 1 norm + SwiGLU (members 0 and 1 the gate and the up matrix, output ys[0]), 2 residual (one member),
   3 norm, plain outputs. lg: the tile width (8 << lg columns); at most max_grid blocks. */
void emu_dgemv(int bf, int kind, const float *X, const float *gamma, float eps, int count, const uint16_t *const *ws,
               float *const *ys, const int64_t *ns, const float *res, int64_t K, int lg, unsigned max_grid) {
    RlxQMembers mem;
    std::memset(&mem, 0, sizeof(mem));
    bool vec = true;
    for (int j = 0; j < count; j++) {
        mem.w[j] = (const uint8_t *)ws[j];
        mem.y[j] = ys[j];
        mem.n[j] = ns[j];
        vec = vec && ns[j] % 8 == 0;
    }
    mem.count = count;
    if (bf && vec)
        d_kind<true, true>(kind, X, gamma, eps, mem, res, K, lg, max_grid);
    else if (bf)
        d_kind<true, false>(kind, X, gamma, eps, mem, res, K, lg, max_grid);
    else if (vec)
        d_kind<false, true>(kind, X, gamma, eps, mem, res, K, lg, max_grid);
    else
        d_kind<false, false>(kind, X, gamma, eps, mem, res, K, lg, max_grid);
}
}

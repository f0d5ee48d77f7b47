/* Entry points running the CUDA MoE kernels (templates/cuda/kernels/moe.cuh) on the CPU through cuda_shim.h, with
 * the launch arithmetic of templates/cuda/moe.cu.j2 written out (tests/codegen/test_cuda_moe_emulated.py). The
 * block-format experts go through kernels/quant.cuh's rlx_q_sub, which reads f16 scales (quant_shim.h). */
#include "quant_shim.h"

/* moe.cuh's f32-weight loop, instantiated (never run) for the block formats' byte weights: the shim's f32 and
   _Float16 overloads would both take a byte */
inline float rlx_f(unsigned char x) { return (float)x; }

#include "quant.cuh"
#include "moe.cuh"

static unsigned rlx_emu_blocks(int64_t n, int t) { return (unsigned)((n + t - 1) / t); }

extern "C" {

void emu_moe_topk(const float *L, int32_t *ids, int64_t rows, int64_t E, int k) {
    rlx_emu_launch(rlx_emu_blocks(rows, 128), 128, [&] { rlx_moe_topk<float>(L, ids, rows, E, k); });
}

void emu_moe_gate(const float *L, const int32_t *ids, float *G, int64_t rows, int64_t E, int k, int normalize) {
    rlx_emu_launch(rlx_emu_blocks(rows, 128), 128, [&] { rlx_moe_gate<float, float>(L, ids, G, rows, E, k, normalize); });
}

/* The grouped path (scratch: 2 * (E + 1) + tokens * top_k int32). */
static void emu_grouped(int fmt, const float *X, int x_per_pair, const int32_t *ids, int top_k, const void *W,
                        float *Y, int64_t pairs, int64_t E, int64_t N, int64_t K, int64_t RB, int32_t *scratch) {
    int32_t *start = scratch, *tile_off = start + E + 1, *order = tile_off + E + 1;
    rlx_emu_launch(1, 32, [&] { rlx_moe_sort<float>(ids, pairs, E, N, Y, start, tile_off, order); });
    RlxDim3 grid;
    grid.x = (unsigned)((N + RLX_MOE_TILE - 1) / RLX_MOE_TILE);
    grid.y = (unsigned)((pairs + RLX_MOE_TILE - 1) / RLX_MOE_TILE + E);
    const uint8_t *Wq = (const uint8_t *)W;
    const float *Wf = (const float *)W;
    rlx_emu_launch3(grid, 256, 0, [&] {
        switch (fmt) {
        case RLX_Q8_0: rlx_moe_group_gemm<float, uint8_t, float, RLX_Q8_0, 32, 34>(X, x_per_pair, top_k, nullptr, Wq, Y, start, tile_off, order, E, N, K, RB); break;
        case RLX_Q4_1: rlx_moe_group_gemm<float, uint8_t, float, RLX_Q4_1, 32, 20>(X, x_per_pair, top_k, nullptr, Wq, Y, start, tile_off, order, E, N, K, RB); break;
        case RLX_Q4_K: rlx_moe_group_gemm<float, uint8_t, float, RLX_Q4_K, 256, 144>(X, x_per_pair, top_k, nullptr, Wq, Y, start, tile_off, order, E, N, K, RB); break;
        default: rlx_moe_group_gemm<float, float, float, -1, 32, 1>(X, x_per_pair, top_k, Wf, nullptr, Y, start, tile_off, order, E, N, K, RB); break;
        }
    });
}

/* fmt < 0: f32 experts [E, N, K]; else a block format of quant.cuh ([E, N, RB] bytes). With `scratch` the grouped
 * path (moe.cu.j2 takes it for steps of more than gemv_max_pairs pairs), else one warp per pair and row. */
void emu_moe_matmul(int fmt, const float *X, int x_per_pair, const int32_t *ids, int top_k, const void *W, float *Y,
                    int64_t tokens, int64_t E, int64_t N, int64_t K, int64_t RB, int32_t *scratch) {
    const int64_t pairs = tokens * top_k;
    if (scratch) {
        emu_grouped(fmt, X, x_per_pair, ids, top_k, W, Y, pairs, E, N, K, RB, scratch);
        return;
    }
    const unsigned blocks = (unsigned)(pairs * ((N + RLX_MOE_WARPS - 1) / RLX_MOE_WARPS));
    const uint8_t *Wq = (const uint8_t *)W;
    rlx_emu_launch(blocks, 32 * RLX_MOE_WARPS, [&] {
        switch (fmt) {
        case RLX_Q8_0: rlx_moe_qgemv<float, float, RLX_Q8_0, 32, 34>(X, x_per_pair, ids, top_k, Wq, Y, E, N, K, RB); break;
        case RLX_Q4_1: rlx_moe_qgemv<float, float, RLX_Q4_1, 32, 20>(X, x_per_pair, ids, top_k, Wq, Y, E, N, K, RB); break;
        case RLX_Q4_K: rlx_moe_qgemv<float, float, RLX_Q4_K, 256, 144>(X, x_per_pair, ids, top_k, Wq, Y, E, N, K, RB); break;
        default: rlx_moe_gemv<float, float, float>(X, x_per_pair, ids, top_k, (const float *)W, Y, E, N, K); break;
        }
    });
}

}

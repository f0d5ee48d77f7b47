/* Entry points running the CUDA MoE kernels (templates/cuda/kernels/moe.cuh) on the CPU through cuda_shim.h, with
 * the launch arithmetic of templates/cuda/moe.cu.j2 written out (tests/codegen/test_cuda_moe_emulated.py). The
 * block-format experts go through kernels/quant.cuh's rlx_q_sub, which reads f16 scales: the shim's __half is
 * the bits, widened exactly here. */
#include <cstring>

#include "cuda_shim.h"

struct __half {
    uint16_t bits;
};
inline __half __ushort_as_half(unsigned short u) { return __half{u}; }
inline float __half2float(__half h) {  /* IEEE binary16 -> binary32, exact (subnormals included) */
    const uint32_t sign = (uint32_t)(h.bits >> 15) << 31, exp = (h.bits >> 10) & 31, man = h.bits & 1023;
    float v;
    if (exp == 0)
        v = std::ldexp((float)man, -24);
    else if (exp == 31)
        v = man ? NAN : INFINITY;
    else
        v = std::ldexp((float)(man | 1024), (int)exp - 25);
    return sign ? -v : v;
}
inline float __int_as_float(int32_t b) {
    float v;
    std::memcpy(&v, &b, sizeof(v));
    return v;
}
using std::isnan;
/* named by quant.cuh's other kernels (not run here) */
struct float4 {
    float x, y, z, w;
};
inline float4 make_float4(float x, float y, float z, float w) { return float4{x, y, z, w}; }
struct uint4 {
    uint32_t x, y, z, w;
};
inline float __uint_as_float(uint32_t b) {
    float v;
    std::memcpy(&v, &b, sizeof(v));
    return v;
}
inline uint32_t __byte_perm(uint32_t x, uint32_t y, uint32_t s) {  /* CUDA's default mode: 4 byte selectors */
    const uint64_t both = (uint64_t)y << 32 | x;
    uint32_t r = 0;
    for (int i = 0; i < 4; i++)
        r |= (uint32_t)((both >> (8 * ((s >> (4 * i)) & 7))) & 0xFF) << (8 * i);
    return r;
}
#define __grid_constant__
/* moe.cuh's f32-weight loop, instantiated (never run) for the block formats' byte weights: the shim's f32 and
   _Float16 overloads would both take a byte */
inline float rlx_f(unsigned char x) { return (float)x; }
inline float rsqrtf(float x) { return 1.0f / std::sqrt(x); }
inline void __syncwarp() { rlx_emu_warp_bar->arrive_and_wait(); }

#undef __shared__
#define __shared__ /* quant.cuh's `extern __shared__` arrays: declared, never used by these entry points */
#include "quant.cuh"
#undef __shared__
#define __shared__ static
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

/* A CPU stand-in for the CUDA features the SSM and KV-attention kernels use (tests only): each block's threads run as
 * std::threads, __syncthreads is a barrier of the block, warp shuffles exchange through a per-warp slot
 * array between two barriers of the warp, __shared__ arrays are function statics (blocks run one at a
 * time), dynamic shared memory one buffer, atomics std::atomic_ref. Enough to check the index arithmetic and
 * synchronization of kernels/ssm.cuh, kernels/kv_attention.cuh and kernels/kv_decode.cuh without a GPU. */
#pragma once
#include <barrier>
#include <cmath>
#include <cstdint>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

struct RlxDim3 {
    unsigned x = 1, y = 1, z = 1;
};
inline RlxDim3 blockDim, gridDim;
inline thread_local RlxDim3 threadIdx, blockIdx;
inline thread_local std::barrier<> *rlx_emu_block_bar = nullptr;
inline thread_local std::barrier<> *rlx_emu_warp_bar = nullptr;
inline thread_local float *rlx_emu_warp_slots = nullptr;

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __restrict__
#define __launch_bounds__(...)
#define __shared__ static

inline std::vector<float> rlx_emu_dynamic_smem;
#define RLX_DYNAMIC_SHARED(type, name) type *name = (type *)rlx_emu_dynamic_smem.data()

inline void __syncthreads() { rlx_emu_block_bar->arrive_and_wait(); }
inline void __threadfence() { std::atomic_thread_fence(std::memory_order_seq_cst); }
inline void __threadfence_system() { std::atomic_thread_fence(std::memory_order_seq_cst); }
[[noreturn]] inline void __trap() { std::abort(); }
inline void rlx_pdl_wait() {}
inline void rlx_pdl_trigger() {}
#define RLX_KV_PREFETCH(p) ((void)(p))
template <typename T> inline T __ldcg(const T *p) { return *p; }
inline int atomicAdd(int32_t *p, int v) { return std::atomic_ref<int32_t>(*p).fetch_add(v); }
inline uint32_t atomicAdd(uint32_t *p, uint32_t v) { return std::atomic_ref<uint32_t>(*p).fetch_add(v); }
inline int atomicOr(int32_t *p, int v) { return std::atomic_ref<int32_t>(*p).fetch_or(v); }
inline float __expf(float x) { return std::exp(x); }
inline float __shfl_xor_sync(unsigned, float v, int off) {
    const int lane = threadIdx.x % 32;
    rlx_emu_warp_slots[lane] = v;
    rlx_emu_warp_bar->arrive_and_wait();
    const float other = rlx_emu_warp_slots[lane ^ off];
    rlx_emu_warp_bar->arrive_and_wait();
    return other;
}
inline float rlx_f(float x) { return x; }
/* the prelude's warp sum (templates/cuda/prelude.cuh.j2), over the emulated shuffle */
inline float rlx_warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
template <typename T> inline T rlx_to(float x) { return (T)x; }

/* Run kernel(args...) over a grid of blocks of `block` threads (block a multiple of 32), one block at a time, in
 * x-fastest order, with `smem_bytes` of dynamic shared memory. */
template <typename F> void rlx_emu_launch3(RlxDim3 grid, unsigned block, size_t smem_bytes, F kernel) {
    blockDim.x = block;
    gridDim = grid;
    rlx_emu_dynamic_smem.assign((smem_bytes + sizeof(float) - 1) / sizeof(float), 0.0f);
    for (unsigned bz = 0; bz < grid.z; ++bz)
        for (unsigned by = 0; by < grid.y; ++by)
            for (unsigned bx = 0; bx < grid.x; ++bx) {
                std::barrier<> bar(block);
                std::vector<std::unique_ptr<std::barrier<>>> warps;
                std::vector<float> slots(block);
                for (unsigned w = 0; w < block / 32; ++w) warps.push_back(std::make_unique<std::barrier<>>(32));
                std::vector<std::thread> threads;
                for (unsigned t = 0; t < block; ++t)
                    threads.emplace_back([&, t] {
                        threadIdx.x = t;
                        blockIdx.x = bx;
                        blockIdx.y = by;
                        blockIdx.z = bz;
                        rlx_emu_block_bar = &bar;
                        rlx_emu_warp_bar = warps[t / 32].get();
                        rlx_emu_warp_slots = slots.data() + (t / 32) * 32;
                        kernel();
                    });
                for (auto &th : threads) th.join();
            }
}

/* Run kernel(args...) over `grid` blocks of `block` threads (block a multiple of 32). */
template <typename F> void rlx_emu_launch(unsigned grid, unsigned block, F kernel) {
    RlxDim3 g;
    g.x = grid;
    rlx_emu_launch3(g, block, 0, kernel);
}

/* kernels/kv_decode.cuh: its 16-byte load type, and f16 caches as the compiler's _Float16 (x86-64 g++ 12+) */
struct alignas(16) RlxEmuVec16 {
    unsigned char bytes[16];
};
#define RLX_KVD_VEC16 RlxEmuVec16
/* CUDA's 8-byte float pair (the decode merge's loads) */
struct alignas(8) float2 {
    float x, y;
};
inline float2 make_float2(float x, float y) { return float2{x, y}; }
inline float rlx_f(_Float16 x) { return (float)x; }

/* kernels/kv_f8.cuh's cache type on the CPU: an e4m3fn byte (bias 7, no infinity, 0x7f / 0xff NaN), stored from f32
   with round-to-nearest-even saturating at +-448 as CUDA's satfinite conversion does (and rlx.reference stores). */
struct __nv_fp8_e4m3 {
    unsigned char __x;
};
inline float rlx_f(__nv_fp8_e4m3 v) {
    const int e = (v.__x >> 3) & 15, m = v.__x & 7;
    if (e == 15 && m == 7) return NAN;
    const float mag = e == 0 ? std::ldexp((float)m, -9) : std::ldexp((float)(8 + m), e - 10);
    return v.__x & 0x80 ? -mag : mag;
}
template <> inline __nv_fp8_e4m3 rlx_to<__nv_fp8_e4m3>(float x) {
    __nv_fp8_e4m3 r;
    if (std::isnan(x)) {
        r.__x = 0x7f;
        return r;
    }
    const double a = std::fabs((double)x);
    int bits;
    if (a < 0.015625) {  /* subnormal: steps of 2^-9 (a carry to 8 is the smallest normal, 2^-6) */
        bits = (int)std::nearbyint(a * 512.0);
    } else {             /* binade 2^e, steps of 2^(e-3); a carry to 16 is the next binade's first value */
        int e;
        std::frexp(a, &e);
        e -= 1;
        const int q = (int)std::nearbyint(std::ldexp(a, 3 - e));
        bits = e > 8 ? 0x7f : (e + 7) * 8 + q - 8;
    }
    r.__x = (unsigned char)((bits > 0x7e ? 0x7e : bits) | (std::signbit(x) ? 0x80 : 0));
    return r;
}

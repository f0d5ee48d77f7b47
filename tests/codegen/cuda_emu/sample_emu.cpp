/* Entry point running the CUDA sampling kernel (templates/cuda/kernels/sample.cuh) on the CPU through
 * cuda_shim.h, plus the warp votes, matches, integer shuffles and shared-memory atomics that kernel uses
 * (tests/codegen/test_cuda_sample_emulated.py). Blocks run one at a time, so per-thread exchange slots
 * can be indexed by threadIdx.x; each exchange sits between two barriers of the warp. */
#include <atomic>

#include "cuda_shim.h"

static uint64_t rlx_emu_slots64[1024];

template <typename V> static V rlx_emu_exchange(V v, int from_lane) {
    const unsigned base = threadIdx.x & ~31u;
    rlx_emu_slots64[threadIdx.x] = (uint64_t)v;
    rlx_emu_warp_bar->arrive_and_wait();
    const V other = (V)rlx_emu_slots64[base + (unsigned)from_lane];
    rlx_emu_warp_bar->arrive_and_wait();
    return other;
}

inline uint32_t __shfl_xor_sync(unsigned, uint32_t v, int off) {
    return rlx_emu_exchange<uint32_t>(v, (int)(threadIdx.x & 31u) ^ off);
}
inline int64_t __shfl_xor_sync(unsigned, int64_t v, int off) {
    return rlx_emu_exchange<int64_t>(v, (int)(threadIdx.x & 31u) ^ off);
}
inline uint32_t __shfl_up_sync(unsigned, uint32_t v, int off) {
    const int lane = (int)(threadIdx.x & 31u);
    return rlx_emu_exchange<uint32_t>(v, lane >= off ? lane - off : lane);
}

/* every lane's value of `v`, then f(lane's value) folded into a mask */
template <typename F> static unsigned rlx_emu_vote(uint64_t v, F same) {
    const unsigned base = threadIdx.x & ~31u;
    rlx_emu_slots64[threadIdx.x] = v;
    rlx_emu_warp_bar->arrive_and_wait();
    unsigned bits = 0;
    for (unsigned l = 0; l < 32; ++l)
        if (same(rlx_emu_slots64[base + l])) bits |= 1u << l;
    rlx_emu_warp_bar->arrive_and_wait();
    return bits;
}
inline unsigned __ballot_sync(unsigned, bool p) {
    return rlx_emu_vote(p ? 1u : 0u, [](uint64_t o) { return o != 0; });
}
inline unsigned __match_any_sync(unsigned, uint32_t v) {
    return rlx_emu_vote(v, [v](uint64_t o) { return (uint32_t)o == v; });
}
inline int __popc(unsigned v) { return __builtin_popcount(v); }
inline int __ffs(unsigned v) { return __builtin_ffs((int)v); }
inline uint32_t __float_as_uint(float v) {
    uint32_t b;
    std::memcpy(&b, &v, sizeof(b));
    return b;
}
using std::isfinite;
using std::isnan;

/* sample.cuh's argmax pass reduces with argmax.cuh's rlx_block_best (the generated .cu has both, in this order) */
struct uint4 { /* CUDA's vector type, named by argmax.cuh's 16-byte loads (not run here) */
    unsigned x, y, z, w;
};
#include "argmax.cuh"
#include "sample.cuh"

extern "C" {

/* The launch of templates/cuda/sample.cu.j2 with `threads` per block (the GPU uses RLX_SAMPLE_THREADS). */
int emu_sample_top_k(const float *x, const double *u, const double *s, int32_t *y, int64_t rows, int64_t n,
                     unsigned threads) {
    int32_t flag = 0;
    rlx_emu_launch((unsigned)(rows < 4096 ? rows : 4096), threads,
                   [&] { rlx_sample_top_k<float>(x, u, s, y, rows, n, &flag); });
    return flag;
}

/* The same launch given an argmax's ids `best` (SampleFromArgmax). */
int emu_sample_top_k_best(const float *x, const double *u, const double *s, int32_t *y, int64_t rows, int64_t n,
                          unsigned threads, const int32_t *best) {
    int32_t flag = 0;
    rlx_emu_launch((unsigned)(rows < 4096 ? rows : 4096), threads,
                   [&] { rlx_sample_top_k<float>(x, u, s, y, rows, n, &flag, best); });
    return flag;
}
}

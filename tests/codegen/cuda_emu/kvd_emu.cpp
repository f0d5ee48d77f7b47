/* An entry point running the grouped CUDA decode attention (templates/cuda/kernels/kv_decode.cuh) on the CPU through
 * cuda_shim.h, launched as templates/cuda/decoder.cu.j2 launches it (tests/codegen/test_cuda_kv_emulated.py):
 * f32 compute, an f32 or f16 (_Float16) cache, head dim 64, 2 query heads per KV head; over a paged cache after
 * rlx_kv_append_paged (kernels/kv_attention.cuh), as the paged decoder launches the two. */
#include "cuda_shim.h"
#include "kv_attention.cuh"
#include "kv_decode.cuh"

namespace {

template <typename KT, bool ROPE, bool NEOX, bool WINDOW>
int run(const float *q, const float *k, const float *v, void *kc, void *vc, const int32_t *pos, float *out,
        int64_t batch, int64_t sq, int64_t cap, int heads, int kv_heads, float scale, int64_t window,
        const float *cosb, const float *sinb, int rot, unsigned splits, int64_t split_keys, float *partials,
        int32_t *counters) {
    constexpr int HD = 64, G = 2;
    int32_t flag = 0;
    /* as rlx/codegen/cuda/decoder.py sizes it */
    const size_t smem = rlx_kvd_smem_floats<HD, G>() * sizeof(float);
    RlxDim3 grid;
    grid.x = (unsigned)(batch * kv_heads);
    grid.y = (unsigned)sq;
    grid.z = splits;
    rlx_emu_launch3(grid, RLX_KVD_THREADS, smem, [&] {
        rlx_kv_decode<float, KT, HD, G, ROPE, NEOX, WINDOW>(q, k, v, (KT *)kc, (KT *)vc, pos, out, sq, cap, heads,
                                                            kv_heads, scale, window, &flag, cosb, sinb, rot, 0,
                                                            partials, counters, split_keys);
    });
    return flag;
}

template <typename KT, bool ROPE, bool NEOX>
int run_w(bool windowed, auto... a) {
    return windowed ? run<KT, ROPE, NEOX, true>(a...) : run<KT, ROPE, NEOX, false>(a...);
}

/* PAGED: rlx_kv_append_paged (rotating the keys it stores with ROPE), then rlx_kv_decode through the block tables;
 * `inside` (the distinct-rows hint): no append launch, rlx_kv_decode stores each row's keys. */
template <typename KT, bool ROPE, bool NEOX>
int run_paged(const float *q, const float *k, const float *v, void *kc, void *vc, const int32_t *pos, float *out,
              int64_t batch, int heads, int kv_heads, float scale, const float *cosb, const float *sinb, int rot,
              unsigned splits, int64_t split_keys, float *partials, int32_t *counters, const int32_t *bt,
              int64_t page, int64_t maxp, int64_t num_pages, int inside) {
    constexpr int HD = 64, G = 2;
    int32_t flag = 0;
    RlxDim3 rows;
    rows.x = (unsigned)batch;
    if (!inside)
        rlx_emu_launch3(rows, 128, 0, [&] {
            rlx_kv_append_paged<float, KT, ROPE, NEOX>(k, v, (KT *)kc, (KT *)vc, pos, bt, 1, page, maxp, num_pages,
                                                       (int64_t)kv_heads * HD, cosb, sinb, rot, 1, HD);
        });
    const size_t smem = rlx_kvd_smem_floats<HD, G>() * sizeof(float);
    RlxDim3 grid;
    grid.x = (unsigned)(batch * kv_heads);
    grid.z = splits;
    rlx_emu_launch3(grid, RLX_KVD_THREADS, smem, [&] {
        rlx_kv_decode<float, KT, HD, G, ROPE, NEOX, false, true>(q, k, v, (KT *)kc, (KT *)vc, pos, out, 1, maxp * page,
                                                                 heads, kv_heads, scale, 0, &flag, cosb, sinb, rot, 1,
                                                                 partials, counters, split_keys, bt, page, maxp,
                                                                 num_pages, inside);
    });
    return flag;
}

}  // namespace

extern "C" {

/* One launch over `splits` blocks per (row, query, KV head); rope 0: none, 1: interleaved, 2: neox (tables
 * [sq, rot/2]); cache 0: the caches hold float, 1: _Float16, 2: e4m3 bytes (without rope). Returns the error
 * flag. */
int emu_kv_decode(const float *q, const float *k, const float *v, void *kc, void *vc, const int32_t *pos, float *out,
                  int64_t batch, int64_t sq, int64_t cap, int heads, int kv_heads, float scale, int64_t window,
                  const float *cosb, const float *sinb, int rot, int rope, int cache, unsigned splits,
                  int64_t split_keys, float *partials, int32_t *counters) {
    const bool w = window > 0;
#define RLX_EMU_ARGS w, q, k, v, kc, vc, pos, out, batch, sq, cap, heads, kv_heads, scale, window, cosb, sinb, rot, \
                     splits, split_keys, partials, counters
    if (cache == 2) return run_w<__nv_fp8_e4m3, false, false>(RLX_EMU_ARGS);
    if (cache == 1) {
        if (rope == 1) return run_w<_Float16, true, false>(RLX_EMU_ARGS);
        if (rope == 2) return run_w<_Float16, true, true>(RLX_EMU_ARGS);
        return run_w<_Float16, false, false>(RLX_EMU_ARGS);
    }
    if (rope == 1) return run_w<float, true, false>(RLX_EMU_ARGS);
    if (rope == 2) return run_w<float, true, true>(RLX_EMU_ARGS);
    return run_w<float, false, false>(RLX_EMU_ARGS);
#undef RLX_EMU_ARGS
}

/* One token a row over block tables `bt` ([batch, maxp] pages of `page` rows in a pool of `num_pages`), the rope
 * tables per row ([batch, rot/2]); rope and cache as above (an e4m3 cache without rope). Returns the error flag. */
int emu_kv_decode_paged(const float *q, const float *k, const float *v, void *kc, void *vc, const int32_t *pos,
                        float *out, int64_t batch, int heads, int kv_heads, float scale, const float *cosb,
                        const float *sinb, int rot, int rope, int cache, unsigned splits, int64_t split_keys,
                        float *partials, int32_t *counters, const int32_t *bt, int64_t page, int64_t maxp,
                        int64_t num_pages, int inside) {
#define RLX_EMU_ARGS q, k, v, kc, vc, pos, out, batch, heads, kv_heads, scale, cosb, sinb, rot, splits, split_keys, \
                     partials, counters, bt, page, maxp, num_pages, inside
    if (cache == 2) return run_paged<__nv_fp8_e4m3, false, false>(RLX_EMU_ARGS);
    if (cache == 1) {
        if (rope == 2) return run_paged<_Float16, true, true>(RLX_EMU_ARGS);
        return run_paged<_Float16, false, false>(RLX_EMU_ARGS);
    }
    if (rope == 1) return run_paged<float, true, false>(RLX_EMU_ARGS);
    if (rope == 2) return run_paged<float, true, true>(RLX_EMU_ARGS);
    return run_paged<float, false, false>(RLX_EMU_ARGS);
#undef RLX_EMU_ARGS
}

}  // extern "C"

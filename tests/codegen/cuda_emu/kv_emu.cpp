/* An entry point running the CUDA decoder attention (templates/cuda/kernels/kv_attention.cuh) on the CPU through
 * cuda_shim.h, launched as templates/cuda/decoder.cu.j2 launches it (tests/codegen/test_cuda_kv_emulated.py). */
#include "cuda_shim.h"
#include "kv_attention.cuh"

extern "C" {

/* rlx_kv_attend<float, float, 64, false, false> over `splits` blocks per query, as templates/cuda/decoder.cu.j2
 * launches it (contiguous caches: bt NULL); returns the error flag. */
static int launch_attend(const float *q, const float *k, const float *v, float *kc, float *vc, const int32_t *pos,
                         float *out, int64_t batch, int64_t sq, int64_t cap, int heads, int kv_heads, float scale,
                         unsigned splits, int64_t split_keys, float *partials, int32_t *counters, int64_t window,
                         const int32_t *bt, int64_t page, int64_t maxp, int64_t num_pages) {
    int32_t flag = 0;
    const size_t smem = (64 + RLX_KV_WARPS + RLX_KV_WARPS * 64 + RLX_KV_ROPE_ROWS * 64 + cap) * sizeof(float);
    RlxDim3 grid;
    grid.x = (unsigned)(batch * heads);
    grid.y = (unsigned)sq;
    grid.z = splits;
    rlx_emu_launch3(grid, RLX_KV_THREADS, smem, [&] {
        rlx_kv_attend<float, float, 64, false, false>(q, k, v, kc, vc, pos, out, sq, cap, heads, kv_heads, scale,
                                                      window, &flag, nullptr, nullptr, 0, 0, partials, counters,
                                                      split_keys, bt, page, maxp, num_pages);
    });
    return flag;
}

/* One launch of rlx_kv_attend<float, float, 64, false, false> over `splits` blocks per query; returns the error flag. */
int emu_kv_attend(const float *q, const float *k, const float *v, float *kc, float *vc, const int32_t *pos,
                  float *out, int64_t batch, int64_t sq, int64_t cap, int heads, int kv_heads, float scale,
                  unsigned splits, int64_t split_keys, float *partials, int32_t *counters, int64_t window) {
    return launch_attend(q, k, v, kc, vc, pos, out, batch, sq, cap, heads, kv_heads, scale, splits, split_keys,
                         partials, counters, window, nullptr, 1, 0, 0);
}

/* The paged layout: rlx_kv_append_paged, then rlx_kv_attend over block tables `bt` ([batch, maxp] of pages of
 * `page` rows in a pool of `num_pages`), as templates/cuda/decoder.cu.j2 launches them; returns the error flag. */
int emu_kv_attend_paged(const float *q, const float *k, const float *v, float *kc, float *vc, const int32_t *pos,
                        float *out, int64_t batch, int64_t sq, int heads, int kv_heads, float scale, unsigned splits,
                        int64_t split_keys, float *partials, int32_t *counters, const int32_t *bt, int64_t page,
                        int64_t maxp, int64_t num_pages, int64_t window) {
    RlxDim3 rows;
    rows.x = (unsigned)(batch * sq);
    rows.y = rows.z = 1;
    rlx_emu_launch3(rows, 128, 0, [&] {
        rlx_kv_append_paged<float, float>(k, v, kc, vc, pos, bt, sq, page, maxp, num_pages, (int64_t)kv_heads * 64);
    });
    return launch_attend(q, k, v, kc, vc, pos, out, batch, sq, maxp * page, heads, kv_heads, scale, splits,
                         split_keys, partials, counters, window, bt, page, maxp, num_pages);
}

}  // extern "C"

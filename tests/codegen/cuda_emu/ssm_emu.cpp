/* Entry points running the CUDA SSM kernels (templates/cuda/kernels/ssm.cuh) on the CPU through cuda_shim.h,
 * with the path choice of templates/cuda/ssm.cu.j2 written out (tests/codegen/test_cuda_ssm_emulated.py). */
#include "cuda_shim.h"
#include "ssm.cuh"

extern "C" {

/* Returns the number of chunks the scan ran in (1: the sequential kernel). state0 / state1 (may be null, may be
 * the same buffer) as the carried form's launch passes them. */
int64_t emu_selective_scan(const float *x, const float *dt, const float *A, const float *Bm, const float *Cm,
                           const float *state0, float *state1, float *y, int64_t batch, int64_t seq, int64_t H, int N, int64_t num_sms,
                           int64_t min_chunk, int64_t warps_per_sm, int64_t max_segments, float *scratch) {
    const int64_t bh = batch * H;
    int64_t nch = 1;
    if (seq >= 2 * min_chunk) {
        const int64_t want = (num_sms * warps_per_sm + bh - 1) / bh;
        const int64_t most = seq / min_chunk, room = max_segments / bh;
        nch = want < most ? want : most;
        nch = nch < room ? nch : room;
    }
    auto blocks = [](int64_t n, int t) { return (unsigned)((n + t - 1) / t); };
    if (nch >= 2) {
        const int64_t len = (seq + nch - 1) / nch;
        nch = (seq + len - 1) / len;
        float *ends = scratch, *dsum = ends + bh * nch * N;
        rlx_emu_launch(blocks(bh * nch * 32, 128), 128, [&] {
            rlx_ssm_chunk_ends<float>(x, dt, A, Bm, ends, dsum, batch, seq, H, N, nch, len); });
        rlx_emu_launch(blocks(bh * N, 128), 128, [&] { rlx_ssm_chunk_carry<float>(A, ends, dsum, state0, state1, batch, H, N, nch); });
        rlx_emu_launch(blocks(bh * nch * 32, 128), 128, [&] {
            rlx_ssm_chunk_out<float>(x, dt, A, Bm, Cm, y, ends, batch, seq, H, N, nch, len); });
        return nch;
    }
    rlx_emu_launch(blocks(bh * 32, 128), 128, [&] { rlx_selective_scan<float>(x, dt, A, Bm, Cm, state0, state1, y, batch, seq, H, N); });
    return 1;
}

/* Returns 1 when the chunked (WY) form ran, 0 for the column kernel. */
int emu_gated_delta_net(const float *q, const float *k, const float *v, const float *g, const float *beta,
                        const float *state0, float *state1, float *o, int64_t batch, int64_t seq, int64_t H, int N,
                        float scale, int64_t chunk_segments, int64_t chunk_min_seq, float *scratch) {
    const int64_t bh = batch * H, tiles = (N + RLX_GDN_COLS - 1) / RLX_GDN_COLS;
    const int64_t nch = (seq + RLX_GDN_CHUNK - 1) / RLX_GDN_CHUNK;
    if (chunk_segments && seq >= chunk_min_seq && bh * nch <= chunk_segments) {
        rlx_emu_launch((unsigned)(bh * nch), (unsigned)((2 * N + 31) / 32 * 32), [&] {
            rlx_gdn_chunk_prep<float>(q, k, v, g, beta, scratch, seq, H, N, nch); });
        rlx_emu_launch((unsigned)(bh * tiles), 32 * RLX_GDN_COLS, [&] {
            rlx_gdn_chunk_state<float>(q, k, scratch, state0, state1, o, seq, H, N, nch, scale); });
        return 1;
    }
    const int R = N <= 32 ? 1 : N <= 64 ? 2 : N <= 128 ? 4 : 8;
    rlx_emu_launch((unsigned)(bh * tiles), 32 * RLX_GDN_COLS, [&] {
        if (R == 1) rlx_gdn_columns<float, 1>(q, k, v, g, beta, state0, state1, o, seq, H, N, scale);
        else if (R == 2) rlx_gdn_columns<float, 2>(q, k, v, g, beta, state0, state1, o, seq, H, N, scale);
        else if (R == 4) rlx_gdn_columns<float, 4>(q, k, v, g, beta, state0, state1, o, seq, H, N, scale);
        else rlx_gdn_columns<float, 8>(q, k, v, g, beta, state0, state1, o, seq, H, N, scale);
    });
    return 0;
}

/* The carried depthwise conv as templates/cuda/ssm.cu.j2 launches it: the conv reading the state as its left pad,
 * then rlx_conv_state_update (state updated in place). Returns the error flag (256: a bad length). */
int32_t emu_dwconv_carry(const float *x, const float *w, float *state, const int32_t *lengths, float *y,
                         int64_t batch, int64_t seq, int64_t C, int K) {
    int32_t flag = 0;
    auto blocks = [](int64_t n, int t) { return (unsigned)((n + t - 1) / t); };
    rlx_emu_launch(blocks(batch * seq * C, 256), 256, [&] {
        rlx_dwconv1d_causal<float>(x, w, state, y, batch, seq, C, K, 0); });
    rlx_emu_launch(blocks(batch * C, 256), 256, [&] {
        rlx_conv_state_update<float>(x, state, lengths, batch, seq, C, K, &flag); });
    return flag;
}

}  // extern "C"

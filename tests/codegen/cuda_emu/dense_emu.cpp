/* Entry points running the one-row dense 16-bit decode GEMV (templates/cuda/kernels/dense_gemv.cuh, rlx_dgemv) on the
 * CPU through cuda_shim.h / quant_shim.h (tests/codegen/test_cuda_dense_emulated.py), with f32 activations and
 * outputs, f16 or bf16 weights as their bits. The launch arithmetic of templates/cuda/dense.cu.j2, except that the
 * tile width (lg), the K splits and a cap on the unsplit grid are the caller's; a split launch's partials (NaN
 * before it: every one must be written) are a buffer of their own, then rlx_dgemv_reduce adds them. emu_dgemv_ar runs
 * the row-parallel form summed over a clique (kernels/dense_gemv_ar.cuh) for every rank in turn: each rank's split
 * rlx_dgemv, then rlx_dgemv_reduce_ar's two halves (every rank's publish, then every rank's sum: the flags a sum
 * waits for are up by then; the kernel runs both in one launch on each GPU). */
#include "quant_shim.h"

#define RLX_DGEMV_LDG(p) (*(p))
#define RLX_AR_EMU 1

#include "quant.cuh"
#include "dense_gemv.cuh"
#include "exchange.cuh"
#include "dense_gemv_ar.cuh"

/* partials a split launch left unwritten (NaN), since the last emu_dgemv_unwritten */
static int64_t d_unwritten = 0;

template <bool BF, bool NORM, int EPI, bool VEC>
static void d_gemv(const float *X, const float *gamma, float eps, const RlxQMembers &mem, const float *res, int64_t K,
                   int lg, int splits, unsigned max_grid) {
    const int C = 8 << lg;
    int64_t tiles = (mem.n[0] + C - 1) / C;
    if (EPI == 0)
        for (int j = 1; j < mem.count; j++)
            tiles += (mem.n[j] + C - 1) / C;
    const int nm = EPI == 2 ? 2 : 1;
    RlxDim3 grid;
    if (splits <= 1) {
        grid.x = (unsigned)(tiles < (int64_t)max_grid ? tiles : max_grid);
        const size_t smem = (size_t)rlx_dgemv_smem(K, lg, nm) * sizeof(float);
        rlx_emu_launch3(grid, RLX_DGEMV_THREADS, smem,
                        [&] { rlx_dgemv<float, BF, NORM, EPI, VEC, false>(X, gamma, eps, mem, res, K, lg, nullptr, 1); });
        return;
    }
    std::vector<float> partials((size_t)(splits * rlx_dgemv_pcols<EPI>(mem)), NAN);
    grid.x = (unsigned)tiles;
    grid.y = (unsigned)splits;
    const size_t smem = (size_t)rlx_dgemv_smem(rlx_dgemv_kchunk(K, lg, nm, splits), lg, nm) * sizeof(float);
    rlx_emu_launch3(grid, RLX_DGEMV_THREADS, smem, [&] {
        rlx_dgemv<float, BF, NORM, EPI, VEC, true>(X, gamma, eps, mem, res, K, lg, partials.data(), splits);
    });
    for (float p : partials)
        d_unwritten += std::isnan(p) ? 1 : 0;
    RlxDim3 rgrid;
    const int64_t cols = rlx_dgemv_cols<EPI>(mem);
    rgrid.x = (unsigned)((cols + RLX_DGEMV_REDUCE_THREADS - 1) / RLX_DGEMV_REDUCE_THREADS);
    rlx_emu_launch3(rgrid, RLX_DGEMV_REDUCE_THREADS, 0,
                    [&] { rlx_dgemv_reduce<float, EPI>(mem, res, partials.data(), splits); });
}

template <bool BF, bool VEC>
static void d_kind(int kind, const float *X, const float *gamma, float eps, const RlxQMembers &mem, const float *res,
                   int64_t K, int lg, int splits, unsigned max_grid) {
    switch (kind) {
    case 0: d_gemv<BF, false, 0, VEC>(X, gamma, eps, mem, res, K, lg, splits, max_grid); break;
    case 1: d_gemv<BF, true, 2, VEC>(X, gamma, eps, mem, res, K, lg, splits, max_grid); break;
    case 2: d_gemv<BF, false, 1, VEC>(X, gamma, eps, mem, res, K, lg, splits, max_grid); break;
    default: d_gemv<BF, true, 0, VEC>(X, gamma, eps, mem, res, K, lg, splits, max_grid); break;
    }
}

extern "C" {
/* rlx_dgemv over `count` (1..4) members [K, n_j] (16-bit bits, bf16 if `bf` else f16), outputs ys[j], one row of X.
   kind: 0 plain, 1 norm + SwiGLU (members 0 and 1 the gate and the up matrix, output ys[0]), 2 residual (one member),
   3 norm, plain outputs. lg: the tile width (8 << lg columns); splits: K's splits over blocks (1: none, at most
   max_grid blocks; > 1: rlx_dgemv's SPLIT launch, one tile a block, then rlx_dgemv_reduce). */
void emu_dgemv(int bf, int kind, const float *X, const float *gamma, float eps, int count, const uint16_t *const *ws,
               float *const *ys, const int64_t *ns, const float *res, int64_t K, int lg, int splits, unsigned max_grid) {
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
        d_kind<true, true>(kind, X, gamma, eps, mem, res, K, lg, splits, max_grid);
    else if (bf)
        d_kind<true, false>(kind, X, gamma, eps, mem, res, K, lg, splits, max_grid);
    else if (vec)
        d_kind<false, true>(kind, X, gamma, eps, mem, res, K, lg, splits, max_grid);
    else
        d_kind<false, false>(kind, X, gamma, eps, mem, res, K, lg, splits, max_grid);
}

/* rlx_dgemv_plan (the host's choice of tile width and K splits) for members as emu_dgemv's (kind: 1 SwiGLU), K and
   `wave` resident blocks, lg lg_hi..lg_lo and splits s_lo..s_hi: returns the tiles, choice[0] lg, choice[1] splits. */
int64_t emu_dgemv_plan(int kind, int count, const int64_t *ns, int64_t K, int64_t wave, int lg_hi, int lg_lo, int s_lo,
                       int s_hi, int *choice) {
    RlxQMembers mem;
    std::memset(&mem, 0, sizeof(mem));
    for (int j = 0; j < count; j++)
        mem.n[j] = ns[j];
    mem.count = count;
    return kind == 1 ? rlx_dgemv_plan<2>(mem, K, wave, lg_hi, lg_lo, s_lo, s_hi, &choice[0], &choice[1])
                     : rlx_dgemv_plan<0>(mem, K, wave, lg_hi, lg_lo, s_lo, s_hi, &choice[0], &choice[1]);
}

/* The partials split launches left unwritten since the last call (0: every one written), and reset. */
int64_t emu_dgemv_unwritten() {
    const int64_t n = d_unwritten;
    d_unwritten = 0;
    return n;
}
}

/* World 2 or 4 ranks (kernels/dense_gemv_ar.cuh) over `calls` calls: call c's rank r multiplies its row X[c][r] ([K]
   f32) by its weight ws[r] ([K, n] bits), K split over splits[r] blocks of tiles of 8 << lg columns, and ys[c][r]
   ([n]) is what rank r's rlx_dgemv_reduce_ar wrote (res[c] [n] added when not NULL). The exchange buffers persist
   over the calls (parities alternate); `counters` gets each rank's call counter after the last call. */
template <int W>
static void d_ar(int bf, int calls, const float *X, const uint16_t *const *ws, const float *res, float *ys, int64_t n,
                 int64_t K, int lg, const int *splits, uint32_t *counters) {
    std::vector<std::vector<char>> bufs(W, std::vector<char>(rlx_ar_buffer_bytes(W), 0));
    RlxArPeers peers;
    std::memset(&peers, 0, sizeof(peers));
    for (int r = 0; r < W; r++)
        peers.buf[r] = bufs[r].data();
    const int64_t tiles = (n + (8 << lg) - 1) / (8 << lg);
    std::vector<std::vector<float>> partials(W);
    RlxDim3 rgrid;
    rgrid.x = (unsigned)((n + RLX_DGEMV_AR_THREADS - 1) / RLX_DGEMV_AR_THREADS);
    for (int c = 0; c < calls; c++) {
        for (int r = 0; r < W; r++) {
            RlxQMembers mem;
            std::memset(&mem, 0, sizeof(mem));
            mem.w[0] = (const uint8_t *)ws[r];
            mem.n[0] = n;
            mem.count = 1;
            const float *x = X + ((int64_t)c * W + r) * K;
            partials[r].assign((size_t)(splits[r] * n), NAN);
            float *pr = partials[r].data();
            RlxDim3 grid;
            grid.x = (unsigned)tiles;
            grid.y = (unsigned)splits[r];
            const size_t smem = (size_t)rlx_dgemv_smem(rlx_dgemv_kchunk(K, lg, 1, splits[r]), lg, 1) * sizeof(float);
            const int sr = splits[r];
            rlx_emu_launch3(grid, RLX_DGEMV_THREADS, smem, [&] {
                if (bf && n % 8 == 0)
                    rlx_dgemv<float, true, false, 0, true, true>(x, nullptr, 0.0f, mem, nullptr, K, lg, pr, sr);
                else if (bf)
                    rlx_dgemv<float, true, false, 0, false, true>(x, nullptr, 0.0f, mem, nullptr, K, lg, pr, sr);
                else
                    rlx_dgemv<float, false, false, 0, true, true>(x, nullptr, 0.0f, mem, nullptr, K, lg, pr, sr);
            });
        }
        for (int r = 0; r < W; r++)
            rlx_emu_launch3(rgrid, RLX_DGEMV_AR_THREADS, 0, [&] {
                const uint32_t e = rlx_ar_call(peers, r, W);
                rlx_dgemv_ar_publish<float, W>(partials[r].data(), splits[r], n, peers, r, e);
            });
        for (int r = 0; r < W; r++) {
            float *y = ys + ((int64_t)c * W + r) * n;
            const float *rs = res ? res + (int64_t)c * n : nullptr;
            rlx_emu_launch3(rgrid, RLX_DGEMV_AR_THREADS, 0, [&] {
                const uint32_t e = rlx_ar_call(peers, r, W);
                if (rs)
                    rlx_dgemv_ar_sum<float, true, W>(rs, y, n, peers, r, e);
                else
                    rlx_dgemv_ar_sum<float, false, W>(rs, y, n, peers, r, e);
                rlx_ar_call_done(peers, r, W, e);
            });
        }
    }
    for (int r = 0; r < W; r++)
        counters[r] = rlx_ar_flags(peers.buf[r], W)[RLX_AR_COUNTER];
}

extern "C" void emu_dgemv_ar(int bf, int world, int calls, const float *X, const uint16_t *const *ws,
                             const float *res, float *ys, int64_t n, int64_t K, int lg, const int *splits,
                             uint32_t *counters) {
    if (world == 2)
        d_ar<2>(bf, calls, X, ws, res, ys, n, K, lg, splits, counters);
    else
        d_ar<4>(bf, calls, X, ws, res, ys, n, K, lg, splits, counters);
}

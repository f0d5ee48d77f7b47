/* Entry points running the int8-activation kernels (templates/cuda/kernels/quant_q8.cuh, and quant.cuh's fused decode
 * GEMV with ACT = 1; tests/codegen/test_cuda_q8_emulated.py) and the fused decode GEMV with f32 activations (ACT = 0;
 * tests/codegen/test_cuda_qgemv_emulated.py; quant_occ.cuh's rlx_qgemv_occ with either) on the CPU through
 * cuda_shim.h / quant_shim.h, with the launch arithmetic of templates/cuda/quant.cu.j2 written out. f32 activations. */
#include "quant_shim.h"

#include "quant.cuh"
#include "quant_q8.cuh"

static unsigned rlx_emu_blocks(int64_t n, int t) { return (unsigned)((n + t - 1) / t); }

template <int FMT, int MR>
static void q8_gemv(const uint32_t *XQ, const uint8_t *W, float *Y, int64_t N, int64_t K, int64_t RB) {
    rlx_emu_launch(rlx_emu_blocks(N, RLX_QGEMV_WARPS), 32 * RLX_QGEMV_WARPS,
                   [&] { rlx_q8_gemv<float, FMT, MR>(XQ, W, Y, N, K, RB); });
}

template <int FMT>
static void q8_gemv_rows(int64_t M, const uint32_t *XQ, const uint8_t *W, float *Y, int64_t N, int64_t K, int64_t RB) {
    switch (M) {
    case 1: q8_gemv<FMT, 1>(XQ, W, Y, N, K, RB); break;
    case 2: q8_gemv<FMT, 2>(XQ, W, Y, N, K, RB); break;
    case 3: q8_gemv<FMT, 3>(XQ, W, Y, N, K, RB); break;
    case 4: q8_gemv<FMT, 4>(XQ, W, Y, N, K, RB); break;
    case 5: q8_gemv<FMT, 5>(XQ, W, Y, N, K, RB); break;
    case 6: q8_gemv<FMT, 6>(XQ, W, Y, N, K, RB); break;
    case 7: q8_gemv<FMT, 7>(XQ, W, Y, N, K, RB); break;
    default: q8_gemv<FMT, 8>(XQ, W, Y, N, K, RB); break;
    }
}

/* rlx_qgemv_fused<..., ACT> over `rows` weight rows (every member's, or the gate's with EPI 2); the grid as
 * quant.cu.j2 sizes it (rows a warp takes per pass: rlx_qf_warp_rows), capped at `max_grid` blocks so that the
 * grid-stride loop over row groups runs more than one pass. */
template <int FMT, int QK, int QB, int MR, bool NORM, int EPI, int ACT>
static void q_fused(const float *X, const float *gamma, float eps, const RlxQMembers &mem, const float *res, int64_t K,
                    int64_t RB, int64_t rows, unsigned max_grid) {
    RlxDim3 grid;
    grid.x = rlx_emu_blocks(rows, RLX_QFUSED_WARPS * rlx_qf_warp_rows<FMT, MR, EPI, ACT>());
    grid.x = grid.x < max_grid ? grid.x : max_grid;
    const size_t smem = (size_t)MR * (K / 32) * RLX_QFUSED_PAD * sizeof(float);
    rlx_emu_launch3(grid, 32 * RLX_QFUSED_WARPS, smem,
                    [&] { rlx_qgemv_fused<float, FMT, QK, QB, MR, NORM, EPI, ACT>(X, gamma, eps, mem, res, K, RB, rows); });
}

template <int FMT, int QK, int QB, bool NORM, int EPI, int ACT>
static void q_fused_rows(int64_t M, const float *X, const float *gamma, float eps, const RlxQMembers &mem,
                         const float *res, int64_t K, int64_t RB, int64_t rows, unsigned max_grid) {
    if (M == 1)
        q_fused<FMT, QK, QB, 1, NORM, EPI, ACT>(X, gamma, eps, mem, res, K, RB, rows, max_grid);
    else
        q_fused<FMT, QK, QB, 3, NORM, EPI, ACT>(X, gamma, eps, mem, res, K, RB, rows, max_grid);
}

/* The three shapes of group the tests take: plain members (no norm, EPI 0), norm + SwiGLU (EPI 2), one member + the
 * residual (EPI 1). */
template <int FMT, int QK, int QB, int ACT>
static void q_fused_kind(int kind, int64_t M, const float *X, const float *gamma, float eps, const RlxQMembers &mem,
                         const float *res, int64_t K, int64_t RB, int64_t rows, unsigned max_grid) {
    if (kind == 0)
        q_fused_rows<FMT, QK, QB, false, 0, ACT>(M, X, gamma, eps, mem, res, K, RB, rows, max_grid);
    else if (kind == 1)
        q_fused_rows<FMT, QK, QB, true, 2, ACT>(M, X, gamma, eps, mem, res, K, RB, rows, max_grid);
    else
        q_fused_rows<FMT, QK, QB, false, 1, ACT>(M, X, gamma, eps, mem, res, K, RB, rows, max_grid);
}

/* `count` (1 or 2) members of N rows each: weights w0, w1, outputs y0, y1. */
static RlxQMembers q_members(int count, const uint8_t *w0, const uint8_t *w1, float *y0, float *y1, int64_t N) {
    RlxQMembers mem;
    std::memset(&mem, 0, sizeof(mem));
    mem.w[0] = w0;
    mem.w[1] = w1;
    mem.y[0] = y0;
    mem.y[1] = y1;
    mem.n[0] = mem.n[1] = N;
    mem.count = count;
    return mem;
}

/* `count` members of N rows each (weights w0, w1; outputs y0, y1), as `kind` says (see q_fused_kind); the SwiGLU and
 * residual kinds write y0 only. */
template <int ACT>
static void q_fused_entry(int fmt, int kind, const float *X, const float *gamma, float eps, int count,
                          const uint8_t *w0, const uint8_t *w1, float *y0, float *y1, const float *res, int64_t M,
                          int64_t N, int64_t K, int64_t RB, unsigned max_grid) {
    const RlxQMembers mem = q_members(count, w0, w1, y0, y1, N);
    const int64_t rows = kind == 1 ? N : count * N;
    switch (fmt) {
    case RLX_Q8_0: q_fused_kind<RLX_Q8_0, 32, 34, ACT>(kind, M, X, gamma, eps, mem, res, K, RB, rows, max_grid); break;
    case RLX_Q4_0: q_fused_kind<RLX_Q4_0, 32, 18, ACT>(kind, M, X, gamma, eps, mem, res, K, RB, rows, max_grid); break;
    case RLX_Q4_K: q_fused_kind<RLX_Q4_K, 256, 144, ACT>(kind, M, X, gamma, eps, mem, res, K, RB, rows, max_grid); break;
    case RLX_Q6_K:
        if constexpr (ACT == 0) {
            q_fused_kind<RLX_Q6_K, 256, 210, 0>(kind, M, X, gamma, eps, mem, res, K, RB, rows, max_grid);
            break;
        }
        [[fallthrough]];
    default: q_fused_kind<RLX_Q4_1, 32, 20, ACT>(kind, M, X, gamma, eps, mem, res, K, RB, rows, max_grid); break;
    }
}

extern "C" {

/* rlx_q8_act: records ([M, K / 32] of RLX_Q8_REC words) and / or x' = q * d, either pointer null. At most 3 blocks
 * (quant.cu.j2 launches one warp per 32 values): the warps then take several blocks of 32 in the grid-stride loop. */
void emu_q8_act(const float *X, int64_t M, int64_t K, uint32_t *rec, float *xd) {
    const unsigned grid = rlx_emu_blocks(M * K, 256);
    rlx_emu_launch(grid < 3 ? grid : 3, 256, [&] { rlx_q8_act<float>(X, M, K, rec, xd); });
}

/* rlx_q8_gemv of the records of M <= 8 rows against a weight [N, RB] of format `fmt` (quant.cuh's ids). */
void emu_q8_gemv(int fmt, const uint32_t *XQ, const uint8_t *W, float *Y, int64_t M, int64_t N, int64_t K, int64_t RB) {
    switch (fmt) {
    case RLX_Q8_0: q8_gemv_rows<RLX_Q8_0>(M, XQ, W, Y, N, K, RB); break;
    case RLX_Q4_0: q8_gemv_rows<RLX_Q4_0>(M, XQ, W, Y, N, K, RB); break;
    case RLX_Q4_K: q8_gemv_rows<RLX_Q4_K>(M, XQ, W, Y, N, K, RB); break;
    default: q8_gemv_rows<RLX_Q4_1>(M, XQ, W, Y, N, K, RB); break;
    }
}

/* The fused decode GEMV with int8 activations, M = 1 or 3 (q_fused_entry), at most `max_grid` blocks. */
void emu_q8_fused(int fmt, int kind, const float *X, const float *gamma, float eps, int count, const uint8_t *w0,
                  const uint8_t *w1, float *y0, float *y1, const float *res, int64_t M, int64_t N, int64_t K,
                  int64_t RB, unsigned max_grid) {
    q_fused_entry<1>(fmt, kind, X, gamma, eps, count, w0, w1, y0, y1, res, M, N, K, RB, max_grid);
}

/* The fused decode GEMV with f32 activations (ACT = 0), M = 1 or 3, at most `max_grid` blocks. */
void emu_qf_fused(int fmt, int kind, const float *X, const float *gamma, float eps, int count, const uint8_t *w0,
                  const uint8_t *w1, float *y0, float *y1, const float *res, int64_t M, int64_t N, int64_t K,
                  int64_t RB, unsigned max_grid) {
    q_fused_entry<0>(fmt, kind, X, gamma, eps, count, w0, w1, y0, y1, res, M, N, K, RB, max_grid);
}
}

/* rlx_qgemv_xr (one row of X, XG groups a tile) as quant.cu.j2 launches it: one block per tile, capped at
 * `max_grid` (the grid-stride loop over tiles), kinds as q_fused_kind's. */
template <int FMT, int QK, int QB, bool NORM, int EPI, int XG>
static void q_xr(const float *X, const float *gamma, float eps, const RlxQMembers &mem, const float *res, int64_t K,
                 int64_t RB, int64_t rows, unsigned max_grid) {
    const int64_t tr = (int64_t)XG * RLX_QXR_G / (EPI == 2 ? 2 : 1), nsub = K / 32;
    unsigned grid = rlx_emu_blocks(rows, (int)tr);
    grid = grid < max_grid ? grid : max_grid;
    const size_t smem = ((size_t)nsub * RLX_QFUSED_PAD + (size_t)(nsub + 31) / 32 * XG * RLX_QXR_G) * sizeof(float);
    RlxDim3 g3;
    g3.x = grid;
    rlx_emu_launch3(g3, 32 * RLX_QFUSED_WARPS, smem,
                    [&] { rlx_qgemv_xr<float, FMT, QK, QB, NORM, EPI, XG>(X, gamma, eps, mem, res, K, RB, rows); });
}

template <int FMT, int QK, int QB, int XG>
static void q_xr_kind(int kind, const float *X, const float *gamma, float eps, const RlxQMembers &mem,
                      const float *res, int64_t K, int64_t RB, int64_t rows, unsigned max_grid) {
    if (kind == 0)
        q_xr<FMT, QK, QB, false, 0, XG>(X, gamma, eps, mem, res, K, RB, rows, max_grid);
    else if (kind == 1)
        q_xr<FMT, QK, QB, true, 2, XG>(X, gamma, eps, mem, res, K, RB, rows, max_grid);
    else
        q_xr<FMT, QK, QB, false, 1, XG>(X, gamma, eps, mem, res, K, RB, rows, max_grid);
}

template <int FMT, int QK, int QB>
static void q_xr_groups(int xg, int kind, const float *X, const float *gamma, float eps, const RlxQMembers &mem,
                        const float *res, int64_t K, int64_t RB, int64_t rows, unsigned max_grid) {
    if (xg == 1)
        q_xr_kind<FMT, QK, QB, 1>(kind, X, gamma, eps, mem, res, K, RB, rows, max_grid);
    else if (xg == 2)
        q_xr_kind<FMT, QK, QB, 2>(kind, X, gamma, eps, mem, res, K, RB, rows, max_grid);
    else
        q_xr_kind<FMT, QK, QB, 4>(kind, X, gamma, eps, mem, res, K, RB, rows, max_grid);
}

extern "C" {
/* rlx_qgemv_xr, format `fmt` (quant.cuh's ids), M = 1, xg (1, 2 or 4) groups of RLX_QXR_G weight rows a tile, at most
   `max_grid` blocks. */
void emu_qf_xr(int fmt, int xg, int kind, const float *X, const float *gamma, float eps, int count, const uint8_t *w0,
               const uint8_t *w1, float *y0, float *y1, const float *res, int64_t N, int64_t K, int64_t RB,
               unsigned max_grid) {
    const RlxQMembers mem = q_members(count, w0, w1, y0, y1, N);
    const int64_t rows = kind == 1 ? N : count * N;
    switch (fmt) {
    case RLX_Q8_0: q_xr_groups<RLX_Q8_0, 32, 34>(xg, kind, X, gamma, eps, mem, res, K, RB, rows, max_grid); break;
    case RLX_Q4_0: q_xr_groups<RLX_Q4_0, 32, 18>(xg, kind, X, gamma, eps, mem, res, K, RB, rows, max_grid); break;
    case RLX_Q4_1: q_xr_groups<RLX_Q4_1, 32, 20>(xg, kind, X, gamma, eps, mem, res, K, RB, rows, max_grid); break;
    default: q_xr_groups<RLX_Q4_K, 256, 144>(xg, kind, X, gamma, eps, mem, res, K, RB, rows, max_grid); break;
    }
}
}

/* rlx_qgemv_occ (kernels/quant_occ.cuh; one row of X, G weight rows an item) as quant.cu.j2 launches it: R = 16 / nslab
 * replicas of the K slabs a block, `tr` output rows a tile, at most `max_grid` blocks (the grid-stride loop over
 * tiles), kinds as q_fused_kind's. */
#include "quant_occ.cuh"

template <int FMT, int QK, int QB, bool NORM, int EPI, int G, bool PF = false, int ACT = 0>
static void q_occ(const float *X, const float *gamma, float eps, const RlxQMembers &mem, const float *res, int64_t K,
                  int64_t RB, int64_t rows, int64_t tr, unsigned max_grid) {
    const int64_t nslab = (K / 32 + 31) / 32, reps = 16 / nslab;
    const int64_t tiles = (rows + tr - 1) / tr;
    RlxDim3 g3;
    g3.x = (unsigned)(tiles < (int64_t)max_grid ? tiles : (int64_t)max_grid);
    const size_t smem = (size_t)nslab * (EPI == 2 ? 2 * tr : tr) * sizeof(float);
    rlx_emu_launch3(g3, (unsigned)(32 * nslab * reps), smem,
                    [&] { rlx_qgemv_occ<float, FMT, QK, QB, NORM, EPI, G, PF, ACT>(X, gamma, eps, mem, res, K, RB, rows, tr); });
}

template <int FMT, int QK, int QB, int G, int ACT = 0>
static void q_occ_kind(int kind, const float *X, const float *gamma, float eps, const RlxQMembers &mem,
                       const float *res, int64_t K, int64_t RB, int64_t rows, int64_t tr, unsigned max_grid) {
    if (kind == 0)
        q_occ<FMT, QK, QB, false, 0, G, false, ACT>(X, gamma, eps, mem, res, K, RB, rows, tr, max_grid);
    else if (kind == 1)
        q_occ<FMT, QK, QB, true, 2, G, false, ACT>(X, gamma, eps, mem, res, K, RB, rows, tr, max_grid);
    else
        q_occ<FMT, QK, QB, false, 1, G, false, ACT>(X, gamma, eps, mem, res, K, RB, rows, tr, max_grid);
}

template <int FMT, int QK, int QB, int ACT = 0>
static void q_occ_g(int g, int kind, const float *X, const float *gamma, float eps, const RlxQMembers &mem,
                    const float *res, int64_t K, int64_t RB, int64_t rows, int64_t tr, unsigned max_grid) {
    if (g == 2)
        q_occ_kind<FMT, QK, QB, 2, ACT>(kind, X, gamma, eps, mem, res, K, RB, rows, tr, max_grid);
    else if (g == 3)  /* 2 rows an item and the next prefetched (PF: walk "occp"; the shim's prefetch does nothing) */
        q_occ<FMT, QK, QB, true, 2, 2, true, ACT>(X, gamma, eps, mem, res, K, RB, rows, tr, max_grid);
    else if (g == 8)
        q_occ_kind<FMT, QK, QB, 8, ACT>(kind, X, gamma, eps, mem, res, K, RB, rows, tr, max_grid);
    else
        q_occ_kind<FMT, QK, QB, 4, ACT>(kind, X, gamma, eps, mem, res, K, RB, rows, tr, max_grid);
}

/* The format's instantiation of q_occ_g (ACT 0: f32 activations, 1: int8). */
template <int ACT>
static void q_occ_fmt(int fmt, int g, int kind, const float *X, const float *gamma, float eps, int count,
                      const uint8_t *w0, const uint8_t *w1, float *y0, float *y1, const float *res, int64_t N,
                      int64_t K, int64_t RB, int64_t tr, unsigned max_grid) {
    const RlxQMembers mem = q_members(count, w0, w1, y0, y1, N);
    const int64_t rows = kind == 1 ? N : count * N;
    switch (fmt) {
    case RLX_Q8_0: q_occ_g<RLX_Q8_0, 32, 34, ACT>(g, kind, X, gamma, eps, mem, res, K, RB, rows, tr, max_grid); break;
    case RLX_Q4_0: q_occ_g<RLX_Q4_0, 32, 18, ACT>(g, kind, X, gamma, eps, mem, res, K, RB, rows, tr, max_grid); break;
    case RLX_Q4_1: q_occ_g<RLX_Q4_1, 32, 20, ACT>(g, kind, X, gamma, eps, mem, res, K, RB, rows, tr, max_grid); break;
    default: q_occ_g<RLX_Q4_K, 256, 144, ACT>(g, kind, X, gamma, eps, mem, res, K, RB, rows, tr, max_grid); break;
    }
}

extern "C" {
/* rlx_qgemv_occ, format `fmt`, M = 1, g (2, 4 or 8; 3: 2 and PF, norm + SwiGLU only) weight rows an item, tr output rows a tile, at most max_grid blocks. */
void emu_qf_occ(int fmt, int g, int kind, const float *X, const float *gamma, float eps, int count, const uint8_t *w0,
                const uint8_t *w1, float *y0, float *y1, const float *res, int64_t N, int64_t K, int64_t RB, int64_t tr,
                unsigned max_grid) {
    q_occ_fmt<0>(fmt, g, kind, X, gamma, eps, count, w0, w1, y0, y1, res, N, K, RB, tr, max_grid);
}

/* rlx_qgemv_occ with int8 activations (ACT = 1: act="q8"), arguments as emu_qf_occ's. */
void emu_q8_occ(int fmt, int g, int kind, const float *X, const float *gamma, float eps, int count, const uint8_t *w0,
                const uint8_t *w1, float *y0, float *y1, const float *res, int64_t N, int64_t K, int64_t RB, int64_t tr,
                unsigned max_grid) {
    q_occ_fmt<1>(fmt, g, kind, X, gamma, eps, count, w0, w1, y0, y1, res, N, K, RB, tr, max_grid);
}

/* rlx_qgemv_occ over three members of n0, n1, n2 rows (Q / K / V: plain outputs, no norm), format `fmt`, g rows an
   item, tr rows a tile, at most max_grid blocks: rows of one item or tile straddle the members' boundaries. */
void emu_qf_occ3(int fmt, int g, const float *X, const uint8_t *w0, const uint8_t *w1, const uint8_t *w2, float *y0,
                 float *y1, float *y2, int64_t n0, int64_t n1, int64_t n2, int64_t K, int64_t RB, int64_t tr,
                 unsigned max_grid) {
    RlxQMembers mem;
    std::memset(&mem, 0, sizeof(mem));
    mem.w[0] = w0;
    mem.w[1] = w1;
    mem.w[2] = w2;
    mem.y[0] = y0;
    mem.y[1] = y1;
    mem.y[2] = y2;
    mem.n[0] = n0;
    mem.n[1] = n1;
    mem.n[2] = n2;
    mem.count = 3;
    switch (fmt) {
    case RLX_Q8_0: q_occ_g<RLX_Q8_0, 32, 34>(g, 0, X, nullptr, 0.0f, mem, nullptr, K, RB, n0 + n1 + n2, tr, max_grid); break;
    case RLX_Q4_0: q_occ_g<RLX_Q4_0, 32, 18>(g, 0, X, nullptr, 0.0f, mem, nullptr, K, RB, n0 + n1 + n2, tr, max_grid); break;
    case RLX_Q4_1: q_occ_g<RLX_Q4_1, 32, 20>(g, 0, X, nullptr, 0.0f, mem, nullptr, K, RB, n0 + n1 + n2, tr, max_grid); break;
    default: q_occ_g<RLX_Q4_K, 256, 144>(g, 0, X, nullptr, 0.0f, mem, nullptr, K, RB, n0 + n1 + n2, tr, max_grid); break;
    }
}
}

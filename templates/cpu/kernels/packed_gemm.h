/* RLX's packed-panel GEMM for params (needs kernels/gemm.h and kernels/threads.h).
 * A fixed RLX kernel header: no template code; included by generated files that need it. */
#ifndef RLX_KERNELS_PACKED_GEMM_H
#define RLX_KERNELS_PACKED_GEMM_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>


/* ── RLX's own GEMM for weights: C = A @ B with B a param packed at set time ──
 *
 * A matmul whose right operand is a param (every linear layer) does not go
 * through the BLAS: rlx_set_param copies the weight into the micro-kernel's
 * panel layout once, and rlx_run multiplies with the micro-kernel rlx_kernel
 * (kernels/packed_core.h: a kernel unit, compiled once per toolchain), adding
 * the bias at each tile's store and applying the activation to each block of
 * RLX_MC rows x one panel (12 KiB on AVX-512) once its rows are done.
 *
 * Packed layout of one K x N matrix: ceil(N / RLX_NR) panels of RLX_NR
 * columns; panel p holds B[0:K, p*NR : p*NR+NR] row by row (K x NR floats,
 * contiguous), columns past N are zero. The kernel streams a panel front to
 * back. The kernel (and so NR) is picked by the instruction set this file is
 * compiled for; param storage is sized for RLX_PACK_NR_MAX columns per panel,
 * which covers every variant, so offsets do not depend on the ISA.
 *
 *   AVX-512: 12 x 32 tile, 24 zmm accumulators + 2 for B + 1 broadcast of A.
 *   AVX2+FMA: 6 x 16 tile, 12 ymm accumulators + 2 for B + 1 broadcast.
 *   otherwise: B is stored row-major (ld = N) and multiplied with rlx_sgemm1
 *              (BLAS or the C fallback) on blocks of C.
 *
 * Work is split into tiles (a block of up to RLX_MC rows x one panel); the
 * OpenMP threads of a GEMM take contiguous ranges of tiles, so a GEMM with few
 * rows (one short sentence) is still spread over every core by panels.
 */
#include "kernels/packed_core.h"

/* act(C) on an mr x nc block of C, right after the block's last multiply-add. The generated
 * file defines it (one case per activation its GEMMs fuse) before including this header. */
static inline void rlx_epilogue_act(float *restrict C, int64_t ldc, int64_t mr, int64_t nc, int act);

#ifdef RLX_NR

/* Rows per tile: a tile's A block (RLX_MC x K floats) stays in L2 while the panels pass by. */
#define RLX_MC (8 * RLX_MR)
/* Longest K one kernel call covers; beyond it the panel slice no longer sits in L2 and
 * partial sums go through C (the bias is added with the last slice). */
#define RLX_KC 2048

/* rlx_kernel (the micro-kernel: a C tile += rows of A @ one panel) and rlx_pack_b are declared in
 * kernels/packed_core.h and compiled once per toolchain from kernels/packed_core.c. */

/* Work units of an M x N product: tiles of RLX_MC rows x one panel, row blocks outermost. */
static inline int64_t rlx_pgemm_tiles(int64_t M, int64_t N)
{
    return (M + RLX_MC - 1) / RLX_MC * ((N + RLX_NR - 1) / RLX_NR);
}

/* The first tile at or after `w` row-panels of work (rounded to the nearest tile start), in the
 * row-block-major order of rlx_pgemm_tiles: a full row block's tiles cost RLX_MC row-panels each,
 * the last (short) block's M % RLX_MC. */
static inline int64_t rlx_pgemm_tile_at(int64_t M, int64_t np, int64_t w)
{
    const int64_t full = M / RLX_MC, head = full * RLX_MC * np;
    if (np == 0)
        return 0;
    if (w <= head)
        return w / (RLX_MC * np) * np + (w % (RLX_MC * np) + RLX_MC / 2) / RLX_MC;
    const int64_t last = M - full * RLX_MC;
    return full * np + (w - head + last / 2) / last;
}

/* Thread t's tiles [t0, t1) of an M x N product, balanced by rows rather than by tile count: the
 * short last row block's tiles are cheaper, and a split that counts them as whole tiles leaves
 * one thread up to a block's worth of rows behind (MiniLM at 8 x 128: 1024 = 10 x 96 + 64 rows,
 * ~6% more work for the first of 2 threads). Contiguous, covering, in order: t0(t + 1) = t1(t). */
static inline void rlx_pgemm_split(int64_t M, int64_t N, int t, int nt, int64_t *t0, int64_t *t1)
{
    const int64_t np = (N + RLX_NR - 1) / RLX_NR, work = M * np;
    *t0 = rlx_pgemm_tile_at(M, np, work * t / nt);
    *t1 = rlx_pgemm_tile_at(M, np, work * (t + 1) / nt);
}

/* Tiles [t0, t1) of C[M, N] = A[M, K] @ packed B (+ bias), then act. K = 0 gives bias (or 0). */
static void rlx_pgemm(int64_t M, int64_t N, int64_t K, const float *A, int64_t lda, const float *Bp, float *C,
                      int64_t ldc, const float *bias, int act, int64_t t0, int64_t t1)
{
    const int64_t np = (N + RLX_NR - 1) / RLX_NR;
    for (int64_t t = t0; t < t1; t++) {
        const int64_t i0 = t / np * RLX_MC, j0 = t % np * RLX_NR;
        const int64_t i1 = i0 + RLX_MC < M ? i0 + RLX_MC : M;
        const int64_t nr = N - j0 < RLX_NR ? N - j0 : RLX_NR;
        const float *panel = Bp + j0 * K;  /* panel t % np starts after (t % np) * NR * K floats */
        const float *bs = bias ? bias + j0 : NULL;
        for (int64_t i = i0; i < i1; i += RLX_MR) {
            const int64_t mr = i1 - i < RLX_MR ? i1 - i : RLX_MR;
            float *c = C + i * ldc + j0;
            if (K == 0)
                rlx_kernel(mr, 0, 0, A, lda, panel, c, ldc, nr, bs, 0);
            for (int64_t k0 = 0; k0 < K; k0 += RLX_KC) {
                const int64_t kc = K - k0 < RLX_KC ? K - k0 : RLX_KC;
                rlx_kernel(mr, i == i0, kc, A + i * lda + k0, lda, panel + k0 * RLX_NR, c, ldc, nr,
                           k0 + kc >= K ? bs : NULL, k0 > 0);
            }
        }
        /* the activation over the whole block rather than after each kernel call: MiniLM's erf GELU epilogue
           (8 x 128, 2 threads, FFN up-projection less the down-projection per call) 3.40 -> 3.08 ms, the
           GELU's long chains back to back instead of between the kernel's multiply-adds */
        if (act != RLX_EPI_NONE)
            rlx_epilogue_act(C + i0 * ldc + j0, ldc, i1 - i0, nr, act);
    }
}

#else  /* no packing kernel for this ISA: B stays row-major and the BLAS (or C GEMM) multiplies */

/* Blocks handed to one rlx_sgemm1 call: rows x columns of C. */
#define RLX_FB_ROWS 64
#define RLX_FB_COLS 256

static inline int64_t rlx_pgemm_tiles(int64_t M, int64_t N)
{
    return (M + RLX_FB_ROWS - 1) / RLX_FB_ROWS * ((N + RLX_FB_COLS - 1) / RLX_FB_COLS);
}

/* Thread t's tiles: an even count of them, unweighted (these tiles are row x column blocks, both
 * possibly short; the micro-kernel's split above is the one MiniLM's GEMMs take). */
static inline void rlx_pgemm_split(int64_t M, int64_t N, int t, int nt, int64_t *t0, int64_t *t1)
{
    const int64_t tiles = rlx_pgemm_tiles(M, N);
    *t0 = tiles * t / nt;
    *t1 = tiles * (t + 1) / nt;
}

/* Tiles [t0, t1) (row blocks outermost): one sgemm per row block over the tiles' column span. */
static void rlx_pgemm(int64_t M, int64_t N, int64_t K, const float *A, int64_t lda, const float *B, float *C,
                      int64_t ldc, const float *bias, int act, int64_t t0, int64_t t1)
{
    const int64_t nb = (N + RLX_FB_COLS - 1) / RLX_FB_COLS;
    for (int64_t t = t0; t < t1;) {
        const int64_t bm = t / nb, c0 = t % nb;
        const int64_t c1 = c0 + (t1 - t) < nb ? c0 + (t1 - t) : nb;
        const int64_t i0 = bm * RLX_FB_ROWS, i1 = i0 + RLX_FB_ROWS < M ? i0 + RLX_FB_ROWS : M;
        const int64_t j0 = c0 * RLX_FB_COLS, j1 = c1 * RLX_FB_COLS < N ? c1 * RLX_FB_COLS : N;
        float *c = C + i0 * ldc + j0;
        rlx_sgemm1(0, 0, i1 - i0, j1 - j0, K, A + i0 * lda, lda, B + j0, N, c, ldc);
        if (bias)
            for (int64_t i = 0; i < i1 - i0; i++) {
                float *restrict row = c + i * ldc;
                #pragma omp simd
                for (int64_t j = 0; j < j1 - j0; j++)
                    row[j] += bias[j0 + j];
            }
        if (act != RLX_EPI_NONE)
            rlx_epilogue_act(c, ldc, i1 - i0, j1 - j0, act);
        t += c1 - c0;
    }
}

#endif

/* The pool of a packed GEMM's tiles for a team of `nt`: thread t's range as rlx_pgemm_split gives it. */
static inline void rlx_pgemm_pool(rlx_task_pool *pool, int64_t M, int64_t N, int nt)
{
    rlx_task_pool_init(pool, nt);
    for (int t = 0; t < nt; t++) {
        int64_t t0, t1;
        rlx_pgemm_split(M, N, t, nt, &t0, &t1);
        rlx_task_pool_range(pool, t, t0, t1);
    }
}

/* Threads for a packed GEMM: no more than there are tiles, none for tiny products. */
static inline int rlx_pgemm_threads(int nt, int64_t tiles, int64_t m, int64_t n, int64_t k)
{
    const int ng = rlx_gemm_threads(nt, m, n, k);
    return tiles < 1 ? 1 : (tiles < ng ? (int)tiles : ng);
}

/* Thread t's share [lo, hi) of n work units, in contiguous ranges. */
static inline void rlx_split(int64_t n, int t, int nt, int64_t *lo, int64_t *hi)
{
    *lo = n * t / nt;
    *hi = n * (t + 1) / nt;
}

/* rlx_pack_param (set_param of a packed param) is in kernels/packed_core.c too. */

#endif /* RLX_KERNELS_PACKED_GEMM_H */

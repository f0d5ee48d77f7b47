/* The graph-independent core of the packed GEMM (declared in kernels/packed_core.h): packing B
 * and the micro-kernel. A kernel unit: a fixed translation unit, compiled once per compiler, flags
 * and ISA into the RLX cache and linked into every program that includes kernels/packed_core.h. */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "kernels/packed_core.h"

#ifdef RLX_NR
#include <immintrin.h>

#if RLX_NR == 32
/* out[k * ldo + j] <- in[j * ldi + k] for j, k < 16: a 16 x 16 block transposed in registers (unpacks of
 * lanes and pairs, then 128-bit lane shuffles; the result's rows come out with dims 1 and 2 of each 4 swapped). */
static inline void rlx_transpose16(float *restrict out, int64_t ldo, const float *restrict in, int64_t ldi)
{
    __m512 r[16], t[16];
    for (int i = 0; i < 16; i++)
        r[i] = _mm512_loadu_ps(in + i * ldi);
    for (int i = 0; i < 16; i += 2) {
        t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
        t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
    }
    for (int i = 0; i < 16; i += 4)
        for (int j = 0; j < 2; j++) {
            r[i + j] = _mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(t[i + j]), _mm512_castps_pd(t[i + j + 2])));
            r[i + j + 2] = _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(t[i + j]), _mm512_castps_pd(t[i + j + 2])));
        }
    for (int i = 0; i < 16; i += 8)
        for (int j = 0; j < 4; j++) {
            t[i + j] = _mm512_shuffle_f32x4(r[i + j], r[i + j + 4], 0x88);
            t[i + j + 4] = _mm512_shuffle_f32x4(r[i + j], r[i + j + 4], 0xdd);
        }
    for (int j = 0; j < 8; j++) {
        r[j] = _mm512_shuffle_f32x4(t[j], t[j + 8], 0x88);
        r[j + 8] = _mm512_shuffle_f32x4(t[j], t[j + 8], 0xdd);
    }
    for (int i = 0; i < 16; i++)
        _mm512_storeu_ps(out + ((i & ~3) | (i & 1) << 1 | (i >> 1 & 1)) * ldo, r[i]);
}

/* One panel of `w` columns whose elements are contiguous along K (sk == 1, column j at col + j * sn): a
 * transposed read, 16 x 16 blocks at a time through registers instead of one strided load per element (an
 * attention task's K^T, a PyTorch [out, in] weight): the same values as the loop below. */
static void rlx_pack_panel_t(float *restrict out, const float *restrict col, int64_t K, int64_t w, int64_t sn)
{
    const int64_t kf = K / 16 * 16, jf = w / 16 * 16;
    for (int64_t j0 = 0; j0 < jf; j0 += 16)
        for (int64_t k0 = 0; k0 < kf; k0 += 16)
            rlx_transpose16(out + k0 * RLX_NR + j0, RLX_NR, col + j0 * sn + k0, sn);
    for (int64_t k = 0; k < K; k++)  /* the rest: rows past the last whole block, columns past jf, the zeros */
        for (int64_t j = k < kf ? jf : 0; j < RLX_NR; j++)
            out[k * RLX_NR + j] = j < w ? col[j * sn + k] : 0.0f;
}
#endif

/* Panels of RLX_NR columns, K rows each, zero-padded past N. */
void rlx_pack_b(float *restrict dst, const float *restrict src, int64_t K, int64_t N, int64_t sk, int64_t sn)
{
    for (int64_t p0 = 0; p0 < N; p0 += RLX_NR) {
        const int64_t w = N - p0 < RLX_NR ? N - p0 : RLX_NR;
        const float *restrict col = src + p0 * sn;
#if RLX_NR == 32
        if (sk == 1 && sn != 1) {
            rlx_pack_panel_t(dst, col, K, w, sn);
            dst += K * RLX_NR;
            continue;
        }
#endif
        for (int64_t k = 0; k < K; k++) {
            float *restrict out = dst + k * RLX_NR;
            const float *restrict in = col + k * sk;
            if (sn == 1) {
                memcpy(out, in, (size_t)w * sizeof(float));
            } else {
                for (int64_t j = 0; j < w; j++)
                    out[j] = in[j * sn];
            }
            for (int64_t j = w; j < RLX_NR; j++)
                out[j] = 0.0f;
        }
        dst += K * RLX_NR;
    }
}

/* Ask for a row of the C tile (`lines` cache lines from `row`) for writing, before the tile's
 * multiply-adds: C is usually in no cache yet (a fresh activation), and the tile's stores at the
 * end would otherwise wait for those lines (read for ownership) with nothing left to overlap.
 * Measured on the AVX2 tile (Zen 3, one thread's CPU time, K = 384): 54 -> 68 GFLOP/s at
 * N = 1536, where C rows are 6 KiB apart and every tile's rows miss. */
static inline __attribute__((always_inline)) void rlx_prefetch_c_row(float *row, int lines)
{
    __builtin_prefetch(row, 1, 3);
    if (lines > 1)
        __builtin_prefetch(row + 16, 1, 3);
}

#if RLX_NR == 32
#include "kernels/tile_store.h"

/* C[0:mr, 0:nr] (+)= A[0:mr, 0:kc] @ panel[0:kc, :] (+ bias[0:nr]). `mr` and `prefetch` are
 * compile-time constants at every call (see rlx_kernel), so unused rows cost neither registers
 * nor FMAs. `nr` <= 32 masks the stores of the last panel; `accumulate` adds to what C holds.
 * `prefetch`: the panel comes from memory (first row group of a tile), so ask for it
 * RLX_PF_BYTES ahead; without this a short GEMM streams weights at half the DRAM bandwidth. */
static inline __attribute__((always_inline)) void rlx_kernel_tile(const int mr, const int prefetch, int64_t kc,
        const float *restrict A, int64_t lda, const float *restrict Bp, float *restrict C, int64_t ldc, int64_t nr,
        const float *restrict bias, int accumulate, const char *next)
{
    __m512 c0[RLX_MR], c1[RLX_MR];
    #pragma GCC unroll 12
    for (int i = 0; i < RLX_MR; i++)
        if (i < mr) {
            c0[i] = _mm512_setzero_ps();
            c1[i] = _mm512_setzero_ps();
            rlx_prefetch_c_row(C + i * ldc, 2);
        }
    for (int64_t k = 0; k < kc; k++) {
        if (prefetch) {
            _mm_prefetch((const char *)(Bp + k * RLX_NR) + RLX_PF_BYTES, _MM_HINT_T0);
            _mm_prefetch((const char *)(Bp + k * RLX_NR) + RLX_PF_BYTES + 64, _MM_HINT_T0);
        }
        if (next && !(k & 1))  /* rlx_kernel_next: a line of the next panel every other k */
            _mm_prefetch(next + (k >> 1) * 64, _MM_HINT_T0);
        const __m512 b0 = _mm512_load_ps(Bp + k * RLX_NR);
        const __m512 b1 = _mm512_load_ps(Bp + k * RLX_NR + 16);
        #pragma GCC unroll 12
        for (int i = 0; i < RLX_MR; i++)
            if (i < mr) {
                const __m512 a = _mm512_set1_ps(A[i * lda + k]);
                c0[i] = _mm512_fmadd_ps(a, b0, c0[i]);
                c1[i] = _mm512_fmadd_ps(a, b1, c1[i]);
            }
    }
    rlx_tile_store_512(mr, c0, c1, C, ldc, nr, bias, accumulate);
}
#else
/* The AVX2 tile: same contract as above with 6 rows and 16 columns (one cache line per k). */
static inline __attribute__((always_inline)) void rlx_kernel_tile(const int mr, const int prefetch, int64_t kc,
        const float *restrict A, int64_t lda, const float *restrict Bp, float *restrict C, int64_t ldc, int64_t nr,
        const float *restrict bias, int accumulate, const char *next)
{
    __m256 c0[RLX_MR], c1[RLX_MR];
    #pragma GCC unroll 6
    for (int i = 0; i < RLX_MR; i++)
        if (i < mr) {
            c0[i] = _mm256_setzero_ps();
            c1[i] = _mm256_setzero_ps();
            rlx_prefetch_c_row(C + i * ldc, 1);
        }
    for (int64_t k = 0; k < kc; k++) {
        if (prefetch)
            _mm_prefetch((const char *)(Bp + k * RLX_NR) + RLX_PF_BYTES, _MM_HINT_T0);
        if (next && !(k & 1))  /* rlx_kernel_next: a line of the next panel every other k */
            _mm_prefetch(next + (k >> 1) * 64, _MM_HINT_T0);
        const __m256 b0 = _mm256_load_ps(Bp + k * RLX_NR);
        const __m256 b1 = _mm256_load_ps(Bp + k * RLX_NR + 8);
        #pragma GCC unroll 6
        for (int i = 0; i < RLX_MR; i++)
            if (i < mr) {
                const __m256 a = _mm256_broadcast_ss(A + i * lda + k);
                c0[i] = _mm256_fmadd_ps(a, b0, c0[i]);
                c1[i] = _mm256_fmadd_ps(a, b1, c1[i]);
            }
    }
    const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    const int w = nr < 16 ? (int)nr : 16;
    const __m256i m0 = _mm256_cmpgt_epi32(_mm256_set1_epi32(w), lane);
    const __m256i m1 = _mm256_cmpgt_epi32(_mm256_set1_epi32(w - 8), lane);
    __m256 bias0 = _mm256_setzero_ps(), bias1 = _mm256_setzero_ps();
    if (bias && nr >= 16) {
        bias0 = _mm256_loadu_ps(bias);
        bias1 = _mm256_loadu_ps(bias + 8);
    } else if (bias) {
        bias0 = _mm256_maskload_ps(bias, m0);
        bias1 = _mm256_maskload_ps(bias + 8, m1);
    }
    #pragma GCC unroll 6
    for (int i = 0; i < RLX_MR; i++)
        if (i < mr) {
            float *row = C + i * ldc;
            __m256 v0 = _mm256_add_ps(c0[i], bias0), v1 = _mm256_add_ps(c1[i], bias1);
            if (nr >= 16) {  /* a whole panel: plain moves (vmaskmovps is microcoded on AMD: -8..13%) */
                if (accumulate) {
                    v0 = _mm256_add_ps(v0, _mm256_loadu_ps(row));
                    v1 = _mm256_add_ps(v1, _mm256_loadu_ps(row + 8));
                }
                _mm256_storeu_ps(row, v0);
                _mm256_storeu_ps(row + 8, v1);
                continue;
            }
            if (accumulate) {
                v0 = _mm256_add_ps(v0, _mm256_maskload_ps(row, m0));
                v1 = _mm256_add_ps(v1, _mm256_maskload_ps(row + 8, m1));
            }
            _mm256_maskstore_ps(row, m0, v0);
            _mm256_maskstore_ps(row + 8, m1, v1);
        }
}
#endif

/* Instances of the tile for a few row counts only (RLX_MR, 8, 4, 2, 1 — or 6, 4, 2, 1 for AVX2),
 * each compiled for exactly that many rows; other counts run as a sum of them (11 = 8 + 2 + 1)
 * over disjoint rows of C, which computes every element exactly as one 11-row tile would.
 * Every instance is a fully unrolled AVX kernel: instantiating all twelve doubled the compile
 * time of a one-matmul program for rows that only the last tile of a GEMM ever has. */
#define RLX_KERNEL_CASE(R)                                                                     \
    case R:                                                                                    \
        if (prefetch)                                                                          \
            rlx_kernel_tile(R, 1, kc, A, lda, Bp, C, ldc, nr, bias, accumulate, NULL);         \
        else                                                                                   \
            rlx_kernel_tile(R, 0, kc, A, lda, Bp, C, ldc, nr, bias, accumulate, NULL);         \
        break;

void rlx_kernel(int64_t mr, int prefetch, int64_t kc, const float *A, int64_t lda, const float *Bp, float *C,
                       int64_t ldc, int64_t nr, const float *bias, int accumulate)
{
    while (mr > 0) {
        const int64_t r = mr >= RLX_MR ? RLX_MR : mr >= 8 ? 8 : mr >= 4 ? 4 : mr >= 2 ? 2 : 1;
        switch (r) {
#if RLX_MR == 12
        RLX_KERNEL_CASE(12)
        RLX_KERNEL_CASE(8)
#else
        RLX_KERNEL_CASE(6)
#endif
        RLX_KERNEL_CASE(4)
        RLX_KERNEL_CASE(2)
        default:
        RLX_KERNEL_CASE(1)
        }
        A += r * lda;
        C += r * ldc;
        mr -= r;
        prefetch = 0;  /* the first piece brought the panel in */
    }
}
#undef RLX_KERNEL_CASE

void rlx_kernel_next(int64_t mr, int64_t kc, const float *A, int64_t lda, const float *Bp, float *C, int64_t ldc,
                     int64_t nr, int accumulate, const float *next)
{
    const char *pf = (const char *)next;
    const int64_t lines = kc * RLX_NR * (int64_t)sizeof(float) / 64;  /* of the next panel */
    int64_t done = next ? 0 : lines;
    while (mr > 0) {
        if (mr >= RLX_MR && done < lines) {  /* a whole row group: kc / 2 lines of the next panel */
            rlx_kernel_tile(RLX_MR, 0, kc, A, lda, Bp, C, ldc, nr, NULL, accumulate, pf + done * 64);
            done += kc / 2 > 0 ? kc / 2 : 1;
            A += RLX_MR * lda;
            C += RLX_MR * ldc;
            mr -= RLX_MR;
            continue;
        }
        const int64_t r = mr >= RLX_MR ? RLX_MR : mr;
        rlx_kernel(r, 0, kc, A, lda, Bp, C, ldc, nr, NULL, accumulate);
        A += r * lda;
        C += r * ldc;
        mr -= r;
    }
}

#include "kernels/vgelu.h"

#if RLX_NR == 32
/* Lanes [0, w) of 16 (w in 1..16). */
static inline __mmask16 rlx_lanes16(int64_t w)
{
    return w >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << w) - 1u);
}

/* gelu on rows x 32 of C (rows <= RLX_MR) with each lane given only its range's operations: the lanes of the
 * tail range (|x| >= 0.75, NaN) are packed into a buffer (vcompressps) while the center form runs over whole
 * vectors in place, the tail form runs over the packed lanes, and its results go back to their lanes
 * (vexpandps). Every lane gets the operations rlx_gelu16x4 gives it, so the same values; 41-62% of MiniLM's
 * FFN activations (8 x 128, by layer) are center lanes, which skip the tail's ~45 operations and division.
 * 12 x 32 tiles of a 96 x 1536 block, N(0, 1.1) values (half center lanes): 1.61 -> 1.42 TSC ticks an element;
 * N(-0.3, 1.2) (46%): 1.62 -> 1.51 (Sapphire Rapids; the sorting costs ~0.4 ticks an element). In MiniLM at
 * 8 x 128 (FFN up-projection less the down-projection per call, 5 alternating processes) 3.16 -> 2.97 ms over
 * whole 96-row blocks (rlx_pgemm's epilogue); called after each 12-row kernel call it was slower than the
 * lockstep form (3.39 -> 3.56 ms): its round trips through the buffer then sat between the kernel's tiles. */
static void rlx_gelu_rows32(float *C, int64_t ldc, int64_t rows)
{
    float tb[2 * RLX_MR * 16 + 64] __attribute__((aligned(64)));  /* the packed tail lanes, then padding */
    __mmask16 tm[2 * RLX_MR];  /* each vector's tail lanes */
    const int nv = 2 * (int)rows;
    int nt = 0;
    for (int q0 = 0; q0 < nv; q0 += 4) {  /* center form in place, four vectors in lockstep (two: last row) */
        __m512 v[4];
        float *at[4];
        const int l = nv - q0 < 4 ? nv - q0 : 4;
        for (int q = 0; q < 4; q++) {
            if (q >= l) {
                v[q] = _mm512_setzero_ps();
                continue;
            }
            at[q] = C + (q0 + q) / 2 * ldc + (q0 + q) % 2 * 16;
            v[q] = _mm512_loadu_ps(at[q]);
            const __m512 ax = _mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(v[q]),
                                                                   _mm512_set1_epi32(0x7fffffff)));
            const __mmask16 m = _mm512_cmp_ps_mask(ax, _mm512_set1_ps(0.75f), _CMP_NLT_UQ);
            tm[q0 + q] = m;
            _mm512_storeu_ps(tb + nt, _mm512_maskz_compress_ps(m, v[q]));
            nt += __builtin_popcount(m);
        }
        rlx_gelu16_center4(v);
        for (int q = 0; q < l; q++)
            _mm512_storeu_ps(at[q], v[q]);
    }
    for (int q = 0; q < 4; q++)  /* the last group's unused lanes: zeros, not stale stack */
        _mm512_storeu_ps(tb + nt + 16 * q, _mm512_setzero_ps());
    int j = 0;
    for (; j + 48 < nt; j += 64) {  /* tail form over the packed lanes: 4, 2 or 1 vectors at a time */
        __m512 v[4] = {_mm512_load_ps(tb + j), _mm512_load_ps(tb + j + 16), _mm512_load_ps(tb + j + 32),
                       _mm512_load_ps(tb + j + 48)};
        rlx_gelu16_tail4(v);
        for (int q = 0; q < 4; q++)
            _mm512_store_ps(tb + j + 16 * q, v[q]);
    }
    if (j + 16 < nt) {
        __m512 v[2] = {_mm512_load_ps(tb + j), _mm512_load_ps(tb + j + 16)};
        rlx_gelu16_tail2(v);
        _mm512_store_ps(tb + j, v[0]);
        _mm512_store_ps(tb + j + 16, v[1]);
        j += 32;
    }
    if (j < nt) {
        __m512 v[1] = {_mm512_load_ps(tb + j)};
        rlx_gelu16_tail1(v);
        _mm512_store_ps(tb + j, v[0]);
    }
    for (int q = 0, off = 0; q < nv; q++) {  /* the tail lanes' results back in place */
        if (!tm[q])
            continue;
        float *at = C + q / 2 * ldc + q % 2 * 16;
        __m512 tail = _mm512_loadu_ps(tb + off);
        __asm__("" : "+v"(tail)); /* keep the load apart: vexpandps from memory ran the block ~7% slower */
        _mm512_storeu_ps(at, _mm512_mask_expand_ps(_mm512_loadu_ps(at), tm[q], tail));
        off += __builtin_popcount(tm[q]);
    }
}

void rlx_gelu_block(float *C, int64_t ldc, int64_t rows, int64_t cols)
{
    int64_t i = 0;
    if (cols == 32) {  /* whole panels of the 12 x 32 tile, the ranges apart */
        for (; i < rows; i += RLX_MR)
            rlx_gelu_rows32(C + i * ldc, ldc, rows - i < RLX_MR ? rows - i : RLX_MR);
        return;
    }
    /* any other block: its vectors two at a time, a short one masked */
    __m512 v[2];
    float *at[2];
    __mmask16 mk[2];
    int q = 0;
    for (; i < rows; i++)
        for (int64_t j = 0; j < cols; j += 16) {
            at[q] = C + i * ldc + j;
            mk[q] = rlx_lanes16(cols - j);
            v[q] = _mm512_maskz_loadu_ps(mk[q], at[q]);
            if (++q == 2) {
                rlx_gelu16x2(v);
                _mm512_mask_storeu_ps(at[0], mk[0], v[0]);
                _mm512_mask_storeu_ps(at[1], mk[1], v[1]);
                q = 0;
            }
        }
    if (q) {
        v[1] = _mm512_setzero_ps();
        rlx_gelu16x2(v);
        _mm512_mask_storeu_ps(at[0], mk[0], v[0]);
    }
}
#else
/* A mask of lanes [0, w) of 8 (w in 1..7). */
static inline __m256i rlx_lanes8(int64_t w)
{
    return _mm256_cmpgt_epi32(_mm256_set1_epi32((int)w), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

/* The first `width` lanes of v to p (all 8 from 8 on): whole vectors with a plain move (vmaskmovps is microcoded
 * on AMD). */
static inline void rlx_store8w(float *p, int64_t width, __m256 v)
{
    if (width >= 8)
        _mm256_storeu_ps(p, v);
    else
        _mm256_maskstore_ps(p, rlx_lanes8(width), v);
}

void rlx_gelu_block(float *C, int64_t ldc, int64_t rows, int64_t cols)
{
    int64_t i = 0;
    if (cols == 16)  /* a whole panel of the 6 x 16 tile: three rows, six vectors per step */
        for (; i + 3 <= rows; i += 3) {
            float *r0 = C + i * ldc, *r1 = r0 + ldc, *r2 = r1 + ldc;
            __m256 t[6] = {_mm256_loadu_ps(r0), _mm256_loadu_ps(r0 + 8), _mm256_loadu_ps(r1),
                           _mm256_loadu_ps(r1 + 8), _mm256_loadu_ps(r2), _mm256_loadu_ps(r2 + 8)};
            rlx_gelu8x6(t);
            _mm256_storeu_ps(r0, t[0]);
            _mm256_storeu_ps(r0 + 8, t[1]);
            _mm256_storeu_ps(r1, t[2]);
            _mm256_storeu_ps(r1 + 8, t[3]);
            _mm256_storeu_ps(r2, t[4]);
            _mm256_storeu_ps(r2 + 8, t[5]);
        }
    /* any other block (and a short tile's last rows): its vectors four at a time, a short one masked */
    __m256 v[4];
    float *at[4];
    int64_t width[4];
    int q = 0;
    for (; i < rows; i++)
        for (int64_t j = 0; j < cols; j += 8) {
            at[q] = C + i * ldc + j;
            width[q] = cols - j;  /* whole vectors use plain moves: vmaskmovps is microcoded on AMD */
            v[q] = width[q] >= 8 ? _mm256_loadu_ps(at[q]) : _mm256_maskload_ps(at[q], rlx_lanes8(width[q]));
            if (++q == 4) {
                rlx_gelu8x4(v);
                for (int r = 0; r < 4; r++)
                    rlx_store8w(at[r], width[r], v[r]);
                q = 0;
            }
        }
    for (int r = q; r < 4; r++)
        v[r] = _mm256_setzero_ps();
    if (q)
        rlx_gelu8x4(v);
    for (int r = 0; r < q; r++)
        rlx_store8w(at[r], width[r], v[r]);
}
#endif

#if RLX_NR == 32
#include "kernels/vexp16.h"

/* Accumulators of C[0:mr, 0:32] = A[0:mr, 0:kc] @ B[0:kc, 0:32], rows of B ldb apart (a packed panel: ldb
 * = 32; V read in place: its row stride): rlx_kernel_tile's multiply-adds, k by k in the same order. `halves` (a
 * compile-time constant): 2, or 1 for columns 0:16 only (c1 left zero: a last panel of at most 16 keys). */
static inline __attribute__((always_inline)) void rlx_attn_acc(const int mr, const int halves, int64_t kc,
        const float *restrict A, int64_t lda, const float *restrict B, int64_t ldb, __m512 *c0, __m512 *c1)
{
    #pragma GCC unroll 12
    for (int i = 0; i < RLX_MR; i++)
        if (i < mr) {
            c0[i] = _mm512_setzero_ps();
            c1[i] = _mm512_setzero_ps();
        }
    for (int64_t k = 0; k < kc; k++) {
        const __m512 b0 = _mm512_loadu_ps(B + k * ldb);
        const __m512 b1 = halves == 2 ? _mm512_loadu_ps(B + k * ldb + 16) : b0;
        #pragma GCC unroll 12
        for (int i = 0; i < RLX_MR; i++)
            if (i < mr) {
                const __m512 a = _mm512_set1_ps(A[i * lda + k]);
                c0[i] = _mm512_fmadd_ps(a, b0, c0[i]);
                if (halves == 2)
                    c1[i] = _mm512_fmadd_ps(a, b1, c1[i]);
            }
    }
}

/* s[0:16] (lanes m) <- 2^(s - max), added to the row's float lanes *acc (s: log2-scaled scores, <= max, -inf where
 * masked, NaN only from NaN inputs). */
static inline __attribute__((always_inline)) void rlx_attn_exp16(float *s, __mmask16 m, __m512 vmx, __m512 *acc)
{
    const __m512 e = _mm512_maskz_mov_ps(m, rlx_exp2_16_nonpos(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, s), vmx)));
    _mm512_mask_storeu_ps(s, m, e);
    *acc = _mm512_add_ps(*acc, e);
}

/* The softmax of n (1 or 2, a compile-time constant) rows of log2-scaled scores, skv apart from s, in place, without
 * the division: s[r, j] <- 2^(s[r, j] - mx[r]) (mx[r] the row's max, not -inf), and inv[r] = 1 / sum_r. Each of 16
 * float lanes adds its keys (j = lane mod 16) in order (rlx_softmax_row adds them in double: two conversions and two
 * adds a vector, ~a third of its exp step), then the 16 lane sums are widened and reduced in double; two rows go
 * together so that their chains overlap. */
static inline __attribute__((always_inline)) void rlx_attn_softmax_rows(const int n, float *restrict s, int64_t skv,
        const float *mx, float *inv)
{
    __m512 vmx[2], acc[2];
    for (int r = 0; r < n; r++) {
        vmx[r] = _mm512_set1_ps(mx[r]);
        acc[r] = _mm512_setzero_ps();
    }
    int64_t j = 0;
    for (; j + 16 <= skv; j += 16)  /* whole vectors: no lane mask to compute */
        for (int r = 0; r < n; r++)
            rlx_attn_exp16(s + r * skv + j, (__mmask16)0xFFFF, vmx[r], &acc[r]);
    if (j < skv)
        for (int r = 0; r < n; r++)
            rlx_attn_exp16(s + r * skv + j, rlx_lanes16(skv - j), vmx[r], &acc[r]);
    for (int r = 0; r < n; r++) {  /* the 16 lanes' sums widened, reduced in double */
        const __m512d lo = _mm512_cvtps_pd(_mm512_castps512_ps256(acc[r]));
        const __m512d hi = _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(acc[r]), 1)));
        inv[r] = (float)(1.0 / _mm512_reduce_add_pd(_mm512_add_pd(lo, hi)));
    }
}

/* One group of mr query rows of rlx_attn_rows (mr a compile-time constant at every call): the scores panel by
 * panel, scaled by scale log2(e), masked and their row maxima taken at the tile's store; each row's powers of 2
 * (exp(x) = 2^(x log2(e))) and float sum, two rows at a time; the weighted sum of V scaled by 1 / sum at its
 * store. */
static inline __attribute__((always_inline)) void rlx_attn_group(const int mr, float *restrict O, int64_t ldo,
        const float *restrict Q, int64_t ldq, const float *restrict kp, int64_t hd, const float *restrict V,
        int64_t ldv, int64_t skv, float scale, const float *restrict keep, float *restrict S)
{
    const __m512 vscale = _mm512_set1_ps(scale * 1.44269504088896341f), ninf = _mm512_set1_ps(-INFINITY);
    __m512 c0[RLX_MR], c1[RLX_MR], vmax[RLX_MR];
    float inv[RLX_MR];
    #pragma GCC unroll 12
    for (int i = 0; i < RLX_MR; i++)
        if (i < mr)
            vmax[i] = ninf;
    /* S[i, j] = (q_i . k_j) * (scale log2(e)), -inf where keep[j] == 0 (S's rows skv apart) */
    for (int64_t p0 = 0; p0 < skv; p0 += 32) {
        const int64_t nr = skv - p0;
        const __mmask16 m0 = rlx_lanes16(nr), m1 = nr > 16 ? rlx_lanes16(nr - 16) : (__mmask16)0;
        if (nr > 16)
            rlx_attn_acc(mr, 2, hd, Q, ldq, kp + p0 * hd, 32, c0, c1);
        else  /* a last panel of at most 16 keys (1 x 16: the only one): half the multiply-adds */
            rlx_attn_acc(mr, 1, hd, Q, ldq, kp + p0 * hd, 32, c0, c1);
        __mmask16 k0 = m0, k1 = m1;  /* lanes of keys kept */
        if (keep) {
            k0 = _mm512_mask_cmp_ps_mask(m0, _mm512_maskz_loadu_ps(m0, keep + p0), _mm512_setzero_ps(), _CMP_NEQ_UQ);
            k1 = _mm512_mask_cmp_ps_mask(m1, _mm512_maskz_loadu_ps(m1, keep + p0 + 16), _mm512_setzero_ps(),
                                         _CMP_NEQ_UQ);
        }
        #pragma GCC unroll 12
        for (int i = 0; i < RLX_MR; i++)
            if (i < mr) {
                __m512 v0 = _mm512_mul_ps(c0[i], vscale), v1 = _mm512_mul_ps(c1[i], vscale);
                if (keep) {
                    v0 = _mm512_mask_blend_ps(k0, ninf, v0);
                    v1 = _mm512_mask_blend_ps(k1, ninf, v1);
                }
                _mm512_mask_storeu_ps(S + i * skv + p0, m0, v0);
                _mm512_mask_storeu_ps(S + i * skv + p0 + 16, m1, v1);
                vmax[i] = _mm512_mask_max_ps(vmax[i], m0, v0, vmax[i]);
                vmax[i] = _mm512_mask_max_ps(vmax[i], m1, v1, vmax[i]);
            }
    }
    /* S[i, j] <- 2^(S[i, j] - max_i), inv[i] = 1 / sum_i, two rows at a time; a row whose keys are all masked is
       zeros (inv 0) */
    float mx[RLX_MR];
    #pragma GCC unroll 12
    for (int i = 0; i < RLX_MR; i++)
        if (i < mr)
            mx[i] = _mm512_reduce_max_ps(vmax[i]);
    for (int r = 0; r < mr;) {
        if (r + 1 < mr && mx[r] != -INFINITY && mx[r + 1] != -INFINITY) {
            rlx_attn_softmax_rows(2, S + r * skv, skv, mx + r, inv + r);
            r += 2;
        } else if (mx[r] != -INFINITY) {
            rlx_attn_softmax_rows(1, S + r * skv, skv, mx + r, inv + r);
            r += 1;
        } else {  /* every key masked */
            memset(S + r * skv, 0, (size_t)skv * sizeof(float));
            inv[r] = 0.0f;
            r += 1;
        }
    }
    /* O[i, :] = (E[i, :] @ V) * inv[i], 32 columns at a time */
    for (int64_t d0 = 0; d0 < hd; d0 += 32) {
        rlx_attn_acc(mr, 2, skv, S, skv, V + d0, ldv, c0, c1);
        #pragma GCC unroll 12
        for (int i = 0; i < RLX_MR; i++)
            if (i < mr) {
                const __m512 w = _mm512_set1_ps(inv[i]), z = _mm512_setzero_ps();
                /* (+ 0: the value the kernel's store gives, then the scaling, as the unfused rows) */
                _mm512_storeu_ps(O + i * ldo + d0, _mm512_mul_ps(_mm512_add_ps(c0[i], z), w));
                _mm512_storeu_ps(O + i * ldo + d0 + 16, _mm512_mul_ps(_mm512_add_ps(c1[i], z), w));
            }
    }
}

#define RLX_ATTN_CASE(R)                                                                   \
    case R:                                                                                \
        rlx_attn_group(R, O, ldo, Q, ldq, kp, hd, V, ldv, skv, scale, keep, S);            \
        break;

void rlx_attn_rows(float *O, int64_t ldo, const float *Q, int64_t ldq, int64_t rows, const float *kp, int64_t hd,
                   const float *V, int64_t ldv, int64_t skv, float scale, const float *keep, float *S)
{
    while (rows > 0) {
        const int64_t r = rows >= RLX_MR ? RLX_MR : rows >= 8 ? 8 : rows >= 4 ? 4 : rows >= 2 ? 2 : 1;
        switch (r) {
        RLX_ATTN_CASE(12)
        RLX_ATTN_CASE(8)
        RLX_ATTN_CASE(4)
        RLX_ATTN_CASE(2)
        default:
        RLX_ATTN_CASE(1)
        }
        Q += r * ldq;
        O += r * ldo;
        rows -= r;
    }
}
#undef RLX_ATTN_CASE
#endif

#else

/* No micro-kernel: B stays row-major (the BLAS or the C GEMM multiplies it). */
void rlx_pack_b(float *restrict dst, const float *restrict src, int64_t K, int64_t N, int64_t sk, int64_t sn)
{
    for (int64_t k = 0; k < K; k++)
        for (int64_t n = 0; n < N; n++)
            dst[k * N + n] = src[k * sk + n * sn];
}

#endif

void rlx_pack_param(float *dst, const float *src, int nbatch_axes, const int64_t *dims, const int64_t *strides)
{
    const int64_t K = dims[nbatch_axes], N = dims[nbatch_axes + 1];
    const int64_t stride = (N + RLX_PACK_NR_MAX - 1) / RLX_PACK_NR_MAX * RLX_PACK_NR_MAX * K;
    const int64_t count = rlx_batch_count(nbatch_axes, dims);
    for (int64_t b = 0; b < count; b++)
        rlx_pack_b(dst + b * stride, src + rlx_batch_offset(b, nbatch_axes, dims, strides), K, N,
                   strides[nbatch_axes], strides[nbatch_axes + 1]);
}

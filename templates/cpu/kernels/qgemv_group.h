/* Decode GEMVs of several quantized weights that read one activation (Q/K/V, or gate/up with the
 * SwiGLU after them), as one pass: the activation is quantized once and one team splits the rows of
 * all the weights, so a decode step forks once where it forked per projection (and ran the SwiGLU as
 * its own kernel). f32 activations take the same pass through rlx_qgemv (the _f32 functions below).
 * Needs kernels/quant_kernels.h (the GEMVs) and kernels/scalar.h (silu). Part of the kernel unit
 * kernels/quant.c (entry points rlx_qgroup_rows_<fmt>_<act>, rlx_qgroup_swiglu_<fmt>_<act>, declared in
 * kernels/quant.h); not included by generated files. */
#ifndef RLX_KERNELS_QGEMV_GROUP_H
#define RLX_KERNELS_QGEMV_GROUP_H

#include <stdint.h>

/* Most weights one group multiplies (rlx.opt.lowering_quant_cpu.DECODE_GEMV_MEMBERS). */
#define RLX_QGROUP_MAX 4

/* Rows [r0, r1) of the concatenation of the members' rows: member m has N[m] rows of rb bytes at
 * W[m] and writes Y[m] ([M, N[m]]). Xq / xds: the activation quantized by rlx_q8_quantize_rows.
 * interleaved: the weights are stored interleaved by 16 rows (kernels/quant_interleaved.h; r0, r1 multiples of 16). */
static inline __attribute__((always_inline)) void rlx_qgroup_rows(const int fmt, const int a16, const int interleaved,
        int64_t M, int64_t K, const int8_t *Xq, const float *xds, int nm, const uint8_t *const *W, const int64_t *N,
        int64_t rb, float *const *Y, int64_t r0, int64_t r1)
{
    int64_t base = 0;
    for (int m = 0; m < nm; m++) {
        const int64_t lo = (r0 > base ? r0 : base) - base;
        const int64_t hi = (r1 < base + N[m] ? r1 : base + N[m]) - base;
        if (lo < hi && interleaved)
            rlx_qi_gemm(fmt, a16, M, N[m], K, Xq, xds, W[m], rb, Y[m], lo / RLX_QI_ROWS, hi / RLX_QI_ROWS);
        else if (lo < hi)
            rlx_q8gemm(fmt, a16, M, N[m], K, Xq, xds, W[m], rb, Y[m], lo, hi);
        base += N[m];
    }
}

/* Rows of gate and up multiplied per chunk before the SwiGLU runs over the chunk (vectorized). */
#define RLX_QGROUP_CHUNK 32

/* out[i, n] = silu(x_i . Wg[n]) * (x_i . Wu[n]) for n in [n0, n1), i < M (<= RLX_QDECODE_MAX_M): both
 * weights' rows of a chunk into registers-sized buffers (RLX_QGEMV_MAX_M rows of X at a time), then the
 * product, so the gate and up projections are never written out. */
static inline __attribute__((always_inline)) void rlx_qgroup_swiglu(const int fmt, const int a16, int64_t M,
        int64_t N, int64_t K, const int8_t *Xq, const float *xds, const uint8_t *Wg, const uint8_t *Wu,
        int64_t rb, float *out, int64_t n0, int64_t n1)
{
    const int64_t nb = K / 32, ahead = (RLX_Q8_PREFETCH_BYTES + rb - 1) / rb, xrow = K * (a16 ? 2 : 1);
    float g[RLX_QDECODE_MAX_M][RLX_QGROUP_CHUNK], u[RLX_QDECODE_MAX_M][RLX_QGROUP_CHUNK];
    float og[RLX_QGEMV_MAX_M], ou[RLX_QGEMV_MAX_M];
    for (int64_t c0 = n0; c0 < n1; c0 += RLX_QGROUP_CHUNK) {
        const int64_t c1 = c0 + RLX_QGROUP_CHUNK < n1 ? c0 + RLX_QGROUP_CHUNK : n1;
        for (int64_t n = c0; n < c1; n++) {
            if (n + ahead < n1)  /* keep DRAM busy while the integer products run (as rlx_q8gemm) */
                for (int64_t o = 0; o < rb; o += 64) {
                    __builtin_prefetch(Wg + (n + ahead) * rb + o, 0, 3);
                    __builtin_prefetch(Wu + (n + ahead) * rb + o, 0, 3);
                }
            for (int64_t i0 = 0; i0 < M; i0 += RLX_QGEMV_MAX_M) {
                const int64_t mr = M - i0 < RLX_QGEMV_MAX_M ? M - i0 : RLX_QGEMV_MAX_M;
                const int8_t *xq = Xq + i0 * xrow;
                const float *ds = xds + 2 * i0 * nb;
                switch (mr) {  /* one instance per row count */
                case 4: rlx_q8dot(fmt, a16, 4, nb, xq, K, ds, Wg + n * rb, og);
                        rlx_q8dot(fmt, a16, 4, nb, xq, K, ds, Wu + n * rb, ou); break;
                case 3: rlx_q8dot(fmt, a16, 3, nb, xq, K, ds, Wg + n * rb, og);
                        rlx_q8dot(fmt, a16, 3, nb, xq, K, ds, Wu + n * rb, ou); break;
                case 2: rlx_q8dot(fmt, a16, 2, nb, xq, K, ds, Wg + n * rb, og);
                        rlx_q8dot(fmt, a16, 2, nb, xq, K, ds, Wu + n * rb, ou); break;
                default: rlx_q8dot(fmt, a16, 1, nb, xq, K, ds, Wg + n * rb, og);
                         rlx_q8dot(fmt, a16, 1, nb, xq, K, ds, Wu + n * rb, ou); break;
                }
                for (int64_t i = 0; i < mr; i++) {
                    g[i0 + i][n - c0] = og[i];
                    u[i0 + i][n - c0] = ou[i];
                }
            }
        }
        for (int64_t i = 0; i < M; i++) {
            float *restrict o = out + i * N + c0;
            const float *restrict gi = g[i], *restrict ui = u[i];
            #pragma omp simd
            for (int64_t j = 0; j < c1 - c0; j++)
                o[j] = rlx_silu_f(gi[j]) * ui[j];
        }
    }
}

/* f32 activations (act="f32", the batch-invariant default of rlxc serve): rows [r0, r1) of the members'
 * concatenated rows through rlx_qgemv, each row of X with the arithmetic of the member's own kernel
 * (wrow: one dequantized weight row for the formats without SIMD kernels). */
static inline __attribute__((always_inline)) void rlx_qgroup_rows_f32(const int fmt, const int qk, const int qb,
        int64_t M, int64_t K, const float *X, int nm, const uint8_t *const *W, const int64_t *N,
        int64_t rb, float *const *Y, int64_t r0, int64_t r1, float *wrow)
{
    int64_t base = 0;
    for (int m = 0; m < nm; m++) {
        const int64_t lo = (r0 > base ? r0 : base) - base;
        const int64_t hi = (r1 < base + N[m] ? r1 : base + N[m]) - base;
        if (lo < hi)
            rlx_qgemv(fmt, qk, qb, M, N[m], K, X, W[m], rb, Y[m], lo, hi, wrow);
        base += N[m];
    }
}

/* rlx_qgroup_swiglu with f32 activations: per chunk of weight rows, gate and up through rlx_qgemv into
 * the chunk's buffers (the same per-row arithmetic as their own kernels), then silu(gate) * up. The
 * thread that computed a chunk's gate and up reads them from its own cache: with a separate SwiGLU
 * kernel half of them came from the other core's (the cost of that region in a many-row step). */
static inline __attribute__((always_inline)) void rlx_qgroup_swiglu_f32(const int fmt, const int qk, const int qb,
        int64_t M, int64_t N, int64_t K, const float *X, const uint8_t *Wg, const uint8_t *Wu,
        int64_t rb, float *out, int64_t n0, int64_t n1, float *wrow)
{
    float g[RLX_QDECODE_MAX_M * RLX_QGROUP_CHUNK], u[RLX_QDECODE_MAX_M * RLX_QGROUP_CHUNK];
    for (int64_t c0 = n0; c0 < n1; c0 += RLX_QGROUP_CHUNK) {
        const int64_t c1 = c0 + RLX_QGROUP_CHUNK < n1 ? c0 + RLX_QGROUP_CHUNK : n1;
        /* row i of the chunk's gate (up) at g + i * RLX_QGROUP_CHUNK: rlx_qgemv's Y with that row stride */
        rlx_qgemv(fmt, qk, qb, M, RLX_QGROUP_CHUNK, K, X, Wg + c0 * rb, rb, g, 0, c1 - c0, wrow);
        rlx_qgemv(fmt, qk, qb, M, RLX_QGROUP_CHUNK, K, X, Wu + c0 * rb, rb, u, 0, c1 - c0, wrow);
        for (int64_t i = 0; i < M; i++) {
            float *restrict o = out + i * N + c0;
            const float *restrict gi = g + i * RLX_QGROUP_CHUNK, *restrict ui = u + i * RLX_QGROUP_CHUNK;
            #pragma omp simd
            for (int64_t j = 0; j < c1 - c0; j++)
                o[j] = rlx_silu_f(gi[j]) * ui[j];
        }
    }
}

#endif /* RLX_KERNELS_QGEMV_GROUP_H */

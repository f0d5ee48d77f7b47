/* Matrix products with weights in GGUF block formats (q8_0, q4_0, q4_1, q5_0, q5_1, q4_k, q6_k): the
 * entry points of the kernel unit kernels/quant.c. A fixed RLX kernel header: no template code;
 * included by generated files that need it.
 *
 * A kernel unit (rlx/toolchain/units.py): the kernels (kernels/quant_kernels.h, and the decode GEMV
 * groups of kernels/qgemv_group.h) are compiled once per compiler, flags and ISA into the RLX cache
 * and linked into every program whose source includes this header. Inlined into every quantized
 * matmul of a program (three copies each: decode group, GEMV, prefill panels) they were most of a
 * quantized decoder's compile time (SmolLM2-135M: ~100 s of gcc -O3, ~15 s without them); a program
 * now holds only the calls.
 *
 * One entry point per format (and, for integer activations, per activation width), each compiled
 * with its format as a constant, so the block loops are as specialized as when they were inlined.
 * A call covers a range of weight rows (a thread's share), a panel or a row, never a block: the call
 * costs nothing next to the work. The names (f: q8_0 q4_0 q4_1 q5_0 q5_1 q4_k q6_k; i: q8_0 q4_0
 * q4_1; a: q8 (int8 activations) or q16 (int16)):
 *
 *   rlx_q_dequant_row_f          one row of blocks to f32, exactly as rlx.ir.quant.dequantize
 *   rlx_qgemv_f                  decode GEMV, f32 activations, over weight rows [n0, n1)
 *   rlx_q_dequant_panel_f        a prefill panel of RLX_QP rows into the packed layout
 *                                (kernels/qgemm_panels.h multiplies it with the packed GEMM)
 *   rlx_qgroup_rows_f_f32        a QuantGemvGroup's rows (several weights, one activation)
 *   rlx_qgroup_swiglu_f_f32      a QuantGemvGroup's gate and up with the SwiGLU after them
 *   rlx_q8_quantize_rows_i_a     X quantized to int8 / int16 blocks for the integer kernels
 *   rlx_q8gemm_i_a               decode GEMV on quantized activations
 *   rlx_qgroup_rows_i_a, rlx_qgroup_swiglu_i_a   the groups on quantized activations
 *   rlx_q_act_round_trip                         a format-free helper
 *
 * and for weights stored interleaved by 16 rows (an InterleavedQuantParam; kernels/quant_interleaved.h;
 * j: q8_0 q4_0 q4_1):
 *
 *   rlx_qi_interleave_param      the GGUF rows into that layout (rlx_set_param)
 *   rlx_qi_quantize_rows_a       X quantized for the q4_x ones (blocks in order; q8_0's rows are)
 *   rlx_qi_gemm_j_a              decode GEMV over groups of 16 weight rows [g0, g1)
 *   rlx_qi_group_rows_j_a, rlx_qi_group_swiglu_j_a   the QuantGemvGroup passes
 *   rlx_qi_dequant_panel_j       a prefill panel (exactly rlx_q_dequant_panel's values)
 *
 * rlx_qgemv_fmt and rlx_q_dequant_panel_fn take the format as an argument (for kernels/moe.h, whose
 * weight kind is a constant of its caller: the switch folds away when inlined).
 */
#ifndef RLX_KERNELS_QUANT_H
#define RLX_KERNELS_QUANT_H

#include <stdint.h>

#include "kernels/packed_core.h"  /* RLX_NR: the prefill panel's width */

/* Format ids (rlx/codegen/cpu/quant.py FORMAT_IDS). */
enum { RLX_Q8_0 = 0, RLX_Q4_0 = 1, RLX_Q4_1 = 2, RLX_Q5_0 = 3, RLX_Q5_1 = 4, RLX_Q4_K = 5, RLX_Q6_K = 6 };

/* Rows of X one GEMV kernel call multiplies while a weight block sits in registers. */
#define RLX_QGEMV_MAX_M 4
/* Rows of X up to which the GEMV kernels run, RLX_QGEMV_MAX_M at a time per weight row (beyond:
 * dequantized panels and the GEMM kernel). Every row takes the same arithmetic whatever M is, so a
 * decode row's result does not depend on the other rows of its step (batch-invariant): a sequence
 * decodes the same alone or among up to RLX_QDECODE_MAX_M - 1 others, and a speculative verification
 * equals the one-row steps it replaces (rlx.opt.lowering_quant_cpu.DECODE_GEMV_ROWS). */
#define RLX_QDECODE_MAX_M 16

/* Threads for a decode GEMV over `bytes` of weight blocks. With sleeping OpenMP threads (`spins`
 * 0: the context's wait policy is passive) waking a team costs about as much as one core streaming
 * half a megabyte of blocks, so smaller weights (every per-layer matrix of a SmolLM-sized model) run on the calling
 * thread and only large ones (the vocabulary projection) are split. With spinning threads (RLX's
 * default, or RLX_OMP_WAIT=active) a fork is cheap and 32 KB per thread pays. */
#define RLX_QGEMV_BYTES_PER_THREAD ((int64_t)1 << 19)
#define RLX_QGEMV_BYTES_PER_SPINNING_THREAD ((int64_t)1 << 15)
static inline int rlx_qgemv_threads(int nt, int spins, int64_t bytes)
{
    const int64_t per = spins ? RLX_QGEMV_BYTES_PER_SPINNING_THREAD : RLX_QGEMV_BYTES_PER_THREAD;
    const int64_t useful = bytes / per;
    return useful < 1 ? 1 : (useful < nt ? (int)useful : nt);
}

/* Weight rows per prefill panel: the packed kernel's panel width (or 32 without one). */
#ifdef RLX_NR
#define RLX_QP RLX_NR
#else
#define RLX_QP 32
#endif

#define RLX_QUANT_FN __attribute__((visibility("hidden")))

/* X' = the values the integer activation modes see, as floats (a16: int16, else int8 blocks). */
RLX_QUANT_FN void rlx_q_act_round_trip(const int a16, int64_t M, int64_t K, const float *restrict X,
                                       float *restrict XF);

/* The f32-activation entry points of format f (every format). */
#define RLX_QUANT_DECLARE_F32(f)                                                                              \
    RLX_QUANT_FN void rlx_q_dequant_row_##f(const uint8_t *row, int64_t K, float *y);                         \
    RLX_QUANT_FN void rlx_qgemv_##f(int64_t M, int64_t N, int64_t K, const float *X,                          \
                                    const uint8_t *W, int64_t rb, float *Y, int64_t n0, int64_t n1,           \
                                    float *wrow);                                                             \
    RLX_QUANT_FN void rlx_q_dequant_panel_##f(const uint8_t *W, int64_t rb, int64_t K, int64_t nr,            \
                                              float *panel, float *wrow);                                     \
    RLX_QUANT_FN void rlx_qgroup_rows_##f##_f32(int64_t M, int64_t K, const float *X, int nm,                  \
                                                const uint8_t *const *W, const int64_t *N, int64_t rb,       \
                                                float *const *Y, int64_t r0, int64_t r1, float *wrow);        \
    RLX_QUANT_FN void rlx_qgroup_swiglu_##f##_f32(int64_t M, int64_t N, int64_t K, const float *X,            \
                                                  const uint8_t *Wg, const uint8_t *Wu,                       \
                                                  int64_t rb, float *out, int64_t n0, int64_t n1, float *wrow);

/* The integer-activation entry points of format f, activation width a (q8 / q16). */
#define RLX_QUANT_DECLARE_INT(f, a)                                                                           \
    RLX_QUANT_FN void rlx_q8_quantize_rows_##f##_##a(int64_t M, int64_t K, const float *X, int8_t *Xq,        \
                                                     float *xds);                                             \
    RLX_QUANT_FN void rlx_q8gemm_##f##_##a(int64_t M, int64_t N, int64_t K, const int8_t *Xq,                 \
                                           const float *xds, const uint8_t *W, int64_t rb, float *Y,          \
                                           int64_t n0, int64_t n1);                                           \
    RLX_QUANT_FN void rlx_qgroup_rows_##f##_##a(int64_t M, int64_t K, const int8_t *Xq, const float *xds,     \
                                                int nm, const uint8_t *const *W, const int64_t *N, int64_t rb, \
                                                float *const *Y, int64_t r0, int64_t r1);                     \
    RLX_QUANT_FN void rlx_qgroup_swiglu_##f##_##a(int64_t M, int64_t N, int64_t K, const int8_t *Xq,          \
                                                  const float *xds, const uint8_t *Wg, const uint8_t *Wu,     \
                                                  int64_t rb, float *out, int64_t n0, int64_t n1);

RLX_QUANT_DECLARE_F32(q8_0)
RLX_QUANT_DECLARE_F32(q4_0)
RLX_QUANT_DECLARE_F32(q4_1)
RLX_QUANT_DECLARE_F32(q5_0)
RLX_QUANT_DECLARE_F32(q5_1)
RLX_QUANT_DECLARE_F32(q4_k)
RLX_QUANT_DECLARE_F32(q6_k)
RLX_QUANT_DECLARE_INT(q8_0, q8)
RLX_QUANT_DECLARE_INT(q4_0, q8)
RLX_QUANT_DECLARE_INT(q4_1, q8)
RLX_QUANT_DECLARE_INT(q8_0, q16)
RLX_QUANT_DECLARE_INT(q4_0, q16)
RLX_QUANT_DECLARE_INT(q4_1, q16)

/* The entry points on weights interleaved by 16 rows (kernels/quant_interleaved.h). */
#define RLX_QUANT_DECLARE_QI(f, a)                                                                            \
    RLX_QUANT_FN void rlx_qi_gemm_##f##_##a(int64_t M, int64_t N, int64_t K, const int8_t *Xq,                \
                                            const float *xds, const uint8_t *W, int64_t rb, float *Y,         \
                                            int64_t g0, int64_t g1);                                          \
    RLX_QUANT_FN void rlx_qi_group_rows_##f##_##a(int64_t M, int64_t K, const int8_t *Xq, const float *xds,   \
                                                  int nm, const uint8_t *const *W, const int64_t *N,          \
                                                  int64_t rb, float *const *Y, int64_t r0, int64_t r1);       \
    RLX_QUANT_FN void rlx_qi_group_swiglu_##f##_##a(int64_t M, int64_t N, int64_t K, const int8_t *Xq,        \
                                                    const float *xds, const uint8_t *Wg, const uint8_t *Wu,   \
                                                    int64_t rb, float *out, int64_t g0, int64_t g1);

RLX_QUANT_FN void rlx_qi_interleave_param(int fmt, uint8_t *dst, const uint8_t *src, int64_t N, int64_t rb);
RLX_QUANT_FN void rlx_qi_quantize_rows_q8(int64_t M, int64_t K, const float *X, int8_t *Xq, float *xds);
RLX_QUANT_FN void rlx_qi_quantize_rows_q16(int64_t M, int64_t K, const float *X, int8_t *Xq, float *xds);
RLX_QUANT_FN void rlx_qi_dequant_panel_q8_0(const uint8_t *W, int64_t rb, int64_t K, int64_t nr, float *panel,
                                            float *wrow);
RLX_QUANT_FN void rlx_qi_dequant_panel_q4_0(const uint8_t *W, int64_t rb, int64_t K, int64_t nr, float *panel,
                                            float *wrow);
RLX_QUANT_FN void rlx_qi_dequant_panel_q4_1(const uint8_t *W, int64_t rb, int64_t K, int64_t nr, float *panel,
                                            float *wrow);
RLX_QUANT_DECLARE_QI(q8_0, q8)
RLX_QUANT_DECLARE_QI(q8_0, q16)
RLX_QUANT_DECLARE_QI(q4_0, q8)
RLX_QUANT_DECLARE_QI(q4_1, q8)
RLX_QUANT_DECLARE_QI(q4_0, q16)
RLX_QUANT_DECLARE_QI(q4_1, q16)

/* rlx_qgemv_<fmt> for a format id (a constant where this is inlined, so the switch folds). */
static inline void rlx_qgemv_fmt(const int fmt, int64_t M, int64_t N, int64_t K, const float *X,
                                 const uint8_t *W, int64_t rb, float *Y, int64_t n0, int64_t n1, float *wrow)
{
    switch (fmt) {
    case RLX_Q8_0: rlx_qgemv_q8_0(M, N, K, X, W, rb, Y, n0, n1, wrow); break;
    case RLX_Q4_0: rlx_qgemv_q4_0(M, N, K, X, W, rb, Y, n0, n1, wrow); break;
    case RLX_Q4_1: rlx_qgemv_q4_1(M, N, K, X, W, rb, Y, n0, n1, wrow); break;
    case RLX_Q5_0: rlx_qgemv_q5_0(M, N, K, X, W, rb, Y, n0, n1, wrow); break;
    case RLX_Q5_1: rlx_qgemv_q5_1(M, N, K, X, W, rb, Y, n0, n1, wrow); break;
    case RLX_Q4_K: rlx_qgemv_q4_k(M, N, K, X, W, rb, Y, n0, n1, wrow); break;
    case RLX_Q6_K: rlx_qgemv_q6_k(M, N, K, X, W, rb, Y, n0, n1, wrow); break;
    default: break;
    }
}

/* A prefill panel's dequantizer (rlx_q_dequant_panel_<fmt>). */
typedef void (*rlx_q_panel_fn)(const uint8_t *W, int64_t rb, int64_t K, int64_t nr, float *panel, float *wrow);

/* rlx_q_dequant_panel_<fmt> for a format id (NULL for none). */
static inline rlx_q_panel_fn rlx_q_dequant_panel_fn(const int fmt)
{
    switch (fmt) {
    case RLX_Q8_0: return rlx_q_dequant_panel_q8_0;
    case RLX_Q4_0: return rlx_q_dequant_panel_q4_0;
    case RLX_Q4_1: return rlx_q_dequant_panel_q4_1;
    case RLX_Q5_0: return rlx_q_dequant_panel_q5_0;
    case RLX_Q5_1: return rlx_q_dequant_panel_q5_1;
    case RLX_Q4_K: return rlx_q_dequant_panel_q4_k;
    case RLX_Q6_K: return rlx_q_dequant_panel_q6_k;
    default: return 0;
    }
}

#endif /* RLX_KERNELS_QUANT_H */

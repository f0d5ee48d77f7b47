/* The kernel unit of the quantized matmuls (declared in kernels/quant.h): the kernels of
 * kernels/quant_kernels.h and kernels/qgemv_group.h instantiated once per format (and activation
 * width), the format a constant in each, so every switch on it folds away. A fixed translation
 * unit, compiled once per compiler, flags and ISA into the RLX cache and linked into every program
 * that includes kernels/quant.h (rlx/toolchain/units.py). */
#include <stdint.h>

#include "kernels/half.h"
#include "kernels/scalar.h"  /* rlx_silu_f, for the SwiGLU groups */
#include "kernels/quant_kernels.h"
#include "kernels/quant_interleaved.h"  /* before the groups: they call its GEMV on interleaved weights */
#include "kernels/qgemv_group.h"

/* f32 activations: format f (id FMT, QK values in QB bytes a block). */
#define RLX_QUANT_DEFINE_F32(f, FMT, QK, QB)                                                                  \
    void rlx_q_dequant_row_##f(const uint8_t *row, int64_t K, float *y)                                       \
    {                                                                                                         \
        rlx_q_dequant_row(FMT, QK, QB, row, K, y);                                                            \
    }                                                                                                         \
    void rlx_qgemv_##f(int64_t M, int64_t N, int64_t K, const float *X, const uint8_t *W,                     \
                       int64_t rb, float *Y, int64_t n0, int64_t n1, float *wrow)                             \
    {                                                                                                         \
        rlx_qgemv(FMT, QK, QB, M, N, K, X, W, rb, Y, n0, n1, wrow);                                           \
    }                                                                                                         \
    void rlx_q_dequant_panel_##f(const uint8_t *W, int64_t rb, int64_t K, int64_t nr, float *panel,           \
                                 float *wrow)                                                                 \
    {                                                                                                         \
        rlx_q_dequant_panel(FMT, QK, QB, W, rb, K, nr, panel, wrow);                                          \
    }                                                                                                         \
    void rlx_qgroup_rows_##f##_f32(int64_t M, int64_t K, const float *X, int nm,                              \
                                   const uint8_t *const *W, const int64_t *N, int64_t rb, float *const *Y,    \
                                   int64_t r0, int64_t r1, float *wrow)                                       \
    {                                                                                                         \
        rlx_qgroup_rows_f32(FMT, QK, QB, M, K, X, nm, W, N, rb, Y, r0, r1, wrow);                             \
    }                                                                                                         \
    void rlx_qgroup_swiglu_##f##_f32(int64_t M, int64_t N, int64_t K, const float *X,                         \
                                     const uint8_t *Wg, const uint8_t *Wu, int64_t rb, float *out, int64_t n0, \
                                     int64_t n1, float *wrow)                                                 \
    {                                                                                                         \
        rlx_qgroup_swiglu_f32(FMT, QK, QB, M, N, K, X, Wg, Wu, rb, out, n0, n1, wrow);                        \
    }

/* Integer activations: format f (id FMT), activation width a (A16: 1 for q16). */
#define RLX_QUANT_DEFINE_INT(f, a, FMT, A16)                                                                  \
    void rlx_q8_quantize_rows_##f##_##a(int64_t M, int64_t K, const float *X, int8_t *Xq, float *xds)         \
    {                                                                                                         \
        rlx_q8_quantize_rows(FMT, 0, A16, M, K, X, Xq, xds);                                                   \
    }                                                                                                         \
    void rlx_q8gemm_##f##_##a(int64_t M, int64_t N, int64_t K, const int8_t *Xq, const float *xds,            \
                              const uint8_t *W, int64_t rb, float *Y, int64_t n0, int64_t n1)                 \
    {                                                                                                         \
        rlx_q8gemm(FMT, A16, M, N, K, Xq, xds, W, rb, Y, n0, n1);                                             \
    }                                                                                                         \
    void rlx_qgroup_rows_##f##_##a(int64_t M, int64_t K, const int8_t *Xq, const float *xds, int nm,          \
                                   const uint8_t *const *W, const int64_t *N, int64_t rb, float *const *Y,    \
                                   int64_t r0, int64_t r1)                                                    \
    {                                                                                                         \
        rlx_qgroup_rows(FMT, A16, 0, M, K, Xq, xds, nm, W, N, rb, Y, r0, r1);                                    \
    }                                                                                                         \
    void rlx_qgroup_swiglu_##f##_##a(int64_t M, int64_t N, int64_t K, const int8_t *Xq, const float *xds,     \
                                     const uint8_t *Wg, const uint8_t *Wu, int64_t rb, float *out, int64_t n0, \
                                     int64_t n1)                                                              \
    {                                                                                                         \
        rlx_qgroup_swiglu(FMT, A16, M, N, K, Xq, xds, Wg, Wu, rb, out, n0, n1);                               \
    }

RLX_QUANT_DEFINE_F32(q8_0, RLX_Q8_0, 32, 34)
RLX_QUANT_DEFINE_F32(q4_0, RLX_Q4_0, 32, 18)
RLX_QUANT_DEFINE_F32(q4_1, RLX_Q4_1, 32, 20)
RLX_QUANT_DEFINE_F32(q5_0, RLX_Q5_0, 32, 22)
RLX_QUANT_DEFINE_F32(q5_1, RLX_Q5_1, 32, 24)
RLX_QUANT_DEFINE_F32(q4_k, RLX_Q4_K, 256, 144)
RLX_QUANT_DEFINE_F32(q6_k, RLX_Q6_K, 256, 210)
RLX_QUANT_DEFINE_INT(q8_0, q8, RLX_Q8_0, 0)
RLX_QUANT_DEFINE_INT(q4_0, q8, RLX_Q4_0, 0)
RLX_QUANT_DEFINE_INT(q4_1, q8, RLX_Q4_1, 0)
RLX_QUANT_DEFINE_INT(q8_0, q16, RLX_Q8_0, 1)
RLX_QUANT_DEFINE_INT(q4_0, q16, RLX_Q4_0, 1)
RLX_QUANT_DEFINE_INT(q4_1, q16, RLX_Q4_1, 1)

/* Weights interleaved by 16 rows (kernels/quant_interleaved.h): q8_0 / q4_0 / q4_1 (id FMT), activation width a. */
#define RLX_QUANT_DEFINE_QI(f, a, FMT, A16)                                                                   \
    void rlx_qi_gemm_##f##_##a(int64_t M, int64_t N, int64_t K, const int8_t *Xq, const float *xds,           \
                               const uint8_t *W, int64_t rb, float *Y, int64_t g0, int64_t g1)                \
    {                                                                                                         \
        rlx_qi_gemm(FMT, A16, M, N, K, Xq, xds, W, rb, Y, g0, g1);                                            \
    }                                                                                                         \
    void rlx_qi_group_rows_##f##_##a(int64_t M, int64_t K, const int8_t *Xq, const float *xds, int nm,        \
                                     const uint8_t *const *W, const int64_t *N, int64_t rb, float *const *Y,  \
                                     int64_t r0, int64_t r1)                                                  \
    {                                                                                                         \
        rlx_qgroup_rows(FMT, A16, 1, M, K, Xq, xds, nm, W, N, rb, Y, r0, r1);                                  \
    }                                                                                                         \
    void rlx_qi_group_swiglu_##f##_##a(int64_t M, int64_t N, int64_t K, const int8_t *Xq, const float *xds,   \
                                       const uint8_t *Wg, const uint8_t *Wu, int64_t rb, float *out,          \
                                       int64_t g0, int64_t g1)                                                \
    {                                                                                                         \
        rlx_qi_group_swiglu(FMT, A16, M, N, K, Xq, xds, Wg, Wu, rb, out, g0, g1);                             \
    }

void rlx_qi_quantize_rows_q8(int64_t M, int64_t K, const float *X, int8_t *Xq, float *xds)
{
    rlx_q8_quantize_rows(RLX_Q4_1, 1, 0, M, K, X, Xq, xds);
}
void rlx_qi_quantize_rows_q16(int64_t M, int64_t K, const float *X, int8_t *Xq, float *xds)
{
    rlx_q8_quantize_rows(RLX_Q4_1, 1, 1, M, K, X, Xq, xds);
}
void rlx_qi_dequant_panel_q8_0(const uint8_t *W, int64_t rb, int64_t K, int64_t nr, float *panel, float *wrow)
{
    rlx_qi_dequant_panel(RLX_Q8_0, W, rb, K, nr, panel, wrow);
}
void rlx_qi_dequant_panel_q4_0(const uint8_t *W, int64_t rb, int64_t K, int64_t nr, float *panel, float *wrow)
{
    rlx_qi_dequant_panel(RLX_Q4_0, W, rb, K, nr, panel, wrow);
}
void rlx_qi_dequant_panel_q4_1(const uint8_t *W, int64_t rb, int64_t K, int64_t nr, float *panel, float *wrow)
{
    rlx_qi_dequant_panel(RLX_Q4_1, W, rb, K, nr, panel, wrow);
}
void rlx_qi_interleave_param(int fmt, uint8_t *dst, const uint8_t *src, int64_t N, int64_t rb)
{
    rlx_qi_interleave(fmt, dst, src, N, rb);
}

RLX_QUANT_DEFINE_QI(q8_0, q8, RLX_Q8_0, 0)
RLX_QUANT_DEFINE_QI(q8_0, q16, RLX_Q8_0, 1)
RLX_QUANT_DEFINE_QI(q4_0, q8, RLX_Q4_0, 0)
RLX_QUANT_DEFINE_QI(q4_1, q8, RLX_Q4_1, 0)
RLX_QUANT_DEFINE_QI(q4_0, q16, RLX_Q4_0, 1)
RLX_QUANT_DEFINE_QI(q4_1, q16, RLX_Q4_1, 1)

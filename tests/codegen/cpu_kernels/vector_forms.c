/* Test harness (tests/codegen/test_cpu_vector_forms.py): the explicit vector forms of RLX's CPU kernels next to the
 * forms they must match bit for bit. Built for one x86-64 level at a time (AVX2+FMA or AVX-512) with the flags
 * of RLX's own builds. */
#include <stdint.h>
#include <string.h>

#include "kernels/half.h"
#include "kernels/scalar.h"
#include "kernels/packed_core.c" /* the kernel unit itself (rlx_gelu_block), in this translation unit */
#include "kernels/gemm.h"
#include "kernels/attention.h"
#if defined(__AVX512F__)
#include "kernels/vexp16.h"
#elif defined(__AVX2__) && defined(__FMA__)
#include "kernels/vexp8.h"
#endif

#define EXPORT __attribute__((visibility("default")))

/* Lanes of this build's vector exp: 16 (AVX-512), 8 (AVX2+FMA), 0 (neither: nothing to compare). */
EXPORT int chk_lanes(void)
{
#if defined(__AVX512F__)
    return 16;
#elif defined(__AVX2__) && defined(__FMA__)
    return 8;
#else
    return 0;
#endif
}

/* out[i] = rlx_gelu_f(x[i]), the loop the generated epilogue runs without a micro-kernel. */
EXPORT void chk_gelu_scalar(const float *x, float *out, int64_t n)
{
    #pragma omp simd
    for (int64_t i = 0; i < n; i++)
        out[i] = rlx_gelu_f(x[i]);
}

/* rlx_gelu_block in place on `blocks` consecutive rows x cols blocks of `buf` (rows ld apart, ld >= cols). */
EXPORT void chk_gelu_block(float *buf, int64_t blocks, int64_t rows, int64_t cols, int64_t ld)
{
#ifdef RLX_NR
    for (int64_t b = 0; b < blocks; b++)
        rlx_gelu_block(buf + b * rows * ld, ld, rows, cols);
#else
    (void)buf; (void)blocks; (void)rows; (void)cols; (void)ld;
#endif
}

/* out[i] = rlx_exp2_16_nonpos(y[i]) (n a multiple of 16; AVX-512 only: returns 0 where this build has none). */
EXPORT int chk_exp2(const float *y, float *out, int64_t n)
{
#if defined(__AVX512F__)
    for (int64_t i = 0; i < n; i += 16)
        _mm512_storeu_ps(out + i, rlx_exp2_16_nonpos(_mm512_loadu_ps(y + i)));
    return 1;
#else
    (void)y; (void)out; (void)n;
    return 0;
#endif
}

/* general[i] = the build's vector exp of x[i], nonpos[i] = its x <= 0 form (n a multiple of chk_lanes()). */
EXPORT void chk_exp(const float *x, float *general, float *nonpos, int64_t n)
{
#if defined(__AVX512F__)
    for (int64_t i = 0; i < n; i += 16) {
        _mm512_storeu_ps(general + i, rlx_exp16(_mm512_loadu_ps(x + i)));
        _mm512_storeu_ps(nonpos + i, rlx_exp16_nonpos(_mm512_loadu_ps(x + i)));
    }
#elif defined(__AVX2__) && defined(__FMA__)
    for (int64_t i = 0; i < n; i += 8) {
        _mm256_storeu_ps(general + i, rlx_exp8(_mm256_loadu_ps(x + i)));
        _mm256_storeu_ps(nonpos + i, rlx_exp8_nonpos(_mm256_loadu_ps(x + i)));
    }
#else
    (void)x; (void)general; (void)nonpos; (void)n;
#endif
}

/* dst <- rlx_pack_b(src, K, N, sk, sn): the packed panels (RLX_NR wide, or row-major without a micro-kernel). */
EXPORT void chk_pack_b(float *dst, const float *src, int64_t K, int64_t N, int64_t sk, int64_t sn)
{
    rlx_pack_b(dst, src, K, N, sk, sn);
}

/* One attention head, Q [sq, hd] (rows ldq apart), K and V [skv, hd] (rows ldk apart), keep [skv] or NULL, both
 * ways: `blocks` as the blocks form (K^T and V packed, a block's scores, rlx_softmax_row per row, the weighted sum,
 * the rows scaled by 1 / sum), `rows` through rlx_attn_rows (AVX-512 only; returns 0 where this build has none;
 * its softmax is 2^x of log2-scaled scores summed in float, the blocks form's rlx_expf summed in double). */
EXPORT int chk_attn(float *blocks, float *rows, const float *Q, const float *K, const float *V, const float *keep,
                    int64_t sq, int64_t skv, int64_t hd, int64_t ldq, int64_t ldk, float scale)
{
#if defined(RLX_NR) && RLX_NR == 32
    const int64_t panels = (skv + 31) / 32;
    float *kp = aligned_alloc(64, (size_t)(panels * 32 * hd + 16) * sizeof(float));
    float *vp = aligned_alloc(64, (size_t)(skv * ((hd + 31) / 32) * 32 + 16) * sizeof(float));
    float *S = malloc((size_t)(sq * skv + 16) * sizeof(float));
    rlx_attn_pack(kp, vp, K, V, skv, hd, ldk);
    rlx_attn_scores(S, skv, Q, ldq, sq, skv, hd, kp, K, ldk, 1);
    float *inv = malloc((size_t)sq * sizeof(float));
    for (int64_t i = 0; i < sq; i++)
        inv[i] = rlx_softmax_row(S + i * skv, skv, skv, scale, NULL, keep);
    rlx_attn_values(blocks, hd, S, skv, sq, skv, hd, vp, skv, V, ldk, 1);
    for (int64_t i = 0; i < sq; i++)
        for (int64_t d = 0; d < hd; d++)
            blocks[i * hd + d] *= inv[i];
    rlx_pack_b(kp, K, hd, skv, 1, ldk);
    rlx_attn_rows(rows, hd, Q, ldq, sq, kp, hd, V, ldk, skv, scale, keep, S);
    free(inv);
    free(S);
    free(vp);
    free(kp);
    return 1;
#else
    (void)blocks; (void)rows; (void)Q; (void)K; (void)V; (void)keep; (void)sq; (void)skv; (void)hd; (void)ldq;
    (void)ldk; (void)scale;
    return 0;
#endif
}

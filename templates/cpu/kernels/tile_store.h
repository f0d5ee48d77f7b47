/* The ending of every AVX-512 GEMM tile (the packed f32 kernel in kernels/packed_core.c, the bf16 and f16
 * kernels in kernels/gemm_bf16.h): rows of c0 | c1 (16 + 16 columns) plus bias, plus what C holds when
 * `accumulate`, stored with the last panel's columns (nr <= 32) masked. Include after <immintrin.h>, in a
 * file built for AVX-512. */
#ifndef RLX_KERNELS_TILE_STORE_H
#define RLX_KERNELS_TILE_STORE_H

/* The lanes of a 32-column panel's half (0: columns 0-15, 1: 16-31) that hold its first nr columns. */
static inline __attribute__((always_inline)) __mmask16 rlx_panel_mask(int64_t nr, int half)
{
    const int64_t w = nr - 16 * half;
    return w >= 16 ? (__mmask16)0xFFFF : w <= 0 ? (__mmask16)0 : (__mmask16)((1u << w) - 1u);
}

static inline __attribute__((always_inline)) void rlx_tile_store_512(const int mr, const __m512 *c0, const __m512 *c1,
        float *restrict C, int64_t ldc, int64_t nr, const float *restrict bias, int accumulate)
{
    const __mmask16 m0 = rlx_panel_mask(nr, 0), m1 = rlx_panel_mask(nr, 1);
    __m512 bias0 = _mm512_setzero_ps(), bias1 = _mm512_setzero_ps();
    if (bias) {
        bias0 = _mm512_maskz_loadu_ps(m0, bias);
        bias1 = _mm512_maskz_loadu_ps(m1, bias + 16);
    }
    #pragma GCC unroll 12
    for (int i = 0; i < RLX_MR; i++)
        if (i < mr) {
            float *row = C + i * ldc;
            __m512 v0 = _mm512_add_ps(c0[i], bias0), v1 = _mm512_add_ps(c1[i], bias1);
            if (accumulate) {
                v0 = _mm512_add_ps(v0, _mm512_maskz_loadu_ps(m0, row));
                v1 = _mm512_add_ps(v1, _mm512_maskz_loadu_ps(m1, row + 16));
            }
            _mm512_mask_storeu_ps(row, m0, v0);
            _mm512_mask_storeu_ps(row + 16, m1, v1);
        }
}

#endif /* RLX_KERNELS_TILE_STORE_H */

/* benchmarks/ffn_fused.py's launchers: the fused FFN (templates/cuda/kernels/ffn_fused.cuh) at two chunk widths,
 * and the same FFN as two rlx_gemm_mma launches (FFN1 with bias + erf GELU in its epilogue, FFN2 with bias), the
 * same products in the same order: the fused kernel's output must equal it bit for bit.
 * Built by benchmarks/ffn_fused.py with -I templates/cuda/kernels; f16, D = 384 (MiniLM's hidden size). */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>
#include <stdio.h>

/* the few names of templates/cuda/prelude.cuh.j2 and activations.cuh.j2 that gemm_mma.cuh uses */
typedef __nv_bfloat16 rlx_bf16;
__device__ __forceinline__ float rlx_f(__half x) { return __half2float(x); }
__device__ __forceinline__ float rlx_f(rlx_bf16 x) { return __bfloat162float(x); }
#include "gelu_erfc.cuh"
enum { RLX_ACT_NONE = 0, RLX_ACT_GELU = 1 };
template <int ACT, typename V> __device__ __forceinline__ V rlx_act(V x) {
    return ACT == RLX_ACT_GELU ? rlx_gelu_erfc(x) : x;
}
#include "gemm_mma.cuh"
#include "ffn_fused.cuh"

constexpr int D = 384;

template <int BI> static int launch_fused(const void *x, const void *w1, const void *b1, const void *w2,
                                          const void *b2, void *y, long long m, long long i, void *stream) {
    typedef RlxFfnFused<D, BI> F;
    auto k = rlx_ffn_fused<__half, D, BI>;
    if (cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)F::total) != cudaSuccess) return 1;
    k<<<(unsigned)((m + F::BM - 1) / F::BM), F::THREADS, F::total, (cudaStream_t)stream>>>(
        (const __half *)x, (const __half *)w1, (const __half *)b1, (const __half *)w2, (const __half *)b2,
        (__half *)y, m, i);
    return cudaGetLastError() != cudaSuccess;
}

template <int ACT> static int launch_mma(const void *a, const void *b, const void *bias, void *c, long long m,
                                         long long n, long long k, void *stream) {
    typedef RlxGemmMma<128, 128, 2, 4> G;
    auto f = rlx_gemm_mma<__half, ACT, true, 128, 128, 2, 4>;
    if (cudaFuncSetAttribute(f, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)G::total) != cudaSuccess) return 1;
    dim3 grid((unsigned)((n + 127) / 128), (unsigned)((m + 127) / 128));
    f<<<grid, G::THREADS, G::total, (cudaStream_t)stream>>>((const __half *)a, (const __half *)b,
                                                            (const __half *)bias, (__half *)c, m, n, k);
    return cudaGetLastError() != cudaSuccess;
}

extern "C" {
int ffn_fused_bi128(const void *x, const void *w1, const void *b1, const void *w2, const void *b2, void *y,
                    long long m, long long i, void *stream) {
    return launch_fused<128>(x, w1, b1, w2, b2, y, m, i, stream);
}
int ffn_fused_bi64(const void *x, const void *w1, const void *b1, const void *w2, const void *b2, void *y,
                   long long m, long long i, void *stream) {
    return launch_fused<64>(x, w1, b1, w2, b2, y, m, i, stream);
}
/* h: [m, i] scratch for the intermediate */
int ffn_mma_two(const void *x, const void *w1, const void *b1, const void *w2, const void *b2, void *h, void *y,
                long long m, long long i, void *stream) {
    if (launch_mma<RLX_ACT_GELU>(x, w1, b1, h, m, i, D, stream)) return 1;
    return launch_mma<RLX_ACT_NONE>(h, w2, b2, y, m, D, i, stream);
}
int ffn_smem_bytes(int bi) { return bi == 128 ? (int)RlxFfnFused<D, 128>::total : (int)RlxFfnFused<D, 64>::total; }
}

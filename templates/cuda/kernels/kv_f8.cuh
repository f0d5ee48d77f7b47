/* An f8e4m3fn KV cache (a CachedAttention whose caches are DType.F8E4M3FN): the cache holds CUDA's __nv_fp8_e4m3,
 * one byte a value, half an f16 cache's bytes. Stored values are converted from f32 with round-to-nearest-even,
 * saturating at +-448 (satfinite: the type has no infinity), as rlx.reference stores them; read back exactly. The
 * attention kernels (kv_attention.cuh, kv_decode.cuh) take the cache type as KT and convert through these. */
#include <cuda_fp8.h>

__device__ __forceinline__ float rlx_f(__nv_fp8_e4m3 x) { return __half2float(__half(__nv_cvt_fp8_to_halfraw(x.__x, __NV_E4M3))); }
template <> __device__ __forceinline__ __nv_fp8_e4m3 rlx_to<__nv_fp8_e4m3>(float x) {
    __nv_fp8_e4m3 r;
    r.__x = __nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3);
    return r;
}

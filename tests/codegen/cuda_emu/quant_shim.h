/* The CUDA device functions kernels/quant.cuh and quant_q8.cuh name, on the CPU (tests only; after cuda_shim.h):
 * f16 scales as their bits widened exactly, byte permutes, the integer dot product __dp4a and the IEEE-rounded
 * intrinsics (x86-64 float arithmetic is IEEE single precision: the same roundings). */
#pragma once
#include <cstring>

#include "cuda_shim.h"

struct __half {
    uint16_t bits;
};
inline __half __ushort_as_half(unsigned short u) { return __half{u}; }
inline float __half2float(__half h) {  /* IEEE binary16 -> binary32, exact (subnormals included) */
    const uint32_t sign = (uint32_t)(h.bits >> 15) << 31, exp = (h.bits >> 10) & 31, man = h.bits & 1023;
    float v;
    if (exp == 0)
        v = std::ldexp((float)man, -24);
    else if (exp == 31)
        v = man ? NAN : INFINITY;
    else
        v = std::ldexp((float)(man | 1024), (int)exp - 25);
    return sign ? -v : v;
}
inline float __int_as_float(int32_t b) {
    float v;
    std::memcpy(&v, &b, sizeof(v));
    return v;
}
using std::isnan;
struct float4 {
    float x, y, z, w;
};
inline float4 make_float4(float x, float y, float z, float w) { return float4{x, y, z, w}; }
struct uint4 {
    uint32_t x, y, z, w;
};
inline float __uint_as_float(uint32_t b) {
    float v;
    std::memcpy(&v, &b, sizeof(v));
    return v;
}
inline uint32_t __byte_perm(uint32_t x, uint32_t y, uint32_t s) {  /* CUDA's default mode: 4 byte selectors */
    const uint64_t both = (uint64_t)y << 32 | x;
    uint32_t r = 0;
    for (int i = 0; i < 4; i++)
        r |= (uint32_t)((both >> (8 * ((s >> (4 * i)) & 7))) & 0xFF) << (8 * i);
    return r;
}
#define __grid_constant__
#define RLX_Q_PREFETCH(p) ((void)(p))
#define RLX_QOCC_FMA(a, b, c) fmaf(a, b, c) /* kernels/quant_occ.cuh's fma.rn.f32 (subnormals kept, as x86's) */
inline float rsqrtf(float x) { return 1.0f / std::sqrt(x); }
inline void __syncwarp() { rlx_emu_warp_bar->arrive_and_wait(); }
inline uint32_t __float_as_uint(float v) {
    uint32_t b;
    std::memcpy(&b, &v, sizeof(b));
    return b;
}
inline float __fdiv_rn(float a, float b) { return a / b; }
inline float __frcp_rn(float a) { return 1.0f / a; }
inline float __fmul_rn(float a, float b) { return a * b; }
inline int __float2int_rn(float x) {  /* round half to even, saturating as the device does */
    if (std::isnan(x))
        return 0;
    const float r = std::nearbyint(x);
    return r >= 2147483648.0f ? INT32_MAX : (r < -2147483648.0f ? INT32_MIN : (int)r);
}
inline int __dp4a(int a, int b, int c) {  /* signed bytes: c + sum of a_i * b_i */
    for (int i = 0; i < 4; i++)
        c += (int)(int8_t)(a >> (8 * i)) * (int)(int8_t)(b >> (8 * i));
    return c;
}
/* kernels/quant_occ.cuh's dp4a.u32.s32: c + the products of a's unsigned bytes and b's signed bytes */
inline int rlx_emu_dp4a_us(uint32_t a, int b, int c) {
    for (int i = 0; i < 4; i++)
        c += (int)(uint8_t)(a >> (8 * i)) * (int)(int8_t)(b >> (8 * i));
    return c;
}
#define RLX_QOCC_DP4A_US(a, b, c) rlx_emu_dp4a_us(a, b, c)
inline uint32_t __funnelshift_r(uint32_t lo, uint32_t hi, uint32_t s) {  /* (hi:lo) >> (s & 31), the low word */
    s &= 31;
    return s ? (lo >> s) | (hi << (32 - s)) : lo;
}

/* Kernels that exercise the emulator itself (tests/metal/test_emulator.py), written as MSL with the
 * signature of RLX's generated kernels (the buffer as bytes at buffer(0), symbols at buffer(1)). */
#include <metal_stdlib>
using namespace metal;

/* out[g] = sum of in over threadgroup g, through threadgroup memory and barriers (a tree reduction),
 * and out2[g] = the same sum through simd_sum per simdgroup. 64 threads per group. */
kernel void tg_sum(device uchar *mem [[buffer(0)]],
                   constant long *sym [[buffer(1)]],
                   uint3 tg_pos [[threadgroup_position_in_grid]],
                   uint3 t_pos [[thread_position_in_threadgroup]],
                   uint3 tg_size [[threads_per_threadgroup]],
                   uint lane [[thread_index_in_simdgroup]],
                   uint sg [[simdgroup_index_in_threadgroup]])
{
    device float *data = (device float *)mem;
    threadgroup float buf[64];
    threadgroup float part[2];
    const uint t = t_pos.x;
    const float v = data[tg_pos.x * 64 + t];
    buf[t] = v;
    threadgroup_barrier(mem_flags::mem_threadgroup);
    for (uint s = 32; s > 0; s >>= 1) {
        if (t < s) buf[t] += buf[t + s];
        threadgroup_barrier(mem_flags::mem_threadgroup);
    }
    const float s2 = simd_sum(v);
    if (lane == 0) part[sg] = s2;
    threadgroup_barrier(mem_flags::mem_threadgroup);
    if (t == 0) {
        data[1024 + tg_pos.x] = buf[0];
        data[2048 + tg_pos.x] = part[0] + part[1];
    }
}

/* Half of a simdgroup at a simd function, the other half at a barrier: the barrier can never complete
 * on a GPU; the emulator (which also requires simd functions to be reached by the whole simdgroup, as
 * RLX's kernels do) reports it. */
kernel void divergent(device uchar *mem [[buffer(0)]],
                      constant long *sym [[buffer(1)]],
                      uint3 tg_pos [[threadgroup_position_in_grid]],
                      uint3 t_pos [[thread_position_in_threadgroup]],
                      uint3 tg_size [[threads_per_threadgroup]],
                      uint lane [[thread_index_in_simdgroup]],
                      uint sg [[simdgroup_index_in_threadgroup]])
{
    device float *data = (device float *)mem;
    if (lane < 16) {
        simd_sum(1.0f);
    } else {
        threadgroup_barrier(mem_flags::mem_threadgroup);
    }
    data[t_pos.x] = 1.0f;
}

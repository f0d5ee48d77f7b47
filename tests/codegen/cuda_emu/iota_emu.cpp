/* The CUDA iota kernels (templates/cuda/kernels/iota.cuh) on the CPU through cuda_shim.h, launched as
 * templates/cuda/select.cu.j2 launches them, with a grid smaller than the values so the grid-stride loop wraps
 * (tests/codegen/test_cuda_iota_emulated.py). f32, f64, i32 and i64 outputs. */
#include "cuda_shim.h"

template <typename T> inline T rlx_to_d(double x) { return (T)x; }
#include "iota.cuh"

extern "C" {

/* dtype 0 f32, 1 f64 (float kernel); 2 i32, 3 i64 (integer kernel, start and delta truncated to int64) */
int emu_iota(void *y, int64_t n, int dtype, double start, double delta, unsigned grid, unsigned threads) {
    const int64_t si = (int64_t)start, di = (int64_t)delta;
    switch (dtype) {
    case 0: rlx_emu_launch(grid, threads, [&] { rlx_iota_float<float>((float *)y, n, start, delta); }); return 0;
    case 1: rlx_emu_launch(grid, threads, [&] { rlx_iota_float<double>((double *)y, n, start, delta); }); return 0;
    case 2: rlx_emu_launch(grid, threads, [&] { rlx_iota_int<int32_t>((int32_t *)y, n, si, di); }); return 0;
    case 3: rlx_emu_launch(grid, threads, [&] { rlx_iota_int<int64_t>((int64_t *)y, n, si, di); }); return 0;
    }
    return -1;
}
}

/* The erf GELU of the CUTLASS unit's epilogue (templates/cuda/kernels/gelu_erfc.cuh) on the host, over arrays
 * (tests/codegen/test_cuda_gelu_erfc.py). The header is host/device code: nothing of the shim is needed. */
#include "gelu_erfc.cuh"

extern "C" void emu_gelu_erfc(const float *x, float *y, long long n) {
    for (long long i = 0; i < n; ++i) y[i] = rlx_gelu_erfc(x[i]);
}

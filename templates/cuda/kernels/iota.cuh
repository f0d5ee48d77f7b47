/* iota (rlx `iota`): y[i] = start + i * delta for i < n. Floats are computed in double and rounded once to the
 * stored type (as the reference), integers exactly in int64 (the op's shape check keeps them in range). */
template <typename T>
__global__ void rlx_iota_float(T *__restrict__ y, int64_t n, double start, double delta) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        y[i] = rlx_to_d<T>(start + (double)i * delta);
}

template <typename T>
__global__ void rlx_iota_int(T *__restrict__ y, int64_t n, int64_t start, int64_t delta) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        y[i] = (T)(start + i * delta);
}

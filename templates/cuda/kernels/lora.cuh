/* Batched LoRA (rlx.ir.ops_lora): y = scale[s] (x a[s]^T) b[s]^T per row, s = idx[row / M] (< 0: zeros).
 * One block per row: each warp shrinks rank rows r = warp, warp + warps, ... (lane-strided dot products
 * reduced by shuffles, in the same order for every row), then every thread expands outputs n = tid,
 * tid + threads, ... from the rank values in shared memory. Inputs are T (float, __half or rlx_bf16),
 * arithmetic f32. A fixed RLX kernel header: no template code. */
#ifndef RLX_CUDA_KERNELS_LORA_CUH
#define RLX_CUDA_KERNELS_LORA_CUH

#define RLX_LORA_THREADS 128

template <typename T>
__global__ void __launch_bounds__(RLX_LORA_THREADS) rlx_lora(const T *__restrict__ x, const T *__restrict__ a,
        const T *__restrict__ b, const T *__restrict__ scale, const int32_t *__restrict__ idx, T *__restrict__ y,
        int64_t rows, int64_t M, int64_t K, int64_t N, int R, int S, int32_t *flag)
{
    extern __shared__ float rlx_lora_t[];  /* R floats */
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
        const int s = idx[row / M];
        T *yr = y + row * N;
        if (s >= S && threadIdx.x == 0)
            atomicOr(flag, 128);
        if (s < 0 || s >= S) {
            for (int64_t n = threadIdx.x; n < N; n += blockDim.x)
                yr[n] = rlx_to<T>(0.0f);
            continue;
        }
        const T *xr = x + row * K;
        const float sc = rlx_f(scale[s]);
        for (int r = warp; r < R; r += warps) {
            const T *ar = a + ((int64_t)s * R + r) * K;
            float acc = 0.0f;
            for (int64_t i = lane; i < K; i += 32)
                acc += rlx_f(xr[i]) * rlx_f(ar[i]);
            for (int o = 16; o > 0; o >>= 1)
                acc += __shfl_xor_sync(0xffffffffu, acc, o);
            if (lane == 0) rlx_lora_t[r] = acc * sc;
        }
        __syncthreads();
        const T *bs = b + (int64_t)s * N * R;
        for (int64_t n = threadIdx.x; n < N; n += blockDim.x) {
            float acc = 0.0f;
            for (int r = 0; r < R; r++)
                acc += rlx_lora_t[r] * rlx_f(bs[n * R + r]);
            yr[n] = rlx_to<T>(acc);
        }
        __syncthreads();
    }
}

#endif /* RLX_CUDA_KERNELS_LORA_CUH */

/* swish_beta(x, beta) = x * sigmoid(beta * x): the CUDA body of examples/custom_op/swish_beta.py.
 * A host function launching one kernel on RLX's stream (templates/cuda/kernels/user_op.cuh). */
#include <stdint.h>

__global__ void swish_beta_kernel(const float *x, const float *beta, float *y, int64_t n)
{
    const float b = *beta;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        y[i] = x[i] / (1.0f + expf(-b * x[i]));
}

static int swish_beta_cuda(const rlx_user_tensor *in, int32_t n_in, rlx_user_tensor *out, cudaStream_t stream)
{
    if (n_in != 2 || in[0].dtype != RLX_USER_F32 || in[1].dtype != RLX_USER_F32 || in[1].numel != 1)
        return 1; /* f32 x and a scalar f32 beta only (a session of precision f32) */
    const int64_t n = out->numel;
    if (n == 0)
        return 0;
    const int64_t blocks = (n + 255) / 256 < 4096 ? (n + 255) / 256 : 4096;
    swish_beta_kernel<<<(unsigned)blocks, 256, 0, stream>>>((const float *)in[0].data, (const float *)in[1].data,
                                                           (float *)out->data, n);
    return 0;
}

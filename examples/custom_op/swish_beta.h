/* swish_beta(x, beta) = x * sigmoid(beta * x): the C body of examples/custom_op/swish_beta.py.
 * RLX's calling convention for user ops (templates/cpu/kernels/user_op.h): tensors in, one tensor out. */
#include <math.h>
#include <stdint.h>

static int swish_beta(const rlx_user_tensor *in, int32_t n_in, rlx_user_tensor *out, int32_t nthreads)
{
    if (n_in != 2 || in[0].dtype != RLX_USER_F32 || in[1].dtype != RLX_USER_F32 || in[1].numel != 1)
        return 1; /* f32 x and a scalar f32 beta only */
    const float *x = (const float *)in[0].data;
    const float beta = *(const float *)in[1].data;
    float *y = (float *)out->data;
    const int64_t n = out->numel;
#pragma omp parallel for num_threads(nthreads) schedule(static) if (n >= 65536)
    for (int64_t i = 0; i < n; ++i)
        y[i] = x[i] / (1.0f + expf(-beta * x[i]));
    return 0;
}

/* swish_beta(x, beta) = x * sigmoid(beta * x): the Metal (MSL) body of examples/custom_op/swish_beta.py.
 * Called by one GPU thread per output element `i` (templates/metal/kernels/user_op.metal). */

inline int swish_beta_metal(thread const rlx_user_tensor *in, int n_in, thread const rlx_user_tensor *out, long i)
{
    if (n_in != 2 || in[0].dtype != RLX_USER_F32 || in[1].dtype != RLX_USER_F32 || in[1].numel != 1)
        return 1; /* f32 x and a scalar f32 beta only */
    const float x = ((device const float *)in[0].data)[i];
    const float beta = ((device const float *)in[1].data)[0];
    ((device float *)out->data)[i] = x / (1.0f + exp(-beta * x));
    return 0;
}

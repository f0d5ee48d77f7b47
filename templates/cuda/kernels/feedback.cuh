/* Device-side token feedback (rlx `token_feed`, `token_store`; rlx/ir/ops_feedback.py): a step's tokens taken
 * from the i32 state `last` (one token a slot) the step before stored its tokens in. A thread an element. */
__global__ void rlx_token_feed(const int32_t *__restrict__ x, const int32_t *__restrict__ src,
                               const int32_t *__restrict__ last, int32_t *__restrict__ y, int64_t rows, int64_t seq,
                               int64_t slots) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < rows * seq;
         i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t b = i / seq;
        const int32_t s = src[b];
        y[i] = (i % seq == seq - 1 && s >= 0 && s < slots) ? last[s] : x[i];
    }
}

__global__ void rlx_token_store(const int32_t *__restrict__ x, const int32_t *__restrict__ dst,
                                int32_t *__restrict__ last, int32_t *__restrict__ y, int64_t rows, int64_t slots) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < rows; i += (int64_t)gridDim.x * blockDim.x) {
        const int32_t d = dst[i];
        y[i] = x[i];
        if (d >= 0 && d < slots) last[d] = x[i];
    }
}

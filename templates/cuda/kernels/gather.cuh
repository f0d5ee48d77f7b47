/* table.take(idx, axis) viewed as [outer, rows, inner] -> [outer, nidx, inner]; a bad index raises flag bit 1
 * and writes zeros, so no out-of-bounds read ever happens. */
template <typename T, typename I, typename IDX>
__global__ void rlx_gather(const T *__restrict__ table, const I *__restrict__ idx, T *__restrict__ out,
                           int64_t outer64, int64_t rows64, int64_t nidx64, int64_t inner64, int32_t *flag) {
    rlx_pdl_trigger(); rlx_pdl_wait(); /* may start early (rlx_launch_pdl): wait before touching data */
    const IDX outer = (IDX)outer64, rows = (IDX)rows64, nidx = (IDX)nidx64, inner = (IDX)inner64;
    const IDX n = outer * nidx * inner;
    for (IDX i = (IDX)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (IDX)gridDim.x * blockDim.x) {
        const IDX c = i % inner;
        const IDX t = i / inner;
        const IDX j = t % nidx;
        const IDX o = t / nidx;
        const int64_t r = (int64_t)idx[j];
        if (r < 0 || r >= (int64_t)rows) {
            atomicOr(flag, 1);
            out[i] = rlx_cvt<T>(0.0);
            continue;
        }
        out[i] = table[(o * rows + (IDX)r) * inner + c];
    }
}


/* One value of table.take(idx, axis=0) viewed as [rows, inner], at flat position p of the take's output, for an
 * elementwise region that does the gather itself (rlx/codegen/cuda/region_gather.py): a bad index raises flag
 * bit 1 and reads as zero, as in rlx_gather. */
template <typename T, typename I, typename IDX>
__device__ __forceinline__ T rlx_gather_at(const T *__restrict__ table, const I *__restrict__ idx, IDX p, IDX rows,
                                           IDX inner, int32_t *flag) {
    const int64_t r = (int64_t)idx[p / inner];
    if (r < 0 || r >= (int64_t)rows) {
        atomicOr(flag, 1);
        return rlx_cvt<T>(0.0);
    }
    return table[(IDX)r * inner + p % inner];
}

/* ── data movement: strided copy/convert ──────────────────────────────── */

/* out[o(i)] = convert(in[s(i)]) over a dense iteration space: transpose, expand, narrow, concat pieces,
 * param layout permutation and precision conversion are all this one kernel with different strides. */
template <typename TI, typename TO, typename IDX>
__global__ void rlx_copy_nd(const TI *__restrict__ in, TO *__restrict__ out, RlxNd nd, IDX n) {
    for (IDX i = (IDX)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (IDX)gridDim.x * blockDim.x) {
        IDX rem = i, si = 0, so = 0;
        for (int d = nd.rank - 1; d >= 0; --d) {
            IDX dim = (IDX)nd.dim[d];
            IDX q = rem / dim, r = rem - q * dim;
            si += r * (IDX)nd.istride[d];
            so += r * (IDX)nd.ostride[d];
            rem = q;
        }
        out[so] = rlx_cvt<TO>(in[si]);
    }
}

/* Dense element-for-element conversion (boundary precision changes). */
template <typename TI, typename TO>
__global__ void rlx_convert(const TI *__restrict__ in, TO *__restrict__ out, int64_t n) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        out[i] = rlx_cvt<TO>(in[i]);
}


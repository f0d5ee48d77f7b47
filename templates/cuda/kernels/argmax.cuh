/* argmax along one axis (rlx `argmax`): x viewed as [outer, n, inner] -> y [outer, inner] int32, one block of
 * RLX_ARGMAX_THREADS per output value (a decoder's one row of 49152 logits: 48 values a thread, in 16-byte loads
 * where the row is contiguous and aligned, unrolled so they overlap); the first index wins ties and the first NaN
 * wins over every number (numpy). */
#define RLX_ARGMAX_THREADS 1024
/* Whether candidate (v, i) beats (best, at); an index < 0 is "no candidate" (a thread or warp that saw no value:
 * with fewer values than threads), which never wins, whatever its placeholder value. */
template <typename A>
__device__ __forceinline__ bool rlx_argmax_better(A v, int64_t i, A best, int64_t at) {
    if (i < 0) return false;
    if (at < 0) return true;
    const bool vn = isnan(v), bn = isnan(best);
    if (vn || bn) return vn && (!bn || i < at);
    return v > best || (v == best && i < at);
}

/* The block's best (value, index) from each thread's candidate (v, i), where `better(v, i, best, at)` says a
 * candidate beats the one held (an index < 0 is "none yet"): a warp shuffle tree, then thread 0 scans the warps'
 * winners in warp order. The result is thread 0's only; `red_v`, `red_i` are shared slots, one a warp. Shared
 * with sample_top_k's argmax pass (kernels/sample.cuh). */
template <typename A, typename Better>
__device__ __forceinline__ int64_t rlx_block_best(A best, int64_t at, A *red_v, int64_t *red_i, Better better) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    for (int o = 16; o > 0; o >>= 1) {
        const A ov = __shfl_xor_sync(0xffffffffu, best, o);
        const int64_t oi = __shfl_xor_sync(0xffffffffu, at, o);
        if (better(ov, oi, best, at)) {
            best = ov;
            at = oi;
        }
    }
    if (lane == 0) {
        red_v[warp] = best;
        red_i[warp] = at;
    }
    __syncthreads();
    if (threadIdx.x == 0)
        for (int w = 1; w < (int)(blockDim.x >> 5); ++w)
            if (better(red_v[w], red_i[w], best, at)) {
                best = red_v[w];
                at = red_i[w];
            }
    return at;
}

template <typename T, typename A>
__global__ void __launch_bounds__(RLX_ARGMAX_THREADS) rlx_argmax(const T *__restrict__ x, int32_t *__restrict__ y, int64_t outer,
                                                  int64_t n, int64_t inner) {
    __shared__ A best_v[RLX_ARGMAX_THREADS / 32];
    __shared__ int64_t best_i[RLX_ARGMAX_THREADS / 32];
    for (int64_t t = blockIdx.x; t < outer * inner; t += gridDim.x) {
        const T *xs = x + (t / inner) * n * inner + t % inner;
        A best = (A)0;
        int64_t at = -1;  /* none yet */
        constexpr int V = 16 / (int)sizeof(T);  /* values per 16-byte load */
        if (inner == 1 && n % V == 0 && ((uintptr_t)xs & 15) == 0) {
            /* a contiguous aligned row: 16-byte loads, each thread's values visited in index order */
            const uint4 *xv = (const uint4 *)xs;
#pragma unroll 4
            for (int64_t q = threadIdx.x; q < n / V; q += blockDim.x) {
                const uint4 raw = xv[q];
                const T *e = (const T *)&raw;
#pragma unroll
                for (int u = 0; u < V; u++) {
                    const A v = (A)rlx_f(e[u]);
                    if (rlx_argmax_better(v, q * V + u, best, at)) {
                        best = v;
                        at = q * V + u;
                    }
                }
            }
        } else {
#pragma unroll 8
            for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
                const A v = (A)rlx_f(xs[j * inner]);
                if (rlx_argmax_better(v, j, best, at)) {
                    best = v;
                    at = j;
                }
            }
        }
        at = rlx_block_best(best, at, best_v, best_i,
                            [](A v, int64_t i, A b, int64_t a) { return rlx_argmax_better(v, i, b, a); });
        if (threadIdx.x == 0) y[t] = (int32_t)at;
        __syncthreads();
    }
}

/* sample_top_k (rlx/ir/ops_sample.py): one token id per row of logits x [rows, n], sampled with the row's
 * uniform u in [0, 1) and the run-time settings s = (temperature, top_k, top_p), both double; one block of
 * RLX_SAMPLE_THREADS per row.
 *
 * Order: value descending, ties by the lower index, NaN above every number. Each value maps to a 32-bit key
 * increasing with that order (-0 as +0, every NaN the largest key), so the row's top k (k <=
 * RLX_SAMPLE_TOP_K_MAX) is found without sorting the vocabulary:
 *   1. radix select, 4 passes of 8 bits from the top: a shared histogram of the keys still matching the
 *      chosen prefix (warp-aggregated atomics) gives the k-th largest key `kth`;
 *   2. every key > kth and the first (lowest-index) keys == kth up to k in all, gathered in index order:
 *      each warp owns a contiguous segment, counts it (ballots), then writes at scanned offsets;
 *   3. the k candidates sorted by rank (each thread counts the candidates ranked before its own);
 *   4. weights exp((v - v0) / temperature) in double by k threads, then one thread runs the reference's
 *      sequential running sums, the top_p prefix and the inverse CDF at u (the numpy reference's arithmetic).
 * Temperature 0 (or k = 1) is one argmax pass (rlx_block_best of kernels/argmax.cuh), or, given `best` (the ids of
 * an argmax of the same logits, SampleFromArgmax), a copy of them. Bad settings or u raise flag bits 8 (temperature),
 * 16 (top_k), 32 (top_p), 64 (u); the run then fails naming it. */
#define RLX_SAMPLE_THREADS 1024
#define RLX_SAMPLE_TOP_K_MAX 256

struct RlxSampleItem {
    uint32_t key;
    int32_t i;
    float v;
};

__device__ __forceinline__ uint32_t rlx_sample_key(float v) {
    if (isnan(v)) return 0xffffffffu;
    if (v == 0.0f) v = 0.0f; /* -0 ranks as +0 (ties then go by index, as the reference's compare) */
    const uint32_t b = __float_as_uint(v);
    return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

/* (ka, ia) ranks before (kb, ib); an index < 0 is "none yet" and ranks last */
__device__ __forceinline__ bool rlx_sample_before(uint32_t ka, int64_t ia, uint32_t kb, int64_t ib) {
    if (ib < 0) return ia >= 0;
    if (ia < 0) return false;
    return ka > kb || (ka == kb && ia < ib);
}

template <typename T>
__global__ void __launch_bounds__(RLX_SAMPLE_THREADS)
rlx_sample_top_k(const T *__restrict__ x, const double *__restrict__ u, const double *__restrict__ s,
                 int32_t *__restrict__ y, int64_t rows, int64_t n, int32_t *flag,
                 const int32_t *__restrict__ best = nullptr) {
    __shared__ uint32_t hist[256];
    __shared__ uint32_t warp_gt[RLX_SAMPLE_THREADS / 32], warp_eq[RLX_SAMPLE_THREADS / 32];
    __shared__ RlxSampleItem cand[RLX_SAMPLE_TOP_K_MAX], sorted[RLX_SAMPLE_TOP_K_MAX];
    __shared__ double cum[RLX_SAMPLE_TOP_K_MAX];
    __shared__ uint32_t sh_prefix, sh_remaining;
    __shared__ uint32_t red_k[RLX_SAMPLE_THREADS / 32];
    __shared__ int64_t red_i[RLX_SAMPLE_THREADS / 32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
    const double temp = s[0], kf = s[1], top_p = s[2];
    /* the settings are the same for every block: each block checks them, block 0 reports */
    int bad = 0;
    if (!isfinite(temp) || !(temp >= 0.0)) bad = 8;
    else if (!isfinite(kf) || kf != floor(kf) || !(kf >= 1.0) || kf > (double)RLX_SAMPLE_TOP_K_MAX) bad = 16;
    else if (!(top_p > 0.0 && top_p <= 1.0)) bad = 32;
    if (bad) {
        if (blockIdx.x == 0 && threadIdx.x == 0) atomicOr(flag, bad);
        return;
    }
    const int64_t k = (int64_t)kf < n ? (int64_t)kf : n;
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
        const T *xs = x + r * n;
        const double ur = u[r];
        if (!(ur >= 0.0 && ur < 1.0)) {
            if (threadIdx.x == 0) {
                atomicOr(flag, 64);
                y[r] = 0;
            }
            continue;
        }
        if ((temp == 0.0 || k == 1) && best != nullptr) { /* the argmax, already computed */
            if (threadIdx.x == 0) y[r] = best[r];
            continue;
        }
        if (temp == 0.0 || k == 1) { /* the argmax: one pass, block reduction */
            uint32_t bk = 0;
            int64_t bi = -1;
            for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
                const uint32_t kj = rlx_sample_key(rlx_f(xs[j]));
                if (rlx_sample_before(kj, j, bk, bi)) {
                    bk = kj;
                    bi = j;
                }
            }
            bi = rlx_block_best(bk, bi, red_k, red_i,
                                [](uint32_t ka, int64_t ia, uint32_t kb, int64_t ib) {
                                    return rlx_sample_before(ka, ia, kb, ib);
                                });
            if (threadIdx.x == 0) y[r] = (int32_t)bi;
            __syncthreads();
            continue;
        }
        /* 1. radix select of the k-th largest key */
        uint32_t prefix = 0, mask = 0, remaining = (uint32_t)k;
        for (int shift = 24; shift >= 0; shift -= 8) {
            for (int b = threadIdx.x; b < 256; b += blockDim.x) hist[b] = 0;
            __syncthreads();
            for (int64_t j0 = 0; j0 < n; j0 += blockDim.x) {
                const int64_t j = j0 + threadIdx.x;
                const uint32_t key = j < n ? rlx_sample_key(rlx_f(xs[j])) : 0u;
                const bool in = j < n && (key & mask) == prefix;
                /* lanes with the same digit add once (their count); lanes not counting match only 256 */
                const uint32_t d = in ? (key >> shift) & 255u : 256u;
                const unsigned peers = __match_any_sync(0xffffffffu, d);
                if (in && lane == __ffs(peers) - 1) atomicAdd(&hist[d], (uint32_t)__popc(peers));
            }
            __syncthreads();
            if (warp == 0) { /* lane l holds bins 255-8l .. 248-8l; the digit holding the k-th key */
                uint32_t mine = 0;
                for (int q = 0; q < 8; ++q) mine += hist[255 - 8 * lane - q];
                uint32_t incl = mine;
                for (int o = 1; o < 32; o <<= 1) {
                    const uint32_t t = __shfl_up_sync(0xffffffffu, incl, o);
                    if (lane >= o) incl += t;
                }
                const unsigned hit = __ballot_sync(0xffffffffu, incl >= remaining);
                const int at = __ffs(hit) - 1;
                if (lane == at) {
                    uint32_t c = incl - mine;
                    int d = 255 - 8 * lane;
                    for (int q = 0; q < 8; ++q, --d) {
                        if (c + hist[d] >= remaining) break;
                        c += hist[d];
                    }
                    sh_prefix = prefix | ((uint32_t)d << shift);
                    sh_remaining = remaining - c;
                }
            }
            __syncthreads();
            prefix = sh_prefix;
            remaining = sh_remaining;
            mask |= 255u << shift;
            __syncthreads();
        }
        const uint32_t kth = prefix;
        const uint32_t n_gt = (uint32_t)k - remaining; /* keys > kth, all kept; then `remaining` keys == kth */
        /* 2. gather the candidates in index order: per-warp counts, offsets, then ballot-ranked writes */
        const int64_t seg = (n + nwarps - 1) / nwarps, lo = warp * seg, hi = lo + seg < n ? lo + seg : n;
        uint32_t gt = 0, eq = 0;
        for (int64_t j0 = lo; j0 < hi; j0 += 32) {
            const int64_t j = j0 + lane;
            const uint32_t key = j < hi ? rlx_sample_key(rlx_f(xs[j])) : 0u;
            gt += __popc(__ballot_sync(0xffffffffu, j < hi && key > kth));
            eq += __popc(__ballot_sync(0xffffffffu, j < hi && key == kth));
        }
        if (lane == 0) {
            warp_gt[warp] = gt;
            warp_eq[warp] = eq;
        }
        __syncthreads();
        if (threadIdx.x == 0) { /* exclusive scans over the warps, in index order */
            uint32_t a = 0, b = 0;
            for (int w = 0; w < nwarps; ++w) {
                const uint32_t g = warp_gt[w], e = warp_eq[w];
                warp_gt[w] = a;
                warp_eq[w] = b;
                a += g;
                b += e;
            }
        }
        __syncthreads();
        uint32_t at_gt = warp_gt[warp], at_eq = warp_eq[warp];
        const unsigned below = (1u << lane) - 1u;
        for (int64_t j0 = lo; j0 < hi; j0 += 32) {
            const int64_t j = j0 + lane;
            const float v = j < hi ? rlx_f(xs[j]) : 0.0f;
            const uint32_t key = j < hi ? rlx_sample_key(v) : 0u;
            const unsigned bg = __ballot_sync(0xffffffffu, j < hi && key > kth);
            const unsigned be = __ballot_sync(0xffffffffu, j < hi && key == kth);
            if (j < hi && key > kth) cand[at_gt + __popc(bg & below)] = RlxSampleItem{key, (int32_t)j, v};
            if (j < hi && key == kth) {
                const uint32_t e = at_eq + __popc(be & below);
                if (e < remaining) cand[n_gt + e] = RlxSampleItem{key, (int32_t)j, v};
            }
            at_gt += __popc(bg);
            at_eq += __popc(be);
        }
        __syncthreads();
        /* 3. rank sort of the k candidates (distinct indices: the ranks are a permutation) */
        for (int64_t t = threadIdx.x; t < k; t += blockDim.x) {
            const RlxSampleItem me = cand[t];
            int rank = 0;
            for (int q = 0; q < k; ++q) rank += rlx_sample_before(cand[q].key, cand[q].i, me.key, me.i);
            sorted[rank] = me;
        }
        __syncthreads();
        /* 4. weights in double, then the reference's sequential sums, top_p prefix and inverse CDF */
        const float v0 = sorted[0].v;
        if (isfinite(v0))
            for (int64_t t = threadIdx.x; t < k; t += blockDim.x)
                cum[t] = exp(((double)sorted[t].v - (double)v0) / temp);
        __syncthreads();
        if (threadIdx.x == 0) {
            int32_t tok = sorted[0].i;
            if (isfinite(v0)) { /* NaN or +-inf on top takes the row */
                double run = 0.0;
                for (int q = 0; q < k; ++q) {
                    run += cum[q];
                    cum[q] = run;
                }
                int64_t m = k;
                if (top_p < 1.0) {
                    const double want = top_p * cum[k - 1];
                    m = 0;
                    while (m < k - 1 && !(cum[m] >= want)) ++m;
                    ++m;
                }
                const double target = ur * cum[m - 1];
                int64_t j = 0;
                while (j < m - 1 && !(cum[j] > target)) ++j;
                tok = sorted[j].i;
            }
            y[r] = tok;
        }
        __syncthreads();
    }
}

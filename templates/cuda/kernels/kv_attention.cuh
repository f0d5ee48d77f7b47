/* Decoder attention over a KV cache ([max_batch, capacity, kv_heads*HD] per layer, on the device), one launch:
 * rlx_kv_attend runs one query row of one head per block of RLX_KV_THREADS: a thread per key for the scores
 * (kept in shared memory), block-wide max and sum through warp shuffles, then the weighted sum of values with a
 * warp per run of keys and the head dims spread over its lanes (a warp reads each value row whole), the
 * warps' partial sums added at the end.
 * ROPE (decode steps, see DecodeRope): q, knew are the projections before the rotary embedding, which the
 * block applies itself to its query row and to the step's new keys (staged rotated in shared memory; at most
 * RLX_KV_ROPE_ROWS of them), from the tables cosb / sinb ([B, S, rot/2] per row, else [S, rot/2]). The step's own keys
 * and values (cache rows pos .. pos+sq-1) are read from its k and v inputs (rounded to the cache dtype KT as it
 * stores them; T is the compute dtype), not from the cache, and the first
 * query's block of the first query head of each KV head appends them to the cache: no block reads a cache
 * row this launch writes, so no second launch has to come first. A position outside the cache raises flag
 * bit 4 and nothing is written.
 * WINDOW (sliding-window attention): window > 0 limits query i to its last `window` keys (0: every key).
 * SPLIT (flash-decoding, see DecodeSplitKv): a decode step has a block per (row, head) only, too few to fill the
 * GPU once the past is long, so the keys 0 .. n-1 of a query are split over up to gridDim.z blocks of at least
 * split_keys keys each (how many is decided per launch from n: a short past stays one block and writes its
 * output directly). A block of a split query writes its running max, its sum of exponentials and its unnormalized
 * weighted sum of values to `partials`; the last of the query's blocks to finish (a counter per (row, head) in
 * `counters`, zero between launches: that block resets it) merges the partials into the output.
 * PAGED (bt not null): the caches are a pool of pages [num_pages, page, kv_heads*HD] and row b's token j is row
 * j % page of page bt[b * maxp + j / page] (cap = maxp * page). Several rows of a step may be one sequence's
 * consecutive tokens (one block table), so a row reads keys other rows of this launch append: the append is then
 * rlx_kv_append_paged, launched before, and rlx_kv_attend reads the cache below each row's position. Keys are
 * read in the same order as in the contiguous layout. A page id outside the pool raises flag bit 4. */
#define RLX_KV_THREADS 256
#define RLX_KV_ROPE_ROWS 4
#define RLX_KV_WARPS (RLX_KV_THREADS / 32)

/* A hint to fetch the 128-byte line at p into L2; a macro so a CPU stand-in can drop it. */
#ifndef RLX_KV_PREFETCH
#define RLX_KV_PREFETCH(p) asm volatile("prefetch.global.L2 [%0];" ::"l"(p))
#endif

/* The kernel's shared scratch (dynamic shared memory); a macro so a CPU stand-in can provide it. */
#ifndef RLX_DYNAMIC_SHARED
#define RLX_DYNAMIC_SHARED(type, name) extern __shared__ type name[]
#endif

/* Block-wide max (op 0) or sum (op 1) of one value per thread; every thread gets the result. */
__device__ __forceinline__ float rlx_kv_block_reduce(float v, int op, float *red) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    for (int o = 16; o > 0; o >>= 1) {
        const float other = __shfl_xor_sync(0xffffffffu, v, o);
        v = op == 0 ? fmaxf(v, other) : v + other;
    }
    if (lane == 0) red[warp] = v;
    __syncthreads();
    v = red[0];
    for (int w = 1; w < RLX_KV_WARPS; ++w)
        v = op == 0 ? fmaxf(v, red[w]) : v + red[w];
    __syncthreads();  /* red is reused by the next reduction */
    return v;
}

/* x as a cache of KT stores it (the step's own keys and values are read from the inputs, as the cache will hold them). */
template <typename KT> __device__ __forceinline__ float rlx_kv_stored(float x) { return rlx_f(rlx_to<KT>(x)); }

template <typename T, typename KT, int HD, bool ROPE, bool NEOX>
__global__ void __launch_bounds__(RLX_KV_THREADS)
rlx_kv_attend(const T *q, const T *__restrict__ knew, const T *__restrict__ vnew,
              KT *__restrict__ kc, KT *__restrict__ vc, const int32_t *__restrict__ pos, T *out,
              int64_t sq, int64_t cap, int heads, int kv_heads, float scale, int64_t window, int32_t *flag,
              const T *__restrict__ cosb, const T *__restrict__ sinb, int rot, int per_row,
              float *__restrict__ partials, int32_t *__restrict__ counters, int64_t split_keys,
              const int32_t *__restrict__ bt, int64_t page, int64_t maxp, int64_t num_pages) {
    RLX_DYNAMIC_SHARED(float, rlx_kv_smem);
    __shared__ int last_block;
    float *qs = rlx_kv_smem;                 /* the query row: HD floats */
    float *red = qs + HD;                    /* reductions: RLX_KV_WARPS floats */
    float *part = red + RLX_KV_WARPS;        /* the warps' partial outputs: RLX_KV_WARPS * HD floats */
    float *kns = part + RLX_KV_WARPS * HD;   /* ROPE: the step's new keys, rotated: RLX_KV_ROPE_ROWS * HD floats */
    float *sc = kns + RLX_KV_ROPE_ROWS * HD; /* scores, then weights: up to cap floats */
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int64_t b = blockIdx.x / heads, i = blockIdx.y;
    const int h = (int)(blockIdx.x % heads), kvh = h / (heads / kv_heads);
    {
        /* Launched early (rlx_launch_pdl) while the projections run: fetch this KV head's cached rows into L2
           (spread over a query's split blocks). Earlier steps wrote them; positions are a run input in a decoder
           (settled: every kernel before the previous one has finished, see rlx_pdl_trigger). Only a hint: were
           `pos` still being computed, a stale value would fetch other rows of this row's cache (clamped to it),
           and nothing is read here. */
        const int64_t p0 = (int64_t)pos[b], kw0 = (int64_t)kv_heads * HD;
        const int64_t rows = bt == nullptr && p0 >= 0 && p0 <= cap ? p0 : 0;  /* paged: no hint */
        for (int64_t j = (int64_t)blockIdx.z * blockDim.x + threadIdx.x; j < rows; j += (int64_t)gridDim.z * blockDim.x)
            for (int off = 0; off < HD * (int)sizeof(KT); off += 128) {
                RLX_KV_PREFETCH((const char *)(kc + (b * cap + j) * kw0 + (int64_t)kvh * HD) + off);
                RLX_KV_PREFETCH((const char *)(vc + (b * cap + j) * kw0 + (int64_t)kvh * HD) + off);
            }
    }
    rlx_pdl_wait();  /* everything below reads earlier kernels' results */
    rlx_pdl_trigger();
    const int64_t p = (int64_t)pos[b];
    if (p < 0 || p + sq > cap) {
        if (threadIdx.x == 0) atomicOr(flag, 4);
        return;
    }
    if (bt != nullptr) {  /* every page this row reads is in the pool */
        bool bad = false;
        for (int64_t c = threadIdx.x; c < (p + sq + page - 1) / page; c += blockDim.x)
            bad = bad || bt[b * maxp + c] < 0 || bt[b * maxp + c] >= num_pages;
        if (rlx_kv_block_reduce(bad ? 1.0f : 0.0f, 0, red) != 0.0f) {
            if (threadIdx.x == 0) atomicOr(flag, 4);
            return;
        }
    }
    /* the cache row of token j of this batch row */
    auto row_at = [&](int64_t j) -> int64_t {
        return bt != nullptr ? (int64_t)bt[b * maxp + j / page] * page + j % page : b * cap + j;
    };
    const int64_t n = p + i + 1;             /* query i sees keys 0 .. p + i (a window: the last `window` of them) */
    const int64_t first = window > 0 && n > window ? n - window : 0, count = n - first;
    /* this block's keys lo .. hi-1: the query's count keys in `active` runs of `per` (none empty) */
    const int64_t want = (count + split_keys - 1) / split_keys;
    const int64_t runs = want < gridDim.z ? want : (int64_t)gridDim.z;
    const int64_t per = (count + runs - 1) / runs;
    const int active = (int)((count + per - 1) / per), split = (int)blockIdx.z;
    if (split >= active) return;
    const int64_t lo = first + (int64_t)split * per, hi = lo + per < n ? lo + per : n;
    const int64_t kw = (int64_t)kv_heads * HD;
    const T *qrow = q + ((b * sq + i) * heads + h) * HD;
    for (int d = threadIdx.x; d < HD; d += blockDim.x)
        qs[d] = rlx_f(qrow[d]);
    if (ROPE) {
        for (int64_t e = threadIdx.x; e < sq * HD; e += blockDim.x)
            kns[e] = rlx_f(knew[(b * sq + e / HD) * kw + (int64_t)kvh * HD + e % HD]);
        __syncthreads();
        const int half = rot / 2;
        for (int64_t e = threadIdx.x; e < (1 + sq) * half; e += blockDim.x) {
            const int64_t r = e / half;  /* 0: the query row; r >= 1: new key r - 1 */
            const int pp = (int)(e % half);
            const int64_t srow = r == 0 ? i : r - 1;
            const int64_t t = (per_row ? b * sq + srow : srow) * half + pp;
            const float c = rlx_f(cosb[t]), sn = rlx_f(sinb[t]);
            float *v = r == 0 ? qs : kns + (r - 1) * HD;
            const int i1 = NEOX ? pp : 2 * pp, i2 = NEOX ? pp + half : 2 * pp + 1;
            const float x1 = v[i1], x2 = v[i2];
            v[i1] = fmaf(x1, c, -(x2 * sn));  /* as rlx_kv_append_paged rotates: the same bits */
            v[i2] = fmaf(x2, c, x1 * sn);
        }
    }
    __syncthreads();
    if (bt == nullptr && i == 0 && split == 0 && h % (heads / kv_heads) == 0) {  /* this KV head's new rows */
        for (int64_t e = threadIdx.x; e < sq * HD; e += blockDim.x) {
            const int64_t s = e / HD, d = e % HD;
            const int64_t src = (b * sq + s) * kw + (int64_t)kvh * HD + d;
            const int64_t dst = row_at(p + s) * kw + (int64_t)kvh * HD + d;
            kc[dst] = rlx_to<KT>(ROPE ? kns[e] : rlx_f(knew[src]));
            vc[dst] = rlx_to<KT>(rlx_f(vnew[src]));
        }
    }
    /* key or value row j of this KV head: the cache below p, this step's input from p on */
    const KT *kb = kc + (int64_t)kvh * HD, *vb = vc + (int64_t)kvh * HD;  /* row j at row_at(j) * kw */
    const T *kn = knew + b * sq * kw + (int64_t)kvh * HD, *vn = vnew + b * sq * kw + (int64_t)kvh * HD;
    float mx = -INFINITY;
    for (int64_t j = lo + threadIdx.x; j < hi; j += blockDim.x) {
        float dot = 0.0f;
        if (ROPE && j >= p) {
            const float *kr = kns + (j - p) * HD;
#pragma unroll 16
            for (int d = 0; d < HD; ++d)
                dot = fmaf(qs[d], rlx_kv_stored<KT>(kr[d]), dot);
        } else if (j < p) {
            const KT *kr = kb + row_at(j) * kw;
#pragma unroll 16
            for (int d = 0; d < HD; ++d)
                dot = fmaf(qs[d], rlx_f(kr[d]), dot);
        } else {
            const T *kr = kn + (j - p) * kw;
#pragma unroll 16
            for (int d = 0; d < HD; ++d)
                dot = fmaf(qs[d], rlx_kv_stored<KT>(rlx_f(kr[d])), dot);
        }
        dot *= scale;
        sc[j - lo] = dot;
        mx = fmaxf(mx, dot);
    }
    mx = rlx_kv_block_reduce(mx, 0, red);
    float sum = 0.0f;
    for (int64_t j = threadIdx.x; j < hi - lo; j += blockDim.x) {
        const float e = __expf(sc[j] - mx);
        sc[j] = e;
        sum += e;
    }
    sum = rlx_kv_block_reduce(sum, 1, red);  /* its barrier also publishes sc */
    constexpr int DPL = (HD + 31) / 32;      /* head dims per lane */
    float acc[DPL];
#pragma unroll
    for (int t = 0; t < DPL; ++t)
        acc[t] = 0.0f;
#pragma unroll 4
    for (int64_t j = lo + warp; j < hi; j += RLX_KV_WARPS) {
        const float w = sc[j - lo];
        if (j < p) {
            const KT *vr = vb + row_at(j) * kw;
#pragma unroll
            for (int t = 0; t < DPL; ++t)
                if (lane + 32 * t < HD) acc[t] = fmaf(w, rlx_f(vr[lane + 32 * t]), acc[t]);
        } else {
            const T *vr = vn + (j - p) * kw;
#pragma unroll
            for (int t = 0; t < DPL; ++t)
                if (lane + 32 * t < HD) acc[t] = fmaf(w, rlx_kv_stored<KT>(rlx_f(vr[lane + 32 * t])), acc[t]);
        }
    }
#pragma unroll
    for (int t = 0; t < DPL; ++t)
        if (lane + 32 * t < HD) part[warp * HD + lane + 32 * t] = acc[t];
    __syncthreads();
    const int64_t row_head = (b * sq + i) * heads + h;
    if (active == 1) {  /* the whole past in this block: the output directly */
        const float inv = 1.0f / sum;
        for (int d = threadIdx.x; d < HD; d += blockDim.x) {
            float total = 0.0f;
            for (int w = 0; w < RLX_KV_WARPS; ++w)
                total += part[w * HD + d];
            out[row_head * HD + d] = rlx_to<T>(total * inv);
        }
        return;
    }
    /* split: this block's max, sum and unnormalized output, [max, sum, HD values] per (row, head, split) */
    float *mine = partials + (row_head * gridDim.z + split) * (HD + 2);
    for (int d = threadIdx.x; d < HD; d += blockDim.x) {
        float total = 0.0f;
        for (int w = 0; w < RLX_KV_WARPS; ++w)
            total += part[w * HD + d];
        mine[2 + d] = total;
    }
    if (threadIdx.x == 0) {
        mine[0] = mx;
        mine[1] = sum;
    }
    __threadfence();  /* the partials are visible device-wide before the counter says so */
    __syncthreads();
    if (threadIdx.x == 0)
        last_block = atomicAdd(counters + row_head, 1) == active - 1;
    __syncthreads();
    if (!last_block)
        return;
    __threadfence();
    const float *all = partials + row_head * gridDim.z * (HD + 2);
    float m = -INFINITY;
    for (int t = 0; t < active; ++t)
        m = fmaxf(m, __ldcg(all + t * (HD + 2)));
    float l = 0.0f;
    for (int t = 0; t < active; ++t)
        l += __ldcg(all + t * (HD + 2) + 1) * __expf(__ldcg(all + t * (HD + 2)) - m);
    for (int d = threadIdx.x; d < HD; d += blockDim.x) {
        float o = 0.0f;
        for (int t = 0; t < active; ++t)
            o += __ldcg(all + t * (HD + 2) + 2 + d) * __expf(__ldcg(all + t * (HD + 2)) - m);
        out[row_head * HD + d] = rlx_to<T>(o / l);
    }
    if (threadIdx.x == 0)
        counters[row_head] = 0;  /* ready for the next launch */
}

/* PAGED: this step's new keys and values into their pages (rounded to the cache dtype KT), one block per
 * (row, new token), before rlx_kv_attend or rlx_kv_decode (which check positions and page ids, raising their flag;
 * a row they would refuse is not written here either). ROPE (DecodeRope): knew holds the raw key projections,
 * rotated here in f32 from the tables cosb / sinb ([B, S, rot/2] per row, else [S, rot/2]) exactly as the attention
 * kernels rotate the row's own new keys, so what a later row reads from the cache equals what the row used. */
template <typename T, typename KT, bool ROPE = false, bool NEOX = false>
__global__ void rlx_kv_append_paged(const T *__restrict__ knew, const T *__restrict__ vnew, KT *__restrict__ kc,
                                    KT *__restrict__ vc, const int32_t *__restrict__ pos,
                                    const int32_t *__restrict__ bt, int64_t sq, int64_t page, int64_t maxp,
                                    int64_t num_pages, int64_t kw, const T *__restrict__ cosb = nullptr,
                                    const T *__restrict__ sinb = nullptr, int rot = 0, int per_row = 0, int hd = 1) {
    rlx_pdl_wait();
    rlx_pdl_trigger();
    const int64_t r = blockIdx.x, b = r / sq, s = r % sq;
    const int64_t p = (int64_t)pos[b];
    if (p < 0 || p + sq > maxp * page)
        return;
    for (int64_t c = 0; c < (p + sq + page - 1) / page; ++c)
        if (bt[b * maxp + c] < 0 || bt[b * maxp + c] >= num_pages)
            return;
    const int64_t t = p + s, dst = ((int64_t)bt[b * maxp + t / page] * page + t % page) * kw;
    const int half = rot / 2;
    for (int64_t e = threadIdx.x; e < kw; e += blockDim.x) {
        float x = rlx_f(knew[r * kw + e]);
        const int d = (int)(e % hd);
        if (ROPE && d < rot) {  /* pair (i1, i2): i1 gets x1 c - x2 s, i2 gets x2 c + x1 s */
            const int pp = NEOX ? (d < half ? d : d - half) : d / 2;
            const bool second = NEOX ? d >= half : (d & 1);
            const int64_t head0 = r * kw + (e - d);
            const int i1 = NEOX ? pp : 2 * pp, i2 = NEOX ? pp + half : 2 * pp + 1;
            const float x1 = rlx_f(knew[head0 + i1]), x2 = rlx_f(knew[head0 + i2]);
            const int64_t ti = (per_row ? r : s) * half + pp;
            const float c = rlx_f(cosb[ti]), sn = rlx_f(sinb[ti]);
            x = second ? fmaf(x2, c, x1 * sn) : fmaf(x1, c, -(x2 * sn));
        }
        kc[dst + e] = rlx_to<KT>(x);
        vc[dst + e] = rlx_to<KT>(rlx_f(vnew[r * kw + e]));
    }
}

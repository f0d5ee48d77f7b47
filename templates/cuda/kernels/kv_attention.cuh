/* Decoder attention over a KV cache ([max_batch, capacity, kv_heads*HD] per layer, on the device), one launch:
 * rlx_kv_attend runs one query row of one head per block of RLX_KV_THREADS: a thread per key for the scores
 * (kept in shared memory), block-wide max and sum through warp shuffles, then the weighted sum of values with a
 * warp per run of keys and the head dims spread over its lanes (a warp reads each value row whole), the
 * warps' partial sums added at the end.
 * ROPE (decode steps, see DecodeRope): q, knew are the projections before the rotary embedding, which the
 * block applies itself to its query row and to the step's new keys (staged rotated in shared memory; at most
 * RLX_KV_ROPE_ROWS of them), from the tables cosb / sinb ([B, S, rot/2] per row, else [S, rot/2]). The step's own keys
 * and values (cache rows pos .. pos+sq-1) are read from its k and v inputs, not from the cache, and the first
 * query's block of the first query head of each KV head appends them to the cache: no block reads a cache
 * row this launch writes, so no second launch has to come first. A position outside the cache raises flag
 * bit 4 and nothing is written. */
#define RLX_KV_THREADS 256
#define RLX_KV_ROPE_ROWS 4
#define RLX_KV_WARPS (RLX_KV_THREADS / 32)

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

template <typename T, int HD, bool ROPE, bool NEOX>
__global__ void __launch_bounds__(RLX_KV_THREADS)
rlx_kv_attend(const T *q, const T *__restrict__ knew, const T *__restrict__ vnew,
              T *__restrict__ kc, T *__restrict__ vc, const int32_t *__restrict__ pos, T *out,
              int64_t sq, int64_t cap, int heads, int kv_heads, float scale, int32_t *flag,
              const T *__restrict__ cosb, const T *__restrict__ sinb, int rot, int per_row) {
    extern __shared__ float rlx_kv_smem[];
    float *qs = rlx_kv_smem;                 /* the query row: HD floats */
    float *red = qs + HD;                    /* reductions: RLX_KV_WARPS floats */
    float *part = red + RLX_KV_WARPS;        /* the warps' partial outputs: RLX_KV_WARPS * HD floats */
    float *kns = part + RLX_KV_WARPS * HD;   /* ROPE: the step's new keys, rotated: RLX_KV_ROPE_ROWS * HD floats */
    float *sc = kns + RLX_KV_ROPE_ROWS * HD; /* scores, then weights: up to cap floats */
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int64_t b = blockIdx.x / heads, i = blockIdx.y;
    const int h = (int)(blockIdx.x % heads), kvh = h / (heads / kv_heads);
    {
        /* Launched early (rlx_launch_pdl) while the projections run: fetch this KV head's cached rows into L2.
           Earlier steps wrote them; positions are a run input in a decoder (settled: every kernel before the
           previous one has finished, see rlx_pdl_trigger). Only a hint: were `pos` still being computed, a stale
           value would fetch other rows of this row's cache (clamped to it), and nothing is read here. */
        const int64_t p0 = (int64_t)pos[b], kw0 = (int64_t)kv_heads * HD;
        const int64_t rows = p0 >= 0 && p0 <= cap ? p0 : 0;
        for (int64_t j = threadIdx.x; j < rows; j += blockDim.x)
            for (int off = 0; off < HD * (int)sizeof(T); off += 128) {
                asm volatile("prefetch.global.L2 [%0];" ::"l"((const char *)(kc + (b * cap + j) * kw0 + (int64_t)kvh * HD) + off));
                asm volatile("prefetch.global.L2 [%0];" ::"l"((const char *)(vc + (b * cap + j) * kw0 + (int64_t)kvh * HD) + off));
            }
    }
    rlx_pdl_wait();  /* everything below reads earlier kernels' results */
    rlx_pdl_trigger();
    const int64_t p = (int64_t)pos[b];
    if (p < 0 || p + sq > cap) {
        if (threadIdx.x == 0) atomicOr(flag, 4);
        return;
    }
    const int64_t n = p + i + 1;             /* query i sees keys 0 .. p + i */
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
            v[i1] = x1 * c - x2 * sn;
            v[i2] = x2 * c + x1 * sn;
        }
    }
    __syncthreads();
    if (i == 0 && h % (heads / kv_heads) == 0) {  /* this KV head's new rows into the cache */
        for (int64_t e = threadIdx.x; e < sq * HD; e += blockDim.x) {
            const int64_t s = e / HD, d = e % HD;
            const int64_t src = (b * sq + s) * kw + (int64_t)kvh * HD + d;
            const int64_t dst = (b * cap + p + s) * kw + (int64_t)kvh * HD + d;
            kc[dst] = ROPE ? rlx_to<T>(kns[e]) : knew[src];
            vc[dst] = vnew[src];
        }
    }
    /* key or value row j of this KV head: the cache below p, this step's input from p on */
    const T *kb = kc + b * cap * kw + (int64_t)kvh * HD, *vb = vc + b * cap * kw + (int64_t)kvh * HD;
    const T *kn = knew + b * sq * kw + (int64_t)kvh * HD, *vn = vnew + b * sq * kw + (int64_t)kvh * HD;
    float mx = -INFINITY;
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
        float dot = 0.0f;
        if (ROPE && j >= p) {
            const float *kr = kns + (j - p) * HD;
#pragma unroll 16
            for (int d = 0; d < HD; ++d)
                dot = fmaf(qs[d], kr[d], dot);
        } else {
            const T *kr = j < p ? kb + j * kw : kn + (j - p) * kw;
#pragma unroll 16
            for (int d = 0; d < HD; ++d)
                dot = fmaf(qs[d], rlx_f(kr[d]), dot);
        }
        dot *= scale;
        sc[j] = dot;
        mx = fmaxf(mx, dot);
    }
    mx = rlx_kv_block_reduce(mx, 0, red);
    float sum = 0.0f;
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
        const float e = __expf(sc[j] - mx);
        sc[j] = e;
        sum += e;
    }
    const float inv = 1.0f / rlx_kv_block_reduce(sum, 1, red);  /* its barrier also publishes sc */
    constexpr int DPL = (HD + 31) / 32;      /* head dims per lane */
    float acc[DPL];
#pragma unroll
    for (int t = 0; t < DPL; ++t)
        acc[t] = 0.0f;
#pragma unroll 4
    for (int64_t j = warp; j < n; j += RLX_KV_WARPS) {
        const float w = sc[j];
        const T *vr = j < p ? vb + j * kw : vn + (j - p) * kw;
#pragma unroll
        for (int t = 0; t < DPL; ++t)
            if (lane + 32 * t < HD) acc[t] = fmaf(w, rlx_f(vr[lane + 32 * t]), acc[t]);
    }
#pragma unroll
    for (int t = 0; t < DPL; ++t)
        if (lane + 32 * t < HD) part[warp * HD + lane + 32 * t] = acc[t];
    __syncthreads();
    for (int d = threadIdx.x; d < HD; d += blockDim.x) {
        float total = 0.0f;
        for (int w = 0; w < RLX_KV_WARPS; ++w)
            total += part[w * HD + d];
        out[((b * sq + i) * heads + h) * HD + d] = rlx_to<T>(total * inv);
    }
}

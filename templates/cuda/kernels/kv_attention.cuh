/* Decoder attention over a KV cache ([max_batch, capacity, kv_heads*HD] per layer, on the device).
 * rlx_kv_append writes this step's keys and values at each row's position (a position outside the
 * cache raises flag bit 4 and writes nothing); rlx_kv_attend runs one query row of one head per
 * block: scores for the keys it sees in shared memory, softmax, then the weighted sum of values
 * with the head dims spread over the threads. */
template <typename T>
__global__ void rlx_kv_append(const T *__restrict__ k, const T *__restrict__ v, T *__restrict__ kc,
                              T *__restrict__ vc, const int32_t *__restrict__ pos, int64_t batch, int64_t sq,
                              int64_t cap, int64_t kw, int32_t *flag) {
    const int64_t n = batch * sq * kw;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t c = i % kw, t = i / kw, s = t % sq, b = t / sq;
        const int64_t p = (int64_t)pos[b];
        if (p < 0 || p + sq > cap) {
            atomicOr(flag, 4);
            continue;
        }
        const int64_t dst = (b * cap + p + s) * kw + c;
        kc[dst] = k[i];
        vc[dst] = v[i];
    }
}

template <typename T, int HD>
__global__ void rlx_kv_attend(const T *__restrict__ q, const T *__restrict__ kc, const T *__restrict__ vc,
                              const int32_t *__restrict__ pos, T *__restrict__ out, int64_t sq, int64_t cap,
                              int heads, int kv_heads, float scale) {
    extern __shared__ float rlx_kv_smem[];
    float *qs = rlx_kv_smem;            /* the query row, HD floats */
    float *red = qs + HD;               /* reductions: blockDim.x floats */
    float *sc = red + blockDim.x;       /* scores then weights: up to cap floats */
    const int64_t b = blockIdx.x / heads, i = blockIdx.y;
    const int h = (int)(blockIdx.x % heads), kvh = h / (heads / kv_heads);
    const int64_t p = (int64_t)pos[b];
    if (p < 0 || p + sq > cap) return;  /* rlx_kv_append raised the flag */
    const int64_t n = p + i + 1;        /* query i sees keys 0 .. p + i */
    const int64_t kw = (int64_t)kv_heads * HD;
    const T *qrow = q + ((b * sq + i) * heads + h) * HD;
    for (int d = threadIdx.x; d < HD; d += blockDim.x)
        qs[d] = rlx_f(qrow[d]);
    __syncthreads();
    const T *kb = kc + b * cap * kw + (int64_t)kvh * HD;
    const T *vb = vc + b * cap * kw + (int64_t)kvh * HD;
    float mx = -INFINITY;
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
        const T *kr = kb + j * kw;
        float dot = 0.0f;
#pragma unroll 8
        for (int d = 0; d < HD; ++d)
            dot += qs[d] * rlx_f(kr[d]);
        dot *= scale;
        sc[j] = dot;
        mx = fmaxf(mx, dot);
    }
    red[threadIdx.x] = mx;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s) red[threadIdx.x] = fmaxf(red[threadIdx.x], red[threadIdx.x + s]);
        __syncthreads();
    }
    mx = red[0];
    __syncthreads();
    float sum = 0.0f;
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
        const float e = __expf(sc[j] - mx);
        sc[j] = e;
        sum += e;
    }
    red[threadIdx.x] = sum;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s) red[threadIdx.x] += red[threadIdx.x + s];
        __syncthreads();
    }
    const float inv = 1.0f / red[0];
    __syncthreads();
    /* weighted sum: thread t handles head dim t % HD over keys t / HD, t / HD + parts, ... */
    const int parts = blockDim.x / HD, d = threadIdx.x % HD, part = threadIdx.x / HD;
    float acc = 0.0f;
    if (part < parts)
        for (int64_t j = part; j < n; j += parts)
            acc += sc[j] * rlx_f(vb[j * kw + d]);
    red[threadIdx.x] = acc;
    __syncthreads();
    if (threadIdx.x < HD) {
        float total = 0.0f;
        for (int r = 0; r < parts; ++r)
            total += red[r * HD + threadIdx.x];
        out[((b * sq + i) * heads + h) * HD + threadIdx.x] = rlx_to<T>(total * inv);
    }
}

/* Decode attention over a KV cache (flash-decoding), the kernel of a decode step's `cached_attention` (see
 * DecodeSplitKv with grouped=True): one block of RLX_KVD_THREADS per (row, query, KV head, split) handles all G
 * query heads of its KV head, so each cached K/V row is read from memory once for the G heads (GQA), and a
 * query's keys are split over up to gridDim.z blocks (the split count from the key count: a short past stays one
 * block and writes its output directly).
 *
 * Inside a block a row of HD keys (or values) is read by LPR lanes with 16-byte loads (VEC elements of the cache
 * dtype KT each); a warp takes 32 / LPR rows at a time. Each lane keeps, per query head, a running max, a running
 * sum of exponentials and its VEC-wide slices of the weighted value sum (online softmax, f32): no score array, so
 * shared memory does not grow with the context. The warps' states merge through shuffles, then shared memory.
 * A split query's blocks write [max, sum, HD unnormalized values] per head to `partials`; the last of them to
 * finish (a counter per (row, KV head) in `counters`, zero between launches: that block resets it) merges them.
 *
 * Keys j of query i at position p + i: the window's first key .. p + i (WINDOW: the last `window` keys only).
 * Rows j < p come from the cache; the step's own rows (j >= p, at most RLX_KVD_NEW_ROWS of them) from the k / v
 * inputs, staged in shared memory (ROPE: rotated there, see DecodeRope) and rounded to KT as the cache stores
 * them. The first split of query 0 appends them to the cache: no block reads a cache row this launch writes.
 * T is the compute dtype (q, k, v, out, rope tables), KT the cache's (f32, f16 or bf16).
 * PAGED (a paged cache, bt not null): the caches are a pool of pages [num_pages, page, kv_heads*HD] and row b's
 * token j is row j % page of page bt[b * maxp + j / page] (cap = maxp * page). Rows of one step may be one
 * sequence's consecutive tokens, reading each other's keys: rlx_kv_append_paged (kernels/kv_attention.cuh, with
 * ROPE it rotates the keys it stores) has stored every row's new keys and values before this launch, so no block
 * appends here; a block still takes its own row's new keys from the inputs (staged as above). A page id outside
 * the pool raises flag bit 4. `inside` (cached_attention's distinct-rows hint: no row of the step reads a cache
 * row another row writes) makes a paged launch append as the contiguous one does, with no append launch before. */
#define RLX_KVD_THREADS 128
#define RLX_KVD_WARPS (RLX_KVD_THREADS / 32)
#define RLX_KVD_NEW_ROWS 4
#define RLX_KVD_MAX_SPLITS 128 /* the most blocks a query splits over (rlx.opt.lowering_cuda.KVD_MAX_SPLITS) */
#define RLX_KVD_LOG2E 1.4426950408889634f

#ifndef RLX_KV_PREFETCH
#define RLX_KV_PREFETCH(p) asm volatile("prefetch.global.L2 [%0];" ::"l"(p))
#endif
#ifndef RLX_DYNAMIC_SHARED
#define RLX_DYNAMIC_SHARED(type, name) extern __shared__ type name[]
#endif
/* The 16-byte type of one vector load; a macro so a CPU stand-in can provide it. */
#ifndef RLX_KVD_VEC16
#define RLX_KVD_VEC16 uint4
#endif

/* Elements of one 16-byte load, lanes per row, rows per warp and loads per lane of a row of HD elements of KT. */
template <typename KT, int HD> struct RlxKvdShape {
    static constexpr int VEC = 16 / (int)sizeof(KT);
    static constexpr int NV = HD / VEC;                      /* 16-byte vectors per row */
    static constexpr int LPR = NV < 32 ? NV : 32;            /* lanes per row */
    static constexpr int RPW = 32 / LPR;                     /* rows per warp */
    static constexpr int VPL = NV / LPR;                     /* vectors per lane */
    static constexpr int DPL = VPL * VEC;                    /* head dims per lane */
    static_assert(HD % VEC == 0 && 32 % LPR == 0 && NV % LPR == 0, "head_dim unsupported by rlx_kv_decode");
};

/* Floats of a block's dynamic shared memory: the G query rows, the step's new keys and values, the warps' states
   (reused by the merge for the warps' sums) and the splits' merge weights (rlx/codegen/cuda/decoder.py sizes the
   launch the same way). */
template <int HD, int G> constexpr int rlx_kvd_smem_floats() {
    return G * HD + 2 * RLX_KVD_NEW_ROWS * HD + RLX_KVD_WARPS * G * (HD + 2) + G * RLX_KVD_MAX_SPLITS;
}

/* Blocks an SM holds (the registers' bound, __launch_bounds__): 4 where a lane's G x DPL query and output values
   are few (<= 24), else 2; rlx.opt.lowering_cuda.kvd_blocks_per_sm sizes the split count by the same rule. */
template <typename KT, int HD, int G> constexpr int rlx_kvd_blocks_per_sm() {
    return G * RlxKvdShape<KT, HD>::DPL <= 24 ? 4 : 2;
}

/* Head dim d of vector slot v of lane `sub_lane`: a row's LPR lanes read LPR * 16 contiguous bytes per slot. */
template <typename KT, int HD> __device__ __forceinline__ int rlx_kvd_dim(int sub_lane, int v, int e) {
    using S = RlxKvdShape<KT, HD>;
    return (v * S::LPR + sub_lane) * S::VEC + e;
}

/* The VEC elements of KT in one 16-byte vector as floats. */
template <typename KT, int VEC> __device__ __forceinline__ void rlx_kvd_cvt(const RLX_KVD_VEC16 &raw, float *x) {
    const KT *e = reinterpret_cast<const KT *>(&raw);
#pragma unroll
    for (int t = 0; t < VEC; ++t)
        x[t] = rlx_f(e[t]);
}

/* exp2(a - m) with a == -inf (an empty state) giving 0 even when m is -inf too. */
__device__ __forceinline__ float rlx_kvd_scale(float a, float m) { return a == -INFINITY ? 0.0f : exp2f(a - m); }

template <typename T, typename KT, int HD, int G, bool ROPE, bool NEOX, bool WINDOW, bool PAGED = false>
__global__ void __launch_bounds__(RLX_KVD_THREADS, rlx_kvd_blocks_per_sm<KT, HD, G>())
rlx_kv_decode(const T *q, const T *__restrict__ knew, const T *__restrict__ vnew, KT *__restrict__ kc,
              KT *__restrict__ vc, const int32_t *__restrict__ pos, T *out, int64_t sq, int64_t cap, int heads,
              int kv_heads, float scale, int64_t window, int32_t *flag, const T *__restrict__ cosb,
              const T *__restrict__ sinb, int rot, int per_row, float *__restrict__ partials,
              int32_t *__restrict__ counters, int64_t split_keys, const int32_t *__restrict__ bt = nullptr,
              int64_t page = 1, int64_t maxp = 0, int64_t num_pages = 0, int inside = 0) {
    using S = RlxKvdShape<KT, HD>;
    RLX_DYNAMIC_SHARED(float, rlx_kvd_smem);
    __shared__ int last_block, bad_page;
    float *qs = rlx_kvd_smem;                          /* the G query rows: G * HD floats */
    float *kns = qs + G * HD;                          /* the step's new keys (rotated): RLX_KVD_NEW_ROWS * HD */
    float *vns = kns + RLX_KVD_NEW_ROWS * HD;          /* ... and values: RLX_KVD_NEW_ROWS * HD */
    float *wst = vns + RLX_KVD_NEW_ROWS * HD;          /* the warps' states: WARPS * G * (HD + 2) */
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int sub = lane / S::LPR, sl = lane % S::LPR; /* this lane's row of the warp's RPW, its place in the row */
    const int64_t b = blockIdx.x / kv_heads, i = blockIdx.y;
    const int kvh = (int)(blockIdx.x % kv_heads), split = (int)blockIdx.z;
    const int64_t kw = (int64_t)kv_heads * HD;
    const KT *kb = kc + (int64_t)kvh * HD, *vb = vc + (int64_t)kvh * HD;  /* key j at row_at(j) * kw */
    /* the cache row of this row's token j (PAGED: through its block table; `hint`: a page id clamped into the pool,
       for prefetches made before the ids are checked) */
    auto row_at = [&](int64_t j, bool hint = false) -> int64_t {
        if (!PAGED) return b * cap + j;
        int64_t id = bt[b * maxp + j / page];
        if (hint) id = id < 0 ? 0 : id >= num_pages ? num_pages - 1 : id;
        return id * page + j % page;
    };

    /* this query's keys first .. n-1, in `active` runs of `per` (none empty); split >= active has none */
    int64_t p = 0, first = 0, n = 0, per = 1, lo = 0, hi = 0;
    int active = 1;
    auto keys = [&](int64_t at) {
        p = at;
        n = p + i + 1;
        first = WINDOW && n > window ? n - window : 0;
        const int64_t count = n - first;
        const int64_t want = (count + split_keys - 1) / split_keys;
        const int64_t runs = want < (int64_t)gridDim.z ? want : (int64_t)gridDim.z;
        per = (count + runs - 1) / runs;
        active = (int)((count + per - 1) / per);
        lo = first + (int64_t)split * per;
        hi = lo + per < n ? lo + per : n;
    };
    {
        /* Launched early (rlx_launch_pdl): fetch this block's cached rows into L2 while the projections run.
           Positions are a run input of a decoder (settled before this launch); a stale value would only fetch
           other rows of this row's cache (clamped to it): nothing is read here. */
        const int64_t at = (int64_t)pos[b];
        keys(at >= 0 && at + sq <= cap ? at : 0);
        const int64_t cached_hi = hi < p ? hi : p;
        for (int64_t j = lo + threadIdx.x; j < cached_hi; j += blockDim.x)
            for (int off = 0; off < HD * (int)sizeof(KT); off += 128) {
                RLX_KV_PREFETCH((const char *)(kb + row_at(j, true) * kw) + off);
                RLX_KV_PREFETCH((const char *)(vb + row_at(j, true) * kw) + off);
            }
    }
    rlx_pdl_wait();  /* everything below reads earlier kernels' results */
    rlx_pdl_trigger();
    const int64_t at = (int64_t)pos[b];
    if (at < 0 || at + sq > cap) {
        if (threadIdx.x == 0 && split == 0) atomicOr(flag, 4);
        return;
    }
    keys(at);
    if (PAGED) {  /* every page this row reads is in the pool (the whole block decides) */
        if (threadIdx.x == 0) bad_page = 0;
        __syncthreads();
        for (int64_t c = threadIdx.x; c < (p + sq + page - 1) / page; c += blockDim.x)
            if (bt[b * maxp + c] < 0 || bt[b * maxp + c] >= num_pages) atomicOr(&bad_page, 1);
        __syncthreads();
        if (bad_page) {
            if (threadIdx.x == 0 && split == 0) atomicOr(flag, 4);
            return;
        }
    }
    if (split >= active) return;  /* the whole block: no barrier is skipped by part of it */

    /* stage the G query rows and the step's new keys and values (f32), rotate them (ROPE), round the new rows to KT */
    const int64_t row = b * sq + i;
    const T *qrow = q + (row * heads + (int64_t)kvh * G) * HD;
    for (int e = threadIdx.x; e < G * HD; e += blockDim.x)
        qs[e] = rlx_f(qrow[e]);
    for (int64_t e = threadIdx.x; e < sq * HD; e += blockDim.x) {
        const int64_t src = (b * sq + e / HD) * kw + (int64_t)kvh * HD + e % HD;
        kns[e] = rlx_f(knew[src]);
        vns[e] = rlx_f(rlx_to<KT>(rlx_f(vnew[src])));
    }
    __syncthreads();
    if (ROPE) {
        const int half = rot / 2;
        for (int64_t e = threadIdx.x; e < (G + sq) * half; e += blockDim.x) {
            const int64_t r = e / half;  /* r < G: query head r; r >= G: new key r - G */
            const int pp = (int)(e % half);
            const int64_t srow = r < G ? i : r - G;
            const int64_t t = (per_row ? b * sq + srow : srow) * half + pp;
            const float c = rlx_f(cosb[t]), sn = rlx_f(sinb[t]);
            float *v = r < G ? qs + r * HD : kns + (r - G) * HD;
            const int i1 = NEOX ? pp : 2 * pp, i2 = NEOX ? pp + half : 2 * pp + 1;
            const float x1 = v[i1], x2 = v[i2];
            v[i1] = fmaf(x1, c, -(x2 * sn));  /* as rlx_kv_append_paged rotates: the same bits */
            v[i2] = fmaf(x2, c, x1 * sn);
        }
        __syncthreads();
    }
    for (int64_t e = threadIdx.x; e < sq * HD; e += blockDim.x)
        kns[e] = rlx_f(rlx_to<KT>(kns[e]));  /* as the cache holds it */
    __syncthreads();
    if ((!PAGED || inside) && i == 0 && split == 0) {  /* this KV head's new rows into the cache (PAGED: stored
                                                          before this launch unless the rows are distinct) */
        for (int64_t e = threadIdx.x; e < sq * HD; e += blockDim.x) {
            const int64_t dst = row_at(p + e / HD) * kw + (int64_t)kvh * HD + e % HD;
            kc[dst] = rlx_to<KT>(kns[e]);
            vc[dst] = rlx_to<KT>(vns[e]);
        }
    }

    /* this lane's slices of the G queries, scaled so that exp2 of a score is exp of the softmax's */
    float qr[G][S::DPL];
#pragma unroll
    for (int g = 0; g < G; ++g)
#pragma unroll
        for (int v = 0; v < S::VPL; ++v)
#pragma unroll
            for (int e = 0; e < S::VEC; ++e)
                qr[g][v * S::VEC + e] = qs[g * HD + rlx_kvd_dim<KT, HD>(sl, v, e)] * (scale * RLX_KVD_LOG2E);
    float m[G], l[G], acc[G][S::DPL];
#pragma unroll
    for (int g = 0; g < G; ++g) {
        m[g] = -INFINITY;
        l[g] = 0.0f;
#pragma unroll
        for (int d = 0; d < S::DPL; ++d)
            acc[g][d] = 0.0f;
    }
    /* U rows per lane per step, all loaded (raw 16-byte vectors) before any is used: more bytes in flight. The
       trip count is warp-uniform (the shuffles need every lane): a lane past hi takes no key. A step's U keys
       update each head's softmax state once (the tile's max, one rescale of the sums), not once per key. */
    constexpr int U = G * S::DPL <= 32 ? 4 : 2;
    for (int64_t base = lo + (int64_t)warp * S::RPW * U; base < hi; base += (int64_t)RLX_KVD_WARPS * S::RPW * U) {
        RLX_KVD_VEC16 kr[U][S::VPL], vr[U][S::VPL];
        bool live[U];
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const int64_t j = base + u * S::RPW + sub;
            live[u] = j < hi;
            if (live[u] && j < p) {
                const int64_t at_j = row_at(j) * kw;
#pragma unroll
                for (int v = 0; v < S::VPL; ++v) {
                    const int d0 = rlx_kvd_dim<KT, HD>(sl, v, 0);
                    kr[u][v] = *reinterpret_cast<const RLX_KVD_VEC16 *>(kb + at_j + d0);
                    vr[u][v] = *reinterpret_cast<const RLX_KVD_VEC16 *>(vb + at_j + d0);
                }
            } else {  /* a new row (staged, already rounded to KT: exact), or row 0 of them for a dead lane */
                const int64_t r = live[u] ? j - p : 0;
#pragma unroll
                for (int v = 0; v < S::VPL; ++v) {
                    KT *ke = reinterpret_cast<KT *>(&kr[u][v]), *ve = reinterpret_cast<KT *>(&vr[u][v]);
#pragma unroll
                    for (int e = 0; e < S::VEC; ++e) {
                        const int d = rlx_kvd_dim<KT, HD>(sl, v, e);
                        ke[e] = rlx_to<KT>(kns[r * HD + d]);
                        ve[e] = rlx_to<KT>(vns[r * HD + d]);
                    }
                }
            }
        }
        float sc[U][G];
#pragma unroll
        for (int u = 0; u < U; ++u) {
            float kx[S::DPL];
#pragma unroll
            for (int v = 0; v < S::VPL; ++v)
                rlx_kvd_cvt<KT, S::VEC>(kr[u][v], kx + v * S::VEC);
#pragma unroll
            for (int g = 0; g < G; ++g) {
                float t = 0.0f;
#pragma unroll
                for (int d = 0; d < S::DPL; ++d)
                    t = fmaf(qr[g][d], kx[d], t);
#pragma unroll
                for (int o = S::LPR / 2; o > 0; o >>= 1)
                    t += __shfl_xor_sync(0xffffffffu, t, o);
                sc[u][g] = t;
            }
        }
        float vx[U][S::DPL];
#pragma unroll
        for (int u = 0; u < U; ++u)
#pragma unroll
            for (int v = 0; v < S::VPL; ++v)
                rlx_kvd_cvt<KT, S::VEC>(vr[u][v], vx[u] + v * S::VEC);
#pragma unroll
        for (int g = 0; g < G; ++g) {
            float mt = -INFINITY;
#pragma unroll
            for (int u = 0; u < U; ++u)
                if (live[u]) mt = fmaxf(mt, sc[u][g]);
            if (mt == -INFINITY) continue;  /* no key of this lane's row (or only -inf scores) */
            const float mn = fmaxf(m[g], mt), c = rlx_kvd_scale(m[g], mn);
            float w[U], ws = 0.0f;
#pragma unroll
            for (int u = 0; u < U; ++u) {
                w[u] = live[u] ? exp2f(sc[u][g] - mn) : 0.0f;
                ws += w[u];
            }
            l[g] = l[g] * c + ws;
#pragma unroll
            for (int d = 0; d < S::DPL; ++d) {
                float a2 = acc[g][d] * c;
#pragma unroll
                for (int u = 0; u < U; ++u)
                    a2 = fmaf(w[u], vx[u][d], a2);
                acc[g][d] = a2;
            }
            m[g] = mn;
        }
    }
    /* merge the warp's RPW row states (lanes with the same place in a row), then the warps' through shared memory */
#pragma unroll
    for (int g = 0; g < G; ++g) {
#pragma unroll
        for (int o = S::LPR; o < 32; o <<= 1) {
            const float mo = __shfl_xor_sync(0xffffffffu, m[g], o), lo2 = __shfl_xor_sync(0xffffffffu, l[g], o);
            const float mn = fmaxf(m[g], mo);
            const float c = rlx_kvd_scale(m[g], mn), co = rlx_kvd_scale(mo, mn);
            l[g] = l[g] * c + lo2 * co;
#pragma unroll
            for (int d = 0; d < S::DPL; ++d) {
                const float ao = __shfl_xor_sync(0xffffffffu, acc[g][d], o);
                acc[g][d] = acc[g][d] * c + ao * co;
            }
            m[g] = mn;
        }
        float *ws = wst + (warp * G + g) * (HD + 2);
        if (sub == 0) {
#pragma unroll
            for (int v = 0; v < S::VPL; ++v)
#pragma unroll
                for (int e = 0; e < S::VEC; ++e)
                    ws[2 + rlx_kvd_dim<KT, HD>(sl, v, e)] = acc[g][v * S::VEC + e];
            if (sl == 0) {
                ws[0] = m[g];
                ws[1] = l[g];
            }
        }
    }
    __syncthreads();
    /* thread (g, d): the block's max, sum and unnormalized output of head g, dim d */
    const bool direct = active == 1;
    float *mine = partials + ((row * heads + (int64_t)kvh * G) * gridDim.z + split) * (HD + 2);
    for (int e = threadIdx.x; e < G * HD; e += blockDim.x) {
        const int g = e / HD, d = e % HD;
        float mx = -INFINITY;
        for (int w = 0; w < RLX_KVD_WARPS; ++w)
            mx = fmaxf(mx, wst[(w * G + g) * (HD + 2)]);
        float sum = 0.0f, o = 0.0f;
        for (int w = 0; w < RLX_KVD_WARPS; ++w) {
            const float *ws = wst + (w * G + g) * (HD + 2);
            const float c = rlx_kvd_scale(ws[0], mx);
            sum += ws[1] * c;
            o += ws[2 + d] * c;
        }
        if (direct) {
            out[(row * heads + (int64_t)kvh * G + g) * HD + d] = rlx_to<T>(o / sum);
        } else {
            float *pg = mine + (int64_t)g * gridDim.z * (HD + 2);
            pg[2 + d] = o;
            if (d == 0) {
                pg[0] = mx;
                pg[1] = sum;
            }
        }
    }
    if (direct) return;
    __threadfence();  /* the partials are visible device-wide before the counter says so */
    __syncthreads();
    if (threadIdx.x == 0)
        last_block = atomicAdd(counters + row * kv_heads + kvh, 1) == active - 1;
    __syncthreads();
    if (!last_block) return;
    __threadfence();
    /* The merge, spread over the block, in few rounds of independent L2 reads (a dependent walk over the splits was
       most of a 16k-context step's attention). (1) A warp per query head, lanes over splits: each split's max and
       sum in one 8-byte load, the common max and sum by shuffles, then each split's weight exp2(m_t - max) / sum into
       shared memory (`wts`, G x RLX_KVD_MAX_SPLITS floats). (2) Warp w sums splits w, w + WARPS, ... of every
       (head, dim), a lane taking 2 adjacent dims (8-byte loads), MU splits' loads issued before any is summed; the
       warps' sums meet in shared memory (`red`: WARPS x G x HD floats of the states region). */
    constexpr int MT = (RLX_KVD_MAX_SPLITS + 31) / 32;  /* splits a lane holds in (1) */
    constexpr int D2 = (HD / 2 + 31) / 32;              /* dim pairs a lane takes in (2): d = 2 (lane + 32 k) */
    constexpr int MU = G * D2 >= 12 ? 2 : 24 / (G * D2);  /* splits in flight per lane in (2) */
    float *red = wst, *wts = wst + RLX_KVD_WARPS * G * (HD + 2);
    const int64_t head_stride = (int64_t)gridDim.z * (HD + 2);
    const float *base = partials + (row * heads + (int64_t)kvh * G) * head_stride;
    for (int g = warp; g < G; g += RLX_KVD_WARPS) {
        const float *all = base + g * head_stride;
        float2 ml[MT];
#pragma unroll
        for (int k = 0; k < MT; ++k) {
            const int t = lane + 32 * k;
            ml[k] = t < active ? __ldcg(reinterpret_cast<const float2 *>(all + (int64_t)t * (HD + 2)))
                               : make_float2(-INFINITY, 0.0f);
        }
        float mx = -INFINITY;
#pragma unroll
        for (int k = 0; k < MT; ++k)
            mx = fmaxf(mx, ml[k].x);
#pragma unroll
        for (int o = 16; o > 0; o >>= 1)
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
        float sum = 0.0f;
#pragma unroll
        for (int k = 0; k < MT; ++k)
            sum += ml[k].y * rlx_kvd_scale(ml[k].x, mx);
#pragma unroll
        for (int o = 16; o > 0; o >>= 1)
            sum += __shfl_xor_sync(0xffffffffu, sum, o);
        const float inv = 1.0f / sum;
#pragma unroll
        for (int k = 0; k < MT; ++k)
            if (lane + 32 * k < active) wts[g * RLX_KVD_MAX_SPLITS + lane + 32 * k] = rlx_kvd_scale(ml[k].x, mx) * inv;
    }
    __syncthreads();
    {
        float2 o[G][D2];
#pragma unroll
        for (int g = 0; g < G; ++g)
#pragma unroll
            for (int k = 0; k < D2; ++k)
                o[g][k] = make_float2(0.0f, 0.0f);
        for (int t0 = warp; t0 < active; t0 += RLX_KVD_WARPS * MU) {
            float2 x[MU][G][D2];
#pragma unroll
            for (int u = 0; u < MU; ++u) {
                const int t = t0 + u * RLX_KVD_WARPS;
#pragma unroll
                for (int g = 0; g < G; ++g)
#pragma unroll
                    for (int k = 0; k < D2; ++k) {
                        const int d = 2 * (lane + 32 * k);
                        x[u][g][k] = t < active && d < HD ? __ldcg(reinterpret_cast<const float2 *>(
                                                                base + g * head_stride + (int64_t)t * (HD + 2) + 2 + d))
                                                          : make_float2(0.0f, 0.0f);
                    }
            }
#pragma unroll
            for (int u = 0; u < MU; ++u) {
                const int t = t0 + u * RLX_KVD_WARPS;
                if (t >= active) break;
#pragma unroll
                for (int g = 0; g < G; ++g) {
                    const float c = wts[g * RLX_KVD_MAX_SPLITS + t];
#pragma unroll
                    for (int k = 0; k < D2; ++k) {
                        o[g][k].x = fmaf(x[u][g][k].x, c, o[g][k].x);
                        o[g][k].y = fmaf(x[u][g][k].y, c, o[g][k].y);
                    }
                }
            }
        }
#pragma unroll
        for (int g = 0; g < G; ++g)
#pragma unroll
            for (int k = 0; k < D2; ++k) {
                const int d = 2 * (lane + 32 * k);
                if (d < HD) {
                    red[(warp * G + g) * HD + d] = o[g][k].x;
                    red[(warp * G + g) * HD + d + 1] = o[g][k].y;
                }
            }
    }
    __syncthreads();
    for (int e = threadIdx.x; e < G * HD; e += blockDim.x) {
        float o = 0.0f;
#pragma unroll
        for (int w = 0; w < RLX_KVD_WARPS; ++w)
            o += red[w * G * HD + e];
        out[(row * heads + (int64_t)kvh * G + e / HD) * HD + e % HD] = rlx_to<T>(o);
    }
    if (threadIdx.x == 0)
        counters[row * kv_heads + kvh] = 0;  /* ready for the next launch */
}

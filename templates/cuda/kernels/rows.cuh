/* ── row kernels: layer/rms norm (+residual), softmax, reductions ─────────
 * A row of N elements is handled by TPR threads (a warp, or a whole block when TPR > 32, then one row per
 * block). With VPT > 0 each thread keeps its VPT elements in registers, so the row is read from memory once;
 * VPT == 0 streams the row again for each pass (rows too long to cache). */

template <typename A, int TPR>
__device__ __forceinline__ A rlx_group_sum(A v, A *red) {
    v = rlx_warp_sum(v);
    if (TPR <= 32) return v;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    __syncthreads(); /* the previous reduction's readers are done with red[] */
    if (lane == 0) red[warp] = v;
    __syncthreads();
    A t = (lane < TPR / 32) ? red[lane] : (A)0;
    return rlx_warp_sum(t);
}

template <typename A, int TPR>
__device__ __forceinline__ A rlx_group_max(A v, A *red) {
    v = rlx_warp_max(v);
    if (TPR <= 32) return v;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    __syncthreads();
    if (lane == 0) red[warp] = v;
    __syncthreads();
    A t = (lane < TPR / 32) ? red[lane] : (A)(-INFINITY);
    return rlx_warp_max(t);
}

/* y = norm(x [+ res] [+ bias]) * gamma [+ beta]; RMS selects rms_norm. Statistics in A (f32, or f64 for f64). */
template <typename T, typename A, int TPR, int VPT, bool RMS, bool RES, bool BIAS>
__global__ void rlx_norm(const T *__restrict__ x, const T *__restrict__ res, const T *__restrict__ bias,
                         const T *__restrict__ gamma, const T *__restrict__ beta, T *__restrict__ out,
                         int64_t rows, int n, A eps) {
    __shared__ A red[32];
    rlx_pdl_trigger(); rlx_pdl_wait(); /* may start early (rlx_launch_pdl): wait before touching data */
    const int rpb = blockDim.x / TPR;
    const int64_t row = (int64_t)blockIdx.x * rpb + threadIdx.x / TPR;
    const int t = threadIdx.x % TPR;
    if (row >= rows) return; /* only whole warps (TPR == 32) or whole blocks (grid == rows) leave here */
    const T *xr = x + row * n;
    const T *rr = RES ? res + row * n : nullptr;
    T *orow = out + row * n;
    A mean = 0, var = 0;
    if (VPT > 0) {
        A v[VPT > 0 ? VPT : 1];
        A s = 0;
#pragma unroll
        for (int k = 0; k < (VPT > 0 ? VPT : 1); ++k) {
            int c = t + k * TPR;
            A e = 0;
            if (c < n) {
                e = rlx_f(xr[c]);
                if (RES) e += rlx_f(rr[c]);
                if (BIAS) e += rlx_f(bias[c]);
            }
            v[k] = e;
            s += e;
        }
        if (!RMS) {
            mean = rlx_group_sum<A, TPR>(s, red) / (A)n;
            A q = 0;
#pragma unroll
            for (int k = 0; k < (VPT > 0 ? VPT : 1); ++k) {
                int c = t + k * TPR;
                A d = c < n ? v[k] - mean : (A)0;
                q += d * d;
            }
            var = rlx_group_sum<A, TPR>(q, red) / (A)n;
        } else {
            A q = 0;
#pragma unroll
            for (int k = 0; k < (VPT > 0 ? VPT : 1); ++k) q += v[k] * v[k];
            var = rlx_group_sum<A, TPR>(q, red) / (A)n;
        }
        const A inv = (A)1 / sqrt(var + eps);
#pragma unroll
        for (int k = 0; k < (VPT > 0 ? VPT : 1); ++k) {
            int c = t + k * TPR;
            if (c < n) {
                A y = (v[k] - mean) * inv * (A)rlx_f(gamma[c]);
                if (!RMS) y += (A)rlx_f(beta[c]);
                orow[c] = rlx_cvt<T>(y);
            }
        }
    } else {
        A s = 0;
        for (int c = t; c < n; c += TPR) {
            A e = rlx_f(xr[c]);
            if (RES) e += rlx_f(rr[c]);
            if (BIAS) e += rlx_f(bias[c]);
            s += RMS ? e * e : e;
        }
        s = rlx_group_sum<A, TPR>(s, red) / (A)n;
        if (RMS) {
            var = s;
        } else {
            mean = s;
            A q = 0;
            for (int c = t; c < n; c += TPR) {
                A e = rlx_f(xr[c]);
                if (RES) e += rlx_f(rr[c]);
                if (BIAS) e += rlx_f(bias[c]);
                q += (e - mean) * (e - mean);
            }
            var = rlx_group_sum<A, TPR>(q, red) / (A)n;
        }
        const A inv = (A)1 / sqrt(var + eps);
        for (int c = t; c < n; c += TPR) {
            A e = rlx_f(xr[c]);
            if (RES) e += rlx_f(rr[c]);
            if (BIAS) e += rlx_f(bias[c]);
            A y = (e - mean) * inv * (A)rlx_f(gamma[c]);
            if (!RMS) y += (A)rlx_f(beta[c]);
            orow[c] = rlx_cvt<T>(y);
        }
    }
}

/* rlx_norm with 16-byte accesses: VEC elements per chunk, CPT chunks per thread kept in registers. Needs
 * n % VEC == 0 and every pointer 16-byte aligned (checked when the code is generated). */
template <typename T, typename A, int TPR, int CPT, int VEC, bool RMS, bool RES, bool BIAS>
__global__ void rlx_norm_vec(const T *__restrict__ x, const T *__restrict__ res, const T *__restrict__ bias,
                             const T *__restrict__ gamma, const T *__restrict__ beta, T *__restrict__ out,
                             int64_t rows, int n, A eps) {
    __shared__ A red[32];
    rlx_pdl_trigger(); rlx_pdl_wait(); /* may start early (rlx_launch_pdl): wait before touching data */
    const int rpb = blockDim.x / TPR;
    const int64_t row = (int64_t)blockIdx.x * rpb + threadIdx.x / TPR;
    const int t = threadIdx.x % TPR;
    if (row >= rows) return;
    const int nc = n / VEC;
    const int4 *xr = reinterpret_cast<const int4 *>(x + row * n);
    const int4 *rr = RES ? reinterpret_cast<const int4 *>(res + row * n) : nullptr;
    int4 *orow = reinterpret_cast<int4 *>(out + row * n);
    A v[CPT][VEC];
    A s = 0;
#pragma unroll
    for (int k = 0; k < CPT; ++k) {
        const int c = t + k * TPR;
#pragma unroll
        for (int e = 0; e < VEC; ++e) v[k][e] = 0;
        if (c < nc) {
            int4 raw = xr[c];
            const T *xe = reinterpret_cast<const T *>(&raw);
#pragma unroll
            for (int e = 0; e < VEC; ++e) v[k][e] = rlx_f(xe[e]);
            if (RES) {
                int4 rraw = rr[c];
                const T *re = reinterpret_cast<const T *>(&rraw);
#pragma unroll
                for (int e = 0; e < VEC; ++e) v[k][e] += rlx_f(re[e]);
            }
            if (BIAS) {
                int4 braw = reinterpret_cast<const int4 *>(bias)[c];
                const T *be = reinterpret_cast<const T *>(&braw);
#pragma unroll
                for (int e = 0; e < VEC; ++e) v[k][e] += rlx_f(be[e]);
            }
        }
#pragma unroll
        for (int e = 0; e < VEC; ++e) s += RMS ? v[k][e] * v[k][e] : v[k][e];
    }
    A mean = 0, var;
    if (RMS) {
        var = rlx_group_sum<A, TPR>(s, red) / (A)n;
    } else {
        mean = rlx_group_sum<A, TPR>(s, red) / (A)n;
        A q = 0;
#pragma unroll
        for (int k = 0; k < CPT; ++k) {
            if (t + k * TPR < nc) {
#pragma unroll
                for (int e = 0; e < VEC; ++e) q += (v[k][e] - mean) * (v[k][e] - mean);
            }
        }
        var = rlx_group_sum<A, TPR>(q, red) / (A)n;
    }
    const A inv = (A)1 / sqrt(var + eps);
#pragma unroll
    for (int k = 0; k < CPT; ++k) {
        const int c = t + k * TPR;
        if (c >= nc) continue;
        int4 graw = reinterpret_cast<const int4 *>(gamma)[c];
        int4 braw = make_int4(0, 0, 0, 0);
        if (!RMS) braw = reinterpret_cast<const int4 *>(beta)[c];
        const T *ge = reinterpret_cast<const T *>(&graw);
        const T *be = reinterpret_cast<const T *>(&braw);
        int4 oraw;
        T *oe = reinterpret_cast<T *>(&oraw);
#pragma unroll
        for (int e = 0; e < VEC; ++e) {
            A y = (v[k][e] - mean) * inv * (A)rlx_f(ge[e]);
            if (!RMS) y += (A)rlx_f(be[e]);
            oe[e] = rlx_cvt<T>(y);
        }
        orow[c] = oraw;
    }
}

/* Softmax over contiguous rows of n elements. */
template <typename T, typename A, int TPR, int VPT>
__global__ void rlx_softmax_rows(const T *__restrict__ x, T *__restrict__ out, int64_t rows, int64_t n) {
    __shared__ A red[32];
    const int rpb = blockDim.x / TPR;
    const int64_t row = (int64_t)blockIdx.x * rpb + threadIdx.x / TPR;
    const int t = threadIdx.x % TPR;
    if (row >= rows) return;
    const T *xr = x + row * n;
    T *orow = out + row * n;
    if (VPT > 0) {
        A v[VPT > 0 ? VPT : 1];
        A m = -INFINITY;
#pragma unroll
        for (int k = 0; k < (VPT > 0 ? VPT : 1); ++k) {
            int64_t c = t + (int64_t)k * TPR;
            v[k] = c < n ? (A)rlx_f(xr[c]) : (A)(-INFINITY);
            m = rlx_max(m, v[k]);
        }
        m = rlx_group_max<A, TPR>(m, red);
        A s = 0;
#pragma unroll
        for (int k = 0; k < (VPT > 0 ? VPT : 1); ++k) {
            int64_t c = t + (int64_t)k * TPR;
            v[k] = c < n ? exp(v[k] - m) : (A)0;
            s += v[k];
        }
        s = rlx_group_sum<A, TPR>(s, red);
        const A inv = (A)1 / s;
#pragma unroll
        for (int k = 0; k < (VPT > 0 ? VPT : 1); ++k) {
            int64_t c = t + (int64_t)k * TPR;
            if (c < n) orow[c] = rlx_cvt<T>(v[k] * inv);
        }
    } else {
        A m = -INFINITY;
        for (int64_t c = t; c < n; c += TPR) m = rlx_max(m, (A)rlx_f(xr[c]));
        m = rlx_group_max<A, TPR>(m, red);
        A s = 0;
        for (int64_t c = t; c < n; c += TPR) s += exp((A)rlx_f(xr[c]) - m);
        s = rlx_group_sum<A, TPR>(s, red);
        const A inv = (A)1 / s;
        for (int64_t c = t; c < n; c += TPR) orow[c] = rlx_cvt<T>(exp((A)rlx_f(xr[c]) - m) * inv);
    }
}

/* Softmax along a middle axis: x viewed as [outer, n, inner], one thread per (outer, inner) column. */
template <typename T, typename A>
__global__ void rlx_softmax_cols(const T *__restrict__ x, T *__restrict__ out, int64_t outer, int64_t n,
                                 int64_t inner) {
    const int64_t cols = outer * inner;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < cols; i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t o = i / inner, c = i % inner;
        const T *xc = x + o * n * inner + c;
        T *oc = out + o * n * inner + c;
        A m = -INFINITY;
        for (int64_t k = 0; k < n; ++k) m = rlx_max(m, (A)rlx_f(xc[k * inner]));
        A s = 0;
        for (int64_t k = 0; k < n; ++k) s += exp((A)rlx_f(xc[k * inner]) - m);
        const A inv = (A)1 / s;
        for (int64_t k = 0; k < n; ++k) oc[k * inner] = rlx_cvt<T>(exp((A)rlx_f(xc[k * inner]) - m) * inv);
    }
}

/* Reductions. A accumulates (f64 for float inputs, i64 for integers); the result is rounded once. */
enum { RLX_RED_SUM = 0, RLX_RED_MEAN, RLX_RED_MAX, RLX_RED_MIN, RLX_RED_PROD };

template <typename T> struct rlx_red_acc { typedef int64_t type; };
template <> struct rlx_red_acc<float> { typedef double type; };
template <> struct rlx_red_acc<double> { typedef double type; };
template <> struct rlx_red_acc<__half> { typedef double type; };
template <> struct rlx_red_acc<rlx_bf16> { typedef double type; };

template <typename T> __device__ __forceinline__ typename rlx_red_acc<T>::type rlx_red_ld(T v) {
    return (typename rlx_red_acc<T>::type)v;
}
template <> __device__ __forceinline__ double rlx_red_ld<__half>(__half v) { return (double)__half2float(v); }
template <> __device__ __forceinline__ double rlx_red_ld<rlx_bf16>(rlx_bf16 v) { return (double)__bfloat162float(v); }

template <int FN, typename A> __device__ __forceinline__ A rlx_red_step(A acc, A v, bool first) {
    if (first) return v;
    switch (FN) {
    case RLX_RED_MAX: return rlx_max(acc, v);
    case RLX_RED_MIN: return rlx_min(acc, v);
    case RLX_RED_PROD: return acc * v;
    default: return acc + v;
    }
}

/* Kept dims (decomposing the output index) and reduced dims, each with its input stride. */
struct RlxRed {
    int kr, rr;
    int64_t kdim[RLX_MAX_RANK], kstride[RLX_MAX_RANK];
    int64_t rdim[RLX_MAX_RANK], rstride[RLX_MAX_RANK];
};

/* One thread per output element; neighbouring threads read neighbouring kept elements (coalesced when the
 * innermost kept dim is contiguous, e.g. mean over the sequence axis of [B, S, H]). */
template <typename T, int FN>
__global__ void rlx_reduce_generic(const T *__restrict__ x, T *__restrict__ out, RlxRed p, int64_t nout,
                                   int64_t nred) {
    typedef typename rlx_red_acc<T>::type A;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < nout; i += (int64_t)gridDim.x * blockDim.x) {
        int64_t rem = i, base = 0;
        for (int d = p.kr - 1; d >= 0; --d) {
            base += (rem % p.kdim[d]) * p.kstride[d];
            rem /= p.kdim[d];
        }
        A acc = (FN == RLX_RED_PROD) ? (A)1 : (A)0;
        for (int64_t r = 0; r < nred; ++r) {
            int64_t rr = r, off = base;
            for (int d = p.rr - 1; d >= 0; --d) {
                off += (rr % p.rdim[d]) * p.rstride[d];
                rr /= p.rdim[d];
            }
            acc = rlx_red_step<FN, A>(acc, rlx_red_ld<T>(x[off]), r == 0 && (FN == RLX_RED_MAX || FN == RLX_RED_MIN));
        }
        if (FN == RLX_RED_MEAN) acc = acc / (A)nred;
        out[i] = rlx_cvt<T>(acc);
    }
}

/* Reduction over trailing axes: contiguous rows of nred elements, TPR threads per row. */
template <typename T, int FN, int TPR>
__global__ void rlx_reduce_rows(const T *__restrict__ x, T *__restrict__ out, int64_t rows, int64_t nred) {
    rlx_pdl_trigger(); rlx_pdl_wait(); /* may start early (rlx_launch_pdl): wait before touching data */
    typedef typename rlx_red_acc<T>::type A;
    __shared__ A red[32];
    const int rpb = blockDim.x / TPR;
    const int64_t row = (int64_t)blockIdx.x * rpb + threadIdx.x / TPR;
    const int t = threadIdx.x % TPR;
    if (row >= rows) return;
    const T *xr = x + row * nred;
    A acc = (FN == RLX_RED_PROD) ? (A)1 : (A)0;
    bool any = false;
    for (int64_t c = t; c < nred; c += TPR) {
        acc = rlx_red_step<FN, A>(acc, rlx_red_ld<T>(xr[c]), !any && (FN == RLX_RED_MAX || FN == RLX_RED_MIN));
        any = true;
    }
    /* Combine the lanes: a lane that saw nothing contributes the identity (or is skipped for max/min). */
    for (int o = 16; o > 0; o >>= 1) {
        A other = __shfl_xor_sync(0xffffffffu, acc, o);
        bool oany = __shfl_xor_sync(0xffffffffu, (int)any, o);
        if (oany) acc = rlx_red_step<FN, A>(acc, other, !any);
        any = any || oany;
    }
    if (TPR > 32) {
        __shared__ int reda[32];
        const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
        if (lane == 0) { red[warp] = acc; reda[warp] = any; }
        __syncthreads();
        if (warp == 0) {
            any = lane < TPR / 32 ? reda[lane] != 0 : false;
            acc = any ? red[lane] : ((FN == RLX_RED_PROD) ? (A)1 : (A)0);
            for (int o = 16; o > 0; o >>= 1) {
                A other = __shfl_xor_sync(0xffffffffu, acc, o);
                bool oany = __shfl_xor_sync(0xffffffffu, (int)any, o);
                if (oany) acc = rlx_red_step<FN, A>(acc, other, !any);
                any = any || oany;
            }
        }
        if (warp != 0) return;
    }
    if (t == 0) {
        if (FN == RLX_RED_MEAN) acc = acc / (A)nred;
        out[row] = rlx_cvt<T>(acc);
    }
}

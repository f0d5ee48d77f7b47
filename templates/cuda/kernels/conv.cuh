/* Convolution and pooling on channels-first tensors (rlx/codegen/cuda/conv.py, templates/cuda/conv.cu.j2).
 *
 * rlx_conv_igemm: implicit GEMM, no im2col buffer. Per group, C[pixel, o] = sum_k A[pixel, k] * W[o, k] with
 * pixel = (n, oh, ow) over the batch and k = (c, kh, kw) (ONNX's weight order). A block computes a
 * 64 x 64 tile of C with 256 threads (4 x 4 each, f32 accumulators); each step stages a 16-deep slice of
 * A, gathered from x on the fly (zeros in the padding), and of W in shared memory. The epilogue adds the
 * bias, applies the activation and stores channels-first. 1-D convolutions are 2-D with H = KH = 1.
 * rlx_conv_direct: one thread per output value (depthwise convolutions: K = KH * KW is small).
 * rlx_pool2d: one thread per output value. */
#define RLX_CONV_BM 64
#define RLX_CONV_BN 64
#define RLX_CONV_BK 16
#define RLX_CONV_THREADS 256

struct rlx_conv_geom {
    int64_t C, H, W, OH, OW, KH, KW, SH, SW, DH, DW, PH, PW;
};

template <typename T>
__device__ __forceinline__ float rlx_conv_at(const T *__restrict__ xg, const rlx_conv_geom &g, int64_t n,
                                             int64_t groups, int64_t oh, int64_t ow, int64_t k) {
    const int64_t kw = k % g.KW, kh = k / g.KW % g.KH, c = k / (g.KW * g.KH);
    const int64_t ih = oh * g.SH - g.PH + kh * g.DH, iw = ow * g.SW - g.PW + kw * g.DW;
    if (ih < 0 || ih >= g.H || iw < 0 || iw >= g.W)
        return 0.0f;
    return rlx_f(xg[((n * groups * g.C + c) * g.H + ih) * g.W + iw]);
}

template <typename T, int ACT>
__global__ void __launch_bounds__(RLX_CONV_THREADS) rlx_conv_igemm(const T *__restrict__ x, const T *__restrict__ w,
        const T *__restrict__ bias, T *__restrict__ y, rlx_conv_geom g, int64_t batch, int64_t groups, int64_t og) {
    __shared__ float As[RLX_CONV_BK][RLX_CONV_BM];
    __shared__ float Bs[RLX_CONV_BK][RLX_CONV_BN + 1];
    const int64_t P = g.OH * g.OW, M = batch * P, K = g.C * g.KH * g.KW;
    const int64_t gi = blockIdx.z, m0 = (int64_t)blockIdx.x * RLX_CONV_BM, o0 = (int64_t)blockIdx.y * RLX_CONV_BN;
    const T *xg = x + gi * g.C * g.H * g.W;  /* this group's channels of image 0 */
    const T *wg = w + gi * og * K;
    const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;  /* 16 x 16 threads, 4 x 4 outputs each */
    float acc[4][4] = {};
    for (int64_t k0 = 0; k0 < K; k0 += RLX_CONV_BK) {
        for (int i = threadIdx.x; i < RLX_CONV_BK * RLX_CONV_BM; i += RLX_CONV_THREADS) {
            const int kk = i / RLX_CONV_BM, mm = i % RLX_CONV_BM;  /* consecutive threads: consecutive pixels */
            const int64_t m = m0 + mm, k = k0 + kk;
            float v = 0.0f;
            if (m < M && k < K) {
                const int64_t n = m / P, p = m % P;
                v = rlx_conv_at(xg, g, n, groups, p / g.OW, p % g.OW, k);
            }
            As[kk][mm] = v;
        }
        for (int i = threadIdx.x; i < RLX_CONV_BK * RLX_CONV_BN; i += RLX_CONV_THREADS) {
            const int oo = i / RLX_CONV_BK, kk = i % RLX_CONV_BK;  /* consecutive threads: consecutive k of a row */
            const int64_t o = o0 + oo, k = k0 + kk;
            Bs[kk][oo] = o < og && k < K ? rlx_f(wg[o * K + k]) : 0.0f;
        }
        __syncthreads();
        #pragma unroll
        for (int kk = 0; kk < RLX_CONV_BK; ++kk) {
            float a[4], b[4];
            #pragma unroll
            for (int i = 0; i < 4; ++i) {
                a[i] = As[kk][tx + 16 * i];
                b[i] = Bs[kk][ty + 16 * i];
            }
            #pragma unroll
            for (int i = 0; i < 4; ++i)
                #pragma unroll
                for (int j = 0; j < 4; ++j)
                    acc[i][j] = fmaf(a[i], b[j], acc[i][j]);
        }
        __syncthreads();
    }
    #pragma unroll
    for (int i = 0; i < 4; ++i) {
        const int64_t m = m0 + tx + 16 * i;
        if (m >= M)
            continue;
        const int64_t n = m / P, p = m % P;
        #pragma unroll
        for (int j = 0; j < 4; ++j) {
            const int64_t o = o0 + ty + 16 * j;
            if (o >= og)
                continue;
            const int64_t oc = gi * og + o;
            float v = acc[i][j] + (bias ? rlx_f(bias[oc]) : 0.0f);
            y[(n * groups * og + oc) * P + p] = rlx_to<T>(rlx_act<ACT>(v));
        }
    }
}

template <typename T, int ACT>
__global__ void rlx_conv_direct(const T *__restrict__ x, const T *__restrict__ w, const T *__restrict__ bias,
                                T *__restrict__ y, rlx_conv_geom g, int64_t batch, int64_t groups, int64_t og) {
    const int64_t P = g.OH * g.OW, O = groups * og, total = batch * O * P, K = g.C * g.KH * g.KW;
    for (int64_t idx = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; idx < total;
         idx += (int64_t)gridDim.x * blockDim.x) {
        const int64_t p = idx % P, oc = idx / P % O, n = idx / (P * O), gi = oc / og;
        const T *xg = x + gi * g.C * g.H * g.W;
        const T *wo = w + oc * K;
        float acc = bias ? rlx_f(bias[oc]) : 0.0f;
        for (int64_t k = 0; k < K; ++k)
            acc = fmaf(rlx_conv_at(xg, g, n, groups, p / g.OW, p % g.OW, k), rlx_f(wo[k]), acc);
        y[idx] = rlx_to<T>(rlx_act<ACT>(acc));
    }
}

/* Max (is_max) or average pooling; PEH / PEW are the end pads (count_pad: an average counts the cells
 * inside the input and its declared pads, else inside the input only). NaN propagates through a max. */
template <typename T>
__global__ void rlx_pool2d(const T *__restrict__ x, T *__restrict__ y, rlx_conv_geom g, int64_t planes,
                           int64_t PEH, int64_t PEW, int is_max, int count_pad) {
    const int64_t P = g.OH * g.OW, total = planes * P;
    for (int64_t idx = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; idx < total;
         idx += (int64_t)gridDim.x * blockDim.x) {
        const int64_t p = idx % P, pl = idx / P, oh = p / g.OW, ow = p % g.OW;
        const T *xp = x + pl * g.H * g.W;
        float acc = is_max ? -INFINITY : 0.0f;
        int64_t n = 0, npad = 0;
        for (int64_t kh = 0; kh < g.KH; ++kh) {
            const int64_t ih = oh * g.SH - g.PH + kh * g.DH;
            const bool in_h = ih >= 0 && ih < g.H, pad_h = ih >= -g.PH && ih < g.H + PEH;
            for (int64_t kw = 0; kw < g.KW; ++kw) {
                const int64_t iw = ow * g.SW - g.PW + kw * g.DW;
                if (pad_h && iw >= -g.PW && iw < g.W + PEW)
                    ++npad;
                if (!in_h || iw < 0 || iw >= g.W)
                    continue;
                const float v = rlx_f(xp[ih * g.W + iw]);
                ++n;
                if (is_max)
                    acc = (v > acc || v != v) && acc == acc ? v : acc;
                else
                    acc += v;
            }
        }
        y[idx] = rlx_to<T>(is_max ? acc : acc / (float)(count_pad ? npad : n));
    }
}

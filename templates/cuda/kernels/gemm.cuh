/* ── matrix products without a library, and the epilogues cuBLASLt cannot fuse ─────────────────────────── */

/* Batch dims of a product, with the stride (elements) each operand advances by; 0 = broadcast. */
struct RlxBatch {
    int rank;
    int64_t dim[RLX_MAX_RANK];
    int64_t as[RLX_MAX_RANK];
    int64_t bs[RLX_MAX_RANK];
};

/* C[b] = act(A[b] @ B[b] + bias): 64x64 output tiles, 256 threads each computing 4x4, K in steps of 16,
 * accumulating in f32 (f64 for f64). The fallback when cuBLASLt is unavailable or the batch broadcasts in a
 * way a strided batch cannot express. */
#define RLX_GT 64
#define RLX_GK 16
template <typename T, int ACT, bool BIAS>
__global__ void __launch_bounds__(256) rlx_gemm_tiled(const T *__restrict__ A, const T *__restrict__ B,
                                                       const T *__restrict__ bias, T *__restrict__ C, int64_t M,
                                                       int64_t N, int64_t K, int64_t nbatch, RlxBatch bt) {
    typedef typename rlx_acc<T>::type Acc;
    __shared__ Acc a_s[RLX_GK][RLX_GT + 1];
    __shared__ Acc b_s[RLX_GK][RLX_GT];
    const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
    const int64_t m0 = (int64_t)blockIdx.x * RLX_GT, n0 = (int64_t)blockIdx.y * RLX_GT;
    for (int64_t z = blockIdx.z; z < nbatch; z += gridDim.z) {
        int64_t rem = z, aoff = 0, boff = 0;
        for (int d = bt.rank - 1; d >= 0; --d) {
            int64_t r = rem % bt.dim[d];
            rem /= bt.dim[d];
            aoff += r * bt.as[d];
            boff += r * bt.bs[d];
        }
        const T *Ab = A + aoff;
        const T *Bb = B + boff;
        T *Cb = C + z * M * N;
        Acc acc[4][4];
#pragma unroll
        for (int i = 0; i < 4; ++i)
#pragma unroll
            for (int j = 0; j < 4; ++j) acc[i][j] = 0;
        for (int64_t k0 = 0; k0 < K; k0 += RLX_GK) {
            __syncthreads();
            for (int e = threadIdx.x; e < RLX_GT * RLX_GK; e += 256) {
                int mm = e / RLX_GK, kk = e % RLX_GK;
                int64_t gm = m0 + mm, gk = k0 + kk;
                a_s[kk][mm] = (gm < M && gk < K) ? (Acc)rlx_f(Ab[gm * K + gk]) : (Acc)0;
                int kb = e / RLX_GT, nn = e % RLX_GT;
                int64_t gk2 = k0 + kb, gn = n0 + nn;
                b_s[kb][nn] = (gk2 < K && gn < N) ? (Acc)rlx_f(Bb[gk2 * N + gn]) : (Acc)0;
            }
            __syncthreads();
#pragma unroll
            for (int kk = 0; kk < RLX_GK; ++kk) {
                Acc av[4], bv[4];
#pragma unroll
                for (int i = 0; i < 4; ++i) av[i] = a_s[kk][ty + 16 * i];
#pragma unroll
                for (int j = 0; j < 4; ++j) bv[j] = b_s[kk][tx + 16 * j];
#pragma unroll
                for (int i = 0; i < 4; ++i)
#pragma unroll
                    for (int j = 0; j < 4; ++j) acc[i][j] += av[i] * bv[j];
            }
        }
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            int64_t gm = m0 + ty + 16 * i;
            if (gm >= M) continue;
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                int64_t gn = n0 + tx + 16 * j;
                if (gn >= N) continue;
                Acc y = acc[i][j];
                if (BIAS) y += (Acc)rlx_f(bias[gn]);
                Cb[gm * N + gn] = rlx_cvt<T>(rlx_act<ACT>(y));
            }
        }
    }
}

/* In place: C = act(C [+ bias]) over rows of n; for activations no cuBLASLt epilogue computes. */
template <typename T, int ACT, bool BIAS>
__global__ void rlx_bias_act(T *__restrict__ c, const T *__restrict__ bias, int64_t total, int64_t n) {
    rlx_pdl_trigger(); rlx_pdl_wait(); /* may start early (rlx_launch_pdl): wait before touching data */
    typedef typename rlx_acc<T>::type Acc;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (int64_t)gridDim.x * blockDim.x) {
        Acc y = (Acc)rlx_f(c[i]);
        if (BIAS) y += (Acc)rlx_f(bias[i % n]);
        c[i] = rlx_cvt<T>(rlx_act<ACT>(y));
    }
}

/* The same, VEC elements (16 bytes) per access: total and n are multiples of VEC, pointers 16-byte aligned. */
template <typename T, int ACT, bool BIAS, int VEC>
__global__ void rlx_bias_act_vec(T *__restrict__ c, const T *__restrict__ bias, int64_t total, int64_t n) {
    rlx_pdl_trigger(); rlx_pdl_wait(); /* may start early (rlx_launch_pdl): wait before touching data */
    typedef typename rlx_acc<T>::type Acc;
    const int64_t nv = total / VEC;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < nv; i += (int64_t)gridDim.x * blockDim.x) {
        int4 raw = reinterpret_cast<int4 *>(c)[i];
        T *e = reinterpret_cast<T *>(&raw);
        int4 braw = make_int4(0, 0, 0, 0);
        if (BIAS) braw = reinterpret_cast<const int4 *>(bias)[(i % (n / VEC))];
        const T *be = reinterpret_cast<const T *>(&braw);
#pragma unroll
        for (int t = 0; t < VEC; ++t) {
            Acc y = (Acc)rlx_f(e[t]);
            if (BIAS) y += (Acc)rlx_f(be[t]);
            e[t] = rlx_cvt<T>(rlx_act<ACT>(y));
        }
        reinterpret_cast<int4 *>(c)[i] = raw;
    }
}

/* In place: gate = silu(gate) * up (the second half of fused_swiglu). */
template <typename T>
__global__ void rlx_swiglu_combine(T *__restrict__ gate, const T *__restrict__ up, int64_t total) {
    typedef typename rlx_acc<T>::type Acc;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (int64_t)gridDim.x * blockDim.x)
        gate[i] = rlx_cvt<T>(rlx_silu((Acc)rlx_f(gate[i])) * (Acc)rlx_f(up[i]));
}

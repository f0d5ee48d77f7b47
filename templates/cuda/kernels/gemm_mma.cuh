/* ── tensor-core GEMM with the bias and activation in its epilogue (f16 / bf16) ─────────────────────────
 * C[M,N] = act(A[M,K] B[K,N] + bias[N]): A and B row-major, f32 accumulation, the result rounded once.
 * For the products whose activation cuBLASLt cannot fuse (erf GELU, SiLU, ...): there, cuBLASLt writes C and a
 * second kernel reads and rewrites it for the activation; here the activation runs on the accumulators, so the
 * (often largest) tensor of a transformer layer crosses device memory once.
 * A block computes a BM x BN tile with WARPS_M x WARPS_N warps (each a (BM/WARPS_M) x (BN/WARPS_N) tile of
 * m16n8k16 mma.sync products, f32 accumulators in registers), K in steps of 32 through STAGES cp.async buffers
 * in shared memory; fragments come from ldmatrix (A as stored, B transposed). Rows are padded by 16 bytes so
 * the ldmatrix reads hit distinct banks. Needs K % 8 == 0, N % 8 == 0 and 16-byte aligned A, B and C (whole
 * 16-byte chunks); tails of M, N and K are zero-filled by cp.async. */

template <int BM, int BN, int WARPS_M, int WARPS_N> struct RlxGemmMma {
    static constexpr int BK = 32, STAGES = 3, THREADS = WARPS_M * WARPS_N * 32;
    static constexpr int WM = BM / WARPS_M, WN = BN / WARPS_N; /* one warp's tile */
    static constexpr int MT = WM / 16, NT = WN / 8;            /* its m16 and n8 fragments */
    static constexpr int LDA = BK + 8, LDB = BN + 8;           /* smem row lengths (elements) */
    static constexpr size_t a_bytes = (size_t)BM * LDA * 2, b_bytes = (size_t)BK * LDB * 2;
    static constexpr size_t stage_bytes = a_bytes + b_bytes;
    static constexpr size_t total = stage_bytes * STAGES;
    static constexpr int LDC = BN + 8; /* the output tile, staged in the same shared memory for 16-byte stores */
    static_assert(WM % 16 == 0 && WN % 16 == 0, "a warp tile is whole m16 fragments and pairs of n8 fragments");
    static_assert((size_t)BM * LDC * 2 <= total, "the staged output tile fits in the pipeline's buffers");
};

/* The m16n8k16 product and the f32 -> 2 x T packing, per element type. */
template <typename T> struct RlxGemmMmaOp;
template <> struct RlxGemmMmaOp<__half> {
    static __device__ __forceinline__ void mma(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                     "{%0,%1,%2,%3};\n"
                     : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    }
    static __device__ __forceinline__ uint32_t pack(float lo, float hi) {
        __half2 v = __floats2half2_rn(lo, hi);
        return *reinterpret_cast<uint32_t *>(&v);
    }
};
template <> struct RlxGemmMmaOp<rlx_bf16> {
    static __device__ __forceinline__ void mma(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                     "{%0,%1,%2,%3};\n"
                     : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    }
    static __device__ __forceinline__ uint32_t pack(float lo, float hi) {
        __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
        return *reinterpret_cast<uint32_t *>(&v);
    }
};

/* 16 bytes global -> shared, asynchronously; zero-filled (nothing read) when !full. */
__device__ __forceinline__ void rlx_gemm_cp16(void *smem, const void *gmem, bool full) {
    const uint32_t s = (uint32_t)__cvta_generic_to_shared(smem);
    const int n = full ? 16 : 0;
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem), "r"(n));
}

template <typename T, int ACT, bool BIAS, int BM, int BN, int WARPS_M, int WARPS_N>
__global__ void __launch_bounds__(WARPS_M * WARPS_N * 32) rlx_gemm_mma(const T *__restrict__ A,
                                                                      const T *__restrict__ B,
                                                                      const T *__restrict__ bias, T *__restrict__ C,
                                                                      int64_t M, int64_t N, int64_t K) {
    typedef RlxGemmMma<BM, BN, WARPS_M, WARPS_N> G;
    typedef RlxGemmMmaOp<T> OP;
    constexpr int BK = G::BK, STAGES = G::STAGES, THREADS = G::THREADS;
    extern __shared__ __align__(128) unsigned char rlx_smem_gemm[];
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int wm = warp / WARPS_N, wn = warp % WARPS_N;
    const int g = lane >> 2, tq = lane & 3;
    const int64_t m0 = (int64_t)blockIdx.y * BM, n0 = (int64_t)blockIdx.x * BN;
    const int ktiles = (int)((K + BK - 1) / BK);

    /* one stage: A rows [m0, m0 + BM) x k [k0, k0 + BK), B rows k [k0, k0 + BK) x [n0, n0 + BN) */
    auto load = [&](int stage, int kt) {
        T *a_s = reinterpret_cast<T *>(rlx_smem_gemm + stage * G::stage_bytes);
        T *b_s = reinterpret_cast<T *>(rlx_smem_gemm + stage * G::stage_bytes + G::a_bytes);
        const int64_t k0 = (int64_t)kt * BK;
#pragma unroll
        for (int e = tid; e < BM * (BK / 8); e += THREADS) {
            const int r = e / (BK / 8), c = (e % (BK / 8)) * 8;
            const bool ok = m0 + r < M && k0 + c < K;
            rlx_gemm_cp16(a_s + r * G::LDA + c, ok ? A + (m0 + r) * K + k0 + c : A, ok);
        }
#pragma unroll
        for (int e = tid; e < BK * (BN / 8); e += THREADS) {
            const int r = e / (BN / 8), c = (e % (BN / 8)) * 8;
            const bool ok = k0 + r < K && n0 + c < N;
            rlx_gemm_cp16(b_s + r * G::LDB + c, ok ? B + (k0 + r) * N + n0 + c : B, ok);
        }
    };

    float acc[G::MT][G::NT][4];
#pragma unroll
    for (int i = 0; i < G::MT; ++i)
#pragma unroll
        for (int j = 0; j < G::NT; ++j) acc[i][j][0] = acc[i][j][1] = acc[i][j][2] = acc[i][j][3] = 0.f;

#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) {
        if (s < ktiles) load(s, s);
        asm volatile("cp.async.commit_group;\n" ::);
    }
    for (int kt = 0; kt < ktiles; ++kt) {
        asm volatile("cp.async.wait_group %0;\n" ::"n"(STAGES - 2));
        __syncthreads(); /* tile kt has landed for every thread; the stage refilled below is no longer read */
        if (kt + STAGES - 1 < ktiles) load((kt + STAGES - 1) % STAGES, kt + STAGES - 1);
        asm volatile("cp.async.commit_group;\n" ::);
        const T *a_s = reinterpret_cast<const T *>(rlx_smem_gemm + (kt % STAGES) * G::stage_bytes);
        const T *b_s = reinterpret_cast<const T *>(rlx_smem_gemm + (kt % STAGES) * G::stage_bytes + G::a_bytes);
#pragma unroll
        for (int kk = 0; kk < BK; kk += 16) {
            uint32_t af[G::MT][4], bf[G::NT][2];
#pragma unroll
            for (int i = 0; i < G::MT; ++i) {
                /* lanes 0-15: rows 0-15 at k, lanes 16-31: rows 0-15 at k + 8 -> a0..a3 of the m16k16 fragment */
                const T *p = a_s + (wm * G::WM + i * 16 + (lane & 15)) * G::LDA + kk + (lane >> 4) * 8;
                const uint32_t addr = (uint32_t)__cvta_generic_to_shared(p);
                asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                             : "=r"(af[i][0]), "=r"(af[i][1]), "=r"(af[i][2]), "=r"(af[i][3])
                             : "r"(addr));
            }
#pragma unroll
            for (int j = 0; j < G::NT; j += 2) {
                /* lanes 0-15: k rows 0-15 at column n, lanes 16-31: at n + 8 -> (b0, b1) of two n8 fragments */
                const T *p = b_s + (kk + (lane & 15)) * G::LDB + wn * G::WN + j * 8 + (lane >> 4) * 8;
                const uint32_t addr = (uint32_t)__cvta_generic_to_shared(p);
                asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                             : "=r"(bf[j][0]), "=r"(bf[j][1]), "=r"(bf[j + 1][0]), "=r"(bf[j + 1][1])
                             : "r"(addr));
            }
#pragma unroll
            for (int i = 0; i < G::MT; ++i)
#pragma unroll
                for (int j = 0; j < G::NT; ++j) OP::mma(acc[i][j], af[i], bf[j][0], bf[j][1]);
        }
    }
    asm volatile("cp.async.wait_group 0;\n" ::);
    __syncthreads(); /* every warp is done with the stages: they now hold the output tile */

    /* epilogue: bias and activation on the accumulators into shared memory (conflict-free 32-bit writes), then
     * whole 16-byte chunks of output rows to C (coalesced) */
    T *c_s = reinterpret_cast<T *>(rlx_smem_gemm);
#pragma unroll
    for (int j = 0; j < G::NT; ++j) {
        const int cl = wn * G::WN + j * 8 + tq * 2;
        float b0 = 0.f, b1 = 0.f;
        if (BIAS && n0 + cl < N) { /* N % 8 == 0: cl + 1 is in range too */
            b0 = (float)rlx_f(bias[n0 + cl]);
            b1 = (float)rlx_f(bias[n0 + cl + 1]);
        }
#pragma unroll
        for (int i = 0; i < G::MT; ++i) {
            const int rl = wm * G::WM + i * 16 + g;
            *reinterpret_cast<uint32_t *>(c_s + rl * G::LDC + cl) =
                OP::pack(rlx_act<ACT>(acc[i][j][0] + b0), rlx_act<ACT>(acc[i][j][1] + b1));
            *reinterpret_cast<uint32_t *>(c_s + (rl + 8) * G::LDC + cl) =
                OP::pack(rlx_act<ACT>(acc[i][j][2] + b0), rlx_act<ACT>(acc[i][j][3] + b1));
        }
    }
    __syncthreads();
#pragma unroll
    for (int e = tid; e < BM * (BN / 8); e += THREADS) {
        const int r = e / (BN / 8), c = (e % (BN / 8)) * 8;
        if (m0 + r < M && n0 + c < N)
            *reinterpret_cast<int4 *>(C + (m0 + r) * N + n0 + c) = *reinterpret_cast<const int4 *>(c_s + r * G::LDC + c);
    }
}

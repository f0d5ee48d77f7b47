/* ── rlx_dgemv: the one-row decode GEMV over dense 16-bit weights (f16 / bf16; after quant.cuh) ─────────────────────
 * A float weight of an f16 / bf16 build sits in the params region as the matmul reads it, [K, N] row-major in the
 * compute type (`decoder_params` stores a GGUF [N, K] matrix transposed), and this kernel reads it so, with no copy:
 *   - the output columns are dealt in tiles of C = 8 L columns (L = 1 << lg lanes a weight row's piece: 16 bytes a
 *     lane, so a warp's load takes 32 / L rows of 16 L contiguous bytes each); every member's columns are tiled on
 *     their own, so a tile never straddles two members (Q / K / V); SwiGLU's tile reads the gate's and the up
 *     matrix's same columns;
 *   - K is split over the block's threads: thread row kr (KR = 512 / L of them) takes rows U kr .. U kr + U - 1 of
 *     every step of U KR rows (U = 4, SwiGLU 2 of each matrix), so a thread issues RLX_DGEMV_LOADS 16-byte loads a
 *     step, all before any product, and the next step's before this step's products (two steps' loads in flight);
 *   - x (normalized by the absorbed RMS norm) is staged once in shared memory as f32, read as one float4 (float2) a
 *     step; a weight value costs one conversion (bf16: a shift or a mask; f16: its cvt, HADD2.F32 on sm_80+) and one
 *     FMA; the thread sums of a column meet in shared memory and one warp adds them in thread-row order (the same
 *     order every run), then one lane applies the epilogue (rlx_qf_store: residual add or silu(gate) * up);
 *   - the first step's weights of the block's first tile are loaded before griddepcontrol.wait (weights are never
 *     written by a kernel), while the kernel before drains (prefetching more into L2 there measured slower:
 *     RLX_DGEMV_PF_STEPS);
 * The host picks lg (the tile width) per launch so that the tiles fill the wave of resident blocks.
 * K split over blocks too (SPLIT, S = gridDim.y > 1 splits): so that tiles may be wide (128..512 columns: 256 B..1 KB
 * of a weight row contiguous) while tiles x S still fill the wave, block (t, s) (grid.x = tiles: one tile a block)
 * sums rows [s KC, s KC + KC) of tile t (KC = rlx_dgemv_kchunk: whole steps, so loads stay aligned and x's float4
 * reads too; the last split may be short or empty) and writes the column sums, not the outputs, to the partials
 * [S][NP] (f32, the scratch region; NP = rlx_dgemv_pcols: every member's columns, SwiGLU's gate then up);
 * rlx_dgemv_reduce, launched right after, adds a column's S partials in split order (the same bits every run) and
 * applies the epilogue. The absorbed RMS norm needs all of x's squares: each block sums them over all of K (x is
 * L2-resident, 2 K bytes) and stages only its own rows. With S = 1 the host launches SPLIT = false: no partials, no
 * second kernel.
 * VEC: every member's N is a multiple of 8 (16-byte loads); else 8 2-byte loads a lane, columns clamped into the
 * member. K a multiple of 8. Dynamic shared memory: rlx_dgemv_smem floats (SPLIT: of KC rows). lg 0..6 (8..512
 * columns); with SPLIT and lg >= 4 (KR <= 32 thread rows) one thread, not a warp, adds a column's thread sums. */
#ifndef RLX_DGEMV_THREADS
#define RLX_DGEMV_THREADS 512
#endif
/* 16-byte loads a thread issues a step (U rows of each matrix) */
#define RLX_DGEMV_LOADS 4
/* blocks an SM holds: ptxas fits the kernel in 64 registers (sm_90, f16 / bf16, each epilogue, VEC, SPLIT or not:
   no spills; sm_80: the unsplit f16 SwiGLU and bf16 odd-N plain ones spill 8 bytes, the SPLIT SwiGLU of odd N 40,
   the SPLIT bf16 norm + Q/K/V 16), so 32 warps an SM, each thread with two steps' loads (128 bytes) in flight */
#ifndef RLX_DGEMV_MIN_BLOCKS
#define RLX_DGEMV_MIN_BLOCKS 2
#endif
/* steps of the block's weights prefetched into L2 before griddepcontrol.wait, after the first one loaded (32 KB a step
   a block). None: the bf16 8B decoder (one H200, decode tok/s, alternating processes) ran 231.4 / 231.4 with none,
   226.6 / 226.6 with 1 (the form before), 218.5 / 218.8 with 3: the loads of the kernel still running go first */
#ifndef RLX_DGEMV_PF_STEPS
#define RLX_DGEMV_PF_STEPS 0
#endif
/* a weight load: through the read-only data path (no kernel writes the params) */
#ifndef RLX_DGEMV_LDG
#define RLX_DGEMV_LDG(p) __ldg(p)
#endif

/* 8 weights (16 bytes of f16 or bf16 bits) as floats: bf16 a shift or a mask a value, f16 its conversion (exact) */
template <bool BF>
__device__ __forceinline__ void rlx_dgemv_cvt(const uint4 &q, float v[8]) {
    const uint32_t w[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
    for (int j = 0; j < 4; j++) {
        if (BF) {
            v[2 * j] = __uint_as_float(w[j] << 16);
            v[2 * j + 1] = __uint_as_float(w[j] & 0xFFFF0000u);
        } else {
            v[2 * j] = __half2float(__ushort_as_half((unsigned short)(w[j] & 0xFFFFu)));
            v[2 * j + 1] = __half2float(__ushort_as_half((unsigned short)(w[j] >> 16)));
        }
    }
}

/* A tile of C output columns: its member j, that member's weight (and the up matrix with SwiGLU), its N and first
   column. */
struct RlxDTile {
    const uint16_t *w, *u;
    int64_t n, c0;
    int j;
};

/* Tiles of member i's columns (0 past the members) */
__host__ __device__ __forceinline__ int rlx_dgemv_mtiles(const RlxQMembers &mem, int i, int C) {
    return i < mem.count ? (int)((mem.n[i] + C - 1) / C) : 0;
}

/* Every member's tiles (SwiGLU: the gate's) */
template <int EPI>
__host__ __device__ __forceinline__ int rlx_dgemv_tiles(const RlxQMembers &mem, int C) {
    if (EPI != 0)
        return rlx_dgemv_mtiles(mem, 0, C);
    return rlx_dgemv_mtiles(mem, 0, C) + rlx_dgemv_mtiles(mem, 1, C) + rlx_dgemv_mtiles(mem, 2, C) +
           rlx_dgemv_mtiles(mem, 3, C);
}

/* Tile t: the member by selects on the members' tile counts (constant indices only: see rlx_qf_member) */
template <int EPI>
__device__ __forceinline__ RlxDTile rlx_dgemv_tile(const RlxQMembers &mem, int t, int C) {
    RlxDTile tl;
    int j = 0;
    if (EPI == 0) {
        const int t0 = rlx_dgemv_mtiles(mem, 0, C), t1 = rlx_dgemv_mtiles(mem, 1, C), t2 = rlx_dgemv_mtiles(mem, 2, C);
        const bool b1 = mem.count > 1 && t >= t0;
        t -= b1 ? t0 : 0;
        const bool b2 = b1 && mem.count > 2 && t >= t1;
        t -= b2 ? t1 : 0;
        const bool b3 = b2 && mem.count > 3 && t >= t2;
        t -= b3 ? t2 : 0;
        j = b3 ? 3 : b2 ? 2 : b1 ? 1 : 0;
    }
    tl.j = j;
    tl.w = (const uint16_t *)rlx_qf_weights(mem, j);
    tl.u = EPI == 2 ? (const uint16_t *)mem.w[1] : tl.w;
    tl.n = rlx_qf_rows(mem, j);
    tl.c0 = (int64_t)t * C;
    return tl;
}

/* The tile's weights from row kb on (a K split's rows: the walk below then counts rows from its first) */
__device__ __forceinline__ RlxDTile rlx_dgemv_from(RlxDTile tl, int kb) {
    tl.w += (int64_t)kb * tl.n;
    tl.u += (int64_t)kb * tl.n;
    return tl;
}

/* The U rows k0 .. k0 + U - 1 of the tile's NM matrices at the lane's 8 columns (col: clamped into the member, so
   every load is in bounds; rows past K read as zeros), loads only. */
template <int NM, int U, bool VEC>
__device__ __forceinline__ void rlx_dgemv_load(uint4 q[NM * U], const RlxDTile &tl, int64_t col, int k0, int K) {
#pragma unroll
    for (int i = 0; i < U; i++) {
        const bool in = k0 + i < K;
        const int64_t row = (int64_t)(in ? k0 + i : 0) * tl.n;
#pragma unroll
        for (int m = 0; m < NM; m++) {
            const uint16_t *w = (m == 0 ? tl.w : tl.u) + row;
            uint4 v = {0u, 0u, 0u, 0u};
            if (VEC) {
                if (in)
                    v = RLX_DGEMV_LDG((const uint4 *)(w + col));
            } else if (in) {
                uint32_t h[8];
#pragma unroll
                for (int e = 0; e < 8; e++) {
                    const int64_t c = col + e < tl.n ? col + e : tl.n - 1;
                    h[e] = RLX_DGEMV_LDG(w + c);
                }
                v.x = h[0] | h[1] << 16;
                v.y = h[2] | h[3] << 16;
                v.z = h[4] | h[5] << 16;
                v.w = h[6] | h[7] << 16;
            }
            q[m * U + i] = v;
        }
    }
}

/* The same rows' 16-byte pieces into L2 (no registers held) */
template <int NM, int U>
__device__ __forceinline__ void rlx_dgemv_prefetch(const RlxDTile &tl, int64_t col, int k0, int K) {
#pragma unroll
    for (int i = 0; i < U; i++) {
        if (k0 + i < K) {
#pragma unroll
            for (int m = 0; m < NM; m++)
                RLX_Q_PREFETCH((m == 0 ? tl.w : tl.u) + (int64_t)(k0 + i) * tl.n + col);
        }
    }
}

/* Output columns of every member (SwiGLU: the gate's), and the columns of a split's partials (SwiGLU: gate, up) */
template <int EPI>
__host__ __device__ __forceinline__ int64_t rlx_dgemv_cols(const RlxQMembers &mem) {
    return EPI != 0 ? mem.n[0] : mem.n[0] + mem.n[1] + mem.n[2] + mem.n[3];
}

template <int EPI>
__host__ __device__ __forceinline__ int64_t rlx_dgemv_pcols(const RlxQMembers &mem) {
    return (EPI == 2 ? 2 : 1) * rlx_dgemv_cols<EPI>(mem);
}

/* Rows of K a split of `splits` takes: whole steps of lg's tile (the last split the rest, maybe none) */
__host__ __device__ __forceinline__ int64_t rlx_dgemv_kchunk(int64_t K, int lg, int nm, int splits) {
    const int64_t step = (RLX_DGEMV_LOADS / nm) * (RLX_DGEMV_THREADS >> lg), per = (K + splits - 1) / splits;
    return (per + step - 1) / step * step;
}

/* Dynamic shared memory (floats) for K and lg: x padded to whole steps, then the [KR][NM C + 1] thread sums */
__host__ __device__ __forceinline__ int64_t rlx_dgemv_smem(int64_t K, int lg, int nm) {
    const int64_t kr = RLX_DGEMV_THREADS >> lg, step = (RLX_DGEMV_LOADS / nm) * kr;
    return (K + step - 1) / step * step + kr * (nm * (8 << lg) + 1);
}

/* The host's launch choice (templates/cuda/dense.cu.j2) for `wave` resident blocks: for each tile width lg from lg_hi
 * down to lg_lo (widest first: 16 << lg contiguous bytes of a weight row a block's load takes), the splits s_lo..s_hi
 * (when chosen, s_lo < s_hi: none left without rows) whose tiles x splits fill the most of their waves (the fewest
 * among equals); the first width filling at least 4/5 of its waves, else the fullest. Returns the tiles; *lg and
 * *splits the choice. With s_lo = s_hi = 1 and lg 3..1 it is the choice of before the split. */
template <int EPI>
__host__ __device__ inline int64_t rlx_dgemv_plan(const RlxQMembers &mem, int64_t K, int64_t wave, int lg_hi,
                                                  int lg_lo, int s_lo, int s_hi, int *lg, int *splits) {
    constexpr int NM = EPI == 2 ? 2 : 1;
    int64_t tiles = 0;
    double best = -1.0;
    *lg = lg_lo;
    *splits = s_lo;
    for (int g = lg_hi; g >= lg_lo; g--) {
        const int64_t nt = rlx_dgemv_tiles<EPI>(mem, 8 << g);
        int gs = s_lo;
        double gf = -1.0;
        for (int s = s_lo; s <= s_hi; s++) {
            if (s_lo < s_hi && (int64_t)(s - 1) * rlx_dgemv_kchunk(K, g, NM, s) >= K)
                continue;
            const int64_t items = nt * s;
            const double fill = (double)items / (double)((items + wave - 1) / wave * wave);
            if (fill > gf + 1e-9) {
                gf = fill;
                gs = s;
            }
        }
        if (gf > best + 1e-9 || gf >= 0.8) {
            best = gf;
            *lg = g;
            *splits = gs;
            tiles = nt;
        }
        if (gf >= 0.8)
            break;
    }
    return tiles;
}

/* Column c of tile tl's sums (a; SwiGLU's up b): the output through the epilogue, or (SPLIT) the partials of split
   blockIdx.y */
template <typename T, int EPI, bool SPLIT>
__device__ __forceinline__ void rlx_dgemv_emit(const RlxQMembers &mem, const RlxDTile &tl, int c, float a, float b,
                                               const T *res, float *partials) {
    const int64_t n = tl.c0 + c;
    if (n >= tl.n)
        return;
    if (SPLIT) {
        const int64_t off = (tl.j > 0 ? mem.n[0] : 0) + (tl.j > 1 ? mem.n[1] : 0) + (tl.j > 2 ? mem.n[2] : 0);
        float *p = partials + blockIdx.y * rlx_dgemv_pcols<EPI>(mem);
        p[off + n] = a;
        if (EPI == 2)
            p[rlx_dgemv_cols<EPI>(mem) + n] = b;
    } else {
        rlx_qf_store<T, EPI>((T *)rlx_qf_out(mem, EPI == 0 ? tl.j : 0), n, a, b, res, n);
    }
}

/* SPLIT: gridDim.y = splits, the column sums into partials [splits][rlx_dgemv_pcols] (else the outputs) */
template <typename T, bool BF, bool NORM, int EPI, bool VEC, bool SPLIT>
__global__ void __launch_bounds__(RLX_DGEMV_THREADS, RLX_DGEMV_MIN_BLOCKS)
rlx_dgemv(const T *__restrict__ X, const T *__restrict__ gamma, float eps, const __grid_constant__ RlxQMembers mem,
          const T *res, int64_t K64, int lg, float *__restrict__ partials, int splits) {
    constexpr int NM = EPI == 2 ? 2 : 1;        /* matrices a tile reads: gate and up with SwiGLU */
    constexpr int U = RLX_DGEMV_LOADS / NM;     /* rows of each a thread reads a step */
    static_assert(U == 2 || U == 4, "a step's x is one float2 or float4");
    const int K = (int)K64, L = 1 << lg, C = 8 * L, KR = RLX_DGEMV_THREADS >> lg;
    const int tid = (int)threadIdx.x, lane = tid & 31, warp = tid >> 5, kr = tid >> lg, l = tid & (L - 1);
    /* this block's rows of K: kn from kb (all of K without SPLIT); the tile's weight pointers start at row kb, so the
       walk counts rows from 0 as without the split */
    const int kc = SPLIT ? (int)rlx_dgemv_kchunk(K, lg, NM, splits) : K, kb = SPLIT ? (int)blockIdx.y * kc : 0;
    const int kn = SPLIT ? (kb + kc < K ? kc : (K > kb ? K - kb : 0)) : K;
    const int step = U * KR, steps = (kn + step - 1) / step, kp = steps * step, PW = NM * C + 1;
    const int tiles = rlx_dgemv_tiles<EPI>(mem, C);
    RLX_DYNAMIC_SHARED(float4, rlx_dgemv_smem4);
    float *xs = (float *)rlx_dgemv_smem4; /* x's rows kb.., kp floats (zero past kn) */
    float *part = xs + kp;                /* [KR][PW] thread sums */
    __shared__ float red[RLX_DGEMV_THREADS / 32];
    int t = (int)blockIdx.x;
    RlxDTile tl = rlx_dgemv_tile<EPI>(mem, t < tiles ? t : 0, C);
    if (SPLIT)
        tl = rlx_dgemv_from(tl, kb);
    int64_t col = tl.c0 + 8 * l;
    col = col < tl.n ? col : (VEC ? tl.n - 8 : tl.n - 1);
    uint4 q[RLX_DGEMV_LOADS];
    if (t < tiles) {  /* the first step's weights while the kernel before drains (and RLX_DGEMV_PF_STEPS into L2) */
        rlx_dgemv_load<NM, U, VEC>(q, tl, col, U * kr, kn);
#pragma unroll
        for (int p = 1; p <= RLX_DGEMV_PF_STEPS; p++)
            rlx_dgemv_prefetch<NM, U>(tl, col, p * step + U * kr, kn);
    }
    rlx_pdl_wait();
    rlx_pdl_trigger(); /* the next kernel may launch and fetch its weights */
    {
        float ss = 0.0f;
        if (SPLIT && NORM) {  /* the norm's squares over all of K; only the block's own rows staged below */
            for (int k = 8 * tid; k < K; k += 8 * RLX_DGEMV_THREADS) {
                float v[8];
                rlx_load8(X + k, v);
#pragma unroll
                for (int e = 0; e < 8; e++)
                    ss = fmaf(v[e], v[e], ss);
            }
        }
        for (int k = 8 * tid; k < kp; k += 8 * RLX_DGEMV_THREADS) {
            float v[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
            if (k < kn)
                rlx_load8(X + kb + k, v);
#pragma unroll
            for (int e = 0; e < 8; e++) {
                if (NORM && !SPLIT)
                    ss = fmaf(v[e], v[e], ss);
                xs[k + e] = v[e];
            }
        }
        if (NORM) {
            ss = rlx_warp_sum(ss);
            if (lane == 0)
                red[warp] = ss;
            __syncthreads();
            float tot = 0.0f;
            for (int w = 0; w < RLX_DGEMV_THREADS / 32; w++)
                tot += red[w];
            const float scale = rsqrtf(tot / (float)K + eps);
            for (int k = 8 * tid; k < kn; k += 8 * RLX_DGEMV_THREADS) {  /* this thread's own values */
                float g[8];
                rlx_load8(gamma + kb + k, g);
#pragma unroll
                for (int e = 0; e < 8; e++)
                    xs[k + e] *= scale * g[e];
            }
        }
    }
    __syncthreads();
    /* (SPLIT: one tile a block, grid.x = tiles: no second tile's pointers to keep) */
    for (; t < tiles; t += SPLIT ? tiles : (int)gridDim.x) {
        if (!SPLIT && t != (int)blockIdx.x) {
            tl = rlx_dgemv_tile<EPI>(mem, t, C);
            col = tl.c0 + 8 * l;
            col = col < tl.n ? col : (VEC ? tl.n - 8 : tl.n - 1);
            rlx_dgemv_load<NM, U, VEC>(q, tl, col, U * kr, kn);
        }
        float acc[NM][8];
#pragma unroll
        for (int m = 0; m < NM; m++)
#pragma unroll
            for (int e = 0; e < 8; e++)
                acc[m][e] = 0.0f;
        for (int s = 0; s < steps; s++) {
            const int k0 = s * step + U * kr;
            uint4 nq[RLX_DGEMV_LOADS];
            const bool more = s + 1 < steps;
            if (more)  /* the next step's loads before this step's products */
                rlx_dgemv_load<NM, U, VEC>(nq, tl, col, k0 + step, kn);
            float xv[U];
            if constexpr (U == 4) {
                const float4 a = *(const float4 *)(xs + k0);
                xv[0] = a.x;
                xv[1] = a.y;
                xv[2] = a.z;
                xv[3] = a.w;
            } else {
                const float2 a = *(const float2 *)(xs + k0);
                xv[0] = a.x;
                xv[1] = a.y;
            }
#pragma unroll
            for (int i = 0; i < U; i++) {
#pragma unroll
                for (int m = 0; m < NM; m++) {
                    float v[8];
                    rlx_dgemv_cvt<BF>(q[m * U + i], v);
#pragma unroll
                    for (int e = 0; e < 8; e++)
                        acc[m][e] = fmaf(xv[i], v[e], acc[m][e]);
                }
            }
            if (more) {
#pragma unroll
                for (int i = 0; i < RLX_DGEMV_LOADS; i++)
                    q[i] = nq[i];
            }
        }
        /* column c of the tile: thread rows' sums in row order, one warp a column (SPLIT, lg >= 4: one thread) */
#pragma unroll
        for (int m = 0; m < NM; m++)
#pragma unroll
            for (int e = 0; e < 8; e++)
                part[kr * PW + m * C + 8 * l + e] = acc[m][e];
        __syncthreads();
        if (SPLIT && lg >= 4) {  /* (SPLIT only: the unsplit kernel's code stays as it was, no spills) */
            for (int c = tid; c < C; c += RLX_DGEMV_THREADS) {
                float a = 0.0f, b = 0.0f;
                for (int r = 0; r < KR; r++) {
                    a += part[r * PW + c];
                    if (EPI == 2)
                        b += part[r * PW + C + c];
                }
                rlx_dgemv_emit<T, EPI, SPLIT>(mem, tl, c, a, b, res, partials);
            }
        } else {
            for (int c = warp; c < C; c += RLX_DGEMV_THREADS / 32) {
                float a = 0.0f, b = 0.0f;
                for (int r = lane; r < KR; r += 32) {
                    a += part[r * PW + c];
                    if (EPI == 2)
                        b += part[r * PW + C + c];
                }
                a = rlx_warp_sum(a);
                if (EPI == 2)
                    b = rlx_warp_sum(b);
                if (lane == 0)
                    rlx_dgemv_emit<T, EPI, SPLIT>(mem, tl, c, a, b, res, partials);
            }
        }
        __syncthreads();
    }
}

/* rlx_dgemv with SPLIT, then this: output column i of every member (SwiGLU: the gate's) is its splits' partials
 * added in split order, then the epilogue (rlx_qf_store). One thread a column. */
#define RLX_DGEMV_REDUCE_THREADS 256
template <typename T, int EPI>
__global__ void __launch_bounds__(RLX_DGEMV_REDUCE_THREADS)
rlx_dgemv_reduce(const __grid_constant__ RlxQMembers mem, const T *res, const float *__restrict__ partials,
                 int splits) {
    rlx_pdl_wait();
    rlx_pdl_trigger();
    const int64_t cols = rlx_dgemv_cols<EPI>(mem), np = rlx_dgemv_pcols<EPI>(mem);
    for (int64_t i = (int64_t)blockIdx.x * RLX_DGEMV_REDUCE_THREADS + threadIdx.x; i < cols;
         i += (int64_t)gridDim.x * RLX_DGEMV_REDUCE_THREADS) {
        float a = 0.0f, b = 0.0f;
        for (int s = 0; s < splits; s++) {
            a += partials[s * np + i];
            if (EPI == 2)
                b += partials[s * np + cols + i];
        }
        int64_t n;
        const int j = rlx_qf_member<EPI>(mem, i, &n);  /* column i of the concatenated members: member j's n */
        rlx_qf_store<T, EPI>((T *)rlx_qf_out(mem, EPI == 0 ? j : 0), n, a, b, res, n);
    }
}

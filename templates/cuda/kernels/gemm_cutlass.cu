/* ── CUTLASS sm90 GEMM with bias + activation in its epilogue (a CUDA kernel unit) ────────────────────────
 * C[M,N] = act(A[M,K] B[K,N] + bias[N]) for f16 / bf16, A, B and C row-major, f32 accumulation, the result
 * rounded once. For the products whose activation cuBLASLt's epilogue cannot fuse (erf GELU, SiLU): there,
 * cuBLASLt writes C and a second kernel reads and rewrites it; here the activation runs on the accumulators of
 * a Hopper warp-specialized kernel (TMA loads, wgmma, the cooperative schedule: two consumer warpgroups share a
 * tile), so the tensor crosses device memory once.
 *
 * This file is compiled once per (element type, activation, tile) into a cached object (rlx/toolchain/cuda_units.py)
 * and linked into every program that uses it: CUTLASS's templates take tens of seconds to instantiate, which
 * a model build then pays once per machine and configuration. The program sees one plain C function per
 * configuration (declared in gemm_cutlass.cuh); nothing of CUTLASS crosses that boundary.
 *
 * Configuration (set by the builder on the command line):
 *   RLX_CUTLASS_DT   1 = f16 (cutlass::half_t), 2 = bf16 (cutlass::bfloat16_t)
 *   RLX_ACT_GELU, RLX_ACT_SILU  the ids of the activations this unit fuses, from templates/activations.toml
 *                    (rlx.toolchain.cuda_units.activation_defines: the table's ids, never a copy kept here)
 *   RLX_CUTLASS_ACT  the RLX_ACT_* id of the activation: RLX_ACT_GELU (erf form: rlx_gelu_erfc of gelu_erfc.cuh,
 *                    12 FP32 instructions and one ex2, within 5e-6 of the exact value), RLX_ACT_SILU
 *                    (thread::SiLu); 0 = bias only, and -DRLX_CUTLASS_GELU_LIBM=1 with RLX_ACT_GELU = CUTLASS's
 *                    thread::GELU (libm erff): both for measuring the epilogue's cost only (benchmarks/cutlass_gemm.py)
 *   RLX_CUTLASS_TILE_M  128 or 256: the tile's rows (below)
 *   RLX_CUTLASS_FN   the launcher's name (rlx_cutlass_gemm_<dt>_<act>_m<tile>)
 * It needs sm_90a (wgmma and the TMA multicast are arch-specific features).
 *
 * TMA needs 16-byte aligned base addresses and row strides: K and N multiples of 8 elements; M is free (the
 * last tile's rows are clipped by TMA). The caller checks this (cuda_cutlass.py at build time, and the
 * launcher again: a shape it cannot take is an error, never garbage). */

#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>

#include "cute/tensor.hpp"
#include "cutlass/cutlass.h"
#include "cutlass/epilogue/collective/collective_builder.hpp"
#include "cutlass/epilogue/fusion/operations.hpp"
#include "cutlass/epilogue/thread/activation.h"
#include "cutlass/gemm/collective/collective_builder.hpp"
#include "cutlass/gemm/device/gemm_universal_adapter.h"
#include "cutlass/gemm/kernel/gemm_universal.hpp"
#include "gelu_erfc.cuh"

#if !defined(RLX_CUTLASS_DT) || !defined(RLX_CUTLASS_ACT) || !defined(RLX_CUTLASS_TILE_M) || !defined(RLX_CUTLASS_FN)
#error "gemm_cutlass.cu is compiled with -DRLX_CUTLASS_DT=, _ACT=, _TILE_M= and _FN= (a kernel unit)"
#endif
#if !defined(RLX_ACT_GELU) || !defined(RLX_ACT_SILU)
#error "gemm_cutlass.cu is compiled with -DRLX_ACT_GELU= and -DRLX_ACT_SILU= (the ids of templates/activations.toml)"
#endif

namespace rlx_cutlass {

using namespace cute;

#if RLX_CUTLASS_DT == 1
using Element = cutlass::half_t;
#elif RLX_CUTLASS_DT == 2
using Element = cutlass::bfloat16_t;
#else
#error "RLX_CUTLASS_DT: 1 (f16) or 2 (bf16)"
#endif

/* The erf GELU on the epilogue's f32 fragments (CUTLASS instantiates the functor for float and for
 * Array<float, N>). CUTLASS's own thread::GELU calls erff: ~25 instructions more per element, and the epilogue
 * of this schedule does not overlap the MMAs, so at K = 384 it cost a third of the kernel (docs/perf-h100.md). */
template <class T> struct GeluErfc;
template <> struct GeluErfc<float> {
    static const bool kIsHeavy = true;
    CUTLASS_HOST_DEVICE float operator()(float const &x) const { return rlx_gelu_erfc(x); }
};
template <int N> struct GeluErfc<cutlass::Array<float, N>> {
    static const bool kIsHeavy = true;
    CUTLASS_HOST_DEVICE cutlass::Array<float, N> operator()(cutlass::Array<float, N> const &x) const {
        cutlass::Array<float, N> y;
        CUTLASS_PRAGMA_UNROLL
        for (int i = 0; i < N; ++i) y[i] = rlx_gelu_erfc(x[i]);
        return y;
    }
};

/* The activation, by its RLX_ACT_* id (applied to the f32 value acc + bias). */
#if RLX_CUTLASS_ACT == 0 /* none (bias only): not called by programs; for measuring the epilogue's cost */
template <class T> using Act = cutlass::epilogue::thread::Identity<T>;
#elif RLX_CUTLASS_ACT == RLX_ACT_GELU && defined(RLX_CUTLASS_GELU_LIBM) /* measuring only: the libm erff form */
template <class T> using Act = cutlass::epilogue::thread::GELU<T>;
#elif RLX_CUTLASS_ACT == RLX_ACT_GELU
template <class T> using Act = GeluErfc<T>;
#elif RLX_CUTLASS_ACT == RLX_ACT_SILU
template <class T> using Act = cutlass::epilogue::thread::SiLu<T>;
#else
#error "RLX_CUTLASS_ACT: RLX_ACT_GELU (erf form), RLX_ACT_SILU or 0 (none)"
#endif

using LayoutA = cutlass::layout::RowMajor; /* A[M,K]: K contiguous */
using LayoutB = cutlass::layout::RowMajor; /* B[K,N]: N contiguous (wgmma reads it MN-major) */
using LayoutD = cutlass::layout::RowMajor; /* C[M,N] */
constexpr int kAlign = 128 / cutlass::sizeof_bits<Element>::value; /* 8 elements: one 16-byte TMA unit */
using Accum = float;

/* The tile (RLX_CUTLASS_TILE_M: 128 or 256 rows by 128 columns, 64 deep), both on the cooperative schedule
 * (two consumer warpgroups split the tile) with clusters of two CTAs along N that share the A tile by TMA
 * multicast. Measured on an H100 (docs/perf-h100.md), bias + erf GELU at N = 1536, K = 384: 256 x 128 is 10%
 * faster at M = 16384 (64.0-64.4 vs 70.7-71.2 us in two runs) but slower at M = 1024 (13.4-13.5 vs
 * 10.1-12.8 us: too few tiles for 132 SMs), so the program calls the 256-row one only when its tiles cover
 * the GPU twice (gemm_call in ops.cu.j2). The ping-pong schedule (128 x 128, 64 x 128, 128 x 64 tiles) was
 * slower at both sizes. */
#if RLX_CUTLASS_TILE_M == 128
using TileShape = Shape<_128, _128, _64>;
#elif RLX_CUTLASS_TILE_M == 256
using TileShape = Shape<_256, _128, _64>;
#else
#error "RLX_CUTLASS_TILE_M: 128 or 256"
#endif
using ClusterShape = Shape<_1, _2, _1>;
using KernelSchedule = cutlass::gemm::KernelTmaWarpSpecializedCooperative;
using EpilogueSchedule = cutlass::epilogue::TmaWarpSpecializedCooperative;

/* D = act(1 * acc + bias[n]); no C operand is read (ElementC void). */
using Fusion = cutlass::epilogue::fusion::LinCombPerColBiasEltAct<Act, Element, Accum, Element, Element, Accum>;

using CollectiveEpilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
    cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
    cutlass::epilogue::collective::EpilogueTileAuto, Accum, Accum, void, LayoutD, kAlign, Element, LayoutD, kAlign,
    EpilogueSchedule, Fusion>::CollectiveOp;

using CollectiveMainloop = typename cutlass::gemm::collective::CollectiveBuilder<
    cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, Element, LayoutA, kAlign, Element, LayoutB, kAlign, Accum,
    TileShape, ClusterShape,
    cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(
        sizeof(typename CollectiveEpilogue::SharedStorage))>,
    KernelSchedule>::CollectiveOp;

using Kernel = cutlass::gemm::kernel::GemmUniversal<Shape<int, int, int, int>, CollectiveMainloop, CollectiveEpilogue>;
using Gemm = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;

}  // namespace rlx_cutlass

#define RLX_CUTLASS_STR2(x) #x
#define RLX_CUTLASS_STR(x) RLX_CUTLASS_STR2(x)

/* The launcher (hidden: linked into one model.so, never exported from it): 0 on success; otherwise nonzero
 * with a message in err. Enqueues on `stream` only (capturable in a CUDA Graph: the TMA descriptors travel in
 * the kernel's parameters). `workspace` (may be NULL when `workspace_bytes` is 0) must hold what the kernel
 * asks for (this configuration's tile scheduler asks for little or nothing; checked here). */
extern "C" int RLX_CUTLASS_FN(const void *A, const void *B, const void *bias, void *C, long long M, long long N,
                              long long K, void *workspace, size_t workspace_bytes, cudaStream_t stream, char *err,
                              size_t err_len) {
    using namespace rlx_cutlass;
    auto fail = [&](const char *what) {
        if (err && err_len)
            snprintf(err, err_len, "CUTLASS GEMM %s: %s (M=%lld N=%lld K=%lld)", RLX_CUTLASS_STR(RLX_CUTLASS_FN),
                     what, M, N, K);
        return 1;
    };
    if (M <= 0 || N <= 0 || K <= 0) return fail("empty product (the caller handles M, N or K == 0)");
    if (N % kAlign || K % kAlign) return fail("N and K must be multiples of 8 (16-byte TMA rows)");
    if (((uintptr_t)A | (uintptr_t)B | (uintptr_t)C) % 16 || (uintptr_t)bias % 16)
        return fail("A, B, C and the bias must be 16-byte aligned");
    if (M > INT32_MAX || N > INT32_MAX || K > INT32_MAX) return fail("a dimension exceeds 2^31 - 1");
    const int m = (int)M, n = (int)N, k = (int)K;
    /* packed strides (M, K, L), (N, K, L), (M, N, L) as CUTLASS names them; the unit-stride modes are static */
    typename Kernel::StrideA sA{};
    typename Kernel::StrideB sB{};
    typename Kernel::StrideD sD{};
    get<0>(sA) = K;   /* A[m, k] at m * K + k */
    get<2>(sA) = M * K;
    get<1>(sB) = N;   /* B[k, n] at k * N + n */
    get<2>(sB) = K * N;
    get<0>(sD) = N;   /* C[m, n] at m * N + n */
    get<2>(sD) = M * N;
    typename Gemm::Arguments args{cutlass::gemm::GemmUniversalMode::kGemm,
                                  {m, n, k, 1},
                                  {static_cast<const Element *>(A), sA, static_cast<const Element *>(B), sB},
                                  {{}, nullptr, sD, static_cast<Element *>(C), sD}};
    args.epilogue.thread.alpha = 1.0f;
    args.epilogue.thread.beta = 0.0f;
    args.epilogue.thread.bias_ptr = static_cast<const Element *>(bias); /* NULL: no bias (adds 0) */
    Gemm gemm;
    if (gemm.can_implement(args) != cutlass::Status::kSuccess) return fail("CUTLASS cannot implement this shape");
    if (Gemm::get_workspace_size(args) > workspace_bytes) return fail("the workspace is too small");
    if (gemm.initialize(args, workspace, stream) != cutlass::Status::kSuccess) return fail("initialize failed");
    if (gemm.run(stream) != cutlass::Status::kSuccess) return fail("the launch failed");
    return 0;
}

/* ── the CUTLASS sm90 GEMMs (kernels/gemm_cutlass.cu, a kernel unit compiled once per configuration) ──────
 * C[M,N] = act(A[M,K] B[K,N] + bias[N]), row-major, f32 accumulation, bias and activation in the epilogue of a
 * TMA + wgmma warp-specialized kernel. One plain C launcher per (element type, activation); the build links the
 * objects of the ones this program calls (rlx/toolchain/cuda_units.py). Two tiles each: 128 x 128 (_m128) and
 * 256 x 128 (_m256, for grids that cover the GPU twice). Each returns 0, or nonzero with the
 * reason in `err`. Needs N and K multiples of 8 and 16-byte aligned operands (checked again at run time). */
#define RLX_CUTLASS_DECL(cfg)                                                                                   \
    extern "C" int rlx_cutlass_gemm_##cfg(const void *A, const void *B, const void *bias, void *C, long long M, \
                                          long long N, long long K, void *workspace, size_t workspace_bytes,    \
                                          cudaStream_t stream, char *err, size_t err_len)
RLX_CUTLASS_DECL(f16_gelu_m128);
RLX_CUTLASS_DECL(f16_gelu_m256);
RLX_CUTLASS_DECL(f16_silu_m128);
RLX_CUTLASS_DECL(f16_silu_m256);
RLX_CUTLASS_DECL(bf16_gelu_m128);
RLX_CUTLASS_DECL(bf16_gelu_m256);
RLX_CUTLASS_DECL(bf16_silu_m128);
RLX_CUTLASS_DECL(bf16_silu_m256);
#undef RLX_CUTLASS_DECL

/* ── GEMM through cuBLASLt ────────────────────────────────────────────────
 * Row-major C[M,N] = A[M,K] B[K,N] is column-major C^T = B^T A^T, so cuBLASLt sees (m, n, k) = (N, M, K) with
 * our B as its first operand; a bias of length N is then a per-row vector of C^T, which is what the BIAS
 * epilogues add. f16/bf16 multiply with f32 accumulation (CUBLAS_COMPUTE_32F); f32 stays exact f32 (no TF32),
 * matching PyTorch's default. Descriptors are built per call: the run is captured once per set of dynamic
 * dims, so this host work happens only while capturing. The GEMM runs on the caller's `stream` (a
 * conditional node's body is captured on a side stream). */
static int rlx_lt_matmul_ex(RlxCtx *c, cudaDataType_t dt, int64_t M, int64_t N, int64_t K, int64_t batch, int64_t sa,
                            int64_t sb, int64_t sc, const void *A, const void *B, void *C, const void *bias, int act,
                            const void *addend, cudaStream_t stream, const char *what) {
    cublasLtMatmulDesc_t op = NULL;
    cublasLtMatrixLayout_t la = NULL, lb = NULL, lc = NULL;
    cublasLtMatmulPreference_t pref = NULL;
    cublasLtMatmulHeuristicResult_t heur;
    int found = 0, rc = RLX_ECUDA;
    const float one = 1.0f, zero = 0.0f;
    /* addend (a [M, N] matrix of dt, or NULL): C = A B + addend, cuBLASLt's C operand with beta = 1 */
    const float *beta = addend ? &one : &zero;
    const void *cin = addend ? addend : C;
    const cublasOperation_t tn = CUBLAS_OP_N;
    cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_DEFAULT;
    if (act == RLX_ACT_RELU) epi = bias ? CUBLASLT_EPILOGUE_RELU_BIAS : CUBLASLT_EPILOGUE_RELU;
    else if (act == RLX_ACT_GELU_TANH) epi = bias ? CUBLASLT_EPILOGUE_GELU_BIAS : CUBLASLT_EPILOGUE_GELU;
    else if (bias) epi = CUBLASLT_EPILOGUE_BIAS;
    const size_t ws = (size_t)RLX_LT_WORKSPACE;
    cublasStatus_t st;
#define RLX_LT(call)                                                                                     \
    do {                                                                                                 \
        st = (call);                                                                                     \
        if (st != CUBLAS_STATUS_SUCCESS) {                                                               \
            rlx_set_error(c, "%s: cuBLASLt %s failed with status %d (M=%lld N=%lld K=%lld batch=%lld)", what, \
                          #call, (int)st, (long long)M, (long long)N, (long long)K, (long long)batch);  \
            goto done;                                                                                   \
        }                                                                                                \
    } while (0)
    RLX_LT(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    RLX_LT(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &tn, sizeof(tn)));
    RLX_LT(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &tn, sizeof(tn)));
    RLX_LT(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof(epi)));
    if (bias) RLX_LT(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias)));
    RLX_LT(cublasLtMatrixLayoutCreate(&la, dt, (uint64_t)N, (uint64_t)K, N));
    RLX_LT(cublasLtMatrixLayoutCreate(&lb, dt, (uint64_t)K, (uint64_t)M, K));
    RLX_LT(cublasLtMatrixLayoutCreate(&lc, dt, (uint64_t)N, (uint64_t)M, N));
    if (batch > 1) {
        const int32_t bc = (int32_t)batch;
        RLX_LT(cublasLtMatrixLayoutSetAttribute(la, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &bc, sizeof(bc)));
        RLX_LT(cublasLtMatrixLayoutSetAttribute(lb, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &bc, sizeof(bc)));
        RLX_LT(cublasLtMatrixLayoutSetAttribute(lc, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &bc, sizeof(bc)));
        RLX_LT(cublasLtMatrixLayoutSetAttribute(la, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &sb, sizeof(sb)));
        RLX_LT(cublasLtMatrixLayoutSetAttribute(lb, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &sa, sizeof(sa)));
        RLX_LT(cublasLtMatrixLayoutSetAttribute(lc, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &sc, sizeof(sc)));
    }
    RLX_LT(cublasLtMatmulPreferenceCreate(&pref));
    RLX_LT(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)));
    RLX_LT(cublasLtMatmulAlgoGetHeuristic(c->lt, op, la, lb, lc, lc, pref, 1, &heur, &found));
    if (found < 1) {
        rlx_set_error(c, "%s: cuBLASLt found no algorithm (M=%lld N=%lld K=%lld batch=%lld)", what, (long long)M,
                      (long long)N, (long long)K, (long long)batch);
        goto done;
    }
    RLX_LT(cublasLtMatmul(c->lt, op, &one, B, la, A, lb, beta, cin, lc, C, lc, &heur.algo,
                          c->dev + RLX_OFF_WORKSPACE, ws, stream));
    rc = 0;
done:
#undef RLX_LT
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    if (lc) cublasLtMatrixLayoutDestroy(lc);
    if (lb) cublasLtMatrixLayoutDestroy(lb);
    if (la) cublasLtMatrixLayoutDestroy(la);
    if (op) cublasLtMatmulDescDestroy(op);
    return rc;
}

static int rlx_lt_matmul(RlxCtx *c, cudaDataType_t dt, int64_t M, int64_t N, int64_t K, int64_t batch, int64_t sa,
                         int64_t sb, int64_t sc, const void *A, const void *B, void *C, const void *bias, int act,
                         cudaStream_t stream, const char *what) {
    return rlx_lt_matmul_ex(c, dt, M, N, K, batch, sa, sb, sc, A, B, C, bias, act, NULL, stream, what);
}

/* C[M,N] = A[M,K] B[K,N] + addend[M,N] (one GEMM, no bias or activation). */
static int rlx_lt_matmul_add(RlxCtx *c, cudaDataType_t dt, int64_t M, int64_t N, int64_t K, const void *A,
                             const void *B, const void *addend, void *C, cudaStream_t stream, const char *what) {
    return rlx_lt_matmul_ex(c, dt, M, N, K, 1, 0, 0, M * N, A, B, C, NULL, RLX_ACT_NONE, addend, stream, what);
}

/* ── control flow: cond and while_loop on the device predicate (rlx/codegen/cuda/control.py) ─────────────── */

/* Under CUDA Graph capture a cond's branches and a while_loop's body are the bodies of conditional graph nodes
 * (CUDA 12.3+: IF and WHILE nodes), whose handles the one-thread kernels below set from the predicate the graph
 * computed, so a replay runs only the taken branch, or the body while the predicate holds, with no host round
 * trip. An eager run reads the predicate back through pinned memory and branches on the host instead. */
#if defined(CUDART_VERSION) && CUDART_VERSION >= 12030
#define RLX_CTRL_GRAPHS 1
#else
#define RLX_CTRL_GRAPHS 0
#endif

/* A loop's carry moves from the body's output slot to the buffer the next trip reads: a kernel, not a memcpy,
 * so the body graph of a WHILE node holds kernel nodes only. 16-byte words when both ends allow them. */
__global__ void rlx_ctrl_copy(char *__restrict__ dst, const char *__restrict__ src, int64_t nbytes) {
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    const int64_t first = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (((uintptr_t)dst | (uintptr_t)src | (uintptr_t)nbytes) % 16 == 0) {
        for (int64_t i = first; i < nbytes / 16; i += stride)
            reinterpret_cast<uint4 *>(dst)[i] = reinterpret_cast<const uint4 *>(src)[i];
    } else {
        for (int64_t i = first; i < nbytes; i += stride) dst[i] = src[i];
    }
}

/* An empty kernel after a conditional node: the next kernel of the program may be launched with programmatic
 * dependent launch, whose edge must come from a kernel node. */
__global__ void rlx_ctrl_join(void) {}

#if RLX_CTRL_GRAPHS
/* A cond's two IF nodes: the first runs the true branch, the second the false one. */
__global__ void rlx_ctrl_set_if(cudaGraphConditionalHandle on_true, cudaGraphConditionalHandle on_false,
                                const unsigned char *pred) {
    const unsigned taken = *pred != 0;
    cudaGraphSetConditional(on_true, taken);
    cudaGraphSetConditional(on_false, 1u - taken);
}

/* A WHILE node's handle: one more trip while the predicate holds and fewer than max_trips (< 0: no bound) ran;
 * `trips` counts the trips started. `first`: before the loop (the count starts at zero). */
__global__ void rlx_ctrl_set_while(cudaGraphConditionalHandle handle, const unsigned char *pred, int64_t *trips,
                                   int64_t max_trips, int first) {
    const int64_t done = first ? 0 : *trips;
    const unsigned go = *pred != 0 && (max_trips < 0 || done < max_trips);
    *trips = done + (int64_t)go;
    cudaGraphSetConditional(handle, go);
}

/* The graph `st` is capturing into, and the nodes its next node depends on. */
static cudaError_t rlx_ctrl_capture_info(cudaStream_t st, cudaGraph_t *graph, const cudaGraphNode_t **deps,
                                         size_t *ndeps) {
    cudaStreamCaptureStatus status;
#if CUDART_VERSION >= 13000
    cudaError_t e = cudaStreamGetCaptureInfo(st, &status, NULL, graph, deps, NULL, ndeps);
#else
    cudaError_t e = cudaStreamGetCaptureInfo(st, &status, NULL, graph, deps, ndeps);
#endif
    if (e == cudaSuccess && status != cudaStreamCaptureStatusActive) e = cudaErrorStreamCaptureInvalidated;
    return e;
}

/* Appends a conditional node of `type` (one body graph) after what `st` captured so far, and makes it the stream's
 * dependency: the next work captured on `st` runs after it. The node's body graph is returned in `body`. */
static cudaError_t rlx_ctrl_add_node(cudaStream_t st, cudaGraphConditionalHandle handle,
                                     cudaGraphConditionalNodeType type, cudaGraph_t *body) {
    cudaGraph_t graph;
    const cudaGraphNode_t *deps = NULL;
    size_t ndeps = 0;
    cudaError_t e = rlx_ctrl_capture_info(st, &graph, &deps, &ndeps);
    if (e != cudaSuccess) return e;
    cudaGraphNodeParams params = {cudaGraphNodeTypeConditional};  /* the rest zero (the union has no default constructor) */
    params.conditional.handle = handle;
    params.conditional.type = type;
    params.conditional.size = 1;
    cudaGraphNode_t node;
#if CUDART_VERSION >= 13000
    e = cudaGraphAddNode(&node, graph, deps, NULL, ndeps, &params);
    if (e == cudaSuccess) e = cudaStreamUpdateCaptureDependencies(st, &node, NULL, 1, cudaStreamSetCaptureDependencies);
#else
    e = cudaGraphAddNode(&node, graph, deps, ndeps, &params);
    if (e == cudaSuccess) e = cudaStreamUpdateCaptureDependencies(st, &node, 1, cudaStreamSetCaptureDependencies);
#endif
    if (e == cudaSuccess) *body = params.conditional.phGraph_out[0];
    return e;
}

/* A cond under capture: a kernel sets two handles from *pred, then two IF nodes; bodies[0] (the true branch) and
 * bodies[1] (the false branch) are captured into by the caller. */
static cudaError_t rlx_ctrl_if_nodes(cudaStream_t st, const unsigned char *pred, cudaGraph_t bodies[2]) {
    cudaGraph_t graph;
    const cudaGraphNode_t *deps = NULL;
    size_t ndeps = 0;
    cudaError_t e = rlx_ctrl_capture_info(st, &graph, &deps, &ndeps);
    cudaGraphConditionalHandle h[2];
    for (int i = 0; i < 2 && e == cudaSuccess; ++i) e = cudaGraphConditionalHandleCreate(&h[i], graph, 0, 0);
    if (e != cudaSuccess) return e;
    rlx_ctrl_set_if<<<1, 1, 0, st>>>(h[0], h[1], pred);
    e = cudaGetLastError();
    for (int i = 0; i < 2 && e == cudaSuccess; ++i) e = rlx_ctrl_add_node(st, h[i], cudaGraphCondTypeIf, &bodies[i]);
    return e;
}

/* A while_loop under capture: a kernel sets the handle from *pred (the cond body ran before), then the WHILE node;
 * the caller captures into *body the trip (body, carry copy, cond body) and `rlx_ctrl_set_while(..., 0)`. */
static cudaError_t rlx_ctrl_while_node(cudaStream_t st, const unsigned char *pred, int64_t *trips, int64_t max_trips,
                                       cudaGraphConditionalHandle *handle, cudaGraph_t *body) {
    cudaGraph_t graph;
    const cudaGraphNode_t *deps = NULL;
    size_t ndeps = 0;
    cudaError_t e = rlx_ctrl_capture_info(st, &graph, &deps, &ndeps);
    if (e == cudaSuccess) e = cudaGraphConditionalHandleCreate(handle, graph, 0, 0);
    if (e != cudaSuccess) return e;
    rlx_ctrl_set_while<<<1, 1, 0, st>>>(*handle, pred, trips, max_trips, 1);
    e = cudaGetLastError();
    if (e == cudaSuccess) e = rlx_ctrl_add_node(st, *handle, cudaGraphCondTypeWhile, body);
    return e;
}
#endif

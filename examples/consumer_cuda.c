/* consumer_cuda.c: run a CUDA RLX artifact from plain C, without Python (the model of examples/mlp.py).
 *
 *   rlxc compile mlp.json -o ART --target cuda --weights mlp.safetensors
 *   cc -O2 -o consumer_cuda examples/consumer_cuda.c -I ART -L ART -l:model.so -Wl,-rpath,"$PWD/ART"
 *   ./consumer_cuda ART x.npy
 *
 * A CUDA artifact's model.so speaks the same C ABI as a CPU one (rlx.h): rlx_run takes host buffers
 * and copies them in and out. rlx_cuda.h adds rlx_run_device, which reads and writes device memory
 * (here allocated with rlx_cuda_malloc; a program with its own CUDA code passes its own pointers).
 * This program runs one batch both ways, checks that they agree bit for bit, and prints y.
 * No CUDA headers or libraries are needed to build it: model.so carries the CUDA runtime. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rlx.h"
#include "rlx_cuda.h"
#include "artifact_io.h" /* die, slurp, tensor, npy_rows: reading the artifact's files */

/* What this program knows about the model (examples/mlp.py): x[batch, IN] -> y[batch, OUT], params
 * in manifest order. rlx_manifest() has all of this as JSON (its "arch" names the GPU arch the
 * library was built for) for programs that must work with any artifact. */
enum { IN = 4, OUT = 3, MAX_BATCH = 64 };
static const char *const PARAMS[] = {"w1", "b1", "w2", "b2"};
enum { TO_DEVICE = 0, TO_HOST = 1 }; /* rlx_cuda_memcpy kinds */

int main(int argc, char **argv)
{
    if (argc != 3) {
        fprintf(stderr, "usage: %s ARTIFACT_DIR INPUT.npy\n", argv[0]);
        return 2;
    }
    if (rlx_abi_version() != RLX_ABI_VERSION) /* the library and this header must agree */
        die("model.so was generated for another RLX ABI version", NULL);

    char path[4096];
    long size;
    snprintf(path, sizeof path, "%s/weights.safetensors", argv[1]);
    char *weights = slurp(path, &size);
    char *input = slurp(argv[2], &size);
    int64_t batch;
    const float *x = npy_rows(input, size, IN, &batch);
    if (batch < 1 || batch > MAX_BATCH)
        die("the batch must be 1..64 (the bound mlp.py traced with)", NULL);

    /* One device allocation for params, arena and scratch, a stream and the captured CUDA graphs.
     * NULL when there is no usable GPU (none, or one of another arch): the reason is in rlx_last_error(NULL). */
    void *ctx = rlx_create();
    if (!ctx)
        die("rlx_create failed", rlx_last_error(NULL));
    for (int32_t i = 0; i < (int32_t)(sizeof PARAMS / sizeof *PARAMS); i++) {
        int64_t nbytes;
        const void *data = tensor(weights, PARAMS[i], &nbytes);
        /* Host data in the declared dtype; the library uploads and converts it once. */
        if (rlx_set_param(ctx, i, data, nbytes) != 0)
            die("rlx_set_param", rlx_last_error(ctx));
    }

    const int64_t symbols[1] = {batch}; /* values of the dynamic dims, in manifest order */
    const int64_t x_bytes = batch * IN * (int64_t)sizeof(float), y_bytes = batch * OUT * (int64_t)sizeof(float);

    /* 1. Host buffers: the library copies x in, replays its CUDA graph, copies y out. */
    float *y = calloc((size_t)batch * OUT, sizeof *y);
    const void *inputs[1] = {x};
    void *outputs[1] = {y};
    if (rlx_run(ctx, symbols, inputs, outputs) != 0)
        die("rlx_run", rlx_last_error(ctx));

    /* 2. Device buffers: no host copies inside the run. */
    void *dx = rlx_cuda_malloc(x_bytes), *dy = rlx_cuda_malloc(y_bytes);
    if (!dx || !dy)
        die("rlx_cuda_malloc", rlx_last_error(NULL));
    if (rlx_cuda_memcpy(dx, x, x_bytes, TO_DEVICE) != 0)
        die("rlx_cuda_memcpy", rlx_last_error(NULL));
    const void *dinputs[1] = {dx};
    void *doutputs[1] = {dy};
    if (rlx_run_device(ctx, symbols, dinputs, doutputs) != 0)
        die("rlx_run_device", rlx_last_error(ctx));
    float *y_dev = calloc((size_t)batch * OUT, sizeof *y_dev);
    if (rlx_cuda_memcpy(y_dev, dy, y_bytes, TO_HOST) != 0)
        die("rlx_cuda_memcpy", rlx_last_error(NULL));
    if (memcmp(y, y_dev, (size_t)y_bytes) != 0) /* the same kernels on the same data */
        die("rlx_run and rlx_run_device disagree", NULL);

    for (int64_t r = 0; r < batch; r++) {
        printf("y[%lld] =", (long long)r);
        for (int c = 0; c < OUT; c++)
            printf(" %.9g", y[r * OUT + c]);
        printf("\n");
    }
    rlx_cuda_free(dx);
    rlx_cuda_free(dy);
    rlx_destroy(ctx);
    free(y_dev);
    free(y);
    free(input);
    free(weights);
    return 0;
}

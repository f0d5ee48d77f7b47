/* consumer.c: run an RLX artifact from plain C, without Python (the model of examples/mlp.py).
 *
 *   cc -O2 -o consumer examples/consumer.c -I ART -L ART -l:model.so -Wl,-rpath,"$PWD/ART"
 *   ./consumer ART x.npy
 *
 * ART is a directory written by `rlxc compile mlp.json -o ART --weights mlp.safetensors`. The
 * program links ART/model.so directly (rlx.h declares its C ABI), sets every param from
 * ART/weights.safetensors, runs one batch read from a float32 .npy file and prints y. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rlx.h"
#include "artifact_io.h" /* die, slurp, tensor, npy_rows: reading the artifact's files */

/* What this program knows about the model (examples/mlp.py): x[batch, IN] -> y[batch, OUT], params
 * in manifest order, which is the order mlp.py declares them. rlx_manifest() has all of this as JSON
 * for programs that must work with any artifact. */
enum { IN = 4, OUT = 3, MAX_BATCH = 64 };
static const char *const PARAMS[] = {"w1", "b1", "w2", "b2"};

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

    /* A context owns the params and the scratch arena; one per thread (rlx_clone copies one). */
    void *ctx = rlx_create();
    if (!ctx)
        die("rlx_create failed (out of memory)", NULL);
    for (int32_t i = 0; i < (int32_t)(sizeof PARAMS / sizeof *PARAMS); i++) {
        int64_t nbytes;
        const void *data = tensor(weights, PARAMS[i], &nbytes);
        /* The library copies (or packs) the values and checks nbytes against the param's shape. */
        if (rlx_set_param(ctx, i, data, nbytes) != 0)
            die("rlx_set_param", rlx_last_error(ctx));
    }

    float *y = calloc((size_t)batch * OUT, sizeof *y);
    const int64_t symbols[1] = {batch}; /* values of the dynamic dims, in manifest order */
    const void *inputs[1] = {x};
    void *outputs[1] = {y};
    if (rlx_run(ctx, symbols, inputs, outputs) != 0) /* never allocates; errors are messages */
        die("rlx_run", rlx_last_error(ctx));

    for (int64_t r = 0; r < batch; r++) {
        printf("y[%lld] =", (long long)r);
        for (int c = 0; c < OUT; c++)
            printf(" %.9g", y[r * OUT + c]);
        printf("\n");
    }
    rlx_destroy(ctx);
    free(y);
    free(input);
    free(weights);
    return 0;
}

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

/* What this program knows about the model (examples/mlp.py): x[batch, IN] -> y[batch, OUT], params
 * in manifest order, which is the order mlp.py declares them. rlx_manifest() has all of this as JSON
 * for programs that must work with any artifact. */
enum { IN = 4, OUT = 3, MAX_BATCH = 64 };
static const char *const PARAMS[] = {"w1", "b1", "w2", "b2"};

static void die(const char *what, const char *detail)
{
    fprintf(stderr, "consumer: %s%s%s\n", what, detail ? ": " : "", detail ? detail : "");
    exit(1);
}

/* The whole file, NUL-terminated so its text parts can be searched with strstr. */
static char *slurp(const char *path, long *size)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        die("cannot open", path);
    fseek(f, 0, SEEK_END);
    *size = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *data = malloc((size_t)*size + 1);
    if (!data || fread(data, 1, (size_t)*size, f) != (size_t)*size)
        die("cannot read", path);
    data[*size] = '\0';
    fclose(f);
    return data;
}

/* A tensor of a .safetensors file: an 8-byte little-endian header length, a JSON header
 * {"NAME":{"dtype":..,"shape":..,"data_offsets":[BEGIN,END]},..}, then the raw data. */
static const void *tensor(const char *file, const char *name, int64_t *nbytes)
{
    uint64_t header_len;
    memcpy(&header_len, file, 8);
    char *header = strndup(file + 8, header_len);
    char key[128];
    snprintf(key, sizeof key, "\"%s\":", name);
    const char *entry = strstr(header, key);
    const char *offsets = entry ? strstr(entry, "\"data_offsets\":[") : NULL;
    long long begin, end;
    if (!offsets || sscanf(offsets + strlen("\"data_offsets\":["), "%lld,%lld", &begin, &end) != 2)
        die("weights.safetensors has no tensor", name);
    free(header);
    *nbytes = end - begin;
    return file + 8 + header_len + begin;
}

/* The data of a float32 [batch, IN] .npy file: magic, version, header length, a Python-dict
 * header ("{'descr': '<f4', 'fortran_order': False, 'shape': (5, 4), }"), then the data. */
static const float *npy_rows(const char *file, long size, int64_t *rows)
{
    if (size < 12 || memcmp(file, "\x93NUMPY", 6) != 0)
        die("not a .npy file", NULL);
    int v1 = file[6] == 1; /* version 1 has a 2-byte header length, later versions 4 bytes */
    uint32_t header_len = v1 ? (uint32_t)(uint8_t)file[8] | (uint32_t)(uint8_t)file[9] << 8 : 0;
    if (!v1)
        memcpy(&header_len, file + 8, 4);
    const char *header = file + (v1 ? 10 : 12);
    long long r, c;
    const char *shape = strstr(header, "'shape': (");
    if (!strstr(header, "'descr': '<f4'") || !strstr(header, "'fortran_order': False") || !shape
        || sscanf(shape + strlen("'shape': ("), "%lld, %lld", &r, &c) != 2 || c != IN)
        die("the input must be a C-ordered float32 .npy of shape [batch, 4]", NULL);
    *rows = r;
    return (const float *)(header + header_len);
}

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
    const float *x = npy_rows(input, size, &batch);
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

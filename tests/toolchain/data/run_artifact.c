/* Runs a saved RLX artifact from plain C, with no Python: the proof that an
 * artifact directory is usable on its own through rlx.h.
 *
 *   run_artifact PLAN.txt
 *
 * PLAN.txt lists, one directive per line (paths without spaces):
 *   library /path/to/model.so
 *   symbols N v0 v1 ...          values of the dynamic dims, in manifest order
 *   param INDEX /path/raw.bin    raw bytes for rlx_set_param
 *   input /path/raw.bin          one per input, in manifest order
 *   output /path/raw.bin NBYTES  one per output, in manifest order
 *
 * The functions are looked up with dlsym and typed from rlx.h's declarations,
 * so a mismatch between the header and this program fails to compile. */
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rlx.h"

#define MAX_ITEMS 256
#define MAX_PATH 4096

static void *read_file(const char *path, int64_t *nbytes)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "cannot open %s\n", path);
        return NULL;
    }
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    fseek(f, 0, SEEK_SET);
    void *data = malloc(size > 0 ? (size_t)size : 1);
    if (data && size > 0 && fread(data, 1, (size_t)size, f) != (size_t)size) {
        free(data);
        data = NULL;
    }
    fclose(f);
    *nbytes = size;
    return data;
}

#define LOOKUP(lib, name, var)                                            \
    __typeof__(&name) var = (__typeof__(&name))dlsym(lib, #name);         \
    if (!var) {                                                           \
        fprintf(stderr, "symbol %s missing: %s\n", #name, dlerror());     \
        return 1;                                                         \
    }

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: %s PLAN.txt\n", argv[0]);
        return 2;
    }
    FILE *plan = fopen(argv[1], "r");
    if (!plan) {
        fprintf(stderr, "cannot open plan %s\n", argv[1]);
        return 2;
    }

    char word[64], path[MAX_PATH], library[MAX_PATH] = "";
    int64_t symbols[MAX_ITEMS];
    int n_symbols = 0, n_inputs = 0, n_outputs = 0, n_params = 0;
    int param_index[MAX_ITEMS];
    char *param_path[MAX_ITEMS], *input_path[MAX_ITEMS], *output_path[MAX_ITEMS];
    long long output_bytes[MAX_ITEMS];

    while (fscanf(plan, "%63s", word) == 1) {
        if (strcmp(word, "library") == 0 && fscanf(plan, "%4095s", library) == 1) {
            continue;
        } else if (strcmp(word, "symbols") == 0 && fscanf(plan, "%d", &n_symbols) == 1) {
            for (int i = 0; i < n_symbols && i < MAX_ITEMS; i++) {
                long long v;
                if (fscanf(plan, "%lld", &v) != 1)
                    return 2;
                symbols[i] = v;
            }
        } else if (strcmp(word, "param") == 0 && n_params < MAX_ITEMS
                   && fscanf(plan, "%d %4095s", &param_index[n_params], path) == 2) {
            param_path[n_params++] = strdup(path);
        } else if (strcmp(word, "input") == 0 && n_inputs < MAX_ITEMS && fscanf(plan, "%4095s", path) == 1) {
            input_path[n_inputs++] = strdup(path);
        } else if (strcmp(word, "output") == 0 && n_outputs < MAX_ITEMS
                   && fscanf(plan, "%4095s %lld", path, &output_bytes[n_outputs]) == 2) {
            output_path[n_outputs++] = strdup(path);
        } else {
            fprintf(stderr, "bad plan directive %s\n", word);
            return 2;
        }
    }
    fclose(plan);

    void *lib = dlopen(library, RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        fprintf(stderr, "dlopen failed: %s\n", dlerror());
        return 1;
    }
    LOOKUP(lib, rlx_abi_version, abi_version)
    LOOKUP(lib, rlx_manifest, manifest)
    LOOKUP(lib, rlx_create, create)
    LOOKUP(lib, rlx_destroy, destroy)
    LOOKUP(lib, rlx_set_param, set_param)
    LOOKUP(lib, rlx_run, run)
    LOOKUP(lib, rlx_last_error, last_error)

    if (abi_version() != RLX_ABI_VERSION) {
        fprintf(stderr, "ABI version %d, rlx.h says %d\n", (int)abi_version(), RLX_ABI_VERSION);
        return 1;
    }
    const char *text = manifest();
    if (!text || text[0] != '{') {
        fprintf(stderr, "rlx_manifest() is not JSON\n");
        return 1;
    }

    void *ctx = create();
    if (!ctx) {
        fprintf(stderr, "rlx_create failed\n");
        return 1;
    }
    for (int i = 0; i < n_params; i++) {
        int64_t nbytes;
        void *data = read_file(param_path[i], &nbytes);
        if (!data || set_param(ctx, param_index[i], data, nbytes) != 0) {
            fprintf(stderr, "rlx_set_param(%d) failed: %s\n", param_index[i], last_error(ctx));
            return 1;
        }
        free(data); /* rlx_set_param copies (or packs) the values */
    }
    const void *inputs[MAX_ITEMS];
    void *outputs[MAX_ITEMS];
    for (int i = 0; i < n_inputs; i++) {
        int64_t nbytes;
        inputs[i] = read_file(input_path[i], &nbytes);
        if (!inputs[i])
            return 1;
    }
    for (int i = 0; i < n_outputs; i++) {
        outputs[i] = calloc(1, output_bytes[i] > 0 ? (size_t)output_bytes[i] : 1);
    }
    if (run(ctx, symbols, inputs, outputs) != 0) {
        fprintf(stderr, "rlx_run failed: %s\n", last_error(ctx));
        return 1;
    }
    for (int i = 0; i < n_outputs; i++) {
        FILE *f = fopen(output_path[i], "wb");
        if (!f || fwrite(outputs[i], 1, (size_t)output_bytes[i], f) != (size_t)output_bytes[i]) {
            fprintf(stderr, "cannot write %s\n", output_path[i]);
            return 1;
        }
        fclose(f);
    }
    destroy(ctx);
    printf("ok: %d input(s), %d output(s)\n", n_inputs, n_outputs);
    return 0;
}

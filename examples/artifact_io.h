/* artifact_io.h: reading an RLX artifact's files from plain C (shared by examples/consumer*.c).
 *
 * Static functions only, so each example stays one translation unit: die, slurp (a whole file),
 * tensor (one tensor of a .safetensors file) and npy_rows (the rows of a float32 [rows, cols] .npy). */
#ifndef RLX_EXAMPLES_ARTIFACT_IO_H
#define RLX_EXAMPLES_ARTIFACT_IO_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

/* The data of a float32 [rows, cols] .npy file: magic, version, header length, a Python-dict
 * header ("{'descr': '<f4', 'fortran_order': False, 'shape': (5, 4), }"), then the data. */
static const float *npy_rows(const char *file, long size, int64_t cols, int64_t *rows)
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
        || sscanf(shape + strlen("'shape': ("), "%lld, %lld", &r, &c) != 2 || c != cols)
        die("the input must be a C-ordered float32 .npy of shape [batch, cols]", NULL);
    *rows = r;
    return (const float *)(header + header_len);
}

#endif /* RLX_EXAMPLES_ARTIFACT_IO_H */

/* gguf_dump - a test helper around formats/gguf.c, used by scripts/check_gguf_dequant.py.
 *
 *   gguf_dump FILE                   one line per tensor: name type ne0 [ne1 ...]
 *   gguf_dump FILE TENSOR [ROWS]     the tensor (or its first ROWS rows) dequantised, as raw
 *                                    little-endian f32 on stdout
 *   gguf_dump --rows N FILE          every tensor in file order, n = min(N, rows) of its rows
 *                                    (N = 0: all) dequantised (row i * rows / n for i < n), as raw f32
 *   gguf_dump --fixture OUT [SEED]   write a GGUF with, for every supported type, a tensor of
 *                                    random blocks ("rand.<TYPE>") and one quantised by
 *                                    gguf_quantize ("quant.<TYPE>") from the F32 tensor "src"
 *   gguf_dump --check FILE [REPEAT]  gguf_check_tensor over every tensor, REPEAT times (default 5)
 *                                    in this process: MB of tensor data per second, the first pass
 *                                    (fresh mapping: page faults) and the median of the others
 * Errors go to stderr as one line; the exit status is 1 on failure, 2 on a bad command line.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "gguf.h"

static uint64_t state;
static uint64_t rnd(void)
{
    state ^= state << 13, state ^= state >> 7, state ^= state << 17;
    return state;
}
static float frand(void) { return (float)(rnd() >> 40) / (float)(1 << 24) * 2 - 1; }

/* A random finite f16/bf16 bit pattern (no inf or nan, which would not compare equal). */
static uint16_t finite16(uint32_t exp_mask)
{
    for (;;) {
        uint16_t h = (uint16_t)rnd();
        if ((h & exp_mask) != exp_mask) return h;
    }
}

/* Random bytes are valid blocks for every type once the f16 scales are finite. Half the blocks
 * get ordinary small scales, half any finite f16 (subnormals, negatives, up to 65504). */
static void random_blocks(uint32_t type, uint8_t *p, size_t nbytes)
{
    const gguf_type_traits *tt = gguf_type_traits_of(type);
    for (size_t i = 0; i < nbytes; i++) p[i] = (uint8_t)rnd();
    for (size_t b = 0; b < nbytes; b += tt->bytes) {
        uint8_t *blk = p + b;
        uint16_t h;
        if (type == GGUF_TYPE_F32) {
            float f = frand() * 4;
            memcpy(blk, &f, 4);
        } else if (type == GGUF_TYPE_F16 || type == GGUF_TYPE_BF16) {
            h = finite16(type == GGUF_TYPE_F16 ? 0x7c00 : 0x7f80);
            blk[0] = (uint8_t)h, blk[1] = (uint8_t)(h >> 8);
        }
        for (int k = 0; k < tt->n_scales; k++) {
            h = rnd() & 1 ? gguf_f32_to_f16(frand() * 0.05f) : finite16(0x7c00);
            blk[tt->scale_at[k]] = (uint8_t)h, blk[tt->scale_at[k] + 1] = (uint8_t)(h >> 8);
        }
    }
}

static int fixture(const char *out, uint64_t seed)
{
    enum { COLS = 512, ROWS = 8, N = COLS * ROWS };
    static float src[N];
    static uint8_t buf[N * 4];
    char name[32], err[FASA_ERRLEN];
    state = seed | 1;
    gguf_writer *w = gguf_writer_new();
    if (!w) return 1;
    gguf_w_str(w, "general.architecture", "fixture");
    for (int i = 0; i < N; i++) src[i] = frand() * (1 + (float)(i % 7));
    int64_t ne[2] = { COLS, ROWS };
    gguf_w_tensor(w, "src", GGUF_TYPE_F32, 2, ne, src);
    for (uint32_t type = 0; type < GGUF_TYPE_COUNT; type++) {
        if (!gguf_type_known(type)) continue;
        random_blocks(type, buf, gguf_row_bytes(type, COLS) * ROWS);
        snprintf(name, sizeof name, "rand.%s", gguf_type_name(type));
        gguf_w_tensor(w, name, type, 2, ne, buf);
        gguf_quantize(type, src, buf, N);
        snprintf(name, sizeof name, "quant.%s", gguf_type_name(type));
        gguf_w_tensor(w, name, type, 2, ne, buf);
    }
    int rc = gguf_writer_write(w, out, err);
    gguf_writer_free(w);
    if (rc < 0) fprintf(stderr, "gguf_dump: %s\n", err);
    return rc < 0;
}

/* Rows i * rows / n of t for i < n = min(n_max, rows) (n_max <= 0: all), as f32 on stdout. */
static int dump_rows(const gguf_tensor *t, int64_t n_max, float *row)
{
    int64_t rows = t->ne[1] * t->ne[2] * t->ne[3], n = n_max > 0 && n_max < rows ? n_max : rows;
    size_t rb = gguf_row_bytes(t->type, t->ne[0]);
    for (int64_t i = 0; i < n; i++) {
        int64_t r = n == rows ? i : (int64_t)((unsigned __int128)i * (uint64_t)rows / (uint64_t)n);
        gguf_dequant(t->type, (const uint8_t *)t->data + (size_t)r * rb, row, t->ne[0]);
        if (fwrite(row, sizeof *row, (size_t)t->ne[0], stdout) != (size_t)t->ne[0]) return 1;
    }
    return 0;
}

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static int check_speed(const char *path, int repeat)
{
    gguf_file g;
    char err[FASA_ERRLEN];
    double t[64];
    if (repeat < 2 || repeat > 64) repeat = 5;
    if (gguf_open(&g, path, err) < 0) {
        fprintf(stderr, "gguf_dump: %s\n", err);
        return 1;
    }
    uint64_t bytes = 0;
    for (uint64_t i = 0; i < g.n_tensors; i++) bytes += g.tensors[i].nbytes;
    for (int r = 0; r < repeat; r++) {
        double t0 = now();
        for (uint64_t i = 0; i < g.n_tensors; i++)
            if (gguf_check_tensor(&g, &g.tensors[i], err) < 0) {
                fprintf(stderr, "gguf_dump: %s\n", err);
                gguf_close(&g);
                return 1;
            }
        t[r] = now() - t0;
    }
    double first = t[0];
    qsort(t + 1, (size_t)repeat - 1, sizeof *t, cmp_double);
    double med = t[1 + (repeat - 1) / 2];
    printf("%s: %llu tensors, %.1f MB of tensor data: first pass %.1f ms (%.0f MB/s), "
           "median of %d more %.2f ms (%.0f MB/s)\n", path, (unsigned long long)g.n_tensors, (double)bytes / 1e6,
           first * 1e3, (double)bytes / 1e6 / first, repeat - 1, med * 1e3, (double)bytes / 1e6 / med);
    gguf_close(&g);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc >= 3 && strcmp(argv[1], "--check") == 0) return check_speed(argv[2], argc > 3 ? atoi(argv[3]) : 5);
    if (argc >= 3 && strcmp(argv[1], "--fixture") == 0)
        return fixture(argv[2], argc > 3 ? strtoull(argv[3], NULL, 0) : 42);
    int every = argc == 4 && strcmp(argv[1], "--rows") == 0;
    if (!every && (argc < 2 || argc > 4)) {
        fprintf(stderr, "usage: gguf_dump FILE [TENSOR [ROWS]] | gguf_dump --rows N FILE | "
                        "gguf_dump --fixture OUT [SEED] | gguf_dump --check FILE [REPEAT]\n");
        return 2;
    }
    const char *path = every ? argv[3] : argv[1];
    gguf_file g;
    char err[FASA_ERRLEN];
    if (gguf_open(&g, path, err) < 0) {
        fprintf(stderr, "gguf_dump: %s\n", err);
        return 1;
    }
    int64_t widest = 1;
    for (uint64_t i = 0; i < g.n_tensors; i++)
        if (g.tensors[i].ne[0] > widest) widest = g.tensors[i].ne[0];
    float *row = malloc((size_t)widest * sizeof *row);
    int rc = row ? 0 : 1;
    if (every) {
        int64_t n = atoll(argv[2]);
        for (uint64_t i = 0; !rc && i < g.n_tensors; i++) rc = dump_rows(&g.tensors[i], n, row);
    } else if (argc == 2) {
        for (uint64_t i = 0; i < g.n_tensors; i++) {
            const gguf_tensor *t = &g.tensors[i];
            printf("%.*s %s", (int)t->name.len, t->name.ptr, gguf_type_name(t->type));
            for (uint32_t d = 0; d < t->n_dims; d++) printf(" %lld", (long long)t->ne[d]);
            printf("\n");
        }
    } else if (!rc) {
        const gguf_tensor *t = gguf_find_tensor(&g, argv[2]);
        if (!t) {
            fprintf(stderr, "gguf_dump: '%s': no tensor '%s'\n", path, argv[2]);
            rc = 1;
        } else {
            int64_t rows = t->ne[1] * t->ne[2] * t->ne[3];
            if (argc == 4 && atoll(argv[3]) < rows) rows = atoll(argv[3]);
            size_t rb = gguf_row_bytes(t->type, t->ne[0]);
            for (int64_t r = 0; !rc && r < rows; r++) {
                gguf_dequant(t->type, (const uint8_t *)t->data + (size_t)r * rb, row, t->ne[0]);
                if (fwrite(row, sizeof *row, (size_t)t->ne[0], stdout) != (size_t)t->ne[0]) rc = 1;
            }
        }
    }
    free(row);
    gguf_close(&g);
    return rc;
}

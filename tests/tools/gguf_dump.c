/* gguf_dump - a test helper around formats/gguf.c, used by scripts/check_gguf_dequant.py.
 *
 *   gguf_dump FILE                   one line per tensor: name type ne0 [ne1 ...]
 *   gguf_dump FILE TENSOR [ROWS]     the tensor (or its first ROWS rows) dequantised, as raw
 *                                    little-endian f32 on stdout
 *   gguf_dump --fixture OUT [SEED]   write a GGUF with, for every supported type, a tensor of
 *                                    random blocks ("rand.<TYPE>") and one quantised by
 *                                    gguf_quantize ("quant.<TYPE>") from the F32 tensor "src"
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gguf.h"

static const uint32_t TYPES[] = { GGUF_TYPE_F32, GGUF_TYPE_F16, GGUF_TYPE_BF16, GGUF_TYPE_Q8_0,
                                  GGUF_TYPE_Q4_0, GGUF_TYPE_Q4_1, GGUF_TYPE_Q4_K, GGUF_TYPE_Q6_K };
#define N_TYPES (sizeof TYPES / sizeof TYPES[0])

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

/* Random bytes are valid blocks for every type once the f16 scales are sane. */
static void random_blocks(uint32_t type, uint8_t *p, size_t nbytes)
{
    for (size_t i = 0; i < nbytes; i++) p[i] = (uint8_t)rnd();
    size_t bb = gguf_type_block_bytes(type);
    for (size_t b = 0; b < nbytes; b += bb) {
        uint8_t *blk = p + b;
        int at[2] = { -1, -1 };
        switch (type) {
        case GGUF_TYPE_F32: { float f = frand() * 4; memcpy(blk, &f, 4); break; }
        case GGUF_TYPE_F16: { uint16_t h = finite16(0x7c00); memcpy(blk, &h, 2); break; }
        case GGUF_TYPE_BF16: { uint16_t h = finite16(0x7f80); memcpy(blk, &h, 2); break; }
        case GGUF_TYPE_Q8_0: case GGUF_TYPE_Q4_0: at[0] = 0; break;
        case GGUF_TYPE_Q4_1: case GGUF_TYPE_Q4_K: at[0] = 0, at[1] = 2; break;
        case GGUF_TYPE_Q6_K: at[0] = 208; break;
        }
        for (int k = 0; k < 2; k++)
            if (at[k] >= 0) {
                uint16_t h = gguf_f32_to_f16(frand() * 0.05f);
                blk[at[k]] = (uint8_t)h, blk[at[k] + 1] = (uint8_t)(h >> 8);
            }
    }
}

static int fixture(const char *out, uint64_t seed)
{
    enum { COLS = 512, ROWS = 4, N = COLS * ROWS };
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
    for (size_t t = 0; t < N_TYPES; t++) {
        random_blocks(TYPES[t], buf, gguf_row_bytes(TYPES[t], COLS) * ROWS);
        snprintf(name, sizeof name, "rand.%s", gguf_type_name(TYPES[t]));
        gguf_w_tensor(w, name, TYPES[t], 2, ne, buf);
        gguf_quantize(TYPES[t], src, buf, N);
        snprintf(name, sizeof name, "quant.%s", gguf_type_name(TYPES[t]));
        gguf_w_tensor(w, name, TYPES[t], 2, ne, buf);
    }
    int rc = gguf_writer_write(w, out, err);
    gguf_writer_free(w);
    if (rc < 0) fprintf(stderr, "gguf_dump: %s\n", err);
    return rc < 0;
}

int main(int argc, char **argv)
{
    if (argc >= 3 && strcmp(argv[1], "--fixture") == 0)
        return fixture(argv[2], argc > 3 ? strtoull(argv[3], NULL, 0) : 42);
    if (argc < 2 || argc > 4) {
        fprintf(stderr, "usage: gguf_dump FILE [TENSOR [ROWS]] | gguf_dump --fixture OUT [SEED]\n");
        return 2;
    }
    gguf_file g;
    char err[FASA_ERRLEN];
    if (gguf_open(&g, argv[1], err) < 0) {
        fprintf(stderr, "gguf_dump: %s\n", err);
        return 1;
    }
    int rc = 0;
    if (argc == 2) {
        for (uint64_t i = 0; i < g.n_tensors; i++) {
            const gguf_tensor *t = &g.tensors[i];
            printf("%.*s %s", (int)t->name.len, t->name.ptr, gguf_type_name(t->type));
            for (uint32_t d = 0; d < t->n_dims; d++) printf(" %lld", (long long)t->ne[d]);
            printf("\n");
        }
    } else {
        const gguf_tensor *t = gguf_find_tensor(&g, argv[2]);
        if (!t) {
            fprintf(stderr, "gguf_dump: '%s': no tensor '%s'\n", argv[1], argv[2]);
            gguf_close(&g);
            return 1;
        }
        int64_t rows = t->ne[1] * t->ne[2] * t->ne[3];
        if (argc == 4 && atoll(argv[3]) < rows) rows = atoll(argv[3]);
        size_t rb = gguf_row_bytes(t->type, t->ne[0]);
        float *row = malloc((size_t)t->ne[0] * sizeof *row);
        for (int64_t r = 0; row && r < rows; r++) {
            gguf_dequant(t->type, (const uint8_t *)t->data + (size_t)r * rb, row, t->ne[0]);
            if (fwrite(row, sizeof *row, (size_t)t->ne[0], stdout) != (size_t)t->ne[0]) { rc = 1; break; }
        }
        if (!row) rc = 1;
        free(row);
    }
    gguf_close(&g);
    return rc;
}

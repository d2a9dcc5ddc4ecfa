/* test_quant_formats.c - every ggml type formats/gguf.c reads (suite "quant_formats"): the traits
 * table, hand-built blocks of the types added for real Q4_K_M/Q5_K_M files (Q5_0, Q5_1, Q2_K,
 * Q3_K, Q5_K, IQ4_NL, IQ4_XS; the older types are in test_gguf.c), scale checks, hostile model
 * files (library and CLI), and the cross-check against gguf-py (scripts/check_gguf_dequant.py).
 *
 * Expected values are worked out here from the block layout, independently of gguf.c, plus a few
 * computed by hand and written as literals. */
#define _GNU_SOURCE   /* memmem */
#include <criterion/criterion.h>

#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "fixtures.h"
#include "gguf.h"
#include "model.h"

static const int8_t KV[16] = { -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113 };

/* Bytes k*mul+add (mod 256): patterns that reach every bit of every byte. */
static void pattern(uint8_t *p, int n, int mul, int add)
{
    for (int k = 0; k < n; k++) p[k] = (uint8_t)(k * mul + add);
}

static int bit(const uint8_t *bytes, int k) { return bytes[k / 8] >> (k % 8) & 1; }

/* ---- the traits table ------------------------------------------------------------------------ */

Test(quant_formats, traits_table)
{
    /* ggml's block sizes and bytes per block (ggml-common.h) */
    static const struct { uint32_t type; const char *name; int64_t block; size_t bytes; int n_scales; } want[] = {
        { GGUF_TYPE_F32, "F32", 1, 4, 0 },         { GGUF_TYPE_F16, "F16", 1, 2, 0 },
        { GGUF_TYPE_BF16, "BF16", 1, 2, 0 },       { GGUF_TYPE_Q4_0, "Q4_0", 32, 18, 1 },
        { GGUF_TYPE_Q4_1, "Q4_1", 32, 20, 2 },     { GGUF_TYPE_Q5_0, "Q5_0", 32, 22, 1 },
        { GGUF_TYPE_Q5_1, "Q5_1", 32, 24, 2 },     { GGUF_TYPE_Q8_0, "Q8_0", 32, 34, 1 },
        { GGUF_TYPE_Q2_K, "Q2_K", 256, 84, 2 },    { GGUF_TYPE_Q3_K, "Q3_K", 256, 110, 1 },
        { GGUF_TYPE_Q4_K, "Q4_K", 256, 144, 2 },   { GGUF_TYPE_Q5_K, "Q5_K", 256, 176, 2 },
        { GGUF_TYPE_Q6_K, "Q6_K", 256, 210, 1 },   { GGUF_TYPE_IQ4_NL, "IQ4_NL", 32, 18, 1 },
        { GGUF_TYPE_IQ4_XS, "IQ4_XS", 256, 136, 1 },
    };
    int known = 0;
    for (uint32_t t = 0; t < GGUF_TYPE_COUNT + 5; t++) known += gguf_type_known(t);
    cr_assert_eq(known, (int)(sizeof want / sizeof want[0]), "%d known types", known);
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        const gguf_type_traits *tt = gguf_type_traits_of(want[i].type);
        cr_assert_not_null(tt, "%s", want[i].name);
        cr_assert_str_eq(tt->name, want[i].name);
        cr_assert_eq(tt->block, want[i].block, "%s", want[i].name);
        cr_assert_eq(tt->bytes, want[i].bytes, "%s", want[i].name);
        cr_assert_eq(tt->n_scales, want[i].n_scales, "%s", want[i].name);
        for (int k = 0; k < tt->n_scales; k++) cr_assert_leq(tt->scale_at[k] + 2u, tt->bytes, "%s", tt->name);
        cr_assert(tt->to_float && tt->from_float_ref, "%s", tt->name);
        /* the public helpers read the same row */
        cr_assert_str_eq(gguf_type_name(want[i].type), tt->name);
        cr_assert_eq(gguf_type_block(want[i].type), tt->block);
        cr_assert_eq(gguf_type_block_bytes(want[i].type), tt->bytes);
        cr_assert_eq(gguf_row_bytes(want[i].type, 3 * tt->block), 3 * tt->bytes);
    }
    static const uint32_t unknown[] = { 4, 5, GGUF_TYPE_Q8_1, GGUF_TYPE_Q8_K, GGUF_TYPE_IQ2_XXS, GGUF_TYPE_IQ1_S,
                                        GGUF_TYPE_IQ3_S, GGUF_TYPE_I8, GGUF_TYPE_F64, GGUF_TYPE_IQ1_M,
                                        GGUF_TYPE_COUNT, 39, 0xffffffffu };
    for (size_t i = 0; i < sizeof unknown / sizeof unknown[0]; i++) {
        cr_assert_null(gguf_type_traits_of(unknown[i]), "type %u", unknown[i]);
        cr_assert_null(gguf_type_name(unknown[i]));
        cr_assert_eq(gguf_type_block(unknown[i]), 0);
        cr_assert_eq(gguf_row_bytes(unknown[i], 256), 0);
    }
}

/* ---- hand-built blocks --------------------------------------------------------------------------- */

/* Q5_0 / Q5_1: qs[j] = j | (15 - j) << 4; qh = 0f 1e c3 a5, whose bits 15 and 16 (the nibble
 * boundary) differ. Value v takes nibble v / 16 of qs[v % 16] and bit v of qh. */
static const uint8_t QH5[4] = { 0x0f, 0x1e, 0xc3, 0xa5 };

static int q5_code(const uint8_t *qs, int v)
{
    int nib = v < 16 ? qs[v] & 15 : qs[v - 16] >> 4;
    return nib + 16 * bit(QH5, v);
}

Test(quant_formats, dequant_q5_0)
{
    uint8_t b[22] = { 0x00, 0x38 };                        /* d = 0.5 */
    memcpy(b + 2, QH5, 4);
    for (int j = 0; j < 16; j++) b[6 + j] = (uint8_t)(j | (15 - j) << 4);
    float y[32];
    gguf_dequant(GGUF_TYPE_Q5_0, b, y, 32);
    for (int v = 0; v < 32; v++) cr_assert_eq(y[v], 0.5f * (float)(q5_code(b + 6, v) - 16), "value %d: %g", v, y[v]);
    /* by hand: v=0 nibble 0 + bit 16 -> 0; v=4: 4, bit clear -> -6; v=15: 15, qh bit 15 clear
     * -> -0.5; v=16: 15 + 16 -> 7.5; v=31: 0 + 16 -> 0 */
    cr_assert(y[0] == 0 && y[4] == -6.0f && y[15] == -0.5f && y[16] == 7.5f && y[31] == 0);
}

Test(quant_formats, dequant_q5_1)
{
    uint8_t b[24] = { 0x00, 0x34, 0x00, 0xbe };            /* d = 0.25, m = -1.5 */
    memcpy(b + 4, QH5, 4);
    for (int j = 0; j < 16; j++) b[8 + j] = (uint8_t)(j | (15 - j) << 4);
    float y[32];
    gguf_dequant(GGUF_TYPE_Q5_1, b, y, 32);
    for (int v = 0; v < 32; v++) cr_assert_eq(y[v], 0.25f * (float)q5_code(b + 8, v) - 1.5f, "value %d", v);
    cr_assert(y[0] == 2.5f && y[4] == -0.5f && y[16] == 6.25f && y[15] == 2.25f);
}

/* The 2-bit code of value v in a K-quant's qs[64]: each 32-byte half holds 128 values, value r of
 * the half in bits 2 * (r / 32) of byte r % 32. */
static int code2(const uint8_t *qs, int v)
{
    int half = v / 128, r = v % 128;
    return qs[32 * half + r % 32] >> (2 * (r / 32)) & 3;
}

/* Q2_K: scales[s] = s | (15 - s) << 4 (scale s, min 15 - s), qs[k] = 37k + 11, d = 0.5 and
 * dmin = 0.25 at the end of the block. */
Test(quant_formats, dequant_q2_k)
{
    uint8_t b[84];
    for (int s = 0; s < 16; s++) b[s] = (uint8_t)(s | (15 - s) << 4);
    pattern(b + 16, 64, 37, 11);
    b[80] = 0x00, b[81] = 0x38, b[82] = 0x00, b[83] = 0x34;
    float y[256];
    gguf_dequant(GGUF_TYPE_Q2_K, b, y, 256);
    for (int v = 0; v < 256; v++) {
        int s = v / 16;
        cr_assert_eq(y[v], 0.5f * (float)s * (float)code2(b + 16, v) - 0.25f * (float)(15 - s), "value %d", v);
    }
    /* v=0: scale 0, min 15 -> -3.75. v=200: sub-block 12 (scale 12, min 3), half 1, r = 72:
     * bits 4-5 of qs[40] = 211 = 0b11010011 -> 1: 6 - 0.75 */
    cr_assert_eq(y[0], -3.75f);
    cr_assert_eq(y[200], 5.25f);
}

/* Q3_K: sixteen 6-bit scales u (stored with 32 added), packed by hand:
 *   u = 0 63 32 31 1 62 17 46 | 5 40 33 8 60 3 48 15
 *   bytes 0-7: low nibble of u[j], high nibble = low nibble of u[j + 8]
 *   bytes 8-11: byte 8 + k holds the top two bits of u[k], u[k+4], u[k+8], u[k+12] at bits 0, 2, 4, 6
 * hmask[k] = 29k + 3, qs[k] = 37k + 11, d = 0.5. */
Test(quant_formats, dequant_q3_k)
{
    static const int u[16] = { 0, 63, 32, 31, 1, 62, 17, 46, 5, 40, 33, 8, 60, 3, 48, 15 };
    static const uint8_t scales[12] = { 0x50, 0x8f, 0x10, 0x8f, 0xc1, 0x3e, 0x01, 0xfe, 0xc0, 0x2f, 0xe6, 0x09 };
    uint8_t b[110];
    pattern(b, 32, 29, 3);
    pattern(b + 32, 64, 37, 11);
    memcpy(b + 96, scales, 12);
    b[108] = 0x00, b[109] = 0x38;
    float y[256];
    gguf_dequant(GGUF_TYPE_Q3_K, b, y, 256);
    for (int v = 0; v < 256; v++) {
        int high = bit(b, 8 * (v % 32) + v / 32);            /* bit v / 32 of hmask[v % 32] */
        int q = code2(b + 32, v) - (high ? 0 : 4);
        cr_assert_eq(y[v], 0.5f * (float)(u[v / 16] - 32) * (float)q, "value %d: %g", v, y[v]);
    }
    /* v=0: scale -32, code 3 (qs[0] = 11), hmask[0] = 3 has bit 0 -> 3: -48.
     * v=16: scale 31, qs[16] = 91 -> 3, hmask[16] = 211 bit 0 set -> 3: 46.5.
     * v=100: scale -15, bits 6-7 of qs[4] = 159 -> 2, bit 3 of hmask[4] = 119 clear -> -2: 15.
     * v=200: scale 28, bits 4-5 of qs[40] = 211 -> 1, bit 6 of hmask[8] = 235 set -> 1: 14. */
    cr_assert_eq(y[0], -48.0f);
    cr_assert_eq(y[16], 46.5f);
    cr_assert_eq(y[37], 0.0f);
    cr_assert_eq(y[100], 15.0f);
    cr_assert_eq(y[200], 14.0f);
}

/* Q5_K: Q4_K's scales and mins from test_gguf.c (scales 1 17 33 63 5 20 40 63, mins 0 3 16 50 7
 * 31 32 63, top bits of j >= 4 in the spare bits of bytes 0-7), qh[k] = 29k + 3, qs[k] = 7k. */
Test(quant_formats, dequant_q5_k)
{
    static const int sc[8] = { 1, 17, 33, 63, 5, 20, 40, 63 }, mn[8] = { 0, 3, 16, 50, 7, 31, 32, 63 };
    uint8_t b[176] = { 0x00, 0x38, 0x00, 0x34,              /* d = 0.5, dmin = 0.25 */
                       0x01, 0x51, 0xa1, 0xff, 0x00, 0x43, 0x90, 0xf2, 0x75, 0xf4, 0x08, 0xff };
    pattern(b + 16, 32, 29, 3);
    pattern(b + 48, 128, 7, 0);
    float y[256];
    gguf_dequant(GGUF_TYPE_Q5_K, b, y, 256);
    for (int v = 0; v < 256; v++) {
        int chunk = v / 64, r = v % 64, s = v / 32;
        int nib = b[48 + 32 * chunk + r % 32] >> (r < 32 ? 0 : 4) & 15;
        int q = nib + 16 * bit(b + 16, 8 * (v % 32) + v / 32);
        cr_assert_eq(y[v], 0.5f * (float)sc[s] * (float)q - 0.25f * (float)mn[s], "value %d", v);
    }
    /* v=0: nibble 0, qh[0] = 3 bit 0 -> 16: 8. v=40: high nibble of qs[8] = 56 -> 3, bit 1 of
     * qh[8] = 235 -> 19: 8.5 * 19 - 0.75. v=255: high nibble of qs[127] = 121 -> 7, bit 7 of
     * qh[31] = 134 -> 23: 31.5 * 23 - 15.75 */
    cr_assert_eq(y[0], 8.0f);
    cr_assert_eq(y[40], 160.75f);
    cr_assert_eq(y[255], 708.75f);
}

/* IQ4_NL, two blocks (d = 0.5, then d = -2): qs[j] = j | (15 - j) << 4. */
Test(quant_formats, dequant_iq4_nl)
{
    uint8_t b[36] = { 0x00, 0x38 };
    for (int j = 0; j < 16; j++) b[2 + j] = b[20 + j] = (uint8_t)(j | (15 - j) << 4);
    b[18] = 0x00, b[19] = 0xc0;
    float y[64];
    gguf_dequant(GGUF_TYPE_IQ4_NL, b, y, 64);
    for (int j = 0; j < 16; j++) {
        cr_assert_eq(y[j], 0.5f * (float)KV[j]);
        cr_assert_eq(y[j + 16], 0.5f * (float)KV[15 - j]);
        cr_assert_eq(y[32 + j], -2.0f * (float)KV[j]);
        cr_assert_eq(y[48 + j], -2.0f * (float)KV[15 - j]);
    }
    cr_assert(y[0] == -63.5f && y[16] == 56.5f && y[32] == 254.0f && y[63] == 254.0f);
}

/* IQ4_XS: eight 6-bit scales u = 0 63 32 31 1 62 17 46 (minus 32: -32 31 0 -1 -31 30 -15 14),
 * packed by hand: scales_l = f0 f0 e1 e1 (u[2k] low nibble, u[2k+1] high nibble), scales_h =
 * 0x9c6c (top two bits of u[s] at bits 2s); qs[k] = 37k + 11; d = 0.25. */
Test(quant_formats, dequant_iq4_xs)
{
    static const int u[8] = { 0, 63, 32, 31, 1, 62, 17, 46 };
    uint8_t b[136] = { 0x00, 0x34, 0x6c, 0x9c, 0xf0, 0xf0, 0xe1, 0xe1 };
    pattern(b + 8, 128, 37, 11);
    float y[256];
    gguf_dequant(GGUF_TYPE_IQ4_XS, b, y, 256);
    for (int v = 0; v < 256; v++) {
        int s = v / 32, j = v % 32;
        int code = b[8 + 16 * s + j % 16] >> (j < 16 ? 0 : 4) & 15;
        cr_assert_eq(y[v], 0.25f * (float)(u[s] - 32) * (float)KV[code], "value %d: %g", v, y[v]);
    }
    /* v=0: step -8, low nibble of qs[0] = 11 -> 38: -304. v=48: step 7.75, high nibble of
     * qs[16] = 0x5b -> -35. v=100: step -0.25, low nibble of qs[52] = 0x8f -> 113. v=255: step
     * 3.5, high nibble of qs[127] = 0x66 -> -22. */
    cr_assert_eq(y[0], -304.0f);
    cr_assert_eq(y[48], -271.25f);
    cr_assert_eq(y[100], -28.25f);
    cr_assert_eq(y[255], -77.0f);
}

/* A row is its blocks: the row functions of the table step through blocks at the right stride,
 * so a whole row and its blocks one at a time give the same bytes and the same floats. */
Test(quant_formats, rows_are_blocks)
{
    enum { N = 256 * 3 };
    static float x[N], y[N], z[N];
    static uint8_t whole[N * 4], parts[N * 4];
    for (int i = 0; i < N; i++) x[i] = sinf((float)i * 0.37f) * (1 + (float)(i % 50));
    for (uint32_t t = 0; t < GGUF_TYPE_COUNT; t++) {
        const gguf_type_traits *tt = gguf_type_traits_of(t);
        if (!tt) continue;
        tt->from_float_ref(x, whole, N);
        for (int64_t i = 0; i < N; i += tt->block)
            tt->from_float_ref(x + i, parts + i / tt->block * tt->bytes, tt->block);
        cr_assert_eq(memcmp(whole, parts, (size_t)(N / tt->block) * tt->bytes), 0, "%s", tt->name);
        tt->to_float(whole, y, N);
        for (int64_t i = 0; i < N; i += tt->block) tt->to_float(parts + i / tt->block * tt->bytes, z + i, tt->block);
        cr_assert_eq(memcmp(y, z, sizeof y), 0, "%s", tt->name);
    }
}

/* ---- scale checks --------------------------------------------------------------------------------- */

/* A one-tensor GGUF of `rows` x 256 values of the given type, as bytes. */
static uint8_t *one_tensor(uint32_t type, int rows, size_t *len)
{
    float *x = malloc(sizeof(float) * 256 * rows);
    for (int i = 0; i < 256 * rows; i++) x[i] = cosf((float)i) * 2;
    size_t rb = gguf_row_bytes(type, 256);
    uint8_t *q = malloc(rb * rows), *out;
    gguf_quantize(type, x, q, 256 * rows);
    gguf_writer *w = gguf_writer_new();
    int64_t ne[2] = { 256, rows };
    char name[32], err[FASA_ERRLEN];
    snprintf(name, sizeof name, "t.%s", gguf_type_name(type));
    gguf_w_tensor(w, name, type, 2, ne, q);
    cr_assert_eq(gguf_writer_bytes(w, &out, len, err), 0, "%s", err);
    gguf_writer_free(w);
    free(x);
    free(q);
    return out;
}

Test(quant_formats, check_tensor_finds_nonfinite_scales)
{
    static const uint16_t bad[] = { 0x7c00, 0xfc00, 0x7e00, 0x7c01, 0xffff };   /* +-inf, nans */
    int checked = 0;
    for (uint32_t type = 0; type < GGUF_TYPE_COUNT; type++) {
        const gguf_type_traits *tt = gguf_type_traits_of(type);
        if (!tt) continue;
        size_t len;
        uint8_t *buf = one_tensor(type, 3, &len);
        gguf_file g;
        char err[FASA_ERRLEN], want[FASA_ERRLEN];
        cr_assert_eq(gguf_parse(&g, buf, len, err), 0, "%s", err);
        const gguf_tensor *t = &g.tensors[0];
        cr_assert_eq(gguf_check_tensor(&g, t, err), 0, "%s: %s", tt->name, err);
        uint8_t *data = (uint8_t *)t->data;
        int64_t nb = (int64_t)(t->nbytes / tt->bytes);
        for (int k = 0; k < tt->n_scales; k++)
            for (int i = 0; i < 5; i++) {
                int64_t blk = (nb - 1) * i / 4;                       /* first, middle, last blocks */
                uint8_t *s = data + blk * (int64_t)tt->bytes + tt->scale_at[k], keep[2] = { s[0], s[1] };
                s[0] = (uint8_t)bad[i], s[1] = (uint8_t)(bad[i] >> 8);
                cr_assert_eq(gguf_check_tensor(&g, t, err), FASA_EFORMAT, "%s scale %d block %lld", tt->name, k,
                             (long long)blk);
                snprintf(want, sizeof want, "gguf: tensor 't.%s': block %lld has a non-finite scale", tt->name,
                         (long long)blk);
                cr_assert_str_eq(err, want);
                s[0] = keep[0], s[1] = keep[1];
                checked++;
            }
        /* a NaN among plain values is data, not a scale */
        if (!tt->n_scales) {
            memset(data, 0xff, 8);
            cr_assert_eq(gguf_check_tensor(&g, t, err), 0, "%s", tt->name);
        }
        /* the largest finite f16 is fine */
        if (tt->n_scales) {
            data[tt->scale_at[0]] = 0xff, data[tt->scale_at[0] + 1] = 0x7b;
            cr_assert_eq(gguf_check_tensor(&g, t, err), 0, "%s: %s", tt->name, err);
        }
        gguf_close(&g);
        free(buf);
    }
    cr_assert_eq(checked, 5 * 17, "%d checks", checked);   /* 12 types with a d, 5 of them a dmin or m too */
}

/* ---- hostile model files -------------------------------------------------------------------------- */

/* A tiny llama whose every matrix is Q4_K (all widths 256), as bytes. */
static uint8_t *tiny_q4k(size_t *len, const char *dir)
{
    tiny_model t;
    tiny_make(&t, &(tiny_spec){ .arch = TINY_LLAMA, .d_model = 256, .n_head = 4, .n_kv_head = 2, .d_head = 64,
                                .d_ff = 256, .seed = 5 });
    char path[600];
    snprintf(path, sizeof path, "%s/good.gguf", dir);
    cr_assert_eq(tiny_write_gguf(&t, path, GGUF_TYPE_Q4_K), 0);
    tiny_free(&t);
    char *buf;
    char err[FASA_ERRLEN];
    cr_assert_eq(fasa_read_file(path, 0, &buf, len, err), 0, "%s", err);
    return (uint8_t *)buf;
}

static void write_bytes(const char *path, const void *buf, size_t len)
{
    char err[FASA_ERRLEN];
    cr_assert_eq(fasa_write_file(path, buf, len, err), 0, "%s", err);
}

static int open_model(const char *path, char *err)
{
    model *m = NULL;
    int rc = model_open(&m, path, err);
    model_close(m);
    return rc;
}

/* The three hostile files of the issue, each with its exact one-line message. */
typedef struct hostile { char path[3][256]; char msg[3][FASA_ERRLEN]; } hostile;

static void make_hostile(hostile *h, const char *dir)
{
    size_t len;
    uint8_t *buf = tiny_q4k(&len, dir);
    gguf_file g;
    char err[FASA_ERRLEN];
    cr_assert_eq(gguf_parse(&g, buf, len, err), 0, "%s", err);
    const gguf_tensor *down = gguf_find_tensor(&g, "blk.1.ffn_down.weight");
    cr_assert(down && down->type == GGUF_TYPE_Q4_K && down->nbytes == 256 * 144);
    size_t at = (size_t)((const uint8_t *)down->data - buf);

    /* 1. a NaN d in block 5 of a Q4_K tensor; an inf dmin would do the same */
    snprintf(h->path[0], sizeof h->path[0], "%s/nan-scale.gguf", dir);
    uint8_t *p = malloc(len);
    memcpy(p, buf, len);
    p[at + 5 * 144] = 0x00, p[at + 5 * 144 + 1] = 0x7e;
    write_bytes(h->path[0], p, len);
    snprintf(h->msg[0], sizeof h->msg[0], "'%s': tensor 'blk.1.ffn_down.weight': block 5 has a non-finite scale",
             h->path[0]);

    /* 2. a row of 320 values, not a multiple of Q4_K's 256: ne[0] follows the name and n_dims */
    snprintf(h->path[1], sizeof h->path[1], "%s/bad-row.gguf", dir);
    memcpy(p, buf, len);
    const char *nm = "blk.0.attn_q.weight";
    uint8_t *hit = memmem(p, len, nm, strlen(nm));
    cr_assert_not_null(hit);
    uint8_t *ne0 = hit + strlen(nm) + 4;
    cr_assert(ne0[0] == 0 && ne0[1] == 1 && ne0[2] == 0, "ne[0] is not 256");
    ne0[0] = 0x40;                                              /* 256 + 64 */
    write_bytes(h->path[1], p, len);
    snprintf(h->msg[1], sizeof h->msg[1],
             "'%s': tensor 'blk.0.attn_q.weight' has ne[0] = 320, not a multiple of the Q4_K block size 256",
             h->path[1]);

    /* 3. the file cut in the middle of a Q4_K tensor */
    snprintf(h->path[2], sizeof h->path[2], "%s/cut.gguf", dir);
    size_t cut = at + down->nbytes / 2;
    write_bytes(h->path[2], buf, cut);
    uint64_t start = (uint64_t)at, end = start + down->nbytes;
    snprintf(h->msg[2], sizeof h->msg[2],
             "'%s': tensor 'blk.1.ffn_down.weight' data [%llu, %llu) lies past the end of the file (size %zu)",
             h->path[2], (unsigned long long)start, (unsigned long long)end, cut);
    free(p);
    gguf_close(&g);
    free(buf);
}

Test(quant_formats, hostile_files_one_line_each)
{
    char *dir = tmpdir_make();
    hostile h;
    make_hostile(&h, dir);
    char err[FASA_ERRLEN], good[700];
    snprintf(good, sizeof good, "%s/good.gguf", dir);
    cr_assert_eq(open_model(good, err), 0, "%s", err);
    static const int status[3] = { FASA_EFORMAT, FASA_EFORMAT, FASA_EFORMAT };
    for (int i = 0; i < 3; i++) {
        err[0] = 0;
        cr_expect_eq(open_model(h.path[i], err), status[i], "%s: %s", h.path[i], err);
        cr_expect_str_eq(err, h.msg[i]);
    }
    tmpdir_remove(dir);
}

/* Every type we read binds as model weights, and the scale check passes valid files. */
Test(quant_formats, tiny_model_of_every_type_opens)
{
    tiny_model t;
    tiny_make(&t, &(tiny_spec){ .arch = TINY_QWEN2, .d_model = 256, .n_head = 4, .n_kv_head = 2, .d_head = 64,
                                .d_ff = 256, .seed = 9 });
    char *dir = tmpdir_make(), path[600], err[FASA_ERRLEN];
    for (uint32_t type = 0; type < GGUF_TYPE_COUNT; type++) {
        if (!gguf_type_known(type)) continue;
        snprintf(path, sizeof path, "%s/%s.gguf", dir, gguf_type_name(type));
        cr_assert_eq(tiny_write_gguf(&t, path, type), 0);
        model *m = NULL;
        cr_assert_eq(model_open(&m, path, err), 0, "%s: %s", gguf_type_name(type), err);
        cr_expect_eq(m->layers[1].w_down.type, type);
        model_close(m);
    }
    tiny_free(&t);
    tmpdir_remove(dir);
}

/* ---- the CLI on the same files ----------------------------------------------------------------------- */

/* "fasa ARGS": exit status, stderr into a malloc'd string. */
static int fasa(const char *args, const char *dir, char **err)
{
    char cmd[4096], p[700];
    snprintf(cmd, sizeof cmd, "%s %s >/dev/null 2>%s/stderr </dev/null", fx_bin(), args, dir);
    int st = system(cmd);
    snprintf(p, sizeof p, "%s/stderr", dir);
    char *buf = NULL;
    size_t len;
    char e[FASA_ERRLEN];
    if (fasa_read_file(p, 0, &buf, &len, e) < 0) buf = strdup("");
    *err = buf;
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128;
}

Test(quant_formats, cli_hostile_files_exit_1_with_one_line, .timeout = 120)
{
    char *dir = tmpdir_make();
    hostile h;
    make_hostile(&h, dir);
    const char *verbs[2] = { "inspect %s", "run %s hi" };
    for (int i = 0; i < 3; i++)
        for (int v = 0; v < 2; v++) {
            char args[1024], want[FASA_ERRLEN + 16], *err;
            snprintf(args, sizeof args, verbs[v], h.path[i]);
            int rc = fasa(args, dir, &err);
            snprintf(want, sizeof want, "fasa: %s\n", h.msg[i]);
            cr_expect_eq(rc, 1, "'fasa %s' exited %d: %s", args, rc, err);
            cr_expect_str_eq(err, want, "'fasa %s'", args);
            free(err);
        }
    tmpdir_remove(dir);
}

/* ---- real files --------------------------------------------------------------------------------------- */

static void repo_root(char *root, size_t n)
{
    const char *bin = fx_bin(), *slash = strrchr(bin, '/');
    snprintf(root, n, "%.*s/..", slash ? (int)(slash - bin) : 1, slash ? bin : ".");
}

/* Every GGUF file in models/ parses (every tensor type known: real Q4_K_M files mix Q5_0, Q8_0,
 * Q6_K in), has finite scales, and its first and last row of each tensor dequantise to finite
 * values. */
Test(quant_formats, real_files_parse_and_check, .timeout = 300)
{
    char root[1024], dir[1100], path[1400], err[FASA_ERRLEN];
    repo_root(root, sizeof root);
    snprintf(dir, sizeof dir, "%s/models", root);
    DIR *d = opendir(dir);
    int files = 0;
    float *row = malloc(sizeof(float) * (1 << 20));
    for (struct dirent *e; d && (e = readdir(d));) {
        size_t n = strlen(e->d_name);
        if (n < 5 || strcmp(e->d_name + n - 5, ".gguf") != 0) continue;
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        gguf_file g;
        cr_assert_eq(gguf_open(&g, path, err), 0, "%s", err);
        for (uint64_t i = 0; i < g.n_tensors; i++) {
            const gguf_tensor *t = &g.tensors[i];
            cr_assert_eq(gguf_check_tensor(&g, t, err), 0, "%s", err);
            int64_t rows = (int64_t)(t->nbytes / gguf_row_bytes(t->type, t->ne[0]));
            cr_assert_leq(t->ne[0], 1 << 20);
            for (int k = 0; k < 2; k++) {
                size_t r = (size_t)(k ? rows - 1 : 0);
                const uint8_t *p = (const uint8_t *)t->data + r * gguf_row_bytes(t->type, t->ne[0]);
                gguf_dequant(t->type, p, row, t->ne[0]);
                for (int64_t j = 0; j < t->ne[0]; j++)
                    cr_assert(isfinite(row[j]), "%s: %.*s row %d value %lld is %g", path, (int)t->name.len, t->name.ptr,
                              k, (long long)j, row[j]);
            }
        }
        gguf_close(&g);
        files++;
    }
    if (d) closedir(d);
    free(row);
    if (!files) cr_skip_test("quant_formats::real_files_parse_and_check: no GGUF file in %s", dir);
    cr_log_info("%d GGUF files checked", files);
}

/* ---- gguf-py ------------------------------------------------------------------------------------------ */

/* scripts/check_gguf_dequant.py: every type on random blocks, and 4 rows of every tensor of every
 * GGUF file in models/, equal to gguf.quants.dequantize to the bit. */
Test(quant_formats, dequant_matches_gguf_py, .timeout = 600)
{
    char root[1024], py[1200], cmd[4096];
    repo_root(root, sizeof root);
    snprintf(py, sizeof py, "%s/.venv/bin/python", root);
    if (access(py, X_OK) != 0)
        cr_skip_test("quant_formats::dequant_matches_gguf_py: no reference venv (scripts/setup.sh --reference)");
    snprintf(cmd, sizeof cmd,
             "cd %s && mkdir -p build && .venv/bin/python scripts/check_gguf_dequant.py --rows 4 --quiet "
             ">build/check_gguf_dequant.log 2>&1", root);
    int st = system(cmd);
    int rc = WIFEXITED(st) ? WEXITSTATUS(st) : 128;
    if (rc == 77)
        cr_skip_test("quant_formats::dequant_matches_gguf_py: gguf cannot be imported (build/check_gguf_dequant.log)");
    cr_expect_eq(rc, 0, "check_gguf_dequant.py found differences (exit %d); see build/check_gguf_dequant.log", rc);
}

/* test_gguf.c - GGUF parser, writer, fp16/bf16 and block (de)quantiser tests (suite "gguf"). */
#include <criterion/criterion.h>

#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gguf.h"
#include "model.h"

#define REAL_MODEL "models/SmolLM2-135M-Instruct.Q4_1.gguf"

static const uint32_t ALL_TYPES[] = {
    GGUF_TYPE_F32, GGUF_TYPE_F16, GGUF_TYPE_BF16, GGUF_TYPE_Q8_0, GGUF_TYPE_Q4_0, GGUF_TYPE_Q4_1,
    GGUF_TYPE_Q5_0, GGUF_TYPE_Q5_1, GGUF_TYPE_Q2_K, GGUF_TYPE_Q3_K, GGUF_TYPE_Q4_K, GGUF_TYPE_Q5_K,
    GGUF_TYPE_Q6_K, GGUF_TYPE_IQ4_NL, GGUF_TYPE_IQ4_XS,
};
#define N_TYPES (sizeof ALL_TYPES / sizeof ALL_TYPES[0])

/* ---- helpers ------------------------------------------------------------------------------- */

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static uint64_t rng(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}
static float frand(void) { return (float)(rng() >> 40) / (float)(1 << 24) * 2 - 1; }   /* [-1, 1) */

static uint32_t fbits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static float bitsf(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

/* A growing byte buffer for hand-built files. */
typedef struct bb { uint8_t *p; size_t len, cap; } bb;

static void bb_put(bb *b, const void *src, size_t n)
{
    if (b->len + n > b->cap) {
        b->cap = (b->len + n) * 2 + 64;
        b->p = realloc(b->p, b->cap);
        cr_assert_not_null(b->p);
    }
    if (n) memcpy(b->p + b->len, src, n);
    b->len += n;
}
static void bb_u8(bb *b, uint8_t v) { bb_put(b, &v, 1); }
static void bb_u32(bb *b, uint32_t v) { for (int i = 0; i < 4; i++) bb_u8(b, (uint8_t)(v >> 8 * i)); }
static void bb_u64(bb *b, uint64_t v) { for (int i = 0; i < 8; i++) bb_u8(b, (uint8_t)(v >> 8 * i)); }
static void bb_str(bb *b, const char *s) { bb_u64(b, strlen(s)); bb_put(b, s, strlen(s)); }
static void bb_zero(bb *b, size_t n) { while (n--) bb_u8(b, 0); }
static void bb_pad(bb *b, size_t align) { while (b->len % align) bb_u8(b, 0); }

typedef struct tinfo { const char *name; uint32_t n_dims; uint64_t ne[4]; uint32_t type; uint64_t offset; } tinfo;

/* A hand-built file: header, an optional general.alignment, tensor infos, padding, data_len
 * zero bytes of data. */
static void build(bb *b, uint32_t version, const tinfo *t, int nt, size_t data_len, uint32_t alignment)
{
    b->len = 0;
    bb_put(b, "GGUF", 4);
    bb_u32(b, version);
    bb_u64(b, (uint64_t)nt);
    bb_u64(b, alignment ? 1 : 0);
    if (alignment) {
        bb_str(b, "general.alignment");
        bb_u32(b, GGUF_VT_U32);
        bb_u32(b, alignment);
    }
    for (int i = 0; i < nt; i++) {
        bb_str(b, t[i].name);
        bb_u32(b, t[i].n_dims);
        for (uint32_t d = 0; d < t[i].n_dims; d++) bb_u64(b, t[i].ne[d < 4 ? d : 3]);
        bb_u32(b, t[i].type);
        bb_u64(b, t[i].offset);
    }
    bb_pad(b, alignment ? alignment : 32);
    bb_zero(b, data_len);
}

/* Parses a private copy of exactly len bytes, so that the sanitizer sees any overread. */
static int parse_copy(const uint8_t *buf, size_t len, char *err)
{
    uint8_t *copy = malloc(len ? len : 1);
    cr_assert_not_null(copy);
    if (len) memcpy(copy, buf, len);
    gguf_file g;
    err[0] = 0;
    int rc = gguf_parse(&g, copy, len, err);
    if (rc == 0) gguf_close(&g);
    free(copy);
    return rc;
}

static void expect_fail(const bb *b, const char *needle)
{
    char err[FASA_ERRLEN];
    int rc = parse_copy(b->p, b->len, err);
    cr_assert_lt(rc, 0, "expected failure containing \"%s\"", needle);
    cr_assert_not_null(strstr(err, needle), "message \"%s\" lacks \"%s\"", err, needle);
    cr_assert_null(strchr(err, '\n'), "message is not one line: %s", err);
}

static void expect_ok(const bb *b)
{
    char err[FASA_ERRLEN];
    cr_assert_eq(parse_copy(b->p, b->len, err), 0, "%s", err);
}

static void fill_random(float *x, int64_t n, float scale)
{
    for (int64_t i = 0; i < n; i++) x[i] = frand() * scale;
}

/* A small valid file with every kind of metadata and a tensor of each type. */
static void make_sample(uint8_t **out, size_t *len)
{
    gguf_writer *w = gguf_writer_new();
    cr_assert_not_null(w);
    gguf_w_str(w, "general.architecture", "llama");
    gguf_w_u32(w, "llama.block_count", 2);
    gguf_w_f32(w, "llama.rope.freq_base", 10000.0f);
    gguf_w_bool(w, "tokenizer.ggml.add_bos_token", 1);
    const char *toks[] = { "<s>", "a", "", "bc" };
    gguf_w_arr_str(w, "tokenizer.ggml.tokens", toks, 4);
    int32_t tt[] = { 3, 1, 1, 1 };
    gguf_w_arr_i32(w, "tokenizer.ggml.token_type", tt, 4);
    float sc[] = { 0, -1, -2, -3 };
    gguf_w_arr_f32(w, "tokenizer.ggml.scores", sc, 4);
    uint8_t nested[] = { GGUF_VT_ARRAY, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0,       /* 1 inner array */
                         GGUF_VT_U16, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0, 7, 0, 9, 0 };
    gguf_w_value(w, "test.nested", GGUF_VT_ARRAY, nested, sizeof nested);
    for (size_t i = 0; i < N_TYPES; i++) {
        uint32_t type = ALL_TYPES[i];
        int64_t ne[2] = { gguf_type_block(type) * (type == GGUF_TYPE_F32 ? 8 : 1), 2 };
        size_t nb = gguf_row_bytes(type, ne[0]) * 2;
        float *x = malloc((size_t)ne[0] * 2 * sizeof *x);
        uint8_t *q = malloc(nb);
        fill_random(x, ne[0] * 2, 1.0f);
        gguf_quantize(type, x, q, ne[0] * 2);
        char name[32];
        snprintf(name, sizeof name, "t.%s", gguf_type_name(type));
        gguf_w_tensor(w, name, type, 2, ne, q);
        free(x);
        free(q);
    }
    char err[FASA_ERRLEN];
    cr_assert_eq(gguf_writer_bytes(w, out, len, err), 0, "%s", err);
    gguf_writer_free(w);
}

/* ---- types, fp16, bf16 ---------------------------------------------------------------------- */

Test(gguf, type_table)
{
    cr_assert_str_eq(gguf_type_name(GGUF_TYPE_Q4_1), "Q4_1");
    cr_assert_null(gguf_type_name(9));          /* Q8_1: ggml's internal type */
    cr_assert(!gguf_type_known(GGUF_TYPE_IQ2_XXS));
    cr_assert_eq(gguf_type_block(GGUF_TYPE_Q4_K), 256);
    cr_assert_eq(gguf_type_block(GGUF_TYPE_BF16), 1);
    cr_assert_eq(gguf_type_block_bytes(GGUF_TYPE_F32), 4);
    cr_assert_eq(gguf_type_block_bytes(GGUF_TYPE_Q4_0), 18);
    cr_assert_eq(gguf_type_block_bytes(GGUF_TYPE_Q4_1), 20);
    cr_assert_eq(gguf_type_block_bytes(GGUF_TYPE_Q8_0), 34);
    cr_assert_eq(gguf_type_block_bytes(GGUF_TYPE_Q4_K), 144);
    cr_assert_eq(gguf_type_block_bytes(GGUF_TYPE_Q6_K), 210);
    cr_assert_eq(gguf_row_bytes(GGUF_TYPE_Q4_1, 576), 18 * 20);
    cr_assert_eq(gguf_row_bytes(GGUF_TYPE_F16, 5), 10);
}

Test(gguf, f16_edges)
{
    cr_assert_eq(gguf_f16_to_f32(0x0000), 0.0f);
    cr_assert_eq(fbits(gguf_f16_to_f32(0x8000)), 0x80000000u);
    cr_assert_eq(gguf_f16_to_f32(0x3c00), 1.0f);
    cr_assert_eq(gguf_f16_to_f32(0xc000), -2.0f);
    cr_assert_eq(gguf_f16_to_f32(0x7bff), 65504.0f);
    cr_assert_eq(gguf_f16_to_f32(0x0001), ldexpf(1, -24));       /* smallest subnormal */
    cr_assert_eq(gguf_f16_to_f32(0x03ff), ldexpf(1023, -24));    /* largest subnormal */
    cr_assert_eq(gguf_f16_to_f32(0x0400), ldexpf(1, -14));       /* smallest normal */
    cr_assert(isinf(gguf_f16_to_f32(0x7c00)) && gguf_f16_to_f32(0x7c00) > 0);
    cr_assert(isinf(gguf_f16_to_f32(0xfc00)) && gguf_f16_to_f32(0xfc00) < 0);
    cr_assert(isnan(gguf_f16_to_f32(0x7e00)) && isnan(gguf_f16_to_f32(0x7c01)));

    cr_assert_eq(gguf_f32_to_f16(1.0f), 0x3c00);
    cr_assert_eq(gguf_f32_to_f16(-0.0f), 0x8000);
    cr_assert_eq(gguf_f32_to_f16(65504.0f), 0x7bff);
    cr_assert_eq(gguf_f32_to_f16(65519.99f), 0x7bff);
    cr_assert_eq(gguf_f32_to_f16(65520.0f), 0x7c00);              /* tie rounds to even: inf */
    cr_assert_eq(gguf_f32_to_f16(1e10f), 0x7c00);
    cr_assert_eq(gguf_f32_to_f16(-INFINITY), 0xfc00);
    uint16_t n = gguf_f32_to_f16(NAN);
    cr_assert((n & 0x7c00) == 0x7c00 && (n & 0x3ff) != 0);
    cr_assert_eq(gguf_f32_to_f16(bitsf(0x7f800001)) & 0x7e00, 0x7e00); /* signalling -> quiet nan */
    cr_assert_eq(gguf_f32_to_f16(1.0f + ldexpf(1, -11)), 0x3c00);   /* tie to even (down) */
    cr_assert_eq(gguf_f32_to_f16(1.0f + 3 * ldexpf(1, -11)), 0x3c02); /* tie to even (up) */
    cr_assert_eq(gguf_f32_to_f16(2047.5f), 0x6800);                /* tie, odd: up a binade */
    cr_assert_eq(gguf_f32_to_f16(ldexpf(1, -24)), 0x0001);
    cr_assert_eq(gguf_f32_to_f16(ldexpf(1, -25)), 0x0000);         /* tie to even: zero */
    cr_assert_eq(gguf_f32_to_f16(ldexpf(1, -25) * 1.0001f), 0x0001);
    cr_assert_eq(gguf_f32_to_f16(ldexpf(3, -25)), 0x0002);         /* 1.5 ulp: to even 2 */
    cr_assert_eq(gguf_f32_to_f16(ldexpf(5, -25)), 0x0002);         /* 2.5 ulp: to even 2 */
    cr_assert_eq(gguf_f32_to_f16(ldexpf(1, -14) - ldexpf(1, -26)), 0x0400); /* rounds up to normal */
    cr_assert_eq(gguf_f32_to_f16(-ldexpf(1, -30)), 0x8000);
    cr_assert_eq(gguf_f32_to_f16(bitsf(1)), 0x0000);                /* f32 subnormal */
}

Test(gguf, f16_every_value_round_trips)
{
    for (uint32_t h = 0; h < 65536; h++) {
        float f = gguf_f16_to_f32((uint16_t)h);
        if ((h & 0x7c00) == 0x7c00 && (h & 0x3ff)) {
            cr_assert(isnan(f));
            cr_assert(isnan(gguf_f16_to_f32(gguf_f32_to_f16(f))));
            continue;
        }
        cr_assert_eq(gguf_f32_to_f16(f), h, "0x%04x", h);
    }
}

#ifdef __FLT16_MAX__
/* The compiler's _Float16 conversion is IEEE round-to-nearest-even: compare on random bits and
 * on values that land near f16 rounding boundaries. */
Test(gguf, f16_matches_compiler)
{
    for (int i = 0; i < 2000000; i++) {
        uint32_t u = (uint32_t)rng();
        if (i & 1) u = (u & 0x80001fff) | (uint32_t)(0x33 + (rng() % 0x15)) << 23 | (uint32_t)(rng() & 0x7f) << 16;
        float f = bitsf(u);
        _Float16 h = (_Float16)f;
        uint16_t hb;
        memcpy(&hb, &h, 2);
        if (isnan(f)) { cr_assert(isnan(gguf_f16_to_f32(gguf_f32_to_f16(f)))); continue; }
        cr_assert_eq(gguf_f32_to_f16(f), hb, "f32 0x%08x: 0x%04x vs 0x%04x", u, gguf_f32_to_f16(f), hb);
        cr_assert_eq(fbits(gguf_f16_to_f32(hb)), fbits((float)h));
    }
}
#endif

Test(gguf, bf16_edges)
{
    cr_assert_eq(gguf_f32_to_bf16(1.0f), 0x3f80);
    cr_assert_eq(gguf_bf16_to_f32(0x3f80), 1.0f);
    cr_assert_eq(gguf_bf16_to_f32(0xc040), -3.0f);
    cr_assert_eq(gguf_f32_to_bf16(bitsf(0x3f808000)), 0x3f80);   /* tie, even stays */
    cr_assert_eq(gguf_f32_to_bf16(bitsf(0x3f818000)), 0x3f82);   /* tie, odd rounds up */
    cr_assert_eq(gguf_f32_to_bf16(bitsf(0x3f808001)), 0x3f81);
    cr_assert_eq(gguf_f32_to_bf16(bitsf(0x7f7fffff)), 0x7f80);   /* max float rounds to inf */
    cr_assert_eq(gguf_f32_to_bf16(INFINITY), 0x7f80);
    cr_assert_eq(gguf_f32_to_bf16(-INFINITY), 0xff80);
    cr_assert_eq(gguf_f32_to_bf16(-0.0f), 0x8000);
    cr_assert_eq(gguf_f32_to_bf16(bitsf(0x00010000)), 0x0001);   /* subnormal kept */
    cr_assert_eq(gguf_bf16_to_f32(0x0001), bitsf(0x00010000));
    uint16_t n = gguf_f32_to_bf16(bitsf(0x7f800001));            /* payload only in low bits */
    cr_assert(isnan(gguf_bf16_to_f32(n)));
    cr_assert(isnan(gguf_bf16_to_f32(gguf_f32_to_bf16(-NAN))));
    for (uint32_t h = 0; h < 65536; h++) {
        float f = gguf_bf16_to_f32((uint16_t)h);
        if (!isnan(f)) cr_assert_eq(gguf_f32_to_bf16(f), h);
    }
}

/* ---- hand-built blocks ----------------------------------------------------------------------- */

Test(gguf, dequant_plain_types)
{
    uint8_t f32[8] = { 0x00, 0x00, 0x80, 0x3f, 0x00, 0x00, 0x20, 0xc1 };   /* 1, -10 */
    uint8_t f16[4] = { 0x00, 0x3c, 0x01, 0x80 };                           /* 1, -2^-24 */
    uint8_t b16[4] = { 0x80, 0x3f, 0x49, 0x40 };                           /* 1, 3.140625 */
    float y[2];
    gguf_dequant(GGUF_TYPE_F32, f32, y, 2);
    cr_assert(y[0] == 1.0f && y[1] == -10.0f);
    gguf_dequant(GGUF_TYPE_F16, f16, y, 2);
    cr_assert(y[0] == 1.0f && y[1] == -ldexpf(1, -24));
    gguf_dequant(GGUF_TYPE_BF16, b16, y, 2);
    cr_assert(y[0] == 1.0f && y[1] == 3.140625f);
}

Test(gguf, dequant_q4_0)
{
    uint8_t b[18] = { 0x00, 0x38 };                       /* d = 0.5 */
    for (int j = 0; j < 16; j++) b[2 + j] = (uint8_t)(j | (15 - j) << 4);
    float y[32];
    gguf_dequant(GGUF_TYPE_Q4_0, b, y, 32);
    for (int j = 0; j < 16; j++) {
        cr_assert_eq(y[j], 0.5f * (float)(j - 8));       /* low nibble of qs[j] -> value j */
        cr_assert_eq(y[j + 16], 0.5f * (float)(7 - j));  /* high nibble -> value j + 16 */
    }
    cr_assert(y[0] == -4.0f && y[15] == 3.5f && y[16] == 3.5f && y[31] == -4.0f);
}

Test(gguf, dequant_q4_1)
{
    uint8_t b[20] = { 0x00, 0x34, 0x00, 0xbe };           /* d = 0.25, m = -1.5 */
    for (int j = 0; j < 16; j++) b[4 + j] = (uint8_t)(j | (15 - j) << 4);
    float y[32];
    gguf_dequant(GGUF_TYPE_Q4_1, b, y, 32);
    for (int j = 0; j < 16; j++) {
        cr_assert_eq(y[j], 0.25f * (float)j - 1.5f);
        cr_assert_eq(y[j + 16], 0.25f * (float)(15 - j) - 1.5f);
    }
    cr_assert(y[0] == -1.5f && y[16] == 2.25f);
}

Test(gguf, dequant_q8_0)
{
    uint8_t b[2 * 34] = { 0x00, 0x30 };                   /* d = 0.125; second block d = -2 */
    for (int j = 0; j < 32; j++) b[2 + j] = (uint8_t)(int8_t)(j * 8 - 128);
    b[34] = 0x00, b[35] = 0xc0;
    for (int j = 0; j < 32; j++) b[36 + j] = (uint8_t)(int8_t)(j - 16);
    float y[64];
    gguf_dequant(GGUF_TYPE_Q8_0, b, y, 64);
    for (int j = 0; j < 32; j++) {
        cr_assert_eq(y[j], 0.125f * (float)(j * 8 - 128));
        cr_assert_eq(y[32 + j], -2.0f * (float)(j - 16));
    }
}

/* Q4_K: scales {1,17,33,63,5,20,40,63}, mins {0,3,16,50,7,31,32,63}, packed by hand:
 *  bytes 0-3: low 6 bits of scales 0-3, top bits = scale[4+j] >> 4
 *  bytes 4-7: low 6 bits of mins 0-3, top bits = min[4+j] >> 4
 *  bytes 8-11: scale[4+j] & 15 | (min[4+j] & 15) << 4 */
Test(gguf, dequant_q4_k)
{
    static const int sc[8] = { 1, 17, 33, 63, 5, 20, 40, 63 }, mn[8] = { 0, 3, 16, 50, 7, 31, 32, 63 };
    uint8_t b[144] = { 0x00, 0x38, 0x00, 0x34,            /* d = 0.5, dmin = 0.25 */
                       0x01, 0x51, 0xa1, 0xff, 0x00, 0x43, 0x90, 0xf2, 0x75, 0xf4, 0x08, 0xff };
    for (int k = 0; k < 128; k++) b[16 + k] = (uint8_t)(k * 7);
    float y[256];
    gguf_dequant(GGUF_TYPE_Q4_K, b, y, 256);
    /* 32-byte chunk c: low nibbles are values 64c..64c+31, high nibbles 64c+32..64c+63. */
    for (int v = 0; v < 256; v++) {
        int c = v / 64, r = v % 64, s = v / 32;
        int q = (b[16 + 32 * c + r % 32] >> (r < 32 ? 0 : 4)) & 15;
        cr_assert_eq(y[v], 0.5f * (float)(sc[s] * q) - 0.25f * (float)mn[s], "value %d", v);
    }
    /* a few worked by hand */
    cr_assert_eq(y[0], 0.0f);
    cr_assert_eq(y[33], -0.75f);
    cr_assert_eq(y[40], 24.75f);
    cr_assert_eq(y[130], 33.25f);
    cr_assert_eq(y[200], 152.0f);
    cr_assert_eq(y[255], 204.75f);
}

/* Q6_K: ql[k] = 13k, qh[k] = 29k + 5, d = 0.125, the scales below. */
Test(gguf, dequant_q6_k)
{
    static const int8_t sc[16] = { -128, -3, 1, 2, 5, 7, 11, 127, -1, 3, 8, -16, 20, 31, 64, -64 };
    uint8_t b[210];
    for (int k = 0; k < 128; k++) b[k] = (uint8_t)(k * 13);
    for (int k = 0; k < 64; k++) b[128 + k] = (uint8_t)(k * 29 + 5);
    memcpy(b + 192, sc, 16);
    b[208] = 0x00, b[209] = 0x30;
    float y[256];
    gguf_dequant(GGUF_TYPE_Q6_K, b, y, 256);
    /* Half h, position r: low 4 bits from ql[64h + r % 64] (nibble r / 64), high 2 bits from
     * qh[32h + r % 32] (bit pair r / 32). */
    for (int v = 0; v < 256; v++) {
        int h = v / 128, r = v % 128;
        int lo = (b[64 * h + r % 64] >> (4 * (r / 64))) & 15;
        int hi = (b[128 + 32 * h + r % 32] >> (2 * (r / 32))) & 3;
        cr_assert_eq(y[v], 0.125f * (float)sc[v / 16] * (float)((lo | hi << 4) - 32), "value %d", v);
    }
    cr_assert_eq(y[0], 256.0f);
    cr_assert_eq(y[100], -4.125f);
    cr_assert_eq(y[150], 11.25f);
    cr_assert_eq(y[255], 200.0f);
}

/* ---- quantise -> dequantise ------------------------------------------------------------------ */

#define F16_QUANTUM 5.9604645e-08f   /* 2^-24: scales cannot be finer */

/* A super-block with mins (Q2_K, Q5_K; sub-blocks of len, scales and mins up to smax, codes up
 * to qmax): the min rounded up costs at most one dmin, which widens the range the step covers;
 * the step rounded up costs at most one d; the error is half the step. */
static float bound_with_mins(const float *x, int64_t b0, int64_t i, int len, int smax, int qmax)
{
    float rmax = 0, rs = 0, maxoff = 0;
    for (int s = 0; s < 256 / len; s++) {
        float lo = 0, hi = 0;
        for (int j = 0; j < len; j++) lo = fminf(lo, x[b0 + len * s + j]), hi = fmaxf(hi, x[b0 + len * s + j]);
        rmax = fmaxf(rmax, hi - lo);
        maxoff = fmaxf(maxoff, -lo);
        if (s == (i - b0) / len) rs = hi - lo;
    }
    float dmin = maxoff / (float)smax * 1.001f + F16_QUANTUM;
    float d = (rmax + dmin) / (float)(qmax * smax) * 1.001f + F16_QUANTUM;
    return 0.5f * ((rs + dmin) / (float)qmax + d) * 1.001f;
}

/* Largest error allowed for value i of block-aligned data x (what each scheme guarantees). */
static float quant_bound(uint32_t type, const float *x, int64_t i)
{
    int64_t b0 = i / gguf_type_block(type) * gguf_type_block(type);
    float amax = 0, lo = 0, hi = 0, lo0 = x[b0], hi0 = x[b0];
    switch (type) {
    case GGUF_TYPE_F32: return 0;
    case GGUF_TYPE_F16: return fabsf(x[i]) * 0x1p-11f + F16_QUANTUM / 2;
    case GGUF_TYPE_BF16: return fabsf(x[i]) * 0x1p-8f;
    case GGUF_TYPE_Q8_0:
        for (int j = 0; j < 32; j++) amax = fmaxf(amax, fabsf(x[b0 + j]));
        return 0.5f * (amax / 127 * 1.002f + F16_QUANTUM) + 1e-9f;
    case GGUF_TYPE_Q4_0:       /* the side opposite the extreme reaches only 7 of 8 steps */
        for (int j = 0; j < 32; j++) amax = fmaxf(amax, fabsf(x[b0 + j]));
        return amax / 8 * 1.002f + 16 * F16_QUANTUM;
    case GGUF_TYPE_Q4_1:
        for (int j = 0; j < 32; j++) lo0 = fminf(lo0, x[b0 + j]), hi0 = fmaxf(hi0, x[b0 + j]);
        return 0.5f * (hi0 - lo0) / 15 * 1.002f + fabsf(lo0) * 0x1p-11f + 2 * F16_QUANTUM;
    case GGUF_TYPE_Q4_K: {     /* half a step of its sub-block, plus what 6-bit scales cost */
        float rmax = 0, rs = 0;
        for (int s = 0; s < 8; s++) {
            lo = hi = 0;
            for (int j = 0; j < 32; j++) lo = fminf(lo, x[b0 + 32 * s + j]), hi = fmaxf(hi, x[b0 + 32 * s + j]);
            rmax = fmaxf(rmax, hi - lo);
            if (s == (i - b0) / 32) rs = hi - lo;
        }
        return 0.5f * rs / 15 + 0.05f * rmax / 15 + 64 * F16_QUANTUM;
    }
    case GGUF_TYPE_Q6_K: {
        float as = 0;
        for (int j = 0; j < 256; j++) amax = fmaxf(amax, fabsf(x[b0 + j]));
        int64_t s0 = i / 16 * 16;
        for (int j = 0; j < 16; j++) as = fmaxf(as, fabsf(x[s0 + j]));
        return 0.5f * (as / 31 + amax / (31 * 127) * 1.01f) * 1.001f + 128 * F16_QUANTUM;
    }
    case GGUF_TYPE_Q5_0:
        for (int j = 0; j < 32; j++) amax = fmaxf(amax, fabsf(x[b0 + j]));
        return amax / 16 * 1.002f + 32 * F16_QUANTUM;
    case GGUF_TYPE_Q5_1:
        for (int j = 0; j < 32; j++) lo0 = fminf(lo0, x[b0 + j]), hi0 = fmaxf(hi0, x[b0 + j]);
        return 0.5f * (hi0 - lo0) / 31 * 1.002f + fabsf(lo0) * 0x1p-11f + 2 * F16_QUANTUM;
    case GGUF_TYPE_Q2_K: return bound_with_mins(x, b0, i, 16, 15, 3);
    case GGUF_TYPE_Q5_K: return bound_with_mins(x, b0, i, 32, 63, 31);
    case GGUF_TYPE_Q3_K: {     /* as Q6_K: codes up to 3, scales up to 31 */
        float as = 0;
        for (int j = 0; j < 256; j++) amax = fmaxf(amax, fabsf(x[b0 + j]));
        for (int j = 0; j < 16; j++) as = fmaxf(as, fabsf(x[i / 16 * 16 + j]));
        return 0.5f * (as / 3 + amax / (3 * 31) * 1.01f) * 1.001f + 32 * F16_QUANTUM;
    }
    case GGUF_TYPE_IQ4_NL:     /* half the widest table gap (89 to 113) in steps of amax / 113 */
        for (int j = 0; j < 32; j++) amax = fmaxf(amax, fabsf(x[b0 + j]));
        return 12 * (amax / 113 * 1.001f + F16_QUANTUM);
    case GGUF_TYPE_IQ4_XS: {   /* the same, with the sub-block step rounded up by at most one d */
        float as = 0;
        for (int j = 0; j < 256; j++) amax = fmaxf(amax, fabsf(x[b0 + j]));
        for (int j = 0; j < 32; j++) as = fmaxf(as, fabsf(x[i / 32 * 32 + j]));
        return 12 * (as / 113 + amax / (113 * 31) * 1.001f + 32 * F16_QUANTUM) * 1.001f;
    }
    }
    return 0;
}

Test(gguf, quantize_dequantize_error_bounds)
{
    enum { N = 256 * 8 };
    static float x[N], y[N];
    static uint8_t q[N * 4];
    const char *shapes[] = { "uniform", "weights", "positive", "negative", "outliers", "tiny",
                             "large", "zero", "constant", "mixed scales" };
    for (size_t k = 0; k < sizeof shapes / sizeof shapes[0]; k++) {
        for (int i = 0; i < N; i++) {
            switch (k) {
            case 0: x[i] = frand(); break;
            case 1: x[i] = 0.02f * (frand() + frand() + frand()); break;
            case 2: x[i] = 0.5f + 0.75f * (frand() + 1); break;
            case 3: x[i] = -0.1f - 3 * (frand() + 1); break;
            case 4: x[i] = rng() % 97 == 0 ? 50 * frand() : 0.1f * frand(); break;
            case 5: x[i] = 1e-6f * frand(); break;
            case 6: x[i] = 3000 * frand(); break;
            case 7: x[i] = 0; break;
            case 8: x[i] = -0.7f; break;
            case 9: x[i] = frand() * ldexpf(1, (int)(i / 16 % 12) - 8); break;
            }
        }
        for (size_t t = 0; t < N_TYPES; t++) {
            uint32_t type = ALL_TYPES[t];
            gguf_quantize(type, x, q, N);
            gguf_dequant(type, q, y, N);
            float worst = 0;
            for (int i = 0; i < N; i++) {
                float e = fabsf(y[i] - x[i]), bound = quant_bound(type, x, i);
                cr_assert(e <= bound, "%s on %s data: value %d is %g for %g (error %g > bound %g)",
                          gguf_type_name(type), shapes[k], i, y[i], x[i], e, bound);
                worst = fmaxf(worst, e);
            }
            if (k == 7) cr_assert_eq(worst, 0.0f, "%s: zeros must stay exact", gguf_type_name(type));
        }
    }
}

/* The quantisers' blocks must be valid for any reader: Q4_K scales and mins use all 6 bits. */
Test(gguf, quantize_q4_k_uses_high_scale_bits)
{
    float x[256];
    for (int i = 0; i < 256; i++) x[i] = (float)(i / 32 + 1) * frand() - (i % 64 < 32 ? 0.5f * (float)(i / 32) : 0);
    uint8_t b[144];
    gguf_quantize(GGUF_TYPE_Q4_K, x, b, 256);
    int top = 0;
    for (int j = 0; j < 8; j++) top |= b[4 + j] >> 6;
    cr_assert(top, "expected some scale or min above 15");
}

/* ---- writer and round trip ---------------------------------------------------------------------- */

Test(gguf, writer_round_trip_metadata)
{
    gguf_writer *w = gguf_writer_new();
    uint8_t u8 = 200, i8 = (uint8_t)-100, u16[2] = { 0x60, 0xea }, i16[2] = { 0xd0, 0x8a };
    uint8_t i32[4] = { 0x00, 0x6c, 0xca, 0x88 };            /* -2000000000 */
    uint8_t u64[8] = { 5, 0, 0, 0, 0, 0, 0, 0x80 };         /* 2^63 + 5 */
    uint8_t i64[8] = { 0xfd, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xbf };   /* -2^62 - 3 */
    uint8_t f64[8];
    double tenth = 0.1;
    memcpy(f64, &tenth, 8);
    gguf_w_value(w, "t.u8", GGUF_VT_U8, &u8, 1);
    gguf_w_value(w, "t.i8", GGUF_VT_I8, &i8, 1);
    gguf_w_value(w, "t.u16", GGUF_VT_U16, u16, 2);
    gguf_w_value(w, "t.i16", GGUF_VT_I16, i16, 2);
    gguf_w_u32(w, "t.u32", 4000000000u);
    gguf_w_value(w, "t.i32", GGUF_VT_I32, i32, 4);
    gguf_w_f32(w, "t.f32", 1.5f);
    gguf_w_bool(w, "t.bool", 7);
    gguf_w_str(w, "t.str", "hello");
    gguf_w_str(w, "t.empty", "");
    gguf_w_value(w, "t.u64", GGUF_VT_U64, u64, 8);
    gguf_w_value(w, "t.i64", GGUF_VT_I64, i64, 8);
    gguf_w_value(w, "t.f64", GGUF_VT_F64, f64, 8);
    const char *strs[] = { "a", "", "ccc" };
    gguf_w_arr_str(w, "t.astr", strs, 3);
    int32_t ints[] = { -1, 2, INT32_MAX, INT32_MIN };
    gguf_w_arr_i32(w, "t.ai32", ints, 4);
    float fl[] = { 0.5f, -INFINITY, 3 };
    gguf_w_arr_f32(w, "t.af32", fl, 3);
    gguf_w_arr_i32(w, "t.aempty", NULL, 0);
    uint8_t au8[] = { GGUF_VT_U8, 0, 0, 0, 3, 0, 0, 0, 0, 0, 0, 0, 1, 255, 3 };
    gguf_w_value(w, "t.au8", GGUF_VT_ARRAY, au8, sizeof au8);
    uint8_t au32[] = { GGUF_VT_U32, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x80 };
    gguf_w_value(w, "t.au32big", GGUF_VT_ARRAY, au32, sizeof au32);
    uint8_t abool[] = { GGUF_VT_BOOL, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0, 1, 0 };
    gguf_w_value(w, "t.abool", GGUF_VT_ARRAY, abool, sizeof abool);
    uint8_t af64[] = { GGUF_VT_F64, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xf8, 0x3f };
    gguf_w_value(w, "t.af64", GGUF_VT_ARRAY, af64, sizeof af64);
    /* [[1, 2], []] as i32 arrays, then [["xy"]] */
    uint8_t nest[] = { GGUF_VT_ARRAY, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0,
                       GGUF_VT_I32, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 2, 0, 0, 0,
                       GGUF_VT_I32, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0 };
    gguf_w_value(w, "t.nested", GGUF_VT_ARRAY, nest, sizeof nest);
    uint8_t nests[] = { GGUF_VT_ARRAY, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0,
                        GGUF_VT_STRING, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0, 'x', 'y' };
    gguf_w_value(w, "t.nested_str", GGUF_VT_ARRAY, nests, sizeof nests);

    uint8_t *buf;
    size_t len;
    char err[FASA_ERRLEN];
    cr_assert_eq(gguf_writer_bytes(w, &buf, &len, err), 0, "%s", err);
    gguf_writer_free(w);
    gguf_file g;
    cr_assert_eq(gguf_parse(&g, buf, len, err), 0, "%s", err);
    cr_assert_eq(g.version, 3);
    cr_assert_eq(g.n_kv, 23);
    cr_assert_eq(g.n_tensors, 0);
    cr_assert_eq(g.alignment, 32);
    cr_assert_eq(g.path[0], 0);
    /* insertion order */
    cr_assert(g.kv[0].key.len == 4 && memcmp(g.kv[0].key.ptr, "t.u8", 4) == 0);
    cr_assert(g.kv[22].key.len == 12 && memcmp(g.kv[22].key.ptr, "t.nested_str", 12) == 0);

    uint32_t u;
    int64_t s;
    float f;
    int b;
    gguf_str str;
    cr_assert(gguf_get_u32(&g, "t.u8", &u) == 0 && u == 200);
    cr_assert(gguf_get_u32(&g, "t.u16", &u) == 0 && u == 60000);
    cr_assert(gguf_get_u32(&g, "t.u32", &u) == 0 && u == 4000000000u);
    cr_assert_eq(gguf_get_u32(&g, "t.i8", &u), FASA_EFORMAT);      /* negative */
    cr_assert_eq(gguf_get_u32(&g, "t.u64", &u), FASA_EFORMAT);     /* too big */
    cr_assert_eq(gguf_get_u32(&g, "t.str", &u), FASA_EFORMAT);
    cr_assert_eq(gguf_get_u32(&g, "t.bool", &u), FASA_EFORMAT);
    cr_assert_eq(gguf_get_u32(&g, "t.missing", &u), FASA_EARG);
    cr_assert(gguf_get_i64(&g, "t.i8", &s) == 0 && s == -100);
    cr_assert(gguf_get_i64(&g, "t.i16", &s) == 0 && s == -30000);
    cr_assert(gguf_get_i64(&g, "t.i32", &s) == 0 && s == -2000000000);
    cr_assert(gguf_get_i64(&g, "t.i64", &s) == 0 && s == -(INT64_C(1) << 62) - 3);
    cr_assert(gguf_get_i64(&g, "t.u32", &s) == 0 && s == 4000000000);
    cr_assert_eq(gguf_get_i64(&g, "t.u64", &s), FASA_EFORMAT);
    cr_assert_eq(gguf_get_i64(&g, "t.f32", &s), FASA_EFORMAT);
    cr_assert(gguf_get_f32(&g, "t.f32", &f) == 0 && f == 1.5f);
    cr_assert(gguf_get_f32(&g, "t.f64", &f) == 0 && f == 0.1f);
    cr_assert_eq(gguf_get_f32(&g, "t.u32", &f), FASA_EFORMAT);
    cr_assert(gguf_get_bool(&g, "t.bool", &b) == 0 && b == 1);
    cr_assert_eq(gguf_get_bool(&g, "t.u8", &b), FASA_EFORMAT);
    cr_assert(gguf_get_str(&g, "t.str", &str) == 0 && str.len == 5 && memcmp(str.ptr, "hello", 5) == 0);
    cr_assert(gguf_get_str(&g, "t.empty", &str) == 0 && str.len == 0);
    cr_assert_eq(gguf_get_str(&g, "t.astr", &str), FASA_EFORMAT);

    const gguf_kv *kv = gguf_find_kv(&g, "t.astr");
    cr_assert(kv && kv->type == GGUF_VT_ARRAY && kv->arr_type == GGUF_VT_STRING && kv->arr_n == 3);
    gguf_str sv[3];
    cr_assert_eq(gguf_arr_strs(kv, sv), 0);
    cr_assert(sv[0].len == 1 && sv[0].ptr[0] == 'a' && sv[1].len == 0 && sv[2].len == 3 &&
              memcmp(sv[2].ptr, "ccc", 3) == 0);
    int32_t iv[4];
    cr_assert_eq(gguf_arr_i32(kv, iv), FASA_EFORMAT);
    kv = gguf_find_kv(&g, "t.ai32");
    cr_assert(gguf_arr_i32(kv, iv) == 0 && iv[0] == -1 && iv[1] == 2 && iv[2] == INT32_MAX && iv[3] == INT32_MIN);
    float fv[3];
    cr_assert_eq(gguf_arr_f32(kv, fv), FASA_EFORMAT);
    cr_assert_eq(gguf_arr_strs(kv, sv), FASA_EFORMAT);
    kv = gguf_find_kv(&g, "t.af32");
    cr_assert(gguf_arr_f32(kv, fv) == 0 && fv[0] == 0.5f && isinf(fv[1]) && fv[2] == 3);
    kv = gguf_find_kv(&g, "t.af64");
    cr_assert(gguf_arr_f32(kv, fv) == 0 && fv[0] == 1.5f);
    kv = gguf_find_kv(&g, "t.aempty");
    cr_assert(kv && kv->arr_n == 0 && kv->arr_type == GGUF_VT_I32 && gguf_arr_i32(kv, iv) == 0);
    kv = gguf_find_kv(&g, "t.au8");
    cr_assert(gguf_arr_i32(kv, iv) == 0 && iv[0] == 1 && iv[1] == 255 && iv[2] == 3);
    kv = gguf_find_kv(&g, "t.au32big");
    cr_assert_eq(gguf_arr_i32(kv, iv), FASA_EFORMAT);
    kv = gguf_find_kv(&g, "t.abool");
    cr_assert(kv->arr_n == 2 && kv->value[0] == 1 && kv->value[1] == 0);
    cr_assert_eq(gguf_arr_i32(kv, iv), FASA_EFORMAT);
    kv = gguf_find_kv(&g, "t.nested");
    cr_assert(kv->arr_type == GGUF_VT_ARRAY && kv->arr_n == 2);
    cr_assert_eq(kv->value[0], GGUF_VT_I32);                      /* first inner header */
    kv = gguf_find_kv(&g, "t.nested_str");
    cr_assert(kv->arr_type == GGUF_VT_ARRAY && kv->arr_n == 1 && memcmp(kv->value + 20, "xy", 2) == 0);
    cr_assert_null(gguf_find_kv(&g, "t.u"));                      /* prefixes do not match */
    cr_assert_null(gguf_find_kv(&g, "t.u8x"));
    gguf_close(&g);
    free(buf);
}

Test(gguf, writer_round_trip_tensors)
{
    gguf_writer *w = gguf_writer_new();
    gguf_w_u32(w, "general.alignment", 64);
    uint8_t *data[N_TYPES];
    int64_t shapes[N_TYPES][4];
    for (size_t i = 0; i < N_TYPES; i++) {
        uint32_t type = ALL_TYPES[i], n_dims = 1 + (uint32_t)(i % 4);
        int64_t *ne = shapes[i], n = 1;
        for (int d = 0; d < 4; d++) ne[d] = 1;
        ne[0] = gguf_type_block(type) * (type == GGUF_TYPE_F32 ? 3 : 2);   /* F32: 3 bytes off 64 */
        for (uint32_t d = 1; d < n_dims; d++) ne[d] = 2 + d;
        for (int d = 0; d < 4; d++) n *= ne[d];
        float *x = malloc((size_t)n * sizeof *x);
        fill_random(x, n, 2.0f);
        data[i] = malloc(gguf_row_bytes(type, n));
        gguf_quantize(type, x, data[i], n);
        char name[32];
        snprintf(name, sizeof name, "w.%zu.%s", i, gguf_type_name(type));
        gguf_w_tensor(w, name, type, n_dims, ne, data[i]);
        free(x);
    }
    uint8_t *buf;
    size_t len;
    char err[FASA_ERRLEN];
    cr_assert_eq(gguf_writer_bytes(w, &buf, &len, err), 0, "%s", err);
    gguf_writer_free(w);
    gguf_file g;
    cr_assert_eq(gguf_parse(&g, buf, len, err), 0, "%s", err);
    cr_assert_eq(g.alignment, 64);
    cr_assert_eq(g.n_tensors, N_TYPES);
    for (size_t i = 0; i < N_TYPES; i++) {
        const gguf_tensor *t = &g.tensors[i];
        char name[32];
        snprintf(name, sizeof name, "w.%zu.%s", i, gguf_type_name(ALL_TYPES[i]));
        cr_assert_eq(gguf_find_tensor(&g, name), t);
        cr_assert_eq(t->type, ALL_TYPES[i]);
        cr_assert_eq(t->n_dims, 1 + i % 4);
        for (int d = 0; d < 4; d++) cr_assert_eq(t->ne[d], shapes[i][d]);
        cr_assert_eq(t->offset % 64, 0);
        cr_assert_eq(((const uint8_t *)t->data - buf) % 64, 0);
        int64_t n = t->ne[0] * t->ne[1] * t->ne[2] * t->ne[3];
        cr_assert_eq(t->nbytes, gguf_row_bytes(t->type, n));
        cr_assert_eq(memcmp(t->data, data[i], t->nbytes), 0);
        free(data[i]);
    }
    cr_assert_null(gguf_find_tensor(&g, "w.0"));
    gguf_close(&g);
    free(buf);
}

static int count_entries(const char *dir)
{
    DIR *d = opendir(dir);
    int n = 0;
    for (struct dirent *e; (e = readdir(d));)
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) n++;
    closedir(d);
    return n;
}

Test(gguf, writer_file_and_open)
{
    char dir[] = "/tmp/gguf_test_XXXXXX", path[64], err[FASA_ERRLEN];
    cr_assert_not_null(mkdtemp(dir));
    snprintf(path, sizeof path, "%s/m.gguf", dir);
    gguf_writer *w = gguf_writer_new();
    gguf_w_str(w, "general.architecture", "llama");
    float x[64];
    fill_random(x, 64, 1);
    uint8_t q[40];
    gguf_quantize(GGUF_TYPE_Q4_1, x, q, 64);
    int64_t ne[2] = { 32, 2 };
    gguf_w_tensor(w, "a", GGUF_TYPE_Q4_1, 2, ne, q);
    cr_assert_eq(gguf_writer_write(w, path, err), 0, "%s", err);
    cr_assert_eq(gguf_writer_write(w, path, err), 0, "%s", err);   /* replaces atomically */
    cr_assert_eq(count_entries(dir), 1, "temporary files left behind");

    gguf_file g;
    cr_assert_eq(gguf_open(&g, path, err), 0, "%s", err);
    cr_assert_str_eq(g.path, path);
    cr_assert_not_null(g.map);
    const gguf_tensor *t = gguf_find_tensor(&g, "a");
    float y[64];
    gguf_dequant(t->type, t->data, y, 64);
    for (int i = 0; i < 64; i++) cr_assert_lt(fabsf(y[i] - x[i]), 0.1f);
    gguf_close(&g);
    gguf_close(&g);                                                /* harmless twice */

    /* a file that fails to parse is named in the message and unmapped */
    FILE *f = fopen(path, "wb");
    fwrite("GGUF\3\0\0\0", 1, 8, f);
    fclose(f);
    cr_assert_lt(gguf_open(&g, path, err), 0);
    cr_assert(strstr(err, path) && strstr(err, "truncated"), "%s", err);
    f = fopen(path, "wb");
    fclose(f);
    cr_assert_lt(gguf_open(&g, path, err), 0);
    cr_assert(strstr(err, path), "%s", err);

    char bad[96];
    snprintf(bad, sizeof bad, "%s/no/such/dir/m.gguf", dir);
    cr_assert_eq(gguf_writer_write(w, bad, err), FASA_EIO);
    cr_assert(strstr(err, bad), "%s", err);
    cr_assert_lt(gguf_open(&g, dir, err), 0);
    cr_assert(strstr(err, "not a regular file"), "%s", err);
    gguf_writer_free(w);
    unlink(path);
    cr_assert_eq(count_entries(dir), 0);
    rmdir(dir);
}

Test(gguf, open_missing)
{
    gguf_file g;
    char err[FASA_ERRLEN];
    cr_assert_eq(gguf_open(&g, "/nonexistent/x.gguf", err), FASA_EIO);
    cr_assert_str_eq(err, "cannot open '/nonexistent/x.gguf': No such file or directory");
    gguf_close(&g);
}

Test(gguf, writer_rejects_bad_input)
{
    char err[FASA_ERRLEN];
    uint8_t *buf;
    size_t len;
    uint8_t data[64] = { 0 };
    struct { const char *what; uint32_t type, n_dims; int64_t ne[4]; const char *needle; } cases[] = {
        { "block", GGUF_TYPE_Q4_0, 1, { 33 }, "not a multiple" },
        { "dims", GGUF_TYPE_F32, 5, { 1, 1, 1, 1 }, "dimensions" },
        { "zero", GGUF_TYPE_F32, 2, { 1, 0 }, "size 0" },
        { "type", 5, 1, { 32 }, "unsupported type 5" },
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        gguf_writer *w = gguf_writer_new();
        gguf_w_tensor(w, "x", cases[i].type, cases[i].n_dims, cases[i].ne, data);
        cr_assert_lt(gguf_writer_bytes(w, &buf, &len, err), 0, "%s", cases[i].what);
        cr_assert(strstr(err, cases[i].needle), "%s", err);
        gguf_writer_free(w);
    }
    gguf_writer *w = gguf_writer_new();
    gguf_w_u32(w, "k", 1);
    gguf_w_u32(w, "k", 2);
    cr_assert_lt(gguf_writer_bytes(w, &buf, &len, err), 0);
    cr_assert(strstr(err, "duplicate metadata key 'k'"), "%s", err);
    gguf_writer_free(w);
    w = gguf_writer_new();
    gguf_w_u32(w, "general.alignment", 48);
    cr_assert_lt(gguf_writer_bytes(w, &buf, &len, err), 0);
    cr_assert(strstr(err, "power of two"), "%s", err);
    gguf_writer_free(w);
    w = gguf_writer_new();
    int64_t ne[1] = { 16 };
    gguf_w_tensor(w, "x", GGUF_TYPE_F32, 1, ne, data);
    gguf_w_tensor(w, "x", GGUF_TYPE_F32, 1, ne, data);
    cr_assert_lt(gguf_writer_bytes(w, &buf, &len, err), 0);
    cr_assert(strstr(err, "duplicate tensor name 'x'"), "%s", err);
    gguf_writer_free(w);
}

/* ---- hostile files ----------------------------------------------------------------------------- */

Test(gguf, every_prefix_fails)
{
    uint8_t *buf;
    size_t len;
    make_sample(&buf, &len);
    gguf_file g;
    char err[FASA_ERRLEN];
    cr_assert_eq(gguf_parse(&g, buf, len, err), 0, "%s", err);
    size_t end = 0;
    for (uint64_t i = 0; i < g.n_tensors; i++) {
        size_t e = (size_t)((const uint8_t *)g.tensors[i].data - buf) + g.tensors[i].nbytes;
        if (e > end) end = e;
    }
    gguf_close(&g);
    for (size_t cut = 0; cut < end; cut++) {
        cr_assert_lt(parse_copy(buf, cut, err), 0, "prefix of %zu bytes parsed", cut);
        cr_assert(err[0] && !strchr(err, '\n'));
    }
    free(buf);
}

Test(gguf, bad_headers)
{
    bb b = { 0 };
    bb_put(&b, "GGML", 4);
    bb_zero(&b, 20);
    expect_fail(&b, "not a GGUF file");
    b.len = 0;
    expect_fail(&b, "truncated");
    build(&b, 1, NULL, 0, 0, 0);
    expect_fail(&b, "GGUF version 1 is not supported");
    build(&b, 4, NULL, 0, 0, 0);
    expect_fail(&b, "GGUF version 4 is not supported");
    build(&b, 0x03000000, NULL, 0, 0, 0);
    expect_fail(&b, "big-endian");
    build(&b, 2, NULL, 0, 0, 0);
    expect_ok(&b);
    build(&b, 3, NULL, 0, 0, 0);
    b.len = 24;                                   /* no padding and no data: still fine */
    expect_ok(&b);

    build(&b, 3, NULL, 0, 0, 0);
    for (int i = 0; i < 8; i++) b.p[16 + i] = 0xff;            /* n_kv = 2^64 - 1 */
    expect_fail(&b, "metadata count 18446744073709551615 is impossible");
    build(&b, 3, NULL, 0, 0, 0);
    b.p[15] = 0x10;                                            /* n_tensors = 2^60 */
    expect_fail(&b, "tensor count 1152921504606846976 is impossible");
    free(b.p);
}

/* One metadata entry with the given raw value after the key. */
static void one_kv(bb *b, const char *key, uint32_t type, const uint8_t *val, size_t n)
{
    b->len = 0;
    bb_put(b, "GGUF", 4);
    bb_u32(b, 3);
    bb_u64(b, 0);
    bb_u64(b, 1);
    bb_str(b, key);
    bb_u32(b, type);
    bb_put(b, val, n);
}

Test(gguf, bad_metadata)
{
    bb b = { 0 }, v = { 0 };
    one_kv(&b, "k", 13, NULL, 0);
    expect_fail(&b, "metadata 'k' has unknown value type 13");

    v.len = 0, bb_u64(&v, 100), bb_put(&v, "abc", 3);          /* string length past the end */
    one_kv(&b, "general.name", GGUF_VT_STRING, v.p, v.len);
    expect_fail(&b, "truncated");
    v.len = 0, bb_u64(&v, UINT64_MAX);
    one_kv(&b, "general.name", GGUF_VT_STRING, v.p, v.len);
    expect_fail(&b, "needs 18446744073709551615 bytes");

    b.len = 0;                                                  /* key length past the end */
    bb_put(&b, "GGUF", 4), bb_u32(&b, 3), bb_u64(&b, 0), bb_u64(&b, 1), bb_u64(&b, 1u << 30);
    bb_zero(&b, 16);
    expect_fail(&b, "the key of metadata entry 0");

    v.len = 0, bb_u32(&v, GGUF_VT_U32), bb_u64(&v, UINT64_MAX / 2), bb_zero(&v, 64);
    one_kv(&b, "big", GGUF_VT_ARRAY, v.p, v.len);
    expect_fail(&b, "metadata 'big' claims 9223372036854775807 array elements");
    v.len = 0, bb_u32(&v, GGUF_VT_STRING), bb_u64(&v, 1000), bb_zero(&v, 64);
    one_kv(&b, "strs", GGUF_VT_ARRAY, v.p, v.len);
    expect_fail(&b, "claims 1000 array elements");
    v.len = 0, bb_u32(&v, GGUF_VT_STRING), bb_u64(&v, 2), bb_str(&v, "ok"), bb_u64(&v, 5), bb_put(&v, "ab", 2);
    one_kv(&b, "strs", GGUF_VT_ARRAY, v.p, v.len);
    expect_fail(&b, "truncated: a metadata string needs 5 bytes");
    v.len = 0, bb_u32(&v, 99), bb_u64(&v, 0);
    one_kv(&b, "arr", GGUF_VT_ARRAY, v.p, v.len);
    expect_fail(&b, "array of unknown value type 99");

    /* nesting: 8 levels are fine, 9 are not */
    for (int depth = 8; depth <= 9; depth++) {
        v.len = 0;
        for (int i = 0; i < depth - 1; i++) bb_u32(&v, GGUF_VT_ARRAY), bb_u64(&v, 1);
        bb_u32(&v, GGUF_VT_U8), bb_u64(&v, 1), bb_u8(&v, 42);
        one_kv(&b, "deep", GGUF_VT_ARRAY, v.p, v.len);
        if (depth == 8) expect_ok(&b);
        else expect_fail(&b, "metadata 'deep' nests arrays more than 8 deep");
    }

    b.len = 0;                                                  /* duplicate keys */
    bb_put(&b, "GGUF", 4), bb_u32(&b, 3), bb_u64(&b, 0), bb_u64(&b, 3);
    bb_str(&b, "a"), bb_u32(&b, GGUF_VT_U8), bb_u8(&b, 1);
    bb_str(&b, "b"), bb_u32(&b, GGUF_VT_U8), bb_u8(&b, 1);
    bb_str(&b, "a"), bb_u32(&b, GGUF_VT_STRING), bb_str(&b, "x");
    expect_fail(&b, "duplicate metadata key 'a'");

    /* keys with control bytes are shown safely, on one line */
    one_kv(&b, "bad\nkey", 77, NULL, 0);
    expect_fail(&b, "metadata 'bad?key' has unknown value type 77");

    uint8_t al[8] = { 0 };
    one_kv(&b, "general.alignment", GGUF_VT_U32, al, 4);
    expect_fail(&b, "general.alignment must be a u32 power of two");
    al[0] = 24;
    one_kv(&b, "general.alignment", GGUF_VT_U32, al, 4);
    expect_fail(&b, "general.alignment must be a u32 power of two");
    al[0] = 32;
    one_kv(&b, "general.alignment", GGUF_VT_U64, al, 8);
    expect_fail(&b, "general.alignment must be a u32 power of two");
    one_kv(&b, "general.alignment", GGUF_VT_U32, al, 4);
    expect_ok(&b);
    free(b.p);
    free(v.p);
}

Test(gguf, bad_tensors)
{
    bb b = { 0 };
    tinfo t[2] = { { "w", 2, { 32, 2 }, GGUF_TYPE_Q8_0, 0 }, { "v", 1, { 8 }, GGUF_TYPE_F32, 96 } };
    build(&b, 3, t, 2, 128, 0);
    expect_ok(&b);
    build(&b, 3, t, 2, 127, 0);
    expect_fail(&b, "tensor 'v' data [");
    expect_fail(&b, "lies past the end of the file");

    t[1].offset = 80;                                          /* misaligned */
    build(&b, 3, t, 2, 128, 0);
    expect_fail(&b, "tensor 'v' offset 80 is not a multiple of the alignment 32");
    build(&b, 3, t, 2, 128, 16);                               /* ... but fine at 16 */
    expect_ok(&b);
    t[1].offset = 64;                                          /* w is [0, 68) */
    build(&b, 3, t, 2, 128, 0);
    expect_fail(&b, "tensors 'w' and 'v' overlap");
    t[1].offset = 0;
    build(&b, 3, t, 2, 128, 0);
    expect_fail(&b, "overlap");
    t[1].offset = 96;
    t[1].name = "w";
    build(&b, 3, t, 2, 128, 0);
    expect_fail(&b, "duplicate tensor name 'w'");
    t[1].name = "v";

    t[0].type = GGUF_TYPE_IQ2_XXS;
    build(&b, 3, t, 2, 128, 0);
    expect_fail(&b, "tensor 'w' has unsupported type 16");
    t[0].type = GGUF_TYPE_Q8_0;
    t[0].ne[0] = 48;
    build(&b, 3, t, 2, 128, 0);
    expect_fail(&b, "tensor 'w' has ne[0] = 48, not a multiple of the Q8_0 block size 32");
    t[0].ne[0] = 32;
    t[0].ne[1] = 0;
    build(&b, 3, t, 2, 128, 0);
    expect_fail(&b, "tensor 'w' has dimension 1 of size 0");
    t[0].ne[1] = UINT64_MAX;
    build(&b, 3, t, 2, 128, 0);
    expect_fail(&b, "tensor 'w' has dimension 1 of size 18446744073709551615");
    t[0].n_dims = 4;
    t[0].ne[1] = t[0].ne[2] = t[0].ne[3] = 1u << 22;           /* 2^66 rows */
    build(&b, 3, t, 2, 128, 0);
    expect_fail(&b, "tensor 'w' is too large");
    t[0].ne[1] = 1u << 30, t[0].ne[2] = 1u << 28, t[0].ne[3] = 1;   /* 2^58 rows x 34 bytes */
    build(&b, 3, t, 2, 128, 0);
    expect_fail(&b, "tensor 'w' is too large");
    t[0].ne[1] = 1u << 20, t[0].ne[2] = 1;                     /* fits, but not in the file */
    build(&b, 3, t, 2, 128, 0);
    expect_fail(&b, "lies past the end of the file");
    t[0].n_dims = 0;
    build(&b, 3, t, 2, 128, 0);
    expect_fail(&b, "tensor 'w' has 0 dimensions (need 1 to 4)");
    t[0].n_dims = 5;
    build(&b, 3, t, 2, 128, 0);
    expect_fail(&b, "has 5 dimensions");
    t[0].n_dims = 2, t[0].ne[1] = 2;
    t[1].offset = UINT64_MAX - 31;                             /* offset + start overflows */
    build(&b, 3, t, 2, 128, 0);
    expect_fail(&b, "tensor 'v' data");

    build(&b, 3, t, 2, 128, 0);                                /* n_tensors larger than what follows */
    b.p[8] = 200;
    expect_fail(&b, "tensor count 200 is impossible");
    free(b.p);
}

/* Thousands of random corruptions of a valid file: the parser may accept or reject each one,
 * but must never read outside the buffer (run under ASan), and what it accepts must be usable. */
Test(gguf, random_mutations_never_crash, .timeout = 120)
{
    uint8_t *base;
    size_t base_len;
    make_sample(&base, &base_len);
    gguf_file g0;
    char err[FASA_ERRLEN];
    cr_assert_eq(gguf_parse(&g0, base, base_len, err), 0, "%s", err);
    size_t header_len = (size_t)((const uint8_t *)g0.tensors[0].data - base);
    gguf_close(&g0);
    static const uint64_t interesting[] = { 0, 1, 2, 3, 4, 5, 7, 8, 9, 12, 31, 32, 33, 255, 256,
                                            0x7fffffff, 0x80000000, 0xffffffff, 0x100000000ull,
                                            INT64_MAX, (uint64_t)INT64_MAX + 1, UINT64_MAX, UINT64_MAX - 7 };
    int accepted = 0;
    float *row = malloc(4096 * sizeof *row);
    for (int iter = 0; iter < 20000; iter++) {
        size_t len = base_len;
        uint8_t *m = malloc(len);
        memcpy(m, base, len);
        int k = 1 + (int)(rng() % 4);
        for (int j = 0; j < k; j++) {
            /* most corruptions land in the header, where the structure is */
            size_t span = rng() % 5 && header_len < len ? header_len : len;
            if (span == 0) break;
            size_t pos = (size_t)(rng() % span);
            switch (rng() % 6) {
            case 0: m[pos] ^= (uint8_t)(1u << (rng() % 8)); break;
            case 1: m[pos] = (uint8_t)rng(); break;
            case 2: case 3: {
                uint64_t v = interesting[rng() % (sizeof interesting / sizeof interesting[0])];
                int w = rng() % 2 ? 8 : 4;
                for (int b = 0; b < w && pos + (size_t)b < len; b++) m[pos + (size_t)b] = (uint8_t)(v >> 8 * b);
                break;
            }
            case 4: len = (size_t)(rng() % (len + 1)); break;
            case 5: if (pos + 1 < len) m[pos] = m[pos + 1] = 0; break;
            }
        }
        uint8_t *exact = malloc(len ? len : 1);
        if (len) memcpy(exact, m, len);
        free(m);
        gguf_file g;
        if (gguf_parse(&g, exact, len, err) == 0) {
            accepted++;
            for (uint64_t i = 0; i < g.n_kv; i++) {
                const gguf_kv *kv = &g.kv[i];
                cr_assert(kv->value >= exact && kv->value <= exact + len);
                if (kv->type == GGUF_VT_ARRAY && kv->arr_type == GGUF_VT_STRING) {
                    gguf_str *s = malloc((size_t)(kv->arr_n ? kv->arr_n : 1) * sizeof *s);
                    cr_assert_eq(gguf_arr_strs(kv, s), 0);
                    for (uint64_t j = 0; j < kv->arr_n; j++)
                        cr_assert((const uint8_t *)s[j].ptr + s[j].len <= exact + len);
                    free(s);
                } else if (kv->type == GGUF_VT_ARRAY && kv->arr_n <= 4096) {
                    gguf_arr_i32(kv, (int32_t *)row);
                    gguf_arr_f32(kv, row);
                }
            }
            for (uint64_t i = 0; i < g.n_tensors; i++) {
                const gguf_tensor *t = &g.tensors[i];
                const uint8_t *d = t->data;
                cr_assert(d >= exact && d + t->nbytes <= exact + len);
                int64_t n = gguf_type_block(t->type);
                gguf_dequant(t->type, d, row, n);
                gguf_dequant(t->type, d + t->nbytes - gguf_type_block_bytes(t->type), row, n);
            }
            gguf_close(&g);
        } else {
            cr_assert(err[0] && !strchr(err, '\n'));
        }
        free(exact);
    }
    cr_log_info("gguf mutations: %d of 20000 accepted", accepted);
    free(row);
    free(base);
}

/* ---- found by fuzzing (fuzz/fuzz_gguf.c) ------------------------------------------------------ */

/* A llama GGUF with the given head count, head dim 16 and one tiny embedding, opened with
 * model_open; returns its status with err filled. */
static int open_heads(uint32_t n_head, uint32_t n_kv_head, char *err)
{
    char dir[] = "/tmp/gguf_test_XXXXXX", path[64];
    cr_assert_not_null(mkdtemp(dir));
    snprintf(path, sizeof path, "%s/m.gguf", dir);
    gguf_writer *w = gguf_writer_new();
    gguf_w_str(w, "general.architecture", "llama");
    gguf_w_u32(w, "llama.block_count", 1);
    gguf_w_u32(w, "llama.embedding_length", 32);
    gguf_w_u32(w, "llama.feed_forward_length", 32);
    gguf_w_u32(w, "llama.attention.head_count", n_head);
    gguf_w_u32(w, "llama.attention.head_count_kv", n_kv_head);
    gguf_w_u32(w, "llama.attention.key_length", 16);
    gguf_w_u32(w, "llama.rope.dimension_count", 16);
    float embd[4 * 32] = { 0 };
    int64_t ne[2] = { 32, 4 };
    gguf_w_tensor(w, "token_embd.weight", GGUF_TYPE_F32, 2, ne, embd);
    cr_assert_eq(gguf_writer_write(w, path, err), 0, "%s", err);
    gguf_writer_free(w);
    model *m = NULL;
    int rc = model_open(&m, path, err);
    model_close(m);
    unlink(path);
    rmdir(dir);
    return rc;
}

/* 2^27 heads of dim 16 are 2^31 values per token: the loader multiplied them in an int
 * (signed overflow, UB) before any tensor was checked. */
Test(gguf, model_rejects_attention_wider_than_int)
{
    char err[FASA_ERRLEN];
    cr_assert_eq(open_heads(1u << 27, 1u << 27, err), FASA_EFORMAT, "%s", err);
    cr_assert(strstr(err, "attention width"), "%s", err);
    cr_assert_eq(open_heads(1u << 17, 1u << 17, err), FASA_EFORMAT, "%s", err);   /* 2^21 */
    cr_assert(strstr(err, "attention width"), "%s", err);
    /* within the limit the loader goes on to the tensors */
    cr_assert_eq(open_heads(2, 1, err), FASA_EMISMATCH, "%s", err);
    cr_assert(strstr(err, "missing tensor"), "%s", err);
}

/* ---- the real model -------------------------------------------------------------------------- */

Test(gguf, real_model)
{
    if (access(REAL_MODEL, R_OK) != 0) cr_skip_test(REAL_MODEL " not found");
    gguf_file g;
    char err[FASA_ERRLEN];
    cr_assert_eq(gguf_open(&g, REAL_MODEL, err), 0, "%s", err);
    cr_assert_eq(g.version, 3);
    cr_assert_eq(g.n_tensors, 272);
    cr_assert_eq(g.alignment, 32);
    uint32_t u;
    cr_assert(gguf_get_u32(&g, "llama.block_count", &u) == 0 && u == 30);
    cr_assert(gguf_get_u32(&g, "llama.embedding_length", &u) == 0 && u == 576);
    gguf_str arch;
    cr_assert(gguf_get_str(&g, "general.architecture", &arch) == 0 && arch.len == 5 &&
              memcmp(arch.ptr, "llama", 5) == 0);
    const gguf_kv *tok = gguf_find_kv(&g, "tokenizer.ggml.tokens");
    cr_assert(tok && tok->arr_type == GGUF_VT_STRING && tok->arr_n == 49152);
    gguf_str *toks = malloc(49152 * sizeof *toks);
    cr_assert_eq(gguf_arr_strs(tok, toks), 0);
    free(toks);
    const gguf_tensor *t = gguf_find_tensor(&g, "token_embd.weight");
    cr_assert_not_null(t);
    cr_assert_eq(t->type, GGUF_TYPE_Q8_0);
    cr_assert(t->n_dims == 2 && t->ne[0] == 576 && t->ne[1] == 49152);
    cr_assert_eq(t->nbytes, 49152ull * 18 * 34);
    float row[1536];
    gguf_dequant(t->type, (const uint8_t *)t->data + 100 * t->nbytes / 49152, row, 576);
    for (int i = 0; i < 576; i++) cr_assert(isfinite(row[i]) && fabsf(row[i]) < 10);
    t = gguf_find_tensor(&g, "blk.0.ffn_down.weight");
    cr_assert(t && t->type == GGUF_TYPE_Q4_1 && t->ne[0] == 1536 && t->ne[1] == 576);
    gguf_dequant(t->type, t->data, row, 1536);
    for (int i = 0; i < 1536; i++) cr_assert(isfinite(row[i]));
    gguf_close(&g);
}

/* test_safetensors.c - formats/safetensors.h: round trips through the writer, one test per
 * rejection rule of the reader (each checks the message names the file and the problem), the
 * sharded index, and a mutation loop that must never crash (run it under ASan by hand:
 * `make sanitize`, or build this file with -fsanitize=address,undefined). */
#include <criterion/criterion.h>
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "safetensors.h"

/* ---- helpers ----------------------------------------------------------------------------- */

static char tmp_dir[64];

static void make_tmp_dir(void)
{
    snprintf(tmp_dir, sizeof tmp_dir, "/tmp/st_test.XXXXXX");
    cr_assert_not_null(mkdtemp(tmp_dir));
}

/* The tests only create plain files in tmp_dir. */
static void remove_tmp_dir(void)
{
    DIR *d = opendir(tmp_dir);
    if (!d) return;
    struct dirent *e;
    char p[512];
    while ((e = readdir(d))) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
        snprintf(p, sizeof p, "%s/%s", tmp_dir, e->d_name);
        unlink(p);
    }
    closedir(d);
    rmdir(tmp_dir);
}

static const char *in_tmp(const char *name)
{
    static char p[4][512];
    static int k;
    k = (k + 1) % 4;
    snprintf(p[k], sizeof p[k], "%s/%s", tmp_dir, name);
    return p[k];
}

static void write_file(const char *path, const void *buf, size_t len)
{
    FILE *fp = fopen(path, "wb");
    cr_assert_not_null(fp, "cannot create %s", path);
    cr_assert_eq(fwrite(buf, 1, len, fp), len);
    fclose(fp);
}

static uint8_t *read_file(const char *path, size_t *len)
{
    FILE *fp = fopen(path, "rb");
    cr_assert_not_null(fp, "cannot open %s", path);
    fseek(fp, 0, SEEK_END);
    *len = (size_t)ftell(fp);
    rewind(fp);
    uint8_t *buf = malloc(*len + 1);
    cr_assert_eq(fread(buf, 1, *len, fp), *len);
    fclose(fp);
    return buf;
}

/* A file image: 8-byte length of json, json, then dlen data bytes of a fixed pattern. */
static uint8_t *image(const char *json, size_t dlen, size_t *len)
{
    size_t n = strlen(json);
    *len = 8 + n + dlen;
    uint8_t *buf = malloc(*len);
    for (int i = 0; i < 8; i++) buf[i] = (uint8_t)((uint64_t)n >> 8 * i);
    memcpy(buf + 8, json, n);
    for (size_t i = 0; i < dlen; i++) buf[8 + n + i] = (uint8_t)(i * 7 + 1);
    return buf;
}

static int parse_image(const char *json, size_t dlen, char *err)
{
    size_t len;
    uint8_t *buf = image(json, dlen, &len);
    st_file f = {0};
    strcpy(f.path, "bad.safetensors");
    int rc = st_parse(&f, buf, len, err);
    if (rc == 0) st_close(&f);
    free(buf);
    return rc;
}

/* The reader must reject json + dlen data bytes with one line naming the file and `needle`. */
#define expect_bad(json, dlen, needle)                                                       \
    do {                                                                                     \
        char err_[ST_ERRLEN] = "";                                                           \
        cr_assert_lt(parse_image(json, dlen, err_), 0, "accepted: %s", json);                \
        cr_assert_not_null(strstr(err_, "'bad.safetensors': "), "no file in: %s", err_);     \
        cr_assert_not_null(strstr(err_, needle), "'%s' not in: %s", needle, err_);           \
        cr_assert_null(strchr(err_, '\n'), "not one line: %s", err_);                        \
    } while (0)

#define expect_good(json, dlen)                                                              \
    do {                                                                                     \
        char err_[ST_ERRLEN] = "";                                                           \
        cr_assert_eq(parse_image(json, dlen, err_), 0, "rejected %s: %s", json, err_);       \
    } while (0)

/* One F32 tensor "a" of shape [2] plus whatever `extra` adds to the top-level object. */
#define ONE_A "\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}"

/* ---- dtypes ------------------------------------------------------------------------------ */

Test(safetensors, dtype_helpers)
{
    static const char *names[] = {"BOOL", "U8", "I8", "I16", "U16", "F16", "BF16", "I32", "U32",
                                  "F32", "I64", "U64", "F64", "F8_E4M3", "F8_E5M2"};
    static const size_t sizes[] = {1, 1, 1, 2, 2, 2, 2, 4, 4, 4, 8, 8, 8, 1, 1};
    cr_assert_eq(sizeof names / sizeof *names, ST_NDTYPE);
    for (int i = 0; i < ST_NDTYPE; i++) {
        cr_assert_str_eq(st_dtype_name((st_dtype)i), names[i]);
        cr_assert_eq(st_dtype_from_name(names[i]), i);
        cr_assert_eq(st_dtype_size((st_dtype)i), sizes[i], "%s", names[i]);
    }
    cr_assert_eq(st_dtype_from_name("F33"), -1);
    cr_assert_eq(st_dtype_from_name("f32"), -1);
    cr_assert_eq(st_dtype_from_name(""), -1);
    cr_assert_eq(st_dtype_size(ST_NDTYPE), 0);

    st_tensor t = {.n_dims = 3, .shape = {2, 3, 4}};
    cr_assert_eq(st_numel(&t), 24);
    t.n_dims = 0;
    cr_assert_eq(st_numel(&t), 1);
    st_tensor big = {.n_dims = 2, .shape = {INT64_MAX, 2}};
    cr_assert_eq(st_numel(&big), -1);
    st_tensor empty = {.n_dims = 3, .shape = {INT64_MAX, INT64_MAX, 0}};
    cr_assert_eq(st_numel(&empty), 0);
}

/* ---- round trip -------------------------------------------------------------------------- */

Test(safetensors, round_trip, .init = make_tmp_dir, .fini = remove_tmp_dir)
{
    float w[6] = {1, 2, 3, 4, 5, -6.5f};
    uint16_t bf[4] = {0x3f80, 0x4000, 0xc040, 0x0001};
    int64_t scalar = -1234567890123LL;
    uint8_t mask[4] = {1, 0, 0, 1};
    uint8_t f8[3] = {0x38, 0x40, 0xb8};
    double f64[2] = {3.14159, -2.5e300};
    const int64_t s23[] = {2, 3}, s4[] = {4}, s0[] = {0}, s22[] = {2, 2}, s3[] = {3},
                  s2[] = {2}, s0x5[] = {5, 0};
    char err[ST_ERRLEN] = "";

    st_writer *wr = st_writer_new();
    cr_assert_not_null(wr);
    /* added out of order: the file must come out sorted by name */
    cr_assert_eq(st_writer_add(wr, "z.weight", ST_F32, 2, s23, w), 0);
    cr_assert_eq(st_writer_add(wr, "b.bias", ST_BF16, 1, s4, bf), 0);
    cr_assert_eq(st_writer_add(wr, "scalar", ST_I64, 0, NULL, &scalar), 0);
    cr_assert_eq(st_writer_add(wr, "empty", ST_U8, 1, s0, NULL), 0);
    cr_assert_eq(st_writer_add(wr, "mask", ST_BOOL, 2, s22, mask), 0);
    cr_assert_eq(st_writer_add(wr, "a.f8", ST_F8_E4M3, 1, s3, f8), 0);
    cr_assert_eq(st_writer_add(wr, "d\"q\\uote\n\x01 \xc3\xa9", ST_F64, 1, s2, f64), 0);
    cr_assert_eq(st_writer_add(wr, "empty2", ST_F16, 2, s0x5, NULL), 0);
    cr_assert_eq(st_writer_meta(wr, "format", "pt"), 0);
    cr_assert_eq(st_writer_meta(wr, "quote\"key", "line\nbreak \xc3\xa9 \xf0\x9f\x98\x80"), 0);
    cr_assert_eq(st_writer_meta(wr, "format", "np"), 0);   /* replaces */
    const char *path = in_tmp("model.safetensors");
    cr_assert_eq(st_writer_write(wr, path, err), 0, "%s", err);
    st_writer_free(wr);

    /* header length: 8 + N is a multiple of 8 and the padding is spaces after the object */
    size_t len;
    uint8_t *raw = read_file(path, &len);
    uint64_t n = 0;
    for (int i = 7; i >= 0; i--) n = n << 8 | raw[i];
    cr_assert_eq((8 + n) % 8, 0, "N = %llu", (unsigned long long)n);
    cr_assert_eq(raw[8], '{');
    size_t last = 8 + n - 1;
    while (raw[last] == ' ') last--;
    cr_assert_eq(raw[last], '}');
    cr_assert_lt(8 + n - 1 - last, 8, "padding longer than needed");
    cr_assert_eq(len, 8 + n + 24 + 8 + 8 + 4 + 3 + 16);
    free(raw);

    st_file f;
    cr_assert_eq(st_open(&f, path, err), 0, "%s", err);
    cr_assert_str_eq(f.path, path);
    cr_assert_eq(f.n_tensors, 8);
    /* tensors are listed by offset, and the writer laid them out by name */
    for (int i = 1; i < f.n_tensors; i++) {
        cr_assert_lt(strcmp(f.tensors[i - 1].name, f.tensors[i].name), 0);
        cr_assert_eq(f.tensors[i - 1].end, f.tensors[i].begin);
    }
    cr_assert_eq(f.tensors[0].begin, 0);

    const st_tensor *t = st_find(&f, "z.weight");
    cr_assert_not_null(t);
    cr_assert_eq(t->dtype, ST_F32);
    cr_assert_eq(t->n_dims, 2);
    cr_assert_eq(t->shape[0], 2);
    cr_assert_eq(t->shape[1], 3);
    cr_assert_eq(st_numel(t), 6);
    cr_assert_eq(t->end - t->begin, sizeof w);
    cr_assert_eq(memcmp(t->data, w, sizeof w), 0);

    t = st_find(&f, "b.bias");
    cr_assert(t && t->dtype == ST_BF16 && t->n_dims == 1 && t->shape[0] == 4);
    cr_assert_eq(memcmp(t->data, bf, sizeof bf), 0);
    t = st_find(&f, "scalar");
    cr_assert(t && t->dtype == ST_I64 && t->n_dims == 0 && st_numel(t) == 1);
    cr_assert_eq(memcmp(t->data, &scalar, 8), 0);
    t = st_find(&f, "empty");
    cr_assert(t && t->dtype == ST_U8 && t->n_dims == 1 && t->shape[0] == 0 && t->begin == t->end);
    t = st_find(&f, "empty2");
    cr_assert(t && t->dtype == ST_F16 && t->n_dims == 2 && t->shape[0] == 5 && t->shape[1] == 0);
    t = st_find(&f, "mask");
    cr_assert(t && t->dtype == ST_BOOL && st_numel(t) == 4);
    cr_assert_eq(memcmp(t->data, mask, 4), 0);
    t = st_find(&f, "a.f8");
    cr_assert(t && t->dtype == ST_F8_E4M3);
    cr_assert_eq(memcmp(t->data, f8, 3), 0);
    t = st_find(&f, "d\"q\\uote\n\x01 \xc3\xa9");
    cr_assert(t && t->dtype == ST_F64);
    cr_assert_eq(memcmp(t->data, f64, sizeof f64), 0);
    cr_assert_null(st_find(&f, "missing"));
    cr_assert_null(st_find(&f, "z.weigh"));

    cr_assert_eq(f.n_meta, 2);
    cr_assert_str_eq(st_meta(&f, "format"), "np");
    cr_assert_str_eq(st_meta(&f, "quote\"key"), "line\nbreak \xc3\xa9 \xf0\x9f\x98\x80");
    cr_assert_null(st_meta(&f, "nope"));
    st_close(&f);
    cr_assert_null(f.tensors);

    /* nothing but the result is left in the directory */
    DIR *d = opendir(tmp_dir);
    struct dirent *e;
    int files = 0;
    while ((e = readdir(d)))
        if (e->d_name[0] != '.') files++;
    closedir(d);
    cr_assert_eq(files, 1);
}

Test(safetensors, writer_exact_bytes, .init = make_tmp_dir, .fini = remove_tmp_dir)
{
    /* the layout example in the header comment, byte for byte */
    const float v[2] = {1, 2};
    const int64_t s2[] = {2};
    char err[ST_ERRLEN];
    st_writer *w = st_writer_new();
    cr_assert_eq(st_writer_add(w, "w", ST_F32, 1, s2, v), 0);
    cr_assert_eq(st_writer_write(w, in_tmp("x.safetensors"), err), 0, "%s", err);
    st_writer_free(w);
    size_t len;
    uint8_t *raw = read_file(in_tmp("x.safetensors"), &len);
    const char *json = "{\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}  ";
    cr_assert_eq(len, 72);
    cr_assert_eq(memcmp(raw, "\x38\0\0\0\0\0\0\0", 8), 0);
    cr_assert_eq(memcmp(raw + 8, json, 56), 0);
    cr_assert_eq(memcmp(raw + 64, v, 8), 0);
    free(raw);
}

Test(safetensors, writer_empty_and_overwrite, .init = make_tmp_dir, .fini = remove_tmp_dir)
{
    char err[ST_ERRLEN];
    const char *path = in_tmp("e.safetensors");
    write_file(path, "old contents", 12);
    st_writer *w = st_writer_new();
    cr_assert_eq(st_writer_write(w, path, err), 0, "%s", err);
    st_writer_free(w);
    st_file f;
    cr_assert_eq(st_open(&f, path, err), 0, "%s", err);
    cr_assert_eq(f.n_tensors, 0);
    cr_assert_eq(f.n_meta, 0);
    cr_assert_eq(f.len, 16);
    st_close(&f);
}

Test(safetensors, writer_rejects, .init = make_tmp_dir, .fini = remove_tmp_dir)
{
    const int64_t ok[] = {2}, neg[] = {-1}, nine[9] = {1, 1, 1, 1, 1, 1, 1, 1, 1};
    const int64_t huge[] = {INT64_MAX / 2, 4};
    const float v[2] = {0};
    char err[ST_ERRLEN] = "";
    st_writer *w = st_writer_new();
    cr_assert_eq(st_writer_add(w, "x", ST_NDTYPE, 1, ok, v), ST_EARG);
    cr_assert_eq(st_writer_add(w, "x", ST_F32, 9, nine, v), ST_EARG);
    cr_assert_eq(st_writer_add(w, "x", ST_F32, 1, neg, v), ST_EARG);
    cr_assert_eq(st_writer_add(w, "x", ST_F32, 2, huge, v), ST_EARG);
    cr_assert_eq(st_writer_add(w, "x", ST_F32, 1, ok, NULL), ST_EARG);
    cr_assert_eq(st_writer_add(w, "__metadata__", ST_F32, 1, ok, v), ST_EARG);
    cr_assert_eq(st_writer_add(w, "bad\xff", ST_F32, 1, ok, v), ST_EARG);
    cr_assert_eq(st_writer_add(w, NULL, ST_F32, 1, ok, v), ST_EARG);
    cr_assert_eq(st_writer_meta(w, "k", "\xc0\x80"), ST_EARG);

    /* a missing directory: reported, and nothing created */
    cr_assert_eq(st_writer_add(w, "x", ST_F32, 1, ok, v), 0);
    cr_assert_lt(st_writer_write(w, in_tmp("no/such/dir.safetensors"), err), 0);
    cr_assert_not_null(strstr(err, "no/such/dir.safetensors"), "%s", err);
    cr_assert_not_null(strstr(err, "No such file"), "%s", err);

    /* duplicate names are caught at write time, before any file exists */
    cr_assert_eq(st_writer_add(w, "x", ST_F32, 1, ok, v), 0);
    cr_assert_lt(st_writer_write(w, in_tmp("dup.safetensors"), err), 0);
    cr_assert_not_null(strstr(err, "duplicate tensor name 'x'"), "%s", err);
    cr_assert_eq(access(in_tmp("dup.safetensors"), F_OK), -1);
    st_writer_free(w);

    /* a target that cannot be replaced (a non-empty directory): the temp file is removed */
    mkdir(in_tmp("target"), 0755);
    write_file(in_tmp("target/keep"), "x", 1);
    w = st_writer_new();
    cr_assert_eq(st_writer_add(w, "x", ST_F32, 1, ok, v), 0);
    cr_assert_lt(st_writer_write(w, in_tmp("target"), err), 0);
    cr_assert_not_null(strstr(err, "cannot rename"), "%s", err);
    st_writer_free(w);
    DIR *d = opendir(tmp_dir);
    struct dirent *e;
    while ((e = readdir(d))) cr_assert_null(strstr(e->d_name, ".tmp."), "left %s", e->d_name);
    closedir(d);
    unlink(in_tmp("target/keep"));
    rmdir(in_tmp("target"));
}

/* ---- what the reader accepts ------------------------------------------------------------- */

Test(safetensors, parse_minimal_and_padded)
{
    expect_good("{}", 0);
    expect_good("{}      ", 0);
    expect_good(" \t\r\n{" ONE_A "}   ", 8);
    expect_good("{\"__metadata__\":{}}", 0);
    /* zero-element tensors may share an offset with each other and with the next tensor */
    expect_good("{\"e\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[0,0]},"
                "\"f\":{\"dtype\":\"I8\",\"shape\":[3,0],\"data_offsets\":[0,0]}," ONE_A "}", 8);
    /* fields in any order; escapes and surrogate pairs in names */
    size_t len;
    uint8_t *buf = image("{\"\\u00e9\\ud83d\\ude00\\/\\t\":{\"data_offsets\":[0,2],\"shape\":[],"
                         "\"dtype\":\"I16\"},\"__metadata__\":{\"k\":\"v\\\"\"}}", 2, &len);
    st_file f = {0};
    char err[ST_ERRLEN];
    cr_assert_eq(st_parse(&f, buf, len, err), 0, "%s", err);
    cr_assert_eq(f.n_tensors, 1);
    cr_assert_str_eq(f.tensors[0].name, "\xc3\xa9\xf0\x9f\x98\x80/\t");
    cr_assert_eq(f.tensors[0].n_dims, 0);
    cr_assert_eq(f.tensors[0].data, buf + len - 2);
    cr_assert_str_eq(st_meta(&f, "k"), "v\"");
    st_close(&f);
    free(buf);
}

Test(safetensors, parse_from_memory_message)
{
    char err[ST_ERRLEN];
    st_file f = {0};
    cr_assert_lt(st_parse(&f, "\x02\0\0\0\0\0\0\0[]", 10, err), 0);
    cr_assert_eq(strncmp(err, "safetensors: ", 13), 0, "%s", err);
    cr_assert_not_null(strstr(err, "not a JSON object"), "%s", err);
    st_close(&f);   /* safe after a failed parse */
}

/* ---- one test per rejection rule --------------------------------------------------------- */

Test(safetensors, reject_truncated)
{
    char err[ST_ERRLEN];
    st_file f = {0};
    strcpy(f.path, "bad.safetensors");
    cr_assert_lt(st_parse(&f, "\x08\0\0\0", 4, err), 0);
    cr_assert_not_null(strstr(err, "'bad.safetensors': file too small (4 bytes)"), "%s", err);
    cr_assert_lt(st_parse(&f, "", 0, err), 0);
    cr_assert_not_null(strstr(err, "too small"), "%s", err);

    /* the header length points past the end */
    size_t len;
    uint8_t *buf = image("{" ONE_A "}", 8, &len);
    for (size_t cut = 8; cut < len - 8; cut++) {
        cr_assert_lt(st_parse(&f, buf, cut, err), 0);
        cr_assert_not_null(strstr(err, "past the end"), "cut %zu: %s", cut, err);
    }
    /* header complete, data cut short */
    cr_assert_lt(st_parse(&f, buf, len - 1, err), 0);
    cr_assert_not_null(strstr(err, "exceed the data section of 7 bytes"), "%s", err);
    free(buf);
}

Test(safetensors, reject_header_too_large)
{
    char err[ST_ERRLEN];
    uint8_t buf[16] = {0};
    uint64_t n = 100000001;
    for (int i = 0; i < 8; i++) buf[i] = (uint8_t)(n >> 8 * i);
    st_file f = {0};
    strcpy(f.path, "bad.safetensors");
    cr_assert_lt(st_parse(&f, buf, sizeof buf, err), 0);
    cr_assert_not_null(strstr(err, "header length 100000001 exceeds the limit"), "%s", err);
    memset(buf, 0xff, 8);   /* 2^64 - 1: must not wrap around any size computation */
    cr_assert_lt(st_parse(&f, buf, sizeof buf, err), 0);
    cr_assert_not_null(strstr(err, "exceeds the limit"), "%s", err);
}

Test(safetensors, reject_not_json)
{
    expect_bad("hello", 0, "not valid JSON");
    expect_bad("", 0, "not valid JSON: unexpected end");
    expect_bad("[]", 0, "header is not a JSON object");
    expect_bad("{\"a\":1,}", 0, "expected a string key");
    expect_bad("{\"a\" 1}", 0, "expected ':'");
    expect_bad("{\"a\":[1 2]}", 0, "expected ',' or ']'");
    expect_bad("{\"a\":01}", 0, "leading zero");
    expect_bad("{\"a\":-}", 0, "invalid number");
    expect_bad("{\"a\":1.}", 0, "invalid number");
    expect_bad("{\"a\":tru}", 0, "invalid literal, expected 'true'");
    expect_bad("{\"a\":nul", 0, "invalid literal, expected 'null'");
    expect_bad("{\"a\":?}", 0, "unexpected character '?'");
    expect_bad("{'a':1}", 0, "expected a string key");
    expect_bad("{\"a\":\"x", 0, "unterminated string");
    expect_bad("{\"a\":\"\\x\"}", 0, "invalid escape");
    expect_bad("{\"a\":\"\\u12g4\"}", 0, "bad hex digit");
    expect_bad("{\"a\":\"\\ud800\"}", 0, "unpaired surrogate");
    expect_bad("{\"a\":\"\\udc00\\ud800\"}", 0, "unpaired surrogate");
    expect_bad("{\"a\":\"\\ud800\\u0041\"}", 0, "unpaired surrogate");
    expect_bad("{\"a\":\"\\u0000\"}", 0, "\\u0000");
    expect_bad("{\"a\":\"tab\there\"}", 0, "control character 0x09");
    expect_bad("{\"a\":\"\xc0\xaf\"}", 0, "invalid UTF-8");       /* overlong '/' */
    expect_bad("{\"a\":\"\xed\xa0\x80\"}", 0, "invalid UTF-8");   /* encoded surrogate */
    expect_bad("{\"a\":\"\xe2\x82\"}", 0, "invalid UTF-8");       /* cut short */
    expect_bad("{} x", 0, "unexpected data after the JSON value");
    expect_bad("{}{}", 0, "unexpected data after");

    char deep[300];
    memset(deep, '[', 200);
    memset(deep + 200, ']', 99);
    deep[299] = 0;
    expect_bad(deep, 0, "nested deeper than 64");
}

Test(safetensors, reject_offsets_out_of_range)
{
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}", 8,
               "tensor 'a' data_offsets [0, 16] exceed the data section of 8 bytes");
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,16]}}", 8,
               "exceed the data section");
    expect_bad("{\"a\":{\"dtype\":\"U8\",\"shape\":[0],"
               "\"data_offsets\":[9223372036854775807,9223372036854775807]}}", 8,
               "exceed the data section");
    expect_bad("{\"a\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[6,4]}}", 8,
               "tensor 'a' data_offsets [6, 4] begin after end");
    expect_bad("{\"a\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[-2,0]}}", 8,
               "data_offsets is not [begin, end]");
    expect_bad("{\"a\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[0,2,4]}}", 8,
               "data_offsets is not [begin, end]");
    expect_bad("{\"a\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[0]}}", 8,
               "data_offsets is not [begin, end]");
    expect_bad("{\"a\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":{\"b\":0}}}", 8,
               "data_offsets is not [begin, end]");
    expect_bad("{\"a\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[0,2.0]}}", 8,
               "data_offsets is not [begin, end]");
    expect_bad("{\"a\":{\"dtype\":\"U8\",\"shape\":[2],"
               "\"data_offsets\":[0,99999999999999999999999]}}", 8,
               "data_offsets is not [begin, end]");
}

Test(safetensors, reject_overlap)
{
    expect_bad("{" ONE_A ",\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}", 12,
               "tensor 'b' data_offsets [4, 12] overlap 'a' [0, 8]");
    expect_bad("{" ONE_A ",\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8,
               "overlap");
    /* an empty tensor inside another one still overlaps it */
    expect_bad("{" ONE_A ",\"e\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[4,4]}}", 8,
               "tensor 'e' data_offsets [4, 4] overlap 'a'");
}

Test(safetensors, reject_gap)
{
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}", 12,
               "gap in the data section: bytes [0, 4) before tensor 'a'");
    expect_bad("{" ONE_A ",\"b\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[10,12]}}", 12,
               "bytes [8, 10) before tensor 'b'");
}

Test(safetensors, reject_size_mismatch)
{
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,20]}}", 24,
               "tensor 'a' data_offsets span 20 bytes but shape [2, 3] of F32 needs 24");
    expect_bad("{\"a\":{\"dtype\":\"BF16\",\"shape\":[],\"data_offsets\":[0,4]}}", 4,
               "shape [] of BF16 needs 2");
    expect_bad("{\"a\":{\"dtype\":\"F64\",\"shape\":[4294967296,4294967296],"
               "\"data_offsets\":[0,0]}}", 0, "overflows 64 bits");
    expect_bad("{\"a\":{\"dtype\":\"F64\",\"shape\":[1152921504606846976],"   /* 2^60 x 8 */
               "\"data_offsets\":[0,0]}}", 0, "overflows 64 bits");
}

Test(safetensors, reject_bad_shape)
{
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[-2],\"data_offsets\":[0,8]}}", 8,
               "tensor 'a' shape[0] is not a non-negative integer");
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[2,\"3\"],\"data_offsets\":[0,8]}}", 8,
               "shape[1] is not a non-negative integer");
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[2e0],\"data_offsets\":[0,8]}}", 8,
               "shape[0] is not");
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":2,\"data_offsets\":[0,8]}}", 8,
               "shape is not an array");
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1,1,1,1,2],\"data_offsets\":[0,8]}}",
               8, "shape has 9 dimensions, more than 8");
    expect_good("{\"a\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1,1,1,2],\"data_offsets\":[0,8]}}",
                8);
}

Test(safetensors, reject_unknown_dtype)
{
    expect_bad("{\"a\":{\"dtype\":\"F33\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8,
               "tensor 'a' has unknown dtype 'F33'");
    expect_bad("{\"a\":{\"dtype\":\"f32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8,
               "unknown dtype 'f32'");
    expect_bad("{\"a\":{\"dtype\":4,\"shape\":[2],\"data_offsets\":[0,8]}}", 8,
               "unknown dtype '(not a string)'");
}

Test(safetensors, reject_bad_entries)
{
    expect_bad("{\"a\":{\"shape\":[2],\"data_offsets\":[0,8]}}", 8, "tensor 'a' has no dtype");
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"data_offsets\":[0,8]}}", 8, "tensor 'a' has no shape");
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[2]}}", 8, "tensor 'a' has no data_offsets");
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8],\"x\":1}}", 8,
               "tensor 'a' has unknown field 'x'");
    expect_bad("{\"a\":[0,8]}", 8, "tensor 'a' entry is not an object");
    /* hostile names are shown on one line, bounded */
    expect_bad("{\"a\\nb\":7}", 0, "tensor 'a?b' entry");
}

Test(safetensors, reject_bad_metadata)
{
    expect_bad("{\"__metadata__\":{\"n\":1}}", 0, "__metadata__ value of 'n' is not a string");
    expect_bad("{\"__metadata__\":{\"a\":\"x\",\"n\":null}}", 0, "value of 'n' is not a string");
    expect_bad("{\"__metadata__\":{\"o\":{}}}", 0, "not a string");
    expect_bad("{\"__metadata__\":[\"a\"]}", 0, "__metadata__ is not an object");
    expect_bad("{\"__metadata__\":\"x\"}", 0, "__metadata__ is not an object");
}

Test(safetensors, reject_duplicate_key)
{
    expect_bad("{" ONE_A "," ONE_A "}", 8, "duplicate key 'a'");
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}",
               8, "duplicate key 'dtype'");
    expect_bad("{\"__metadata__\":{\"k\":\"1\",\"j\":\"2\",\"k\":\"3\"}}", 0, "duplicate key 'k'");
    expect_bad("{\"__metadata__\":{},\"__metadata__\":{}}", 0, "duplicate key '__metadata__'");
    /* the same name spelled with an escape is the same key */
    expect_bad("{" ONE_A ",\"\\u0061\":{}}", 8, "duplicate key 'a'");
}

Test(safetensors, reject_trailing_bytes)
{
    expect_bad("{" ONE_A "}", 9, "1 trailing bytes after the last tensor");
    expect_bad("{}", 3, "3 trailing bytes");
    expect_bad("{" ONE_A "}", 16, "8 + header 54 + data 8 != file size 78");
}

/* ---- files ------------------------------------------------------------------------------- */

Test(safetensors, open_missing_path)
{
    char err[ST_ERRLEN];
    st_file f;
    cr_assert_lt(st_open(&f, "/nonexistent/dir/model.safetensors", err), 0);
    cr_assert_str_eq(err, "cannot open '/nonexistent/dir/model.safetensors': "
                          "No such file or directory");
    cr_assert_lt(st_open(&f, "/", err), 0);
    cr_assert_str_eq(err, "cannot open '/': not a regular file");
    st_close(&f);
}

Test(safetensors, open_small_and_bad_files, .init = make_tmp_dir, .fini = remove_tmp_dir)
{
    char err[ST_ERRLEN];
    st_file f;
    write_file(in_tmp("empty.safetensors"), "", 0);
    cr_assert_lt(st_open(&f, in_tmp("empty.safetensors"), err), 0);
    cr_assert_not_null(strstr(err, "empty.safetensors': file too small (0 bytes)"), "%s", err);
    write_file(in_tmp("five.safetensors"), "\x01\0\0\0\0", 5);
    cr_assert_lt(st_open(&f, in_tmp("five.safetensors"), err), 0);
    cr_assert_not_null(strstr(err, "five.safetensors': file too small (5 bytes)"), "%s", err);
    write_file(in_tmp("json.safetensors"), "\x02\0\0\0\0\0\0\0{]", 10);
    cr_assert_lt(st_open(&f, in_tmp("json.safetensors"), err), 0);
    cr_assert_not_null(strstr(err, "json.safetensors': header is not valid JSON: expected a "
                                   "string key at byte 9"), "%s", err);
    st_close(&f);
}

/* ---- sharded ----------------------------------------------------------------------------- */

static void write_shard(const char *name, const char *t1, const char *t2, const float *v)
{
    char err[ST_ERRLEN];
    const int64_t s2[] = {2};
    st_writer *w = st_writer_new();
    cr_assert_eq(st_writer_add(w, t1, ST_F32, 1, s2, v), 0);
    if (t2) cr_assert_eq(st_writer_add(w, t2, ST_F32, 1, s2, v + 2), 0);
    cr_assert_eq(st_writer_write(w, in_tmp(name), err), 0, "%s", err);
    st_writer_free(w);
}

#define INDEX_JSON(extra)                                                                    \
    "{\"metadata\": {\"total_size\": 24, \"ratio\": 0.5},\n"                                 \
    " \"weight_map\": {\"l0.q\": \"s-1.safetensors\", \"l0.k\": \"s-1.safetensors\",\n"     \
    "                \"l1.q\": \"s-2.safetensors\"" extra "}}\n"

Test(safetensors, sharded_round_trip, .init = make_tmp_dir, .fini = remove_tmp_dir)
{
    const float v[4] = {1, 2, 3, 4};
    char err[ST_ERRLEN];
    write_shard("s-1.safetensors", "l0.q", "l0.k", v);
    write_shard("s-2.safetensors", "l1.q", NULL, v + 2);
    const char *idx = INDEX_JSON("");
    write_file(in_tmp("model.safetensors.index.json"), idx, strlen(idx));

    for (int by_file = 0; by_file < 2; by_file++) {
        st_sharded s;
        const char *p = by_file ? in_tmp("model.safetensors.index.json") : tmp_dir;
        cr_assert_eq(st_sharded_open(&s, p, err), 0, "%s", err);
        cr_assert_eq(s.n_files, 2);
        const st_file *owner = NULL;
        const st_tensor *t = st_sharded_find(&s, "l1.q", &owner);
        cr_assert_not_null(t);
        cr_assert_eq(owner, &s.files[1]);
        cr_assert_not_null(strstr(owner->path, "s-2.safetensors"));
        cr_assert_eq(memcmp(t->data, v + 2, 8), 0);
        t = st_sharded_find(&s, "l0.k", &owner);
        cr_assert(t && owner == &s.files[0]);
        cr_assert_eq(memcmp(t->data, v + 2, 8), 0);
        cr_assert_not_null(st_sharded_find(&s, "l0.q", NULL));
        cr_assert_null(st_sharded_find(&s, "l2.q", &owner));
        st_sharded_close(&s);
        cr_assert_eq(s.n_files, 0);
    }
}

Test(safetensors, sharded_errors, .init = make_tmp_dir, .fini = remove_tmp_dir)
{
    const float v[4] = {1, 2, 3, 4};
    char err[ST_ERRLEN];
    st_sharded s;
    const char *idx_path = in_tmp("model.safetensors.index.json");
    write_shard("s-1.safetensors", "l0.q", "l0.k", v);

    cr_assert_lt(st_sharded_open(&s, tmp_dir, err), 0);
    cr_assert_not_null(strstr(err, "cannot open '"), "%s", err);
    cr_assert_not_null(strstr(err, "model.safetensors.index.json': No such file"), "%s", err);

    /* the second shard is missing */
    const char *idx = INDEX_JSON("");
    write_file(idx_path, idx, strlen(idx));
    cr_assert_lt(st_sharded_open(&s, idx_path, err), 0);
    cr_assert_not_null(strstr(err, "s-2.safetensors': No such file or directory"), "%s", err);
    cr_assert_eq(s.n_files, 0);

    /* a shard without the tensor the index promises */
    write_shard("s-2.safetensors", "l1.q", NULL, v);
    idx = INDEX_JSON(", \"l1.v\": \"s-2.safetensors\"");
    write_file(idx_path, idx, strlen(idx));
    cr_assert_eq(st_sharded_open(&s, idx_path, err), ST_EMISMATCH);
    cr_assert_not_null(strstr(err, "index.json': tensor 'l1.v' is mapped to 's-2.safetensors', "
                                   "which has no such tensor"), "%s", err);

    const char *bad[][2] = {
        {"{\"weight_map\": [1]}", "no \"weight_map\" object"},
        {"{\"weight_map\": {\"a\": 1}}", "weight_map entry 'a' is not a relative file name"},
        {"{\"weight_map\": {\"a\": \"../s-1.safetensors\"}}", "not a relative file name"},
        {"{\"weight_map\": {\"a\": \"/etc/passwd\"}}", "not a relative file name"},
        {"{\"weight_map\": {\"a\": \"x\", \"a\": \"y\"}}", "duplicate key 'a'"},
        {"{\"weight_map\": {}", "not valid JSON: expected ',' or '}' at byte 17"},
        {"[]", "no \"weight_map\" object"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        write_file(idx_path, bad[i][0], strlen(bad[i][0]));
        cr_assert_lt(st_sharded_open(&s, idx_path, err), 0, "%s", bad[i][0]);
        cr_assert_not_null(strstr(err, "index.json': "), "%s", err);
        cr_assert_not_null(strstr(err, bad[i][1]), "'%s' not in: %s", bad[i][1], err);
    }
}

/* ---- hostile input ----------------------------------------------------------------------- */

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static uint64_t rng(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}

Test(safetensors, mutations_never_crash)
{
    /* A valid two-tensor file with metadata; variants flip bytes, write JSON-significant
     * characters, change the length field, and cut the file. Run under ASan to make it count. */
    const char *json = "{\"__metadata__\":{\"format\":\"pt\",\"k\\u00e9\":\"v\\n\"},"
                       "\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                       "\"b\":{\"dtype\":\"BF16\",\"shape\":[2,1],\"data_offsets\":[8,12]}}  ";
    static const char special[] = "{}[]\",:\\u0123456789-eE. \x00\xff\xc3\xed";
    size_t len;
    uint8_t *orig = image(json, 12, &len);
    char err[ST_ERRLEN];
    st_file f = {0};
    cr_assert_eq(st_parse(&f, orig, len, err), 0, "%s", err);
    st_close(&f);

    int accepted = 0;
    for (int iter = 0; iter < 2000; iter++) {
        size_t n = len;
        uint8_t *buf = malloc(len);   /* exact size, so ASan sees any overread */
        memcpy(buf, orig, len);
        int edits = 1 + (int)(rng() % 4);
        for (int e = 0; e < edits && n > 0; e++) {
            size_t at = (size_t)(rng() % n);
            switch (rng() % 5) {
            case 0: buf[at] ^= (uint8_t)(1u << rng() % 8); break;
            case 1: buf[at] = (uint8_t)special[rng() % (sizeof special - 1)]; break;
            case 2: buf[at] = (uint8_t)rng(); break;
            case 3: buf[rng() % 8] = (uint8_t)rng(); break;   /* the length field */
            case 4: n = at; break;                           /* truncate */
            }
        }
        strcpy(f.path, "fuzz.safetensors");
        memset(err, 0, sizeof err);
        int rc = st_parse(&f, buf, n, err);
        if (rc == 0) {
            /* whatever was accepted must be internally consistent */
            accepted++;
            uint64_t pos = 0;
            for (int i = 0; i < f.n_tensors; i++) {
                const st_tensor *t = &f.tensors[i];
                cr_assert_eq(t->begin, pos);
                cr_assert_eq(t->end - t->begin, (uint64_t)st_numel(t) * st_dtype_size(t->dtype));
                cr_assert((const uint8_t *)t->data + (t->end - t->begin) <= buf + n);
                cr_assert_eq(st_find(&f, t->name), t);
                pos = t->end;
            }
            uint64_t hlen = 0;
            for (int i = 7; i >= 0; i--) hlen = hlen << 8 | buf[i];
            cr_assert_eq(8 + hlen + pos, n);
        } else {
            cr_assert_lt(rc, 0);
            cr_assert_gt(strlen(err), 0, "no message (iteration %d)", iter);
            cr_assert_null(strchr(err, '\n'), "not one line: %s", err);
            cr_assert_eq(strncmp(err, "'fuzz.safetensors': ", 20), 0, "%s", err);
            cr_assert_null(f.tensors);
        }
        st_close(&f);
        free(buf);
    }
    /* some edits (e.g. inside the data or a metadata value) keep the file valid */
    cr_assert_gt(accepted, 0);
    cr_assert_lt(accepted, 2000);
    free(orig);
}

/* tokenize.c - test driver for lib/tokenizer: encodes byte strings read from stdin.
 *
 *   tokenize MODEL < records          MODEL: a tokenizer.json or a GGUF file
 *   tokenize --bench FILE MODEL       encode FILE (whole, then line by line), print tokens/s
 *   tokenize --decode MODEL < ids     one line of ids in, their bytes out
 *
 * A record is a u32 little-endian length, one flag byte (bit 0: parse special tokens; bit 1:
 * also decode) and that many bytes, which may be any bytes (invalid UTF-8, NULs). For each
 * record one line of space-separated ids is printed (with bit 1, then a tab and the hex of the
 * concatenated decoded bytes), or "ERROR <status>". scripts/tokenizer_check.py drives it.
 */
#include "tokenizer.h"
#include "gguf.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int load_gguf(tokenizer **out, const char *path, char *err)
{
    gguf_file g;
    gguf_str pre = { "default", 7 };
    const gguf_kv *kt, *km, *ky;
    uint64_t nv, nm;
    gguf_str *s = NULL;
    const char **p = NULL;
    uint64_t *l = NULL;
    int32_t *types = NULL;
    char prebuf[64];
    uint32_t bos, eos;
    int rc;

    if ((rc = gguf_open(&g, path, err)) < 0) return rc;
    kt = gguf_find_kv(&g, "tokenizer.ggml.tokens");
    km = gguf_find_kv(&g, "tokenizer.ggml.merges");
    ky = gguf_find_kv(&g, "tokenizer.ggml.token_type");
    if (!kt || kt->type != GGUF_VT_ARRAY || kt->arr_type != GGUF_VT_STRING) {
        gguf_close(&g);
        return fasa_error(err, FASA_EFORMAT, "'%s': no tokenizer.ggml.tokens", path);
    }
    gguf_get_str(&g, "tokenizer.ggml.pre", &pre);
    snprintf(prebuf, sizeof prebuf, "%.*s", (int)(pre.len < 63 ? pre.len : 63), pre.ptr);
    nv = kt->arr_n;
    nm = km && km->type == GGUF_VT_ARRAY && km->arr_type == GGUF_VT_STRING ? km->arr_n : 0;
    s = calloc(nv + nm + 1, sizeof *s);
    p = calloc(nv + nm + 1, sizeof *p);
    l = calloc(nv + nm + 1, sizeof *l);
    if (ky && ky->type == GGUF_VT_ARRAY && ky->arr_n == nv) types = calloc(nv + 1, sizeof *types);
    if (!s || !p || !l) rc = fasa_error(err, FASA_ENOMEM, "out of memory");
    else if (gguf_arr_strs(kt, s) < 0 || (nm && gguf_arr_strs(km, s + nv) < 0) || (types && gguf_arr_i32(ky, types) < 0))
        rc = fasa_error(err, FASA_EFORMAT, "'%s': malformed tokenizer arrays", path);
    else {
        for (uint64_t i = 0; i < nv + nm; i++) p[i] = s[i].ptr, l[i] = s[i].len;
        rc = tokenizer_load_vocab(out, (int)nv, p, l, types, (int)nm, p + nv, l + nv, prebuf, err);
    }
    if (rc == 0) {
        int b = gguf_get_u32(&g, "tokenizer.ggml.bos_token_id", &bos) == 0 ? (int)bos : -1;
        int e = gguf_get_u32(&g, "tokenizer.ggml.eos_token_id", &eos) == 0 ? (int)eos : -1;
        tokenizer_set_special(*out, b, e);
    }
    free(s); free(p); free(l); free(types);
    gguf_close(&g);
    return rc;
}

static int load_any(tokenizer **out, const char *path, char *err)
{
    char magic[4] = { 0 };
    FILE *f = fopen(path, "rb");
    if (f) {
        size_t n = fread(magic, 1, 4, f);
        fclose(f);
        if (n == 4 && !memcmp(magic, "GGUF", 4)) return load_gguf(out, path, err);
    }
    return tokenizer_load_json(out, path, err);
}

static char *slurp(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    char *buf = NULL;
    size_t cap = 0, n = 0, got;
    if (!f) return NULL;
    do {
        if (n == cap) {
            cap = cap ? 2 * cap : 1 << 20;
            buf = realloc(buf, cap);
            if (!buf) { fclose(f); return NULL; }
        }
        got = fread(buf + n, 1, cap - n, f);
        n += got;
    } while (got);
    fclose(f);
    *len = n;
    return buf;
}

static int bench(tokenizer *t, const char *path)
{
    size_t len;
    char *text = slurp(path, &len);
    int32_t *ids;
    int n = 0, reps = 0;
    double t0, dt;
    if (!text) { fprintf(stderr, "tokenize: cannot read '%s'\n", path); return 1; }
    ids = malloc((len + 1) * sizeof *ids);
    t0 = fasa_now();
    do {
        n = tokenizer_encode(t, text, len, 0, ids, (int)len + 1);
        reps++;
        dt = fasa_now() - t0;
    } while (dt < 1.0 && n >= 0);
    printf("whole file: %zu bytes -> %d tokens, %.3f s per pass, %.0f tokens/s, %.1f MB/s\n",
           len, n, dt / reps, n * (double)reps / dt, len * (double)reps / dt / 1e6);
    /* Line by line, as calibration and bench feed text. */
    t0 = fasa_now();
    long total = 0;
    for (size_t a = 0; a < len;) {
        char *nl = memchr(text + a, '\n', len - a);
        size_t b = nl ? (size_t)(nl - text) + 1 : len;
        total += tokenizer_encode(t, text + a, b - a, 0, ids, (int)len + 1);
        a = b;
    }
    dt = fasa_now() - t0;
    printf("line by line: %ld tokens, %.3f s, %.0f tokens/s\n", total, dt, total / dt);
    free(ids);
    free(text);
    return n < 0;
}

static int decode_ids(tokenizer *t)
{
    long id;
    char buf[1024];
    while (scanf("%ld", &id) == 1) {
        int n = tokenizer_decode(t, (int32_t)id, buf, sizeof buf);
        if (n < 0) { fprintf(stderr, "tokenize: bad id %ld\n", id); return 1; }
        fwrite(buf, 1, (size_t)n < sizeof buf ? (size_t)n : sizeof buf, stdout);
    }
    return 0;
}

int main(int argc, char **argv)
{
    char err[FASA_ERRLEN];
    tokenizer *t;
    const char *bench_file = NULL;
    int decode = 0, rc = 0;
    int32_t *ids = NULL;
    size_t ids_cap = 0;
    char *buf = NULL;
    size_t buf_cap = 0;

    if (argc == 4 && !strcmp(argv[1], "--bench")) bench_file = argv[2];
    else if (argc == 3 && !strcmp(argv[1], "--decode")) decode = 1;
    else if (argc != 2) {
        fprintf(stderr, "usage: tokenize [--bench FILE | --decode] MODEL  (tokenizer.json or GGUF)\n");
        return 2;
    }
    if (load_any(&t, argv[argc - 1], err) < 0) {
        fprintf(stderr, "tokenize: %s\n", err);
        return 1;
    }
    if (bench_file) rc = bench(t, bench_file);
    else if (decode) rc = decode_ids(t);
    else {
        unsigned char hdr[5];
        while (fread(hdr, 1, 5, stdin) == 5) {
            size_t len = hdr[0] | (size_t)hdr[1] << 8 | (size_t)hdr[2] << 16 | (size_t)hdr[3] << 24;
            int n;
            if (len + 1 > buf_cap) {
                buf_cap = len + 1;
                if (!(buf = realloc(buf, buf_cap))) return 1;
            }
            if (fread(buf, 1, len, stdin) != len) { fprintf(stderr, "tokenize: truncated record\n"); return 1; }
            if (3 * len + 1 > ids_cap) {          /* invalid UTF-8 can give 3 ids a byte */
                ids_cap = 3 * len + 1;
                if (!(ids = realloc(ids, ids_cap * sizeof *ids))) return 1;
            }
            n = tokenizer_encode(t, buf, len, hdr[4] & 1, ids, (int)ids_cap);
            if (n < 0) { printf("ERROR %d\n", n); continue; }
            for (int i = 0; i < n; i++) printf(i ? " %d" : "%d", ids[i]);
            if (hdr[4] & 2) {
                putchar('\t');
                for (int i = 0; i < n; i++) {
                    char piece[1024];
                    int l = tokenizer_decode(t, ids[i], piece, sizeof piece);
                    if (l < 0 || l > (int)sizeof piece) { printf("DECODE-ERROR %d", ids[i]); break; }
                    for (int k = 0; k < l; k++) printf("%02x", (unsigned char)piece[k]);
                }
            }
            putchar('\n');
        }
    }
    free(buf);
    free(ids);
    tokenizer_free(t);
    return rc;
}

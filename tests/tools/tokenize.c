/* tokenize.c - test driver for lib/tokenizer: encodes byte strings read from stdin.
 *
 *   tokenize MODEL < records          MODEL: a tokenizer.json or a GGUF file
 *   tokenize --bench FILE MODEL       encode FILE (whole, then line by line), print tokens/s
 *   tokenize --decode MODEL < ids     one line of ids in, their bytes out
 *   tokenize --chat TEMPLATE MODEL < records
 *                                     render each record as a chat with the template in the
 *                                     file TEMPLATE ("-": the model's own) and encode it
 *
 * A record is a u32 little-endian length, one flag byte (bit 0: parse special tokens; bit 1:
 * also decode; with --chat, bit 2: the record is "system\0user", else just the user message)
 * and that many bytes, which may be any bytes (invalid UTF-8, NULs). For each record one line
 * of space-separated ids is printed (with bit 1, then a tab and the hex of the text
 * tokenizer_decode_text gives), or "ERROR <status>". With --chat the line is the hex of the
 * rendered text, a tab, and the ids of tokenizer_encode_prompt. scripts/tokenizer_check.py
 * drives it.
 */
#include "tokenizer.h"
#include "gguf.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int load_gguf(tokenizer **out, const char *path, char *err)
{
    gguf_file g;
    int rc;
    if ((rc = gguf_open(&g, path, err)) < 0) return rc;
    rc = tokenizer_load_gguf(out, &g, err);
    if (rc == 0 && !*out) rc = fasa_error(err, FASA_EFORMAT, "'%s': no tokenizer.ggml.tokens", path);
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

static void put_hex(const char *s, size_t n)
{
    for (size_t k = 0; k < n; k++) printf("%02x", (unsigned char)s[k]);
}

/* One chat record: system (or none) and user, rendered and encoded. */
static void chat_record(tokenizer *t, const tokenizer_chat *chat, const char *buf, size_t len, int has_system)
{
    const char *system = NULL, *user = buf;
    const char *nul = has_system ? memchr(buf, 0, len) : NULL;
    if (nul) system = buf, user = nul + 1;
    int need = tokenizer_chat_render(chat, system, user, NULL, 0);
    char *text = need >= 0 ? malloc((size_t)need + 1) : NULL;
    int n = text ? tokenizer_encode_prompt(t, chat, system, user, NULL, 0) : -1;
    int32_t *ids = n >= 0 ? malloc(((size_t)n + 1) * sizeof *ids) : NULL;
    if (!text || !ids) {
        printf("ERROR %d\n", need < 0 ? need : n < 0 ? n : FASA_ENOMEM);
        free(text);
        free(ids);
        return;
    }
    tokenizer_chat_render(chat, system, user, text, (size_t)need + 1);
    put_hex(text, (size_t)need);
    putchar('\t');
    n = tokenizer_encode_prompt(t, chat, system, user, ids, n);
    for (int i = 0; i < n; i++) printf(i ? " %d" : "%d", ids[i]);
    putchar('\n');
    free(text);
    free(ids);
}

int main(int argc, char **argv)
{
    char err[FASA_ERRLEN];
    tokenizer *t;
    const char *bench_file = NULL, *chat_file = NULL;
    int decode = 0, rc = 0;
    int32_t *ids = NULL;
    size_t ids_cap = 0;
    char *buf = NULL;
    size_t buf_cap = 0;
    tokenizer_chat chat;

    if (argc == 4 && !strcmp(argv[1], "--bench")) bench_file = argv[2];
    else if (argc == 4 && !strcmp(argv[1], "--chat")) chat_file = argv[2];
    else if (argc == 3 && !strcmp(argv[1], "--decode")) decode = 1;
    else if (argc != 2) {
        fprintf(stderr, "usage: tokenize [--bench FILE | --decode | --chat TEMPLATE] MODEL"
                        "  (tokenizer.json or GGUF)\n");
        return 2;
    }
    if (load_any(&t, argv[argc - 1], err) < 0) {
        fprintf(stderr, "tokenize: %s\n", err);
        return 1;
    }
    if (chat_file && strcmp(chat_file, "-")) {
        size_t len;
        char *text = slurp(chat_file, &len);
        if (!text || !(text = realloc(text, len + 1))) {
            fprintf(stderr, "tokenize: cannot read '%s'\n", chat_file);
            return 1;
        }
        text[len] = 0;
        rc = tokenizer_set_chat_template(t, text, chat_file);
        free(text);
    }
    if (chat_file && (rc < 0 || (rc = tokenizer_chat_of(t, &chat)) < 0)) {
        fprintf(stderr, "tokenize: no chat template fasa knows (%d)\n", rc);
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
            buf[len] = 0;
            if (chat_file) { chat_record(t, &chat, buf, len, hdr[4] & 4); continue; }
            if (5 * len + 3 > ids_cap) {          /* the bound tokenizer_encode states */
                ids_cap = 5 * len + 3;
                if (!(ids = realloc(ids, ids_cap * sizeof *ids))) return 1;
            }
            n = tokenizer_encode(t, buf, len, hdr[4] & 1, ids, (int)ids_cap);
            if (n < 0) { printf("ERROR %d\n", n); continue; }
            for (int i = 0; i < n; i++) printf(i ? " %d" : "%d", ids[i]);
            if (hdr[4] & 2) {
                int l = tokenizer_decode_text(t, ids, n, NULL, 0);
                char *text = l >= 0 ? malloc((size_t)l + 1) : NULL;
                putchar('\t');
                if (!text) printf("DECODE-ERROR %d", l);
                else put_hex(text, (size_t)tokenizer_decode_text(t, ids, n, text, (size_t)l + 1));
                free(text);
            }
            putchar('\n');
        }
    }
    free(buf);
    free(ids);
    tokenizer_free(t);
    return rc;
}

/* fuzz_gguf.c - libFuzzer target for formats/gguf.c and the GGUF half of the model loader.
 *
 * Any bytes go to gguf_parse. An accepted file is then read the way fasa reads one: every
 * metadata value through the typed getters and array walkers, every tensor looked up by name
 * and its data dequantised (tensors up to 64 KiB, a few hundred KiB of output per input), so
 * ASan sees any offset or size that escaped the checks. A file naming an architecture is also
 * written to the scratch directory and opened with model_open (config keys, tokenizer.ggml.*
 * arrays, tensor shapes against the config); a model that loads runs two tokens through the
 * forward pass, and its tokenizer encodes and decodes a short string.
 */
#include <math.h>

#include "fuzz_common.h"
#include "gguf.h"
#include "forward.h"
#include "model.h"

#define MAX_DEQUANT_BYTES (64 << 10)
#define MAX_DEQUANT_TOTAL (1 << 18)      /* output floats per input */
#define MAX_FORWARD_PARAMS (1 << 20)

static char model_path[160];
static volatile float fsink;
static volatile uint8_t bsink;

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    snprintf(model_path, sizeof model_path, "%s/fuzz.gguf", fuzz_dir());
    return 0;
}

/* A file string as a C string, or NULL when it holds a NUL (then no lookup can name it). */
static char *cstr(gguf_str s)
{
    if (memchr(s.ptr, 0, (size_t)s.len)) return NULL;
    char *c = malloc((size_t)s.len + 1);
    FUZZ_CHECK(c);
    memcpy(c, s.ptr, (size_t)s.len);
    c[s.len] = 0;
    return c;
}

static void check_kv(const gguf_file *g, const gguf_kv *kv, const uint8_t *buf, size_t len)
{
    char *key = cstr(kv->key);
    FUZZ_CHECK((const uint8_t *)kv->key.ptr >= buf && (const uint8_t *)kv->key.ptr + kv->key.len <= buf + len);
    if (key) {
        FUZZ_CHECK(gguf_find_kv(g, key) == kv);   /* duplicates were rejected */
        uint32_t u;
        int64_t i;
        float f;
        int b;
        gguf_str s;
        if (gguf_get_u32(g, key, &u) == 0) bsink ^= (uint8_t)u;
        if (gguf_get_i64(g, key, &i) == 0) bsink ^= (uint8_t)i;
        if (gguf_get_f32(g, key, &f) == 0) fsink += f;
        if (gguf_get_bool(g, key, &b) == 0) bsink ^= (uint8_t)b;
        if (gguf_get_str(g, key, &s) == 0) {
            FUZZ_CHECK((const uint8_t *)s.ptr >= buf && (const uint8_t *)s.ptr + s.len <= buf + len);
            for (uint64_t k = 0; k < s.len; k++) bsink ^= (uint8_t)s.ptr[k];
        }
        free(key);
    }
    if (kv->type != GGUF_VT_ARRAY) return;
    /* The parser bounded arr_n by the bytes left, so these allocations are bounded by len. */
    uint64_t n = kv->arr_n;
    if (kv->arr_type == GGUF_VT_STRING) {
        gguf_str *out = malloc((size_t)(n ? n : 1) * sizeof *out);
        FUZZ_CHECK(out);
        FUZZ_CHECK(gguf_arr_strs(kv, out) == 0);
        for (uint64_t k = 0; k < n; k++) {
            FUZZ_CHECK((const uint8_t *)out[k].ptr >= buf && (const uint8_t *)out[k].ptr + out[k].len <= buf + len);
            if (out[k].len) bsink ^= (uint8_t)out[k].ptr[out[k].len - 1];
        }
        free(out);
    } else if (kv->arr_type != GGUF_VT_ARRAY) {
        int32_t *i32 = malloc((size_t)(n ? n : 1) * sizeof *i32);
        float *f32 = malloc((size_t)(n ? n : 1) * sizeof *f32);
        FUZZ_CHECK(i32 && f32);
        if (gguf_arr_i32(kv, i32) == 0)
            for (uint64_t k = 0; k < n; k++) bsink ^= (uint8_t)i32[k];
        if (gguf_arr_f32(kv, f32) == 0)
            for (uint64_t k = 0; k < n; k++) fsink += f32[k];
        free(i32);
        free(f32);
    }
}

static void check_tensors(const gguf_file *g, const uint8_t *buf, size_t len)
{
    int64_t budget = MAX_DEQUANT_TOTAL;
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        const gguf_tensor *t = &g->tensors[i];
        FUZZ_CHECK(gguf_type_known(t->type) && gguf_type_name(t->type));
        FUZZ_CHECK(t->n_dims >= 1 && t->n_dims <= 4);
        FUZZ_CHECK(t->offset % g->alignment == 0);
        FUZZ_CHECK((const uint8_t *)t->data >= buf && t->nbytes <= len &&
                   (const uint8_t *)t->data - buf <= (ptrdiff_t)(len - t->nbytes));
        int64_t rows = t->ne[1] * t->ne[2] * t->ne[3];   /* no overflow: nbytes was computed */
        size_t rb = gguf_row_bytes(t->type, t->ne[0]);
        FUZZ_CHECK(t->ne[0] % gguf_type_block(t->type) == 0);
        FUZZ_CHECK((uint64_t)rb * (uint64_t)rows == t->nbytes);
        char *name = cstr(t->name);
        if (name) {
            FUZZ_CHECK(gguf_find_tensor(g, name) == t);
            free(name);
        }
        /* the load-time scale scan: a verdict and, on rejection, one line */
        char msg[FASA_ERRLEN] = "";
        const int ck = gguf_check_tensor(g, t, msg);
        FUZZ_CHECK(ck == 0 || (ck == FASA_EFORMAT && fuzz_one_line(msg, sizeof msg)));
        if (t->nbytes > MAX_DEQUANT_BYTES || t->ne[0] > budget) continue;
        float *row = malloc((size_t)t->ne[0] * sizeof *row);
        FUZZ_CHECK(row);
        for (int64_t r = 0; r < rows && budget >= t->ne[0]; r++, budget -= t->ne[0]) {
            gguf_dequant(t->type, (const uint8_t *)t->data + (size_t)r * rb, row, t->ne[0]);
            fsink += row[0] + row[t->ne[0] - 1];
        }
        free(row);
    }
}

static void try_model(const uint8_t *data, size_t size)
{
    char err[FASA_ERRLEN];
    model *m = NULL;
    if (fuzz_write(model_path, data, size) < 0) return;
    memset(err, 0, sizeof err);
    if (model_open(&m, model_path, err) < 0) {
        FUZZ_CHECK(m == NULL);
        return;
    }
    if (m->tok) {
        static const char text[] = "Hello, world! 12345 <|im_end|>  caf\xc3\xa9 \xff\n\tend";
        int32_t ids[256];
        char piece[64];
        int n = tokenizer_encode(m->tok, text, sizeof text - 1, 1, ids, 256);
        FUZZ_CHECK(n >= 0 && n <= 3 * (int)(sizeof text - 1));
        for (int i = 0; i < n && i < 256; i++) {
            FUZZ_CHECK(ids[i] >= 0 && ids[i] < tokenizer_n_vocab(m->tok));
            FUZZ_CHECK(tokenizer_decode(m->tok, ids[i], piece, sizeof piece) >= 0);
        }
    }
    if (m->n_params <= MAX_FORWARD_PARAMS) {
        run_state *s = run_state_new(m, 4, 2, err);
        if (s) {
            int32_t ids[2] = { 0, m->cfg.n_vocab - 1 };
            if (model_forward(m, s, ids, 2, 0, err) == 0) fsink += s->logits[0];
            run_state_free(s);
        }
    }
    model_close(m);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char err[FASA_ERRLEN];
    gguf_file g;
    memset(err, 0, sizeof err);
    uint8_t *buf = malloc(size ? size : 1);   /* exactly size bytes, so ASan sees overreads */
    FUZZ_CHECK(buf);
    if (size) memcpy(buf, data, size);
    int rc = gguf_parse(&g, buf, size, err);
    if (rc < 0) {
        FUZZ_CHECK(rc == FASA_EFORMAT || rc == FASA_EUNSUPPORTED || rc == FASA_ENOMEM);
        FUZZ_CHECK(g.kv == NULL && g.tensors == NULL && g.n_kv == 0 && g.n_tensors == 0);
        FUZZ_CHECK(fuzz_one_line(err, sizeof err));
        free(buf);
        return 0;
    }
    FUZZ_CHECK(g.version == 2 || g.version == 3);
    FUZZ_CHECK(g.alignment && !(g.alignment & (g.alignment - 1)));
    for (uint64_t i = 0; i < g.n_kv; i++) check_kv(&g, &g.kv[i], buf, size);
    check_tensors(&g, buf, size);
    int has_arch = gguf_find_kv(&g, "general.architecture") != NULL;
    gguf_close(&g);
    free(buf);
    if (has_arch) try_model(data, size);
    return 0;
}

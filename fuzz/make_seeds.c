/* make_seeds.c - writes the seed corpora of the fuzz targets: small valid files made by fasa's
 * own writers (safetensors and GGUF writers, tests/fixtures.c's tiny models, calibrate +
 * profile_save, convert's tokenizer.json and .fasa bundles, bundle_write) plus a few
 * hand-built variants that reach options the writers never emit.
 *
 *   build-fuzz/make_seeds build-fuzz/seeds      # -> seeds/{safetensors,gguf,config,...}/NAME
 *
 * Deterministic: the same build writes the same seeds.
 */
#include <cjson/cJSON.h>
#include <errno.h>
#include <sys/stat.h>

#include "bundle.h"
#include "calibrate.h"
#include "convert.h"
#include "fixtures.h"
#include "fuzz_common.h"
#include "gguf.h"
#include "model.h"
#include "profile.h"
#include "safetensors.h"
#include "tokenizer.h"

static const char *out_root;
static char work[64];
static int n_written;

#define DIE(...) do { fprintf(stderr, "make_seeds: " __VA_ARGS__); fputc('\n', stderr); exit(1); } while (0)

/* The smallest model the loaders accept whole (F32 or F16 only: 8 is not a block multiple). */
#define SMALL_SPEC(a) ((tiny_spec){ .arch = (a), .n_layer = 1, .d_model = 8, .n_head = 2, .n_kv_head = 1, \
                                     .d_head = 4, .d_ff = 8, .n_vocab = 64, .seed = 3 })

static void mkdir_p(const char *p)
{
    if (mkdir(p, 0755) < 0 && errno != EEXIST) DIE("cannot create '%s': %s", p, strerror(errno));
}

static void put(const char *target, const char *name, const void *data, size_t n)
{
    char p[1024];
    snprintf(p, sizeof p, "%s/%s", out_root, target);
    mkdir_p(p);
    snprintf(p, sizeof p, "%s/%s/%s", out_root, target, name);
    if (fuzz_write(p, data, n) < 0) DIE("cannot write '%s'", p);
    n_written++;
}

static char *slurp(const char *path, size_t *n)
{
    FILE *f = fopen(path, "rb");
    if (!f) DIE("cannot open '%s'", path);
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t)len + 1);
    if (!buf || fread(buf, 1, (size_t)len, f) != (size_t)len) DIE("cannot read '%s'", path);
    fclose(f);
    buf[len] = 0;
    *n = (size_t)len;
    return buf;
}

static void put_file(const char *target, const char *name, const char *path)
{
    size_t n;
    char *b = slurp(path, &n);
    put(target, name, b, n);
    free(b);
}

/* target gets a + NUL + b: the two-part inputs of the config and tokenizer targets. */
static void put_pair(const char *target, const char *name, const char *a, size_t na, const char *b)
{
    size_t nb = strlen(b);
    char *buf = malloc(na + 1 + nb);
    memcpy(buf, a, na);
    buf[na] = 0;
    memcpy(buf + na + 1, b, nb);
    put(target, name, buf, na + 1 + nb);
    free(buf);
}

static char *wpath(const char *name)
{
    static char p[4][256];
    static int k;
    k = (k + 1) % 4;
    snprintf(p[k], sizeof p[k], "%s/%s", work, name);
    return p[k];
}

/* ---------------------------------------------------------------- safetensors */

static void seeds_safetensors(void)
{
    char err[ST_ERRLEN], dir[300];
    tiny_model t;
    tiny_make(&t, &SMALL_SPEC(TINY_QWEN2));
    snprintf(dir, sizeof dir, "%s", wpath("st"));
    mkdir_p(dir);
    if (tiny_write_hf(&t, dir) != 0) DIE("tiny_write_hf failed");
    tiny_free(&t);
    put_file("safetensors", "tiny_qwen2.safetensors", wpath("st/model.safetensors"));

    /* every dtype, scalars, empty and 8-dimensional tensors, escaped names, metadata */
    static uint8_t data[64];
    for (int i = 0; i < 64; i++) data[i] = (uint8_t)(i * 37 + 11);
    st_writer *w = st_writer_new();
    for (int d = 0; d < ST_NDTYPE; d++) {
        char name[32];
        int64_t shape[2] = { 2, 2 };
        snprintf(name, sizeof name, "t.%s", st_dtype_name((st_dtype)d));
        st_writer_add(w, name, (st_dtype)d, 2, shape, data);
    }
    int64_t zero[2] = { 0, 5 }, eight[8] = { 1, 1, 1, 1, 1, 1, 1, 2 };
    st_writer_add(w, "scalar", ST_F32, 0, NULL, data);
    st_writer_add(w, "empty", ST_BF16, 2, zero, NULL);
    st_writer_add(w, "deep", ST_U8, 8, eight, data);
    st_writer_add(w, "quote\"back\\slash\ttab caf\xc3\xa9 \xf0\x9f\x99\x82", ST_I8, 1, eight + 7, data);
    st_writer_meta(w, "format", "pt");
    st_writer_meta(w, "fasa.chunk_order", "[[[1,0]]]");
    st_writer_meta(w, "ctl\x01", "line\nbreak");
    if (st_writer_write(w, wpath("types.safetensors"), err) != 0) DIE("%s", err);
    st_writer_free(w);
    put_file("safetensors", "types.safetensors", wpath("types.safetensors"));

    w = st_writer_new();
    st_writer_meta(w, "only", "metadata");
    if (st_writer_write(w, wpath("meta.safetensors"), err) != 0) DIE("%s", err);
    st_writer_free(w);
    put_file("safetensors", "meta_only.safetensors", wpath("meta.safetensors"));

    /* sharded indexes for fuzz_safetensors' fixed shards a (x, y) and b (z) */
    static const char idx1[] = "{\"metadata\":{\"total_size\":11},\"weight_map\":"
                               "{\"x\":\"a.safetensors\",\"y\":\"a.safetensors\",\"z\":\"b.safetensors\"}}";
    static const char idx2[] = "{\"weight_map\":{\"z\":\"./b.safetensors\",\"q\":\"a.safetensors\"}}";
    put("safetensors", "index.json", idx1, sizeof idx1 - 1);
    put("safetensors", "index_bad.json", idx2, sizeof idx2 - 1);
}

/* ---------------------------------------------------------------- tokenizers */

/* GPT-2's byte symbol of byte b, as UTF-8. */
static int byte_sym(int b, char *out)
{
    int printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
    int cp = b, extra = 0;
    if (!printable) {
        for (int i = 0; i < b; i++)
            if (!((i >= 0x21 && i <= 0x7E) || (i >= 0xA1 && i <= 0xAC) || i >= 0xAE)) extra++;
        cp = 256 + extra;
    }
    if (cp < 0x80) { out[0] = (char)cp; out[1] = 0; return 1; }
    out[0] = (char)(0xC0 | cp >> 6);
    out[1] = (char)(0x80 | (cp & 0x3F));
    out[2] = 0;
    return 2;
}

/* A small byte-level vocabulary: chosen bytes' symbols, a few merges, added tokens. */
static const char VOCAB_BYTES[] = " \n\tabcdehilnorstw0123456789',.!<>|_/\xc3\xa9";
static const char *const MERGES[][2] = {
    { "t", "h" }, { "th", "e" }, { "\xc4\xa0", "th" }, { "\xc4\xa0", "w" }, { "o", "r" },
    { "\xc4\xa0w", "or" }, { "l", "d" }, { "\xc4\xa0wor", "ld" }, { "1", "2" }, { "e", "s" },
};
static const char *const ADDED[] = { "<|im_start|>", "<|im_end|>", "<s>", "</s>", "<|user|>" };

static cJSON *tok_pre(enum tokenizer_pre kind)
{
    static const char *const split_re[] = {
        [TOKENIZER_PRE_LLAMA3] = "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| "
                                 "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
        [TOKENIZER_PRE_QWEN2] = "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| "
                                "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
    };
    cJSON *bl = cJSON_CreateObject();
    cJSON_AddStringToObject(bl, "type", "ByteLevel");
    cJSON_AddFalseToObject(bl, "add_prefix_space");
    cJSON_AddTrueToObject(bl, "trim_offsets");
    cJSON_AddBoolToObject(bl, "use_regex", kind == TOKENIZER_PRE_GPT2 || kind == TOKENIZER_PRE_SMOLLM);
    if (kind == TOKENIZER_PRE_GPT2) return bl;
    cJSON *seq = cJSON_CreateObject(), *items = cJSON_CreateArray(), *first = cJSON_CreateObject();
    cJSON_AddStringToObject(seq, "type", "Sequence");
    if (kind == TOKENIZER_PRE_SMOLLM) {
        cJSON_AddStringToObject(first, "type", "Digits");
        cJSON_AddTrueToObject(first, "individual_digits");
    } else {
        cJSON *pat = cJSON_CreateObject();
        cJSON_AddStringToObject(first, "type", "Split");
        cJSON_AddStringToObject(pat, "Regex", split_re[kind]);
        cJSON_AddItemToObject(first, "pattern", pat);
        cJSON_AddStringToObject(first, "behavior", "Isolated");
        cJSON_AddFalseToObject(first, "invert");
    }
    cJSON_AddItemToArray(items, first);
    cJSON_AddItemToArray(items, bl);
    cJSON_AddItemToObject(seq, "pretokenizers", items);
    return seq;
}

/* variant bits: 1 merges as pairs, 2 unk token + fuse_unk, 4 added-token options, 8 ignore_merges */
static char *tok_json(enum tokenizer_pre kind, int variant)
{
    cJSON *root = cJSON_CreateObject(), *model = cJSON_CreateObject();
    cJSON *vocab = cJSON_CreateObject(), *merges = cJSON_CreateArray(), *added = cJSON_CreateArray();
    int id = 0;
    char sym[8];
    for (const unsigned char *b = (const unsigned char *)VOCAB_BYTES; *b; b++) {
        if (*b == 0xc3) continue;   /* é is two bytes: both symbols below */
        byte_sym(*b, sym);
        cJSON_AddNumberToObject(vocab, sym, id++);
    }
    byte_sym(0xa9, sym);
    cJSON_AddNumberToObject(vocab, sym, id++);
    byte_sym(0xc3, sym);
    cJSON_AddNumberToObject(vocab, sym, id++);
    for (size_t i = 0; i < sizeof MERGES / sizeof *MERGES; i++) {
        char cat[32];
        snprintf(cat, sizeof cat, "%s%s", MERGES[i][0], MERGES[i][1]);
        if (!cJSON_GetObjectItemCaseSensitive(vocab, cat)) cJSON_AddNumberToObject(vocab, cat, id++);
        if (variant & 1) {
            cJSON *pair = cJSON_CreateArray();
            cJSON_AddItemToArray(pair, cJSON_CreateString(MERGES[i][0]));
            cJSON_AddItemToArray(pair, cJSON_CreateString(MERGES[i][1]));
            cJSON_AddItemToArray(merges, pair);
        } else {
            char m[40];
            snprintf(m, sizeof m, "%s %s", MERGES[i][0], MERGES[i][1]);
            cJSON_AddItemToArray(merges, cJSON_CreateString(m));
        }
    }
    if (variant & 2) cJSON_AddNumberToObject(vocab, "<unk>", id++);
    for (size_t i = 0; i < sizeof ADDED / sizeof *ADDED; i++) {
        cJSON *a = cJSON_CreateObject();
        int opt = (variant & 4) ? (int)i : -1;
        cJSON_AddNumberToObject(a, "id", id++);
        cJSON_AddStringToObject(a, "content", ADDED[i]);
        cJSON_AddBoolToObject(a, "single_word", opt == 1);
        cJSON_AddBoolToObject(a, "lstrip", opt == 2 || opt == 4);
        cJSON_AddBoolToObject(a, "rstrip", opt == 3 || opt == 4);
        cJSON_AddBoolToObject(a, "normalized", opt == 4);
        cJSON_AddBoolToObject(a, "special", i < 4);
        cJSON_AddItemToArray(added, a);
    }
    cJSON_AddStringToObject(root, "version", "1.0");
    cJSON_AddItemToObject(root, "added_tokens", added);
    if (kind == TOKENIZER_PRE_QWEN2) {
        cJSON *nfc = cJSON_CreateObject();
        cJSON_AddStringToObject(nfc, "type", "NFC");
        cJSON_AddItemToObject(root, "normalizer", nfc);
    } else {
        cJSON_AddNullToObject(root, "normalizer");
    }
    cJSON_AddItemToObject(root, "pre_tokenizer", tok_pre(kind));
    cJSON_AddStringToObject(model, "type", "BPE");
    if (variant & 2) {
        cJSON_AddStringToObject(model, "unk_token", "<unk>");
        cJSON_AddTrueToObject(model, "fuse_unk");
    }
    cJSON_AddBoolToObject(model, "ignore_merges", (variant & 8) != 0);
    cJSON_AddItemToObject(model, "vocab", vocab);
    cJSON_AddItemToObject(model, "merges", merges);
    cJSON_AddItemToObject(root, "model", model);
    char *s = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    return s;
}

static const char SAMPLE_TEXT[] =
    "the world's 12 <|im_start|>user\nhello, world!<|im_end|> <|user|> caf\xc3\xa9 x\x04 \xff";

static void seeds_tokenizer(void)
{
    static const char *const names[] = { "gpt2", "smollm", "llama3", "qwen2" };
    char name[64], err[FASA_ERRLEN];
    for (int kind = 0; kind < 4; kind++)
        for (int variant = 0; variant < 16; variant += 5) {   /* 0, 5, 10, 15 */
            char *s = tok_json((enum tokenizer_pre)kind, variant);
            tokenizer *t;
            if (tokenizer_parse_json(&t, s, strlen(s), "seed", err) != 0) DIE("seed tokenizer: %s", err);
            tokenizer_free(t);
            snprintf(name, sizeof name, "%s_v%d.json", names[kind], variant);
            put_pair("tokenizer", name, s, strlen(s), SAMPLE_TEXT);
            free(s);
        }
}

/* ---------------------------------------------------------------- GGUF */

/* tiny's weights (F32, llama names) with a tokenizer.ggml.* vocabulary of n_vocab tokens. */
static void write_gguf_with_tokenizer(const tiny_model *t, const char *path, const char *pre)
{
    const tiny_spec *s = &t->s;
    const int D = s->d_model, qd = s->n_head * s->d_head, kvd = s->n_kv_head * s->d_head;
    const char *tokens[64], *merges[sizeof MERGES / sizeof *MERGES];
    char store[64][16], mstore[sizeof MERGES / sizeof *MERGES][40], name[64], err[FASA_ERRLEN];
    int32_t types[64];
    int n = 0, first_added = -1;
    for (const unsigned char *b = (const unsigned char *)VOCAB_BYTES; *b && n < s->n_vocab; b++) {
        if (*b == 0xc3) continue;
        byte_sym(*b, store[n]);
        types[n] = 1;
        tokens[n] = store[n];
        n++;
    }
    for (size_t i = 0; i < sizeof MERGES / sizeof *MERGES; i++) {
        snprintf(store[n], sizeof store[n], "%s%s", MERGES[i][0], MERGES[i][1]);
        int dup = 0;
        for (int k = 0; k < n; k++) dup |= !strcmp(store[k], store[n]);
        if (!dup) { tokens[n] = store[n]; types[n] = 1; n++; }
        snprintf(mstore[i], sizeof mstore[i], "%s %s", MERGES[i][0], MERGES[i][1]);
        merges[i] = mstore[i];
    }
    first_added = n;
    for (size_t i = 0; i < sizeof ADDED / sizeof *ADDED && n < s->n_vocab; i++) {
        tokens[n] = ADDED[i];
        types[n] = i < 4 ? 3 : 4;
        n++;
    }
    while (n < s->n_vocab) {   /* pad with unused tokens */
        snprintf(store[n], sizeof store[n], "<unused%d>", n);
        tokens[n] = store[n];
        types[n++] = 5;
    }
    gguf_writer *w = gguf_writer_new();
    gguf_w_str(w, "general.architecture", "llama");
    gguf_w_str(w, "general.name", "tiny-tok");
    gguf_w_u32(w, "llama.block_count", (uint32_t)s->n_layer);
    gguf_w_u32(w, "llama.context_length", 64);
    gguf_w_u32(w, "llama.embedding_length", (uint32_t)D);
    gguf_w_u32(w, "llama.feed_forward_length", (uint32_t)s->d_ff);
    gguf_w_u32(w, "llama.attention.head_count", (uint32_t)s->n_head);
    gguf_w_u32(w, "llama.attention.head_count_kv", (uint32_t)s->n_kv_head);
    gguf_w_u32(w, "llama.rope.dimension_count", (uint32_t)s->d_head);
    gguf_w_f32(w, "llama.rope.freq_base", 10000.0f);
    gguf_w_f32(w, "llama.attention.layer_norm_rms_epsilon", 1e-5f);
    gguf_w_str(w, "tokenizer.ggml.model", "gpt2");
    gguf_w_str(w, "tokenizer.ggml.pre", pre);
    gguf_w_arr_str(w, "tokenizer.ggml.tokens", tokens, (uint64_t)n);
    gguf_w_arr_i32(w, "tokenizer.ggml.token_type", types, (uint64_t)n);
    gguf_w_arr_str(w, "tokenizer.ggml.merges", merges, sizeof MERGES / sizeof *MERGES);
    gguf_w_u32(w, "tokenizer.ggml.bos_token_id", (uint32_t)first_added + 2);   /* <s> */
    gguf_w_u32(w, "tokenizer.ggml.eos_token_id", (uint32_t)first_added + 1);   /* <|im_end|> */
    gguf_w_bool(w, "tokenizer.ggml.add_bos_token", 0);
    gguf_w_str(w, "tokenizer.chat_template", "{% for m in messages %}{{ m.content }}{% endfor %}");
    int64_t ne[2];
#define T2(nm, data, rows, cols)                                                                                       \
    (ne[0] = (cols), ne[1] = (rows), gguf_w_tensor(w, nm, GGUF_TYPE_F32, (rows) == 1 ? 1 : 2, ne, data))
    T2("token_embd.weight", t->embd, s->n_vocab, D);
    T2("output_norm.weight", t->out_norm, 1, D);
    if (t->lm_head) T2("output.weight", t->lm_head, s->n_vocab, D);
    for (int l = 0; l < s->n_layer; l++) {
        const tiny_layer *L = &t->layers[l];
#define TL(fmt, data, rows, cols) (snprintf(name, sizeof name, fmt, l), T2(name, data, rows, cols))
        TL("blk.%d.attn_norm.weight", L->attn_norm, 1, D);
        TL("blk.%d.ffn_norm.weight", L->ffn_norm, 1, D);
        TL("blk.%d.attn_q.weight", L->wq, qd, D);
        TL("blk.%d.attn_k.weight", L->wk, kvd, D);
        TL("blk.%d.attn_v.weight", L->wv, kvd, D);
        TL("blk.%d.attn_output.weight", L->wo, D, qd);
        TL("blk.%d.ffn_gate.weight", L->gate, s->d_ff, D);
        TL("blk.%d.ffn_up.weight", L->up, s->d_ff, D);
        TL("blk.%d.ffn_down.weight", L->down, D, s->d_ff);
#undef TL
    }
#undef T2
    if (gguf_writer_write(w, path, err) != 0) DIE("%s", err);
    gguf_writer_free(w);
}

/* Metadata of every value type (nested arrays too), tensors of every type, alignment 64. */
static void write_gguf_types(const char *path)
{
    char err[FASA_ERRLEN];
    float x[256];
    uint8_t q[512];
    for (int i = 0; i < 256; i++) x[i] = (float)((i * 37) % 101 - 50) / 7.0f;
    gguf_writer *w = gguf_writer_new();
    gguf_w_u32(w, "general.alignment", 64);
    uint8_t u8 = 200;
    int8_t i8 = -5;
    uint16_t u16 = 60000;
    int16_t i16 = -30000;
    int32_t i32 = -7;
    uint64_t u64 = 1ull << 40;
    int64_t i64 = -(1ll << 40);
    double f64 = 0.25;
    gguf_w_value(w, "v.u8", GGUF_VT_U8, &u8, 1);
    gguf_w_value(w, "v.i8", GGUF_VT_I8, &i8, 1);
    gguf_w_value(w, "v.u16", GGUF_VT_U16, &u16, 2);
    gguf_w_value(w, "v.i16", GGUF_VT_I16, &i16, 2);
    gguf_w_value(w, "v.i32", GGUF_VT_I32, &i32, 4);
    gguf_w_value(w, "v.u64", GGUF_VT_U64, &u64, 8);
    gguf_w_value(w, "v.i64", GGUF_VT_I64, &i64, 8);
    gguf_w_value(w, "v.f64", GGUF_VT_F64, &f64, 8);
    gguf_w_f32(w, "v.f32", 1.5f);
    gguf_w_bool(w, "v.bool", 1);
    gguf_w_str(w, "v.str", "caf\xc3\xa9");
    static const char *const strs[] = { "a", "", "bc" };
    gguf_w_arr_str(w, "v.arr_str", strs, 3);
    int32_t ia[3] = { 1, -2, 3 };
    gguf_w_arr_i32(w, "v.arr_i32", ia, 3);
    float fa[2] = { 0.5f, -0.5f };
    gguf_w_arr_f32(w, "v.arr_f32", fa, 2);
    /* [[1, 2], [3]] as u8 arrays inside an array */
    uint8_t nested[4 + 8 + 2 * (4 + 8) + 3];
    size_t k = 0;
#define P32(v) (nested[k] = (uint8_t)(v), nested[k + 1] = nested[k + 2] = nested[k + 3] = 0, k += 4)
#define P64(v) (P32(v), P32(0))
    P32(GGUF_VT_ARRAY); P64(2);
    P32(GGUF_VT_U8); P64(2); nested[k++] = 1; nested[k++] = 2;
    P32(GGUF_VT_U8); P64(1); nested[k++] = 3;
#undef P64
#undef P32
    gguf_w_value(w, "v.nested", GGUF_VT_ARRAY, nested, k);
    static const uint32_t types[] = { GGUF_TYPE_F32, GGUF_TYPE_F16, GGUF_TYPE_BF16, GGUF_TYPE_Q4_0, GGUF_TYPE_Q4_1,
                                      GGUF_TYPE_Q5_0, GGUF_TYPE_Q5_1, GGUF_TYPE_Q8_0, GGUF_TYPE_Q2_K, GGUF_TYPE_Q3_K,
                                      GGUF_TYPE_Q4_K, GGUF_TYPE_Q5_K, GGUF_TYPE_Q6_K, GGUF_TYPE_IQ4_NL,
                                      GGUF_TYPE_IQ4_XS };
    for (size_t i = 0; i < sizeof types / sizeof *types; i++) {
        int64_t blk = gguf_type_block(types[i]), ne[2] = { blk == 1 ? 8 : blk, blk >= 256 ? 1 : 2 };
        char name[32];
        for (int64_t r = 0; r < ne[1]; r++)
            gguf_quantize(types[i], x + r * ne[0], q + r * gguf_row_bytes(types[i], ne[0]), ne[0]);
        snprintf(name, sizeof name, "t.%s", gguf_type_name(types[i]));
        gguf_w_tensor(w, name, types[i], 2, ne, q);
    }
    if (gguf_writer_write(w, path, err) != 0) DIE("%s", err);
    gguf_writer_free(w);
}

static void seeds_gguf(void)
{
    static const struct { uint32_t type; const char *name; } q[] = {
        { GGUF_TYPE_Q8_0, "tiny_q8_0.gguf" }, { GGUF_TYPE_Q4_0, "tiny_q4_0.gguf" },
        { GGUF_TYPE_Q4_1, "tiny_q4_1.gguf" },
    };
    tiny_model t;
    tiny_make(&t, &FUZZ_TINY_SPEC);
    for (size_t i = 0; i < sizeof q / sizeof *q; i++) {
        if (tiny_write_gguf(&t, wpath("q.gguf"), q[i].type) != 0) DIE("tiny_write_gguf failed");
        put_file("gguf", q[i].name, wpath("q.gguf"));
    }
    tiny_free(&t);
    static const struct { enum tiny_arch a; uint32_t type; const char *name; } f[] = {
        { TINY_LLAMA, GGUF_TYPE_F32, "small_llama_f32.gguf" }, { TINY_QWEN2, GGUF_TYPE_F16, "small_qwen2_f16.gguf" },
        { TINY_LLAMA, GGUF_TYPE_BF16, "small_llama_bf16.gguf" },
    };
    for (size_t i = 0; i < sizeof f / sizeof *f; i++) {
        tiny_spec s = SMALL_SPEC(f[i].a);
        s.tied = (int)i % 2;
        tiny_make(&t, &s);
        if (tiny_write_gguf(&t, wpath("s.gguf"), f[i].type) != 0) DIE("tiny_write_gguf failed");
        put_file("gguf", f[i].name, wpath("s.gguf"));
        tiny_free(&t);
    }
    tiny_make(&t, &SMALL_SPEC(TINY_LLAMA));
    static const char *const pres[] = { "smollm", "llama-bpe", "qwen2", "gpt2" };
    for (size_t i = 0; i < sizeof pres / sizeof *pres; i++) {
        char name[64];
        write_gguf_with_tokenizer(&t, wpath("tok.gguf"), pres[i]);
        snprintf(name, sizeof name, "small_tok_%s.gguf", pres[i]);
        put_file("gguf", name, wpath("tok.gguf"));
    }
    tiny_free(&t);
    write_gguf_types(wpath("types.gguf"));
    put_file("gguf", "types.gguf", wpath("types.gguf"));
}

/* ---------------------------------------------------------------- config.json */

static void seeds_config(void)
{
    char dir[300];
    tiny_model t;
    size_t n;
    snprintf(dir, sizeof dir, "%s", wpath("cfg"));
    mkdir_p(dir);
    tiny_make(&t, &FUZZ_TINY_SPEC);
    if (tiny_write_hf(&t, dir) != 0) DIE("tiny_write_hf failed");
    tiny_free(&t);
    char *cfg = slurp(wpath("cfg/config.json"), &n);
    put("config", "tiny_llama.json", cfg, n);
    /* the same, read beside fuzz_config's converted copy, with a chunk order */
    put_pair("config", "tiny_llama_order.json", cfg, n, "[[[7,6,5,4,3,2,1,0]]]");
    put_pair("config", "tiny_llama_order_bad.json", cfg, n, "[[[0,0,1,2,3,4,5,6.5]]]");
    free(cfg);
    tiny_make(&t, &SMALL_SPEC(TINY_QWEN2));
    if (tiny_write_hf(&t, dir) != 0) DIE("tiny_write_hf failed");
    tiny_free(&t);
    put_file("config", "small_qwen2.json", wpath("cfg/config.json"));

    /* what the writers never emit: other model types and RoPE scalings */
    static const char *const extra[][2] = {
        { "llama3_scaling.json",
          "{\"model_type\":\"llama\",\"num_hidden_layers\":1,\"hidden_size\":32,\"intermediate_size\":32,"
          "\"num_attention_heads\":2,\"num_key_value_heads\":1,\"vocab_size\":32,\"rope_theta\":500000.0,"
          "\"rms_norm_eps\":1e-05,\"tie_word_embeddings\":false,\"rope_scaling\":{\"rope_type\":\"llama3\","
          "\"factor\":8.0,\"low_freq_factor\":1.0,\"high_freq_factor\":4.0,\"original_max_position_embeddings\":8192}"
          "}" },
        { "linear_scaling.json",
          "{\"model_type\":\"mistral\",\"num_hidden_layers\":1,\"hidden_size\":32,\"intermediate_size\":32,"
          "\"num_attention_heads\":2,\"num_key_value_heads\":1,\"head_dim\":16,\"vocab_size\":32,"
          "\"max_position_embeddings\":32768,\"rope_scaling\":{\"type\":\"linear\",\"factor\":2}}" },
        { "rope_parameters.json",
          "{\"model_type\":\"qwen2\",\"num_hidden_layers\":1,\"hidden_size\":32,\"intermediate_size\":32,"
          "\"num_attention_heads\":2,\"num_key_value_heads\":2,\"vocab_size\":32,\"attention_bias\":true,"
          "\"rope_parameters\":{\"rope_type\":\"default\",\"rope_theta\":1000000.0}}" },
    };
    for (size_t i = 0; i < sizeof extra / sizeof *extra; i++)
        put("config", extra[i][0], extra[i][1], strlen(extra[i][1]));
}

/* ---------------------------------------------------------------- profiles and bundles */

static void seeds_profile_bundle(void)
{
    char err[FASA_ERRLEN], dir[300];
    tiny_model t;
    model *m;
    snprintf(dir, sizeof dir, "%s", wpath("prof"));
    mkdir_p(dir);
    tiny_make(&t, &FUZZ_TINY_SPEC);
    if (tiny_write_hf(&t, dir) != 0) DIE("tiny_write_hf failed");
    tiny_free(&t);
    if (model_open(&m, dir, err) != 0) DIE("%s", err);
    int32_t ids[24];
    for (int i = 0; i < 24; i++) ids[i] = (i * 7 + 3) % m->cfg.n_vocab;
    profile p;
    for (int def = 0; def < 2; def++) {
        calib_opts o = calib_defaults(m);
        o.n_prefill = 8;
        o.n_k = 3;
        o.ks[0] = 2, o.ks[1] = 4, o.ks[2] = 8;
        o.rank_k = 4;
        o.fcs = 2;
        o.chunks = def ? CHUNKS_ADJACENT : CHUNKS_PLANE;
        if (calibrate_run(m, ids, 24, &o, &p, err) != 0) DIE("%s", err);
        if (profile_save(&p, wpath("p.json"), err) != 0) DIE("%s", err);
        put_file("profile", def ? "tiny_adjacent.profile.json" : "tiny_plane.profile.json", wpath("p.json"));
        if (!def) {
            /* a converted model as a bundle, plain and zstd */
            convert_opts co = convert_defaults();
            co.prof = &p;
            co.prof_path = "p.json";
            co.bundle = 1;
            for (int z = 0; z < 2; z++) {
                co.zstd = z;
                if (convert_write(m, &co, wpath("conv.fasa"), err) != 0) DIE("%s", err);
                put_file("bundle", z ? "tiny_converted_zstd.fasa" : "tiny_converted.fasa", wpath("conv.fasa"));
            }
        }
        profile_free(&p);
    }
    model_close(m);
    /* a header whose dims would size gigabytes of tables, with almost no data */
    static const char huge[] =
        "{\"format\":\"fasa-profile\",\"version\":1,\"model\":{\"architecture\":\"llama\",\"n_layer\":1024,"
        "\"n_head\":1024,\"n_kv_head\":1,\"d_head\":1024,\"qk_hash\":\"0000000000000000\"},\"chunks\":"
        "{\"definition\":\"plane\",\"count\":512},\"calibration\":{\"sample_hash\":\"0000000000000000\","
        "\"n_tokens\":1,\"n_prefill\":1,\"n_steps\":1,\"k\":[1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16],"
        "\"rank_k\":1,\"fcs\":1},\"ca\":{\"1\":[[[0.5]]]},\"rank\":[[[0]]],\"group_rank\":[[[0]]]}";
    put("profile", "huge_dims.json", huge, sizeof huge - 1);

    /* a GGUF tokenizer exported as tokenizer.json by convert */
    tiny_make(&t, &SMALL_SPEC(TINY_LLAMA));
    write_gguf_with_tokenizer(&t, wpath("tok.gguf"), "smollm");
    tiny_free(&t);
    if (model_open(&m, wpath("tok.gguf"), err) != 0) DIE("%s", err);
    snprintf(dir, sizeof dir, "%s", wpath("tokdir"));
    mkdir_p(dir);
    if (convert_gguf_tokenizer(m, dir, err) != 0) DIE("%s", err);
    size_t n;
    char *tj = slurp(wpath("tokdir/tokenizer.json"), &n);
    put_pair("tokenizer", "converted_smollm.json", tj, n, SAMPLE_TEXT);
    free(tj);
    /* the whole small model with its tokenizer, exported to HF as a bundle */
    convert_opts co = convert_defaults();
    co.reorder = 0;
    co.bundle = 1;
    co.zstd = 1;
    if (convert_write(m, &co, wpath("export.fasa"), err) != 0) DIE("%s", err);
    put_file("bundle", "small_export_zstd.fasa", wpath("export.fasa"));
    model_close(m);

    /* bundle_write of two small files */
    static const char *const names[] = { "notes.txt", "data.bin" };
    snprintf(dir, sizeof dir, "%s", wpath("bdir"));
    mkdir_p(dir);
    fuzz_write(wpath("bdir/notes.txt"), "hello\n", 6);
    fuzz_write(wpath("bdir/data.bin"), "\0\1\2\3\4\5\6\7", 8);
    for (int z = 0; z < 2; z++) {
        if (bundle_write(wpath("b.fasa"), dir, names, 2, z, err) != 0) DIE("%s", err);
        put_file("bundle", z ? "two_files_zstd.fasa" : "two_files.fasa", wpath("b.fasa"));
    }
    if (bundle_write(wpath("b.fasa"), dir, names, 0, 0, err) != 0) DIE("%s", err);
    put_file("bundle", "empty.fasa", wpath("b.fasa"));
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: make_seeds OUTDIR\n");
        return 2;
    }
    out_root = argv[1];
    mkdir_p(out_root);
    snprintf(work, sizeof work, "/tmp/fasa-seeds-XXXXXX");
    if (!mkdtemp(work)) DIE("cannot create a work directory");
    seeds_safetensors();
    seeds_tokenizer();
    seeds_gguf();
    seeds_config();
    seeds_profile_bundle();
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", work);
    if (system(cmd) != 0) fprintf(stderr, "make_seeds: could not remove %s\n", work);
    fprintf(stderr, "make_seeds: %d seeds in %s\n", n_written, out_root);
    return 0;
}

/* convert.c - FC-reordered Hugging Face exports of any loaded model, and .fasa bundles. */
#include "convert.h"

#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include "bundle.h"
#include "gguf.h"
#include "safetensors.h"

convert_opts convert_defaults(void)
{
    return (convert_opts){ .dtype = -1, .reorder = 1 };
}

static int ends_with(const char *s, const char *suffix)
{
    size_t a = strlen(s), b = strlen(suffix);
    return a >= b && !strcmp(s + a - b, suffix);
}

void convert_out_path(const convert_opts *o, const char *out, char *buf, size_t cap)
{
    size_t n = strlen(out);
    while (n > 1 && out[n - 1] == '/') n--;   /* "dir/" renames like "dir" */
    snprintf(buf, cap, "%.*s%s", (int)n, out, o->bundle && !ends_with(out, ".fasa") ? ".fasa" : "");
}

void convert_row_map(const model *m, int layer, int kv_head, const int16_t *order, int *src)
{
    const int d = m->cfg.d_head, half = d / 2;
    int inv[2048];   /* Hugging Face dim -> file dim of the source; d_head <= 1024 */
    for (int f = 0; f < d; f++) inv[model_hf_dim(m, layer, kv_head, f)] = f;
    for (int x = 0; x < d; x++) src[x] = inv[order ? (x % 2) * half + order[x / 2] : x];
}

/* ---------------------------------------------------------------- tensors */

typedef struct out_tensor {
    char name[128];
    int n_dims;
    int64_t shape[2];
    void *data;
} out_tensor;

typedef struct tensor_list {
    out_tensor *t;
    int n, cap;
} tensor_list;

static size_t dtype_size(int dtype) { return dtype == ST_F32 ? 4 : 2; }

static void store(void *dst, int64_t i, const float *x, int64_t n, int dtype)
{
    if (dtype == ST_F32) {
        memcpy((float *)dst + i, x, sizeof(float) * n);
    } else {
        uint16_t *h = (uint16_t *)dst + i;
        for (int64_t c = 0; c < n; c++) h[c] = dtype == ST_F16 ? gguf_f32_to_f16(x[c]) : gguf_f32_to_bf16(x[c]);
    }
}

/* Adds rows x cols values at dtype: row r of the output is row src[r] of w (src NULL: r). */
static out_tensor *add_matrix(tensor_list *L, const char *name, const weight *w, const int *src, int dtype, char *err)
{
    if (L->n == L->cap) {
        int cap = L->cap ? 2 * L->cap : 64;
        out_tensor *t = realloc(L->t, sizeof *t * cap);
        if (!t) return fasa_error(err, FASA_ENOMEM, "out of memory"), NULL;
        L->t = t, L->cap = cap;
    }
    out_tensor *t = &L->t[L->n];
    memset(t, 0, sizeof *t);
    snprintf(t->name, sizeof t->name, "%s", name);
    const int64_t rows = w->rows, cols = w->cols;
    t->n_dims = rows == 1 ? 1 : 2;
    t->shape[0] = rows == 1 ? cols : rows;
    t->shape[1] = cols;
    if (!(t->data = malloc((size_t)rows * cols * dtype_size(dtype)))) {
        fasa_error(err, FASA_ENOMEM, "out of memory for tensor '%s'", name);
        return NULL;
    }
    int fail = 0;
#pragma omp parallel
    {
        float *row = malloc(sizeof(float) * cols);
        if (!row) {
#pragma omp atomic write
            fail = 1;
        }
#pragma omp for schedule(static)
        for (int64_t r = 0; r < rows; r++) {
            if (!row) continue;
            weight_row(w, src ? src[r] : r, row);
            store(t->data, r * cols, row, cols, dtype);
        }
        free(row);
    }
    L->n++;
    if (fail) return fasa_error(err, FASA_ENOMEM, "out of memory"), NULL;
    return t;
}

static out_tensor *add_vector(tensor_list *L, const char *name, const float *v, int64_t n, const int *src,
                              int dtype, char *err)
{
    float *tmp = malloc(sizeof(float) * n);
    if (!tmp) return fasa_error(err, FASA_ENOMEM, "out of memory"), NULL;
    for (int64_t i = 0; i < n; i++) tmp[i] = v[src ? src[i] : i];
    weight w = { GGUF_TYPE_F32, 1, n, tmp };
    out_tensor *t = add_matrix(L, name, &w, NULL, dtype, err);
    free(tmp);
    return t;
}

/* A norm's weights as Hugging Face stores them: Gemma's RMSNorm scales by 1 + w, and fasa keeps
 * 1 + w (model.c adds the one on load), so w goes out. */
static out_tensor *add_norm(tensor_list *L, const char *name, const float *v, int64_t n, const int *src, int dtype,
                            int gemma, char *err)
{
    if (!gemma) return add_vector(L, name, v, n, src, dtype, err);
    float *tmp = malloc(sizeof(float) * n);
    if (!tmp) return fasa_error(err, FASA_ENOMEM, "out of memory"), NULL;
    for (int64_t i = 0; i < n; i++) tmp[i] = v[src ? src[i] : i] - 1;
    out_tensor *t = add_vector(L, name, tmp, n, NULL, dtype, err);
    free(tmp);
    return t;
}

static void list_free(tensor_list *L)
{
    for (int i = 0; i < L->n; i++) free(L->t[i].data);
    free(L->t);
}

static size_t tensor_bytes(const out_tensor *t, int dtype)
{
    return (size_t)t->shape[0] * (t->n_dims == 2 ? t->shape[1] : 1) * dtype_size(dtype);
}

/* Every tensor under its Hugging Face name; q/k rows (and biases) through the row maps. Also
 * the xxh64 of the written q/k bytes, as profile_model_hash will see them. */
static int build_tensors(const model *m, const int16_t *order, int dtype, tensor_list *L, uint64_t *qk_hash, char *err)
{
    const model_config *c = &m->cfg;
    const int d = c->d_head, half = d / 2, group = c->n_head / c->n_kv_head;
    const int qd = c->n_head * d, kvd = c->n_kv_head * d;
    int *qsrc = malloc(sizeof(int) * qd), *ksrc = malloc(sizeof(int) * kvd), map[1024];
    XXH64_state_t *h = XXH64_createState();
    char name[128];
    int rc = 0;
    if (!qsrc || !ksrc || !h) { rc = fasa_error(err, FASA_ENOMEM, "out of memory"); goto out; }
    XXH64_reset(h, 0);
#define MAT(w, src, ...) do { snprintf(name, sizeof name, __VA_ARGS__); \
        if (!(t = add_matrix(L, name, w, src, dtype, err))) { rc = FASA_ENOMEM; goto out; } } while (0)
#define VEC(v, n, src, ...) do { snprintf(name, sizeof name, __VA_ARGS__); \
        if (!(t = add_vector(L, name, v, n, src, dtype, err))) { rc = FASA_ENOMEM; goto out; } } while (0)
#define NORM(v, n, ...) do { snprintf(name, sizeof name, __VA_ARGS__); \
        if (!(t = add_norm(L, name, v, n, NULL, dtype, c->gemma, err))) { rc = FASA_ENOMEM; goto out; } } while (0)
    out_tensor *t;
    /* q/k norms weigh each head's dims alike in every head, so the rows of different heads cannot
     * be put in different orders under them */
    if (c->qk_norm && order) {
        rc = fasa_error(err, FASA_EUNSUPPORTED, "%s normalises q and k per head with one weight vector per layer: "
                        "its q/k rows cannot be reordered per KV head (use --to hf)", fasa_arch_name(c->arch));
        goto out;
    }
    MAT(&m->tok_embd, NULL, "model.embed_tokens.weight");
    NORM(m->out_norm.data, c->d_model, "model.norm.weight");
    if (!c->tied_embeddings) MAT(&m->output, NULL, "lm_head.weight");
    for (int l = 0; l < c->n_layer; l++) {
        const layer_weights *W = &m->layers[l];
        for (int g = 0; g < c->n_kv_head; g++) {
            convert_row_map(m, l, g, order ? order + ((size_t)l * c->n_kv_head + g) * half : NULL, map);
            for (int x = 0; x < d; x++) {
                ksrc[g * d + x] = g * d + map[x];
                for (int hq = g * group; hq < (g + 1) * group; hq++) qsrc[hq * d + x] = hq * d + map[x];
            }
        }
        NORM(W->attn_norm.data, c->d_model, "model.layers.%d.input_layernorm.weight", l);
        if (c->gemma) {   /* Gemma's names: the feed-forward's input norm is "pre_feedforward" */
            NORM(W->ffn_norm.data, c->d_model, "model.layers.%d.pre_feedforward_layernorm.weight", l);
            NORM(W->post_attn_norm, c->d_model, "model.layers.%d.post_attention_layernorm.weight", l);
            NORM(W->post_ffn_norm, c->d_model, "model.layers.%d.post_feedforward_layernorm.weight", l);
        } else {
            NORM(W->ffn_norm.data, c->d_model, "model.layers.%d.post_attention_layernorm.weight", l);
        }
        if (c->qk_norm) {
            NORM(W->q_norm, d, "model.layers.%d.self_attn.q_norm.weight", l);
            NORM(W->k_norm, d, "model.layers.%d.self_attn.k_norm.weight", l);
        }
        MAT(&W->wq, qsrc, "model.layers.%d.self_attn.q_proj.weight", l);
        XXH64_update(h, t->data, tensor_bytes(t, dtype));
        MAT(&W->wk, ksrc, "model.layers.%d.self_attn.k_proj.weight", l);
        XXH64_update(h, t->data, tensor_bytes(t, dtype));
        MAT(&W->wv, NULL, "model.layers.%d.self_attn.v_proj.weight", l);
        MAT(&W->wo, NULL, "model.layers.%d.self_attn.o_proj.weight", l);
        MAT(&W->w_gate, NULL, "model.layers.%d.mlp.gate_proj.weight", l);
        MAT(&W->w_up, NULL, "model.layers.%d.mlp.up_proj.weight", l);
        MAT(&W->w_down, NULL, "model.layers.%d.mlp.down_proj.weight", l);
        if (W->bq) VEC(W->bq, qd, qsrc, "model.layers.%d.self_attn.q_proj.bias", l);
        if (W->bk) VEC(W->bk, kvd, ksrc, "model.layers.%d.self_attn.k_proj.bias", l);
        if (W->bv) VEC(W->bv, kvd, NULL, "model.layers.%d.self_attn.v_proj.bias", l);
    }
#undef MAT
#undef VEC
#undef NORM
    *qk_hash = XXH64_digest(h);
out:
    if (h) XXH64_freeState(h);
    free(qsrc);
    free(ksrc);
    return rc;
}

/* ---------------------------------------------------------------- small files */

static int write_text(const char *dir, const char *name, const char *text, char *err)
{
    char p[8192];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    return fasa_write_file(p, text, strlen(text), err);
}

/* cJSON's own printer, then a newline, into dir/name. */
static int write_json(const char *dir, const char *name, cJSON *o, int pretty, char *err)
{
    char *s = o ? (pretty ? cJSON_Print(o) : cJSON_PrintUnformatted(o)) : NULL;
    if (!s) return fasa_error(err, FASA_ENOMEM, "out of memory writing '%s/%s'", dir, name);
    size_t n = strlen(s);
    char *t = realloc(s, n + 2);
    if (!t) { free(s); return fasa_error(err, FASA_ENOMEM, "out of memory writing '%s/%s'", dir, name); }
    t[n] = '\n', t[n + 1] = 0;
    int rc = write_text(dir, name, t, err);
    free(t);
    return rc;
}

static int copy_file(const char *src, const char *dir, const char *name, char *err)
{
    char p[8192], buf[1 << 16];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    int in = open(src, O_RDONLY | O_CLOEXEC);
    if (in < 0) return fasa_error(err, FASA_EIO, "cannot open '%s': %s", src, strerror(errno));
    fasa_atomic out;
    int rc = fasa_atomic_open(&out, p, err);
    while (rc == 0) {
        ssize_t k = read(in, buf, sizeof buf);
        if (k < 0 && errno == EINTR) continue;
        if (k < 0) rc = fasa_error(err, FASA_EIO, "cannot read '%s': %s", src, strerror(errno));
        if (k <= 0) break;
        rc = fasa_atomic_write(&out, buf, (size_t)k, err);
    }
    close(in);
    if (rc < 0) {
        fasa_atomic_abort(&out);
        return rc;
    }
    return fasa_atomic_commit(&out, err);
}

static int exists(const char *p)
{
    struct stat st;
    return stat(p, &st) == 0;
}

/* A float as the shortest of up to 9 significant digits that reads back as the same float. */
static cJSON *json_float(float v)
{
    char buf[48];
    for (int prec = 6; prec <= 9; prec++) {
        snprintf(buf, sizeof buf, "%.*g", prec, v);
        if (strtof(buf, NULL) == v) break;
    }
    return cJSON_CreateRaw(buf);
}

static void set_item(cJSON *o, const char *key, cJSON *v)
{
    if (cJSON_GetObjectItemCaseSensitive(o, key)) cJSON_ReplaceItemInObjectCaseSensitive(o, key, v);
    else cJSON_AddItemToObject(o, key, v);
}

static cJSON *read_json_file(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    char *buf = NULL;
    long len = -1;
    if (fseek(f, 0, SEEK_END) == 0) len = ftell(f);
    if (len >= 0 && len < (64 << 20) && fseek(f, 0, SEEK_SET) == 0 && (buf = malloc(len + 1)) &&
        fread(buf, 1, len, f) == (size_t)len)
        buf[len] = 0;
    else
        len = -1;
    fclose(f);
    cJSON *o = len >= 0 ? cJSON_ParseWithLength(buf, len) : NULL;
    free(buf);
    if (o && !cJSON_IsObject(o)) cJSON_Delete(o), o = NULL;
    return o;
}

static const char *token_str(const model *m, int id, char *buf, size_t cap)
{
    if (!m->tok || id < 0 || id >= tokenizer_n_vocab(m->tok)) return NULL;
    int n = tokenizer_decode(m->tok, id, buf, cap - 1);
    if (n < 0 || (size_t)n >= cap) return NULL;
    buf[n] = 0;
    return buf;
}

/* config.json: the source's own when it has one (keys it has that we do not set survive), with
 * every field fasa reads set from the loaded config. */
static int write_config(const model *m, const char *src_dir, int dtype, int reordered, const char *dir, char *err)
{
    const model_config *c = &m->cfg;
    char p[8192];
    cJSON *o = NULL;
    if (src_dir) {
        snprintf(p, sizeof p, "%s/config.json", src_dir);
        o = read_json_file(p);
    }
    if (!o) o = cJSON_CreateObject();
    if (!o) return fasa_error(err, FASA_ENOMEM, "out of memory");
    static const char *const archs[FASA_ARCH_COUNT] = {
        [FASA_ARCH_LLAMA] = "LlamaForCausalLM", [FASA_ARCH_MISTRAL] = "MistralForCausalLM",
        [FASA_ARCH_QWEN2] = "Qwen2ForCausalLM", [FASA_ARCH_QWEN3] = "Qwen3ForCausalLM",
        [FASA_ARCH_GEMMA3] = "Gemma3ForCausalLM",
    };
    if ((unsigned)c->arch >= FASA_ARCH_COUNT || !archs[c->arch]) {
        cJSON_Delete(o);
        return fasa_error(err, FASA_EUNSUPPORTED, "config.json: no Hugging Face class for architecture %d", c->arch);
    }
    const char *arch_list[1] = { archs[c->arch] };
    set_item(o, "architectures", cJSON_CreateStringArray(arch_list, 1));
    set_item(o, "model_type", cJSON_CreateString(fasa_arch_name(c->arch)));
    set_item(o, "hidden_size", cJSON_CreateNumber(c->d_model));
    set_item(o, "intermediate_size", cJSON_CreateNumber(c->d_ff));
    set_item(o, "num_hidden_layers", cJSON_CreateNumber(c->n_layer));
    set_item(o, "num_attention_heads", cJSON_CreateNumber(c->n_head));
    set_item(o, "num_key_value_heads", cJSON_CreateNumber(c->n_kv_head));
    set_item(o, "head_dim", cJSON_CreateNumber(c->d_head));
    set_item(o, "vocab_size", cJSON_CreateNumber(c->n_vocab));
    set_item(o, "max_position_embeddings", cJSON_CreateNumber(c->n_ctx_train));
    set_item(o, "rms_norm_eps", json_float(c->norm_eps));
    set_item(o, "rope_theta", json_float(c->rope_theta));
    cJSON *rs = cJSON_CreateNull();
    if (c->rope_scaling == ROPE_SCALING_LINEAR) {
        cJSON_Delete(rs);
        rs = cJSON_CreateObject();
        cJSON_AddStringToObject(rs, "rope_type", "linear");
        cJSON_AddItemToObject(rs, "factor", json_float(c->rope_factor));
    } else if (c->rope_scaling == ROPE_SCALING_LLAMA3) {
        cJSON_Delete(rs);
        rs = cJSON_CreateObject();
        cJSON_AddStringToObject(rs, "rope_type", "llama3");
        cJSON_AddItemToObject(rs, "factor", json_float(c->rope_factor));
        cJSON_AddItemToObject(rs, "low_freq_factor", json_float(c->rope_low_freq_factor));
        cJSON_AddItemToObject(rs, "high_freq_factor", json_float(c->rope_high_freq_factor));
        cJSON_AddNumberToObject(rs, "original_max_position_embeddings", c->rope_orig_ctx);
    }
    cJSON_DeleteItemFromObjectCaseSensitive(o, "rope_parameters");   /* superseded by the two keys */
    set_item(o, "rope_scaling", rs);
    set_item(o, "tie_word_embeddings", cJSON_CreateBool(c->tied_embeddings));
    if (c->arch != FASA_ARCH_QWEN2) set_item(o, "attention_bias", cJSON_CreateBool(c->qkv_bias));
    if (!cJSON_GetObjectItemCaseSensitive(o, "hidden_act"))
        cJSON_AddStringToObject(o, "hidden_act", c->gemma ? "gelu_pytorch_tanh" : "silu");
    /* the window and, for gemma3, its pattern of local and global layers (model.c reads these) */
    if (c->sliding_window > 0) set_item(o, "sliding_window", cJSON_CreateNumber(c->sliding_window));
    if (c->gemma) {
        set_item(o, "hidden_activation", cJSON_CreateString("gelu_pytorch_tanh"));
        set_item(o, "sliding_window_pattern", cJSON_CreateNumber(c->swa_period));
        cJSON *lt = cJSON_CreateArray();
        for (int l = 0; lt && l < c->n_layer; l++)
            cJSON_AddItemToArray(lt, cJSON_CreateString(model_layer_local(c, l) ? "sliding_attention"
                                                                                 : "full_attention"));
        set_item(o, "layer_types", lt);
        set_item(o, "rope_local_base_freq", json_float(c->rope_theta_local));
        if (c->attn_scale > 0)
            set_item(o, "query_pre_attn_scalar", json_float(1.0f / (c->attn_scale * c->attn_scale)));
    }
    set_item(o, "torch_dtype",
             cJSON_CreateString(dtype == ST_F32   ? "float32"
                                : dtype == ST_F16 ? "float16"
                                                  : "bfloat16"));
    if (!src_dir && m->tok) {
        if (tokenizer_bos(m->tok) >= 0) set_item(o, "bos_token_id", cJSON_CreateNumber(tokenizer_bos(m->tok)));
        if (tokenizer_eos(m->tok) >= 0) set_item(o, "eos_token_id", cJSON_CreateNumber(tokenizer_eos(m->tok)));
    }
    /* Informational: a converted model's q/k rows only make sense with fasa's RoPE tables. */
    if (reordered)
        set_item(o, "fasa_rope_layout", cJSON_CreateString("permuted: see fasa.chunk_order in model.safetensors"));
    else cJSON_DeleteItemFromObjectCaseSensitive(o, "fasa_rope_layout");
    int rc = write_json(dir, "config.json", o, 1, err);
    cJSON_Delete(o);
    return rc;
}

/* ---------------------------------------------------------------- tokenizer from GGUF */

static cJSON *byte_level(int use_regex)
{
    cJSON *b = cJSON_CreateObject();
    cJSON_AddStringToObject(b, "type", "ByteLevel");
    cJSON_AddFalseToObject(b, "add_prefix_space");
    cJSON_AddTrueToObject(b, "trim_offsets");
    cJSON_AddBoolToObject(b, "use_regex", use_regex);
    return b;
}

/* The pre-tokenizers lib/tokenizer.c recognises (its pre_detect), spelled as `tokenizers` does. */
static cJSON *pre_tokenizer(enum tokenizer_pre kind)
{
    static const char *const llama3 =
        "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*"
        "|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
    static const char *const qwen2 =
        "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*"
        "|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
    if (kind == TOKENIZER_PRE_GPT2) return byte_level(1);
    cJSON *seq = cJSON_CreateObject(), *items = cJSON_CreateArray(), *first = cJSON_CreateObject();
    cJSON_AddStringToObject(seq, "type", "Sequence");
    if (kind == TOKENIZER_PRE_SMOLLM) {
        cJSON_AddStringToObject(first, "type", "Digits");
        cJSON_AddTrueToObject(first, "individual_digits");
    } else {
        cJSON_AddStringToObject(first, "type", "Split");
        cJSON *pat = cJSON_AddObjectToObject(first, "pattern");
        cJSON_AddStringToObject(pat, "Regex", kind == TOKENIZER_PRE_LLAMA3 ? llama3 : qwen2);
        cJSON_AddStringToObject(first, "behavior", "Isolated");
        cJSON_AddFalseToObject(first, "invert");
    }
    cJSON_AddItemToArray(items, first);
    cJSON_AddItemToArray(items, byte_level(kind == TOKENIZER_PRE_SMOLLM));
    cJSON_AddItemToObject(seq, "pretokenizers", items);
    return seq;
}

/* A NUL-terminated copy of a GGUF string into *buf (grown as needed); NULL if it holds a NUL. */
static const char *cstr(gguf_str s, char **buf, size_t *cap)
{
    if (memchr(s.ptr, 0, s.len)) return NULL;
    if (s.len + 1 > *cap) {
        size_t c = (s.len + 1) * 2;
        char *b = realloc(*buf, c);
        if (!b) return NULL;
        *buf = b, *cap = c;
    }
    memcpy(*buf, s.ptr, s.len);
    (*buf)[s.len] = 0;
    return *buf;
}

/* ---- SentencePiece vocabularies: merges from scores
 *
 * A GGUF SentencePiece vocabulary has scores, no merges; `tokenizers` wants merges. As Hugging
 * Face's converter does, every split of a piece into two pieces of the vocabulary (at character
 * boundaries) is a merge, ranked by the piece's score, highest first (within a piece by the two
 * halves' ids): BPE by rank then merges what llama.cpp's by-score merging does. */
typedef struct spm_merge {
    float score;
    int32_t piece, l, r;
} spm_merge;

static int cmp_spm_merge(const void *pa, const void *pb)
{
    const spm_merge *a = pa, *b = pb;
    if (a->score != b->score) return a->score > b->score ? -1 : 1;
    if (a->piece != b->piece) return a->piece < b->piece ? -1 : 1;
    if (a->l != b->l) return a->l < b->l ? -1 : 1;
    return (a->r > b->r) - (a->r < b->r);
}

/* The merges of vocabulary ts[0..nv) (scores sc): *out (malloc'd), *n of them; < 0 out of memory. */
static int spm_merges(const tokenizer *tok, const gguf_str *ts, const float *sc, uint64_t nv, spm_merge **out,
                      size_t *n)
{
    size_t cap = 0, cnt = 0;
    spm_merge *v = NULL;
    char piece[1024];
    for (uint64_t i = 0; i < nv; i++) {
        const size_t len = ts[i].len;
        if (len < 2 || len >= sizeof piece || memchr(ts[i].ptr, 0, len)) continue;
        memcpy(piece, ts[i].ptr, len);
        piece[len] = 0;
        for (size_t k = 1; k < len; k++) {
            if (((unsigned char)piece[k] & 0xC0) == 0x80) continue;   /* inside a character */
            const char c = piece[k];
            piece[k] = 0;
            const int l = tokenizer_find(tok, piece);
            piece[k] = c;
            const int r = l < 0 ? -1 : tokenizer_find(tok, piece + k);
            if (r < 0) continue;
            if (cnt == cap) {
                spm_merge *g = realloc(v, (cap = cap ? 2 * cap : 1 << 16) * sizeof *v);
                if (!g) return free(v), FASA_ENOMEM;
                v = g;
            }
            v[cnt++] = (spm_merge){ sc ? sc[i] : 0, (int32_t)i, l, r };
        }
    }
    qsort(v, cnt, sizeof *v, cmp_spm_merge);
    *out = v, *n = cnt;
    return 0;
}

static cJSON *replace_step(const char *from, const char *to)
{
    cJSON *r = cJSON_CreateObject();
    cJSON_AddStringToObject(r, "type", "Replace");
    cJSON_AddStringToObject(cJSON_AddObjectToObject(r, "pattern"), "String", from);
    cJSON_AddStringToObject(r, "content", to);
    return r;
}

static cJSON *typed(const char *type)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "type", type);
    return o;
}

/* normalizer and decoder of a SentencePiece vocabulary (prepend: a "▁" before each piece) */
static void spm_steps(cJSON *root, int prepend)
{
    cJSON *norm = replace_step(" ", "\u2581"), *dec = typed("Sequence"), *ds = cJSON_AddArrayToObject(dec, "decoders");
    if (prepend) {
        cJSON *seq = typed("Sequence"), *steps = cJSON_AddArrayToObject(seq, "normalizers"), *pre = typed("Prepend");
        cJSON_AddStringToObject(pre, "prepend", "\u2581");
        cJSON_AddItemToArray(steps, pre);
        cJSON_AddItemToArray(steps, norm);
        norm = seq;
    }
    cJSON_AddItemToArray(ds, replace_step("\u2581", " "));
    cJSON_AddItemToArray(ds, typed("ByteFallback"));
    cJSON_AddItemToArray(ds, typed("Fuse"));
    if (prepend) {
        cJSON *strip = typed("Strip");
        cJSON_AddStringToObject(strip, "content", " ");
        cJSON_AddNumberToObject(strip, "start", 1);
        cJSON_AddNumberToObject(strip, "stop", 0);
        cJSON_AddItemToArray(ds, strip);
    }
    cJSON_AddItemToObject(root, "normalizer", norm);
    cJSON_AddNullToObject(root, "pre_tokenizer");
    cJSON_AddNullToObject(root, "post_processor");
    cJSON_AddItemToObject(root, "decoder", dec);
}

int convert_gguf_tokenizer(const model *m, const char *dir, char *err)
{
    const gguf_file *g = m->file;
    if (m->source != MODEL_SOURCE_GGUF || !m->tok)
        return fasa_error(err, FASA_EARG, "'%s': no GGUF tokenizer", m->path);
    const gguf_kv *kt = gguf_find_kv(g, "tokenizer.ggml.tokens");
    const gguf_kv *km = gguf_find_kv(g, "tokenizer.ggml.merges");
    const gguf_kv *ky = gguf_find_kv(g, "tokenizer.ggml.token_type");
    uint64_t nv = kt->arr_n, nm = km && km->type == GGUF_VT_ARRAY && km->arr_type == GGUF_VT_STRING ? km->arr_n : 0;
    gguf_str *ts = calloc(nv + nm + 1, sizeof *ts);
    int32_t *types = calloc(nv + 1, sizeof *types);
    char *buf = NULL, cbuf[512];
    size_t cap = 0;
    int rc = 0;
    cJSON *root = cJSON_CreateObject(), *tc = NULL, *gc = NULL;
    if (!ts || !types || !root) { rc = fasa_error(err, FASA_ENOMEM, "out of memory"); goto out; }
    /* open_gguf already checked these arrays when it built m->tok */
    gguf_arr_strs(kt, ts);
    if (nm) gguf_arr_strs(km, ts + nv);
    for (uint64_t i = 0; i < nv; i++) types[i] = 1;
    if (ky && ky->type == GGUF_VT_ARRAY && ky->arr_n == nv) gguf_arr_i32(ky, types);

    const enum tokenizer_pre kind = tokenizer_pre_kind(m->tok);
    const int spm = tokenizer_type(m->tok) == TOKENIZER_SPM;
    int prepend = 1;
    gguf_get_bool(g, "tokenizer.ggml.add_space_prefix", &prepend);
    cJSON_AddStringToObject(root, "version", "1.0");
    cJSON_AddNullToObject(root, "truncation");
    cJSON_AddNullToObject(root, "padding");
    cJSON *added = cJSON_AddArrayToObject(root, "added_tokens");
    if (spm) {
        spm_steps(root, prepend);
    } else {
        cJSON_AddNullToObject(root, "normalizer");
        cJSON_AddItemToObject(root, "pre_tokenizer", pre_tokenizer(kind));
        cJSON_AddNullToObject(root, "post_processor");
        cJSON_AddItemToObject(root, "decoder", byte_level(1));
    }
    cJSON *mo = cJSON_AddObjectToObject(root, "model");
    cJSON_AddStringToObject(mo, "type", "BPE");
    cJSON_AddNullToObject(mo, "dropout");
    uint64_t unk = nv;   /* SentencePiece: the first UNKNOWN token */
    for (uint64_t i = 0; spm && i < nv && unk == nv; i++) unk = types[i] == 2 ? i : nv;
    const char *us = unk < nv ? cstr(ts[unk], &buf, &cap) : NULL;
    if (us) cJSON_AddStringToObject(mo, "unk_token", us);
    else cJSON_AddNullToObject(mo, "unk_token");
    cJSON_AddNullToObject(mo, "continuing_subword_prefix");
    cJSON_AddNullToObject(mo, "end_of_word_suffix");
    cJSON_AddBoolToObject(mo, "fuse_unk", spm);
    cJSON_AddBoolToObject(mo, "byte_fallback", spm);
    cJSON_AddBoolToObject(mo, "ignore_merges", kind == TOKENIZER_PRE_LLAMA3 && !spm);
    cJSON *vocab = cJSON_AddObjectToObject(mo, "vocab"), *merges = cJSON_AddArrayToObject(mo, "merges");
    if (spm) {
        /* as two-element arrays: SentencePiece pieces may hold spaces */
        const gguf_kv *ks = gguf_find_kv(g, "tokenizer.ggml.scores");
        float *sc = ks && ks->type == GGUF_VT_ARRAY && ks->arr_n == nv ? malloc(nv * sizeof *sc) : NULL;
        spm_merge *mv = NULL;
        size_t n_mv = 0;
        if (sc && gguf_arr_f32(ks, sc) < 0) free(sc), sc = NULL;
        rc = spm_merges(m->tok, ts, sc, nv, &mv, &n_mv);
        free(sc);
        if (rc < 0) { rc = fasa_error(err, FASA_ENOMEM, "out of memory"); goto out; }
        for (size_t i = 0; i < n_mv; i++) {
            cJSON *pair = cJSON_CreateArray();
            const char *l = cstr(ts[mv[i].l], &buf, &cap);
            cJSON_AddItemToArray(pair, cJSON_CreateString(l ? l : ""));
            const char *r = cstr(ts[mv[i].r], &buf, &cap);
            cJSON_AddItemToArray(pair, cJSON_CreateString(r ? r : ""));
            cJSON_AddItemToArray(merges, pair);
        }
        free(mv);
    }
    for (uint64_t i = 0; i < nv + nm; i++) {
        const char *s = cstr(ts[i], &buf, &cap);
        if (!s) {
            rc = fasa_error(err, FASA_EUNSUPPORTED, "'%s': tokenizer string %" PRIu64 " holds a NUL byte", m->path, i);
            goto out;
        }
        if (i >= nv) {
            if (!spm) cJSON_AddItemToArray(merges, cJSON_CreateString(s));
            continue;
        }
        cJSON_AddItemToObject(vocab, s, cJSON_CreateNumber((double)i));
        /* CONTROL: special; USER_DEFINED: plain, normalized (SentencePiece, as llama.cpp matches
         * them: UNKNOWN special too, and all on the raw text) */
        if (types[i] == 3 || types[i] == 4 || (spm && types[i] == 2)) {
            cJSON *a = cJSON_CreateObject();
            cJSON_AddNumberToObject(a, "id", (double)i);
            cJSON_AddStringToObject(a, "content", s);
            cJSON_AddFalseToObject(a, "single_word");
            cJSON_AddFalseToObject(a, "lstrip");
            cJSON_AddFalseToObject(a, "rstrip");
            cJSON_AddBoolToObject(a, "normalized", types[i] == 4 && !spm);
            cJSON_AddBoolToObject(a, "special", types[i] != 4);
            cJSON_AddItemToArray(added, a);
        }
    }
    if ((rc = write_json(dir, "tokenizer.json", root, 0, err)) < 0) goto out;

    /* bos/eos as fasa uses them (eos: the end of a chat turn), so a reload behaves the same. */
    tc = cJSON_CreateObject();
    gc = cJSON_CreateObject();
    const char *s;
    uint32_t id;
    int add_bos = 0;
    gguf_get_bool(g, "tokenizer.ggml.add_bos_token", &add_bos);
    cJSON_AddBoolToObject(tc, "add_bos_token", add_bos);
    cJSON_AddFalseToObject(tc, "add_prefix_space");
    if ((s = token_str(m, tokenizer_bos(m->tok), cbuf, sizeof cbuf))) cJSON_AddStringToObject(tc, "bos_token", s);
    if ((s = token_str(m, tokenizer_eos(m->tok), cbuf, sizeof cbuf))) cJSON_AddStringToObject(tc, "eos_token", s);
    if (gguf_get_u32(g, "tokenizer.ggml.unknown_token_id", &id) == 0 && (s = token_str(m, (int)id, cbuf, sizeof cbuf)))
        cJSON_AddStringToObject(tc, "unk_token", s);
    if (gguf_get_u32(g, "tokenizer.ggml.padding_token_id", &id) == 0 && (s = token_str(m, (int)id, cbuf, sizeof cbuf)))
        cJSON_AddStringToObject(tc, "pad_token", s);
    gguf_str tmpl;
    if (gguf_get_str(g, "tokenizer.chat_template", &tmpl) == 0 && (s = cstr(tmpl, &buf, &cap)))
        cJSON_AddStringToObject(tc, "chat_template", s);
    cJSON_AddFalseToObject(tc, "clean_up_tokenization_spaces");
    cJSON_AddNumberToObject(tc, "model_max_length", m->cfg.n_ctx_train);
    cJSON_AddStringToObject(tc, "tokenizer_class", spm ? "PreTrainedTokenizerFast" : "GPT2Tokenizer");
    if ((rc = write_json(dir, "tokenizer_config.json", tc, 1, err)) < 0) goto out;
    if (tokenizer_bos(m->tok) >= 0) cJSON_AddNumberToObject(gc, "bos_token_id", tokenizer_bos(m->tok));
    if (tokenizer_eos(m->tok) >= 0) cJSON_AddNumberToObject(gc, "eos_token_id", tokenizer_eos(m->tok));
    rc = write_json(dir, "generation_config.json", gc, 1, err);
out:
    cJSON_Delete(root);
    cJSON_Delete(tc);
    cJSON_Delete(gc);
    free(buf);
    free(ts);
    free(types);
    return rc;
}

/* ---------------------------------------------------------------- the whole output */

static char *chunk_order_json(const profile *p)
{
    size_t cap = (size_t)p->n_layer * p->n_kv_head * (p->n_chunk * 6 + 4) + 16, n = 0;
    char *s = malloc(cap);
    if (!s) return NULL;
    s[n++] = '[';
    for (int l = 0; l < p->n_layer; l++) {
        s[n++] = l ? ',' : '[';
        if (l) s[n++] = '[';
        for (int g = 0; g < p->n_kv_head; g++) {
            const int16_t *r = profile_group_rank(p, l, g);
            s[n++] = g ? ',' : '[';
            if (g) s[n++] = '[';
            for (int c = 0; c < p->n_chunk; c++) n += (size_t)snprintf(s + n, cap - n, c ? ",%d" : "%d", r[c]);
            s[n++] = ']';
        }
        s[n++] = ']';
    }
    s[n++] = ']';
    s[n] = 0;
    return s;
}

/* The Hugging Face directory a loaded model came from, or NULL (GGUF). A bundle's directory was
 * removed after loading, so it is extracted again into *tmp (the caller removes it). */
static int source_dir(const model *m, char *buf, size_t cap, char *tmp, size_t tcap, const char **out, char *err)
{
    struct stat st;
    *out = NULL;
    tmp[0] = 0;
    if (m->source != MODEL_SOURCE_SAFETENSORS) return 0;
    if (ends_with(m->path, ".fasa")) {
        int rc = bundle_extract_temp(m->path, tmp, tcap, err);
        if (rc < 0) return rc;
        *out = tmp;
        return 0;
    }
    if (stat(m->path, &st) == 0 && S_ISDIR(st.st_mode)) {
        snprintf(buf, cap, "%s", m->path);
    } else {
        const char *slash = strrchr(m->path, '/');
        if (slash) snprintf(buf, cap, "%.*s", (int)(slash - m->path), m->path);
        else snprintf(buf, cap, ".");
    }
    *out = buf;
    return 0;
}

/* Makes a directory's entries durable (after its files were synced); best effort. */
static void sync_dir(const char *p)
{
    int fd = open(p, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd >= 0) {
        fsync(fd);
        close(fd);
    }
}

static void sync_parent(const char *p)
{
    char dir[4096];
    const char *slash = strrchr(p, '/');
    if (!slash) snprintf(dir, sizeof dir, ".");
    else snprintf(dir, sizeof dir, "%.*s", slash == p ? 1 : (int)(slash - p), p);
    sync_dir(dir);
}

static int dir_empty(const char *p)
{
    DIR *d = opendir(p);
    if (!d) return 0;
    struct dirent *de;
    int n = 0;
    while ((de = readdir(d)))
        n += strcmp(de->d_name, ".") && strcmp(de->d_name, "..");
    closedir(d);
    return n == 0;
}

/* Everything the output holds, written into the directory dir. */
static int write_all_files(const model *m, const convert_opts *o, const char *dir, const char **members, int *n_members,
                           char *err)
{
    tensor_list L = { 0 };
    st_writer *w = NULL;
    char *order_json = NULL, p[8192], srcbuf[4096], tmpsrc[4096];
    const char *src = NULL;
    int16_t *order = NULL;
    uint64_t qk_hash = 0;
    int rc;
    *n_members = 0;
    if ((rc = source_dir(m, srcbuf, sizeof srcbuf, tmpsrc, sizeof tmpsrc, &src, err)) < 0) return rc;

    if (o->reorder) {
        const profile *pr = o->prof;
        if (!(order = malloc(sizeof *order * pr->n_layer * pr->n_kv_head * pr->n_chunk)) ||
            !(order_json = chunk_order_json(pr))) {
            rc = fasa_error(err, FASA_ENOMEM, "out of memory");
            goto out;
        }
        memcpy(order, pr->group_rank, sizeof *order * pr->n_layer * pr->n_kv_head * pr->n_chunk);
    }
    if ((rc = build_tensors(m, order, o->dtype, &L, &qk_hash, err)) < 0) goto out;
    if (!(w = st_writer_new())) { rc = fasa_error(err, FASA_ENOMEM, "out of memory"); goto out; }
    for (int i = 0; i < L.n; i++)
        if ((rc = st_writer_add(w, L.t[i].name, (st_dtype)o->dtype, L.t[i].n_dims, L.t[i].shape, L.t[i].data)) < 0) {
            rc = fasa_error(err, rc, "cannot add tensor '%s'", L.t[i].name);
            goto out;
        }
    st_writer_meta(w, "format", "pt");
    if (o->reorder) {
        char hex[32];
        snprintf(hex, sizeof hex, "%016" PRIx64, o->prof->sample_hash);
        if ((rc = st_writer_meta(w, "fasa.chunk_order", order_json)) < 0 ||
            (rc = st_writer_meta(w, "fasa.profile_sample_hash", hex)) < 0) {
            rc = fasa_error(err, FASA_ENOMEM, "out of memory");
            goto out;
        }
    }
    snprintf(p, sizeof p, "%s/model.safetensors", dir);
    if ((rc = st_writer_write(w, p, err)) < 0) goto out;
    st_writer_free(w);
    w = NULL;
    list_free(&L);
    memset(&L, 0, sizeof L);

    if ((rc = write_config(m, src, o->dtype, o->reorder, dir, err)) < 0) goto out;
    if (src) {
        static const char *const copies[] = { "generation_config.json", "special_tokens_map.json",
                                              "tokenizer_config.json", "tokenizer.json" };
        for (size_t i = 0; i < sizeof copies / sizeof *copies; i++) {
            snprintf(p, sizeof p, "%s/%s", src, copies[i]);
            if (exists(p) && (rc = copy_file(p, dir, copies[i], err)) < 0) goto out;
        }
    } else if (m->tok) {
        if ((rc = convert_gguf_tokenizer(m, dir, err)) < 0) goto out;
    }
    if (o->prof) {
        profile cp = *o->prof;   /* same CA and ranks, the hash of the weights just written */
        cp.qk_hash = qk_hash;
        snprintf(p, sizeof p, "%s/profile.json", dir);
        if ((rc = profile_save(&cp, p, err)) < 0) goto out;
    }
    /* Bundle order: small files first, the weights last. */
    static const char *const order_names[] = { "config.json", "generation_config.json", "special_tokens_map.json",
                                               "tokenizer_config.json", "tokenizer.json", "profile.json",
                                               "model.safetensors" };
    for (size_t i = 0; i < sizeof order_names / sizeof *order_names; i++) {
        snprintf(p, sizeof p, "%s/%s", dir, order_names[i]);
        if (exists(p)) members[(*n_members)++] = order_names[i];
    }
out:
    if (tmpsrc[0]) bundle_remove_dir(tmpsrc);
    st_writer_free(w);
    list_free(&L);
    free(order);
    free(order_json);
    return rc;
}

int convert_dtype(const model *m, const convert_opts *o)
{
    if (o->dtype >= 0) return o->dtype;
    const uint32_t t = m->layers[0].wq.type;   /* the source's float type, or f16 for quantised weights */
    return t == GGUF_TYPE_F32 ? ST_F32 : t == GGUF_TYPE_BF16 ? ST_BF16 : ST_F16;
}

int convert_write(const model *m, const convert_opts *opts, const char *out, char *err)
{
    char final[4096], tmpdir[4200];
    const char *members[16];
    int n_members = 0, rc;
    struct stat st;
    convert_opts oo = *opts;
    const convert_opts *o = &oo;
    oo.dtype = convert_dtype(m, opts);
    if (o->dtype != ST_F32 && o->dtype != ST_F16 && o->dtype != ST_BF16)
        return fasa_error(err, FASA_EARG, "cannot convert to dtype %s: only F32, F16 and BF16",
                          st_dtype_name((st_dtype)o->dtype));
    if (o->reorder && !o->prof)
        return fasa_error(err, FASA_EARG, "reordering '%s' needs a profile (fasa calibrate)", m->path);
    if (o->prof) {
        const char *pp = o->prof_path ? o->prof_path : "profile";
        if ((rc = profile_check_model(o->prof, m, pp, err)) < 0) return rc;
        if (o->reorder && o->prof->chunks != CHUNKS_PLANE)
            return fasa_error(err, FASA_EMISMATCH,
                              "'%s' defines chunks as adjacent dims, which RoPE does not rotate together; "
                              "reordering needs a plane profile (fasa calibrate --chunks plane)", pp);
    }
    convert_out_path(o, out, final, sizeof final);
    if (stat(final, &st) == 0) {
        if (o->bundle && S_ISDIR(st.st_mode))
            return fasa_error(err, FASA_EARG, "cannot write '%s': it is a directory", final);
        if (!o->bundle && !S_ISDIR(st.st_mode))
            return fasa_error(err, FASA_EARG, "cannot write '%s': it exists and is not a directory", final);
        if (!o->bundle && !dir_empty(final))
            return fasa_error(err, FASA_EARG, "cannot write '%s': the directory exists and is not empty", final);
    }
    snprintf(tmpdir, sizeof tmpdir, "%s.tmp.XXXXXX", final);
    if (!mkdtemp(tmpdir)) return fasa_error(err, FASA_EIO, "cannot create '%s': %s", final, strerror(errno));
    if (chmod(tmpdir, 0755) != 0) {
        rc = fasa_error(err, FASA_EIO, "cannot create '%s': %s", final, strerror(errno));
        goto fail;
    }
    if ((rc = write_all_files(m, o, tmpdir, members, &n_members, err)) < 0) goto fail;
    if (o->bundle) {
        rc = bundle_write(final, tmpdir, members, n_members, o->zstd, err);
        bundle_remove_dir(tmpdir);
    } else {
        sync_dir(tmpdir);
        if (rename(tmpdir, final) != 0) {
            rc = fasa_error(err, FASA_EIO, "cannot rename into '%s': %s", final, strerror(errno));
            goto fail;
        }
    }
    if (rc == 0) sync_parent(final);
    return rc;
fail:
    bundle_remove_dir(tmpdir);
    return rc;
}

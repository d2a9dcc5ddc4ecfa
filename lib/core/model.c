/* model.c - loading (GGUF or Hugging Face safetensors) and the CPU forward pass. */
#include "model.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "bundle.h"
#include "gguf.h"
#include "safetensors.h"

/* ---------------------------------------------------------------- RoPE frequencies */

void model_rope_freqs(const model_config *c, float *theta)
{
    const int half = c->d_head / 2;
    for (int j = 0; j < half; j++) {
        /* As Hugging Face computes inv_freq: base^(-2j/d) in float32. */
        float f = (float)(1.0 / pow((double)c->rope_theta, (double)(2 * j) / c->d_head));
        if (c->rope_scaling == ROPE_SCALING_LINEAR) {
            f /= c->rope_factor;
        } else if (c->rope_scaling == ROPE_SCALING_LLAMA3) {
            double wavelen = 2 * M_PI / f;
            double low_wl = c->rope_orig_ctx / c->rope_low_freq_factor;
            double high_wl = c->rope_orig_ctx / c->rope_high_freq_factor;
            if (wavelen > low_wl) {
                f /= c->rope_factor;
            } else if (wavelen >= high_wl) {
                double smooth = (c->rope_orig_ctx / wavelen - c->rope_low_freq_factor) /
                                (c->rope_high_freq_factor - c->rope_low_freq_factor);
                f = (float)((1 - smooth) * f / c->rope_factor + smooth * f);
            }
        }
        theta[j] = f;
    }
}

/* ---------------------------------------------------------------- config checks */

int model_config_check(const model_config *c, const char *where, char *err)
{
    if (c->n_layer <= 0 || c->n_layer > 1024 || c->d_model <= 0 || c->n_head <= 0 ||
        c->n_kv_head <= 0 || c->d_head <= 0 || c->d_ff <= 0 || c->n_vocab <= 0)
        return fasa_error(err, FASA_EFORMAT, "'%s': missing or non-positive model dimensions", where);
    if (c->n_head % c->n_kv_head)
        return fasa_error(err, FASA_EFORMAT, "'%s': %d query heads are not a multiple of %d KV heads",
                          where, c->n_head, c->n_kv_head);
    if (c->d_head % 2 || c->d_head > 1024)
        return fasa_error(err, FASA_EFORMAT, "'%s': head dim %d must be even and <= 1024", where, c->d_head);
    /* q/k/v widths and per-(layer, KV head) table sizes are ints; n_kv_head <= n_head here. */
    if ((int64_t)c->n_head * c->d_head > MODEL_MAX_ATTN_WIDTH)
        return fasa_error(err, FASA_EFORMAT, "'%s': %d heads of dim %d exceed the attention width limit of %d",
                          where, c->n_head, c->d_head, MODEL_MAX_ATTN_WIDTH);
    if (!(c->rope_theta > 0) || !(c->norm_eps > 0))
        return fasa_error(err, FASA_EFORMAT, "'%s': rope theta and norm eps must be positive", where);
    if (c->rope_scaling != ROPE_SCALING_NONE && !(c->rope_factor > 0))
        return fasa_error(err, FASA_EFORMAT, "'%s': rope scaling factor must be positive", where);
    if (c->rope_scaling == ROPE_SCALING_LLAMA3 &&
        !(c->rope_high_freq_factor > c->rope_low_freq_factor && c->rope_low_freq_factor > 0 &&
          c->rope_orig_ctx > 0))
        return fasa_error(err, FASA_EFORMAT, "'%s': bad llama3 rope scaling parameters", where);
    return 0;
}

/* A weight must have the shape the config implies; its type must be one we can read; a GGUF
 * tensor's block scales must be finite (a NaN scale would poison every logit silently). */
static int check_weight(const model *m, const weight *w, const char *name, int64_t rows, int64_t cols,
                        char *err)
{
    const char *file = m->path;
    if (!w->data)
        return fasa_error(err, FASA_EMISMATCH, "'%s': missing tensor '%s'", file, name);
    if (w->rows != rows || w->cols != cols)
        return fasa_error(err, FASA_EMISMATCH,
                          "'%s': tensor '%s' is %lld x %lld but the config implies %lld x %lld",
                          file, name, (long long)w->rows, (long long)w->cols, (long long)rows,
                          (long long)cols);
    if (!gguf_type_known(w->type))
        return fasa_error(err, FASA_EUNSUPPORTED, "'%s': tensor '%s' has unsupported type %u",
                          file, name, w->type);
    if (m->source == MODEL_SOURCE_GGUF)
        return gguf_check_tensor(m->file, gguf_find_tensor(m->file, name), err);
    return 0;
}

/* ---------------------------------------------------------------- tensor lookup by role */

/* Names of each role in the two naming schemes. */
enum role { R_EMBD, R_OUT_NORM, R_OUTPUT, R_ATTN_NORM, R_Q, R_K, R_V, R_O, R_FFN_NORM, R_GATE,
            R_UP, R_DOWN, R_BQ, R_BK, R_BV, R_Q_NORM, R_K_NORM, R_POST_ATTN_NORM, R_POST_FFN_NORM, R_COUNT };
static const char *const gguf_names[R_COUNT] = {
    "token_embd.weight", "output_norm.weight", "output.weight", "blk.%d.attn_norm.weight",
    "blk.%d.attn_q.weight", "blk.%d.attn_k.weight", "blk.%d.attn_v.weight",
    "blk.%d.attn_output.weight", "blk.%d.ffn_norm.weight", "blk.%d.ffn_gate.weight",
    "blk.%d.ffn_up.weight", "blk.%d.ffn_down.weight", "blk.%d.attn_q.bias",
    "blk.%d.attn_k.bias", "blk.%d.attn_v.bias", "blk.%d.attn_q_norm.weight", "blk.%d.attn_k_norm.weight",
    "blk.%d.post_attention_norm.weight", "blk.%d.post_ffw_norm.weight",
};
static const char *const hf_names[R_COUNT] = {
    "model.embed_tokens.weight", "model.norm.weight", "lm_head.weight",
    "model.layers.%d.input_layernorm.weight", "model.layers.%d.self_attn.q_proj.weight",
    "model.layers.%d.self_attn.k_proj.weight", "model.layers.%d.self_attn.v_proj.weight",
    "model.layers.%d.self_attn.o_proj.weight", "model.layers.%d.post_attention_layernorm.weight",
    "model.layers.%d.mlp.gate_proj.weight", "model.layers.%d.mlp.up_proj.weight",
    "model.layers.%d.mlp.down_proj.weight", "model.layers.%d.self_attn.q_proj.bias",
    "model.layers.%d.self_attn.k_proj.bias", "model.layers.%d.self_attn.v_proj.bias",
    "model.layers.%d.self_attn.q_norm.weight", "model.layers.%d.self_attn.k_norm.weight",
    "model.layers.%d.post_attention_layernorm.weight", "model.layers.%d.post_feedforward_layernorm.weight",
};

/* Gemma's Hugging Face names differ for the norms around the feed-forward: its input norm is
 * "pre_feedforward_layernorm" ("post_attention_layernorm" is the norm of attention's output). */
static const char *role_name(const model *m, enum role r)
{
    if (m->source == MODEL_SOURCE_GGUF) return gguf_names[r];
    if (m->cfg.gemma && r == R_FFN_NORM) return "model.layers.%d.pre_feedforward_layernorm.weight";
    return hf_names[r];
}

static int st_to_type(st_dtype t)
{
    switch (t) {
    case ST_F32: return GGUF_TYPE_F32;
    case ST_F16: return GGUF_TYPE_F16;
    case ST_BF16: return GGUF_TYPE_BF16;
    default: return -1;
    }
}

/* Finds a role's tensor; a missing tensor gives w->data == NULL. */
static int find_weight(const model *m, enum role r, int layer, weight *w, char *name, char *err)
{
    memset(w, 0, sizeof *w);
    snprintf(name, 128, role_name(m, r), layer);
    if (m->source == MODEL_SOURCE_GGUF) {
        const gguf_tensor *t = gguf_find_tensor(m->file, name);
        if (!t) return 0;
        if (t->n_dims > 2)
            return fasa_error(err, FASA_EMISMATCH, "'%s': tensor '%s' has %u dims, expected <= 2",
                              m->path, name, t->n_dims);
        *w = (weight){ t->type, t->n_dims == 2 ? t->ne[1] : 1, t->ne[0], t->data };
    } else {
        const st_file *owner;
        const st_tensor *t = st_sharded_find(m->file, name, &owner);
        if (!t) return 0;
        int type = st_to_type(t->dtype);
        if (type < 0)
            return fasa_error(err, FASA_EUNSUPPORTED, "'%s': tensor '%s' has unsupported dtype %s",
                              owner->path, name, st_dtype_name(t->dtype));
        if (t->n_dims < 1 || t->n_dims > 2)
            return fasa_error(err, FASA_EMISMATCH, "'%s': tensor '%s' has %d dims, expected 1 or 2",
                              owner->path, name, t->n_dims);
        *w = (weight){ (uint32_t)type, t->n_dims == 2 ? t->shape[0] : 1,
                       t->shape[t->n_dims - 1], t->data };
    }
    return 0;
}

static int load_vector(model *m, enum role r, int layer, int64_t n, float **out, int required,
                       char *err)
{
    char name[128];
    weight w;
    int rc = find_weight(m, r, layer, &w, name, err);
    if (rc < 0) return rc;
    *out = NULL;
    if (!w.data && !required) return 0;
    if ((rc = check_weight(m, &w, name, 1, n, err)) < 0) return rc;
    if (!(*out = malloc(n * sizeof(float)))) return fasa_error(err, FASA_ENOMEM, "out of memory");
    weight_row(&w, 0, *out);
    /* Gemma's RMSNorm scales by 1 + w; llama.cpp's converter stores 1 + w in GGUF files */
    if (m->cfg.gemma && m->source != MODEL_SOURCE_GGUF && r != R_BQ && r != R_BK && r != R_BV)
        for (int64_t i = 0; i < n; i++) (*out)[i] += 1;
    return 0;
}

/* ---------------------------------------------------------------- config from GGUF */

static int gguf_u32_key(gguf_file *g, const char *arch, const char *suffix, int *out, int required,
                        const char *path, char *err)
{
    char key[128];
    uint32_t v;
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    if (gguf_get_u32(g, key, &v) < 0) {
        if (!required) return 0;
        return fasa_error(err, FASA_EFORMAT, "'%s': missing or malformed key '%s'", path, key);
    }
    if (v > (1u << 30)) return fasa_error(err, FASA_EFORMAT, "'%s': key '%s' = %u is out of range", path, key, v);
    *out = (int)v;
    return 0;
}

static int config_from_gguf(model *m, char *err)
{
    gguf_file *g = m->file;
    model_config *c = &m->cfg;
    gguf_str s;
    char arch[32];
    if (gguf_get_str(g, "general.architecture", &s) < 0 || s.len == 0 || s.len >= sizeof arch)
        return fasa_error(err, FASA_EFORMAT, "'%s': missing 'general.architecture'", m->path);
    memcpy(arch, s.ptr, s.len);
    arch[s.len] = 0;
    /* mistral GGUFs say "llama"; llama.cpp permutes llama's q/k rows into the interleaved layout */
    const int a = fasa_arch_parse(arch);
    if (a < 0 || a == FASA_ARCH_MISTRAL)
        return fasa_error(err, FASA_EUNSUPPORTED, "'%s': unsupported architecture '%s'", m->path, arch);
    c->arch = a;
    c->layout = a == FASA_ARCH_LLAMA ? ROPE_LAYOUT_INTERLEAVED : ROPE_LAYOUT_HF;
    c->qkv_bias = a == FASA_ARCH_QWEN2;
    c->qk_norm = a == FASA_ARCH_QWEN3 || a == FASA_ARCH_GEMMA3;
    c->gemma = a == FASA_ARCH_GEMMA3;
    if (gguf_get_str(g, "general.name", &s) == 0)
        snprintf(m->name, sizeof m->name, "%.*s", (int)(s.len < 127 ? s.len : 127), s.ptr);
    int rc;
    if ((rc = gguf_u32_key(g, arch, "block_count", &c->n_layer, 1, m->path, err)) < 0 ||
        (rc = gguf_u32_key(g, arch, "embedding_length", &c->d_model, 1, m->path, err)) < 0 ||
        (rc = gguf_u32_key(g, arch, "feed_forward_length", &c->d_ff, 1, m->path, err)) < 0 ||
        (rc = gguf_u32_key(g, arch, "attention.head_count", &c->n_head, 1, m->path, err)) < 0)
        return rc;
    c->n_kv_head = c->n_head;
    c->n_ctx_train = 4096;
    if ((rc = gguf_u32_key(g, arch, "attention.head_count_kv", &c->n_kv_head, 0, m->path, err)) < 0 ||
        (rc = gguf_u32_key(g, arch, "context_length", &c->n_ctx_train, 0, m->path, err)) < 0)
        return rc;
    c->d_head = c->n_head ? c->d_model / c->n_head : 0;
    if ((rc = gguf_u32_key(g, arch, "attention.key_length", &c->d_head, 0, m->path, err)) < 0) return rc;
    int rot = c->d_head;
    if ((rc = gguf_u32_key(g, arch, "rope.dimension_count", &rot, 0, m->path, err)) < 0) return rc;
    if (rot != c->d_head)
        return fasa_error(err, FASA_EUNSUPPORTED, "'%s': partial rotary embeddings (%d of %d dims) are not supported",
                          m->path, rot, c->d_head);
    char key[128];
    c->rope_theta = 10000.0f;
    snprintf(key, sizeof key, "%s.rope.freq_base", arch);
    gguf_get_f32(g, key, &c->rope_theta);
    c->norm_eps = 1e-5f;
    snprintf(key, sizeof key, "%s.attention.layer_norm_rms_epsilon", arch);
    gguf_get_f32(g, key, &c->norm_eps);
    snprintf(key, sizeof key, "%s.rope.scaling.type", arch);
    if (gguf_get_str(g, key, &s) == 0 && s.len == 6 && !memcmp(s.ptr, "linear", 6)) {
        c->rope_scaling = ROPE_SCALING_LINEAR;
        snprintf(key, sizeof key, "%s.rope.scaling.factor", arch);
        gguf_get_f32(g, key, &c->rope_factor);
    }
    snprintf(key, sizeof key, "%s.rope.scaling.type", arch);
    if (gguf_get_str(g, key, &s) == 0 && !(s.len == 6 && !memcmp(s.ptr, "linear", 6)) &&
        !(s.len == 4 && !memcmp(s.ptr, "none", 4)))
        return fasa_error(err, FASA_EUNSUPPORTED, "'%s': unsupported rope scaling '%.*s'", m->path, (int)s.len, s.ptr);
    if ((rc = gguf_u32_key(g, arch, "attention.sliding_window", &c->sliding_window, 0, m->path, err)) < 0) return rc;
    if (c->gemma) {
        /* Gemma 3 (as llama.cpp reads it): every sixth layer global with the file's RoPE base,
         * the others local over the sliding window with base 10000; queries scaled by
         * 1/sqrt(head dim), or 1/sqrt(d_model / n_head) for the 62-layer 27B */
        if (!c->sliding_window)
            return fasa_error(err, FASA_EFORMAT, "'%s': a gemma3 file needs 'gemma3.attention.sliding_window'",
                              m->path);
        c->swa_period = 6;
        c->rope_theta_local = 10000.0f;
        c->attn_scale = 1.0f / sqrtf((float)(c->n_layer == 62 ? c->d_model / c->n_head : c->d_head));
    }
    const gguf_tensor *tv = gguf_find_tensor(g, "token_embd.weight");
    if (!tv || tv->n_dims != 2)
        return fasa_error(err, FASA_EMISMATCH, "'%s': missing tensor 'token_embd.weight'", m->path);
    c->n_vocab = (int)tv->ne[1];
    c->tied_embeddings = gguf_find_tensor(g, "output.weight") == NULL;
    return 0;
}

/* ---------------------------------------------------------------- config from config.json */

static double json_num(const cJSON *o, const char *key, double def)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsNumber(v) ? v->valuedouble : def;
}

/* A number read as an int (truncated, as a cast does); one outside the int range names itself in
 * *bad (the first such key) and reads as def, since converting it would be undefined. */
static int json_int(const cJSON *o, const char *key, int def, const char **bad)
{
    double v = json_num(o, key, def);
    if (v > -2147483649.0 && v < 2147483648.0) return (int)v;
    if (!*bad) *bad = key;
    return def;
}

int model_config_parse(model_config *c, const char *json, size_t len, const char *path, char *err)
{
    memset(c, 0, sizeof *c);
    cJSON *j = cJSON_ParseWithLength(json, len);
    if (!cJSON_IsObject(j)) {
        cJSON_Delete(j);
        return fasa_error(err, FASA_EFORMAT, "'%s': not a JSON object", path);
    }
    int rc = 0;
    const char *bad = NULL;
    const cJSON *mt = cJSON_GetObjectItemCaseSensitive(j, "model_type");
    const char *type = cJSON_IsString(mt) ? mt->valuestring : "";
    const int arch = fasa_arch_parse(type);
    if (arch < 0) {
        rc = fasa_error(err, FASA_EUNSUPPORTED, "'%s': unsupported model_type '%s'", path, type);
        goto out;
    }
    c->arch = arch;
    c->qkv_bias = arch == FASA_ARCH_QWEN2;
    c->qk_norm = arch == FASA_ARCH_QWEN3 || arch == FASA_ARCH_GEMMA3;
    c->gemma = arch == FASA_ARCH_GEMMA3;
    c->layout = ROPE_LAYOUT_HF;
    c->n_layer = json_int(j, "num_hidden_layers", 0, &bad);
    c->d_model = json_int(j, "hidden_size", 0, &bad);
    c->d_ff = json_int(j, "intermediate_size", 0, &bad);
    c->n_head = json_int(j, "num_attention_heads", 0, &bad);
    c->n_kv_head = json_int(j, "num_key_value_heads", c->n_head, &bad);
    c->d_head = c->n_head > 0 ? c->d_model / c->n_head : 0;
    const cJSON *hd = cJSON_GetObjectItemCaseSensitive(j, "head_dim");
    if (cJSON_IsNumber(hd)) c->d_head = hd->valueint;
    c->n_vocab = json_int(j, "vocab_size", 0, &bad);
    c->n_ctx_train = json_int(j, "max_position_embeddings", 4096, &bad);
    c->norm_eps = (float)json_num(j, "rms_norm_eps", 1e-6);
    c->tied_embeddings = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(j, "tie_word_embeddings"));
    if (cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(j, "attention_bias"))) c->qkv_bias = 1;
    /* RoPE: either top-level rope_theta + rope_scaling, or (newer) one rope_parameters object. */
    const cJSON *rp = cJSON_GetObjectItemCaseSensitive(j, "rope_parameters");
    const cJSON *rs = cJSON_IsObject(rp) ? rp : cJSON_GetObjectItemCaseSensitive(j, "rope_scaling");
    c->rope_theta = (float)json_num(cJSON_IsObject(rp) ? rp : j, "rope_theta", json_num(j, "rope_theta", 10000.0));
    if (cJSON_IsObject(rs)) {
        const cJSON *t = cJSON_GetObjectItemCaseSensitive(rs, "rope_type");
        if (!cJSON_IsString(t)) t = cJSON_GetObjectItemCaseSensitive(rs, "type");
        const char *rt = cJSON_IsString(t) ? t->valuestring : "default";
        c->rope_factor = (float)json_num(rs, "factor", 1.0);
        if (!strcmp(rt, "llama3")) {
            c->rope_scaling = ROPE_SCALING_LLAMA3;
            c->rope_low_freq_factor = (float)json_num(rs, "low_freq_factor", 1.0);
            c->rope_high_freq_factor = (float)json_num(rs, "high_freq_factor", 4.0);
            c->rope_orig_ctx = json_int(rs, "original_max_position_embeddings", 8192, &bad);
        } else if (!strcmp(rt, "linear")) {
            c->rope_scaling = ROPE_SCALING_LINEAR;
        } else if (strcmp(rt, "default")) {
            rc = fasa_error(err, FASA_EUNSUPPORTED, "'%s': unsupported rope scaling '%s'", path, rt);
        }
    }
    /* a sliding window: mistral (every layer, when the config gives one), gemma3 (local layers in
     * its pattern, with their own RoPE base) */
    const cJSON *sw = cJSON_GetObjectItemCaseSensitive(j, "sliding_window");
    if (cJSON_IsNumber(sw) && sw->valuedouble > 0 && sw->valuedouble < c->n_ctx_train)
        c->sliding_window = json_int(j, "sliding_window", 0, &bad);
    if (rc == 0 && c->gemma) {
        const cJSON *lt = cJSON_GetObjectItemCaseSensitive(j, "layer_types");
        c->swa_period = json_int(j, "sliding_window_pattern", 6, &bad);
        if (cJSON_IsArray(lt)) {   /* newer configs list each layer; the pattern must be periodic */
            int period = 0, i = 0;
            const cJSON *v;
            cJSON_ArrayForEach(v, lt) {
                if (cJSON_IsString(v) && !strcmp(v->valuestring, "full_attention") && !period) period = i + 1;
                i++;
            }
            if (period) c->swa_period = period;
            i = 0;
            cJSON_ArrayForEach(v, lt) {
                const int global = cJSON_IsString(v) && !strcmp(v->valuestring, "full_attention");
                if (global != (i % c->swa_period == c->swa_period - 1))
                    rc = fasa_error(err, FASA_EUNSUPPORTED, "'%s': layer_types is not one global layer in every %d",
                                    path, c->swa_period);
                i++;
            }
        }
        if (rc == 0 && c->sliding_window <= 0)
            rc = fasa_error(err, FASA_EFORMAT, "'%s': a gemma3 config needs \"sliding_window\"", path);
        c->rope_theta_local = (float)json_num(j, "rope_local_base_freq", 10000.0);
        c->attn_scale = 1.0f / sqrtf((float)json_num(j, "query_pre_attn_scalar", c->d_head));
        c->norm_eps = (float)json_num(j, "rms_norm_eps", 1e-6);
    }
    if (rc == 0 && bad) rc = fasa_error(err, FASA_EFORMAT, "'%s': \"%s\" is out of range", path, bad);
out:
    cJSON_Delete(j);
    return rc;
}

static int config_from_json(model *m, const char *path, char *err)
{
    FILE *f = fopen(path, "rb");
    if (!f) return fasa_error(err, FASA_EIO, "cannot open '%s': %s", path, strerror(errno));
    char *buf = NULL;
    long len = 0;
    if (fseek(f, 0, SEEK_END) == 0 && (len = ftell(f)) >= 0 && len < (64 << 20) &&
        fseek(f, 0, SEEK_SET) == 0 && (buf = malloc(len + 1)) && fread(buf, 1, len, f) == (size_t)len) {
        buf[len] = 0;
    } else {
        free(buf);
        fclose(f);
        return fasa_error(err, FASA_EIO, "cannot read '%s'", path);
    }
    fclose(f);
    int rc = model_config_parse(&m->cfg, buf, (size_t)len, path, err);
    free(buf);
    return rc;
}

/* ---------------------------------------------------------------- opening */

static int is_dir(const char *p)
{
    struct stat st;
    return stat(p, &st) == 0 && S_ISDIR(st.st_mode);
}

static int ends_with(const char *s, const char *suffix)
{
    size_t a = strlen(s), b = strlen(suffix);
    return a >= b && !strcmp(s + a - b, suffix);
}

static int open_gguf(model *m, char *err)
{
    gguf_file *g = calloc(1, sizeof *g);
    if (!g) return fasa_error(err, FASA_ENOMEM, "out of memory");
    m->file = g;
    int rc = gguf_open(g, m->path, err);
    if (rc < 0) { free(g); m->file = NULL; return rc; }
    if ((rc = config_from_gguf(m, err)) < 0) return rc;

    /* Tokenizer from tokenizer.ggml.* (none: fine for ids-only use; m->tok stays NULL). */
    return tokenizer_load_gguf(&m->tok, g, err);
}

static int open_hf(model *m, const char *dir, char *err)
{
    char p[1024];
    int rc;
    snprintf(p, sizeof p, "%s/config.json", dir);
    if ((rc = config_from_json(m, p, err)) < 0) return rc;
    st_sharded *s = calloc(1, sizeof *s);
    if (!s) return fasa_error(err, FASA_ENOMEM, "out of memory");
    m->file = s;
    snprintf(p, sizeof p, "%s/model.safetensors.index.json", dir);
    struct stat st;
    if (stat(p, &st) == 0) {
        rc = st_sharded_open(s, p, err);
    } else {
        /* One file: the path given, or model.safetensors in the directory. */
        s->files = calloc(1, sizeof(st_file));
        if (!s->files) return fasa_error(err, FASA_ENOMEM, "out of memory");
        if (ends_with(m->path, ".safetensors")) snprintf(p, sizeof p, "%s", m->path);
        else snprintf(p, sizeof p, "%s/model.safetensors", dir);
        rc = st_open(s->files, p, err);
        if (rc == 0) s->n_files = 1;
    }
    if (rc < 0) return rc;
    const char *order = s->n_files ? st_meta(&s->files[0], "fasa.chunk_order") : NULL;
    if (order) {
        model_config *c = &m->cfg;
        if ((rc = model_config_check(c, dir, err)) < 0) return rc;
        m->chunk_order = malloc(sizeof(int16_t) * c->n_layer * c->n_kv_head * (c->d_head / 2));
        if (!m->chunk_order) return fasa_error(err, FASA_ENOMEM, "out of memory");
        if ((rc = model_parse_chunk_order(order, c, m->chunk_order, s->files[0].path, err)) < 0) return rc;
        c->layout = ROPE_LAYOUT_PERMUTED;
    }
    snprintf(p, sizeof p, "%s/tokenizer.json", dir);
    if (stat(p, &st) == 0) {
        if ((rc = tokenizer_load_json(&m->tok, p, err)) < 0) return rc;
    }
    const char *slash = strrchr(dir, '/');
    snprintf(m->name, sizeof m->name, "%s", slash && slash[1] ? slash + 1 : dir);
    return 0;
}

static int load_weights(model *m, char *err)
{
    model_config *c = &m->cfg;
    const int d = c->d_model, qd = c->n_head * c->d_head, kvd = c->n_kv_head * c->d_head;
    char name[128];
    int rc;
    weight w;

#define GET(role, layer, dst, rows, cols)                                              \
    do {                                                                               \
        if ((rc = find_weight(m, role, layer, &w, name, err)) < 0) return rc;          \
        if ((rc = check_weight(m, &w, name, rows, cols, err)) < 0) return rc;          \
        dst = w;                                                                       \
        m->n_params += (rows) * (int64_t)(cols);                                       \
        m->weight_bytes += weight_bytes(&w);                                           \
    } while (0)

    GET(R_EMBD, 0, m->tok_embd, c->n_vocab, d);
    if ((rc = find_weight(m, R_OUTPUT, 0, &w, name, err)) < 0) return rc;
    if (w.data && !c->tied_embeddings) {
        GET(R_OUTPUT, 0, m->output, c->n_vocab, d);
    } else {
        c->tied_embeddings = 1;
        m->output = m->tok_embd;
    }
    if (!(m->layers = calloc(c->n_layer, sizeof *m->layers)))
        return fasa_error(err, FASA_ENOMEM, "out of memory");
    float *norm;
    if ((rc = load_vector(m, R_OUT_NORM, 0, d, &norm, 1, err)) < 0) return rc;
    m->out_norm = (weight){ GGUF_TYPE_F32, 1, d, norm };
    for (int l = 0; l < c->n_layer; l++) {
        layer_weights *L = &m->layers[l];
        GET(R_Q, l, L->wq, qd, d);
        GET(R_K, l, L->wk, kvd, d);
        GET(R_V, l, L->wv, kvd, d);
        GET(R_O, l, L->wo, d, qd);
        GET(R_GATE, l, L->w_gate, c->d_ff, d);
        GET(R_UP, l, L->w_up, c->d_ff, d);
        GET(R_DOWN, l, L->w_down, d, c->d_ff);
        if ((rc = load_vector(m, R_ATTN_NORM, l, d, &norm, 1, err)) < 0) return rc;
        L->attn_norm = (weight){ GGUF_TYPE_F32, 1, d, norm };
        if ((rc = load_vector(m, R_FFN_NORM, l, d, &norm, 1, err)) < 0) return rc;
        L->ffn_norm = (weight){ GGUF_TYPE_F32, 1, d, norm };
        if ((rc = load_vector(m, R_BQ, l, qd, &L->bq, c->qkv_bias, err)) < 0 ||
            (rc = load_vector(m, R_BK, l, kvd, &L->bk, c->qkv_bias, err)) < 0 ||
            (rc = load_vector(m, R_BV, l, kvd, &L->bv, c->qkv_bias, err)) < 0)
            return rc;
        /* only where the architecture has them: llama's Hugging Face files have a tensor called
         * post_attention_layernorm too, the feed-forward's input norm */
        if (c->qk_norm && ((rc = load_vector(m, R_Q_NORM, l, c->d_head, &L->q_norm, 1, err)) < 0 ||
                           (rc = load_vector(m, R_K_NORM, l, c->d_head, &L->k_norm, 1, err)) < 0))
            return rc;
        if (c->gemma && ((rc = load_vector(m, R_POST_ATTN_NORM, l, d, &L->post_attn_norm, 1, err)) < 0 ||
                         (rc = load_vector(m, R_POST_FFN_NORM, l, d, &L->post_ffn_norm, 1, err)) < 0))
            return rc;
    }
#undef GET
    m->n_params += (int64_t)d * (1 + 2 * c->n_layer);
    return 0;
}

int model_hf_dim(const model *m, int layer, int kv_head, int file_dim)
{
    const int d = m->cfg.d_head, half = d / 2;
    switch (m->cfg.layout) {
    case ROPE_LAYOUT_HF: return file_dim;
    case ROPE_LAYOUT_INTERLEAVED: return (file_dim % 2) * half + file_dim / 2;   /* 2j + t <-> t d/2 + j */
    default: {
        const int16_t *order = m->chunk_order + ((size_t)layer * m->cfg.n_kv_head + kv_head) * half;
        return (file_dim % 2) * half + order[file_dim / 2];
    }
    }
}

int model_parse_chunk_order(const char *json, const model_config *c, int16_t *order, const char *where, char *err)
{
    const int half = c->d_head / 2;
    cJSON *j = cJSON_Parse(json);
    int rc = 0;
    if (!cJSON_IsArray(j) || cJSON_GetArraySize(j) != c->n_layer) {
        rc = fasa_error(err, FASA_EFORMAT, "'%s': fasa.chunk_order must list %d layers", where, c->n_layer);
        goto out;
    }
    for (int l = 0; l < c->n_layer; l++) {
        const cJSON *la = cJSON_GetArrayItem(j, l);
        if (!cJSON_IsArray(la) || cJSON_GetArraySize(la) != c->n_kv_head) {
            rc = fasa_error(err, FASA_EFORMAT, "'%s': fasa.chunk_order layer %d must list %d KV heads", where, l,
                            c->n_kv_head);
            goto out;
        }
        for (int g = 0; g < c->n_kv_head; g++) {
            const cJSON *ga = cJSON_GetArrayItem(la, g), *v;
            char seen[512] = { 0 };
            int r = 0;
            if (!cJSON_IsArray(ga) || cJSON_GetArraySize(ga) != half) goto bad;
            cJSON_ArrayForEach(v, ga) {
                double x = cJSON_IsNumber(v) ? v->valuedouble : -1;
                if (x < 0 || x >= half || x != (int)x || seen[(int)x]++) goto bad;
                order[((size_t)l * c->n_kv_head + g) * half + r++] = (int16_t)x;
            }
            continue;
        bad:
            rc = fasa_error(err, FASA_EFORMAT,
                            "'%s': fasa.chunk_order layer %d KV head %d is not a permutation of %d chunks", where, l, g,
                            half);
            goto out;
        }
    }
out:
    cJSON_Delete(j);
    return rc;
}

/* Canonical pair c holds frequency chunk c, or chunk_order[c] in a converted model. */
static int rope_tables(model *m, char *err)
{
    const model_config *c = &m->cfg;
    const int half = c->d_head / 2, n = c->n_layer * c->n_kv_head;
    m->rope_src = malloc(sizeof(int16_t) * n * c->d_head);
    m->rope_freq = malloc(sizeof(float) * n * half);
    float *theta = malloc(sizeof(float) * 2 * half), *local = theta + half;
    if (!m->rope_src || !m->rope_freq || !theta) { free(theta); return fasa_error(err, FASA_ENOMEM, "out of memory"); }
    model_rope_freqs(c, theta);
    /* local (sliding-window) layers of gemma3 rotate with their own base and no scaling */
    model_config cl = *c;
    cl.rope_theta = c->rope_theta_local > 0 ? c->rope_theta_local : c->rope_theta;
    if (c->rope_theta_local > 0) cl.rope_scaling = ROPE_SCALING_NONE;
    model_rope_freqs(&cl, local);
    /* llama.cpp writes Llama 3.1+'s RoPE scaling as per-frequency divisors, a tensor */
    const gguf_tensor *rf = m->source == MODEL_SOURCE_GGUF ? gguf_find_tensor(m->file, "rope_freqs.weight") : NULL;
    if (rf) {
        if (rf->type != GGUF_TYPE_F32 || rf->ne[0] != half || rf->n_dims != 1) {
            free(theta);
            return fasa_error(err, FASA_EFORMAT, "'%s': 'rope_freqs.weight' must hold %d f32 values", m->path, half);
        }
        const float *div = rf->data;
        for (int j = 0; j < half; j++) {
            if (!(div[j] > 0)) {
                free(theta);
                return fasa_error(err, FASA_EFORMAT, "'%s': 'rope_freqs.weight' holds a non-positive factor", m->path);
            }
            theta[j] /= div[j];
        }
    }
    for (int i = 0; i < n; i++)
        for (int j = 0; j < half; j++) {
            int16_t *src = m->rope_src + (size_t)i * c->d_head + 2 * j;
            if (c->layout == ROPE_LAYOUT_HF) src[0] = j, src[1] = j + half;
            else src[0] = 2 * j, src[1] = 2 * j + 1;
            int f = c->layout == ROPE_LAYOUT_PERMUTED ? m->chunk_order[(size_t)i * half + j] : j;
            m->rope_freq[(size_t)i * half + j] = (model_layer_local(c, i / c->n_kv_head) ? local : theta)[f];
        }
    free(theta);
    return 0;
}

int model_open(model **out, const char *path, char *err)
{
    *out = NULL;
    struct stat st;
    if (stat(path, &st) != 0)
        return fasa_error(err, FASA_EIO, "cannot open '%s': %s", path, strerror(errno));
    model *m = calloc(1, sizeof *m);
    if (!m) return fasa_error(err, FASA_ENOMEM, "out of memory");
    snprintf(m->path, sizeof m->path, "%s", path);
    int rc;
    if (S_ISDIR(st.st_mode)) {
        m->source = MODEL_SOURCE_SAFETENSORS;
        rc = open_hf(m, path, err);
    } else if (ends_with(path, ".fasa")) {
        /* A bundle: extract, open as a directory; the mappings outlive the unlinked files. */
        char dir[4096];
        m->source = MODEL_SOURCE_SAFETENSORS;
        if ((rc = bundle_extract_temp(path, dir, sizeof dir, err)) == 0) {
            rc = open_hf(m, dir, err);
            /* the bundle's profile, kept for `fasa run X.fasa` (the files go away now) */
            char pj[4200];
            snprintf(pj, sizeof pj, "%s/profile.json", dir);
            FILE *pf = rc == 0 ? fopen(pj, "rb") : NULL;
            if (pf) {
                fseek(pf, 0, SEEK_END);
                long len = ftell(pf);
                fseek(pf, 0, SEEK_SET);
                if (len > 0 && (m->bundle_profile = malloc(len + 1)) &&
                    fread(m->bundle_profile, 1, len, pf) == (size_t)len) {
                    m->bundle_profile[len] = 0;
                    m->bundle_profile_len = (size_t)len;
                } else {
                    free(m->bundle_profile);
                    m->bundle_profile = NULL;
                }
                fclose(pf);
            }
            bundle_remove_dir(dir);
            const char *base = strrchr(path, '/');
            snprintf(m->name, sizeof m->name, "%.*s", (int)strlen(base ? base + 1 : path) - 5, base ? base + 1 : path);
        }
    } else if (ends_with(path, ".safetensors")) {
        char dir[512];
        snprintf(dir, sizeof dir, "%s", path);
        char *slash = strrchr(dir, '/');
        if (slash) *slash = 0; else snprintf(dir, sizeof dir, ".");
        m->source = MODEL_SOURCE_SAFETENSORS;
        rc = open_hf(m, dir, err);
    } else {
        m->source = MODEL_SOURCE_GGUF;
        rc = open_gguf(m, err);
    }
    if (rc == 0) rc = model_config_check(&m->cfg, path, err);
    if (rc == 0) rc = load_weights(m, err);
    if (rc == 0) rc = rope_tables(m, err);
    if (rc == 0 && m->tok && tokenizer_n_vocab(m->tok) > m->cfg.n_vocab)
        rc = fasa_error(err, FASA_EMISMATCH, "'%s': tokenizer has %d tokens but the model only %d",
                        path, tokenizer_n_vocab(m->tok), m->cfg.n_vocab);
    if (rc < 0) {
        model_close(m);
        return rc;
    }
    (void)is_dir;
    *out = m;
    return 0;
}

void model_close(model *m)
{
    if (!m) return;
    free(m->bundle_profile);
    if (m->layers) {
        for (int l = 0; l < m->cfg.n_layer; l++) {
            layer_weights *L = &m->layers[l];
            free((void *)L->attn_norm.data);
            free((void *)L->ffn_norm.data);
            free(L->bq); free(L->bk); free(L->bv);
            free(L->q_norm); free(L->k_norm); free(L->post_attn_norm); free(L->post_ffn_norm);
        }
        free(m->layers);
    }
    free((void *)m->out_norm.data);
    if (m->file) {
        if (m->source == MODEL_SOURCE_GGUF) gguf_close(m->file);
        else st_sharded_close(m->file);
        free(m->file);
    }
    tokenizer_free(m->tok);
    free(m->rope_src);
    free(m->rope_freq);
    free(m->chunk_order);
    free(m);
}

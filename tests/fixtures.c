#include "fixtures.h"

#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "base.h"
#include "calibrate.h"
#include "gguf.h"
#include "safetensors.h"

static uint64_t rng_next(uint64_t *s)
{
    uint64_t x = *s += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

static float *rand_vec(uint64_t *s, size_t n, float scale, float offset)
{
    float *v = malloc(n * sizeof *v);
    for (size_t i = 0; i < n; i++)
        v[i] = offset + scale * ((rng_next(s) >> 40) / (float)(1 << 24) * 2 - 1);
    return v;
}

void tiny_make(tiny_model *t, const tiny_spec *spec)
{
    memset(t, 0, sizeof *t);
    tiny_spec s = *spec;
    if (!s.n_layer) s.n_layer = 2;
    if (!s.d_model) s.d_model = 64;
    if (!s.n_head) s.n_head = 4;
    if (!s.n_kv_head) s.n_kv_head = 2;
    if (!s.d_head) s.d_head = 16;
    if (!s.d_ff) s.d_ff = 96;
    if (!s.n_vocab) s.n_vocab = 128;
    if (!s.rope_theta) s.rope_theta = 10000;
    if (s.arch == TINY_GEMMA3 && !s.sliding_window) s.sliding_window = 8;
    if (s.arch == TINY_GEMMA3 && spec->n_layer == 0) s.n_layer = 6;   /* one global layer */
    t->s = s;
    uint64_t r = s.seed * 7919 + 17;
    const int D = s.d_model, qd = s.n_head * s.d_head, kvd = s.n_kv_head * s.d_head;
    const float ws = 1.0f / sqrtf((float)D);
    t->embd = rand_vec(&r, (size_t)s.n_vocab * D, 1.0f, 0);
    t->out_norm = rand_vec(&r, D, 0.2f, 1.0f);
    t->lm_head = s.tied ? NULL : rand_vec(&r, (size_t)s.n_vocab * D, ws, 0);
    t->layers = calloc(s.n_layer, sizeof *t->layers);
    for (int l = 0; l < s.n_layer; l++) {
        tiny_layer *L = &t->layers[l];
        L->attn_norm = rand_vec(&r, D, 0.2f, 1.0f);
        L->ffn_norm = rand_vec(&r, D, 0.2f, 1.0f);
        /* Larger q/k weights make attention peaked, so a RoPE mistake cannot hide. */
        L->wq = rand_vec(&r, (size_t)qd * D, 3 * ws, 0);
        L->wk = rand_vec(&r, (size_t)kvd * D, 3 * ws, 0);
        L->wv = rand_vec(&r, (size_t)kvd * D, ws, 0);
        L->wo = rand_vec(&r, (size_t)D * qd, ws, 0);
        L->gate = rand_vec(&r, (size_t)s.d_ff * D, ws, 0);
        L->up = rand_vec(&r, (size_t)s.d_ff * D, ws, 0);
        L->down = rand_vec(&r, (size_t)D * s.d_ff, 1.0f / sqrtf((float)s.d_ff), 0);
        if (s.arch == TINY_QWEN2) {
            L->bq = rand_vec(&r, qd, 0.5f, 0);
            L->bk = rand_vec(&r, kvd, 0.5f, 0);
            L->bv = rand_vec(&r, kvd, 0.5f, 0);
        }
        if (s.arch == TINY_QWEN3 || s.arch == TINY_GEMMA3) {
            /* gemma keeps w of a (1 + w) scale: about 0, where the others keep about 1 */
            const float off = s.arch == TINY_GEMMA3 ? 0 : 1;
            L->q_norm = rand_vec(&r, s.d_head, 0.5f, off + 0.5f);
            L->k_norm = rand_vec(&r, s.d_head, 0.5f, off + 0.5f);
        }
        if (s.arch == TINY_GEMMA3) {
            L->post_attn_norm = rand_vec(&r, D, 0.2f, 0);
            L->post_ffn_norm = rand_vec(&r, D, 0.2f, 0);
            for (int i = 0; i < D; i++) L->attn_norm[i] -= 1, L->ffn_norm[i] -= 1;
        }
    }
    if (s.arch == TINY_GEMMA3)
        for (int i = 0; i < D; i++) t->out_norm[i] -= 1;
}

/* Layer l of a gemma3 fixture attends over the sliding window (five layers of six). */
static int tiny_local(const tiny_spec *s, int l)
{
    if (!s->sliding_window) return 0;
    return s->arch != TINY_GEMMA3 || l % 6 < 5;
}

void tiny_free(tiny_model *t)
{
    for (int l = 0; l < t->s.n_layer; l++) {
        tiny_layer *L = &t->layers[l];
        float *p[] = { L->attn_norm, L->ffn_norm, L->wq, L->wk, L->wv, L->wo, L->bq, L->bk, L->bv,
                       L->gate, L->up, L->down, L->q_norm, L->k_norm, L->post_attn_norm, L->post_ffn_norm };
        for (size_t i = 0; i < sizeof p / sizeof *p; i++) free(p[i]);
    }
    free(t->layers);
    free(t->embd);
    free(t->out_norm);
    free(t->lm_head);
}

int tiny_write_hf(const tiny_model *t, const char *dir)
{
    const tiny_spec *s = &t->s;
    char path[512];
    snprintf(path, sizeof path, "%s/config.json", dir);
    FILE *f = fopen(path, "w");
    if (!f) return -1;
    static const char *const types[] = { "llama", "qwen2", "qwen3", "gemma3_text" };
    const char *type = s->arch == TINY_LLAMA && s->sliding_window ? "mistral" : types[s->arch];
    fprintf(f, "{\n  \"model_type\": \"%s\",\n  \"num_hidden_layers\": %d,\n  \"hidden_size\": %d,\n"
               "  \"intermediate_size\": %d,\n  \"num_attention_heads\": %d,\n  \"num_key_value_heads\": %d,\n"
               "  \"head_dim\": %d,\n  \"vocab_size\": %d,\n  \"max_position_embeddings\": 512,\n"
               "  \"rms_norm_eps\": 1e-05,\n  \"rope_theta\": %g,\n  \"tie_word_embeddings\": %s",
            type, s->n_layer, s->d_model, s->d_ff, s->n_head, s->n_kv_head, s->d_head, s->n_vocab, s->rope_theta,
            s->tied ? "true" : "false");
    if (s->sliding_window) fprintf(f, ",\n  \"sliding_window\": %d", s->sliding_window);
    if (s->arch == TINY_GEMMA3)
        fprintf(f, ",\n  \"sliding_window_pattern\": 6,\n  \"rope_local_base_freq\": 10000.0,\n"
                   "  \"query_pre_attn_scalar\": %d", s->d_head);
    fprintf(f, "\n}\n");
    fclose(f);
    const int64_t D = s->d_model, qd = s->n_head * s->d_head, kvd = s->n_kv_head * s->d_head;
    st_writer *w = st_writer_new();
    char names[16 * 64][96];
    int k = 0;
#define ADD(ptr, r, c, fmt, ...)                                                          \
    do {                                                                                  \
        snprintf(names[k], sizeof names[k], fmt, __VA_ARGS__);                            \
        int64_t shape[2] = { r, c };                                                      \
        if ((r) == 1) st_writer_add(w, names[k], ST_F32, 1, shape + 1, ptr);              \
        else st_writer_add(w, names[k], ST_F32, 2, shape, ptr);                           \
        k++;                                                                              \
    } while (0)
    ADD(t->embd, s->n_vocab, D, "%s", "model.embed_tokens.weight");
    ADD(t->out_norm, 1, D, "%s", "model.norm.weight");
    if (t->lm_head) ADD(t->lm_head, s->n_vocab, D, "%s", "lm_head.weight");
    for (int l = 0; l < s->n_layer; l++) {
        const tiny_layer *L = &t->layers[l];
        ADD(L->attn_norm, 1, D, "model.layers.%d.input_layernorm.weight", l);
        if (s->arch == TINY_GEMMA3) {
            ADD(L->ffn_norm, 1, D, "model.layers.%d.pre_feedforward_layernorm.weight", l);
            ADD(L->post_attn_norm, 1, D, "model.layers.%d.post_attention_layernorm.weight", l);
            ADD(L->post_ffn_norm, 1, D, "model.layers.%d.post_feedforward_layernorm.weight", l);
        } else {
            ADD(L->ffn_norm, 1, D, "model.layers.%d.post_attention_layernorm.weight", l);
        }
        if (L->q_norm) {
            ADD(L->q_norm, 1, s->d_head, "model.layers.%d.self_attn.q_norm.weight", l);
            ADD(L->k_norm, 1, s->d_head, "model.layers.%d.self_attn.k_norm.weight", l);
        }
        ADD(L->wq, qd, D, "model.layers.%d.self_attn.q_proj.weight", l);
        ADD(L->wk, kvd, D, "model.layers.%d.self_attn.k_proj.weight", l);
        ADD(L->wv, kvd, D, "model.layers.%d.self_attn.v_proj.weight", l);
        ADD(L->wo, D, qd, "model.layers.%d.self_attn.o_proj.weight", l);
        ADD(L->gate, s->d_ff, D, "model.layers.%d.mlp.gate_proj.weight", l);
        ADD(L->up, s->d_ff, D, "model.layers.%d.mlp.up_proj.weight", l);
        ADD(L->down, D, s->d_ff, "model.layers.%d.mlp.down_proj.weight", l);
        if (L->bq) {
            ADD(L->bq, 1, qd, "model.layers.%d.self_attn.q_proj.bias", l);
            ADD(L->bk, 1, kvd, "model.layers.%d.self_attn.k_proj.bias", l);
            ADD(L->bv, 1, kvd, "model.layers.%d.self_attn.v_proj.bias", l);
        }
    }
#undef ADD
    char err[ST_ERRLEN];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    int rc = st_writer_write(w, path, err);
    st_writer_free(w);
    return rc;
}

/* llama.cpp's converter interleaves the rotate_half halves of every head's q/k rows:
 * gguf_row[h*d + 2j + t] = hf_row[h*d + t*d/2 + j]. */
static float *permute_rows(const float *w, int n_head, int d_head, int cols, int rows_per_bias)
{
    float *out = malloc(sizeof(float) * n_head * d_head * cols);
    for (int h = 0; h < n_head; h++)
        for (int j = 0; j < d_head / 2; j++)
            for (int t = 0; t < 2; t++)
                memcpy(out + ((size_t)h * d_head + 2 * j + t) * cols,
                       w + ((size_t)h * d_head + t * d_head / 2 + j) * cols, sizeof(float) * cols);
    (void)rows_per_bias;
    return out;
}

static void put(gguf_writer *w, const char *name, const float *data, int64_t rows, int64_t cols, uint32_t type)
{
    int64_t ne[2] = { cols, rows };
    if (rows == 1 || type == GGUF_TYPE_F32) {
        gguf_w_tensor(w, name, GGUF_TYPE_F32, rows == 1 ? 1 : 2, ne, data);
        return;
    }
    size_t rb = gguf_row_bytes(type, cols);
    uint8_t *q = malloc(rb * rows);
    for (int64_t r = 0; r < rows; r++) gguf_quantize(type, data + r * cols, q + r * rb, cols);
    gguf_w_tensor(w, name, type, 2, ne, q);
    free(q);
}

int tiny_write_gguf(const tiny_model *t, const char *path, uint32_t type)
{
    const tiny_spec *s = &t->s;
    const int D = s->d_model, qd = s->n_head * s->d_head, kvd = s->n_kv_head * s->d_head;
    const int llama = s->arch == TINY_LLAMA, permute = llama && !s->gguf_no_permute;
    static const char *const archs[] = { "llama", "qwen2", "qwen3", "gemma3" };
    const char *a = archs[s->arch];
    char key[128];
    gguf_writer *w = gguf_writer_new();
    gguf_w_str(w, "general.architecture", a);
    gguf_w_str(w, "general.name", "tiny");
#define KU(suffix, v) (snprintf(key, sizeof key, "%s." suffix, a), gguf_w_u32(w, key, v))
    KU("block_count", s->n_layer);
    KU("context_length", 512);
    KU("embedding_length", D);
    KU("feed_forward_length", s->d_ff);
    KU("attention.head_count", s->n_head);
    KU("attention.head_count_kv", s->n_kv_head);
    KU("attention.key_length", s->d_head);
    KU("rope.dimension_count", s->d_head);
#undef KU
    snprintf(key, sizeof key, "%s.rope.freq_base", a);
    gguf_w_f32(w, key, s->rope_theta);
    snprintf(key, sizeof key, "%s.attention.layer_norm_rms_epsilon", a);
    gguf_w_f32(w, key, 1e-5f);
    if (s->sliding_window && !s->gguf_no_window) {
        snprintf(key, sizeof key, "%s.attention.sliding_window", a);
        gguf_w_u32(w, key, s->sliding_window);
    }
    /* gemma: the file holds 1 + w, as llama.cpp's converter writes it */
    const int plus1 = s->arch == TINY_GEMMA3;
    float *one = malloc(sizeof(float) * (D > s->d_head ? D : s->d_head));
#define NORM(v, n)                                                                                                     \
    (memcpy(one, v, sizeof(float) * (n)),                                                                              \
     plus1 ? (void)({                                                                                                  \
         for (int i_ = 0; i_ < (n); i_++) one[i_] += 1;                                                                \
     })                                                                                                                \
           : (void)0,                                                                                                  \
     one)
    put(w, "token_embd.weight", t->embd, s->n_vocab, D, type);
    put(w, "output_norm.weight", NORM(t->out_norm, D), 1, D, type);
    if (t->lm_head) put(w, "output.weight", t->lm_head, s->n_vocab, D, type);
    char name[128];
    for (int l = 0; l < s->n_layer; l++) {
        const tiny_layer *L = &t->layers[l];
#define P(fmt, data, r, c) (snprintf(name, sizeof name, fmt, l), put(w, name, data, r, c, type))
        P("blk.%d.attn_norm.weight", NORM(L->attn_norm, D), 1, D);
        P("blk.%d.ffn_norm.weight", NORM(L->ffn_norm, D), 1, D);
        if (L->q_norm) {
            P("blk.%d.attn_q_norm.weight", NORM(L->q_norm, s->d_head), 1, s->d_head);
            P("blk.%d.attn_k_norm.weight", NORM(L->k_norm, s->d_head), 1, s->d_head);
        }
        if (L->post_attn_norm) {
            P("blk.%d.post_attention_norm.weight", NORM(L->post_attn_norm, D), 1, D);
            P("blk.%d.post_ffw_norm.weight", NORM(L->post_ffn_norm, D), 1, D);
        }
        float *wq = permute ? permute_rows(L->wq, s->n_head, s->d_head, D, 0) : L->wq;
        float *wk = permute ? permute_rows(L->wk, s->n_kv_head, s->d_head, D, 0) : L->wk;
        P("blk.%d.attn_q.weight", wq, qd, D);
        P("blk.%d.attn_k.weight", wk, kvd, D);
        if (permute) free(wq), free(wk);
        P("blk.%d.attn_v.weight", L->wv, kvd, D);
        P("blk.%d.attn_output.weight", L->wo, D, qd);
        P("blk.%d.ffn_gate.weight", L->gate, s->d_ff, D);
        P("blk.%d.ffn_up.weight", L->up, s->d_ff, D);
        P("blk.%d.ffn_down.weight", L->down, D, s->d_ff);
        if (L->bq) {
            P("blk.%d.attn_q.bias", L->bq, 1, qd);
            P("blk.%d.attn_k.bias", L->bk, 1, kvd);
            P("blk.%d.attn_v.bias", L->bv, 1, kvd);
        }
#undef P
    }
#undef NORM
    free(one);
    char err[FASA_ERRLEN];
    int rc = gguf_writer_write(w, path, err);
    gguf_writer_free(w);
    return rc;
}

/* ---------------------------------------------------------------- reference forward (double) */

static void ref_matvec(double *y, const float *w, const double *x, int rows, int cols)
{
    for (int r = 0; r < rows; r++) {
        double s = 0;
        for (int c = 0; c < cols; c++) s += (double)w[(size_t)r * cols + c] * x[c];
        y[r] = s;
    }
}

/* RMSNorm with weights g, or 1 + g (gemma) */
static void ref_rmsnorm(double *out, const double *x, const float *g, int n, int plus1)
{
    double ss = 0;
    for (int i = 0; i < n; i++) ss += x[i] * x[i];
    double sc = 1.0 / sqrt(ss / n + 1e-5);
    for (int i = 0; i < n; i++) out[i] = x[i] * sc * (g[i] + plus1);
}

/* Hugging Face rotate_half: x' = x cos + rotate_half(x) sin with rotate_half(x) = (-x2, x1). */
static void ref_rope(double *v, int d, int pos, double theta)
{
    for (int j = 0; j < d / 2; j++) {
        double f = pow(theta, -2.0 * j / d), c = cos(pos * f), s = sin(pos * f);
        double a = v[j], b = v[j + d / 2];
        v[j] = a * c - b * s;
        v[j + d / 2] = b * c + a * s;
    }
}

void tiny_forward_ref(const tiny_model *t, const int32_t *ids, int n, double *logits)
{
    const tiny_spec *s = &t->s;
    const int D = s->d_model, dh = s->d_head, H = s->n_head, G = s->n_kv_head;
    const int qd = H * dh, kvd = G * dh, gem = s->arch == TINY_GEMMA3;
    double *x = calloc((size_t)n * D, sizeof *x), *xb = malloc(sizeof(double) * D);
    double *q = malloc(sizeof(double) * (size_t)n * qd), *k = malloc(sizeof(double) * (size_t)n * kvd);
    double *v = malloc(sizeof(double) * (size_t)n * kvd), *o = malloc(sizeof(double) * qd);
    double *tmp = malloc(sizeof(double) * (D > s->d_ff ? D : s->d_ff) * 2), *att = malloc(sizeof(double) * n);
    double *g = malloc(sizeof(double) * s->d_ff), *u = malloc(sizeof(double) * s->d_ff);
    for (int i = 0; i < n; i++)
        for (int c = 0; c < D; c++)
            x[(size_t)i * D + c] = t->embd[(size_t)ids[i] * D + c] * (gem ? sqrt((double)D) : 1);
    for (int l = 0; l < s->n_layer; l++) {
        const tiny_layer *L = &t->layers[l];
        const int local = tiny_local(s, l);
        const double theta = gem && local ? 10000.0 : s->rope_theta;
        for (int i = 0; i < n; i++) {
            ref_rmsnorm(xb, x + (size_t)i * D, L->attn_norm, D, gem);
            ref_matvec(q + (size_t)i * qd, L->wq, xb, qd, D);
            ref_matvec(k + (size_t)i * kvd, L->wk, xb, kvd, D);
            ref_matvec(v + (size_t)i * kvd, L->wv, xb, kvd, D);
            for (int j = 0; L->bq && j < qd; j++) q[(size_t)i * qd + j] += L->bq[j];
            for (int j = 0; L->bk && j < kvd; j++)
                k[(size_t)i * kvd + j] += L->bk[j], v[(size_t)i * kvd + j] += L->bv[j];
            for (int h = 0; L->q_norm && h < H; h++) {
                double *p = q + (size_t)i * qd + h * dh;
                ref_rmsnorm(p, p, L->q_norm, dh, gem);
            }
            for (int h = 0; L->k_norm && h < G; h++) {
                double *p = k + (size_t)i * kvd + h * dh;
                ref_rmsnorm(p, p, L->k_norm, dh, gem);
            }
            for (int h = 0; h < H; h++) ref_rope(q + (size_t)i * qd + h * dh, dh, i, theta);
            for (int h = 0; h < G; h++) ref_rope(k + (size_t)i * kvd + h * dh, dh, i, theta);
        }
        for (int i = 0; i < n; i++) {
            /* a local layer sees the last sliding_window tokens, itself included */
            const int t0 = local && i + 1 > s->sliding_window ? i + 1 - s->sliding_window : 0;
            for (int h = 0; h < H; h++) {
                int gi = h / (H / G);
                double mx = -1e300, sum = 0;
                for (int t2 = t0; t2 <= i; t2++) {
                    double d = 0;
                    for (int c = 0; c < dh; c++)
                        d += q[(size_t)i * qd + h * dh + c] * k[(size_t)t2 * kvd + gi * dh + c];
                    att[t2] = d / sqrt((double)dh);
                    if (att[t2] > mx) mx = att[t2];
                }
                for (int t2 = t0; t2 <= i; t2++) sum += att[t2] = exp(att[t2] - mx);
                for (int c = 0; c < dh; c++) {
                    double acc = 0;
                    for (int t2 = t0; t2 <= i; t2++) acc += att[t2] / sum * v[(size_t)t2 * kvd + gi * dh + c];
                    o[h * dh + c] = acc;
                }
            }
            ref_matvec(tmp, L->wo, o, D, qd);
            if (gem) ref_rmsnorm(tmp, tmp, L->post_attn_norm, D, 1);
            for (int c = 0; c < D; c++) x[(size_t)i * D + c] += tmp[c];
        }
        for (int i = 0; i < n; i++) {
            ref_rmsnorm(xb, x + (size_t)i * D, L->ffn_norm, D, gem);
            ref_matvec(g, L->gate, xb, s->d_ff, D);
            ref_matvec(u, L->up, xb, s->d_ff, D);
            for (int c = 0; c < s->d_ff; c++) {
                const double a = g[c];
                g[c] = gem ? 0.5 * a * (1 + tanh(sqrt(2 / M_PI) * (a + 0.044715 * a * a * a))) * u[c]
                           : a / (1 + exp(-a)) * u[c];
            }
            ref_matvec(tmp, L->down, g, D, s->d_ff);
            if (gem) ref_rmsnorm(tmp, tmp, L->post_ffn_norm, D, 1);
            for (int c = 0; c < D; c++) x[(size_t)i * D + c] += tmp[c];
        }
    }
    for (int i = 0; i < n; i++) {
        ref_rmsnorm(xb, x + (size_t)i * D, t->out_norm, D, gem);
        ref_matvec(logits + (size_t)i * s->n_vocab, t->lm_head ? t->lm_head : t->embd, xb, s->n_vocab, D);
    }
    free(x); free(xb); free(q); free(k); free(v); free(o); free(tmp); free(att); free(g); free(u);
}

char *tmpdir_make(void)
{
    char *d = strdup("/tmp/fasa-test-XXXXXX");
    return mkdtemp(d) ? d : (free(d), NULL);
}

void tmpdir_remove(char *dir)
{
    if (!dir) return;
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) { /* best effort */ }
    free(dir);
}

const char *fx_bin(void)
{
    const char *b = getenv("FASA_BIN");
    return b && *b ? b : "bin/fasa";
}

int fx_sh(const char *line, char **out, char **err)
{
    char *dir = tmpdir_make();
    size_t len = strlen(line) + 2 * strlen(dir) + 64;
    char *cmd = malloc(len), p[600];
    snprintf(cmd, len, "%s >%s/out 2>%s/err </dev/null", line, dir, dir);
    int st = system(cmd);
    free(cmd);
    char **dst[2] = { out, err };
    const char *names[2] = { "out", "err" };
    for (int i = 0; i < 2; i++) {
        if (!dst[i]) continue;
        snprintf(p, sizeof p, "%s/%s", dir, names[i]);
        if (!(*dst[i] = fx_read(p, NULL))) *dst[i] = calloc(1, 1);
    }
    tmpdir_remove(dir);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128;
}

int fx_fasa(const char *args, char **out, char **err)
{
    size_t len = strlen(fx_bin()) + strlen(args) + 2;
    char *line = malloc(len);
    snprintf(line, len, "%s %s", fx_bin(), args);
    int st = fx_sh(line, out, err);
    free(line);
    return st;
}

int fx_lines(const char *s)
{
    int n = 0;
    for (; *s; s++) n += *s == '\n';
    return n;
}

char *fx_read(const char *path, size_t *len)
{
    char *buf = NULL, err[FASA_ERRLEN];
    return fasa_read_file(path, 0, &buf, len, err) < 0 ? NULL : buf;
}

double fx_rel(const float *a, const float *ref, size_t n)
{
    double md = 0, mr = 0;
    for (size_t i = 0; i < n; i++) md = fmax(md, fabs((double)a[i] - ref[i])), mr = fmax(mr, fabs(ref[i]));
    return md / mr;
}

void fx_ids(int32_t *ids, int n, int n_vocab)
{
    for (int i = 0; i < n; i++) ids[i] = (i * 29 + 7 + (i * i) % 13) % n_vocab;
}

void fx_profile(model *m, const int32_t *ids, profile *p)
{
    char err[FASA_ERRLEN];
    calib_opts o = calib_defaults(m);
    o.n_prefill = 150;
    o.fcs = 2;
    o.rank_k = 64;
    cr_assert_eq(calibrate_run(m, ids, 200, &o, p, err), 0, "%s", err);
}

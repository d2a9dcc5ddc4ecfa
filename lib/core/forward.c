/* forward.c - the decoder forward pass over a batch of tokens (prefill) or one token (decode).
 * Attention itself is attention_layer's (lib/fasa/attention.c): this file is the rest of the
 * layer, the run state, and the batched prefill loop every caller shares. */
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "attention.h"
#include "model.h"

run_state *run_state_new(const model *m, int n_ctx, int n_batch, char *err)
{
    return run_state_new_kv(m, n_ctx, n_batch, NULL, err);
}

run_state *run_state_new_kv(const model *m, int n_ctx, int n_batch, const kv_opts *ko, char *err)
{
    const model_config *c = &m->cfg;
    if (n_ctx < 1 || n_batch < 1) {
        fasa_error(err, FASA_EARG, "context and batch sizes must be positive");
        return NULL;
    }
    run_state *s = calloc(1, sizeof *s);
    if (!s) { fasa_error(err, FASA_ENOMEM, "out of memory"); return NULL; }
    s->n_ctx = n_ctx;
    s->n_batch = n_batch;
    s->n_threads = omp_get_max_threads();
    const size_t B = n_batch, qd = (size_t)c->n_head * c->d_head, kvd = (size_t)c->n_kv_head * c->d_head;
    s->x = malloc(B * c->d_model * sizeof(float));
    s->xb = malloc(B * c->d_model * sizeof(float));
    s->q = malloc(B * qd * sizeof(float));
    s->k = malloc(B * kvd * sizeof(float));
    s->v = malloc(B * kvd * sizeof(float));
    s->att_out = malloc(B * qd * sizeof(float));
    s->ffa = malloc(B * c->d_ff * sizeof(float));
    s->ffb = malloc(B * c->d_ff * sizeof(float));
    s->logits = malloc(B * c->n_vocab * sizeof(float));
    s->krow = malloc(c->d_head * sizeof(float));
    s->bytes_kv = calloc((size_t)s->n_threads * 8, sizeof *s->bytes_kv);
    if (!s->x || !s->xb || !s->q || !s->k || !s->v || !s->att_out || !s->ffa || !s->ffb || !s->logits || !s->krow ||
        !s->bytes_kv) {
        run_state_free(s);
        fasa_error(err, FASA_ENOMEM, "out of memory for a run state of %d tokens", n_ctx);
        return NULL;
    }
    if (!(s->attn = attn_work_new(m, n_ctx, n_batch, ko && ko->n_split, s->n_threads, err)) ||
        kvcache_init(&s->kv, c->n_layer, c->n_kv_head, n_ctx, c->d_head, ko, err) < 0) {
        run_state_free(s);
        return NULL;
    }
    return s;
}

void run_state_free(run_state *s)
{
    if (!s) return;
    kvcache_free(&s->kv);
    attn_work_free(s->attn);
    free(s->x); free(s->xb); free(s->q); free(s->k); free(s->v); free(s->att_out);
    free(s->ffa); free(s->ffb); free(s->logits); free(s->krow); free(s->bytes_kv);
    free(s);
}

void run_state_reset(run_state *s)
{
    s->n_past = 0;
    s->t_attn = 0;
    memset(s->bytes_kv, 0, sizeof *s->bytes_kv * 8 * s->n_threads);
}

uint64_t run_state_kv_bytes_read(const run_state *s)
{
    uint64_t b = 0;
    for (int t = 0; t < s->n_threads; t++) b += s->bytes_kv[8 * t];
    return b;
}

static void add_bias(float *x, const float *b, int n, int width)
{
    if (!b) return;
    for (int i = 0; i < n; i++)
        for (int j = 0; j < width; j++) x[(size_t)i * width + j] += b[j];
}

/* Rotates one head vector (file layout) and writes it in canonical layout: pair c = (src[2c],
 * src[2c+1]) of the input, rotated by the angle whose cosine and sine are cs[c], sn[c]. */
static void rope_gather(float *out, const float *in, const int16_t *src, const float *cs, const float *sn, int d_head)
{
    for (int c = 0; c < d_head / 2; c++) {
        const float a = in[src[2 * c]], b = in[src[2 * c + 1]];
        out[2 * c] = a * cs[c] - b * sn[c];
        out[2 * c + 1] = a * sn[c] + b * cs[c];
    }
}

/* Per-head RMSNorm of the batch's q (in s->att_out) and k (qwen3, gemma3), before RoPE. */
static void qk_norm(const model *m, run_state *s, const layer_weights *L, int n)
{
    const model_config *c = &m->cfg;
    const int dh = c->d_head;
    for (int i = 0; i < n * c->n_head; i++)
        ops_rmsnorm(s->att_out + (size_t)i * dh, s->att_out + (size_t)i * dh, L->q_norm, dh, c->norm_eps);
    for (int i = 0; i < n * c->n_kv_head; i++)
        ops_rmsnorm(s->k + (size_t)i * dh, s->k + (size_t)i * dh, L->k_norm, dh, c->norm_eps);
}

/* Layer l's projections of the batch (q in s->att_out, file layout; k, v in s->k, s->v) rotated
 * into canonical layout: q into s->q, k and v into the cache at positions n_past... A query
 * scale other than attention's 1/sqrt(d_head) (gemma3's) is folded into q. */
static void rope_and_cache(const model *m, run_state *s, int l, int n)
{
    const model_config *c = &m->cfg;
    const int dh = c->d_head, G = c->n_kv_head, grp = c->n_head / G, qd = c->n_head * dh, kvd = G * dh;
    const float qs = c->attn_scale > 0 ? c->attn_scale * sqrtf((float)dh) : 1;
    for (int i = 0; i < n; i++) {
        const int pos = s->n_past + i;
        for (int g = 0; g < G; g++) {
            const size_t tab = (size_t)l * G + g;
            const float *freq = m->rope_freq + tab * (dh / 2);
            float cs[512], sn[512];   /* d_head <= 1024 (model_config_check) */
            for (int j = 0; j < dh / 2; j++) cs[j] = cosf((float)pos * freq[j]), sn[j] = sinf((float)pos * freq[j]);
            const int16_t *src = m->rope_src + tab * dh;
            rope_gather(s->krow, s->k + (size_t)i * kvd + g * dh, src, cs, sn, dh);
            kvcache_put_key(&s->kv, l, g, pos, s->krow);
            kvcache_put_value(&s->kv, l, g, pos, s->v + (size_t)i * kvd + g * dh);
            for (int h = g * grp; h < (g + 1) * grp; h++) {
                float *q = s->q + (size_t)i * qd + h * dh;
                rope_gather(q, s->att_out + (size_t)i * qd + h * dh, src, cs, sn, dh);
                if (qs != 1)
                    for (int j = 0; j < dh; j++) q[j] *= qs;
            }
        }
    }
}

/* x[i] += norm(y[i]) (gemma's norms after attention and the feed-forward), or x += y */
static void residual(const model *m, run_state *s, const float *norm, int n)
{
    const int D = m->cfg.d_model;
    if (norm)
        for (int i = 0; i < n; i++) ops_rmsnorm(s->xb + (size_t)i * D, s->xb + (size_t)i * D, norm, D, m->cfg.norm_eps);
    for (size_t j = 0; j < (size_t)n * D; j++) s->x[j] += s->xb[j];
}

int model_forward(const model *m, run_state *s, const int32_t *tokens, int n, int all_logits, char *err)
{
    const model_config *c = &m->cfg;
    const int D = c->d_model;
    if (n < 1 || n > s->n_batch)
        return fasa_error(err, FASA_EARG, "batch of %d tokens (at most %d)", n, s->n_batch);
    if (s->n_past + n > s->n_ctx)
        return fasa_error(err, FASA_EARG, "context is full (%d tokens)", s->n_ctx);
    for (int i = 0; i < n; i++)
        if (tokens[i] < 0 || tokens[i] >= c->n_vocab)
            return fasa_error(err, FASA_EARG, "token id %d is outside the vocabulary (%d)", tokens[i], c->n_vocab);

    for (int i = 0; i < n; i++) weight_row(&m->tok_embd, tokens[i], s->x + (size_t)i * D);
    if (c->gemma) {   /* gemma scales its embeddings by sqrt(d_model) */
        const float e = sqrtf((float)D);
        for (size_t j = 0; j < (size_t)n * D; j++) s->x[j] *= e;
    }

    for (int l = 0; l < c->n_layer; l++) {
        const layer_weights *L = &m->layers[l];
        if (n == 1) kvcache_prefetch_put(&s->kv, l, s->n_past);
        /* attention: q, k, v in one parallel region; q lands in att_out until RoPE moves it */
        for (int i = 0; i < n; i++)
            ops_rmsnorm(s->xb + (size_t)i * D, s->x + (size_t)i * D, L->attn_norm.data, D, c->norm_eps);
        float *const qkv_out[3] = { s->att_out, s->k, s->v };
        const weight *const qkv_w[3] = { &L->wq, &L->wk, &L->wv };
        ops_matmul_multi(qkv_out, qkv_w, 3, s->xb, n);
        add_bias(s->att_out, L->bq, n, c->n_head * c->d_head);
        add_bias(s->k, L->bk, n, c->n_kv_head * c->d_head);
        add_bias(s->v, L->bv, n, c->n_kv_head * c->d_head);
        if (c->qk_norm) qk_norm(m, s, L, n);
        const double t_attn = fasa_now();
        rope_and_cache(m, s, l, n);
        if (s->stats) attn_stats_append(s->stats, s, l, s->n_past + n);
        int rc = attention_layer(m, s, l, n, err);
        if (s->stats) attn_stats_reduce(s->stats, l);
        s->t_attn += fasa_now() - t_attn;
        if (rc < 0) return rc;
        ops_matmul(s->xb, &L->wo, s->att_out, n);
        residual(m, s, L->post_attn_norm, n);

        /* feed-forward: SwiGLU (GELU-gated for gemma), gate and up in one parallel region */
        for (int i = 0; i < n; i++)
            ops_rmsnorm(s->xb + (size_t)i * D, s->x + (size_t)i * D, L->ffn_norm.data, D, c->norm_eps);
        float *const gu_out[2] = { s->ffa, s->ffb };
        const weight *const gu_w[2] = { &L->w_gate, &L->w_up };
        ops_matmul_multi(gu_out, gu_w, 2, s->xb, n);
        if (c->gemma) ops_geglu(s->ffa, s->ffb, n * c->d_ff);
        else ops_swiglu(s->ffa, s->ffb, n * c->d_ff);
        ops_matmul(s->xb, &L->w_down, s->ffa, n);
        residual(m, s, L->post_ffn_norm, n);
    }

    const int first = all_logits ? 0 : n - 1, rows = n - first;
    for (int i = 0; i < rows; i++)
        ops_rmsnorm(s->xb + (size_t)i * D, s->x + (size_t)(first + i) * D, m->out_norm.data, D, c->norm_eps);
    ops_matmul(s->logits, &m->output, s->xb, rows);
    s->n_past += n;
    return 0;
}

int model_prefill(const model *m, run_state *s, const int32_t *tokens, int n, float *all_logits, char *err)
{
    const size_t V = m->cfg.n_vocab;
    for (int i = 0; i < n; i += s->n_batch) {
        const int nb = n - i < s->n_batch ? n - i : s->n_batch;
        const int rc = model_forward(m, s, tokens + i, nb, all_logits != NULL, err);
        if (rc < 0) return rc;
        if (all_logits) memcpy(all_logits + (size_t)i * V, s->logits, sizeof(float) * nb * V);
    }
    /* the last position's logits in row 0, as after a one-token step */
    if (all_logits && n > 0) memmove(s->logits, s->logits + (size_t)((n - 1) % s->n_batch) * V, sizeof(float) * V);
    return 0;
}

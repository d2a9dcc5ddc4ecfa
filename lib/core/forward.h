/* forward.h - the CPU forward pass: a run state (activations, KV cache, attention's scratch) and
 * the passes over a batch of tokens.
 *
 *   run_state *s = run_state_new(m, 4096, 64, err);   // context 4096, batches of up to 64
 *   model_prefill(m, s, ids, n, NULL, err);           // the prompt; s->logits: the last position's
 *   model_forward(m, s, &next, 1, 0, err);            // one decode step
 *   run_state_free(s);
 *
 * A layer is RMSNorm, q/k/v, RoPE into the canonical layout and into the cache, attention
 * (attention_layer, lib/fasa/attention.c: dense, or what a policy selects), the output
 * projection, RMSNorm and a SwiGLU feed-forward, each with its residual.
 */
#ifndef FASA_FORWARD_H
#define FASA_FORWARD_H

#include <stdint.h>

#include "kvcache.h"
#include "model.h"

/* Attention observers see every query against the cache (calibration, benchmarks). */
struct run_state;
struct policy;
struct attn_stats;

typedef struct attn_obs {
    /* Called once per (token, layer, query head) after the token's k/v are cached, before the
     * softmax: q is the rotated query (canonical layout, d_head), pos its position; the cache
     * holds positions 0..pos for that layer. May run concurrently on several threads for
     * different (token, head) pairs. */
    void (*on_query)(void *ctx, const model *m, const struct run_state *s, int layer, int head,
                     int pos, const float *q);
    void *ctx;
} attn_obs;

typedef struct run_state {
    int n_ctx, n_batch;
    int n_past;                  /* tokens in the cache */
    int n_threads;               /* per-thread scratch is sized for this many (OpenMP's maximum) */
    kvcache kv;
    /* activations of a batch, (n_batch, width) */
    float *x, *xb;               /* residual stream, normed input of a block (d_model) */
    float *q, *k, *v;            /* rotated queries (n_head d_head); k, v before the cache */
    float *att_out;              /* attention's output; the file-layout q before RoPE */
    float *ffa, *ffb;            /* (d_ff) */
    float *logits;               /* (n_batch, n_vocab) */
    float *krow;                 /* (d_head) a rotated key on its way into the cache */
    struct attn_work *attn;      /* the attention step's scratch (lib/fasa/attn_impl.h) */
    /* Sparse decoding (attention.h: attention_use_policy): queries at positions >= sparse_from
     * attend to the tokens the policy selects; stats (when set) are updated by every query. */
    struct policy *policy;
    struct attn_stats *stats;
    int sparse_from;
    const attn_obs *obs;
    /* Another engine for the attention step (a GPU): given a query and the rows to read (idx
     * NULL: 0..n-1) at position pos, it writes out[d_head] and returns 0, or < 0 with a message
     * in err. While set, every query goes through the per-query path and calls it instead of
     * the CPU kernels (selection stays on the CPU). */
    int (*attend_hook)(void *ctx, const struct run_state *s, int layer, int head, int pos, const float *q,
                       const int32_t *idx, int n, float *out, char *err);
    void *attend_ctx;
    uint64_t *bytes_kv;          /* (n_threads * 8) KV bytes attention read, selection included */
    double t_attn;               /* seconds in attention (RoPE, cache writes, selection, softmax) */
} run_state;

run_state *run_state_new(const model *m, int n_ctx, int n_batch, char *err);
/* The same with a KV cache laid out as ko says (split keys, a cold tier; NULL: whole rows). */
run_state *run_state_new_kv(const model *m, int n_ctx, int n_batch, const kv_opts *ko, char *err);
void run_state_free(run_state *s);
void run_state_reset(run_state *s);
uint64_t run_state_kv_bytes_read(const run_state *s);   /* summed over threads since the last reset */

/* Runs n <= n_batch tokens at positions s->n_past.., appends them to the cache. If all_logits,
 * writes (n, n_vocab) logits to s->logits, else only the last position's (row 0). Returns 0 or
 * < 0 (context full, a bad token id, an attention hook's failure). */
int model_forward(const model *m, run_state *s, const int32_t *tokens, int n, int all_logits, char *err);
/* Any number of tokens, in batches of s->n_batch. all_logits: (n, n_vocab) floats to receive
 * every position's logits, or NULL. Afterwards s->logits row 0 holds the last position's. */
int model_prefill(const model *m, run_state *s, const int32_t *tokens, int n, float *all_logits, char *err);

#endif

/* model.h - configuration and weights of Llama-family decoders, from any container.
 *
 *   model *m;  char err[FASA_ERRLEN];
 *   if (model_open(&m, "SmolLM2-135M-Instruct.Q4_1.gguf", err) < 0) ...;   // or an HF directory
 *   printf("%d layers, %d heads of %d dims\n", m->cfg.n_layer, m->cfg.n_head, m->cfg.d_head);
 *   model_close(m);
 *
 * The forward pass over a model is forward.h's.
 *
 * MODEL may be a GGUF file, a Hugging Face directory (config.json, model.safetensors or a sharded
 * index, tokenizer.json), or a .safetensors file with those beside it.
 *
 * RoPE layouts. Hugging Face checkpoints rotate dims (j, j + d/2) by theta_j ("rotate_half");
 * llama.cpp's GGUF files rotate (2j, 2j + 1). Inside fasa there is one canonical layout: frequency
 * chunk j occupies dims (2c, 2c + 1) where c is the chunk's slot in the per-KV-head chunk order
 * (identity unless a converted model says otherwise). q and k are rotated and gathered into that
 * layout right after their projections, so the KV cache, attention, TIP and calibration only ever
 * see canonical pairs, whatever the file's layout was. A wrong layout would not crash, only
 * degrade: tests load one tiny model written in both layouts and demand equal logits.
 */
#ifndef FASA_MODEL_H
#define FASA_MODEL_H

#include <stdint.h>

#include "base.h"
#include "kvcache.h"
#include "ops.h"
#include "tokenizer.h"

/* PERMUTED: written by `fasa convert`: each KV head's q/k rows are pairs (2r, 2r+1) holding the
 * rotation plane of frequency chunk_order[r], dominant chunks first (metadata fasa.chunk_order). */
enum rope_layout { ROPE_LAYOUT_HF, ROPE_LAYOUT_INTERLEAVED, ROPE_LAYOUT_PERMUTED };
enum rope_scaling { ROPE_SCALING_NONE, ROPE_SCALING_LINEAR, ROPE_SCALING_LLAMA3 };
enum model_source { MODEL_SOURCE_GGUF, MODEL_SOURCE_SAFETENSORS };

typedef struct model_config {
    enum fasa_arch arch;
    int n_layer, d_model, n_head, n_kv_head, d_head, d_ff, n_vocab, n_ctx_train;
    float rope_theta, norm_eps;
    enum rope_scaling rope_scaling;
    float rope_factor, rope_low_freq_factor, rope_high_freq_factor;
    int rope_orig_ctx;
    int tied_embeddings, qkv_bias;
    enum rope_layout layout;     /* of the file's q/k projection rows */
    int qk_norm;                 /* q and k RMS-normed per head before RoPE (qwen3, gemma3) */
    int gemma;                   /* gemma3: embeddings times sqrt(d_model), norms after attention and the
                                  * feed-forward too, a GELU (tanh) gate instead of SiLU */
    float attn_scale;            /* the queries' scale; 0: 1/sqrt(d_head) */
    int sliding_window;          /* > 0: local layers attend to their last this many tokens */
    int swa_period;              /* > 0: only every swa_period-th layer is global (gemma3: 6); 0: with a
                                  * window, every layer is local (mistral v0.1) */
    float rope_theta_local;      /* local layers' RoPE base (gemma3), without scaling; 0: rope_theta */
} model_config;

/* Layer l attends to a sliding window (sliding_window > 0), not the whole context. */
static inline int model_layer_local(const model_config *c, int l)
{
    return c->sliding_window > 0 && (c->swa_period <= 0 || l % c->swa_period < c->swa_period - 1);
}

typedef struct layer_weights {
    weight attn_norm;            /* (d_model) f32 */
    weight wq, wk, wv, wo;       /* (n_head*d_head, d_model) (n_kv*d_head, d_model) x2, (d_model, n_head*d_head) */
    float *bq, *bk, *bv;         /* (n_head*d_head), (n_kv*d_head) x2: owned f32 copies, or NULL */
    weight ffn_norm;             /* (d_model) */
    weight w_gate, w_up, w_down; /* (d_ff, d_model) x2, (d_model, d_ff) */
    float *q_norm, *k_norm;      /* qk_norm: (d_head) each, or NULL */
    float *post_attn_norm, *post_ffn_norm;   /* gemma: (d_model) each, or NULL */
} layer_weights;

typedef struct model model;
struct model {
    model_config cfg;
    enum model_source source;
    char path[512];
    char name[128];
    weight tok_embd;             /* (n_vocab, d_model) */
    weight out_norm;             /* (d_model) */
    weight output;               /* (n_vocab, d_model); = tok_embd when tied */
    layer_weights *layers;       /* (n_layer) */
    float *norms;                /* owned f32 copies of every norm vector */
    tokenizer *tok;
    /* RoPE in canonical layout: for every (layer, kv head) and canonical pair c, the file dims
     * of its two components and its angular frequency. */
    int16_t *chunk_order;        /* (n_layer, n_kv_head, d_head/2) PERMUTED layout only, else NULL */
    int16_t *rope_src;           /* (n_layer, n_kv_head, d_head) file dim of canonical dim */
    float *rope_freq;            /* (n_layer, n_kv_head, d_head/2) theta of canonical pair */
    int64_t n_params;
    size_t weight_bytes;
    void *file;                  /* gguf_file or st_sharded */
    char *bundle_profile;        /* a .fasa bundle's profile.json text, or NULL */
    size_t bundle_profile_len;
};

int  model_open(model **out, const char *path, char *err);
void model_close(model *m);

/* The config of a Hugging Face config.json held in memory (len bytes, no NUL needed); path
 * names it in messages. *c is reset first. Only parses: model_config_check then rejects
 * missing, non-positive or inconsistent dimensions, as model_open does after loading. */
int model_config_parse(model_config *c, const char *json, size_t len, const char *path, char *err);
int model_config_check(const model_config *c, const char *where, char *err);
/* Largest n_head * d_head model_config_check accepts (real models: up to 16384). */
#define MODEL_MAX_ATTN_WIDTH (1 << 20)

/* The Hugging Face (rotate_half) dim of a q/k projection dim of the file, for KV head g of a
 * layer (and the query heads of its group). */
int model_hf_dim(const model *m, int layer, int kv_head, int file_dim);

/* Parses a fasa.chunk_order value (JSON [n_layer][n_kv_head][d_head/2] permutations) into
 * order; 0 or < 0 with a message naming where. */
int model_parse_chunk_order(const char *json, const model_config *c, int16_t *order, const char *where, char *err);

/* Frequencies theta_j, j < d_head/2, after scaling (llama3 / linear). */
void model_rope_freqs(const model_config *c, float *theta);

#endif

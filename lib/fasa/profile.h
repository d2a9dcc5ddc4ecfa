/* profile.h - a calibration profile: per head, which frequency chunks rank tokens like the head.
 *
 *   profile p;
 *   if (profile_load(&p, "smollm2.profile.json", err) < 0) ...;
 *   if (profile_check_model(&p, m, "smollm2.profile.json", err) < 0) ...;   // dims, q/k hash, chunks
 *   const int16_t *r = profile_rank(&p, layer, head);     // chunks, most dominant first
 *   profile_free(&p);
 *
 * JSON (cJSON), deterministic: the same inputs give byte-identical files.
 *   {"format": "fasa-profile", "version": 1,
 *    "model": {"architecture", "n_layer", "n_head", "n_kv_head", "d_head", "qk_hash"
 *              [, "sliding_window", "swa_period", "fasa_layers": [the global layers]]},
 *    "chunks": {"definition": "plane"|"adjacent", "count": d_head/2},
 *    "calibration": {"sample_hash", "n_tokens", "n_prefill", "n_steps", "k": [..], "rank_k", "fcs"},
 *    "ca": {"<K>": [[[mean CA of chunk c] per head] per layer], ...},
 *    "rank": [[[chunk ids by mean CA at rank_k, best first] per head] per layer],
 *    "group_rank": [[[...] per KV head (mean over its query heads)] per layer]}
 * Chunk j under "plane" is RoPE's rotation plane of frequency theta_j (Hugging Face dims j and
 * j + d/2); under "adjacent" it is Hugging Face dims 2j and 2j + 1 (the paper's released code).
 */
#ifndef FASA_PROFILE_H
#define FASA_PROFILE_H

#include <stddef.h>
#include <stdint.h>

#include "base.h"

struct model;

#define PROFILE_VERSION 1
#define PROFILE_MAX_K 16

enum chunk_def { CHUNKS_PLANE, CHUNKS_ADJACENT };

typedef struct profile {
    char arch[16];
    int n_layer, n_head, n_kv_head, d_head, n_chunk;
    int sliding_window, swa_period; /* the model's local layers (model_layer_local), which attend over
                                     * a window and never sparsely: FASA covers the others */
    uint64_t qk_hash;
    enum chunk_def chunks;
    uint64_t sample_hash;
    int n_tokens, n_prefill, n_steps;
    int n_k, ks[PROFILE_MAX_K];
    int rank_k;            /* the K (a value of ks) the ranking uses */
    int fcs;               /* default number of dominant chunks F */
    double *ca;            /* (n_k, n_layer, n_head, n_chunk) mean CA */
    int16_t *rank;         /* (n_layer, n_head, n_chunk) */
    int16_t *group_rank;   /* (n_layer, n_kv_head, n_chunk) */
} profile;

/* The default F for heads of d_head dims: 3/8 of the chunks (at least 1). Chosen on the
 * calibration text (GPL-3, N = 256, default model: perplexity at 7k tokens 25.50 / 25.13 / 24.63 /
 * 24.44 / 24.46 / 24.25 for F = 8 / 10 / 12 / 14 / 16 / 20 of 32, the oracle 23.95): beyond 12
 * two more chunks gain under 1% while TIP reads 2 bytes more a key. The paper's scripts use 1/4. */
static inline int profile_default_fcs(int d_head) { return 3 * d_head / 16 > 0 ? 3 * d_head / 16 : 1; }

/* Allocates ca/rank/group_rank for the dims already set in p. */
int  profile_alloc(profile *p, char *err);
void profile_free(profile *p);
/* Fills rank and group_rank from ca at rank_k (ties: lower chunk id first). */
void profile_rank_all(profile *p);

int profile_save(const profile *p, const char *path, char *err);   /* temp file + rename */
/* Adds the profile's "model" and "calibration" objects to a cJSON object (profile files and
 * exports share them). */
struct cJSON;
void profile_json_identity(const profile *p, struct cJSON *o);
int profile_load(profile *p, const char *path, char *err);
/* profile_load from a file's text held in memory (len bytes, no NUL needed); path names it in
 * messages. On failure p holds nothing to free. */
int profile_parse(profile *p, const char *json, size_t len, const char *path, char *err);
int profile_check_model(const profile *p, const struct model *m, const char *path, char *err);

static inline double *profile_ca(const profile *p, int ki, int layer, int head)
{
    return p->ca + (((size_t)ki * p->n_layer + layer) * p->n_head + head) * p->n_chunk;
}
static inline const int16_t *profile_rank(const profile *p, int layer, int head)
{
    return p->rank + ((size_t)layer * p->n_head + head) * p->n_chunk;
}
static inline const int16_t *profile_group_rank(const profile *p, int layer, int kv_head)
{
    return p->group_rank + ((size_t)layer * p->n_kv_head + kv_head) * p->n_chunk;
}
int profile_k_index(const profile *p, int k);   /* index of k in ks, or -1 */

/* Where a model's profile lives by default: the model path without its extension (.gguf,
 * .safetensors, .fasa; a directory as is) + ".profile.json". */
void profile_default_path(const char *model_path, char *out, size_t cap);
/* An existing profile for a model: the default path, else DIR/profile.json for a directory (as
 * `fasa convert` writes). Returns 1 and fills out when found, else 0. */
int profile_find(const char *model_path, char *out, size_t cap);

/* Identity of a model's attention: xxh64 over every layer's q and k projection bytes. */
uint64_t profile_model_hash(const struct model *m);

/* Canonical cache dims (see model.h) of chunk j of KV head g in layer l under a definition:
 * dims[2j], dims[2j+1]. */
void profile_chunk_dims(const struct model *m, int layer, int kv_head, enum chunk_def def, int16_t *dims);

#endif

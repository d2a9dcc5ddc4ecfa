/* kvcache.h - the key/value cache: where attention reads past tokens from.
 *
 *   kvcache kv;
 *   kvcache_init(&kv, n_layer, n_kv_head, n_ctx, d_head, &(kv_opts){ 0 }, err);
 *   float *k = kvcache_k(&kv, layer, kv_head);   // (n_ctx, kvcache_kw(&kv)), rows 0..n-1 valid
 *   kvcache_free(&kv);
 *
 * Keys are stored after RoPE in the canonical layout (model.h): frequency chunks as adjacent
 * pairs, in the model's chunk order, so once the chunks are in rank order (a converted model, or
 * model_rank_chunks at load) the dominant chunks are the first dims of every row.
 *
 * Split keys (n_split > 0): dims [0, n_split) of every key, the dominant block, live in their own
 * contiguous (n_ctx, n_split) array per (layer, KV head), and the remaining dims in another, so
 * the token importance predictor streams only the block. FASA-M (cold_dir set) keeps only that
 * block in memory: the rest of the keys and all values go to a cold tier, a file mapping under
 * cold_dir (the file is unlinked at once, so nothing is left behind), read only for the rows
 * focused attention chooses.
 */
#ifndef FASA_KVCACHE_H
#define FASA_KVCACHE_H

#include <stddef.h>
#include <stdint.h>

typedef struct kv_opts {
    int n_split;             /* 0: whole key rows; else the width of the dominant block */
    const char *cold_dir;    /* FASA-M: where the cold tier's file goes (needs n_split > 0) */
} kv_opts;

typedef struct kvcache {
    int n_layer, n_kv_head, n_ctx, d_head;
    int n_split;
    float *k;        /* (n_layer, n_kv_head, n_ctx, kw): whole rows, or the dominant block */
    float *kr;       /* (n_layer, n_kv_head, n_ctx, d_head - n_split) when split, else NULL */
    float *v;        /* (n_layer, n_kv_head, n_ctx, d_head) */
    void *cold;      /* the cold tier's mapping (kr and v), or NULL */
    size_t cold_len;
} kvcache;

int  kvcache_init(kvcache *kv, int n_layer, int n_kv_head, int n_ctx, int d_head, const kv_opts *o, char *err);
void kvcache_free(kvcache *kv);
/* Bytes n tokens occupy: all of them, in memory, and in the cold tier. */
size_t kvcache_bytes(const kvcache *kv, int n_tokens);
size_t kvcache_resident_bytes(const kvcache *kv, int n_tokens);
size_t kvcache_cold_bytes(const kvcache *kv, int n_tokens);

/* Width of a row of kvcache_k: d_head, or n_split when split. */
static inline int kvcache_kw(const kvcache *kv) { return kv->n_split ? kv->n_split : kv->d_head; }

static inline float *kvcache_k(const kvcache *kv, int layer, int head)
{
    return kv->k + ((size_t)layer * kv->n_kv_head + head) * kv->n_ctx * kvcache_kw(kv);
}
static inline float *kvcache_kr(const kvcache *kv, int layer, int head)
{
    return kv->kr + ((size_t)layer * kv->n_kv_head + head) * kv->n_ctx * (kv->d_head - kv->n_split);
}
static inline float *kvcache_v(const kvcache *kv, int layer, int head)
{
    return kv->v + ((size_t)layer * kv->n_kv_head + head) * kv->n_ctx * kv->d_head;
}

/* Key i of (layer, head) as a whole row: in place, or assembled into buf (d_head floats). */
const float *kvcache_key_row(const kvcache *kv, int layer, int head, int i, float *buf);
/* Stores key row `key` (d_head floats) at position i. */
void kvcache_put_key(kvcache *kv, int layer, int head, int i, const float *key);

#endif

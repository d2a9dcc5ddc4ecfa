/* kvcache.h - the key/value cache: where attention reads past tokens from.
 *
 *   kvcache kv;
 *   kvcache_init(&kv, n_layer, n_kv_head, n_ctx, d_head, err);
 *   float *k = kvcache_k(&kv, layer, kv_head);   // (n_ctx, d_head), rows 0..n-1 valid
 *   kvcache_free(&kv);
 *
 * Keys are stored after RoPE in the canonical layout (model.h): frequency chunks as adjacent
 * pairs, in the model's chunk order, so a converted model's dominant chunks are the first dims of
 * every row. Each (layer, KV head) owns one contiguous (n_ctx, d_head) block.
 */
#ifndef FASA_KVCACHE_H
#define FASA_KVCACHE_H

#include <stddef.h>

typedef struct kvcache {
    int n_layer, n_kv_head, n_ctx, d_head;
    float *k, *v;   /* (n_layer, n_kv_head, n_ctx, d_head) */
} kvcache;

int  kvcache_init(kvcache *kv, int n_layer, int n_kv_head, int n_ctx, int d_head, char *err);
void kvcache_free(kvcache *kv);
size_t kvcache_bytes(const kvcache *kv, int n_tokens);   /* resident bytes for n tokens */

static inline float *kvcache_k(const kvcache *kv, int layer, int head)
{
    return kv->k + ((size_t)layer * kv->n_kv_head + head) * kv->n_ctx * kv->d_head;
}
static inline float *kvcache_v(const kvcache *kv, int layer, int head)
{
    return kv->v + ((size_t)layer * kv->n_kv_head + head) * kv->n_ctx * kv->d_head;
}

#endif

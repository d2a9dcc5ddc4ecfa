#include "kvcache.h"

#include <stdlib.h>

#include "common.h"

int kvcache_init(kvcache *kv, int n_layer, int n_kv_head, int n_ctx, int d_head, char *err)
{
    size_t n = (size_t)n_layer * n_kv_head * n_ctx * d_head;
    *kv = (kvcache){ n_layer, n_kv_head, n_ctx, d_head, NULL, NULL };
    /* Pages are touched only as the context fills, so a large n_ctx costs address space only. */
    kv->k = malloc(n * sizeof(float));
    kv->v = malloc(n * sizeof(float));
    if (!kv->k || !kv->v) {
        kvcache_free(kv);
        return fasa_error(err, FASA_ENOMEM, "cannot allocate a KV cache of %d tokens (%.1f MiB)",
                          n_ctx, 2.0 * n * sizeof(float) / (1 << 20));
    }
    return 0;
}

void kvcache_free(kvcache *kv)
{
    free(kv->k);
    free(kv->v);
    kv->k = kv->v = NULL;
}

size_t kvcache_bytes(const kvcache *kv, int n_tokens)
{
    return 2 * (size_t)kv->n_layer * kv->n_kv_head * n_tokens * kv->d_head * sizeof(float);
}

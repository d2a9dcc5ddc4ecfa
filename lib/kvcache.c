#include "kvcache.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "common.h"

/* The cold tier: one file under dir, unlinked as soon as it is open, mapped shared. Pages are
 * written as tokens arrive and read back only for the rows attention chooses; the kernel may
 * write them out and drop them under memory pressure, which is the point. */
static void *cold_map(const char *dir, size_t len, char *err)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/fasa-kv-XXXXXX", dir);
    int fd = mkstemp(path);
    if (fd < 0) {
        fasa_error(err, FASA_EIO, "cannot create the cold KV tier in '%s': %s", dir, strerror(errno));
        return NULL;
    }
    unlink(path);
    if (ftruncate(fd, (off_t)len) != 0) {
        fasa_error(err, FASA_EIO, "cannot size the cold KV tier in '%s' to %zu bytes: %s", dir, len, strerror(errno));
        close(fd);
        return NULL;
    }
    void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (p == MAP_FAILED) {
        fasa_error(err, FASA_EIO, "cannot map the cold KV tier in '%s': %s", dir, strerror(errno));
        return NULL;
    }
    madvise(p, len, MADV_RANDOM);   /* rows are read scattered: no readahead around them */
    return p;
}

int kvcache_init(kvcache *kv, int n_layer, int n_kv_head, int n_ctx, int d_head, const kv_opts *o, char *err)
{
    const int split = o ? o->n_split : 0;
    const char *cold_dir = o ? o->cold_dir : NULL;
    *kv = (kvcache){ .n_layer = n_layer, .n_kv_head = n_kv_head, .n_ctx = n_ctx, .d_head = d_head, .n_split = split };
    if (split < 0 || split >= d_head || split % 2)
        return fasa_error(err, FASA_EARG, "the dominant key block must be an even width below %d dims, not %d", d_head, split);
    if (cold_dir && !split) return fasa_error(err, FASA_EARG, "a cold KV tier needs split keys");
    const size_t rows = (size_t)n_layer * n_kv_head * n_ctx;
    const size_t nk = rows * kvcache_kw(kv), nr = split ? rows * (d_head - split) : 0, nv = rows * d_head;
    /* Pages are touched only as the context fills, so a large n_ctx costs address space only. */
    kv->k = malloc(nk * sizeof(float));
    if (cold_dir) {
        kv->cold_len = (nr + nv) * sizeof(float);
        if (!(kv->cold = cold_map(cold_dir, kv->cold_len, err))) { kvcache_free(kv); return FASA_EIO; }
        kv->kr = kv->cold;
        kv->v = (float *)kv->cold + nr;
    } else {
        kv->kr = split ? malloc(nr * sizeof(float)) : NULL;
        kv->v = malloc(nv * sizeof(float));
    }
    if (!kv->k || !kv->v || (split && !kv->kr)) {
        kvcache_free(kv);
        return fasa_error(err, FASA_ENOMEM, "cannot allocate a KV cache of %d tokens (%.1f MiB)",
                          n_ctx, (double)(nk + nr + nv) * sizeof(float) / (1 << 20));
    }
    return 0;
}

void kvcache_free(kvcache *kv)
{
    free(kv->k);
    if (kv->cold) munmap(kv->cold, kv->cold_len);
    else free(kv->kr), free(kv->v);
    kv->k = kv->kr = kv->v = NULL;
    kv->cold = NULL;
}

size_t kvcache_bytes(const kvcache *kv, int n_tokens)
{
    return 2 * (size_t)kv->n_layer * kv->n_kv_head * n_tokens * kv->d_head * sizeof(float);
}

size_t kvcache_cold_bytes(const kvcache *kv, int n_tokens)
{
    if (!kv->cold) return 0;
    return (size_t)kv->n_layer * kv->n_kv_head * n_tokens * (2 * kv->d_head - kv->n_split) * sizeof(float);
}

size_t kvcache_resident_bytes(const kvcache *kv, int n_tokens)
{
    return kvcache_bytes(kv, n_tokens) - kvcache_cold_bytes(kv, n_tokens);
}

const float *kvcache_key_row(const kvcache *kv, int layer, int head, int i, float *buf)
{
    const int d = kv->d_head, s = kv->n_split;
    if (!s) return kvcache_k(kv, layer, head) + (size_t)i * d;
    memcpy(buf, kvcache_k(kv, layer, head) + (size_t)i * s, sizeof(float) * s);
    memcpy(buf + s, kvcache_kr(kv, layer, head) + (size_t)i * (d - s), sizeof(float) * (d - s));
    return buf;
}

void kvcache_put_key(kvcache *kv, int layer, int head, int i, const float *key)
{
    const int d = kv->d_head, s = kv->n_split;
    if (!s) { memcpy(kvcache_k(kv, layer, head) + (size_t)i * d, key, sizeof(float) * d); return; }
    memcpy(kvcache_k(kv, layer, head) + (size_t)i * s, key, sizeof(float) * s);
    memcpy(kvcache_kr(kv, layer, head) + (size_t)i * (d - s), key + s, sizeof(float) * (d - s));
}

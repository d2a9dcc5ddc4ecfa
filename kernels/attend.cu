/* attend.cu - decode attention from host memory, for a hook in the CPU forward pass: a device
 * mirror of the CPU KV cache (f16, keys split at n_dom), refreshed row by row as tokens
 * arrive, then dense.cu's or fac.cu's kernels for one query head. */
#include <stdlib.h>
#include <string.h>

#include "fasa_cuda_internal.cuh"

struct fasa_cuda_kv {
    fasa_cuda *cu;
    int n_layer, n_head, n_kv, n_ctx, d, n_dom;
    uint16_t *kdom, *krest, *v;   /* device (n_layer, n_kv, n_ctx, n_dom / d - n_dom / d) */
    int *synced;                  /* (n_layer, n_kv) rows mirrored */
    float *d_q, *d_out;           /* (d) */
    int32_t *d_idx;               /* (n_ctx) */
    uint16_t *h_dom, *h_rest, *h_v;   /* host staging for new rows, (n_ctx, width) */
    pthread_mutex_t lock;
};

extern "C" void fasa_cuda_kv_close(fasa_cuda_kv *kv)
{
    if (!kv) return;
    fasa_cuda_free(kv->cu, kv->kdom);
    fasa_cuda_free(kv->cu, kv->krest);
    fasa_cuda_free(kv->cu, kv->v);
    fasa_cuda_free(kv->cu, kv->d_q);
    fasa_cuda_free(kv->cu, kv->d_out);
    fasa_cuda_free(kv->cu, kv->d_idx);
    free(kv->synced);
    free(kv->h_dom);
    free(kv->h_rest);
    free(kv->h_v);
    pthread_mutex_destroy(&kv->lock);
    free(kv);
}

extern "C" int fasa_cuda_kv_open(fasa_cuda *cu, fasa_cuda_kv **out, int n_layer, int n_head, int n_kv, int n_ctx,
                                 int d, int n_dom, char *err)
{
    *out = nullptr;
    if (n_layer < 1 || n_kv < 1 || n_head < 1 || n_head % n_kv || n_ctx < 1 || d < 1 || d > FASA_CUDA_MAX_D ||
        n_dom < 1 || n_dom > d)
        return fasa_error(err, FASA_EARG, "bad KV mirror (%d layers, %d/%d heads, %d tokens, d %d, %d dominant dims)",
                          n_layer, n_head, n_kv, n_ctx, d, n_dom);
    fasa_cuda_kv *kv = (fasa_cuda_kv *)calloc(1, sizeof *kv);
    if (!kv) return fasa_error(err, FASA_ENOMEM, "out of memory");
    pthread_mutex_init(&kv->lock, nullptr);
    kv->cu = cu;
    kv->n_layer = n_layer;
    kv->n_head = n_head;
    kv->n_kv = n_kv;
    kv->n_ctx = n_ctx;
    kv->d = d;
    kv->n_dom = n_dom;
    const size_t rows = (size_t)n_layer * n_kv * n_ctx, n_rest = (size_t)(d - n_dom);
    int r = fasa_cuda_alloc(cu, (void **)&kv->kdom, rows * n_dom * sizeof(uint16_t), err);
    if (r == 0 && n_rest) r = fasa_cuda_alloc(cu, (void **)&kv->krest, rows * n_rest * sizeof(uint16_t), err);
    if (r == 0) r = fasa_cuda_alloc(cu, (void **)&kv->v, rows * d * sizeof(uint16_t), err);
    if (r == 0) r = fasa_cuda_alloc(cu, (void **)&kv->d_q, d * sizeof(float), err);
    if (r == 0) r = fasa_cuda_alloc(cu, (void **)&kv->d_out, d * sizeof(float), err);
    if (r == 0) r = fasa_cuda_alloc(cu, (void **)&kv->d_idx, n_ctx * sizeof(int32_t), err);
    if (r == 0) {
        kv->synced = (int *)calloc((size_t)n_layer * n_kv, sizeof *kv->synced);
        kv->h_dom = (uint16_t *)malloc((size_t)n_ctx * n_dom * sizeof(uint16_t));
        kv->h_rest = (uint16_t *)malloc((size_t)n_ctx * (n_rest ? n_rest : 1) * sizeof(uint16_t));
        kv->h_v = (uint16_t *)malloc((size_t)n_ctx * d * sizeof(uint16_t));
        if (!kv->synced || !kv->h_dom || !kv->h_rest || !kv->h_v) r = fasa_error(err, FASA_ENOMEM, "out of memory");
    }
    if (r < 0) {
        fasa_cuda_kv_close(kv);
        return r;
    }
    *out = kv;
    return 0;
}

/* Rows [from, t) of one KV head, converted (and split at n_dom when K holds whole rows), into
 * the mirror. */
static int mirror_rows(fasa_cuda_kv *kv, int layer, int g, const float *K, const float *krest, const float *V, int from,
                       int t, char *err)
{
    const int d = kv->d, nd = kv->n_dom, nr = d - nd, m = t - from, kw = krest ? nd : d;
    const size_t row0 = ((size_t)layer * kv->n_kv + g) * kv->n_ctx + from;
    for (int i = 0; i < m; i++) {
        const float *k = K + (size_t)(from + i) * kw, *v = V + (size_t)(from + i) * d;
        const float *kr = krest ? krest + (size_t)(from + i) * nr : k + nd;
        for (int c = 0; c < nd; c++) kv->h_dom[(size_t)i * nd + c] = fasa_f32_to_f16(k[c]);
        for (int c = 0; c < nr; c++) kv->h_rest[(size_t)i * nr + c] = fasa_f32_to_f16(kr[c]);
        for (int c = 0; c < d; c++) kv->h_v[(size_t)i * d + c] = fasa_f32_to_f16(v[c]);
    }
    int r = fasa_cuda_upload(kv->cu, kv->kdom + row0 * nd, kv->h_dom, (size_t)m * nd * sizeof(uint16_t), err);
    if (r == 0 && nr)
        r = fasa_cuda_upload(kv->cu, kv->krest + row0 * nr, kv->h_rest, (size_t)m * nr * sizeof(uint16_t), err);
    if (r == 0) r = fasa_cuda_upload(kv->cu, kv->v + row0 * d, kv->h_v, (size_t)m * d * sizeof(uint16_t), err);
    return r;
}

static int attend_locked(fasa_cuda_kv *kv, int layer, int head, const float *K, const float *krest, const float *V,
                         int t, const float *q, const int32_t *idx, int n, float *out, char *err)
{
    fasa_cuda *cu = kv->cu;
    FASA_CU_TRY(cudaSetDevice(cu->device), "cudaSetDevice");   /* the caller may be any thread */
    const int g = head / (kv->n_head / kv->n_kv);
    int *synced = &kv->synced[(size_t)layer * kv->n_kv + g];
    if (t < *synced) *synced = 0;   /* the cache was reset */
    if (t > *synced) {
        const int r = mirror_rows(kv, layer, g, K, krest, V, *synced, t, err);
        if (r < 0) return r;
        *synced = t;
    }
    int r = fasa_cuda_upload(cu, kv->d_q, q, kv->d * sizeof(float), err);
    if (r < 0) return r;
    const size_t base = ((size_t)layer * kv->n_kv + g) * kv->n_ctx;
    /* one head, one KV head: the shape of a single-head layer at this KV head's rows */
    const fasa_cuda_shape sh = { 1, 1, kv->d, kv->n_dom, kv->n_ctx };
    const uint16_t *d_kdom = kv->kdom + base * kv->n_dom;
    const uint16_t *d_krest = kv->krest ? kv->krest + base * (kv->d - kv->n_dom) : nullptr;
    const uint16_t *d_v = kv->v + base * kv->d;
    if (idx) {
        for (int j = 0; j < n; j++)
            if (idx[j] < 0 || idx[j] >= t)
                return fasa_error(err, FASA_EARG, "attention: token %d is not cached (%d)", idx[j], t);
        if ((r = fasa_cuda_upload(cu, kv->d_idx, idx, (size_t)n * sizeof(int32_t), err)) < 0) return r;
        r = fasa_cuda_fac(cu, kv->d_out, kv->d_q, d_kdom, d_krest, d_v, &sh, kv->d_idx, n, 0, err);
    } else {
        r = fasa_cuda_dense(cu, kv->d_out, kv->d_q, d_kdom, d_krest, d_v, &sh, t, err);
    }
    if (r < 0) return r;
    return fasa_cuda_download(cu, out, kv->d_out, kv->d * sizeof(float), err);
}

extern "C" int fasa_cuda_attend(fasa_cuda_kv *kv, int layer, int head, const float *K, const float *krest,
                                const float *V, int t, const float *q, const int32_t *idx, int n, float *out, char *err)
{
    if (layer < 0 || layer >= kv->n_layer || head < 0 || head >= kv->n_head || t < 1 || t > kv->n_ctx ||
        (idx && (n < 1 || n > t)))
        return fasa_error(err, FASA_EARG, "attention of head %d in layer %d over %d of %d tokens", head, layer,
                          idx ? n : t, t);
    pthread_mutex_lock(&kv->lock);
    const int r = attend_locked(kv, layer, head, K, krest, V, t, q, idx, n, out, err);
    pthread_mutex_unlock(&kv->lock);
    return r;
}

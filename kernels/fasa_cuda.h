/* fasa_cuda.h - FASA's decode attention on a CUDA device, behind a small C API.
 *
 *   char err[FASA_ERRLEN];
 *   fasa_cuda *cu;
 *   if (fasa_cuda_open(&cu, 0, err) < 0) ...;        // "built without CUDA", "no CUDA device (..)"
 *   fasa_cuda_shape sh = { .n_head = 9, .n_kv = 3, .d = 64, .n_dom = 16, .n_ctx = 8192 };
 *   fasa_cuda_tip(cu, scores, qdom, kdom, &sh, t, err);          // TIP over the dominant block
 *   fasa_cuda_topn(cu, idx, scores, sh.n_head, t, 256, err);     // top 256 per query head
 *   fasa_cuda_fac(cu, out, q, kdom, krest, v, &sh, idx, 256, 0, err);   // exact attention on them
 *   fasa_cuda_sync(cu, err);
 *   fasa_cuda_close(cu);
 *
 * Kernels run on the context's stream in launch order and return at once; pointers named d_*
 * or described as "device" are device memory (fasa_cuda_alloc), keys and values are f16 bit
 * patterns (uint16_t), queries and outputs f32. Tensor layouts are in fasa_cuda_math.h, which
 * holds all of the kernels' arithmetic (tested on the CPU by tests/test_kernels.c).
 * Every function returns 0 (or a count) or a negative fasa_status with one line in err naming
 * the CUDA call that failed ("cudaMalloc: out of memory"). Built without CUDA (CUDA=0), every
 * function fails with FASA_EUNSUPPORTED "built without CUDA" (kernels/fasa_cuda_stub.c).
 */
#ifndef FASA_CUDA_H
#define FASA_CUDA_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define FASA_CUDA_MAX_D 256   /* largest head dim (and dominant block) the kernels take */

typedef struct fasa_cuda_device {
    int index;
    char name[256];
    size_t mem_total, mem_free;   /* bytes */
    int cc_major, cc_minor;       /* compute capability */
    int n_sm;
    int can_map_host;             /* zero-copy reads of pinned host memory (FASA-M fetch) */
    int has_kernels;              /* fasa's kernels are built for it: sm_80 runs on 8.x, sm_90 on 9.0 */
} fasa_cuda_device;

/* 1 when built with CUDA (make CUDA=1). */
int fasa_cuda_built(void);
/* Fills up to max entries; returns the number of devices (>= 1), or < 0 with err "built without
 * CUDA" or "no CUDA device (cudaGetDeviceCount: <reason>)" (FASA_EUNSUPPORTED). */
int fasa_cuda_devices(fasa_cuda_device *dev, int max, char *err);

typedef struct fasa_cuda fasa_cuda;   /* a device, two streams (compute, copy), cuBLAS, scratch */
int  fasa_cuda_open(fasa_cuda **out, int device, char *err);
void fasa_cuda_close(fasa_cuda *cu);
/* Waits for everything launched on the context; reports errors of kernels that ran. */
int  fasa_cuda_sync(fasa_cuda *cu, char *err);

/* Device memory, and pinned host memory mapped into the device's address space. Uploads and
 * downloads are synchronous. upload_f16 converts n floats to f16 (fasa_f32_to_f16) first. */
int  fasa_cuda_alloc(fasa_cuda *cu, void **d_ptr, size_t bytes, char *err);
void fasa_cuda_free(fasa_cuda *cu, void *d_ptr);
int  fasa_cuda_host_alloc(fasa_cuda *cu, void **h_ptr, size_t bytes, char *err);
void fasa_cuda_host_free(fasa_cuda *cu, void *h_ptr);
int  fasa_cuda_upload(fasa_cuda *cu, void *d_dst, const void *src, size_t bytes, char *err);
int  fasa_cuda_upload_f16(fasa_cuda *cu, uint16_t *d_dst, const float *src, size_t n, char *err);
int  fasa_cuda_download(fasa_cuda *cu, void *dst, const void *d_src, size_t bytes, char *err);

/* One layer's cache as the kernels see it. Query head h reads KV head h / (n_head / n_kv). */
typedef struct fasa_cuda_shape {
    int n_head, n_kv;   /* query heads, KV heads (n_head a multiple of n_kv) */
    int d;              /* head dim, <= FASA_CUDA_MAX_D */
    int n_dom;          /* dims of the dominant block (2F), 1..d; d: keys are one block, no rest */
    int n_ctx;          /* rows per KV head in the key / value tensors (their stride) */
} fasa_cuda_shape;

/* TIP: scores[h*t + i] = fasa_tip_score(qdom[h], kdom[kv(h)][i]) for i < t.
 * scores (n_head, t) f32, qdom (n_head, n_dom) f32, kdom (n_kv, n_ctx, n_dom) f16: device. */
int fasa_cuda_tip(fasa_cuda *cu, float *scores, const float *qdom, const uint16_t *kdom,
                  const fasa_cuda_shape *sh, int t, char *err);

/* Top-N per query head: idx[h*k ..] = the k = min(n, t) tokens with the largest scores, ties to
 * the lower index (lib/topk's order), ascending. Returns k. scores (n_head, t), idx (n_head, k):
 * device. Exact radix select on fasa_topn_pack keys, one block per head. */
int fasa_cuda_topn(fasa_cuda *cu, int32_t *idx, const float *scores, int n_head, int t, int n, char *err);

/* FAC: out[h] = softmax(q[h] . K[idx[h]] / sqrt(d)) V[idx[h]] over idx[h*n ..+n), exact, split-K
 * over blocks with a combine kernel. q, out (n_head, d) f32; kdom (n_kv, n_ctx, n_dom), krest
 * (n_kv, n_ctx, d - n_dom) (NULL when n_dom == d), v (n_kv, n_ctx, d) f16; idx (n_head, n).
 * compact = 1 (FASA-M): krest and v are staging buffers (n_head, n, width) holding the chosen
 * rows in order (fasa_cuda_fetch_*), only kdom is indexed by idx. All device. */
int fasa_cuda_fac(fasa_cuda *cu, float *out, const float *q, const uint16_t *kdom, const uint16_t *krest,
                  const uint16_t *v, const fasa_cuda_shape *sh, const int32_t *idx, int n, int compact, char *err);

/* Dense decode attention over rows 0..t-1 (full mode, dense layers), split-K likewise. */
int fasa_cuda_dense(fasa_cuda *cu, float *out, const float *q, const uint16_t *kdom, const uint16_t *krest,
                    const uint16_t *v, const fasa_cuda_shape *sh, int t, char *err);

/* FASA-M: the cold tier (V rows and the non-dominant key dims) in pinned, mapped host memory;
 * only the dominant block stays on the device. Fill rest/v through the host pointers. */
typedef struct fasa_cuda_cold {
    int n_layer, n_kv, n_ctx, d, n_rest;
    uint16_t *rest;           /* (n_layer, n_kv, n_ctx, n_rest) host */
    uint16_t *v;              /* (n_layer, n_kv, n_ctx, d) host */
    const uint16_t *d_rest, *d_v;   /* the same memory as the device sees it (zero-copy) */
} fasa_cuda_cold;
int  fasa_cuda_cold_init(fasa_cuda *cu, fasa_cuda_cold *c, int n_layer, int n_kv, int n_ctx, int d, int n_rest,
                         char *err);
void fasa_cuda_cold_free(fasa_cuda *cu, fasa_cuda_cold *c);

/* Two staging slots on the device (slot = layer & 1), so layer l + 1's rows can arrive while
 * layer l's FAC still reads the other slot. */
typedef struct fasa_cuda_stage {
    int n_head, n, d, n_rest;
    uint16_t *rest[2];        /* (n_head, n, n_rest) device */
    uint16_t *v[2];           /* (n_head, n, d) device */
    void *ready[2], *released[2];   /* cudaEvent_t */
} fasa_cuda_stage;
int  fasa_cuda_stage_init(fasa_cuda *cu, fasa_cuda_stage *st, int n_head, int n, int d, int n_rest, char *err);
void fasa_cuda_stage_free(fasa_cuda *cu, fasa_cuda_stage *st);
/* Zero-copy: a kernel on the compute stream reads the chosen rows of `layer` from the mapped
 * cold tier into slot layer & 1. idx (n_head, n) device, e.g. fasa_cuda_topn's output. */
int fasa_cuda_fetch_mapped(fasa_cuda *cu, fasa_cuda_stage *st, const fasa_cuda_cold *c, int layer, int n_head,
                           const int32_t *idx, int n, char *err);
/* Copy engine: one cudaMemcpyAsync per run of consecutive chosen rows, on the copy stream,
 * once the slot's previous contents are released; then fasa_cuda_fetch_wait before the FAC
 * and fasa_cuda_fetch_release after it. idx (n_head, n) host, ascending per head. */
int fasa_cuda_fetch_copy(fasa_cuda *cu, fasa_cuda_stage *st, const fasa_cuda_cold *c, int layer, int n_head,
                         const int32_t *idx, int n, char *err);
int fasa_cuda_fetch_wait(fasa_cuda *cu, fasa_cuda_stage *st, int layer, char *err);
int fasa_cuda_fetch_release(fasa_cuda *cu, fasa_cuda_stage *st, int layer, char *err);

/* y (rows) = W x: W (rows, cols) f16 row-major (a warp per row, fasa_matvec_lane order), or f32
 * through cublasSgemv. All device. */
int fasa_cuda_matvec_f16(fasa_cuda *cu, float *y, const uint16_t *W, const float *x, int rows, int cols, char *err);
int fasa_cuda_matvec_f32(fasa_cuda *cu, float *y, const float *W, const float *x, int rows, int cols, char *err);

/* The decode step's attention from host memory, for an attention hook in the CPU forward pass:
 * the device mirrors the CPU cache (f32 -> f16, split at n_dom) and each call uploads the rows
 * it has not seen yet. Calls are serialised (safe from several threads) and synchronous. */
typedef struct fasa_cuda_kv fasa_cuda_kv;
int  fasa_cuda_kv_open(fasa_cuda *cu, fasa_cuda_kv **out, int n_layer, int n_head, int n_kv, int n_ctx, int d,
                       int n_dom, char *err);
void fasa_cuda_kv_close(fasa_cuda_kv *kv);
/* out[d] = attention of query head `head` (q: d floats, canonical layout) over rows 0..t-1 of
 * its KV head in `layer` (idx NULL), or over rows idx[0..n) (FAC). The KV head's CPU cache
 * blocks, f32, rows 0..t-1 valid: K (n_ctx, d) whole key rows with krest NULL, or split as
 * lib/kvcache does it, K (n_ctx, n_dom) the dominant block and krest (n_ctx, d - n_dom); V
 * (n_ctx, d). Rows already mirrored are not read again (t smaller than before means the cache
 * was reset: everything is mirrored again). */
int fasa_cuda_attend(fasa_cuda_kv *kv, int layer, int head, const float *K, const float *krest, const float *V, int t,
                     const float *q, const int32_t *idx, int n, float *out, char *err);

#ifdef __cplusplus
}
#endif

#endif

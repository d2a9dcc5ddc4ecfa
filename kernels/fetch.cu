/* fetch.cu - FASA-M: the rows a step chose (V and the non-dominant key dims) come from the cold
 * tier in pinned host memory, either read in place by a kernel (zero-copy over PCIe/NVLink) or
 * copied by the copy engine, run by run, into one of two staging slots. Addresses:
 * fasa_cold_row, fasa_stage_row, fasa_run_length (fasa_cuda_math.h). */
#include <stdlib.h>
#include <string.h>

#include "fasa_cuda_internal.cuh"

#define FETCH_THREADS 64

extern "C" int fasa_cuda_cold_init(fasa_cuda *cu, fasa_cuda_cold *c, int n_layer, int n_kv, int n_ctx, int d,
                                   int n_rest, char *err)
{
    memset(c, 0, sizeof *c);
    if (n_layer < 1 || n_kv < 1 || n_ctx < 1 || d < 1 || d > FASA_CUDA_MAX_D || n_rest < 0 || n_rest >= d)
        return fasa_error(err, FASA_EARG, "bad cold tier (%d layers, %d KV heads, %d tokens, d %d, %d rest dims)",
                          n_layer, n_kv, n_ctx, d, n_rest);
    c->n_layer = n_layer;
    c->n_kv = n_kv;
    c->n_ctx = n_ctx;
    c->d = d;
    c->n_rest = n_rest;
    const size_t rows = (size_t)n_layer * n_kv * n_ctx;
    int r = fasa_cuda_host_alloc(cu, (void **)&c->v, rows * d * sizeof(uint16_t), err);
    if (r == 0 && n_rest) r = fasa_cuda_host_alloc(cu, (void **)&c->rest, rows * n_rest * sizeof(uint16_t), err);
    if (r < 0) {
        fasa_cuda_cold_free(cu, c);
        return r;
    }
    void *dv = nullptr, *dr = nullptr;
    cudaError_t e = cudaHostGetDevicePointer(&dv, c->v, 0);
    if (e == cudaSuccess && c->rest) e = cudaHostGetDevicePointer(&dr, c->rest, 0);
    if (e != cudaSuccess) {
        fasa_cuda_cold_free(cu, c);
        return fasa_cuda_fail(err, e, "cudaHostGetDevicePointer");
    }
    c->d_v = (const uint16_t *)dv;
    c->d_rest = (const uint16_t *)dr;
    return 0;
}

extern "C" void fasa_cuda_cold_free(fasa_cuda *cu, fasa_cuda_cold *c)
{
    fasa_cuda_host_free(cu, c->v);
    fasa_cuda_host_free(cu, c->rest);
    memset(c, 0, sizeof *c);
}

extern "C" int fasa_cuda_stage_init(fasa_cuda *cu, fasa_cuda_stage *st, int n_head, int n, int d, int n_rest,
                                    char *err)
{
    memset(st, 0, sizeof *st);
    if (n_head < 1 || n < 1 || d < 1 || n_rest < 0 || n_rest >= d)
        return fasa_error(err, FASA_EARG, "bad staging buffers (%d heads, %d rows, d %d, %d rest dims)", n_head, n, d,
                          n_rest);
    st->n_head = n_head;
    st->n = n;
    st->d = d;
    st->n_rest = n_rest;
    int r = 0;
    for (int s = 0; s < 2 && r == 0; s++) {
        r = fasa_cuda_alloc(cu, (void **)&st->v[s], (size_t)n_head * n * d * sizeof(uint16_t), err);
        if (r == 0 && n_rest)
            r = fasa_cuda_alloc(cu, (void **)&st->rest[s], (size_t)n_head * n * n_rest * sizeof(uint16_t), err);
        cudaEvent_t ev[2] = {};
        if (r == 0) {
            cudaError_t e = cudaEventCreateWithFlags(&ev[0], cudaEventDisableTiming);
            if (e == cudaSuccess) e = cudaEventCreateWithFlags(&ev[1], cudaEventDisableTiming);
            st->ready[s] = ev[0];
            st->released[s] = ev[1];
            if (e != cudaSuccess) r = fasa_cuda_fail(err, e, "cudaEventCreateWithFlags");
        }
    }
    if (r < 0) fasa_cuda_stage_free(cu, st);
    return r;
}

extern "C" void fasa_cuda_stage_free(fasa_cuda *cu, fasa_cuda_stage *st)
{
    for (int s = 0; s < 2; s++) {
        fasa_cuda_free(cu, st->v[s]);
        fasa_cuda_free(cu, st->rest[s]);
        if (st->ready[s]) cudaEventDestroy((cudaEvent_t)st->ready[s]);
        if (st->released[s]) cudaEventDestroy((cudaEvent_t)st->released[s]);
    }
    memset(st, 0, sizeof *st);
}

static int check_fetch(const fasa_cuda_stage *st, const fasa_cuda_cold *c, int layer, int n_head, int n, char *err)
{
    if (!c->v || layer < 0 || layer >= c->n_layer || n_head < 1 || n_head > st->n_head || n_head % c->n_kv ||
        n < 1 || n > st->n || c->d != st->d || c->n_rest != st->n_rest)
        return fasa_error(err, FASA_EARG,
                          "fetch of %d rows for %d heads in layer %d does not fit the cold tier or staging buffers", n,
                          n_head, layer);
    return 0;
}

/* width halves from src to dst, 8 at a time when both are 16-byte aligned. */
static __device__ __forceinline__ void copy_row(uint16_t *dst, const uint16_t *src, int width)
{
    if ((((uintptr_t)dst | (uintptr_t)src) & 15) == 0 && (width & 7) == 0) {
        for (int i = threadIdx.x; i < width / 8; i += FETCH_THREADS)
            reinterpret_cast<uint4 *>(dst)[i] = reinterpret_cast<const uint4 *>(src)[i];
    } else {
        for (int i = threadIdx.x; i < width; i += FETCH_THREADS) dst[i] = src[i];
    }
}

/* Block (j, h): row idx[h][j] of head h's KV head, read from mapped host memory. */
static __global__ void __launch_bounds__(FETCH_THREADS) fetch_kernel(uint16_t *dst_rest, uint16_t *dst_v,
                                                                     const uint16_t *cold_rest, const uint16_t *cold_v,
                                                                     const int32_t *idx, int n, int group, int layer,
                                                                     int n_kv, int n_ctx, int d, int n_rest)
{
    const int j = blockIdx.x, h = blockIdx.y, g = h / group;
    const int tok = idx[(size_t)h * n + j];
    if (tok < 0 || tok >= n_ctx) return;   /* a bad index leaves the row as it was, never reads outside */
    if (n_rest)
        copy_row(dst_rest + fasa_stage_row(h, j, n, n_rest),
                 cold_rest + fasa_cold_row(layer, g, tok, n_kv, n_ctx, n_rest), n_rest);
    copy_row(dst_v + fasa_stage_row(h, j, n, d), cold_v + fasa_cold_row(layer, g, tok, n_kv, n_ctx, d), d);
}

extern "C" int fasa_cuda_fetch_mapped(fasa_cuda *cu, fasa_cuda_stage *st, const fasa_cuda_cold *c, int layer,
                                      int n_head, const int32_t *idx, int n, char *err)
{
    const int r = check_fetch(st, c, layer, n_head, n, err);
    if (r < 0) return r;
    const int s = layer & 1;
    fetch_kernel<<<dim3(n, n_head), FETCH_THREADS, 0, cu->stream>>>(st->rest[s], st->v[s], c->d_rest, c->d_v, idx, n,
                                                                    n_head / c->n_kv, layer, c->n_kv, c->n_ctx, c->d,
                                                                    c->n_rest);
    return fasa_cuda_launched(err, "fetch_kernel");
}

extern "C" int fasa_cuda_fetch_copy(fasa_cuda *cu, fasa_cuda_stage *st, const fasa_cuda_cold *c, int layer,
                                    int n_head, const int32_t *idx, int n, char *err)
{
    const int r = check_fetch(st, c, layer, n_head, n, err);
    if (r < 0) return r;
    const int s = layer & 1, group = n_head / c->n_kv;
    /* the slot's previous rows (layer - 2) must have been read; an event never recorded is done */
    FASA_CU_TRY(cudaStreamWaitEvent(cu->copy, (cudaEvent_t)st->released[s], 0), "cudaStreamWaitEvent");
    for (int h = 0; h < n_head; h++) {
        const int32_t *ih = idx + (size_t)h * n;
        for (int j = 0; j < n; ) {
            const int run = fasa_run_length(ih, n, j);
            if (ih[j] < 0 || ih[j] + run > c->n_ctx)
                return fasa_error(err, FASA_EARG, "fetch: token %d is outside the cache (%d)", ih[j] + run - 1,
                                  c->n_ctx);
            if (c->n_rest)
                FASA_CU_TRY(
                    cudaMemcpyAsync(st->rest[s] + fasa_stage_row(h, j, n, c->n_rest),
                                    c->rest + fasa_cold_row(layer, h / group, ih[j], c->n_kv, c->n_ctx, c->n_rest),
                                    (size_t)run * c->n_rest * sizeof(uint16_t), cudaMemcpyHostToDevice, cu->copy),
                    "cudaMemcpyAsync (fetch)");
            FASA_CU_TRY(cudaMemcpyAsync(st->v[s] + fasa_stage_row(h, j, n, c->d),
                                        c->v + fasa_cold_row(layer, h / group, ih[j], c->n_kv, c->n_ctx, c->d),
                                        (size_t)run * c->d * sizeof(uint16_t), cudaMemcpyHostToDevice, cu->copy),
                        "cudaMemcpyAsync (fetch)");
            j += run;
        }
    }
    FASA_CU_TRY(cudaEventRecord((cudaEvent_t)st->ready[s], cu->copy), "cudaEventRecord");
    return 0;
}

extern "C" int fasa_cuda_fetch_wait(fasa_cuda *cu, fasa_cuda_stage *st, int layer, char *err)
{
    FASA_CU_TRY(cudaStreamWaitEvent(cu->stream, (cudaEvent_t)st->ready[layer & 1], 0), "cudaStreamWaitEvent");
    return 0;
}

extern "C" int fasa_cuda_fetch_release(fasa_cuda *cu, fasa_cuda_stage *st, int layer, char *err)
{
    FASA_CU_TRY(cudaEventRecord((cudaEvent_t)st->released[layer & 1], cu->stream), "cudaEventRecord");
    return 0;
}

/* fasa_cuda_internal.cuh - what the .cu files share: the context, error reporting, the
 * vectorised row dot product and the split-K attention kernels used by fac.cu and dense.cu. */
#ifndef FASA_CUDA_INTERNAL_CUH
#define FASA_CUDA_INTERNAL_CUH

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <pthread.h>

extern "C" {
#include "lib/common.h"
}
#include "fasa_cuda.h"
#include "fasa_cuda_math.h"

struct fasa_cuda {
    int device;
    cudaStream_t stream;      /* kernels */
    cudaStream_t copy;        /* FASA-M fetches through the copy engine */
    cublasHandle_t blas;      /* created on first use */
    float *part;              /* split-K partials, (n_head, n_split, d + 2) */
    size_t part_cap;          /* floats */
};

/* "cudaMalloc: out of memory" (with what, when given, in parentheses). */
static inline int fasa_cuda_fail(char *err, cudaError_t e, const char *call, const char *what = nullptr)
{
    const int status = e == cudaErrorMemoryAllocation ? FASA_ENOMEM : FASA_EIO;
    if (what) return fasa_error(err, status, "%s (%s): %s", call, what, cudaGetErrorString(e));
    return fasa_error(err, status, "%s: %s", call, cudaGetErrorString(e));
}

#define FASA_CU_TRY(call, name)                                  \
    do {                                                         \
        cudaError_t e_ = (call);                                 \
        if (e_ != cudaSuccess) return fasa_cuda_fail(err, e_, name); \
    } while (0)

/* After a launch: configuration errors show up here, faults of the running kernel at the next
 * synchronisation (fasa_cuda_sync). */
static inline int fasa_cuda_launched(char *err, const char *kernel)
{
    const cudaError_t e = cudaGetLastError();
    if (e == cudaSuccess) return 0;
    return fasa_error(err, FASA_EIO, "cudaLaunchKernel (%s): %s", kernel, cudaGetErrorString(e));
}

/* The split-K scratch, grown (never shrunk) to at least n floats. Only between kernels of the
 * one stream, so growing waits for the kernels that may still read the old buffer. */
static inline int fasa_cuda_part(fasa_cuda *cu, size_t n, char *err)
{
    if (n <= cu->part_cap) return 0;
    FASA_CU_TRY(cudaStreamSynchronize(cu->stream), "cudaStreamSynchronize");
    if (cu->part) cudaFree(cu->part);
    cu->part = nullptr;
    cu->part_cap = 0;
    FASA_CU_TRY(cudaMalloc((void **)&cu->part, n * sizeof(float)), "cudaMalloc");
    cu->part_cap = n;
    return 0;
}

static inline int fasa_cuda_check_shape(const fasa_cuda_shape *sh, char *err)
{
    if (!sh || sh->n_head < 1 || sh->n_kv < 1 || sh->n_head % sh->n_kv || sh->d < 1 || sh->d > FASA_CUDA_MAX_D ||
        sh->n_dom < 1 || sh->n_dom > sh->d || sh->n_ctx < 1)
        return fasa_error(err, FASA_EARG, "bad attention shape (heads %d/%d, d %d, dominant dims %d, context %d)",
                          sh ? sh->n_head : 0, sh ? sh->n_kv : 0, sh ? sh->d : 0, sh ? sh->n_dom : 0, sh ? sh->n_ctx : 0);
    return 0;
}

/* acc + sum_j q[j] k[j] in fasa_dot_f16's order, loading 8 halves at a time when aligned. */
static __device__ __forceinline__ float fasa_row_dot(float acc, const float *q, const uint16_t *k, int n)
{
    int j = 0;
    if (((uintptr_t)k & 15) == 0) {
        for (; j + 8 <= n; j += 8) {
            const uint4 w = *reinterpret_cast<const uint4 *>(k + j);
            acc = fasa_chunk_fma(acc, q[j], q[j + 1], w.x);
            acc = fasa_chunk_fma(acc, q[j + 2], q[j + 3], w.y);
            acc = fasa_chunk_fma(acc, q[j + 4], q[j + 5], w.z);
            acc = fasa_chunk_fma(acc, q[j + 6], q[j + 7], w.w);
        }
    }
    return fasa_dot_f16(acc, q + j, k + j, n - j);
}

/* --- split-K attention (fac.cu, dense.cu) --------------------------------------------------- */

#define FASA_ATT_THREADS 128   /* tokens scored per tile; dims per thread: d / 128, at most 2 */

struct fasa_att_args {
    const float *q;           /* (n_head, d) */
    const uint16_t *kdom;     /* (n_kv, n_ctx, n_dom) */
    const uint16_t *krest;    /* (n_kv, n_ctx, d - n_dom), or staging (n_head, n, d - n_dom) */
    const uint16_t *v;        /* (n_kv, n_ctx, d), or staging (n_head, n, d) */
    const int32_t *idx;       /* (n_head, n), or NULL: rows 0..n-1 */
    int n, n_split;
    int group, d, n_dom, n_ctx;
    int compact;              /* krest and v are staging buffers */
    float scale;
    float *part;              /* (n_head, n_split, d + 2): acc[0..d), m, l */
};

/* Block (split s, query head h): scores one tile of tokens a thread each (fasa_full_score's
 * order), then every thread folds the tile's scores in token order into the running softmax
 * (each thread holds the same m, l) and its dims' accumulators: fasa_softmax_push and
 * fasa_acc_push, token by token, as the CPU twin does. */
static __global__ void __launch_bounds__(FASA_ATT_THREADS) fasa_att_partial(fasa_att_args a)
{
    __shared__ float qs[FASA_CUDA_MAX_D];
    __shared__ float sc[FASA_ATT_THREADS];
    __shared__ int rows[FASA_ATT_THREADS];
    const int s = blockIdx.x, h = blockIdx.y, tid = threadIdx.x, g = h / a.group;
    const int n_rest = a.d - a.n_dom;
    for (int c = tid; c < a.d; c += FASA_ATT_THREADS) qs[c] = a.q[(size_t)h * a.d + c];
    int lo, hi;
    fasa_split_range(a.n, a.n_split, s, &lo, &hi);
    const int32_t *idx = a.idx ? a.idx + (size_t)h * a.n : nullptr;
    const uint16_t *kdom = a.kdom + (size_t)g * a.n_ctx * a.n_dom;
    /* rows of krest and v: the KV head's block, or this head's staging rows */
    const uint16_t *krest = a.compact ? a.krest + fasa_stage_row(h, 0, a.n, n_rest) : a.krest + (size_t)g * a.n_ctx * n_rest;
    const uint16_t *v = a.compact ? a.v + fasa_stage_row(h, 0, a.n, a.d) : a.v + (size_t)g * a.n_ctx * a.d;
    fasa_softmax st = fasa_softmax_init();
    float acc0 = 0.0f, acc1 = 0.0f;   /* dims tid and tid + FASA_ATT_THREADS */
    const int c0 = tid, c1 = tid + FASA_ATT_THREADS;
    __syncthreads();
    for (int j0 = lo; j0 < hi; j0 += FASA_ATT_THREADS) {
        const int j = j0 + tid;
        if (j < hi) {
            const int row = idx ? idx[j] : j;
            const int rrow = idx ? fasa_gather_row(idx, j, a.compact) : j;
            float acc = fasa_row_dot(0.0f, qs, kdom + (size_t)row * a.n_dom, a.n_dom);
            if (n_rest) acc = fasa_row_dot(acc, qs + a.n_dom, krest + (size_t)rrow * n_rest, n_rest);
            sc[tid] = a.scale * acc;
            rows[tid] = rrow;
        }
        __syncthreads();
        const int m = hi - j0 < FASA_ATT_THREADS ? hi - j0 : FASA_ATT_THREADS;
        for (int i = 0; i < m; i++) {
            float alpha, p;
            fasa_softmax_push(&st, sc[i], &alpha, &p);
            const uint16_t *vr = v + (size_t)rows[i] * a.d;
            if (c0 < a.d) acc0 = fasa_acc_push(acc0, alpha, p, fasa_f16_to_f32(vr[c0]));
            if (c1 < a.d) acc1 = fasa_acc_push(acc1, alpha, p, fasa_f16_to_f32(vr[c1]));
        }
        __syncthreads();
    }
    float *out = a.part + ((size_t)h * a.n_split + s) * (a.d + 2);
    if (c0 < a.d) out[c0] = acc0;
    if (c1 < a.d) out[c1] = acc1;
    if (tid == 0) {
        out[a.d] = st.m;
        out[a.d + 1] = st.l;
    }
}

/* Block h: merges the n_split partial states in split order (fasa_softmax_merge) and
 * normalises (fasa_softmax_finish). */
static __global__ void __launch_bounds__(FASA_ATT_THREADS) fasa_att_combine(const float *part, int n_split, int d,
                                                                            float *out)
{
    const int h = blockIdx.x;
    const float *p0 = part + (size_t)h * n_split * (d + 2);
    for (int c = threadIdx.x; c < d; c += FASA_ATT_THREADS) {
        fasa_softmax st;
        st.m = p0[d];
        st.l = p0[d + 1];
        float acc = p0[c];
        for (int s = 1; s < n_split; s++) {
            const float *ps = p0 + (size_t)s * (d + 2);
            fasa_softmax b;
            b.m = ps[d];
            b.l = ps[d + 1];
            float wa, wb;
            fasa_softmax_merge(&st, b, &wa, &wb);
            acc = fasa_acc_merge(acc, wa, ps[c], wb);
        }
        out[(size_t)h * d + c] = fasa_softmax_finish(acc, st.l);
    }
}

/* Both kernels for n_head heads of n tokens each. */
static inline int fasa_att_run(fasa_cuda *cu, fasa_att_args a, int n_head, float *out, const char *name, char *err)
{
    a.n_split = fasa_split_count(a.n);
    const int r = fasa_cuda_part(cu, (size_t)n_head * a.n_split * (a.d + 2), err);
    if (r < 0) return r;
    a.part = cu->part;
    fasa_att_partial<<<dim3(a.n_split, n_head), FASA_ATT_THREADS, 0, cu->stream>>>(a);
    if (fasa_cuda_launched(err, name) < 0) return FASA_EIO;
    fasa_att_combine<<<n_head, FASA_ATT_THREADS, 0, cu->stream>>>(a.part, a.n_split, a.d, out);
    return fasa_cuda_launched(err, "attention combine");
}

#endif

/* fasa_cuda_internal.cuh - what the .cu files share: the context, error reporting, the
 * vectorised row dot product and the split-K attention kernels used by fac.cu and dense.cu. */
#ifndef FASA_CUDA_INTERNAL_CUH
#define FASA_CUDA_INTERNAL_CUH

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <pthread.h>

extern "C" {
#include "base.h"
}
#include "fasa_cuda.h"
#include "fasa_cuda_math.h"

struct fasa_cuda {
    int device;
    cudaStream_t stream;      /* kernels */
    cudaStream_t copy;        /* FASA-M fetches through the copy engine */
    cublasHandle_t blas;      /* created on first use (cuBLAS is dlopen'ed then: matvec.cu) */
    float *part;              /* split-K partials, (n_head, n_split, d + 2) */
    size_t part_cap;          /* floats */
};

/* Destroys the context's cuBLAS handle, if it has one (matvec.cu). */
void fasa_cuda_blas_release(fasa_cuda *cu);

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
                          sh ? sh->n_head : 0, sh ? sh->n_kv : 0, sh ? sh->d : 0, sh ? sh->n_dom : 0,
                          sh ? sh->n_ctx : 0);
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

/* --- split-K attention (kernels in fac.cu, used by dense.cu too) ---------------------------- */

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

/* Runs fasa_att_partial and fasa_att_combine (fac.cu) for n_head heads of a.n tokens each;
 * fills in a.n_split and a.part. */
int fasa_att_run(fasa_cuda *cu, fasa_att_args a, int n_head, float *out, const char *name, char *err);

#endif

/* matvec.cu - y = W x for the projections: f16 weights with a warp per row (the lane order of
 * fasa_matvec_lane, then a butterfly sum), f32 weights through cuBLAS. */
#include "fasa_cuda_internal.cuh"

#define MATVEC_WARPS 8

static __global__ void __launch_bounds__(MATVEC_WARPS * 32) matvec_f16_kernel(float *y, const uint16_t *W, const float *x,
                                                                             int rows, int cols)
{
    const int row = blockIdx.x * MATVEC_WARPS + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (row >= rows) return;   /* whole warps */
    const uint16_t *r = W + (size_t)row * cols;
    float acc;
    if (((uintptr_t)r & 15) == 0 && (cols & 7) == 0) {
        acc = 0.0f;
        for (int base = 8 * lane; base < cols; base += 256) {
            const uint4 w = *reinterpret_cast<const uint4 *>(r + base);
            acc = fasa_chunk_fma(acc, x[base], x[base + 1], w.x);
            acc = fasa_chunk_fma(acc, x[base + 2], x[base + 3], w.y);
            acc = fasa_chunk_fma(acc, x[base + 4], x[base + 5], w.z);
            acc = fasa_chunk_fma(acc, x[base + 6], x[base + 7], w.w);
        }
    } else {
        acc = fasa_matvec_lane(r, x, cols, lane);
    }
    for (int off = 16; off; off >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, off);
    if (lane == 0) y[row] = acc;
}

extern "C" int fasa_cuda_matvec_f16(fasa_cuda *cu, float *y, const uint16_t *W, const float *x, int rows, int cols,
                                    char *err)
{
    if (rows < 1 || cols < 1) return fasa_error(err, FASA_EARG, "matvec of a %d x %d matrix", rows, cols);
    matvec_f16_kernel<<<(rows + MATVEC_WARPS - 1) / MATVEC_WARPS, MATVEC_WARPS * 32, 0, cu->stream>>>(y, W, x, rows, cols);
    return fasa_cuda_launched(err, "matvec_f16_kernel");
}

static const char *blas_status(cublasStatus_t s)
{
    switch (s) {
    case CUBLAS_STATUS_NOT_INITIALIZED: return "not initialized";
    case CUBLAS_STATUS_ALLOC_FAILED: return "allocation failed";
    case CUBLAS_STATUS_INVALID_VALUE: return "invalid value";
    case CUBLAS_STATUS_ARCH_MISMATCH: return "architecture mismatch";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "execution failed";
    case CUBLAS_STATUS_INTERNAL_ERROR: return "internal error";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "not supported";
    default: return "error";
    }
}

/* W is row-major (rows, cols), i.e. column-major (cols, rows): y = op(A) x with op = transpose. */
extern "C" int fasa_cuda_matvec_f32(fasa_cuda *cu, float *y, const float *W, const float *x, int rows, int cols,
                                    char *err)
{
    if (rows < 1 || cols < 1) return fasa_error(err, FASA_EARG, "matvec of a %d x %d matrix", rows, cols);
    cublasStatus_t s;
    if (!cu->blas) {
        if ((s = cublasCreate(&cu->blas)) != CUBLAS_STATUS_SUCCESS) {
            cu->blas = nullptr;
            return fasa_error(err, FASA_EIO, "cublasCreate: %s", blas_status(s));
        }
        if ((s = cublasSetStream(cu->blas, cu->stream)) != CUBLAS_STATUS_SUCCESS)
            return fasa_error(err, FASA_EIO, "cublasSetStream: %s", blas_status(s));
    }
    const float one = 1.0f, zero = 0.0f;
    if ((s = cublasSgemv(cu->blas, CUBLAS_OP_T, cols, rows, &one, W, cols, x, 1, &zero, y, 1)) != CUBLAS_STATUS_SUCCESS)
        return fasa_error(err, FASA_EIO, "cublasSgemv (%d x %d): %s", rows, cols, blas_status(s));
    return 0;
}

/* matvec.cu - y = W x for the projections: f16 weights with a warp per row (the lane order of
 * fasa_matvec_lane, then a butterfly sum), f32 weights through cuBLAS.
 *
 * cuBLAS is loaded with dlopen on first use, not linked: linked, its libraries (over 500 MB with
 * cuBLASLt) are mapped at every start of fasa and of every test process, 0.3-0.4 s each here. */
#include <dlfcn.h>

#include "fasa_cuda_internal.cuh"

#define MATVEC_WARPS 8

static __global__ void __launch_bounds__(MATVEC_WARPS * 32)
    matvec_f16_kernel(float *y, const uint16_t *W, const float *x, int rows, int cols)
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
    matvec_f16_kernel<<<(rows + MATVEC_WARPS - 1) / MATVEC_WARPS, MATVEC_WARPS * 32, 0, cu->stream>>>(y, W, x, rows,
                                                                                                      cols);
    return fasa_cuda_launched(err, "matvec_f16_kernel");
}

#define FASA_STR_(x) #x
#define FASA_STR(x) FASA_STR_(x)

static struct {
    pthread_mutex_t lock;
    void *lib;
    decltype(&cublasCreate_v2) create;
    decltype(&cublasDestroy_v2) destroy;
    decltype(&cublasSetStream_v2) set_stream;
    decltype(&cublasSgemv_v2) sgemv;
} blas = { PTHREAD_MUTEX_INITIALIZER, nullptr, nullptr, nullptr, nullptr, nullptr };

static int blas_load(char *err)
{
    static const char name[] = "libcublas.so." FASA_STR(CUBLAS_VER_MAJOR);
    pthread_mutex_lock(&blas.lock);
    int r = 0;
    if (!blas.lib) {
        void *lib = dlopen(name, RTLD_NOW | RTLD_LOCAL);
        if (!lib) {
            r = fasa_error(err, FASA_EUNSUPPORTED, "dlopen %s: %s", name, dlerror());
        } else {
            blas.create = (decltype(blas.create))dlsym(lib, "cublasCreate_v2");
            blas.destroy = (decltype(blas.destroy))dlsym(lib, "cublasDestroy_v2");
            blas.set_stream = (decltype(blas.set_stream))dlsym(lib, "cublasSetStream_v2");
            blas.sgemv = (decltype(blas.sgemv))dlsym(lib, "cublasSgemv_v2");
            if (!blas.create || !blas.destroy || !blas.set_stream || !blas.sgemv) {
                r = fasa_error(err, FASA_EUNSUPPORTED, "dlsym: %s lacks cublasSgemv_v2 or its companions", name);
                dlclose(lib);
            } else {
                blas.lib = lib;   /* kept for the life of the process */
            }
        }
    }
    pthread_mutex_unlock(&blas.lock);
    return r;
}

void fasa_cuda_blas_release(fasa_cuda *cu)
{
    if (cu->blas && blas.destroy) blas.destroy(cu->blas);
    cu->blas = nullptr;
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
    const int r = blas_load(err);
    if (r < 0) return r;
    cublasStatus_t s;
    if (!cu->blas) {
        if ((s = blas.create(&cu->blas)) != CUBLAS_STATUS_SUCCESS) {
            cu->blas = nullptr;
            return fasa_error(err, FASA_EIO, "cublasCreate: %s", blas_status(s));
        }
        if ((s = blas.set_stream(cu->blas, cu->stream)) != CUBLAS_STATUS_SUCCESS)
            return fasa_error(err, FASA_EIO, "cublasSetStream: %s", blas_status(s));
    }
    const float one = 1.0f, zero = 0.0f;
    if ((s = blas.sgemv(cu->blas, CUBLAS_OP_T, cols, rows, &one, W, cols, x, 1, &zero, y, 1)) != CUBLAS_STATUS_SUCCESS)
        return fasa_error(err, FASA_EIO, "cublasSgemv (%d x %d): %s", rows, cols, blas_status(s));
    return 0;
}

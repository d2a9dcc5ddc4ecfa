/* device.cu - device discovery, the context (streams, scratch) and memory transfers. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fasa_cuda_internal.cuh"

extern "C" int fasa_cuda_built(void) { return 1; }

/* The number of devices (>= 1) or FASA_EUNSUPPORTED. */
static int count_devices(char *err)
{
    int n = 0;
    const cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
        /* no driver, no device, or a driver older than this runtime: all mean "nothing to run on" */
        const char *why = cudaGetErrorString(e);
        cudaGetLastError();   /* clear the error */
        return fasa_error(err, FASA_EUNSUPPORTED, "no CUDA device (cudaGetDeviceCount: %s%s)", why,
                          e == cudaErrorInsufficientDriver
                              ? ": no NVIDIA driver is loaded, or it is older than this CUDA runtime"
                              : "");
    }
    if (n == 0) return fasa_error(err, FASA_EUNSUPPORTED, "no CUDA device");
    return n;
}

extern "C" int fasa_cuda_devices(fasa_cuda_device *dev, int max, char *err)
{
    const int n = count_devices(err);
    if (n < 0) return n;
    int cur = 0;
    if (cudaGetDevice(&cur) != cudaSuccess) cur = 0;
    for (int i = 0; i < n && i < max; i++) {
        cudaDeviceProp p;
        FASA_CU_TRY(cudaGetDeviceProperties(&p, i), "cudaGetDeviceProperties");
        fasa_cuda_device *d = &dev[i];
        memset(d, 0, sizeof *d);
        d->index = i;
        snprintf(d->name, sizeof d->name, "%s", p.name);
        d->mem_total = p.totalGlobalMem;
        d->cc_major = p.major;
        d->cc_minor = p.minor;
        d->n_sm = p.multiProcessorCount;
        d->can_map_host = p.canMapHostMemory;
        d->has_kernels = p.major == 8 || (p.major == 9 && p.minor == 0);   /* CUDA_ARCHS in the Makefile */
        size_t free_b = 0, total_b = 0;
        /* free memory needs a context on that device; report 0 when one cannot be made */
        if (cudaSetDevice(i) == cudaSuccess && cudaMemGetInfo(&free_b, &total_b) == cudaSuccess)
            d->mem_free = free_b;
        cudaGetLastError();
    }
    cudaSetDevice(cur);
    return n;
}

extern "C" int fasa_cuda_open(fasa_cuda **out, int device, char *err)
{
    *out = nullptr;
    const int n = count_devices(err);
    if (n < 0) return n;
    if (device < 0 || device >= n)
        return fasa_error(err, FASA_EARG, "CUDA device %d does not exist (%d found)", device, n);
    FASA_CU_TRY(cudaSetDevice(device), "cudaSetDevice");
    /* zero-copy reads of mapped host memory (FASA-M); implied under unified addressing, and
     * refused once the device's context exists, which is harmless */
    if (cudaSetDeviceFlags(cudaDeviceMapHost) != cudaSuccess) cudaGetLastError();
    fasa_cuda *cu = (fasa_cuda *)calloc(1, sizeof *cu);
    if (!cu) return fasa_error(err, FASA_ENOMEM, "out of memory");
    cu->device = device;
    cudaError_t e = cudaStreamCreateWithFlags(&cu->stream, cudaStreamNonBlocking);
    if (e == cudaSuccess) e = cudaStreamCreateWithFlags(&cu->copy, cudaStreamNonBlocking);
    if (e != cudaSuccess) {
        fasa_cuda_close(cu);
        return fasa_cuda_fail(err, e, "cudaStreamCreateWithFlags");
    }
    *out = cu;
    return 0;
}

extern "C" void fasa_cuda_close(fasa_cuda *cu)
{
    if (!cu) return;
    cudaSetDevice(cu->device);
    if (cu->stream) cudaStreamSynchronize(cu->stream);
    if (cu->copy) cudaStreamSynchronize(cu->copy);
    fasa_cuda_blas_release(cu);
    if (cu->part) cudaFree(cu->part);
    if (cu->stream) cudaStreamDestroy(cu->stream);
    if (cu->copy) cudaStreamDestroy(cu->copy);
    free(cu);
}

extern "C" int fasa_cuda_sync(fasa_cuda *cu, char *err)
{
    FASA_CU_TRY(cudaStreamSynchronize(cu->copy), "cudaStreamSynchronize (copy stream)");
    FASA_CU_TRY(cudaStreamSynchronize(cu->stream), "cudaStreamSynchronize");
    return 0;
}

extern "C" int fasa_cuda_alloc(fasa_cuda *cu, void **d_ptr, size_t bytes, char *err)
{
    (void)cu;
    *d_ptr = nullptr;
    const cudaError_t e = cudaMalloc(d_ptr, bytes ? bytes : 1);
    if (e != cudaSuccess) {
        char what[64];
        snprintf(what, sizeof what, "%zu bytes", bytes);
        *d_ptr = nullptr;
        return fasa_cuda_fail(err, e, "cudaMalloc", what);
    }
    return 0;
}

extern "C" void fasa_cuda_free(fasa_cuda *cu, void *d_ptr)
{
    (void)cu;
    if (d_ptr) cudaFree(d_ptr);
}

extern "C" int fasa_cuda_host_alloc(fasa_cuda *cu, void **h_ptr, size_t bytes, char *err)
{
    (void)cu;
    *h_ptr = nullptr;
    const cudaError_t e = cudaHostAlloc(h_ptr, bytes ? bytes : 1, cudaHostAllocMapped | cudaHostAllocPortable);
    if (e != cudaSuccess) {
        char what[64];
        snprintf(what, sizeof what, "%zu bytes, pinned and mapped", bytes);
        *h_ptr = nullptr;
        return fasa_cuda_fail(err, e, "cudaHostAlloc", what);
    }
    return 0;
}

extern "C" void fasa_cuda_host_free(fasa_cuda *cu, void *h_ptr)
{
    (void)cu;
    if (h_ptr) cudaFreeHost(h_ptr);
}

extern "C" int fasa_cuda_upload(fasa_cuda *cu, void *d_dst, const void *src, size_t bytes, char *err)
{
    FASA_CU_TRY(cudaMemcpyAsync(d_dst, src, bytes, cudaMemcpyHostToDevice, cu->stream), "cudaMemcpyAsync (upload)");
    FASA_CU_TRY(cudaStreamSynchronize(cu->stream), "cudaStreamSynchronize (upload)");
    return 0;
}

extern "C" int fasa_cuda_upload_f16(fasa_cuda *cu, uint16_t *d_dst, const float *src, size_t n, char *err)
{
    const size_t CHUNK = (size_t)1 << 16;
    uint16_t *buf = (uint16_t *)malloc(sizeof(uint16_t) * (n < CHUNK ? (n ? n : 1) : CHUNK));
    if (!buf) return fasa_error(err, FASA_ENOMEM, "out of memory");
    for (size_t i = 0; i < n; i += CHUNK) {
        const size_t m = n - i < CHUNK ? n - i : CHUNK;
        for (size_t j = 0; j < m; j++) buf[j] = fasa_f32_to_f16(src[i + j]);
        const int r = fasa_cuda_upload(cu, d_dst + i, buf, m * sizeof(uint16_t), err);
        if (r < 0) {
            free(buf);
            return r;
        }
    }
    free(buf);
    return 0;
}

extern "C" int fasa_cuda_download(fasa_cuda *cu, void *dst, const void *d_src, size_t bytes, char *err)
{
    FASA_CU_TRY(cudaMemcpyAsync(dst, d_src, bytes, cudaMemcpyDeviceToHost, cu->stream), "cudaMemcpyAsync (download)");
    FASA_CU_TRY(cudaStreamSynchronize(cu->stream), "cudaStreamSynchronize (download)");
    return 0;
}

/* fasa_cuda_stub.c - the CUDA API of a build without CUDA (make CUDA=0): every call fails with
 * "built without CUDA", so callers need no #ifdefs. With CUDA=1 the .cu files define the API
 * and this file compiles to nothing (it is still built: the library notices a CUDA switch). */
#include "kernels/fasa_cuda.h"
#include "base.h"

#if !defined(FASA_CUDA) || !FASA_CUDA

#define NO_CUDA fasa_error(err, FASA_EUNSUPPORTED, "built without CUDA")

int fasa_cuda_built(void) { return 0; }
int fasa_cuda_devices(fasa_cuda_device *dev, int max, char *err) { return NO_CUDA; }
int fasa_cuda_open(fasa_cuda **out, int device, char *err)
{
    *out = NULL;
    return NO_CUDA;
}
void fasa_cuda_close(fasa_cuda *cu) {}
int fasa_cuda_sync(fasa_cuda *cu, char *err) { return NO_CUDA; }
int fasa_cuda_alloc(fasa_cuda *cu, void **d_ptr, size_t bytes, char *err)
{
    *d_ptr = NULL;
    return NO_CUDA;
}
void fasa_cuda_free(fasa_cuda *cu, void *d_ptr) {}
int fasa_cuda_host_alloc(fasa_cuda *cu, void **h_ptr, size_t bytes, char *err)
{
    *h_ptr = NULL;
    return NO_CUDA;
}
void fasa_cuda_host_free(fasa_cuda *cu, void *h_ptr) {}
int fasa_cuda_upload(fasa_cuda *cu, void *d_dst, const void *src, size_t bytes, char *err) { return NO_CUDA; }
int fasa_cuda_upload_f16(fasa_cuda *cu, uint16_t *d_dst, const float *src, size_t n, char *err) { return NO_CUDA; }
int fasa_cuda_download(fasa_cuda *cu, void *dst, const void *d_src, size_t bytes, char *err) { return NO_CUDA; }
int fasa_cuda_tip(fasa_cuda *cu, float *scores, const float *qdom, const uint16_t *kdom, const fasa_cuda_shape *sh,
                  int t, char *err)
{
    return NO_CUDA;
}
int fasa_cuda_topn(fasa_cuda *cu, int32_t *idx, const float *scores, int n_head, int t, int n, char *err)
{
    return NO_CUDA;
}
int fasa_cuda_fac(fasa_cuda *cu, float *out, const float *q, const uint16_t *kdom, const uint16_t *krest,
                  const uint16_t *v, const fasa_cuda_shape *sh, const int32_t *idx, int n, int compact, char *err)
{
    return NO_CUDA;
}
int fasa_cuda_dense(fasa_cuda *cu, float *out, const float *q, const uint16_t *kdom, const uint16_t *krest,
                    const uint16_t *v, const fasa_cuda_shape *sh, int t, char *err)
{
    return NO_CUDA;
}
int fasa_cuda_cold_init(fasa_cuda *cu, fasa_cuda_cold *c, int n_layer, int n_kv, int n_ctx, int d, int n_rest,
                        char *err)
{
    return NO_CUDA;
}
void fasa_cuda_cold_free(fasa_cuda *cu, fasa_cuda_cold *c) {}
int fasa_cuda_stage_init(fasa_cuda *cu, fasa_cuda_stage *st, int n_head, int n, int d, int n_rest, char *err)
{
    return NO_CUDA;
}
void fasa_cuda_stage_free(fasa_cuda *cu, fasa_cuda_stage *st) {}
int fasa_cuda_fetch_mapped(fasa_cuda *cu, fasa_cuda_stage *st, const fasa_cuda_cold *c, int layer, int n_head,
                           const int32_t *idx, int n, char *err)
{
    return NO_CUDA;
}
int fasa_cuda_fetch_copy(fasa_cuda *cu, fasa_cuda_stage *st, const fasa_cuda_cold *c, int layer, int n_head,
                         const int32_t *idx, int n, char *err)
{
    return NO_CUDA;
}
int fasa_cuda_fetch_wait(fasa_cuda *cu, fasa_cuda_stage *st, int layer, char *err) { return NO_CUDA; }
int fasa_cuda_fetch_release(fasa_cuda *cu, fasa_cuda_stage *st, int layer, char *err) { return NO_CUDA; }
int fasa_cuda_matvec_f16(fasa_cuda *cu, float *y, const uint16_t *W, const float *x, int rows, int cols, char *err)
{
    return NO_CUDA;
}
int fasa_cuda_matvec_f32(fasa_cuda *cu, float *y, const float *W, const float *x, int rows, int cols, char *err)
{
    return NO_CUDA;
}
int fasa_cuda_kv_open(fasa_cuda *cu, fasa_cuda_kv **out, int n_layer, int n_head, int n_kv, int n_ctx, int d,
                      int n_dom, char *err)
{
    *out = NULL;
    return NO_CUDA;
}
void fasa_cuda_kv_close(fasa_cuda_kv *kv) {}
int fasa_cuda_attend(fasa_cuda_kv *kv, int layer, int head, const float *K, const float *krest, const float *V, int t,
                     const float *q, const int32_t *idx, int n, float *out, char *err)
{
    return NO_CUDA;
}

#else

typedef int fasa_cuda_stub_unused;   /* an empty translation unit is not ISO C */

#endif

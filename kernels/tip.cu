/* tip.cu - the token importance predictor: every cached token's partial score over the 2F
 * dominant dims of its KV head, per query head (DESIGN.md §3, TIP). */
#include "fasa_cuda_internal.cuh"

#define TIP_THREADS 256

/* Block (token tile, query head h): a thread per token, fasa_tip_score's order. The keys of the
 * tile are one contiguous stretch of the dominant block, so a warp reads whole cache lines. */
static __global__ void __launch_bounds__(TIP_THREADS) tip_kernel(float *scores, const float *qdom,
                                                                 const uint16_t *kdom, int t, int n_dom, int n_ctx,
                                                                 int group)
{
    __shared__ float qs[FASA_CUDA_MAX_D];
    const int h = blockIdx.y, g = h / group, tok = blockIdx.x * TIP_THREADS + threadIdx.x;
    for (int c = threadIdx.x; c < n_dom; c += TIP_THREADS) qs[c] = qdom[(size_t)h * n_dom + c];
    __syncthreads();
    if (tok < t)
        scores[(size_t)h * t + tok] = fasa_row_dot(0.0f, qs, kdom + ((size_t)g * n_ctx + tok) * n_dom, n_dom);
}

extern "C" int fasa_cuda_tip(fasa_cuda *cu, float *scores, const float *qdom, const uint16_t *kdom,
                             const fasa_cuda_shape *sh, int t, char *err)
{
    const int r = fasa_cuda_check_shape(sh, err);
    if (r < 0) return r;
    if (t < 0 || t > sh->n_ctx)
        return fasa_error(err, FASA_EARG, "TIP over %d tokens of a %d-token cache", t, sh->n_ctx);
    if (t == 0) return 0;
    const dim3 grid((t + TIP_THREADS - 1) / TIP_THREADS, sh->n_head);
    tip_kernel<<<grid, TIP_THREADS, 0, cu->stream>>>(scores, qdom, kdom, t, sh->n_dom, sh->n_ctx,
                                                     sh->n_head / sh->n_kv);
    return fasa_cuda_launched(err, "tip_kernel");
}

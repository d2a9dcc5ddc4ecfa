/* dense.cu - dense decode attention (full mode and FASA's dense layers): every query head over
 * all t cached tokens, split-K over thread blocks like fac.cu, rows read in order. */
#include <math.h>

#include "fasa_cuda_internal.cuh"

extern "C" int fasa_cuda_dense(fasa_cuda *cu, float *out, const float *q, const uint16_t *kdom, const uint16_t *krest,
                               const uint16_t *v, const fasa_cuda_shape *sh, int t, char *err)
{
    const int r = fasa_cuda_check_shape(sh, err);
    if (r < 0) return r;
    if (t < 1 || t > sh->n_ctx)
        return fasa_error(err, FASA_EARG, "dense attention over %d tokens of a %d-token cache", t, sh->n_ctx);
    if (sh->n_dom < sh->d && !krest) return fasa_error(err, FASA_EARG, "dense attention: keys have no rest block");
    fasa_att_args a = {};
    a.q = q;
    a.kdom = kdom;
    a.krest = krest;
    a.v = v;
    a.idx = nullptr;
    a.n = t;
    a.group = sh->n_head / sh->n_kv;
    a.d = sh->d;
    a.n_dom = sh->n_dom;
    a.n_ctx = sh->n_ctx;
    a.compact = 0;
    a.scale = 1.0f / sqrtf((float)sh->d);
    return fasa_att_run(cu, a, sh->n_head, out, "fasa_att_partial (dense)", err);
}

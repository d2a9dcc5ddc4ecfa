/* fac.cu - focused attention (FAC): exact softmax attention of each query head over the N
 * tokens it chose, split-K over thread blocks with a combine kernel (flash-decoding style).
 * The kernels are fasa_att_partial / fasa_att_combine (fasa_cuda_internal.cuh). */
#include <math.h>

#include "fasa_cuda_internal.cuh"

extern "C" int fasa_cuda_fac(fasa_cuda *cu, float *out, const float *q, const uint16_t *kdom, const uint16_t *krest,
                             const uint16_t *v, const fasa_cuda_shape *sh, const int32_t *idx, int n, int compact,
                             char *err)
{
    const int r = fasa_cuda_check_shape(sh, err);
    if (r < 0) return r;
    if (n < 1 || !idx) return fasa_error(err, FASA_EARG, "focused attention over %d tokens", n);
    if (sh->n_dom < sh->d && !krest) return fasa_error(err, FASA_EARG, "focused attention: keys have no rest block");
    fasa_att_args a = {};
    a.q = q;
    a.kdom = kdom;
    a.krest = krest;
    a.v = v;
    a.idx = idx;
    a.n = n;
    a.group = sh->n_head / sh->n_kv;
    a.d = sh->d;
    a.n_dom = sh->n_dom;
    a.n_ctx = sh->n_ctx;
    a.compact = compact != 0;
    a.scale = 1.0f / sqrtf((float)sh->d);
    return fasa_att_run(cu, a, sh->n_head, out, "fasa_att_partial (fac)", err);
}

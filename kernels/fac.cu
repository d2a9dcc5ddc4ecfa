/* fac.cu - focused attention (FAC): exact softmax attention of each query head over the N
 * tokens it chose, split-K over thread blocks with a combine kernel (flash-decoding style).
 * The same two kernels run dense attention (dense.cu) with the rows in order. */
#include <math.h>

#include "fasa_cuda_internal.cuh"

/* Block (split s, query head h): scores one tile of tokens a thread each (fasa_full_score's
 * order), then every thread folds the tile's scores in token order into the running softmax
 * (each thread holds the same m, l) and its dims' accumulators: fasa_softmax_push and
 * fasa_acc_push, token by token, as the CPU twin does. */
static __global__ void __launch_bounds__(FASA_ATT_THREADS, 4) fasa_att_partial(fasa_att_args a)
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
    const uint16_t *krest =
        a.compact ? a.krest + fasa_stage_row(h, 0, a.n, n_rest) : a.krest + (size_t)g * a.n_ctx * n_rest;
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

int fasa_att_run(fasa_cuda *cu, fasa_att_args a, int n_head, float *out, const char *name, char *err)
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

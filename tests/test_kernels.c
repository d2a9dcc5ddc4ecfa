/* The CUDA kernels' arithmetic (kernels/fasa_cuda_math.h) on the CPU against scalar references,
 * CPU twins of each kernel built from the same functions, and one test per kernel that runs it
 * on a device against its twin (reported skipped, by name, when there is no device or no CUDA).
 *
 * Tolerances: conversions, packing and addresses are exact. Dot products are held to the
 * classic bound n * 2^-24 * sum |q_j k_j| against double precision. Attention outputs over n
 * tokens are held to a relative error (max |difference| / max |reference|) of sum_tol(n):
 * 1e-6 up to 256 tokens, then 4 sqrt(n) 2^-24, the random-walk growth of float summation (two
 * float computations in different orders differ by that much: lib/ops' one-pass softmax
 * attention is itself 1.75e-6 from double precision at 4096 tokens). A kernel and
 * its twin compute the same operations in the same order (fmaf, fasa_expf), so GPU results are
 * held to 1e-6 relative of the twin: exact in principle, with room for a device library that
 * rounds a division differently. */
#include <cpuid.h>
#include <criterion/criterion.h>
#include <float.h>
#include <immintrin.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base.h"
#include "gguf.h"
#include "kernels/fasa_cuda.h"
#include "kernels/fasa_cuda_math.h"
#include "ops.h"
#include "topk.h"

/* --- helpers --------------------------------------------------------------------------------- */

static uint64_t rng_next(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

static float urand(uint64_t *s)   /* [-1, 1) */
{
    return (float)((rng_next(s) >> 40) * (1.0 / (1 << 23)) - 1.0);
}

static float nrand(uint64_t *s)   /* roughly normal */
{
    return (urand(s) + urand(s) + urand(s) + urand(s)) * 0.866f;
}

static uint16_t *rand_f16(int n, float scale, uint64_t *s)
{
    uint16_t *h = malloc(sizeof *h * (n ? n : 1));
    for (int i = 0; i < n; i++) h[i] = fasa_f32_to_f16(nrand(s) * scale);
    return h;
}

static float *decode_f16(const uint16_t *h, int n)
{
    float *f = malloc(sizeof *f * (n ? n : 1));
    for (int i = 0; i < n; i++) f[i] = fasa_f16_to_f32(h[i]);
    return f;
}

static uint32_t f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static int have_f16c(void)
{
    unsigned a, b, c, d;
    return __get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C);
}

__attribute__((target("f16c"))) static float hw_h2f(uint16_t h) { return _cvtsh_ss(h); }
__attribute__((target("f16c"))) static uint16_t hw_f2h(float f) { return _cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT); }

/* max |a - b| / max |b| over n values */
static double rel_err(const float *a, const double *b, int n)
{
    double num = 0, den = 0;
    for (int i = 0; i < n; i++) {
        num = fmax(num, fabs(a[i] - b[i]));
        den = fmax(den, fabs(b[i]));
    }
    return den > 0 ? num / den : num;
}

static double sum_tol(int n)
{
    return fmax(1e-6, 4 * sqrt((double)n) * 0x1p-24);
}

static double rel_err_f(const float *a, const float *b, int n)
{
    double num = 0, den = 0;
    for (int i = 0; i < n; i++) {
        num = fmax(num, fabs((double)a[i] - b[i]));
        den = fmax(den, fabs((double)b[i]));
    }
    return den > 0 ? num / den : num;
}

/* --- f16 conversion -------------------------------------------------------------------------- */

Test(kernels, f16_to_f32_all_patterns)
{
    const int hw = have_f16c();
    for (uint32_t h = 0; h < 65536; h++) {
        const float f = fasa_f16_to_f32_soft((uint16_t)h);
        if (hw)
            cr_assert_eq(f32_bits(f), f32_bits(hw_h2f((uint16_t)h)), "half 0x%04x: 0x%08x, F16C 0x%08x", h, f32_bits(f),
                         f32_bits(hw_h2f((uint16_t)h)));
        /* and against the definition */
        const int e = (h >> 10) & 31, m = h & 1023;
        const double sign = (h & 0x8000) ? -1 : 1;
        if (e == 31) {
            cr_assert(m ? isnan(f) : isinf(f) && (f < 0) == (sign < 0), "half 0x%04x", h);
        } else {
            const double want = sign * (e ? ldexp(1024 + m, e - 25) : ldexp(m, -24));
            cr_assert_eq((double)f, want, "half 0x%04x: %g, want %g", h, f, want);
        }
    }
    if (!hw)
        fprintf(stderr, "kernels::f16_to_f32_all_patterns: no F16C on this CPU; checked against the definition only\n");
}

static void check_f2h(float f, int hw)
{
    const uint16_t s = fasa_f32_to_f16_soft(f);
    if (hw) cr_assert_eq(s, hw_f2h(f), "float 0x%08x (%g): 0x%04x, F16C 0x%04x", f32_bits(f), f, s, hw_f2h(f));
}

Test(kernels, f32_to_f16_round_trip_and_rounding)
{
    const int hw = have_f16c();
    for (uint32_t h = 0; h < 65536; h++) {
        const float f = fasa_f16_to_f32_soft((uint16_t)h);
        if (!isnan(f)) cr_assert_eq(fasa_f32_to_f16_soft(f), h, "half 0x%04x does not round-trip", h);
        check_f2h(f, hw);
        /* the ties between neighbours (exact in float) and one float ulp either side */
        if ((h & 0x7fff) < 0x7c00) {
            const float g = fasa_f16_to_f32_soft((uint16_t)(h + 1)), mid = (float)(((double)f + g) / 2);
            if (!isinf(g)) {
                check_f2h(mid, hw);
                check_f2h(nextafterf(mid, 0), hw);
                check_f2h(nextafterf(mid, INFINITY), hw);
                check_f2h(-mid, hw);
                /* the tie rounds to the even one of the two */
                const uint16_t t = fasa_f32_to_f16_soft(mid);
                cr_assert(t == ((h & 1) ? h + 1 : h), "tie after 0x%04x went to 0x%04x", h, t);
            }
        }
    }
    /* the largest half, the overflow boundary (65520 rounds to inf), tiny values, NaN payloads */
    const float edge[] = { 65504.0f, 65519.996f, 65520.0f, 1e10f, 5.9604645e-8f, 2.9802322e-8f, 2.9802326e-8f,
                           1e-30f, 0.0f, -0.0f, INFINITY, -INFINITY };
    for (size_t i = 0; i < sizeof edge / sizeof *edge; i++) check_f2h(edge[i], hw), check_f2h(-edge[i], hw);
    cr_assert_eq(fasa_f32_to_f16_soft(65520.0f), 0x7c00);
    cr_assert_eq(fasa_f32_to_f16_soft(2.9802322e-8f), 0);   /* 2^-25: ties to 0 */
    cr_assert_eq(fasa_f32_to_f16_soft(2.9802326e-8f), 1);
    /* a stride through every float bit pattern, NaNs included */
    for (uint64_t u = 0; u < (1ull << 32); u += 4093) {
        float f;
        uint32_t b = (uint32_t)u;
        memcpy(&f, &b, 4);
        check_f2h(f, hw);
    }
    if (!hw)
        fprintf(stderr,
                "kernels::f32_to_f16_round_trip_and_rounding: no F16C on this CPU; round trips and ties only\n");
}

/* --- exp ------------------------------------------------------------------------------------- */

static int64_t ulp_diff(float a, float b)
{
    int32_t ia, ib;
    memcpy(&ia, &a, 4);
    memcpy(&ib, &b, 4);
    if (ia < 0) ia = INT32_MIN - ia;
    if (ib < 0) ib = INT32_MIN - ib;
    return llabs((int64_t)ia - ib);
}

Test(kernels, expf_within_2_ulp)
{
    int64_t worst = 0;
    float at = 0;
    for (int i = 0; i <= 2000000; i++) {
        const float x = -87.3f + (88.3f + 87.3f) * i / 2000000;
        const float want = (float)exp((double)x), got = fasa_expf(x);
        const int64_t u = ulp_diff(got, want);
        if (u > worst) worst = u, at = x;
    }
    cr_assert_leq(worst, 2, "fasa_expf is %lld ulp off at %g", (long long)worst, at);
    cr_assert_eq(fasa_expf(0.0f), 1.0f);
    cr_assert_eq(fasa_expf(-87.4f), 0.0f);
    cr_assert_eq(fasa_expf(-INFINITY), 0.0f);
    cr_assert(isnan(fasa_expf(NAN)));
    cr_assert(fasa_expf(1000.0f) == fasa_expf(88.3f) && isfinite(fasa_expf(1000.0f)));
}

/* --- scores ---------------------------------------------------------------------------------- */

Test(kernels, tip_score_matches_references)
{
    uint64_t r = 7;
    for (int n_dom = 2; n_dom <= 64; n_dom += 2) {
        const int t = 33;
        float q[64];
        for (int j = 0; j < n_dom; j++) q[j] = nrand(&r);
        uint16_t *k = rand_f16(t * n_dom, 1.0f, &r);
        float *kf = decode_f16(k, t * n_dom);
        float s_ops[33];
        ops_attn_scores_ref(s_ops, q, kf, t, n_dom, 1.0f);   /* lib/ops.c's scalar scores, scale 1 */
        for (int i = 0; i < t; i++) {
            const uint16_t *row = k + (size_t)i * n_dom;
            const float s = fasa_tip_score(q, row, n_dom);
            double want = 0, mag = 0;
            for (int j = 0; j < n_dom; j++)
                want += (double)q[j] * kf[i * n_dom + j], mag += fabs((double)q[j] * kf[i * n_dom + j]);
            const double bound = n_dom * 0x1p-24 * mag;
            cr_assert_leq(fabs(s - want), bound, "2F=%d token %d: %.9g vs %.9g", n_dom, i, s, want);
            cr_assert_leq(fabs((double)s - s_ops[i]), 2 * bound, "2F=%d token %d: %.9g vs ops %.9g", n_dom, i, s,
                          s_ops[i]);
            /* the kernels' word-at-a-time order is the same computation */
            float w = 0;
            for (int c = 0; c < n_dom / 2; c++) {
                uint32_t word;
                memcpy(&word, row + 2 * c, 4);
                w = fasa_chunk_fma(w, q[2 * c], q[2 * c + 1], word);
            }
            cr_assert_eq(f32_bits(w), f32_bits(s), "2F=%d: chunk order differs", n_dom);
        }
        free(k);
        free(kf);
    }
}

Test(kernels, full_score_is_dominant_then_rest)
{
    uint64_t r = 11;
    const int d = 64;
    for (int n_dom = 2; n_dom <= d; n_dom += 2) {
        float q[64], kf[64], s_ops;
        uint16_t *k = rand_f16(d, 1.0f, &r);
        for (int j = 0; j < d; j++) q[j] = nrand(&r), kf[j] = fasa_f16_to_f32(k[j]);
        const float scale = 1.0f / sqrtf((float)d);
        /* the key split into its blocks: dominant dims 0..n_dom, the rest after */
        const float s = fasa_full_score(q, k, k + n_dom, n_dom, d, scale);
        cr_assert_eq(f32_bits(s), f32_bits(scale * fasa_dot_f16(0.0f, q, k, d)), "2F=%d", n_dom);
        ops_attn_scores_ref(&s_ops, q, kf, 1, d, scale);
        double want = 0, mag = 0;
        for (int j = 0; j < d; j++) want += (double)q[j] * kf[j], mag += fabs((double)q[j] * kf[j]);
        want *= scale;
        cr_assert_leq(fabs(s - want), (d + 1) * 0x1p-24 * mag * scale, "2F=%d: %.9g vs %.9g", n_dom, s, want);
        cr_assert_leq(fabs(s - s_ops), 2 * (d + 1) * 0x1p-24 * mag * scale, "2F=%d: %.9g vs ops %.9g", n_dom, s, s_ops);
        free(k);
    }
}

/* --- online softmax and split-K -------------------------------------------------------------- */

/* The CPU twin of fasa_att_partial + fasa_att_combine for one query head: scores of the chosen
 * rows (idx NULL: rows 0..n-1), split with fasa_split_count, each split folded token by token,
 * the splits merged in order. compact: krest and v rows are j, not idx[j]. */
static void att_twin(float *out, const float *q, const uint16_t *kdom, const uint16_t *krest, const uint16_t *v, int d,
                     int n_dom, const int32_t *idx, int n, int compact)
{
    const int n_split = fasa_split_count(n), n_rest = d - n_dom;
    const float scale = 1.0f / sqrtf((float)d);
    static float part[FASA_SPLIT_MAX][FASA_CUDA_MAX_D];
    fasa_softmax st[FASA_SPLIT_MAX];
    for (int s = 0; s < n_split; s++) {
        int lo, hi;
        fasa_split_range(n, n_split, s, &lo, &hi);
        st[s] = fasa_softmax_init();
        for (int c = 0; c < d; c++) part[s][c] = 0;
        for (int j = lo; j < hi; j++) {
            const int row = idx ? idx[j] : j, rrow = idx ? fasa_gather_row(idx, j, compact) : j;
            const float sc = fasa_full_score(q, kdom + (size_t)row * n_dom,
                                             n_rest ? krest + (size_t)rrow * n_rest : NULL, n_dom, d, scale);
            float alpha, p;
            fasa_softmax_push(&st[s], sc, &alpha, &p);
            for (int c = 0; c < d; c++)
                part[s][c] = fasa_acc_push(part[s][c], alpha, p, fasa_f16_to_f32(v[(size_t)rrow * d + c]));
        }
    }
    for (int c = 0; c < d; c++) {
        fasa_softmax a = st[0];
        float acc = part[0][c];
        for (int s = 1; s < n_split; s++) {
            float wa, wb;
            fasa_softmax_merge(&a, st[s], &wa, &wb);
            acc = fasa_acc_merge(acc, wa, part[s][c], wb);
        }
        out[c] = fasa_softmax_finish(acc, a.l);
    }
}

/* Softmax attention of scores s over rows of V (n, d) in double precision. */
static void attn_double(double *out, const float *s, const float *V, int n, int d)
{
    double m = -INFINITY, l = 0;
    for (int j = 0; j < n; j++) m = fmax(m, s[j]);
    for (int c = 0; c < d; c++) out[c] = 0;
    for (int j = 0; j < n; j++) {
        const double p = exp((double)s[j] - m);
        l += p;
        for (int c = 0; c < d; c++) out[c] += p * V[(size_t)j * d + c];
    }
    for (int c = 0; c < d; c++) out[c] /= l;
}

/* Online softmax over the scores in parts (cut at the given points), merged in order. */
static void online_parts(float *out, const float *s, const float *V, int n, int d, const int *cut, int n_cut)
{
    float acc[4][64];
    fasa_softmax st[4];
    int lo = 0;
    for (int p = 0; p <= n_cut; p++) {
        const int hi = p < n_cut ? cut[p] : n;
        st[p] = fasa_softmax_init();
        for (int c = 0; c < d; c++) acc[p][c] = 0;
        for (int j = lo; j < hi; j++) {
            float alpha, w;
            fasa_softmax_push(&st[p], s[j], &alpha, &w);
            for (int c = 0; c < d; c++) acc[p][c] = fasa_acc_push(acc[p][c], alpha, w, V[(size_t)j * d + c]);
        }
        lo = hi;
    }
    for (int c = 0; c < d; c++) {
        fasa_softmax a = st[0];
        float x = acc[0][c];
        for (int p = 1; p <= n_cut; p++) {
            float wa, wb;
            fasa_softmax_merge(&a, st[p], &wa, &wb);
            x = fasa_acc_merge(x, wa, acc[p][c], wb);
        }
        out[c] = fasa_softmax_finish(x, a.l);
    }
}

Test(kernels, online_softmax_split_merge_equals_one_pass)
{
    uint64_t r = 5;
    const int d = 64, sizes[] = { 1, 2, 7, 128, 129, 1000, 4096 };
    float *s = malloc(sizeof(float) * 4096), *V = malloc(sizeof(float) * 4096 * d), *p = malloc(sizeof(float) * 4096);
    for (size_t si = 0; si < sizeof sizes / sizeof *sizes; si++) {
        const int n = sizes[si];
        for (int kind = 0; kind < 4; kind++) {
            for (int j = 0; j < n; j++) {
                s[j] = kind == 0 ? 3 * nrand(&r)                    /* ordinary logits */
                       : kind == 1 ? 1.5f                           /* all equal */
                       : kind == 2 ? (j == n / 2 ? 50.0f : nrand(&r) - 60)   /* one dominates, the rest underflow */
                                   : 0.25f * (float)j;               /* rising: the max moves at every token */
                for (int c = 0; c < d; c++) V[(size_t)j * d + c] = nrand(&r);
            }
            double ref[64];
            attn_double(ref, s, V, n, d);
            float one[64], split[64], ops[64];
            online_parts(one, s, V, n, d, NULL, 0);
            const int cut[3] = { n / 4, n / 2, n / 2 };   /* an empty part in the middle */
            online_parts(split, s, V, n, d, cut, 3);
            memcpy(p, s, sizeof(float) * n);
            ops_softmax_ref(p, n);
            ops_attn_accum_ref(ops, p, V, n, d);   /* lib/ops.c's one-pass softmax attention */
            const double e_one = rel_err(one, ref, d), e_split = rel_err(split, ref, d), tol = sum_tol(n);
            const double e_vs_one = rel_err_f(split, one, d), e_vs_ops = rel_err_f(split, ops, d);
            cr_assert_leq(e_vs_one, tol, "n=%d kind %d: split-K vs one pass %.3g", n, kind, e_vs_one);
            cr_assert_leq(e_vs_ops, tol, "n=%d kind %d: split-K vs ops one-pass %.3g", n, kind, e_vs_ops);
            cr_assert_leq(e_one, tol, "n=%d kind %d: one pass vs double %.3g", n, kind, e_one);
            cr_assert_leq(e_split, tol, "n=%d kind %d: split-K vs double %.3g", n, kind, e_split);
        }
    }
    /* merging with an empty part changes nothing; two empty parts stay empty */
    fasa_softmax a = { 2.0f, 3.0f }, e = fasa_softmax_init();
    float wa, wb;
    fasa_softmax_merge(&a, e, &wa, &wb);
    cr_assert(a.m == 2.0f && a.l == 3.0f && wa == 1.0f && wb == 0.0f);
    fasa_softmax e2 = fasa_softmax_init();
    fasa_softmax_merge(&e2, e, &wa, &wb);
    cr_assert(e2.m == -INFINITY && e2.l == 0.0f && wb == 0.0f);
    cr_assert_eq(fasa_softmax_finish(1.0f, 0.0f), 0.0f);
    free(s);
    free(V);
    free(p);
}

Test(kernels, split_ranges_cover_every_token_once)
{
    for (int n = 0; n < 20000; n += (n < 300 ? 1 : 97)) {
        const int ns = fasa_split_count(n);
        cr_assert(ns >= 1 && ns <= FASA_SPLIT_MAX);
        int next = 0;
        for (int s = 0; s < ns; s++) {
            int lo, hi;
            fasa_split_range(n, ns, s, &lo, &hi);
            cr_assert(lo == next && hi >= lo, "n=%d split %d: [%d, %d) after %d", n, s, lo, hi, next);
            next = hi;
        }
        cr_assert_eq(next, n, "n=%d: splits end at %d", n, next);
    }
}

/* CPU cache rows (f16) of one KV head, split into blocks. */
typedef struct head_cache {
    int t, d, n_dom;
    uint16_t *full, *kdom, *krest, *v;   /* (t, d) (t, n_dom) (t, d - n_dom) (t, d) */
    float *kf, *vf;                       /* decoded (t, d) */
} head_cache;

static head_cache cache_make(int t, int d, int n_dom, uint64_t *r)
{
    head_cache h = { t, d, n_dom, NULL, NULL, NULL, NULL, NULL, NULL };
    h.full = rand_f16(t * d, 1.0f, r);
    h.v = rand_f16(t * d, 1.0f, r);
    h.kdom = malloc(sizeof(uint16_t) * t * n_dom);
    h.krest = malloc(sizeof(uint16_t) * t * (d - n_dom) + 2);
    for (int i = 0; i < t; i++) {
        memcpy(h.kdom + (size_t)i * n_dom, h.full + (size_t)i * d, sizeof(uint16_t) * n_dom);
        memcpy(h.krest + (size_t)i * (d - n_dom), h.full + (size_t)i * d + n_dom, sizeof(uint16_t) * (d - n_dom));
    }
    h.kf = decode_f16(h.full, t * d);
    h.vf = decode_f16(h.v, t * d);
    return h;
}

static void cache_free(head_cache *h)
{
    free(h->full), free(h->kdom), free(h->krest), free(h->v), free(h->kf), free(h->vf);
}

/* The same in double precision. */
static void attn_double_ref(double *out, const float *q, const head_cache *h, const int32_t *idx, int n)
{
    float *s = malloc(sizeof(float) * n), *V = malloc(sizeof(float) * (size_t)n * h->d);
    for (int j = 0; j < n; j++) {
        const int row = idx ? idx[j] : j;
        double acc = 0;
        for (int c = 0; c < h->d; c++) acc += (double)q[c] * h->kf[(size_t)row * h->d + c];
        s[j] = (float)(acc / sqrt((double)h->d));
        memcpy(V + (size_t)j * h->d, h->vf + (size_t)row * h->d, sizeof(float) * h->d);
    }
    attn_double(out, s, V, n, h->d);
    free(s);
    free(V);
}

/* What the CPU forward pass computes (lib/forward.c's attend / attend_sparse, scalar twins). */
static void attn_ops_ref(float *out, const float *q, const head_cache *h, const int32_t *idx, int n)
{
    float *s = malloc(sizeof(float) * n);
    const float scale = 1.0f / sqrtf((float)h->d);
    if (idx) {
        ops_attn_scores_idx_ref(s, q, h->kf, idx, n, h->d, scale);
        ops_softmax_ref(s, n);
        ops_attn_accum_idx_ref(out, s, h->vf, idx, n, h->d);
    } else {
        ops_attn_scores_ref(s, q, h->kf, n, h->d, scale);
        ops_softmax_ref(s, n);
        ops_attn_accum_ref(out, s, h->vf, n, h->d);
    }
    free(s);
}

Test(kernels, fac_and_dense_twins_match_cpu_attention)
{
    uint64_t r = 3;
    const int t = 3000, d = 64;
    const int doms[] = { 16, 2, 64 };
    for (size_t di = 0; di < 3; di++) {
        const int n_dom = doms[di];
        head_cache h = cache_make(t, d, n_dom, &r);
        float q[64], out[64], ref[64];
        for (int c = 0; c < d; c++) q[c] = 2 * nrand(&r);
        double dref[64];
        /* dense over t tokens */
        att_twin(out, q, h.kdom, h.krest, h.v, d, n_dom, NULL, t, 0);
        attn_ops_ref(ref, q, &h, NULL, t);
        attn_double_ref(dref, q, &h, NULL, t);
        double e = rel_err_f(out, ref, d), e2 = rel_err(out, dref, d);
        cr_assert_leq(e, sum_tol(t), "dense 2F=%d: %.3g from lib/ops", n_dom, e);
        cr_assert_leq(e2, sum_tol(t), "dense 2F=%d: %.3g from double", n_dom, e2);
        /* focused attention over 256 chosen tokens (every 11th), in the full cache and compact */
        int32_t idx[256];
        for (int j = 0; j < 256; j++) idx[j] = j * 11 + (int)(di * 3);
        att_twin(out, q, h.kdom, h.krest, h.v, d, n_dom, idx, 256, 0);
        attn_ops_ref(ref, q, &h, idx, 256);
        attn_double_ref(dref, q, &h, idx, 256);
        e = rel_err_f(out, ref, d), e2 = rel_err(out, dref, d);
        cr_assert_leq(e, sum_tol(256), "fac 2F=%d: %.3g from lib/ops", n_dom, e);
        cr_assert_leq(e2, sum_tol(256), "fac 2F=%d: %.3g from double", n_dom, e2);
        uint16_t *srest = malloc(sizeof(uint16_t) * 256 * (d - n_dom) + 2), *sv = malloc(sizeof(uint16_t) * 256 * d);
        for (int j = 0; j < 256; j++) {
            memcpy(srest + fasa_stage_row(0, j, 256, d - n_dom), h.krest + (size_t)idx[j] * (d - n_dom),
                   sizeof(uint16_t) * (d - n_dom));
            memcpy(sv + fasa_stage_row(0, j, 256, d), h.v + (size_t)idx[j] * d, sizeof(uint16_t) * d);
        }
        float outc[64];
        att_twin(outc, q, h.kdom, srest, sv, d, n_dom, idx, 256, 1);
        for (int c = 0; c < d; c++) cr_assert_eq(f32_bits(outc[c]), f32_bits(out[c]), "compact rows differ at %d", c);
        free(srest);
        free(sv);
        cache_free(&h);
    }
}

/* --- top-N ----------------------------------------------------------------------------------- */

/* The CPU twin of topn.cu: radix select with the shared helpers, then an ascending scan.
 * Returns k; *passes = radix passes used. */
static int topn_twin(const float *s, int t, int n, int32_t *idx, int *passes)
{
    const int k = n < t ? n : t;
    uint64_t thr = 0;
    *passes = 0;
    if (k < t) {
        uint64_t prefix = 0;
        uint32_t rank = (uint32_t)k;
        for (int pass = 0; pass < 8; pass++) {
            uint32_t hist[256] = { 0 };
            for (int i = 0; i < t; i++) {
                const uint64_t key = fasa_topn_pack(s[i], (uint32_t)i);
                if (fasa_radix_match(key, prefix, pass)) hist[fasa_radix_digit(key, pass)]++;
            }
            uint32_t rank_in, count;
            const uint32_t digit = fasa_radix_pick(hist, rank, &rank_in, &count);
            prefix = fasa_radix_prefix(prefix, digit, pass);
            rank = rank_in;
            ++*passes;
            if (count == rank_in) break;
        }
        thr = prefix;
    }
    int m = 0;
    for (int i = 0; i < t; i++)
        if (fasa_topn_pack(s[i], (uint32_t)i) >= thr) idx[m++] = i;
    cr_assert_eq(m, k, "t=%d n=%d: %d selected", t, n, m);
    return k;
}

Test(kernels, topn_packing_equals_lib_topk)
{
    uint64_t r = 9;
    const float special[] = { 0.0f, -0.0f, INFINITY, -INFINITY, 1e-40f, -1e-40f, FLT_MAX, -FLT_MAX, 1.0f, -1.0f };
    for (int i = 0; i < 200000; i++) {
        const float f = i < 10 ? special[i] : nrand(&r) * (i % 7 == 0 ? 1e30f : 1.0f);
        const uint32_t ix = (uint32_t)rng_next(&r);
        cr_assert_eq(fasa_topn_pack(f, ix), topk_pack(f, ix), "%g #%u", f, ix);
        cr_assert_eq(fasa_topn_index(fasa_topn_pack(f, ix)), ix);
    }
    /* the order: higher score first, then lower index */
    cr_assert_gt(fasa_topn_pack(1.0f, 5), fasa_topn_pack(0.5f, 0));
    cr_assert_gt(fasa_topn_pack(1.0f, 2), fasa_topn_pack(1.0f, 3));
    cr_assert_gt(fasa_topn_pack(-1.0f, 9), fasa_topn_pack(-2.0f, 0));
    cr_assert_gt(fasa_topn_pack(0.0f, 9), fasa_topn_pack(-0.0f, 0));
}

Test(kernels, topn_radix_select_equals_lib_topk)
{
    uint64_t r = 13;
    const int ts[] = { 1, 2, 7, 100, 1000, 5000, 8191 };
    float *s = malloc(sizeof(float) * 8191);
    int32_t *a = malloc(sizeof(int32_t) * 8191), *b = malloc(sizeof(int32_t) * 8191);
    uint64_t *scratch = malloc(sizeof(uint64_t) * 8191);
    int max_passes = 0;
    for (size_t ti = 0; ti < sizeof ts / sizeof *ts; ti++) {
        const int t = ts[ti];
        const int ns[] = { 1, t / 3 > 0 ? t / 3 : 1, t > 1 ? t - 1 : 1, t, t + 5, 256, 124, 1000 };
        for (int kind = 0; kind < 5; kind++) {
            /* kinds 3 and 4 take the sampled path for the small counts: TIP-like scores rising
             * towards recent rows on a coarse grid (ties straddle the cut), and one NaN among them */
            for (int i = 0; i < t; i++)
                s[i] = kind == 0 ? nrand(&r)
                       : kind == 1 ? (float)(rng_next(&r) % 4) - 1.5f             /* heavy ties */
                       : kind == 2 ? ((rng_next(&r) & 1) ? 0.0f : -0.0f)          /* only zeros of both signs */
                                   : roundf(8 * (3 * nrand(&r) + 2.0f * i / t)) / 8; /* ties at every value */
            if (kind == 4) s[t / 2] = NAN;
            for (size_t ni = 0; ni < sizeof ns / sizeof *ns; ni++) {
                int passes;
                const int k = topn_twin(s, t, ns[ni], a, &passes);
                if (k < t) b[k] = -7;   /* idx holds k: nothing is written past them */
                const int kr = topk_indices(s, t, ns[ni], b, scratch);
                cr_assert_eq(k, kr, "t=%d n=%d", t, ns[ni]);
                if (k < t) cr_assert_eq(b[k], -7, "t=%d n=%d: written past the %d picks", t, ns[ni], k);
                for (int j = 0; j < k; j++)
                    cr_assert_eq(a[j], b[j], "t=%d n=%d kind %d: [%d] %d vs lib/topk %d", t, ns[ni], kind, j, a[j],
                                 b[j]);
                if (passes > max_passes) max_passes = passes;
            }
        }
    }
    cr_assert_gt(max_passes, 4, "ties never reached the index bits (%d passes)", max_passes);
    free(s);
    free(a);
    free(b);
    free(scratch);
}

static int cmp_desc_u64(const void *a, const void *b)
{
    const uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? 1 : x > y ? -1 : 0;
}

static int cmp_asc_i32(const void *a, const void *b)
{
    const int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

/* topk_keys (the merge of the threads' picks in FASA's decode step) against a full sort: spread
 * scores, scores on a coarse grid (the keys stay distinct through their indices), every count
 * from 1 to n, and a key given twice (the quickselect's fallback). */
Test(kernels, topk_keys_equal_a_sort)
{
    uint64_t r = 21;
    enum { N = 600 };
    uint64_t key[N], sorted[N];
    int32_t idx[N], want[N];
    for (int kind = 0; kind < 3; kind++)
        for (int n = 1; n <= N; n += n < 40 ? 1 : 37) {
            const int n_index = 3 * N;
            for (int i = 0; i < n; i++) {
                const float x = kind == 1 ? roundf(4 * nrand(&r)) / 4 : nrand(&r);
                key[i] = topk_pack(x, (uint32_t)((i * 7 + 5) % n_index));   /* distinct indices */
            }
            if (kind == 2 && n > 2) key[n - 1] = key[0];
            memcpy(sorted, key, sizeof(uint64_t) * n);
            qsort(sorted, n, sizeof *sorted, cmp_desc_u64);
            for (int k = 1; k <= n + 1; k += k < 8 ? 1 : 1 + n / 5) {
                const int kk = k < n ? k : n;
                uint64_t work[3 * N];
                memcpy(work, key, sizeof(uint64_t) * n);
                const int got = topk_keys(work, n, k, n_index, idx);
                cr_assert_eq(got, kk, "kind %d n=%d k=%d: %d selected", kind, n, k, got);
                for (int j = 0; j < kk; j++) want[j] = (int32_t)topk_index(sorted[j]);
                qsort(want, kk, sizeof *want, cmp_asc_i32);
                if (kind == 2 && n > 2) {   /* outside the contract (distinct keys): the indices it
                                             * lists, ascending, are among the best (the repeated one
                                             * is listed once), and nothing is written past k */
                    for (int j = 0; j < kk && (j == 0 || idx[j] > idx[j - 1]); j++)
                        cr_assert(bsearch(&idx[j], want, kk, sizeof *want, cmp_asc_i32), "kind %d n=%d k=%d: #%d",
                                  kind, n, k, idx[j]);
                    continue;
                }
                for (int j = 0; j < kk; j++)
                    cr_assert_eq(idx[j], want[j], "kind %d n=%d k=%d: [%d] %d vs %d", kind, n, k, j, idx[j], want[j]);
            }
        }
}

/* --- FASA-M fetch addresses ------------------------------------------------------------------ */

Test(kernels, fetch_address_arithmetic)
{
    /* cold rows enumerate (layer, kv head, token) in row-major order, width apart */
    const int n_layer = 3, n_kv = 2, n_ctx = 50, width = 48;
    size_t expect = 0;
    for (int l = 0; l < n_layer; l++)
        for (int g = 0; g < n_kv; g++)
            for (int t = 0; t < n_ctx; t++, expect += width)
                cr_assert_eq(fasa_cold_row(l, g, t, n_kv, n_ctx, width), expect, "(%d, %d, %d)", l, g, t);
    expect = 0;
    for (int h = 0; h < 9; h++)
        for (int j = 0; j < 17; j++, expect += width) cr_assert_eq(fasa_stage_row(h, j, 17, width), expect);
    /* large tiers do not overflow int arithmetic */
    cr_assert_eq(fasa_cold_row(29, 2, 131071, 3, 131072, 64), (((size_t)29 * 3 + 2) * 131072 + 131071) * 64);
    int32_t idx[5] = { 7, 9, 10, 11, 20 };
    cr_assert_eq(fasa_gather_row(idx, 2, 0), 10);
    cr_assert_eq(fasa_gather_row(idx, 2, 1), 2);

    /* runs: maximal stretches of consecutive tokens that partition a sorted selection, and a
     * gather run by run (fasa_cuda_fetch_copy) equals the gather row by row (fetch_kernel) */
    uint64_t r = 17;
    uint16_t *cold = malloc(sizeof(uint16_t) * n_layer * n_kv * n_ctx * width);
    for (int i = 0; i < n_layer * n_kv * n_ctx * width; i++) cold[i] = (uint16_t)rng_next(&r);
    for (int trial = 0; trial < 200; trial++) {
        int32_t sel[50];
        int n = 0;
        const int density = 1 + trial % 5;
        for (int t = 0; t < n_ctx; t++)
            if ((int)(rng_next(&r) % 6) < density) sel[n++] = t;
        if (!n) continue;
        const int l = trial % n_layer, g = trial % n_kv;
        uint16_t by_row[50 * 48], by_run[50 * 48];
        for (int j = 0; j < n; j++)
            memcpy(by_row + fasa_stage_row(0, j, n, width), cold + fasa_cold_row(l, g, sel[j], n_kv, n_ctx, width),
                   sizeof(uint16_t) * width);
        int covered = 0;
        for (int j = 0; j < n;) {
            const int run = fasa_run_length(sel, n, j);
            cr_assert_geq(run, 1);
            for (int i = 1; i < run; i++) cr_assert_eq(sel[j + i], sel[j] + i);
            if (j + run < n) cr_assert_neq(sel[j + run], sel[j] + run, "run at %d is not maximal", j);
            memcpy(by_run + fasa_stage_row(0, j, n, width), cold + fasa_cold_row(l, g, sel[j], n_kv, n_ctx, width),
                   sizeof(uint16_t) * width * run);
            covered += run;
            j += run;
        }
        cr_assert_eq(covered, n);
        cr_assert(!memcmp(by_row, by_run, sizeof(uint16_t) * width * n), "trial %d: run gather differs", trial);
    }
    free(cold);
}

/* --- matvec ---------------------------------------------------------------------------------- */

static float matvec_twin(const uint16_t *row, const float *x, int cols)
{
    float p[32];
    for (int lane = 0; lane < 32; lane++) p[lane] = fasa_matvec_lane(row, x, cols, lane);
    return fasa_warp_sum_ref(p);
}

Test(kernels, matvec_lanes_and_butterfly_sum)
{
    uint64_t r = 19;
    const int colss[] = { 1, 8, 31, 255, 256, 576, 1000, 1536 };
    for (size_t ci = 0; ci < sizeof colss / sizeof *colss; ci++) {
        const int cols = colss[ci];
        uint16_t *w = rand_f16(cols, 0.1f, &r);
        float *x = malloc(sizeof(float) * cols);
        for (int j = 0; j < cols; j++) x[j] = nrand(&r);
        /* every column is taken by exactly one lane */
        int seen = 0;
        for (int lane = 0; lane < 32; lane++)
            for (int base = 8 * lane; base < cols; base += 256) seen += (base + 8 < cols ? base + 8 : cols) - base;
        cr_assert_eq(seen, cols);
        const float y = matvec_twin(w, x, cols);
        double want = 0, mag = 0;
        for (int j = 0; j < cols; j++) {
            const double v = (double)x[j] * fasa_f16_to_f32(w[j]);
            want += v;
            mag += fabs(v);
        }
        cr_assert_leq(fabs(y - want), (cols / 32 + 8 + 5) * 0x1p-24 * mag, "cols=%d: %.9g vs %.9g", cols, y, want);
        free(w);
        free(x);
    }
    float p[32];
    for (int i = 0; i < 32; i++) p[i] = (float)(i + 1);
    cr_assert_eq(fasa_warp_sum_ref(p), 528.0f);
}

/* --- on a device ----------------------------------------------------------------------------- */

/* A device, or the test is skipped. The line on stderr makes the skip visible by name in make
 * test's ordinary output (Criterion lists skips only with --verbose, and cr_log_warn would make
 * its exit status 1). */
static fasa_cuda *gpu_or_skip(const char *test, const char *what)
{
    char err[FASA_ERRLEN];
    fasa_cuda *cu = NULL;
    if (fasa_cuda_open(&cu, 0, err) < 0) {
        char *why = strstr(err, " (");   /* the details: fasa inspect --devices shows them */
        if (why) *why = 0;
        fprintf(stderr, "[SKIP] kernels::%s: %s: %s not run\n", test, err, what);
        cr_skip_test("%s: %s not run", err, what);
    }
    return cu;
}

static void *gpu_put(fasa_cuda *cu, const void *src, size_t bytes)
{
    char err[FASA_ERRLEN];
    void *d;
    cr_assert_eq(fasa_cuda_alloc(cu, &d, bytes, err), 0, "%s", err);
    if (src) cr_assert_eq(fasa_cuda_upload(cu, d, src, bytes, err), 0, "%s", err);
    return d;
}

static void gpu_get(fasa_cuda *cu, void *dst, const void *d, size_t bytes)
{
    char err[FASA_ERRLEN];
    cr_assert_eq(fasa_cuda_sync(cu, err), 0, "%s", err);
    cr_assert_eq(fasa_cuda_download(cu, dst, d, bytes, err), 0, "%s", err);
}

/* GQA layer for the device tests: 6 query heads over 2 KV heads, d 64, 2F 16. */
enum { G_NH = 6, G_NKV = 2, G_D = 64, G_DOM = 16, G_CTX = 2048, G_T = 1900 };

typedef struct gpu_layer {
    head_cache kv[G_NKV];
    uint16_t *kdom, *krest, *v;   /* (n_kv, n_ctx, ..) host */
    float q[G_NH * G_D];
    fasa_cuda_shape sh;
} gpu_layer;

static void layer_make(gpu_layer *L, uint64_t *r)
{
    L->sh = (fasa_cuda_shape){ G_NH, G_NKV, G_D, G_DOM, G_CTX };
    L->kdom = calloc((size_t)G_NKV * G_CTX * G_DOM, sizeof(uint16_t));
    L->krest = calloc((size_t)G_NKV * G_CTX * (G_D - G_DOM), sizeof(uint16_t));
    L->v = calloc((size_t)G_NKV * G_CTX * G_D, sizeof(uint16_t));
    for (int g = 0; g < G_NKV; g++) {
        L->kv[g] = cache_make(G_T, G_D, G_DOM, r);
        memcpy(L->kdom + (size_t)g * G_CTX * G_DOM, L->kv[g].kdom, sizeof(uint16_t) * G_T * G_DOM);
        memcpy(L->krest + (size_t)g * G_CTX * (G_D - G_DOM), L->kv[g].krest, sizeof(uint16_t) * G_T * (G_D - G_DOM));
        memcpy(L->v + (size_t)g * G_CTX * G_D, L->kv[g].v, sizeof(uint16_t) * G_T * G_D);
    }
    for (int i = 0; i < G_NH * G_D; i++) L->q[i] = 2 * nrand(r);
}

static void layer_free(gpu_layer *L)
{
    for (int g = 0; g < G_NKV; g++) cache_free(&L->kv[g]);
    free(L->kdom), free(L->krest), free(L->v);
}

static void expect_close(const float *got, const float *want, int n, double tol, const char *what)
{
    const double e = rel_err_f(got, want, n);
    cr_assert_leq(e, tol, "%s: relative error %.3g vs its CPU twin", what, e);
}

Test(kernels, gpu_tip)
{
    fasa_cuda *cu = gpu_or_skip("gpu_tip", "kernels/tip.cu");
    char err[FASA_ERRLEN];
    uint64_t r = 23;
    gpu_layer L;
    layer_make(&L, &r);
    float qdom[G_NH * G_DOM];
    for (int h = 0; h < G_NH; h++) memcpy(qdom + h * G_DOM, L.q + h * G_D, sizeof(float) * G_DOM);
    void *d_k = gpu_put(cu, L.kdom, sizeof(uint16_t) * G_NKV * G_CTX * G_DOM), *d_q = gpu_put(cu, qdom, sizeof qdom);
    void *d_s = gpu_put(cu, NULL, sizeof(float) * G_NH * G_T);
    cr_assert_eq(fasa_cuda_tip(cu, d_s, d_q, d_k, &L.sh, G_T, err), 0, "%s", err);
    float *s = malloc(sizeof(float) * G_NH * G_T), *want = malloc(sizeof(float) * G_NH * G_T);
    gpu_get(cu, s, d_s, sizeof(float) * G_NH * G_T);
    for (int h = 0; h < G_NH; h++)
        for (int i = 0; i < G_T; i++)
            want[h * G_T + i] =
                fasa_tip_score(qdom + h * G_DOM, L.kv[h / (G_NH / G_NKV)].kdom + (size_t)i * G_DOM, G_DOM);
    expect_close(s, want, G_NH * G_T, 1e-6, "tip");
    free(s), free(want);
    fasa_cuda_free(cu, d_k), fasa_cuda_free(cu, d_q), fasa_cuda_free(cu, d_s);
    layer_free(&L);
    fasa_cuda_close(cu);
}

Test(kernels, gpu_topn)
{
    fasa_cuda *cu = gpu_or_skip("gpu_topn", "kernels/topn.cu");
    char err[FASA_ERRLEN];
    uint64_t r = 29;
    const int t = 5000, nh = 3, n = 256;
    float *s = malloc(sizeof(float) * nh * t);
    for (int i = 0; i < nh * t; i++) s[i] = i < t ? nrand(&r) : (float)(rng_next(&r) % 5);   /* head 1, 2: ties */
    void *d_s = gpu_put(cu, s, sizeof(float) * nh * t), *d_i = gpu_put(cu, NULL, sizeof(int32_t) * nh * n);
    cr_assert_eq(fasa_cuda_topn(cu, d_i, d_s, nh, t, n, err), n, "%s", err);
    int32_t *got = malloc(sizeof(int32_t) * nh * n), want[256];
    uint64_t *scratch = malloc(sizeof(uint64_t) * t);
    gpu_get(cu, got, d_i, sizeof(int32_t) * nh * n);
    for (int h = 0; h < nh; h++) {
        topk_indices(s + h * t, t, n, want, scratch);
        for (int j = 0; j < n; j++) cr_assert_eq(got[h * n + j], want[j], "head %d [%d]", h, j);
    }
    free(s), free(got), free(scratch);
    fasa_cuda_free(cu, d_s), fasa_cuda_free(cu, d_i);
    fasa_cuda_close(cu);
}

/* idx (n_head, n): ascending, spread over the cache, different per head */
static void make_idx(int32_t *idx, int n, uint64_t *r)
{
    for (int h = 0; h < G_NH; h++) {
        int t = (int)(rng_next(r) % 7);
        for (int j = 0; j < n; j++) {
            idx[h * n + j] = t;
            t += 1 + (int)(rng_next(r) % 6);
        }
        cr_assert_lt(idx[h * n + n - 1], G_T);
    }
}

Test(kernels, gpu_fac)
{
    fasa_cuda *cu = gpu_or_skip("gpu_fac", "kernels/fac.cu");
    char err[FASA_ERRLEN];
    uint64_t r = 31;
    gpu_layer L;
    layer_make(&L, &r);
    const int n = 300;
    int32_t idx[G_NH * 300];
    make_idx(idx, n, &r);
    void *d_kd = gpu_put(cu, L.kdom, sizeof(uint16_t) * G_NKV * G_CTX * G_DOM);
    void *d_kr = gpu_put(cu, L.krest, sizeof(uint16_t) * G_NKV * G_CTX * (G_D - G_DOM));
    void *d_v = gpu_put(cu, L.v, sizeof(uint16_t) * G_NKV * G_CTX * G_D);
    void *d_q = gpu_put(cu, L.q, sizeof L.q), *d_i = gpu_put(cu, idx, sizeof idx);
    void *d_o = gpu_put(cu, NULL, sizeof(float) * G_NH * G_D);
    cr_assert_eq(fasa_cuda_fac(cu, d_o, d_q, d_kd, d_kr, d_v, &L.sh, d_i, n, 0, err), 0, "%s", err);
    float out[G_NH * G_D], want[G_NH * G_D];
    gpu_get(cu, out, d_o, sizeof out);
    for (int h = 0; h < G_NH; h++) {
        const head_cache *c = &L.kv[h / (G_NH / G_NKV)];
        att_twin(want + h * G_D, L.q + h * G_D, c->kdom, c->krest, c->v, G_D, G_DOM, idx + h * n, n, 0);
    }
    expect_close(out, want, G_NH * G_D, 1e-6, "fac");
    fasa_cuda_free(cu, d_kd), fasa_cuda_free(cu, d_kr), fasa_cuda_free(cu, d_v);
    fasa_cuda_free(cu, d_q), fasa_cuda_free(cu, d_i), fasa_cuda_free(cu, d_o);
    layer_free(&L);
    fasa_cuda_close(cu);
}

Test(kernels, gpu_dense)
{
    fasa_cuda *cu = gpu_or_skip("gpu_dense", "kernels/dense.cu");
    char err[FASA_ERRLEN];
    uint64_t r = 37;
    gpu_layer L;
    layer_make(&L, &r);
    void *d_kd = gpu_put(cu, L.kdom, sizeof(uint16_t) * G_NKV * G_CTX * G_DOM);
    void *d_kr = gpu_put(cu, L.krest, sizeof(uint16_t) * G_NKV * G_CTX * (G_D - G_DOM));
    void *d_v = gpu_put(cu, L.v, sizeof(uint16_t) * G_NKV * G_CTX * G_D);
    void *d_q = gpu_put(cu, L.q, sizeof L.q), *d_o = gpu_put(cu, NULL, sizeof(float) * G_NH * G_D);
    float out[G_NH * G_D], want[G_NH * G_D];
    const int ts[] = { 1, 129, G_T };
    for (int ti = 0; ti < 3; ti++) {
        cr_assert_eq(fasa_cuda_dense(cu, d_o, d_q, d_kd, d_kr, d_v, &L.sh, ts[ti], err), 0, "%s", err);
        gpu_get(cu, out, d_o, sizeof out);
        for (int h = 0; h < G_NH; h++) {
            const head_cache *c = &L.kv[h / (G_NH / G_NKV)];
            att_twin(want + h * G_D, L.q + h * G_D, c->kdom, c->krest, c->v, G_D, G_DOM, NULL, ts[ti], 0);
        }
        expect_close(out, want, G_NH * G_D, 1e-6, "dense");
    }
    fasa_cuda_free(cu, d_kd), fasa_cuda_free(cu, d_kr), fasa_cuda_free(cu, d_v);
    fasa_cuda_free(cu, d_q), fasa_cuda_free(cu, d_o);
    layer_free(&L);
    fasa_cuda_close(cu);
}

Test(kernels, gpu_fetch)
{
    fasa_cuda *cu = gpu_or_skip("gpu_fetch", "kernels/fetch.cu");
    char err[FASA_ERRLEN];
    uint64_t r = 41;
    const int n_layer = 2, n = 200, n_rest = G_D - G_DOM;
    fasa_cuda_cold cold;
    fasa_cuda_stage st;
    cr_assert_eq(fasa_cuda_cold_init(cu, &cold, n_layer, G_NKV, G_CTX, G_D, n_rest, err), 0, "%s", err);
    cr_assert_eq(fasa_cuda_stage_init(cu, &st, G_NH, n, G_D, n_rest, err), 0, "%s", err);
    for (size_t i = 0; i < (size_t)n_layer * G_NKV * G_CTX * n_rest; i++) cold.rest[i] = (uint16_t)rng_next(&r);
    for (size_t i = 0; i < (size_t)n_layer * G_NKV * G_CTX * G_D; i++) cold.v[i] = (uint16_t)rng_next(&r);
    int32_t idx[G_NH * 200];
    uint16_t *want_r = malloc(sizeof(uint16_t) * G_NH * n * n_rest),
             *want_v = malloc(sizeof(uint16_t) * G_NH * n * G_D);
    uint16_t *got_r = malloc(sizeof(uint16_t) * G_NH * n * n_rest), *got_v = malloc(sizeof(uint16_t) * G_NH * n * G_D);
    void *d_i = gpu_put(cu, NULL, sizeof idx);
    for (int layer = 0; layer < n_layer; layer++) {
        make_idx(idx, n, &r);
        for (int h = 0; h < G_NH; h++)
            for (int j = 0; j < n; j++) {
                const int g = h / (G_NH / G_NKV), tok = idx[h * n + j];
                memcpy(want_r + fasa_stage_row(h, j, n, n_rest),
                       cold.rest + fasa_cold_row(layer, g, tok, G_NKV, G_CTX, n_rest), sizeof(uint16_t) * n_rest);
                memcpy(want_v + fasa_stage_row(h, j, n, G_D), cold.v + fasa_cold_row(layer, g, tok, G_NKV, G_CTX, G_D),
                       sizeof(uint16_t) * G_D);
            }
        for (int mode = 0; mode < 2; mode++) {
            if (mode == 0) {
                cr_assert_eq(fasa_cuda_upload(cu, d_i, idx, sizeof idx, err), 0, "%s", err);
                cr_assert_eq(fasa_cuda_fetch_mapped(cu, &st, &cold, layer, G_NH, d_i, n, err), 0, "%s", err);
            } else {
                cr_assert_eq(fasa_cuda_fetch_copy(cu, &st, &cold, layer, G_NH, idx, n, err), 0, "%s", err);
                cr_assert_eq(fasa_cuda_fetch_wait(cu, &st, layer, err), 0, "%s", err);
            }
            gpu_get(cu, got_r, st.rest[layer & 1], sizeof(uint16_t) * G_NH * n * n_rest);
            gpu_get(cu, got_v, st.v[layer & 1], sizeof(uint16_t) * G_NH * n * G_D);
            cr_assert(!memcmp(got_r, want_r, sizeof(uint16_t) * G_NH * n * n_rest), "layer %d mode %d: key rows", layer,
                      mode);
            cr_assert(!memcmp(got_v, want_v, sizeof(uint16_t) * G_NH * n * G_D), "layer %d mode %d: value rows", layer,
                      mode);
            cr_assert_eq(fasa_cuda_fetch_release(cu, &st, layer, err), 0, "%s", err);
            /* clear the slot, so the other mode has to fill it again */
            memset(got_r, 0, sizeof(uint16_t) * G_NH * n * n_rest);
            memset(got_v, 0, sizeof(uint16_t) * G_NH * n * G_D);
            cr_assert_eq(fasa_cuda_upload(cu, st.rest[layer & 1], got_r, sizeof(uint16_t) * G_NH * n * n_rest, err), 0,
                         "%s", err);
            cr_assert_eq(fasa_cuda_upload(cu, st.v[layer & 1], got_v, sizeof(uint16_t) * G_NH * n * G_D, err), 0, "%s",
                         err);
        }
    }
    free(want_r), free(want_v), free(got_r), free(got_v);
    fasa_cuda_free(cu, d_i);
    fasa_cuda_stage_free(cu, &st);
    fasa_cuda_cold_free(cu, &cold);
    fasa_cuda_close(cu);
}

Test(kernels, gpu_matvec)
{
    fasa_cuda *cu = gpu_or_skip("gpu_matvec", "kernels/matvec.cu");
    char err[FASA_ERRLEN];
    uint64_t r = 43;
    const int rows = 100, cols = 576;
    uint16_t *w = rand_f16(rows * cols, 0.1f, &r);
    float *wf = decode_f16(w, rows * cols), x[576], y[100], want[100];
    for (int j = 0; j < cols; j++) x[j] = nrand(&r);
    void *d_w = gpu_put(cu, w, sizeof(uint16_t) * rows * cols), *d_wf = gpu_put(cu, wf, sizeof(float) * rows * cols);
    void *d_x = gpu_put(cu, x, sizeof x), *d_y = gpu_put(cu, NULL, sizeof y);
    cr_assert_eq(fasa_cuda_matvec_f16(cu, d_y, d_w, d_x, rows, cols, err), 0, "%s", err);
    gpu_get(cu, y, d_y, sizeof y);
    for (int i = 0; i < rows; i++) want[i] = matvec_twin(w + (size_t)i * cols, x, cols);
    expect_close(y, want, rows, 1e-6, "matvec_f16");
    cr_assert_eq(fasa_cuda_matvec_f32(cu, d_y, d_wf, d_x, rows, cols, err), 0, "%s", err);
    gpu_get(cu, y, d_y, sizeof y);
    ops_matmul_ref(want, &(weight){ GGUF_TYPE_F32, rows, cols, wf }, x, 1);
    expect_close(y, want, rows, 1e-5, "matvec_f32 (cuBLAS) vs ops_matmul_ref");
    free(w), free(wf);
    fasa_cuda_free(cu, d_w), fasa_cuda_free(cu, d_wf), fasa_cuda_free(cu, d_x), fasa_cuda_free(cu, d_y);
    fasa_cuda_close(cu);
}

Test(kernels, gpu_attend_hook)
{
    fasa_cuda *cu = gpu_or_skip("gpu_attend_hook", "kernels/attend.cu");
    char err[FASA_ERRLEN];
    uint64_t r = 47;
    const int t = 700, d = G_D;
    /* an f32 CPU cache whose values are f16-exact, so the mirror holds them exactly */
    head_cache h = cache_make(t, d, G_DOM, &r);
    fasa_cuda_kv *kv;
    cr_assert_eq(fasa_cuda_kv_open(cu, &kv, 2, G_NH, G_NKV, 1024, d, G_DOM, err), 0, "%s", err);
    float q[64], out[64], want[64];
    for (int c = 0; c < d; c++) q[c] = nrand(&r);
    /* dense, in two steps (the second mirrors only the new rows), then focused */
    for (int step = 0; step < 2; step++) {
        const int tt = step ? t : t / 2;
        cr_assert_eq(fasa_cuda_attend(kv, 1, 4, h.kf, NULL, h.vf, tt, q, NULL, 0, out, err), 0, "%s", err);
        att_twin(want, q, h.kdom, h.krest, h.v, d, G_DOM, NULL, tt, 0);
        expect_close(out, want, d, 1e-6, "attend (dense)");
    }
    int32_t idx[128];
    for (int j = 0; j < 128; j++) idx[j] = j * 5 + 1;
    cr_assert_eq(fasa_cuda_attend(kv, 1, 4, h.kf, NULL, h.vf, t, q, idx, 128, out, err), 0, "%s", err);
    att_twin(want, q, h.kdom, h.krest, h.v, d, G_DOM, idx, 128, 0);
    expect_close(out, want, d, 1e-6, "attend (fac)");
    /* a CPU cache with split keys (lib/kvcache's n_split = 2F), another layer */
    float *kd = decode_f16(h.kdom, t * G_DOM), *kr = decode_f16(h.krest, t * (d - G_DOM));
    cr_assert_eq(fasa_cuda_attend(kv, 0, 1, kd, kr, h.vf, t, q, idx, 128, out, err), 0, "%s", err);
    expect_close(out, want, d, 1e-6, "attend (fac, split keys)");
    free(kd);
    free(kr);
    fasa_cuda_kv_close(kv);
    cache_free(&h);
    fasa_cuda_close(cu);
}

/* Without a device the API says why, in one line, and never crashes. */
Test(kernels, api_without_device_reports_why)
{
    char err[FASA_ERRLEN] = "";
    fasa_cuda_device dev[4];
    const int n = fasa_cuda_devices(dev, 4, err);
    if (n > 0) cr_skip_test("a CUDA device is present (%s): the no-device path is not exercised", dev[0].name);
    cr_assert_eq(n, FASA_EUNSUPPORTED);
    if (fasa_cuda_built()) cr_assert(!strncmp(err, "no CUDA device", 14), "'%s'", err);
    else cr_assert_str_eq(err, "built without CUDA");
    fasa_cuda *cu = (fasa_cuda *)1;
    cr_assert_lt(fasa_cuda_open(&cu, 0, err), 0);
    cr_assert_null(cu);
    cr_assert(!strchr(err, '\n'));
}

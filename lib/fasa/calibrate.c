/* calibrate.c - the CA observer and the calibration driver. */
#include "calibrate.h"

#include "forward.h"
#include "topk.h"

#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------------------- top-K buckets */

/* The nested quickselects: exact, about three passes with swaps over the data per K. */
static void buckets_select(uint64_t *keys, int n, const int *ks, int n_k, uint8_t *bucket)
{
    int hi = n;
    for (int b = n_k - 1; b >= 0; b--) {
        int k = ks[b] < n ? ks[b] : n;
        if (k < hi) topk_select(keys, hi, k);
        for (int j = 0; j < k; j++) bucket[topk_index(keys[j])] = (uint8_t)b;
        hi = k;
    }
}

/* Histogram select: scores are binned linearly between their min and max (a monotone map, so
 * equal scores share a bin and bins never reorder keys); cumulative counts from the top bin
 * find, for every K at once, the bin holding the K-th largest score. Tokens above that bin are
 * in, tokens below are out, and only the few tokens inside a boundary bin are ranked exactly by
 * their packed key. Two passes over the scores for all K together. */
#define NBIN 1024

static int cmp_key_desc(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? 1 : x > y ? -1 : 0;
}

void calib_buckets(const float *score, int n, const int *ks, int n_k, uint8_t *bucket, uint64_t *scratch)
{
    float mn = 0, mx = 0;
    int bad = n <= 64 || !topk_minmax(score, n, &mn, &mx);
    const float range = mx - mn;
    uint16_t *bin = (uint16_t *)(scratch + n);
    uint32_t hist[NBIN] = { 0 };
    if (!bad) {
        const float scale = (NBIN - 1) / range;
        for (int j = 0; j < n; j++) {
            const int b = topk_bin(score[j], mn, scale, NBIN);
            bin[j] = (uint16_t)b;
            hist[b]++;
        }
    }
    if (bad) {   /* few, flat, infinite, NaN or too close scores: the exact quickselects */
        for (int j = 0; j < n; j++) bucket[j] = (uint8_t)n_k;
        for (int j = 0; j < n; j++) scratch[j] = topk_pack(score[j], (uint32_t)j);
        buckets_select(scratch, n, ks, n_k, bucket);
        return;
    }
    /* per K: its boundary bin and how many of that bin's tokens it takes */
    int bb[PROFILE_MAX_K], take[PROFILE_MAX_K];
    int x = NBIN - 1, above = 0;
    for (int b = 0; b < n_k; b++) {
        int K = ks[b] < n ? ks[b] : n;
        while (above + (int)hist[x] < K) above += hist[x--];
        bb[b] = x, take[b] = K - above;
    }
    /* tab[x]: the first K whose boundary bin lies strictly below x; boundary bins are marked */
    uint8_t tab[NBIN];
    int b = 0;
    for (int y = NBIN - 1; y >= 0; y--) {
        while (b < n_k && bb[b] >= y) b++;
        tab[y] = (uint8_t)b;
    }
    for (int b2 = 0; b2 < n_k; b2++) tab[bb[b2]] |= 0x80;
    int nl = 0;
    for (int j = 0; j < n; j++) {
        uint8_t t = tab[bin[j]];
        bucket[j] = t & 0x7f;
        if (t & 0x80) scratch[nl++] = (uint64_t)bin[j] << 48 | (uint64_t)j;   /* by bin, then index */
    }
    /* rank the boundary tokens bin by bin: packed keys in descending order */
    qsort(scratch, nl, sizeof *scratch, cmp_key_desc);
    uint64_t *list = scratch;
    for (int s = 0; s < nl;) {
        const int y = (int)(list[s] >> 48);
        int e = s;
        while (e < nl && (int)(list[e] >> 48) == y) e++;
        uint64_t *key = list + nl + s;   /* room: scratch holds 2n + 256 keys */
        for (int j = s; j < e; j++) {
            uint32_t idx = (uint32_t)(list[j] & 0xffffffffu);
            key[j - s] = topk_pack(score[idx], idx);
        }
        qsort(key, e - s, sizeof *key, cmp_key_desc);
        for (int r = 0; r < e - s; r++) {
            uint32_t idx = topk_index(key[r]);
            int bk = bucket[idx];
            for (int b2 = 0; b2 < n_k; b2++)
                if (bb[b2] == y && r < take[b2]) { bk = b2 < bk ? b2 : bk; break; }
            bucket[idx] = (uint8_t)bk;
        }
        s = e;
    }
}

void calib_buckets_ref(const float *score, int n, const int *ks, int n_k, uint8_t *bucket)
{
    uint64_t *a = malloc(sizeof *a * n);
    for (int i = 0; i < n; i++) a[i] = topk_pack(score[i], (uint32_t)i);
    qsort(a, n, sizeof *a, cmp_key_desc);
    for (int r = 0; r < n; r++) {
        int b = 0;
        while (b < n_k && r >= ks[b]) b++;
        bucket[topk_index(a[r])] = (uint8_t)b;
    }
    free(a);
}

/* ---------------------------------------------------------------- the observer */

typedef struct calib_ctx {
    const calib_opts *o;
    int n_prefill;
    int n_layer, n_head, n_kv, n_chunk, d;
    int16_t *dims;          /* (n_layer, n_kv, d) chunk c = canonical dims dims[2c], dims[2c+1] */
    uint64_t *hits;         /* (n_threads, n_k, n_layer, n_head, n_chunk) summed intersections */
    uint64_t *denom;        /* (n_threads, n_k, n_layer, n_head) summed min(K, t) */
    int n_threads;
    /* per-thread scratch, n_ctx each: full + chunk scores, buckets, select scratch */
    float **scores;
    uint8_t **buckets;
    uint64_t **sel;
    int n_ctx;
} calib_ctx;

static void on_query(void *vctx, const model *m, const run_state *s, int layer, int head, int pos,
                     const float *q)
{
    calib_ctx *c = vctx;
    /* a local layer attends over its window and never sparsely: no CA to measure there */
    if (pos < c->n_prefill || model_layer_local(&m->cfg, layer)) return;
    const int tid = omp_get_thread_num(), t = pos + 1, d = c->d, nc = c->n_chunk, nk = c->o->n_k;
    const int g = head / (c->n_head / c->n_kv);
    const float *K = kvcache_k(&s->kv, layer, g);
    const int16_t *dims = c->dims + ((size_t)layer * c->n_kv + g) * d;
    float *full = c->scores[tid], *cs = full + c->n_ctx;   /* cs: (n_chunk, n_ctx) */
    uint8_t *bf = c->buckets[tid], *bc = bf + c->n_ctx;
    uint64_t *sel = c->sel[tid];

    float qa[512], qb[512];
    for (int j = 0; j < nc; j++) qa[j] = q[dims[2 * j]], qb[j] = q[dims[2 * j + 1]];
    for (int i = 0; i < t; i++) {
        const float *k = K + (size_t)i * d;
        float sum = 0;
        for (int j = 0; j < nc; j++) {
            float v = qa[j] * k[dims[2 * j]] + qb[j] * k[dims[2 * j + 1]];
            cs[(size_t)j * c->n_ctx + i] = v;
            sum += v;
        }
        full[i] = sum;
    }
    calib_buckets(full, t, c->o->ks, nk, bf, sel);
    uint64_t *hits = c->hits + ((((size_t)tid * nk) * c->n_layer + layer) * c->n_head + head) * nc;
    const size_t kstride = (size_t)c->n_layer * c->n_head * nc;
    for (int j = 0; j < nc; j++) {
        calib_buckets(cs + (size_t)j * c->n_ctx, t, c->o->ks, nk, bc, sel);
        /* a token in both top-K_b sets counts for b and every larger K */
        uint32_t hist[PROFILE_MAX_K + 1] = { 0 };
        for (int i = 0; i < t; i++) {
            int b = bf[i] > bc[i] ? bf[i] : bc[i];
            hist[b]++;
        }
        uint32_t acc = 0;
        for (int b = 0; b < nk; b++) {
            acc += hist[b];
            hits[b * kstride + j] += acc;
        }
    }
    uint64_t *den = c->denom + (((size_t)tid * nk) * c->n_layer + layer) * c->n_head + head;
    for (int b = 0; b < nk; b++) den[(size_t)b * c->n_layer * c->n_head] += c->o->ks[b] < t ? c->o->ks[b] : t;
}

/* ---------------------------------------------------------------- driver */

calib_opts calib_defaults(const model *m)
{
    calib_opts o = { 0 };
    static const int ks[] = { 64, 128, 256, 512, 1024, 2048 };
    o.n_k = 6;
    memcpy(o.ks, ks, sizeof ks);
    o.rank_k = 256;
    o.fcs = profile_default_fcs(m->cfg.d_head);
    o.chunks = CHUNKS_PLANE;
    o.n_prefill = -1;            /* default: all but the last 256 tokens */
    return o;
}

int calibrate_run(const model *m, const int32_t *ids, int n, const calib_opts *o, profile *p, char *err)
{
    const model_config *cf = &m->cfg;
    int n_prefill = o->n_prefill >= 0 ? o->n_prefill : n - 256;
    if (n_prefill < 1) n_prefill = n / 2;
    if (n < 2 || n_prefill >= n)
        return fasa_error(err, FASA_EARG, "the sample (%d tokens) must be longer than the prefill (%d)", n, n_prefill);
    if (o->n_k < 1 || o->n_k > PROFILE_MAX_K)
        return fasa_error(err, FASA_EARG, "between 1 and %d values of K", PROFILE_MAX_K);
    for (int b = 0; b < o->n_k; b++)
        if (o->ks[b] < 1 || (b && o->ks[b] <= o->ks[b - 1]))
            return fasa_error(err, FASA_EARG, "K values must be positive and increasing");

    memset(p, 0, sizeof *p);
    snprintf(p->arch, sizeof p->arch, "%s", fasa_arch_name(cf->arch));
    p->sliding_window = cf->sliding_window, p->swa_period = cf->swa_period;
    p->n_layer = cf->n_layer, p->n_head = cf->n_head, p->n_kv_head = cf->n_kv_head;
    p->d_head = cf->d_head, p->n_chunk = cf->d_head / 2;
    p->qk_hash = profile_model_hash(m);
    p->chunks = o->chunks;
    p->sample_hash = o->sample_hash;
    p->n_tokens = n, p->n_prefill = n_prefill, p->n_steps = n - n_prefill;
    p->n_k = o->n_k;
    memcpy(p->ks, o->ks, sizeof p->ks);
    p->rank_k = o->rank_k;
    p->fcs = o->fcs;
    if (profile_k_index(p, p->rank_k) < 0)
        return fasa_error(err, FASA_EARG, "the ranking K (%d) must be one of the K values", p->rank_k);
    if (p->fcs < 1 || p->fcs > p->n_chunk)
        return fasa_error(err, FASA_EARG, "F must be between 1 and %d chunks", p->n_chunk);
    int rc = profile_alloc(p, err);
    if (rc < 0) return rc;

    const int n_batch = 64;
    run_state *s = run_state_new(m, n, n_batch, err);
    if (!s) { profile_free(p); return FASA_ENOMEM; }
    calib_ctx c = { .o = o, .n_prefill = n_prefill, .n_layer = cf->n_layer, .n_head = cf->n_head,
                    .n_kv = cf->n_kv_head, .n_chunk = p->n_chunk, .d = cf->d_head,
                    .n_threads = s->n_threads, .n_ctx = n };
    const size_t per = (size_t)o->n_k * cf->n_layer * cf->n_head;
    c.dims = malloc(sizeof(int16_t) * cf->n_layer * cf->n_kv_head * cf->d_head);
    c.hits = calloc((size_t)c.n_threads * per * p->n_chunk, sizeof *c.hits);
    c.denom = calloc((size_t)c.n_threads * per, sizeof *c.denom);
    c.scores = calloc(c.n_threads, sizeof *c.scores);
    c.buckets = calloc(c.n_threads, sizeof *c.buckets);
    c.sel = calloc(c.n_threads, sizeof *c.sel);
    int ok = c.dims && c.hits && c.denom && c.scores && c.buckets && c.sel;
    for (int t = 0; ok && t < c.n_threads; t++) {
        c.scores[t] = malloc(sizeof(float) * (p->n_chunk + 1) * (size_t)n);
        c.buckets[t] = malloc(2 * (size_t)n);
        c.sel[t] = malloc(sizeof(uint64_t) * (2 * (size_t)n + 256));
        ok = c.scores[t] && c.buckets[t] && c.sel[t];
    }
    if (!ok) {
        rc = fasa_error(err, FASA_ENOMEM, "out of memory for calibration scratch");
        goto out;
    }
    for (int l = 0; l < cf->n_layer; l++)
        for (int g = 0; g < cf->n_kv_head; g++)
            profile_chunk_dims(m, l, g, o->chunks, c.dims + ((size_t)l * cf->n_kv_head + g) * cf->d_head);

    /* the dense prefix, then the decode steps with the observer */
    if ((rc = model_prefill(m, s, ids, n_prefill, NULL, err)) < 0) goto out;
    if (o->progress) o->progress(o->progress_ctx, n_prefill, n);
    attn_obs obs = { on_query, &c };
    s->obs = &obs;
    for (int i = n_prefill; i < n; i += n_batch) {
        int nb = n - i < n_batch ? n - i : n_batch;
        if ((rc = model_forward(m, s, ids + i, nb, 0, err)) < 0) goto out;
        if (o->progress) o->progress(o->progress_ctx, i + nb, n);
    }

    /* mean CA = sum of intersections / sum of K (each capped at t) */
    for (size_t b = 0; b < per; b++) {
        uint64_t den = 0;
        for (int t = 0; t < c.n_threads; t++) den += c.denom[t * per + b];
        for (int j = 0; j < p->n_chunk; j++) {
            uint64_t h = 0;
            for (int t = 0; t < c.n_threads; t++) h += c.hits[(t * per + b) * p->n_chunk + j];
            p->ca[b * p->n_chunk + j] = den ? (double)h / den : 0;
        }
    }
    profile_rank_all(p);
    rc = 0;
out:
    for (int t = 0; c.scores && t < c.n_threads; t++) free(c.scores[t]);
    for (int t = 0; c.buckets && t < c.n_threads; t++) free(c.buckets[t]);
    for (int t = 0; c.sel && t < c.n_threads; t++) free(c.sel[t]);
    free(c.scores); free(c.buckets); free(c.sel); free(c.dims); free(c.hits); free(c.denom);
    run_state_free(s);
    if (rc < 0) profile_free(p);
    return rc;
}

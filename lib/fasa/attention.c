/* attention.c - the attention step of one layer: the batch's rotated queries (s->q) against the
 * cache, which already holds the batch's keys and values; writes s->att_out. The step picks one
 * of four paths, once per layer (attn_path_of), and every path lives here or in fasa_decode.c. */
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attn_impl.h"
#include "ops.h"

enum attn_path {
    ATTN_DENSE_BATCH,   /* several queries, none sparse: per head, all of them in one pass over the cache */
    ATTN_DENSE_DECODE,  /* one query, every head dense: by KV group, the sequence cut into parts */
    ATTN_FASA_DECODE,   /* one query, FASA over the dominant key block with forced rows (fasa_decode.c) */
    ATTN_PER_QUERY,     /* anything else: each (query, head) asks the policy for its rows and attends */
};

struct attn_work *attn_work_new(const model *m, int n_ctx, int n_batch, int split, int n_threads, char *err)
{
    const model_config *c = &m->cfg;
    struct attn_work *w = calloc(1, sizeof *w);
    if (!w) return fasa_error(err, FASA_ENOMEM, "out of memory"), NULL;
    const size_t T = n_threads, N = n_ctx, grp = c->n_head / c->n_kv_head;
    *w = (struct attn_work){ .n_threads = n_threads, .n_ctx = n_ctx, .n_batch = n_batch, .grp = (int)grp,
                             .d_head = c->d_head };
    w->scores = malloc(T * N * sizeof(float));
    w->tmp = malloc(T * N * sizeof(float));
    w->dscores = malloc(T * 2 * grp * N * sizeof(float));
    /* two score blocks per thread with split keys: the dominant block's and the rest's */
    w->bscores = n_batch > 1 ? malloc(T * (split ? 2 : 1) * n_batch * N * sizeof(float)) : NULL;
    w->dpart = malloc((size_t)c->n_kv_head * DECODE_PARTS * grp * (c->d_head + 2) * sizeof(float));
    w->vmean = malloc((size_t)c->n_kv_head * c->d_head * sizeof(float));
    if (!w->scores || !w->tmp || !w->dscores || !w->dpart || !w->vmean || (n_batch > 1 && !w->bscores)) {
        attn_work_free(w);
        return fasa_error(err, FASA_ENOMEM, "out of memory for attention over %d tokens", n_ctx), NULL;
    }
    return w;
}

void attn_work_free(struct attn_work *w)
{
    if (!w) return;
    free(w->scores); free(w->tmp); free(w->dscores); free(w->bscores); free(w->dpart); free(w->vmean);
    free(w);
}

int attention_use_policy(run_state *s, policy *p, int sparse_from, char *err)
{
    if (p && policy_reserve(p, s->n_ctx, s->n_threads, err) < 0) return FASA_ENOMEM;
    s->policy = p;
    s->sparse_from = sparse_from;
    return 0;
}

static inline void count_bytes(run_state *s, uint64_t b) { s->bytes_kv[8 * omp_get_thread_num()] += b; }

/* Exact attention of one query over the cached rows idx[0..n) (idx NULL: row0..row0+n-1) of one
 * KV head; leaves the softmax weights in scores. With split keys a score is the dominant block's
 * dot product plus the rest's (tmp: n floats). */
static void attend(float *out, const float *q, const kvcache *kv, int l, int g, const int32_t *idx, int row0, int n,
                   float *scores, float *tmp)
{
    const int d = kv->d_head, ns = kv->n_split;
    const float scale = 1.0f / sqrtf((float)d);
    if (idx) kvcache_prefetch(kv, l, g, idx, n), row0 = 0;
    kvcache_scores(kv, KV_KEYS, l, g, row0, idx, n, q, 1, d, scale, scores, n);
    if (ns) {
        kvcache_scores(kv, KV_REST, l, g, row0, idx, n, q + ns, 1, d, scale, tmp, n);
        for (int i = 0; i < n; i++) scores[i] += tmp[i];
    }
    ops_softmax(scores, n);
    kvcache_accum(kv, l, g, row0, idx, n, scores, 1, NULL, out, d);
}

/* The first row a query at pos may see: 0, or the start of a local layer's sliding window. */
static inline int window_start(const model *m, int l, int pos)
{
    const int w = m->cfg.sliding_window;
    return model_layer_local(&m->cfg, l) && pos + 1 > w ? pos + 1 - w : 0;
}

/* The tail's offset (attn_tail): how far the exact logits of the rows of [lo, hi) left unchosen
 * sit above TIP's estimates scale tip[row]. how = 1: the chosen rows' mean offset (S: their
 * exact logits). how = 2: a ratio estimate over TAIL_SAMPLE rows evenly spaced in [lo, hi) that
 * TIP scored below every chosen row (so none is chosen), the log of their exact exps' sum less
 * that of their estimates' (without such rows, as 1). The chosen rows, TIP's highest, are a
 * biased sample: on the calibration text 1 puts the tail's mass at about 0.7x the exact (the
 * median over heads and steps) and 2 at 0.95x, yet 2 is the farther from full attention at N =
 * 256, the default (docs/results.md, Accuracy). *rows: the rows read here. */
#define TAIL_SAMPLE 32
static float tail_offset(const kvcache *kv, int l, int g, const float *q, const float *S, const int32_t *idx, int n,
                         const float *tip, int lo, int hi, float scale, int how, int *rows)
{
    double dc = 0;
    int k = 0, m = 0;
    float th = INFINITY;
    for (int i = 0; i < n; i++)
        if (idx[i] >= lo && idx[i] < hi) dc += S[i] - scale * tip[idx[i]], k++, th = fminf(th, tip[idx[i]]);
    *rows = 0;
    const float mean = k ? (float)(dc / k) : 0;
    int32_t r[TAIL_SAMPLE];
    const int64_t len = hi - lo;
    for (int j = 0; how == 2 && len > 0 && j < TAIL_SAMPLE; j++) {
        const int row = lo + (int)((2 * j + 1) * len / (2 * TAIL_SAMPLE));
        if (tip[row] < th && (!m || row != r[m - 1])) r[m++] = row;
    }
    if (!m) return mean;
    float E[2 * TAIL_SAMPLE], mx = -INFINITY;
    kvcache_prefetch_parts(kv, KV_KEYS, KV_REST, l, g, r, m);
    kvcache_scores(kv, KV_KEYS, l, g, 0, r, m, q, 1, 0, scale, E, m);
    if (kv->n_split) {
        kvcache_scores(kv, KV_REST, l, g, 0, r, m, q + kv->n_split, 1, 0, scale, E + m, m);
        for (int j = 0; j < m; j++) E[j] += E[m + j];
    }
    for (int j = 0; j < m; j++) mx = fmaxf(mx, fmaxf(E[j], scale * tip[r[j]]));
    double exact = 0, est = 0;
    for (int j = 0; j < m; j++) exact += exp(E[j] - mx), est += exp(scale * tip[r[j]] - mx);
    *rows = m;
    return (float)log(exact / est);
}

/* Unnormalised attention of nq queries (ldq apart) over rows [a, a + len) or idx[0..len): each
 * query's max score, sum of exp and weighted values go to part (stride d + 2), to be merged.
 * With tip (one query, idx): *c, the tail's offset (tail_offset, by how; *rows, the rows it read). */
static void attend_part(float *part, const float *Q, int nq, int ldq, const kvcache *kv, int l, int g, int a,
                        const int32_t *idx, int len, float *S, float *T, const float *tip, int lo, int hi, int how,
                        float *c, int *rows)
{
    const int d = kv->d_head, ns = kv->n_split;
    const float scale = 1.0f / sqrtf((float)d);
    if (len <= 0) {
        for (int h = 0; h < nq; h++) part[h * (d + 2)] = -INFINITY, part[h * (d + 2) + 1] = 0;
        return;
    }
    if (idx) kvcache_prefetch(kv, l, g, idx, len);
    kvcache_scores(kv, KV_KEYS, l, g, a, idx, len, Q, nq, ldq, scale, S, len);
    if (ns) {
        kvcache_scores(kv, KV_REST, l, g, a, idx, len, Q + ns, nq, ldq, scale, T, len);
        for (int i = 0; i < nq * len; i++) S[i] += T[i];
    }
    if (tip) *c = tail_offset(kv, l, g, Q, S, idx, len, tip, lo, hi, scale, how, rows);
    for (int h = 0; h < nq; h++) {
        float *row = S + (size_t)h * len, mx = row[0], sum = 0;
        for (int i = 1; i < len; i++) mx = row[i] > mx ? row[i] : mx;
        for (int i = 0; i < len; i++) row[i] -= mx;
        ops_exp(row, row, len);
        for (int i = 0; i < len; i++) sum += row[i];
        part[h * (d + 2)] = mx, part[h * (d + 2) + 1] = sum;
    }
    if (nq == 1) {
        kvcache_accum(kv, l, g, a, idx, len, S, 1, NULL, part + 2, d);
        return;
    }
    float out[8 * 1024];   /* (nq, d): nq <= 8, d <= 1024 (attn_path_of) */
    kvcache_accum(kv, l, g, a, idx, len, S, nq, NULL, out, d);
    for (int h = 0; h < nq; h++) memcpy(part + h * (d + 2) + 2, out + (size_t)h * d, sizeof(float) * d);
}

static float *dpart_slot(const run_state *s, int g, int p, int h)
{
    const struct attn_work *w = s->attn;
    return w->dpart + (((size_t)g * DECODE_PARTS + p) * w->grp + h) * (w->d_head + 2);
}

void attn_rows(const model *m, run_state *s, int l, int g, int p, int a, int b)
{
    const struct attn_work *w = s->attn;
    const int d = m->cfg.d_head, tid = omp_get_thread_num();
    float *S = w->dscores + (size_t)tid * 2 * w->grp * w->n_ctx;
    attend_part(dpart_slot(s, g, p, 0), s->q + (size_t)g * w->grp * d, w->grp, d, &s->kv, l, g, a, NULL, b - a, S,
                S + (size_t)w->grp * w->n_ctx, NULL, 0, 0, 0, NULL, NULL);
    if (b > a) count_bytes(s, (uint64_t)(b - a) * 2 * d * kvcache_esz(&s->kv));
}

/* The tail's values by block (attn_tail with vpre): zb, the estimated mass of each block of B
 * rows from lo / B on (ops_exp_sum_blocks), less its chosen rows', times the block's mean value,
 * summed into out; the mass of the rows past the nb whole blocks times vmean. */
static void tail_block_values(float *out, int d, const float *vmean, const float *vpre, int nb, double *zb,
                              const float *S, int lo, int hi, const int32_t *idx, int n, float mx, float scale)
{
    const int B = KVCACHE_VSUM_ROWS, b0 = lo / B, b1 = (hi - 1) / B + 1, bw = b1 < nb ? b1 : nb;
    float e[256];   /* the chosen rows' exps, a vector at a time */
    int32_t at[256];
    for (int k0 = 0; k0 < n; k0 += 256) {
        int m = 0;
        for (int k = k0; k < n && k < k0 + 256; k++)
            if (idx[k] >= lo && idx[k] < hi) at[m] = idx[k], e[m++] = scale * (S[idx[k]] - mx);
        ops_exp(e, e, m);
        for (int k = 0; k < m; k++) zb[at[k] / B - b0] -= e[k];
    }
    double rest = 0;
    for (int b = bw; b < b1; b++) rest += zb[b - b0];
    /* sum_b w_b (P_b - P_{b-1}) over the running sums P, as sum_b (w_b - w_{b+1}) P_b: one
     * weighted sum of the rows P_{b0-1} .. P_{bw-1} */
    const int first = b0 ? b0 - 1 : 0, rows = bw - first;
    float coef[rows], w = 0;
    for (int b = bw - 1; b >= b0; b--) {
        const float next = zb[b - b0] > 0 ? (float)(zb[b - b0] / B) : 0;
        coef[b - first] = next - w, w = next;
    }
    if (b0) coef[0] = -w;
    ops_attn_accum(out, coef, vpre + (size_t)first * d, rows, d);
    if (rest > 0)
        for (int j = 0; j < d; j++) out[j] += (float)rest * vmean[j];
}

/* The estimated mass of S[lo, hi) under mx: by blocks into zb when it is non-NULL. */
static double tail_mass(double *zb, const float *S, int lo, int hi, float mx, float scale)
{
    return zb ? ops_exp_sum_blocks(zb, S, lo, hi, KVCACHE_VSUM_ROWS, mx, scale)
              : ops_exp_sum_est(S + lo, hi - lo, mx, scale);
}

void attn_tail(float *part, int d, const float *vmean, const float *vpre, int nb, const float *S, int lo, int hi,
               const int32_t *idx, int n, float c)
{
    const float scale = 1.0f / sqrtf((float)d);
    part[0] = -INFINITY, part[1] = 0;   /* empty until it holds mass */
    memset(part + 2, 0, sizeof(float) * d);
    if (hi - lo <= 0) return;
    /* by block when a whole block holds rows of [lo, hi): 8 bytes of mass per 64 rows */
    const int by_block = vpre && nb > lo / KVCACHE_VSUM_ROWS;
    double zbuf[by_block ? (hi - 1) / KVCACHE_VSUM_ROWS - lo / KVCACHE_VSUM_ROWS + 1 : 1], *zb = by_block ? zbuf : NULL;
    /* the max of [lo, hi) is TIP's first pick: among the chosen rows unless they were reranked,
     * when a pass of its own finds it */
    float mx = -INFINITY;
    for (int k = 0; k < n; k++)
        if (idx[k] >= lo && idx[k] < hi && S[idx[k]] > mx) mx = S[idx[k]];
    double all = mx > -INFINITY ? tail_mass(zb, S, lo, hi, mx, scale) : -1, chosen = 0;   /* none chosen */
    if (all < 0) mx = ops_max(S + lo, hi - lo), all = tail_mass(zb, S, lo, hi, mx, scale);
    float buf[256];   /* the chosen rows' scores, gathered to take the same estimate a vector at a time */
    int b = 0;
    for (int k = 0; k < n; k++) {
        if (idx[k] >= lo && idx[k] < hi) buf[b++] = S[idx[k]];
        if (b == 256) chosen += ops_exp_sum_est(buf, b, mx, scale), b = 0;
    }
    chosen += ops_exp_sum_est(buf, b, mx, scale);
    const double z = all - chosen;
    if (!(z > 1e-5 * all)) return;   /* nothing left, or the trace of the estimate's error (3e-6 an exp) */
    part[0] = mx * scale + c, part[1] = (float)z;
    if (zb)
        tail_block_values(part + 2, d, vmean, vpre, nb, zb, S, lo, hi, idx, n, mx, scale);
    else
        for (int j = 0; j < d; j++) part[2 + j] = (float)z * vmean[j];
}

void attn_chosen(const model *m, run_state *s, int l, int h, const int32_t *idx, int n, int lo, int hi)
{
    const struct attn_work *w = s->attn;
    const policy *p = s->policy;
    const int d = m->cfg.d_head, g = h / w->grp, tid = omp_get_thread_num();
    const float *tip = p->o.tail ? p->tip + (size_t)h * p->tip_ld : NULL, *q = s->q + (size_t)h * d;
    float c = 0, *tmp = w->tmp + (size_t)tid * w->n_ctx;
    int sampled = 0;
    attend_part(dpart_slot(s, g, 2, h % w->grp), q, 1, d, &s->kv, l, g, 0, idx, n, w->scores + (size_t)tid * w->n_ctx,
                tmp, tip, lo, hi, p->o.tail, &c, &sampled);
    if (tip) {
        int nb = 0;
        const float *vpre = p->o.tail_blocks ? kvcache_value_prefix(&s->kv, l, g, s->n_past + 1, &nb) : NULL;
        attn_tail(dpart_slot(s, g, 3, h % w->grp), d, w->vmean + (size_t)g * d, vpre, nb, tip, lo, hi, idx, n, c);
    }
    count_bytes(s, ((uint64_t)n * 2 + sampled) * d * kvcache_esz(&s->kv));
}

/* P partials (max, sum of exps, weighted values: d + 2 floats each, stride apart; a sum of 0 is
 * empty) merged into out as one softmax; returns 1 / the merged sum, and *mx the merged max: a
 * partial's exps times exp(its max - *mx) / that sum are softmax weights. */
static float parts_merge(float *out, const float *part, size_t stride, int P, int d, float *mx_out)
{
    float mx = -INFINITY, sum = 0;
    for (int p = 0; p < P; p++) mx = part[p * stride] > mx ? part[p * stride] : mx;
    memset(out, 0, sizeof(float) * d);
    for (int p = 0; p < P; p++) {
        const float *pt = part + p * stride;
        if (pt[1] == 0) continue;
        const float wt = expf(pt[0] - mx);
        sum += wt * pt[1];
        for (int j = 0; j < d; j++) out[j] += wt * pt[2 + j];
    }
    const float inv = 1.0f / sum;
    for (int j = 0; j < d; j++) out[j] *= inv;
    *mx_out = mx;
    return inv;
}

void attn_merge(const model *m, run_state *s, int P)
{
    const model_config *c = &m->cfg;
    const int d = c->d_head, grp = c->n_head / c->n_kv_head;
    float mx;
    for (int g = 0; g < c->n_kv_head; g++)
        for (int h = 0; h < grp; h++)
            parts_merge(s->att_out + (size_t)(g * grp + h) * d, dpart_slot(s, g, 0, h), (size_t)grp * (d + 2), P, d,
                        &mx);
}

/* Dense attention of queries r0..r1-1 of a batch (positions n_past + r) for head h, in one pass
 * over the cache: every key and value row is read once for all of them. Calls the observer and
 * updates the statistics per query, as the per-query path does. */
static void attend_batch(const model *m, run_state *s, int l, int h, int r0, int r1)
{
    const model_config *c = &m->cfg;
    const kvcache *kv = &s->kv;
    const struct attn_work *w = s->attn;
    const int d = c->d_head, qd = c->n_head * d, g = h / w->grp, ns = kv->n_split;
    const int nq = r1 - r0, t = s->n_past + r1;   /* the last query sees t keys */
    const float scale = 1.0f / sqrtf((float)d);
    const float *Q = s->q + (size_t)r0 * qd + (size_t)h * d;
    const size_t blk = (size_t)w->n_batch * w->n_ctx;
    float *S = w->bscores + (size_t)omp_get_thread_num() * blk * (ns ? 2 : 1), *T = S + blk;
    kvcache_scores(kv, KV_KEYS, l, g, 0, NULL, t, Q, nq, qd, scale, S, t);
    if (ns) {
        kvcache_scores(kv, KV_REST, l, g, 0, NULL, t, Q + ns, nq, qd, scale, T, t);
        for (size_t i = 0; i < (size_t)nq * t; i++) S[i] += T[i];
    }
    int len[512];
    for (int i = 0; i < nq; i++) {
        const int pos = s->n_past + r0 + i;
        len[i] = pos + 1;
        if (s->obs && s->obs->on_query) s->obs->on_query(s->obs->ctx, m, s, l, h, pos, Q + (size_t)i * qd);
        ops_softmax(S + (size_t)i * t, len[i]);
        if (s->stats) attn_stats_observe(s->stats, l, h, pos, S + (size_t)i * t, NULL, 0, len[i]);
        count_bytes(s, (uint64_t)len[i] * 2 * d * kvcache_esz(kv));
    }
    kvcache_accum(kv, l, g, 0, NULL, t, S, nq, len, s->att_out + (size_t)r0 * qd + (size_t)h * d, qd);
}

/* A KV group's heads over a long cache, queries r0..r1 of the batch: flash attention
 * (ops_attn_flash: key tiles read once for the group's heads, a running max and sum per query,
 * the queries in the vector lanes), whose tiles of scores and values stay in L2, instead of each
 * head's whole rows of scores written and read back from memory by attend_batch. Used from
 * ATTN_TILED_FROM keys on, when no statistic needs each query's weights; 0 when done, -1
 * (nothing done) when the kernel does not take the shape or the build has none. */
enum { ATTN_TILED_FROM = 2048 };

static int attend_group_flash(const model *m, run_state *s, int l, int g, int r0, int r1)
{
    const model_config *c = &m->cfg;
    const kvcache *kv = &s->kv;
    const struct attn_work *w = s->attn;
    const int d = c->d_head, qd = c->n_head * d, h0 = g * w->grp, nq = r1 - r0, t = s->n_past + r1;
    const float *Q = s->q + (size_t)r0 * qd + (size_t)h0 * d;
    float *work = w->bscores + (size_t)omp_get_thread_num() * w->n_batch * w->n_ctx * (kv->n_split ? 2 : 1);
    int len[64];   /* nq <= 64: batch_tiled */
    for (int i = 0; i < nq; i++) len[i] = s->n_past + r0 + i + 1;
    if (ops_attn_flash(s->att_out + (size_t)r0 * qd + (size_t)h0 * d, qd, Q, nq, qd, w->grp, d, kvcache_k(kv, l, g),
                       kvcache_v(kv, l, g), kv->f16, t, len, d, 1.0f / sqrtf((float)d), work) < 0)
        return -1;
    for (int h = h0; h < h0 + w->grp; h++)
        for (int i = 0; i < nq; i++) {
            if (s->obs && s->obs->on_query)
                s->obs->on_query(s->obs->ctx, m, s, l, h, len[i] - 1, Q + (size_t)i * qd + (size_t)(h - h0) * d);
            count_bytes(s, (uint64_t)len[i] * 2 * d * kvcache_esz(kv));
        }
    return 0;
}

/* A batch of n queries in `halves` parts takes the flash path: a long cache, parts the kernel
 * takes, keys in one part, room for its scratch, and no statistic that adds up each query's
 * weights (H2O's, or SnapKV's votes for a query in its window). What the kernel may still refuse
 * (head dims, group size, a build without AVX2) is the same for every part. */
static int batch_tiled(const model *m, const run_state *s, int n, int halves)
{
    const attn_stats *st = s->stats;
    const struct attn_work *w = s->attn;
    const int p0 = s->n_past, p1 = s->n_past + n;
    if (p1 < ATTN_TILED_FROM || (n + halves - 1) / halves > 64 || s->kv.n_split || (st && st->h2o) ||
        ops_attn_flash_floats(w->grp, m->cfg.d_head) > (size_t)w->n_batch * w->n_ctx)
        return 0;
    return !(st && st->votes && p0 < st->snap_hi && p1 > st->snap_lo);
}

/* Exact attention of head h's query at pos over its chosen rows idx[0..n) (the forced ones among
 * them) and the tail of the rest (attn_tail; S: the head's TIP scores of every row), as the fast
 * path computes them; leaves the chosen rows' softmax weights in scores. */
static void attend_tail(float *out, const model *m, run_state *s, int l, int h, int pos, const int32_t *idx, int n,
                        const float *S, float *scores, float *tmp)
{
    const policy *p = s->policy;
    const int d = m->cfg.d_head, g = h / (m->cfg.n_head / m->cfg.n_kv_head), t = pos + 1;
    int lo, hi, sampled = 0;
    float part[2][1026], vmean[1024], c = 0;   /* d <= 1024 */
    if (!policy_forced(&p->o, t, policy_layer_budget(&p->o, l), &lo, &hi)) lo = hi = 0;   /* no room: no tail */
    attend_part(part[0], s->q + (size_t)(pos - s->n_past) * m->cfg.n_head * d + (size_t)h * d, 1, d, &s->kv, l, g, 0,
                idx, n, scores, tmp, S, lo, hi, p->o.tail, &c, &sampled);
    count_bytes(s, (uint64_t)sampled * d * kvcache_esz(&s->kv));
    kvcache_value_mean(&s->kv, l, g, t, vmean);
    int nb = 0;
    const float *vpre = p->o.tail_blocks ? kvcache_value_prefix(&s->kv, l, g, t, &nb) : NULL;
    attn_tail(part[1], d, vmean, vpre, nb, S, lo, hi, idx, n, c);
    float mx;
    const float w = parts_merge(out, part[0], 1026, 2, d, &mx) * expf(part[0][0] - mx);
    for (int i = 0; i < n; i++) scores[i] *= w;   /* the chosen rows' weights, as attend leaves them */
}

/* The per-query path: each (query, head) of the batch asks the policy for its rows (or attends
 * densely) and attends to them; observers and statistics see every query. With tip, the policy
 * finds this step's TIP scores already in p->tip. Returns < 0 when the attention hook failed. */
static int attend_each(const model *m, run_state *s, int l, int n, int tip, char *err)
{
    const model_config *c = &m->cfg;
    const struct attn_work *w = s->attn;
    policy *p = s->policy;
    const int H = c->n_head, dh = c->d_head, qd = H * dh;
    const size_t esz = kvcache_esz(&s->kv);
    int hook_failed = 0;
    char hook_err[FASA_ERRLEN] = "";
#pragma omp parallel for schedule(dynamic, 1) num_threads(ops_threads())
    for (int ih = 0; ih < n * H; ih++) {
        const int i = ih / H, h = ih % H, g = h / w->grp, pos = s->n_past + i, tid = omp_get_thread_num();
        const float *q = s->q + (size_t)i * qd + h * dh;
        float *scores = w->scores + (size_t)tid * w->n_ctx, *tmp = w->tmp + (size_t)tid * w->n_ctx;
        float *out = s->att_out + (size_t)i * qd + h * dh;
        if (s->obs && s->obs->on_query) s->obs->on_query(s->obs->ctx, m, s, l, h, pos, q);
        int n_sel = -1;
        int32_t *idx = NULL;
        if (p && pos >= s->sparse_from) {
            idx = p->idx + (size_t)tid * p->n_ctx;
            policy_scratch sc = { p->score + (size_t)tid * p->n_ctx, p->keys + (size_t)tid * p->n_ctx,
                                  tip ? p->tip + (size_t)h * p->tip_ld : NULL,
                                  p->rr ? p->rr + (size_t)tid * POLICY_RR_FLOATS(p->n_ctx) : NULL, p->n_ctx };
            n_sel = policy_select(p, s, s->stats, l, h, pos, s->q + (size_t)i * qd, policy_layer_budget(&p->o, l), idx,
                                  &sc);
            if (n_sel >= 0) policy_count(p, tid, n_sel);
            /* TIP's bytes: the block once per KV group when the group scored together */
            if (n_sel >= 0 && (!tip || h % w->grp == 0))
                count_bytes(s, attn_select_bytes(p, &s->kv, l, h / w->grp, pos + 1));
        }
        /* dense: every row to pos, or a local layer's window of them */
        const int row0 = n_sel < 0 ? window_start(m, l, pos) : 0, rows = n_sel < 0 ? pos + 1 - row0 : n_sel;
        if (n_sel < 0) idx = NULL;
        if (s->attend_hook) {
            char herr[FASA_ERRLEN];
            int32_t *win = NULL;   /* the hook takes rows as a list when they do not start at 0 */
            if (!idx && row0 && (win = malloc(sizeof *win * rows)))
                for (int j = 0; j < rows; j++) win[j] = row0 + j;
            if ((!idx && row0 && !win) ||
                s->attend_hook(s->attend_ctx, s, l, h, pos, q, win ? win : idx, rows, out, herr) < 0) {
#pragma omp critical(fasa_hook_err)
                if (!hook_failed)
                    hook_failed = 1,
                    snprintf(hook_err, sizeof hook_err, "%s", win || idx || !row0 ? herr : "out of memory");
            }
            free(win);
        } else if (idx && p->o.tail && p->o.kind == POLICY_FASA) {
            attend_tail(out, m, s, l, h, pos, idx, rows, tip ? p->tip + (size_t)h * p->tip_ld : p->score +
                        (size_t)tid * p->n_ctx, scores, tmp);
            if (s->stats) attn_stats_observe(s->stats, l, h, pos, scores, idx, row0, rows);
        } else {
            attend(out, q, &s->kv, l, g, idx, row0, rows, scores, tmp);
            if (s->stats) attn_stats_observe(s->stats, l, h, pos, scores, idx, row0, rows);
        }
        count_bytes(s, (uint64_t)rows * 2 * dh * esz);
    }
    return hook_failed ? fasa_error(err, FASA_EIO, "%s", hook_err) : 0;
}

/* TIP over the dominant block can serve this step: one decode query of a FASA policy whose
 * block the cache keeps contiguous (the group's top chunks, or the union of its heads' own). */
static int tip_block_ok(const model *m, const run_state *s)
{
    const policy *p = s->policy;
    const int ns = s->kv.n_split;
    return p && p->o.kind == POLICY_FASA && !p->o.group && p->tip && m->cfg.n_head / m->cfg.n_kv_head <= 8 &&
           ((p->o.tip_bits && p->tip_width && s->kv.tip_width == p->tip_width && s->kv.tip_id == p->tip_id) ||
            (!p->o.tip_bits && p->o.block == 1 && ns == p->n_dom) ||
            (!p->o.tip_bits && p->o.block == 2 && p->dom_end <= ns));
}

/* How many rows TIP picks per head for `keep` chosen among `room`: keep, or (group_)rerank times it. */
static int tip_picks(const policy *p, int keep, int room)
{
    const int r = p->o.group_rerank > 0 ? p->o.group_rerank : p->o.rerank;
    const int n = r > 1 ? keep * r : keep;
    return n < room ? n : room;
}

/* The path of layer l for a batch of n tokens at positions n_past.. (see enum attn_path). */
static enum attn_path attn_path_of(const model *m, run_state *s, int l, int n)
{
    policy *p = s->policy;
    const int t1 = s->n_past + 1, grp = m->cfg.n_head / m->cfg.n_kv_head;
    const int sparse = p && s->n_past + n > s->sparse_from;   /* some query of the batch */
    /* a local layer's sliding window cuts off rows the batch path would read */
    const int windowed = model_layer_local(&m->cfg, l) && s->n_past + n > m->cfg.sliding_window;
    if (s->attend_hook) return ATTN_PER_QUERY;
    if (n > 1) return !sparse && !windowed && n <= 512 && s->attn->bscores ? ATTN_DENSE_BATCH : ATTN_PER_QUERY;
    const int budget = p ? policy_layer_budget(&p->o, l) : 0;
    const int dense = !sparse || p->o.kind == POLICY_FULL || budget >= t1 || model_layer_local(&m->cfg, l);
    if (dense) return !s->obs && !s->stats && grp <= 8 && m->cfg.d_head <= 1024 ? ATTN_DENSE_DECODE : ATTN_PER_QUERY;
    int lo, hi;
    /* a budget that sets itself takes this path when the forced rows leave room under its minimum
     * (policy_select then always chooses among [lo, hi)) and TIP's picks are not reranked */
    if (tip_block_ok(m, s) && !s->obs && !s->stats && policy_forced(&p->o, t1, budget, &lo, &hi) && hi > lo &&
        (!(p->o.auto_mass > 0) || (p->o.rerank <= 1 && lo + (t1 - hi) < p->o.auto_min))) {
        const int threads = ops_threads() < s->n_threads ? ops_threads() : s->n_threads;
        const int mid = tip_picks(p, budget - lo - (t1 - hi), hi - lo);
        if ((size_t)threads * mid <= (size_t)s->n_ctx && policy_reserve_picks(p, threads, mid) == 0)
            return ATTN_FASA_DECODE;
    }
    return ATTN_PER_QUERY;
}

int attention_layer(const model *m, run_state *s, int l, int n, char *err)
{
    const model_config *c = &m->cfg;
    const int t1 = s->n_past + 1;
    switch (attn_path_of(m, s, l, n)) {
    case ATTN_DENSE_BATCH: {
        /* per head, in two halves so that two threads share nine heads evenly */
        const int halves = n >= 16 ? 2 : 1;
        if (batch_tiled(m, s, n, halves)) {   /* a KV group's heads together, by key tiles */
            int refused = 0;
#pragma omp parallel for schedule(dynamic, 1) num_threads(ops_threads()) reduction(| : refused)
            for (int it = 0; it < c->n_kv_head * halves; it++) {
                const int g = it / halves, part = it % halves;
                refused |= attend_group_flash(m, s, l, g, part * n / halves, (part + 1) * n / halves) < 0;
            }
            if (!refused) return 0;   /* refused: by every item alike (the shape), none done */
        }
#pragma omp parallel for schedule(dynamic, 1) num_threads(ops_threads())
        for (int it = 0; it < c->n_head * halves; it++) {
            const int h = it / halves, part = it % halves;
            attend_batch(m, s, l, h, part * n / halves, (part + 1) * n / halves);
        }
        return 0;
    }
    case ATTN_DENSE_DECODE: {
        const int w0 = window_start(m, l, t1 - 1), t = t1 - w0, P = decode_parts(t);
#pragma omp parallel for schedule(dynamic, 1) num_threads(ops_threads()) if (t >= DECODE_PARALLEL_MIN)
        for (int it = 0; it < c->n_kv_head * P; it++) {
            const int g = it / P, p = it % P;
            attn_rows(m, s, l, g, p, w0 + (int)((int64_t)p * t / P), w0 + (int)((int64_t)(p + 1) * t / P));
        }
        attn_merge(m, s, P);
        return 0;
    }
    case ATTN_FASA_DECODE: {
        const policy *p = s->policy;
        int lo, hi, ldq;
        const int budget = policy_layer_budget(&p->o, l);
        policy_forced(&p->o, t1, budget, &lo, &hi);
        const float *tq = fasa_tip_queries(m, s, l, &ldq);
        const int threads = ops_threads() < s->n_threads ? ops_threads() : s->n_threads;
        const int keep = budget - lo - (t1 - hi);
        fasa_decode(m, s, l, lo, hi, tip_picks(p, keep, hi - lo), keep, tq, ldq, threads);
        return 0;
    }
    case ATTN_PER_QUERY: {
        /* one decode query of a FASA policy with the block: TIP for a group's heads in one pass */
        const int tip = n == 1 && !s->attend_hook && s->n_past >= s->sparse_from && tip_block_ok(m, s);
        if (tip) {
            int ldq;
            const float *tq = fasa_tip_queries(m, s, l, &ldq);
            fasa_tip_all(m, s, l, tq, ldq);
        }
        return attend_each(m, s, l, n, tip, err);
    }
    }
    return 0;
}

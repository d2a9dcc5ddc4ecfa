/* forward.c - the decoder forward pass over a batch of tokens (prefill) or one token (decode). */
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attention.h"
#include "model.h"
#include "topk.h"

#define DECODE_PARTS 8   /* most parts one decode query's keys are cut into */

/* Parts a decode step cuts t cached keys into (threads take them independently). */
static int decode_parts(int t)
{
    return t >= 4096 ? DECODE_PARTS : t >= 1024 ? 4 : t >= 128 ? 2 : 1;
}

/* Below this many cached keys a decode step's attention is a few microseconds of work, less than
 * waking the thread team: it stays on the calling thread. */
#define DECODE_PARALLEL_MIN 64

run_state *run_state_new(const model *m, int n_ctx, int n_batch, char *err)
{
    return run_state_new_kv(m, n_ctx, n_batch, NULL, err);
}

run_state *run_state_new_kv(const model *m, int n_ctx, int n_batch, const kv_opts *ko, char *err)
{
    const model_config *c = &m->cfg;
    if (n_ctx < 1 || n_batch < 1) {
        fasa_error(err, FASA_EARG, "context and batch sizes must be positive");
        return NULL;
    }
    run_state *s = calloc(1, sizeof *s);
    if (!s) { fasa_error(err, FASA_ENOMEM, "out of memory"); return NULL; }
    s->n_ctx = n_ctx;
    s->n_batch = n_batch;
    s->n_threads = omp_get_max_threads();
    const size_t B = n_batch, qd = (size_t)c->n_head * c->d_head, kvd = (size_t)c->n_kv_head * c->d_head;
    s->x = malloc(B * c->d_model * sizeof(float));
    s->xb = malloc(B * c->d_model * sizeof(float));
    s->q = malloc(B * qd * sizeof(float));
    s->k = malloc(B * kvd * sizeof(float));
    s->v = malloc(B * kvd * sizeof(float));
    s->att_out = malloc(B * qd * sizeof(float));
    s->ffa = malloc(B * c->d_ff * sizeof(float));
    s->ffb = malloc(B * c->d_ff * sizeof(float));
    s->scores = malloc((size_t)s->n_threads * n_ctx * sizeof(float));
    s->logits = malloc(B * c->n_vocab * sizeof(float));
    const size_t tn = (size_t)s->n_threads * n_ctx;
    s->sel_idx = malloc(tn * sizeof *s->sel_idx);
    s->sel_score = malloc(tn * sizeof *s->sel_score);
    s->sel_keys = malloc(tn * sizeof *s->sel_keys);
    s->bytes_kv = calloc((size_t)s->n_threads * 8, sizeof *s->bytes_kv);
    s->krow = malloc(c->d_head * sizeof(float));
    /* batched dense attention: a (n_batch, n_ctx) score block per thread, two with split keys */
    s->bscores = n_batch > 1 ? malloc((size_t)s->n_threads * (ko && ko->n_split ? 2 : 1) * n_batch * n_ctx * sizeof(float)) : NULL;
    /* split decode attention: per thread a (group, n_ctx) score block, two with split keys; per
     * (KV head, part, head of the group) a partial result: max, sum, d outputs */
    const int grp = c->n_head / c->n_kv_head;
    s->dscores = malloc((size_t)s->n_threads * 2 * grp * n_ctx * sizeof(float));
    /* TIP rows a cache line longer than the context: at a stride of n_ctx floats (128 KiB at
     * 32k) the rows TIP writes together fell on the same cache sets, and in some processes TIP
     * streamed at a third of the bandwidth it reaches otherwise (8k and 32k, f16, 2 threads) */
    s->tip_ld = n_ctx + 16;
    s->tip = ko && ko->n_split ? malloc((size_t)c->n_head * s->tip_ld * sizeof(float)) : NULL;
    s->tipq = ko && ko->n_split ? malloc((size_t)c->n_head * c->d_head * sizeof(float)) : NULL;
    s->dpart = malloc((size_t)c->n_kv_head * DECODE_PARTS * grp * (c->d_head + 2) * sizeof(float));
    s->cand_n = malloc((size_t)c->n_head * s->n_threads * sizeof(int));
    if (!s->dscores || !s->dpart || !s->cand_n || (ko && ko->n_split && (!s->tip || !s->tipq))) { run_state_free(s); fasa_error(err, FASA_ENOMEM, "out of memory for a run state of %d tokens", n_ctx); return NULL; }
    if (n_batch > 1 && !s->bscores) { run_state_free(s); fasa_error(err, FASA_ENOMEM, "out of memory for a run state of %d tokens", n_ctx); return NULL; }
    if (!s->krow || !s->x || !s->xb || !s->q || !s->k || !s->v || !s->att_out || !s->ffa || !s->ffb ||
        !s->scores || !s->logits || !s->sel_idx || !s->sel_score || !s->sel_keys || !s->bytes_kv) {
        run_state_free(s);
        fasa_error(err, FASA_ENOMEM, "out of memory for a run state of %d tokens", n_ctx);
        return NULL;
    }
    if (kvcache_init(&s->kv, c->n_layer, c->n_kv_head, n_ctx, c->d_head, ko, err) < 0) {
        run_state_free(s);
        return NULL;
    }
    return s;
}

void run_state_free(run_state *s)
{
    if (!s) return;
    kvcache_free(&s->kv);
    free(s->x); free(s->xb); free(s->q); free(s->k); free(s->v); free(s->att_out);
    free(s->ffa); free(s->ffb); free(s->scores); free(s->logits);
    free(s->sel_idx); free(s->sel_score); free(s->sel_keys); free(s->bytes_kv); free(s->krow); free(s->bscores); free(s->dscores); free(s->dpart); free(s->tip); free(s->tipq);
    free(s->cand); free(s->cand_n);
    free(s);
}

void run_state_reset(run_state *s)
{
    s->n_past = 0;
    s->t_attn = 0;
    memset(s->bytes_kv, 0, sizeof *s->bytes_kv * 8 * s->n_threads);
}

uint64_t run_state_kv_bytes_read(const run_state *s)
{
    uint64_t b = 0;
    for (int t = 0; t < s->n_threads; t++) b += s->bytes_kv[8 * t];
    return b;
}

/* cs[c], sn[c]: cosine and sine of pos * freq[c], c < d_head / 2 */
static void rope_angles(float *cs, float *sn, const float *freq, int d_head, int pos)
{
    for (int c = 0; c < d_head / 2; c++) {
        const float ang = (float)pos * freq[c];
        cs[c] = cosf(ang), sn[c] = sinf(ang);
    }
}

/* Rotates one head vector (file layout) and writes it in canonical layout: pair c = (src[2c],
 * src[2c+1]) of the input, rotated by the angle whose cosine and sine are cs[c], sn[c]. */
static void rope_gather(float *out, const float *in, const int16_t *src, const float *cs, const float *sn, int d_head)
{
    for (int c = 0; c < d_head / 2; c++) {
        const float a = in[src[2 * c]], b = in[src[2 * c + 1]];
        out[2 * c] = a * cs[c] - b * sn[c];
        out[2 * c + 1] = a * sn[c] + b * cs[c];
    }
}

static void add_bias(float *x, const float *b, int n, int width)
{
    if (!b) return;
    for (int i = 0; i < n; i++)
        for (int j = 0; j < width; j++) x[(size_t)i * width + j] += b[j];
}

/* Exact attention of one query over the cached positions idx[0..n) (idx NULL: 0..n-1) of one KV
 * head; leaves the softmax weights in scores. With split keys the score is the dominant block's
 * dot product plus the rest's (tmp: n floats). */
static void attend(float *out, const float *q, const kvcache *kv, int l, int g, const int32_t *idx, int n,
                   float *scores, float *tmp)
{
    const int d = kv->d_head, s = kv->n_split;
    const float scale = 1.0f / sqrtf((float)d);
    if (idx) kvcache_prefetch(kv, l, g, idx, n);
    kvcache_scores(kv, KV_KEYS, l, g, 0, idx, n, q, 1, d, scale, scores, n);
    if (s) {
        kvcache_scores(kv, KV_REST, l, g, 0, idx, n, q + s, 1, d, scale, tmp, n);
        for (int i = 0; i < n; i++) scores[i] += tmp[i];
    }
    ops_softmax(scores, n);
    kvcache_accum(kv, l, g, 0, idx, n, scores, 1, NULL, out, d);
}

/* Dense attention of queries r0..r1-1 of a batch (positions n_past + r) for head h, in one pass
 * over the cache: every key and value row is read once for all of them. Calls the observer and
 * updates the statistics per query, as the one-query path does. */
static void attend_batch(const model *m, run_state *s, int l, int h, int r0, int r1, float *S, float *T)
{
    const model_config *c = &m->cfg;
    const kvcache *kv = &s->kv;
    const int d = c->d_head, qd = c->n_head * d, g = h / (c->n_head / c->n_kv_head), ns = kv->n_split;
    const int nq = r1 - r0, t = s->n_past + r1;   /* the last query sees t keys */
    const float scale = 1.0f / sqrtf((float)d);
    const float *Q = s->q + (size_t)r0 * qd + (size_t)h * d;
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
        if (s->stats) attn_stats_observe(s->stats, l, h, pos, S + (size_t)i * t, NULL, len[i]);
    }
    kvcache_accum(kv, l, g, 0, NULL, t, S, nq, len, s->att_out + (size_t)r0 * qd + (size_t)h * d, qd);
    const int tid = omp_get_thread_num();
    for (int i = 0; i < nq; i++) s->bytes_kv[8 * tid] += (uint64_t)len[i] * 2 * d * kvcache_esz(kv);
}

/* Decode, a dense layer: the heads of a KV group read each key and value row once between them,
 * and the sequence is cut into parts that threads take independently (flash-decoding): each part
 * leaves its max, sum and unnormalised output, merged afterwards. Part p of t keys is
 * [p t / P, (p + 1) t / P). attend_rows does rows [a, b) into slot p of group g. */
static void attend_rows(const model *m, run_state *s, int l, int g, int p, int a, int b, float *S, float *T)
{
    const model_config *c = &m->cfg;
    const kvcache *kv = &s->kv;
    const int d = c->d_head, grp = c->n_head / c->n_kv_head, ns = kv->n_split, len = b - a;
    const float scale = 1.0f / sqrtf((float)d);
    const float *Q = s->q + (size_t)g * grp * d;
    float *part = s->dpart + ((size_t)g * DECODE_PARTS + p) * grp * (d + 2);
    if (len <= 0) {
        for (int h = 0; h < grp; h++) part[h * (d + 2)] = -INFINITY, part[h * (d + 2) + 1] = 0;
        return;
    }
    kvcache_scores(kv, KV_KEYS, l, g, a, NULL, len, Q, grp, d, scale, S, len);
    if (ns) {
        kvcache_scores(kv, KV_REST, l, g, a, NULL, len, Q + ns, grp, d, scale, T, len);
        for (int i = 0; i < grp * len; i++) S[i] += T[i];
    }
    for (int h = 0; h < grp; h++) {
        float *row = S + (size_t)h * len, mx = row[0], sum = 0;
        for (int i = 1; i < len; i++) mx = row[i] > mx ? row[i] : mx;
        for (int i = 0; i < len; i++) row[i] -= mx;
        ops_exp(row, row, len);
        for (int i = 0; i < len; i++) sum += row[i];
        part[h * (d + 2)] = mx, part[h * (d + 2) + 1] = sum;
    }
    /* outputs of the group's heads, (grp, d + 2) with stride d + 2, from the values a..b */
    float out[8 * 1024];
    kvcache_accum(kv, l, g, a, NULL, len, S, grp, NULL, out, d);
    for (int h = 0; h < grp; h++) memcpy(part + h * (d + 2) + 2, out + (size_t)h * d, sizeof(float) * d);
    s->bytes_kv[8 * omp_get_thread_num()] += (uint64_t)len * 2 * d * kvcache_esz(kv);
}

static void attend_part(const model *m, run_state *s, int l, int g, int p, int P, float *S, float *T)
{
    const int t = s->n_past + 1;
    attend_rows(m, s, l, g, p, (int)((int64_t)p * t / P), (int)((int64_t)(p + 1) * t / P), S, T);
}

/* FASA decode with forced tokens: head h (of group g) attends to the rows it chose, idx[0..n),
 * leaving its max, sum and unnormalised output in slot 2 of its group; the group's forced rows
 * (sinks, recent window: read once for the group's heads) are slots 0 and 1 (attend_rows), and
 * merge_parts(.., 3) merges the three. */
static void attend_chosen(const model *m, run_state *s, int l, int h, const int32_t *idx, int n, float *scores,
                          float *tmp)
{
    const model_config *c = &m->cfg;
    const kvcache *kv = &s->kv;
    const int d = c->d_head, grp = c->n_head / c->n_kv_head, g = h / grp, ns = kv->n_split;
    const float *q = s->q + (size_t)h * d, scale = 1.0f / sqrtf((float)d);
    float *part = s->dpart + (((size_t)g * DECODE_PARTS + 2) * grp + h % grp) * (d + 2);
    if (n <= 0) {
        part[0] = -INFINITY, part[1] = 0;
        return;
    }
    kvcache_prefetch(kv, l, g, idx, n);
    kvcache_scores(kv, KV_KEYS, l, g, 0, idx, n, q, 1, d, scale, scores, n);
    if (ns) {
        kvcache_scores(kv, KV_REST, l, g, 0, idx, n, q + ns, 1, d, scale, tmp, n);
        for (int i = 0; i < n; i++) scores[i] += tmp[i];
    }
    float mx = scores[0], sum = 0;
    for (int i = 1; i < n; i++) mx = scores[i] > mx ? scores[i] : mx;
    for (int i = 0; i < n; i++) scores[i] -= mx;
    ops_exp(scores, scores, n);
    for (int i = 0; i < n; i++) sum += scores[i];
    part[0] = mx, part[1] = sum;
    kvcache_accum(kv, l, g, 0, idx, n, scores, 1, NULL, part + 2, d);
}

static void merge_parts(const model *m, run_state *s, int P)
{
    const model_config *c = &m->cfg;
    const int d = c->d_head, grp = c->n_head / c->n_kv_head;
    for (int g = 0; g < c->n_kv_head; g++)
        for (int h = 0; h < grp; h++) {
            float mx = -INFINITY, sum = 0;
            for (int p = 0; p < P; p++) {
                const float *part = s->dpart + (((size_t)g * DECODE_PARTS + p) * grp + h) * (d + 2);
                mx = part[0] > mx ? part[0] : mx;
            }
            float *out = s->att_out + (size_t)(g * grp + h) * d;
            memset(out, 0, sizeof(float) * d);
            for (int p = 0; p < P; p++) {
                const float *part = s->dpart + (((size_t)g * DECODE_PARTS + p) * grp + h) * (d + 2);
                if (part[1] == 0) continue;
                const float w = expf(part[0] - mx);
                sum += w * part[1];
                for (int j = 0; j < d; j++) out[j] += w * part[2 + j];
            }
            const float inv = 1.0f / sum;
            for (int j = 0; j < d; j++) out[j] *= inv;
        }
}

/* Bytes of keys a selection reads before attention (FASA-C's TIP reads 2F dims of every key, or
 * the whole block of ns dims when each head's own chunks lie in it). */
static uint64_t select_bytes(const policy *p, int t, int d, int ns, size_t esz)
{
    switch (p->o.kind) {
    case POLICY_FASA: case POLICY_RANDOM: return (uint64_t)t * (p->o.block == 2 && ns ? ns : p->n_dom) * esz;
    case POLICY_ORACLE: return (uint64_t)t * d * esz;
    case POLICY_QUEST: return (uint64_t)(t / 16) * 2 * d * sizeof(float);   /* page bounds stay f32 */
    default: return 0;
    }
}

/* FASA decode with forced rows (sinks, recent window), layer l, in one parallel region. TIP's
 * work, the G groups' rows between the forced ones (lo..hi), is cut into equal shares, one per
 * thread, at cache lines of the score rows: a thread scores its rows (the heads of a group in one
 * pass over the dominant block) and picks each head's best `mid` among them. A head whose row one
 * thread scored whole is thereby selected; the others (a group cut between threads) take, after
 * a barrier, the best mid of the threads' picks, which is the best mid of the row: the same set as
 * one selection over it. Then each head attends to its rows, beside the group's forced rows.
 * A thread reads only TIP scores it wrote: when the two cores sit on different dies (this
 * machine's do, in some minutes), handing 300 KB of scores per layer from one core to the other
 * made TIP 2.5x slower (8k, f16: 2.3-2.5 ms per token against 0.9-1.0, the cores a measured
 * 160-200 ns apart instead of 27-50).
 * s->cand holds, per (thread, head), mid packed keys (topk_pack) or, when the thread scored the
 * whole row, the head's indices (int32, ascending); s->cand_n their count, -1 - count for the latter. */
static int tip_cut(int t, int nt, int G, int lo, int hi)
{
    const int L = hi - lo;
    const int64_t p = (int64_t)t * G * L / nt;
    const int g = (int)(p / L);
    int r = (lo + (int)(p % L)) & ~15;
    return g * L + (r < lo ? 0 : r - lo);
}

/* Thread t's share [*p0, *p1) of the G rows of L = hi - lo tokens laid end to end. */
static void tip_share(int t, int nt, int G, int lo, int hi, int *p0, int *p1)
{
    *p0 = tip_cut(t, nt, G, lo, hi);
    *p1 = t == nt - 1 ? G * (hi - lo) : tip_cut(t + 1, nt, G, lo, hi);
}

/* The thread whose share holds group g's row whole, or -1 when the row is cut between threads. */
static int tip_owner(int g, int nt, int G, int lo, int hi)
{
    const int L = hi - lo;
    for (int t = 0; t < nt; t++) {
        int p0, p1;
        tip_share(t, nt, G, lo, hi, &p0, &p1);
        if (p0 <= g * L && p1 >= (g + 1) * L) return t;
    }
    return -1;
}

/* Item it of decode_fasa's second half: head it (it < n_head) takes its rows and attends to
 * them; item n_head + 2 g + r attends to group g's sinks (r = 0) or recent window (r = 1). */
static void decode_fasa_item(const model *m, run_state *s, int l, int it, int lo, int hi, int mid, int nt)
{
    const model_config *c = &m->cfg;
    const int H = c->n_head, grp = H / c->n_kv_head, t1 = s->n_past + 1, tid = omp_get_thread_num();
    float *S = s->dscores + (size_t)tid * 2 * grp * s->n_ctx;
    if (it >= H) {
        const int g = (it - H) / 2, r = (it - H) % 2;
        attend_rows(m, s, l, g, r, r ? hi : 0, r ? t1 : lo, S, S + (size_t)grp * s->n_ctx);
        return;
    }
    int32_t *idx = s->sel_idx + (size_t)tid * s->n_ctx;
    uint64_t *keys = s->sel_keys + (size_t)tid * s->n_ctx;
    const int32_t *rows = idx;
    int n = 0, k = -1;
    for (int i = 0; i < nt && k < 0; i++) {
        const int ni = s->cand_n[(size_t)i * H + it];
        const uint64_t *cand = s->cand + ((size_t)i * H + it) * mid;
        if (ni < 0) rows = (const int32_t *)cand, k = -1 - ni;
        else memcpy(keys + n, cand, sizeof *keys * ni), n += ni;
    }
    if (k < 0) k = topk_keys(keys, n, mid, t1, idx);
    attend_chosen(m, s, l, it, rows, k, s->scores + (size_t)tid * s->n_ctx, s->sel_score + (size_t)tid * s->n_ctx);
    s->bytes_kv[8 * tid] += (uint64_t)k * 2 * c->d_head * kvcache_esz(&s->kv);
}

static void decode_fasa(const model *m, run_state *s, int l, int lo, int hi, int mid, const float *tq, int ldq,
                        int threads)
{
    const model_config *c = &m->cfg;
    const int H = c->n_head, G = c->n_kv_head, grp = H / G, dh = c->d_head, L = hi - lo;
    const size_t esz = kvcache_esz(&s->kv);
#pragma omp parallel num_threads(threads)
    {
        const int tid = omp_get_thread_num(), nt = omp_get_num_threads();
        int32_t *idx = s->sel_idx + (size_t)tid * s->n_ctx;
        uint64_t *keys = s->sel_keys + (size_t)tid * s->n_ctx;
        int *cn = s->cand_n + (size_t)tid * H;
        for (int h = 0; h < H; h++) cn[h] = 0;
        int p0, p1;
        tip_share(tid, nt, G, lo, hi, &p0, &p1);
        for (int g = p0 / L; g < G && g * L < p1; g++) {
            const int a = lo + (p0 > g * L ? p0 - g * L : 0), b = lo + (p1 < (g + 1) * L ? p1 - g * L : L);
            if (b <= a) continue;
            kvcache_scores(&s->kv, KV_KEYS, l, g, a, NULL, b - a, tq + (size_t)g * grp * ldq, grp, ldq, 1.0f,
                           s->tip + (size_t)g * grp * s->tip_ld + a, s->tip_ld);
            s->bytes_kv[8 * tid] += select_bytes(s->policy, b - a, dh, s->kv.n_split, esz);
            for (int h = g * grp; h < (g + 1) * grp; h++) {
                const float *row = s->tip + (size_t)h * s->tip_ld + a;
                uint64_t *cand = s->cand + ((size_t)tid * H + h) * mid;
                const int n = topk_indices(row, b - a, mid, idx, keys);
                if (a == lo && b == hi) {   /* the whole row: these are the head's rows */
                    int32_t *out = (int32_t *)cand;
                    for (int j = 0; j < n; j++) out[j] = lo + idx[j];
                    cn[h] = -1 - n;
                } else {
                    for (int j = 0; j < n; j++) cand[j] = topk_pack(row[idx[j]], (uint32_t)(a + idx[j]));
                    cn[h] = n;
                }
            }
        }
#pragma omp barrier
        /* the heads and the groups' forced rows: a head whose whole row this thread selected stays
         * here (its picks are in this core's cache); the rest, the recent windows first, then the
         * cut heads, the sinks last, go to whichever thread is free */
        for (int h = 0; h < H; h++)
            if (cn[h] < 0) decode_fasa_item(m, s, l, h, lo, hi, mid, nt);
#pragma omp for schedule(dynamic, 1) nowait
        for (int j = 0; j < G + H + G; j++) {
            if (j >= G && j < G + H && tip_owner((j - G) / grp, nt, G, lo, hi) >= 0) continue;
            decode_fasa_item(m, s, l, j < G ? H + 2 * j + 1 : j < G + H ? j - G : H + 2 * (j - G - H), lo, hi, mid, nt);
        }
    }
    merge_parts(m, s, 3);
}

int model_forward(const model *m, run_state *s, const int32_t *tokens, int n, int all_logits,
                  char *err)
{
    const model_config *c = &m->cfg;
    const int D = c->d_model, dh = c->d_head, H = c->n_head, G = c->n_kv_head, group = H / G;
    const int qd = H * dh, kvd = G * dh;
    if (n < 1 || n > s->n_batch)
        return fasa_error(err, FASA_EARG, "batch of %d tokens (at most %d)", n, s->n_batch);
    if (s->n_past + n > s->n_ctx)
        return fasa_error(err, FASA_EARG, "context is full (%d tokens)", s->n_ctx);
    for (int i = 0; i < n; i++)
        if (tokens[i] < 0 || tokens[i] >= c->n_vocab)
            return fasa_error(err, FASA_EARG, "token id %d is outside the vocabulary (%d)", tokens[i], c->n_vocab);

    for (int i = 0; i < n; i++) weight_row(&m->tok_embd, tokens[i], s->x + (size_t)i * D);
    int hook_failed = 0;
    char hook_err[FASA_ERRLEN] = "";

    for (int l = 0; l < c->n_layer; l++) {
        const layer_weights *L = &m->layers[l];
        for (int i = 0; i < n; i++)
            ops_rmsnorm(s->xb + (size_t)i * D, s->x + (size_t)i * D, L->attn_norm.data, D, c->norm_eps);
        /* file-layout q (rotated into s->q below), k, v: one parallel region for the three */
        float *const qkv_out[3] = { s->att_out, s->k, s->v };
        const weight *const qkv_w[3] = { &L->wq, &L->wk, &L->wv };
        ops_matmul_multi(qkv_out, qkv_w, 3, s->xb, n);
        add_bias(s->att_out, L->bq, n, qd);
        add_bias(s->k, L->bk, n, kvd);
        add_bias(s->v, L->bv, n, kvd);

        const double t_attn0 = fasa_now();
        for (int i = 0; i < n; i++) {
            const int pos = s->n_past + i;
            for (int g = 0; g < G; g++) {
                const size_t tab = (size_t)l * G + g;
                const int16_t *src = m->rope_src + tab * dh;
                float cs[512], sn[512];   /* d_head <= 1024 (model_config_check) */
                rope_angles(cs, sn, m->rope_freq + tab * (dh / 2), dh, pos);
                rope_gather(s->krow, s->k + (size_t)i * kvd + g * dh, src, cs, sn, dh);
                kvcache_put_key(&s->kv, l, g, pos, s->krow);
                kvcache_put_value(&s->kv, l, g, pos, s->v + (size_t)i * kvd + g * dh);
                for (int h = g * group; h < (g + 1) * group; h++)
                    rope_gather(s->q + (size_t)i * qd + h * dh, s->att_out + (size_t)i * qd + h * dh, src, cs, sn, dh);
            }
        }

        if (s->stats) attn_stats_append(s->stats, s, l, s->n_past + n);
        /* a batch with no sparse query: per head, all its queries in one pass over the cache
         * (in two halves, so two threads share nine heads evenly) */
        const int dense_batch = !s->attend_hook && n > 1 && n <= 512 && s->bscores && (!s->policy || s->n_past + n <= s->sparse_from);
        /* one decode query in a layer where every head attends densely, nobody watching: by KV
         * group, the sequence split into parts */
        const int t1 = s->n_past + 1;
        const int dense_decode = !s->attend_hook && n == 1 && !s->obs && !s->stats && c->n_head / c->n_kv_head <= 8 && dh <= 1024 &&
                                 (!s->policy || s->n_past < s->sparse_from || s->policy->o.kind == POLICY_FULL ||
                                  s->policy->o.budget >= t1 || policy_layer_dense(&s->policy->o, l));
        if (dense_decode) {
            const int P = decode_parts(t1);
#pragma omp parallel for schedule(dynamic, 1) num_threads(ops_threads()) if (t1 >= DECODE_PARALLEL_MIN)
            for (int it = 0; it < G * P; it++) {
                const int tid = omp_get_thread_num();
                float *S = s->dscores + (size_t)tid * 2 * group * s->n_ctx;
                attend_part(m, s, l, it / P, it % P, P, S, S + (size_t)group * s->n_ctx);
            }
            merge_parts(m, s, P);
        }
        /* FASA over split keys in decode: TIP for the heads of a KV group in one pass over the
         * dominant block, the sequence split into parts; each head then selects from its row */
        const int tip_pre = !s->attend_hook && n == 1 && !dense_decode && s->tip && s->policy && s->policy->o.kind == POLICY_FASA &&
                            !s->policy->o.group &&
                            ((s->policy->o.block == 1 && s->kv.n_split == s->policy->n_dom) ||
                             (s->policy->o.block == 2 && s->policy->dom_end <= s->kv.n_split)) &&
                            s->n_past >= s->sparse_from && group <= 8;
        const int ns = s->kv.n_split;
        const float *tq = s->q;   /* the heads' queries on the block, dh apart */
        if (tip_pre && s->policy->o.block == 2) {
            /* each head's own chunks only: its query there, zero on the rest of the block */
            const int nd = s->policy->n_dom;
            memset(s->tipq, 0, sizeof(float) * H * ns);
            for (int h = 0; h < H; h++) {
                const int16_t *dom = s->policy->dom + ((size_t)l * H + h) * nd;
                for (int j = 0; j < nd; j++) s->tipq[(size_t)h * ns + dom[j]] = s->q[(size_t)h * dh + dom[j]];
            }
            tq = s->tipq;
        }
        const int ldq = tq == s->q ? dh : ns;
        /* the usual case, in one region (decode_fasa): the forced tokens (sinks, recent window)
         * are the same rows for every head of a group, attended once per group, and each thread
         * selects from the TIP scores it wrote */
        int f_lo = 0, f_hi = 0;
        const int shared = tip_pre && !s->stats && !s->obs && policy_forced(&s->policy->o, t1, s->policy->o.budget, &f_lo, &f_hi);
        const int mid = shared ? s->policy->o.budget - f_lo - (t1 - f_hi) : 0;
        const int threads = ops_threads() < s->n_threads ? ops_threads() : s->n_threads;   /* per-thread scratch */
        const size_t n_cand = (size_t)H * threads * mid;
        int fused = shared && f_hi > f_lo && (size_t)threads * mid <= (size_t)s->n_ctx;
        if (fused && n_cand > s->cand_cap) {
            uint64_t *p = realloc(s->cand, n_cand * sizeof *p);
            if (p) s->cand = p, s->cand_cap = n_cand;
            else fused = 0;   /* the per-head path below needs no more memory */
        }
        if (fused) decode_fasa(m, s, l, f_lo, f_hi, mid, tq, ldq, threads);
        if (tip_pre && !fused) {
            const int P = decode_parts(t1);
#pragma omp parallel for schedule(dynamic, 1) num_threads(ops_threads()) if (t1 >= DECODE_PARALLEL_MIN)
            for (int it = 0; it < G * P; it++) {
                const int g = it / P, p = it % P;
                const int a = (int)((int64_t)p * t1 / P), b = (int)((int64_t)(p + 1) * t1 / P);
                kvcache_scores(&s->kv, KV_KEYS, l, g, a, NULL, b - a, tq + (size_t)g * group * ldq, group, ldq, 1.0f,
                               s->tip + (size_t)g * group * s->tip_ld + a, s->tip_ld);
            }
        }
        if (dense_batch) {
            const int halves = n >= 16 ? 2 : 1;
#pragma omp parallel for schedule(dynamic, 1) num_threads(ops_threads())
            for (int it = 0; it < H * halves; it++) {
                const int h = it / halves, part = it % halves, tid = omp_get_thread_num();
                const size_t blk = (size_t)n * s->n_ctx;
                float *S = s->bscores + (size_t)tid * blk * (s->kv.n_split ? 2 : 1);
                attend_batch(m, s, l, h, part * n / halves, (part + 1) * n / halves, S, S + blk);
            }
        } else if (!dense_decode && !fused) {
#pragma omp parallel for schedule(dynamic, 1) num_threads(ops_threads())
            for (int ih = 0; ih < n * H; ih++) {
                const int i = ih / H, h = ih % H, g = h / group, pos = s->n_past + i, tid = omp_get_thread_num();
                const float *q = s->q + (size_t)i * qd + h * dh;
                float *scores = s->scores + (size_t)tid * s->n_ctx;
                float *out = s->att_out + (size_t)i * qd + h * dh;
                if (s->obs && s->obs->on_query) s->obs->on_query(s->obs->ctx, m, s, l, h, pos, q);
                int n_sel = -1;
                int32_t *idx = s->sel_idx + (size_t)tid * s->n_ctx;
                if (s->policy && pos >= s->sparse_from) {
                    policy_scratch sc = { s->sel_score + (size_t)tid * s->n_ctx, s->sel_keys + (size_t)tid * s->n_ctx,
                                          tip_pre ? s->tip + (size_t)h * s->tip_ld : NULL };
                    n_sel = policy_select(s->policy, s, s->stats, l, h, pos, s->q + (size_t)i * qd,
                                          s->policy->o.budget, idx, &sc);
                    /* TIP's bytes: the block once per KV group when the group scored together */
                    if (n_sel >= 0 && (!tip_pre || h % group == 0)) s->bytes_kv[8 * tid] += select_bytes(s->policy, pos + 1, dh, s->kv.n_split, kvcache_esz(&s->kv));
                }
                if (s->attend_hook) {
                    char herr[FASA_ERRLEN];
                    if (s->attend_hook(s->attend_ctx, s, l, h, pos, q, n_sel < 0 ? NULL : idx, n_sel < 0 ? pos + 1 : n_sel, out, herr) < 0) {
#pragma omp critical(fasa_hook_err)
                        if (!hook_failed) hook_failed = 1, snprintf(hook_err, sizeof hook_err, "%s", herr);
                    }
                    s->bytes_kv[8 * tid] += (uint64_t)(n_sel < 0 ? pos + 1 : n_sel) * 2 * dh * kvcache_esz(&s->kv);
                } else if (n_sel < 0) {
                    attend(out, q, &s->kv, l, g, NULL, pos + 1, scores, s->sel_score + (size_t)tid * s->n_ctx);
                    s->bytes_kv[8 * tid] += (uint64_t)(pos + 1) * 2 * dh * kvcache_esz(&s->kv);
                    if (s->stats) attn_stats_observe(s->stats, l, h, pos, scores, NULL, pos + 1);
                } else {
                    attend(out, q, &s->kv, l, g, idx, n_sel, scores, s->sel_score + (size_t)tid * s->n_ctx);
                    s->bytes_kv[8 * tid] += (uint64_t)n_sel * 2 * dh * kvcache_esz(&s->kv);
                    if (s->stats) attn_stats_observe(s->stats, l, h, pos, scores, idx, n_sel);
                }
            }
        }
        if (s->stats) attn_stats_reduce(s->stats, l);
        s->t_attn += fasa_now() - t_attn0;
        if (hook_failed) return fasa_error(err, FASA_EIO, "%s", hook_err);

        ops_matmul(s->xb, &L->wo, s->att_out, n);
        for (size_t j = 0; j < (size_t)n * D; j++) s->x[j] += s->xb[j];

        for (int i = 0; i < n; i++)
            ops_rmsnorm(s->xb + (size_t)i * D, s->x + (size_t)i * D, L->ffn_norm.data, D, c->norm_eps);
        float *const gu_out[2] = { s->ffa, s->ffb };
        const weight *const gu_w[2] = { &L->w_gate, &L->w_up };
        ops_matmul_multi(gu_out, gu_w, 2, s->xb, n);
        ops_swiglu(s->ffa, s->ffb, n * c->d_ff);
        ops_matmul(s->xb, &L->w_down, s->ffa, n);
        for (size_t j = 0; j < (size_t)n * D; j++) s->x[j] += s->xb[j];
    }

    const int first = all_logits ? 0 : n - 1, rows = n - first;
    for (int i = 0; i < rows; i++)
        ops_rmsnorm(s->xb + (size_t)i * D, s->x + (size_t)(first + i) * D, m->out_norm.data, D, c->norm_eps);
    ops_matmul(s->logits, &m->output, s->xb, rows);
    s->n_past += n;
    return 0;
}

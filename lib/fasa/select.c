/* select.c - token selection policies (FASA and the baselines) and their running statistics. */
#include "attn_impl.h"

#include <errno.h>
#include <float.h>
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "ops.h"
#include "sampler.h"
#include "topk.h"

static const char *const names[POLICY_COUNT] = {
    "full", "fasa", "oracle", "stream", "snapkv", "h2o", "quest", "random",
};

const char *policy_name(enum policy_kind k) { return k < POLICY_COUNT ? names[k] : "?"; }

int policy_parse(const char *name, enum policy_kind *out)
{
    for (int k = 0; k < POLICY_COUNT; k++)
        if (!strcmp(name, names[k])) return *out = (enum policy_kind)k, 0;
    if (!strcmp(name, "fasa-c") || !strcmp(name, "fasa-m")) return *out = POLICY_FASA, 0;
    return -1;
}

int policy_parse_layers(const char *s, char sep, uint64_t *mask)
{
    uint64_t m = 0;
    for (const char *p = s; *p;) {
        char *end;
        long l = strtol(p, &end, 10);
        if (end == p || l < 0 || l > 63 || (*end && *end != sep)) return -1;
        m |= 1ull << l;
        p = *end ? end + 1 : end;
    }
    *mask |= m;
    return 0;
}

int policy_parse_dense_budget(const char *s, int *out)
{
    char *end;
    errno = 0;
    const long v = strtol(s, &end, 10);
    const int times = *end == 'x' && !end[1];
    if (errno || end == s || (*end && !times) || v < times || v > (times ? 1024 : 1 << 24)) return -1;
    *out = times ? (int)-v : (int)v;
    return 0;
}

policy_opts policy_defaults(enum policy_kind kind, const model *m, int budget)
{
    policy_opts o = { .kind = kind, .budget = budget, .fcs = profile_default_fcs(m->cfg.d_head), .n_dense_layers = 1,
                      .window = 32, .page = 16, .seed = 1 };
    if (kind == POLICY_STREAM) o.n_sink = 4;
    if (kind == POLICY_FASA) o.n_sink = 4, o.n_recent = POLICY_RECENT_DEFAULT;
    return o;
}

int policy_init(policy *p, const model *m, const policy_opts *o, char *err)
{
    memset(p, 0, sizeof *p);
    p->o = *o;
    p->m = m;
    const model_config *c = &m->cfg;
    const int nc = c->d_head / 2;
    if (o->budget < 1) return fasa_error(err, FASA_EARG, "the budget must be at least 1 token");
    if (o->kind != POLICY_FASA && o->kind != POLICY_RANDOM) return 0;
    if (o->fcs < 1 || o->fcs > nc) return fasa_error(err, FASA_EARG, "F must be between 1 and %d chunks", nc);
    if (o->group_rerank > 0 && (!o->tip_bits || o->group || o->auto_mass > 0 || o->rerank > 1))
        return fasa_error(err, FASA_EARG, "group rerank takes the 4-bit TIP copy and a fixed budget, without rerank");
    if (o->tail && !policy_tail_fits(o))
        return fasa_error(err, FASA_EARG, "the tail estimate takes per-head selection and a fixed budget, "
                                          "without group rerank");
    if (o->kind == POLICY_FASA && !o->prof)
        return fasa_error(err, FASA_EARG, "fasa needs a calibration profile (fasa calibrate MODEL)");
    p->n_dom = 2 * o->fcs;
    p->dom = malloc(sizeof(int16_t) * c->n_layer * c->n_head * p->n_dom);
    if (!p->dom) return fasa_error(err, FASA_ENOMEM, "out of memory");
    int16_t dims[1024];
    uint64_t rng = o->seed * 0x9E3779B97F4A7C15ull + 1;
    for (int l = 0; l < c->n_layer; l++)
        for (int h = 0; h < c->n_head; h++) {
            const int g = h / (c->n_head / c->n_kv_head);
            enum chunk_def def = o->prof ? o->prof->chunks : CHUNKS_PLANE;
            profile_chunk_dims(m, l, g, def, dims);
            int16_t chosen[512];
            if (o->kind == POLICY_FASA) {
                const int16_t *r =
                    o->group || o->block == 1 ? profile_group_rank(o->prof, l, g) : profile_rank(o->prof, l, h);
                memcpy(chosen, r, sizeof(int16_t) * o->fcs);
            } else {
                /* F distinct chunks drawn uniformly (partial Fisher-Yates) */
                int16_t all[512];
                for (int j = 0; j < nc; j++) all[j] = (int16_t)j;
                for (int j = 0; j < o->fcs; j++) {
                    int r = j + (int)(sampler_rand(&rng) * (nc - j));
                    if (r >= nc) r = nc - 1;
                    int16_t t = all[j]; all[j] = all[r]; all[r] = t;
                    chosen[j] = all[j];
                }
            }
            int16_t *dst = p->dom + ((size_t)l * c->n_head + h) * p->n_dom;
            for (int j = 0; j < o->fcs; j++) dst[2 * j] = dims[2 * chosen[j]], dst[2 * j + 1] = dims[2 * chosen[j] + 1];
            for (int j = 0; j < p->n_dom; j++) p->dom_end = dst[j] + 1 > p->dom_end ? dst[j] + 1 : p->dom_end;
        }
    if (o->kind == POLICY_FASA && o->tip_bits) {
        if (o->tip_bits != 4) return fasa_error(err, FASA_EARG, "the TIP copy holds 4-bit values, not %d", o->tip_bits);
        /* the copy holds, per KV group, the union of its heads' dims, in key order */
        const int G = c->n_kv_head, grp = c->n_head / G, d = c->d_head;
        int16_t *u = malloc(sizeof(int16_t) * c->n_layer * G * d);
        int *nu = calloc((size_t)c->n_layer * G, sizeof(int));
        if (!u || !nu) { free(u); free(nu); return fasa_error(err, FASA_ENOMEM, "out of memory"); }
        for (int l = 0; l < c->n_layer; l++)
            for (int g = 0; g < G; g++) {
                uint8_t in[1024] = { 0 };
                for (int h = g * grp; h < (g + 1) * grp; h++)
                    for (int j = 0; j < p->n_dom; j++) in[p->dom[((size_t)l * c->n_head + h) * p->n_dom + j]] = 1;
                const size_t lg = (size_t)l * G + g;
                for (int j = 0; j < d; j++)
                    if (in[j]) u[lg * d + nu[lg]++] = (int16_t)j;
                p->tip_width = nu[lg] > p->tip_width ? nu[lg] : p->tip_width;
            }
        p->tip_width = (p->tip_width + 7) / 8 * 8;
        const int tw = p->tip_width;
        p->tip_map = malloc(sizeof(int16_t) * c->n_layer * G * tw);
        p->tip_pos = malloc(sizeof(int16_t) * c->n_layer * c->n_head * p->n_dom);
        if (!p->tip_map || !p->tip_pos) { free(u); free(nu); return fasa_error(err, FASA_ENOMEM, "out of memory"); }
        for (int l = 0; l < c->n_layer; l++)
            for (int g = 0; g < G; g++) {
                const size_t lg = (size_t)l * G + g;
                int16_t pos[1024];
                for (int j = 0; j < tw; j++) {
                    p->tip_map[lg * tw + j] = (int16_t)(j < nu[lg] ? u[lg * d + j] : -1);
                    if (j < nu[lg]) pos[u[lg * d + j]] = (int16_t)j;
                }
                for (int h = g * grp; h < (g + 1) * grp; h++)
                    for (int j = 0; j < p->n_dom; j++) {
                        const size_t at = ((size_t)l * c->n_head + h) * p->n_dom + j;
                        p->tip_pos[at] = pos[p->dom[at]];
                    }
            }
        free(u);
        free(nu);
        p->tip_id = kvcache_tip_map_id(p->tip_map, (size_t)c->n_layer * G * tw);
    }
    return 0;
}

void policy_free(policy *p)
{
    free(p->tip_map); free(p->tip_pos);
    p->tip_map = p->tip_pos = NULL;
    free(p->n_sel);
    p->n_sel = NULL;
    free(p->dom); free(p->idx); free(p->score); free(p->keys); free(p->tip); free(p->tipq);
    free(p->cand); free(p->cand_n); free(p->rr);
    p->rr = NULL;
    p->dom = NULL, p->idx = NULL, p->score = NULL, p->keys = NULL, p->tip = p->tipq = NULL;
    p->cand = NULL, p->cand_n = NULL, p->cand_cap = 0, p->n_ctx = p->n_threads = 0;
}

int policy_reserve(policy *p, int n_ctx, int n_threads, char *err)
{
    if (n_ctx <= p->n_ctx && n_threads <= p->n_threads) return 0;
    const model_config *c = &p->m->cfg;
    if (n_ctx < p->n_ctx) n_ctx = p->n_ctx;
    if (n_threads < p->n_threads) n_threads = p->n_threads;
    const size_t tn = (size_t)n_threads * n_ctx;
    const int fasa = p->o.kind == POLICY_FASA;
    free(p->idx); free(p->score); free(p->keys); free(p->tip); free(p->tipq); free(p->cand_n); free(p->rr);
    p->idx = malloc(tn * sizeof *p->idx);
    const int rerank = fasa && (p->o.rerank > 1 || p->o.group_rerank > 0);
    p->rr = rerank ? calloc((size_t)n_threads * POLICY_RR_FLOATS(n_ctx), sizeof *p->rr) : NULL;
    p->score = malloc(tn * sizeof *p->score);
    p->keys = malloc(tn * sizeof *p->keys);
    p->tip_ld = n_ctx + 16;
    p->tip = fasa ? malloc((size_t)c->n_head * p->tip_ld * sizeof *p->tip) : NULL;
    p->tipq = fasa ? malloc((size_t)c->n_head * (c->d_head + 8) * sizeof *p->tipq) : NULL;   /* tip_width <= d + 8 */
    p->cand_n = malloc((size_t)n_threads * c->n_head * sizeof *p->cand_n);
    free(p->n_sel);
    p->n_sel = calloc((size_t)n_threads * 8, sizeof *p->n_sel);
    p->n_ctx = n_ctx, p->n_threads = n_threads;
    if (!p->idx || !p->score || !p->keys || !p->cand_n || !p->n_sel || (fasa && (!p->tip || !p->tipq)) ||
        (rerank && !p->rr)) {
        p->n_ctx = p->n_threads = 0;
        return fasa_error(err, FASA_ENOMEM, "out of memory for selecting among %d tokens", n_ctx);
    }
    return 0;
}

double policy_selected(policy *p, uint64_t *n)
{
    uint64_t sum = 0, calls = 0;
    for (int t = 0; p->n_sel && t < p->n_threads; t++) {
        sum += p->n_sel[8 * t], calls += p->n_sel[8 * t + 1];
        p->n_sel[8 * t] = p->n_sel[8 * t + 1] = 0;
    }
    if (n) *n = calls;
    return calls ? (double)sum / calls : 0;
}

int policy_reserve_picks(policy *p, int threads, int mid)
{
    const size_t n = (size_t)p->m->cfg.n_head * threads * mid;
    if (n <= p->cand_cap) return 0;
    uint64_t *c = realloc(p->cand, n * sizeof *c);
    if (!c) return FASA_ENOMEM;
    p->cand = c, p->cand_cap = n;
    return 0;
}

uint64_t attn_select_bytes(const policy *p, const kvcache *kv, int l, int g, int t)
{
    const int d = kv->d_head, ns = kv->n_split;
    const size_t esz = kvcache_esz(kv);
    switch (p->o.kind) {
    case POLICY_FASA: case POLICY_RANDOM:
        if (p->o.tip_bits) {   /* the copy (or as much from the keys, when the cache has none) */
            const int16_t *map = p->tip_map + ((size_t)l * kv->n_kv_head + g) * p->tip_width;
            return (uint64_t)(t * (kv->tip_width ? kvcache_tip_row_bytes(kv, l, g)
                                                  : kvcache_tip_map_bytes(map, 1, p->tip_width)));
        }
        return (uint64_t)t * (p->o.block == 2 && ns ? ns : p->n_dom) * esz;
    case POLICY_ORACLE: return (uint64_t)t * d * esz;
    case POLICY_QUEST: return (uint64_t)(t / 16) * 2 * d * sizeof(float);   /* page bounds stay f32 */
    default: return 0;
    }
}

int policy_stats_flags(enum policy_kind kind)
{
    switch (kind) {
    case POLICY_QUEST: return STATS_QUEST;
    case POLICY_SNAPKV: return STATS_SNAPKV;
    case POLICY_H2O: return STATS_H2O;
    default: return 0;
    }
}

/* ---------------------------------------------------------------- selection */

/* TIP: partial scores over the dominant dims only (2F values of each key). */
static void tip_scores(float *S, const float *q, const kvcache *kv, int l, int g, int t, const int16_t *dom,
                       int n_dom, int add)
{
    float qd[1024], row[1024];
    for (int j = 0; j < n_dom; j++) qd[j] = q[dom[j]];
    for (int i = 0; i < t; i++) {
        const float *k = kvcache_key_row(kv, l, g, i, row);
        float acc = 0;
        for (int j = 0; j < n_dom; j++) acc += qd[j] * k[dom[j]];
        S[i] = add ? S[i] + acc : acc;
    }
}

int policy_tail_fits(const policy_opts *o)
{
    return !o->group && !(o->auto_mass > 0) && o->group_rerank <= 0;
}

void policy_kv_opts(const policy *p, kv_opts *ko)
{
    if (p->o.tail) ko->value_sums = 1;
    if (!p->o.tip_bits) return;
    ko->tip_width = p->tip_width;
    ko->tip_map = p->tip_map;
    ko->n_split = 0;
}

void policy_tip_query(const policy *p, int layer, int head, const float *q, float *out)
{
    if (p->o.tip_union) {   /* every dim of the group's copy (unmapped ones zero) */
        const int G = p->m->cfg.n_kv_head, g = head / (p->m->cfg.n_head / G);
        const int16_t *map = p->tip_map + ((size_t)layer * G + g) * p->tip_width;
        for (int j = 0; j < p->tip_width; j++) out[j] = map[j] >= 0 ? q[map[j]] : 0;
        return;
    }
    const size_t at = ((size_t)layer * p->m->cfg.n_head + head) * p->n_dom;
    memset(out, 0, sizeof(float) * p->tip_width);
    for (int j = 0; j < p->n_dom; j++) out[p->tip_pos[at + j]] = q[p->dom[at + j]];
}

/* TIP of one head from the 4-bit copy, or, without one in this cache, from keys rounded exactly
 * as the copy rounds them (kvcache_tip_key): the same scores either way. */
static void tip_scores_q4(const policy *p, const kvcache *kv, int l, int h, int g, int t, const float *q, float *S)
{
    const int tw = p->tip_width;
    float qt[1032];
    policy_tip_query(p, l, h, q, qt);
    if (kv->tip_width == tw && kv->tip_id == p->tip_id) {   /* the copy of this policy's map */
        kvcache_tip_scores(kv, l, g, 0, t, qt, 1, tw, S, t);
        return;
    }
    int8_t qi[1032], v[1032];
    int32_t qsum;
    const float qs = kvcache_tip_query(qt, tw, qi, &qsum);
    const int16_t *map = p->tip_map + ((size_t)l * kv->n_kv_head + g) * tw;
    float row[1024], off[1032] = { 0 }, sum[1032] = { 0 }, c = 0;   /* the span's offsets, as the copy's */
    for (int i = 0, span = 0; i < t; i++) {
        if (kvcache_tip_span(i) != span) {
            kvcache_tip_span_offset(sum, i - kvcache_tip_span_start(span++), off, tw, off);
            memset(sum, 0, sizeof(float) * tw);
            c = kvcache_tip_offset_dot(qt, off, tw);
        }
        const float ks = kvcache_tip_key(kvcache_key_row(kv, l, g, i, row), map, tw, off, v);
        kvcache_tip_span_add(sum, v, ks, tw);
        int32_t dot = 0;
        for (int j = 0; j < tw; j++) dot += v[j] * qi[j];
        S[i] = fmaf((float)dot, ks * qs, c);
    }
}

/* Scores that make forced tokens win over any real score and keep their order among themselves:
 * 2^100 (1 + i 2^-23) is exact and strictly increasing in i for i < 2^23, so later tokens win
 * ties; sinks sit one power of two higher. */
static inline float forced(int i) { return ldexpf(1.0f + (float)i * 0x1p-23f, 100); }
static inline float forced_sink(int i) { return ldexpf(1.0f + (float)i * 0x1p-23f, 101); }

int policy_auto_count(const float *S, int t, int lo, int hi, float scale, float P, float *ws, int32_t *ix, float *bar)
{
    const float mx = ops_max(S, t);
    float *e = ws;   /* the masses of [lo, hi), then scratch */
    double mid, sinks, recent;
    ops_exp_from(e, S + lo, hi - lo, mx, scale, &mid);
    ops_exp_from(e + (hi - lo), S, lo, mx, scale, &sinks);
    ops_exp_from(e + (hi - lo), S + hi, t - hi, mx, scale, &recent);
    const double forced = sinks + recent;
    const int c = topk_mass_cut(e, hi - lo, mid, P * (mid + forced) - forced, bar, e + (hi - lo));
    const int k = topk_at_least(e, hi - lo, *bar, ix);
    for (int j = 0; j < k; j++) ix[j] += lo;
    return c;
}

/* The best want of the m candidate rows cand (ascending) by their exact scores against q (the
 * whole keys), kept ascending in place; E: 3 m floats of scratch, keys: m. Returns want. */
int policy_rerank(const kvcache *kv, int layer, int g, const float *q, int32_t *cand, int m, int want, float *E,
                  uint64_t *keys)
{
    const int d = kv->d_head, ns = kv->n_split;
    float *T = E + m;
    int32_t *pick = (int32_t *)(E + 2 * m);
    kvcache_prefetch_parts(kv, KV_KEYS, KV_REST, layer, g, cand, m);   /* the rows, at random */
    kvcache_scores(kv, KV_KEYS, layer, g, 0, cand, m, q, 1, d, 1.0f, E, m);
    if (ns) {
        kvcache_scores(kv, KV_REST, layer, g, 0, cand, m, q + ns, 1, d, 1.0f, T, m);
        for (int i = 0; i < m; i++) E[i] += T[i];
    }
    const int k = topk_indices(E, m, want, pick, keys);
    for (int j = 0; j < k; j++) cand[j] = cand[pick[j]];   /* pick[j] >= j: in place */
    return k;
}

int policy_marked(uint8_t *mark, int lo, int hi, int32_t *U)
{
    int u = 0;
    for (int i = lo; i < hi; i++)
        if (mark[i]) U[u++] = i, mark[i] = 0;
    return u;
}

/* group_rerank in the per-query path, as fasa_decode does it: the union of the best want * R of
 * [lo, hi) by TIP of each head of head's group (S: head's own scores over the t rows), and head's
 * best want of it by exact scores, ascending into idx. */
static int group_picks(const policy *p, const run_state *s, int layer, int head, int t, const float *q_tok,
                       const float *S, int lo, int hi, int want, int32_t *idx, policy_scratch *sc)
{
    const model_config *c = &p->m->cfg;
    const int grp = c->n_head / c->n_kv_head, g = head / grp;
    const int n_ctx = sc->n_rr, d = c->d_head;
    float *other = sc->rr + 3 * (size_t)n_ctx;
    int32_t *U = (int32_t *)(sc->rr + 4 * (size_t)n_ctx);
    uint8_t *mark = POLICY_RR_MARK(sc->rr, n_ctx);
    for (int h = g * grp; h < (g + 1) * grp; h++) {
        const float *row = S;
        if (h != head && sc->tip) row = p->tip + (size_t)h * p->tip_ld;   /* the step's TIP, every head */
        else if (h != head) tip_scores_q4(p, &s->kv, layer, h, g, t, q_tok + (size_t)h * d, other), row = other;
        const int n = topk_indices(row + lo, hi - lo, want * p->o.group_rerank, U, sc->sel);
        for (int j = 0; j < n; j++) mark[lo + U[j]] = 1;
    }
    const int u = policy_marked(mark, lo, hi, idx);
    return u > want ? policy_rerank(&s->kv, layer, g, q_tok + (size_t)head * d, idx, u, want, sc->rr, sc->sel) : u;
}

int policy_recent(const policy_opts *o, int budget)
{
    if (o->n_recent >= 0) return o->n_recent;
    if (o->auto_mass > 0) return o->auto_min / 2;
    return o->n_recent == POLICY_RECENT_HALF || budget / 2 < POLICY_RECENT ? budget / 2 : POLICY_RECENT;
}

int policy_forced(const policy_opts *o, int t, int budget, int *lo, int *hi)
{
    const int recent = policy_recent(o, budget);
    *lo = o->n_sink < t ? o->n_sink : t;
    *hi = t - recent > *lo ? t - recent : *lo;
    return *lo + (t - *hi) < budget;
}

int policy_select(const policy *p, const run_state *s, const attn_stats *st, int layer, int head,
                  int pos, const float *q_tok, int budget, int32_t *idx, policy_scratch *sc)
{
    const policy_opts *o = &p->o;
    const model_config *c = &p->m->cfg;
    const int t = pos + 1, d = c->d_head, group = c->n_head / c->n_kv_head, g = head / group;
    if (o->kind == POLICY_FULL || budget >= t || model_layer_local(c, layer)) return -1;
    const kvcache *kv = &s->kv;
    const float *q = q_tok + (size_t)head * d;
    float *S = sc->tip && o->kind == POLICY_FASA ? sc->tip : sc->score;

    const int ns = s->kv.n_split;
    switch (o->kind) {
    case POLICY_FASA:
        if (sc->tip) break;   /* S already holds this head's TIP scores */
        if (ns && ns == p->n_dom && (o->block == 1 || o->group)) {
            /* split keys: the dominant block holds the group's top chunks, contiguous; TIP
             * streams it (the group's dims for every head of the group) */
            if (o->group) {
                kvcache_scores(kv, KV_KEYS, layer, g, 0, NULL, t, q_tok + (size_t)g * group * d, 1, d, 1.0f, S, t);
                float *tmp = (float *)sc->sel;
                for (int h = g * group + 1; h < (g + 1) * group; h++) {
                    kvcache_scores(kv, KV_KEYS, layer, g, 0, NULL, t, q_tok + (size_t)h * d, 1, d, 1.0f, tmp, t);
                    for (int i = 0; i < t; i++) S[i] += tmp[i];
                }
            } else {
                kvcache_scores(kv, KV_KEYS, layer, g, 0, NULL, t, q, 1, d, 1.0f, S, t);
            }
            break;
        }
        /* fall through */
    case POLICY_RANDOM:
        if (o->group && o->kind == POLICY_FASA) {
            const int16_t *dom = p->dom + ((size_t)layer * c->n_head + g * group) * p->n_dom;
            for (int h = g * group; h < (g + 1) * group; h++)
                tip_scores(S, q_tok + (size_t)h * d, &s->kv, layer, g, t, dom, p->n_dom, h > g * group);
        } else {
            if (o->tip_bits && o->kind == POLICY_FASA)
                tip_scores_q4(p, &s->kv, layer, head, g, t, q, S);
            else
                tip_scores(S, q, &s->kv, layer, g, t, p->dom + ((size_t)layer * c->n_head + head) * p->n_dom, p->n_dom,
                           0);
        }
        break;
    case POLICY_ORACLE:
        kvcache_scores(kv, KV_KEYS, layer, g, 0, NULL, t, q, 1, d, 1.0f, S, t);
        if (ns) {
            float *tmp = (float *)sc->sel;
            kvcache_scores(kv, KV_REST, layer, g, 0, NULL, t, q + ns, 1, d, 1.0f, tmp, t);
            for (int i = 0; i < t; i++) S[i] += tmp[i];
        }
        break;
    case POLICY_STREAM:
        for (int i = 0; i < t; i++) S[i] = (float)i;
        break;
    case POLICY_SNAPKV: {
        /* Prompt tokens keep the votes the observation window gave them at prefill; the window
         * and everything after it are kept, most recent first, within the same budget. */
        const float *v = st->votes + ((size_t)layer * c->n_head + head) * st->n_ctx;
        const int lo = st->snap_lo;
        for (int i = 0; i < t; i++) {
            if (i >= lo) { S[i] = forced(i); continue; }
            /* max-pool over 7 neighbours smooths the votes, as SnapKV does */
            float mx = v[i];
            for (int j = i - 3; j <= i + 3; j++)
                if (j >= 0 && j < lo && v[j] > mx) mx = v[j];
            S[i] = mx;
        }
        break;
    }
    case POLICY_H2O: {
        /* half heavy hitters by accumulated attention, half recent */
        const float *acc = st->h2o + ((size_t)layer * c->n_head + head) * st->n_ctx;
        const int recent = budget / 2;
        for (int i = 0; i < t; i++) S[i] = i >= t - recent ? forced(i) : acc[i];
        break;
    }
    case POLICY_QUEST: {
        /* page score = sum_i max(q_i max_i, q_i min_i) over full pages; the current partial page
         * always stays */
        const int P = st->page, full = t / P;
        const float *mn = st->page_min + ((size_t)layer * c->n_kv_head + g) * (st->n_ctx / P + 1) * d;
        const float *mx = st->page_max + ((size_t)layer * c->n_kv_head + g) * (st->n_ctx / P + 1) * d;
        for (int pg = 0; pg < full; pg++) {
            float sc2 = 0;
            for (int j = 0; j < d; j++) sc2 += fmaxf(q[j] * mx[(size_t)pg * d + j], q[j] * mn[(size_t)pg * d + j]);
            for (int i = pg * P; i < (pg + 1) * P; i++) S[i] = sc2;
        }
        for (int i = full * P; i < t; i++) S[i] = forced(i);
        break;
    }
    default:
        return -1;
    }
    /* forced tokens (attention sinks, a recent window): when they leave room in the budget, the
     * rest is selected from the tokens between them, and the indices stay ascending */
    int lo, hi, counted = -1;
    if (o->auto_mass > 0 && o->kind == POLICY_FASA) {
        policy_forced(o, t, budget, &lo, &hi);
        float bar;   /* the count's rows, ascending, go to idx + lo */
        counted = policy_auto_count(S, t, lo, hi, 1.0f / sqrtf((float)d), o->auto_mass, (float *)sc->sel, idx + lo,
                                    &bar);
        const int n = lo + (t - hi) + counted;
        budget = n < o->auto_min ? o->auto_min : n < budget ? n : budget;
        if (budget >= t) return -1;
    }
    const int room = policy_forced(o, t, budget, &lo, &hi);
    const int recent = policy_recent(o, budget);
    if (o->kind != POLICY_STREAM && room) {
        const int want = budget - lo - (t - hi);
        const int rr = o->kind == POLICY_FASA && o->rerank > 1 ? o->rerank : 1;
        int m = want;
        if (o->kind == POLICY_FASA && o->group_rerank > 0 && sc->rr) {   /* reranked already: m <= want */
            m = group_picks(p, s, layer, head, t, q_tok, S, lo, hi, want, idx + lo, sc);
        } else if (want != counted || rr > 1) {   /* else the count's own rows are the best want */
            m = topk_indices(S + lo, hi - lo, want * rr, idx + lo, sc->sel);
            for (int j = lo; j < lo + m; j++) idx[j] += lo;
        }
        for (int i = 0; i < lo; i++) idx[i] = i;
        if (m > want && sc->rr) m = policy_rerank(kv, layer, g, q, idx + lo, m, want, sc->rr, sc->sel);
        for (int i = hi; i < t; i++) idx[lo + m + i - hi] = i;
        return lo + m + (t - hi);
    }
    for (int i = 0; i < o->n_sink && i < t; i++) S[i] = forced_sink(i);
    if (o->kind == POLICY_STREAM) {
        for (int i = 0; i < t; i++) S[i] = i < o->n_sink ? forced_sink(i) : (float)i;
    } else {
        for (int i = t - recent; i < t; i++)
            if (i >= 0) S[i] = forced(i);
    }
    return topk_indices(S, t, budget, idx, sc->sel);
}

/* ---------------------------------------------------------------- statistics */

int attn_stats_init(attn_stats *st, const model *m, int n_ctx, int flags, int n_prefill, char *err)
{
    const model_config *c = &m->cfg;
    memset(st, 0, sizeof *st);
    *st = (attn_stats){ .flags = flags, .n_layer = c->n_layer, .n_head = c->n_head, .n_kv = c->n_kv_head,
                        .d = c->d_head, .n_ctx = n_ctx, .n_threads = omp_get_max_threads(), .page = 16 };
    const size_t lh = (size_t)c->n_layer * c->n_head * n_ctx;
    int ok = 1;
    if (flags & STATS_QUEST) {
        size_t n = (size_t)c->n_layer * c->n_kv_head * (n_ctx / st->page + 1) * c->d_head;
        st->page_min = malloc(n * sizeof(float));
        st->page_max = malloc(n * sizeof(float));
        st->pages_done = calloc((size_t)c->n_layer * c->n_kv_head, sizeof(int));
        ok = st->page_min && st->page_max && st->pages_done;
    }
    if (flags & STATS_SNAPKV) {
        st->snap_hi = n_prefill;
        st->snap_lo = n_prefill - 32 > 0 ? n_prefill - 32 : 0;
        ok = ok && (st->votes = calloc(lh * st->n_threads, sizeof(float)));
    }
    if (flags & STATS_H2O) ok = ok && (st->h2o = calloc(lh * st->n_threads, sizeof(float)));
    if (!ok) {
        attn_stats_free(st);
        return fasa_error(err, FASA_ENOMEM, "out of memory for attention statistics");
    }
    return 0;
}

void attn_stats_free(attn_stats *st)
{
    free(st->page_min); free(st->page_max); free(st->pages_done); free(st->votes); free(st->h2o);
    memset(st, 0, sizeof *st);
}

void attn_stats_append(attn_stats *st, const run_state *s, int layer, int n_cached)
{
    if (!(st->flags & STATS_QUEST)) return;
    const int d = st->d, P = st->page, stride = st->n_ctx / P + 1;
    for (int g = 0; g < st->n_kv; g++) {
        int *done = &st->pages_done[(size_t)layer * st->n_kv + g];
        float row[1024];
        float *mn = st->page_min + ((size_t)layer * st->n_kv + g) * stride * d;
        float *mx = st->page_max + ((size_t)layer * st->n_kv + g) * stride * d;
        for (; (*done + 1) * P <= n_cached; (*done)++) {
            float *a = mn + (size_t)*done * d, *b = mx + (size_t)*done * d;
            for (int j = 0; j < d; j++) a[j] = FLT_MAX, b[j] = -FLT_MAX;
            for (int i = *done * P; i < (*done + 1) * P; i++) {
                const float *k = kvcache_key_row(&s->kv, layer, g, i, row);
                for (int j = 0; j < d; j++) {
                    float v = k[j];
                    a[j] = fminf(a[j], v);
                    b[j] = fmaxf(b[j], v);
                }
            }
        }
    }
}

void attn_stats_observe(attn_stats *st, int layer, int head, int pos, const float *p, const int32_t *idx, int row0,
                        int n)
{
    const size_t off = (size_t)omp_get_thread_num() * st->n_layer * st->n_head * st->n_ctx +
                       ((size_t)layer * st->n_head + head) * st->n_ctx;
    float *dst[2] = { NULL, NULL };
    if (st->votes && pos >= st->snap_lo && pos < st->snap_hi) dst[0] = st->votes + off;
    if (st->h2o) dst[1] = st->h2o + off;
    for (int k = 0; k < 2; k++) {
        if (!dst[k]) continue;
        if (idx) for (int i = 0; i < n; i++) dst[k][idx[i]] += p[i];
        else for (int i = 0; i < n; i++) dst[k][row0 + i] += p[i];
    }
}

void attn_stats_reduce(attn_stats *st, int layer)
{
    float *arrs[2] = { st->votes, st->h2o };
    const size_t per = (size_t)st->n_layer * st->n_head * st->n_ctx, lay = (size_t)st->n_head * st->n_ctx;
    for (int k = 0; k < 2; k++) {
        if (!arrs[k]) continue;
        float *base = arrs[k] + layer * lay;
        for (int t = 1; t < st->n_threads; t++) {
            float *other = base + t * per;
            for (size_t i = 0; i < lay; i++) base[i] += other[i], other[i] = 0;
        }
    }
}

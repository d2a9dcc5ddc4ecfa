/* bench.c - compound CA, perplexity and passkey benchmarks over the selection policies. */
#include "bench.h"

#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "calibrate.h"
#include "sampler.h"
#include "ruler.h"
#include "session.h"
#include "topk.h"

/* spec as parsed; shown as errors name it (a default-VARIANT's fasa twin is parsed under the name given) */
static int parse_policy(const char *spec, const char *shown, const model *m, const profile *prof, bench_policy *out,
                        char *err)
{
    char base[48];
    snprintf(base, sizeof base, "%s", spec);
    memset(out, 0, sizeof *out);
    snprintf(out->name, sizeof out->name, "%s", spec);
    /* default: what `fasa run` selects without flags */
    if (!strncmp(spec, "default", 7) && (!spec[7] || spec[7] == '-' || spec[7] == ':')) {
        if (!prof) return fasa_error(err, FASA_EARG, "policy '%s' needs a profile (-p)", shown);
        const session_opts so = session_defaults();
        session_policy_opts(m, prof, &so, &out->o);
        if (!spec[7]) return 0;
        /* default-VARIANTS: the same with fasa's variants below (-aPP, -minN, -sN, -rN, -rhalf, -xR, -dN,
         * -nodense, -own, -tail, -tails, -tailb, -tailm, -notail); default:F with F chunks (as `fasa run
         * --fcs F`) */
        bench_policy v;
        char alt[48];
        snprintf(alt, sizeof alt, "fasa%s", spec + 7);
        int rc = parse_policy(alt, spec, m, prof, &v, err);
        if (rc < 0) return rc;
        if (strchr(spec, ':')) out->o.fcs = v.o.fcs;
        out->o.auto_mass = v.o.auto_mass, out->o.auto_min = v.o.auto_min;
        out->o.n_recent = v.o.n_recent, out->o.n_sink = v.o.n_sink;
        if (v.o.rerank) out->o.rerank = v.o.rerank;
        if (v.o.group_rerank) out->o.group_rerank = v.o.group_rerank;
        if (v.o.tip_union) out->o.tip_union = 1;
        if (strstr(spec + 7, "-own")) out->o.tip_union = 0;   /* the previous default: own chunks */
        /* the tail as `fasa run` takes it: on unless -notail, off beside what it does not take
         * (auto budgets, group reranking) unless -tail asks for it */
        if (v.o.tail || strstr(spec + 7, "-notail") || !policy_tail_fits(&out->o))
            out->o.tail = v.o.tail;
        for (const char *d = strstr(spec, "-d"); d; d = strstr(d + 1, "-d"))   /* -dN replaces the default's */
            if (d[2] >= '0' && d[2] <= '9') out->o.dense_budget = v.o.dense_budget;
        if (strstr(spec, "-nodense")) out->o.n_dense_layers = 0;
        /* the tail's values by block as the default has them, one mean for all with -tailm */
        if (strstr(spec + 7, "-tailm")) out->o.tail_blocks = 0;
        else if (v.o.tail_blocks) out->o.tail_blocks = 1;
        out->o.tail_blocks = out->o.tail_blocks && out->o.tail;
        return 0;
    }
    const int nc = m->cfg.d_head / 2;
    int fcs = prof ? prof->fcs : profile_default_fcs(m->cfg.d_head);
    int group = 0, block = 0, dense = 1, sink = -1, recent = POLICY_RECENT_DEFAULT, tip_bits = 0, tip_union = 0;
    int auto_min = 64, rerank = 0, group_rerank = 0, dense_budget = 0, tail = 0, tail_blocks = 0;
    float auto_mass = 0;
    uint64_t mask = 0;
    char *at = strchr(base, '@');   /* @L.L.L: these layers dense too */
    if (at) {
        if (policy_parse_layers(at + 1, '.', &mask) < 0 || (m->cfg.n_layer < 64 && mask >> m->cfg.n_layer))
            return fasa_error(err, FASA_EARG, "policy '%s': @ takes layers 0..%d separated by dots", shown,
                              (m->cfg.n_layer < 64 ? m->cfg.n_layer : 64) - 1);
        *at = 0;
    }
    char *colon = strchr(base, ':');
    if (colon) {
        char *end;
        long f = strtol(colon + 1, &end, 10);
        if (*end || f < 1 || f > nc) return fasa_error(err, FASA_EARG, "policy '%s': F must be 1..%d", shown, nc);
        fcs = (int)f;
        *colon = 0;
    }
    char *dash;
    while ((dash = strrchr(base, '-')) && strncmp(base, "fasa", 4) == 0 && dash > base + 3) {
        if (!strcmp(dash, "-1/8")) fcs = nc / 8;
        else if (!strcmp(dash, "-1/4")) fcs = nc / 4;
        else if (!strcmp(dash, "-group")) group = 1;
        else if (!strcmp(dash, "-block")) block = 1;
        else if (!strcmp(dash, "-nodense")) dense = 0;
        else if (dash[1] == 'd' && dash[2] >= '0' && dash[2] <= '9') {   /* -dN, -dKx: the dense layers' budget */
            if (policy_parse_dense_budget(dash + 2, &dense_budget) < 0)
                return fasa_error(err, FASA_EARG, "policy '%s': bad count in '%s'", shown, dash);
        }
        else if (!strcmp(dash, "-q4")) tip_bits = 4;
        else if (!strcmp(dash, "-u")) tip_union = 1;   /* with the copy: every head its group's union */
        else if (!strcmp(dash, "-own")) tip_union = 0;   /* with the copy: every head its own chunks */
        else if (!strcmp(dash, "-tail")) tail = 1;   /* the unchosen rows as one estimate */
        else if (!strcmp(dash, "-tails")) tail = 2;   /* its offset from a sample of the unchosen rows */
        else if (!strcmp(dash, "-tailb")) tail_blocks = 1;   /* its values by block of 64 rows */
        else if (!strcmp(dash, "-tailm")) tail = 1;   /* one mean value for all (default-tailm) */
        else if (!strcmp(dash, "-notail")) tail = 0;   /* without it (default-notail) */
        else if (dash[1] == 'a' && dash[2] >= '0' && dash[2] <= '9') {   /* -aPP: auto budget, mass PP % */
            char *end;
            const double v = strtod(dash + 2, &end);
            if (*end || v <= 0 || v >= 100)
                return fasa_error(err, FASA_EARG, "policy '%s': -aP takes 0 < P < 100", shown);
            auto_mass = (float)(v / 100);
        }
        else if (!strncmp(dash, "-min", 4) && dash[4] >= '0' && dash[4] <= '9') auto_min = atoi(dash + 4);
        else if (dash[1] == 'x' && dash[2] >= '2' && dash[2] <= '9' && !dash[3]) rerank = dash[2] - '0';
        else if (!strncmp(dash, "-gx", 3) && dash[3] >= '1' && dash[3] <= '9' && !dash[4]) group_rerank = dash[3] - '0';
        else if (!strcmp(dash, "-c") || !strcmp(dash, "-m")) { /* storage, not selection */ }
        else if (!strcmp(dash, "-rhalf")) recent = POLICY_RECENT_HALF;   /* the default until 2026-12-07 */
        else if ((dash[1] == 's' || dash[1] == 'r') && dash[2] >= '0' && dash[2] <= '9') {   /* -sN sinks, -rN recent */
            char *end;
            const long v = strtol(dash + 2, &end, 10);
            if (*end || v > 1 << 20) return fasa_error(err, FASA_EARG, "policy '%s': bad count in '%s'", shown, dash);
            *(dash[1] == 's' ? &sink : &recent) = (int)v;
        }
        else return fasa_error(err, FASA_EARG, "unknown policy variant '%s' in '%s'", dash, shown);
        *dash = 0;
    }
    enum policy_kind k;
    if (policy_parse(base, &k) < 0)
        return fasa_error(err, FASA_EARG,
                          "unknown policy '%s' (full, fasa, oracle, stream, snapkv, h2o, quest, random)", shown);
    out->o = policy_defaults(k, m, 1);
    out->o.fcs = fcs < 1 ? 1 : fcs;
    out->o.group = group;
    out->o.block = block;
    out->o.tip_bits = tip_bits;
    out->o.tip_union = tip_union;
    out->o.auto_mass = auto_mass;
    out->o.auto_min = auto_min;
    out->o.rerank = rerank;
    out->o.group_rerank = group_rerank;
    out->o.tail = tail;
    out->o.tail_blocks = tail_blocks;
    out->o.n_dense_layers = dense;
    out->o.dense_mask = mask;
    out->o.dense_budget = dense_budget;
    if (sink >= 0) out->o.n_sink = sink;
    if (recent != POLICY_RECENT_DEFAULT) out->o.n_recent = recent;
    out->o.prof = prof;
    if (k == POLICY_FASA && !prof) return fasa_error(err, FASA_EARG, "policy '%s' needs a profile (-p)", shown);
    return 0;
}

int bench_policy_parse(const char *spec, const model *m, const profile *prof, bench_policy *out, char *err)
{
    return parse_policy(spec, spec, m, prof, out, err);
}

/* The statistics the listed policies read: the prefill keeps no others (H2O's and SnapKV's add
 * up each query's attention weights, which keeps a long prefill off its tiled path). */
static int bench_stats_flags(const bench_cfg *cfg)
{
    int f = 0;
    for (int i = 0; i < cfg->n_policy; i++) f |= policy_stats_flags(cfg->policies[i].o.kind);
    return f;
}

/* The statistics a run keeps up: those of the listed policies while prefilling (flags: theirs),
 * a policy's own while it decodes, none where none are read: a run state with statistics
 * attends one query at a time, one without takes the decode paths `fasa run` takes. */
static attn_stats *stats_kept(attn_stats *st, int flags) { return flags & st->flags ? st : NULL; }

static int add_row(bench_row **rows, int *n, const char *task, const char *policy, int budget, int context,
                   double value, double extra, double depth)
{
    bench_row *r = realloc(*rows, sizeof **rows * (*n + 1));
    if (!r) return -1;
    *rows = r;
    bench_row *x = &r[(*n)++];
    memset(x, 0, sizeof *x);
    snprintf(x->task, sizeof x->task, "%s", task);
    snprintf(x->policy, sizeof x->policy, "%s", policy);
    x->budget = budget, x->context = context, x->value = value, x->extra = extra, x->depth = depth;
    x->layer = x->head = -1;
    x->kl = x->agree = -1;
    return 0;
}

/* The cache options every policy of cfg can read: the TIP copy of the first policy with one
 * (policies of its F and profile read it; one of another F has another map and, as a policy
 * without a copy in the cache, rounds each key itself: the same scores far slower). Returns the
 * map the options point at (the caller frees it after the last run state is made), or NULL. */
static int16_t *bench_kv_opts(const model *m, const bench_cfg *cfg, kv_opts *ko, char *err)
{
    for (int i = 0; i < cfg->n_policy; i++)
        if (cfg->policies[i].o.tail) ko->value_sums = 1;
    for (int i = 0; i < cfg->n_policy; i++) {
        policy pol;
        if (!cfg->policies[i].o.tip_bits || policy_init(&pol, m, &cfg->policies[i].o, err) < 0) continue;
        kv_opts tmp = *ko;
        policy_kv_opts(&pol, &tmp);
        const size_t n = (size_t)m->cfg.n_layer * m->cfg.n_kv_head * tmp.tip_width;
        int16_t *map = malloc(sizeof *map * n);
        if (map) {
            memcpy(map, tmp.tip_map, sizeof *map * n);
            ko->tip_width = tmp.tip_width, ko->tip_map = map;
        }
        policy_free(&pol);
        return map;
    }
    return NULL;
}

/* ---------------------------------------------------------------- compound CA */

typedef struct ca_ctx {
    const bench_cfg *cfg;
    policy *pol;             /* (n_policy) */
    const attn_stats *st;
    int n_prefill, n_ctx, n_threads, n_layer, n_head;
    uint64_t *hits, *den;    /* (n_threads, n_policy, n_k, n_layer) */
    double *mass;            /* (n_threads, n_policy, n_k, n_layer, n_head): attention probability held */
    uint64_t *queries;       /* (n_threads, n_layer): (query, head) pairs seen */
    float **full, **prob;
    uint8_t **bucket;
    uint64_t **keys;
    int32_t **idx;
    float **score;
} ca_ctx;

static void ca_query(void *vctx, const model *m, const run_state *s, int layer, int head, int pos, const float *q)
{
    ca_ctx *c = vctx;
    if (pos < c->n_prefill) return;
    const bench_cfg *cfg = c->cfg;
    const int tid = omp_get_thread_num(), t = pos + 1, d = m->cfg.d_head, g = head / (m->cfg.n_head / m->cfg.n_kv_head);
    const float *K = kvcache_k(&s->kv, layer, g);
    float *full = c->full[tid], *prob = c->prob[tid];
    for (int i = 0; i < t; i++) full[i] = ops_dot(q, K + (size_t)i * d, d);
    calib_buckets(full, t, cfg->ks, cfg->n_k, c->bucket[tid], c->keys[tid]);
    /* full attention's probabilities, for the mass each selection holds */
    const float scale = 1.0f / sqrtf((float)d);
    for (int i = 0; i < t; i++) prob[i] = full[i] * scale;
    ops_softmax(prob, t);
    c->queries[(size_t)tid * c->n_layer + layer]++;
    /* q of every head of this token: the forward pass keeps them contiguous */
    const float *q_tok = q - (size_t)head * d;
    for (int p = 0; p < cfg->n_policy; p++) {
        for (int b = 0; b < cfg->n_k; b++) {
            const int K_ = cfg->ks[b];
            const int k = K_ < t ? K_ : t;
            policy_scratch sc = { c->score[tid], c->keys[tid] + 2 * (size_t)c->n_ctx + 256, NULL,
                                  (float *)(c->keys[tid] + 3 * (size_t)c->n_ctx + 256), c->n_ctx };
            int n = policy_select(&c->pol[p], s, c->st, layer, head, pos, q_tok, K_, c->idx[tid], &sc);
            int inter = 0;
            double held = 0;
            if (n < 0) inter = k, held = 1;   /* everything fits: agreement is total */
            else for (int j = 0; j < n; j++) inter += c->bucket[tid][c->idx[tid][j]] <= b, held += prob[c->idx[tid][j]];
            size_t at = (((size_t)tid * cfg->n_policy + p) * cfg->n_k + b) * c->n_layer + layer;
            c->hits[at] += inter;
            c->den[at] += k;
            c->mass[at * c->n_head + head] += held;
        }
    }
}

int bench_ca(const model *m, const int32_t *ids, int n, const bench_cfg *cfg, bench_row **rows, int *n_rows, char *err)
{
    const int steps = cfg->steps > 0 ? cfg->steps : 256;
    if (n <= steps) return fasa_error(err, FASA_EARG, "the text (%d tokens) must be longer than %d steps", n, steps);
    const int n_prefill = n - steps;
    int rc = 0;
    run_state *s = run_state_new(m, n, 64, err);
    if (!s) return FASA_ENOMEM;
    attn_stats st;
    if ((rc = attn_stats_init(&st, m, n, bench_stats_flags(cfg), n_prefill, err)) < 0) {
        run_state_free(s);
        return rc;
    }
    const int L = m->cfg.n_layer, H = m->cfg.n_head;
    ca_ctx c = { .cfg = cfg, .st = &st, .n_prefill = n_prefill, .n_ctx = n, .n_threads = s->n_threads, .n_layer = L,
                 .n_head = H };
    c.pol = calloc(cfg->n_policy, sizeof *c.pol);
    size_t nh = (size_t)c.n_threads * cfg->n_policy * cfg->n_k * L;
    c.hits = calloc(nh, sizeof *c.hits);
    c.den = calloc(nh, sizeof *c.den);
    c.mass = calloc(nh * H, sizeof *c.mass);
    c.queries = calloc((size_t)c.n_threads * L, sizeof *c.queries);
    c.full = calloc(c.n_threads, sizeof *c.full);
    c.prob = calloc(c.n_threads, sizeof *c.prob);
    c.bucket = calloc(c.n_threads, sizeof *c.bucket);
    c.keys = calloc(c.n_threads, sizeof *c.keys);
    c.idx = calloc(c.n_threads, sizeof *c.idx);
    c.score = calloc(c.n_threads, sizeof *c.score);
    int ok =
        c.pol && c.hits && c.den && c.mass && c.queries && c.full && c.prob && c.bucket && c.keys && c.idx && c.score;
    for (int t = 0; ok && t < c.n_threads; t++) {
        c.full[t] = malloc(sizeof(float) * n);
        c.prob[t] = malloc(sizeof(float) * n);
        c.bucket[t] = malloc(n);
        /* 3 n + 256 keys, then a rerank's scratch (its marks zero) */
        c.keys[t] = calloc(3 * (size_t)n + 256 + (POLICY_RR_FLOATS(n) + 1) / 2, sizeof(uint64_t));
        c.idx[t] = malloc(sizeof(int32_t) * n);
        c.score[t] = malloc(sizeof(float) * n);
        ok = c.full[t] && c.prob[t] && c.bucket[t] && c.keys[t] && c.idx[t] && c.score[t];
    }
    if (!ok) { rc = fasa_error(err, FASA_ENOMEM, "out of memory"); goto out; }
    for (int p = 0; p < cfg->n_policy; p++) {
        policy_opts o = cfg->policies[p].o;
        o.n_dense_layers = 0, o.dense_mask = 0;   /* CA is measured in every layer */
        o.budget = 1;
        if ((rc = policy_init(&c.pol[p], m, &o, err)) < 0) goto out;
    }
    s->stats = &st;
    if ((rc = model_prefill(m, s, ids, n_prefill, NULL, err)) < 0) goto out;
    attn_obs obs = { ca_query, &c };
    s->obs = &obs;
    for (int i = n_prefill; i < n; i += s->n_batch) {
        int nb = n - i < s->n_batch ? n - i : s->n_batch;
        if ((rc = model_forward(m, s, ids + i, nb, 0, err)) < 0) goto out;
        if (cfg->progress) cfg->progress(cfg->progress_ctx, i + nb - n_prefill, steps);
    }
    /* layer -1: all layers; then each layer when asked */
    for (int lay = -1; lay < (cfg->per_layer ? L : 0); lay++)
        for (int what = 0; what < 2; what++)   /* ca, mass */
            for (int p = 0; p < cfg->n_policy; p++)
                for (int b = 0; b < cfg->n_k; b++) {
                    uint64_t h = 0, dd = 0, nq = 0;
                    double ms = 0;
                    for (int t = 0; t < c.n_threads; t++)
                        for (int l = lay < 0 ? 0 : lay; l < (lay < 0 ? L : lay + 1); l++) {
                            size_t at = (((size_t)t * cfg->n_policy + p) * cfg->n_k + b) * L + l;
                            h += c.hits[at], dd += c.den[at], nq += c.queries[(size_t)t * L + l];
                            for (int hd = 0; hd < H; hd++) ms += c.mass[at * H + hd];
                        }
                    const double v = what ? (nq ? ms / nq : 0) : (dd ? (double)h / dd : 0);
                    if (add_row(rows, n_rows, what ? "mass" : "ca", cfg->policies[p].name, cfg->ks[b], n, v,
                                (double)steps * (lay < 0 ? L : 1) * m->cfg.n_head, -1) < 0) {
                        rc = fasa_error(err, FASA_ENOMEM, "out of memory");
                        goto out;
                    }
                    (*rows)[*n_rows - 1].layer = lay;
                }
    /* each head of each layer: its own mean, so the heads the predictor serves worst show */
    for (int lay = 0; cfg->per_head && lay < L; lay++)
        for (int hd = 0; hd < H; hd++)
            for (int p = 0; p < cfg->n_policy; p++)
                for (int b = 0; b < cfg->n_k; b++) {
                    uint64_t nq = 0;
                    double ms = 0;
                    for (int t = 0; t < c.n_threads; t++) {
                        size_t at = (((size_t)t * cfg->n_policy + p) * cfg->n_k + b) * L + lay;
                        ms += c.mass[at * H + hd], nq += c.queries[(size_t)t * L + lay];
                    }
                    nq /= H;   /* queries[] counts (query, head) pairs: every head sees each query */
                    if (add_row(rows, n_rows, "mass", cfg->policies[p].name, cfg->ks[b], n, nq ? ms / nq : 0, steps,
                                -1) < 0) {
                        rc = fasa_error(err, FASA_ENOMEM, "out of memory");
                        goto out;
                    }
                    (*rows)[*n_rows - 1].layer = lay, (*rows)[*n_rows - 1].head = hd;
                }
out:
    for (int p = 0; c.pol && p < cfg->n_policy; p++) policy_free(&c.pol[p]);
    for (int t = 0; c.full && t < c.n_threads; t++)
        free(c.full[t]), free(c.bucket[t]), free(c.keys[t]), free(c.idx[t]), free(c.score[t]);
    for (int t = 0; c.prob && t < c.n_threads; t++) free(c.prob[t]);
    free(c.pol);
    free(c.hits);
    free(c.den);
    free(c.mass);
    free(c.queries);
    free(c.full);
    free(c.prob);
    free(c.bucket);
    free(c.keys);
    free(c.idx);
    free(c.score);
    attn_stats_free(&st);
    run_state_free(s);
    return rc;
}

/* ---------------------------------------------------------------- perplexity */

static double log_sum_exp(const float *logits, int n_vocab)
{
    float mx = logits[0];
    for (int i = 1; i < n_vocab; i++) if (logits[i] > mx) mx = logits[i];
    double sum = 0;
    for (int i = 0; i < n_vocab; i++) sum += exp((double)logits[i] - mx);
    return log(sum) + mx;
}

/* KL(ref || p) in nats: ref as log-probabilities, p as logits whose log-sum-exp is lse. */
static double kl_of(const float *ref, const float *logits, double lse, int n_vocab)
{
    double kl = 0;
    for (int i = 0; i < n_vocab; i++) kl += exp((double)ref[i]) * (ref[i] - (logits[i] - lse));
    return kl;
}

/* Snapshot of the statistics prefill leaves behind, so each policy starts from the same state. */
typedef struct stats_snap { float *votes, *h2o; int *pages; size_t lh, pg; } stats_snap;

static void snap_take(stats_snap *sn, const attn_stats *st)
{
    sn->lh = (size_t)st->n_threads * st->n_layer * st->n_head * st->n_ctx;
    sn->pg = (size_t)st->n_layer * st->n_kv;
    sn->votes = st->votes ? malloc(sn->lh * sizeof(float)) : NULL;
    sn->h2o = st->h2o ? malloc(sn->lh * sizeof(float)) : NULL;
    sn->pages = st->pages_done ? malloc(sn->pg * sizeof(int)) : NULL;
    if (sn->votes) memcpy(sn->votes, st->votes, sn->lh * sizeof(float));
    if (sn->h2o) memcpy(sn->h2o, st->h2o, sn->lh * sizeof(float));
    if (sn->pages) memcpy(sn->pages, st->pages_done, sn->pg * sizeof(int));
}

static void snap_restore(const stats_snap *sn, attn_stats *st)
{
    if (sn->votes) memcpy(st->votes, sn->votes, sn->lh * sizeof(float));
    if (sn->h2o) memcpy(st->h2o, sn->h2o, sn->lh * sizeof(float));
    if (sn->pages) memcpy(st->pages_done, sn->pages, sn->pg * sizeof(int));
}

static void snap_free(stats_snap *sn) { free(sn->votes); free(sn->h2o); free(sn->pages); }

int bench_ppl(const model *m, const int32_t *ids, int n, const bench_cfg *cfg, bench_row **rows, int *n_rows, char *err)
{
    const int M = cfg->steps > 0 ? cfg->steps : 256, V = m->cfg.n_vocab, W = cfg->windows > 1 ? cfg->windows : 1;
    const int runs = cfg->n_policy * cfg->n_budget;   /* (policy, budget) pairs, full's once */
    int rc = 0, done = 0, total = cfg->n_ctx * runs * W;
    for (int ci = 0; ci < cfg->n_ctx; ci++) {   /* every context checked before the first runs */
        const int C = cfg->contexts[ci];
        if (C + 1 > n) return fasa_error(err, FASA_EARG, "context %d needs %d tokens of text; it has %d", C, C + 1, n);
        if (C - M < 1) return fasa_error(err, FASA_EARG, "context %d is not longer than %d steps", C, M);
    }
    /* with full attention in the list it runs first in each window, and its next-token
     * distributions (M x V log-probabilities) are what the others are compared with */
    int fi = -1;
    for (int pi = cfg->n_policy - 1; pi >= 0; pi--)
        if (cfg->policies[pi].o.kind == POLICY_FULL) fi = pi;
    const int fid = fi >= 0 && cfg->n_policy > 1;
    double *nll = malloc(sizeof *nll * runs), *sel = malloc(sizeof *sel * runs);
    double *kl = calloc(runs, sizeof *kl), *agree = calloc(runs, sizeof *agree);
    float *ref = fid ? malloc(sizeof *ref * M * (size_t)V) : NULL;
    int *ref_top = fid ? malloc(sizeof *ref_top * M) : NULL;
    if (!nll || !sel || !kl || !agree || (fid && (!ref || !ref_top))) {
        free(nll), free(sel), free(kl), free(agree), free(ref), free(ref_top);
        return fasa_error(err, FASA_ENOMEM, "out of memory");
    }
    kv_opts ko = { .f16 = cfg->kv_f16 };
    int16_t *map = bench_kv_opts(m, cfg, &ko, err);
    for (int ci = 0; ci < cfg->n_ctx && rc == 0; ci++) {
        const int C = cfg->contexts[ci], P = C - M;
        memset(nll, 0, sizeof *nll * runs), memset(sel, 0, sizeof *sel * runs);
        memset(kl, 0, sizeof *kl * runs), memset(agree, 0, sizeof *agree * runs);
        /* window w: the C tokens from an offset spread evenly over the text (the first at 0),
         * each with its own cache and statistics */
        for (int w = 0; w < W && rc == 0; w++) {
            const int32_t *x = ids + (W > 1 ? (int64_t)w * (n - C - 1) / (W - 1) : 0);
            run_state *s = run_state_new_kv(m, C, 64, &ko, err);
            if (!s) {
                rc = FASA_ENOMEM;
                break;
            }
            attn_stats st;
            if ((rc = attn_stats_init(&st, m, C, bench_stats_flags(cfg), P, err)) < 0) {
                run_state_free(s);
                break;
            }
            s->stats = stats_kept(&st, st.flags);
            stats_snap sn = { 0 };
            if ((rc = model_prefill(m, s, x, P, NULL, err)) < 0) goto next;
            snap_take(&sn, &st);
            for (int k = 0; k < cfg->n_policy && rc == 0; k++) {
                const int pi = fi < 0 ? k : k == 0 ? fi : k <= fi ? k - 1 : k;   /* full first */
                const bench_policy *bp = &cfg->policies[pi];
                const int nb_budget = bp->o.kind == POLICY_FULL ? 1 : cfg->n_budget;
                for (int bi = 0; bi < nb_budget && rc == 0; bi++) {
                    policy pol;
                    policy_opts o = bp->o;
                    o.budget = bp->o.kind == POLICY_FULL ? C : cfg->budgets[bi];
                    if ((rc = policy_init(&pol, m, &o, err)) < 0) break;
                    snap_restore(&sn, &st);
                    s->stats = stats_kept(&st, policy_stats_flags(o.kind));
                    s->n_past = P;
                    if ((rc = attention_use_policy(s, &pol, P, err)) < 0) {
                        policy_free(&pol);
                        break;
                    }
                    /* h2o's scores depend on the previous step: one token at a time */
                    const int batch = o.kind == POLICY_H2O ? 1 : s->n_batch;
                    for (int i = 0; i < M && rc == 0; i += batch) {
                        int nb = M - i < batch ? M - i : batch;
                        rc = model_forward(m, s, x + P + i, nb, 1, err);
                        for (int j = 0; j < nb && rc == 0; j++) {
                            const float *lg = s->logits + (size_t)j * V;
                            const int r = pi * cfg->n_budget + bi, step = i + j;
                            const double lse = log_sum_exp(lg, V);   /* once: NLL, reference, KL */
                            nll[r] += lse - lg[x[P + step + 1]];
                            if (!fid) continue;
                            if (pi == fi) {
                                for (int v = 0; v < V; v++) ref[(size_t)step * V + v] = (float)(lg[v] - lse);
                                ref_top[step] = sampler_argmax(lg, V);
                            } else {
                                kl[r] += kl_of(ref + (size_t)step * V, lg, lse, V);
                                agree[r] += sampler_argmax(lg, V) == ref_top[step];
                            }
                        }
                    }
                    attention_use_policy(s, NULL, 0, NULL);
                    sel[pi * cfg->n_budget + bi] += policy_selected(&pol, NULL) / W;
                    policy_free(&pol);
                    done += bp->o.kind == POLICY_FULL ? cfg->n_budget : 1;
                    if (rc == 0 && cfg->progress) cfg->progress(cfg->progress_ctx, done, total);
                }
            }
        next:
            snap_free(&sn);
            attn_stats_free(&st);
            run_state_free(s);
        }
        for (int pi = 0; pi < cfg->n_policy && rc == 0; pi++) {
            const bench_policy *bp = &cfg->policies[pi];
            for (int bi = 0; bi < (bp->o.kind == POLICY_FULL ? 1 : cfg->n_budget); bi++) {
                const double mean = nll[pi * cfg->n_budget + bi] / ((double)M * W);
                if (add_row(rows, n_rows, "ppl", bp->name, bp->o.kind == POLICY_FULL ? 0 : cfg->budgets[bi], C,
                            exp(mean), mean, -1) < 0) {
                    rc = fasa_error(err, FASA_ENOMEM, "out of memory");
                    break;
                }
                bench_row *row = &(*rows)[*n_rows - 1];
                row->tokens = sel[pi * cfg->n_budget + bi];
                if (fid && pi != fi) {
                    row->kl = kl[pi * cfg->n_budget + bi] / ((double)M * W);
                    row->agree = agree[pi * cfg->n_budget + bi] / ((double)M * W);
                }
            }
        }
    }
    free(nll), free(sel), free(kl), free(agree), free(ref), free(ref_top), free(map);
    return rc < 0 ? rc : 0;
}

/* ---------------------------------------------------------------- passkey */

static const char filler[] =
    "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again. ";

/* Builds the prompt: filler up to ~len tokens with the key sentence at depth; returns ids. */
static int passkey_prompt(const model *m, int len, double depth, int key, int32_t **out, char *err)
{
    char needle[128], question[160];
    snprintf(needle, sizeof needle, "The pass key is %d. Remember it. %d is the pass key. ", key, key);
    snprintf(question, sizeof question, "What is the pass key? The pass key is");
    const char *head = "There is an important info hidden inside a lot of irrelevant text. Find it and memorize it. "
                       "I will quiz you about the important information there. ";
    /* filler sentences cost the same tokens each time: measure once */
    int32_t tmp[256];
    int per = tokenizer_encode(m->tok, filler, strlen(filler), 0, tmp, 256);
    int fixed = tokenizer_encode(m->tok, head, strlen(head), 0, tmp, 256) +
                tokenizer_encode(m->tok, needle, strlen(needle), 0, tmp, 256) +
                tokenizer_encode(m->tok, question, strlen(question), 0, tmp, 256);
    int reps = (len - fixed) / (per > 0 ? per : 1);
    if (reps < 1) reps = 1;
    int at = (int)(depth * reps + 0.5);
    size_t cap = strlen(head) + strlen(needle) + strlen(question) + (size_t)reps * strlen(filler) + 1;
    char *text = malloc(cap);
    if (!text) return fasa_error(err, FASA_ENOMEM, "out of memory");
    strcpy(text, head);
    size_t w = strlen(text);
    for (int r = 0; r <= reps; r++) {
        if (r == at) { memcpy(text + w, needle, strlen(needle)); w += strlen(needle); }
        if (r < reps) { memcpy(text + w, filler, strlen(filler)); w += strlen(filler); }
    }
    memcpy(text + w, question, strlen(question) + 1);
    w += strlen(question);
    int32_t *ids = malloc(sizeof *ids * (w + 16));
    int n = ids ? tokenizer_encode(m->tok, text, w, 0, ids, (int)(w + 16)) : -1;
    free(text);
    if (n < 0) { free(ids); return fasa_error(err, FASA_EFORMAT, "cannot tokenize the passkey prompt"); }
    *out = ids;
    return n;
}

int bench_passkey(const model *m, const bench_cfg *cfg, bench_row **rows, int *n_rows, char *err)
{
    if (!m->tok) return fasa_error(err, FASA_EARG, "passkey needs a tokenizer");
    const int n_gen = 8, V = m->cfg.n_vocab;
    const int seeds = cfg->seeds > 0 ? cfg->seeds : 5;
    int rc = 0, done = 0, total = cfg->n_ctx * cfg->n_depth * seeds;
    /* hits per (length, policy, budget) */
    int nb_all = cfg->n_policy * cfg->n_budget;
    int *hits = calloc((size_t)cfg->n_ctx * cfg->n_depth * nb_all, sizeof *hits);
    if (!hits) return fasa_error(err, FASA_ENOMEM, "out of memory");
    kv_opts ko = { .f16 = cfg->kv_f16 };
    int16_t *map = bench_kv_opts(m, cfg, &ko, err);
    uint64_t rng = 12345;
    for (int li = 0; li < cfg->n_ctx && rc == 0; li++) {
        for (int di = 0; di < cfg->n_depth && rc == 0; di++) {
            for (int sd = 0; sd < seeds && rc == 0; sd++) {
                int key = 10000 + (int)(sampler_rand(&rng) * 89999);
                int32_t *ids = NULL;
                int n = passkey_prompt(m, cfg->contexts[li], cfg->depths[di], key, &ids, err);
                if (n < 0) { rc = n; break; }
                run_state *s = run_state_new_kv(m, n + n_gen, 64, &ko, err);
                attn_stats st;
                stats_snap sn = { 0 };
                if (!s) { free(ids); rc = FASA_ENOMEM; break; }
                if ((rc = attn_stats_init(&st, m, n + n_gen, bench_stats_flags(cfg), n, err)) < 0) {
                    run_state_free(s); free(ids); break;
                }
                s->stats = stats_kept(&st, st.flags);
                /* prefill all but the last prompt token densely; it is the first decode step */
                if ((rc = model_prefill(m, s, ids, n - 1, NULL, err)) == 0) snap_take(&sn, &st);
                char want[16];
                snprintf(want, sizeof want, "%d", key);
                for (int pi = 0; pi < cfg->n_policy && rc == 0; pi++) {
                    const bench_policy *bp = &cfg->policies[pi];
                    for (int bi = 0; bi < cfg->n_budget && rc == 0; bi++) {
                        policy pol;
                        policy_opts o = bp->o;
                        o.budget = cfg->budgets[bi];
                        if ((rc = policy_init(&pol, m, &o, err)) < 0) break;
                        snap_restore(&sn, &st);
                        s->stats = stats_kept(&st, policy_stats_flags(o.kind));
                        s->n_past = n - 1;
                        if ((rc = attention_use_policy(s, &pol, n - 1, err)) < 0) { policy_free(&pol); break; }
                        char outbuf[256];
                        size_t ol = 0;
                        int32_t tok = ids[n - 1];
                        for (int g = 0; g < n_gen && rc == 0; g++) {
                            if ((rc = model_forward(m, s, &tok, 1, 0, err)) < 0) break;
                            tok = sampler_argmax(s->logits, V);
                            char piece[64];
                            int pl = tokenizer_decode(m->tok, tok, piece, sizeof piece);
                            if (pl > 0 && ol + pl < sizeof outbuf - 1) memcpy(outbuf + ol, piece, pl), ol += pl;
                        }
                        outbuf[ol] = 0;
                        attention_use_policy(s, NULL, 0, NULL);
                        policy_free(&pol);
                        hits[((size_t)li * cfg->n_depth + di) * nb_all + pi * cfg->n_budget + bi] +=
                            strstr(outbuf, want) != NULL;
                    }
                }
                snap_free(&sn);
                attn_stats_free(&st);
                run_state_free(s);
                free(ids);
                if (cfg->progress) cfg->progress(cfg->progress_ctx, ++done, total);
            }
        }
    }
    for (int li = 0; li < cfg->n_ctx && rc == 0; li++)
        for (int di = 0; di < cfg->n_depth; di++)
            for (int pi = 0; pi < cfg->n_policy; pi++)
                for (int bi = 0; bi < cfg->n_budget; bi++)
                    if (add_row(rows, n_rows, "passkey", cfg->policies[pi].name, cfg->budgets[bi], cfg->contexts[li],
                                hits[((size_t)li * cfg->n_depth + di) * nb_all + pi * cfg->n_budget + bi] /
                                    (double)seeds,
                                seeds, cfg->depths[di]) < 0)
                        rc = fasa_error(err, FASA_ENOMEM, "out of memory");
    free(hits), free(map);
    return rc;
}

/* ---------------------------------------------------------------- ruler */

static int count_tokens(void *ctx, const char *text, size_t len)
{
    const model *m = ctx;
    int32_t *ids = malloc(sizeof *ids * (len + 16));
    const int n = ids ? tokenizer_encode(m->tok, text, len, 0, ids, (int)(len + 16)) : -1;
    free(ids);
    return n;
}

int bench_ruler(const model *m, const bench_cfg *cfg, uint64_t tasks, bench_row **rows, int *n_rows, char *err)
{
    if (!m->tok) return fasa_error(err, FASA_EARG, "ruler needs a model with a tokenizer");
    const int V = m->cfg.n_vocab, samples = cfg->seeds > 0 ? cfg->seeds : 1, T = ruler_task_count();
    const int k0 = cfg->first_sample > 1 ? cfg->first_sample - 1 : 0;   /* sample k's seed: k0 + k + 1 */
    int n_tasks = 0;
    for (int t = 0; t < T; t++) n_tasks += !tasks || (tasks >> t & 1);
    /* the runs per sample: full once, every other policy at every budget */
    int runs = 0;
    for (int pi = 0; pi < cfg->n_policy; pi++) runs += cfg->policies[pi].o.kind == POLICY_FULL ? 1 : cfg->n_budget;
    double *score = calloc((size_t)cfg->n_ctx * T * runs, sizeof *score);
    if (!score) return fasa_error(err, FASA_ENOMEM, "out of memory");
    /* the chat template's own tokens: what a prompt costs beyond its text */
    int32_t *probe;
    const int overhead = session_prompt_ids(m, "x", -1, NULL, &probe, err);
    if (overhead < 0) { free(score); return overhead; }
    free(probe);
    kv_opts ko = { .f16 = cfg->kv_f16 };
    int16_t *map = bench_kv_opts(m, cfg, &ko, err);
    int rc = 0, done = 0;
    const int total = cfg->n_ctx * n_tasks * samples;
    for (int li = 0; li < cfg->n_ctx && rc == 0; li++)
        for (int t = 0; t < T && rc == 0; t++) {
            if (tasks && !(tasks >> t & 1)) continue;
            for (int k = 0; k < samples && rc == 0; k++) {
                ruler_sample smp;
                const int L = cfg->contexts[li];
                /* RULER's length holds the prompt and the answer to generate */
                rc = ruler_generate(t, L - overhead - 128, (uint64_t)(k0 + k + 1) * 7919 + (uint64_t)L, count_tokens,
                                    (void *)m, &smp, err);
                if (rc < 0) break;
                int32_t *ids = NULL, *pre = NULL;
                int n = session_prompt_ids(m, smp.prompt, -1, NULL, &ids, err);
                const size_t pl = strlen(smp.answer_prefix);
                int np = n < 0 ? n
                         : (pre = malloc(sizeof *pre * (pl + 16)))
                             ? tokenizer_encode(m->tok, smp.answer_prefix, pl, 0, pre, (int)(pl + 16))
                             : FASA_ENOMEM;
                int32_t *all = n > 0 && np >= 0 ? realloc(ids, sizeof *ids * (n + np)) : NULL;
                if (!all) {
                    free(ids), free(pre), ruler_sample_free(&smp);
                    rc = n < 0    ? n
                         : np < 0 ? fasa_error(err, FASA_EFORMAT, "cannot tokenize a ruler prompt")
                                  : FASA_ENOMEM;
                    break;
                }
                ids = all;
                memcpy(ids + n, pre, sizeof *pre * np);
                free(pre);
                n += np;
                const int n_gen = smp.max_new_tokens;
                run_state *s = run_state_new_kv(m, n + n_gen, 64, &ko, err);
                attn_stats st;
                stats_snap sn = { 0 };
                if (!s) { free(ids), ruler_sample_free(&smp); rc = FASA_ENOMEM; break; }
                if ((rc = attn_stats_init(&st, m, n + n_gen, bench_stats_flags(cfg), n, err)) < 0) {
                    run_state_free(s), free(ids), ruler_sample_free(&smp);
                    break;
                }
                s->stats = stats_kept(&st, st.flags);
                if (cfg->show) {
                    const size_t pl = strlen(smp.prompt);
                    fprintf(stderr, "ruler %s, %d tokens, sample %d: ...%s%s\n  expected:", ruler_task_name(t), n,
                            k0 + k + 1, smp.prompt + (pl > 240 ? pl - 240 : 0), smp.answer_prefix);
                    for (int a = 0; a < smp.n_answers; a++) fprintf(stderr, " \"%s\"", smp.answers[a]);
                    fputc('\n', stderr);
                }
                /* prefill all but the last prompt token densely, once; it is every run's first decode step */
                if ((rc = model_prefill(m, s, ids, n - 1, NULL, err)) == 0) snap_take(&sn, &st);
                for (int pi = 0, run = 0; pi < cfg->n_policy && rc == 0; pi++) {
                    const bench_policy *bp = &cfg->policies[pi];
                    const int nb = bp->o.kind == POLICY_FULL ? 1 : cfg->n_budget;
                    for (int bi = 0; bi < nb && rc == 0; bi++, run++) {
                        policy pol;
                        policy_opts o = bp->o;
                        o.budget = bp->o.kind == POLICY_FULL ? n + n_gen : cfg->budgets[bi];
                        if ((rc = policy_init(&pol, m, &o, err)) < 0) break;
                        snap_restore(&sn, &st);
                        s->stats = stats_kept(&st, policy_stats_flags(o.kind));
                        s->n_past = n - 1;
                        if ((rc = attention_use_policy(s, &pol, n - 1, err)) < 0) { policy_free(&pol); break; }
                        char out[2048];
                        size_t ol = 0;
                        int32_t tok = ids[n - 1];
                        for (int g = 0; g < n_gen && rc == 0; g++) {
                            if ((rc = model_forward(m, s, &tok, 1, 0, err)) < 0) break;
                            tok = sampler_argmax(s->logits, V);
                            if (tok == tokenizer_eos(m->tok)) break;
                            char piece[64];
                            int n_piece = tokenizer_decode(m->tok, tok, piece, sizeof piece);
                            if (n_piece > 0 && ol + n_piece < sizeof out - 1)
                                memcpy(out + ol, piece, n_piece), ol += n_piece;
                        }
                        out[ol] = 0;
                        attention_use_policy(s, NULL, 0, NULL);
                        policy_free(&pol);
                        const double sc = ruler_score(&smp, out);
                        score[((size_t)li * T + t) * runs + run] += sc;
                        if (cfg->show)
                            fprintf(stderr, "  %s@%d: %.2f \"%s\"\n", bp->name,
                                    o.kind == POLICY_FULL ? 0 : o.budget, sc, out);
                    }
                }
                snap_free(&sn);
                attn_stats_free(&st);
                run_state_free(s);
                free(ids);
                ruler_sample_free(&smp);
                if (cfg->progress) cfg->progress(cfg->progress_ctx, ++done, total);
            }
        }
    /* rows: per task, then the mean over the tasks, for each (length, policy, budget) */
    for (int li = 0; li < cfg->n_ctx && rc == 0; li++)
        for (int t = 0; t <= T && rc == 0; t++) {
            if (t < T && tasks && !(tasks >> t & 1)) continue;
            for (int pi = 0, run = 0; pi < cfg->n_policy && rc == 0; pi++) {
                const bench_policy *bp = &cfg->policies[pi];
                const int nb = bp->o.kind == POLICY_FULL ? 1 : cfg->n_budget;
                for (int bi = 0; bi < nb && rc == 0; bi++, run++) {
                    double v = 0;
                    if (t < T) {
                        v = score[((size_t)li * T + t) * runs + run] / samples;
                    } else {
                        for (int u = 0; u < T; u++)
                            if (!tasks || (tasks >> u & 1)) v += score[((size_t)li * T + u) * runs + run] / samples;
                        v /= n_tasks;
                    }
                    if (add_row(rows, n_rows, "ruler", bp->name, bp->o.kind == POLICY_FULL ? 0 : cfg->budgets[bi],
                                cfg->contexts[li], v, samples, -1) < 0) {
                        rc = fasa_error(err, FASA_ENOMEM, "out of memory");
                        break;
                    }
                    snprintf((*rows)[*n_rows - 1].task, sizeof(*rows)[*n_rows - 1].task, "%s",
                             t < T ? ruler_task_name(t) : "mean");
                }
            }
        }
    free(score);
    free(map);
    return rc;
}

/* speed.c - the decode speed benchmark (speed.h). */
#include "speed.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <omp.h>

#include "session.h"

static const char *const names[SPEED_COUNT] = { "full", "fasa-c", "fasa-m", "quest", "default" };

const char *speed_policy_name(enum speed_policy p) { return names[p]; }

int speed_policy_parse(const char *name, enum speed_policy *out)
{
    for (int i = 0; i < SPEED_COUNT; i++)
        if (!strcmp(name, names[i])) { *out = (enum speed_policy)i; return 0; }
    return -1;
}

/* the policy a speed policy runs as: default is fasa-c with a profile, full without */
static enum speed_policy kind_of(enum speed_policy p, const profile *prof)
{
    return p != SPEED_DEFAULT ? p : prof ? SPEED_FASA_C : SPEED_FULL;
}

speed_cfg speed_defaults(void)
{
    speed_cfg c = { 0 };
    static const int depths[] = { 0, 2048, 4096, 8192, 16384, 32768 };
    c.n_depth = 6;
    memcpy(c.depths, depths, sizeof depths);
    c.n_policy = 4;
    for (int i = 0; i < 4; i++) c.policies[i] = (enum speed_policy)i;
    c.budget = 256;
    c.steps = 16;
    c.repeats = 5;
    c.n_fill = 512;
    c.rerank = -1;
    c.group_rerank = -1;
    c.tail = -1;
    c.recent = -1;
    c.dense_budget = SESSION_DENSE_BUDGET;
    return c;
}


/* RssAnon and RssFile of this process, in MB. */
static void rss(double *anon, double *file)
{
    *anon = *file = 0;
    FILE *f = fopen("/proc/self/status", "r");
    if (!f) return;
    char line[256];
    long kb;
    while (fgets(line, sizeof line, f)) {
        if (sscanf(line, "RssAnon: %ld kB", &kb) == 1) *anon = kb / 1024.0;
        if (sscanf(line, "RssFile: %ld kB", &kb) == 1) *file = kb / 1024.0;
    }
    fclose(f);
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, int n)
{
    qsort(v, n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

double speed_read_bandwidth(size_t bytes, int passes)
{
    bytes &= ~(size_t)4095;
    uint64_t *buf = NULL;
    if (bytes < 4096 || posix_memalign((void **)&buf, 4096, bytes)) return 0;
    memset(buf, 1, bytes);   /* every page committed before the clock starts */
    const size_t n = bytes / sizeof *buf;
    double best[64];
    uint64_t sink = 0;
    if (passes > 64) passes = 64;
    for (int p = 0; p < passes; p++) {
        const double t0 = fasa_now();
#pragma omp parallel reduction(+ : sink)
        {
            /* each thread its own contiguous slice, four independent sums so loads overlap */
            const int nt = omp_get_num_threads(), tid = omp_get_thread_num();
            const size_t a = n * tid / nt / 8 * 8, b = n * (tid + 1) / nt / 8 * 8;
            uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
            for (size_t i = a; i < b; i += 8) {
                s0 += buf[i] + buf[i + 4], s1 += buf[i + 1] + buf[i + 5];
                s2 += buf[i + 2] + buf[i + 6], s3 += buf[i + 3] + buf[i + 7];
            }
            sink += s0 + s1 + s2 + s3;
        }
        best[p] = bytes / (fasa_now() - t0) / 1e9;
    }
    free(buf);
    __asm__ volatile("" : : "r"(sink));
    return median(best, passes);
}

/* Copies the first `have` rows of every (layer, KV head) cyclically out to `want` rows. */
static void tile_cache(kvcache *kv, int have, int want)
{
    for (int i = have; i < want; i++) kvcache_copy_row(kv, i % have, i);
}

static int deepest_depth(const speed_cfg *cfg)
{
    int deepest = 0;
    for (int i = 0; i < cfg->n_depth; i++) deepest = cfg->depths[i] > deepest ? cfg->depths[i] : deepest;
    return deepest;
}

int speed_fill(const speed_cfg *cfg)
{
    const int deepest = deepest_depth(cfg);
    return cfg->n_fill < deepest ? cfg->n_fill : deepest > 0 ? deepest : 1;
}

int bench_speed(model *m, const profile *prof, const int32_t *ids, int n_ids, const speed_cfg *cfg,
                speed_row **rows, int *n_rows, char *err)
{
    const model_config *c = &m->cfg;
    const int deepest = deepest_depth(cfg), fill = speed_fill(cfg);
    /* the roofline against this machine's bandwidth now, not a constant: 512 MiB read 5 times */
    const double bw = cfg->bandwidth > 0 ? cfg->bandwidth : speed_read_bandwidth((size_t)512 << 20, 5);
    int rc = 0, done = 0;
    if (n_ids < fill + cfg->steps + 1)
        return fasa_error(err, FASA_EARG, "the text (%d tokens) is shorter than the fill (%d) plus %d steps", n_ids,
                          fill, cfg->steps);
    int fasa = 0;
    for (int p = 0; p < cfg->n_policy; p++) {
        const enum speed_policy k = kind_of(cfg->policies[p], prof);
        fasa |= k == SPEED_FASA_C || k == SPEED_FASA_M;
    }
    const int fcs = cfg->fcs ? cfg->fcs : prof ? prof->fcs : 0;
    /* fasa-c and fasa-m as `fasa run` makes them (session_fasa), with this run's budget, F, layout */
    session_opts so = session_defaults();
    so.budget = cfg->budget, so.fcs = fcs, so.tip = cfg->tip, so.kv_cold = cfg->cold_dir;
    so.target_mass = cfg->target_mass;
    if (cfg->rerank >= 0) so.rerank = cfg->rerank;
    if (cfg->group_rerank >= 0) so.group_rerank = cfg->group_rerank;
    if (cfg->tail >= 0) so.tail = cfg->tail;
    if (cfg->recent >= 0) so.n_recent = cfg->recent;
    so.dense_budget = cfg->dense_budget;
    if (fasa) {
        if (!prof) return fasa_error(err, FASA_EARG, "fasa-c and fasa-m need a profile (fasa calibrate MODEL)");
        if (fcs < 1 || 2 * fcs >= c->d_head)
            return fasa_error(err, FASA_EARG, "F must be between 1 and %d", c->d_head / 2 - 1);
    }
    if (!(*rows = calloc((size_t)cfg->n_policy * cfg->n_depth, sizeof **rows)))
        return fasa_error(err, FASA_ENOMEM, "out of memory");
    *n_rows = 0;
    const int P = cfg->n_policy, R = cfg->repeats;
    double *tps = malloc(sizeof(double) * P * R), *attn = malloc(sizeof(double) * P * R);
    struct unit {
        run_state *s;
        policy pol;
        attn_stats st;
        int have_pol, have_st;
        double prefill_tps, anon_mb, file_mb;
        uint64_t kv_read;
    } *u = calloc(P, sizeof *u);
    if (!tps || !attn || !u) { free(tps); free(attn); free(u); return fasa_error(err, FASA_ENOMEM, "out of memory"); }

    /* Every policy's state first (a real prefill, timed, then the tiles); the memory each one
     * adds is its own. */
    for (int pi = 0; pi < P && rc == 0; pi++) {
        const enum speed_policy sp = kind_of(cfg->policies[pi], prof);
        struct unit *x = &u[pi];
        double a0, f0;
        rss(&a0, &f0);
        kv_opts ko = { .f16 = cfg->kv_f16 };
        if (sp == SPEED_FASA_C || sp == SPEED_FASA_M) {
            if ((rc = session_fasa(m, prof, &so, sp == SPEED_FASA_M, &x->pol, &ko, err)) < 0) break;
            x->have_pol = 1;
        } else if (sp == SPEED_QUEST) {
            policy_opts o = policy_defaults(POLICY_QUEST, m, cfg->budget);
            if ((rc = policy_init(&x->pol, m, &o, err)) < 0) break;
            x->have_pol = 1;
            if ((rc = attn_stats_init(&x->st, m, deepest + cfg->steps + 1, STATS_QUEST, 0, err)) < 0) break;
            x->have_st = 1;
        }
        if (!(x->s = run_state_new_kv(m, deepest + cfg->steps + 1, 64, &ko, err))) { rc = FASA_ENOMEM; break; }
        run_state *s = x->s;
        double t0 = fasa_now();
        rc = model_prefill(m, s, ids, fill, NULL, err);
        x->prefill_tps = fill / (fasa_now() - t0);
        if (rc) break;
        tile_cache(&s->kv, fill, deepest);
        if (x->have_st) {
            s->stats = &x->st;
            for (int l = 0; l < c->n_layer; l++) attn_stats_append(&x->st, s, l, deepest);
        }
        if (x->have_pol && (rc = attention_use_policy(s, &x->pol, 0, err)) < 0) break;
        double a1, f1;
        rss(&a1, &f1);
        x->anon_mb = a1 - a0, x->file_mb = f1 - f0;
    }
    /* Then per depth, each repeat runs every policy in turn: a busy minute on a shared machine
     * falls on all of them alike, so the ratios of one run hold. */
    for (int di = 0; di < cfg->n_depth && rc == 0; di++) {
        const int depth = cfg->depths[di];
        for (int pi = 0; pi < P; pi++)
            if (u[pi].have_pol) policy_selected(&u[pi].pol, NULL);   /* counts from this depth on */
        for (int r = 0; r < R && rc == 0; r++)
            for (int pi = 0; pi < P && rc == 0; pi++) {
                run_state *s = u[pi].s;
                s->n_past = depth;
                s->t_attn = 0;
                const uint64_t kv0 = run_state_kv_bytes_read(s);
                const double t0 = fasa_now();
                for (int k = 0; k < cfg->steps && rc == 0; k++) rc = model_forward(m, s, ids + fill + k, 1, 0, err);
                const double secs = fasa_now() - t0;
                tps[pi * R + r] = cfg->steps / secs;
                attn[pi * R + r] = 1e3 * s->t_attn / cfg->steps;
                u[pi].kv_read = run_state_kv_bytes_read(s) - kv0;
            }
        for (int pi = 0; pi < P && rc == 0; pi++) {
            const enum speed_policy sp = kind_of(cfg->policies[pi], prof);
            const run_state *s = u[pi].s;
            speed_row *w = &(*rows)[(*n_rows)++];
            snprintf(w->policy, sizeof w->policy, "%s", names[cfg->policies[pi]]);
            w->depth = depth;
            w->kv_f16 = cfg->kv_f16;
            w->budget = sp == SPEED_FULL ? 0 : cfg->budget;
            w->fcs = sp == SPEED_FASA_C || sp == SPEED_FASA_M ? fcs : 0;
            /* what TIP streams per key and KV head: the copy, or the f16/f32 block */
            if (w->fcs) {
                w->tip_bytes = s->kv.tip_width ? kvcache_tip_bytes(&s->kv) : s->kv.n_split * kvcache_esz(&s->kv);
                w->attended = policy_selected(&u[pi].pol, NULL);
                w->recent = policy_recent(&u[pi].pol.o, cfg->budget);
            }
            w->decode_tok_s = median(tps + pi * R, R);
            w->attn_ms = median(attn + pi * R, R);
            w->bytes_per_token = (double)m->weight_bytes + (double)u[pi].kv_read / cfg->steps;
            w->gb_s = w->bytes_per_token * w->decode_tok_s / 1e9;
            w->roofline = w->gb_s / bw;
            w->bandwidth = bw;
            w->prefill_tok_s = u[pi].prefill_tps;
            const int t = depth + cfg->steps;
            w->kv_resident_mb = kvcache_resident_bytes(&s->kv, t) / 1e6;
            w->kv_cold_mb = kvcache_cold_bytes(&s->kv, t) / 1e6;
            w->kv_total_mb = kvcache_bytes(&s->kv, t) / 1e6;
            w->rss_anon_mb = u[pi].anon_mb, w->rss_file_mb = u[pi].file_mb;
            struct rusage ru;
            getrusage(RUSAGE_SELF, &ru);
            w->peak_rss_mb = ru.ru_maxrss / 1024.0;
            if (cfg->progress) cfg->progress(cfg->progress_ctx, ++done, P * cfg->n_depth);
        }
    }
    for (int pi = 0; pi < P; pi++) {
        if (!u[pi].s) continue;
        u[pi].s->stats = NULL;
        if (u[pi].have_st) attn_stats_free(&u[pi].st);
        if (u[pi].have_pol) policy_free(&u[pi].pol);
        run_state_free(u[pi].s);
    }
    free(u);
    free(tps);
    free(attn);
    return rc;
}

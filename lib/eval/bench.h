/* bench.h - accuracy benchmarks of the selection policies on one model: compound contextual
 * agreement, perplexity (DESIGN.md §6 protocol) and passkey retrieval.
 *
 *   bench_cfg cfg = { .steps = 256, .n_budget = 1, .budgets = { 256 }, .n_ctx = 1, .contexts = { 4096 } };
 *   bench_policy_parse("fasa-1/4", m, &prof, &cfg.policies[cfg.n_policy++], err);
 *   bench_row *rows; int n_rows;
 *   bench_ppl(m, ids, n_ids, &cfg, &rows, &n_rows, err);   // one row per (policy, budget, context)
 *
 * Every task runs the ordinary forward pass: dense prefill, then decode steps whose attention
 * reads what the policy selects (attention.h). Teacher-forced steps run in batches where that
 * is exact (every policy except h2o, whose scores depend on the previous step).
 */
#ifndef FASA_BENCH_H
#define FASA_BENCH_H

#include "attention.h"
#include "model.h"
#include "profile.h"

#define BENCH_MAX 32

typedef struct bench_policy {
    char name[48];           /* as given: fasa, fasa-1/8, fasa-group, stream, ... */
    policy_opts o;           /* budget is filled per run */
} bench_policy;

typedef struct bench_cfg {
    int n_policy;
    bench_policy policies[BENCH_MAX];
    int n_budget, budgets[BENCH_MAX];     /* ppl, passkey; ca uses ks */
    int n_ctx, contexts[BENCH_MAX];       /* ppl contexts C; passkey lengths */
    int n_k, ks[BENCH_MAX];               /* ca */
    int steps;                            /* M decode steps (ppl, ca) */
    int windows;                          /* ppl: windows of the text per context, spread over it (0: 1) */
    int n_depth; double depths[BENCH_MAX];/* passkey */
    int seeds;                            /* passkey samples per (length, depth) */
    int first_sample;                     /* ruler: the first sample's number (0: 1); samples first.. */
    int kv_f16;                           /* ppl, passkey: an f16 KV cache (ca reads f32 keys) */
    int per_layer;                        /* ca: also rows per layer */
    int per_head;                         /* ca: also "mass" rows per (layer, query head) */
    int show;                             /* ruler: each sample's question, answers and outputs on stderr */
    void (*progress)(void *ctx, int done, int total);
    void *progress_ctx;
} bench_cfg;

typedef struct bench_row {
    char task[24], policy[48];
    int budget, context;     /* for ca: budget = K, context = tokens */
    double depth;            /* passkey: where the key sits (0 = start, 1 = end); else -1 */
    int layer;               /* ca per layer or head: the layer; else -1 */
    int head;                /* ca per head: the query head; else -1 */
    double value;            /* ca in [0,1]; ppl; passkey accuracy in [0,1] */
    double extra;            /* ppl: mean NLL; passkey: samples; ca: steps x layers x heads */
    double tokens;           /* ppl: mean tokens a sparse query attended to (0: dense) */
    double kl, agree;        /* ppl beside full attention: mean KL(full || policy) of a step's next-token
                              * distribution, in nats, and the share of steps whose top token is full's;
                              * -1 when not measured (no full policy in the run, or full itself) */
} bench_row;

/* Parses a policy spec: full, oracle, stream, snapkv, h2o, quest, random, fasa, and fasa
 * variants: fasa-1/8, fasa-1/4 (F as a fraction of the chunks), fasa:F, fasa-group,
 * fasa-nodense (layer 0 sparse too); any of them @L.L.L: those layers dense as well. */
int bench_policy_parse(const char *spec, const model *m, const profile *prof, bench_policy *out, char *err);

/* ca: rows "ca" (compound CA per policy and K, in that order, n_policy x n_k), then "mass" (the
 * share of full attention's probability the selected tokens hold, averaged over queries and
 * heads), then with per_layer "ca" and "mass" rows for each layer (layer >= 0), then with per_head
 * "mass" rows for each layer and query head (head >= 0), in that order, each n_policy x n_k. */
int bench_ca(const model *m, const int32_t *ids, int n, const bench_cfg *cfg, bench_row **rows, int *n_rows, char *err);
int bench_ppl(const model *m, const int32_t *ids, int n, const bench_cfg *cfg, bench_row **rows, int *n_rows,
              char *err);
int bench_passkey(const model *m, const bench_cfg *cfg, bench_row **rows, int *n_rows, char *err);
/* ruler: RULER-style tasks (ruler.h) at each length of cfg->contexts, cfg->seeds samples per
 * (task, length); each sample is prefilled once (densely) and decoded under every policy and
 * budget from the same cache. Rows "ruler": task, context = length, policy, budget, value = mean
 * score, extra = samples; then "ruler" rows with task "mean" averaging the tasks. tasks: a mask
 * of ruler task indices (0: all). */
int bench_ruler(const model *m, const bench_cfg *cfg, uint64_t tasks, bench_row **rows, int *n_rows, char *err);

#endif

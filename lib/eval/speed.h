/* speed.h - decode speed of full attention, FASA-C, FASA-M and Quest at chosen cache depths.
 *
 *   speed_cfg c = speed_defaults();
 *   speed_row *rows; int n;
 *   bench_speed(m, &prof, ids, n_ids, &c, &rows, &n, err);   // one row per (policy, depth)
 *
 * The cache is filled by a real dense prefill of the first tokens of a text, then tiled (rows
 * copied) out to the deepest depth: speed does not depend on what the rows hold, and a 32k-token
 * prefill would take longer than everything else. Every policy's state is set up first; then at
 * each depth, each of `repeats` rounds decodes `steps` tokens under every policy in turn, and
 * each (policy, depth) reports medians: on a shared machine a busy moment falls on all policies
 * alike. Rows come depth by depth, policies in the order given.
 */
#ifndef FASA_SPEED_H
#define FASA_SPEED_H

#include "bench.h"

/* SPEED_DEFAULT: what `fasa run` does without flags (fasa-c with a profile, else full), named so */
enum speed_policy { SPEED_FULL, SPEED_FASA_C, SPEED_FASA_M, SPEED_QUEST, SPEED_DEFAULT, SPEED_COUNT };

typedef struct speed_cfg {
    int n_depth, depths[BENCH_MAX];
    int n_policy;
    enum speed_policy policies[SPEED_COUNT];
    int budget, fcs;              /* fasa, quest: N; fasa: F (0: the profile's) */
    float target_mass;            /* fasa, > 0: a budget that sets itself ('fasa run --budget auto'),
                                   * this share of the mass, budget its largest */
    int steps, repeats;           /* decode tokens per repeat; repeats (median) */
    int n_fill;                   /* tokens prefilled for real before tiling (and timed) */
    const char *cold_dir;         /* fasa-m's cold tier */
    int kv_f16;                   /* KV rows as f16 (else f32) */
    int tip;                      /* fasa: what TIP reads (enum fasa_tip, session.h; 0: the default) */
    int rerank;                   /* fasa: session_opts.rerank (-1: the default) */
    int group_rerank;             /* fasa: session_opts.group_rerank (-1: the default) */
    int tail;                     /* fasa: session_opts.tail (-1: the default) */
    int recent;                   /* fasa: session_opts.n_recent (-1: the default) */
    int dense_budget;             /* fasa: session_opts.dense_budget (SESSION_DENSE_BUDGET) */
    double bandwidth;             /* GB/s of the machine's memory, for the roofline fraction (0: measured
                                   * in the run, speed_read_bandwidth) */
    void (*progress)(void *ctx, int done, int total);
    void *progress_ctx;
} speed_cfg;

typedef struct speed_row {
    char policy[16];
    int depth, budget, fcs;
    double tip_bytes;             /* fasa: bytes per key and KV head TIP reads (the copy: a mean; or the block) */
    double attended;              /* fasa: tokens attended per query and head where it selects, mean
                                   * over the steps (the budget, or what auto chose) */
    int recent;                   /* fasa: the recent window it always attends (policy_recent) */
    int kv_f16;
    double decode_tok_s;          /* median over repeats */
    double attn_ms;               /* attention per token (median) */
    double bytes_per_token;       /* weights + KV bytes attention read (code's count) */
    double gb_s, roofline;        /* bytes_per_token x tok/s; its fraction of the bandwidth */
    double bandwidth;             /* GB/s the roofline is against (given, or measured in this run) */
    double prefill_tok_s;         /* the real prefill of n_fill tokens */
    double kv_resident_mb, kv_cold_mb, kv_total_mb;   /* at this depth, by tier */
    double rss_anon_mb, rss_file_mb;  /* what setting up this policy's state (prefill, cache tiled
                                       * to the deepest depth) added to the process */
    double peak_rss_mb;               /* the process's peak, after this row */
} speed_row;

speed_cfg speed_defaults(void);
/* Memory read bandwidth in GB/s: all OpenMP threads sum their slices of a bytes-long buffer (much
 * larger than the caches), the median of passes. */
double speed_read_bandwidth(size_t bytes, int passes);
const char *speed_policy_name(enum speed_policy p);
int speed_policy_parse(const char *name, enum speed_policy *out);

/* Tokens prefilled for real before the cache is tiled: n_fill, at most the deepest depth. */
int speed_fill(const speed_cfg *cfg);

/* May reorder m's chunks (keys_order) when a FASA policy is asked for. */
int bench_speed(model *m, const profile *prof, const int32_t *ids, int n_ids, const speed_cfg *cfg,
                speed_row **rows, int *n_rows, char *err);

#endif

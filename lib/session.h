/* session.h - a model made ready to generate: its calibration profile, attention policy, key
 * layout, KV cache and device, resolved from one options struct. `fasa run` is flags and
 * printing around it; bench and calibrate use its profile resolution and model_prefill.
 *
 *   session_opts o = session_defaults();        // fasa-c when the model has a profile, else full
 *   o.n_ctx = n_prompt + 64;
 *   session *ss;
 *   if (session_open(&ss, m, "model.gguf", &o, err) < 0) ...;   // FASA_EARG: a usage error
 *   fprintf(stderr, "fasa: %s\n", ss->note);                      // what runs, in one line
 *   if (session_prefill(ss, ids, n_prompt, NULL, err) < 0) ...;   // dense; the last logits
 *   int32_t next = sampler_sample(&sp, session_logits(ss));
 *   if (session_step(ss, next, err) < 0) ...;                     // one decode step
 *   session_close(ss);                                            // the model stays open
 *
 * The profile is found in one place (session_find_profile): the file given, else the model's
 * own (MODEL.profile.json beside it, DIR/profile.json in a converted directory, or the
 * profile.json inside a .fasa bundle). With a profile and a FASA mode, each KV head's frequency
 * chunks are put in the profile's order as the model loads (keys_block), so that TIP reads
 * one contiguous block of dominant key dims per token.
 */
#ifndef FASA_SESSION_H
#define FASA_SESSION_H

#include <stddef.h>
#include <stdint.h>

#include "attention.h"
#include "model.h"
#include "keys.h"
#include "profile.h"

enum fasa_mode {
    FASA_MODE_AUTO,     /* fasa-c when a profile is found, else full */
    FASA_MODE_FULL,     /* dense attention */
    FASA_MODE_FASA_C,   /* FASA over the whole cache */
    FASA_MODE_FASA_M,   /* FASA with only the dominant key block in memory, the rest in a cold tier */
};
enum fasa_device { FASA_DEVICE_CPU, FASA_DEVICE_CUDA };
/* --budget auto: chosen on the calibration text (docs/results.md, Accuracy) */
#define SESSION_AUTO_MASS 0.95f
#define SESSION_AUTO_MIN 160
#define SESSION_AUTO_MAX 1024
#define SESSION_AUTO_RECENT 128
/* the dense layer (layer 0) attends to 4 times the budget, chosen as the others' tokens are:
 * chosen on the calibration text (docs/results.md, Accuracy) */
#define SESSION_DENSE_BUDGET (-4)
/* The rows left unchosen join as one estimate (the tail): chosen on the calibration text by KL to
 * full attention, then checked by RULER beside the default without it (docs/results.md, "The
 * unchosen rows as one estimate"); since 2026-11-28. Their values by block of 64 rows (2) rather
 * than one mean (1): closer to full attention in all eight calibration cells (docs/results.md,
 * "The tail's values by block"); since 2026-12-05 */
#define SESSION_TAIL 2

/* What the token importance predictor reads. */
enum fasa_tip {
    FASA_TIP_Q4,        /* each head's own top F chunks, from a 4-bit copy of its KV group's union of them
                         * (the default: as accurate as exact keys on the calibration text, fewer bytes) */
    FASA_TIP_GROUP,     /* the KV group's top F chunks for all its heads, an f16 block of the cache */
    FASA_TIP_UNION,     /* each head's own chunks inside an f16 block holding its group's union */
};

const char *fasa_mode_name(enum fasa_mode m);     /* "auto", "full", "fasa-c", "fasa-m" */
int fasa_mode_parse(const char *s);               /* the mode, or -1 ("fasa" means fasa-c) */

typedef struct session_opts {
    enum fasa_mode mode;
    const char *profile;       /* a profile file; NULL: the model's own, when it has one */
    /* the attention policy (fasa modes) */
    int budget;                /* N: tokens attended per query (256); with target_mass, the most */
    float target_mass;         /* > 0: the budget sets itself (policy auto_mass): per layer, head and step
                                * the fewest tokens whose estimated attention mass reaches this share,
                                * between auto_min and budget; the recent window is then 128 tokens */
    int auto_min;
    int fcs;                   /* F: dominant chunks per head (0: the profile's) */
    int n_dense_layers;        /* layers 0..n-1 attend densely (1) */
    uint64_t dense_mask;       /* and these, layer l < 64 as bit l */
    int dense_budget;          /* those layers attend to this many tokens (> 0), -dense_budget times
                                * the budget (< 0), or all (0): policy_opts.dense_budget */
    int n_sink, n_recent;      /* forced tokens within the budget (-1: the policy's defaults) */
    int group;                 /* one selection per KV head (TIP over the group's chunks) */
    enum fasa_tip tip;         /* what TIP reads (FASA_TIP_Q4) */
    int rerank;                /* > 1: TIP picks rerank times N - forced tokens, exact scores keep the best */
    int tail;                  /* the rows left unchosen join as one estimate (policy_opts.tail): 2 on,
                                * their values by block (policy_opts.tail_blocks), 1 on with one mean
                                * value for all, 0 off, -1 SESSION_TAIL; not with group, target_mass,
                                * group_rerank or the CUDA device (1 or 2 with them: an error; -1: off) */
    int group_rerank;          /* >= 1: TIP picks group_rerank times that per head, each head keeps the
                                * best of its KV group's union by exact scores (policy_opts) */
    int order_chunks;          /* full mode: order key dims by the profile as fasa-c does */
    int exact;                 /* every weight product in f32, x not rounded (ops_exact) */
    /* the KV cache */
    int kv_f16;                /* 1 f16, 0 f32, -1 the default (f16; f32 with CUDA) */
    const char *kv_cold;       /* fasa-m: the cold tier's directory (NULL: $TMPDIR or /tmp) */
    int n_ctx;                 /* tokens the cache holds (required) */
    int n_batch;               /* prefill batch (64) */
    enum fasa_device device;   /* CUDA: the decode steps' attention on device 0 */
    /* session_prefill calls this after each batch with the tokens done of its n (NULL: none) */
    void (*progress)(void *ctx, int done, int total);
    void *progress_ctx;
} session_opts;

typedef struct session {
    model *m;                  /* borrowed: the caller opens and closes it */
    session_opts o;
    enum fasa_mode mode;       /* what runs: FULL, FASA_C or FASA_M */
    profile prof;
    int has_profile;
    char profile_path[4096];   /* where it came from (a bundle: "MODEL (profile.json)") */
    policy pol;
    int has_policy;
    run_state *s;
    void *cuda;                /* the device's state when device == CUDA */
    char note[4096 + 1024];    /* one line: the mode and its settings */
} session;

session_opts session_defaults(void);
const char *fasa_tip_name(enum fasa_tip t);   /* "q4", "group", "union" */
int fasa_tip_parse(const char *s);            /* or -1 */

/* The attention policy of o's FASA settings for m and prof: what `fasa run` uses, and what
 * `fasa bench --policy default` runs. Fills po (po->prof = prof). */
void session_policy_opts(const model *m, const profile *prof, const session_opts *o, policy_opts *po);
/* The policy and the cache layout they need (FASA-M: fasa_m, with cold_dir): orders m's key dims
 * for the f16 block layouts (keys_block). Returns 0 with pol initialised and kvo filled, or < 0
 * (FASA_EARG: settings the model cannot meet). */
int session_fasa(model *m, const profile *prof, const session_opts *o, int fasa_m, policy *pol, kv_opts *kvo,
                 char *err);

/* The profile for a model at model_path: path when given, else the model's own. 1 when found,
 * loaded and checked against m (where names it), 0 when there is none, < 0 on an error. */
int session_find_profile(const model *m, const char *model_path, const char *path, profile *out, char *where,
                         size_t where_cap, char *err);

/* Resolves o for m (opened from model_path): profile, mode, policy, key layout, cache, device.
 * FASA_EARG: options that cannot work with this model (a usage error); other statuses: failures. */
int  session_open(session **out, model *m, const char *model_path, const session_opts *o, char *err);
void session_close(session *ss);

/* Runs n tokens densely (prefill: queries before the end of a prefill never attend sparsely);
 * all_logits: (n, n_vocab) floats for every position's logits, or NULL. With o.progress, batch
 * by batch (the same batches, so the same results), reporting after each. */
int session_prefill(session *ss, const int32_t *ids, int n, float *all_logits, char *err);
/* One decode step on token id; its logits are then session_logits(ss). */
int session_step(session *ss, int32_t id, char *err);
/* The logits of the last position run (n_vocab floats). */
static inline float *session_logits(const session *ss) { return ss->s->logits; }

/* The prompt as token ids: text wrapped in the model's chat template when chat (system: NULL
 * for the template's default), else as is. *ids is malloc'ed; returns the count, or < 0
 * (FASA_EARG when chat is asked of a model without a template). chat < 0: the template when
 * the vocabulary has one. */
int session_prompt_ids(const model *m, const char *text, int chat, const char *system, int32_t **ids, char *err);

/* --device cuda can run here: a device with fasa's kernels. 0, or < 0 with the reason. */
int session_cuda_check(char *err);
/* The CUDA devices fasa's kernels can use, as text (one line each, or JSON when json), malloc'ed;
 * "built without CUDA" or "no CUDA device ..." when there are none. */
char *session_devices(int json);

#endif

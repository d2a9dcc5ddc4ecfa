/* calibrate.h - contextual agreement (CA) of every frequency chunk with its head's ranking.
 *
 *   calib_opts o = calib_defaults(m);          // K list, prefill, F, plane chunks
 *   profile p;
 *   if (calibrate_run(m, ids, n, &o, &p, err) < 0) ...;    // ids: the sample, tokenized
 *   profile_save(&p, "model.profile.json", err);
 *
 * The sample's first n_prefill tokens are prefilled densely; every later token is a decode step
 * (teacher-forced: its query sees the cache of every token before it and itself). At every step,
 * for every layer, query head and chunk, CA_K = |TopK(q.K) intersect TopK(q^(c).K^(c))| / K, with
 * K capped at the number of cached tokens. The observer hooks into the ordinary forward pass
 * (model.h attn_obs); teacher-forced steps run in batches, which gives the same queries and
 * caches as one step at a time. Counts are integers, so results do not depend on threads.
 */
#ifndef FASA_CALIBRATE_H
#define FASA_CALIBRATE_H

#include "model.h"
#include "profile.h"

typedef struct calib_opts {
    int n_prefill;                 /* dense prefix; the rest of the sample is decode steps */
    int n_k, ks[PROFILE_MAX_K];
    int rank_k;                    /* K whose mean CA orders the chunks */
    int fcs;                       /* F, recorded as the profile's default */
    enum chunk_def chunks;
    uint64_t sample_hash;
    void (*progress)(void *ctx, int done, int total);
    void *progress_ctx;
} calib_opts;

calib_opts calib_defaults(const model *m);
int calibrate_run(const model *m, const int32_t *ids, int n, const calib_opts *o, profile *out, char *err);

/* Top-K bucket of every score: bucket[i] = smallest b with i among the ks[b] largest scores
 * (ties: lower index first), n_k when none. ks ascending. scratch: 2n + 256 entries. Exposed for tests
 * and for bench --task ca. */
void calib_buckets(const float *score, int n, const int *ks, int n_k, uint8_t *bucket, uint64_t *scratch);
/* Plain twin: a full sort. */
void calib_buckets_ref(const float *score, int n, const int *ks, int n_k, uint8_t *bucket);

#endif

/* attn_impl.h - what attention.c (the per-layer step) and fasa_decode.c (FASA's decode path)
 * share. Internal to lib/fasa. */
#ifndef FASA_ATTN_IMPL_H
#define FASA_ATTN_IMPL_H

#include "attention.h"

#define DECODE_PARTS 8   /* most parts one decode query's keys are cut into */

/* Parts a decode step cuts t cached keys into (threads take them independently). */
static inline int decode_parts(int t)
{
    return t >= 4096 ? DECODE_PARTS : t >= 1024 ? 4 : t >= 128 ? 2 : 1;
}

/* Below this many cached keys a decode step's attention is a few microseconds of work, less than
 * waking the thread team: it stays on the calling thread. */
#define DECODE_PARALLEL_MIN 64

/* The attention step's scratch (one per run state). Rows are n_ctx floats; "per thread" means
 * n_threads of them, thread tid's at tid * n_ctx. */
struct attn_work {
    int n_threads, n_ctx, n_batch, grp, d_head;
    float *scores;   /* (n_threads, n_ctx) one query's softmax weights */
    float *tmp;      /* (n_threads, n_ctx) the rest of split keys' scores */
    float *dscores;  /* (n_threads, 2 grp, n_ctx) a KV group's queries against a run of rows */
    float *bscores;  /* (n_threads, 2 n_batch, n_ctx) a batch's queries against the cache */
    float *dpart;    /* (n_kv, DECODE_PARTS, grp, d_head + 2) decode partials: max, sum, output */
    float *vmean;    /* (n_kv, d_head) the tail's mean values, once per KV group a step (fasa_decode) */
};

/* Rows [a, b) of KV group g for the group's decode queries, into slot p of the partials. */
void attn_rows(const model *m, run_state *s, int l, int g, int p, int a, int b);
/* Head h's chosen rows idx[0..n) of [lo, hi), into slot 2 of its group's partials; with the tail
 * (policy_opts.tail), the rest of [lo, hi) into slot 3 (attn_tail, from the head's TIP row and
 * its group's mean value in s->attn->vmean). */
void attn_chosen(const model *m, run_state *s, int l, int h, const int32_t *idx, int n, int lo, int hi);
/* The tail: the rows of [lo, hi) not among idx[0..n) as one partial (max, sum, weighted values:
 * d + 2 floats; an empty one (-inf, 0, zeros)). Their logits are estimated as scale S[i] + c (S:
 * TIP's raw scores of the rows; c: the chosen rows' exact logits less their TIP estimates, on
 * average), their values as vmean, the mean value of every cached row (kvcache_value_mean).
 * Chosen on the calibration text (docs/results.md, "The unchosen rows as one estimate").
 * With vpre (policy_opts.tail_blocks; kvcache_value_prefix: the running sums of nb blocks of 64
 * rows), the rows of each whole block take the block's mean value, weighted by their estimated
 * mass, and only the rows past the last whole block take vmean. */
void attn_tail(float *part, int d, const float *vmean, const float *vpre, int nb, const float *S, int lo, int hi,
               const int32_t *idx, int n, float c);
/* Merges slots 0..P-1 of every head's partials into s->att_out. */
void attn_merge(const model *m, run_state *s, int P);

/* Bytes of keys a selection reads before attention (TIP: the dominant dims of every key, or the
 * whole block when each head's own chunks lie in it). */
uint64_t attn_select_bytes(const policy *p, const kvcache *kv, int l, int g, int t);

/* FASA decode over split keys, layer l, forced rows [0, lo) and [hi, t): TIP, selection and
 * focused attention in one parallel region (fasa_decode.c says how). TIP picks mid rows per head;
 * when that is more than keep (policy_opts.rerank), their exact scores keep the best keep.
 * tq: the heads' queries on the dominant block, ldq apart. */
void fasa_decode(const model *m, run_state *s, int l, int lo, int hi, int mid, int keep, const float *tq, int ldq,
                 int threads);
/* TIP of one decode query over the dominant block for every head, into p->tip (the per-query
 * path then selects from it). */
void fasa_tip_all(const model *m, run_state *s, int l, const float *tq, int ldq);
/* The heads' queries as TIP reads them: s->q itself (*ldq = d_head), or with per-head chunks
 * (block 2) each head's query on its own chunks of the block, zero elsewhere (*ldq = n_split). */
const float *fasa_tip_queries(const model *m, const run_state *s, int l, int *ldq);

#endif

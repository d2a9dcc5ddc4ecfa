/* attention.h - the attention step of a layer, and which cached tokens a decode query reads: one
 * policy interface for FASA and the baselines, plus the running statistics some of them need.
 *
 *   policy p;
 *   policy_opts o = policy_defaults(POLICY_FASA, m, 256);   // budget 256, 4 sinks, 32 recent
 *   o.prof = &prof;
 *   if (policy_init(&p, m, &o, err) < 0) ...;
 *   attn_stats st;                         // Quest pages, SnapKV votes, H2O scores, as needed
 *   attn_stats_init(&st, m, n_ctx, policy_stats_flags(o.kind), n_prefill, err);
 *   s->stats = &st;
 *   attention_use_policy(s, &p, n_prefill, err);   // prefill stays dense; sizes p's scratch
 *   model_forward(m, s, &tok, 1, 0, err);          // decode steps attend to the selected tokens
 *   policy_free(&p); attn_stats_free(&st);
 *
 * model_forward calls attention_layer once per layer. It picks one of four paths (attention.c):
 * a dense batch (prefill), a dense decode step split along the sequence, FASA's decode step over
 * the contiguous dominant key block (fasa_decode.c), or per query: each (query, head) asks
 * policy_select (select.c) for its rows. Every policy reads the cache in place through
 * kvcache_scores / kvcache_accum; nothing copies it.
 * Definitions (DESIGN.md §3): FASA's token importance predictor (TIP) scores every cached token
 * with the 2F dims of the head's dominant frequency chunks only, S = sum_{c in dom} q^(c).K^(c),
 * and focused attention (FAC) is exact softmax attention over the top-N tokens by S.
 */
#ifndef FASA_ATTENTION_H
#define FASA_ATTENTION_H

#include <stdint.h>

#include "forward.h"
#include "profile.h"

enum policy_kind {
    POLICY_FULL, POLICY_FASA, POLICY_ORACLE, POLICY_STREAM, POLICY_SNAPKV, POLICY_H2O,
    POLICY_QUEST, POLICY_RANDOM, POLICY_COUNT
};

typedef struct policy_opts {
    enum policy_kind kind;
    int budget;              /* N: tokens attended per query (including forced ones) */
    int fcs;                 /* F: dominant chunks (fasa, random) */
    int n_dense_layers;      /* layers 0..n-1 always attend densely */
    uint64_t dense_mask;     /* and so does layer l < 64 whose bit l is set */
    int dense_budget;        /* those layers attend, chosen as the others' are, to this many
                              * tokens (> 0) or -dense_budget times the budget (< 0); 0: all */
    int n_sink, n_recent;    /* tokens always kept, within the budget: the first n_sink and the
                              * last n_recent (POLICY_RECENT_*: below). fasa: 4 and
                              * POLICY_RECENT_DEFAULT (chosen on the calibration text,
                              * docs/results.md); stream: 4, then all recent */
    int group;               /* fasa: one selection per KV head from the group's summed TIP */
    float auto_mass;         /* fasa, > 0: a budget that sets itself: per (layer, head, step) the fewest
                              * tokens whose attention mass, estimated from TIP's scores, reaches this
                              * share, at least auto_min and at most budget (the recent window is then
                              * auto_min / 2 unless n_recent says) */
    int auto_min;
    int tip_bits;            /* fasa: 4: TIP reads each head's own chunks from the cache's 4-bit copy
                              * of its group's union (kvcache.h), or rounds keys the same way when
                              * the cache has none; 0: TIP reads the keys as cached */
    int tip_union;           /* tip_bits: each head scores every dim of the copy (its group's union of
                              * chunks), not only its own: the same bytes and the same kernel work */
    int block;               /* fasa, TIP over the contiguous block split keys keep: 1, every head
                              * scores its group's top F chunks (the block), selecting per head;
                              * 2, every head its own top F chunks, inside a block that holds the
                              * union of its group's (keys_order_union) */
    int rerank;              /* fasa, > 1: TIP picks rerank times the tokens it chooses, and the exact
                              * scores of those (the whole keys) keep the best */
    int group_rerank;        /* fasa with tip_bits, >= 1: each head's TIP picks group_rerank times the
                              * tokens it chooses, and every head of a KV group keeps the best of the
                              * group's union of picks by their exact scores (the union's keys read
                              * once for the group) */
    int tail;                /* fasa, with room beside the forced rows: the rows of [lo, hi) left
                              * unchosen join the attention as one estimate (attention.c, attn_tail):
                              * their logits from TIP's scores, their values the mean value; TIP's
                              * offset from the exact logits measured on the chosen rows (1) or on
                              * a sample of the unchosen (2) (attention.c, tail_offset) */
    int tail_blocks;         /* with tail: the values by block of 64 rows, each block's mean value
                              * weighted by the estimated mass of its unchosen rows, not one mean */
    int window;              /* snapkv observation window (32); pooling kernel 7 */
    int page;                /* quest page size (16) */
    uint64_t seed;           /* random chunks */
    const profile *prof;     /* fasa */
} policy_opts;

typedef struct policy {
    policy_opts o;
    const model *m;
    int n_dom;               /* dims per key the selector reads (2F), 0 when it reads none */
    int16_t *dom;            /* (n_layer, n_head, 2F) canonical dims of the dominant chunks */
    int dom_end;             /* 1 + the largest of them: a key block that wide holds them all */
    int tip_width;           /* tip_bits: dims of the copy (the widest union, to a multiple of 8) */
    int16_t *tip_map;        /* (n_layer, n_kv_head, tip_width) the key dim each copy dim holds, or -1 */
    uint64_t tip_id;         /* kvcache_tip_map_id of tip_map: a cache's copy of another map is not read */
    int16_t *tip_pos;        /* (n_layer, n_head, 2F) where each of a head's dims sits in the copy */
    /* scratch for a context of n_ctx tokens and n_threads threads (policy_reserve) */
    int n_ctx, n_threads;
    int32_t *idx;            /* (n_threads, n_ctx) a query's chosen rows */
    float *score;            /* (n_threads, n_ctx) its selection scores */
    uint64_t *keys;          /* (n_threads, n_ctx) packed (score, index) keys for top-k */
    float *tip;              /* fasa: (n_head, tip_ld) a decode step's TIP scores */
    int tip_ld;              /* n_ctx + 16: rows n_ctx floats apart fell on the same cache sets,
                              * and TIP then streamed at a third of its bandwidth in some runs */
    float *tipq;             /* fasa, block 2: (n_head, d_head) each head's query on its own chunks */
    float *rr;               /* fasa with rerank or group_rerank: (n_threads, POLICY_RR_FLOATS(n_ctx)) */
    uint64_t *n_sel;         /* (n_threads, 8) tokens selected, selections made (policy_selected) */
    uint64_t *cand;          /* fasa decode: (threads, n_head, mid) each thread's picks per head */
    size_t cand_cap;
    int *cand_n;             /* (n_threads, n_head) how many */
} policy;

enum { STATS_QUEST = 1, STATS_SNAPKV = 2, STATS_H2O = 4 };

/* Running statistics, updated by the forward pass (dense or sparse) as tokens arrive. */
typedef struct attn_stats {
    int flags, n_layer, n_head, n_kv, d, n_ctx, n_threads;
    int page;
    float *page_min, *page_max;  /* (n_layer, n_kv, n_ctx / page, d) */
    int *pages_done;             /* (n_layer, n_kv) complete pages summarised */
    int snap_lo, snap_hi;        /* queries at positions [lo, hi) vote */
    float *votes;                /* (n_threads, n_layer, n_head, n_ctx) attention sums */
    float *h2o;                  /* (n_threads, n_layer, n_head, n_ctx) */
} attn_stats;

/* Per-thread scratch a selection needs. */
typedef struct policy_scratch {
    float *score;            /* (n_ctx) */
    uint64_t *sel;           /* (n_ctx) */
    float *tip;              /* fasa: this head's TIP scores, already computed (used in place), or NULL */
    float *rr;               /* fasa with rerank or group_rerank: POLICY_RR_FLOATS(n_rr), its last
                              * n_rr bytes zero (they stay zero between calls) */
    int n_rr;                /* the context rr is sized for (>= the query's position + 1) */
} policy_scratch;

/* A rerank's scratch for n_ctx tokens: the exact scores (3 n_ctx floats, policy_rerank), another
 * head's TIP scores and the group's union (n_ctx each), and n_ctx bytes of marks. */
#define POLICY_RR_FLOATS(n_ctx) ((size_t)(n_ctx) * 5 + (size_t)(n_ctx) / 4 + 4)
#define POLICY_RR_MARK(rr, n_ctx) ((uint8_t *)((rr) + (size_t)(n_ctx) * 5))

/* The tokens a selection of `budget` among t forces in: attention sinks [0, *lo) and the recent
 * window [*hi, t). 1 when they leave room in the budget (the rest is then chosen among [lo, hi)),
 * 0 when they do not (everything is ranked together, the forced tokens first). */
int policy_forced(const policy_opts *o, int t, int budget, int *lo, int *hi);

/* fasa's recent window under a budget: n_recent when >= 0; auto budgets auto_min / 2; else
 * POLICY_RECENT_DEFAULT: POLICY_RECENT tokens, at most half the budget (small budgets keep half
 * for TIP), and POLICY_RECENT_HALF: half the budget (the default until 2026-12-07). */
enum { POLICY_RECENT = 32, POLICY_RECENT_DEFAULT = -1, POLICY_RECENT_HALF = -2 };
int policy_recent(const policy_opts *o, int budget);

/* The budget that sets itself: how many of [lo, hi) the fewest tokens whose estimated attention
 * mass reaches P need beside the forced ones [0, lo) and [hi, t), from S[0..t), TIP's scores of
 * every token (they stand for the logits, times scale = 1/sqrt(d)). Their indices, ascending,
 * into ix[0..count) (ix: room for hi - lo); *bar: the cut on their masses (topk_mass_cut).
 * ws: 2 t floats of scratch. */
int policy_auto_count(const float *S, int t, int lo, int hi, float scale, float P, float *ws, int32_t *ix, float *bar);

/* Layer l is one of the dense layers (which attend to dense_budget tokens when that is set). */
static inline int policy_layer_dense(const policy_opts *o, int l)
{
    return l < o->n_dense_layers || (l < 64 && (o->dense_mask >> l & 1));
}

/* The tokens a dense layer attends to per query (dense_budget): every token (INT_MAX) when
 * that is 0. */
static inline int policy_dense_budget(const policy_opts *o)
{
    const int64_t n = o->dense_budget > 0 ? o->dense_budget : -(int64_t)o->dense_budget * o->budget;
    return n > 0 && n < 0x7fffffff ? (int)n : 0x7fffffff;
}

/* The tokens layer l attends to per query: the budget, or a dense layer's. */
static inline int policy_layer_budget(const policy_opts *o, int l)
{
    return policy_layer_dense(o, l) ? policy_dense_budget(o) : o->budget;
}

/* Layer numbers 0..63 separated by sep ("20,14" or "20.14") as bits of *mask (ORed in);
 * -1 on anything else. */
int policy_parse_layers(const char *s, char sep, uint64_t *mask);
/* A dense layers' budget (policy_opts.dense_budget): "N" tokens, 0 to 2^24 (*out = N), or "Kx",
 * K times the budget, 1 to 1024 (*out = -K); -1 on anything else. */
int policy_parse_dense_budget(const char *s, int *out);

const char *policy_name(enum policy_kind k);
int  policy_parse(const char *name, enum policy_kind *out);
policy_opts policy_defaults(enum policy_kind kind, const model *m, int budget);
int  policy_init(policy *p, const model *m, const policy_opts *o, char *err);
/* Whether o's selection takes the tail estimate: per head, a fixed budget, no group rerank. */
int  policy_tail_fits(const policy_opts *o);
void policy_free(policy *p);
/* Sizes p's scratch for a context of n_ctx tokens and n_threads threads (grows, never shrinks;
 * the decode loop then allocates nothing). */
int  policy_reserve(policy *p, int n_ctx, int n_threads, char *err);
/* Room for `threads` threads' picks of mid tokens per head (FASA's decode step); 0 or < 0. */
int  policy_reserve_picks(policy *p, int threads, int mid);

/* TIP's candidates reranked (policy_opts.rerank): the best want of the m rows cand (ascending) of
 * KV head g by their exact scores against q (the whole keys), kept ascending in place. E: 3 m
 * floats of scratch, keys: m. Returns min(want, m). */
int policy_rerank(const struct kvcache *kv, int layer, int g, const float *q, int32_t *cand, int m, int want,
                  float *E, uint64_t *keys);
/* Rows [lo, hi) marked in mark, ascending, into U (clearing their marks); their count. */
int policy_marked(uint8_t *mark, int lo, int hi, int32_t *U);
/* Mean tokens a sparse query attended to since policy_reserve or the last call (0: none), and
 * the count of them into *n when n is given; resets the tally. */
double policy_selected(policy *p, uint64_t *n);
static inline void policy_count(policy *p, int tid, int n)
{
    p->n_sel[8 * tid] += (uint64_t)n, p->n_sel[8 * tid + 1]++;
}
/* The cache layout the policy reads fastest from: with tip_bits, the TIP copy's width and map. */
void policy_kv_opts(const policy *p, kv_opts *ko);
/* Head h's query (canonical layout) as TIP reads the copy: its own dims at their copy positions,
 * zero elsewhere (tip_width floats). */
void policy_tip_query(const policy *p, int layer, int head, const float *q, float *out);
/* The statistics (STATS_*) a policy of this kind reads. */
int  policy_stats_flags(enum policy_kind kind);

/* Chooses the tokens query head `head` at position pos reads in `layer`, among positions 0..pos.
 * q_tok: all query heads of this token (canonical layout), so group selection can sum them.
 * Writes at most budget indices, ascending, into idx and returns their count; returns -1 when
 * the query should attend densely (budget >= pos + 1, a dense layer, or a full policy). */
int policy_select(const policy *p, const run_state *s, const attn_stats *st, int layer, int head,
                  int pos, const float *q_tok, int budget, int32_t *idx, policy_scratch *sc);

/* ---------------------------------------------------------------- the attention step */

/* Attaches policy p (NULL: full attention) to a run state: queries at positions >= sparse_from
 * attend to what it selects. Reserves p's scratch for s. */
int attention_use_policy(run_state *s, policy *p, int sparse_from, char *err);
/* Layer l's attention for the n tokens at s->n_past.. whose rotated queries are in s->q and
 * whose keys and values are cached: writes s->att_out (n, n_head * d_head). < 0 only when an
 * attention hook fails. */
int attention_layer(const model *m, run_state *s, int layer, int n, char *err);
/* The step's scratch, owned by the run state (run_state_new_kv makes it). */
struct attn_work *attn_work_new(const model *m, int n_ctx, int n_batch, int split, int n_threads, char *err);
void attn_work_free(struct attn_work *w);

int  attn_stats_init(attn_stats *st, const model *m, int n_ctx, int flags, int n_prefill, char *err);
void attn_stats_free(attn_stats *st);
/* After the keys of positions < n_cached are in the cache of `layer`: summarise new full pages. */
void attn_stats_append(attn_stats *st, const run_state *s, int layer, int n_cached);
/* The softmax weights one query gave to tokens idx[0..n) (idx NULL: row0..row0+n-1). Thread-safe. */
void attn_stats_observe(attn_stats *st, int layer, int head, int pos, const float *p,
                        const int32_t *idx, int row0, int n);
/* Folds the per-thread sums of `layer` together (call outside parallel regions). */
void attn_stats_reduce(attn_stats *st, int layer);

#endif

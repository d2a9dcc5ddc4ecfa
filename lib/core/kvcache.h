/* kvcache.h - the key/value cache: where attention reads past tokens from.
 *
 *   kvcache kv;
 *   kvcache_init(&kv, n_layer, n_kv_head, n_ctx, d_head, &(kv_opts){ 0 }, err);
 *   float *k = kvcache_k(&kv, layer, kv_head);   // (n_ctx, kvcache_kw(&kv)), rows 0..n-1 valid
 *   kvcache_free(&kv);
 *
 * Keys are stored after RoPE in the canonical layout (model.h): frequency chunks as adjacent
 * pairs, in the model's chunk order, so once the chunks are in rank order (a converted model, or
 * keys_order at load) the dominant chunks are the first dims of every row.
 *
 * Split keys (n_split > 0): dims [0, n_split) of every key, the dominant block, live in their own
 * contiguous (n_ctx, n_split) array per (layer, KV head), and the remaining dims in another, so
 * the token importance predictor streams only the block. FASA-M (cold_dir set) keeps only that
 * block in memory: the rest of the keys and all values go to a cold tier, a file mapping under
 * cold_dir (the file is unlinked at once, so nothing is left behind), read only for the rows
 * focused attention chooses.
 *
 * Rows are f32 or f16 (kv_opts.f16; what llama.cpp keeps by default): f16 halves the bytes every
 * decode step streams. Readers go through kvcache_scores / kvcache_accum, which pick the kernel
 * for the type; kvcache_k / kvcache_kr / kvcache_v give typed pointers into f32 caches only.
 *
 * The TIP copy (tip_width > 0): beside the keys, a compact copy of the dims the token importance
 * predictor reads (for each (layer, KV head), the dims tip_map lists: the union of its query
 * heads' dominant chunks), each key's values rounded to 4-bit integers with one f16 scale per key
 * (amax / 7, rounded to f16 before the values are rounded against it): 2 + tip_width / 2 bytes a
 * key. The values are rounded after an offset per dim is taken off: in some dims, those RoPE
 * turns slowly, every key shares a large part (in Qwen2.5-Coder-1.5B on the calibration text the
 * largest mean of a dim is a median 3.9 times the largest spread around it over the (layer, KV
 * head)s, 1.5 to 13 past layer 0), and with it in a key's largest value the rest had been
 * rounded to a few levels. Positions fall into spans (kvcache_tip_span: [0, 64), spans doubling
 * from 64 to KVCACHE_TIP_SPAN keys, then KVCACHE_TIP_SPAN keys each); a span's offsets are the
 * mean of the previous span as the copy holds it (none for the first), computed from the copy
 * when the span's first key arrives and kept in f32 beside the tiles, and a score adds the
 * query's product with them. Ranking needs order, not exact values: on the calibration text the
 * copy keeps about as much attention mass as exact keys do (docs/results.md, Accuracy) at 4 bits a value.
 * It is laid out in tiles of 16 keys for ops_tip_q4 and read only by kvcache_tip_scores. With a
 * cold tier (FASA-M) the copy is all that stays in memory; keys and values go to the file.
 */
#ifndef FASA_KVCACHE_H
#define FASA_KVCACHE_H

#include <stddef.h>
#include <stdint.h>

#define KVCACHE_TIP_SPAN 1024   /* the longest span of keys sharing the TIP copy's offsets (64 2^k) */

/* The span of position i, and the first position of span s. */
static inline int kvcache_tip_span(int i)
{
    if (i < 64) return 0;
    if (i < KVCACHE_TIP_SPAN) return 32 - __builtin_clz((unsigned)i / 64);
    return 32 - __builtin_clz(KVCACHE_TIP_SPAN / 64) + (i - KVCACHE_TIP_SPAN) / KVCACHE_TIP_SPAN;
}
static inline int kvcache_tip_span_start(int s)
{
    const int k = 32 - __builtin_clz(KVCACHE_TIP_SPAN / 64);   /* the span that starts at KVCACHE_TIP_SPAN */
    return s == 0 ? 0 : s < k ? 64 << (s - 1) : (s - k + 1) * KVCACHE_TIP_SPAN;
}

typedef struct kv_opts {
    int n_split;             /* 0: whole key rows; else the width of the dominant block */
    const char *cold_dir;    /* FASA-M: where the cold tier's file goes (needs n_split or a copy) */
    int f16;                 /* rows stored as f16 (rounded to nearest even) instead of f32 */
    int tip_width;           /* dims of the TIP copy (a multiple of 8); 0: no copy */
    const int16_t *tip_map;  /* (n_layer, n_kv_head, tip_width) the key dim each copy dim holds, -1 none */
    int value_sums;          /* keep running sums of the values (kvcache_value_mean) */
} kv_opts;

typedef struct kvcache {
    int n_layer, n_kv_head, n_ctx, d_head;
    int n_split;
    int f16;         /* element type: f16 when set, else f32 */
    void *k;         /* (n_layer, n_kv_head, n_ctx, kw): whole rows, or the dominant block */
    void *kr;        /* (n_layer, n_kv_head, n_ctx, d_head - n_split) when split, else NULL */
    void *v;         /* (n_layer, n_kv_head, n_ctx, d_head) */
    void *cold;      /* the cold tier's mapping (kr and v; k and v with a TIP copy), or NULL */
    size_t cold_len;
    int tip_width;   /* the TIP copy: dims per key at most, 0 when there is none */
    uint64_t tip_id; /* kvcache_tip_map_id of its map: a policy reads the copy only when its map is this one */
    int n_tiles;     /* tiles of 16 keys per (layer, KV head): n_ctx rounded up */
    int16_t *tip_map;/* (n_layer, n_kv_head, tip_width) */
    int *tip_w;      /* (n_layer, n_kv_head) its dims: to its map's last dim, a multiple of 8 */
    size_t *tip_at;  /* (n_layer, n_kv_head) where its tiles start in tq */
    uint8_t *tq;     /* per (layer, KV head): (n_tiles, tip_w / 8, 64) 4-bit values (ops_tip_q4) */
    uint16_t *tscale;/* (n_layer, n_kv_head, 16 n_tiles) one f16 scale per key */
    float *toff;     /* (n_layer, n_kv_head, n_spans, tip_width) the offsets per dim of each span */
    uint8_t *tset;   /* (n_layer, n_kv_head, n_spans) the span's offsets hold for the span before as it is */
    int n_spans;     /* spans of n_ctx keys (kvcache_tip_span) */
    float *vcum;     /* value_sums: (n_layer, n_kv_head, n_ctx / KVCACHE_VSUM_ROWS, d_head) the sum of the
                      * values of rows [0, 64 (b + 1)), taken when row 64 b + 63 is written; or NULL */
} kvcache;

#define KVCACHE_VSUM_ROWS 64

int  kvcache_init(kvcache *kv, int n_layer, int n_kv_head, int n_ctx, int d_head, const kv_opts *o, char *err);
void kvcache_free(kvcache *kv);
/* Bytes n tokens occupy: all of them, in memory, and in the cold tier. */
size_t kvcache_bytes(const kvcache *kv, int n_tokens);
size_t kvcache_resident_bytes(const kvcache *kv, int n_tokens);
size_t kvcache_cold_bytes(const kvcache *kv, int n_tokens);

/* Width of a row of kvcache_k: d_head, or n_split when split. */
static inline int kvcache_kw(const kvcache *kv) { return kv->n_split ? kv->n_split : kv->d_head; }

/* Bytes of one element. */
static inline size_t kvcache_esz(const kvcache *kv) { return kv->f16 ? 2 : 4; }

/* The three parts of a (layer, KV head): keys (whole rows, or the dominant block when split),
 * the rest of the keys (split only), values. */
enum kv_part { KV_KEYS, KV_REST, KV_VALUES };

static inline int kvcache_width(const kvcache *kv, enum kv_part p)
{
    return p == KV_KEYS ? kvcache_kw(kv) : p == KV_REST ? kv->d_head - kv->n_split : kv->d_head;
}
/* Row 0 of part p of (layer, head), whatever the type. */
static inline void *kvcache_rows(const kvcache *kv, enum kv_part p, int layer, int head)
{
    void *base = p == KV_KEYS ? kv->k : p == KV_REST ? kv->kr : kv->v;
    return (char *)base + ((size_t)layer * kv->n_kv_head + head) * kv->n_ctx * kvcache_width(kv, p) * kvcache_esz(kv);
}
/* f32 caches only */
static inline float *kvcache_k(const kvcache *kv, int layer, int head)
{
    return kvcache_rows(kv, KV_KEYS, layer, head);
}
static inline float *kvcache_kr(const kvcache *kv, int layer, int head)
{
    return kvcache_rows(kv, KV_REST, layer, head);
}
static inline float *kvcache_v(const kvcache *kv, int layer, int head)
{
    return kvcache_rows(kv, KV_VALUES, layer, head);
}

/* Attention reads, in the cache's type. Rows are idx[0..n) when idx is given (then nq == 1),
 * else row0..row0+n-1.
 *   kvcache_scores: S[i lds + j] = scale * dot(Q[i ldq ..], row j of part p), i < nq (lds >= n;
 *                   one query: lds is not used)
 *   kvcache_accum:  O[i ldo + c] = sum_{j < len_i} P[i n + j] value row j [c], i < nq
 *                   (len NULL: all n rows) */
void kvcache_scores(const kvcache *kv, enum kv_part p, int layer, int head, int row0, const int32_t *idx, int n,
                    const float *Q, int nq, int ldq, float scale, float *S, int lds);
void kvcache_accum(const kvcache *kv, int layer, int head, int row0, const int32_t *idx, int n, const float *P,
                   int nq, const int *len, float *O, int ldo);

/* TIP over the copy: S[h lds + i] for rows a <= i < b and the nq <= 8 queries Q (f32, ldq apart,
 * tip_width dims each in copy order, zero where a query has no dim: (layer, head)'s first tip_w
 * are read). S points at row 0. */
void kvcache_tip_scores(const kvcache *kv, int layer, int head, int a, int b, const float *Q, int nq, int ldq, float *S,
                        int lds);
/* The copy's rounding, for callers that score without a copy and must agree with it exactly:
 * a key's mapped dims less the offsets off (tw, copy order; NULL: none) as integers v (-7..7) and
 * the scale returned, v ~ (key - off) / scale; a query's tw values as qi (-127..127), *qsum their
 * sum, and the scale returned. A score is then
 *   fmaf((float)(sum_j v[j] qi[j]), key scale * query scale, kvcache_tip_offset_dot(q, off, tw)).
 * A span's offsets: kvcache_tip_span_add adds each of its keys as the copy holds it (v, scale)
 * to sum (tw, zeroed first), in order; kvcache_tip_span_offset turns the sum over its n keys and
 * the span's own offsets into the next span's. */
float kvcache_tip_key(const float *key, const int16_t *map, int tw, const float *off, int8_t *v);
float kvcache_tip_query(const float *q, int tw, int8_t *qi, int32_t *qsum);
float kvcache_tip_offset_dot(const float *q, const float *off, int tw);
void kvcache_tip_span_add(float *sum, const int8_t *v, float scale, int tw);
void kvcache_tip_span_offset(const float *sum, int n, const float *off, int tw, float *next);
/* The dims the copy keeps of a (layer, head) whose map (tw entries) is map: to its last mapped
 * dim, a multiple of 8 (at least 8). */
int kvcache_tip_w(const int16_t *map, int tw);
/* A hash (FNV-1a) of a copy's map of n entries: two maps of one width that differ read as
 * different copies. */
uint64_t kvcache_tip_map_id(const int16_t *map, size_t n);
/* Bytes a token takes in a copy of `heads` (layer, head)s mapped by map (tw entries each). */
double kvcache_tip_map_bytes(const int16_t *map, size_t heads, int tw);
/* Bytes a key of tw dims takes in the TIP copy (its nibbles, its f16 scale and its share of its
 * span's f32 offsets); in kv's copy of (layer, head); and in kv's, averaged over (layer, head),
 * whose widths differ. */
static inline double kvcache_tip_key_bytes(int tw)
{
    return tw > 0 ? tw / 2 + 2 + 4.0 * tw / KVCACHE_TIP_SPAN : 0;
}
static inline double kvcache_tip_row_bytes(const kvcache *kv, int layer, int head)
{
    return kv->tip_width ? kvcache_tip_key_bytes(kv->tip_w[(size_t)layer * kv->n_kv_head + head]) : 0;
}
double kvcache_tip_bytes(const kvcache *kv);

/* Key i of (layer, head) as a whole row: in place, or assembled into buf (d_head floats). */
const float *kvcache_key_row(const kvcache *kv, int layer, int head, int i, float *buf);
/* The mean of the values of rows [0, t) of (layer, head) into out (d_head floats), from the running
 * sums (a cache made with value_sums; rows written in order) and the last t % 64 rows; without
 * the sums, from every row. */
void kvcache_value_mean(const kvcache *kv, int layer, int head, int t, float *out);
/* The running sums of (layer, head)'s values: row b holds the sum over rows [0, 64 (b + 1)), for
 * the *nb blocks of 64 that rows [0, t) complete (d_head floats a row); NULL without the sums. */
const float *kvcache_value_prefix(const kvcache *kv, int layer, int head, int t, int *nb);
/* Starts loading rows idx[0..n) of the keys (every part) and of the values (software prefetch),
 * so that focused attention's gathers from them (from memory, or FASA-M's cold tier) overlap
 * with other work: scoring the first rows, or TIP of the next heads. A hint: no effect on
 * results. */
void kvcache_prefetch(const kvcache *kv, int layer, int head, const int32_t *idx, int n);
/* The same for parts first..last (a part the cache does not have is skipped). */
void kvcache_prefetch_parts(const kvcache *kv, enum kv_part first, enum kv_part last, int layer, int head,
                            const int32_t *idx, int n);
/* Starts loading, for writing, the lines that layer's keys, values and TIP copy of position i
 * occupy in every KV head (decode calls it before the layer's projections, so that the writes
 * after them do not wait for memory). A hint: no effect on results. */
void kvcache_prefetch_put(const kvcache *kv, int layer, int i);
/* Stores key row `key` / value row `val` (d_head floats) at position i. */
void kvcache_put_key(kvcache *kv, int layer, int head, int i, const float *key);
void kvcache_put_value(kvcache *kv, int layer, int head, int i, const float *val);
/* Copies row `from` to row `to` in every part of every (layer, head) (benchmarks fill deep
 * caches this way). */
void kvcache_copy_row(kvcache *kv, int from, int to);

#endif

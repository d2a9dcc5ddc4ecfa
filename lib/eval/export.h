/* export.h - what a calibration profile says, in numbers, and in other engines' formats.
 *
 *   profile p;
 *   if (profile_load(&p, "P.json", err) < 0) ...;
 *   export_summary s;
 *   if (export_summarize(&p, 256, 8, &s, err) < 0) ...;      // K = 256, F = 8
 *   double best = s.layers[l].best_mean;                       // also n_union, by_votes[] ...
 *   cJSON *o = export_summary_json(&p, "P.json", &s);          // same facts as JSON
 *   export_summary_free(&s);
 *
 *   export_compare c;                                          // dominant-set overlap of two profiles
 *   if (export_compare_profiles(&a, "A.json", &b, "B.json", 8, &c, err) < 0) ...;
 *   export_compare_free(&c);
 *
 *   export_sglang_ds(&p, EXPORT_DS_QK, "channels.json", err); // SGLang Double Sparsity channels
 *   export_json_dims(&p, 8, "dims.json", err);                 // engine-neutral dominant dims
 *   export_csv(&p, "ca.csv", err);                             // k,layer,head,chunk,ca,rank
 *
 * Dims are always Hugging Face dims of one head (0..d_head-1, "rotate_half" layout): chunk j is
 * dims (j, j + d/2) under the "plane" definition and (2j, 2j + 1) under "adjacent".
 *
 * Rankings at K: at the profile's rank_k the stored ranking (profile_rank) is used; at another K
 * the head's chunks are ranked by mean CA at that K, ties to the lower chunk id (the rule
 * profile_rank_all uses). Exports always use the stored ranking.
 *
 * SGLang Double Sparsity channel config ("sglang-ds"): a JSON object with one key per layer,
 * "model.layers.<i>.self_attn.<qk|q|k>_proj", whose value is a table of rows, one per query head
 * (qk, q) or per KV head (k, from the group ranking), each row a permutation of 0..d_head-1: the
 * head's chunks best first, each as its two dims. SGLang keeps the first ds_heavy_channel_num
 * columns, so --ds-heavy-channel-num 2F selects exactly the top-F chunks. Its backend gathers
 * both q and k with the same table, which needs n_head == n_kv_head (no GQA).
 *
 * Every file is written to a temporary name beside the target and renamed into place.
 */
#ifndef FASA_EXPORT_H
#define FASA_EXPORT_H

#include <stddef.h>
#include <stdint.h>

#include "profile.h"

struct cJSON;

typedef struct export_layer {
    double best_min, best_mean, best_max;  /* over query heads: CA of the head's best chunk */
    double top_mean;                       /* mean CA of the heads' top-F chunks */
    double all_mean;                       /* mean CA of all (head, chunk) pairs */
    int n_union;                           /* distinct chunks in the union of the heads' top-F sets */
    int n_shared;                          /* chunks in every head's top-F set */
    int16_t *by_votes;                     /* (n_chunk) chunks by votes, then summed CA, then id */
    int16_t *votes;                        /* (n_chunk) votes[c]: heads with chunk c in their top F */
} export_layer;

typedef struct export_summary {
    int k, ki, fcs;                        /* the K shown (ki its index in ks) and F */
    int n_layer, n_head, n_chunk;
    int16_t *rank;                         /* (n_layer, n_head, n_chunk) ranking at K, best first */
    export_layer *layers;                  /* (n_layer) */
    double best_mean, top_mean, all_mean;  /* means over layers */
    double n_union_mean;
    int16_t *by_votes, *votes;             /* (n_chunk) the same votes over every layer and head */
} export_summary;

/* Fills s for K (one of p->ks) and F in [1, n_chunk]. */
int  export_summarize(const profile *p, int k, int fcs, export_summary *s, char *err);
void export_summary_free(export_summary *s);
/* The summary as a cJSON object (caller deletes); NULL when out of memory. */
struct cJSON *export_summary_json(const profile *p, const char *path, const export_summary *s);

/* The head's chunks ranked by mean CA at ks[ki] (the stored ranking at rank_k). */
void export_rank_at(const profile *p, int ki, int layer, int head, int16_t *out);
/* One line on where the frequencies are under a chunk definition, for legends. */
const char *export_chunk_note(enum chunk_def def);
/* Hugging Face dims of chunk c of a d_head-dim head under a chunk definition. */
void export_chunk_dims(enum chunk_def def, int d_head, int chunk, int dims[2]);

#define EXPORT_COMPARE_MAX_F 3

/* Overlap of dominant sets: for each F, the mean over heads of |top-F(A) ∩ top-F(B)| / F. Sets
 * are compared as Hugging Face dims (|dims ∩ dims| / 2F), which equals the chunk overlap when both
 * profiles use one chunk definition and stays meaningful when they do not. */
typedef struct export_compare {
    int n_layer, n_chunk, n_f;
    int f[EXPORT_COMPARE_MAX_F];
        /* chance overlap of random sets: f / n_chunk */ /* n_chunk/8, n_chunk/4 and fcs, distinct, ascending */
    double *head;                          /* (n_f, n_layer) query heads (stored rankings) */
    double *kv;                            /* (n_f, n_layer) KV heads (group rankings) */
    double overall[EXPORT_COMPARE_MAX_F], kv_overall[EXPORT_COMPARE_MAX_F];
} export_compare;

/* Fails (FASA_EMISMATCH, naming both files) unless a and b have the same layer, head, KV head and
 * head dim counts. */
int  export_compare_profiles(const profile *a, const char *path_a, const profile *b, const char *path_b,
                             int fcs, export_compare *c, char *err);
void export_compare_free(export_compare *c);
struct cJSON *export_compare_json(const export_compare *c, const char *path_a, const char *path_b);

enum export_ds_type { EXPORT_DS_QK, EXPORT_DS_Q, EXPORT_DS_K };

int export_sglang_ds(const profile *p, enum export_ds_type type, const char *path, char *err);
/* {"format": "fasa-dims", "version": 1, "model": {...}, "d_head", "chunk_definition", "dims_layout", "rank_k", "fcs",
 *  "layers": [{"layer", "heads": [{"head", "kv_head", "dominant_chunks", "dims_hf"}],
 *              "kv_heads": [{"kv_head", "dominant_chunks", "dims_hf"}]}]} */
int export_json_dims(const profile *p, int fcs, const char *path, char *err);
/* Long format, every K: "k,layer,head,chunk,ca,rank" with rank 1 = the head's best chunk at that K. */
int export_csv(const profile *p, const char *path, char *err);

#endif

/* convert.h - write any loaded model as a Hugging Face directory (or a .fasa bundle), with every
 * KV head's q/k projection rows reordered so its dominant frequency chunks come first.
 *
 *   profile p;  profile_load(&p, "m.profile.json", err);   // checked against m
 *   convert_opts o = convert_defaults();
 *   o.prof = &p;  o.prof_path = "m.profile.json";
 *   if (convert_write(m, &o, "m-fasa", err) < 0) ...;      // a directory
 *   o.bundle = 1;
 *   if (convert_write(m, &o, "m-fasa", err) < 0) ...;      // m-fasa.fasa, one file
 *   o = convert_defaults(); o.reorder = 0;                 // plain GGUF -> Hugging Face export
 *
 * The output directory holds:
 *   model.safetensors   every tensor under its Hugging Face name, dequantised to o.dtype (q/k rows
 *                       reordered, lm_head omitted when tied); __metadata__ {"format": "pt"} and,
 *                       when reordered, "fasa.chunk_order" (JSON [n_layer][n_kv_head][d_head/2]:
 *                       slot r of a KV head holds frequency chunk order[r], dominant first) and
 *                       "fasa.profile_sample_hash"
 *   config.json         model_type, dims, RoPE, norm eps, tied embeddings, ...
 *   tokenizer.json, tokenizer_config.json   copied from a Hugging Face source (with
 *                       generation_config.json and special_tokens_map.json when present); built
 *                       from the vocabulary, merges and token types of a GGUF source
 *   generation_config.json   bos/eos ids (GGUF source)
 *   profile.json        the profile, its q/k hash updated to the written weights (when given)
 * The chunk order of KV head g in layer l is the profile's group_rank[l][g]; the file rows of head
 * h of that group are: file row h*d + 2r + t = Hugging Face row h*d + t*d/2 + order[r] (q, k and
 * their biases), which model_open reads back as ROPE_LAYOUT_PERMUTED. Without reordering
 * (o.reorder = 0) the rows are in the plain Hugging Face (rotate_half) layout whatever the source
 * layout was (llama.cpp's interleave undone), so transformers can load the result.
 *
 * Atomic: everything is built in a temporary directory next to the output and renamed into place
 * at the end (a bundle: built, packed into a temporary file, renamed); a failed or interrupted
 * convert leaves nothing at the output path. The result is deterministic: same inputs, same bytes.
 * Memory: the converted tensors are held in memory until written (the model's size at o.dtype).
 */
#ifndef FASA_CONVERT_H
#define FASA_CONVERT_H

#include <stddef.h>
#include <stdint.h>

#include "base.h"
#include "model.h"
#include "profile.h"

typedef struct convert_opts {
    int dtype;               /* st_dtype of the written tensors: ST_F32, ST_F16, ST_BF16, or -1 (the
                              * default): the source's where it is one of them, else f16 (a quantised
                              * GGUF: f16 holds its dequantised values far better than they need) */
    int reorder;             /* 1 (default): chunk order from prof->group_rank; 0: Hugging Face layout */
    const profile *prof;     /* required to reorder; otherwise optional (copied when given) */
    const char *prof_path;   /* for messages */
    int bundle, zstd;        /* write one .fasa file; compress it */
} convert_opts;

convert_opts convert_defaults(void);

/* Where convert_write puts its output: out, or out + ".fasa" for a bundle not already so named. */
void convert_out_path(const convert_opts *o, const char *out, char *buf, size_t cap);

/* The dtype convert_write writes for m: o->dtype, or the default it resolves (-1). */
int convert_dtype(const model *m, const convert_opts *o);
/* Writes the converted model (see above). Checks the profile against m first (dims and q/k
 * hash; reordering also needs chunks defined as RoPE planes). Refuses an existing non-empty
 * output directory; an existing bundle file is replaced atomically. */
int convert_write(const model *m, const convert_opts *o, const char *out, char *err);

/* For q/k head rows of KV head g in layer l: src[x] = the source file dim that becomes output dim
 * x (x < d_head), for a target chunk order (order[r] = frequency chunk of pair r) or, with order
 * NULL, the Hugging Face layout. */
void convert_row_map(const model *m, int layer, int kv_head, const int16_t *order, int *src);

/* tokenizer.json (+ tokenizer_config.json and generation_config.json) in dir, built from a GGUF
 * model's tokenizer.ggml.* arrays: byte-level BPE with the pre-tokenizer its "pre" name implies,
 * CONTROL tokens as special added tokens, USER_DEFINED as plain ones; or, for a SentencePiece
 * vocabulary ("llama"), BPE with byte fallback whose merges are every split of a piece into two
 * pieces ranked by the piece's score (as transformers' converter writes them), the prefix "▁" a
 * Prepend normalizer when add_space_prefix is set, UNKNOWN and CONTROL tokens special. */
int convert_gguf_tokenizer(const model *m, const char *dir, char *err);

#endif

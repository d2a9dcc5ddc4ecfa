/* tokenizer.h - byte-level BPE (GPT-2 family: SmolLM2, Llama-3, Qwen2), decode, chat templates.
 *
 *   tokenizer *tok;
 *   char err[FASA_ERRLEN];
 *   if (tokenizer_load_json(&tok, "tokenizer.json", err) < 0) ...;
 *   int32_t ids[512];
 *   int n = tokenizer_encode(tok, text, strlen(text), 1, ids, 512);   // 1: parse special tokens
 *   char piece[256];
 *   int len = tokenizer_decode(tok, ids[0], piece, sizeof piece);       // raw bytes, not NUL-terminated
 *   tokenizer_free(tok);
 *
 * Pre-tokenisation uses each family's regular expression through PCRE2 (UTF + UCP), as written
 * in tokenizer.json or known for the GGUF "tokenizer.ggml.pre" name. Ids agree with Hugging Face
 * `tokenizers` (scripts/tokenizer_check.py compares them on >= 10,000 varied lines).
 * A tokenizer is immutable after loading except through tokenizer_set_special; encode and decode
 * may run on one tokenizer from several threads at once.
 */
#ifndef FASA_TOKENIZER_H
#define FASA_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>
#include "base.h"

typedef struct tokenizer tokenizer;

enum tokenizer_pre { TOKENIZER_PRE_GPT2, TOKENIZER_PRE_SMOLLM, TOKENIZER_PRE_LLAMA3, TOKENIZER_PRE_QWEN2 };
enum tokenizer_chat { TOKENIZER_CHAT_CHATML, TOKENIZER_CHAT_LLAMA3 };

/* The system message SmolLM2's chat template inserts when the conversation has none. */
#define TOKENIZER_SMOLLM_SYSTEM "You are a helpful AI assistant named SmolLM, trained by Hugging Face"

/* From a Hugging Face tokenizer.json (model.type "BPE", byte-level; merges as "a b" strings or as
 * ["a", "b"] pairs; added_tokens with "special", "lstrip", "rstrip", "single_word"; model
 * "ignore_merges"). The pre_tokenizer must be one of the known families: ByteLevel (GPT2),
 * Digits(individual) + ByteLevel (SMOLLM), or a Split with the Llama-3 or Qwen2 regex + ByteLevel;
 * anything else is FASA_EUNSUPPORTED with a message saying what. An "NFC" normalizer (Qwen2) is
 * accepted but not applied: text already in NFC, i.e. nearly all text, is unaffected.
 * bos/eos come from tokenizer_config.json beside the file when it exists, else from well-known
 * token names (eos: <|im_end|>, <|eot_id|>, <|end_of_text|>, <|endoftext|>, </s>). */
int tokenizer_load_json(tokenizer **out, const char *path, char *err);
/* The same from a tokenizer.json held in memory (len bytes, no NUL needed); name (NULL:
 * "tokenizer.json") is used in messages only. No tokenizer_config.json is read, so bos/eos come
 * from the well-known token names. */
int tokenizer_parse_json(tokenizer **out, const char *json, size_t len, const char *name, char *err);

/* From vocabulary arrays (as GGUF stores them: tokenizer.ggml.tokens / token_type / merges /
 * pre). types may be NULL; type 3 (CONTROL) tokens are special added tokens, type 4
 * (USER_DEFINED) plain added tokens (see tokenizer_encode). pre is the GGUF pre name: "smollm",
 * "gpt2" or "default" (also for NULL), "llama-bpe" or "llama3" (which also turns on
 * ignore_merges, as llama.cpp does), "qwen2"; others are FASA_EUNSUPPORTED. token_lens and
 * merge_lens may be NULL for NUL-terminated strings; otherwise strings need not be
 * NUL-terminated. A merge whose parts or result are not tokens is an error (FASA_EFORMAT).
 * bos/eos are guessed from token names as for tokenizer_load_json: set the file's own with
 * tokenizer_set_special. */
int tokenizer_load_vocab(tokenizer **out, int n_vocab, const char *const *tokens,
                         const uint64_t *token_lens, const int32_t *types,
                         int n_merges, const char *const *merges, const uint64_t *merge_lens,
                         const char *pre, char *err);

void tokenizer_free(tokenizer *t);

int tokenizer_n_vocab(const tokenizer *t);
/* Id of an exact token string, or -1. Ordinary tokens are spelled in their byte-level form
 * ("\xC4\xA0the", i.e. "Ġthe", for " the"); added tokens as written ("<|im_end|>"). */
int tokenizer_find(const tokenizer *t, const char *piece);
int tokenizer_bos(const tokenizer *t);   /* -1 if none */
int tokenizer_eos(const tokenizer *t);   /* end of turn for chat: <|im_end|>, <|eot_id|>, ... */
/* Overrides bos and eos; an id outside the vocabulary (e.g. -1) means none. */
void tokenizer_set_special(tokenizer *t, int bos, int eos);
/* 1 for special added tokens (tokenizer.json "special", GGUF CONTROL), else 0. */
int tokenizer_is_special(const tokenizer *t, int id);
enum tokenizer_pre tokenizer_pre_kind(const tokenizer *t);

/* Encode len bytes. No BOS is added.
 * Added tokens are split out first, leftmost-longest: special ones only when parse_special is
 * set, plain (non-special) ones always, as `tokenizers` does (parse_special 0 is its
 * encode_special_tokens = True). Each remaining piece is pre-tokenised and BPE-merged. A byte
 * whose symbol is not in the vocabulary (SmolLM2 lacks 21, e.g. 0x04 and 0xFF) becomes the
 * tokenizer.json unk_token, or is dropped when there is none, as in `tokenizers`.
 * Any bytes are accepted: each maximal invalid UTF-8 subsequence is replaced by U+FFFD first,
 * which gives exactly what `tokenizers` returns for bytes.decode("utf-8", errors="replace") and
 * what llama.cpp does (so such bytes do not survive a decode round trip; valid text does).
 * Returns the number of ids (which may exceed max_ids: then only max_ids were written), or < 0
 * (FASA_EARG for bad arguments or len > INT_MAX, FASA_ENOMEM). The count is at most len for
 * valid UTF-8 and at most 3 * len otherwise (a lone invalid byte becomes U+FFFD's 3 bytes). */
int tokenizer_encode(const tokenizer *t, const char *text, size_t len, int parse_special,
                     int32_t *ids, int max_ids);

/* Bytes of one token: its characters mapped back through the byte-level table, or, if it has
 * characters outside that table, its own UTF-8 (the ByteLevel decoder of `tokenizers`; added
 * tokens such as "<|im_end|>" come out as written, and callers that hide special tokens check
 * tokenizer_is_special). Returns the length (may exceed cap: then only cap were written), or
 * < 0 for a bad id. A token's bytes may be part of a UTF-8 character: concatenate before
 * printing. */
int tokenizer_decode(const tokenizer *t, int32_t id, char *buf, size_t cap);

/* Render a chat prompt: optional system message, one user message, and the assistant header.
 * CHATML: "<|im_start|>system\n...<|im_end|>\n<|im_start|>user\n...<|im_end|>\n<|im_start|>assistant\n".
 * LLAMA3: "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n...<|eot_id|>"
 *         "<|start_header_id|>user<|end_header_id|>\n\n...<|eot_id|>"
 *         "<|start_header_id|>assistant<|end_header_id|>\n\n" (messages trimmed, as its template does).
 * system == NULL: no system block (SmolLM2's template would add TOKENIZER_SMOLLM_SYSTEM; pass it
 * to get that). Encode the result with parse_special set.
 * Like snprintf: writes at most cap bytes including the NUL (out may be NULL when cap is 0) and
 * returns the full length, or FASA_EARG (user NULL, unknown kind). */
int tokenizer_chat_render(enum tokenizer_chat kind, const char *system, const char *user,
                          char *out, size_t cap);

#endif

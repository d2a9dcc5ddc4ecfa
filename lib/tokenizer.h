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
 * in tokenizer.json or known for the GGUF "tokenizer.ggml.pre" name.
 */
#ifndef FASA_TOKENIZER_H
#define FASA_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>
#include "common.h"

typedef struct tokenizer tokenizer;

enum tokenizer_pre { TOKENIZER_PRE_GPT2, TOKENIZER_PRE_SMOLLM, TOKENIZER_PRE_LLAMA3, TOKENIZER_PRE_QWEN2 };
enum tokenizer_chat { TOKENIZER_CHAT_CHATML, TOKENIZER_CHAT_LLAMA3 };

/* From a Hugging Face tokenizer.json (model.type "BPE", byte-level; merges as "a b" strings or as
 * ["a", "b"] pairs; added_tokens with "special"). */
int tokenizer_load_json(tokenizer **out, const char *path, char *err);

/* From vocabulary arrays (as GGUF stores them: tokenizer.ggml.tokens / token_type / merges /
 * pre). types may be NULL; type 3 (CONTROL) and 4 (USER_DEFINED) are added tokens that encode
 * matches before pre-tokenisation when parse_special is set. pre is the GGUF pre name
 * ("smollm", "gpt2", "llama-bpe", "qwen2", ...). Strings need not be NUL-terminated. */
int tokenizer_load_vocab(tokenizer **out, int n_vocab, const char *const *tokens,
                         const uint64_t *token_lens, const int32_t *types,
                         int n_merges, const char *const *merges, const uint64_t *merge_lens,
                         const char *pre, char *err);

void tokenizer_free(tokenizer *t);

int tokenizer_n_vocab(const tokenizer *t);
/* Id of an exact token string (e.g. "<|im_end|>"), or -1. */
int tokenizer_find(const tokenizer *t, const char *piece);
int tokenizer_bos(const tokenizer *t);   /* -1 if none */
int tokenizer_eos(const tokenizer *t);   /* end of turn for chat: <|im_end|>, <|eot_id|>, ... */
void tokenizer_set_special(tokenizer *t, int bos, int eos);
int tokenizer_is_special(const tokenizer *t, int id);
enum tokenizer_pre tokenizer_pre_kind(const tokenizer *t);

/* Encode len bytes (any bytes: invalid UTF-8 is encoded byte-wise like HF tokenizers does).
 * Returns the number of ids (which may exceed max_ids: then only max_ids were written), or < 0. */
int tokenizer_encode(const tokenizer *t, const char *text, size_t len, int parse_special,
                     int32_t *ids, int max_ids);

/* Bytes of one token (byte-level BPE decoded back to raw bytes). Returns the length (may exceed
 * cap: then only cap were written), or < 0 for a bad id. */
int tokenizer_decode(const tokenizer *t, int32_t id, char *buf, size_t cap);

/* Render a chat prompt: optional system message, one user message, and the assistant header.
 * CHATML: "<|im_start|>system\n...<|im_end|>\n<|im_start|>user\n...<|im_end|>\n<|im_start|>assistant\n".
 * Returns the length written (NUL-terminated, truncated to cap) or the needed length. */
int tokenizer_chat_render(enum tokenizer_chat kind, const char *system, const char *user,
                          char *out, size_t cap);

#endif

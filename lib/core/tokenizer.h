/* tokenizer.h - BPE tokenizers (byte-level: SmolLM2, Llama-3, Qwen2; SentencePiece-style with byte
 * fallback: Llama 2, Mistral, Gemma, TinyLlama), decode, chat templates.
 *
 *   tokenizer *tok;
 *   char err[FASA_ERRLEN];
 *   if (tokenizer_load_json(&tok, "tokenizer.json", err) < 0) ...;
 *   int32_t ids[512];
 *   int n = tokenizer_encode(tok, text, strlen(text), 1, ids, 512);   // 1: parse special tokens
 *   char piece[256];
 *   int len = tokenizer_decode(tok, ids[0], piece, sizeof piece);       // raw bytes, not NUL-terminated
 *   tokenizer_chat chat;                                                // the model's own chat template
 *   if (tokenizer_chat_of(tok, &chat) == 0)
 *       n = tokenizer_encode_prompt(tok, &chat, NULL, "Hi!", ids, 512); // its default system message
 *   tokenizer_free(tok);
 *
 * Byte-level BPE pre-tokenises with each family's regular expression through PCRE2 (UTF + UCP),
 * as written in tokenizer.json or known for the GGUF "tokenizer.ggml.pre" name.
 * SentencePiece-style BPE writes spaces as U+2581 (\xE2\x96\x81, "▁"), optionally after a
 * prefix "▁", merges characters into pieces, and spells a character no piece covers as byte tokens
 * <0x00>..<0xFF>. From a GGUF (tokenizer.ggml.model "llama") it follows llama.cpp: the adjacent pair
 * whose concatenation is the piece with the highest score merges first, leftmost on ties; any
 * tokenizer.ggml.merges are ignored, as llama.cpp does. From a tokenizer.json it follows `tokenizers`:
 * merges by rank from model.merges.
 * Ids agree with Hugging Face `tokenizers` and llama.cpp (scripts/tokenizer_check.py compares them on
 * >= 10,000 varied lines).
 * A tokenizer is immutable after loading except through tokenizer_set_special and
 * tokenizer_set_chat_template; encode and decode may run on one tokenizer from several threads at once.
 */
#ifndef FASA_TOKENIZER_H
#define FASA_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>
#include "base.h"

struct gguf_file;
typedef struct tokenizer tokenizer;

enum tokenizer_type { TOKENIZER_BYTE_LEVEL, TOKENIZER_SPM };
enum tokenizer_pre { TOKENIZER_PRE_GPT2, TOKENIZER_PRE_SMOLLM, TOKENIZER_PRE_LLAMA3, TOKENIZER_PRE_QWEN2 };

/* From a Hugging Face tokenizer.json (model.type "BPE"; merges as "a b" strings or as ["a", "b"]
 * pairs; added_tokens with "special", "lstrip", "rstrip", "single_word"; model "ignore_merges").
 * Byte-level: the pre_tokenizer must be one of the known families: ByteLevel (GPT2),
 * Digits(individual) + ByteLevel (SMOLLM), or a Split with the Llama-3 or Qwen2 regex + ByteLevel.
 * An "NFC" normalizer (Qwen2) is accepted but not applied: text already in NFC, i.e. nearly all
 * text, is unaffected.
 * SentencePiece-style (model.byte_fallback true, or a "▁" normalizer or Metaspace pre_tokenizer):
 * normalizer null, Replace(" ", "▁"), Prepend("▁") or a Sequence of those; pre_tokenizer null or
 * Metaspace("▁", prepend_scheme first/always/never, split); the decoder's Strip(" ", 1, 0) or
 * Metaspace says whether decoding drops the leading space (tokenizer_decode_text). byte_fallback
 * needs all 256 tokens <0x00>..<0xFF>.
 * Anything else is FASA_EUNSUPPORTED with a message saying what.
 * bos/eos come from tokenizer_config.json beside the file when it exists (also add_bos_token,
 * add_eos_token and chat_template; else chat_template.jinja beside it), else from the
 * post_processor and well-known token names (eos: <|im_end|>, <|eot_id|>, <end_of_turn>,
 * <|end_of_text|>, <|endoftext|>, </s>, <eos>). */
int tokenizer_load_json(tokenizer **out, const char *path, char *err);
/* The same from a tokenizer.json held in memory (len bytes, no NUL needed); name (NULL:
 * "tokenizer.json") is used in messages only. No tokenizer_config.json is read, so bos/eos come
 * from the post_processor and the well-known token names, and there is no chat template. */
int tokenizer_parse_json(tokenizer **out, const char *json, size_t len, const char *name, char *err);

/* From a parsed GGUF's tokenizer.ggml.* keys: model "gpt2" (byte-level BPE: tokens, token_type,
 * merges, pre as for tokenizer_load_vocab) or "llama" (SentencePiece BPE: tokens, scores,
 * token_type, add_space_prefix (default 1); merges ignored). bos_token_id / eos_token_id,
 * add_bos_token (default 1 for "llama", 0 for "gpt2") and add_eos_token are read, and eos
 * becomes the end of a chat turn when the vocabulary has one (<|im_end|>, <|eot_id|>,
 * <end_of_turn>), since that is what ends generation. tokenizer.chat_template is kept
 * (tokenizer_chat_template). Token types: 3 (CONTROL), and for "llama" 2 (UNKNOWN), are special
 * added tokens, 4 (USER_DEFINED) plain added tokens, 6 (BYTE) the <0xNN> tokens. The file's
 * types are kept as written: llama.cpp also retypes some tokens by their spelling (a "</s>" that
 * is text in Gemma 3 and Qwen2.5 becomes a control token there), `tokenizers` does not.
 * A file without tokenizer.ggml.tokens returns 0 with *out NULL (a model used with ids only).
 * Messages name g's file. */
int tokenizer_load_gguf(tokenizer **out, const struct gguf_file *g, char *err);

/* From vocabulary arrays of a byte-level BPE (as GGUF stores them: tokenizer.ggml.tokens /
 * token_type / merges / pre). types may be NULL; type 3 (CONTROL) tokens are special added
 * tokens, type 4 (USER_DEFINED) plain added tokens (see tokenizer_encode). pre is
 * the GGUF pre name: "smollm", "gpt2" or "default" (also for NULL), "llama-bpe" or "llama3"
 * (which also turns on ignore_merges, as llama.cpp does), "qwen2"; others are
 * FASA_EUNSUPPORTED. token_lens and merge_lens may be NULL for NUL-terminated strings;
 * otherwise strings need not be NUL-terminated. A merge whose parts or result are not tokens is
 * an error (FASA_EFORMAT). bos/eos are guessed from token names as for tokenizer_load_json: set
 * the file's own with tokenizer_set_special. */
int tokenizer_load_vocab(tokenizer **out, int n_vocab, const char *const *tokens,
                         const uint64_t *token_lens, const int32_t *types,
                         int n_merges, const char *const *merges, const uint64_t *merge_lens,
                         const char *pre, char *err);

void tokenizer_free(tokenizer *t);

int tokenizer_n_vocab(const tokenizer *t);
/* Id of an exact token string, or -1. Byte-level tokens are spelled in their byte-level form
 * ("\xC4\xA0the", i.e. "Ġthe", for " the"), SentencePiece ones with "▁" ("\xE2\x96\x81the");
 * added tokens as written ("<|im_end|>"). */
int tokenizer_find(const tokenizer *t, const char *piece);
int tokenizer_bos(const tokenizer *t);   /* -1 if none */
int tokenizer_eos(const tokenizer *t);   /* end of turn for chat: <|im_end|>, <|eot_id|>, ... */
/* 1 when the tokenizer's configuration puts BOS before an encoded text (GGUF add_bos_token,
 * tokenizer_config.json add_bos_token, a TemplateProcessing post_processor) and it has one.
 * tokenizer_encode never adds it; tokenizer_encode_prompt does. */
int tokenizer_add_bos(const tokenizer *t);
/* Overrides bos and eos; an id outside the vocabulary (e.g. -1) means none. */
void tokenizer_set_special(tokenizer *t, int bos, int eos);
/* 1 for special added tokens (tokenizer.json "special", GGUF CONTROL, and UNKNOWN for
 * SentencePiece), else 0. */
int tokenizer_is_special(const tokenizer *t, int id);
enum tokenizer_type tokenizer_type(const tokenizer *t);
enum tokenizer_pre tokenizer_pre_kind(const tokenizer *t);   /* byte-level only (GPT2 for SPM) */

/* Encode len bytes. No BOS is added.
 * Added tokens are split out first, leftmost-longest: special ones only when parse_special is
 * set, plain (non-special) ones always, as `tokenizers` does (parse_special 0 is its
 * encode_special_tokens = True). Each remaining piece is pre-tokenised and BPE-merged.
 * Byte-level: a byte whose symbol is not in the vocabulary (SmolLM2 lacks 21, e.g. 0x04 and 0xFF)
 * becomes the tokenizer.json unk_token, or is dropped when there is none, as in `tokenizers`.
 * SentencePiece: a piece gets its prefix "▁" as the file says (GGUF add_space_prefix: every piece,
 * i.e. at the start and after each added token, as llama.cpp does; Prepend("▁"): every piece
 * between added tokens; Metaspace first: the piece at the start of the text), spaces become "▁",
 * and a character without a token becomes its UTF-8 bytes' <0xNN> tokens.
 * Any bytes are accepted: each maximal invalid UTF-8 subsequence is replaced by U+FFFD first,
 * which gives exactly what `tokenizers` returns for bytes.decode("utf-8", errors="replace") and
 * what llama.cpp's byte-level BPE does (so such bytes do not survive a decode round trip; valid
 * text does).
 * Returns the number of ids (which may exceed max_ids: then only max_ids were written), or < 0
 * (FASA_EARG for bad arguments or a text over INT_MAX bytes, FASA_ENOMEM). Byte-level, the count
 * is at most len for valid UTF-8 and at most 3 * len otherwise (a lone invalid byte becomes
 * U+FFFD's 3 bytes); in any case at most 5 * len + 3 (SentencePiece: a space or U+FFFD without a
 * token is 3 byte tokens, and each piece may add a prefix). */
int tokenizer_encode(const tokenizer *t, const char *text, size_t len, int parse_special,
                     int32_t *ids, int max_ids);

/* Token ids written as text (whitespace-separated decimals, as `fasa run --json` prints them) from
 * path ("-": stdin), each checked against n_vocab. Returns the count (> 0; *out is the caller's
 * to free), or < 0 with err naming the file and the problem. */
int tokenizer_read_ids(const char *path, int n_vocab, int32_t **out, char *err);

/* Bytes of one token. Byte-level: its characters mapped back through the byte-level table, or,
 * if it has characters outside that table, its own UTF-8 (the ByteLevel decoder of `tokenizers`).
 * SentencePiece: a <0xNN> token is that byte, any other "▁" becomes a space. Special added
 * tokens such as "<|im_end|>" come out as written (callers that hide them check
 * tokenizer_is_special). Returns the length (may exceed cap: then only cap were written), or
 * < 0 for a bad id. A token's bytes may be part of a UTF-8 character: concatenate before
 * printing. */
int tokenizer_decode(const tokenizer *t, int32_t id, char *buf, size_t cap);
/* The text of n ids from the start of a text: their bytes concatenated, less the one leading
 * space a SentencePiece tokenizer put in front (GGUF add_space_prefix, a Strip(" ", 1, 0) or
 * Metaspace decoder). Same return convention as tokenizer_decode. */
int tokenizer_decode_text(const tokenizer *t, const int32_t *ids, int n, char *buf, size_t cap);

/* ---- chat templates ----------------------------------------------------------------------
 * A chat template is recognised from its text (never from a model's name), then rendered by
 * fasa for one system and one user message plus the assistant's header.
 *   CHATML   "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nU<|im_end|>\n<|im_start|>assistant\n"
 *   LLAMA3   "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nS<|eot_id|>"
 *            "<|start_header_id|>user<|end_header_id|>\n\nU<|eot_id|>"
 *            "<|start_header_id|>assistant<|end_header_id|>\n\n"        (S and U trimmed)
 *   GEMMA    "<bos><start_of_turn>user\nS\n\nU<end_of_turn>\n<start_of_turn>model\n"  (U trimmed;
 *            Gemma has no system turn: Gemma 3 folds S into the first user turn, 1 and 2 refuse one)
 *   MISTRAL  "<s>[INST] S\n\nU [/INST]"   (" [INST] ..." and "...U[/INST]" as the template spells)
 *   LLAMA2   "<s>[INST] <<SYS>>\nS\n<</SYS>>\n\nU [/INST]"              (S..U stripped)
 * With no system message the system part is left out. The BOS text is the tokenizer's BOS
 * token, written only when the template writes bos_token (or the BOS text itself). */
enum tokenizer_chat_kind { TOKENIZER_CHAT_CHATML, TOKENIZER_CHAT_LLAMA3, TOKENIZER_CHAT_GEMMA,
                           TOKENIZER_CHAT_MISTRAL, TOKENIZER_CHAT_LLAMA2 };

/* The system message SmolLM2's chat template inserts when the conversation has none. */
#define TOKENIZER_SMOLLM_SYSTEM "You are a helpful AI assistant named SmolLM, trained by Hugging Face"
#define TOKENIZER_CHAT_SYSTEM_MAX 1024

typedef struct tokenizer_chat {
    enum tokenizer_chat_kind kind;
    int bos;                /* the rendered text starts with bos_text */
    int inst_space;         /* MISTRAL: " [INST] " (a space first, as Mistral v0.1's later template) */
    int inst_close_space;   /* MISTRAL: " [/INST]"; 0: "[/INST]" right after the message (v0.3) */
    int trim;               /* MISTRAL: the user message is trimmed */
    char bos_text[64];      /* the BOS token's text: "<s>", "<bos>", "<|begin_of_text|>" */
    char system[TOKENIZER_CHAT_SYSTEM_MAX];   /* the template's default system message, "" if none */
} tokenizer_chat;

/* Recognises a Jinja chat template from its text: the kind by its markers (<|im_start|>,
 * <|start_header_id|>, <start_of_turn>, [INST] with or without <<SYS>>), whether it writes
 * bos_token, the Mistral spacing, and the default system message: the text a string literal puts
 * in a whole system turn ('<|im_start|>system\n...<|im_end|>', as SmolLM2's and Qwen2.5's
 * templates do when no system message is given). bos_text is the kind's usual BOS
 * (tokenizer_chat_of puts the tokenizer's own). 0, FASA_EARG (NULL), FASA_EUNSUPPORTED (no known
 * kind, or a default system message of TOKENIZER_CHAT_SYSTEM_MAX bytes or more). */
int tokenizer_chat_detect(const char *template_text, tokenizer_chat *out);
/* The chat format of the tokenizer's own template; without a template, from its special tokens
 * (<|im_start|>: CHATML, <|start_header_id|>: LLAMA3, <start_of_turn>: GEMMA, [INST]: MISTRAL,
 * the last three after BOS). 0, or FASA_EUNSUPPORTED (a template of no known kind, or no
 * template and none of those tokens). */
int tokenizer_chat_of(const tokenizer *t, tokenizer_chat *out);
/* The chat template text the tokenizer was loaded with (GGUF tokenizer.chat_template;
 * tokenizer_config.json's "chat_template", or chat_template.jinja, beside a tokenizer.json), or
 * NULL; and where it was found ("tokenizer.chat_template" or the file's path), or NULL. */
const char *tokenizer_chat_template(const tokenizer *t);
const char *tokenizer_chat_template_source(const tokenizer *t);
/* Replaces the chat template (text NULL: none); source as for tokenizer_chat_template_source.
 * 0 or FASA_ENOMEM. */
int tokenizer_set_chat_template(tokenizer *t, const char *text, const char *source);

/* Render a chat prompt as described above: system NULL means the format's default system message
 * (none when it has none; "" gives an empty system turn, as the template would). Encode the
 * result with parse_special set.
 * Like snprintf: writes at most cap bytes including the NUL (out may be NULL when cap is 0) and
 * returns the full length, or FASA_EARG (chat or user NULL, unknown kind). */
int tokenizer_chat_render(const tokenizer_chat *chat, const char *system, const char *user,
                          char *out, size_t cap);

/* The ids of a prompt, the one call a session needs. With chat (from tokenizer_chat_of): the
 * rendered conversation, encoded with special tokens parsed. With chat NULL: text as it is,
 * special tokens not parsed, after BOS when tokenizer_add_bos says so. Returns the count (may
 * exceed max_ids, as tokenizer_encode), or < 0. */
int tokenizer_encode_prompt(const tokenizer *t, const tokenizer_chat *chat, const char *system,
                            const char *text, int32_t *ids, int max_ids);

#endif

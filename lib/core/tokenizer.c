/* tokenizer.c - byte-level BPE (GPT-2 family), decode, chat templates.
 *
 * The pipeline follows Hugging Face `tokenizers` for the models fasa runs:
 *   text -> invalid UTF-8 replaced by U+FFFD -> added tokens split out -> pre-tokenisation
 *   (optional Digits split, then the family's regex) -> bytes mapped to GPT-2 symbols ->
 *   BPE merges by rank inside each pre-token -> ids.
 * scripts/tokenizer_check.py compares the result with `tokenizers` on >= 10,000 lines.
 */
#include "tokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <cjson/cJSON.h>

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Largest id we accept from a file: far above any real vocabulary, small enough that
 * per-id tables can never overflow. */
#define TOK_MAX_VOCAB (1 << 22)

enum { TOK_F_ADDED = 1, TOK_F_SPECIAL = 2 };

typedef struct added_token {
    int32_t id;
    uint32_t off, len;          /* content in the arena */
    uint8_t special, lstrip, rstrip, single_word, normalized;
} added_token;

typedef struct merge_slot {
    uint64_t key;               /* (left id << 32) | right id */
    int32_t rank;               /* -1: empty slot */
    int32_t id;                 /* the merged token */
} merge_slot;

struct tokenizer {
    int n_vocab;
    char *arena;                /* every token string, back to back */
    size_t arena_len, arena_cap;
    uint32_t *off;              /* (n_vocab) */
    int32_t *len;               /* (n_vocab) -1: no token has this id */
    uint8_t *flags;             /* (n_vocab) TOK_F_* */

    int32_t *vtab;              /* string -> id, open addressing, -1 empty */
    uint32_t vmask;
    merge_slot *mtab;           /* id pair -> rank and merged id */
    uint32_t mmask;
    int n_merges;

    int32_t byte_id[256];       /* id of each byte's single-symbol token, -1 if absent */
    uint8_t b2u[256][2];        /* UTF-8 of each byte's GPT-2 symbol */
    uint8_t b2u_len[256];
    int16_t u2b[324];           /* inverse: symbol code point -> byte, -1 if not a symbol */

    added_token *added;
    int n_added;
    /* Added tokens are matched in two passes like `tokenizers` does: class 0 (normalized false)
     * on the raw text, then class 1 (normalized true) in the gaps. Per class, indices into
     * added[] sorted by first byte, longest first; abeg[c][b]..abeg[c][b+1] is the range. */
    int32_t *aidx[2];
    int32_t abeg[2][257];

    pcre2_code *re_main;        /* the family's split regex */
    pcre2_code *re_digit;       /* \p{N}, when digits are isolated first (SmolLM2) */
    pcre2_code *re_space;       /* \p{White_Space}: lstrip/rstrip of added tokens */
    pcre2_code *re_word;        /* a word character: single_word added tokens */

    enum tokenizer_pre pre;
    int ignore_merges;          /* a pre-token that is itself in the vocabulary skips BPE */
    int fuse_unk;
    int unk, bos, eos;
};

/* ---- split patterns ---------------------------------------------------------------------
 * The *_JSON strings are the patterns exactly as tokenizer.json writes them; a file is
 * recognised by comparing against them. The compiled forms differ in one respect: for
 * Oniguruma (which `tokenizers` uses) \s is the White_Space property, while PCRE2's \s with UCP
 * also takes U+180E, which its built-in list of horizontal spaces kept after Unicode 6.3 made it
 * a format character. So \s and \S are spelled \p{White_Space} and \P{White_Space}; all else
 * runs as written. */
#define PAT_GPT2_JSON "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+"
#define PAT_LLAMA3_JSON "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
#define PAT_QWEN2_JSON "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"

#define SP "\\p{White_Space}"
#define NSP "\\P{White_Space}"
#define PUNCT "[^\\p{White_Space}\\p{L}\\p{N}]"
static const char PAT_GPT2[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?" PUNCT "+|" SP "+(?!" NSP ")|" SP "+";
static const char PAT_LLAMA3[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}|"
    " ?" PUNCT "+[\\r\\n]*|" SP "*[\\r\\n]+|" SP "+(?!" NSP ")|" SP "+";
static const char PAT_QWEN2[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}|"
    " ?" PUNCT "+[\\r\\n]*|" SP "*[\\r\\n]+|" SP "+(?!" NSP ")|" SP "+";
#undef PUNCT
#undef SP
#undef NSP

/* ---- small helpers ---------------------------------------------------------------------- */

/* FNV-1a: only used to place strings in the vocabulary table. */
static uint32_t hash_bytes(const char *s, size_t n)
{
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) {
        h ^= (uint8_t)s[i];
        h *= 1099511628211ull;
    }
    return (uint32_t)(h ^ (h >> 32));
}

static uint32_t hash_u64(uint64_t x)
{
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ull;
    x ^= x >> 33;
    return (uint32_t)x;
}

static uint32_t table_size(size_t n)
{
    uint32_t s = 16;
    while (s < 2 * n + 1) s <<= 1;
    return s;
}

static int utf8_put(uint32_t cp, uint8_t *o)
{
    if (cp < 0x80) { o[0] = (uint8_t)cp; return 1; }
    if (cp < 0x800) { o[0] = 0xC0 | (cp >> 6); o[1] = 0x80 | (cp & 0x3F); return 2; }
    if (cp < 0x10000) {
        o[0] = 0xE0 | (cp >> 12); o[1] = 0x80 | ((cp >> 6) & 0x3F); o[2] = 0x80 | (cp & 0x3F);
        return 3;
    }
    o[0] = 0xF0 | (cp >> 18); o[1] = 0x80 | ((cp >> 12) & 0x3F);
    o[2] = 0x80 | ((cp >> 6) & 0x3F); o[3] = 0x80 | (cp & 0x3F);
    return 4;
}

/* Length of the well-formed UTF-8 sequence at s, or 0 if it is not well formed; then *bad is
 * the length of its maximal invalid subpart (Unicode 3.9, "substitution of maximal subparts"),
 * which is exactly what Python's bytes.decode("utf-8", "replace") turns into one U+FFFD. */
static size_t utf8_seq(const uint8_t *s, size_t n, size_t *bad)
{
    uint8_t c = s[0];
    size_t need;
    uint8_t lo = 0x80, hi = 0xBF;       /* allowed range of the second byte */
    if (c < 0x80) return 1;
    if (c >= 0xC2 && c <= 0xDF) need = 1;
    else if (c == 0xE0) { need = 2; lo = 0xA0; }
    else if (c == 0xED) { need = 2; hi = 0x9F; }
    else if (c >= 0xE1 && c <= 0xEF) need = 2;
    else if (c == 0xF0) { need = 3; lo = 0x90; }
    else if (c == 0xF4) { need = 3; hi = 0x8F; }
    else if (c >= 0xF1 && c <= 0xF3) need = 3;
    else { *bad = 1; return 0; }
    for (size_t k = 1; k <= need; k++) {
        uint8_t b;
        if (k >= n) { *bad = k; return 0; }
        b = s[k];
        if (k == 1 ? (b < lo || b > hi) : (b < 0x80 || b > 0xBF)) { *bad = k; return 0; }
    }
    return need + 1;
}

/* One code point and its length; a byte that does not start a well-formed sequence decodes
 * as itself with length 1 and code point UINT32_MAX (token strings from a file may be any
 * bytes). */
static uint32_t utf8_get(const uint8_t *s, size_t n, size_t *len)
{
    size_t bad, l = utf8_seq(s, n, &bad);
    uint32_t cp;
    *len = l ? l : 1;
    switch (l) {
    case 1: return s[0];
    case 2: return ((uint32_t)(s[0] & 0x1F) << 6) | (s[1] & 0x3F);
    case 3: return ((uint32_t)(s[0] & 0x0F) << 12) | ((uint32_t)(s[1] & 0x3F) << 6) | (s[2] & 0x3F);
    case 4:
        cp = ((uint32_t)(s[0] & 0x07) << 18) | ((uint32_t)(s[1] & 0x3F) << 12);
        return cp | ((uint32_t)(s[2] & 0x3F) << 6) | (s[3] & 0x3F);
    default: return UINT32_MAX;
    }
}

/* ---- construction ----------------------------------------------------------------------- */

static void byte_unicode_init(tokenizer *t)
{
    /* GPT-2's bytes_to_unicode: printable Latin-1 bytes stand for themselves, the other 68
     * (controls, space, DEL, NBSP, soft hyphen) get U+0100.. in byte order, so every byte is
     * one visible character and a token string never contains a raw space. */
    int extra = 0;
    for (int i = 0; i < 324; i++) t->u2b[i] = -1;
    for (int b = 0; b < 256; b++) {
        int printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
        uint32_t cp = printable ? (uint32_t)b : 256u + (uint32_t)extra++;
        t->b2u_len[b] = (uint8_t)utf8_put(cp, t->b2u[b]);
        t->u2b[cp] = (int16_t)b;
    }
}

static tokenizer *tok_new(int n_vocab, size_t arena_cap)
{
    tokenizer *t = calloc(1, sizeof *t);
    if (!t) return NULL;
    t->n_vocab = n_vocab;
    t->arena_cap = arena_cap ? arena_cap : 1;
    t->arena = malloc(t->arena_cap);
    t->off = calloc((size_t)n_vocab, sizeof *t->off);
    t->len = malloc((size_t)n_vocab * sizeof *t->len);
    t->flags = calloc((size_t)n_vocab, 1);
    if (!t->arena || !t->off || !t->len || !t->flags) { tokenizer_free(t); return NULL; }
    for (int i = 0; i < n_vocab; i++) t->len[i] = -1;
    t->unk = t->bos = t->eos = -1;
    byte_unicode_init(t);
    return t;
}

static int tok_set_piece(tokenizer *t, int id, const char *s, size_t n)
{
    if (n > t->arena_cap - t->arena_len || n > INT32_MAX) return -1;
    memcpy(t->arena + t->arena_len, s, n);
    t->off[id] = (uint32_t)t->arena_len;
    t->len[id] = (int32_t)n;
    t->arena_len += n;
    return 0;
}

static int vocab_get(const tokenizer *t, const char *s, size_t n)
{
    uint32_t h = hash_bytes(s, n) & t->vmask;
    for (;;) {
        int32_t id = t->vtab[h];
        if (id < 0) return -1;
        if ((size_t)t->len[id] == n && memcmp(t->arena + t->off[id], s, n) == 0) return id;
        h = (h + 1) & t->vmask;
    }
}

/* Later duplicates of a string win, as in llama.cpp's and serde's maps, except that a model
 * token beats an added token spelled the same: merges and BPE look strings up in the model's
 * vocabulary, as `tokenizers` does (its added tokens live in a separate table). */
static int vocab_build(tokenizer *t)
{
    size_t n = 0;
    for (int i = 0; i < t->n_vocab; i++) n += t->len[i] >= 0;
    uint32_t size = table_size(n);
    t->vtab = malloc(size * sizeof *t->vtab);
    if (!t->vtab) return -1;
    memset(t->vtab, 0xFF, size * sizeof *t->vtab);
    t->vmask = size - 1;
    for (int pass = 0; pass < 2; pass++) {
        for (int i = 0; i < t->n_vocab; i++) {
            int added = (t->flags[i] & TOK_F_ADDED) != 0;
            if (t->len[i] < 0 || added != pass) continue;
            const char *s = t->arena + t->off[i];
            uint32_t h = hash_bytes(s, (size_t)t->len[i]) & t->vmask;
            for (;;) {
                int32_t id = t->vtab[h];
                if (id < 0) { t->vtab[h] = i; break; }
                if (t->len[id] == t->len[i] && !memcmp(t->arena + t->off[id], s, (size_t)t->len[i])) {
                    if (!pass || (t->flags[id] & TOK_F_ADDED)) t->vtab[h] = i;
                    break;
                }
                h = (h + 1) & t->vmask;
            }
        }
    }
    return 0;
}

static const merge_slot *merge_get(const tokenizer *t, int32_t a, int32_t b)
{
    uint64_t key = ((uint64_t)(uint32_t)a << 32) | (uint32_t)b;
    uint32_t h = hash_u64(key) & t->mmask;
    for (;;) {
        const merge_slot *m = &t->mtab[h];
        if (m->rank < 0) return NULL;
        if (m->key == key) return m;
        h = (h + 1) & t->mmask;
    }
}

static int merges_alloc(tokenizer *t, int n)
{
    uint32_t size = table_size((size_t)n);
    t->mtab = malloc(size * sizeof *t->mtab);
    if (!t->mtab) return -1;
    for (uint32_t i = 0; i < size; i++) t->mtab[i].rank = -1;
    t->mmask = size - 1;
    return 0;
}

/* Adds merge number `rank` (a, b). label/what name it in messages ("'tokenizer.json':
 * model.merges", "tokenizer.ggml.merges"). A repeated pair keeps its first (best) rank. */
static int merge_add(tokenizer *t, int rank, const char *a, size_t na, const char *b, size_t nb,
                     const char *what, char *err)
{
    int ia = vocab_get(t, a, na), ib = vocab_get(t, b, nb), iab;
    char *cat;
    if (ia < 0 || ib < 0)
        return fasa_error(err, FASA_EFORMAT, "%s[%d] '%.*s %.*s': '%.*s' is not in the vocabulary",
                          what, rank, (int)na, a, (int)nb, b,
                          ia < 0 ? (int)na : (int)nb, ia < 0 ? a : b);
    cat = malloc(na + nb + 1);
    if (!cat) return fasa_error(err, FASA_ENOMEM, "%s: out of memory", what);
    memcpy(cat, a, na);
    memcpy(cat + na, b, nb);
    iab = vocab_get(t, cat, na + nb);
    free(cat);
    if (iab < 0)
        return fasa_error(err, FASA_EFORMAT, "%s[%d] '%.*s %.*s': the merged token is not in the vocabulary",
                          what, rank, (int)na, a, (int)nb, b);
    uint64_t key = ((uint64_t)(uint32_t)ia << 32) | (uint32_t)ib;
    uint32_t h = hash_u64(key) & t->mmask;
    while (t->mtab[h].rank >= 0) {
        if (t->mtab[h].key == key) return 0;
        h = (h + 1) & t->mmask;
    }
    t->mtab[h].key = key;
    t->mtab[h].rank = rank;
    t->mtab[h].id = iab;
    t->n_merges++;
    return 0;
}

static int added_add(tokenizer *t, int id, const char *s, size_t n, int special, int lstrip,
                     int rstrip, int single_word, int normalized)
{
    added_token *a;
    if (tok_set_piece(t, id, s, n) < 0) return -1;
    if ((t->n_added & (t->n_added - 1)) == 0) {     /* capacity doubles at each power of two */
        a = realloc(t->added, ((size_t)t->n_added * 2 + 1) * sizeof *a);
        if (!a) return -1;
        t->added = a;
    }
    a = &t->added[t->n_added++];
    a->id = id;
    a->off = t->off[id];
    a->len = (uint32_t)n;
    a->special = (uint8_t)!!special;
    a->lstrip = (uint8_t)!!lstrip;
    a->rstrip = (uint8_t)!!rstrip;
    a->single_word = (uint8_t)!!single_word;
    a->normalized = (uint8_t)!!normalized;
    t->flags[id] |= TOK_F_ADDED | (special ? TOK_F_SPECIAL : 0);
    return 0;
}

/* Sort key of an added token in the first-byte index: longest first within a first byte,
 * so the first hit at a position is the longest. */
typedef struct added_key { uint8_t first; uint32_t len; int32_t id, index; } added_key;

static int added_cmp(const void *pa, const void *pb)
{
    const added_key *a = pa, *b = pb;
    if (a->first != b->first) return a->first < b->first ? -1 : 1;
    if (a->len != b->len) return a->len > b->len ? -1 : 1;
    return a->id < b->id ? -1 : a->id > b->id;
}

static int pattern_compile(pcre2_code **out, const char *pat, const char *label, char *err)
{
    int ec;
    PCRE2_SIZE eo;
    *out = pcre2_compile((PCRE2_SPTR)pat, PCRE2_ZERO_TERMINATED, PCRE2_UTF | PCRE2_UCP, &ec, &eo, NULL);
    if (!*out) {
        PCRE2_UCHAR msg[128];
        pcre2_get_error_message(ec, msg, sizeof msg);
        return fasa_error(err, FASA_EUNSUPPORTED, "%s: cannot compile pre-tokenizer pattern: %s", label, (char *)msg);
    }
    /* Without JIT (e.g. a kernel forbidding executable memory) the interpreter gives the same
     * answers, only slower. */
    pcre2_jit_compile(*out, PCRE2_JIT_COMPLETE);
    return 0;
}

/* Hash tables, byte symbols, added-token index, regexes, default bos/eos. */
static int tok_finish(tokenizer *t, const char *label, char *err)
{
    static const char *const eos_names[] = { "<|im_end|>", "<|eot_id|>", "<|end_of_text|>", "<|endoftext|>", "</s>" };
    static const char *const bos_names[] = { "<|begin_of_text|>", "<s>" };
    const char *pat = t->pre == TOKENIZER_PRE_LLAMA3 ? PAT_LLAMA3
                    : t->pre == TOKENIZER_PRE_QWEN2 ? PAT_QWEN2 : PAT_GPT2;
    int rc, need_word = 0, need_space = 0;

    for (int b = 0; b < 256; b++) t->byte_id[b] = vocab_get(t, (const char *)t->b2u[b], t->b2u_len[b]);

    for (int c = 0; c < 2; c++) {
        added_key *keys = malloc(((size_t)t->n_added + 1) * sizeof *keys);
        int n = 0;
        t->aidx[c] = malloc(((size_t)t->n_added + 1) * sizeof(int32_t));
        if (!keys || !t->aidx[c]) { free(keys); return fasa_error(err, FASA_ENOMEM, "%s: out of memory", label); }
        for (int i = 0; i < t->n_added; i++) {
            const added_token *a = &t->added[i];
            if (a->len > 0 && a->normalized == c)
                keys[n++] = (added_key){ (uint8_t)t->arena[a->off], a->len, a->id, i };
        }
        qsort(keys, (size_t)n, sizeof *keys, added_cmp);
        for (int k = 0; k < n; k++) t->aidx[c][k] = keys[k].index;
        for (int b = 0, k = 0; b <= 256; b++) {
            while (k < n && keys[k].first < b) k++;
            t->abeg[c][b] = k;
        }
        free(keys);
    }
    for (int i = 0; i < t->n_added; i++) {
        need_word |= t->added[i].single_word;
        need_space |= t->added[i].lstrip | t->added[i].rstrip;
    }

    if ((rc = pattern_compile(&t->re_main, pat, label, err)) < 0) return rc;
    if (t->pre == TOKENIZER_PRE_SMOLLM && (rc = pattern_compile(&t->re_digit, "\\p{N}", label, err)) < 0) return rc;
    /* `tokenizers` tests these with the Rust regex crate's \s and \w (Unicode definitions). */
    if (need_space && (rc = pattern_compile(&t->re_space, "\\p{White_Space}", label, err)) < 0) return rc;
    if (need_word && (rc = pattern_compile(&t->re_word, "[\\p{Alphabetic}\\p{M}\\p{Nd}\\p{Pc}\\p{Join_Control}]",
                                           label, err)) < 0)
        return rc;

    if (t->eos < 0)
        for (size_t i = 0; i < sizeof eos_names / sizeof *eos_names && t->eos < 0; i++)
            t->eos = tokenizer_find(t, eos_names[i]);
    if (t->bos < 0)
        for (size_t i = 0; i < sizeof bos_names / sizeof *bos_names && t->bos < 0; i++)
            t->bos = tokenizer_find(t, bos_names[i]);
    return 0;
}

void tokenizer_free(tokenizer *t)
{
    if (!t) return;
    free(t->arena);
    free(t->off);
    free(t->len);
    free(t->flags);
    free(t->vtab);
    free(t->mtab);
    free(t->added);
    free(t->aidx[0]);
    free(t->aidx[1]);
    pcre2_code_free(t->re_main);
    pcre2_code_free(t->re_digit);
    pcre2_code_free(t->re_space);
    pcre2_code_free(t->re_word);
    free(t);
}

/* ---- loading from GGUF-style arrays ----------------------------------------------------- */

int tokenizer_load_vocab(tokenizer **out, int n_vocab, const char *const *tokens,
                         const uint64_t *token_lens, const int32_t *types,
                         int n_merges, const char *const *merges, const uint64_t *merge_lens,
                         const char *pre, char *err)
{
    static const char what_tok[] = "tokenizer.ggml.tokens", what_merge[] = "tokenizer.ggml.merges";
    enum tokenizer_pre kind = TOKENIZER_PRE_GPT2;
    size_t total = 0;
    tokenizer *t;
    int rc;

    if (!out) return fasa_error(err, FASA_EARG, "tokenizer: no output pointer");
    *out = NULL;
    if (n_vocab <= 0 || n_vocab > TOK_MAX_VOCAB || !tokens)
        return fasa_error(err, FASA_EARG, "%s: bad vocabulary size %d", what_tok, n_vocab);
    if (n_merges < 0 || (n_merges > 0 && !merges))
        return fasa_error(err, FASA_EARG, "%s: bad merge count %d", what_merge, n_merges);

    if (!pre || !strcmp(pre, "gpt2") || !strcmp(pre, "default")) kind = TOKENIZER_PRE_GPT2;
    else if (!strcmp(pre, "smollm")) kind = TOKENIZER_PRE_SMOLLM;
    else if (!strcmp(pre, "llama-bpe") || !strcmp(pre, "llama3")) kind = TOKENIZER_PRE_LLAMA3;
    else if (!strcmp(pre, "qwen2")) kind = TOKENIZER_PRE_QWEN2;
    else
        return fasa_error(err, FASA_EUNSUPPORTED,
                          "tokenizer.ggml.pre '%s' is not supported (known: smollm, gpt2, default, llama-bpe, llama3, qwen2)", pre);

    for (int i = 0; i < n_vocab; i++) {
        size_t n;
        if (!tokens[i]) return fasa_error(err, FASA_EARG, "%s[%d] is missing", what_tok, i);
        n = token_lens ? token_lens[i] : strlen(tokens[i]);
        if (n > (1u << 20)) return fasa_error(err, FASA_EFORMAT, "%s[%d] is %zu bytes long", what_tok, i, n);
        total += n;
    }
    if (!(t = tok_new(n_vocab, total))) return fasa_error(err, FASA_ENOMEM, "%s: out of memory", what_tok);
    t->pre = kind;
    /* llama.cpp treats Llama-3 like its tokenizer.json's "ignore_merges": true. */
    t->ignore_merges = kind == TOKENIZER_PRE_LLAMA3;

    for (int i = 0; i < n_vocab; i++) {
        size_t n = token_lens ? token_lens[i] : strlen(tokens[i]);
        int type = types ? types[i] : 1;
        /* CONTROL tokens are special; USER_DEFINED ones are plain added tokens, matched even
         * when parse_special is off, as `tokenizers` does with non-special added tokens. */
        rc = (type == 3 || type == 4) ? added_add(t, i, tokens[i], n, type == 3, 0, 0, 0, type == 4)
                                      : tok_set_piece(t, i, tokens[i], n);
        if (rc < 0) { tokenizer_free(t); return fasa_error(err, FASA_ENOMEM, "%s: out of memory", what_tok); }
    }
    if (vocab_build(t) < 0 || merges_alloc(t, n_merges) < 0) {
        tokenizer_free(t);
        return fasa_error(err, FASA_ENOMEM, "%s: out of memory", what_tok);
    }
    for (int i = 0; i < n_merges; i++) {
        const char *m = merges[i], *sp = NULL;
        size_t n;
        if (!m) { tokenizer_free(t); return fasa_error(err, FASA_EARG, "%s[%d] is missing", what_merge, i); }
        n = merge_lens ? merge_lens[i] : strlen(m);
        /* The separator is the first space after the first byte (a token is never empty). */
        if (n > 1) sp = memchr(m + 1, ' ', n - 1);
        if (!sp || sp + 1 == m + n || memchr(sp + 1, ' ', (size_t)(m + n - sp - 1))) {
            tokenizer_free(t);
            return fasa_error(err, FASA_EFORMAT, "%s[%d] '%.*s' is not a pair", what_merge, i, (int)(n > 64 ? 64 : n), m);
        }
        if ((rc = merge_add(t, i, m, (size_t)(sp - m), sp + 1, (size_t)(m + n - sp - 1), what_merge, err)) < 0) {
            tokenizer_free(t);
            return rc;
        }
    }
    if ((rc = tok_finish(t, "tokenizer", err)) < 0) { tokenizer_free(t); return rc; }
    *out = t;
    return 0;
}

/* ---- loading from tokenizer.json -------------------------------------------------------- */

static char *read_file(const char *path, size_t *len, char *err, int *rc)
{
    FILE *f = fopen(path, "rb");
    char *buf = NULL;
    size_t cap = 0, n = 0;
    if (!f) { *rc = fasa_error(err, FASA_EIO, "cannot open '%s': %s", path, strerror(errno)); return NULL; }
    for (;;) {
        if (n == cap) {
            char *nb;
            cap = cap ? cap * 2 : 1 << 16;
            if (!(nb = realloc(buf, cap + 1))) {
                free(buf); fclose(f);
                *rc = fasa_error(err, FASA_ENOMEM, "'%s': out of memory", path);
                return NULL;
            }
            buf = nb;
        }
        size_t got = fread(buf + n, 1, cap - n, f);
        n += got;
        if (got == 0) break;
    }
    if (ferror(f)) {
        free(buf); fclose(f);
        *rc = fasa_error(err, FASA_EIO, "cannot read '%s'", path);
        return NULL;
    }
    fclose(f);
    buf[n] = 0;
    *len = n;
    return buf;
}

static cJSON *json_parse_text(const char *buf, size_t n, const char *path, char *err, int *rc)
{
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(buf, n, &end, 0);
    if (!root) {
        size_t at = end && end >= buf && end <= buf + n ? (size_t)(end - buf) : n;
        *rc = fasa_error(err, FASA_EFORMAT, "'%s': invalid JSON at byte %zu", path, at);
    }
    return root;
}

static cJSON *json_parse_file(const char *path, char *err, int *rc)
{
    size_t n;
    char *buf = read_file(path, &n, err, rc);
    cJSON *root;
    if (!buf) return NULL;
    root = json_parse_text(buf, n, path, err, rc);
    free(buf);
    return root;
}

static const cJSON *jget(const cJSON *o, const char *key)
{
    return cJSON_GetObjectItemCaseSensitive(o, key);
}

static int jtrue(const cJSON *o, const char *key)
{
    return cJSON_IsTrue(jget(o, key));
}

static const char *jstr(const cJSON *o, const char *key)
{
    const cJSON *v = jget(o, key);
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

/* An id: an integral number in [0, TOK_MAX_VOCAB). */
static int jid(const cJSON *v)
{
    if (!cJSON_IsNumber(v) || v->valuedouble < 0 || v->valuedouble >= TOK_MAX_VOCAB ||
        v->valuedouble != (double)(int)v->valuedouble)
        return -1;
    return (int)v->valuedouble;
}

static const char *jtype(const cJSON *o)
{
    const char *s = jstr(o, "type");
    return s ? s : "(no type)";
}

static int byte_level_ok(const cJSON *bl, int use_regex, const char *path, char *err)
{
    if (jtrue(bl, "add_prefix_space"))
        return fasa_error(err, FASA_EUNSUPPORTED, "'%s': pre_tokenizer ByteLevel with add_prefix_space is not supported", path);
    /* use_regex defaults to true in `tokenizers`. */
    if ((jget(bl, "use_regex") ? jtrue(bl, "use_regex") : 1) != use_regex)
        return fasa_error(err, FASA_EUNSUPPORTED, "'%s': pre_tokenizer ByteLevel with use_regex %s is not supported here",
                          path, use_regex ? "false" : "true");
    return 0;
}

/* Maps the pre_tokenizer to a known family:
 *   ByteLevel(use_regex)                                  GPT2
 *   Sequence[Digits(individual_digits), ByteLevel(use_regex)]  SMOLLM
 *   Sequence[Split(Llama-3 regex, Isolated), ByteLevel(no regex)]  LLAMA3
 *   Sequence[Split(Qwen2 regex, Isolated), ByteLevel(no regex)]    QWEN2 */
static int pre_detect(const cJSON *p, enum tokenizer_pre *kind, const char *path, char *err)
{
    const char *type = jtype(p);
    const cJSON *items, *a, *b;
    int rc;
    if (!cJSON_IsObject(p))
        return fasa_error(err, FASA_EUNSUPPORTED, "'%s': pre_tokenizer is missing (byte-level BPE needs one)", path);
    if (!strcmp(type, "ByteLevel")) {
        if ((rc = byte_level_ok(p, 1, path, err)) < 0) return rc;
        *kind = TOKENIZER_PRE_GPT2;
        return 0;
    }
    if (strcmp(type, "Sequence"))
        return fasa_error(err, FASA_EUNSUPPORTED, "'%s': pre_tokenizer %s is not supported", path, type);
    items = jget(p, "pretokenizers");
    if (!cJSON_IsArray(items) || cJSON_GetArraySize(items) != 2)
        return fasa_error(err, FASA_EUNSUPPORTED, "'%s': pre_tokenizer Sequence must hold two steps "
                          "(Digits or Split, then ByteLevel)", path);
    a = cJSON_GetArrayItem(items, 0);
    b = cJSON_GetArrayItem(items, 1);
    if (!cJSON_IsObject(a) || !cJSON_IsObject(b) || strcmp(jtype(b), "ByteLevel"))
        return fasa_error(err, FASA_EUNSUPPORTED, "'%s': pre_tokenizer Sequence[%s, %s] is not supported",
                          path, jtype(a), jtype(b));
    if (!strcmp(jtype(a), "Digits")) {
        if (!jtrue(a, "individual_digits"))
            return fasa_error(err, FASA_EUNSUPPORTED, "'%s': pre_tokenizer Digits without individual_digits is not supported", path);
        if ((rc = byte_level_ok(b, 1, path, err)) < 0) return rc;
        *kind = TOKENIZER_PRE_SMOLLM;
        return 0;
    }
    if (!strcmp(jtype(a), "Split")) {
        const char *re = jstr(jget(a, "pattern"), "Regex"), *beh = jstr(a, "behavior");
        if (!re || !beh || strcmp(beh, "Isolated") || jtrue(a, "invert"))
            return fasa_error(err, FASA_EUNSUPPORTED, "'%s': pre_tokenizer Split must be an isolated Regex split", path);
        if (!strcmp(re, PAT_LLAMA3_JSON)) *kind = TOKENIZER_PRE_LLAMA3;
        else if (!strcmp(re, PAT_QWEN2_JSON)) *kind = TOKENIZER_PRE_QWEN2;
        else if (!strcmp(re, PAT_GPT2_JSON)) *kind = TOKENIZER_PRE_GPT2;
        else
            return fasa_error(err, FASA_EUNSUPPORTED, "'%s': pre_tokenizer Split regex is not a known family "
                              "(GPT-2, Llama-3, Qwen2): %.80s", path, re);
        return byte_level_ok(b, 0, path, err);
    }
    return fasa_error(err, FASA_EUNSUPPORTED, "'%s': pre_tokenizer Sequence[%s, ByteLevel] is not supported", path, jtype(a));
}

static int normalizer_ok(const cJSON *n, const char *path, char *err)
{
    const char *type;
    if (!n || cJSON_IsNull(n)) return 0;
    type = jtype(n);
    /* Qwen2 declares NFC. Text already in NFC (all ASCII, and nearly all real text) is
     * unchanged by it; we do not carry composition tables, so decomposed input may
     * tokenise differently from `tokenizers` (llama.cpp behaves the same way). */
    if (!strcmp(type, "NFC")) return 0;
    if (!strcmp(type, "Sequence")) {
        const cJSON *x, *items = jget(n, "normalizers");
        int rc;
        cJSON_ArrayForEach(x, items)
            if ((rc = normalizer_ok(x, path, err)) < 0) return rc;
        return 0;
    }
    return fasa_error(err, FASA_EUNSUPPORTED, "'%s': normalizer %s is not supported", path, type);
}

/* bos_token / eos_token of a tokenizer_config.json: a string or {"content": ...}. */
static const char *config_token(const cJSON *cfg, const char *key)
{
    const cJSON *v = jget(cfg, key);
    if (cJSON_IsString(v)) return v->valuestring;
    if (cJSON_IsObject(v)) return jstr(v, "content");
    return NULL;
}

/* A Hugging Face directory keeps bos/eos in tokenizer_config.json next to tokenizer.json. */
static int load_config(tokenizer *t, const char *path, char *err)
{
    const char *slash = strrchr(path, '/');
    size_t dir = slash ? (size_t)(slash - path + 1) : 0;
    char *cpath = malloc(dir + sizeof "tokenizer_config.json");
    cJSON *cfg;
    FILE *f;
    int rc = 0;
    if (!cpath) return fasa_error(err, FASA_ENOMEM, "'%s': out of memory", path);
    memcpy(cpath, path, dir);
    memcpy(cpath + dir, "tokenizer_config.json", sizeof "tokenizer_config.json");
    if (!(f = fopen(cpath, "rb"))) { free(cpath); return 0; }
    fclose(f);
    if ((cfg = json_parse_file(cpath, err, &rc))) {
        const char *bos = config_token(cfg, "bos_token"), *eos = config_token(cfg, "eos_token");
        if (bos && tokenizer_find(t, bos) >= 0) t->bos = tokenizer_find(t, bos);
        if (eos && tokenizer_find(t, eos) >= 0) t->eos = tokenizer_find(t, eos);
        cJSON_Delete(cfg);
    }
    free(cpath);
    return rc;
}

/* with_config: also read tokenizer_config.json beside path (a file, not a buffer). */
static int load_json_root(tokenizer **out, const cJSON *root, const char *path, int with_config, char *err)
{
    const cJSON *model, *vocab, *merges, *added, *x, *v;
    enum tokenizer_pre kind = TOKENIZER_PRE_GPT2;
    tokenizer *t;
    const char *s, *unk;
    size_t total = 0;
    int max_id = -1, i, rc, n_merges;

    if (!cJSON_IsObject(root)) return fasa_error(err, FASA_EFORMAT, "'%s': not a JSON object", path);
    model = jget(root, "model");
    if (!cJSON_IsObject(model)) return fasa_error(err, FASA_EFORMAT, "'%s': no \"model\" object", path);
    if ((s = jstr(model, "type")) && strcmp(s, "BPE"))
        return fasa_error(err, FASA_EUNSUPPORTED, "'%s': model.type %s is not supported (only BPE)", path, s);
    vocab = jget(model, "vocab");
    merges = jget(model, "merges");
    if (!cJSON_IsObject(vocab)) return fasa_error(err, FASA_EFORMAT, "'%s': model.vocab is missing or not an object", path);
    if (!cJSON_IsArray(merges)) return fasa_error(err, FASA_EFORMAT, "'%s': model.merges is missing or not an array", path);
    if (jtrue(model, "byte_fallback"))
        return fasa_error(err, FASA_EUNSUPPORTED, "'%s': model.byte_fallback is not supported (byte-level BPE only)", path);
    if (((s = jstr(model, "continuing_subword_prefix")) && *s) || ((s = jstr(model, "end_of_word_suffix")) && *s))
        return fasa_error(err, FASA_EUNSUPPORTED, "'%s': subword prefixes/suffixes are not supported", path);
    if ((v = jget(model, "dropout")) && cJSON_IsNumber(v) && v->valuedouble > 0)
        return fasa_error(err, FASA_EUNSUPPORTED, "'%s': model.dropout is not supported", path);
    if ((rc = normalizer_ok(jget(root, "normalizer"), path, err)) < 0) return rc;
    if ((rc = pre_detect(jget(root, "pre_tokenizer"), &kind, path, err)) < 0) return rc;

    /* Sizes first: the id range (ids may have gaps) and the bytes of all strings. */
    cJSON_ArrayForEach(x, vocab) {
        int id = jid(x);
        if (id < 0) return fasa_error(err, FASA_EFORMAT, "'%s': model.vocab[\"%.64s\"] is not a valid id", path, x->string);
        if (id > max_id) max_id = id;
        total += strlen(x->string);
    }
    added = jget(root, "added_tokens");
    if (added && !cJSON_IsNull(added) && !cJSON_IsArray(added))
        return fasa_error(err, FASA_EFORMAT, "'%s': added_tokens is not an array", path);
    i = 0;
    cJSON_ArrayForEach(x, added) {
        int id = jid(jget(x, "id"));
        const char *c = jstr(x, "content");
        if (id < 0 || !c || !*c)
            return fasa_error(err, FASA_EFORMAT, "'%s': added_tokens[%d] needs an id and a non-empty content", path, i);
        if (id > max_id) max_id = id;
        total += strlen(c);
        i++;
    }
    if (max_id < 0) return fasa_error(err, FASA_EFORMAT, "'%s': model.vocab is empty", path);

    if (!(t = tok_new(max_id + 1, total))) return fasa_error(err, FASA_ENOMEM, "'%s': out of memory", path);
    t->pre = kind;
    t->ignore_merges = jtrue(model, "ignore_merges");
    t->fuse_unk = jtrue(model, "fuse_unk");
    cJSON_ArrayForEach(x, vocab) tok_set_piece(t, jid(x), x->string, strlen(x->string));
    cJSON_ArrayForEach(x, added) {
        const cJSON *norm = jget(x, "normalized");
        int special = jtrue(x, "special");
        const char *c = jstr(x, "content");
        /* `tokenizers` defaults normalized to !special. */
        if (added_add(t, jid(jget(x, "id")), c, strlen(c), special, jtrue(x, "lstrip"), jtrue(x, "rstrip"),
                      jtrue(x, "single_word"), norm ? cJSON_IsTrue(norm) : !special) < 0) {
            tokenizer_free(t);
            return fasa_error(err, FASA_ENOMEM, "'%s': out of memory", path);
        }
    }
    n_merges = cJSON_GetArraySize(merges);
    if (vocab_build(t) < 0 || merges_alloc(t, n_merges) < 0) {
        tokenizer_free(t);
        return fasa_error(err, FASA_ENOMEM, "'%s': out of memory", path);
    }

    {
        size_t plen = strlen(path);
        char *what = malloc(plen + 32);
        if (!what) { tokenizer_free(t); return fasa_error(err, FASA_ENOMEM, "'%s': out of memory", path); }
        snprintf(what, plen + 32, "'%s': model.merges", path);
        i = 0;
        rc = 0;
        cJSON_ArrayForEach(x, merges) {
            const char *a = NULL, *b = NULL;
            size_t na = 0, nb = 0;
            if (cJSON_IsString(x)) {
                /* "a b": exactly one space, as `tokenizers` requires. */
                const char *sp = strchr(x->valuestring, ' ');
                if (sp && sp != x->valuestring && sp[1] && !strchr(sp + 1, ' ')) {
                    a = x->valuestring; na = (size_t)(sp - a);
                    b = sp + 1; nb = strlen(b);
                }
            } else if (cJSON_IsArray(x) && cJSON_GetArraySize(x) == 2 &&
                       cJSON_IsString(x->child) && cJSON_IsString(x->child->next)) {
                a = x->child->valuestring; na = strlen(a);
                b = x->child->next->valuestring; nb = strlen(b);
            }
            if (!a) { rc = fasa_error(err, FASA_EFORMAT, "%s[%d] is not a pair", what, i); break; }
            if ((rc = merge_add(t, i, a, na, b, nb, what, err)) < 0) break;
            i++;
        }
        free(what);
        if (rc < 0) { tokenizer_free(t); return rc; }
    }

    if ((unk = jstr(model, "unk_token"))) {
        t->unk = tokenizer_find(t, unk);
        if (t->unk < 0) {
            tokenizer_free(t);
            return fasa_error(err, FASA_EFORMAT, "'%s': model.unk_token '%.64s' is not in the vocabulary", path, unk);
        }
    }
    if ((with_config && (rc = load_config(t, path, err)) < 0) || (rc = tok_finish(t, path, err)) < 0) {
        tokenizer_free(t);
        return rc;
    }
    *out = t;
    return 0;
}

int tokenizer_load_json(tokenizer **out, const char *path, char *err)
{
    cJSON *root;
    int rc = 0;
    if (!out || !path) return fasa_error(err, FASA_EARG, "tokenizer: no path or output pointer");
    *out = NULL;
    if (!(root = json_parse_file(path, err, &rc))) return rc;
    rc = load_json_root(out, root, path, 1, err);
    cJSON_Delete(root);
    return rc;
}

int tokenizer_parse_json(tokenizer **out, const char *json, size_t len, const char *name, char *err)
{
    cJSON *root;
    int rc = 0;
    if (!out || (!json && len)) return fasa_error(err, FASA_EARG, "tokenizer: no text or output pointer");
    *out = NULL;
    if (!name) name = "tokenizer.json";
    if (!(root = json_parse_text(json ? json : "", len, name, err, &rc))) return rc;
    rc = load_json_root(out, root, name, 0, err);
    cJSON_Delete(root);
    return rc;
}

/* ---- queries ---------------------------------------------------------------------------- */

int tokenizer_n_vocab(const tokenizer *t) { return t->n_vocab; }
int tokenizer_bos(const tokenizer *t) { return t->bos; }
int tokenizer_eos(const tokenizer *t) { return t->eos; }
enum tokenizer_pre tokenizer_pre_kind(const tokenizer *t) { return t->pre; }

int tokenizer_find(const tokenizer *t, const char *piece)
{
    if (!t->vtab || !piece) return -1;
    return vocab_get(t, piece, strlen(piece));
}

void tokenizer_set_special(tokenizer *t, int bos, int eos)
{
    t->bos = bos >= 0 && bos < t->n_vocab ? bos : -1;
    t->eos = eos >= 0 && eos < t->n_vocab ? eos : -1;
}

int tokenizer_is_special(const tokenizer *t, int id)
{
    return id >= 0 && id < t->n_vocab && (t->flags[id] & TOK_F_SPECIAL);
}

int tokenizer_decode(const tokenizer *t, int32_t id, char *buf, size_t cap)
{
    const uint8_t *s;
    size_t n, i = 0, o = 0;
    if (id < 0 || id >= t->n_vocab || t->len[id] < 0) return FASA_EARG;
    s = (const uint8_t *)t->arena + t->off[id];
    n = (size_t)t->len[id];
    /* The ByteLevel decoder of `tokenizers`, which sees added tokens too: if every character
     * is a byte symbol, the bytes; otherwise the token's own UTF-8. Printable ASCII stands for
     * itself, so "<|im_end|>" comes out as written either way. */
    while (i < n) {
        size_t l;
        uint32_t cp = utf8_get(s + i, n - i, &l);
        if (cp >= 324 || t->u2b[cp] < 0) break;
        if (o < cap) buf[o] = (char)t->u2b[cp];
        o++;
        i += l;
    }
    if (i == n) return (int)o;
    if (cap) memcpy(buf, s, n < cap ? n : cap);
    return (int)n;
}

/* ---- encoding --------------------------------------------------------------------------- */

/* A candidate merge: rank << 32 | position of its left symbol. Ordering the integers orders by
 * rank, then leftmost, which is the order `tokenizers` merges in. 8 bytes, so a long word's
 * heap stays small; a popped entry is checked against the current symbols. */
typedef uint64_t heap_entry;

typedef struct enc {
    const tokenizer *t;
    int32_t *ids;
    int64_t n, max_ids;
    int status;
    pcre2_match_data *md;
    size_t cap;             /* symbols the scratch below can hold */
    int32_t *sym, *prev, *next;
    heap_entry *heap;
    char *word;             /* the pre-token as symbols, for ignore_merges (2 bytes per byte) */
} enc;

static void emit(enc *e, int32_t id)
{
    if (e->n < e->max_ids) e->ids[e->n] = id;
    e->n++;
}

static int scratch(enc *e, size_t n)
{
    if (n <= e->cap) return 0;
    size_t c = e->cap ? e->cap : 64;
    while (c < n) c *= 2;
    free(e->sym); free(e->prev); free(e->next); free(e->heap); free(e->word);
    e->sym = malloc(c * sizeof *e->sym);
    e->prev = malloc(c * sizeof *e->prev);
    e->next = malloc(c * sizeof *e->next);
    e->heap = malloc(3 * c * sizeof *e->heap);
    e->word = malloc(2 * c);
    if (!e->sym || !e->prev || !e->next || !e->heap || !e->word) { e->cap = 0; return -1; }
    e->cap = c;
    return 0;
}

static void heap_push(heap_entry *h, size_t *n, heap_entry x)
{
    size_t i = (*n)++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (x >= h[p]) break;
        h[i] = h[p];
        i = p;
    }
    h[i] = x;
}

static heap_entry heap_pop(heap_entry *h, size_t *n)
{
    heap_entry top = h[0], x = h[--*n];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= *n) break;
        if (c + 1 < *n && h[c + 1] < h[c]) c++;
        if (h[c] >= x) break;
        h[i] = h[c];
        i = c;
    }
    if (*n) h[i] = x;
    return top;
}

static void pair_push(enc *e, size_t *hn, int32_t l, int32_t r)
{
    const merge_slot *m;
    if (l < 0 || r < 0 || !(m = merge_get(e->t, e->sym[l], e->sym[r]))) return;
    heap_push(e->heap, hn, (uint64_t)m->rank << 32 | (uint32_t)l);
}

/* BPE over one pre-token: always merge the lowest-ranked adjacent pair, leftmost first. A heap
 * of candidate pairs with lazy invalidation keeps this O(n log n), so a 100 KB run of one
 * character costs milliseconds rather than the minutes a rescan per merge would. */
static void bpe_word(enc *e, const uint8_t *s, size_t n)
{
    const tokenizer *t = e->t;
    size_t m = 0, hn = 0;
    if (n == 0 || e->status < 0) return;
    if (scratch(e, n) < 0) { e->status = FASA_ENOMEM; return; }
    if (t->ignore_merges) {
        size_t w = 0;
        int id;
        for (size_t i = 0; i < n; i++) {
            memcpy(e->word + w, t->b2u[s[i]], t->b2u_len[s[i]]);
            w += t->b2u_len[s[i]];
        }
        if ((id = vocab_get(t, e->word, w)) >= 0) { emit(e, id); return; }
    }
    for (size_t i = 0; i < n; i++) {
        int32_t id = t->byte_id[s[i]];
        if (id < 0) {
            /* Only in hand-made vocabularies: like `tokenizers`, unknown symbols become unk
             * (fused if asked) or vanish when there is none. */
            if (t->unk < 0 || (t->fuse_unk && m > 0 && e->sym[m - 1] == t->unk)) continue;
            id = t->unk;
        }
        e->sym[m] = id;
        e->prev[m] = (int32_t)m - 1;
        e->next[m] = (int32_t)m + 1;
        m++;
    }
    if (m == 0) return;
    e->next[m - 1] = -1;
    for (size_t i = 0; i + 1 < m; i++) pair_push(e, &hn, (int32_t)i, (int32_t)i + 1);
    while (hn > 0) {
        heap_entry h = heap_pop(e->heap, &hn);
        int32_t l = (int32_t)(uint32_t)h, r;
        const merge_slot *mg;
        /* Stale if the left symbol was absorbed or either side has changed since the push (the
         * rank names the pair, so an equal rank means the same pair). */
        if (e->sym[l] < 0 || (r = e->next[l]) < 0 || !(mg = merge_get(t, e->sym[l], e->sym[r])) ||
            (uint64_t)mg->rank != h >> 32)
            continue;
        e->sym[l] = mg->id;
        e->sym[r] = -1;
        e->next[l] = e->next[r];
        if (e->next[r] >= 0) e->prev[e->next[r]] = l;
        pair_push(e, &hn, e->prev[l], l);
        pair_push(e, &hn, l, e->next[l]);
    }
    for (int32_t i = 0; i >= 0; i = e->next[i]) emit(e, e->sym[i]);
}

static size_t char_len(const uint8_t *s, size_t n)
{
    size_t l;
    utf8_get(s, n, &l);
    return l <= n ? l : n;
}

/* Next match of re in s[0..n) at or after pos, into [*ms, *me); 0 if none, < 0 on an engine
 * error. JIT stack exhaustion falls back to the interpreter, which keeps its state on the
 * heap. */
static int re_next(enc *e, const pcre2_code *re, const uint8_t *s, size_t n, size_t pos, size_t *ms, size_t *me)
{
    int rc = pcre2_match(re, s, n, pos, PCRE2_NO_UTF_CHECK, e->md, NULL);
    if (rc < 0 && rc != PCRE2_ERROR_NOMATCH)
        rc = pcre2_match(re, s, n, pos, PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT, e->md, NULL);
    if (rc == PCRE2_ERROR_NOMATCH) return 0;
    if (rc < 0) return FASA_EUNSUPPORTED;
    PCRE2_SIZE *ov = pcre2_get_ovector_pointer(e->md);
    *ms = ov[0];
    *me = ov[1];
    return 1;
}

/* Split s with re like a `tokenizers` Split with Isolated behaviour: every match is a
 * pre-token, and so is any text between matches. The subject ends at n, so lookaheads such as
 * \s+(?!\S) see the end of this piece, not the text beyond it, exactly as in `tokenizers`,
 * where each piece is a separate string. */
static void split_regex(enc *e, const pcre2_code *re, const uint8_t *s, size_t n)
{
    size_t gap = 0, pos = 0, ms, me;
    while (pos < n && e->status >= 0) {
        int rc = re_next(e, re, s, n, pos, &ms, &me);
        if (rc < 0) { e->status = rc; return; }
        if (rc == 0) break;
        if (me <= ms) { pos = ms + char_len(s + ms, n - ms); continue; }   /* empty: no split */
        bpe_word(e, s + gap, ms - gap);
        bpe_word(e, s + ms, me - ms);
        gap = pos = me;
    }
    bpe_word(e, s + gap, n - gap);
}

static void pretokenize(enc *e, const uint8_t *s, size_t n)
{
    size_t gap = 0, ms, me;
    if (!e->t->re_digit) { split_regex(e, e->t->re_main, s, n); return; }
    /* Digits(individual_digits): every numeric character is a piece of its own, then the GPT-2
     * regex runs on the pieces between them. A lone numeric character is one regex match. */
    while (gap < n && e->status >= 0) {
        int rc = re_next(e, e->t->re_digit, s, n, gap, &ms, &me);
        if (rc < 0) { e->status = rc; return; }
        if (rc == 0) break;
        if (ms > gap) split_regex(e, e->t->re_main, s + gap, ms - gap);
        bpe_word(e, s + ms, me - ms);
        gap = me;
    }
    if (gap < n) split_regex(e, e->t->re_main, s + gap, n - gap);
}

static int re_char_at(enc *e, const pcre2_code *re, const uint8_t *s, size_t n)
{
    return pcre2_match(re, s, n, 0, PCRE2_NO_UTF_CHECK | PCRE2_ANCHORED, e->md, NULL) >= 0;
}

/* Start of the last character of s[0..n). */
static size_t char_back(const uint8_t *s, size_t n)
{
    size_t i = n - 1;
    while (i > 0 && (s[i] & 0xC0) == 0x80) i--;
    return i;
}

/* Leftmost-longest matching of the added tokens of one class, non-overlapping, left to right
 * (as the Aho-Corasick automaton of `tokenizers` does). A match that is then rejected (a
 * special token with parse_special off, a single_word token inside a word) stays plain text
 * and the search resumes after it. */
static void split_added(enc *e, int cls, const uint8_t *s, size_t n, int parse_special)
{
    const tokenizer *t = e->t;
    size_t gap = 0, pos = 0;
    if (t->abeg[cls][256] > 0) {
        while (pos < n && e->status >= 0) {
            const added_token *a = NULL;
            size_t ms, me;
            for (ms = pos; ms < n; ms++) {
                for (int k = t->abeg[cls][s[ms]]; k < t->abeg[cls][s[ms] + 1] && !a; k++) {
                    const added_token *c = &t->added[t->aidx[cls][k]];
                    if (c->len <= n - ms && !memcmp(s + ms, t->arena + c->off, c->len)) a = c;
                }
                if (a) break;
            }
            if (!a) break;
            me = ms + a->len;
            pos = me;
            if (a->special && !parse_special) continue;
            if (a->single_word && ((ms > 0 && re_char_at(e, t->re_word, s + char_back(s, ms), ms - char_back(s, ms))) ||
                                   (me < n && re_char_at(e, t->re_word, s + me, n - me))))
                continue;
            if (a->lstrip)
                while (ms > gap && re_char_at(e, t->re_space, s + char_back(s, ms), ms - char_back(s, ms)))
                    ms = char_back(s, ms);
            if (a->rstrip)
                while (me < n && re_char_at(e, t->re_space, s + me, n - me)) me += char_len(s + me, n - me);
            if (ms > gap) {
                if (cls == 0) split_added(e, 1, s + gap, ms - gap, parse_special);
                else pretokenize(e, s + gap, ms - gap);
            }
            emit(e, a->id);
            gap = pos = me;
        }
    }
    if (gap < n) {
        if (cls == 0) split_added(e, 1, s + gap, n - gap, parse_special);
        else pretokenize(e, s + gap, n - gap);
    }
}

int tokenizer_encode(const tokenizer *t, const char *text, size_t len, int parse_special,
                     int32_t *ids, int max_ids)
{
    enc e = { 0 };
    uint8_t *clean = NULL;
    const uint8_t *s = (const uint8_t *)text;
    size_t i = 0;

    if (!t || (!text && len) || max_ids < 0 || (!ids && max_ids > 0)) return FASA_EARG;
    if (len > INT_MAX) return FASA_EARG;   /* ids never outnumber bytes, so the count fits */

    /* Invalid UTF-8 becomes U+FFFD per maximal subpart: the string `tokenizers` sees when the
     * bytes are decoded with errors="replace", and what llama.cpp does. */
    while (i < len) {
        size_t bad, l = utf8_seq(s + i, len - i, &bad);
        if (!l) break;
        i += l;
    }
    if (i < len) {
        size_t o = i;
        /* Each replacement is 3 bytes for at least 1 byte in. */
        if (len > (SIZE_MAX - 1) / 3 || !(clean = malloc(3 * len + 1))) return FASA_ENOMEM;
        memcpy(clean, s, i);
        while (i < len) {
            size_t bad, l = utf8_seq(s + i, len - i, &bad);
            if (l) { memcpy(clean + o, s + i, l); o += l; i += l; }
            else { memcpy(clean + o, "\xEF\xBF\xBD", 3); o += 3; i += bad; }
        }
        s = clean;
        len = o;
        if (len > INT_MAX) { free(clean); return FASA_EARG; }   /* symbol positions are int32 */
    }

    e.t = t;
    e.ids = ids;
    e.max_ids = max_ids;
    if (!(e.md = pcre2_match_data_create(1, NULL))) { free(clean); return FASA_ENOMEM; }
    split_added(&e, 0, s, len, parse_special);
    pcre2_match_data_free(e.md);
    free(e.sym); free(e.prev); free(e.next); free(e.heap); free(e.word);
    free(clean);
    if (e.status < 0) return e.status;
    return e.n > INT_MAX ? FASA_EARG : (int)e.n;
}

/* ---- chat templates --------------------------------------------------------------------- */

typedef struct sbuf { char *out; size_t cap, n; } sbuf;

static void sb_put(sbuf *b, const char *s, size_t n)
{
    if (b->n < b->cap) {
        size_t room = b->cap - b->n;
        memcpy(b->out + b->n, s, n < room ? n : room);
    }
    b->n += n;
}

static void sb_str(sbuf *b, const char *s) { sb_put(b, s, strlen(s)); }

/* Llama-3's template trims each message (Jinja's trim: leading and trailing whitespace). */
static void sb_trimmed(sbuf *b, const char *s)
{
    size_t n = strlen(s);
    while (n && (*s == ' ' || *s == '\t' || *s == '\n' || *s == '\r' || *s == '\v' || *s == '\f')) s++, n--;
    while (n && (s[n - 1] == ' ' || s[n - 1] == '\t' || s[n - 1] == '\n' || s[n - 1] == '\r' ||
                 s[n - 1] == '\v' || s[n - 1] == '\f'))
        n--;
    sb_put(b, s, n);
}

int tokenizer_chat_render(enum tokenizer_chat kind, const char *system, const char *user,
                          char *out, size_t cap)
{
    sbuf b = { out, cap ? cap - 1 : 0, 0 };
    if (!user || (!out && cap)) return FASA_EARG;
    switch (kind) {
    case TOKENIZER_CHAT_CHATML:
        if (system) {
            sb_str(&b, "<|im_start|>system\n");
            sb_str(&b, system);
            sb_str(&b, "<|im_end|>\n");
        }
        sb_str(&b, "<|im_start|>user\n");
        sb_str(&b, user);
        sb_str(&b, "<|im_end|>\n<|im_start|>assistant\n");
        break;
    case TOKENIZER_CHAT_LLAMA3:
        sb_str(&b, "<|begin_of_text|>");
        if (system) {
            sb_str(&b, "<|start_header_id|>system<|end_header_id|>\n\n");
            sb_trimmed(&b, system);
            sb_str(&b, "<|eot_id|>");
        }
        sb_str(&b, "<|start_header_id|>user<|end_header_id|>\n\n");
        sb_trimmed(&b, user);
        sb_str(&b, "<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n");
        break;
    default:
        return FASA_EARG;
    }
    if (cap) out[b.n < b.cap ? b.n : b.cap] = 0;
    return b.n > INT_MAX ? FASA_EARG : (int)b.n;
}

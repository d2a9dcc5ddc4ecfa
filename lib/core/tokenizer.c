/* tokenizer.c - BPE tokenizers (byte-level and SentencePiece-style), decode, chat templates.
 *
 * The pipeline follows Hugging Face `tokenizers` for the models fasa runs:
 *   text -> invalid UTF-8 replaced by U+FFFD -> added tokens split out -> then per piece
 *   byte-level: pre-tokenisation (optional Digits split, then the family's regex) -> bytes mapped
 *     to GPT-2 symbols -> BPE merges by rank inside each pre-token -> ids;
 *   SentencePiece: prefix "▁", spaces to "▁" (optional Metaspace split at each "▁") -> characters
 *     (or their <0xNN> byte tokens) -> merges, by rank (tokenizer.json) or, as llama.cpp does for
 *     a GGUF, by the score of the merged piece -> ids.
 * scripts/tokenizer_check.py compares the result with `tokenizers` and llama.cpp on >= 10,000 lines.
 */
#include "tokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <cjson/cJSON.h>

#include "gguf.h"

#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Largest id we accept from a file: far above any real vocabulary, small enough that
 * per-id tables can never overflow. */
#define TOK_MAX_VOCAB (1 << 22)

enum { TOK_F_ADDED = 1, TOK_F_SPECIAL = 2, TOK_F_BYTE = 4 };

/* U+2581, SentencePiece's stand-in for a space. */
#define SPM_SPACE "\xE2\x96\x81"

/* Metaspace's prepend_scheme: which pieces get "▁" in front (unless they start with one). */
enum spm_meta { SPM_META_NEVER, SPM_META_FIRST, SPM_META_ALWAYS };

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

    enum tokenizer_type type;
    enum tokenizer_pre pre;
    int ignore_merges;          /* a pre-token that is itself in the vocabulary skips BPE */
    int fuse_unk;
    int unk, bos, eos;
    int add_bos, add_eos;

    /* SentencePiece-style. byte_id[] then holds the <0xNN> tokens. */
    int byte_fallback;          /* a character without a token becomes its bytes' tokens */
    int by_score;               /* merge by the merged piece's score over text spans (GGUF) */
    int32_t *srank;             /* (n_vocab) by_score: dense rank of the score, 0 the highest */
    int32_t max_len;            /* longest token in bytes: no longer span is a token */
    int prepend;                /* "▁" before each piece between class-0 added tokens */
    enum spm_meta meta;         /* Metaspace's own prefix */
    int replace_space;          /* ' ' becomes "▁" */
    int split_words;            /* Metaspace split: each "▁" starts a word */
    int strip_space;            /* decode_text drops one leading space */

    char *chat_template;        /* as found in the file, NUL-terminated */
    char *chat_source;          /* where: "tokenizer.chat_template" or a path */
};

/* ---- split patterns ---------------------------------------------------------------------
 * The *_JSON strings are the patterns exactly as tokenizer.json writes them; a file is
 * recognised by comparing against them. The compiled forms differ in one respect: for
 * Oniguruma (which `tokenizers` uses) \s is the White_Space property, while PCRE2's \s with UCP
 * also takes U+180E, which its built-in list of horizontal spaces kept after Unicode 6.3 made it
 * a format character. So \s and \S are spelled \p{White_Space} and \P{White_Space}; all else
 * runs as written. */
#define PAT_GPT2_JSON "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+"
#define PAT_LLAMA3_JSON                                                                                                \
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| "                                         \
    "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
#define PAT_QWEN2_JSON                                                                                                 \
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| "                                              \
    "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"

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

/* Per-token score ranks for merging by score: equal scores share a rank, so the heap's order
 * (rank, then position) is llama.cpp's (highest score, then leftmost). A NaN counts as lowest. */
typedef struct score_key { float score; int32_t id; } score_key;

static int score_cmp(const void *pa, const void *pb)
{
    const score_key *a = pa, *b = pb;
    if (a->score != b->score) return a->score > b->score ? -1 : 1;
    return a->id < b->id ? -1 : a->id > b->id;
}

static int score_ranks(tokenizer *t, const float *scores)
{
    score_key *k = malloc((size_t)t->n_vocab * sizeof *k);
    t->srank = malloc((size_t)t->n_vocab * sizeof *t->srank);
    if (!k || !t->srank) { free(k); return -1; }
    for (int i = 0; i < t->n_vocab; i++) {
        float x = scores ? scores[i] : 0.0f;
        k[i] = (score_key){ isnan(x) ? -INFINITY : x, i };
    }
    qsort(k, (size_t)t->n_vocab, sizeof *k, score_cmp);
    for (int i = 0, r = 0; i < t->n_vocab; i++) {
        if (i > 0 && k[i].score != k[i - 1].score) r++;
        t->srank[k[i].id] = r;
    }
    free(k);
    return 0;
}

/* Hash tables, byte symbols, added-token index, regexes, default bos/eos. label names the
 * file in messages ("'tokenizer.json'", "tokenizer.ggml.tokens"). */
static int tok_finish(tokenizer *t, const char *label, char *err)
{
    static const char *const eos_names[] = { "<|im_end|>", "<|eot_id|>", "<end_of_turn>", "<|end_of_text|>",
                                             "<|endoftext|>", "</s>", "<eos>" };
    static const char *const bos_names[] = { "<|begin_of_text|>", "<s>", "<bos>" };
    const char *pat = t->pre == TOKENIZER_PRE_LLAMA3 ? PAT_LLAMA3
                    : t->pre == TOKENIZER_PRE_QWEN2 ? PAT_QWEN2 : PAT_GPT2;
    int rc, need_word = 0, need_space = 0;

    if (t->type == TOKENIZER_SPM) {
        for (int b = 0; b < 256; b++) {
            char name[8];
            snprintf(name, sizeof name, "<0x%02X>", b);
            if ((t->byte_id[b] = vocab_get(t, name, 6)) >= 0) t->flags[t->byte_id[b]] |= TOK_F_BYTE;
            else if (t->byte_fallback)
                return fasa_error(err, FASA_EFORMAT, "%s: byte_fallback needs the 256 byte tokens <0x00>..<0xFF>; "
                                  "%s is missing", label, name);
        }
        for (int i = 0; i < t->n_vocab; i++) if (t->len[i] > t->max_len) t->max_len = t->len[i];
    } else {
        for (int b = 0; b < 256; b++) t->byte_id[b] = vocab_get(t, (const char *)t->b2u[b], t->b2u_len[b]);
    }

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

    if (t->type == TOKENIZER_BYTE_LEVEL) {
        if ((rc = pattern_compile(&t->re_main, pat, label, err)) < 0) return rc;
        if (t->pre == TOKENIZER_PRE_SMOLLM && (rc = pattern_compile(&t->re_digit, "\\p{N}", label, err)) < 0)
            return rc;
    }
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
    free(t->srank);
    free(t->chat_template);
    free(t->chat_source);
    free(t);
}

/* ---- loading from GGUF-style arrays ----------------------------------------------------- */

typedef struct vocab_arrays {
    int n_vocab;
    const char *const *tokens;
    const uint64_t *token_lens;     /* NULL: NUL-terminated */
    const int32_t *types;           /* NULL: all NORMAL */
    const float *scores;            /* SPM; NULL: all 0 */
    int n_merges;                   /* byte-level */
    const char *const *merges;
    const uint64_t *merge_lens;
    const char *pre;                /* byte-level */
    int spm;
} vocab_arrays;

static int load_arrays(tokenizer **out, const vocab_arrays *va, char *err)
{
    static const char what_tok[] = "tokenizer.ggml.tokens", what_merge[] = "tokenizer.ggml.merges";
    enum tokenizer_pre kind = TOKENIZER_PRE_GPT2;
    const char *pre = va->pre;
    size_t total = 0;
    tokenizer *t;
    int rc, n_vocab = va->n_vocab, n_merges = va->spm ? 0 : va->n_merges;

    if (!out) return fasa_error(err, FASA_EARG, "tokenizer: no output pointer");
    *out = NULL;
    if (n_vocab <= 0 || n_vocab > TOK_MAX_VOCAB || !va->tokens)
        return fasa_error(err, FASA_EARG, "%s: bad vocabulary size %d", what_tok, n_vocab);
    if (n_merges < 0 || (n_merges > 0 && !va->merges))
        return fasa_error(err, FASA_EARG, "%s: bad merge count %d", what_merge, n_merges);

    if (va->spm || !pre || !strcmp(pre, "gpt2") || !strcmp(pre, "default")) kind = TOKENIZER_PRE_GPT2;
    else if (!strcmp(pre, "smollm")) kind = TOKENIZER_PRE_SMOLLM;
    else if (!strcmp(pre, "llama-bpe") || !strcmp(pre, "llama3")) kind = TOKENIZER_PRE_LLAMA3;
    else if (!strcmp(pre, "qwen2")) kind = TOKENIZER_PRE_QWEN2;
    else
        return fasa_error(
            err, FASA_EUNSUPPORTED,
            "tokenizer.ggml.pre '%s' is not supported (known: smollm, gpt2, default, llama-bpe, llama3, qwen2)", pre);

    for (int i = 0; i < n_vocab; i++) {
        size_t n;
        if (!va->tokens[i]) return fasa_error(err, FASA_EARG, "%s[%d] is missing", what_tok, i);
        n = va->token_lens ? va->token_lens[i] : strlen(va->tokens[i]);
        if (n > (1u << 20)) return fasa_error(err, FASA_EFORMAT, "%s[%d] is %zu bytes long", what_tok, i, n);
        total += n;
    }
    if (!(t = tok_new(n_vocab, total))) return fasa_error(err, FASA_ENOMEM, "%s: out of memory", what_tok);
    t->type = va->spm ? TOKENIZER_SPM : TOKENIZER_BYTE_LEVEL;
    t->pre = kind;
    /* llama.cpp treats Llama-3 like its tokenizer.json's "ignore_merges": true. */
    t->ignore_merges = kind == TOKENIZER_PRE_LLAMA3;
    if (va->spm) t->byte_fallback = t->by_score = t->replace_space = 1;

    for (int i = 0; i < n_vocab; i++) {
        size_t n = va->token_lens ? va->token_lens[i] : strlen(va->tokens[i]);
        int type = va->types ? va->types[i] : 1;
        /* CONTROL tokens (and for SentencePiece UNKNOWN, as llama.cpp has it) are special;
         * USER_DEFINED ones are plain added tokens, matched even when parse_special is off, as
         * `tokenizers` does with non-special added tokens. A SentencePiece vocabulary matches
         * them all on the raw text, so that llama.cpp's prefix follows each of them. */
        int special = type == 3 || (va->spm && type == 2);
        rc = special || type == 4 ? added_add(t, i, va->tokens[i], n, special, 0, 0, 0, type == 4 && !va->spm)
                                  : tok_set_piece(t, i, va->tokens[i], n);
        if (rc < 0) { tokenizer_free(t); return fasa_error(err, FASA_ENOMEM, "%s: out of memory", what_tok); }
    }
    if (vocab_build(t) < 0 || merges_alloc(t, n_merges) < 0 || (va->spm && score_ranks(t, va->scores) < 0)) {
        tokenizer_free(t);
        return fasa_error(err, FASA_ENOMEM, "%s: out of memory", what_tok);
    }
    for (int i = 0; i < n_merges; i++) {
        const char *m = va->merges[i], *sp = NULL;
        size_t n;
        if (!m) { tokenizer_free(t); return fasa_error(err, FASA_EARG, "%s[%d] is missing", what_merge, i); }
        n = va->merge_lens ? va->merge_lens[i] : strlen(m);
        /* The separator is the first space after the first byte (a token is never empty). */
        if (n > 1) sp = memchr(m + 1, ' ', n - 1);
        if (!sp || sp + 1 == m + n || memchr(sp + 1, ' ', (size_t)(m + n - sp - 1))) {
            tokenizer_free(t);
            return fasa_error(err, FASA_EFORMAT, "%s[%d] '%.*s' is not a pair", what_merge, i, (int)(n > 64 ? 64 : n),
                              m);
        }
        if ((rc = merge_add(t, i, m, (size_t)(sp - m), sp + 1, (size_t)(m + n - sp - 1), what_merge, err)) < 0) {
            tokenizer_free(t);
            return rc;
        }
    }
    if ((rc = tok_finish(t, what_tok, err)) < 0) { tokenizer_free(t); return rc; }
    *out = t;
    return 0;
}

int tokenizer_load_vocab(tokenizer **out, int n_vocab, const char *const *tokens,
                         const uint64_t *token_lens, const int32_t *types,
                         int n_merges, const char *const *merges, const uint64_t *merge_lens,
                         const char *pre, char *err)
{
    const vocab_arrays va = { n_vocab, tokens, token_lens, types, NULL, n_merges, merges, merge_lens, pre, 0 };
    return load_arrays(out, &va, err);
}

/* A copy of n bytes with a NUL after them (GGUF strings are not terminated). */
static char *str_dup(const char *s, size_t n)
{
    char *d = malloc(n + 1);
    if (d) { memcpy(d, s, n); d[n] = 0; }
    return d;
}

int tokenizer_set_chat_template(tokenizer *t, const char *text, const char *source)
{
    char *a = NULL, *b = NULL;
    if (text && (!(a = str_dup(text, strlen(text))) || (source && !(b = str_dup(source, strlen(source)))))) {
        free(a);
        return FASA_ENOMEM;
    }
    free(t->chat_template);
    free(t->chat_source);
    t->chat_template = a;
    t->chat_source = b;
    return 0;
}

/* An array key of the given element type, or NULL if absent; FASA_EFORMAT through *rc if it is
 * something else or does not have n elements (n 0: any). */
static const gguf_kv *gguf_array(const gguf_file *g, const char *key, uint32_t type, uint64_t n, int *rc,
                                 const char *file, char *err)
{
    const gguf_kv *kv = gguf_find_kv(g, key);
    int numeric = type != GGUF_VT_STRING;
    if (!kv) return NULL;
    if (kv->type != GGUF_VT_ARRAY || (numeric ? kv->arr_type == GGUF_VT_STRING || kv->arr_type == GGUF_VT_ARRAY
                                              : kv->arr_type != GGUF_VT_STRING)) {
        *rc = fasa_error(err, FASA_EFORMAT, "'%s': %s is not an array of %s", file, key,
                         numeric ? "numbers" : "strings");
        return NULL;
    }
    if (n && kv->arr_n != n) {
        *rc = fasa_error(err, FASA_EFORMAT, "'%s': %s has %" PRIu64 " entries for %" PRIu64 " tokens", file, key,
                         kv->arr_n, n);
        return NULL;
    }
    return kv;
}

int tokenizer_load_gguf(tokenizer **out, const gguf_file *g, char *err)
{
    const char *file = g && g->path[0] ? g->path : "gguf";
    const gguf_kv *kt, *km = NULL, *ky, *ks = NULL;
    gguf_str model, pre = { "default", 7 }, tmpl;
    gguf_str *strs = NULL;
    const char **ptrs = NULL;
    uint64_t *lens = NULL, nv, nm = 0;
    int32_t *types = NULL;
    float *scores = NULL;
    char prebuf[64];
    int rc = 0, spm;
    uint32_t u;

    if (!out || !g) return fasa_error(err, FASA_EARG, "tokenizer: no file or output pointer");
    *out = NULL;
    if (!(kt = gguf_find_kv(g, "tokenizer.ggml.tokens"))) return 0;
    if (gguf_get_str(g, "tokenizer.ggml.model", &model) < 0)
        return fasa_error(err, FASA_EFORMAT, "'%s': tokenizer.ggml.model is missing", file);
    if (model.len == 4 && !memcmp(model.ptr, "gpt2", 4)) spm = 0;
    else if (model.len == 5 && !memcmp(model.ptr, "llama", 5)) spm = 1;
    else
        return fasa_error(err, FASA_EUNSUPPORTED, "'%s': tokenizer.ggml.model '%.*s' is not supported "
                          "(gpt2: byte-level BPE; llama: SentencePiece BPE)", file,
                          (int)(model.len < 32 ? model.len : 32), model.ptr);
    nv = kt->arr_n;
    if (!gguf_array(g, "tokenizer.ggml.tokens", GGUF_VT_STRING, 0, &rc, file, err))
        return rc;
    if (nv == 0 || nv > TOK_MAX_VOCAB)
        return fasa_error(err, FASA_EFORMAT, "'%s': tokenizer.ggml.tokens holds %" PRIu64 " tokens", file, nv);
    ky = gguf_array(g, "tokenizer.ggml.token_type", GGUF_VT_I32, nv, &rc, file, err);
    if (spm) ks = gguf_array(g, "tokenizer.ggml.scores", GGUF_VT_F32, nv, &rc, file, err);
    else if ((km = gguf_array(g, "tokenizer.ggml.merges", GGUF_VT_STRING, 0, &rc, file, err))) nm = km->arr_n;
    if (rc < 0) return rc;
    if (nm > (1u << 24)) return fasa_error(err, FASA_EFORMAT, "'%s': tokenizer.ggml.merges is too large", file);
    gguf_get_str(g, "tokenizer.ggml.pre", &pre);
    snprintf(prebuf, sizeof prebuf, "%.*s", (int)(pre.len < 63 ? pre.len : 63), pre.ptr);

    strs = calloc(nv + nm, sizeof *strs);
    ptrs = calloc(nv + nm, sizeof *ptrs);
    lens = calloc(nv + nm, sizeof *lens);
    if (ky) types = calloc(nv, sizeof *types);
    if (ks) scores = calloc(nv, sizeof *scores);
    if (!strs || !ptrs || !lens || (ky && !types) || (ks && !scores))
        rc = fasa_error(err, FASA_ENOMEM, "'%s': out of memory", file);
    else if (gguf_arr_strs(kt, strs) < 0 || (nm && gguf_arr_strs(km, strs + nv) < 0) ||
             (ky && gguf_arr_i32(ky, types) < 0) || (ks && gguf_arr_f32(ks, scores) < 0))
        rc = fasa_error(err, FASA_EFORMAT, "'%s': malformed tokenizer arrays", file);
    else {
        vocab_arrays va = { (int)nv, ptrs, lens, types, scores, (int)nm, ptrs + nv, lens + nv, prebuf, spm };
        for (uint64_t i = 0; i < nv + nm; i++) ptrs[i] = strs[i].ptr, lens[i] = strs[i].len;
        if ((rc = load_arrays(out, &va, err)) < 0) {
            char inner[FASA_ERRLEN];
            snprintf(inner, sizeof inner, "%s", err ? err : "");
            rc = fasa_error(err, rc, "'%s': %s", file, inner);
        }
    }
    free(strs); free(ptrs); free(lens); free(types); free(scores);
    if (rc < 0) return rc;

    tokenizer *t = *out;
    int b = gguf_get_u32(g, "tokenizer.ggml.bos_token_id", &u) == 0 ? (int)u : -1;
    int e = gguf_get_u32(g, "tokenizer.ggml.eos_token_id", &u) == 0 ? (int)u : -1;
    /* For chat, the end of a turn is what ends generation. */
    int eot = tokenizer_find(t, "<|im_end|>");
    if (eot < 0) eot = tokenizer_find(t, "<|eot_id|>");
    if (eot < 0) eot = tokenizer_find(t, "<end_of_turn>");
    tokenizer_set_special(t, b >= 0 ? b : t->bos, eot >= 0 ? eot : e >= 0 ? e : t->eos);
    /* llama.cpp's defaults: BOS and a prefix space for SentencePiece, BOS for Llama-3. */
    t->add_bos = spm || t->pre == TOKENIZER_PRE_LLAMA3;
    gguf_get_bool(g, "tokenizer.ggml.add_bos_token", &t->add_bos);
    gguf_get_bool(g, "tokenizer.ggml.add_eos_token", &t->add_eos);
    if (spm) {
        t->prepend = 1;
        gguf_get_bool(g, "tokenizer.ggml.add_space_prefix", &t->prepend);
        t->strip_space = t->prepend;
    }
    if (gguf_get_str(g, "tokenizer.chat_template", &tmpl) == 0 &&
        (!(t->chat_template = str_dup(tmpl.ptr, tmpl.len)) ||
         !(t->chat_source = str_dup("tokenizer.chat_template", 23)))) {
        tokenizer_free(t);
        *out = NULL;
        return fasa_error(err, FASA_ENOMEM, "'%s': out of memory", file);
    }
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
        return fasa_error(err, FASA_EUNSUPPORTED,
                          "'%s': pre_tokenizer ByteLevel with add_prefix_space is not supported", path);
    /* use_regex defaults to true in `tokenizers`. */
    if ((jget(bl, "use_regex") ? jtrue(bl, "use_regex") : 1) != use_regex)
        return fasa_error(err, FASA_EUNSUPPORTED,
                          "'%s': pre_tokenizer ByteLevel with use_regex %s is not supported here", path,
                          use_regex ? "false" : "true");
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
            return fasa_error(err, FASA_EUNSUPPORTED,
                              "'%s': pre_tokenizer Digits without individual_digits is not supported", path);
        if ((rc = byte_level_ok(b, 1, path, err)) < 0) return rc;
        *kind = TOKENIZER_PRE_SMOLLM;
        return 0;
    }
    if (!strcmp(jtype(a), "Split")) {
        const char *re = jstr(jget(a, "pattern"), "Regex"), *beh = jstr(a, "behavior");
        if (!re || !beh || strcmp(beh, "Isolated") || jtrue(a, "invert"))
            return fasa_error(err, FASA_EUNSUPPORTED, "'%s': pre_tokenizer Split must be an isolated Regex split",
                              path);
        if (!strcmp(re, PAT_LLAMA3_JSON)) *kind = TOKENIZER_PRE_LLAMA3;
        else if (!strcmp(re, PAT_QWEN2_JSON)) *kind = TOKENIZER_PRE_QWEN2;
        else if (!strcmp(re, PAT_GPT2_JSON)) *kind = TOKENIZER_PRE_GPT2;
        else
            return fasa_error(err, FASA_EUNSUPPORTED, "'%s': pre_tokenizer Split regex is not a known family "
                              "(GPT-2, Llama-3, Qwen2): %.80s", path, re);
        return byte_level_ok(b, 0, path, err);
    }
    return fasa_error(err, FASA_EUNSUPPORTED, "'%s': pre_tokenizer Sequence[%s, ByteLevel] is not supported", path,
                      jtype(a));
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

/* ---- SentencePiece-style tokenizer.json ---- */

typedef struct spm_opts {
    int prepend, replace_space, split_words, strip_space;
    enum spm_meta meta;
} spm_opts;

static int is_type(const cJSON *o, const char *type)
{
    return cJSON_IsObject(o) && !strcmp(jtype(o), type);
}

/* A normalizer step of SentencePiece's kind (Prepend, Replace), alone or in a Sequence. */
static int has_spm_step(const cJSON *n)
{
    const cJSON *x;
    if (is_type(n, "Prepend") || is_type(n, "Replace")) return 1;
    if (is_type(n, "Sequence")) cJSON_ArrayForEach(x, jget(n, "normalizers")) if (has_spm_step(x)) return 1;
    return 0;
}

static int spm_normalizer(spm_opts *o, const cJSON *n, const char *path, char *err)
{
    const char *type, *a, *b;
    const cJSON *x;
    int rc;
    if (!n || cJSON_IsNull(n)) return 0;
    type = jtype(n);
    if (!strcmp(type, "Sequence")) {
        cJSON_ArrayForEach(x, jget(n, "normalizers"))
            if ((rc = spm_normalizer(o, x, path, err)) < 0) return rc;
        return 0;
    }
    if (!strcmp(type, "Prepend")) {
        if (!(a = jstr(n, "prepend")) || strcmp(a, SPM_SPACE))
            return fasa_error(err, FASA_EUNSUPPORTED,
                              "'%s': normalizer Prepend(\"%.16s\") is not supported (only \"▁\")", path, a ? a : "");
        o->prepend = 1;
        return 0;
    }
    if (!strcmp(type, "Replace")) {
        a = jstr(jget(n, "pattern"), "String");
        b = jstr(n, "content");
        if (!a || !b || strcmp(a, " ") || strcmp(b, SPM_SPACE))
            return fasa_error(err, FASA_EUNSUPPORTED,
                              "'%s': normalizer Replace is supported only from \" \" to \"▁\"", path);
        o->replace_space = 1;
        return 0;
    }
    return fasa_error(err, FASA_EUNSUPPORTED, "'%s': normalizer %s is not supported for SentencePiece BPE "
                      "(Prepend, Replace, Sequence)", path, type);
}

/* Metaspace (pre_tokenizer or decoder): "▁" only; prepend_scheme, or the older add_prefix_space. */
static int spm_metaspace(const cJSON *m, enum spm_meta *meta, int *split, const char *path, char *err)
{
    const char *rep = jstr(m, "replacement"), *ps = jstr(m, "prepend_scheme");
    if (rep && strcmp(rep, SPM_SPACE))
        return fasa_error(err, FASA_EUNSUPPORTED, "'%s': Metaspace replacement '%.16s' is not supported (only \"▁\")",
                          path, rep);
    if (!ps) *meta = jget(m, "add_prefix_space") && !jtrue(m, "add_prefix_space") ? SPM_META_NEVER : SPM_META_ALWAYS;
    else if (!strcmp(ps, "first")) *meta = SPM_META_FIRST;
    else if (!strcmp(ps, "always")) *meta = SPM_META_ALWAYS;
    else if (!strcmp(ps, "never")) *meta = SPM_META_NEVER;
    else return fasa_error(err, FASA_EUNSUPPORTED, "'%s': Metaspace prepend_scheme '%.16s' is not supported", path, ps);
    if (split) *split = jget(m, "split") ? jtrue(m, "split") : 1;
    return 0;
}

/* The decoder only says whether a leading space goes: Strip(" ", start >= 1), or a Metaspace
 * that prepends. ByteFallback, Fuse and Replace("▁", " ") are what tokenizer_decode does. */
static void spm_decoder(spm_opts *o, const cJSON *d, const char *path)
{
    const cJSON *x;
    enum spm_meta meta;
    if (is_type(d, "Sequence")) cJSON_ArrayForEach(x, jget(d, "decoders")) spm_decoder(o, x, path);
    if (is_type(d, "Strip") && jstr(d, "content") && !strcmp(jstr(d, "content"), " ") &&
        cJSON_IsNumber(jget(d, "start")) && jget(d, "start")->valuedouble >= 1)
        o->strip_space = 1;
    if (is_type(d, "Metaspace") && spm_metaspace(d, &meta, NULL, path, NULL) == 0 && meta != SPM_META_NEVER)
        o->strip_space = 1;
}

static int spm_detect(spm_opts *o, const cJSON *root, const char *path, char *err)
{
    const cJSON *pre = jget(root, "pre_tokenizer");
    int rc;
    memset(o, 0, sizeof *o);
    if ((rc = spm_normalizer(o, jget(root, "normalizer"), path, err)) < 0) return rc;
    if (is_type(pre, "Metaspace")) {
        if ((rc = spm_metaspace(pre, &o->meta, &o->split_words, path, err)) < 0) return rc;
        o->replace_space = 1;
    } else if (pre && !cJSON_IsNull(pre)) {
        return fasa_error(err, FASA_EUNSUPPORTED, "'%s': pre_tokenizer %s is not supported for SentencePiece BPE "
                          "(null or Metaspace)", path, jtype(pre));
    }
    spm_decoder(o, jget(root, "decoder"), path);
    return 0;
}

/* The special token a TemplateProcessing post_processor puts first (Llama's "<s> $A") and
 * whether one comes last; Sequence processors (Llama-3's ByteLevel + TemplateProcessing) are
 * searched. Returns the first one's id, or -1. */
static int post_processor(const tokenizer *t, const cJSON *p, int *add_bos, int *add_eos)
{
    const cJSON *x, *single, *first, *last;
    int id = -1;
    if (is_type(p, "Sequence")) {
        cJSON_ArrayForEach(x, jget(p, "processors")) {
            int r = post_processor(t, x, add_bos, add_eos);
            if (r >= 0) id = r;
        }
        return id;
    }
    if (!is_type(p, "TemplateProcessing") || !cJSON_IsArray(single = jget(p, "single"))) return -1;
    first = cJSON_GetArrayItem(single, 0);
    last = cJSON_GetArrayItem(single, cJSON_GetArraySize(single) - 1);
    if (cJSON_GetArraySize(single) > 1 && jget(last, "SpecialToken")) *add_eos = 1;
    if (!jget(first, "SpecialToken")) return -1;
    const char *name = jstr(jget(first, "SpecialToken"), "id");
    const cJSON *ids = jget(jget(jget(p, "special_tokens"), name ? name : ""), "ids");
    id = cJSON_IsArray(ids) && cJSON_GetArraySize(ids) == 1 ? jid(cJSON_GetArrayItem(ids, 0)) : -1;
    if (id < 0 || id >= t->n_vocab) id = name ? tokenizer_find(t, name) : -1;
    if (id >= 0) *add_bos = 1;
    return id;
}

/* bos_token / eos_token of a tokenizer_config.json: a string or {"content": ...}. */
static const char *config_token(const cJSON *cfg, const char *key)
{
    const cJSON *v = jget(cfg, key);
    if (cJSON_IsString(v)) return v->valuestring;
    if (cJSON_IsObject(v)) return jstr(v, "content");
    return NULL;
}

/* dir of path + name, malloc'ed. */
static char *path_beside(const char *path, const char *name)
{
    const char *slash = strrchr(path, '/');
    size_t dir = slash ? (size_t)(slash - path + 1) : 0, n = strlen(name);
    char *p = malloc(dir + n + 1);
    if (p) { memcpy(p, path, dir); memcpy(p + dir, name, n + 1); }
    return p;
}

/* A Hugging Face directory keeps bos/eos, add_bos_token/add_eos_token and the chat template in
 * tokenizer_config.json next to tokenizer.json ("chat_template": a string, or a list of
 * {"name", "template"} of which "default" is taken); newer ones keep the template in
 * chat_template.jinja. */
static int load_config(tokenizer *t, const char *path, char *err)
{
    char *cpath = path_beside(path, "tokenizer_config.json"), *jpath = path_beside(path, "chat_template.jinja");
    const char *tmpl = NULL;
    cJSON *cfg = NULL;
    FILE *f;
    int rc = 0;
    if (!cpath || !jpath) { rc = fasa_error(err, FASA_ENOMEM, "'%s': out of memory", path); goto out; }
    if ((f = fopen(cpath, "rb"))) {
        fclose(f);
        if (!(cfg = json_parse_file(cpath, err, &rc))) goto out;
        const char *bos = config_token(cfg, "bos_token"), *eos = config_token(cfg, "eos_token");
        const cJSON *ct = jget(cfg, "chat_template"), *x;
        if (bos && tokenizer_find(t, bos) >= 0) t->bos = tokenizer_find(t, bos);
        if (eos && tokenizer_find(t, eos) >= 0) t->eos = tokenizer_find(t, eos);
        if (cJSON_IsBool(jget(cfg, "add_bos_token"))) t->add_bos = jtrue(cfg, "add_bos_token");
        if (cJSON_IsBool(jget(cfg, "add_eos_token"))) t->add_eos = jtrue(cfg, "add_eos_token");
        if (cJSON_IsString(ct)) tmpl = ct->valuestring;
        else cJSON_ArrayForEach(x, ct)
            if (jstr(x, "template") && (!tmpl || (jstr(x, "name") && !strcmp(jstr(x, "name"), "default"))))
                tmpl = jstr(x, "template");
        if (tmpl && tokenizer_set_chat_template(t, tmpl, cpath) < 0)
            rc = fasa_error(err, FASA_ENOMEM, "'%s': out of memory", cpath);
    }
    if (!tmpl && (f = fopen(jpath, "rb"))) {
        size_t n;
        char *text = read_file(jpath, &n, err, &rc);
        fclose(f);
        if (text && tokenizer_set_chat_template(t, text, jpath) < 0)
            rc = fasa_error(err, FASA_ENOMEM, "'%s': out of memory", jpath);
        free(text);
    }
out:
    cJSON_Delete(cfg);
    free(cpath);
    free(jpath);
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
    int max_id = -1, i, rc, n_merges, spm, pp_bos;
    spm_opts so;
    char *label;

    if (!cJSON_IsObject(root)) return fasa_error(err, FASA_EFORMAT, "'%s': not a JSON object", path);
    model = jget(root, "model");
    if (!cJSON_IsObject(model)) return fasa_error(err, FASA_EFORMAT, "'%s': no \"model\" object", path);
    if ((s = jstr(model, "type")) && strcmp(s, "BPE"))
        return fasa_error(err, FASA_EUNSUPPORTED, "'%s': model.type %s is not supported (only BPE)", path, s);
    vocab = jget(model, "vocab");
    merges = jget(model, "merges");
    if (!cJSON_IsObject(vocab))
        return fasa_error(err, FASA_EFORMAT, "'%s': model.vocab is missing or not an object", path);
    if (!cJSON_IsArray(merges))
        return fasa_error(err, FASA_EFORMAT, "'%s': model.merges is missing or not an array", path);
    if (((s = jstr(model, "continuing_subword_prefix")) && *s) || ((s = jstr(model, "end_of_word_suffix")) && *s))
        return fasa_error(err, FASA_EUNSUPPORTED, "'%s': subword prefixes/suffixes are not supported", path);
    if ((v = jget(model, "dropout")) && cJSON_IsNumber(v) && v->valuedouble > 0)
        return fasa_error(err, FASA_EUNSUPPORTED, "'%s': model.dropout is not supported", path);
    /* SentencePiece-style: byte fallback, a "▁" normalizer or a Metaspace pre-tokenizer. */
    spm = jtrue(model, "byte_fallback") || has_spm_step(jget(root, "normalizer")) ||
          is_type(jget(root, "pre_tokenizer"), "Metaspace");
    if (spm && (rc = spm_detect(&so, root, path, err)) < 0) return rc;
    if (!spm && ((rc = normalizer_ok(jget(root, "normalizer"), path, err)) < 0 ||
                 (rc = pre_detect(jget(root, "pre_tokenizer"), &kind, path, err)) < 0))
        return rc;

    /* Sizes first: the id range (ids may have gaps) and the bytes of all strings. */
    cJSON_ArrayForEach(x, vocab) {
        int id = jid(x);
        if (id < 0)
            return fasa_error(err, FASA_EFORMAT, "'%s': model.vocab[\"%.64s\"] is not a valid id", path, x->string);
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
    if (spm) {
        t->type = TOKENIZER_SPM;
        t->byte_fallback = jtrue(model, "byte_fallback");
        t->prepend = so.prepend;
        t->meta = so.meta;
        t->replace_space = so.replace_space;
        t->split_words = so.split_words;
        t->strip_space = so.strip_space;
    }
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
    pp_bos = post_processor(t, jget(root, "post_processor"), &t->add_bos, &t->add_eos);
    if (with_config && (rc = load_config(t, path, err)) < 0) { tokenizer_free(t); return rc; }
    if (t->bos < 0) t->bos = pp_bos;
    if (!(label = malloc(strlen(path) + 3))) {
        tokenizer_free(t);
        return fasa_error(err, FASA_ENOMEM, "'%s': out of memory", path);
    }
    sprintf(label, "'%s'", path);
    rc = tok_finish(t, label, err);
    free(label);
    if (rc < 0) { tokenizer_free(t); return rc; }
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
int tokenizer_add_bos(const tokenizer *t) { return t->add_bos && t->bos >= 0; }
enum tokenizer_type tokenizer_type(const tokenizer *t) { return t->type; }
enum tokenizer_pre tokenizer_pre_kind(const tokenizer *t) { return t->pre; }
const char *tokenizer_chat_template(const tokenizer *t) { return t->chat_template; }
const char *tokenizer_chat_template_source(const tokenizer *t) { return t->chat_source; }

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
    if (t->type == TOKENIZER_SPM) {
        if (t->flags[id] & TOK_F_BYTE) {
            /* "<0xNN>" (tok_finish found it by that name) */
            if (cap) buf[0] = (char)strtol((const char[3]){ (char)s[3], (char)s[4], 0 }, NULL, 16);
            return 1;
        }
        /* ByteFallback + Replace("▁", " "); special added tokens stay as written. */
        for (i = 0; i < n; i++) {
            int sp = !(t->flags[id] & TOK_F_SPECIAL) && i + 3 <= n && !memcmp(s + i, SPM_SPACE, 3);
            if (o < cap) buf[o] = sp ? ' ' : (char)s[i];
            o++;
            if (sp) i += 2;
        }
        return (int)o;
    }
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

int tokenizer_decode_text(const tokenizer *t, const int32_t *ids, int n, char *buf, size_t cap)
{
    size_t o = 0;
    if (n < 0 || (n > 0 && !ids) || (!buf && cap)) return FASA_EARG;
    for (int i = 0; i < n; i++) {
        int l = tokenizer_decode(t, ids[i], o < cap ? buf + o : NULL, o < cap ? cap - o : 0);
        if (l < 0) return l;
        /* The first token's leading space was the tokenizer's, not the text's. */
        if (i == 0 && t->strip_space && l > 0) {
            char first;
            tokenizer_decode(t, ids[0], &first, 1);
            if (first == ' ') {
                char *tmp = malloc((size_t)l);
                if (!tmp) return FASA_ENOMEM;
                tokenizer_decode(t, ids[0], tmp, (size_t)l);
                if (cap) memcpy(buf, tmp + 1, (size_t)l - 1 < cap ? (size_t)l - 1 : cap);
                free(tmp);
                l--;
            }
        }
        o += (size_t)l;
        if (o > INT_MAX) return FASA_EARG;
    }
    return (int)o;
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
    const uint8_t *text;    /* the whole text and the current class-0 piece: SentencePiece's prefix */
    const uint8_t *piece0;
    uint8_t *norm;          /* a SentencePiece piece with its "▁"s */
    size_t norm_cap;
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

/* Merges e->sym[0..m) (linked by prev/next): always the lowest-ranked adjacent pair, leftmost
 * first. A heap of candidate pairs with lazy invalidation keeps this O(n log n), so a 100 KB run
 * of one character costs milliseconds rather than the minutes a rescan per merge would. */
static void bpe_merge(enc *e, size_t m)
{
    const tokenizer *t = e->t;
    size_t hn = 0;
    if (m == 0) return;
    for (size_t i = 0; i < m; i++) {
        e->prev[i] = (int32_t)i - 1;
        e->next[i] = (int32_t)i + 1;
    }
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

/* An unknown symbol: like `tokenizers`, unk (fused with an unk just before if asked) or nothing
 * when there is none. Returns the new symbol count. */
static size_t push_unk(enc *e, size_t m)
{
    const tokenizer *t = e->t;
    if (t->unk < 0 || (t->fuse_unk && m > 0 && e->sym[m - 1] == t->unk)) return m;
    e->sym[m] = t->unk;
    return m + 1;
}

/* Byte-level BPE over one pre-token. */
static void bpe_word(enc *e, const uint8_t *s, size_t n)
{
    const tokenizer *t = e->t;
    size_t m = 0;
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
    /* A byte without a symbol token happens only in hand-made vocabularies. */
    for (size_t i = 0; i < n; i++)
        if (t->byte_id[s[i]] >= 0) e->sym[m++] = t->byte_id[s[i]];
        else m = push_unk(e, m);
    bpe_merge(e, m);
}

/* SentencePiece BPE over one word as `tokenizers` does it: each character is its token, or its
 * bytes' <0xNN> tokens, or unk; then merges by rank. s is valid UTF-8. */
static void spm_word_ranked(enc *e, const uint8_t *s, size_t n)
{
    const tokenizer *t = e->t;
    size_t m = 0, l;
    int id;
    if (t->ignore_merges && (id = vocab_get(t, (const char *)s, n)) >= 0) { emit(e, id); return; }
    for (size_t i = 0; i < n; i += l) {
        utf8_get(s + i, n - i, &l);
        if ((id = vocab_get(t, (const char *)s + i, l)) >= 0) e->sym[m++] = id;
        else if (t->byte_fallback)          /* all 256 exist: tok_finish checked */
            for (size_t k = 0; k < l; k++) e->sym[m++] = t->byte_id[s[i + k]];
        else m = push_unk(e, m);
    }
    bpe_merge(e, m);
}

/* The token spelled by the span of symbol i: symbols are adjacent pieces of s, so the span
 * runs to the next live symbol's start. -1 if not a token. */
static int span_token(const enc *e, const uint8_t *s, size_t n, int32_t l, int32_t r_end)
{
    size_t a = (size_t)e->sym[l], b = r_end >= 0 ? (size_t)e->sym[r_end] : n;
    if (b - a > (size_t)e->t->max_len) return -1;
    return vocab_get(e->t, (const char *)s + a, b - a);
}

static void span_push(enc *e, const uint8_t *s, size_t n, size_t *hn, int32_t l, int32_t r)
{
    int id;
    if (l < 0 || r < 0 || (id = span_token(e, s, n, l, e->next[r])) < 0) return;
    heap_push(e->heap, hn, (uint64_t)(uint32_t)e->t->srank[id] << 32 | (uint32_t)l);
}

/* SentencePiece BPE as llama.cpp runs it on a GGUF vocabulary: symbols are spans of the text,
 * starting as characters; the adjacent pair whose concatenation is the token with the highest
 * score merges first, leftmost on ties. Here e->sym holds each symbol's start offset (-1 once
 * absorbed). A popped entry is current when the pair at its position still spells a token of its
 * rank: an equal-ranked pair there would be popped at the same point of the order anyway. Spans
 * left that are not tokens (single characters) become their bytes' <0xNN> tokens. */
static void spm_word_scored(enc *e, const uint8_t *s, size_t n)
{
    size_t m = 0, hn = 0, l;
    for (size_t i = 0; i < n; i += l) {
        utf8_get(s + i, n - i, &l);
        e->sym[m] = (int32_t)i;
        e->prev[m] = (int32_t)m - 1;
        e->next[m] = (int32_t)m + 1;
        m++;
    }
    e->next[m - 1] = -1;
    for (size_t i = 0; i + 1 < m; i++) span_push(e, s, n, &hn, (int32_t)i, (int32_t)i + 1);
    while (hn > 0) {
        heap_entry h = heap_pop(e->heap, &hn);
        int32_t lft = (int32_t)(uint32_t)h, r;
        int id;
        if (e->sym[lft] < 0 || (r = e->next[lft]) < 0 || (id = span_token(e, s, n, lft, e->next[r])) < 0 ||
            (uint64_t)(uint32_t)e->t->srank[id] != h >> 32)
            continue;
        e->sym[r] = -1;
        e->next[lft] = e->next[r];
        if (e->next[r] >= 0) e->prev[e->next[r]] = lft;
        span_push(e, s, n, &hn, e->prev[lft], lft);
        span_push(e, s, n, &hn, lft, e->next[lft]);
    }
    for (int32_t i = 0; i >= 0; i = e->next[i]) {
        int id = span_token(e, s, n, i, e->next[i]);
        if (id >= 0) { emit(e, id); continue; }
        for (size_t k = (size_t)e->sym[i]; k < (e->next[i] >= 0 ? (size_t)e->sym[e->next[i]] : n); k++)
            emit(e, e->t->byte_id[s[k]]);
    }
}

static void spm_word(enc *e, const uint8_t *s, size_t n)
{
    if (n == 0 || e->status < 0) return;
    if (n > INT32_MAX) { e->status = FASA_EARG; return; }   /* symbol positions are int32 */
    if (scratch(e, n) < 0) { e->status = FASA_ENOMEM; return; }
    if (e->t->by_score) spm_word_scored(e, s, n);
    else spm_word_ranked(e, s, n);
}

static int starts_space(const uint8_t *s, size_t n, int replace)
{
    return (n >= 3 && !memcmp(s, SPM_SPACE, 3)) || (replace && n && s[0] == ' ');
}

/* One piece between added tokens: its prefix "▁" (Prepend / llama.cpp's add_space_prefix on each
 * class-0 piece; Metaspace's on the first or every piece, unless one is there), spaces as "▁",
 * then words (Metaspace split: each "▁" starts one). */
static void spm_piece(enc *e, const uint8_t *s, size_t n)
{
    const tokenizer *t = e->t;
    size_t o = 0, need;
    int pre = t->prepend && s == e->piece0;
    if (n == 0 || e->status < 0) return;
    if ((t->meta == SPM_META_ALWAYS || (t->meta == SPM_META_FIRST && s == e->text)) &&
        !(pre || starts_space(s, n, t->replace_space)))
        pre = 1;
    if (n > (SIZE_MAX - 3) / 3) { e->status = FASA_EARG; return; }
    need = 3 * n + 3;
    if (need > e->norm_cap) {
        free(e->norm);
        if (!(e->norm = malloc(need))) { e->norm_cap = 0; e->status = FASA_ENOMEM; return; }
        e->norm_cap = need;
    }
    if (pre) { memcpy(e->norm, SPM_SPACE, 3); o = 3; }
    for (size_t i = 0; i < n; i++) {
        if (s[i] == ' ' && t->replace_space) { memcpy(e->norm + o, SPM_SPACE, 3); o += 3; }
        else e->norm[o++] = s[i];
    }
    if (!t->split_words) { spm_word(e, e->norm, o); return; }
    size_t w = 0;
    for (size_t i = 1; i + 3 <= o; i++)
        if (!memcmp(e->norm + i, SPM_SPACE, 3)) {
            spm_word(e, e->norm + w, i - w);
            w = i;
        }
    spm_word(e, e->norm + w, o - w);
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
    if (e->t->type == TOKENIZER_SPM) { spm_piece(e, s, n); return; }
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
static void split_gap(enc *e, int cls, const uint8_t *s, size_t n, int parse_special);

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
            if (ms > gap) split_gap(e, cls, s + gap, ms - gap, parse_special);
            emit(e, a->id);
            gap = pos = me;
        }
    }
    if (gap < n) split_gap(e, cls, s + gap, n - gap, parse_special);
}

/* Text between added tokens of class cls: class 1's turn, or pre-tokenisation. A class-0 piece
 * is what a Prepend normalizer (and llama.cpp's add_space_prefix) puts its "▁" before. */
static void split_gap(enc *e, int cls, const uint8_t *s, size_t n, int parse_special)
{
    if (cls == 1) { pretokenize(e, s, n); return; }
    e->piece0 = s;
    split_added(e, 1, s, n, parse_special);
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
    e.text = s;
    if (!(e.md = pcre2_match_data_create(1, NULL))) { free(clean); return FASA_ENOMEM; }
    split_added(&e, 0, s, len, parse_special);
    pcre2_match_data_free(e.md);
    free(e.sym); free(e.prev); free(e.next); free(e.heap); free(e.word); free(e.norm);
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

static int is_ws(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'; }

/* A string with its leading and/or trailing whitespace left out (Jinja's trim, Python's strip). */
static void sb_strip(sbuf *b, const char *s, size_t n, int lead, int trail)
{
    while (lead && n && is_ws(*s)) s++, n--;
    while (trail && n && is_ws(s[n - 1])) n--;
    sb_put(b, s, n);
}

/* ---- recognising a template ---- */

/* The next Jinja string literal of a template, unescaped into out (at most cap - 1 bytes, then
 * NUL; longer ones are cut). Literals live inside {{ }} and {% %}; text outside tags and {# #}
 * comments is skipped. *uses_bos is set when an expression (not a literal) names bos_token on
 * the way. 0 when there are no more. */
typedef struct jscan { const char *start, *p; int in_tag; } jscan;

static int is_ident(char c)
{
    return c == '_' || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9');
}

static int jinja_literal(jscan *j, char *out, size_t cap, int *uses_bos)
{
    const char *p = j->p;
    while (*p) {
        if (!j->in_tag) {
            if (p[0] == '{' && (p[1] == '{' || p[1] == '%')) { j->in_tag = 1; p += 2; continue; }
            if (p[0] == '{' && p[1] == '#') {
                const char *e = strstr(p + 2, "#}");
                p = e ? e + 2 : p + strlen(p);
                continue;
            }
            p++;
            continue;
        }
        if ((p[0] == '}' && p[1] == '}') || (p[0] == '%' && p[1] == '}')) { j->in_tag = 0; p += 2; continue; }
        if (!strncmp(p, "bos_token", 9) && (p == j->start || !is_ident(p[-1])) && !is_ident(p[9])) *uses_bos = 1;
        if (*p == '\'' || *p == '"') {
            char q = *p++;
            size_t o = 0;
            while (*p && *p != q) {
                char c = *p++;
                if (c == '\\' && *p) {
                    c = *p++;
                    c = c == 'n' ? '\n' : c == 't' ? '\t' : c == 'r' ? '\r' : c;
                }
                if (o + 1 < cap) out[o++] = c;
            }
            out[o] = 0;
            j->p = *p ? p + 1 : p;
            return 1;
        }
        p++;
    }
    j->p = p;
    return 0;
}

/* The text between open and close inside one literal, when there is some. */
static int literal_between(const char *lit, const char *open, const char *close, const char **a, size_t *n)
{
    const char *o = strstr(lit, open), *c;
    if (!o) return 0;
    o += strlen(open);
    if (!(c = strstr(o, close)) || c == o) return 0;
    *a = o;
    *n = (size_t)(c - o);
    return 1;
}

int tokenizer_chat_detect(const char *tmpl, tokenizer_chat *out)
{
    static const char *const bos_of[] = { "", "<|begin_of_text|>", "<bos>", "<s>", "<s>" };
    /* A whole system turn in one literal holds the default system message. */
    static const char *const sys_open[] = { "<|im_start|>system\n", "<|start_header_id|>system<|end_header_id|>\n\n",
                                            NULL, NULL, "<<SYS>>\n" };
    static const char *const sys_close[] = { "<|im_end|>", "<|eot_id|>", NULL, NULL, "\n<</SYS>>" };
    jscan j = { tmpl, tmpl, 0 };
    char *lit;
    int uses_bos = 0;
    if (!tmpl || !out) return FASA_EARG;
    memset(out, 0, sizeof *out);
    if (strstr(tmpl, "<|im_start|>")) out->kind = TOKENIZER_CHAT_CHATML;
    else if (strstr(tmpl, "<|start_header_id|>")) out->kind = TOKENIZER_CHAT_LLAMA3;
    else if (strstr(tmpl, "<start_of_turn>")) out->kind = TOKENIZER_CHAT_GEMMA;
    else if (strstr(tmpl, "[INST]") && strstr(tmpl, "<<SYS>>")) out->kind = TOKENIZER_CHAT_LLAMA2;
    else if (strstr(tmpl, "[INST]")) out->kind = TOKENIZER_CHAT_MISTRAL;
    else return FASA_EUNSUPPORTED;
    snprintf(out->bos_text, sizeof out->bos_text, "%s", bos_of[out->kind]);
    if (out->kind == TOKENIZER_CHAT_MISTRAL) {
        out->inst_close_space = 1;
        out->trim = strstr(tmpl, "| trim") || strstr(tmpl, "|trim") || strstr(tmpl, ".strip()");
    }
    if (!(lit = malloc(strlen(tmpl) + 1))) return FASA_ENOMEM;
    while (jinja_literal(&j, lit, strlen(tmpl) + 1, &uses_bos)) {
        const char *a, *m;
        size_t n;
        if (*out->bos_text && !strncmp(lit, out->bos_text, strlen(out->bos_text))) uses_bos = 1;
        if (out->kind == TOKENIZER_CHAT_MISTRAL) {
            if ((m = strstr(lit, "[INST]"))) out->inst_space = m > lit && m[-1] == ' ';
            if ((m = strstr(lit, "[/INST]"))) out->inst_close_space = m > lit && m[-1] == ' ';
        }
        if (!*out->system && sys_open[out->kind] &&
            literal_between(lit, sys_open[out->kind], sys_close[out->kind], &a, &n)) {
            if (n >= sizeof out->system) { free(lit); return FASA_EUNSUPPORTED; }
            memcpy(out->system, a, n);
            out->system[n] = 0;
        }
    }
    free(lit);
    out->bos = uses_bos;
    return 0;
}

int tokenizer_chat_of(const tokenizer *t, tokenizer_chat *out)
{
    int rc;
    if (!t || !out) return FASA_EARG;
    if (t->chat_template) {
        if ((rc = tokenizer_chat_detect(t->chat_template, out)) < 0) return rc;
    } else {
        memset(out, 0, sizeof *out);
        if (tokenizer_find(t, "<|im_start|>") >= 0) out->kind = TOKENIZER_CHAT_CHATML;
        else if (tokenizer_find(t, "<|start_header_id|>") >= 0) out->kind = TOKENIZER_CHAT_LLAMA3, out->bos = 1;
        else if (tokenizer_find(t, "<start_of_turn>") >= 0) out->kind = TOKENIZER_CHAT_GEMMA, out->bos = 1;
        else if (tokenizer_find(t, "[INST]") >= 0)
            out->kind = TOKENIZER_CHAT_MISTRAL, out->bos = 1, out->inst_close_space = 1;
        else return FASA_EUNSUPPORTED;
    }
    /* The template writes bos_token: the tokenizer's own. */
    if (out->bos && t->bos >= 0 && t->len[t->bos] < (int32_t)sizeof out->bos_text) {
        memcpy(out->bos_text, t->arena + t->off[t->bos], (size_t)t->len[t->bos]);
        out->bos_text[t->len[t->bos]] = 0;
    }
    if (out->bos && !*out->bos_text) out->bos = 0;
    return 0;
}

int tokenizer_chat_render(const tokenizer_chat *f, const char *system, const char *user, char *out, size_t cap)
{
    sbuf b = { out, cap ? cap - 1 : 0, 0 };
    if (!f || !user || (!out && cap)) return FASA_EARG;
    if (!system && *f->system) system = f->system;
    if (f->bos) sb_str(&b, f->bos_text);
    switch (f->kind) {
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
        if (system) {
            sb_str(&b, "<|start_header_id|>system<|end_header_id|>\n\n");
            sb_strip(&b, system, strlen(system), 1, 1);
            sb_str(&b, "<|eot_id|>");
        }
        sb_str(&b, "<|start_header_id|>user<|end_header_id|>\n\n");
        sb_strip(&b, user, strlen(user), 1, 1);
        sb_str(&b, "<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n");
        break;
    case TOKENIZER_CHAT_GEMMA:
        sb_str(&b, "<start_of_turn>user\n");
        if (system) {
            sb_str(&b, system);
            sb_str(&b, "\n\n");
        }
        sb_strip(&b, user, strlen(user), 1, 1);
        sb_str(&b, "<end_of_turn>\n<start_of_turn>model\n");
        break;
    case TOKENIZER_CHAT_MISTRAL:
        sb_str(&b, f->inst_space ? " [INST] " : "[INST] ");
        if (system) {
            sb_str(&b, system);
            sb_str(&b, "\n\n");
        }
        sb_strip(&b, user, strlen(user), f->trim, f->trim);
        sb_str(&b, f->inst_close_space ? " [/INST]" : "[/INST]");
        break;
    case TOKENIZER_CHAT_LLAMA2: {
        /* content.strip() on the whole "<<SYS>>...<</SYS>>\n\n" + user */
        sb_str(&b, "[INST] ");
        if (system) {
            sb_str(&b, "<<SYS>>\n");
            sb_strip(&b, system, strlen(system), 0, 0);
            sb_str(&b, "\n<</SYS>>\n\n");
            sb_strip(&b, user, strlen(user), 0, 1);
        } else {
            sb_strip(&b, user, strlen(user), 1, 1);
        }
        sb_str(&b, " [/INST]");
        break;
    }
    default:
        return FASA_EARG;
    }
    if (cap) out[b.n < b.cap ? b.n : b.cap] = 0;
    return b.n > INT_MAX ? FASA_EARG : (int)b.n;
}

int tokenizer_encode_prompt(const tokenizer *t, const tokenizer_chat *chat, const char *system,
                            const char *text, int32_t *ids, int max_ids)
{
    char *rendered = NULL;
    int n, bos, need;
    if (!t || !text || max_ids < 0 || (!ids && max_ids > 0)) return FASA_EARG;
    if (chat) {
        if ((need = tokenizer_chat_render(chat, system, text, NULL, 0)) < 0) return need;
        if (!(rendered = malloc((size_t)need + 1))) return FASA_ENOMEM;
        tokenizer_chat_render(chat, system, text, rendered, (size_t)need + 1);
        n = tokenizer_encode(t, rendered, (size_t)need, 1, ids, max_ids);
        free(rendered);
        return n;
    }
    bos = tokenizer_add_bos(t);
    if (bos && max_ids > 0) ids[0] = t->bos;
    n = tokenizer_encode(t, text, strlen(text), 0, ids ? ids + bos : NULL, max_ids > bos ? max_ids - bos : 0);
    if (n < 0) return n;
    return n > INT_MAX - bos ? FASA_EARG : n + bos;
}

int tokenizer_read_ids(const char *path, int n_vocab, int32_t **out, char *err)
{
    char *text;
    size_t len;
    *out = NULL;
    if (!strcmp(path, "-")) {
        if (!(text = fasa_read_stream(stdin, &len)))
            return fasa_error(err, FASA_EIO, "cannot read token ids from stdin");
    } else {
        const int rc = fasa_read_file(path, 0, &text, &len, err);
        if (rc < 0) return rc;
    }
    int n = 0, cap = 1024, rc = 0;
    int32_t *ids = malloc(sizeof *ids * cap);
    for (char *p = text, *end; ids && rc == 0;) {
        while (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r') p++;
        if (!*p) break;
        errno = 0;
        const long v = strtol(p, &end, 10);
        if (end == p || (*end && !strchr(" \t\n\r", *end)))
            rc = fasa_error(err, FASA_EFORMAT, "'%s': not a list of token ids (at byte %zu)", path, (size_t)(p - text));
        else if (errno || v < 0 || v >= n_vocab)
            rc = fasa_error(err, FASA_EFORMAT, "'%s': token id %.20s is outside the vocabulary (%d)", path, p, n_vocab);
        else {
            if (n == cap) {
                int32_t *grown = realloc(ids, sizeof *ids * (size_t)(cap *= 2));
                if (!grown) { free(ids); ids = NULL; break; }
                ids = grown;
            }
            ids[n++] = (int32_t)v, p = end;
        }
    }
    free(text);
    if (!ids) return fasa_error(err, FASA_ENOMEM, "out of memory");
    if (rc == 0 && n == 0) rc = fasa_error(err, FASA_EFORMAT, "'%s': no token ids", path);
    if (rc < 0) { free(ids); return rc; }
    *out = ids;
    return n;
}

/* safetensors.h - stb-style single-header reader and writer for .safetensors files.
 *
 * In exactly one C file:   #define SAFETENSORS_IMPLEMENTATION
 *                          #include "safetensors.h"
 * (formats/safetensors.c is that file.) The implementation needs POSIX (mmap, mkstemp, fsync).
 *
 *   st_file f;
 *   char err[ST_ERRLEN];
 *   if (st_open(&f, "model.safetensors", err) < 0) ...;     // mmap + st_parse
 *   const st_tensor *t = st_find(&f, "model.embed_tokens.weight");
 *   // t->dtype == ST_BF16, t->shape = {49152, 576}, t->data points into the mapping
 *   st_close(&f);
 *
 * Byte layout: u64 little-endian N (header length; rejected when N > 100,000,000), N bytes of
 * UTF-8 JSON object {name: {"dtype": "F32", "shape": [..], "data_offsets": [begin, end]}, ...,
 * "__metadata__": {string: string}}, then the data section. Offsets are relative to the data
 * section; tensors are contiguous with no gaps or overlaps; end - begin = prod(shape) x dtype
 * size; the last end + 8 + N equals the file size. Writers pad the header with spaces to a
 * multiple of 8 and sort tensors by name.
 *
 * Example, a file holding one F32 tensor "w" of shape [2], 72 bytes in all (offsets in hex):
 *   00: 38 00 00 00 00 00 00 00                                 N = 56
 *   08: {"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}  54 bytes + 2 spaces of padding
 *   40: 8 data bytes                                            the data section
 *
 * What the reader accepts (st_parse): strict JSON (RFC 8259; \uXXXX escapes incl. surrogate
 * pairs; strings must be valid UTF-8 and may not contain \u0000; nesting depth <= 64), no
 * duplicate key in any object, whitespace after the object (the padding) but nothing else.
 * A tensor entry has exactly the three fields above: unknown fields are rejected, so a typo
 * cannot silently drop information. Zero-element tensors are allowed (begin == end).
 *
 * Errors: every function returning int gives 0 (success) or one of the negative ST_E* codes,
 * whose values match enum fasa_status in formats/base.h, and writes one line into err (which may
 * be NULL) naming the file: "'model.safetensors': tensor 'x' data_offsets [0, 8] overlap 'y'
 * [4, 12]". Names from the file are shown truncated, with control bytes replaced by '?'.
 *
 * Ownership: an st_file owns its tensor array, names and metadata strings (freed by st_close);
 * tensor data points into the buffer (st_parse: the caller's, which must outlive f; st_open:
 * the read-only mapping). Truncating a file while it is mapped makes later reads fault
 * (SIGBUS), as with any mmap reader. t->data is not necessarily aligned for its dtype (the
 * format does not require it, and this writer lays tensors out by name): read through memcpy
 * or unaligned loads, not by casting to float *.
 *
 * Sharded models: model.safetensors.index.json {"weight_map": {tensor: file}}; st_sharded_open
 * opens every shard and finds tensors across them.
 *
 * The header is parsed by a small strict JSON parser inside this file (no dependencies).
 */
#ifndef SAFETENSORS_H
#define SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#define ST_ERRLEN 512
#define ST_MAX_DIMS 8
#define ST_MAX_HEADER 100000000u  /* largest accepted header length N */

/* Status codes, equal to FASA_EIO .. FASA_EARG in formats/base.h. */
#define ST_EIO       (-1)   /* cannot open / read / write */
#define ST_EFORMAT   (-2)   /* malformed or hostile file */
#define ST_EMISMATCH (-3)   /* index and shards do not fit together */
#define ST_ENOMEM    (-4)
#define ST_EARG      (-5)   /* bad argument from the caller */

typedef enum st_dtype {
    ST_BOOL, ST_U8, ST_I8, ST_I16, ST_U16, ST_F16, ST_BF16, ST_I32, ST_U32, ST_F32,
    ST_I64, ST_U64, ST_F64, ST_F8_E4M3, ST_F8_E5M2, ST_NDTYPE
} st_dtype;

typedef struct st_tensor {
    char *name;
    st_dtype dtype;
    int n_dims;
    int64_t shape[ST_MAX_DIMS];   /* shape[0] outermost, as in the file */
    uint64_t begin, end;          /* relative to the data section */
    const void *data;             /* into the buffer */
} st_tensor;

typedef struct st_file {
    st_tensor *tensors;   /* sorted by data offset */
    int n_tensors;
    char **meta_keys, **meta_vals;   /* __metadata__, string values only */
    int n_meta;
    const uint8_t *buf;   /* whole file */
    size_t len;
    void *map;            /* mmap owned by st_open */
    char path[256];       /* for messages; empty when parsed from memory */
} st_file;

/* Pure parser: no I/O, validates everything listed above; err gets one line. Returns 0 or < 0.
 * Every field of f is (re)initialised except path, which names the file in messages: set it, or
 * zero it (st_file f = {0}) when parsing from memory, and messages start "safetensors: ".
 * On error f holds nothing that needs freeing; st_close(f) is still safe. */
int  st_parse(st_file *f, const void *buf, size_t len, char *err);
int  st_open(st_file *f, const char *path, char *err);     /* messages name path */
void st_close(st_file *f);

const st_tensor *st_find(const st_file *f, const char *name);
const char *st_meta(const st_file *f, const char *key);
const char *st_dtype_name(st_dtype t);        /* "F32"; "?" if out of range */
int         st_dtype_from_name(const char *s);/* -1 if unknown */
size_t      st_dtype_size(st_dtype t);        /* bytes per element; 0 if out of range */
int64_t     st_numel(const st_tensor *t);     /* prod(shape), 1 for a scalar; -1 on overflow */

/* Writer: collects tensors (data is referenced, not copied, until st_writer_write returns) and
 * metadata, then writes sorted, padded, via a temporary file renamed into place.
 * st_writer_add / st_writer_meta return ST_EARG for a NULL or non-UTF-8 name, the reserved name
 * "__metadata__", an unknown dtype, n_dims outside 0..8, a negative or overflowing shape, or NULL
 * data for a non-empty tensor; ST_ENOMEM when out of memory. st_writer_meta replaces the value of
 * a key already set. st_writer_write rejects duplicate tensor names; the new file gets mode 0644;
 * on failure no temporary file is left behind and any existing file at path is untouched. */
typedef struct st_writer st_writer;
st_writer *st_writer_new(void);
void st_writer_free(st_writer *w);
int  st_writer_add(st_writer *w, const char *name, st_dtype dtype, int n_dims,
                   const int64_t *shape, const void *data);
int  st_writer_meta(st_writer *w, const char *key, const char *value);
int  st_writer_write(st_writer *w, const char *path, char *err);

/* Sharded: path is a directory holding model.safetensors.index.json, or the index file itself.
 * Shard names in weight_map are relative to the index's directory (absolute names and ".."
 * components are rejected); each distinct shard is opened once, files[] is sorted by shard name,
 * and every tensor in weight_map must exist in the shard it maps to (ST_EMISMATCH otherwise).
 * Other top-level keys of the index ("metadata") are ignored. st_sharded_find returns the first
 * shard holding name (and sets *owner when owner is not NULL), or NULL. */
typedef struct st_sharded {
    st_file *files;
    int n_files;
} st_sharded;
int  st_sharded_open(st_sharded *s, const char *path, char *err);
void st_sharded_close(st_sharded *s);
const st_tensor *st_sharded_find(const st_sharded *s, const char *name, const st_file **owner);

#endif /* SAFETENSORS_H */

#ifdef SAFETENSORS_IMPLEMENTATION
#ifndef SAFETENSORS_IMPLEMENTED
#define SAFETENSORS_IMPLEMENTED

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---- messages ---------------------------------------------------------------------------- */

/* Copies s for quoting in a message: bounded, with control bytes shown as '?', so a hostile
 * name can neither break the one-line rule nor crowd out the rest of the message. */
static const char *st__show(char *out, size_t cap, const char *s)
{
    size_t i = 0;
    for (; s[i] && i + 1 < cap; i++)
        out[i] = ((unsigned char)s[i] < 0x20 || s[i] == 0x7f) ? '?' : s[i];
    out[i] = 0;
    if (s[i] && cap > 4) memcpy(out + cap - 4, "...", 4);
    return out;
}

/* Writes one line into err (if not NULL) and returns status. With a file, the line starts
 * "'file': " ("safetensors: " for ""), for problems with its contents; without, the message
 * names its subject itself ("cannot open 'x': ..."). */
__attribute__((format(printf, 4, 5)))
static int st__ferr(char *err, const char *file, int status, const char *fmt, ...)
{
    if (!err) return status;
    int k = 0;
    if (file) {
        char shown[200];
        k = *file ? snprintf(err, ST_ERRLEN, "'%s': ", st__show(shown, sizeof shown, file))
                  : snprintf(err, ST_ERRLEN, "safetensors: ");
    }
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err + k, ST_ERRLEN - k, fmt, ap);
    va_end(ap);
    return status;
}
#define st__err(err, status, ...) st__ferr(err, NULL, status, __VA_ARGS__)

/* ---- dtypes ------------------------------------------------------------------------------ */

static const struct { const char *name; unsigned char size; } st__dtypes[ST_NDTYPE] = {
    [ST_BOOL] = {"BOOL", 1}, [ST_U8] = {"U8", 1},     [ST_I8] = {"I8", 1},
    [ST_I16] = {"I16", 2},   [ST_U16] = {"U16", 2},   [ST_F16] = {"F16", 2},
    [ST_BF16] = {"BF16", 2}, [ST_I32] = {"I32", 4},   [ST_U32] = {"U32", 4},
    [ST_F32] = {"F32", 4},   [ST_I64] = {"I64", 8},   [ST_U64] = {"U64", 8},
    [ST_F64] = {"F64", 8},   [ST_F8_E4M3] = {"F8_E4M3", 1}, [ST_F8_E5M2] = {"F8_E5M2", 1},
};

const char *st_dtype_name(st_dtype t)
{
    return (unsigned)t < ST_NDTYPE ? st__dtypes[t].name : "?";
}

int st_dtype_from_name(const char *s)
{
    for (int i = 0; i < ST_NDTYPE; i++)
        if (strcmp(s, st__dtypes[i].name) == 0) return i;
    return -1;
}

size_t st_dtype_size(st_dtype t)
{
    return (unsigned)t < ST_NDTYPE ? st__dtypes[t].size : 0;
}

/* prod(shape) into *numel; -1 if it exceeds INT64_MAX. A zero dimension makes the product 0
 * whatever the other dimensions are, so it is looked for before multiplying. */
static int st__shape_numel(const int64_t *shape, int n_dims, uint64_t *numel)
{
    uint64_t p = 1;
    for (int i = 0; i < n_dims; i++)
        if (shape[i] == 0) { *numel = 0; return 0; }
    for (int i = 0; i < n_dims; i++) {
        if (shape[i] < 0 || (uint64_t)shape[i] > (uint64_t)INT64_MAX / p) return -1;
        p *= (uint64_t)shape[i];
    }
    *numel = p;
    return 0;
}

int64_t st_numel(const st_tensor *t)
{
    uint64_t n;
    if (t->n_dims < 0 || t->n_dims > ST_MAX_DIMS || st__shape_numel(t->shape, t->n_dims, &n) < 0)
        return -1;
    return (int64_t)n;
}

/* ---- UTF-8 ------------------------------------------------------------------------------- */

/* Length of the well-formed UTF-8 sequence at s (n bytes available), 0 if malformed: overlong
 * forms, surrogates and code points past U+10FFFF are malformed too (RFC 3629). */
static size_t st__utf8_len(const unsigned char *s, size_t n)
{
    if (n == 0) return 0;
    unsigned c = s[0];
    size_t k;
    uint32_t cp, min;
    if (c < 0x80) return 1;
    if (c >= 0xc2 && c <= 0xdf) { k = 2; cp = c & 0x1f; min = 0x80; }
    else if ((c & 0xf0) == 0xe0) { k = 3; cp = c & 0x0f; min = 0x800; }
    else if (c >= 0xf0 && c <= 0xf4) { k = 4; cp = c & 0x07; min = 0x10000; }
    else return 0;
    if (n < k) return 0;
    for (size_t i = 1; i < k; i++) {
        if ((s[i] & 0xc0) != 0x80) return 0;
        cp = cp << 6 | (s[i] & 0x3f);
    }
    if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return 0;
    return k;
}

static int st__utf8_valid(const char *s)
{
    size_t n = strlen(s), k;
    for (size_t i = 0; i < n; i += k)
        if (!(k = st__utf8_len((const unsigned char *)s + i, n - i))) return 0;
    return 1;
}

static size_t st__utf8_put(char *o, uint32_t cp)
{
    if (cp < 0x80) { o[0] = (char)cp; return 1; }
    if (cp < 0x800) { o[0] = (char)(0xc0 | cp >> 6); o[1] = (char)(0x80 | (cp & 0x3f)); return 2; }
    if (cp < 0x10000) {
        o[0] = (char)(0xe0 | cp >> 12); o[1] = (char)(0x80 | (cp >> 6 & 0x3f));
        o[2] = (char)(0x80 | (cp & 0x3f));
        return 3;
    }
    o[0] = (char)(0xf0 | cp >> 18); o[1] = (char)(0x80 | (cp >> 12 & 0x3f));
    o[2] = (char)(0x80 | (cp >> 6 & 0x3f)); o[3] = (char)(0x80 | (cp & 0x3f));
    return 4;
}

/* ---- JSON -------------------------------------------------------------------------------- */
/* A strict parser into a flat node array. Children are linked by index, not pointer, because the
 * array grows while parsing. Decoded strings go to one buffer sized to the input: a decoded
 * string plus its NUL is never longer than its quoted form, so the buffer never moves and node
 * strings can point into it. */

enum { ST__J_OBJ, ST__J_ARR, ST__J_STR, ST__J_INT, ST__J_NUM, ST__J_TRUE, ST__J_FALSE, ST__J_NULL };
#define ST__J_MAX_DEPTH 64   /* headers need 3; the limit keeps the recursion's stack small */

typedef struct st__jnode {
    int type;
    int child, next;     /* first child, next sibling: indices into nodes, -1 for none */
    int n;               /* number of children */
    const char *key;     /* member name when the parent is an object */
    const char *s;       /* ST__J_STR: decoded, NUL-terminated */
    int64_t i;           /* ST__J_INT */
} st__jnode;

typedef struct st__json {
    const unsigned char *start, *p, *end;
    st__jnode *nodes;
    int n_nodes, cap_nodes;
    char *strs;
    size_t n_strs;
    int status;          /* ST_EFORMAT or ST_ENOMEM once failed */
    size_t at;           /* byte offset of the error */
    char msg[160];
} st__json;

__attribute__((format(printf, 2, 3)))
static int st__jerr(st__json *j, const char *fmt, ...)
{
    if (!j->status) {   /* keep the first, innermost error */
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(j->msg, sizeof j->msg, fmt, ap);
        va_end(ap);
        j->status = ST_EFORMAT;
        j->at = (size_t)(j->p - j->start);
    }
    return -1;
}

static int st__jnomem(st__json *j)
{
    st__jerr(j, "out of memory");
    j->status = ST_ENOMEM;
    return -1;
}

static int st__jnew(st__json *j, int type)
{
    if (j->n_nodes == j->cap_nodes) {
        if (j->cap_nodes > INT_MAX / 2) return st__jnomem(j);
        int cap = j->cap_nodes ? 2 * j->cap_nodes : 64;
        st__jnode *nn = realloc(j->nodes, (size_t)cap * sizeof *nn);
        if (!nn) return st__jnomem(j);
        j->nodes = nn;
        j->cap_nodes = cap;
    }
    st__jnode *nd = &j->nodes[j->n_nodes];
    memset(nd, 0, sizeof *nd);
    nd->type = type;
    nd->child = nd->next = -1;
    return j->n_nodes++;
}

static void st__jws(st__json *j)
{
    while (j->p < j->end && (*j->p == ' ' || *j->p == '\t' || *j->p == '\n' || *j->p == '\r'))
        j->p++;
}

static int st__jhex4(st__json *j, uint32_t *out)
{
    uint32_t v = 0;
    if (j->end - j->p < 4) return st__jerr(j, "truncated \\u escape");
    for (int i = 0; i < 4; i++) {
        unsigned c = j->p[i];
        v <<= 4;
        if (c >= '0' && c <= '9') v |= c - '0';
        else if (c >= 'a' && c <= 'f') v |= c - 'a' + 10;
        else if (c >= 'A' && c <= 'F') v |= c - 'A' + 10;
        else return st__jerr(j, "bad hex digit in \\u escape");
    }
    j->p += 4;
    *out = v;
    return 0;
}

/* j->p is at the opening quote. Returns the decoded string, or NULL on error. */
static const char *st__jstring(st__json *j)
{
    char *out = j->strs + j->n_strs, *o = out;
    j->p++;
    for (;;) {
        if (j->p >= j->end) return st__jerr(j, "unterminated string"), NULL;
        unsigned c = *j->p;
        if (c == '"') { j->p++; break; }
        if (c < 0x20) return st__jerr(j, "control character 0x%02x in string", c), NULL;
        if (c >= 0x80) {
            size_t k = st__utf8_len(j->p, (size_t)(j->end - j->p));
            if (!k) return st__jerr(j, "invalid UTF-8 in string"), NULL;
            memcpy(o, j->p, k);
            o += k;
            j->p += k;
            continue;
        }
        if (c != '\\') { *o++ = (char)c; j->p++; continue; }
        if (j->end - j->p < 2) return st__jerr(j, "unterminated string"), NULL;
        c = j->p[1];
        j->p += 2;
        switch (c) {
        case '"': case '\\': case '/': *o++ = (char)c; break;
        case 'b': *o++ = '\b'; break;
        case 'f': *o++ = '\f'; break;
        case 'n': *o++ = '\n'; break;
        case 'r': *o++ = '\r'; break;
        case 't': *o++ = '\t'; break;
        case 'u': {
            uint32_t cp, lo;
            if (st__jhex4(j, &cp) < 0) return NULL;
            if (cp >= 0xdc00 && cp <= 0xdfff) return st__jerr(j, "unpaired surrogate"), NULL;
            if (cp >= 0xd800 && cp <= 0xdbff) {   /* a high surrogate needs its low half next */
                if (j->end - j->p < 2 || j->p[0] != '\\' || j->p[1] != 'u')
                    return st__jerr(j, "unpaired surrogate"), NULL;
                j->p += 2;
                if (st__jhex4(j, &lo) < 0) return NULL;
                if (lo < 0xdc00 || lo > 0xdfff) return st__jerr(j, "unpaired surrogate"), NULL;
                cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
            }
            /* names and values become C strings, where an embedded NUL would cut them short */
            if (cp == 0) return st__jerr(j, "\\u0000 in string"), NULL;
            o += st__utf8_put(o, cp);
            break;
        }
        default: return st__jerr(j, "invalid escape '\\%c'", c >= 0x20 && c < 0x7f ? c : '?'), NULL;
        }
    }
    *o++ = 0;
    j->n_strs = (size_t)(o - j->strs);
    return out;
}

static int st__isdigit(const st__json *j) { return j->p < j->end && *j->p >= '0' && *j->p <= '9'; }

/* RFC 8259 number grammar. Integers that fit int64 become ST__J_INT; anything else (fractions,
 * exponents, huge values) is ST__J_NUM, accepted as JSON but never as a shape or offset. */
static int st__jnumber(st__json *j)
{
    int neg = 0, integral = 1, overflow = 0;
    uint64_t mag = 0;
    if (*j->p == '-') { neg = 1; j->p++; }
    if (!st__isdigit(j)) return st__jerr(j, "invalid number");
    if (*j->p == '0') {
        j->p++;
        if (st__isdigit(j)) return st__jerr(j, "leading zero in number");
    }
    for (; st__isdigit(j); j->p++) {
        unsigned d = *j->p - '0';
        if (mag > (UINT64_MAX - d) / 10) overflow = 1;
        else mag = mag * 10 + d;
    }
    if (j->p < j->end && *j->p == '.') {
        integral = 0;
        j->p++;
        if (!st__isdigit(j)) return st__jerr(j, "invalid number");
        while (st__isdigit(j)) j->p++;
    }
    if (j->p < j->end && (*j->p == 'e' || *j->p == 'E')) {
        integral = 0;
        j->p++;
        if (j->p < j->end && (*j->p == '+' || *j->p == '-')) j->p++;
        if (!st__isdigit(j)) return st__jerr(j, "invalid number");
        while (st__isdigit(j)) j->p++;
    }
    int k = st__jnew(j, ST__J_NUM);
    if (k < 0) return -1;
    uint64_t limit = neg ? (uint64_t)INT64_MAX + 1 : (uint64_t)INT64_MAX;
    if (integral && !overflow && mag <= limit) {
        j->nodes[k].type = ST__J_INT;
        j->nodes[k].i = !neg ? (int64_t)mag : mag == limit ? INT64_MIN : -(int64_t)mag;
    }
    return k;
}

static int st__junexpected(st__json *j)
{
    unsigned c = *j->p;
    return st__jerr(j, "unexpected character '%c'", c >= 0x20 && c < 0x7f ? (int)c : '?');
}

static int st__jliteral(st__json *j, const char *word, int type)
{
    size_t n = strlen(word);
    if ((size_t)(j->end - j->p) < n || memcmp(j->p, word, n) != 0)
        return st__jerr(j, "invalid literal, expected '%s'", word);
    j->p += n;
    return st__jnew(j, type);
}

static int st__jvalue(st__json *j, int depth);

static int st__jcmpkey(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* Sorting the keys finds duplicates in n log n: a header may hold 100 MB of keys. */
static int st__jdupcheck(st__json *j, int obj, const unsigned char *at)
{
    int n = j->nodes[obj].n, i = 0, rc = 0;
    if (n < 2) return 0;
    const char **keys = malloc((size_t)n * sizeof *keys);
    if (!keys) return st__jnomem(j);
    for (int c = j->nodes[obj].child; c >= 0; c = j->nodes[c].next) keys[i++] = j->nodes[c].key;
    qsort(keys, (size_t)n, sizeof *keys, st__jcmpkey);
    for (i = 1; i < n && rc == 0; i++) {
        if (strcmp(keys[i - 1], keys[i]) == 0) {
            char shown[64];
            j->p = at;
            rc = st__jerr(j, "duplicate key '%s'", st__show(shown, sizeof shown, keys[i]));
        }
    }
    free(keys);
    return rc;
}

/* Objects and arrays: j->p is at '{' or '['. */
static int st__jcontainer(st__json *j, int depth)
{
    const unsigned char *at = j->p;
    int is_obj = *j->p == '{', close = is_obj ? '}' : ']', last = -1;
    int k = st__jnew(j, is_obj ? ST__J_OBJ : ST__J_ARR);
    if (k < 0) return -1;
    j->p++;
    st__jws(j);
    if (j->p < j->end && *j->p == close) { j->p++; return k; }
    for (;;) {
        const char *key = NULL;
        if (is_obj) {
            st__jws(j);
            if (j->p >= j->end || *j->p != '"') return st__jerr(j, "expected a string key");
            if (!(key = st__jstring(j))) return -1;
            st__jws(j);
            if (j->p >= j->end || *j->p != ':') return st__jerr(j, "expected ':' after key");
            j->p++;
        }
        int v = st__jvalue(j, depth + 1);
        if (v < 0) return -1;
        j->nodes[v].key = key;
        if (last < 0) j->nodes[k].child = v;
        else j->nodes[last].next = v;
        last = v;
        j->nodes[k].n++;
        st__jws(j);
        if (j->p < j->end && *j->p == ',') { j->p++; continue; }
        if (j->p < j->end && *j->p == close) { j->p++; break; }
        return st__jerr(j, is_obj ? "expected ',' or '}'" : "expected ',' or ']'");
    }
    if (is_obj && st__jdupcheck(j, k, at) < 0) return -1;
    return k;
}

static int st__jvalue(st__json *j, int depth)
{
    st__jws(j);
    if (j->p >= j->end) return st__jerr(j, "unexpected end");
    if (depth >= ST__J_MAX_DEPTH) return st__jerr(j, "nested deeper than %d", ST__J_MAX_DEPTH);
    switch (*j->p) {
    case '{': case '[': return st__jcontainer(j, depth);
    case 't': return st__jliteral(j, "true", ST__J_TRUE);
    case 'f': return st__jliteral(j, "false", ST__J_FALSE);
    case 'n': return st__jliteral(j, "null", ST__J_NULL);
    case '"': {
        int k = st__jnew(j, ST__J_STR);
        const char *s;
        if (k < 0 || !(s = st__jstring(j))) return -1;
        j->nodes[k].s = s;
        return k;
    }
    default:
        if (*j->p == '-' || (*j->p >= '0' && *j->p <= '9')) return st__jnumber(j);
        return st__junexpected(j);
    }
}

static void st__jfree(st__json *j)
{
    free(j->nodes);
    free(j->strs);
    j->nodes = NULL;
    j->strs = NULL;
}

/* Parses text as one JSON value followed only by whitespace; returns the root node or -1 with
 * j->status, j->msg and j->at set. Call st__jfree either way. */
static int st__jparse(st__json *j, const void *text, size_t len)
{
    memset(j, 0, sizeof *j);
    j->start = j->p = text;
    j->end = j->p + len;
    if (!(j->strs = malloc(len + 1))) return st__jnomem(j);
    int root = st__jvalue(j, 0);
    if (root < 0) return -1;
    st__jws(j);
    if (j->p != j->end) return st__jerr(j, "unexpected data after the JSON value");
    return root;
}

/* The member of object obj named key, or -1. */
static int st__jget(const st__json *j, int obj, const char *key)
{
    for (int c = j->nodes[obj].child; c >= 0; c = j->nodes[c].next)
        if (strcmp(j->nodes[c].key, key) == 0) return c;
    return -1;
}

/* ---- reader ------------------------------------------------------------------------------ */

static void st__release(st_file *f)
{
    for (int i = 0; i < f->n_tensors; i++) free(f->tensors[i].name);
    for (int i = 0; i < f->n_meta; i++) { free(f->meta_keys[i]); free(f->meta_vals[i]); }
    free(f->tensors);
    free(f->meta_keys);
    free(f->meta_vals);
    f->tensors = NULL;
    f->meta_keys = f->meta_vals = NULL;
    f->n_tensors = f->n_meta = 0;
}

static const char *st__fmt_shape(char *out, size_t cap, const st_tensor *t)
{
    size_t k = (size_t)snprintf(out, cap, "[");
    for (int i = 0; i < t->n_dims && k < cap; i++)
        k += (size_t)snprintf(out + k, cap - k, "%s%" PRId64, i ? ", " : "", t->shape[i]);
    if (k < cap) snprintf(out + k, cap - k, "]");
    return out;
}

/* Fills t (whose name is set) from its header entry e; dlen is the data section's length. */
static int st__parse_tensor(const st__json *j, int e, st_tensor *t, uint64_t dlen,
                            const char *file, char *err)
{
    char nm[80], sh[160];
    const char *name = st__show(nm, sizeof nm, t->name);
    int dt = -1, shape = -1, offs = -1;
    if (j->nodes[e].type != ST__J_OBJ)
        return st__ferr(err, file, ST_EFORMAT, "tensor '%s' entry is not an object", name);
    for (int c = j->nodes[e].child; c >= 0; c = j->nodes[c].next) {
        const char *key = j->nodes[c].key;
        if (strcmp(key, "dtype") == 0) dt = c;
        else if (strcmp(key, "shape") == 0) shape = c;
        else if (strcmp(key, "data_offsets") == 0) offs = c;
        else return st__ferr(err, file, ST_EFORMAT, "tensor '%s' has unknown field '%s'", name,
                             st__show(sh, sizeof sh, key));
    }
    if (dt < 0 || shape < 0 || offs < 0)
        return st__ferr(err, file, ST_EFORMAT, "tensor '%s' has no %s", name,
                        dt < 0 ? "dtype" : shape < 0 ? "shape" : "data_offsets");

    int d = j->nodes[dt].type == ST__J_STR ? st_dtype_from_name(j->nodes[dt].s) : -1;
    if (d < 0)
        return st__ferr(err, file, ST_EFORMAT, "tensor '%s' has unknown dtype '%s'", name,
                        j->nodes[dt].type == ST__J_STR ? st__show(sh, sizeof sh, j->nodes[dt].s)
                                                       : "(not a string)");
    t->dtype = (st_dtype)d;

    if (j->nodes[shape].type != ST__J_ARR)
        return st__ferr(err, file, ST_EFORMAT, "tensor '%s' shape is not an array", name);
    if (j->nodes[shape].n > ST_MAX_DIMS)
        return st__ferr(err, file, ST_EFORMAT, "tensor '%s' shape has %d dimensions, more than %d",
                        name, j->nodes[shape].n, ST_MAX_DIMS);
    for (int c = j->nodes[shape].child; c >= 0; c = j->nodes[c].next) {
        if (j->nodes[c].type != ST__J_INT || j->nodes[c].i < 0)
            return st__ferr(err, file, ST_EFORMAT,
                            "tensor '%s' shape[%d] is not a non-negative integer", name, t->n_dims);
        t->shape[t->n_dims++] = j->nodes[c].i;
    }
    uint64_t numel, size = st__dtypes[d].size;
    if (st__shape_numel(t->shape, t->n_dims, &numel) < 0 || numel > (uint64_t)INT64_MAX / size)
        return st__ferr(err, file, ST_EFORMAT, "tensor '%s' shape %s overflows 64 bits", name,
                        st__fmt_shape(sh, sizeof sh, t));

    int b = j->nodes[offs].child, en = b >= 0 ? j->nodes[b].next : -1;
    if (j->nodes[offs].type != ST__J_ARR || j->nodes[offs].n != 2 || j->nodes[b].type != ST__J_INT
        || j->nodes[en].type != ST__J_INT || j->nodes[b].i < 0 || j->nodes[en].i < 0)
        return st__ferr(err, file, ST_EFORMAT,
                        "tensor '%s' data_offsets is not [begin, end] of non-negative integers",
                        name);
    t->begin = (uint64_t)j->nodes[b].i;
    t->end = (uint64_t)j->nodes[en].i;
    if (t->begin > t->end)
        return st__ferr(err, file, ST_EFORMAT, "tensor '%s' data_offsets [%" PRIu64 ", %" PRIu64
                        "] begin after end", name, t->begin, t->end);
    if (t->end > dlen)
        return st__ferr(err, file, ST_EFORMAT, "tensor '%s' data_offsets [%" PRIu64 ", %" PRIu64
                        "] exceed the data section of %" PRIu64 " bytes", name, t->begin, t->end,
                        dlen);
    if (t->end - t->begin != numel * size)
        return st__ferr(err, file, ST_EFORMAT, "tensor '%s' data_offsets span %" PRIu64
                        " bytes but shape %s of %s needs %" PRIu64, name, t->end - t->begin,
                        st__fmt_shape(sh, sizeof sh, t), st__dtypes[d].name, numel * size);
    return 0;
}

static int st__cmp_offset(const void *a, const void *b)
{
    const st_tensor *x = a, *y = b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    if (x->end != y->end) return x->end < y->end ? -1 : 1;
    return strcmp(x->name, y->name);
}

static int st__parse_meta(st_file *f, const st__json *j, int m, const char *file, char *err)
{
    char nm[80];
    if (j->nodes[m].type != ST__J_OBJ)
        return st__ferr(err, file, ST_EFORMAT, "__metadata__ is not an object");
    int n = j->nodes[m].n;
    f->meta_keys = calloc((size_t)n + 1, sizeof *f->meta_keys);
    f->meta_vals = calloc((size_t)n + 1, sizeof *f->meta_vals);
    if (!f->meta_keys || !f->meta_vals) return st__ferr(err, file, ST_ENOMEM, "out of memory");
    for (int c = j->nodes[m].child; c >= 0; c = j->nodes[c].next) {
        if (j->nodes[c].type != ST__J_STR)
            return st__ferr(err, file, ST_EFORMAT, "__metadata__ value of '%s' is not a string",
                            st__show(nm, sizeof nm, j->nodes[c].key));
        char *k = strdup(j->nodes[c].key), *v = strdup(j->nodes[c].s);
        if (!k || !v) {
            free(k);
            free(v);
            return st__ferr(err, file, ST_ENOMEM, "out of memory");
        }
        f->meta_keys[f->n_meta] = k;
        f->meta_vals[f->n_meta++] = v;
    }
    return 0;
}

static int st__parse_header(st_file *f, const st__json *j, int root, uint64_t n, char *err)
{
    const char *file = f->path;
    char nm[80], nm2[80];
    uint64_t dlen = f->len - 8 - n, pos = 0;
    int rc;
    if (j->nodes[root].type != ST__J_OBJ)
        return st__ferr(err, file, ST_EFORMAT, "header is not a JSON object");
    f->tensors = calloc((size_t)j->nodes[root].n + 1, sizeof *f->tensors);
    if (!f->tensors) return st__ferr(err, file, ST_ENOMEM, "out of memory");
    for (int c = j->nodes[root].child; c >= 0; c = j->nodes[c].next) {
        if (strcmp(j->nodes[c].key, "__metadata__") == 0) {
            if ((rc = st__parse_meta(f, j, c, file, err)) < 0) return rc;
            continue;
        }
        st_tensor *t = &f->tensors[f->n_tensors];
        if (!(t->name = strdup(j->nodes[c].key)))
            return st__ferr(err, file, ST_ENOMEM, "out of memory");
        f->n_tensors++;
        if ((rc = st__parse_tensor(j, c, t, dlen, file, err)) < 0) return rc;
    }

    /* Sorted by offset, each tensor must start exactly where the previous one ended. */
    qsort(f->tensors, (size_t)f->n_tensors, sizeof *f->tensors, st__cmp_offset);
    for (int i = 0; i < f->n_tensors; i++) {
        st_tensor *t = &f->tensors[i];
        if (t->begin < pos) {
            const st_tensor *p = &f->tensors[i - 1];
            return st__ferr(err, file, ST_EFORMAT, "tensor '%s' data_offsets [%" PRIu64 ", %"
                            PRIu64 "] overlap '%s' [%" PRIu64 ", %" PRIu64 "]",
                            st__show(nm, sizeof nm, t->name), t->begin, t->end,
                            st__show(nm2, sizeof nm2, p->name), p->begin, p->end);
        }
        if (t->begin > pos)
            return st__ferr(err, file, ST_EFORMAT, "gap in the data section: bytes [%" PRIu64 ", %"
                            PRIu64 ") before tensor '%s' belong to no tensor", pos, t->begin,
                            st__show(nm, sizeof nm, t->name));
        t->data = f->buf + 8 + n + t->begin;
        pos = t->end;
    }
    if (pos != dlen)
        return st__ferr(err, file, ST_EFORMAT, "%" PRIu64 " trailing bytes after the last tensor: "
                        "8 + header %" PRIu64 " + data %" PRIu64 " != file size %zu",
                        dlen - pos, n, pos, f->len);
    return 0;
}

int st_parse(st_file *f, const void *buf, size_t len, char *err)
{
    char path[sizeof f->path];
    memcpy(path, f->path, sizeof path);
    path[sizeof path - 1] = 0;   /* f may be uninitialised: never read past the array */
    memset(f, 0, sizeof *f);
    memcpy(f->path, path, sizeof path);
    f->buf = buf;
    f->len = len;
    if (len < 8)
        return st__ferr(err, path, ST_EFORMAT, "file too small (%zu bytes) for the 8-byte header "
                        "length", len);
    uint64_t n = 0;
    for (int i = 7; i >= 0; i--) n = n << 8 | f->buf[i];
    if (n > ST_MAX_HEADER)
        return st__ferr(err, path, ST_EFORMAT, "header length %" PRIu64 " exceeds the limit of %u",
                        n, ST_MAX_HEADER);
    if (n > len - 8)
        return st__ferr(err, path, ST_EFORMAT, "header length %" PRIu64 " runs past the end of "
                        "the file (%zu bytes): truncated?", n, len);
    st__json j;
    int root = st__jparse(&j, f->buf + 8, (size_t)n), rc;
    if (root < 0)
        rc = st__ferr(err, path, j.status, "header is not valid JSON: %s at byte %zu", j.msg,
                      8 + j.at);
    else
        rc = st__parse_header(f, &j, root, n, err);
    st__jfree(&j);
    if (rc < 0) {
        st__release(f);
        f->buf = NULL;
        f->len = 0;
    }
    return rc;
}

int st_open(st_file *f, const char *path, char *err)
{
    static const uint8_t none[8];   /* stands in for the buffer of a file too small to map */
    char shown[300];
    struct stat sb;
    void *map = NULL;
    memset(f, 0, sizeof *f);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return st__err(err, ST_EIO, "cannot open '%s': %s", st__show(shown, sizeof shown, path),
                       strerror(errno));
    const char *why = fstat(fd, &sb) < 0             ? strerror(errno)
                    : !S_ISREG(sb.st_mode)            ? "not a regular file"
                    : (uint64_t)sb.st_size > SIZE_MAX ? "too large to map" : NULL;
    if (why) {
        close(fd);
        return st__err(err, ST_EIO, "cannot open '%s': %s", st__show(shown, sizeof shown, path),
                       why);
    }
    size_t size = (size_t)sb.st_size;
    if (size >= 8) {   /* mmap of length 0 fails; smaller files are rejected by st_parse anyway */
        map = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (map == MAP_FAILED) {
            int e = errno;
            close(fd);
            return st__err(err, ST_EIO, "cannot map '%s': %s", st__show(shown, sizeof shown, path),
                           strerror(e));
        }
    }
    close(fd);   /* the mapping keeps the file */
    snprintf(f->path, sizeof f->path, "%s", path);
    int rc = st_parse(f, map ? map : none, size, err);
    if (rc < 0) {
        if (map) munmap(map, size);
        return rc;
    }
    f->map = map;
    return 0;
}

void st_close(st_file *f)
{
    st__release(f);
    if (f->map) munmap(f->map, f->len);
    memset(f, 0, sizeof *f);
}

const st_tensor *st_find(const st_file *f, const char *name)
{
    for (int i = 0; i < f->n_tensors; i++)
        if (strcmp(f->tensors[i].name, name) == 0) return &f->tensors[i];
    return NULL;
}

const char *st_meta(const st_file *f, const char *key)
{
    for (int i = 0; i < f->n_meta; i++)
        if (strcmp(f->meta_keys[i], key) == 0) return f->meta_vals[i];
    return NULL;
}

/* ---- writer ------------------------------------------------------------------------------ */

typedef struct st__wtensor {
    char *name;
    st_dtype dtype;
    int n_dims;
    int64_t shape[ST_MAX_DIMS];
    uint64_t nbytes;
    const void *data;    /* the caller's, not copied */
} st__wtensor;

struct st_writer {
    st__wtensor *t;
    int n, cap;
    struct st__wmeta { char *key, *val; } *meta;
    int n_meta, cap_meta;
};

st_writer *st_writer_new(void)
{
    return calloc(1, sizeof(st_writer));
}

void st_writer_free(st_writer *w)
{
    if (!w) return;
    for (int i = 0; i < w->n; i++) free(w->t[i].name);
    for (int i = 0; i < w->n_meta; i++) { free(w->meta[i].key); free(w->meta[i].val); }
    free(w->t);
    free(w->meta);
    free(w);
}

/* Array p of *cap elements of size elem, holding n, grown so one more fits; NULL (p intact)
 * when out of memory. */
static void *st__grow(void *p, int *cap, int n, size_t elem)
{
    if (n < *cap) return p;
    if (*cap > INT_MAX / 2) return NULL;
    int c = *cap ? 2 * *cap : 16;
    void *q = realloc(p, (size_t)c * elem);
    if (q) *cap = c;
    return q;
}

int st_writer_add(st_writer *w, const char *name, st_dtype dtype, int n_dims,
                  const int64_t *shape, const void *data)
{
    uint64_t numel;
    /* Whatever is written must read back: the reader wants valid UTF-8 and a sane shape. */
    if (!w || !name || !st__utf8_valid(name) || strcmp(name, "__metadata__") == 0
        || (unsigned)dtype >= ST_NDTYPE || n_dims < 0 || n_dims > ST_MAX_DIMS
        || (n_dims > 0 && !shape) || st__shape_numel(shape, n_dims, &numel) < 0
        || numel > (uint64_t)INT64_MAX / st__dtypes[dtype].size
        || numel * st__dtypes[dtype].size > SIZE_MAX || (numel && !data))
        return ST_EARG;
    st__wtensor *t = st__grow(w->t, &w->cap, w->n, sizeof *w->t);
    if (!t) return ST_ENOMEM;
    w->t = t;
    t = &w->t[w->n];
    memset(t, 0, sizeof *t);
    if (!(t->name = strdup(name))) return ST_ENOMEM;
    t->dtype = dtype;
    t->n_dims = n_dims;
    if (n_dims) memcpy(t->shape, shape, (size_t)n_dims * sizeof *shape);
    t->nbytes = numel * st__dtypes[dtype].size;
    t->data = data;
    w->n++;
    return 0;
}

int st_writer_meta(st_writer *w, const char *key, const char *value)
{
    if (!w || !key || !value || !st__utf8_valid(key) || !st__utf8_valid(value)) return ST_EARG;
    char *v = strdup(value);
    if (!v) return ST_ENOMEM;
    for (int i = 0; i < w->n_meta; i++) {
        if (strcmp(w->meta[i].key, key) == 0) {
            free(w->meta[i].val);
            w->meta[i].val = v;
            return 0;
        }
    }
    char *k = strdup(key);
    struct st__wmeta *m = k ? st__grow(w->meta, &w->cap_meta, w->n_meta, sizeof *m) : NULL;
    if (!m) {
        free(k);
        free(v);
        return ST_ENOMEM;
    }
    w->meta = m;
    w->meta[w->n_meta].key = k;
    w->meta[w->n_meta++].val = v;
    return 0;
}

/* A growing byte buffer for the header; nomem sticks so callers check once at the end. */
typedef struct st__buf {
    char *p;
    size_t n, cap;
    int nomem;
} st__buf;

static void st__put(st__buf *b, const void *s, size_t n)
{
    if (b->nomem || n == 0) return;
    if (n > b->cap - b->n) {
        size_t cap = b->cap ? b->cap : 4096;
        while (cap - b->n < n) {
            if (cap > SIZE_MAX / 2) { b->nomem = 1; return; }
            cap *= 2;
        }
        char *q = realloc(b->p, cap);
        if (!q) { b->nomem = 1; return; }
        b->p = q;
        b->cap = cap;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
}

static void st__puts(st__buf *b, const char *s) { st__put(b, s, strlen(s)); }

static void st__putu(st__buf *b, uint64_t v)
{
    char tmp[24];
    st__put(b, tmp, (size_t)snprintf(tmp, sizeof tmp, "%" PRIu64, v));
}

/* A JSON string: quotes, backslashes and control bytes escaped, UTF-8 passed through. */
static void st__putstr(st__buf *b, const char *s)
{
    st__put(b, "\"", 1);
    for (const unsigned char *c = (const unsigned char *)s; *c; c++) {
        char esc[8];
        switch (*c) {
        case '"': st__puts(b, "\\\""); break;
        case '\\': st__puts(b, "\\\\"); break;
        case '\n': st__puts(b, "\\n"); break;
        case '\r': st__puts(b, "\\r"); break;
        case '\t': st__puts(b, "\\t"); break;
        default:
            if (*c < 0x20) st__put(b, esc, (size_t)snprintf(esc, sizeof esc, "\\u%04x", *c));
            else st__put(b, c, 1);
        }
    }
    st__put(b, "\"", 1);
}

static int st__cmp_wname(const void *a, const void *b)
{
    return strcmp(((const st__wtensor *)a)->name, ((const st__wtensor *)b)->name);
}

static int st__cmp_wmeta(const void *a, const void *b)
{
    return strcmp(((const struct st__wmeta *)a)->key, ((const struct st__wmeta *)b)->key);
}

/* Header bytes: the 8-byte length, then JSON padded with spaces so 8 + N is a multiple of 8
 * (the data section then starts aligned, as other writers do). Tensors must be sorted. */
static int st__build_header(const st_writer *w, st__buf *b, const char *path, char *err)
{
    uint64_t off = 0;
    char shown[200];
    st__put(b, "\0\0\0\0\0\0\0\0{", 9);
    if (w->n_meta) {
        st__puts(b, "\"__metadata__\":{");
        for (int i = 0; i < w->n_meta; i++) {
            if (i) st__puts(b, ",");
            st__putstr(b, w->meta[i].key);
            st__puts(b, ":");
            st__putstr(b, w->meta[i].val);
        }
        st__puts(b, "}");
    }
    for (int i = 0; i < w->n; i++) {
        const st__wtensor *t = &w->t[i];
        if (off > UINT64_MAX - t->nbytes)
            return st__err(err, ST_EARG, "cannot write '%s': tensors total more than 2^64 bytes",
                           st__show(shown, sizeof shown, path));
        if (i || w->n_meta) st__puts(b, ",");
        st__putstr(b, t->name);
        st__puts(b, ":{\"dtype\":\"");
        st__puts(b, st__dtypes[t->dtype].name);
        st__puts(b, "\",\"shape\":[");
        for (int d = 0; d < t->n_dims; d++) {
            if (d) st__puts(b, ",");
            st__putu(b, (uint64_t)t->shape[d]);
        }
        st__puts(b, "],\"data_offsets\":[");
        st__putu(b, off);
        st__puts(b, ",");
        st__putu(b, off += t->nbytes);
        st__puts(b, "]}");
    }
    st__puts(b, "}");
    while (b->n % 8) st__puts(b, " ");
    if (b->nomem) return st__err(err, ST_ENOMEM, "cannot write '%s': out of memory",
                                 st__show(shown, sizeof shown, path));
    uint64_t n = b->n - 8;
    if (n > ST_MAX_HEADER)
        return st__err(err, ST_EARG, "cannot write '%s': header of %" PRIu64 " bytes exceeds the "
                       "limit of %u", st__show(shown, sizeof shown, path), n, ST_MAX_HEADER);
    for (int i = 0; i < 8; i++) b->p[i] = (char)(n >> 8 * i);
    return 0;
}

static int st__write_all(int fd, const void *p, uint64_t n)
{
    const char *c = p;
    while (n) {
        size_t chunk = n > (1u << 30) ? (1u << 30) : (size_t)n;
        ssize_t k = write(fd, c, chunk);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) {
            if (k == 0) errno = EIO;   /* no progress on a regular file: do not spin */
            return -1;
        }
        c += k;
        n -= (uint64_t)k;
    }
    return 0;
}

/* The directory part of path, malloc'd: "a/b" -> "a", "/b" -> "/", "b" -> ".". */
static char *st__dirname(const char *path)
{
    const char *slash = strrchr(path, '/');
    return slash ? strndup(path, slash == path ? 1 : (size_t)(slash - path)) : strdup(".");
}

/* Makes a finished rename durable; best effort, since the data itself is already synced. */
static void st__sync_dir(const char *path)
{
    char *dir = st__dirname(path);
    if (!dir) return;
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd >= 0) {
        fsync(fd);
        close(fd);
    }
    free(dir);
}

int st_writer_write(st_writer *w, const char *path, char *err)
{
    char shown[200], nm[80];
    st__buf b = {0};
    int rc;
    if (!w || !path) return st__err(err, ST_EARG, "st_writer_write: no writer or path");
    st__show(shown, sizeof shown, path);
    if (w->n > 1) qsort(w->t, (size_t)w->n, sizeof *w->t, st__cmp_wname);
    for (int i = 1; i < w->n; i++)
        if (strcmp(w->t[i - 1].name, w->t[i].name) == 0)
            return st__err(err, ST_EARG, "cannot write '%s': duplicate tensor name '%s'", shown,
                           st__show(nm, sizeof nm, w->t[i].name));
    if (w->n_meta > 1) qsort(w->meta, (size_t)w->n_meta, sizeof *w->meta, st__cmp_wmeta);
    if ((rc = st__build_header(w, &b, path, err)) < 0) {
        free(b.p);
        return rc;
    }

    /* Write beside the target and rename, so readers see the old file or the whole new one. */
    size_t plen = strlen(path);
    char *tmp = malloc(plen + sizeof ".tmp.XXXXXX");
    if (!tmp) {
        free(b.p);
        return st__err(err, ST_ENOMEM, "cannot write '%s': out of memory", shown);
    }
    memcpy(tmp, path, plen);
    memcpy(tmp + plen, ".tmp.XXXXXX", sizeof ".tmp.XXXXXX");
    int fd = mkstemp(tmp);
    if (fd < 0) {
        rc = st__err(err, ST_EIO, "cannot create '%s.tmp.XXXXXX': %s", shown, strerror(errno));
        free(tmp);
        free(b.p);
        return rc;
    }
    const char *what = "write";
    int ok = fchmod(fd, 0644) == 0 && st__write_all(fd, b.p, b.n) == 0;
    for (int i = 0; ok && i < w->n; i++)
        ok = st__write_all(fd, w->t[i].data, w->t[i].nbytes) == 0;
    if (ok && !(ok = fsync(fd) == 0)) what = "sync";
    int e = errno;
    if (close(fd) != 0 && ok) { ok = 0; e = errno; }
    if (ok && !(ok = rename(tmp, path) == 0)) { what = "rename into"; e = errno; }
    if (!ok) {
        unlink(tmp);
        rc = st__err(err, ST_EIO, "cannot %s '%s': %s", what, shown, strerror(e));
    } else {
        st__sync_dir(path);
        rc = 0;
    }
    free(tmp);
    free(b.p);
    return rc;
}

/* ---- sharded ----------------------------------------------------------------------------- */

/* dir + "/" + name, malloc'd. */
static char *st__join(const char *dir, const char *name)
{
    size_t a = strlen(dir), b = strlen(name);
    char *p = malloc(a + b + 2);
    if (!p) return NULL;
    memcpy(p, dir, a);
    p[a] = '/';
    memcpy(p + a + 1, name, b + 1);
    return p;
}

/* Reads a whole (index) file into a malloc'd buffer; the header limit bounds it too. */
static int st__read_file(const char *path, char **out, size_t *len, char *err)
{
    char shown[300];
    struct stat sb;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return st__err(err, ST_EIO, "cannot open '%s': %s", st__show(shown, sizeof shown, path),
                       strerror(errno));
    const char *why = fstat(fd, &sb) < 0                  ? strerror(errno)
                    : !S_ISREG(sb.st_mode)                 ? "not a regular file"
                    : (uint64_t)sb.st_size > ST_MAX_HEADER ? "larger than 100000000 bytes" : NULL;
    char *buf = why ? NULL : malloc((size_t)sb.st_size + 1);
    size_t n = 0;
    if (!why && !buf) why = "out of memory";
    while (!why && n < (size_t)sb.st_size) {
        ssize_t k = read(fd, buf + n, (size_t)sb.st_size - n);
        if (k < 0 && errno == EINTR) continue;
        if (k < 0) why = strerror(errno);
        else if (k == 0) why = "file shrank while reading";
        else n += (size_t)k;
    }
    close(fd);
    if (why) {
        free(buf);
        return st__err(err, ST_EIO, "cannot read '%s': %s", st__show(shown, sizeof shown, path),
                       why);
    }
    *out = buf;
    *len = n;
    return 0;
}

/* Shard names come from a file: keep them inside the index's directory. */
static int st__shard_name_ok(const char *s)
{
    if (!*s || *s == '/') return 0;
    for (const char *p = s; *p; p = strchr(p, '/') ? strchr(p, '/') + 1 : p + strlen(p))
        if (p[0] == '.' && p[1] == '.' && (p[2] == '/' || p[2] == 0)) return 0;
    return 1;
}

static int st__cmp_str(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

void st_sharded_close(st_sharded *s)
{
    for (int i = 0; i < s->n_files; i++) st_close(&s->files[i]);
    free(s->files);
    s->files = NULL;
    s->n_files = 0;
}

int st_sharded_open(st_sharded *s, const char *path, char *err)
{
    char shown[300];
    struct stat sb;
    char *index = NULL, *dir = NULL, *text = NULL;
    const char **names = NULL;
    size_t len = 0;
    int rc, n_names = 0;
    st__json j;
    memset(&j, 0, sizeof j);
    memset(s, 0, sizeof *s);
    if (stat(path, &sb) < 0)
        return st__err(err, ST_EIO, "cannot open '%s': %s", st__show(shown, sizeof shown, path),
                       strerror(errno));
    if (S_ISDIR(sb.st_mode)) {
        dir = strdup(path);
        index = st__join(path, "model.safetensors.index.json");
    } else {
        index = strdup(path);
        dir = st__dirname(path);
    }
    if (!dir || !index) { rc = st__err(err, ST_ENOMEM, "out of memory"); goto done; }
    if ((rc = st__read_file(index, &text, &len, err)) < 0) goto done;

    int root = st__jparse(&j, text, len), wm = -1;
    if (root < 0) {
        rc = st__ferr(err, index, j.status, "not valid JSON: %s at byte %zu", j.msg, j.at);
        goto done;
    }
    if (j.nodes[root].type == ST__J_OBJ) wm = st__jget(&j, root, "weight_map");
    if (wm < 0 || j.nodes[wm].type != ST__J_OBJ) {
        rc = st__ferr(err, index, ST_EFORMAT, "no \"weight_map\" object");
        goto done;
    }
    if (!(names = malloc(((size_t)j.nodes[wm].n + 1) * sizeof *names))) {
        rc = st__ferr(err, index, ST_ENOMEM, "out of memory");
        goto done;
    }
    for (int c = j.nodes[wm].child; c >= 0; c = j.nodes[c].next) {
        char nm[80];
        if (j.nodes[c].type != ST__J_STR || !st__shard_name_ok(j.nodes[c].s)) {
            rc = st__ferr(err, index, ST_EFORMAT, "weight_map entry '%s' is not a relative file "
                          "name", st__show(nm, sizeof nm, j.nodes[c].key));
            goto done;
        }
        names[n_names++] = j.nodes[c].s;
    }

    /* Distinct shards, sorted: files[i] is the shard names[i]. */
    if (n_names > 1) qsort(names, (size_t)n_names, sizeof *names, st__cmp_str);
    int n_uniq = 0;
    for (int i = 0; i < n_names; i++)
        if (i == 0 || strcmp(names[i], names[n_uniq - 1]) != 0) names[n_uniq++] = names[i];
    if (!(s->files = calloc((size_t)n_uniq + 1, sizeof *s->files))) {
        rc = st__ferr(err, index, ST_ENOMEM, "out of memory");
        goto done;
    }
    for (int i = 0; i < n_uniq; i++) {
        char *p = st__join(dir, names[i]);
        if (!p) { rc = st__err(err, ST_ENOMEM, "out of memory"); goto done; }
        rc = st_open(&s->files[i], p, err);
        free(p);
        if (rc < 0) goto done;
        s->n_files++;
    }

    for (int c = j.nodes[wm].child; c >= 0; c = j.nodes[c].next) {
        const char *key = j.nodes[c].s;
        const char **hit = bsearch(&key, names, (size_t)n_uniq, sizeof *names, st__cmp_str);
        if (!st_find(&s->files[hit - names], j.nodes[c].key)) {
            char nm[80], sh[120];
            rc = st__ferr(err, index, ST_EMISMATCH, "tensor '%s' is mapped to '%s', which has no "
                          "such tensor", st__show(nm, sizeof nm, j.nodes[c].key),
                          st__show(sh, sizeof sh, key));
            goto done;
        }
    }
    rc = 0;
done:
    if (rc < 0) st_sharded_close(s);
    st__jfree(&j);
    free(names);
    free(text);
    free(index);
    free(dir);
    return rc;
}

const st_tensor *st_sharded_find(const st_sharded *s, const char *name, const st_file **owner)
{
    for (int i = 0; i < s->n_files; i++) {
        const st_tensor *t = st_find(&s->files[i], name);
        if (t) {
            if (owner) *owner = &s->files[i];
            return t;
        }
    }
    return NULL;
}

#endif /* SAFETENSORS_IMPLEMENTED */
#endif /* SAFETENSORS_IMPLEMENTATION */

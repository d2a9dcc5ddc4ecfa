/* gguf.c - GGUF v2/v3 parser, fixture writer, and scalar block (de)quantisers.
 *
 * The parser treats the buffer as hostile: every count is checked against the bytes left before
 * anything proportional to it is allocated or looped over, every addition and multiplication of
 * file-supplied numbers is overflow-checked, and multi-byte values are assembled byte by byte so
 * unaligned fields are fine. Messages are one line and name the file.
 *
 * The dequantisers do ggml's float operations in ggml's order (step = d * scale, then step * q,
 * then - dmin * min or + m) and agree to the bit with ggml's reference C and gguf-py's numpy
 * (scripts/check_gguf_dequant.py). Every product is exact in f32 (an f16's 11 significant bits
 * times at most 7 bits of scale and 7 of code), so neither the order of the multiplies nor a
 * compiler's fused multiply-add can change a value; only the final add rounds.
 */
#include "gguf.h"

#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define GGUF_MAX_DEPTH 8            /* arrays nested deeper than this are rejected */
#define GGUF_DEFAULT_ALIGNMENT 32
#define QK_K 256

/* Smallest encodings, used to bound hostile counts before allocating: a metadata entry is at
 * least a u64 key length, a u32 type and a 1-byte value; a tensor info at least a u64 name
 * length, u32 n_dims, one u64 dimension, u32 type and u64 offset. */
#define MIN_KV_BYTES 13
#define MIN_TENSOR_INFO_BYTES 32

/* ---- little-endian loads and stores ---------------------------------------------------- */

static uint16_t ld16(const uint8_t *p) { return (uint16_t)(p[0] | p[1] << 8); }
static uint32_t ld32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static uint64_t ld64(const uint8_t *p) { return (uint64_t)ld32(p) | (uint64_t)ld32(p + 4) << 32; }
static float ldf32(const uint8_t *p) { uint32_t u = ld32(p); float f; memcpy(&f, &u, 4); return f; }
static double ldf64(const uint8_t *p) { uint64_t u = ld64(p); double d; memcpy(&d, &u, 8); return d; }

static void st16(uint8_t *p, uint16_t v) { p[0] = (uint8_t)v; p[1] = (uint8_t)(v >> 8); }
static void st32(uint8_t *p, uint32_t v) { for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> 8 * i); }
static void st64(uint8_t *p, uint64_t v) { for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> 8 * i); }

/* Size of one fixed-size metadata value; 0 for strings, arrays and unknown types. */
static size_t vtype_size(uint32_t vt)
{
    switch (vt) {
    case GGUF_VT_U8: case GGUF_VT_I8: case GGUF_VT_BOOL: return 1;
    case GGUF_VT_U16: case GGUF_VT_I16: return 2;
    case GGUF_VT_U32: case GGUF_VT_I32: case GGUF_VT_F32: return 4;
    case GGUF_VT_U64: case GGUF_VT_I64: case GGUF_VT_F64: return 8;
    default: return 0;
    }
}

/* ---- error messages ----------------------------------------------------------------------- */

/* "'path': problem", or "gguf: problem" for a buffer parsed from memory. */
static int fail(const char *name, char *err, int status, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static int fail(const char *name, char *err, int status, const char *fmt, ...)
{
    char msg[FASA_ERRLEN];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (name && name[0]) return fasa_error(err, status, "'%s': %s", name, msg);
    return fasa_error(err, status, "gguf: %s", msg);
}

/* A file-supplied string made safe for a one-line message: truncated, control bytes as '?'. */
typedef struct shown { char s[96]; } shown;

static shown show(gguf_str str)
{
    shown out;
    size_t n = str.len < sizeof out.s - 4 ? (size_t)str.len : sizeof out.s - 4;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)str.ptr[i];
        out.s[i] = c < 0x20 || c == 0x7f ? '?' : (char)c;
    }
    if (n < str.len) memcpy(out.s + n, "...", 3), n += 3;
    out.s[n] = 0;
    return out;
}

/* ---- parser ------------------------------------------------------------------------------- */

typedef struct reader {
    const uint8_t *buf;
    size_t len, pos;
    const char *name;
    char *err;
} reader;

static size_t left(const reader *r) { return r->len - r->pos; }

static int need(reader *r, uint64_t n, const char *what)
{
    if (n <= left(r)) return 0;
    return fail(r->name, r->err, FASA_EFORMAT,
                "truncated: %s needs %llu bytes at offset %zu but the file has %zu",
                what, (unsigned long long)n, r->pos, r->len);
}

static int read_u32(reader *r, uint32_t *v, const char *what)
{
    if (need(r, 4, what) < 0) return FASA_EFORMAT;
    *v = ld32(r->buf + r->pos);
    r->pos += 4;
    return 0;
}

static int read_u64(reader *r, uint64_t *v, const char *what)
{
    if (need(r, 8, what) < 0) return FASA_EFORMAT;
    *v = ld64(r->buf + r->pos);
    r->pos += 8;
    return 0;
}

static int read_str(reader *r, gguf_str *s, const char *what)
{
    uint64_t n;
    if (read_u64(r, &n, what) < 0 || need(r, n, what) < 0) return FASA_EFORMAT;
    s->ptr = (const char *)r->buf + r->pos;
    s->len = n;
    r->pos += (size_t)n;
    return 0;
}

static int skip_array(reader *r, uint32_t et, uint64_t n, int depth, gguf_str key);

static int skip_value(reader *r, uint32_t vt, int depth, gguf_str key)
{
    size_t sz = vtype_size(vt);
    if (sz) {
        if (need(r, sz, "a metadata value") < 0) return FASA_EFORMAT;
        r->pos += sz;
        return 0;
    }
    if (vt == GGUF_VT_STRING) {
        gguf_str s;
        return read_str(r, &s, "a metadata string");
    }
    if (vt == GGUF_VT_ARRAY) {
        uint32_t et;
        uint64_t n;
        if (depth >= GGUF_MAX_DEPTH)
            return fail(r->name, r->err, FASA_EFORMAT,
                        "metadata '%s' nests arrays more than %d deep", show(key).s, GGUF_MAX_DEPTH);
        if (read_u32(r, &et, "an array header") < 0 || read_u64(r, &n, "an array header") < 0)
            return FASA_EFORMAT;
        return skip_array(r, et, n, depth + 1, key);
    }
    return fail(r->name, r->err, FASA_EFORMAT, "metadata '%s' has unknown value type %u",
                show(key).s, vt);
}

/* Strings and arrays are walked element by element, but only after the count has been checked
 * against their smallest encoding, so a hostile count costs no more than the file's size. */
static int skip_array(reader *r, uint32_t et, uint64_t n, int depth, gguf_str key)
{
    size_t sz = vtype_size(et);
    size_t min = sz ? sz : et == GGUF_VT_STRING ? 8 : et == GGUF_VT_ARRAY ? 12 : 0;
    if (!min)
        return fail(r->name, r->err, FASA_EFORMAT,
                    "metadata '%s' is an array of unknown value type %u", show(key).s, et);
    if (n > left(r) / min)
        return fail(r->name, r->err, FASA_EFORMAT,
                    "metadata '%s' claims %llu array elements but only %zu bytes remain",
                    show(key).s, (unsigned long long)n, left(r));
    if (sz) {
        r->pos += (size_t)n * sz;
        return 0;
    }
    for (uint64_t i = 0; i < n; i++)
        if (skip_value(r, et, depth, key) < 0) return FASA_EFORMAT;
    return 0;
}

static int str_cmp(gguf_str a, gguf_str b)
{
    size_t n = a.len < b.len ? (size_t)a.len : (size_t)b.len;
    int c = n ? memcmp(a.ptr, b.ptr, n) : 0;
    if (c) return c;
    return a.len < b.len ? -1 : a.len > b.len;
}

static int str_eq(gguf_str a, const char *b)
{
    size_t n = strlen(b);
    return a.len == n && memcmp(a.ptr, b, n) == 0;
}

static int cmp_kv_key(const void *a, const void *b)
{
    return str_cmp((*(const gguf_kv *const *)a)->key, (*(const gguf_kv *const *)b)->key);
}

static int cmp_tensor_name(const void *a, const void *b)
{
    return str_cmp((*(const gguf_tensor *const *)a)->name, (*(const gguf_tensor *const *)b)->name);
}

static int cmp_tensor_offset(const void *a, const void *b)
{
    uint64_t x = (*(const gguf_tensor *const *)a)->offset, y = (*(const gguf_tensor *const *)b)->offset;
    return x < y ? -1 : x > y;
}

static int parse_header(reader *r, gguf_file *g)
{
    if (need(r, 4, "the magic") < 0) return FASA_EFORMAT;
    const uint8_t *m = r->buf;
    if (memcmp(m, "GGUF", 4) != 0)
        return fail(r->name, r->err, FASA_EFORMAT,
                    "not a GGUF file (magic %02x %02x %02x %02x, expected 'GGUF')", m[0], m[1], m[2], m[3]);
    r->pos = 4;
    if (read_u32(r, &g->version, "the version") < 0) return FASA_EFORMAT;
    if (g->version != 2 && g->version != 3) {
        uint32_t swapped = __builtin_bswap32(g->version);
        if (swapped == 2 || swapped == 3)
            return fail(r->name, r->err, FASA_EUNSUPPORTED,
                        "big-endian GGUF (version %u) is not supported", swapped);
        return fail(r->name, r->err, FASA_EUNSUPPORTED,
                    "GGUF version %u is not supported (only 2 and 3)", g->version);
    }
    if (read_u64(r, &g->n_tensors, "the tensor count") < 0 ||
        read_u64(r, &g->n_kv, "the metadata count") < 0)
        return FASA_EFORMAT;
    return 0;
}

static int parse_kvs(reader *r, gguf_file *g)
{
    if (g->n_kv > left(r) / MIN_KV_BYTES)
        return fail(r->name, r->err, FASA_EFORMAT,
                    "metadata count %llu is impossible with %zu bytes left",
                    (unsigned long long)g->n_kv, left(r));
    g->kv = calloc(g->n_kv ? (size_t)g->n_kv : 1, sizeof *g->kv);
    if (!g->kv) return fail(r->name, r->err, FASA_ENOMEM, "out of memory for %llu metadata entries",
                            (unsigned long long)g->n_kv);
    for (uint64_t i = 0; i < g->n_kv; i++) {
        gguf_kv *kv = &g->kv[i];
        char what[64];
        snprintf(what, sizeof what, "the key of metadata entry %llu", (unsigned long long)i);
        if (read_str(r, &kv->key, what) < 0) return FASA_EFORMAT;
        snprintf(what, sizeof what, "the type of '%.40s'", show(kv->key).s);
        if (read_u32(r, &kv->type, what) < 0) return FASA_EFORMAT;
        if (kv->type == GGUF_VT_ARRAY) {
            if (read_u32(r, &kv->arr_type, what) < 0 || read_u64(r, &kv->arr_n, what) < 0)
                return FASA_EFORMAT;
            kv->value = r->buf + r->pos;
            if (skip_array(r, kv->arr_type, kv->arr_n, 1, kv->key) < 0) return FASA_EFORMAT;
        } else {
            kv->value = r->buf + r->pos;
            if (skip_value(r, kv->type, 0, kv->key) < 0) return FASA_EFORMAT;
        }
    }
    if (g->n_kv > 1) {
        gguf_kv **s = malloc((size_t)g->n_kv * sizeof *s);
        if (!s) return fail(r->name, r->err, FASA_ENOMEM, "out of memory");
        for (uint64_t i = 0; i < g->n_kv; i++) s[i] = &g->kv[i];
        qsort(s, (size_t)g->n_kv, sizeof *s, cmp_kv_key);
        for (uint64_t i = 1; i < g->n_kv; i++)
            if (str_cmp(s[i - 1]->key, s[i]->key) == 0) {
                shown k = show(s[i]->key);
                free(s);
                return fail(r->name, r->err, FASA_EFORMAT, "duplicate metadata key '%s'", k.s);
            }
        free(s);
    }
    g->alignment = GGUF_DEFAULT_ALIGNMENT;
    const gguf_kv *a = gguf_find_kv(g, "general.alignment");
    if (a) {
        uint32_t v = a->type == GGUF_VT_U32 ? ld32(a->value) : 0;
        if (a->type != GGUF_VT_U32 || v == 0 || (v & (v - 1)))
            return fail(r->name, r->err, FASA_EFORMAT,
                        "general.alignment must be a u32 power of two (type %u, value %u)", a->type, v);
        g->alignment = v;
    }
    return 0;
}

/* One tensor info: name, dims, type, offset; then its byte size, all overflow-checked. */
static int parse_tensor_info(reader *r, gguf_file *g, gguf_tensor *t, uint64_t i)
{
    char what[64];
    snprintf(what, sizeof what, "the name of tensor %llu", (unsigned long long)i);
    if (read_str(r, &t->name, what) < 0) return FASA_EFORMAT;
    shown nm = show(t->name);
    snprintf(what, sizeof what, "the info of tensor '%.40s'", nm.s);
    if (read_u32(r, &t->n_dims, what) < 0) return FASA_EFORMAT;
    if (t->n_dims < 1 || t->n_dims > 4)
        return fail(r->name, r->err, FASA_EFORMAT, "tensor '%s' has %u dimensions (need 1 to 4)",
                    nm.s, t->n_dims);
    for (int d = 0; d < 4; d++) t->ne[d] = 1;
    for (uint32_t d = 0; d < t->n_dims; d++) {
        uint64_t ne;
        if (read_u64(r, &ne, what) < 0) return FASA_EFORMAT;
        if (ne == 0 || ne > (uint64_t)INT64_MAX)
            return fail(r->name, r->err, FASA_EFORMAT, "tensor '%s' has dimension %u of size %llu",
                        nm.s, d, (unsigned long long)ne);
        t->ne[d] = (int64_t)ne;
    }
    if (read_u32(r, &t->type, what) < 0 || read_u64(r, &t->offset, what) < 0) return FASA_EFORMAT;
    const gguf_type_traits *ti = gguf_type_traits_of(t->type);
    if (!ti)
        return fail(r->name, r->err, FASA_EUNSUPPORTED, "tensor '%s' has unsupported type %u",
                    nm.s, t->type);
    if (t->ne[0] % ti->block)
        return fail(r->name, r->err, FASA_EFORMAT,
                    "tensor '%s' has ne[0] = %lld, not a multiple of the %s block size %lld",
                    nm.s, (long long)t->ne[0], ti->name, (long long)ti->block);
    int64_t rows = 1, n;
    uint64_t row_bytes;
    if (__builtin_mul_overflow(t->ne[1], t->ne[2], &rows) ||
        __builtin_mul_overflow(rows, t->ne[3], &rows) ||
        __builtin_mul_overflow(t->ne[0], rows, &n) ||
        __builtin_mul_overflow((uint64_t)(t->ne[0] / ti->block), (uint64_t)ti->bytes, &row_bytes) ||
        __builtin_mul_overflow(row_bytes, (uint64_t)rows, &t->nbytes))
        return fail(r->name, r->err, FASA_EFORMAT, "tensor '%s' is too large (size overflows)", nm.s);
    if (t->offset % g->alignment)
        return fail(r->name, r->err, FASA_EFORMAT,
                    "tensor '%s' offset %llu is not a multiple of the alignment %llu", nm.s,
                    (unsigned long long)t->offset, (unsigned long long)g->alignment);
    return 0;
}

static int parse_tensors(reader *r, gguf_file *g)
{
    if (g->n_tensors > left(r) / MIN_TENSOR_INFO_BYTES)
        return fail(r->name, r->err, FASA_EFORMAT,
                    "tensor count %llu is impossible with %zu bytes left",
                    (unsigned long long)g->n_tensors, left(r));
    g->tensors = calloc(g->n_tensors ? (size_t)g->n_tensors : 1, sizeof *g->tensors);
    if (!g->tensors) return fail(r->name, r->err, FASA_ENOMEM, "out of memory for %llu tensors",
                                 (unsigned long long)g->n_tensors);
    for (uint64_t i = 0; i < g->n_tensors; i++)
        if (parse_tensor_info(r, g, &g->tensors[i], i) < 0) return FASA_EFORMAT;

    /* pos <= len and alignment <= 2^31, so this cannot overflow 64 bits. */
    uint64_t data_start = ((uint64_t)r->pos + g->alignment - 1) / g->alignment * g->alignment;
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        gguf_tensor *t = &g->tensors[i];
        uint64_t start, end;
        if (__builtin_add_overflow(data_start, t->offset, &start) ||
            __builtin_add_overflow(start, t->nbytes, &end) || end > r->len)
            return fail(r->name, r->err, FASA_EFORMAT,
                        "tensor '%s' data [%llu, %llu) lies past the end of the file (size %zu)",
                        show(t->name).s, (unsigned long long)(data_start + t->offset),
                        (unsigned long long)(data_start + t->offset + t->nbytes), r->len);
        t->data = r->buf + start;
    }
    if (g->n_tensors < 2) return 0;

    int status = 0;
    gguf_tensor **s = malloc((size_t)g->n_tensors * sizeof *s);
    if (!s) return fail(r->name, r->err, FASA_ENOMEM, "out of memory");
    for (uint64_t i = 0; i < g->n_tensors; i++) s[i] = &g->tensors[i];
    qsort(s, (size_t)g->n_tensors, sizeof *s, cmp_tensor_name);
    for (uint64_t i = 1; i < g->n_tensors && !status; i++)
        if (str_cmp(s[i - 1]->name, s[i]->name) == 0)
            status = fail(r->name, r->err, FASA_EFORMAT, "duplicate tensor name '%s'", show(s[i]->name).s);
    if (!status) {
        qsort(s, (size_t)g->n_tensors, sizeof *s, cmp_tensor_offset);
        for (uint64_t i = 1; i < g->n_tensors && !status; i++) {
            const gguf_tensor *a = s[i - 1], *b = s[i];
            if (a->offset + a->nbytes > b->offset)   /* both ends were checked above */
                status = fail(r->name, r->err, FASA_EFORMAT,
                              "tensors '%s' and '%s' overlap (data offsets [%llu, %llu) and [%llu, %llu))",
                              show(a->name).s, show(b->name).s, (unsigned long long)a->offset,
                              (unsigned long long)(a->offset + a->nbytes),
                              (unsigned long long)b->offset, (unsigned long long)(b->offset + b->nbytes));
        }
    }
    free(s);
    return status;
}

static int parse_named(gguf_file *g, const void *buf, size_t len, const char *name, char *err)
{
    memset(g, 0, sizeof *g);
    reader r = { .buf = buf, .len = len, .pos = 0, .name = name, .err = err };
    g->buf = buf;
    g->len = len;
    int st;
    if ((st = parse_header(&r, g)) < 0 || (st = parse_kvs(&r, g)) < 0 || (st = parse_tensors(&r, g)) < 0) {
        free(g->kv);
        free(g->tensors);
        memset(g, 0, sizeof *g);
        return st;
    }
    return 0;
}

int gguf_parse(gguf_file *g, const void *buf, size_t len, char *err)
{
    if (!buf && len) return fasa_error(err, FASA_EARG, "gguf: NULL buffer");
    return parse_named(g, buf ? buf : "", len, NULL, err);
}

int gguf_open(gguf_file *g, const char *path, char *err)
{
    memset(g, 0, sizeof *g);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return fasa_error(err, FASA_EIO, "cannot open '%s': %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) < 0) {
        int e = errno;
        close(fd);
        return fasa_error(err, FASA_EIO, "cannot stat '%s': %s", path, strerror(e));
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return fasa_error(err, FASA_EIO, "cannot read '%s': not a regular file", path);
    }
    size_t len = (size_t)st.st_size;
    void *map = NULL;
    if (len) {   /* mmap of zero bytes fails; an empty file is reported by the parser */
        map = mmap(NULL, len, PROT_READ, MAP_PRIVATE, fd, 0);
        if (map == MAP_FAILED) {
            int e = errno;
            close(fd);
            return fasa_error(err, FASA_EIO, "cannot map '%s': %s", path, strerror(e));
        }
    }
    close(fd);
    int rc = parse_named(g, map ? map : "", len, path, err);
    if (rc < 0) {
        if (map) munmap(map, len);
        return rc;
    }
    g->map = map;
    snprintf(g->path, sizeof g->path, "%s", path);
    return 0;
}

void gguf_close(gguf_file *g)
{
    if (!g) return;
    if (g->map) munmap(g->map, g->len);
    free(g->kv);
    free(g->tensors);
    memset(g, 0, sizeof *g);
}

/* ---- lookups and getters ------------------------------------------------------------------ */

const gguf_kv *gguf_find_kv(const gguf_file *g, const char *key)
{
    for (uint64_t i = 0; i < g->n_kv; i++)
        if (str_eq(g->kv[i].key, key)) return &g->kv[i];
    return NULL;
}

const gguf_tensor *gguf_find_tensor(const gguf_file *g, const char *name)
{
    for (uint64_t i = 0; i < g->n_tensors; i++)
        if (str_eq(g->tensors[i].name, name)) return &g->tensors[i];
    return NULL;
}

/* An integer value as sign + magnitude-free pair: neg ? s : u holds it exactly. */
typedef struct intval { int neg; int64_t s; uint64_t u; } intval;

static int int_load(uint32_t vt, const uint8_t *p, intval *v)
{
    int64_t s;
    switch (vt) {
    case GGUF_VT_U8:  v->neg = 0; v->u = p[0]; return 0;
    case GGUF_VT_U16: v->neg = 0; v->u = ld16(p); return 0;
    case GGUF_VT_U32: v->neg = 0; v->u = ld32(p); return 0;
    case GGUF_VT_U64: v->neg = 0; v->u = ld64(p); return 0;
    case GGUF_VT_I8:  s = (int8_t)p[0]; break;
    case GGUF_VT_I16: s = (int16_t)ld16(p); break;
    case GGUF_VT_I32: s = (int32_t)ld32(p); break;
    case GGUF_VT_I64: s = (int64_t)ld64(p); break;
    default: return FASA_EFORMAT;
    }
    v->neg = s < 0;
    v->s = s;
    v->u = s < 0 ? 0 : (uint64_t)s;
    return 0;
}

static const gguf_kv *find_scalar(const gguf_file *g, const char *key, int *st)
{
    const gguf_kv *kv = gguf_find_kv(g, key);
    *st = kv ? 0 : FASA_EARG;
    return kv;
}

int gguf_get_u32(const gguf_file *g, const char *key, uint32_t *out)
{
    int st;
    intval v;
    const gguf_kv *kv = find_scalar(g, key, &st);
    if (!kv) return st;
    if (int_load(kv->type, kv->value, &v) < 0 || v.neg || v.u > UINT32_MAX) return FASA_EFORMAT;
    *out = (uint32_t)v.u;
    return 0;
}

int gguf_get_i64(const gguf_file *g, const char *key, int64_t *out)
{
    int st;
    intval v;
    const gguf_kv *kv = find_scalar(g, key, &st);
    if (!kv) return st;
    if (int_load(kv->type, kv->value, &v) < 0 || (!v.neg && v.u > (uint64_t)INT64_MAX))
        return FASA_EFORMAT;
    *out = v.neg ? v.s : (int64_t)v.u;
    return 0;
}

int gguf_get_f32(const gguf_file *g, const char *key, float *out)
{
    int st;
    const gguf_kv *kv = find_scalar(g, key, &st);
    if (!kv) return st;
    if (kv->type == GGUF_VT_F32) *out = ldf32(kv->value);
    else if (kv->type == GGUF_VT_F64) *out = (float)ldf64(kv->value);
    else return FASA_EFORMAT;
    return 0;
}

int gguf_get_bool(const gguf_file *g, const char *key, int *out)
{
    int st;
    const gguf_kv *kv = find_scalar(g, key, &st);
    if (!kv) return st;
    if (kv->type != GGUF_VT_BOOL) return FASA_EFORMAT;
    *out = kv->value[0] != 0;
    return 0;
}

int gguf_get_str(const gguf_file *g, const char *key, gguf_str *out)
{
    int st;
    const gguf_kv *kv = find_scalar(g, key, &st);
    if (!kv) return st;
    if (kv->type != GGUF_VT_STRING) return FASA_EFORMAT;
    out->len = ld64(kv->value);
    out->ptr = (const char *)kv->value + 8;
    return 0;
}

/* The array walkers trust the layout: gguf_parse has already bounds-checked every element. */
int gguf_arr_strs(const gguf_kv *kv, gguf_str *out)
{
    if (kv->type != GGUF_VT_ARRAY || kv->arr_type != GGUF_VT_STRING) return FASA_EFORMAT;
    const uint8_t *p = kv->value;
    for (uint64_t i = 0; i < kv->arr_n; i++) {
        out[i].len = ld64(p);
        out[i].ptr = (const char *)p + 8;
        p += 8 + out[i].len;
    }
    return 0;
}

int gguf_arr_i32(const gguf_kv *kv, int32_t *out)
{
    size_t sz = vtype_size(kv->arr_type);
    intval v;
    if (kv->type != GGUF_VT_ARRAY || kv->arr_type == GGUF_VT_BOOL || kv->arr_type == GGUF_VT_F32 ||
        kv->arr_type == GGUF_VT_F64 || sz == 0)
        return FASA_EFORMAT;
    for (uint64_t i = 0; i < kv->arr_n; i++) {
        if (int_load(kv->arr_type, kv->value + i * sz, &v) < 0 || (v.neg ? v.s < INT32_MIN : v.u > INT32_MAX))
            return FASA_EFORMAT;
        out[i] = v.neg ? (int32_t)v.s : (int32_t)v.u;
    }
    return 0;
}

int gguf_arr_f32(const gguf_kv *kv, float *out)
{
    if (kv->type != GGUF_VT_ARRAY) return FASA_EFORMAT;
    if (kv->arr_type == GGUF_VT_F32)
        for (uint64_t i = 0; i < kv->arr_n; i++) out[i] = ldf32(kv->value + 4 * i);
    else if (kv->arr_type == GGUF_VT_F64)
        for (uint64_t i = 0; i < kv->arr_n; i++) out[i] = (float)ldf64(kv->value + 8 * i);
    else
        return FASA_EFORMAT;
    return 0;
}

/* ---- tensor checks ------------------------------------------------------------------------------ */

/* A NaN or infinite f16 has all five exponent bits set. The plain loop is the fast one: its exit
 * branch is never taken on a good file, and it reads the scales of a block together (a version
 * that ORed flags over runs of blocks, one scale field at a time, measured half as fast). */
static int f16_nonfinite(uint16_t h) { return (h & 0x7c00) == 0x7c00; }

int gguf_check_tensor(const gguf_file *g, const gguf_tensor *t, char *err)
{
    const gguf_type_traits *tt = gguf_type_traits_of(t->type);
    if (!tt)
        return fail(g->path, err, FASA_EUNSUPPORTED, "tensor '%s' has unsupported type %u", show(t->name).s, t->type);
    const uint8_t *p = t->data;
    const uint64_t nb = t->nbytes / tt->bytes;
    for (uint64_t b = 0; b < nb; b++, p += tt->bytes)
        for (int k = 0; k < tt->n_scales; k++)
            if (f16_nonfinite(ld16(p + tt->scale_at[k])))
                return fail(g->path, err, FASA_EFORMAT, "tensor '%s': block %llu has a non-finite scale",
                            show(t->name).s, (unsigned long long)b);
    return 0;
}

/* ---- fp16 / bf16 ---------------------------------------------------------------------------- */

static uint32_t f32_bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static float bits_f32(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

float gguf_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    uint32_t exp = (h >> 10) & 0x1f, mant = h & 0x3ff;
    if (exp == 0x1f) return bits_f32(sign | 0x7f800000 | mant << 13);      /* inf, nan + payload */
    if (exp != 0) return bits_f32(sign | (exp + 112) << 23 | mant << 13);  /* rebias 15 -> 127 */
    if (mant == 0) return bits_f32(sign);
    /* Subnormal mant * 2^-24: shift the leading one up to the implicit bit. */
    uint32_t e = 113;
    while (!(mant & 0x400)) mant <<= 1, e--;
    return bits_f32(sign | e << 23 | (mant & 0x3ff) << 13);
}

/* Rounds x right by `shift` bits, to nearest, ties to even. */
static uint32_t shr_rne(uint32_t x, int shift)
{
    uint32_t q = x >> shift, rem = x & ((1u << shift) - 1), half = 1u << (shift - 1);
    return q + (rem > half || (rem == half && (q & 1)));
}

uint16_t gguf_f32_to_f16(float f)
{
    uint32_t x = f32_bits(f);
    uint16_t sign = (uint16_t)(x >> 16 & 0x8000);
    x &= 0x7fffffff;
    if (x > 0x7f800000) return sign | 0x7e00 | (uint16_t)(x >> 13 & 0x1ff);  /* quiet nan */
    if (x >= 0x477ff000) return sign | 0x7c00;       /* >= 65520 rounds past 65504: inf */
    if (x >= 0x38800000)                              /* normal: >= 2^-14 */
        /* the carry of rounding may step into the exponent, which is the right answer */
        return sign | (uint16_t)shr_rne(x - (112u << 23), 13);
    if (x <= 0x33000000) return sign;                 /* <= 2^-25 (a tie) rounds to zero */
    /* subnormal: value * 2^24 = mant * 2^(e - 126) with e in 102..112 */
    uint32_t e = x >> 23, mant = (x & 0x7fffff) | 0x800000;
    return sign | (uint16_t)shr_rne(mant, (int)(126 - e));
}

float gguf_bf16_to_f32(uint16_t h) { return bits_f32((uint32_t)h << 16); }

uint16_t gguf_f32_to_bf16(float f)
{
    uint32_t x = f32_bits(f);
    if ((x & 0x7fffffff) > 0x7f800000) return (uint16_t)(x >> 16 | 0x40);   /* keep it a nan */
    return (uint16_t)((x + 0x7fff + (x >> 16 & 1)) >> 16);   /* overflow to inf is correct */
}

/* ---- dequantisers ---------------------------------------------------------------------------
 *
 * One function per type turns n values (whole blocks, from a block boundary) into floats with
 * ggml's arithmetic: a sub-block's step is d * scale, each value step * q (minus dmin * min).
 * The layouts are in gguf.h. */

static float f16_at(const uint8_t *p) { return gguf_f16_to_f32(ld16(p)); }

/* The non-linear 4-bit codebook of IQ4_NL and IQ4_XS. */
static const int8_t KVALUES_IQ4NL[16] = { -127, -104, -83, -65, -49, -35, -22, -10,
                                          1,    13,   25,  38,  53,  69,  89,  113 };

static void dq_f32(const void *src, float *y, int64_t n)
{
    const uint8_t *p = src;
    for (int64_t i = 0; i < n; i++) y[i] = ldf32(p + 4 * i);
}

static void dq_f16(const void *src, float *y, int64_t n)
{
    const uint8_t *p = src;
    for (int64_t i = 0; i < n; i++) y[i] = f16_at(p + 2 * i);
}

static void dq_bf16(const void *src, float *y, int64_t n)
{
    const uint8_t *p = src;
    for (int64_t i = 0; i < n; i++) y[i] = gguf_bf16_to_f32(ld16(p + 2 * i));
}

static void dq_q4_0(const void *src, float *y, int64_t n)
{
    for (const uint8_t *b = src; n > 0; n -= 32, b += 18, y += 32) {
        float d = f16_at(b);
        for (int j = 0; j < 16; j++) {
            y[j] = d * (float)((b[2 + j] & 0xf) - 8);
            y[j + 16] = d * (float)((b[2 + j] >> 4) - 8);
        }
    }
}

static void dq_q4_1(const void *src, float *y, int64_t n)
{
    for (const uint8_t *b = src; n > 0; n -= 32, b += 20, y += 32) {
        float d = f16_at(b), m = f16_at(b + 2);
        for (int j = 0; j < 16; j++) {
            y[j] = d * (float)(b[4 + j] & 0xf) + m;
            y[j + 16] = d * (float)(b[4 + j] >> 4) + m;
        }
    }
}

/* Q5_0 and Q5_1: the nibbles of Q4_0/Q4_1 and a fifth bit from qh, bit j for value j. */
static void dq_q5_0(const void *src, float *y, int64_t n)
{
    for (const uint8_t *b = src; n > 0; n -= 32, b += 22, y += 32) {
        float d = f16_at(b);
        uint32_t qh = ld32(b + 2);
        const uint8_t *qs = b + 6;
        for (int j = 0; j < 16; j++) {
            int lo = (qs[j] & 0xf) | (int)(qh >> j & 1) << 4;
            int hi = (qs[j] >> 4) | (int)(qh >> (j + 16) & 1) << 4;
            y[j] = d * (float)(lo - 16);
            y[j + 16] = d * (float)(hi - 16);
        }
    }
}

static void dq_q5_1(const void *src, float *y, int64_t n)
{
    for (const uint8_t *b = src; n > 0; n -= 32, b += 24, y += 32) {
        float d = f16_at(b), m = f16_at(b + 2);
        uint32_t qh = ld32(b + 4);
        const uint8_t *qs = b + 8;
        for (int j = 0; j < 16; j++) {
            int lo = (qs[j] & 0xf) | (int)(qh >> j & 1) << 4;
            int hi = (qs[j] >> 4) | (int)(qh >> (j + 16) & 1) << 4;
            y[j] = d * (float)lo + m;
            y[j + 16] = d * (float)hi + m;
        }
    }
}

static void dq_q8_0(const void *src, float *y, int64_t n)
{
    for (const uint8_t *b = src; n > 0; n -= 32, b += 34, y += 32) {
        float d = f16_at(b);
        for (int j = 0; j < 32; j++) y[j] = (float)(int8_t)b[2 + j] * d;
    }
}

/* The 2-bit field of value v (0..255) in a K-quant's qs[64]: each 32-byte half-block chunk
 * holds 128 values as four bit planes of 32. Shared by Q2_K and Q3_K. */
static int q2_at(const uint8_t *qs, int v) { return qs[32 * (v / 128) + v % 32] >> 2 * (v % 128 / 32) & 3; }

static void dq_q2_k(const void *src, float *y, int64_t n)
{
    for (const uint8_t *b = src; n > 0; n -= QK_K, b += 84, y += QK_K) {
        const uint8_t *scales = b, *qs = b + 16;
        float d = f16_at(b + 80), dmin = f16_at(b + 82);
        for (int s = 0; s < 16; s++) {
            float dl = d * (float)(scales[s] & 0xf), ml = dmin * (float)(scales[s] >> 4);
            for (int v = 16 * s; v < 16 * s + 16; v++) y[v] = dl * (float)q2_at(qs, v) - ml;
        }
    }
}

/* Q3_K's scale s (0..15), 6 bits stored with 32 added. */
static int q3k_scale(const uint8_t *sc, int s)
{
    int lo = s < 8 ? sc[s] & 0xf : sc[s - 8] >> 4;
    return (lo | (sc[8 + s % 4] >> 2 * (s / 4) & 3) << 4) - 32;
}

static void dq_q3_k(const void *src, float *y, int64_t n)
{
    for (const uint8_t *b = src; n > 0; n -= QK_K, b += 110, y += QK_K) {
        const uint8_t *hmask = b, *qs = b + 32, *scales = b + 96;
        float d = f16_at(b + 108);
        for (int s = 0; s < 16; s++) {
            float dl = d * (float)q3k_scale(scales, s);
            for (int v = 16 * s; v < 16 * s + 16; v++) {
                /* a set hmask bit means the value is the 2-bit field as is; clear, 4 below it */
                int q = q2_at(qs, v) - (hmask[v % 32] >> (v / 32) & 1 ? 0 : 4);
                y[v] = dl * (float)q;
            }
        }
    }
}

/* Q4_K's and Q5_K's 12 scale bytes hold eight 6-bit scales and eight 6-bit mins: bytes 0-3 are
 * the low six bits of scales 0-3, bytes 4-7 of mins 0-3; for j >= 4 the low four bits sit in
 * byte j+4 (scale low nibble, min high nibble) and the top two bits in the spare top bits of
 * bytes j-4 (scale) and j (min). */
static void k_scale_min(const uint8_t *s, int j, int *sc, int *m)
{
    if (j < 4) {
        *sc = s[j] & 63;
        *m = s[j + 4] & 63;
    } else {
        *sc = (s[j + 4] & 0xf) | (s[j - 4] >> 6) << 4;
        *m = (s[j + 4] >> 4) | (s[j] >> 6) << 4;
    }
}

/* Q4_K and Q5_K share everything but the fifth bit (qh == NULL for Q4_K). */
static void dq_k_with_mins(const uint8_t *b, const uint8_t *qh, const uint8_t *qs, float *y)
{
    float d = f16_at(b), dmin = f16_at(b + 2);
    for (int s = 0; s < 8; s++) {
        int sc, m;
        k_scale_min(b + 4, s, &sc, &m);
        float dl = d * (float)sc, ml = dmin * (float)m;
        for (int v = 32 * s; v < 32 * s + 32; v++) {
            int q = qs[32 * (v / 64) + v % 32] >> 4 * (v % 64 / 32) & 0xf;
            if (qh) q |= (qh[v % 32] >> (v / 32) & 1) << 4;
            y[v] = dl * (float)q - ml;
        }
    }
}

static void dq_q4_k(const void *src, float *y, int64_t n)
{
    for (const uint8_t *b = src; n > 0; n -= QK_K, b += 144, y += QK_K) dq_k_with_mins(b, NULL, b + 16, y);
}

static void dq_q5_k(const void *src, float *y, int64_t n)
{
    for (const uint8_t *b = src; n > 0; n -= QK_K, b += 176, y += QK_K) dq_k_with_mins(b, b + 16, b + 48, y);
}

/* Q6_K: each half of 128 values uses 64 ql bytes and 32 qh bytes: for l < 32, values l, l+32,
 * l+64, l+96 take the low nibble of ql[l], of ql[l+32], the high nibble of ql[l], of ql[l+32],
 * and bit pairs 0-1, 2-3, 4-5, 6-7 of qh[l]. Sixteen values share a scale. */
static void dq_q6_k(const void *src, float *y, int64_t n)
{
    for (const uint8_t *b = src; n > 0; n -= QK_K, b += 210) {
        const uint8_t *ql = b, *qh = b + 128;
        const int8_t *sc = (const int8_t *)(b + 192);
        float d = f16_at(b + 208);
        for (int h = 0; h < 2; h++, ql += 64, qh += 32, sc += 8, y += 128) {
            for (int l = 0; l < 32; l++) {
                int s = l / 16;
                int q1 = ((ql[l] & 0xf) | (qh[l] & 3) << 4) - 32;
                int q2 = ((ql[l + 32] & 0xf) | (qh[l] >> 2 & 3) << 4) - 32;
                int q3 = ((ql[l] >> 4) | (qh[l] >> 4 & 3) << 4) - 32;
                int q4 = ((ql[l + 32] >> 4) | (qh[l] >> 6 & 3) << 4) - 32;
                y[l] = d * (float)sc[s] * (float)q1;
                y[l + 32] = d * (float)sc[s + 2] * (float)q2;
                y[l + 64] = d * (float)sc[s + 4] * (float)q3;
                y[l + 96] = d * (float)sc[s + 6] * (float)q4;
            }
        }
    }
}

/* 32 values from 16 bytes of IQ4 codes (Q4_0's nibble order) with step dl. */
static void dq_iq4_32(const uint8_t *qs, float dl, float *y)
{
    for (int j = 0; j < 16; j++) {
        y[j] = dl * (float)KVALUES_IQ4NL[qs[j] & 0xf];
        y[j + 16] = dl * (float)KVALUES_IQ4NL[qs[j] >> 4];
    }
}

static void dq_iq4_nl(const void *src, float *y, int64_t n)
{
    for (const uint8_t *b = src; n > 0; n -= 32, b += 18, y += 32) dq_iq4_32(b + 2, f16_at(b), y);
}

static void dq_iq4_xs(const void *src, float *y, int64_t n)
{
    for (const uint8_t *b = src; n > 0; n -= QK_K, b += 136, y += QK_K) {
        float d = f16_at(b);
        unsigned scales_h = ld16(b + 2);
        const uint8_t *scales_l = b + 4, *qs = b + 8;
        for (int s = 0; s < 8; s++) {
            int ls = (scales_l[s / 2] >> 4 * (s % 2) & 0xf) | (int)(scales_h >> 2 * s & 3) << 4;
            dq_iq4_32(qs + 16 * s, d * (float)(ls - 32), y + 32 * s);
        }
    }
}

/* ---- reference quantisers --------------------------------------------------------------------
 *
 * For fixtures and tests: simple, valid for any reader, never clipping (but for Q4_0/Q5_0's
 * extreme, as in ggml). Steps are rounded up, not to nearest, wherever a rounded-down step would
 * push the largest value past the top code. */

static int clampi(int v, int lo, int hi) { return v < lo ? lo : v > hi ? hi : v; }

/* A non-negative scale as f16, rounded up so that x / scale never exceeds the intended range. */
static uint16_t f16_up(float v)
{
    uint16_t h = gguf_f32_to_f16(v);
    if (gguf_f16_to_f32(h) < v && h < 0x7bff) h++;
    return h;
}

/* Signed: the magnitude rounded up, the sign kept. */
static uint16_t f16_away(float v) { return (uint16_t)(f16_up(fabsf(v)) | (v < 0 ? 0x8000 : 0)); }

static void q_f32(const float *x, void *dst, int64_t n) { memcpy(dst, x, (size_t)n * 4); }

static void q_f16(const float *x, void *dst, int64_t n)
{
    for (int64_t i = 0; i < n; i++) st16((uint8_t *)dst + 2 * i, gguf_f32_to_f16(x[i]));
}

static void q_bf16(const float *x, void *dst, int64_t n)
{
    for (int64_t i = 0; i < n; i++) st16((uint8_t *)dst + 2 * i, gguf_f32_to_bf16(x[i]));
}

/* 32 codes (each below 16) into 16 bytes, value j in the low nibble of byte j, j+16 high. */
static void put_nibbles32(uint8_t *qs, const int *q)
{
    for (int j = 0; j < 16; j++) qs[j] = (uint8_t)((q[j] & 0xf) | (q[j + 16] & 0xf) << 4);
}

/* Q4_0 / Q5_0: the value of largest magnitude maps to the lowest code, the one with no positive
 * twin; levels = 16 or 32. */
static void q_sym_offset(const float *x, uint8_t *b, int levels)
{
    float amax = 0, max = 0;
    for (int j = 0; j < 32; j++)
        if (fabsf(x[j]) > amax) amax = fabsf(x[j]), max = x[j];
    uint16_t dh = gguf_f32_to_f16(max / (float)(-levels / 2));
    float d = gguf_f16_to_f32(dh), id = d != 0 ? 1 / d : 0;
    int q[32];
    for (int j = 0; j < 32; j++) q[j] = clampi((int)lrintf(x[j] * id) + levels / 2, 0, levels - 1);
    st16(b, dh);
    if (levels == 16) {
        put_nibbles32(b + 2, q);
        return;
    }
    uint32_t qh = 0;
    for (int j = 0; j < 32; j++) qh |= (uint32_t)(q[j] >> 4) << j;
    st32(b + 2, qh);
    put_nibbles32(b + 6, q);
}

/* Q4_1 / Q5_1: y = d * q + m over [lo, hi]. */
static void q_min(const float *x, uint8_t *b, int levels)
{
    float lo = x[0], hi = x[0];
    for (int j = 1; j < 32; j++) lo = fminf(lo, x[j]), hi = fmaxf(hi, x[j]);
    uint16_t dh = f16_up((hi - lo) / (float)(levels - 1)), mh = gguf_f32_to_f16(lo);
    float d = gguf_f16_to_f32(dh), m = gguf_f16_to_f32(mh), id = d != 0 ? 1 / d : 0;
    int q[32];
    for (int j = 0; j < 32; j++) q[j] = clampi((int)lrintf((x[j] - m) * id), 0, levels - 1);
    st16(b, dh);
    st16(b + 2, mh);
    if (levels == 16) {
        put_nibbles32(b + 4, q);
        return;
    }
    uint32_t qh = 0;
    for (int j = 0; j < 32; j++) qh |= (uint32_t)(q[j] >> 4) << j;
    st32(b + 4, qh);
    put_nibbles32(b + 8, q);
}

static void q_q4_0(const float *x, void *dst, int64_t n)
{
    for (uint8_t *b = dst; n > 0; n -= 32, b += 18, x += 32) q_sym_offset(x, b, 16);
}

static void q_q5_0(const float *x, void *dst, int64_t n)
{
    for (uint8_t *b = dst; n > 0; n -= 32, b += 22, x += 32) q_sym_offset(x, b, 32);
}

static void q_q4_1(const float *x, void *dst, int64_t n)
{
    for (uint8_t *b = dst; n > 0; n -= 32, b += 20, x += 32) q_min(x, b, 16);
}

static void q_q5_1(const float *x, void *dst, int64_t n)
{
    for (uint8_t *b = dst; n > 0; n -= 32, b += 24, x += 32) q_min(x, b, 32);
}

static void q_q8_0(const float *x, void *dst, int64_t n)
{
    for (uint8_t *b = dst; n > 0; n -= 32, b += 34, x += 32) {
        float amax = 0;
        for (int j = 0; j < 32; j++) amax = fmaxf(amax, fabsf(x[j]));
        uint16_t dh = f16_up(amax / 127);
        float d = gguf_f16_to_f32(dh), id = d != 0 ? 1 / d : 0;
        st16(b, dh);
        for (int j = 0; j < 32; j++) b[2 + j] = (uint8_t)(int8_t)clampi((int)lrintf(x[j] * id), -127, 127);
    }
}

/* A super-block with mins (Q2_K, Q4_K, Q5_K), simply: sub-block s of len values covers
 * [min(0, lo), hi]; its min (a non-negative offset) and its scale are quantised to 0..smax
 * against the super-block's largest, the min rounded up and the scale rounded up to cover what
 * the rounded min moved. Fills the f16 d and dmin, scales, mins and codes 0..qmax. */
typedef struct kq { uint16_t dh, dminh; int sc[16], m[16]; uint8_t q[QK_K]; } kq;

static void kq_with_mins(const float *x, int len, int smax, int qmax, kq *k)
{
    const int nsub = QK_K / len;
    float off[16], need[16], scale[16], maxoff = 0, maxscale = 0;
    for (int s = 0; s < nsub; s++) {
        float lo = 0, hi = 0;
        for (int l = 0; l < len; l++) lo = fminf(lo, x[len * s + l]), hi = fmaxf(hi, x[len * s + l]);
        off[s] = -lo;
        need[s] = hi - lo;
        maxoff = fmaxf(maxoff, off[s]);
    }
    k->dminh = f16_up(maxoff / (float)smax);
    float dmin = gguf_f16_to_f32(k->dminh);
    for (int s = 0; s < nsub; s++) {
        k->m[s] = dmin > 0 ? clampi((int)ceilf(off[s] / dmin), 0, smax) : 0;
        /* with the min rounded up, the top of the range moved up by the same amount */
        scale[s] = (need[s] + (dmin * (float)k->m[s] - off[s])) / (float)qmax;
        maxscale = fmaxf(maxscale, scale[s]);
    }
    k->dh = f16_up(maxscale / (float)smax);
    float d = gguf_f16_to_f32(k->dh);
    for (int s = 0; s < nsub; s++) k->sc[s] = d > 0 ? clampi((int)ceilf(scale[s] / d), 0, smax) : 0;
    for (int i = 0; i < QK_K; i++) {
        float ds = d * (float)k->sc[i / len], dm = dmin * (float)k->m[i / len];
        k->q[i] = (uint8_t)(ds > 0 ? clampi((int)lrintf((x[i] + dm) / ds), 0, qmax) : 0);
    }
}

static void q_q2_k(const float *x, void *dst, int64_t n)
{
    for (uint8_t *b = dst; n > 0; n -= QK_K, b += 84, x += QK_K) {
        kq k;
        kq_with_mins(x, 16, 15, 3, &k);
        memset(b, 0, 84);
        for (int s = 0; s < 16; s++) b[s] = (uint8_t)(k.sc[s] | k.m[s] << 4);
        for (int v = 0; v < QK_K; v++) b[16 + 32 * (v / 128) + v % 32] |= (uint8_t)(k.q[v] << 2 * (v % 128 / 32));
        st16(b + 80, k.dh);
        st16(b + 82, k.dminh);
    }
}

/* The 12 bytes of eight 6-bit scales and mins, as k_scale_min reads them. */
static void k_pack_scales(uint8_t *p, const int *sc, const int *m)
{
    for (int j = 0; j < 4; j++) {
        p[j] = (uint8_t)((sc[j] & 63) | (sc[j + 4] >> 4) << 6);
        p[j + 4] = (uint8_t)((m[j] & 63) | (m[j + 4] >> 4) << 6);
        p[j + 8] = (uint8_t)((sc[j + 4] & 0xf) | (m[j + 4] & 0xf) << 4);
    }
}

/* Q4_K and Q5_K (qh != NULL): the low nibbles as dq_k_with_mins reads them, the fifth bit in qh. */
static void k_pack_codes(const uint8_t *q, uint8_t *qh, uint8_t *qs)
{
    memset(qs, 0, QK_K / 2);
    if (qh) memset(qh, 0, QK_K / 8);
    for (int v = 0; v < QK_K; v++) {
        qs[32 * (v / 64) + v % 32] |= (uint8_t)((q[v] & 0xf) << 4 * (v % 64 / 32));
        if (qh) qh[v % 32] |= (uint8_t)((q[v] >> 4) << (v / 32));
    }
}

static void q_q4_k(const float *x, void *dst, int64_t n)
{
    for (uint8_t *b = dst; n > 0; n -= QK_K, b += 144, x += QK_K) {
        kq k;
        kq_with_mins(x, 32, 63, 15, &k);
        st16(b, k.dh);
        st16(b + 2, k.dminh);
        k_pack_scales(b + 4, k.sc, k.m);
        k_pack_codes(k.q, NULL, b + 16);
    }
}

static void q_q5_k(const float *x, void *dst, int64_t n)
{
    for (uint8_t *b = dst; n > 0; n -= QK_K, b += 176, x += QK_K) {
        kq k;
        kq_with_mins(x, 32, 63, 31, &k);
        st16(b, k.dh);
        st16(b + 2, k.dminh);
        k_pack_scales(b + 4, k.sc, k.m);
        k_pack_codes(k.q, b + 16, b + 48);
    }
}

/* Symmetric super-blocks (Q3_K, Q6_K): sixteen sub-blocks of 16, each with a step that maps its
 * largest magnitude to qmax; steps quantised to 0..smax against the largest, rounded up. */
static void ks_symmetric(const float *x, int qmax, int smax, uint16_t *dh, int *sc)
{
    float want[16], maxw = 0;
    for (int s = 0; s < 16; s++) {
        float amax = 0;
        for (int l = 0; l < 16; l++) amax = fmaxf(amax, fabsf(x[16 * s + l]));
        want[s] = amax / (float)qmax;
        maxw = fmaxf(maxw, want[s]);
    }
    *dh = f16_up(maxw / (float)smax);
    float d = gguf_f16_to_f32(*dh);
    for (int s = 0; s < 16; s++) sc[s] = d > 0 ? clampi((int)ceilf(want[s] / d), 0, smax) : 0;
}

/* Q3_K: codes -3..3 of the -4..3 range (the largest magnitude maps to 3, so -4 stays unused). */
static void q_q3_k(const float *x, void *dst, int64_t n)
{
    for (uint8_t *b = dst; n > 0; n -= QK_K, b += 110, x += QK_K) {
        uint16_t dh;
        int sc[16];
        ks_symmetric(x, 3, 31, &dh, sc);
        float d = gguf_f16_to_f32(dh);
        memset(b, 0, 110);
        uint8_t *hmask = b, *qs = b + 32, *scales = b + 96;
        for (int s = 0; s < 16; s++) {
            int u = sc[s] + 32;                                        /* stored 6-bit value */
            scales[s % 8] |= (uint8_t)((u & 0xf) << 4 * (s / 8));
            scales[8 + s % 4] |= (uint8_t)((u >> 4) << 2 * (s / 4));
        }
        for (int v = 0; v < QK_K; v++) {
            float ds = d * (float)sc[v / 16];
            int u = (ds > 0 ? clampi((int)lrintf(x[v] / ds), -4, 3) : 0) + 4;   /* 0..7 */
            qs[32 * (v / 128) + v % 32] |= (uint8_t)((u & 3) << 2 * (v % 128 / 32));
            hmask[v % 32] |= (uint8_t)((u >> 2) << (v / 32));
        }
        st16(b + 108, dh);
    }
}

/* Q6_K: codes -31..31, int8 scales 0..127. */
static void q_q6_k(const float *x, void *dst, int64_t n)
{
    for (uint8_t *b = dst; n > 0; n -= QK_K, b += 210, x += QK_K) {
        uint16_t dh;
        int sc[16];
        ks_symmetric(x, 31, 127, &dh, sc);
        float d = gguf_f16_to_f32(dh);
        uint8_t *ql = b, *qh = b + 128;
        memset(b, 0, 192);
        for (int s = 0; s < 16; s++) b[192 + s] = (uint8_t)(int8_t)sc[s];
        st16(b + 208, dh);
        for (int i = 0; i < QK_K; i++) {
            float ds = d * (float)sc[i / 16];
            int q = (ds > 0 ? clampi((int)lrintf(x[i] / ds), -32, 31) : 0) + 32;
            int h = i / 128, r = i % 128;
            ql[64 * h + r % 64] |= (uint8_t)((q & 0xf) << 4 * (r / 64));
            qh[32 * h + r % 32] |= (uint8_t)((q >> 4) << 2 * (r / 32));
        }
    }
}

/* IQ4: the code whose table value is nearest x / dl. With dl = extreme / 113 every ratio lies
 * in [-113, 113], inside the table's [-127, 113]: nothing clips, the error is at most half the
 * widest gap (89 to 113) times dl. */
static int iq4_nearest(float t)
{
    int best = 0;
    for (int k = 1; k < 16; k++)
        if (fabsf(t - (float)KVALUES_IQ4NL[k]) < fabsf(t - (float)KVALUES_IQ4NL[best])) best = k;
    return best;
}

static void iq4_codes32(const float *x, float dl, uint8_t *qs)
{
    int q[32];
    for (int j = 0; j < 32; j++) q[j] = dl != 0 ? iq4_nearest(x[j] / dl) : 8;
    put_nibbles32(qs, q);
}

/* The value of largest magnitude in x[0..n), with its sign. */
static float extreme(const float *x, int n)
{
    float e = 0;
    for (int j = 0; j < n; j++)
        if (fabsf(x[j]) > fabsf(e)) e = x[j];
    return e;
}

static void q_iq4_nl(const float *x, void *dst, int64_t n)
{
    for (uint8_t *b = dst; n > 0; n -= 32, b += 18, x += 32) {
        uint16_t dh = f16_away(extreme(x, 32) / 113);
        st16(b, dh);
        iq4_codes32(x, gguf_f16_to_f32(dh), b + 2);
    }
}

/* IQ4_XS: sub-block steps want = extreme / 113 (signed), as d * (ls - 32) with ls - 32 in
 * -31..31, the magnitude rounded up. */
static void q_iq4_xs(const float *x, void *dst, int64_t n)
{
    for (uint8_t *b = dst; n > 0; n -= QK_K, b += 136, x += QK_K) {
        float want[8], maxw = 0;
        for (int s = 0; s < 8; s++) want[s] = extreme(x + 32 * s, 32) / 113, maxw = fmaxf(maxw, fabsf(want[s]));
        uint16_t dh = f16_up(maxw / 31);
        float d = gguf_f16_to_f32(dh);
        unsigned scales_h = 0;
        memset(b + 4, 0, 4);
        for (int s = 0; s < 8; s++) {
            int ls = d > 0 ? clampi((int)ceilf(fabsf(want[s]) / d), 0, 31) : 0;
            if (want[s] < 0) ls = -ls;
            int u = ls + 32;
            b[4 + s / 2] |= (uint8_t)((u & 0xf) << 4 * (s % 2));
            scales_h |= (unsigned)(u >> 4) << 2 * s;
            iq4_codes32(x + 32 * s, d * (float)ls, b + 8 + 16 * s);
        }
        st16(b, dh);
        st16(b + 2, (uint16_t)scales_h);
    }
}

/* ---- types --------------------------------------------------------------------------------
 *
 * The one table of per-type facts, indexed by type number; a row without a name is a type this
 * file does not read (Q8_1/Q8_K are ggml's internal types; the other IQ types need large grids). */

#define SCALES0 0, { 0, 0 }
#define SCALES1(a) 1, { a, 0 }
#define SCALES2(a, b) 2, { a, b }

static const gguf_type_traits TRAITS[GGUF_TYPE_COUNT] = {
    [GGUF_TYPE_F32]    = { "F32",    1,    4,   SCALES0,          dq_f32,    q_f32 },
    [GGUF_TYPE_F16]    = { "F16",    1,    2,   SCALES0,          dq_f16,    q_f16 },
    [GGUF_TYPE_BF16]   = { "BF16",   1,    2,   SCALES0,          dq_bf16,   q_bf16 },
    [GGUF_TYPE_Q4_0]   = { "Q4_0",   32,   18,  SCALES1(0),       dq_q4_0,   q_q4_0 },
    [GGUF_TYPE_Q4_1]   = { "Q4_1",   32,   20,  SCALES2(0, 2),    dq_q4_1,   q_q4_1 },
    [GGUF_TYPE_Q5_0]   = { "Q5_0",   32,   22,  SCALES1(0),       dq_q5_0,   q_q5_0 },
    [GGUF_TYPE_Q5_1]   = { "Q5_1",   32,   24,  SCALES2(0, 2),    dq_q5_1,   q_q5_1 },
    [GGUF_TYPE_Q8_0]   = { "Q8_0",   32,   34,  SCALES1(0),       dq_q8_0,   q_q8_0 },
    [GGUF_TYPE_Q2_K]   = { "Q2_K",   QK_K, 84,  SCALES2(80, 82),  dq_q2_k,   q_q2_k },
    [GGUF_TYPE_Q3_K]   = { "Q3_K",   QK_K, 110, SCALES1(108),     dq_q3_k,   q_q3_k },
    [GGUF_TYPE_Q4_K]   = { "Q4_K",   QK_K, 144, SCALES2(0, 2),    dq_q4_k,   q_q4_k },
    [GGUF_TYPE_Q5_K]   = { "Q5_K",   QK_K, 176, SCALES2(0, 2),    dq_q5_k,   q_q5_k },
    [GGUF_TYPE_Q6_K]   = { "Q6_K",   QK_K, 210, SCALES1(208),     dq_q6_k,   q_q6_k },
    [GGUF_TYPE_IQ4_NL] = { "IQ4_NL", 32,   18,  SCALES1(0),       dq_iq4_nl, q_iq4_nl },
    [GGUF_TYPE_IQ4_XS] = { "IQ4_XS", QK_K, 136, SCALES1(0),       dq_iq4_xs, q_iq4_xs },
};

const gguf_type_traits *gguf_type_traits_of(uint32_t type)
{
    return type < GGUF_TYPE_COUNT && TRAITS[type].name ? &TRAITS[type] : NULL;
}

const char *gguf_type_name(uint32_t type)
{
    const gguf_type_traits *t = gguf_type_traits_of(type);
    return t ? t->name : NULL;
}

int gguf_type_known(uint32_t type) { return gguf_type_traits_of(type) != NULL; }

int64_t gguf_type_block(uint32_t type)
{
    const gguf_type_traits *t = gguf_type_traits_of(type);
    return t ? t->block : 0;
}

size_t gguf_type_block_bytes(uint32_t type)
{
    const gguf_type_traits *t = gguf_type_traits_of(type);
    return t ? t->bytes : 0;
}

size_t gguf_row_bytes(uint32_t type, int64_t n)
{
    const gguf_type_traits *t = gguf_type_traits_of(type);
    if (!t || n < 0) return 0;
    return (size_t)(n / t->block) * t->bytes;
}

void gguf_dequant(uint32_t type, const void *src, float *dst, int64_t n)
{
    const gguf_type_traits *t = gguf_type_traits_of(type);
    assert(t && n % t->block == 0);
    if (t && n > 0) t->to_float(src, dst, n);
}

void gguf_quantize(uint32_t type, const float *src, void *dst, int64_t n)
{
    const gguf_type_traits *t = gguf_type_traits_of(type);
    assert(t && t->from_float_ref && n % t->block == 0);
    if (t && t->from_float_ref && n > 0) t->from_float_ref(src, dst, n);
}

/* ---- writer ------------------------------------------------------------------------------------ */

typedef struct bytes { uint8_t *p; size_t len, cap; } bytes;

typedef struct wtensor {
    char *name;
    uint32_t type, n_dims;
    int64_t ne[4];
    uint8_t *data;
    uint64_t nbytes, offset;
} wtensor;

struct gguf_writer {
    bytes kv;                 /* encoded metadata entries in insertion order */
    uint64_t n_kv;
    wtensor *t;
    size_t n_t, cap_t;
    uint32_t alignment;
    int failed;               /* first error, reported by gguf_writer_write */
    char error[FASA_ERRLEN];
};

static void w_fail(gguf_writer *w, int status, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void w_fail(gguf_writer *w, int status, const char *fmt, ...)
{
    if (w->failed) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(w->error, sizeof w->error, fmt, ap);
    va_end(ap);
    w->failed = status;
}

static uint8_t *b_grow(gguf_writer *w, bytes *b, size_t n)
{
    if (w->failed) return NULL;
    if (n > b->cap - b->len) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap - b->len < n) {
            if (cap > SIZE_MAX / 2) { w_fail(w, FASA_ENOMEM, "out of memory"); return NULL; }
            cap *= 2;
        }
        uint8_t *p = realloc(b->p, cap);
        if (!p) { w_fail(w, FASA_ENOMEM, "out of memory"); return NULL; }
        b->p = p;
        b->cap = cap;
    }
    uint8_t *at = b->p + b->len;
    b->len += n;
    return at;
}

static void b_put(gguf_writer *w, bytes *b, const void *src, size_t n)
{
    uint8_t *at = b_grow(w, b, n);
    if (at && n) memcpy(at, src, n);
}
static void b_u32(gguf_writer *w, bytes *b, uint32_t v)
{
    uint8_t *at = b_grow(w, b, 4);
    if (at) st32(at, v);
}

static void b_u64(gguf_writer *w, bytes *b, uint64_t v)
{
    uint8_t *at = b_grow(w, b, 8);
    if (at) st64(at, v);
}
static void b_str(gguf_writer *w, bytes *b, const char *s)
{
    size_t n = strlen(s);
    b_u64(w, b, n);
    b_put(w, b, s, n);
}

gguf_writer *gguf_writer_new(void)
{
    gguf_writer *w = calloc(1, sizeof *w);
    if (w) w->alignment = GGUF_DEFAULT_ALIGNMENT;
    return w;
}

void gguf_writer_free(gguf_writer *w)
{
    if (!w) return;
    for (size_t i = 0; i < w->n_t; i++) free(w->t[i].name), free(w->t[i].data);
    free(w->t);
    free(w->kv.p);
    free(w);
}

void gguf_w_value(gguf_writer *w, const char *key, uint32_t vtype, const void *value, size_t nbytes)
{
    if (strcmp(key, "general.alignment") == 0) {
        uint32_t v = vtype == GGUF_VT_U32 && nbytes == 4 ? ld32(value) : 0;
        if (v == 0 || (v & (v - 1)))
            w_fail(w, FASA_EARG, "general.alignment must be a u32 power of two");
        else
            w->alignment = v;
    }
    b_str(w, &w->kv, key);
    b_u32(w, &w->kv, vtype);
    b_put(w, &w->kv, value, nbytes);
    w->n_kv++;
}

void gguf_w_u32(gguf_writer *w, const char *key, uint32_t v)
{
    uint8_t b[4];
    st32(b, v);
    gguf_w_value(w, key, GGUF_VT_U32, b, 4);
}

void gguf_w_f32(gguf_writer *w, const char *key, float v)
{
    uint8_t b[4];
    st32(b, f32_bits(v));
    gguf_w_value(w, key, GGUF_VT_F32, b, 4);
}

void gguf_w_bool(gguf_writer *w, const char *key, int v)
{
    uint8_t b = v != 0;
    gguf_w_value(w, key, GGUF_VT_BOOL, &b, 1);
}

void gguf_w_str(gguf_writer *w, const char *key, const char *v)
{
    b_str(w, &w->kv, key);
    b_u32(w, &w->kv, GGUF_VT_STRING);
    b_str(w, &w->kv, v);
    w->n_kv++;
}

static void w_arr_head(gguf_writer *w, const char *key, uint32_t et, uint64_t n)
{
    b_str(w, &w->kv, key);
    b_u32(w, &w->kv, GGUF_VT_ARRAY);
    b_u32(w, &w->kv, et);
    b_u64(w, &w->kv, n);
    w->n_kv++;
}

void gguf_w_arr_str(gguf_writer *w, const char *key, const char *const *v, uint64_t n)
{
    w_arr_head(w, key, GGUF_VT_STRING, n);
    for (uint64_t i = 0; i < n; i++) b_str(w, &w->kv, v[i]);
}

void gguf_w_arr_i32(gguf_writer *w, const char *key, const int32_t *v, uint64_t n)
{
    w_arr_head(w, key, GGUF_VT_I32, n);
    for (uint64_t i = 0; i < n; i++) b_u32(w, &w->kv, (uint32_t)v[i]);
}

void gguf_w_arr_f32(gguf_writer *w, const char *key, const float *v, uint64_t n)
{
    w_arr_head(w, key, GGUF_VT_F32, n);
    for (uint64_t i = 0; i < n; i++) b_u32(w, &w->kv, f32_bits(v[i]));
}

void gguf_w_tensor(gguf_writer *w, const char *name, uint32_t type, uint32_t n_dims,
                   const int64_t *ne, const void *data)
{
    if (w->failed) return;
    const gguf_type_traits *ti = gguf_type_traits_of(type);
    if (!ti) { w_fail(w, FASA_EARG, "tensor '%s' has unsupported type %u", name, type); return; }
    if (n_dims < 1 || n_dims > 4) {
        w_fail(w, FASA_EARG, "tensor '%s' has %u dimensions (need 1 to 4)", name, n_dims);
        return;
    }
    wtensor t = { .type = type, .n_dims = n_dims, .ne = { 1, 1, 1, 1 } };
    int64_t rows = 1;
    for (uint32_t d = 0; d < n_dims; d++) {
        if (ne[d] < 1) {
            w_fail(w, FASA_EARG, "tensor '%s' has dimension %u of size %lld", name, d, (long long)ne[d]);
            return;
        }
        t.ne[d] = ne[d];
        if (d > 0 && __builtin_mul_overflow(rows, ne[d], &rows)) {
            w_fail(w, FASA_EARG, "tensor '%s' is too large", name);
            return;
        }
    }
    if (t.ne[0] % ti->block) {
        w_fail(w, FASA_EARG, "tensor '%s' has ne[0] = %lld, not a multiple of the %s block size %lld",
               name, (long long)t.ne[0], ti->name, (long long)ti->block);
        return;
    }
    if (__builtin_mul_overflow((uint64_t)gguf_row_bytes(type, t.ne[0]), (uint64_t)rows, &t.nbytes) ||
        t.nbytes > SIZE_MAX) {
        w_fail(w, FASA_EARG, "tensor '%s' is too large", name);
        return;
    }
    if (w->n_t == w->cap_t) {
        size_t cap = w->cap_t ? 2 * w->cap_t : 16;
        wtensor *p = realloc(w->t, cap * sizeof *p);
        if (!p) { w_fail(w, FASA_ENOMEM, "out of memory"); return; }
        w->t = p;
        w->cap_t = cap;
    }
    t.name = strdup(name);
    t.data = malloc(t.nbytes ? (size_t)t.nbytes : 1);
    if (!t.name || !t.data) {
        free(t.name), free(t.data);
        w_fail(w, FASA_ENOMEM, "out of memory for tensor '%s'", name);
        return;
    }
    memcpy(t.data, data, (size_t)t.nbytes);
    w->t[w->n_t++] = t;
}

static void b_pad(gguf_writer *w, bytes *b, uint64_t align)
{
    size_t pad = (size_t)((align - b->len % align) % align);
    uint8_t *at = b_grow(w, b, pad);
    if (at) memset(at, 0, pad);
}

int gguf_writer_bytes(gguf_writer *w, uint8_t **out, size_t *len, char *err)
{
    *out = NULL;
    *len = 0;
    bytes b = { 0 };
    b_put(w, &b, "GGUF", 4);
    b_u32(w, &b, 3);
    b_u64(w, &b, w->n_t);
    b_u64(w, &b, w->n_kv);
    b_put(w, &b, w->kv.p, w->kv.len);
    uint64_t off = 0;
    for (size_t i = 0; i < w->n_t; i++) {
        wtensor *t = &w->t[i];
        t->offset = off;
        off = (off + t->nbytes + w->alignment - 1) / w->alignment * w->alignment;
        b_str(w, &b, t->name);
        b_u32(w, &b, t->n_dims);
        for (uint32_t d = 0; d < t->n_dims; d++) b_u64(w, &b, (uint64_t)t->ne[d]);
        b_u32(w, &b, t->type);
        b_u64(w, &b, t->offset);
    }
    b_pad(w, &b, w->alignment);
    for (size_t i = 0; i < w->n_t; i++) {
        b_put(w, &b, w->t[i].data, (size_t)w->t[i].nbytes);
        b_pad(w, &b, w->alignment);
    }
    if (w->failed) {
        free(b.p);
        return fasa_error(err, w->failed, "gguf writer: %s", w->error);
    }
    /* What we emit must be what we accept: duplicate keys or names are caught here. */
    gguf_file g;
    int st = gguf_parse(&g, b.p, b.len, err);
    if (st < 0) {
        free(b.p);
        return st;
    }
    gguf_close(&g);
    *out = b.p;
    *len = b.len;
    return 0;
}

int gguf_writer_write(gguf_writer *w, const char *path, char *err)
{
    uint8_t *buf;
    size_t len;
    char msg[FASA_ERRLEN];
    int st = gguf_writer_bytes(w, &buf, &len, msg);
    if (st < 0) return fasa_error(err, st, "cannot write '%s': %s", path, msg);

    st = fasa_write_file(path, buf, len, err);
    free(buf);
    return st;
}

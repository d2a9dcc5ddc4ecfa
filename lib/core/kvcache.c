#include "kvcache.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "base.h"
#include "ops.h"
#include "simd.h"

/* The cold tier: one file under dir, unlinked as soon as it is open, mapped shared. Pages are
 * written as tokens arrive and read back only for the rows attention chooses; the kernel may
 * write them out and drop them under memory pressure, which is the point. */
static void *cold_map(const char *dir, size_t len, char *err)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/fasa-kv-XXXXXX", dir);
    int fd = mkstemp(path);
    if (fd < 0) {
        fasa_error(err, FASA_EIO, "cannot create the cold KV tier in '%s': %s", dir, strerror(errno));
        return NULL;
    }
    unlink(path);
    if (ftruncate(fd, (off_t)len) != 0) {
        fasa_error(err, FASA_EIO, "cannot size the cold KV tier in '%s' to %zu bytes: %s", dir, len, strerror(errno));
        close(fd);
        return NULL;
    }
    void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (p == MAP_FAILED) {
        fasa_error(err, FASA_EIO, "cannot map the cold KV tier in '%s': %s", dir, strerror(errno));
        return NULL;
    }
    madvise(p, len, MADV_RANDOM);   /* rows are read scattered: no readahead around them */
    return p;
}

/* The cache's arrays, on transparent huge pages where the kernel gives them (madvise mode, as on
 * these machines): TIP streams the dominant block and focused attention gathers rows scattered
 * over the rest, and with 4 KiB pages both paid for TLB misses. At 8k (f16, 2 threads, after a
 * real 4096-token prefill) TIP took 2.4-2.5 ms per token in 3 runs of 3; on huge pages 0.91-0.95
 * ms, and the decode step 10.8-11.1 -> 8.5 ms. The cost: a huge page is committed when its first
 * row is written, and it holds rows of several (layer, head) regions, so the cache's resident
 * size follows n_ctx rather than the tokens cached so far. */
static void *kv_alloc(size_t n)
{
    void *p = NULL;
    if (posix_memalign(&p, (size_t)2 << 20, n ? n : 1)) return NULL;
    if (n >= (size_t)2 << 20) madvise(p, n, MADV_HUGEPAGE);   /* advice only: ignored where unsupported */
    return p;
}

int kvcache_init(kvcache *kv, int n_layer, int n_kv_head, int n_ctx, int d_head, const kv_opts *o, char *err)
{
    const int split = o ? o->n_split : 0;
    const char *cold_dir = o ? o->cold_dir : NULL;
    *kv = (kvcache){ .n_layer = n_layer, .n_kv_head = n_kv_head, .n_ctx = n_ctx, .d_head = d_head, .n_split = split,
                     .f16 = o && o->f16 };
    const size_t es = kvcache_esz(kv);
    const int tw = o ? o->tip_width : 0;
    if (split < 0 || split >= d_head || split % 2)
        return fasa_error(err, FASA_EARG, "the dominant key block must be an even width below %d dims, not %d", d_head,
                          split);
    if (tw < 0 || tw % 8 || tw > d_head + 8 || (tw && (split || !o->tip_map)))
        return fasa_error(err, FASA_EARG, "a TIP copy needs whole key rows, a map and a width of 8k dims, not %d", tw);
    if (cold_dir && !split && !tw) return fasa_error(err, FASA_EARG, "a cold KV tier needs split keys or a TIP copy");
    const size_t rows = (size_t)n_layer * n_kv_head * n_ctx;
    const size_t nk = rows * kvcache_kw(kv), nr = split ? rows * (d_head - split) : 0, nv = rows * d_head;
    if (tw) {
        kv->tip_width = tw;
        kv->n_tiles = (n_ctx + 15) / 16;
        const size_t heads = (size_t)n_layer * n_kv_head, tiles = heads * kv->n_tiles;
        kv->tip_map = malloc(heads * tw * sizeof *kv->tip_map);
        kv->tip_w = malloc(heads * sizeof *kv->tip_w);
        kv->tip_at = malloc(heads * sizeof *kv->tip_at);
        if (!kv->tip_map || !kv->tip_w || !kv->tip_at) {
            kvcache_free(kv);
            return fasa_error(err, FASA_ENOMEM, "out of memory");
        }
        memcpy(kv->tip_map, o->tip_map, heads * tw * sizeof *kv->tip_map);
        kv->tip_id = kvcache_tip_map_id(kv->tip_map, heads * tw);
        for (size_t i = 0; i < heads * tw; i++)
            if (kv->tip_map[i] >= d_head) {
                kvcache_free(kv);
                return fasa_error(err, FASA_EARG, "the TIP copy maps dim %d of a %d-dim key", kv->tip_map[i], d_head);
            }
        /* each (layer, head) as wide as its map needs (the unions of the default model's groups
         * hold 16 to 38 dims, 26 at the median: 40 for all read 30% more) */
        size_t at = 0;
        for (size_t lh = 0; lh < heads; lh++) {
            kv->tip_w[lh] = kvcache_tip_w(kv->tip_map + lh * tw, tw), kv->tip_at[lh] = at;
            at += (size_t)kv->n_tiles * (kv->tip_w[lh] / 8) * 64;
        }
        kv->tq = kv_alloc(at);
        kv->tscale = kv_alloc(tiles * 16 * sizeof *kv->tscale);
        kv->n_spans = kvcache_tip_span(n_ctx - 1) + 1;
        kv->toff = calloc(heads * kv->n_spans * tw, sizeof *kv->toff);   /* the first span's: none */
        kv->tset = calloc(heads * kv->n_spans, 1);
        if (!kv->tq || !kv->tscale || !kv->toff || !kv->tset) {
            kvcache_free(kv);
            return fasa_error(err, FASA_ENOMEM, "cannot allocate a TIP copy of %d tokens", n_ctx);
        }
    }
    if (o && o->value_sums) {
        const size_t n = (size_t)n_layer * n_kv_head * (n_ctx / KVCACHE_VSUM_ROWS) * d_head;
        if (!(kv->vcum = malloc((n ? n : 1) * sizeof *kv->vcum))) {
            kvcache_free(kv);
            return fasa_error(err, FASA_ENOMEM, "out of memory");
        }
    }
    if (cold_dir) {
        /* FASA-M: what TIP reads stays (the dominant block, or the copy); the rest goes cold */
        const size_t ck = tw ? nk : nr;
        kv->cold_len = (ck + nv) * es;
        if (!(kv->cold = cold_map(cold_dir, kv->cold_len, err))) { kvcache_free(kv); return FASA_EIO; }
        if (tw) kv->k = kv->cold;
        else kv->kr = kv->cold, kv->k = kv_alloc(nk * es);
        kv->v = (char *)kv->cold + ck * es;
    } else {
        kv->k = kv_alloc(nk * es);
        kv->kr = split ? kv_alloc(nr * es) : NULL;
        kv->v = kv_alloc(nv * es);
    }
    if (!kv->k || !kv->v || (split && !kv->kr)) {
        kvcache_free(kv);
        return fasa_error(err, FASA_ENOMEM, "cannot allocate a KV cache of %d tokens (%.1f MiB)",
                          n_ctx, (double)(nk + nr + nv) * es / (1 << 20));
    }
    return 0;
}

void kvcache_free(kvcache *kv)
{
    if (kv->cold) {
        if (kv->k != kv->cold) free(kv->k);
        munmap(kv->cold, kv->cold_len);
    } else {
        free(kv->k), free(kv->kr), free(kv->v);
    }
    free(kv->tip_map), free(kv->tip_w), free(kv->tip_at), free(kv->tq), free(kv->tscale);
    free(kv->toff), free(kv->tset), free(kv->vcum);
    kv->vcum = NULL;
    kv->k = kv->kr = kv->v = kv->cold = NULL;
    kv->tip_map = NULL, kv->tip_w = NULL, kv->tip_at = NULL, kv->tq = NULL, kv->tscale = NULL;
    kv->toff = NULL, kv->tset = NULL;
}

size_t kvcache_bytes(const kvcache *kv, int n_tokens)
{
    return 2 * (size_t)kv->n_layer * kv->n_kv_head * n_tokens * kv->d_head * kvcache_esz(kv);
}

size_t kvcache_cold_bytes(const kvcache *kv, int n_tokens)
{
    if (!kv->cold) return 0;
    return (size_t)kv->n_layer * kv->n_kv_head * n_tokens * (2 * kv->d_head - kv->n_split) * kvcache_esz(kv);
}

uint64_t kvcache_tip_map_id(const int16_t *map, size_t n)
{
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) h = (h ^ (uint16_t)map[i]) * 1099511628211ull;
    return h;
}

int kvcache_tip_w(const int16_t *map, int tw)
{
    int w = 8;
    for (int j = w; j < tw; j++)
        if (map[j] >= 0) w = (j + 8) / 8 * 8;
    return w;
}

double kvcache_tip_map_bytes(const int16_t *map, size_t heads, int tw)
{
    double b = 0;
    for (size_t lh = 0; tw > 0 && lh < heads; lh++) b += kvcache_tip_key_bytes(kvcache_tip_w(map + lh * tw, tw));
    return b;
}

/* Bytes a token takes in the TIP copy, over every (layer, head). */
static double tip_token_bytes(const kvcache *kv)
{
    return kvcache_tip_map_bytes(kv->tip_map, (size_t)kv->n_layer * kv->n_kv_head, kv->tip_width);
}

double kvcache_tip_bytes(const kvcache *kv) { return tip_token_bytes(kv) / (kv->n_layer * kv->n_kv_head); }

size_t kvcache_resident_bytes(const kvcache *kv, int n_tokens)
{
    const size_t vsums = kv->vcum ? (size_t)kv->n_layer * kv->n_kv_head * (n_tokens / KVCACHE_VSUM_ROWS) *
                                        kv->d_head * sizeof(float) : 0;
    return kvcache_bytes(kv, n_tokens) - kvcache_cold_bytes(kv, n_tokens) +
           (size_t)((double)n_tokens * tip_token_bytes(kv) + 0.5) + vsums;
}

float kvcache_tip_key(const float *key, const int16_t *map, int tw, const float *off, int8_t *v)
{
    float x[1032], amax = 0;
    for (int j = 0; j < tw; j++) {
        x[j] = map[j] >= 0 ? key[map[j]] - (off ? off[j] : 0) : 0;
        amax = fabsf(x[j]) > amax ? fabsf(x[j]) : amax;   /* fmaxf, as NaN goes, without its libm call */
    }
    /* the scale as the copy stores it (f16, at most its largest finite value), so that the values
     * are rounded against the scale they are read with */
    float scale = amax > 0 && isfinite(amax) ? fminf(amax / 7, 65504.0f) : 0;
    uint16_t h;
    ops_f32_to_f16(&h, &scale, 1), ops_f16_to_f32(&scale, &h, 1);
    const float inv = scale > 0 ? 1 / scale : 0;
    for (int j = 0; j < tw; j++) {
        const float r = nearbyintf(x[j] * inv);
        v[j] = (int8_t)(r > 7 ? 7 : r < -7 ? -7 : r == r ? r : 0);
    }
    return scale;
}

float kvcache_tip_offset_dot(const float *q, const float *off, int tw)
{
    /* eight partial sums (dims j mod 8), then their sum: one fixed order for every caller, and
     * no chain of dependent multiply-adds (a span's product per query, per (layer, KV head)) */
    int j = 0;
#ifdef OPS_AVX2
    __m256 acc = _mm256_setzero_ps();
    for (; j + 8 <= tw; j += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(q + j), _mm256_loadu_ps(off + j), acc);
    float c = hsum256(acc);
#else
    float part[8] = { 0 };
    for (; j + 8 <= tw; j += 8)
        for (int k = 0; k < 8; k++) part[k] = fmaf(q[j + k], off[j + k], part[k]);
    float c = ((part[0] + part[4]) + (part[2] + part[6])) + ((part[1] + part[5]) + (part[3] + part[7]));
#endif
    for (; j < tw; j++) c = fmaf(q[j], off[j], c);
    return c;
}

void kvcache_tip_span_add(float *sum, const int8_t *v, float scale, int tw)
{
    for (int j = 0; j < tw; j++) sum[j] = fmaf((float)v[j], scale, sum[j]);
}

void kvcache_tip_span_offset(const float *sum, int n, const float *off, int tw, float *next)
{
    const float inv = 1.0f / (float)n;
    for (int j = 0; j < tw; j++) {
        const float x = off[j] + sum[j] * inv;
        next[j] = isfinite(x) ? x : 0;
    }
}

float kvcache_tip_query(const float *q, int tw, int8_t *qi, int32_t *qsum)
{
    float amax = 0;
    for (int j = 0; j < tw; j++) amax = fabsf(q[j]) > amax ? fabsf(q[j]) : amax;   /* (as kvcache_tip_key) */
    const float inv = amax > 0 && isfinite(amax) ? 127 / amax : 0;
    *qsum = 0;
    for (int j = 0; j < tw; j++) {
        const float x = nearbyintf(q[j] * inv);
        *qsum += qi[j] = (int8_t)(x > 127 ? 127 : x < -127 ? -127 : x == x ? x : 0);
    }
    return inv > 0 ? amax / 127 : 0;
}

static inline float *tip_off(const kvcache *kv, size_t lh, int span)
{
    return kv->toff + (lh * kv->n_spans + span) * kv->tip_width;
}

/* Key i's first 4 bytes in its tile of (layer, KV head) lh: the rest lie 64 bytes apart, one in
 * each of the tile's tip_w / 8 lines. */
static uint8_t *tip_slot(const kvcache *kv, size_t lh, int i)
{
    return kv->tq + kv->tip_at[lh] + (size_t)i / 16 * (kv->tip_w[lh] / 8) * 64 + 4 * (i % 16);
}

/* Row i of (layer, head)'s copy as integers (v, -7..7; its w dims) and its scale. */
static float tip_get(const kvcache *kv, size_t lh, int i, int8_t *v)
{
    const int w = kv->tip_w[lh];
    const uint8_t *tile = tip_slot(kv, lh, i);
    for (int j = 0; j < w / 8; j++)
        for (int b = 0; b < 4; b++) {
            const uint8_t x = tile[(size_t)j * 64 + b];
            v[8 * j + b] = (int8_t)((x & 15) - 8), v[8 * j + 4 + b] = (int8_t)((x >> 4) - 8);
        }
    float scale;
    ops_f16_to_f32(&scale, kv->tscale + lh * kv->n_tiles * 16 + i, 1);
    return scale;
}

/* Row i of the TIP copy of (layer, head) from a key, into the row's nibbles of its tile (ops.h,
 * ops_tip_q4): value v + 8. The first row of a span sets the span's offsets from the previous
 * span as the copy holds it, unless they are set and that span has not been written since (a
 * cache rolled back to a span's start, as the speed bench's repeats do): once per span of up to
 * 1,024 keys, a read of the span before. */
static void tip_put(kvcache *kv, int layer, int head, int i, const float *key)
{
    const int tw = kv->tip_width;
    const size_t lh = (size_t)layer * kv->n_kv_head + head;
    const int w = kv->tip_w[lh], span = kvcache_tip_span(i);
    uint8_t *set = kv->tset + lh * kv->n_spans;
    int8_t v[1032];
    if (span > 0 && i == kvcache_tip_span_start(span) && !set[span]) {
        const int r0 = kvcache_tip_span_start(span - 1);
        float sum[1032] = { 0 };
        for (int r = r0; r < i; r++) {
            const float scale = tip_get(kv, lh, r, v);
            kvcache_tip_span_add(sum, v, scale, w);
        }
        kvcache_tip_span_offset(sum, i - r0, tip_off(kv, lh, span - 1), w, tip_off(kv, lh, span));
        set[span] = 1;
    }
    if (span + 1 < kv->n_spans) set[span + 1] = 0;   /* this span changes: the next one's offsets are due */
    const float scale = kvcache_tip_key(key, kv->tip_map + lh * tw, tw, tip_off(kv, lh, span), v);
    ops_f32_to_f16(kv->tscale + lh * kv->n_tiles * 16 + i, &scale, 1);
    uint8_t *tile = tip_slot(kv, lh, i);
    for (int j = 0; j < w / 8; j++)
        for (int b = 0; b < 4; b++)
            tile[(size_t)j * 64 + b] = (uint8_t)((v[8 * j + b] + 8) | (v[8 * j + 4 + b] + 8) << 4);
}

void kvcache_tip_scores(const kvcache *kv, int layer, int head, int a, int b, const float *Q, int nq, int ldq, float *S,
                        int lds)
{
    const size_t lh = (size_t)layer * kv->n_kv_head + head;
    const int tw = kv->tip_w[lh];   /* the query's dims past it are zero: the same scale and sums */
    int8_t qi[8 * 1032];
    int32_t qsum[8];
    float qscale[8], edge[8 * 16];
    for (int h = 0; h < nq; h++) qscale[h] = kvcache_tip_query(Q + (size_t)h * ldq, tw, qi + h * tw, &qsum[h]);
    const size_t tile = (size_t)(tw / 8) * 64;
    const uint8_t *tq = kv->tq + kv->tip_at[lh];
    const uint16_t *ks = kv->tscale + lh * kv->n_tiles * 16;
    /* up to CHUNK tiles at a time: each query's product with each span's offsets, tile by tile,
     * then whole tiles straight into S and a tile that [a, b) cuts into through edge */
    enum { CHUNK = 256 };
    float bias[8 * CHUNK];
    for (int t0 = a / 16; t0 * 16 < b;) {
        const int t1 = t0 + CHUNK < (b + 15) / 16 ? t0 + CHUNK : (b + 15) / 16;
        for (int t = t0; t < t1;) {
            const int span = kvcache_tip_span(16 * t), end = kvcache_tip_span_start(span + 1) / 16;
            const int e = end < t1 ? end : t1;
            for (int h = 0; h < nq; h++) {
                const float c = kvcache_tip_offset_dot(Q + (size_t)h * ldq, tip_off(kv, lh, span), tw);
                for (int u = t; u < e; u++) bias[h * CHUNK + u - t0] = c;
            }
            t = e;
        }
        for (int t = t0; t < t1;) {
            const int whole = t * 16 >= a ? ((b - t * 16) / 16 < t1 - t ? (b - t * 16) / 16 : t1 - t) : 0;
            if (whole > 0) {
                ops_tip_q4(S + 16 * t, lds, qi, tw, qsum, qscale, bias + t - t0, CHUNK, nq, tq + t * tile, ks + 16 * t,
                           whole, tw);
                t += whole;
                continue;
            }
            ops_tip_q4(edge, 16, qi, tw, qsum, qscale, bias + t - t0, CHUNK, nq, tq + t * tile, ks + 16 * t, 1, tw);
            const int r0 = a > t * 16 ? a - t * 16 : 0, r1 = b < t * 16 + 16 ? b - t * 16 : 16;
            for (int h = 0; h < nq; h++)
                memcpy(S + (size_t)h * lds + t * 16 + r0, edge + h * 16 + r0, sizeof(float) * (r1 - r0));
            t++;
        }
        t0 = t1;
    }
}

/* n values of row i of part p into out (f32), or from in into the row */
static void row_get(const kvcache *kv, enum kv_part p, int l, int h, int i, float *out, int n)
{
    const char *r = (const char *)kvcache_rows(kv, p, l, h) + (size_t)i * kvcache_width(kv, p) * kvcache_esz(kv);
    if (kv->f16) ops_f16_to_f32(out, (const uint16_t *)r, n);
    else memcpy(out, r, sizeof(float) * n);
}

static void row_put(kvcache *kv, enum kv_part p, int l, int h, int i, const float *in, int n)
{
    char *r = (char *)kvcache_rows(kv, p, l, h) + (size_t)i * kvcache_width(kv, p) * kvcache_esz(kv);
    if (kv->f16) ops_f32_to_f16((uint16_t *)r, in, n);
    else memcpy(r, in, sizeof(float) * n);
}

const float *kvcache_key_row(const kvcache *kv, int layer, int head, int i, float *buf)
{
    const int d = kv->d_head, s = kv->n_split;
    if (!s && !kv->f16) return kvcache_k(kv, layer, head) + (size_t)i * d;
    row_get(kv, KV_KEYS, layer, head, i, buf, kvcache_kw(kv));
    if (s) row_get(kv, KV_REST, layer, head, i, buf + s, d - s);
    return buf;
}

void kvcache_put_key(kvcache *kv, int layer, int head, int i, const float *key)
{
    const int s = kv->n_split;
    row_put(kv, KV_KEYS, layer, head, i, key, kvcache_kw(kv));
    if (s) row_put(kv, KV_REST, layer, head, i, key + s, kv->d_head - s);
    if (!kv->tip_width) return;
    /* the copy rounds the key as cached, so that TIP over it agrees with TIP over the keys */
    float row[1024];
    tip_put(kv, layer, head, i, kvcache_key_row(kv, layer, head, i, row));
}

static float *vcum_at(const kvcache *kv, int layer, int head, int b)
{
    return kv->vcum + (((size_t)layer * kv->n_kv_head + head) * (kv->n_ctx / KVCACHE_VSUM_ROWS) + b) * kv->d_head;
}

/* Row i completes its block of KVCACHE_VSUM_ROWS: the running sum to the block's end, as stored. */
static void vcum_update(kvcache *kv, int layer, int head, int i)
{
    const int B = KVCACHE_VSUM_ROWS, d = kv->d_head, b = i / B;
    if (!kv->vcum || i % B != B - 1) return;
    float *sum = vcum_at(kv, layer, head, b), row[1024];
    if (b) memcpy(sum, vcum_at(kv, layer, head, b - 1), sizeof(float) * d);
    else memset(sum, 0, sizeof(float) * d);
    for (int r = b * B; r <= i; r++) {
        row_get(kv, KV_VALUES, layer, head, r, row, d);
        for (int j = 0; j < d; j++) sum[j] += row[j];
    }
}

void kvcache_put_value(kvcache *kv, int layer, int head, int i, const float *val)
{
    row_put(kv, KV_VALUES, layer, head, i, val, kv->d_head);
    vcum_update(kv, layer, head, i);
}

const float *kvcache_value_prefix(const kvcache *kv, int layer, int head, int t, int *nb)
{
    *nb = kv->vcum ? t / KVCACHE_VSUM_ROWS : 0;
    return kv->vcum ? vcum_at(kv, layer, head, 0) : NULL;
}

void kvcache_value_mean(const kvcache *kv, int layer, int head, int t, float *out)
{
    const int B = KVCACHE_VSUM_ROWS, d = kv->d_head, full = kv->vcum ? t / B : 0;   /* without sums: every row */
    float row[1024];
    if (full) memcpy(out, vcum_at(kv, layer, head, full - 1), sizeof(float) * d);
    else memset(out, 0, sizeof(float) * d);
    for (int r = full * B; r < t; r++) {
        row_get(kv, KV_VALUES, layer, head, r, row, d);
        for (int j = 0; j < d; j++) out[j] += row[j];
    }
    const float inv = t > 0 ? 1.0f / t : 0;
    for (int j = 0; j < d; j++) out[j] *= inv;
}

/* Every line of the rb bytes at r, for reading (into L2) or writing (into L1). */
static inline void prefetch_row(const char *r, size_t rb, int write)
{
    for (size_t o = 0; o < rb; o += 64) write ? __builtin_prefetch(r + o, 1, 3) : __builtin_prefetch(r + o, 0, 1);
    write ? __builtin_prefetch(r + rb - 1, 1, 3) : __builtin_prefetch(r + rb - 1, 0, 1);
}

void kvcache_prefetch(const kvcache *kv, int layer, int head, const int32_t *idx, int n)
{
    kvcache_prefetch_parts(kv, KV_KEYS, KV_VALUES, layer, head, idx, n);
}

void kvcache_prefetch_parts(const kvcache *kv, enum kv_part first, enum kv_part last, int layer, int head,
                            const int32_t *idx, int n)
{
    for (enum kv_part p = first; p <= last; p++) {
        if (p == KV_REST && !kv->n_split) continue;
        const size_t rb = (size_t)kvcache_width(kv, p) * kvcache_esz(kv);
        const char *base = kvcache_rows(kv, p, layer, head);
        for (int j = 0; j < n; j++) prefetch_row(base + (size_t)idx[j] * rb, rb, 0);
    }
}

void kvcache_prefetch_put(const kvcache *kv, int layer, int i)
{
    for (int h = 0; h < kv->n_kv_head; h++) {
        for (enum kv_part p = KV_KEYS; p <= KV_VALUES; p++) {
            if (p == KV_REST && !kv->n_split) continue;
            const size_t rb = (size_t)kvcache_width(kv, p) * kvcache_esz(kv);
            prefetch_row((const char *)kvcache_rows(kv, p, layer, h) + (size_t)i * rb, rb, 1);
        }
        if (!kv->tip_width) continue;
        const size_t lh = (size_t)layer * kv->n_kv_head + h;
        const uint8_t *tile = tip_slot(kv, lh, i);
        for (int j = 0; j < kv->tip_w[lh] / 8; j++) __builtin_prefetch(tile + (size_t)j * 64, 1, 3);
        __builtin_prefetch(kv->tscale + lh * kv->n_tiles * 16 + i, 1, 3);
    }
}

void kvcache_copy_row(kvcache *kv, int from, int to)
{
    for (int l = 0; l < kv->n_layer; l++)
        for (int g = 0; g < kv->n_kv_head; g++)
            for (enum kv_part p = KV_KEYS; p <= KV_VALUES; p++) {
                if (p == KV_REST && !kv->n_split) continue;
                const size_t rb = (size_t)kvcache_width(kv, p) * kvcache_esz(kv);
                char *base = kvcache_rows(kv, p, l, g);
                memcpy(base + (size_t)to * rb, base + (size_t)from * rb, rb);
            }
    for (int l = 0; l < kv->n_layer; l++)
        for (int g = 0; g < kv->n_kv_head; g++) vcum_update(kv, l, g, to);
    if (!kv->tip_width) return;
    /* the copy's row as a put of the key would write it: against the offsets of to's span */
    float row[1024];
    for (int l = 0; l < kv->n_layer; l++)
        for (int g = 0; g < kv->n_kv_head; g++) tip_put(kv, l, g, to, kvcache_key_row(kv, l, g, to, row));
}

void kvcache_scores(const kvcache *kv, enum kv_part p, int layer, int head, int row0, const int32_t *idx, int n,
                    const float *Q, int nq, int ldq, float scale, float *S, int lds)
{
    const int w = kvcache_width(kv, p);
    const char *M = (const char *)kvcache_rows(kv, p, layer, head) + (size_t)row0 * w * kvcache_esz(kv);
    if (kv->f16) {
        if (nq == 1 || idx) ops_attn_scores_f16(S, Q, (const uint16_t *)M, idx, n, w, scale);
        else ops_attn_scores_multi_f16(S, lds, Q, nq, ldq, (const uint16_t *)M, n, w, scale);
    } else if (idx) {
        ops_attn_scores_idx(S, Q, (const float *)M, idx, n, w, scale);
    } else if (nq == 1) {
        ops_attn_scores(S, Q, (const float *)M, n, w, scale);
    } else {
        ops_attn_scores_multi(S, lds, Q, nq, ldq, (const float *)M, n, w, scale);
    }
}

void kvcache_accum(const kvcache *kv, int layer, int head, int row0, const int32_t *idx, int n, const float *P,
                   int nq, const int *len, float *O, int ldo)
{
    const int d = kv->d_head;
    const char *V = (const char *)kvcache_rows(kv, KV_VALUES, layer, head) + (size_t)row0 * d * kvcache_esz(kv);
    const int one = (nq == 1 && !len) || idx;
    if (kv->f16) {
        if (one) ops_attn_accum_f16(O, P, (const uint16_t *)V, idx, n, d);
        else ops_attn_accum_multi_f16(O, ldo, P, nq, len, (const uint16_t *)V, n, d);
    } else if (idx) {
        ops_attn_accum_idx(O, P, (const float *)V, idx, n, d);
    } else if (one) {
        ops_attn_accum(O, P, (const float *)V, n, d);
    } else {
        ops_attn_accum_multi(O, ldo, P, nq, len, (const float *)V, n, d);
    }
}

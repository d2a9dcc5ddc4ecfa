/* The per-type kernels of lib/core/quant.c: each fast kernel against its scalar twin (the same
 * rounded x), and the products against weights dequantised here, independently of the formats,
 * from random blocks (every bit pattern of the codes, finite f16 scales), with the exact bound of
 * the rounding of x. */
#include <criterion/criterion.h>
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gguf.h"
#include "ops.h"
#include "quant.h"
#include "sampler.h"

static float frand(uint64_t *s)
{
    return sampler_rand(s) * 2 - 1;
}

static const uint32_t TYPES[] = { GGUF_TYPE_Q4_0, GGUF_TYPE_Q4_1, GGUF_TYPE_Q5_0, GGUF_TYPE_Q5_1, GGUF_TYPE_Q8_0,
                                  GGUF_TYPE_IQ4_NL, GGUF_TYPE_Q4_K, GGUF_TYPE_Q5_K, GGUF_TYPE_Q6_K };
#define N_TYPES (sizeof TYPES / sizeof *TYPES)

/* ---- blocks: written and read from the ggml layouts, not with lib/ or formats/ code ---- */

static float h2f(const uint8_t *p)
{
    return gguf_f16_to_f32((uint16_t)(p[0] | p[1] << 8));
}

static void f2h(uint8_t *p, float f)
{
    const uint16_t h = gguf_f32_to_f16(f);
    p[0] = (uint8_t)h;
    p[1] = (uint8_t)(h >> 8);
}

/* Byte offsets of a block's f16 fields (d, then m or dmin; -1 none). */
static void f16_fields(uint32_t type, int *a, int *b)
{
    *b = -1;
    *a = type == GGUF_TYPE_Q6_K ? 208 : 0;
    if (type == GGUF_TYPE_Q4_1 || type == GGUF_TYPE_Q5_1 || type == GGUF_TYPE_Q4_K || type == GGUF_TYPE_Q5_K) *b = 2;
}

/* A random valid block: random bytes, f16 scales of either sign around 0.01 (dmin and m too). */
static void rand_block(uint32_t type, uint8_t *blk, size_t bytes, uint64_t *r)
{
    for (size_t i = 0; i < bytes; i++) blk[i] = (uint8_t)(sampler_rand(r) * 256);
    int a, b;
    f16_fields(type, &a, &b);
    f2h(blk + a, frand(r) * 0.02f);
    if (b >= 0) f2h(blk + b, frand(r) * 0.02f);
}

static const int KV_IQ4NL[16] = { -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113 };

/* Q4_K / Q5_K scale and min j of the twelve scale bytes (ggml's get_scale_min_k4). */
static void scale_min_k4(int j, const uint8_t *q, int *sc, int *m)
{
    if (j < 4) {
        *sc = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *sc = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
        *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

/* Dequantise one block into y; mag[k] = |scale term| + |offset term| of value k, the size
 * of the parts the kernels compute separately (their f32 rounding is relative to these). */
static void deq_block(uint32_t type, const uint8_t *b, float *y, float *mag)
{
    switch (type) {
    case GGUF_TYPE_Q4_0: case GGUF_TYPE_Q4_1: case GGUF_TYPE_IQ4_NL: case GGUF_TYPE_Q5_0: case GGUF_TYPE_Q5_1: {
        const int has_m = type == GGUF_TYPE_Q4_1 || type == GGUF_TYPE_Q5_1;
        const int q5 = type == GGUF_TYPE_Q5_0 || type == GGUF_TYPE_Q5_1;
        const float d = h2f(b), m = has_m ? h2f(b + 2) : 0;
        const uint8_t *qh = b + 2 + 2 * has_m, *qs = qh + (q5 ? 4 : 0);
        const uint32_t h =
            q5 ? (uint32_t)qh[0] | (uint32_t)qh[1] << 8 | (uint32_t)qh[2] << 16 | (uint32_t)qh[3] << 24 : 0;
        for (int j = 0; j < 32; j++) {
            int q = (j < 16 ? qs[j] : qs[j - 16] >> 4) & 15;
            if (q5) q |= (int)(h >> j & 1) << 4;
            if (type == GGUF_TYPE_IQ4_NL) {
                y[j] = d * (float)KV_IQ4NL[q];
                mag[j] = fabsf(y[j]);
            } else if (has_m) {
                y[j] = d * (float)q + m;
                mag[j] = fabsf(d * (float)q) + fabsf(m);
            } else {
                const int off = q5 ? 16 : 8;
                y[j] = d * (float)(q - off);
                mag[j] = fabsf(d) * (float)(q + off);
            }
        }
        return;
    }
    case GGUF_TYPE_Q8_0:
        for (int j = 0; j < 32; j++) y[j] = h2f(b) * (float)(int8_t)b[2 + j], mag[j] = fabsf(y[j]);
        return;
    case GGUF_TYPE_Q4_K: case GGUF_TYPE_Q5_K: {
        const int q5 = type == GGUF_TYPE_Q5_K;
        const float d = h2f(b), dmin = h2f(b + 2);
        const uint8_t *qh = b + 16, *qs = b + (q5 ? 48 : 16);
        for (int v = 0; v < 256; v++) {
            int sc, m;
            scale_min_k4(v / 32, b + 4, &sc, &m);
            int q = qs[32 * (v / 64) + v % 32] >> 4 * (v % 64 / 32) & 15;
            if (q5) q += (qh[v % 32] >> (v / 32) & 1) * 16;
            y[v] = d * (float)sc * (float)q - dmin * (float)m;
            mag[v] = fabsf(d * (float)sc * (float)q) + fabsf(dmin * (float)m);
        }
        return;
    }
    case GGUF_TYPE_Q6_K: {
        const float d = h2f(b + 208);
        for (int v = 0; v < 256; v++) {
            const int h = v / 128, r = v % 128;
            const int lo = b[64 * h + r % 64] >> 4 * (r / 64) & 15, hi = b[128 + 32 * h + r % 32] >> 2 * (r / 32) & 3;
            const int q = (lo | hi << 4) - 32;
            y[v] = d * (float)(int8_t)b[192 + v / 16] * (float)q;
            mag[v] = fabsf(d * (float)(int8_t)b[192 + v / 16]) * (float)(q + 64);
        }
        return;
    }
    default:
        cr_assert_fail("no dequantiser for type %u", type);
    }
}

typedef struct qweight {
    weight w;
    uint8_t *data;
    float *f, *mag;   /* (rows, cols) dequantised, and magnitudes (deq_block) */
} qweight;

static void qweight_new(qweight *q, uint32_t type, int64_t rows, int64_t cols, uint64_t seed)
{
    const quant_kernels *k = quant_kernels_of(type);
    cr_assert(k, "no table row for type %u", type);
    const size_t rb = (size_t)(cols / k->block) * k->bytes;
    q->data = malloc(rb * rows + 64);
    q->f = malloc(sizeof(float) * rows * cols);
    q->mag = malloc(sizeof(float) * rows * cols);
    uint64_t r = seed;
    for (int64_t i = 0; i < rows * cols / k->block; i++) {
        rand_block(type, q->data + i * k->bytes, k->bytes, &r);
        deq_block(type, q->data + i * k->bytes, q->f + i * k->block, q->mag + i * k->block);
    }
    q->w = (weight){ type, rows, cols, q->data };
}

static void qweight_free(qweight *q)
{
    free(q->data);
    free(q->f);
    free(q->mag);
}

/* ---- the rounding of x, and its bound ---- */

/* The steps x's rounding takes over each block (xq16: 32 values, 32767 levels; xq8: 256, 127),
 * as the kernels define them: max |x| / levels, per value of x (cols); tight: as if x were
 * rounded to 8 more bits than it is. */
static double *x_steps(int xf, const float *x, int64_t cols, int tight)
{
    double *st = calloc(cols, sizeof(double));
    if (xf == QUANT_XF_F32) return st;
    const int blk = xf == QUANT_XF_Q16 ? 32 : 256;
    const double levels = (xf == QUANT_XF_Q16 ? 32767 : 127) * (tight ? 256.0 : 1.0);
    for (int64_t i = 0; i < cols; i += blk) {
        double amax = 0;
        for (int j = 0; j < blk; j++) amax = fmax(amax, fabs(x[i + j]));
        for (int j = 0; j < blk; j++) st[i + j] = amax / levels;
    }
    return st;
}

/* |y - exact| for row r and token x is at most sum_k step_k / 2 |w_k| (each x_k at most half a
 * step off) plus the f32 rounding of the scalings and sums: 1e-5 of sum_k mag_k |x_k|. */
static double y_bound(const qweight *q, const double *st, int64_t r, const float *x)
{
    const int64_t cols = q->w.cols;
    double b = 0, m = 0;
    for (int64_t k = 0; k < cols; k++) {
        b += st[k] / 2 * fabs(q->f[r * cols + k]);
        m += fabs(q->mag[r * cols + k] * x[k]);
    }
    return b + 1e-5 * m + 1e-30;
}

static double y_exact(const qweight *q, int64_t r, const float *x)
{
    double s = 0;
    for (int64_t k = 0; k < q->w.cols; k++) s += (double)q->f[r * q->w.cols + k] * x[k];
    return s;
}

static void rand_x(float *x, int64_t n, uint64_t *r, int kind)
{
    for (int64_t i = 0; i < n; i++) {
        x[i] = frand(r);
        if (kind == 1 && i % 97 == 5) x[i] *= 300;   /* outliers, as activations have */
        if (kind == 2) x[i] *= (float)(1 + i % 7) * 1e-3f;
    }
}

/* ---- tests ---- */

/* Whether this build can run the type: its rows dequantise here (a fast dequantiser) or in the
 * formats (which read some types only from the quant-formats branch on). */
static int runs(uint32_t type)
{
    const quant_kernels *k = quant_kernels_of(type);
    return k && (k->row || gguf_type_known(type));
}

/* The table covers every type the formats read, with the formats' block sizes. */
Test(quant, table_matches_formats)
{
    for (uint32_t t = 0; t < GGUF_TYPE_COUNT; t++) {
        const quant_kernels *k = quant_kernels_of(t);
        if (gguf_type_known(t)) cr_expect(k != NULL, "type %s has no row", gguf_type_name(t));
        if (!k || !gguf_type_known(t)) continue;
        cr_expect_eq(k->block, gguf_type_block(t), "%s block", k->name);
        cr_expect_eq(k->bytes, gguf_type_block_bytes(t), "%s bytes", k->name);
        cr_expect_str_eq(k->name, gguf_type_name(t));
        /* the integer types have a twin */
        if (k->xf != QUANT_XF_F32) cr_expect(k->dot_ref != NULL, "%s: no scalar twin", k->name);
    }
}

/* The dequantiser here agrees with the formats' wherever they read the type. */
Test(quant, dequant_matches_formats)
{
    for (size_t ti = 0; ti < N_TYPES; ti++) {
        if (!gguf_type_known(TYPES[ti])) continue;
        qweight q;
        qweight_new(&q, TYPES[ti], 3, 512, 7 + ti);
        float row[512];
        for (int r = 0; r < 3; r++) {
            weight_row_ref(&q.w, r, row);
            for (int k = 0; k < 512; k++)
                cr_expect(fabsf(row[k] - q.f[r * 512 + k]) <= 1e-6f * q.mag[r * 512 + k], "%s [%d][%d]: %g vs %g",
                          quant_kernels_of(TYPES[ti])->name, r, k, row[k], q.f[r * 512 + k]);
        }
        qweight_free(&q);
    }
}

/* weight_row (the fast dequantisers) against the dequantiser here: the same f32 operations up
 * to contraction into FMAs, so within 1e-6 of the magnitudes. */
Test(quant, weight_row_matches)
{
    for (size_t ti = 0; ti < N_TYPES; ti++) {
        const int64_t cols = 768;
        if (!runs(TYPES[ti])) continue;
        qweight q;
        qweight_new(&q, TYPES[ti], 5, cols, 99 + ti);
        float row[768];
        for (int r = 0; r < 5; r++) {
            weight_row(&q.w, r, row);
            int bad = 0;
            for (int k = 0; k < cols; k++)
                if (!(fabsf(row[k] - q.f[r * cols + k]) <= 1e-6f * q.mag[r * cols + k]) && bad++ < 3)
                    cr_expect(0, "%s [%d][%d]: %g vs %g", quant_kernels_of(TYPES[ti])->name, r, k, row[k],
                              q.f[r * cols + k]);
        }
        qweight_free(&q);
    }
}

/* The fast roundings of x equal their scalar twins exactly (the sums of xq16 to f32 rounding),
 * over blocks of ordinary, wide, tiny, zero and non-finite values. */
Test(quant, x_rounding_matches_twin)
{
    const int64_t cols = 1024;
    const int n = 3;
    float *x = malloc(sizeof(float) * cols * n);
    uint64_t r = 3;
    rand_x(x, cols * n, &r, 1);
    for (int k = 0; k < 256; k++) x[256 + k] = 0;          /* a zero block */
    for (int k = 0; k < 256; k++) x[512 + k] *= 1e-30f;    /* a tiny block */
    x[cols + 300] = NAN;
    x[2 * cols + 700] = INFINITY;
    uint8_t *b1 = aligned_alloc(64, quant_xq8_bytes(cols, n)), *b2 = aligned_alloc(64, quant_xq8_bytes(cols, n));
    xq8 a, z;
    quant_xq8(&a, x, cols, n, b1, 0);
    quant_xq8(&z, x, cols, n, b2, 1);
    cr_expect_eq(memcmp(a.q, z.q, cols * n), 0, "xq8: q differs");
    for (int64_t i = 0; i < cols * n / 256; i++)
        cr_expect(a.d[i] == z.d[i] || (isnan(a.d[i]) && isnan(z.d[i])), "xq8: d[%lld] %g vs %g", (long long)i, a.d[i],
                  z.d[i]);
    cr_expect(isnan(a.d[(cols + 300) / 256]) && isnan(a.d[(2 * cols + 700) / 256]), "non-finite blocks have NaN steps");
    cr_expect_eq(a.d[1], 0.0f);
    for (int64_t i = 0; i < cols * n / 16; i++) {
        int s = 0;
        for (int k = 0; k < 16; k++) s += a.q[16 * i + k];
        cr_expect_eq(a.s16[i], s, "xq8: s16[%lld]", (long long)i);
        cr_expect_eq(z.s16[i], s);
    }
    for (int64_t i = 0; i < cols * n / 32; i++) cr_expect_eq(a.s32[i], a.s16[2 * i] + a.s16[2 * i + 1]);
    for (int64_t i = 0; i < cols * n; i++) {
        cr_expect(abs(a.q[i]) <= 127);
        if (isfinite(a.d[i / 256]) && a.d[i / 256] > 0)
            cr_expect(fabs(x[i] - a.d[i / 256] * a.q[i]) <= a.d[i / 256] * (0.5 + 1e-5),
                      "xq8: x[%lld] = %g, %d steps of %g", (long long)i, x[i], a.q[i], a.d[i / 256]);
    }
    if (a.qp) /* the nibble order of Q4_K/Q5_K: per 128, [0, 32) [64, 96) [32, 64) [96, 128) */
        for (int64_t i = 0; i < cols * n; i++) {
            const int64_t j = i % 128, src = i - j + (j < 32 ? j : j < 64 ? j + 32 : j < 96 ? j - 32 : j);
            cr_expect_eq(a.qp[i], a.q[src], "qp[%lld]", (long long)i);
        }
    free(b1); free(b2);

    int16_t *h1 = malloc(cols * 2 + cols / 32 * 8), *h2 = malloc(cols * 2 + cols / 32 * 8);
    for (int t = 0; t < n; t++) {
        xq16 u, v;
        quant_xq16(&u, x + t * cols, cols, h1, 0);
        quant_xq16(&v, x + t * cols, cols, h2, 1);
        cr_expect_eq(memcmp(u.x16, v.x16, cols * 2), 0, "xq16: x16 differs (token %d)", t);
        for (int64_t i = 0; i < cols / 32; i++) {
            cr_expect(u.sx[i] == v.sx[i] || (isnan(u.sx[i]) && isnan(v.sx[i])), "xq16: sx[%lld]", (long long)i);
            double m = 0;
            for (int k = 0; k < 32; k++) m += fabs(x[t * cols + 32 * i + k]);
            cr_expect(fabs(u.xs[i] - v.xs[i]) <= 1e-6 * m || (!isfinite(u.xs[i]) && !isfinite(v.xs[i])),
                      "xq16: xs[%lld]", (long long)i);
        }
    }
    free(h1); free(h2); free(x);
}

/* Each fast kernel against its scalar twin on the same rounded x: the integer sums are exact in
 * both, so they differ only by f32 rounding in another order (1e-5 of the magnitudes). For the
 * K types every tile shape: T = 1..4 tokens, 1..4 rows. */
Test(quant, kernels_match_twins)
{
    const int64_t cols_list[] = { 256, 512, 2304 };
    for (size_t ti = 0; ti < N_TYPES; ti++) {
        const quant_kernels *k = quant_kernels_of(TYPES[ti]);
        if (!k->dot1 && !k->tile) continue;   /* no fast kernels in this build */
        for (size_t ci = 0; ci < sizeof cols_list / sizeof *cols_list; ci++) {
            const int64_t cols = cols_list[ci];
            qweight q;
            qweight_new(&q, TYPES[ti], 4, cols, 1000 * ti + ci);
            const size_t rb = (size_t)(cols / k->block) * k->bytes;
            float *x = malloc(sizeof(float) * cols * QUANT_TILE_T);
            uint64_t r = 17 + ci;
            rand_x(x, cols * QUANT_TILE_T, &r, (int)ci % 3);
            uint8_t *buf = aligned_alloc(64, quant_xq8_bytes(cols, QUANT_TILE_T) + cols * 4);
            double *zero = x_steps(QUANT_XF_F32, x, cols, 0);   /* no rounding term: the twins round alike */
            const uint8_t *w[4] = { q.data, q.data + rb, q.data + 2 * rb, q.data + 3 * rb };
            float y[QUANT_TILE_T * 4], yr[QUANT_TILE_T][4];
            if (k->tile) {
                xq8 x8;
                quant_xq8(&x8, x, cols, QUANT_TILE_T, buf, 0);
                for (int t = 0; t < QUANT_TILE_T; t++) {
                    const xq8 xt = { x8.q + t * cols, x8.qp ? x8.qp + t * cols : NULL, x8.d + t * cols / 256,
                                     x8.s16 + t * cols / 16, x8.s32 + t * cols / 32, cols };
                    for (int i = 0; i < 4; i++) yr[t][i] = k->dot_ref(w[i], &xt, cols);
                }
                for (int T = 1; T <= QUANT_TILE_T; T++)
                    for (int nr = 1; nr <= 4; nr++) {
                        const uint8_t *wn[4] = { w[0], w[nr > 1], w[nr > 2 ? 2 : 0], w[nr > 3 ? 3 : 0] };
                        for (int i = 0; i < QUANT_TILE_T * 4; i++) y[i] = NAN;
                        k->tile(y, 4, wn, nr, &x8, T, cols, T == 1 ? 64 : 0);   /* decode prefetches */
                        for (int t = 0; t < QUANT_TILE_T; t++)
                            for (int i = 0; i < 4; i++) {
                                if (t >= T || i >= nr) {
                                    cr_expect(isnan(y[4 * t + i]), "%s T=%d nr=%d: y[%d][%d] written", k->name, T, nr,
                                              t, i);
                                    continue;
                                }
                                const double tol = y_bound(&q, zero, i, x + t * cols);
                                cr_expect(fabs(y[4 * t + i] - yr[t][i]) <= tol,
                                          "%s cols=%lld T=%d nr=%d [%d][%d]: %.9g vs twin %.9g", k->name,
                                          (long long)cols, T, nr, t, i, y[4 * t + i], yr[t][i]);
                            }
                    }
            } else {
                xq16 x16;
                const void *xv = x;
                if (k->xf == QUANT_XF_Q16) {
                    quant_xq16(&x16, x, cols, buf, 0);
                    xv = &x16;
                }
                for (int i = 0; i < 4; i++) yr[0][i] = k->dot_ref(w[i], xv, cols);
                k->dot4(y, q.data, rb, xv, cols);
                for (int i = 0; i < 4; i++) {
                    const double tol = y_bound(&q, zero, i, x);
                    const float y1 = k->dot1(w[i], xv, cols);
                    cr_expect(fabs(y[i] - yr[0][i]) <= tol, "%s cols=%lld dot4 row %d: %.9g vs twin %.9g", k->name,
                              (long long)cols, i, y[i], yr[0][i]);
                    cr_expect(fabs(y1 - yr[0][i]) <= tol, "%s cols=%lld dot1 row %d: %.9g vs twin %.9g", k->name,
                              (long long)cols, i, y1, yr[0][i]);
                }
            }
            free(buf); free(x); free(zero);
            qweight_free(&q);
        }
    }
}

/* ops_matmul on every type (decode, and prefill batches around the tile sizes, on 1 to 3
 * threads) against the exact products of the weights dequantised here: within y_bound. And the
 * bound is not loose: were x rounded to 8 more bits than the kernels claim, some row of the
 * K types would be off by more than that bound allows. */
static void check_type(uint32_t type)
{
    const quant_kernels *k = quant_kernels_of(type);
    if (!runs(type)) cr_skip("%s: neither a fast dequantiser nor the formats' in this build", k->name);
    const int64_t rows = 37, cols = 1536;
    const int n_list[] = { 1, 2, 3, 4, 5, 7, 64 };
    qweight q;
    qweight_new(&q, type, rows, cols, 4000 + type);
    const int saved = omp_get_max_threads();
    ops_threads_adaptive(0);
    double worst_tight = 0;
    for (size_t ni = 0; ni < sizeof n_list / sizeof *n_list; ni++) {
        const int n = n_list[ni];
        float *x = malloc(sizeof(float) * n * cols), *y = malloc(sizeof(float) * n * rows);
        float *y1 = malloc(sizeof(float) * n * rows);
        uint64_t r = 11 + n;
        rand_x(x, n * cols, &r, n % 3);
        /* the 32-value types round x only in decode */
        const int xf = k->xf == QUANT_XF_Q16 && n > 1 ? QUANT_XF_F32 : k->xf;
        for (int threads = 1; threads <= 3; threads++) {
            omp_set_num_threads(threads);
            for (int i = 0; i < n * rows; i++) y[i] = NAN;
            ops_matmul(y, &q.w, x, n);
            int bad = 0;
            for (int t = 0; t < n; t++) {
                double *st = x_steps(xf, x + t * cols, cols, 0), *tight = x_steps(xf, x + t * cols, cols, 1);
                for (int64_t i = 0; i < rows; i++) {
                    const double want = y_exact(&q, i, x + t * cols), got = y[t * rows + i];
                    const double tol = y_bound(&q, st, i, x + t * cols);
                    if (!(fabs(got - want) <= tol) && bad++ < 5)
                        cr_expect(0, "%s n=%d %d threads: y[%d][%lld] = %.9g, exact %.9g (bound %.3g)", k->name, n,
                                  threads, t, (long long)i, got, want, tol);
                    if (xf == QUANT_XF_Q8K)
                        worst_tight = fmax(worst_tight, fabs(got - want) / y_bound(&q, tight, i, x + t * cols));
                }
                free(st); free(tight);
            }
            if (threads == 1) memcpy(y1, y, sizeof(float) * n * rows);
            else
                cr_expect_eq(memcmp(y, y1, sizeof(float) * n * rows), 0, "%s n=%d: %d threads differ from 1", k->name,
                             n, threads);
        }
        /* the K types round x the same way in decode and prefill: token t of a batch is bit for
         * bit its decode */
        if (k->xf == QUANT_XF_Q8K && n > 1) {
            float yd[37];
            ops_matmul(yd, &q.w, x + (n - 1) * cols, 1);
            cr_expect_eq(memcmp(yd, y + (n - 1) * rows, sizeof yd), 0, "%s n=%d: last token differs from its decode",
                         k->name, n);
        }
        free(x); free(y); free(y1);
    }
    if (k->xf == QUANT_XF_Q8K && k->tile)
        cr_expect_gt(worst_tight, 1, "%s: the bound of x rounded to 8 more bits holds too (worst %.3g of it)", k->name,
                     worst_tight);
    omp_set_num_threads(saved);
    ops_threads_adaptive(1);
    qweight_free(&q);
}

Test(quant, matmul_q4_0) { check_type(GGUF_TYPE_Q4_0); }
Test(quant, matmul_q4_1) { check_type(GGUF_TYPE_Q4_1); }
Test(quant, matmul_q5_0) { check_type(GGUF_TYPE_Q5_0); }
Test(quant, matmul_q5_1) { check_type(GGUF_TYPE_Q5_1); }
Test(quant, matmul_q8_0) { check_type(GGUF_TYPE_Q8_0); }
Test(quant, matmul_iq4_nl) { check_type(GGUF_TYPE_IQ4_NL); }
Test(quant, matmul_q4_k) { check_type(GGUF_TYPE_Q4_K); }
Test(quant, matmul_q5_k) { check_type(GGUF_TYPE_Q5_K); }
Test(quant, matmul_q6_k) { check_type(GGUF_TYPE_Q6_K); }

/* ops_exact(1): x is not rounded, so decode and prefill agree with the f32 products of the
 * dequantised rows to f32 summation error, far inside the rounding bound the fast kernels need. */
Test(quant, exact_is_the_f32_path)
{
    const uint32_t types[] = { GGUF_TYPE_Q4_0, GGUF_TYPE_Q5_0, GGUF_TYPE_Q8_0, GGUF_TYPE_Q4_K, GGUF_TYPE_Q6_K };
    const int64_t rows = 13, cols = 768;
    float row[768];
    ops_exact(1);
    for (size_t ti = 0; ti < sizeof types / sizeof *types; ti++) {
        if (!runs(types[ti])) continue;
        qweight q;
        qweight_new(&q, types[ti], rows, cols, 77 + types[ti]);
        for (int n = 1; n <= 5; n += 4) {
            float *x = malloc(sizeof(float) * n * cols), *y = malloc(sizeof(float) * n * rows);
            uint64_t r = 5 + n;
            rand_x(x, n * cols, &r, 0);
            ops_matmul(y, &q.w, x, n);
            for (int t = 0; t < n; t++)
                for (int64_t i = 0; i < rows; i++) {
                    weight_row(&q.w, i, row);
                    double mag = 0;
                    for (int c = 0; c < cols; c++) mag += fabs((double)row[c] * x[t * cols + c]);
                    const double want = y_exact(&q, i, x + t * cols), got = y[t * rows + i];
                    cr_expect(fabs(got - want) <= 1e-5 * mag + 1e-30, "%s n=%d exact: y[%d][%lld] = %.9g, want %.9g",
                              quant_kernels_of(types[ti])->name, n, t, (long long)i, got, want);
                }
            free(x); free(y);
        }
        qweight_free(&q);
    }
    ops_exact(0);
}

/* A NaN or an infinity in x makes every row it meets non-finite, in decode and prefill. */
Test(quant, non_finite_x)
{
    for (size_t ti = 0; ti < N_TYPES; ti++) {
        if (!runs(TYPES[ti])) continue;
        qweight q;
        qweight_new(&q, TYPES[ti], 9, 512, 77 + ti);
        float x[3 * 512], y[3 * 9];
        uint64_t r = 1;
        rand_x(x, 3 * 512, &r, 0);
        x[300] = INFINITY;
        x[512 + 10] = NAN;
        for (int n = 1; n <= 3; n += 2) {
            ops_matmul(y, &q.w, x, n);
            for (int i = 0; i < 9; i++)
                cr_expect(!isfinite(y[i]), "%s n=%d: inf in x, row %d = %g", quant_kernels_of(TYPES[ti])->name, n, i,
                          y[i]);
            if (n == 3)
                for (int i = 0; i < 9; i++)
                    cr_expect(isnan(y[9 + i]), "%s: NaN in x, row %d = %g", quant_kernels_of(TYPES[ti])->name, i,
                              y[9 + i]);
        }
        qweight_free(&q);
    }
}

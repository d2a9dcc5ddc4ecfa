/* ops.c - vector kernels of the forward pass besides the products: dot, axpy, attention over
 * f32 and f16 rows, f16 conversion, RMSNorm, softmax, exp, SwiGLU (each with its scalar twin). */
#include "ops.h"

#include <math.h>
#include <string.h>

#include "gguf.h"
#include "simd.h"

float ops_dot_ref(const float *a, const float *b, int n)
{
    float s = 0;
    for (int i = 0; i < n; i++) s += a[i] * b[i];
    return s;
}

float ops_dot(const float *a, const float *b, int n)
{
#ifdef OPS_AVX2
    __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
    int i = 0;
    for (; i + 16 <= n; i += 16) {
        s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
        s1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), s1);
    }
    for (; i + 8 <= n; i += 8)
        s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
    s0 = _mm256_add_ps(s0, s1);
    __m128 h = _mm_add_ps(_mm256_castps256_ps128(s0), _mm256_extractf128_ps(s0, 1));
    h = _mm_add_ps(h, _mm_movehl_ps(h, h));
    h = _mm_add_ss(h, _mm_movehdup_ps(h));
    float s = _mm_cvtss_f32(h);
    for (; i < n; i++) s += a[i] * b[i];
    return s;
#else
    return ops_dot_ref(a, b, n);
#endif
}

void ops_axpy_ref(float *y, float a, const float *x, int n)
{
    for (int i = 0; i < n; i++) y[i] += a * x[i];
}

void ops_axpy(float *y, float a, const float *x, int n)
{
#ifdef OPS_AVX2
    __m256 va = _mm256_set1_ps(a);
    int i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i, _mm256_fmadd_ps(va, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
    for (; i < n; i++) y[i] += a * x[i];
#else
    ops_axpy_ref(y, a, x, n);
#endif
}

/* ---- attention ------------------------------------------------------------------------------
 *
 * Keys and values are rows of f32 or of f16 (the KV cache's two storage types). Each kernel body
 * takes its rows as untyped pointers and a constant h16, and has a contiguous form (rows 0..t)
 * and a gathered one (rows idx[0..n), for attention over selected positions); inlining makes
 * one instance per type and per d == 64 or any d. */

static inline const void *kv_row(const void *M, const int32_t *idx, int i, int d, int h16)
{
    return (const char *)M + (size_t)(idx ? idx[i] : i) * d * (h16 ? 2 : 4);
}

static inline float kv_at_ref(const void *row, int c, int h16)
{
    return h16 ? gguf_f16_to_f32(((const uint16_t *)row)[c]) : ((const float *)row)[c];
}

static void attn_scores_plain(float *s, const float *q, const void *K, const int32_t *idx, int t, int d,
                              float scale, int h16)
{
    for (int i = 0; i < t; i++) {
        const void *k = kv_row(K, idx, i, d, h16);
        float acc = 0;
        for (int c = 0; c < d; c++) acc += q[c] * kv_at_ref(k, c, h16);
        s[i] = scale * acc;
    }
}

static void attn_accum_plain(float *out, const float *p, const void *V, const int32_t *idx, int t, int d, int h16)
{
    memset(out, 0, sizeof(float) * d);
    for (int i = 0; i < t; i++) {
        const void *v = kv_row(V, idx, i, d, h16);
        for (int c = 0; c < d; c++) out[c] += p[i] * kv_at_ref(v, c, h16);
    }
}

#ifdef OPS_AVX2
#ifdef __AVX512F__
/* Eight key rows k[0..7] against NQ queries (at most 3, ldq apart), d a multiple of 16: 8 NQ
 * accumulators of 16 lanes, each key load used NQ times, one transpose-reduce per query; the
 * eight dot products of query i go to S + i lds. */
static inline __attribute__((always_inline)) void
dot8xq512(float *S, int lds, const void *const k[8], const float *Q, int ldq, int d, const int NQ, const int h16)
{
    __m512 a[3][8];
#pragma GCC unroll 3
    for (int i = 0; i < NQ; i++)
#pragma GCC unroll 8
        for (int r = 0; r < 8; r++) a[i][r] = _mm512_setzero_ps();
    for (int c = 0; c < d; c += 16) {
        __m512 q[3];
#pragma GCC unroll 3
        for (int i = 0; i < NQ; i++) q[i] = _mm512_loadu_ps(Q + (size_t)i * ldq + c);
#pragma GCC unroll 8
        for (int r = 0; r < 8; r++) {
            const __m512 kv = KV_LOAD16(k[r], c, h16);
#pragma GCC unroll 3
            for (int i = 0; i < NQ; i++) a[i][r] = _mm512_fmadd_ps(q[i], kv, a[i][r]);
        }
    }
#pragma GCC unroll 3
    for (int i = 0; i < NQ; i++) _mm256_storeu_ps(S + (size_t)i * lds, hsum8x512(a[i]));
}
#endif

/* Eight keys at a time: eight running sums, one transpose-reduce instead of eight horizontal
 * sums. d a multiple of 8; a constant 64 after inlining keeps q in registers. zmm (d a multiple
 * of 64, AVX-512): the eight keys in zmm registers, half the instructions. */
static inline __attribute__((always_inline)) void
attn_scores_fast(float *s, const float *q, const void *K, const int32_t *idx, int t, const int d, float scale,
                 const int h16, const int zmm)
{
    const __m256 vs = _mm256_set1_ps(scale);
    int i = 0;
    for (; i + 8 <= t; i += 8) {
        const void *k[8];
#pragma GCC unroll 8
        for (int j = 0; j < 8; j++) k[j] = kv_row(K, idx, i + j, d, h16);
#ifdef __AVX512F__
        if (zmm) {
            dot8xq512(s + i, 0, k, q, 0, d, 1, h16);
            _mm256_storeu_ps(s + i, _mm256_mul_ps(vs, _mm256_loadu_ps(s + i)));
            continue;
        }
#endif
        __m256 a[8];
#pragma GCC unroll 8
        for (int j = 0; j < 8; j++) a[j] = _mm256_setzero_ps();
#pragma GCC unroll 8
        for (int c = 0; c < d; c += 8) {
            const __m256 qv = _mm256_loadu_ps(q + c);
#pragma GCC unroll 8
            for (int j = 0; j < 8; j++) a[j] = _mm256_fmadd_ps(qv, KV_LOAD8(k[j], c, h16), a[j]);
        }
        _mm256_storeu_ps(s + i, _mm256_mul_ps(vs, hsum8x256(a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7])));
    }
    for (; i < t; i++) {
        const void *k = kv_row(K, idx, i, d, h16);
        if (!h16) { s[i] = scale * ops_dot(q, k, d); continue; }
        __m256 a = _mm256_setzero_ps();
        for (int c = 0; c < d; c += 8) a = _mm256_fmadd_ps(_mm256_loadu_ps(q + c), KV_LOAD8(k, c, 1), a);
        s[i] = scale * hsum256(a);
    }
}

/* 64 columns at a time with eight accumulators live across all rows, then 8 at a time. */
static inline __attribute__((always_inline)) void
attn_accum_fast(float *out, const float *p, const void *V, const int32_t *idx, int t, const int d, const int h16)
{
    int c = 0;
    for (; c + 64 <= d; c += 64) {
        __m256 a[8];
#pragma GCC unroll 8
        for (int j = 0; j < 8; j++) a[j] = _mm256_setzero_ps();
        for (int i = 0; i < t; i++) {
            const void *v = kv_row(V, idx, i, d, h16);
            const __m256 pi = _mm256_broadcast_ss(p + i);
#pragma GCC unroll 8
            for (int j = 0; j < 8; j++) a[j] = _mm256_fmadd_ps(pi, KV_LOAD8(v, c + 8 * j, h16), a[j]);
        }
#pragma GCC unroll 8
        for (int j = 0; j < 8; j++) _mm256_storeu_ps(out + c + 8 * j, a[j]);
    }
    for (; c + 8 <= d; c += 8) {
        __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
        int i = 0;
        for (; i + 2 <= t; i += 2) {
            a0 = _mm256_fmadd_ps(_mm256_broadcast_ss(p + i), KV_LOAD8(kv_row(V, idx, i, d, h16), c, h16), a0);
            a1 = _mm256_fmadd_ps(_mm256_broadcast_ss(p + i + 1), KV_LOAD8(kv_row(V, idx, i + 1, d, h16), c, h16), a1);
        }
        if (i < t) a0 = _mm256_fmadd_ps(_mm256_broadcast_ss(p + i), KV_LOAD8(kv_row(V, idx, i, d, h16), c, h16), a0);
        _mm256_storeu_ps(out + c, _mm256_add_ps(a0, a1));
    }
    for (; c < d; c++) {
        float s = 0;
        for (int i = 0; i < t; i++) s += p[i] * KV_AT(kv_row(V, idx, i, d, h16), c, h16);
        out[c] = s;
    }
}

#ifdef __AVX512F__
/* d a multiple of 64: four zmm accumulators per 64 columns, live across all rows. */
static inline __attribute__((always_inline)) void
attn_accum_512(float *out, const float *p, const void *V, const int32_t *idx, int t, const int d, const int h16)
{
    for (int c = 0; c < d; c += 64) {
        __m512 a[4];
#pragma GCC unroll 4
        for (int j = 0; j < 4; j++) a[j] = _mm512_setzero_ps();
        for (int i = 0; i < t; i++) {
            const void *v = kv_row(V, idx, i, d, h16);
            const __m512 pi = _mm512_set1_ps(p[i]);
#pragma GCC unroll 4
            for (int j = 0; j < 4; j++) a[j] = _mm512_fmadd_ps(pi, KV_LOAD16(v, c + 16 * j, h16), a[j]);
        }
#pragma GCC unroll 4
        for (int j = 0; j < 4; j++) _mm512_storeu_ps(out + c + 16 * j, a[j]);
    }
}
#endif

static void attn_scores_any(float *s, const float *q, const void *K, const int32_t *idx, int t, int d, float scale,
                            int h16)
{
    if (d % 8) { attn_scores_plain(s, q, K, idx, t, d, scale, h16); return; }
#ifdef __AVX512F__
    if (d == 64 || d == 128) {
        if (d == 64 && h16) attn_scores_fast(s, q, K, idx, t, 64, scale, 1, 1);
        else if (d == 64) attn_scores_fast(s, q, K, idx, t, 64, scale, 0, 1);
        else if (h16) attn_scores_fast(s, q, K, idx, t, 128, scale, 1, 1);
        else attn_scores_fast(s, q, K, idx, t, 128, scale, 0, 1);
        return;
    }
#endif
    if (h16) {
        if (d == 64) attn_scores_fast(s, q, K, idx, t, 64, scale, 1, 0);
        else attn_scores_fast(s, q, K, idx, t, d, scale, 1, 0);
    } else {
        if (d == 64) attn_scores_fast(s, q, K, idx, t, 64, scale, 0, 0);
        else attn_scores_fast(s, q, K, idx, t, d, scale, 0, 0);
    }
}

static void attn_accum_any(float *out, const float *p, const void *V, const int32_t *idx, int t, int d, int h16)
{
#ifdef __AVX512F__
    if (d == 64 || d == 128) {
        if (h16) attn_accum_512(out, p, V, idx, t, d, 1);
        else attn_accum_512(out, p, V, idx, t, d, 0);
        return;
    }
#endif
    if (h16) {
        if (d == 64) attn_accum_fast(out, p, V, idx, t, 64, 1);
        else attn_accum_fast(out, p, V, idx, t, d, 1);
    } else {
        if (d == 64) attn_accum_fast(out, p, V, idx, t, 64, 0);
        else attn_accum_fast(out, p, V, idx, t, d, 0);
    }
}
#else
#define attn_scores_any attn_scores_plain
#define attn_accum_any attn_accum_plain
#endif

void ops_attn_scores(float *s, const float *q, const float *K, int t, int d, float scale)
{
    attn_scores_any(s, q, K, NULL, t, d, scale, 0);
}

void ops_attn_scores_ref(float *s, const float *q, const float *K, int t, int d, float scale)
{
    attn_scores_plain(s, q, K, NULL, t, d, scale, 0);
}

void ops_attn_scores_idx(float *s, const float *q, const float *K, const int32_t *idx, int n, int d, float scale)
{
    attn_scores_any(s, q, K, idx, n, d, scale, 0);
}

void ops_attn_scores_idx_ref(float *s, const float *q, const float *K, const int32_t *idx, int n, int d,
                             float scale)
{
    attn_scores_plain(s, q, K, idx, n, d, scale, 0);
}

void ops_attn_accum(float *out, const float *p, const float *V, int t, int d)
{
    attn_accum_any(out, p, V, NULL, t, d, 0);
}

void ops_attn_accum_ref(float *out, const float *p, const float *V, int t, int d)
{
    attn_accum_plain(out, p, V, NULL, t, d, 0);
}

void ops_attn_accum_idx(float *out, const float *p, const float *V, const int32_t *idx, int n, int d)
{
    attn_accum_any(out, p, V, idx, n, d, 0);
}

void ops_attn_accum_idx_ref(float *out, const float *p, const float *V, const int32_t *idx, int n, int d)
{
    attn_accum_plain(out, p, V, idx, n, d, 0);
}

void ops_attn_scores_f16(float *s, const float *q, const uint16_t *K, const int32_t *idx, int n, int d, float scale)
{
    attn_scores_any(s, q, K, idx, n, d, scale, 1);
}

void ops_attn_scores_f16_ref(float *s, const float *q, const uint16_t *K, const int32_t *idx, int n, int d,
                             float scale)
{
    attn_scores_plain(s, q, K, idx, n, d, scale, 1);
}

void ops_attn_accum_f16(float *out, const float *p, const uint16_t *V, const int32_t *idx, int n, int d)
{
    attn_accum_any(out, p, V, idx, n, d, 1);
}

void ops_attn_accum_f16_ref(float *out, const float *p, const uint16_t *V, const int32_t *idx, int n, int d)
{
    attn_accum_plain(out, p, V, idx, n, d, 1);
}

/* Several queries against the same keys: the heads of a GQA group in decode (each key and value
 * row is read once for the group instead of once per head), or all the queries of a prefill
 * batch. Scores reuse the prefill matmul kernel with the keys as the weight rows. */

static void scores_multi_plain(float *S, int lds, const float *Q, int nq, int ldq, const void *K, int t, int d,
                               float scale, int h16)
{
    for (int i = 0; i < nq; i++) attn_scores_plain(S + (size_t)i * lds, Q + (size_t)i * ldq, K, NULL, t, d, scale, h16);
}

#ifdef OPS_AVX2
/* Narrow rows (d a multiple of 8 up to 48: FASA's dominant block, which TIP scans for every
 * cached token): eight keys at a time, widened once into kb, then per query eight running sums and one
 * transpose-reduce, so no horizontal sum is paid per key. */
static inline __attribute__((always_inline)) void
scores_narrow(float *S, int lds, const float *Q, int nq, int ldq, const void *K, int t, const int d, float scale,
              const int h16)
{
    const size_t rb = (size_t)d * (h16 ? 2 : 4);
    const __m256 vs = _mm256_set1_ps(scale);
    float kb[8 * 48];
    int j = 0;
    for (; j + 8 <= t; j += 8) {
        const char *k0 = kv_row(K, NULL, j, d, h16);
        if (j + 8 + KV_AHEAD_ROWS(rb) < t) prefetch_bytes(k0 + KV_AHEAD_ROWS(rb) * rb, 8 * rb);
#pragma GCC unroll 8
        for (int r = 0; r < 8; r++)
#pragma GCC unroll 4
            for (int c = 0; c < d; c += 8) _mm256_storeu_ps(kb + r * d + c, KV_LOAD8(k0 + r * rb, c, h16));
        for (int i = 0; i < nq; i++) {
            const float *q = Q + (size_t)i * ldq;
            __m256 a[8];
#pragma GCC unroll 8
            for (int r = 0; r < 8; r++) {
                a[r] = _mm256_mul_ps(_mm256_loadu_ps(q), _mm256_loadu_ps(kb + r * d));
#pragma GCC unroll 4
                for (int c = 8; c < d; c += 8)
                    a[r] = _mm256_fmadd_ps(_mm256_loadu_ps(q + c), _mm256_loadu_ps(kb + r * d + c), a[r]);
            }
            _mm256_storeu_ps(S + (size_t)i * lds + j,
                             _mm256_mul_ps(vs, hsum8x256(a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7])));
        }
    }
    for (; j < t; j++)
        for (int i = 0; i < nq; i++) {
            const void *k = kv_row(K, NULL, j, d, h16);
            __m256 a = _mm256_mul_ps(_mm256_loadu_ps(Q + (size_t)i * ldq), KV_LOAD8(k, 0, h16));
            for (int c = 8; c < d; c += 8)
                a = _mm256_fmadd_ps(_mm256_loadu_ps(Q + (size_t)i * ldq + c), KV_LOAD8(k, c, h16), a);
            S[(size_t)i * lds + j] = scale * hsum256(a);
        }
}


static inline __attribute__((always_inline)) void
scores_multi_fast(float *S, int lds, const float *Q, int nq, int ldq, const void *K, int t, int d, float scale,
                  const int h16)
{
    if (d == 16) { scores_narrow(S, lds, Q, nq, ldq, K, t, 16, scale, h16); return; }
    if (d % 8 == 0 && d <= 48) { scores_narrow(S, lds, Q, nq, ldq, K, t, d, scale, h16); return; }
    const size_t rb = (size_t)d * (h16 ? 2 : 4);
    int j0 = 0;
#ifdef __AVX512F__
    /* wide rows (d = 64, 128): eight keys by up to three queries in zmm registers */
    if (d % 16 == 0)
        for (; j0 + 8 <= t; j0 += 8) {
            const char *k0 = kv_row(K, NULL, j0, d, h16);
            if (j0 + 8 + KV_AHEAD_ROWS(rb) < t) prefetch_bytes(k0 + KV_AHEAD_ROWS(rb) * rb, 8 * rb);
            const void *k[8];
            for (int r = 0; r < 8; r++) k[r] = k0 + r * rb;
            for (int i = 0; i < nq; i += 3) {
                float *Si = S + (size_t)i * lds + j0;
                const float *Qi = Q + (size_t)i * ldq;
                if (nq - i >= 3) dot8xq512(Si, lds, k, Qi, ldq, d, 3, h16);
                else if (nq - i == 2) dot8xq512(Si, lds, k, Qi, ldq, d, 2, h16);
                else dot8xq512(Si, lds, k, Qi, ldq, d, 1, h16);
            }
        }
#endif
    for (int j = j0; j < t; j += 4) {
        const int nr = t - j < 4 ? t - j : 4;
        const void *kr[4];
        for (int r = 0; r < 4; r++) kr[r] = kv_row(K, NULL, j + (r < nr ? r : nr - 1), d, h16);
        if (j + 4 + KV_AHEAD_ROWS(rb) < t)   /* the stream ahead (see matvec_rows) */
            prefetch_bytes((const char *)kr[0] + KV_AHEAD_ROWS(rb) * rb, 4 * rb);
        int i = 0;
        for (; i + 3 <= nq; i += 3) tile_4xT(S + (size_t)i * lds + j, lds, kr, Q + (size_t)i * ldq, ldq, d, nr, 3, h16);
        if (nq - i == 2) tile_4xT(S + (size_t)i * lds + j, lds, kr, Q + (size_t)i * ldq, ldq, d, nr, 2, h16);
        else if (nq - i == 1) tile_4xT(S + (size_t)i * lds + j, lds, kr, Q + (size_t)i * ldq, ldq, d, nr, 1, h16);
    }
    const __m256 vs = _mm256_set1_ps(scale);
    for (int i = 0; i < nq; i++) {
        float *row = S + (size_t)i * lds;
        int k = 0;
        for (; k + 8 <= t; k += 8) _mm256_storeu_ps(row + k, _mm256_mul_ps(vs, _mm256_loadu_ps(row + k)));
        for (; k < t; k++) row[k] *= scale;
    }
}
#define scores_multi_any scores_multi_fast
#else
#define scores_multi_any scores_multi_plain
#endif

void ops_attn_scores_multi_ref(float *S, int lds, const float *Q, int nq, int ldq, const float *K, int t, int d,
                               float scale)
{
    scores_multi_plain(S, lds, Q, nq, ldq, K, t, d, scale, 0);
}

void ops_attn_scores_multi(float *S, int lds, const float *Q, int nq, int ldq, const float *K, int t, int d,
                           float scale)
{
    scores_multi_any(S, lds, Q, nq, ldq, K, t, d, scale, 0);
}

void ops_attn_scores_multi_f16_ref(float *S, int lds, const float *Q, int nq, int ldq, const uint16_t *K, int t,
                                   int d, float scale)
{
    scores_multi_plain(S, lds, Q, nq, ldq, K, t, d, scale, 1);
}

void ops_attn_scores_multi_f16(float *S, int lds, const float *Q, int nq, int ldq, const uint16_t *K, int t, int d,
                               float scale)
{
    scores_multi_any(S, lds, Q, nq, ldq, K, t, d, scale, 1);
}

static void accum_multi_plain(float *O, int ldo, const float *P, int nq, const int *len, const void *V, int t,
                              int d, int h16)
{
    for (int i = 0; i < nq; i++)
        attn_accum_plain(O + (size_t)i * ldo, P + (size_t)i * t, V, NULL, len ? len[i] : t, d, h16);
}

#ifdef OPS_AVX2
/* Value rows [lo, l) added into one query's o: the rows beyond its group's shortest query. */
static void accum_rows_after(float *o, const float *p, const void *V, int lo, int l, int d, int h16)
{
    for (int j = lo; j < l; j++) {
        const void *v = kv_row(V, NULL, j, d, h16);
        if (!h16) { ops_axpy(o, p[j], v, d); continue; }
        for (int cc = 0; cc < d; cc++) o[cc] += p[j] * KV_AT(v, cc, 1);
    }
}

/* Four queries (rows p[0..3] of weights) over value rows 0..n, W columns (a constant multiple of
 * 8, at most 16) starting at column c: 4 x W/8 accumulators, each value load used four times. */
static inline __attribute__((always_inline)) void
accum_4q(float *const o[4], const float *const p[4], const void *V, int n, int d, int c, const int W, int nout,
         const int h16)
{
    __m256 a[4][2];
#pragma GCC unroll 4
    for (int q = 0; q < 4; q++)
#pragma GCC unroll 2
        for (int k = 0; k < W / 8; k++) a[q][k] = _mm256_setzero_ps();
    const size_t rb = (size_t)d * (h16 ? 2 : 4);
    const char *v = (const char *)V + (size_t)c * (h16 ? 2 : 4);
    for (int j = 0; j < n; j++, v += rb) {
        if (c == 0 && j + KV_AHEAD_ROWS(rb) < n) __builtin_prefetch(v + KV_AHEAD_ROWS(rb) * rb, 0, 0);
        __m256 vv[2];
#pragma GCC unroll 2
        for (int k = 0; k < W / 8; k++) {
            vv[k] = KV_LOAD8(v, 8 * k, h16);
            __asm__("" : "+x"(vv[k]));   /* one load for the four queries (see tile_4xT) */
        }
#pragma GCC unroll 4
        for (int q = 0; q < 4; q++) {
            const __m256 pq = _mm256_broadcast_ss(p[q] + j);
#pragma GCC unroll 2
            for (int k = 0; k < W / 8; k++) a[q][k] = _mm256_fmadd_ps(pq, vv[k], a[q][k]);
        }
    }
#pragma GCC unroll 4
    for (int q = 0; q < 4; q++)
        if (q < nout)
#pragma GCC unroll 2
            for (int k = 0; k < W / 8; k++) _mm256_storeu_ps(o[q] + c + 8 * k, a[q][k]);
}

/* Three queries (a GQA group of three, the default model's) over value rows 0..n, 32 columns
 * from c: 12 accumulators, each value load used three times; half the passes over the rows that
 * accum_4q's 16 columns take, and no fourth, wasted query. */
static inline __attribute__((always_inline)) void
accum_3q(float *const o[4], const float *const p[4], const void *V, int n, int d, int c, const int h16)
{
    __m256 a[3][4];
#pragma GCC unroll 3
    for (int q = 0; q < 3; q++)
#pragma GCC unroll 4
        for (int k = 0; k < 4; k++) a[q][k] = _mm256_setzero_ps();
    const size_t rb = (size_t)d * (h16 ? 2 : 4);
    const char *v = (const char *)V + (size_t)c * (h16 ? 2 : 4);
    for (int j = 0; j < n; j++, v += rb) {
        if (c == 0 && j + KV_AHEAD_ROWS(rb) < n) __builtin_prefetch(v + KV_AHEAD_ROWS(rb) * rb, 0, 0);
        const __m256 p0 = _mm256_broadcast_ss(p[0] + j), p1 = _mm256_broadcast_ss(p[1] + j),
                     p2 = _mm256_broadcast_ss(p[2] + j);
#pragma GCC unroll 4
        for (int k = 0; k < 4; k++) {
            const __m256 vk = KV_LOAD8(v, 8 * k, h16);
            a[0][k] = _mm256_fmadd_ps(p0, vk, a[0][k]);
            a[1][k] = _mm256_fmadd_ps(p1, vk, a[1][k]);
            a[2][k] = _mm256_fmadd_ps(p2, vk, a[2][k]);
        }
    }
#pragma GCC unroll 3
    for (int q = 0; q < 3; q++)
#pragma GCC unroll 4
        for (int k = 0; k < 4; k++) _mm256_storeu_ps(o[q] + c + 8 * k, a[q][k]);
}

#ifdef __AVX512F__
/* NQ queries (at most 6) over value rows 0..n, 64 columns from c: 4 NQ accumulators of 16
 * lanes, each value load used NQ times; d / 64 passes over the rows for the whole group, where
 * accum_4q takes d / 16 passes for every four queries (a 1.5B model's groups of six, d = 128:
 * 2 passes instead of 16, and no queries repeated to fill a tile). */
static inline __attribute__((always_inline)) void
accum_nq512(float *const o[8], const float *const p[8], const void *V, int n, int d, int c, const int NQ, const int h16)
{
    __m512 a[6][4];
#pragma GCC unroll 6
    for (int q = 0; q < NQ; q++)
#pragma GCC unroll 4
        for (int k = 0; k < 4; k++) a[q][k] = _mm512_setzero_ps();
    const size_t rb = (size_t)d * (h16 ? 2 : 4);
    const char *v = (const char *)V + (size_t)c * (h16 ? 2 : 4);
    for (int j = 0; j < n; j++, v += rb) {
        if (c == 0 && j + KV_AHEAD_ROWS(rb) < n) __builtin_prefetch(v + KV_AHEAD_ROWS(rb) * rb, 0, 0);
        __m512 vk[4];
#pragma GCC unroll 4
        for (int k = 0; k < 4; k++) vk[k] = KV_LOAD16(v, 16 * k, h16);
#pragma GCC unroll 6
        for (int q = 0; q < NQ; q++) {
            const __m512 pq = _mm512_set1_ps(p[q][j]);
#pragma GCC unroll 4
            for (int k = 0; k < 4; k++) a[q][k] = _mm512_fmadd_ps(pq, vk[k], a[q][k]);
        }
    }
#pragma GCC unroll 6
    for (int q = 0; q < NQ; q++)
#pragma GCC unroll 4
        for (int k = 0; k < 4; k++) _mm512_storeu_ps(o[q] + c + 16 * k, a[q][k]);
}

/* Queries i.. (up to six) of accum_multi_fast: rows to the shortest one's length for all of
 * them, the rest one query at a time. */
static void accum_group512(float *O, int ldo, const float *P, int i, int nout, const int *len, const void *V, int t,
                           int d, const int h16)
{
    float *o[8];
    const float *p[8];
    int lo = t;
    for (int q = 0; q < nout; q++) {
        o[q] = O + (size_t)(i + q) * ldo;
        p[q] = P + (size_t)(i + q) * t;
        const int l = len ? len[i + q] : t;
        if (l < lo) lo = l;
    }
    for (int c = 0; c < d; c += 64) switch (nout) {
        case 1: accum_nq512(o, p, V, lo, d, c, 1, h16); break;
        case 2: accum_nq512(o, p, V, lo, d, c, 2, h16); break;
        case 3: accum_nq512(o, p, V, lo, d, c, 3, h16); break;
        case 4: accum_nq512(o, p, V, lo, d, c, 4, h16); break;
        case 5: accum_nq512(o, p, V, lo, d, c, 5, h16); break;
        default: accum_nq512(o, p, V, lo, d, c, 6, h16); break;
        }
    for (int q = 0; q < nout; q++) accum_rows_after(o[q], p[q], V, lo, len ? len[i + q] : t, d, h16);
}
#endif

static inline __attribute__((always_inline)) void
accum_multi_fast(float *O, int ldo, const float *P, int nq, const int *len, const void *V, int t, int d,
                 const int h16)
{
#ifdef __AVX512F__
    if (d % 64 == 0) {
        for (int i = 0; i < nq; i += 6) accum_group512(O, ldo, P, i, nq - i < 6 ? nq - i : 6, len, V, t, d, h16);
        return;
    }
#endif
    for (int i = 0; i < nq; i += 4) {
        const int nout = nq - i < 4 ? nq - i : 4;
        float *o[4];
        const float *p[4];
        int lo = t;   /* rows every query of the group reads */
        for (int q = 0; q < 4; q++) {
            const int iq = i + (q < nout ? q : nout - 1);
            o[q] = O + (size_t)iq * ldo;
            p[q] = P + (size_t)iq * t;
            const int l = len ? len[iq] : t;
            if (l < lo) lo = l;
        }
        int c = 0;
        if (nout == 3)
            for (; c + 32 <= d; c += 32) accum_3q(o, p, V, lo, d, c, h16);
        for (; c + 16 <= d; c += 16) accum_4q(o, p, V, lo, d, c, 16, nout, h16);
        for (; c + 8 <= d; c += 8) accum_4q(o, p, V, lo, d, c, 8, nout, h16);
        for (int q = 0; q < nout; q++) {
            for (int cc = c; cc < d; cc++) {
                float s = 0;
                for (int j = 0; j < lo; j++) s += p[q][j] * KV_AT(kv_row(V, NULL, j, d, h16), cc, h16);
                o[q][cc] = s;
            }
            accum_rows_after(o[q], p[q], V, lo, len ? len[i + q] : t, d, h16);
        }
    }
}
#define accum_multi_any accum_multi_fast
#else
#define accum_multi_any accum_multi_plain
#endif

void ops_attn_accum_multi_ref(float *O, int ldo, const float *P, int nq, const int *len, const float *V, int t,
                              int d)
{
    accum_multi_plain(O, ldo, P, nq, len, V, t, d, 0);
}

void ops_attn_accum_multi(float *O, int ldo, const float *P, int nq, const int *len, const float *V, int t, int d)
{
    accum_multi_any(O, ldo, P, nq, len, V, t, d, 0);
}

void ops_attn_accum_multi_f16_ref(float *O, int ldo, const float *P, int nq, const int *len, const uint16_t *V,
                                  int t, int d)
{
    accum_multi_plain(O, ldo, P, nq, len, V, t, d, 1);
}

void ops_attn_accum_multi_f16(float *O, int ldo, const float *P, int nq, const int *len, const uint16_t *V, int t,
                              int d)
{
    accum_multi_any(O, ldo, P, nq, len, V, t, d, 1);
}

/* ---- f16 conversion (round to nearest even, as gguf_f32_to_f16) ------------------------------ */

void ops_f32_to_f16_ref(uint16_t *y, const float *x, int n)
{
    for (int i = 0; i < n; i++) y[i] = gguf_f32_to_f16(x[i]);
}

void ops_f32_to_f16(uint16_t *y, const float *x, int n)
{
    int i = 0;
#ifdef OPS_AVX2
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(y + i), _mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT));
#endif
    for (; i < n; i++) y[i] = gguf_f32_to_f16(x[i]);
}

void ops_f16_to_f32(float *y, const uint16_t *x, int n)
{
    int i = 0;
#ifdef OPS_AVX2
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(x + i))));
#endif
    for (; i < n; i++) y[i] = gguf_f16_to_f32(x[i]);
}

/* ---- element-wise ---------------------------------------------------------------------------- */

void ops_rmsnorm(float *out, const float *x, const float *gamma, int n, float eps)
{
    double ss = 0;
    for (int i = 0; i < n; i++) ss += (double)x[i] * x[i];
    float scale = 1.0f / sqrtf((float)(ss / n) + eps);
    for (int i = 0; i < n; i++) out[i] = x[i] * scale * gamma[i];
}

/* The fast exp's constants, one set for every width: its range, log2(e), ln2 in two parts (the
 * first exact in a few bits), and Cephes' degree-7 expf polynomial from the top term down. */
#define EXP_HI 88.3762626647949f
#define EXP_LO (-87.3365478515625f)
#define EXP_LOG2E 1.44269504088896341f
#define EXP_LN2_HI 0.693359375f
#define EXP_LN2_LO (-2.12194440e-4f)
#define EXP_P5 1.9875691500e-4f
#define EXP_P4 1.3981999507e-3f
#define EXP_P3 8.3334519073e-3f
#define EXP_P2 4.1665795894e-2f
#define EXP_P1 1.6666665459e-1f
#define EXP_P0 5.0000001201e-1f

/* expf with the fast exp's range: 0 below -87.336 (under FLT_MIN), exp(88.376) above 88.376;
 * for the tails of the vector loops and the build without AVX2, so that every element of every
 * build follows the same rule. */
static inline float exp_clamped(float x)
{
    if (x < EXP_LO) return 0;
    return expf(x < EXP_HI ? x : EXP_HI);
}

#ifdef OPS_AVX2
/* exp(x) for eight floats, within 2e-7 relative of expf (tests/test_ops.c measures it): x = n ln2
 * + r with |r| <= ln2/2, exp(r) by Cephes' degree-7 expf polynomial, 2^n put into the exponent.
 * Inputs above 88.376 give exp(88.376) (about 2.4e38, not inf); below -87.336 (results under
 * FLT_MIN) give 0; NaN is not propagated. */
static inline __m256 exp256(__m256 x)
{
    const __m256 hi = _mm256_set1_ps(EXP_HI), lo = _mm256_set1_ps(EXP_LO);
    const __m256 zero = _mm256_cmp_ps(x, lo, _CMP_LT_OQ);
    x = _mm256_max_ps(_mm256_min_ps(x, hi), lo);
    const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(EXP_LOG2E)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(EXP_LN2_HI), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(EXP_LN2_LO), r);
    __m256 p = _mm256_set1_ps(EXP_P5);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(EXP_P4));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(EXP_P3));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(EXP_P2));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(EXP_P1));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(EXP_P0));
    p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
    const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_andnot_ps(zero, _mm256_mul_ps(p, _mm256_castsi256_ps(e)));
}

void ops_exp(float *y, const float *x, int n)
{
    int i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, exp256(_mm256_loadu_ps(x + i)));
    for (; i < n; i++) y[i] = exp_clamped(x[i]);
}
#else
void ops_exp(float *y, const float *x, int n)
{
    for (int i = 0; i < n; i++) y[i] = exp_clamped(x[i]);
}
#endif

float ops_exp_shifted_ref(float *y, const float *x, int n, float scale, double *sum)
{
    float mx = -INFINITY;
    for (int i = 0; i < n; i++) mx = x[i] > mx ? x[i] : mx;
    double s = 0;
    for (int i = 0; i < n; i++) s += y[i] = exp_clamped((x[i] - mx) * scale);
    *sum = s;
    return mx;
}

#ifdef __AVX512F__
/* exp256's steps 16 wide, 2^n applied by scalef */
static inline __m512 exp512(__m512 x)
{
    const __m512 hi = _mm512_set1_ps(EXP_HI), lo = _mm512_set1_ps(EXP_LO);
    const __mmask16 keep = _mm512_cmp_ps_mask(x, lo, _CMP_GE_OQ);
    x = _mm512_max_ps(_mm512_min_ps(x, hi), lo);
    const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(EXP_LOG2E)),
                                          _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(EXP_LN2_HI), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(EXP_LN2_LO), r);
    __m512 p = _mm512_set1_ps(EXP_P5);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(EXP_P4));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(EXP_P3));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(EXP_P2));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(EXP_P1));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(EXP_P0));
    p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
    return _mm512_maskz_scalef_ps(keep, p, n);
}
#endif

/* ---- flash attention with the queries in the vector lanes (ops.h: ops_attn_flash) ------------- */

size_t ops_attn_flash_floats(int nh, int d)
{
    return (size_t)nh * d * 64 + 2 * (size_t)OPS_FLASH_TILE * d + (size_t)OPS_FLASH_TILE * 64;   /* Qt, Kf, Vf, St */
}

#ifdef OPS_AVX2
/* One kernel in either width: FW lanes (queries) a vector, FNV query vectors by 6 keys in a score
 * tile and 6 queries by FU value vectors in an accumulation, as many as the registers hold (32 of
 * 16 lanes with AVX-512, 16 of 8 with AVX2). fv_max_if / fv_zero_unless act on the lanes whose
 * length n exceeds j. */
#ifdef __AVX512F__
#define FW 16
#define FNV 4
#define FU 4
typedef __m512 fv;
typedef __m512i iv;
#define fv_(op) _mm512_##op##_ps
#define iv_load(p) _mm512_loadu_si512(p)
#define iv_sub _mm512_sub_epi32
#define iv_set1 _mm512_set1_epi32
#define fv_exp exp512
#define fv_max_if(a, x, n, j) _mm512_mask_max_ps(a, _mm512_cmpgt_epi32_mask(n, iv_set1(j)), a, x)
#define fv_zero_unless(x, n, j) _mm512_maskz_mov_ps(_mm512_cmpgt_epi32_mask(n, iv_set1(j)), x)
#else
#define FW 8
#define FNV 2
#define FU 2
typedef __m256 fv;
typedef __m256i iv;
#define fv_(op) _mm256_##op##_ps
#define iv_load(p) _mm256_loadu_si256((const __m256i *)(p))
#define iv_sub _mm256_sub_epi32
#define iv_set1 _mm256_set1_epi32
#define fv_exp exp256
#define fv_lanes(n, j) _mm256_castsi256_ps(_mm256_cmpgt_epi32(n, iv_set1(j)))
#define fv_max_if(a, x, n, j) _mm256_blendv_ps(a, _mm256_max_ps(a, x), fv_lanes(n, j))
#define fv_zero_unless(x, n, j) _mm256_and_ps(x, fv_lanes(n, j))
#endif
#define FQ (64 / FW)   /* query vectors at most */

/* R keys (rows of Kf, d apart) against NV vectors of queries (Qt, a dim per row, QS floats apart),
 * into R rows of St: each key value is broadcast once for NV x FW queries. */
static inline __attribute__((always_inline)) void
flash_scores(float *St, int QS, const float *Qt, const float *Kf, int d, const int R, const int NV)
{
    fv a[6][FNV];
#pragma GCC unroll 6
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int v = 0; v < NV; v++) a[r][v] = fv_(setzero)();
    for (int c = 0; c < d; c++) {
        fv q[FNV];
#pragma GCC unroll 4
        for (int v = 0; v < NV; v++) q[v] = fv_(loadu)(Qt + (size_t)c * QS + FW * v);
#pragma GCC unroll 6
        for (int r = 0; r < R; r++) {
            const fv k = fv_(set1)(Kf[(size_t)r * d + c]);
#pragma GCC unroll 4
            for (int v = 0; v < NV; v++) a[r][v] = fv_(fmadd)(k, q[v], a[r][v]);
        }
    }
#pragma GCC unroll 6
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int v = 0; v < NV; v++) fv_(storeu)(St + (size_t)r * QS + FW * v, a[r][v]);
}

/* Output rows i0..i0+R-1, dims c0..c0+FW U-1: scaled by their queries' al, plus the b weighted
 * rows of Vf (weights Pt[j QS + i]): each value load serves R queries. */
static inline __attribute__((always_inline)) void
flash_accum(float *O, int ldo, const float *al, const float *Pt, int QS, const float *Vf, int b, int d, int i0, int c0,
            const int R, const int U)
{
    fv a[6][FU];
#pragma GCC unroll 6
    for (int r = 0; r < R; r++) {
        const fv s = fv_(set1)(al[i0 + r]);
        const float *o = O + (size_t)(i0 + r) * ldo + c0;
#pragma GCC unroll 4
        for (int u = 0; u < U; u++) a[r][u] = fv_(mul)(s, fv_(loadu)(o + FW * u));
    }
    for (int j = 0; j < b; j++) {
        fv v[FU];
#pragma GCC unroll 4
        for (int u = 0; u < U; u++) v[u] = fv_(loadu)(Vf + (size_t)j * d + c0 + FW * u);
#pragma GCC unroll 6
        for (int r = 0; r < R; r++) {
            const fv p = fv_(set1)(Pt[(size_t)j * QS + i0 + r]);
#pragma GCC unroll 4
            for (int u = 0; u < U; u++) a[r][u] = fv_(fmadd)(p, v[u], a[r][u]);
        }
    }
#pragma GCC unroll 6
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int u = 0; u < U; u++) fv_(storeu)(O + (size_t)(i0 + r) * ldo + c0 + FW * u, a[r][u]);
}

/* R keys from row j against nv query vectors from Sv's and Qv's (at most FNV); the accumulation of
 * U value vectors (at most FU). Cases past the width's registers fold into the last (never run). */
#define FLASH_SCORES(R, nv)                                                                                            \
    switch (nv) {                                                                                                      \
    case 1: flash_scores(Sv + (size_t)j * QS, QS, Qv, kf + (size_t)j * d, d, R, 1); break;                           \
    case 2: flash_scores(Sv + (size_t)j * QS, QS, Qv, kf + (size_t)j * d, d, R, 2); break;                           \
    case 3: flash_scores(Sv + (size_t)j * QS, QS, Qv, kf + (size_t)j * d, d, R, FNV < 3 ? FNV : 3); break;           \
    default: flash_scores(Sv + (size_t)j * QS, QS, Qv, kf + (size_t)j * d, d, R, FNV); break;                        \
    }
#define FLASH_ACCUM(R, U)                                                                                              \
    switch (U) {                                                                                                       \
    case 1: flash_accum(Ok, ldo, al, St, QS, vf, b, d, i0, c0, R, 1); break;                                          \
    case 2: flash_accum(Ok, ldo, al, St, QS, vf, b, d, i0, c0, R, 2); break;                                          \
    case 3: flash_accum(Ok, ldo, al, St, QS, vf, b, d, i0, c0, R, FU < 3 ? FU : 3); break;                            \
    default: flash_accum(Ok, ldo, al, St, QS, vf, b, d, i0, c0, R, FU); break;                                        \
    }

int ops_attn_flash(float *O, int ldo, const float *Q, int nq, int ldq, int nh, int hstride, const void *K,
                   const void *V, int h16, int t, const int *len, int d, float scale, float *work)
{
    if (nq < 1 || nq > 64 || nh < 1 || nh > 8 || d % 16 || d > 256) return -1;
    const int NV = (nq + FW - 1) / FW, QS = FW * NV;
    float *Kf = work + (size_t)nh * d * 64, *Vf = Kf + (size_t)OPS_FLASH_TILE * d;
    float *St = Vf + (size_t)OPS_FLASH_TILE * d, al[64], sum[64];
    fv ms[8][FQ], ls[8][FQ];
    iv L[FQ];
    for (int v = 0; v < NV; v++) {
        int lv[FW];
        for (int k = 0; k < FW; k++) lv[k] = FW * v + k < nq ? len[FW * v + k] : 0;
        L[v] = iv_load(lv);
    }
    for (int k = 0; k < nh; k++) {   /* each head's queries, scaled, one dim per row; lanes past nq zero */
        float *Qt = work + (size_t)k * d * 64;
        const float *Qk = Q + (size_t)k * hstride;
        for (int c = 0; c < d; c++)
            for (int i = 0; i < QS; i++) Qt[(size_t)c * QS + i] = i < nq ? Qk[(size_t)i * ldq + c] * scale : 0.0f;
        for (int v = 0; v < NV; v++) ms[k][v] = fv_(set1)(-INFINITY), ls[k][v] = fv_(setzero)();
        for (int i = 0; i < nq; i++) memset(O + (size_t)k * hstride + (size_t)i * ldo, 0, sizeof(float) * d);
    }
    const size_t rb = (size_t)d * (h16 ? 2 : 4);
    for (int j0 = 0; j0 < t; j0 += OPS_FLASH_TILE) {
        const int b = t - j0 < OPS_FLASH_TILE ? t - j0 : OPS_FLASH_TILE;
        const char *kr = (const char *)K + (size_t)j0 * rb, *vr = (const char *)V + (size_t)j0 * rb;
        const float *kf = (const float *)kr, *vf = (const float *)vr;   /* f32 rows: read in place */
        if (h16) {
            ops_f16_to_f32(Kf, (const uint16_t *)kr, b * d);
            ops_f16_to_f32(Vf, (const uint16_t *)vr, b * d);
            kf = Kf, vf = Vf;
        }
        for (int k = 0; k < nh; k++) {   /* the heads in turn over the tile, converted once */
            const float *Qt = work + (size_t)k * d * 64;
            fv *m = ms[k], *l = ls[k];
            float *Ok = O + (size_t)k * hstride;
            for (int v0 = 0; v0 < NV; v0 += FNV) {
                const int nv = NV - v0 < FNV ? NV - v0 : FNV;
                float *Sv = St + FW * v0;
                const float *Qv = Qt + FW * v0;
                int j = 0;
                for (; j + 6 <= b; j += 6) FLASH_SCORES(6, nv)
                for (; j < b; j++) FLASH_SCORES(1, nv)
            }
            /* each query's running max and sum; the tile's weights in place of its scores (zero past
             * the query's length) */
            for (int v = 0; v < NV; v++) {
                const iv nv = iv_sub(L[v], iv_set1(j0));
                fv tm = fv_(set1)(-INFINITY);
                for (int jj = 0; jj < b; jj++) tm = fv_max_if(tm, fv_(loadu)(St + (size_t)jj * QS + FW * v), nv, jj);
                const fv M = fv_(max)(m[v], tm), a = fv_exp(fv_(sub)(m[v], M));
                fv ts = fv_(setzero)();
                for (int jj = 0; jj < b; jj++) {
                    float *row = St + (size_t)jj * QS + FW * v;
                    const fv p = fv_zero_unless(fv_exp(fv_(sub)(fv_(loadu)(row), M)), nv, jj);
                    fv_(storeu)(row, p);
                    ts = fv_(add)(ts, p);
                }
                l[v] = fv_(fmadd)(l[v], a, ts), m[v] = M;
                fv_(storeu)(al + FW * v, a);
            }
            for (int i0 = 0; i0 < nq; i0 += 6)
                for (int c0 = 0; c0 < d; c0 += FW * FU) {
                    const int U = (d - c0) / FW < FU ? (d - c0) / FW : FU;
                    switch (nq - i0 < 6 ? nq - i0 : 6) {
                    case 1: FLASH_ACCUM(1, U) break;
                    case 2: FLASH_ACCUM(2, U) break;
                    case 3: FLASH_ACCUM(3, U) break;
                    case 4: FLASH_ACCUM(4, U) break;
                    case 5: FLASH_ACCUM(5, U) break;
                    default: FLASH_ACCUM(6, U) break;
                    }
                }
        }
    }
    for (int k = 0; k < nh; k++) {
        for (int v = 0; v < NV; v++) fv_(storeu)(sum + FW * v, ls[k][v]);
        for (int i = 0; i < nq; i++) {
            const float inv = 1.0f / sum[i];
            float *o = O + (size_t)k * hstride + (size_t)i * ldo;
            for (int c = 0; c < d; c++) o[c] *= inv;
        }
    }
    return 0;
}
#undef FLASH_SCORES
#undef FLASH_ACCUM
#undef FW
#undef FNV
#undef FU
#undef FQ
#undef fv_
#undef fv_exp
#undef fv_max_if
#undef fv_zero_unless
#undef fv_lanes
#undef iv_load
#undef iv_sub
#undef iv_set1
#else
int ops_attn_flash(float *O, int ldo, const float *Q, int nq, int ldq, int nh, int hstride, const void *K,
                   const void *V, int h16, int t, const int *len, int d, float scale, float *work)
{
    return -1;
}
#endif

/* 2^f on [-1/2, 1/2] by a degree-4 polynomial fitted here for least relative error (2.6e-6) */
#define EXP2_Q0 0.99999926f
#define EXP2_Q1 0.69312183f
#define EXP2_Q2 0.24024745f
#define EXP2_Q3 0.05591776f
#define EXP2_Q4 0.00957005f
/* The polynomial at f by Horner's rule, in any vector width (FMA and SET1: its intrinsics) */
#define EXP2_POLY(FMA, SET1, f) \
    FMA(FMA(FMA(FMA(SET1(EXP2_Q4), f, SET1(EXP2_Q3)), f, SET1(EXP2_Q2)), f, SET1(EXP2_Q1)), f, SET1(EXP2_Q0))

static inline float exp2_est(float x)
{
    if (x < -150) return 0;
    const float n = rintf(x), f = x - n;
    return ldexpf(EXP2_Q0 + f * (EXP2_Q1 + f * (EXP2_Q2 + f * (EXP2_Q3 + f * EXP2_Q4))), (int)n);
}

/* ops_exp_sum_est's body: the sum of 2^(a x[i] + b) over x[0..n); *above |= some x[i] > mx.
 * Inlined into both callers, so a block at a time costs no call. */
static inline double exp_sum_est_run(const float *x, int n, float a, float b, float mx, int *above_out)
{
    int i = 0, above = 0;
    double s = 0;
#ifdef __AVX512F__
    const __m512 va = _mm512_set1_ps(a), vb = _mm512_set1_ps(b), vm = _mm512_set1_ps(mx);
    const __m512 lo = _mm512_set1_ps(-150.0f);
    __m512 acc = _mm512_setzero_ps();
    __mmask16 up = 0;
    for (; i + 16 <= n; i += 16) {
        const __m512 v = _mm512_loadu_ps(x + i);
        up |= _mm512_cmp_ps_mask(v, vm, _CMP_GT_OQ);
        const __m512 t = _mm512_max_ps(_mm512_fmadd_ps(v, va, vb), lo);
        const __m512 k = _mm512_roundscale_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        const __m512 f = _mm512_sub_ps(t, k);
        const __m512 q = EXP2_POLY(_mm512_fmadd_ps, _mm512_set1_ps, f);
        acc = _mm512_add_ps(acc, _mm512_scalef_ps(q, k));
    }
    s = _mm512_reduce_add_ps(acc);
    above = up != 0;
#elif defined(OPS_AVX2)
    /* 2^k by the exponent field: k >= -126 stays normal; below it the value is under 2^-126 of
     * the max's 1 and counts as 0 (the scalar end gives it as a subnormal). */
    const __m256 va = _mm256_set1_ps(a), vb = _mm256_set1_ps(b), vm = _mm256_set1_ps(mx);
    const __m256 lo = _mm256_set1_ps(-126.0f);
    __m256 acc = _mm256_setzero_ps(), up = _mm256_setzero_ps();
    for (; i + 8 <= n; i += 8) {
        const __m256 v = _mm256_loadu_ps(x + i);
        up = _mm256_or_ps(up, _mm256_cmp_ps(v, vm, _CMP_GT_OQ));
        const __m256 t = _mm256_fmadd_ps(v, va, vb);
        const __m256 k = _mm256_round_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        const __m256 f = _mm256_sub_ps(t, k);
        const __m256 q = EXP2_POLY(_mm256_fmadd_ps, _mm256_set1_ps, f);
        const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(k), _mm256_set1_epi32(127)), 23);
        const __m256 keep = _mm256_cmp_ps(k, lo, _CMP_GE_OQ);
        acc = _mm256_add_ps(acc, _mm256_and_ps(keep, _mm256_mul_ps(q, _mm256_castsi256_ps(e))));
    }
    s = hsum256(acc);
    above = _mm256_movemask_ps(up) != 0;
#endif
    for (; i < n; i++) {
        above |= x[i] > mx;
        s += exp2_est(a * x[i] + b);
    }
    *above_out |= above;
    return s;
}

double ops_exp_sum_est(const float *x, int n, float mx, float scale)
{
    const float a = scale * EXP_LOG2E, b = -mx * a;   /* exp((x - mx) scale) = 2^(a x + b) */
    int above = 0;
    const double s = exp_sum_est_run(x, n, a, b, mx, &above);
    return above ? -1 : s;
}

double ops_exp_sum_blocks(double *zb, const float *x, int lo, int hi, int B, float mx, float scale)
{
    const float a = scale * EXP_LOG2E, b = -mx * a;
    int above = 0;
    double s = 0;
    for (int k = lo / B, r = lo; r < hi; k++) {
        const int e = (k + 1) * B < hi ? (k + 1) * B : hi;
        s += zb[k - lo / B] = exp_sum_est_run(x + r, e - r, a, b, mx, &above);
        r = e;
    }
    return above ? -1 : s;
}

float ops_max(const float *x, int n)
{
    float mx = -INFINITY;
    int i = 0;
#ifdef __AVX512F__
    if (n >= 16) {
        __m512 vmx = _mm512_loadu_ps(x);
        for (i = 16; i + 16 <= n; i += 16) vmx = _mm512_max_ps(vmx, _mm512_loadu_ps(x + i));
        mx = _mm512_reduce_max_ps(vmx);
    }
#endif
    for (; i < n; i++) mx = x[i] > mx ? x[i] : mx;
    return mx;
}

void ops_exp_from(float *y, const float *x, int n, float mx, float scale, double *sum)
{
    int i = 0;
    double s = 0;
#ifdef __AVX512F__
    const __m512 m = _mm512_set1_ps(mx), sc = _mm512_set1_ps(scale);
    __m512 acc = _mm512_setzero_ps();
    for (; i + 16 <= n; i += 16) {
        const __m512 e = exp512(_mm512_mul_ps(_mm512_sub_ps(_mm512_loadu_ps(x + i), m), sc));
        _mm512_storeu_ps(y + i, e);
        acc = _mm512_add_ps(acc, e);
    }
    s = _mm512_reduce_add_ps(acc);
#elif defined(OPS_AVX2)
    const __m256 m = _mm256_set1_ps(mx), sc = _mm256_set1_ps(scale);
    __m256 acc = _mm256_setzero_ps();
    for (; i + 8 <= n; i += 8) {
        const __m256 e = exp256(_mm256_mul_ps(_mm256_sub_ps(_mm256_loadu_ps(x + i), m), sc));
        _mm256_storeu_ps(y + i, e);
        acc = _mm256_add_ps(acc, e);
    }
    float lane[8];
    _mm256_storeu_ps(lane, acc);
    for (int j = 0; j < 8; j++) s += lane[j];
#endif
    for (; i < n; i++) s += y[i] = exp_clamped((x[i] - mx) * scale);
    *sum = s;
}

float ops_exp_shifted(float *y, const float *x, int n, float scale, double *sum)
{
    const float mx = ops_max(x, n);
    ops_exp_from(y, x, n, mx, scale, sum);
    return mx;
}

void ops_softmax_ref(float *x, int n)
{
    float max = x[0];
    for (int i = 1; i < n; i++) if (x[i] > max) max = x[i];
    float sum = 0;
    for (int i = 0; i < n; i++) { x[i] = expf(x[i] - max); sum += x[i]; }
    float inv = 1.0f / sum;
    for (int i = 0; i < n; i++) x[i] *= inv;
}

void ops_softmax(float *x, int n)
{
#ifdef OPS_AVX2
    int i = 0;
    __m256 vmax = _mm256_set1_ps(x[0]);
    for (; i + 8 <= n; i += 8) vmax = _mm256_max_ps(vmax, _mm256_loadu_ps(x + i));
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(vmax), _mm256_extractf128_ps(vmax, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
    float max = _mm_cvtss_f32(m4);
    for (; i < n; i++) if (x[i] > max) max = x[i];
    const __m256 vm = _mm256_set1_ps(max);
    __m256 vsum = _mm256_setzero_ps();
    for (i = 0; i + 8 <= n; i += 8) {
        __m256 e = exp256(_mm256_sub_ps(_mm256_loadu_ps(x + i), vm));
        _mm256_storeu_ps(x + i, e);
        vsum = _mm256_add_ps(vsum, e);
    }
    float sum = hsum256(vsum);
    for (; i < n; i++) { x[i] = exp_clamped(x[i] - max); sum += x[i]; }
    const __m256 inv = _mm256_set1_ps(1.0f / sum);
    for (i = 0; i + 8 <= n; i += 8) _mm256_storeu_ps(x + i, _mm256_mul_ps(inv, _mm256_loadu_ps(x + i)));
    for (; i < n; i++) x[i] *= 1.0f / sum;
#else
    ops_softmax_ref(x, n);
#endif
}

void ops_swiglu_ref(float *a, const float *b, int n)
{
    for (int i = 0; i < n; i++) a[i] = a[i] / (1.0f + expf(-a[i])) * b[i];
}

void ops_swiglu(float *a, const float *b, int n)
{
#ifdef OPS_AVX2
    int i = 0;
    const __m256 one = _mm256_set1_ps(1.0f);
    for (; i + 8 <= n; i += 8) {
        __m256 v = _mm256_loadu_ps(a + i);
        __m256 e = exp256(_mm256_sub_ps(_mm256_setzero_ps(), v));
        _mm256_storeu_ps(a + i, _mm256_mul_ps(_mm256_div_ps(v, _mm256_add_ps(one, e)), _mm256_loadu_ps(b + i)));
    }
    for (; i < n; i++) a[i] = a[i] / (1.0f + exp_clamped(-a[i])) * b[i];
#else
    ops_swiglu_ref(a, b, n);
#endif
}

/* gelu(x) = x / 2 (1 + tanh(u)), u = sqrt(2/pi) (x + 0.044715 x^3); written as x / (1 + exp(-2u)),
 * which equals it and needs only exp. */
void ops_geglu_ref(float *a, const float *b, int n)
{
    for (int i = 0; i < n; i++) {
        const float x = a[i], u = 0.7978845608f * (x + 0.044715f * x * x * x);
        a[i] = 0.5f * x * (1 + tanhf(u)) * b[i];
    }
}

void ops_geglu(float *a, const float *b, int n)
{
    int i = 0;
#ifdef OPS_AVX2
    const __m256 one = _mm256_set1_ps(1.0f), k0 = _mm256_set1_ps(-2 * 0.7978845608f), k1 = _mm256_set1_ps(0.044715f);
    for (; i + 8 <= n; i += 8) {
        const __m256 x = _mm256_loadu_ps(a + i);
        const __m256 u2 = _mm256_mul_ps(k0, _mm256_fmadd_ps(_mm256_mul_ps(k1, x), _mm256_mul_ps(x, x), x));
        const __m256 g = _mm256_div_ps(x, _mm256_add_ps(one, exp256(u2)));
        _mm256_storeu_ps(a + i, _mm256_mul_ps(g, _mm256_loadu_ps(b + i)));
    }
#endif
    for (; i < n; i++) {
        const float x = a[i], u = 0.7978845608f * (x + 0.044715f * x * x * x);
        a[i] = x / (1 + exp_clamped(-2 * u)) * b[i];
    }
}

/* ---- TIP over 4-bit keys (ops.h: ops_tip_q4) ------------------------------------------------- */

void ops_tip_q4_ref(float *S, int ldo, const int8_t *qi, int ldq, const int32_t *qsum, const float *qscale,
                    const float *bias, int ldb, int nq, const uint8_t *tiles, const uint16_t *kscale, int n_tiles,
                    int tw)
{
    const size_t tile = (size_t)tw / 8 * 64;
    for (int t = 0; t < n_tiles; t++)
        for (int r = 0; r < 16; r++)
            for (int h = 0; h < nq; h++) {
                int32_t dot = 0;
                for (int j = 0; j < tw / 8; j++)
                    for (int b = 0; b < 4; b++) {
                        const uint8_t v = tiles[t * tile + (size_t)j * 64 + 4 * r + b];
                        dot +=
                            (v & 15) * qi[(size_t)h * ldq + 8 * j + b] + (v >> 4) * qi[(size_t)h * ldq + 8 * j + 4 + b];
                    }
                float ks;
                ops_f16_to_f32(&ks, kscale + 16 * t + r, 1);
                S[(size_t)h * ldo + 16 * t + r] =
                    fmaf((float)(dot - 8 * qsum[h]), ks * qscale[h], bias[(size_t)h * ldb + t]);
            }
}

/* Tiles TIP prefetches ahead of the one it scores: TIP_AHEAD bytes (simd.h), at least two. */
static inline int tip_ahead(int ng) { return TIP_AHEAD / (ng * 64) > 2 ? TIP_AHEAD / (ng * 64) : 2; }   /* tiles */

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__)
/* A tile's 16 rows are the 16 lanes of one register: each vpdpbusd adds, per row, a 4-dim slice
 * of the dot product (the row's 4 nibbles times the query's 4 bytes, broadcast), so no
 * horizontal sums are needed. NQ is a constant (tip_q4 dispatches on nq), so that the NQ
 * accumulators stay in registers: with a variable count they lived on the stack, cleared by a
 * call to memset per tile, and the kernel ran at 60% of this speed. */
static inline __attribute__((always_inline)) void
tip_q4_nq(float *S, int ldo, const int8_t *qi, int ldq, const int32_t *qsum, const float *qscale, const float *bias,
          int ldb, const int NQ, const uint8_t *tiles, const uint16_t *kscale, int n_tiles, int tw)
{
    const int ng = tw / 8;
    const __m512i nib = _mm512_set1_epi8(0x0F);
    __m512i off[8];
    __m512 qs[8];
#pragma GCC unroll 8
    for (int h = 0; h < NQ; h++) off[h] = _mm512_set1_epi32(8 * qsum[h]), qs[h] = _mm512_set1_ps(qscale[h]);
    const int ahead = tip_ahead(ng);
    for (int t = 0; t < n_tiles; t++, tiles += (size_t)ng * 64) {
        __m512i acc[8];
#pragma GCC unroll 8
        for (int h = 0; h < NQ; h++) acc[h] = _mm512_setzero_si512();
        if (t + ahead < n_tiles) prefetch_bytes(tiles + ahead * (size_t)ng * 64, (size_t)ng * 64);
        for (int j = 0; j < ng; j++) {
            const __m512i v = _mm512_loadu_si512(tiles + (size_t)j * 64);
            const __m512i lo = _mm512_and_si512(v, nib), hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), nib);
#pragma GCC unroll 8
            for (int h = 0; h < NQ; h++) {
                int32_t a, b;
                memcpy(&a, qi + (size_t)h * ldq + 8 * j, 4);
                memcpy(&b, qi + (size_t)h * ldq + 8 * j + 4, 4);
                acc[h] = _mm512_dpbusd_epi32(acc[h], lo, _mm512_set1_epi32(a));
                acc[h] = _mm512_dpbusd_epi32(acc[h], hi, _mm512_set1_epi32(b));
            }
        }
        const __m512 ks = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(kscale + 16 * t)));
#pragma GCC unroll 8
        for (int h = 0; h < NQ; h++) {
            const __m512 d = _mm512_cvtepi32_ps(_mm512_sub_epi32(acc[h], off[h]));
            _mm512_storeu_ps(S + (size_t)h * ldo + 16 * t,
                             _mm512_fmadd_ps(d, _mm512_mul_ps(ks, qs[h]), _mm512_set1_ps(bias[(size_t)h * ldb + t])));
        }
    }
}

#elif defined(OPS_AVX2)
/* Eight rows per register: vpmaddubsw multiplies the nibbles by the query bytes and adds pairs
 * (at most 2 x 15 x 127, no saturation), vpmaddwd by ones adds the pairs into a row's 4-dim sum.
 * NQ a constant, as in the AVX-512 kernel. */
static inline __attribute__((always_inline)) void
tip_q4_nq(float *S, int ldo, const int8_t *qi, int ldq, const int32_t *qsum, const float *qscale, const float *bias,
          int ldb, const int NQ, const uint8_t *tiles, const uint16_t *kscale, int n_tiles, int tw)
{
    const int ng = tw / 8;
    const __m256i nib = _mm256_set1_epi8(0x0F), ones = _mm256_set1_epi16(1);
    const int ahead = tip_ahead(ng);
    for (int t = 0; t < n_tiles; t++, tiles += (size_t)ng * 64) {
        if (t + ahead < n_tiles) prefetch_bytes(tiles + ahead * (size_t)ng * 64, (size_t)ng * 64);
        for (int half = 0; half < 2; half++) {
            __m256i acc[8];
#pragma GCC unroll 8
            for (int h = 0; h < NQ; h++) acc[h] = _mm256_setzero_si256();
            for (int j = 0; j < ng; j++) {
                const __m256i v = _mm256_loadu_si256((const __m256i *)(tiles + (size_t)j * 64 + 32 * half));
                const __m256i lo = _mm256_and_si256(v, nib), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), nib);
#pragma GCC unroll 8
                for (int h = 0; h < NQ; h++) {
                    int32_t a, b;
                    memcpy(&a, qi + (size_t)h * ldq + 8 * j, 4);
                    memcpy(&b, qi + (size_t)h * ldq + 8 * j + 4, 4);
                    const __m256i pa = _mm256_maddubs_epi16(lo, _mm256_set1_epi32(a));
                    const __m256i pb = _mm256_maddubs_epi16(hi, _mm256_set1_epi32(b));
                    acc[h] = _mm256_add_epi32(acc[h], _mm256_madd_epi16(_mm256_add_epi16(pa, pb), ones));
                }
            }
            const __m256 ks = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(kscale + 16 * t + 8 * half)));
#pragma GCC unroll 8
            for (int h = 0; h < NQ; h++) {
                const __m256i d = _mm256_sub_epi32(acc[h], _mm256_set1_epi32(8 * qsum[h]));
                _mm256_storeu_ps(S + (size_t)h * ldo + 16 * t + 8 * half,
                                 _mm256_fmadd_ps(_mm256_cvtepi32_ps(d), _mm256_mul_ps(ks, _mm256_set1_ps(qscale[h])),
                                                 _mm256_set1_ps(bias[(size_t)h * ldb + t])));
            }
        }
    }
}
#endif

#if defined(OPS_AVX2) || (defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__))
void ops_tip_q4(float *S, int ldo, const int8_t *qi, int ldq, const int32_t *qsum, const float *qscale,
                const float *bias, int ldb, int nq, const uint8_t *tiles, const uint16_t *kscale, int n_tiles, int tw)
{
    switch (nq) {
    case 1: tip_q4_nq(S, ldo, qi, ldq, qsum, qscale, bias, ldb, 1, tiles, kscale, n_tiles, tw); break;
    case 2: tip_q4_nq(S, ldo, qi, ldq, qsum, qscale, bias, ldb, 2, tiles, kscale, n_tiles, tw); break;
    case 3: tip_q4_nq(S, ldo, qi, ldq, qsum, qscale, bias, ldb, 3, tiles, kscale, n_tiles, tw); break;
    case 4: tip_q4_nq(S, ldo, qi, ldq, qsum, qscale, bias, ldb, 4, tiles, kscale, n_tiles, tw); break;
    case 5: tip_q4_nq(S, ldo, qi, ldq, qsum, qscale, bias, ldb, 5, tiles, kscale, n_tiles, tw); break;
    case 6: tip_q4_nq(S, ldo, qi, ldq, qsum, qscale, bias, ldb, 6, tiles, kscale, n_tiles, tw); break;
    case 7: tip_q4_nq(S, ldo, qi, ldq, qsum, qscale, bias, ldb, 7, tiles, kscale, n_tiles, tw); break;
    default: tip_q4_nq(S, ldo, qi, ldq, qsum, qscale, bias, ldb, 8, tiles, kscale, n_tiles, tw); break;
    }
}
#else
void ops_tip_q4(float *S, int ldo, const int8_t *qi, int ldq, const int32_t *qsum, const float *qscale,
                const float *bias, int ldb, int nq, const uint8_t *tiles, const uint16_t *kscale, int n_tiles, int tw)
{
    ops_tip_q4_ref(S, ldo, qi, ldq, qsum, qscale, bias, ldb, nq, tiles, kscale, n_tiles, tw);
}
#endif

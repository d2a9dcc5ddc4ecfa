/* simd.h - helpers the CPU kernels share (lib/core only): the AVX2 switch, horizontal sums,
 * f16 loads, software prefetch, and the 4-row micro-kernel both the prefill matmul and the
 * attention score kernels use. Static inline; not a public header. */
#ifndef FASA_SIMD_H
#define FASA_SIMD_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define OPS_AVX2 1
#endif

/* Bytes the streaming kernels prefetch ahead of what they read: the cache's rows in attention
 * (KV_AHEAD) and TIP's 4-bit copy (TIP_AHEAD, in tiles: ops.c). Both measured best at 6 KB:
 * full attention's step at 32k went from 29.2 to 24.9 ms with 6 KB instead of 1,536 bytes
 * (alternating builds, median of five; docs/results.md), TIP's kernel on one thread from 50.5 to 31.6
 * cycles a tile with 6 KB instead of two tiles, 3 KB and 12 KB both slower
 * (tests/tools/bench_tip, 40 dims). */
#ifndef KV_AHEAD
#define KV_AHEAD 6144
#endif
#ifndef TIP_AHEAD
#define TIP_AHEAD KV_AHEAD
#endif
#define KV_AHEAD_ROWS(rb) ((int)((KV_AHEAD + (rb) - 1) / (rb)))

/* Starts loading the n bytes at p (non-temporal: streamed once). */
static inline void prefetch_bytes(const void *p, size_t n)
{
    for (size_t o = 0; o < n; o += 64) __builtin_prefetch((const char *)p + o, 0, 0);
}

#ifdef OPS_AVX2
static inline float f16_scalar(const uint8_t *p)
{
    uint16_t h = (uint16_t)(p[0] | p[1] << 8);
    return _cvtsh_ss(h);
}

/* eight values of a row from column c, widened from f16 by F16C when h16 */
#define KV_LOAD8(row, c, h16)                                                                   \
    ((h16) ? _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)(row) + (c)))) \
           : _mm256_loadu_ps((const float *)(row) + (c)))
#ifdef __AVX512F__
#define KV_LOAD16(row, c, h16)                                                                     \
    ((h16) ? _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)((const uint16_t *)(row) + (c)))) \
           : _mm512_loadu_ps((const float *)(row) + (c)))
#endif
#define KV_AT(row, c, h16) ((h16) ? _cvtsh_ss(((const uint16_t *)(row))[c]) : ((const float *)(row))[c])

static inline float hsum256(__m256 v)
{
    __m128 h = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    h = _mm_add_ps(h, _mm_movehl_ps(h, h));
    h = _mm_add_ss(h, _mm_movehdup_ps(h));
    return _mm_cvtss_f32(h);
}

/* (sum a, sum b, sum c, sum d) */
static inline __m128 hsum4x256(__m256 a, __m256 b, __m256 c, __m256 d)
{
    __m256 u = _mm256_hadd_ps(_mm256_hadd_ps(a, b), _mm256_hadd_ps(c, d));
    return _mm_add_ps(_mm256_castps256_ps128(u), _mm256_extractf128_ps(u, 1));
}

/* (sum v[0], ..., sum v[7]): a transpose-reduce instead of eight horizontal sums */
static inline __m256 hsum8x256(__m256 v0, __m256 v1, __m256 v2, __m256 v3, __m256 v4, __m256 v5,
                               __m256 v6, __m256 v7)
{
    __m256 a = _mm256_hadd_ps(_mm256_hadd_ps(v0, v1), _mm256_hadd_ps(v2, v3));
    __m256 b = _mm256_hadd_ps(_mm256_hadd_ps(v4, v5), _mm256_hadd_ps(v6, v7));
    return _mm256_add_ps(_mm256_permute2f128_ps(a, b, 0x20), _mm256_permute2f128_ps(a, b, 0x31));
}

#ifdef __AVX512F__
/* (sum v[0], ..., sum v[7]) of eight zmm vectors: halves folded, then hsum8x256 */
static inline __m256 hsum8x512(const __m512 v[8])
{
#define HALF(x) _mm256_add_ps(_mm512_castps512_ps256(x), _mm512_extractf32x8_ps(x, 1))
    return hsum8x256(HALF(v[0]), HALF(v[1]), HALF(v[2]), HALF(v[3]), HALF(v[4]), HALF(v[5]), HALF(v[6]), HALF(v[7]));
#undef HALF
}
#endif

static inline uint32_t load_u32(const uint8_t *p)
{
    uint32_t u;
    memcpy(&u, p, 4);
    return u;
}

/* The prefill micro-kernel: y[t * ldy + r] = w[r] . x[t] for r < nr (<= 4; w[nr..3] are
 * repeats; rows of f32, or of f16 when h16, for attention over an f16 KV cache) and t < T (a
 * constant after inlining, so the 4 x T sums stay in registers). Splitting long rows into column
 * chunks that stay in L1 measured slower here. */
static inline __attribute__((always_inline)) void
tile_4xT(float *y, size_t ldy, const void *const w[4], const float *x, size_t ldx, int64_t cols,
         int nr, const int T, const int h16)
{
    __m256 acc[4][3];
#pragma GCC unroll 4
    for (int r = 0; r < 4; r++)
#pragma GCC unroll 3
        for (int t = 0; t < T; t++) acc[r][t] = _mm256_setzero_ps();
    int64_t k = 0;
    for (; k + 8 <= cols; k += 8) {
        __m256 xv[3];
#pragma GCC unroll 3
        for (int t = 0; t < T; t++) {
            xv[t] = _mm256_loadu_ps(x + t * ldx + k);
            /* keep x and w in registers: otherwise gcc folds a load into every FMA (15 or 16
             * loads per 12 FMAs instead of 7) */
            __asm__("" : "+x"(xv[t]));
        }
#pragma GCC unroll 4
        for (int r = 0; r < 4; r++) {
            __m256 wv = KV_LOAD8(w[r], k, h16);
            __asm__("" : "+x"(wv));
#pragma GCC unroll 3
            for (int t = 0; t < T; t++) acc[r][t] = _mm256_fmadd_ps(wv, xv[t], acc[r][t]);
        }
    }
#pragma GCC unroll 3
    for (int t = 0; t < T; t++) {
        float out[4];
        _mm_storeu_ps(out, hsum4x256(acc[0][t], acc[1][t], acc[2][t], acc[3][t]));
        for (int64_t j = k; j < cols; j++)
            for (int r = 0; r < 4; r++) out[r] += KV_AT(w[r], j, h16) * x[t * ldx + j];
        if (nr == 4)
            memcpy(y + t * ldy, out, sizeof out);
        else
            for (int r = 0; r < nr; r++) y[t * ldy + r] = out[r];
    }
}

#endif

#endif

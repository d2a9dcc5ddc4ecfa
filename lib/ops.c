#include "ops.h"

#include <math.h>
#include <omp.h>
#include <string.h>
#include <time.h>

#include "gguf.h"

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define OPS_AVX2 1
#endif

size_t weight_bytes(const weight *w)
{
    return gguf_row_bytes(w->type, w->cols) * (size_t)w->rows;
}

#ifdef OPS_AVX2
static inline float f16_scalar(const uint8_t *p)
{
    uint16_t h = (uint16_t)(p[0] | p[1] << 8);
    return _cvtsh_ss(h);
}

/* Q8_0 block: f16 d, i8 q[32]; y = d * q. */
static void dequant_q8_0(const uint8_t *b, float *y, int64_t n)
{
    for (int64_t i = 0; i < n; i += 32, b += 34, y += 32) {
        __m256 d = _mm256_set1_ps(f16_scalar(b));
        for (int k = 0; k < 4; k++) {
            __m128i q = _mm_loadl_epi64((const __m128i *)(b + 2 + 8 * k));
            _mm256_storeu_ps(y + 8 * k, _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q))));
        }
    }
}

/* Q4_0 / Q4_1 block: f16 d (, f16 m), u8 qs[16]; low nibbles are values 0..15, high 16..31.
 * Q4_0: y = d * (q - 8); Q4_1: y = d * q + m. */
static void dequant_q4(const uint8_t *b, float *y, int64_t n, int has_min)
{
    const int bytes = has_min ? 20 : 18;
    const __m128i mask = _mm_set1_epi8(0x0F);
    for (int64_t i = 0; i < n; i += 32, b += bytes, y += 32) {
        __m256 d = _mm256_set1_ps(f16_scalar(b));
        __m256 m = _mm256_set1_ps(has_min ? f16_scalar(b + 2) : -8 * f16_scalar(b));
        __m128i q = _mm_loadu_si128((const __m128i *)(b + bytes - 16));
        __m128i lo = _mm_and_si128(q, mask), hi = _mm_and_si128(_mm_srli_epi16(q, 4), mask);
        __m128i parts[4] = { lo, _mm_srli_si128(lo, 8), hi, _mm_srli_si128(hi, 8) };
        for (int k = 0; k < 4; k++) {
            __m256 v = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(parts[k]));
            _mm256_storeu_ps(y + 8 * k, _mm256_fmadd_ps(d, v, m));
        }
    }
}

static void dequant_f16(const uint8_t *b, float *y, int64_t n)
{
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(b + 2 * i))));
    for (; i < n; i++) y[i] = f16_scalar(b + 2 * i);
}

static void dequant_bf16(const uint8_t *b, float *y, int64_t n)
{
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256i v = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(b + 2 * i)));
        _mm256_storeu_ps(y + i, _mm256_castsi256_ps(_mm256_slli_epi32(v, 16)));
    }
    for (; i < n; i++) {
        uint32_t u = (uint32_t)(b[2 * i] | b[2 * i + 1] << 8) << 16;
        memcpy(y + i, &u, 4);
    }
}
#endif

void weight_row_ref(const weight *w, int64_t r, float *out)
{
    size_t rb = gguf_row_bytes(w->type, w->cols);
    gguf_dequant(w->type, (const uint8_t *)w->data + rb * (size_t)r, out, w->cols);
}

void weight_row(const weight *w, int64_t r, float *out)
{
#ifdef OPS_AVX2
    const size_t rb = gguf_row_bytes(w->type, w->cols);
    const uint8_t *b = (const uint8_t *)w->data + rb * (size_t)r;
    switch (w->type) {
    case GGUF_TYPE_Q8_0: dequant_q8_0(b, out, w->cols); return;
    case GGUF_TYPE_Q4_0: dequant_q4(b, out, w->cols, 0); return;
    case GGUF_TYPE_Q4_1: dequant_q4(b, out, w->cols, 1); return;
    case GGUF_TYPE_F16: dequant_f16(b, out, w->cols); return;
    case GGUF_TYPE_BF16: dequant_bf16(b, out, w->cols); return;
    default: break;
    }
#endif
    weight_row_ref(w, r, out);
}

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

/* ---- matrix products ------------------------------------------------------------------------
 *
 * Decode (n == 1) streams the weights once and is bound by memory bandwidth: each row is read a
 * block at a time, unpacked in registers and multiplied into x with no row buffer (fused
 * dequant + dot). For Q4_0/Q4_1 the per-block offset is applied through the block sums of x:
 * sum_k (d q_k + m) x_k = d sum_k q_k x_k + m sum_k x_k, so a block costs one FMA per 8 values.
 *
 * Prefill (n > 1) is bound by arithmetic: four weight rows are dequantised to f32 (in L1) and
 * multiplied against three tokens at a time with the twelve partial sums in ymm registers, one
 * transposing reduction per four outputs. Tokens go in tiles whose x rows fit in L2, so each
 * weight row is dequantised once per tile rather than once per token.
 *
 * Threads: one parallel region per call, no barrier inside it; each thread takes one contiguous,
 * balanced run of rows (static split by bytes for decode, by rows for prefill). */

/* Rows per prefill micro-kernel; thread splits fall on multiples of it. */
#define MM_ROWS 4
/* Bytes of x rows a prefill token tile may hold (L2 is 512 KB per core here; 64 tokens of
 * 1536 columns, 393 KB, measured faster as one tile than as three). */
#ifndef MM_TILE_BYTES
#define MM_TILE_BYTES (512 * 1024)
#endif
/* Below this many multiply-adds a call stays on one thread. */
#define MM_PARALLEL_MIN 32768

/* Bytes the decode matvec prefetches ahead of the four rows it is reading. The hardware
 * prefetcher alone left the decode sweep at 9-10 GB/s here. With the f32 kernels 1536 bytes
 * ahead measured best (tests/tools/bench_ops: 512 / 1024 / 1536 / 3072 / 6144 bytes: 12.8-14.1
 * / 13.2-14.8 / 13.4-14.9 / 8.7-11.4 / 8.2-9.3 GB/s, best of 7, 2 threads); the integer kernels
 * consume rows faster, and the sweep's median of 7 runs went 6.18 / 5.95 / 5.74 ms at 1536 /
 * 2048 / 3072 bytes (2560: 5.73, 4 runs). */
#ifndef MV_AHEAD
#define MV_AHEAD 2560
#endif

/* Bytes the streaming attention kernels prefetch ahead (tuned with MV_AHEAD's first table). */
#ifndef KV_AHEAD
#define KV_AHEAD 1536
#endif
#define KV_AHEAD_ROWS(rb) ((int)((KV_AHEAD + (rb) - 1) / (rb)))

/* Starts loading the n bytes at p (non-temporal: streamed once). */
static inline void prefetch_bytes(const void *p, size_t n)
{
    for (size_t o = 0; o < n; o += 64) __builtin_prefetch((const char *)p + o, 0, 0);
}

struct xq;   /* x rounded to int16 per block, for the integer kernels (defined with them, AVX2 only) */

#ifdef OPS_AVX2
/* eight values of a row from column c, widened from f16 by F16C when h16 */
#define KV_LOAD8(row, c, h16)                                                                   \
    ((h16) ? _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)(row) + (c)))) \
           : _mm256_loadu_ps((const float *)(row) + (c)))
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

static inline uint32_t load_u32(const uint8_t *p)
{
    uint32_t u;
    memcpy(&u, p, 4);
    return u;
}

/* x for the integer decode kernels, per block b of 32 values: xs[b], their sum (exact f32, for
 * the Q4 offsets), sx[b] = max |x| / 32767 and x16 = round(x / sx), so |x16| <= 32767. A block
 * of weights then dots with x16 in exact integer arithmetic (vpmaddwd: 4-bit or 8-bit weights
 * times 16-bit x, pairs summed into 32 bits, no overflow), and the one rounding is x's: at most
 * sx / 2 per value, 1.5e-5 of the block's largest |x| (the f16 KV cache rounds each value by up
 * to 4.9e-4 of itself). Half the vector instructions of converting every weight to f32, which
 * bound the decode matvec on this machine's cores. */
typedef struct xq {
    const float *xs, *sx;   /* (cols / 32) */
    const int16_t *x16;     /* (cols) */
} xq;

static void x_quantize(float *xs, float *sx, int16_t *x16, const float *x, int64_t nb)
{
    const __m256 sign = _mm256_set1_ps(-0.0f);
    for (int64_t b = 0; b < nb; b++, x += 32, x16 += 32) {
        const __m256 v0 = _mm256_loadu_ps(x), v1 = _mm256_loadu_ps(x + 8);
        const __m256 v2 = _mm256_loadu_ps(x + 16), v3 = _mm256_loadu_ps(x + 24);
        xs[b] = hsum256(_mm256_add_ps(_mm256_add_ps(v0, v1), _mm256_add_ps(v2, v3)));
        __m256 m = _mm256_max_ps(_mm256_max_ps(_mm256_andnot_ps(sign, v0), _mm256_andnot_ps(sign, v1)),
                                 _mm256_max_ps(_mm256_andnot_ps(sign, v2), _mm256_andnot_ps(sign, v3)));
        __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
        h = _mm_max_ps(h, _mm_movehl_ps(h, h));
        const float amax = _mm_cvtss_f32(_mm_max_ss(h, _mm_movehdup_ps(h)));
        /* a NaN or infinity anywhere in the block (its sum is not finite) makes the block's
         * products NaN, as the f32 kernels would */
        sx[b] = isfinite(xs[b]) ? amax / 32767 : NAN;
        const __m256 inv = _mm256_set1_ps(amax > 0 && isfinite(xs[b]) ? 32767 / amax : 0);
        const __m256i i0 = _mm256_cvtps_epi32(_mm256_mul_ps(v0, inv)), i1 = _mm256_cvtps_epi32(_mm256_mul_ps(v1, inv));
        const __m256i i2 = _mm256_cvtps_epi32(_mm256_mul_ps(v2, inv)), i3 = _mm256_cvtps_epi32(_mm256_mul_ps(v3, inv));
        /* packs works within 128-bit lanes: 0xD8 puts the four quarters back in order */
        _mm256_storeu_si256((__m256i *)x16, _mm256_permute4x64_epi64(_mm256_packs_epi32(i0, i1), 0xD8));
        _mm256_storeu_si256((__m256i *)(x16 + 16), _mm256_permute4x64_epi64(_mm256_packs_epi32(i2, i3), 0xD8));
    }
}

/* lo . xlo + hi . xhi as eight 32-bit sums (one vpdpwssd where AVX512-VNNI has it) */
static inline __m256i madd2_epi16(__m256i lo, __m256i xlo, __m256i hi, __m256i xhi)
{
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
    return _mm256_dpwssd_epi32(_mm256_madd_epi16(lo, xlo), hi, xhi);
#else
    return _mm256_add_epi32(_mm256_madd_epi16(lo, xlo), _mm256_madd_epi16(hi, xhi));
#endif
}

/* q . x16 over one Q4 block of 16 nibble bytes (low nibbles are values 0..15, high 16..31) */
static inline __m256 q4_block_dot(const uint8_t *qs, __m256i xlo, __m256i xhi)
{
    const __m256i w = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)qs));
    return _mm256_cvtepi32_ps(madd2_epi16(_mm256_and_si256(w, _mm256_set1_epi16(0x0F)), xlo,
                                          _mm256_srli_epi16(w, 4), xhi));
}

/* q . x16 over one block of 32 signed bytes */
static inline __m256 q8_block_dot(const uint8_t *qs, __m256i xlo, __m256i xhi)
{
    return _mm256_cvtepi32_ps(madd2_epi16(_mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)qs)), xlo,
                                          _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(qs + 16))), xhi));
}

#define X16_LO(q, i) _mm256_loadu_si256((const __m256i *)((q)->x16 + 32 * (i)))
#define X16_HI(q, i) _mm256_loadu_si256((const __m256i *)((q)->x16 + 32 * (i) + 16))

/* One row of Q4_1 (f16 d, f16 m, u8 qs[16] per block): sum_b d sx (q . x16) + m xs. */
static float rowdot_q4_1(const uint8_t *b, const xq *x, int64_t nb)
{
    __m256 acc = _mm256_setzero_ps();
    float accm = 0;
    for (int64_t i = 0; i < nb; i++, b += 20) {
        acc = _mm256_fmadd_ps(_mm256_set1_ps(f16_scalar(b) * x->sx[i]), q4_block_dot(b + 4, X16_LO(x, i), X16_HI(x, i)), acc);
        accm += f16_scalar(b + 2) * x->xs[i];
    }
    return hsum256(acc) + accm;
}

/* One row of Q4_0 (f16 d, u8 qs[16]; value d (q - 8)): the offset is -8 sum_b d xs. */
static float rowdot_q4_0(const uint8_t *b, const xq *x, int64_t nb)
{
    __m256 acc = _mm256_setzero_ps();
    float accm = 0;
    for (int64_t i = 0; i < nb; i++, b += 18) {
        const float d = f16_scalar(b);
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d * x->sx[i]), q4_block_dot(b + 2, X16_LO(x, i), X16_HI(x, i)), acc);
        accm += d * x->xs[i];
    }
    return hsum256(acc) - 8 * accm;
}

/* One row of Q8_0 (f16 d, i8 qs[32]). */
static float rowdot_q8_0(const uint8_t *b, const xq *x, int64_t nb)
{
    __m256 acc = _mm256_setzero_ps();
    for (int64_t i = 0; i < nb; i++, b += 34)
        acc = _mm256_fmadd_ps(_mm256_set1_ps(f16_scalar(b) * x->sx[i]), q8_block_dot(b + 2, X16_LO(x, i), X16_HI(x, i)), acc);
    return hsum256(acc);
}

static inline __m128 f16x4(const uint8_t *p0, const uint8_t *p1, const uint8_t *p2, const uint8_t *p3)
{
    return _mm_cvtph_ps(_mm_setr_epi16((short)(p0[0] | p0[1] << 8), (short)(p1[0] | p1[1] << 8),
                                       (short)(p2[0] | p2[1] << 8), (short)(p3[0] | p3[1] << 8), 0, 0, 0, 0));
}

/* Four rows at a time (y[0..3]), as the one-row kernels: x's block is loaded once for the four,
 * the four rows' scales are converted together, and four accumulator chains hide the latency. */
#define ROWDOT4_BODY(QDOT, OFS)                                                                   \
    const __m256i xl = X16_LO(x, i), xh = X16_HI(x, i);                                          \
    a0 = _mm256_fmadd_ps(_mm256_broadcast_ss(ds + 0), QDOT(b + (OFS), xl, xh), a0);              \
    a1 = _mm256_fmadd_ps(_mm256_broadcast_ss(ds + 1), QDOT(b + rb + (OFS), xl, xh), a1);         \
    a2 = _mm256_fmadd_ps(_mm256_broadcast_ss(ds + 2), QDOT(b + 2 * rb + (OFS), xl, xh), a2);     \
    a3 = _mm256_fmadd_ps(_mm256_broadcast_ss(ds + 3), QDOT(b + 3 * rb + (OFS), xl, xh), a3)

static void rowdot4_q4_1(float *y, const uint8_t *b, size_t rb, const xq *x, int64_t nb)
{
    __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps(), a2 = _mm256_setzero_ps(), a3 = _mm256_setzero_ps();
    __m128 am = _mm_setzero_ps();
    float ds[4];
    for (int64_t i = 0; i < nb; i++, b += 20) {
        __m128 dm01 = _mm_cvtph_ps(_mm_unpacklo_epi32(_mm_cvtsi32_si128((int)load_u32(b)),
                                                      _mm_cvtsi32_si128((int)load_u32(b + rb))));
        __m128 dm23 = _mm_cvtph_ps(_mm_unpacklo_epi32(_mm_cvtsi32_si128((int)load_u32(b + 2 * rb)),
                                                      _mm_cvtsi32_si128((int)load_u32(b + 3 * rb))));
        _mm_storeu_ps(ds, _mm_mul_ps(_mm_shuffle_ps(dm01, dm23, _MM_SHUFFLE(2, 0, 2, 0)), _mm_broadcast_ss(x->sx + i)));
        am = _mm_fmadd_ps(_mm_shuffle_ps(dm01, dm23, _MM_SHUFFLE(3, 1, 3, 1)), _mm_broadcast_ss(x->xs + i), am);
        ROWDOT4_BODY(q4_block_dot, 4);
    }
    _mm_storeu_ps(y, _mm_add_ps(hsum4x256(a0, a1, a2, a3), am));
}

static void rowdot4_q4_0(float *y, const uint8_t *b, size_t rb, const xq *x, int64_t nb)
{
    __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps(), a2 = _mm256_setzero_ps(), a3 = _mm256_setzero_ps();
    __m128 am = _mm_setzero_ps();
    float ds[4];
    for (int64_t i = 0; i < nb; i++, b += 18) {
        __m128 dv = f16x4(b, b + rb, b + 2 * rb, b + 3 * rb);
        _mm_storeu_ps(ds, _mm_mul_ps(dv, _mm_broadcast_ss(x->sx + i)));
        am = _mm_fmadd_ps(dv, _mm_broadcast_ss(x->xs + i), am);
        ROWDOT4_BODY(q4_block_dot, 2);
    }
    _mm_storeu_ps(y, _mm_fnmadd_ps(_mm_set1_ps(8), am, hsum4x256(a0, a1, a2, a3)));
}

static void rowdot4_q8_0(float *y, const uint8_t *b, size_t rb, const xq *x, int64_t nb)
{
    __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps(), a2 = _mm256_setzero_ps(), a3 = _mm256_setzero_ps();
    float ds[4];
    for (int64_t i = 0; i < nb; i++, b += 34) {
        _mm_storeu_ps(ds, _mm_mul_ps(f16x4(b, b + rb, b + 2 * rb, b + 3 * rb), _mm_broadcast_ss(x->sx + i)));
        ROWDOT4_BODY(q8_block_dot, 2);
    }
    _mm_storeu_ps(y, hsum4x256(a0, a1, a2, a3));
}
#undef ROWDOT4_BODY

static float rowdot_f16(const uint8_t *b, const float *x, int64_t n)
{
    __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps(), a2 = _mm256_setzero_ps(), a3 = _mm256_setzero_ps();
    int64_t i = 0;
#define F16_AT(k) _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(b + 2 * (k))))
    for (; i + 32 <= n; i += 32) {
        a0 = _mm256_fmadd_ps(F16_AT(i), _mm256_loadu_ps(x + i), a0);
        a1 = _mm256_fmadd_ps(F16_AT(i + 8), _mm256_loadu_ps(x + i + 8), a1);
        a2 = _mm256_fmadd_ps(F16_AT(i + 16), _mm256_loadu_ps(x + i + 16), a2);
        a3 = _mm256_fmadd_ps(F16_AT(i + 24), _mm256_loadu_ps(x + i + 24), a3);
    }
    for (; i + 8 <= n; i += 8) a0 = _mm256_fmadd_ps(F16_AT(i), _mm256_loadu_ps(x + i), a0);
#undef F16_AT
    float s = hsum256(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
    for (; i < n; i++) s += f16_scalar(b + 2 * i) * x[i];
    return s;
}

static float rowdot_bf16(const uint8_t *b, const float *x, int64_t n)
{
    __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps(), a2 = _mm256_setzero_ps(), a3 = _mm256_setzero_ps();
    int64_t i = 0;
#define BF16_AT(k) _mm256_castsi256_ps(_mm256_slli_epi32( \
        _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(b + 2 * (k)))), 16))
    for (; i + 32 <= n; i += 32) {
        a0 = _mm256_fmadd_ps(BF16_AT(i), _mm256_loadu_ps(x + i), a0);
        a1 = _mm256_fmadd_ps(BF16_AT(i + 8), _mm256_loadu_ps(x + i + 8), a1);
        a2 = _mm256_fmadd_ps(BF16_AT(i + 16), _mm256_loadu_ps(x + i + 16), a2);
        a3 = _mm256_fmadd_ps(BF16_AT(i + 24), _mm256_loadu_ps(x + i + 24), a3);
    }
    for (; i + 8 <= n; i += 8) a0 = _mm256_fmadd_ps(BF16_AT(i), _mm256_loadu_ps(x + i), a0);
#undef BF16_AT
    float s = hsum256(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
    for (; i < n; i++) {
        uint32_t u = (uint32_t)(b[2 * i] | b[2 * i + 1] << 8) << 16;
        float f;
        memcpy(&f, &u, 4);
        s += f * x[i];
    }
    return s;
}

static float rowdot_f32(const float *w, const float *x, int64_t n)
{
    __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps(), a2 = _mm256_setzero_ps(), a3 = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        a0 = _mm256_fmadd_ps(_mm256_loadu_ps(w + i), _mm256_loadu_ps(x + i), a0);
        a1 = _mm256_fmadd_ps(_mm256_loadu_ps(w + i + 8), _mm256_loadu_ps(x + i + 8), a1);
        a2 = _mm256_fmadd_ps(_mm256_loadu_ps(w + i + 16), _mm256_loadu_ps(x + i + 16), a2);
        a3 = _mm256_fmadd_ps(_mm256_loadu_ps(w + i + 24), _mm256_loadu_ps(x + i + 24), a3);
    }
    for (; i + 8 <= n; i += 8) a0 = _mm256_fmadd_ps(_mm256_loadu_ps(w + i), _mm256_loadu_ps(x + i), a0);
    float s = hsum256(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
    for (; i < n; i++) s += w[i] * x[i];
    return s;
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

/* Rows [r0, r1) of y = x W^T for n > 1 tokens; buf holds 4 dequantised rows of ld floats. */
static void matmul_batch_rows(float *y, const weight *w, const float *x, int n, int64_t r0,
                              int64_t r1, float *buf, int64_t ld)
{
    const int64_t cols = w->cols, rows = w->rows;
    const size_t ldx = (size_t)cols;
    /* tokens per tile: x rows within MM_TILE_BYTES, tiles of equal size, a multiple of 3 */
    int tile_max = (int)(MM_TILE_BYTES / (4 * cols));
    if (tile_max < 3) tile_max = 3;
    const int n_tiles = (n + tile_max - 1) / tile_max;
    int tile = (n + n_tiles - 1) / n_tiles;
    tile = (tile + 2) / 3 * 3;
    for (int t0 = 0; t0 < n; t0 += tile) {
        const int t1 = t0 + tile < n ? t0 + tile : n;
        for (int64_t r = r0; r < r1; r += MM_ROWS) {
            const int nr = r1 - r < MM_ROWS ? (int)(r1 - r) : MM_ROWS;
            const void *wr[4];
            for (int i = 0; i < 4; i++) {
                const int64_t ri = r + (i < nr ? i : nr - 1);
                if (w->type == GGUF_TYPE_F32) {
                    wr[i] = (const float *)w->data + (size_t)ri * cols;
                } else {
                    wr[i] = buf + i * ld;
                    if (i < nr) weight_row(w, ri, buf + i * ld);
                }
            }
            /* threes, then a two or a one; four left over go as two twos (faster than 3 + 1) */
            const int len = t1 - t0, n3 = len % 3 == 1 && len >= 4 ? len / 3 - 1 : len / 3;
            float *yr = y + r;
            int t = t0;
            for (int i = 0; i < n3; i++, t += 3)
                tile_4xT(yr + (size_t)t * rows, rows, wr, x + t * ldx, ldx, cols, nr, 3, 0);
            for (; t + 2 <= t1; t += 2)
                tile_4xT(yr + (size_t)t * rows, rows, wr, x + t * ldx, ldx, cols, nr, 2, 0);
            if (t < t1)
                tile_4xT(yr + (size_t)t * rows, rows, wr, x + t * ldx, ldx, cols, nr, 1, 0);
        }
    }
}

/* Rows [r0, r1) of y = W x for one token. xq: x quantised for the Q4_0/Q4_1/Q8_0 kernels. */
static void matvec_rows(float *y, const weight *w, const float *x, const xq *xq, int64_t r0,
                        int64_t r1)
{
    const int64_t cols = w->cols, nb = cols / 32;
    const size_t rb = gguf_row_bytes(w->type, cols);
    const uint8_t *b = (const uint8_t *)w->data + rb * (size_t)r0;
    int64_t r = r0;
    switch (w->type) {
    case GGUF_TYPE_Q4_1:
        for (; r + 4 <= r1; r += 4, b += 4 * rb) {
            prefetch_bytes(b + MV_AHEAD, 4 * rb);
            rowdot4_q4_1(y + r, b, rb, xq, nb);
        }
        for (; r < r1; r++, b += rb) y[r] = rowdot_q4_1(b, xq, nb);
        return;
    case GGUF_TYPE_Q4_0:
        for (; r + 4 <= r1; r += 4, b += 4 * rb) {
            prefetch_bytes(b + MV_AHEAD, 4 * rb);
            rowdot4_q4_0(y + r, b, rb, xq, nb);
        }
        for (; r < r1; r++, b += rb) y[r] = rowdot_q4_0(b, xq, nb);
        return;
    case GGUF_TYPE_Q8_0:
        for (; r + 4 <= r1; r += 4, b += 4 * rb) {
            prefetch_bytes(b + MV_AHEAD, 4 * rb);
            rowdot4_q8_0(y + r, b, rb, xq, nb);
        }
        for (; r < r1; r++, b += rb) y[r] = rowdot_q8_0(b, xq, nb);
        return;
    case GGUF_TYPE_F16: for (int64_t r = r0; r < r1; r++, b += rb) y[r] = rowdot_f16(b, x, cols); return;
    case GGUF_TYPE_BF16: for (int64_t r = r0; r < r1; r++, b += rb) y[r] = rowdot_bf16(b, x, cols); return;
    case GGUF_TYPE_F32: for (int64_t r = r0; r < r1; r++, b += rb) y[r] = rowdot_f32((const float *)b, x, cols); return;
    default: {
        float row[cols];
        for (int64_t r = r0; r < r1; r++) {
            weight_row(w, r, row);
            y[r] = ops_dot(row, x, (int)cols);
        }
    }
    }
}
#endif /* OPS_AVX2 */

/* The plain twin (and the path without AVX2): one row dequantised at a time, dotted with every
 * token. */
static void matmul_rows_plain(float *y, const weight *w, const float *x, int n, int64_t r0, int64_t r1,
                              float (*dot)(const float *, const float *, int),
                              void (*row_fn)(const weight *, int64_t, float *))
{
    const int64_t cols = w->cols;
    float buf[cols];
    for (int64_t r = r0; r < r1; r++) {
        const float *row;
        if (w->type == GGUF_TYPE_F32) {
            row = (const float *)w->data + (size_t)r * cols;
        } else {
            row_fn(w, r, buf);
            row = buf;
        }
        for (int i = 0; i < n; i++) y[(size_t)i * w->rows + r] = dot(row, x + (size_t)i * cols, (int)cols);
    }
}

/* Rows [r0, r1) of one product, on the calling thread. */
static void matmul_part(float *y, const weight *w, const float *x, int n, int64_t r0, int64_t r1,
                        float *buf, int64_t ld, const struct xq *xq)
{
#ifdef OPS_AVX2
    if (n == 1)
        matvec_rows(y, w, x, xq, r0, r1);
    else
        matmul_batch_rows(y, w, x, n, r0, r1, buf, ld);
#else
    matmul_rows_plain(y, w, x, n, r0, r1, ops_dot, weight_row);
#endif
}

/* Cost of one row, for balancing threads: bytes streamed in decode, multiply-adds in prefill. */
static double row_cost(const weight *w, int n)
{
    return n == 1 ? (double)gguf_row_bytes(w->type, w->cols) : (double)w->cols;
}

/* Boundary k of nt over the rows of ws[0..count) taken end to end, placed so that every thread
 * gets the same cost: (weight index, row), the row a multiple of MM_ROWS or the weight's end.
 * Neighbouring threads compute the same boundary, so the parts tile the rows exactly. */
static void split_at(const weight *const *ws, int count, int n, int k, int nt, int *wi, int64_t *row)
{
    if (k >= nt) {
        *wi = count - 1;
        *row = ws[count - 1]->rows;
        return;
    }
    double total = 0;
    for (int i = 0; i < count; i++) total += row_cost(ws[i], n) * (double)ws[i]->rows;
    double target = total * k / nt;
    for (int i = 0; i < count; i++) {
        const double c = row_cost(ws[i], n), all = c * (double)ws[i]->rows;
        if (target < all || i == count - 1) {
            int64_t r = (int64_t)(target / c / MM_ROWS + 0.5) * MM_ROWS;
            *wi = i;
            *row = r < ws[i]->rows ? r : ws[i]->rows;
            return;
        }
        target -= all;
    }
}

/* ---- threads ----------------------------------------------------------------------------------
 *
 * A parallel region ends when its slowest thread does. On a machine shared with other busy
 * processes our threads are often off their cores for a scheduler slice (milliseconds), and a
 * decode step has hundreds of regions of a few microseconds each: with the load average at 7
 * on 2 cores, 2 threads decoded at 0.4 tok/s and 1 thread at 37. So matmuls measure both: every
 * call is timed, and a moving average of seconds per unit of work (weight bytes for decode,
 * multiply-adds for prefill) is kept per size class for one thread and for all threads. Each
 * call uses the faster; every explore-th call of a class tries the other (64 calls, doubling up
 * to 4096 while it keeps losing, back to 64 when the choice flips). On an idle machine that costs
 * one slower call in 64 at first and far fewer later; on a busy one it avoids most waits. The
 * results do not depend on the thread count (every row is computed the same way wherever the
 * split falls), so this changes speed only. ops_threads() lets other parallel loops follow the
 * latest choice; ops_threads_adaptive(0) turns it off (always all threads). */

enum { SCHED_CLASSES = 16, SCHED_EXPLORE_MIN = 64, SCHED_EXPLORE_MAX = 4096 };

static struct {
    double cost[SCHED_CLASSES][2];   /* seconds per unit of work, [class][0 one thread, 1 all]; 0 unknown */
    unsigned calls[SCHED_CLASSES];
    unsigned explore[SCHED_CLASSES]; /* the other choice is tried every explore-th call */
    int last;                        /* the latest choice: 0 one thread, 1 all */
    int fixed;                       /* ops_threads_adaptive(0) */
} sched = { .last = 1 };

static double wall_seconds(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Relaxed atomic access: concurrent callers may each update the policy; any interleaving is a
 * valid (if slightly different) policy. */
#define SCHED_GET(f) __extension__({ __typeof__(sched.f) v_; __atomic_load(&sched.f, &v_, __ATOMIC_RELAXED); v_; })
#define SCHED_SET(f, v) do { __typeof__(sched.f) v_ = (v); __atomic_store(&sched.f, &v_, __ATOMIC_RELAXED); } while (0)

/* Size class of a call: decode and prefill apart, then by powers of 4 of the work. */
static int sched_class(double work, int n)
{
    int c = 0;
    for (double w = work / MM_PARALLEL_MIN; w >= 4 && c < SCHED_CLASSES / 2 - 1; w /= 4) c++;
    return (n > 1) * (SCHED_CLASSES / 2) + c;
}

/* 1: use all threads for a call of class k. */
static int sched_pick(int k)
{
    if (SCHED_GET(fixed)) return 1;
    const double one = SCHED_GET(cost[k][0]), all = SCHED_GET(cost[k][1]);
    if (all == 0) return 1;
    if (one == 0) return 0;
    const int best = all <= one;
    const unsigned c = SCHED_GET(calls[k]) + 1, e = SCHED_GET(explore[k]);
    SCHED_SET(calls[k], c);
    return c % (e ? e : SCHED_EXPLORE_MIN) == 0 ? !best : best;
}

/* A call of class k on one thread (par 0) or all (par 1) took sec seconds per unit of work. */
static void sched_note(int k, int par, double sec)
{
    const double one = SCHED_GET(cost[k][0]), all = SCHED_GET(cost[k][1]);
    const int best_before = all <= one;
    /* the choice in use is averaged; a tried one replaces its stale estimate outright, so that
     * a machine that became idle again is noticed at the first try */
    const double old = par ? all : one, now = old == 0 || par != best_before ? sec : 0.75 * old + 0.25 * sec;
    SCHED_SET(cost[k][par], now);
    const int best_after = par ? now <= one : all <= now;
    if (one == 0 || all == 0) return;   /* still learning both */
    const unsigned e = SCHED_GET(explore[k]);
    if (best_after != best_before)
        SCHED_SET(explore[k], SCHED_EXPLORE_MIN);
    else if (par != best_after)   /* tried the other choice and it lost again */
        SCHED_SET(explore[k], e * 2 > SCHED_EXPLORE_MAX ? SCHED_EXPLORE_MAX : (e ? e * 2 : 2 * SCHED_EXPLORE_MIN));
    SCHED_SET(last, best_after);
}

int ops_threads(void)
{
    if (omp_in_parallel()) return 1;
    const int nt = omp_get_max_threads();
    return SCHED_GET(fixed) || SCHED_GET(last) ? nt : 1;
}

void ops_threads_adaptive(int on)
{
    memset(&sched, 0, sizeof sched);
    sched.last = 1;
    SCHED_SET(fixed, !on);
}

typedef struct mm_call {
    float *const *y;
    const weight *const *w;
    int count, n;
    const float *x;
} mm_call;

/* Thread tid of nt: its balanced part of every product. */
static void mm_thread(const mm_call *c, int tid, int nt)
{
    const int64_t cols = c->w[0]->cols;
    const int64_t ld = (cols + 7) & ~(int64_t)7;
    /* the dequantised rows (prefill) or x quantised (decode: sums, scales, x16) of this thread */
    float scratch[(c->n > 1 ? MM_ROWS * ld : cols / 2 + 2 * (cols / 32)) + 8];
    float *buf = (float *)(((uintptr_t)scratch + 31) & ~(uintptr_t)31);
    const struct xq *xqp = NULL;
#ifdef OPS_AVX2
    xq xq;
    if (c->n == 1 && cols % 32 == 0) {
        const int64_t nb = cols / 32;
        int16_t *x16 = (int16_t *)buf;
        float *xs = buf + cols / 2, *sx = xs + nb;
        x_quantize(xs, sx, x16, c->x, nb);
        xq = (struct xq){ xs, sx, x16 };
        xqp = &xq;
    }
#endif
    int wa, wb;
    int64_t ra, rb;
    split_at(c->w, c->count, c->n, tid, nt, &wa, &ra);
    split_at(c->w, c->count, c->n, tid + 1, nt, &wb, &rb);
    for (int i = wa; i <= wb; i++) {
        const int64_t r0 = i == wa ? ra : 0, r1 = i == wb ? rb : c->w[i]->rows;
        if (r0 < r1) matmul_part(c->y[i], c->w[i], c->x, c->n, r0, r1, buf, ld, xqp);
    }
}

void ops_matmul_multi(float *const *y, const weight *const *w, int count, const float *x, int n)
{
    if (count < 1) return;
    const mm_call c = { y, w, count, n, x };
    double work = 0;
    for (int i = 0; i < count; i++) work += (double)w[i]->rows * (double)w[0]->cols * n;
    const int nt = work > MM_PARALLEL_MIN && !omp_in_parallel() ? omp_get_max_threads() : 1;
    if (nt == 1) {
        mm_thread(&c, 0, 1);
        return;
    }
    /* work in the unit the policy compares: weight bytes (decode) or multiply-adds (prefill) */
    double units = work;
    if (n == 1) {
        units = 0;
        for (int i = 0; i < count; i++) units += (double)weight_bytes(w[i]);
    }
    const int k = sched_class(work, n), par = sched_pick(k);
    const double t0 = wall_seconds();
    if (par) {
#pragma omp parallel num_threads(nt)
        mm_thread(&c, omp_get_thread_num(), omp_get_num_threads());
    } else {
        mm_thread(&c, 0, 1);
    }
    sched_note(k, par, (wall_seconds() - t0) / units);
}

void ops_matmul(float *y, const weight *w, const float *x, int n)
{
    ops_matmul_multi(&y, &w, 1, x, n);
}

void ops_matmul_ref(float *y, const weight *w, const float *x, int n)
{
    matmul_rows_plain(y, w, x, n, 0, w->rows, ops_dot_ref, weight_row_ref);
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
/* Eight keys at a time: eight running sums, one transpose-reduce instead of eight horizontal
 * sums. d a multiple of 8; a constant 64 after inlining keeps q in registers. */
static inline __attribute__((always_inline)) void
attn_scores_fast(float *s, const float *q, const void *K, const int32_t *idx, int t, const int d, float scale,
                 const int h16)
{
    const __m256 vs = _mm256_set1_ps(scale);
    int i = 0;
    for (; i + 8 <= t; i += 8) {
        const void *k[8];
#pragma GCC unroll 8
        for (int j = 0; j < 8; j++) k[j] = kv_row(K, idx, i + j, d, h16);
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

static void attn_scores_any(float *s, const float *q, const void *K, const int32_t *idx, int t, int d, float scale,
                            int h16)
{
    if (d % 8) { attn_scores_plain(s, q, K, idx, t, d, scale, h16); return; }
    if (h16) {
        if (d == 64) attn_scores_fast(s, q, K, idx, t, 64, scale, 1);
        else attn_scores_fast(s, q, K, idx, t, d, scale, 1);
    } else {
        if (d == 64) attn_scores_fast(s, q, K, idx, t, 64, scale, 0);
        else attn_scores_fast(s, q, K, idx, t, d, scale, 0);
    }
}

static void attn_accum_any(float *out, const float *p, const void *V, const int32_t *idx, int t, int d, int h16)
{
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
                for (int c = 8; c < d; c += 8) a[r] = _mm256_fmadd_ps(_mm256_loadu_ps(q + c), _mm256_loadu_ps(kb + r * d + c), a[r]);
            }
            _mm256_storeu_ps(S + (size_t)i * lds + j, _mm256_mul_ps(vs, hsum8x256(a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7])));
        }
    }
    for (; j < t; j++)
        for (int i = 0; i < nq; i++) {
            const void *k = kv_row(K, NULL, j, d, h16);
            __m256 a = _mm256_mul_ps(_mm256_loadu_ps(Q + (size_t)i * ldq), KV_LOAD8(k, 0, h16));
            for (int c = 8; c < d; c += 8) a = _mm256_fmadd_ps(_mm256_loadu_ps(Q + (size_t)i * ldq + c), KV_LOAD8(k, c, h16), a);
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
    for (int j = 0; j < t; j += 4) {
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

void ops_attn_scores_multi(float *S, int lds, const float *Q, int nq, int ldq, const float *K, int t, int d, float scale)
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

static inline __attribute__((always_inline)) void
accum_multi_fast(float *O, int ldo, const float *P, int nq, const int *len, const void *V, int t, int d,
                 const int h16)
{
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
            /* the rows beyond the group's shortest query, one query at a time */
            const int l = len ? len[i + q] : t;
            for (int j = lo; j < l; j++) {
                const void *v = kv_row(V, NULL, j, d, h16);
                if (!h16) { ops_axpy(o[q], p[q][j], v, d); continue; }
                for (int cc = 0; cc < d; cc++) o[q][cc] += p[q][j] * KV_AT(v, cc, 1);
            }
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

/* expf with the fast exp's range: 0 below -87.336 (under FLT_MIN), exp(88.376) above 88.376;
 * for the tails of the vector loops and the build without AVX2, so that every element of every
 * build follows the same rule. */
static inline float exp_clamped(float x)
{
    if (x < -87.3365478515625f) return 0;
    return expf(x < 88.3762626647949f ? x : 88.3762626647949f);
}

#ifdef OPS_AVX2
/* exp(x) for eight floats, within 2e-7 relative of expf (tests/test_ops.c measures it): x = n ln2
 * + r with |r| <= ln2/2, exp(r) by Cephes' degree-7 expf polynomial, 2^n put into the exponent.
 * Inputs above 88.376 give exp(88.376) (about 2.4e38, not inf); below -87.336 (results under
 * FLT_MIN) give 0; NaN is not propagated. */
static inline __m256 exp256(__m256 x)
{
    const __m256 hi = _mm256_set1_ps(88.3762626647949f), lo = _mm256_set1_ps(-87.3365478515625f);
    const __m256 zero = _mm256_cmp_ps(x, lo, _CMP_LT_OQ);
    x = _mm256_max_ps(_mm256_min_ps(x, hi), lo);
    const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(1.9875691500e-4f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
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

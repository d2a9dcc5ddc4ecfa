/* quant.c - per weight type: dequantising a row, and the row kernels of the products (the
 * decode matvec fused with dequantisation, the prefill tiles over dequantised rows). The
 * threads that call them are matmul.c's. */
#include "quant.h"

#include <math.h>
#include <string.h>

#include "gguf.h"
#include "simd.h"

size_t weight_bytes(const weight *w)
{
    return gguf_row_bytes(w->type, w->cols) * (size_t)w->rows;
}

#ifdef OPS_AVX2
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
 * Threads are matmul.c's: each takes one contiguous, balanced run of rows. */

/* Bytes of x rows a prefill token tile may hold (L2 is 512 KB per core here; 64 tokens of
 * 1536 columns, 393 KB, measured faster as one tile than as three). */
#ifndef MM_TILE_BYTES
#define MM_TILE_BYTES (512 * 1024)
#endif

/* Bytes the decode matvec prefetches ahead of the four rows it is reading. The hardware
 * prefetcher alone left the decode sweep at 9-10 GB/s here. With the f32 kernels 1536 bytes
 * ahead measured best (tests/tools/bench_ops: 512 / 1024 / 1536 / 3072 / 6144 bytes: 12.8-14.1
 * / 13.2-14.8 / 13.4-14.9 / 8.7-11.4 / 8.2-9.3 GB/s, best of 7, 2 threads); the integer kernels
 * consume rows faster, and the sweep's median of 7 runs went 6.18 / 5.95 / 5.74 ms at 1536 /
 * 2048 / 3072 bytes (2560: 5.73, 4 runs). */
#ifndef MV_AHEAD
#define MV_AHEAD 2560
#endif

#ifdef OPS_AVX2
/* x for the integer decode kernels, per block b of 32 values: xs[b], their sum (exact f32, for
 * the Q4 offsets), sx[b] = max |x| / 32767 and x16 = round(x / sx), so |x16| <= 32767. A block
 * of weights then dots with x16 in exact integer arithmetic (vpmaddwd: 4-bit or 8-bit weights
 * times 16-bit x, pairs summed into 32 bits, no overflow), and the one rounding is x's: at most
 * sx / 2 per value, 1.5e-5 of the block's largest |x| (the f16 KV cache rounds each value by up
 * to 4.9e-4 of itself). Half the vector instructions of converting every weight to f32, which
 * bound the decode matvec on this machine's cores. */

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

size_t quant_scratch_floats(int64_t cols, int n)
{
    const int64_t ld = (cols + 7) & ~(int64_t)7;
    return (size_t)(n > 1 ? MM_ROWS * ld : cols / 2 + 2 * (cols / 32)) + 8;
}

void quant_prepare(quant_x *q, const float *x, int64_t cols, int n, float *scratch)
{
    q->ld = (cols + 7) & ~(int64_t)7;
    q->buf = (float *)(((uintptr_t)scratch + 31) & ~(uintptr_t)31);
    q->xq = NULL;
#ifdef OPS_AVX2
    if (n == 1 && cols % 32 == 0) {
        const int64_t nb = cols / 32;
        int16_t *x16 = (int16_t *)q->buf;
        float *xs = q->buf + cols / 2, *sx = xs + nb;
        x_quantize(xs, sx, x16, x, nb);
        q->xq_ = (xq){ xs, sx, x16 };
        q->xq = &q->xq_;
    }
#endif
}

void quant_rows(float *y, const weight *w, const float *x, int n, int64_t r0, int64_t r1, const quant_x *q)
{
#ifdef OPS_AVX2
    if (n == 1)
        matvec_rows(y, w, x, q->xq, r0, r1);
    else
        matmul_batch_rows(y, w, x, n, r0, r1, q->buf, q->ld);
#else
    matmul_rows_plain(y, w, x, n, r0, r1, ops_dot, weight_row);
#endif
}

void ops_matmul_ref(float *y, const weight *w, const float *x, int n)
{
    matmul_rows_plain(y, w, x, n, 0, w->rows, ops_dot_ref, weight_row_ref);
}


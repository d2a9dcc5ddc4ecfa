/* quant.c - per weight type: the row kernels of the products (the decode matvec fused with
 * dequantisation, the prefill tiles) and fast row dequantisation, gathered in one table
 * (quant_kernels_of); the threads that call them are matmul.c's.
 *
 * Two forms of integer kernels, chosen by the block:
 *   32-value types (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL): x rounded to int16 per 32 (xq16), a
 *     block's integer weights times x16 by vpmaddwd (pairs summed into 32 bits, exact), one f32
 *     FMA per block for d and x's step; offsets (Q4_0's -8, Q4_1's m, ...) through the block's
 *     sum of x. Decode only: their prefill runs f32 tiles over rows dequantised in L1.
 *   256-value K types (Q4_K, Q5_K, Q6_K): x rounded to int8 per 256 (xq8, as llama.cpp's Q8_K),
 *     weights unpacked to unsigned bytes in registers, vpmaddubsw (u8 x s8 pairs into int16, no
 *     saturation: at most 63 * 127 * 2) then vpdpwssd with the sub-block scales (int16 per
 *     pair), so a super-block's sum of 256 products stays in int32 lanes with no per-sub-block
 *     float work; Q4_K/Q5_K's mins and Q6_K's -32 go through the block sums of x. One kernel
 *     (a tile of 4 rows by T tokens) serves decode (T = 1): a 4-row tile's weights are unpacked
 *     once per super-block for its T tokens; prefill unpacks rows once per token tile into the
 *     same vectors and runs the same arithmetic over them (ku_tile), bit for bit.
 * Every other type the formats read runs the generic path: rows dequantised by gguf_dequant,
 * f32 dot products and tiles. */
#include "quant.h"

#include <math.h>
#include <string.h>

#include "gguf.h"
#include "simd.h"

#if defined(OPS_AVX2) && defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && \
    defined(__AVX512DQ__)
#define QUANT_AVX512 1
#endif

static inline uint32_t ld_u32(const uint8_t *p)
{
    uint32_t u;
    memcpy(&u, p, 4);
    return u;
}

static inline float ld_f16(const uint8_t *p)
{
    return gguf_f16_to_f32((uint16_t)(p[0] | p[1] << 8));
}

/* Q4_K's and Q5_K's twelve scale bytes hold eight 6-bit scales and eight 6-bit mins: for j < 4
 * the low 6 bits of bytes j and j + 4; for j >= 4 the low / high nibble of byte j + 4 with the
 * top two bits from bits 6-7 of byte j - 4 / j. Returned as bytes j of *sc and *mn. */
static inline void k_scales(const uint8_t *s, uint64_t *sc, uint64_t *mn)
{
    const uint32_t a = ld_u32(s), b = ld_u32(s + 4), c = ld_u32(s + 8);
    *sc = (a & 0x3f3f3f3f) | (uint64_t)((c & 0x0f0f0f0f) | (a >> 2 & 0x30303030)) << 32;
    *mn = (b & 0x3f3f3f3f) | (uint64_t)((c >> 4 & 0x0f0f0f0f) | (b >> 2 & 0x30303030)) << 32;
}

/* IQ4_NL's non-linear 4-bit codebook. */
static const int8_t IQ4NL_VALUES[16] = { -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113 };

/* ---- x rounded for the integer kernels --------------------------------------------------------
 *
 * xq16: per block of 32, sx = max |x| / 32767 and x16 = round(x / sx), so |x16| <= 32767; a
 * block of weights then dots with x16 exactly, and the one rounding is x's: at most sx / 2 per
 * value, 1.5e-5 of the block's largest |x| (the f16 KV cache rounds each value by up to 4.9e-4
 * of itself). Half the vector instructions of converting every weight to f32.
 * xq8: per block of 256, d = max |x| / 127 and q = round(x / d): at most d / 2 per value, 0.4%
 * of the block's largest |x|, what llama.cpp does for the K types; int8 lets vpmaddubsw take 32
 * weights a 256-bit instruction, and the 256-value block lets a super-block's integer sum run
 * through its sub-block scales without f32 work.
 * A NaN or infinity anywhere in a block (its sum is not finite) makes the block's step NaN, so
 * its products are NaN as the f32 kernels' would be. */

static void xq16_ref(float *xs, float *sx, int16_t *x16, const float *x, int64_t nb)
{
    for (int64_t b = 0; b < nb; b++, x += 32, x16 += 32) {
        float amax = 0, sum = 0;
        for (int k = 0; k < 32; k++) amax = fmaxf(amax, fabsf(x[k])), sum += x[k];
        xs[b] = sum;
        sx[b] = isfinite(sum) ? amax / 32767 : NAN;
        const float inv = amax > 0 && isfinite(sum) ? 32767 / amax : 0;
        for (int k = 0; k < 32; k++) x16[k] = isfinite(sum) ? (int16_t)lrintf(x[k] * inv) : 0;
    }
}

static void xq8_ref(int8_t *q, float *d, int16_t *s16, const float *x, int64_t nb)
{
    for (int64_t b = 0; b < nb; b++, x += 256, q += 256) {
        float amax = 0, sum = 0;
        for (int k = 0; k < 256; k++) amax = fmaxf(amax, fabsf(x[k])), sum += x[k];
        d[b] = isfinite(sum) ? amax / 127 : NAN;
        const float inv = amax > 0 && isfinite(sum) ? 127 / amax : 0;
        for (int j = 0; j < 16; j++) {
            int s = 0;
            for (int k = 16 * j; k < 16 * j + 16; k++) s += q[k] = isfinite(sum) ? (int8_t)lrintf(x[k] * inv) : 0;
            s16[16 * b + j] = (int16_t)s;
        }
    }
}

#ifdef OPS_AVX2
static inline float hmax256(__m256 m)
{
    __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    h = _mm_max_ps(h, _mm_movehl_ps(h, h));
    return _mm_cvtss_f32(_mm_max_ss(h, _mm_movehdup_ps(h)));
}

static void xq16_fast(float *xs, float *sx, int16_t *x16, const float *x, int64_t nb)
{
    const __m256 sign = _mm256_set1_ps(-0.0f);
    for (int64_t b = 0; b < nb; b++, x += 32, x16 += 32) {
        const __m256 v0 = _mm256_loadu_ps(x), v1 = _mm256_loadu_ps(x + 8);
        const __m256 v2 = _mm256_loadu_ps(x + 16), v3 = _mm256_loadu_ps(x + 24);
        xs[b] = hsum256(_mm256_add_ps(_mm256_add_ps(v0, v1), _mm256_add_ps(v2, v3)));
        const float amax =
            hmax256(_mm256_max_ps(_mm256_max_ps(_mm256_andnot_ps(sign, v0), _mm256_andnot_ps(sign, v1)),
                                  _mm256_max_ps(_mm256_andnot_ps(sign, v2), _mm256_andnot_ps(sign, v3))));
        sx[b] = isfinite(xs[b]) ? amax / 32767 : NAN;
        if (!isfinite(xs[b])) {   /* x * 0 is NaN for an infinity: all zero instead */
            memset(x16, 0, 64);
            continue;
        }
        const __m256 inv = _mm256_set1_ps(amax > 0 ? 32767 / amax : 0);
        const __m256i i0 = _mm256_cvtps_epi32(_mm256_mul_ps(v0, inv)), i1 = _mm256_cvtps_epi32(_mm256_mul_ps(v1, inv));
        const __m256i i2 = _mm256_cvtps_epi32(_mm256_mul_ps(v2, inv)), i3 = _mm256_cvtps_epi32(_mm256_mul_ps(v3, inv));
        /* packs works within 128-bit lanes: 0xD8 puts the four quarters back in order */
        _mm256_storeu_si256((__m256i *)x16, _mm256_permute4x64_epi64(_mm256_packs_epi32(i0, i1), 0xD8));
        _mm256_storeu_si256((__m256i *)(x16 + 16), _mm256_permute4x64_epi64(_mm256_packs_epi32(i2, i3), 0xD8));
    }
}

/* (sum a, sum b) of eight int32 lanes each */
static inline void hsum2_epi32(__m256i a, __m256i b, int *sa, int *sb)
{
    __m256i h = _mm256_hadd_epi32(a, b);   /* per lane: a01 a23 b01 b23 */
    h = _mm256_hadd_epi32(h, h);           /* per lane: a b a b */
    const __m128i s = _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
    *sa = _mm_cvtsi128_si32(s);
    *sb = _mm_extract_epi32(s, 1);
}

static void xq8_fast(int8_t *q, float *d, int16_t *s16, const float *x, int64_t nb)
{
    const __m256 sign = _mm256_set1_ps(-0.0f);
    const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    for (int64_t b = 0; b < nb; b++, x += 256, q += 256) {
        __m256 m = _mm256_setzero_ps(), s = _mm256_setzero_ps();
        for (int k = 0; k < 256; k += 8) {
            const __m256 v = _mm256_loadu_ps(x + k);
            m = _mm256_max_ps(m, _mm256_andnot_ps(sign, v));
            s = _mm256_add_ps(s, v);
        }
        const float amax = hmax256(m), sum = hsum256(s);
        d[b] = isfinite(sum) ? amax / 127 : NAN;
        if (!isfinite(sum)) {   /* x * 0 is NaN for an infinity: all zero instead */
            memset(q, 0, 256);
            memset(s16 + 16 * b, 0, 32);
            continue;
        }
        const __m256 inv = _mm256_set1_ps(amax > 0 ? 127 / amax : 0);
        for (int k = 0; k < 256; k += 32) {
            const __m256i i0 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + k), inv));
            const __m256i i1 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + k + 8), inv));
            const __m256i i2 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + k + 16), inv));
            const __m256i i3 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + k + 24), inv));
            /* the two packs interleave the four vectors by 32-bit units within lanes */
            const __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(i0, i1), _mm256_packs_epi32(i2, i3));
            _mm256_storeu_si256((__m256i *)(q + k), _mm256_permutevar8x32_epi32(p, order));
            int sa, sb;
            hsum2_epi32(_mm256_add_epi32(i0, i1), _mm256_add_epi32(i2, i3), &sa, &sb);
            s16[16 * b + k / 16] = (int16_t)sa;
            s16[16 * b + k / 16 + 1] = (int16_t)sb;
        }
    }
}
#endif

void quant_xq16(xq16 *o, const float *x, int64_t cols, void *buf, int ref)
{
    const int64_t nb = cols / 32;
    int16_t *x16 = buf;
    float *xs = (float *)(x16 + cols), *sx = xs + nb;
#ifdef OPS_AVX2
    if (!ref) xq16_fast(xs, sx, x16, x, nb);
    else
#endif
        xq16_ref(xs, sx, x16, x, nb);
    *o = (xq16){ xs, sx, x16 };
}

#define ALIGN64(n) (((n) + 63) & ~(size_t)63)

size_t quant_xq8_bytes(int64_t cols, int n)
{
    const size_t v = (size_t)cols * n;
#ifdef QUANT_AVX512
    const size_t qp = v;
#else
    const size_t qp = 0;
#endif
    return ALIGN64(v) + ALIGN64(qp) + ALIGN64(v / 256 * 4) + ALIGN64(v / 16 * 2) + ALIGN64(v / 32 * 2);
}

void quant_xq8_layout(xq8 *o, int64_t cols, int n, void *buf)
{
    const size_t v = (size_t)cols * n;
    uint8_t *p = buf;
    int8_t *q = (int8_t *)p, *qp = NULL;
    p += ALIGN64(v);
#ifdef QUANT_AVX512
    qp = (int8_t *)p;
    p += ALIGN64(v);
#endif
    float *d = (float *)p;
    p += ALIGN64(v / 256 * 4);
    int16_t *s16 = (int16_t *)p;
    p += ALIGN64(v / 16 * 2);
    *o = (xq8){ q, qp, d, s16, (int16_t *)p, cols };
}

void quant_xq8_fill(const xq8 *o, const float *x, int t0, int t1, int ref)
{
    const xq8 at = quant_xq8_at(o, t0);
    const size_t v = (size_t)o->cols * (t1 - t0), nb = v / 256;
    int8_t *q = (int8_t *)at.q, *qp = (int8_t *)at.qp;
    int16_t *s16 = (int16_t *)at.s16, *s32 = (int16_t *)at.s32;
    x += (size_t)t0 * o->cols;
#ifdef OPS_AVX2
    if (!ref) xq8_fast(q, (float *)at.d, s16, x, (int64_t)nb);
    else
#endif
        xq8_ref(q, (float *)at.d, s16, x, (int64_t)nb);
    for (size_t j = 0; j < v / 32; j++) s32[j] = (int16_t)(s16[2 * j] + s16[2 * j + 1]);
    if (qp)
        for (size_t k = 0; k < v; k += 128) {
            memcpy(qp + k, q + k, 32);
            memcpy(qp + k + 32, q + k + 64, 32);
            memcpy(qp + k + 64, q + k + 32, 32);
            memcpy(qp + k + 96, q + k + 96, 32);
        }
}

void quant_xq8(xq8 *o, const float *x, int64_t cols, int n, void *buf, int ref)
{
    quant_xq8_layout(o, cols, n, buf);
    quant_xq8_fill(o, x, 0, n, ref);
}

/* ---- scalar twins of the integer kernels ------------------------------------------------------
 *
 * One row, one token, the same rounded x, in plain C: the weights' integers, their integer dot
 * with x's, then the same f32 scalings. The kernels must match these within the rounding of f32
 * sums in another order (tests/test_quant.c). */

/* q[0..31] of a 32-value block and its d, offset per unit of x sum (o) and weight scale (d):
 * value = d * q + o. */
static void b32_decode(uint32_t type, const uint8_t *b, int q[32], float *d, float *o)
{
    *d = ld_f16(b);
    *o = 0;
    switch (type) {
    case GGUF_TYPE_Q8_0:
        for (int j = 0; j < 32; j++) q[j] = (int8_t)b[2 + j];
        return;
    case GGUF_TYPE_Q4_0: case GGUF_TYPE_Q4_1: case GGUF_TYPE_IQ4_NL: {
        const uint8_t *qs = b + (type == GGUF_TYPE_Q4_1 ? 4 : 2);
        for (int j = 0; j < 16; j++) q[j] = qs[j] & 15, q[j + 16] = qs[j] >> 4;
        if (type == GGUF_TYPE_IQ4_NL)
            for (int j = 0; j < 32; j++) q[j] = IQ4NL_VALUES[q[j]];
        *o = type == GGUF_TYPE_Q4_0 ? -8 * *d : type == GGUF_TYPE_Q4_1 ? ld_f16(b + 2) : 0;
        return;
    }
    case GGUF_TYPE_Q5_0: case GGUF_TYPE_Q5_1: {
        const int m = type == GGUF_TYPE_Q5_1;
        const uint32_t qh = ld_u32(b + 2 + 2 * m);
        const uint8_t *qs = b + 6 + 2 * m;
        for (int j = 0; j < 16; j++) {
            q[j] = (qs[j] & 15) | (qh >> j & 1) << 4;
            q[j + 16] = (qs[j] >> 4) | (qh >> (j + 16) & 1) << 4;
        }
        *o = m ? ld_f16(b + 2) : -16 * *d;
        return;
    }
    default:
        return;
    }
}

/* sum_b d sx (q . x16) + o xs, blocks of type bt */
static float b32_dot_ref(uint32_t bt, size_t bb, const uint8_t *b, const void *xv, int64_t cols)
{
    const xq16 *x = xv;
    float acc = 0, acco = 0;
    for (int64_t i = 0; i < cols / 32; i++, b += bb) {
        int q[32], s = 0;
        float d, o;
        b32_decode(bt, b, q, &d, &o);
        for (int j = 0; j < 32; j++) s += q[j] * x->x16[32 * i + j];
        acc += d * x->sx[i] * (float)s;
        acco += o * x->xs[i];
    }
    return acc + acco;
}

static float dot_ref_q4_0(const uint8_t *b, const void *x, int64_t c)
{
    return b32_dot_ref(GGUF_TYPE_Q4_0, 18, b, x, c);
}
static float dot_ref_q4_1(const uint8_t *b, const void *x, int64_t c)
{
    return b32_dot_ref(GGUF_TYPE_Q4_1, 20, b, x, c);
}
static float dot_ref_q5_0(const uint8_t *b, const void *x, int64_t c)
{
    return b32_dot_ref(GGUF_TYPE_Q5_0, 22, b, x, c);
}
static float dot_ref_q5_1(const uint8_t *b, const void *x, int64_t c)
{
    return b32_dot_ref(GGUF_TYPE_Q5_1, 24, b, x, c);
}
static float dot_ref_q8_0(const uint8_t *b, const void *x, int64_t c)
{
    return b32_dot_ref(GGUF_TYPE_Q8_0, 34, b, x, c);
}
static float dot_ref_iq4_nl(const uint8_t *b, const void *x, int64_t c)
{
    return b32_dot_ref(GGUF_TYPE_IQ4_NL, 18, b, x, c);
}

/* Q4_K (q5 0) and Q5_K: per super-block (d dx) sum_s sc_s (q . x8)_s - (dmin dx) sum_s m_s sum_s x8 */
static float q45k_dot_ref(const uint8_t *b, const xq8 *x, int64_t cols, int q5)
{
    const size_t bb = q5 ? 176 : 144;
    const uint8_t *qs0 = b + (q5 ? 48 : 16);
    float acc = 0;
    for (int64_t i = 0; i < cols / 256; i++, b += bb, qs0 += bb) {
        uint64_t sc, mn;
        k_scales(b + 4, &sc, &mn);
        int isum = 0, msum = 0;
        for (int s = 0; s < 8; s++) {
            const uint8_t *qs = qs0 + 32 * (s / 2);
            const int8_t *xq = x->q + 256 * i + 32 * s;
            int dot = 0, xsum = 0;
            for (int l = 0; l < 32; l++) {
                int v = s % 2 ? qs[l] >> 4 : qs[l] & 15;
                if (q5) v |= (b[16 + l] >> s & 1) << 4;
                dot += v * xq[l];
                xsum += xq[l];
            }
            isum += (int)(sc >> 8 * s & 0xff) * dot;
            msum += (int)(mn >> 8 * s & 0xff) * xsum;
        }
        acc += ld_f16(b) * x->d[i] * (float)isum - ld_f16(b + 2) * x->d[i] * (float)msum;
    }
    return acc;
}

static float dot_ref_q4_k(const uint8_t *b, const void *x, int64_t c) { return q45k_dot_ref(b, x, c, 0); }
static float dot_ref_q5_k(const uint8_t *b, const void *x, int64_t c) { return q45k_dot_ref(b, x, c, 1); }

/* Q6_K: per super-block (d dx) sum_s sc_s ((q . x8)_s - 32 sum_s x8), sub-blocks of 16 */
static float dot_ref_q6_k(const uint8_t *b, const void *xv, int64_t cols)
{
    const xq8 *x = xv;
    float acc = 0;
    for (int64_t i = 0; i < cols / 256; i++, b += 210) {
        int isum = 0;
        for (int v0 = 0; v0 < 256; v0 += 16) {
            int dot = 0, xsum = 0;
            for (int v = v0; v < v0 + 16; v++) {
                const int h = v / 128, r = v % 128;
                const int lo = b[64 * h + r % 64] >> 4 * (r / 64) & 15,
                          hi = b[128 + 32 * h + r % 32] >> 2 * (r / 32) & 3;
                const int8_t xq = x->q[256 * i + v];
                dot += (lo | hi << 4) * xq;
                xsum += xq;
            }
            isum += (int8_t)b[192 + v0 / 16] * (dot - 32 * xsum);
        }
        acc += ld_f16(b + 208) * x->d[i] * (float)isum;
    }
    return acc;
}

/* ---- the 32-value block kernels (xq16) -------------------------------------------------------- */

#ifdef OPS_AVX2
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

/* Sixteen bits of qh as 16 in the int16 lanes whose bit is set (Q5's fifth bit). */
static inline __m256i q5_bits16(uint32_t bits)
{
#if defined(__AVX512BW__) && defined(__AVX512VL__)
    return _mm256_maskz_set1_epi16((__mmask16)bits, 16);
#else
    const __m256i m = _mm256_setr_epi16(1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384,
                                        (short)32768);
    const __m256i v = _mm256_and_si256(_mm256_set1_epi16((short)bits), m);
    return _mm256_and_si256(_mm256_cmpeq_epi16(v, m), _mm256_set1_epi16(16));
#endif
}

/* q . x16 over one Q5 block: qh (32 fifth bits, bit j for value j), qs as Q4's */
static inline __m256 q5_block_dot(const uint8_t *qh, const uint8_t *qs, __m256i xlo, __m256i xhi)
{
    const uint32_t h = ld_u32(qh);
    const __m256i w = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)qs));
    const __m256i lo = _mm256_or_si256(_mm256_and_si256(w, _mm256_set1_epi16(0x0F)), q5_bits16(h & 0xffff));
    const __m256i hi = _mm256_or_si256(_mm256_srli_epi16(w, 4), q5_bits16(h >> 16));
    return _mm256_cvtepi32_ps(madd2_epi16(lo, xlo, hi, xhi));
}

/* kvalues[q] . x16 over one IQ4_NL block */
static inline __m256 iq4nl_block_dot(const uint8_t *qs, __m256i xlo, __m256i xhi)
{
    const __m128i tab = _mm_loadu_si128((const __m128i *)IQ4NL_VALUES), m4 = _mm_set1_epi8(0x0F);
    const __m128i v = _mm_loadu_si128((const __m128i *)qs);
    const __m128i lo = _mm_shuffle_epi8(tab, _mm_and_si128(v, m4));
    const __m128i hi = _mm_shuffle_epi8(tab, _mm_and_si128(_mm_srli_epi16(v, 4), m4));
    return _mm256_cvtepi32_ps(madd2_epi16(_mm256_cvtepi8_epi16(lo), xlo, _mm256_cvtepi8_epi16(hi), xhi));
}

#define X16_LO(x, i) _mm256_loadu_si256((const __m256i *)((x)->x16 + 32 * (i)))
#define X16_HI(x, i) _mm256_loadu_si256((const __m256i *)((x)->x16 + 32 * (i) + 16))

static inline __m128 f16x4(const uint8_t *p0, const uint8_t *p1, const uint8_t *p2, const uint8_t *p3)
{
    return _mm_cvtph_ps(_mm_setr_epi16((short)(p0[0] | p0[1] << 8), (short)(p1[0] | p1[1] << 8),
                                       (short)(p2[0] | p2[1] << 8), (short)(p3[0] | p3[1] << 8), 0, 0, 0, 0));
}

/* One row of Q4_1 (f16 d, f16 m, u8 qs[16] per block): sum_b d sx (q . x16) + m xs. */
static float dot1_q4_1(const uint8_t *b, const void *xv, int64_t cols)
{
    const xq16 *x = xv;
    __m256 acc = _mm256_setzero_ps();
    float accm = 0;
    for (int64_t i = 0; i < cols / 32; i++, b += 20) {
        acc = _mm256_fmadd_ps(_mm256_set1_ps(f16_scalar(b) * x->sx[i]), q4_block_dot(b + 4, X16_LO(x, i), X16_HI(x, i)),
                              acc);
        accm += f16_scalar(b + 2) * x->xs[i];
    }
    return hsum256(acc) + accm;
}

/* One row of a type with one f16 d per block (Q4_0, Q5_0, Q8_0, IQ4_NL): sum_b d sx (q . x16)
 * + ofs sum_b d xs, the offset ofs -8 (Q4_0), -16 (Q5_0) or none. */
#define DOT1_D(name, bytes, QDOT, ofs)                                                             \
    static float name(const uint8_t *b, const void *xv, int64_t cols)                             \
    {                                                                                              \
        const xq16 *x = xv;                                                                        \
        __m256 acc = _mm256_setzero_ps();                                                          \
        float accm = 0;                                                                            \
        for (int64_t i = 0; i < cols / 32; i++, b += (bytes)) {                                    \
            const float d = f16_scalar(b);                                                         \
            acc = _mm256_fmadd_ps(_mm256_set1_ps(d * x->sx[i]), QDOT, acc);                        \
            if (ofs) accm += d * x->xs[i];                                                         \
        }                                                                                          \
        return hsum256(acc) + (ofs) * accm;                                                        \
    }
DOT1_D(dot1_q4_0, 18, q4_block_dot(b + 2, X16_LO(x, i), X16_HI(x, i)), -8)
DOT1_D(dot1_q5_0, 22, q5_block_dot(b + 2, b + 6, X16_LO(x, i), X16_HI(x, i)), -16)
DOT1_D(dot1_q8_0, 34, q8_block_dot(b + 2, X16_LO(x, i), X16_HI(x, i)), 0)
DOT1_D(dot1_iq4_nl, 18, iq4nl_block_dot(b + 2, X16_LO(x, i), X16_HI(x, i)), 0)
#undef DOT1_D

/* Four rows at a time (y[0..3]), as the one-row kernels: x's block is loaded once for the four,
 * the four rows' scales are converted together, and four accumulator chains hide the latency. */
#define ROWDOT4_BODY(QDOT)                                                                         \
    const __m256i xl = X16_LO(x, i), xh = X16_HI(x, i);                                          \
    a0 = _mm256_fmadd_ps(_mm256_broadcast_ss(ds + 0), QDOT(b), a0);                               \
    a1 = _mm256_fmadd_ps(_mm256_broadcast_ss(ds + 1), QDOT(b + rb), a1);                          \
    a2 = _mm256_fmadd_ps(_mm256_broadcast_ss(ds + 2), QDOT(b + 2 * rb), a2);                      \
    a3 = _mm256_fmadd_ps(_mm256_broadcast_ss(ds + 3), QDOT(b + 3 * rb), a3)

/* Q4_1 and Q5_1: an f16 d and m per block */
#define DOT4_DM(name, bytes, QDOT)                                                                 \
    static void name(float *y, const uint8_t *b, size_t rb, const void *xv, int64_t cols)        \
    {                                                                                              \
        const xq16 *x = xv;                                                                        \
        __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps(), a2 = _mm256_setzero_ps();      \
        __m256 a3 = _mm256_setzero_ps();                                                           \
        __m128 am = _mm_setzero_ps();                                                              \
        float ds[4];                                                                               \
        for (int64_t i = 0; i < cols / 32; i++, b += (bytes)) {                                    \
            __m128 dm01 = _mm_cvtph_ps(_mm_unpacklo_epi32(_mm_cvtsi32_si128((int)load_u32(b)),    \
                                                          _mm_cvtsi32_si128((int)load_u32(b + rb)))); \
            __m128 dm23 = _mm_cvtph_ps(_mm_unpacklo_epi32(_mm_cvtsi32_si128((int)load_u32(b + 2 * rb)), \
                                                          _mm_cvtsi32_si128((int)load_u32(b + 3 * rb)))); \
            _mm_storeu_ps(ds, _mm_mul_ps(_mm_shuffle_ps(dm01, dm23, _MM_SHUFFLE(2, 0, 2, 0)),      \
                                         _mm_broadcast_ss(x->sx + i)));                            \
            am = _mm_fmadd_ps(_mm_shuffle_ps(dm01, dm23, _MM_SHUFFLE(3, 1, 3, 1)),                 \
                              _mm_broadcast_ss(x->xs + i), am);                                    \
            ROWDOT4_BODY(QDOT);                                                                    \
        }                                                                                          \
        _mm_storeu_ps(y, _mm_add_ps(hsum4x256(a0, a1, a2, a3), am));                               \
    }
#define QDOT_Q4_1(p) q4_block_dot((p) + 4, xl, xh)
#define QDOT_Q5_1(p) q5_block_dot((p) + 4, (p) + 8, xl, xh)
DOT4_DM(dot4_q4_1, 20, QDOT_Q4_1)
DOT4_DM(dot4_q5_1, 24, QDOT_Q5_1)

static float dot1_q5_1(const uint8_t *b, const void *xv, int64_t cols)
{
    const xq16 *x = xv;
    __m256 acc = _mm256_setzero_ps();
    float accm = 0;
    for (int64_t i = 0; i < cols / 32; i++, b += 24) {
        acc = _mm256_fmadd_ps(_mm256_set1_ps(f16_scalar(b) * x->sx[i]),
                              q5_block_dot(b + 4, b + 8, X16_LO(x, i), X16_HI(x, i)), acc);
        accm += f16_scalar(b + 2) * x->xs[i];
    }
    return hsum256(acc) + accm;
}

/* one f16 d per block, offset ofs * d * xs */
#define DOT4_D(name, bytes, QDOT, ofs)                                                             \
    static void name(float *y, const uint8_t *b, size_t rb, const void *xv, int64_t cols)        \
    {                                                                                              \
        const xq16 *x = xv;                                                                        \
        __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps(), a2 = _mm256_setzero_ps();      \
        __m256 a3 = _mm256_setzero_ps();                                                           \
        __m128 am = _mm_setzero_ps();                                                              \
        float ds[4];                                                                               \
        for (int64_t i = 0; i < cols / 32; i++, b += (bytes)) {                                    \
            __m128 dv = f16x4(b, b + rb, b + 2 * rb, b + 3 * rb);                                  \
            _mm_storeu_ps(ds, _mm_mul_ps(dv, _mm_broadcast_ss(x->sx + i)));                        \
            if (ofs) am = _mm_fmadd_ps(dv, _mm_broadcast_ss(x->xs + i), am);                       \
            ROWDOT4_BODY(QDOT);                                                                    \
        }                                                                                          \
        __m128 s = hsum4x256(a0, a1, a2, a3);                                                      \
        _mm_storeu_ps(y, (ofs) ? _mm_fmadd_ps(_mm_set1_ps((float)(ofs)), am, s) : s);             \
    }
#define QDOT_Q4_0(p) q4_block_dot((p) + 2, xl, xh)
#define QDOT_Q5_0(p) q5_block_dot((p) + 2, (p) + 6, xl, xh)
#define QDOT_Q8_0(p) q8_block_dot((p) + 2, xl, xh)
#define QDOT_IQ4NL(p) iq4nl_block_dot((p) + 2, xl, xh)
DOT4_D(dot4_q4_0, 18, QDOT_Q4_0, -8)
DOT4_D(dot4_q5_0, 22, QDOT_Q5_0, -16)
DOT4_D(dot4_q8_0, 34, QDOT_Q8_0, 0)
DOT4_D(dot4_iq4_nl, 18, QDOT_IQ4NL, 0)
#undef DOT4_D
#undef DOT4_DM
#undef ROWDOT4_BODY

/* ---- the K-type tiles (xq8) -------------------------------------------------------------------
 *
 * A tile: rows w[0..3] by T tokens (T a constant after inlining). Per super-block and row the
 * weights are unpacked once into unsigned bytes (4 vectors of 64 values with AVX-512, 8 of 32
 * with AVX2), then for each token: vpmaddubsw with x's int8 (pairs into int16), vpdpwssd with
 * the sub-block scales spread over the pairs (int32 lanes: a super-block's sum is at most
 * 256 * 63 * 127 * 128 in magnitude, no overflow), and one f32 FMA of the lanes by d dx. The
 * mins of Q4_K/Q5_K (m . x's 32-sums) go four rows to a vector, by dmin dx. */

static inline __m128 k_dm4(const uint8_t *const w[4], size_t off, __m128 *dmin)
{
    const __m128 dm01 = _mm_cvtph_ps(_mm_unpacklo_epi32(_mm_cvtsi32_si128((int)load_u32(w[0] + off)),
                                                        _mm_cvtsi32_si128((int)load_u32(w[1] + off))));
    const __m128 dm23 = _mm_cvtph_ps(_mm_unpacklo_epi32(_mm_cvtsi32_si128((int)load_u32(w[2] + off)),
                                                        _mm_cvtsi32_si128((int)load_u32(w[3] + off))));
    *dmin = _mm_shuffle_ps(dm01, dm23, _MM_SHUFFLE(3, 1, 3, 1));
    return _mm_shuffle_ps(dm01, dm23, _MM_SHUFFLE(2, 0, 2, 0));
}

/* Decode: each of the four rows' next bb bytes, ahead bytes on (0: none). The rows are read in
 * parallel, so each is prefetched along itself; from a row's end on this runs into the rows
 * after it, the next tile's when ahead is four rows. */
static inline void tile_prefetch(const uint8_t *const w[4], size_t ahead, size_t off, size_t bb)
{
    if (!ahead) return;
    for (int r = 0; r < 4; r++) prefetch_bytes(w[r] + off + ahead, bb);
}

static inline void tile_store(float *y, size_t ldy, int t, int nr, __m128 v)
{
    if (nr == 4) {
        _mm_storeu_ps(y + t * ldy, v);
    } else {
        float out[4];
        _mm_storeu_ps(out, v);
        for (int r = 0; r < nr; r++) y[t * ldy + r] = out[r];
    }
}

/* An unpacked super-block's d and dmin (prefill over unpacked rows: KU_BLOCK below). */
static inline void ku_put_d(uint8_t *u, float d, float dmin)
{
    memcpy(u + 544, &d, 4);
    memcpy(u + 548, &dmin, 4);
}

#ifdef QUANT_AVX512
static inline __m512i dpwssd512(__m512i acc, __m512i a, __m512i b)
{
#ifdef __AVX512VNNI__
    return _mm512_dpwssd_epi32(acc, a, b);
#else
    return _mm512_add_epi32(acc, _mm512_madd_epi16(a, b));
#endif
}

/* (sum a, sum b, sum c, sum d) */
static inline __m128 hsum4x512(__m512 a, __m512 b, __m512 c, __m512 d)
{
#define HALF(v) _mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1))
    return hsum4x256(HALF(a), HALF(b), HALF(c), HALF(d));
#undef HALF
}

/* (sum of lanes 0-3, 4-7, 8-11, 12-15) */
static inline __m128 hsum_quads512(__m512 v)
{
    const __m128 l0 = _mm512_castps512_ps128(v), l1 = _mm512_extractf32x4_ps(v, 1);
    const __m128 l2 = _mm512_extractf32x4_ps(v, 2), l3 = _mm512_extractf32x4_ps(v, 3);
    return _mm_hadd_ps(_mm_hadd_ps(l0, l1), _mm_hadd_ps(l2, l3));
}

#define R8(v) v, v, v, v, v, v, v, v
#define R32(v) R8(v), R8(v), R8(v), R8(v)
#define SH8(a) a, 0x80, a, 0x80, a, 0x80, a, 0x80, a, 0x80, a, 0x80, a, 0x80, a, 0x80
#define SH_LANES(a, b) SH8(a), SH8(a), SH8(b), SH8(b)
/* A 64-byte load of Q4_K's nibbles gives, low nibbles, sub-blocks [s | s + 2] and, high, [s + 1
 * | s + 3]: vpshufb controls that spread scale bytes (0-7 of each 128-bit lane) over the int16
 * pairs of the four vectors of a super-block, and the Q5_K qh bits of their values. */
static const uint8_t K4_SCALE_SHUF[4][64] __attribute__((aligned(64))) = {
    { SH_LANES(0, 2) }, { SH_LANES(1, 3) }, { SH_LANES(4, 6) }, { SH_LANES(5, 7) },
};
static const uint8_t K5_BITS[4][64] __attribute__((aligned(64))) = {
    { R32(1), R32(4) }, { R32(2), R32(8) }, { R32(16), R32(64) }, { R32(32), R32(128) },
};
/* vpermw indices that spread Q6_K's sixteen scales (int16) over the vectors: values 64 k ..
 * 64 k + 63 are sub-blocks 4 k .. 4 k + 3 of 16 */
#define W8(a) a, a, a, a, a, a, a, a
static const int16_t K6_SCALE_IDX[4][32] __attribute__((aligned(64))) = {
    { W8(0), W8(1), W8(2), W8(3) }, { W8(4), W8(5), W8(6), W8(7) },
    { W8(8), W8(9), W8(10), W8(11) }, { W8(12), W8(13), W8(14), W8(15) },
};
/* Q6_K's two high bits of the four vectors (qh[0..31] in both halves): shifted left into bits
 * 4-5 (low nibbles: values 0-31 bits 0-1, values 32-63 bits 2-3) or right (high nibbles: 64-95
 * bits 4-5, 96-127 bits 6-7) */
/* (counts per 64-bit lane: the bits a shift moves across bytes land outside 4-5 and are masked) */
static const int64_t K6_SHL[8] __attribute__((aligned(64))) = { 4, 4, 4, 4, 2, 2, 2, 2 };
static const int64_t K6_SHR[8] __attribute__((aligned(64))) = { 0, 0, 0, 0, 2, 2, 2, 2 };
/* lane -> row of the four rows' dmin spread over quads */
static const int32_t QUAD_IDX[16] __attribute__((aligned(64))) = { 0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3 };
#undef W8
#undef SH_LANES
#undef SH8
#undef R32
#undef R8

#define LOAD512(p) _mm512_load_si512((const void *)(p))

/* Q4_K/Q5_K super-block b as the tiles read it: its 256 values as bytes in four vectors (x's qp
 * order), its scales spread over the int16 pairs of those vectors, and its eight mins (bytes). */
static inline __attribute__((always_inline)) void k45_vec512(const uint8_t *b, const int q5, __m512i q[4],
                                                             __m512i s[4], uint64_t *mn)
{
    const size_t qso = q5 ? 48 : 16;
    const __m512i m4 = _mm512_set1_epi8(0x0F), c16 = _mm512_set1_epi8(16);
    uint64_t sc;
    k_scales(b + 4, &sc, mn);
    const __m512i S = _mm512_set1_epi64((long long)sc);
    const __m512i v0 = _mm512_loadu_si512((const void *)(b + qso));
    const __m512i v1 = _mm512_loadu_si512((const void *)(b + qso + 64));
    q[0] = _mm512_and_si512(v0, m4);
    q[1] = _mm512_and_si512(_mm512_srli_epi16(v0, 4), m4);
    q[2] = _mm512_and_si512(v1, m4);
    q[3] = _mm512_and_si512(_mm512_srli_epi16(v1, 4), m4);
    if (q5) {
        const __m512i h = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(b + 16)));
        #pragma GCC unroll 4
        for (int k = 0; k < 4; k++)
            q[k] = _mm512_mask_add_epi8(q[k], _mm512_test_epi8_mask(h, LOAD512(K5_BITS[k])), q[k], c16);
    }
    #pragma GCC unroll 4
    for (int k = 0; k < 4; k++) s[k] = _mm512_shuffle_epi8(S, LOAD512(K4_SCALE_SHUF[k]));
}

/* Q6_K super-block b as its tile reads it: values as bytes (0..63) in four vectors (x's q order),
 * its sixteen scales spread over their int16 pairs, and -32 times the scales (int16). */
static inline __attribute__((always_inline)) void k6_vec512(const uint8_t *b, __m512i q[4], __m512i s[4],
                                                            __m256i *nsc)
{
    const __m512i m4 = _mm512_set1_epi8(0x0F), m30 = _mm512_set1_epi8(0x30);
    const __m512i shl = LOAD512(K6_SHL), shr = LOAD512(K6_SHR);
    const __m256i sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(b + 192)));
    const __m512i S = _mm512_castsi256_si512(sc16);
    *nsc = _mm256_sub_epi16(_mm256_setzero_si256(), _mm256_slli_epi16(sc16, 5));
    #pragma GCC unroll 2
    for (int h = 0; h < 2; h++) {
        const __m512i v = _mm512_loadu_si512((const void *)(b + 64 * h));
        const __m512i hb = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(b + 128 + 32 * h)));
        /* a | (b & c): 0xF8 */
        q[2 * h] = _mm512_ternarylogic_epi32(_mm512_and_si512(v, m4), _mm512_sllv_epi64(hb, shl), m30, 0xF8);
        q[2 * h + 1] = _mm512_ternarylogic_epi32(_mm512_and_si512(_mm512_srli_epi16(v, 4), m4),
                                                 _mm512_srlv_epi64(hb, shr), m30, 0xF8);
    }
    #pragma GCC unroll 4
    for (int k = 0; k < 4; k++) s[k] = _mm512_permutexvar_epi16(LOAD512(K6_SCALE_IDX[k]), S);
}

/* A tile's sums, zero (accm: the mins', when not NULL). */
static inline __attribute__((always_inline)) void k_zero512(__m512 acc[4][QUANT_TILE_T], __m512 *accm, const int T)
{
    #pragma GCC unroll 4
    for (int t = 0; t < T; t++) {
        if (accm) accm[t] = _mm512_setzero_ps();
        #pragma GCC unroll 4
        for (int r = 0; r < 4; r++) acc[r][t] = _mm512_setzero_ps();
    }
}

/* The four rows' d times each token's step: ddx[t][r]. */
static inline __attribute__((always_inline)) void k_ddx(float ddx[][4], __m128 d, const xq8 *x, int64_t i, const int T)
{
    #pragma GCC unroll 4
    for (int t = 0; t < T; t++) _mm_storeu_ps(ddx[t], _mm_mul_ps(d, _mm_set1_ps(x->d[t * (x->cols / 256) + i])));
}

/* One row's super-block and T tokens into acc[t] (Q4_K/Q5_K: x's qp order; Q6_K: q order and
 * the -32 of every value against x's 16-sums), as every K-type tile does it. */
static inline __attribute__((always_inline)) void k_row512(__m512 *acc, const __m512i q[4], const __m512i s[4],
                                                           const __m256i *nsc, const xq8 *x, int64_t i,
                                                           const float ddx[][4], int r, const int T)
{
    const int64_t cols = x->cols;
    #pragma GCC unroll 4
    for (int t = 0; t < T; t++) {
        const int8_t *xq = (nsc ? x->q : x->qp) + t * cols + 256 * i;
        __m512i ia = _mm512_setzero_si512();
        if (nsc) {
            const __m256i s16 = _mm256_loadu_si256((const __m256i *)(x->s16 + t * cols / 16 + 16 * i));
            ia = dpwssd512(ia, _mm512_zextsi256_si512(*nsc), _mm512_zextsi256_si512(s16));
        }
        #pragma GCC unroll 4
        for (int k = 0; k < 4; k++)
            ia = dpwssd512(ia, _mm512_maddubs_epi16(q[k], _mm512_loadu_si512((const void *)(xq + 64 * k))), s[k]);
        acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(ia), _mm512_set1_ps(ddx[t][r]), acc[t]);
    }
}

/* The four rows' mins (bytes) times x's 32-sums and dmin, into accm[t]: row r in quad r. */
static inline __attribute__((always_inline)) void k_mins512(__m512 *accm, const uint64_t mn[4], __m128 dmin,
                                                            const xq8 *x, int64_t i, const int T)
{
    const int64_t cols = x->cols, nb = cols / 256;
    const __m512i M = _mm512_cvtepu8_epi16(_mm256_set_epi64x((long long)mn[3], (long long)mn[2],
                                                             (long long)mn[1], (long long)mn[0]));
    const __m512 dmq = _mm512_permutexvar_ps(_mm512_load_si512(QUAD_IDX), _mm512_castps128_ps512(dmin));
    #pragma GCC unroll 4
    for (int t = 0; t < T; t++) {
        const __m512i s32 = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)(x->s32 + t * cols / 32 + 8 * i)));
        accm[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_madd_epi16(M, s32)),
                                  _mm512_mul_ps(dmq, _mm512_set1_ps(x->d[t * nb + i])), accm[t]);
    }
}

static inline __attribute__((always_inline)) void
q45k_tile(float *y, size_t ldy, const uint8_t *const w[4], int nr, const xq8 *x, const int T, int64_t cols,
          size_t ahead, const int q5)
{
    const int64_t nb = cols / 256;
    const size_t bb = q5 ? 176 : 144;
    __m512 acc[4][QUANT_TILE_T], accm[QUANT_TILE_T];
    k_zero512(acc, accm, T);
    for (int64_t i = 0; i < nb; i++) {
        const size_t off = (size_t)i * bb;
        tile_prefetch(w, ahead, off, bb);
        __m128 dmin;
        const __m128 d = k_dm4(w, off, &dmin);
        float ddx[QUANT_TILE_T][4];
        k_ddx(ddx, d, x, i, T);
        uint64_t mn[4];
        #pragma GCC unroll 4
        for (int r = 0; r < 4; r++) {
            __m512i q[4], s[4];
            k45_vec512(w[r] + off, q5, q, s, &mn[r]);
            k_row512(acc[r], q, s, NULL, x, i, ddx, r, T);
        }
        k_mins512(accm, mn, dmin, x, i, T);
    }
    #pragma GCC unroll 4
    for (int t = 0; t < T; t++)
        tile_store(y, ldy, t, nr,
                   _mm_sub_ps(hsum4x512(acc[0][t], acc[1][t], acc[2][t], acc[3][t]), hsum_quads512(accm[t])));
}

static inline __attribute__((always_inline)) void
q6k_tile(float *y, size_t ldy, const uint8_t *const w[4], int nr, const xq8 *x, const int T, int64_t cols,
         size_t ahead)
{
    const int64_t nb = cols / 256;
    __m512 acc[4][QUANT_TILE_T];
    k_zero512(acc, NULL, T);
    for (int64_t i = 0; i < nb; i++) {
        const size_t off = (size_t)i * 210;
        tile_prefetch(w, ahead, off, 210);
        const __m128 d = f16x4(w[0] + off + 208, w[1] + off + 208, w[2] + off + 208, w[3] + off + 208);
        float ddx[QUANT_TILE_T][4];
        k_ddx(ddx, d, x, i, T);
        #pragma GCC unroll 4
        for (int r = 0; r < 4; r++) {
            __m512i q[4], s[4];
            __m256i nsc;
            k6_vec512(w[r] + off, q, s, &nsc);
            k_row512(acc[r], q, s, &nsc, x, i, ddx, r, T);
        }
    }
    #pragma GCC unroll 4
    for (int t = 0; t < T; t++) tile_store(y, ldy, t, nr, hsum4x512(acc[0][t], acc[1][t], acc[2][t], acc[3][t]));
}

/* ---- prefill over unpacked rows (AVX-512) ----------------------------------------------------
 *
 * The tiles above build each row's vectors again for every T (<= 4) tokens: the nibbles
 * unpacked, the scales spread, Q5_K's and Q6_K's high bits merged. In prefill a token tile (a
 * batch, 64 tokens) reads the same rows, so here four rows are unpacked once per token tile into
 * KU_BLOCK bytes a super-block, exactly the vectors the tiles build, and the tile reads them back:
 *   [0, 256)    the four value vectors (k45_vec512, k6_vec512);
 *   [256, 512)  the four scale vectors;
 *   [512, 544)  Q4_K/Q5_K: the eight mins (bytes); Q6_K: -32 times the sixteen scales (int16);
 *   [544, 552)  d and (Q4_K/Q5_K) dmin, f32.
 * The same instructions then run on the same values in the same order, so every result is bit
 * for bit the tile's, and the decode's (tests/test_quant.c checks a batch's last token). */
#define KU_BLOCK 576

static void ku_q45k(const uint8_t *b, uint8_t *u, int64_t nb, const int q5)
{
    const size_t bb = q5 ? 176 : 144;
    for (int64_t i = 0; i < nb; i++, b += bb, u += KU_BLOCK) {
        __m512i q[4], s[4];
        uint64_t mn;
        k45_vec512(b, q5, q, s, &mn);
        for (int k = 0; k < 4; k++) {
            _mm512_store_si512((void *)(u + 64 * k), q[k]);
            _mm512_store_si512((void *)(u + 256 + 64 * k), s[k]);
        }
        memcpy(u + 512, &mn, 8);
        ku_put_d(u, f16_scalar(b), f16_scalar(b + 2));
    }
}

static void ku_q6_k(const uint8_t *b, uint8_t *u, int64_t nb)
{
    for (int64_t i = 0; i < nb; i++, b += 210, u += KU_BLOCK) {
        __m512i q[4], s[4];
        __m256i nsc;
        k6_vec512(b, q, s, &nsc);
        for (int k = 0; k < 4; k++) {
            _mm512_store_si512((void *)(u + 64 * k), q[k]);
            _mm512_store_si512((void *)(u + 256 + 64 * k), s[k]);
        }
        _mm256_store_si256((__m256i *)(u + 512), nsc);
        ku_put_d(u, f16_scalar(b + 208), 0);
    }
}

static inline float ku_f32(const uint8_t *p)
{
    float v;
    memcpy(&v, p, 4);
    return v;
}

/* Four unpacked rows (row r at u + r ub; rows nr..3 repeat row 0) by T tokens, as the tiles. */
static inline __attribute__((always_inline)) void
ku_tile(float *y, size_t ldy, const uint8_t *u, size_t ub, int nr, const xq8 *x, const int T, int64_t cols,
        const int q6)
{
    const int64_t nb = cols / 256;
    const uint8_t *ur[4] = { u, u + ub * (nr > 1), u + ub * (nr > 2 ? 2 : 0), u + ub * (nr > 3 ? 3 : 0) };
    __m512 acc[4][QUANT_TILE_T], accm[QUANT_TILE_T];
    k_zero512(acc, accm, T);
    for (int64_t i = 0; i < nb; i++) {
        const size_t off = (size_t)i * KU_BLOCK;
        const __m128 d = _mm_setr_ps(ku_f32(ur[0] + off + 544), ku_f32(ur[1] + off + 544), ku_f32(ur[2] + off + 544),
                                     ku_f32(ur[3] + off + 544));
        float ddx[QUANT_TILE_T][4];
        k_ddx(ddx, d, x, i, T);
        #pragma GCC unroll 4
        for (int r = 0; r < 4; r++) {
            const uint8_t *b = ur[r] + off;
            const __m512i q[4] = { LOAD512(b), LOAD512(b + 64), LOAD512(b + 128), LOAD512(b + 192) };
            const __m512i s[4] = { LOAD512(b + 256), LOAD512(b + 320), LOAD512(b + 384), LOAD512(b + 448) };
            const __m256i nsc = q6 ? _mm256_load_si256((const __m256i *)(b + 512)) : _mm256_setzero_si256();
            k_row512(acc[r], q, s, q6 ? &nsc : NULL, x, i, ddx, r, T);
        }
        if (!q6) {
            uint64_t mn[4];
            for (int r = 0; r < 4; r++) memcpy(&mn[r], ur[r] + off + 512, 8);
            const __m128 dmin = _mm_setr_ps(ku_f32(ur[0] + off + 548), ku_f32(ur[1] + off + 548),
                                            ku_f32(ur[2] + off + 548), ku_f32(ur[3] + off + 548));
            k_mins512(accm, mn, dmin, x, i, T);
        }
    }
    #pragma GCC unroll 4
    for (int t = 0; t < T; t++) {
        __m128 v = hsum4x512(acc[0][t], acc[1][t], acc[2][t], acc[3][t]);
        if (!q6) v = _mm_sub_ps(v, hsum_quads512(accm[t]));
        tile_store(y, ldy, t, nr, v);
    }
}

#define KU_FN(name, q6)                                                                             \
    static void name(float *y, size_t ldy, const uint8_t *u, size_t ub, int nr, const xq8 *x, int T, \
                     int64_t cols)                                                                  \
    {                                                                                               \
        switch (T) {                                                                                \
        case 1: ku_tile(y, ldy, u, ub, nr, x, 1, cols, q6); return;                                 \
        case 2: ku_tile(y, ldy, u, ub, nr, x, 2, cols, q6); return;                                 \
        case 3: ku_tile(y, ldy, u, ub, nr, x, 3, cols, q6); return;                                 \
        default: ku_tile(y, ldy, u, ub, nr, x, 4, cols, q6); return;                                \
        }                                                                                           \
    }
KU_FN(ku_tile_q45k, 0)
KU_FN(ku_tile_q6k, 1)
#undef KU_FN
#define KU(f) f
#undef LOAD512

#else /* AVX2 */

#define SH16(a) a, 0x80, a, 0x80, a, 0x80, a, 0x80, a, 0x80, a, 0x80, a, 0x80, a, 0x80, \
                a, 0x80, a, 0x80, a, 0x80, a, 0x80, a, 0x80, a, 0x80, a, 0x80, a, 0x80
/* vpshufb controls: scale byte j (of 0-7 in each lane) over all sixteen int16 lanes */
static const uint8_t K4_SCALE_SHUF[8][32] __attribute__((aligned(32))) = {
    { SH16(0) }, { SH16(1) }, { SH16(2) }, { SH16(3) }, { SH16(4) }, { SH16(5) }, { SH16(6) }, { SH16(7) },
};
#undef SH16
#define B16(a) a, a, a, a, a, a, a, a, a, a, a, a, a, a, a, a
/* Q6_K: byte 2 j in the low lane, 2 j + 1 in the high one (both bytes of each int16: the
 * arithmetic shift right by 8 then sign-extends the scale) */
static const uint8_t K6_SCALE_SHUF[8][32] __attribute__((aligned(32))) = {
    { B16(0), B16(1) }, { B16(2), B16(3) }, { B16(4), B16(5) }, { B16(6), B16(7) },
    { B16(8), B16(9) }, { B16(10), B16(11) }, { B16(12), B16(13) }, { B16(14), B16(15) },
};
#undef B16

#define LOAD256(p) _mm256_load_si256((const __m256i *)(p))

/* the mins of rows (2 j, 2 j + 1) as int16 lanes 8 r .., times x's 32-sums: lanes 4 r .. 4 r + 3 */
static inline __m256 k_mins2(uint64_t m0, uint64_t m1, __m128i s32)
{
    const __m256i M = _mm256_cvtepu8_epi16(_mm_set_epi64x((long long)m1, (long long)m0));
    return _mm256_cvtepi32_ps(_mm256_madd_epi16(M, _mm256_broadcastsi128_si256(s32)));
}

/* Q4_K/Q5_K: values 64 c .. 64 c + 63 of super-block b as unsigned bytes (h: Q5_K's high bits) */
static inline __attribute__((always_inline)) void k45_bytes(const uint8_t *b, size_t qso, __m256i h, int c,
                                                            const int q5, __m256i *lo, __m256i *hi)
{
    const __m256i m4 = _mm256_set1_epi8(0x0F), c16 = _mm256_set1_epi8(16);
    const __m256i v = _mm256_loadu_si256((const __m256i *)(b + qso + 32 * c));
    *lo = _mm256_and_si256(v, m4);
    *hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
    if (q5) {
        const __m256i bl = _mm256_set1_epi8((char)(1 << 2 * c)), bh = _mm256_set1_epi8((char)(2 << 2 * c));
        *lo = _mm256_add_epi8(*lo, _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(h, bl), bl), c16));
        *hi = _mm256_add_epi8(*hi, _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(h, bh), bh), c16));
    }
}

/* Q6_K: values 128 h + 32 k .. + 31 of super-block b as unsigned bytes (0..63), k < 4 */
static inline __attribute__((always_inline)) void k6_bytes(const uint8_t *b, int h, __m256i q[4])
{
    const __m256i m4 = _mm256_set1_epi8(0x0F), m30 = _mm256_set1_epi8(0x30);
    const __m256i l0 = _mm256_loadu_si256((const __m256i *)(b + 64 * h));
    const __m256i l1 = _mm256_loadu_si256((const __m256i *)(b + 64 * h + 32));
    const __m256i hb = _mm256_loadu_si256((const __m256i *)(b + 128 + 32 * h));
    q[0] = _mm256_or_si256(_mm256_and_si256(l0, m4), _mm256_and_si256(_mm256_slli_epi16(hb, 4), m30));
    q[1] = _mm256_or_si256(_mm256_and_si256(l1, m4), _mm256_and_si256(_mm256_slli_epi16(hb, 2), m30));
    q[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), m4), _mm256_and_si256(hb, m30));
    q[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), m4),
                           _mm256_and_si256(_mm256_srli_epi16(hb, 2), m30));
}

static inline __attribute__((always_inline)) void
q45k_tile(float *y, size_t ldy, const uint8_t *const w[4], int nr, const xq8 *x, const int T, int64_t cols,
          size_t ahead, const int q5)
{
    const int64_t nb = cols / 256;
    const size_t bb = q5 ? 176 : 144, qso = q5 ? 48 : 16;
    const __m256i idx01 = _mm256_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1), idx23 = _mm256_setr_epi32(2, 2, 2, 2, 3, 3, 3, 3);
    __m256 acc[4][QUANT_TILE_T], accm[2][QUANT_TILE_T];
    #pragma GCC unroll 4
    for (int t = 0; t < T; t++) {
        accm[0][t] = accm[1][t] = _mm256_setzero_ps();
        #pragma GCC unroll 4
        for (int r = 0; r < 4; r++) acc[r][t] = _mm256_setzero_ps();
    }
    for (int64_t i = 0; i < nb; i++) {
        const size_t off = (size_t)i * bb;
        tile_prefetch(w, ahead, off, bb);
        __m128 dmin;
        const __m128 d = k_dm4(w, off, &dmin);
        float ddx[QUANT_TILE_T][4];
        #pragma GCC unroll 4
        for (int t = 0; t < T; t++) _mm_storeu_ps(ddx[t], _mm_mul_ps(d, _mm_set1_ps(x->d[t * nb + i])));
        uint64_t mn[4];
        #pragma GCC unroll 4
        for (int r = 0; r < 4; r++) {
            const uint8_t *b = w[r] + off;
            uint64_t sc;
            k_scales(b + 4, &sc, &mn[r]);
            const __m256i S = _mm256_set1_epi64x((long long)sc);
            const __m256i h = q5 ? _mm256_loadu_si256((const __m256i *)(b + 16)) : _mm256_setzero_si256();
            __m256i ia[QUANT_TILE_T];
            #pragma GCC unroll 4
            for (int t = 0; t < T; t++) ia[t] = _mm256_setzero_si256();
            #pragma GCC unroll 4
            for (int c = 0; c < 4; c++) {
                __m256i lo, hi;
                k45_bytes(b, qso, h, c, q5, &lo, &hi);
                const __m256i slo = _mm256_shuffle_epi8(S, LOAD256(K4_SCALE_SHUF[2 * c]));
                const __m256i shi = _mm256_shuffle_epi8(S, LOAD256(K4_SCALE_SHUF[2 * c + 1]));
                #pragma GCC unroll 4
                for (int t = 0; t < T; t++) {
                    const int8_t *xq = x->q + t * cols + 256 * i + 64 * c;
                    const __m256i plo = _mm256_maddubs_epi16(lo, _mm256_loadu_si256((const __m256i *)xq));
                    const __m256i phi = _mm256_maddubs_epi16(hi, _mm256_loadu_si256((const __m256i *)(xq + 32)));
                    ia[t] = _mm256_add_epi32(
                        ia[t], _mm256_add_epi32(_mm256_madd_epi16(plo, slo), _mm256_madd_epi16(phi, shi)));
                }
            }
            #pragma GCC unroll 4
            for (int t = 0; t < T; t++)
                acc[r][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(ia[t]), _mm256_set1_ps(ddx[t][r]), acc[r][t]);
        }
        const __m256 dm = _mm256_castps128_ps256(dmin);
        const __m256 dm01 = _mm256_permutevar8x32_ps(dm, idx01), dm23 = _mm256_permutevar8x32_ps(dm, idx23);
        #pragma GCC unroll 4
        for (int t = 0; t < T; t++) {
            const __m128i s32 = _mm_loadu_si128((const __m128i *)(x->s32 + t * cols / 32 + 8 * i));
            const __m256 dx = _mm256_set1_ps(x->d[t * nb + i]);
            accm[0][t] = _mm256_fmadd_ps(k_mins2(mn[0], mn[1], s32), _mm256_mul_ps(dm01, dx), accm[0][t]);
            accm[1][t] = _mm256_fmadd_ps(k_mins2(mn[2], mn[3], s32), _mm256_mul_ps(dm23, dx), accm[1][t]);
        }
    }
    #pragma GCC unroll 4
    for (int t = 0; t < T; t++) {
        /* quads of accm: rows 0, 1 | 2, 3 */
        const __m256 m = _mm256_hadd_ps(accm[0][t], accm[1][t]);   /* r0 r0 r2 r2 | r1 r1 r3 r3 */
        const __m128 mins = _mm_hadd_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));   /* r0 r2 r1 r3 */
        const __m128 mr = _mm_permute_ps(mins, _MM_SHUFFLE(3, 1, 2, 0));
        tile_store(y, ldy, t, nr, _mm_sub_ps(hsum4x256(acc[0][t], acc[1][t], acc[2][t], acc[3][t]), mr));
    }
}

static inline __attribute__((always_inline)) void
q6k_tile(float *y, size_t ldy, const uint8_t *const w[4], int nr, const xq8 *x, const int T, int64_t cols,
         size_t ahead)
{
    const int64_t nb = cols / 256;
    __m256 acc[4][QUANT_TILE_T];
    #pragma GCC unroll 4
    for (int t = 0; t < T; t++)
        #pragma GCC unroll 4
        for (int r = 0; r < 4; r++) acc[r][t] = _mm256_setzero_ps();
    for (int64_t i = 0; i < nb; i++) {
        const size_t off = (size_t)i * 210;
        tile_prefetch(w, ahead, off, 210);
        const __m128 d = f16x4(w[0] + off + 208, w[1] + off + 208, w[2] + off + 208, w[3] + off + 208);
        float ddx[QUANT_TILE_T][4];
        #pragma GCC unroll 4
        for (int t = 0; t < T; t++) _mm_storeu_ps(ddx[t], _mm_mul_ps(d, _mm_set1_ps(x->d[t * nb + i])));
        #pragma GCC unroll 4
        for (int r = 0; r < 4; r++) {
            const uint8_t *b = w[r] + off;
            const __m256i sb = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(b + 192)));
            const __m256i sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(b + 192)));
            const __m256i nsc = _mm256_sub_epi16(_mm256_setzero_si256(), _mm256_slli_epi16(sc16, 5));
            __m256i ia[QUANT_TILE_T];
            #pragma GCC unroll 4
            for (int t = 0; t < T; t++)
                ia[t] = _mm256_madd_epi16(nsc, _mm256_loadu_si256((const __m256i *)(x->s16 + t * cols / 16 + 16 * i)));
            #pragma GCC unroll 4
            for (int h = 0; h < 2; h++) {
                __m256i q[4];
                k6_bytes(b, h, q);
                #pragma GCC unroll 4
                for (int k = 0; k < 4; k++) {
                    const __m256i s = _mm256_srai_epi16(_mm256_shuffle_epi8(sb, LOAD256(K6_SCALE_SHUF[4 * h + k])), 8);
                    #pragma GCC unroll 4
                    for (int t = 0; t < T; t++) {
                        const int8_t *xq = x->q + t * cols + 256 * i + 128 * h + 32 * k;
                        ia[t] = _mm256_add_epi32(ia[t], _mm256_madd_epi16(
                            _mm256_maddubs_epi16(q[k], _mm256_loadu_si256((const __m256i *)xq)), s));
                    }
                }
            }
            #pragma GCC unroll 4
            for (int t = 0; t < T; t++)
                acc[r][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(ia[t]), _mm256_set1_ps(ddx[t][r]), acc[r][t]);
        }
    }
    #pragma GCC unroll 4
    for (int t = 0; t < T; t++) tile_store(y, ldy, t, nr, hsum4x256(acc[0][t], acc[1][t], acc[2][t], acc[3][t]));
}

/* ---- prefill over unpacked rows (AVX2 without AVX-512) ---------------------------------------
 *
 * The 4-row tiles unpack a row's nibbles and spread its scales again for every pair of tokens,
 * and with 16 registers their sums spill: 72 instructions per row, token and super-block in the
 * 2-token tile. Here a row is unpacked once per token tile into KU_BLOCK bytes a super-block:
 *   [0, 256)    the 256 weights as unsigned bytes, in x's order;
 *   [256, 512)  eight int16 vectors, each spreading one 32-value group's scale(s) over its lanes;
 *   [512, 544)  Q4_K/Q5_K: the eight 6-bit mins (int16); Q6_K: -32 times the sixteen scales;
 *   [544, 552)  d and (Q4_K/Q5_K) dmin, f32.
 * Then each group of 32 weights and token takes one vpmaddubsw, one vpmaddwd and an add (about
 * 30 instructions per row, token and super-block). The integer sums land in the same lanes as
 * the tiles' and the f32 steps are the tiles' in the same order, so every result is bit for bit
 * the decode tile's (tests/test_quant.c checks a batch's last token against its decode). */
#define KU_BLOCK 576

static void ku_q45k(const uint8_t *b, uint8_t *u, int64_t nb, const int q5)
{
    const size_t bb = q5 ? 176 : 144, qso = q5 ? 48 : 16;
    for (int64_t i = 0; i < nb; i++, b += bb, u += KU_BLOCK) {
        uint64_t sc, mn;
        k_scales(b + 4, &sc, &mn);
        const __m256i h = q5 ? _mm256_loadu_si256((const __m256i *)(b + 16)) : _mm256_setzero_si256();
        for (int c = 0; c < 4; c++) {
            __m256i lo, hi;
            k45_bytes(b, qso, h, c, q5, &lo, &hi);
            _mm256_store_si256((__m256i *)(u + 64 * c), lo);
            _mm256_store_si256((__m256i *)(u + 64 * c + 32), hi);
        }
        int16_t m[16] = { 0 };
        for (int j = 0; j < 8; j++) {
            _mm256_store_si256((__m256i *)(u + 256 + 32 * j), _mm256_set1_epi16((short)(sc >> 8 * j & 0xFF)));
            m[j] = (int16_t)(mn >> 8 * j & 0xFF);
        }
        memcpy(u + 512, m, sizeof m);
        ku_put_d(u, f16_scalar(b), f16_scalar(b + 2));
    }
}

static void ku_q6_k(const uint8_t *b, uint8_t *u, int64_t nb)
{
    for (int64_t i = 0; i < nb; i++, b += 210, u += KU_BLOCK) {
        for (int h = 0; h < 2; h++) {
            __m256i q[4];
            k6_bytes(b, h, q);
            for (int k = 0; k < 4; k++) _mm256_store_si256((__m256i *)(u + 128 * h + 32 * k), q[k]);
        }
        const int8_t *sc = (const int8_t *)(b + 192);
        int16_t nsc[16];
        for (int j = 0; j < 8; j++) {
            const __m128i lo = _mm_set1_epi16(sc[2 * j]), hi = _mm_set1_epi16(sc[2 * j + 1]);
            _mm256_store_si256((__m256i *)(u + 256 + 32 * j), _mm256_setr_m128i(lo, hi));
        }
        for (int j = 0; j < 16; j++) nsc[j] = (int16_t)(-32 * sc[j]);
        memcpy(u + 512, nsc, sizeof nsc);
        ku_put_d(u, f16_scalar(b + 208), 0);
    }
}

/* One unpacked row u by T tokens of x: y[t ldy] for t < T. */
static inline __attribute__((always_inline)) void
ku_tile(float *y, size_t ldy, const uint8_t *u, const xq8 *x, const int T, int64_t cols, const int q6)
{
    const int64_t nb = cols / 256;
    __m256 acc[4];
    __m128 accm[4];
    for (int t = 0; t < 4; t++) {
        acc[t] = _mm256_setzero_ps();
        accm[t] = _mm_setzero_ps();
    }
    for (int64_t i = 0; i < nb; i++, u += KU_BLOCK) {
        __m256i ia[4];
        #pragma GCC unroll 4
        for (int t = 0; t < T; t++)
            ia[t] = q6 ? _mm256_madd_epi16(LOAD256(u + 512),
                                           _mm256_loadu_si256((const __m256i *)(x->s16 + t * cols / 16 + 16 * i)))
                       : _mm256_setzero_si256();
        #pragma GCC unroll 1   /* unrolled, gcc loads all 16 vectors first and spills them */
        for (int j = 0; j < 8; j++) {
            const __m256i w = LOAD256(u + 32 * j), s = LOAD256(u + 256 + 32 * j);
            #pragma GCC unroll 4
            for (int t = 0; t < T; t++) {
                const __m256i xq = _mm256_loadu_si256((const __m256i *)(x->q + t * cols + 256 * i + 32 * j));
                ia[t] = _mm256_add_epi32(ia[t], _mm256_madd_epi16(_mm256_maddubs_epi16(w, xq), s));
            }
        }
        float d, dmin;
        memcpy(&d, u + 544, 4);
        memcpy(&dmin, u + 548, 4);
        #pragma GCC unroll 4
        for (int t = 0; t < T; t++) {
            const float dx = x->d[t * nb + i];
            acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(ia[t]), _mm256_set1_ps(d * dx), acc[t]);
            if (!q6) {
                const __m128i m = _mm_madd_epi16(_mm_load_si128((const __m128i *)(u + 512)),
                                                 _mm_loadu_si128((const __m128i *)(x->s32 + t * cols / 32 + 8 * i)));
                accm[t] = _mm_fmadd_ps(_mm_cvtepi32_ps(m), _mm_set1_ps(dmin * dx), accm[t]);
            }
        }
    }
    __m128 s = hsum4x256(acc[0], acc[1], acc[2], acc[3]);
    if (!q6) s = _mm_sub_ps(s, _mm_hadd_ps(_mm_hadd_ps(accm[0], accm[1]), _mm_hadd_ps(accm[2], accm[3])));
    float out[4];
    _mm_storeu_ps(out, s);
    for (int t = 0; t < T; t++) y[t * ldy] = out[t];
}

#define KU_FN(name, q6)                                                                             \
    static void name(float *y, size_t ldy, const uint8_t *u, size_t ub, int nr, const xq8 *x, int T, \
                     int64_t cols)                                                                  \
    {                                                                                               \
        for (int r = 0; r < nr; r++, u += ub, y++) switch (T) {                                    \
            case 1: ku_tile(y, ldy, u, x, 1, cols, q6); break;                                      \
            case 2: ku_tile(y, ldy, u, x, 2, cols, q6); break;                                      \
            case 3: ku_tile(y, ldy, u, x, 3, cols, q6); break;                                      \
            default: ku_tile(y, ldy, u, x, 4, cols, q6); break;                                     \
            }                                                                                       \
    }
KU_FN(ku_tile_q45k, 0)
KU_FN(ku_tile_q6k, 1)
#undef KU_FN
#define KU(f) f
#undef LOAD256
#endif /* QUANT_AVX512 */
#ifdef KU
static void ku_q4_k(const uint8_t *b, uint8_t *u, int64_t nb) { ku_q45k(b, u, nb, 0); }
static void ku_q5_k(const uint8_t *b, uint8_t *u, int64_t nb) { ku_q45k(b, u, nb, 1); }
#endif

/* The tiles by T (a constant in each instance). */
#define TILE_FN(name, CALL)                                                                         \
    static void name(float *y, size_t ldy, const uint8_t *const w[4], int nr, const xq8 *x, int T, \
                     int64_t cols, size_t ahead)                                                    \
    {                                                                                               \
        switch (T) {                                                                                \
        case 1: CALL(1); return;                                                                    \
        case 2: CALL(2); return;                                                                    \
        case 3: CALL(3); return;                                                                    \
        default: CALL(4); return;                                                                   \
        }                                                                                           \
    }
#define CALL_Q4K(T) q45k_tile(y, ldy, w, nr, x, T, cols, ahead, 0)
#define CALL_Q5K(T) q45k_tile(y, ldy, w, nr, x, T, cols, ahead, 1)
#define CALL_Q6K(T) q6k_tile(y, ldy, w, nr, x, T, cols, ahead)
TILE_FN(tile_q4_k, CALL_Q4K)
TILE_FN(tile_q5_k, CALL_Q5K)
TILE_FN(tile_q6_k, CALL_Q6K)
#undef TILE_FN

/* ---- f32, f16, bf16 rows, and fast dequantisation --------------------------------------------- */

static float dot1_f16(const uint8_t *b, const void *xv, int64_t n)
{
    const float *x = xv;
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

static float dot1_bf16(const uint8_t *b, const void *xv, int64_t n)
{
    const float *x = xv;
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

static float dot1_f32(const uint8_t *b, const void *xv, int64_t n)
{
    const float *w = (const float *)b, *x = xv;
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

/* Q8_0 block: f16 d, i8 q[32]; y = d * q. */
static void row_q8_0(const uint8_t *b, float *y, int64_t n)
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
static void row_q4(const uint8_t *b, float *y, int64_t n, int has_min)
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
static void row_q4_0(const uint8_t *b, float *y, int64_t n) { row_q4(b, y, n, 0); }
static void row_q4_1(const uint8_t *b, float *y, int64_t n) { row_q4(b, y, n, 1); }

/* IQ4_NL: y = d * kvalues[q] */
static void row_iq4_nl(const uint8_t *b, float *y, int64_t n)
{
    const __m128i tab = _mm_loadu_si128((const __m128i *)IQ4NL_VALUES), m4 = _mm_set1_epi8(0x0F);
    for (int64_t i = 0; i < n; i += 32, b += 18, y += 32) {
        const __m256 d = _mm256_set1_ps(f16_scalar(b));
        const __m128i v = _mm_loadu_si128((const __m128i *)(b + 2));
        const __m128i lo = _mm_shuffle_epi8(tab, _mm_and_si128(v, m4));
        const __m128i hi = _mm_shuffle_epi8(tab, _mm_and_si128(_mm_srli_epi16(v, 4), m4));
        const __m128i parts[4] = { lo, _mm_srli_si128(lo, 8), hi, _mm_srli_si128(hi, 8) };
        for (int k = 0; k < 4; k++)
            _mm256_storeu_ps(y + 8 * k, _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(parts[k]))));
    }
}

/* Q5_0: y = d * (q - 16), Q5_1: y = d * q + m; q's fifth bit j in the u32 qh (as ggml) */
static void row_q5(const uint8_t *b, float *y, int64_t n, int has_min)
{
    const int bytes = has_min ? 24 : 22;
    const __m128i mask = _mm_set1_epi8(0x0F);
    const __m256i bit = _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128);
    for (int64_t i = 0; i < n; i += 32, b += bytes, y += 32) {
        const float d = f16_scalar(b);
        const __m256 vd = _mm256_set1_ps(d), m = _mm256_set1_ps(has_min ? f16_scalar(b + 2) : -16 * d);
        const uint32_t qh = load_u32(b + 2 + 2 * has_min);
        const __m128i q = _mm_loadu_si128((const __m128i *)(b + bytes - 16));
        const __m128i lo = _mm_and_si128(q, mask), hi = _mm_and_si128(_mm_srli_epi16(q, 4), mask);
        const __m128i parts[4] = { lo, _mm_srli_si128(lo, 8), hi, _mm_srli_si128(hi, 8) };
        for (int k = 0; k < 4; k++) {
            const __m256i h = _mm256_and_si256(_mm256_set1_epi32((int)(qh >> 8 * k)), bit);
            const __m256i v = _mm256_add_epi32(_mm256_cvtepu8_epi32(parts[k]),
                                               _mm256_and_si256(_mm256_cmpeq_epi32(h, bit), _mm256_set1_epi32(16)));
            _mm256_storeu_ps(y + 8 * k, _mm256_fmadd_ps(vd, _mm256_cvtepi32_ps(v), m));
        }
    }
}
static void row_q5_0(const uint8_t *b, float *y, int64_t n) { row_q5(b, y, n, 0); }
static void row_q5_1(const uint8_t *b, float *y, int64_t n) { row_q5(b, y, n, 1); }

/* Q4_K / Q5_K: y = (d sc) q - (dmin m) per sub-block of 32, in the formats' order of operations */
static void row_q45k(const uint8_t *b, float *y, int64_t n, int q5)
{
    const size_t bb = q5 ? 176 : 144;
    const __m128i mask = _mm_set1_epi8(0x0F);
    for (int64_t i = 0; i < n; i += 256, b += bb) {
        const float d = f16_scalar(b), dmin = f16_scalar(b + 2);
        uint64_t sc, mn;
        k_scales(b + 4, &sc, &mn);
        const uint8_t *qs = b + (q5 ? 48 : 16);
        for (int s = 0; s < 8; s++, y += 32) {
            const __m256 vd = _mm256_set1_ps(d * (float)(sc >> 8 * s & 0xff));
            const __m256 vm = _mm256_set1_ps(dmin * (float)(mn >> 8 * s & 0xff));
            for (int h = 0; h < 2; h++) {
                __m128i v = _mm_loadu_si128((const __m128i *)(qs + 32 * (s / 2) + 16 * h));
                v = _mm_and_si128(s % 2 ? _mm_srli_epi16(v, 4) : v, mask);
                if (q5) {
                    const __m128i hb = _mm_loadu_si128((const __m128i *)(b + 16 + 16 * h));
                    const __m128i bs = _mm_set1_epi8((char)(1 << s));
                    v = _mm_add_epi8(v, _mm_and_si128(_mm_cmpeq_epi8(_mm_and_si128(hb, bs), bs), _mm_set1_epi8(16)));
                }
                const __m256 lo = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(v));
                const __m256 hi = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(v, 8)));
                _mm256_storeu_ps(y + 16 * h, _mm256_sub_ps(_mm256_mul_ps(vd, lo), vm));
                _mm256_storeu_ps(y + 16 * h + 8, _mm256_sub_ps(_mm256_mul_ps(vd, hi), vm));
            }
        }
    }
}
static void row_q4_k(const uint8_t *b, float *y, int64_t n) { row_q45k(b, y, n, 0); }
static void row_q5_k(const uint8_t *b, float *y, int64_t n) { row_q45k(b, y, n, 1); }

/* Q6_K: y = (d sc) (q - 32) per sub-block of 16 */
static void row_q6_k(const uint8_t *b, float *y, int64_t n)
{
    const __m128i m4 = _mm_set1_epi8(0x0F), m3 = _mm_set1_epi8(3), c32 = _mm_set1_epi8(32);
    for (int64_t i = 0; i < n; i += 256, b += 210) {
        const float d = f16_scalar(b + 208);
        for (int v0 = 0; v0 < 256; v0 += 16, y += 16) {
            const int h = v0 / 128, r = v0 % 128;
            __m128i lo = _mm_loadu_si128((const __m128i *)(b + 64 * h + r % 64));
            lo = _mm_and_si128(r >= 64 ? _mm_srli_epi16(lo, 4) : lo, m4);
            const __m128i hb = _mm_loadu_si128((const __m128i *)(b + 128 + 32 * h + r % 32));
            const __m128i hi = _mm_and_si128(_mm_srl_epi16(hb, _mm_cvtsi32_si128(2 * (r / 32))), m3);
            const __m128i q = _mm_sub_epi8(_mm_or_si128(lo, _mm_slli_epi16(hi, 4)), c32);
            const __m256 vd = _mm256_set1_ps(d * (float)(int8_t)b[192 + v0 / 16]);
            _mm256_storeu_ps(y, _mm256_mul_ps(vd, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q))));
            _mm256_storeu_ps(y + 8, _mm256_mul_ps(vd, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(q, 8)))));
        }
    }
}

static void row_f16(const uint8_t *b, float *y, int64_t n)
{
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(b + 2 * i))));
    for (; i < n; i++) y[i] = f16_scalar(b + 2 * i);
}

static void row_bf16(const uint8_t *b, float *y, int64_t n)
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
#define K(f) f
#else
#define K(f) NULL
#endif /* OPS_AVX2 */
#ifndef KU   /* no unpacked prefill: no AVX2 */
#define KU(f) NULL
#define KU_BLOCK 0
#endif

/* ---- the table -------------------------------------------------------------------------------- */

static const quant_kernels KERNELS[GGUF_TYPE_COUNT] = {
    [GGUF_TYPE_F32] = { "F32", 1, 4, QUANT_XF_F32, NULL, K(dot1_f32), NULL, NULL, NULL },
    [GGUF_TYPE_F16] = { "F16", 1, 2, QUANT_XF_F32, NULL, K(dot1_f16), NULL, K(row_f16), NULL },
    [GGUF_TYPE_BF16] = { "BF16", 1, 2, QUANT_XF_F32, NULL, K(dot1_bf16), NULL, K(row_bf16), NULL },
    [GGUF_TYPE_Q4_0] = { "Q4_0", 32, 18, QUANT_XF_Q16, K(dot4_q4_0), K(dot1_q4_0), NULL, K(row_q4_0), dot_ref_q4_0 },
    [GGUF_TYPE_Q4_1] = { "Q4_1", 32, 20, QUANT_XF_Q16, K(dot4_q4_1), K(dot1_q4_1), NULL, K(row_q4_1), dot_ref_q4_1 },
    [GGUF_TYPE_Q5_0] = { "Q5_0", 32, 22, QUANT_XF_Q16, K(dot4_q5_0), K(dot1_q5_0), NULL, K(row_q5_0), dot_ref_q5_0 },
    [GGUF_TYPE_Q5_1] = { "Q5_1", 32, 24, QUANT_XF_Q16, K(dot4_q5_1), K(dot1_q5_1), NULL, K(row_q5_1), dot_ref_q5_1 },
    [GGUF_TYPE_Q8_0] = { "Q8_0", 32, 34, QUANT_XF_Q16, K(dot4_q8_0), K(dot1_q8_0), NULL, K(row_q8_0), dot_ref_q8_0 },
    [GGUF_TYPE_IQ4_NL] = { "IQ4_NL", 32, 18, QUANT_XF_Q16, K(dot4_iq4_nl), K(dot1_iq4_nl), NULL, K(row_iq4_nl),
                           dot_ref_iq4_nl },
    [GGUF_TYPE_Q4_K] = { "Q4_K", 256, 144, QUANT_XF_Q8K, NULL, NULL, K(tile_q4_k), K(row_q4_k), dot_ref_q4_k,
                         KU(ku_q4_k), KU(ku_tile_q45k) },
    [GGUF_TYPE_Q5_K] = { "Q5_K", 256, 176, QUANT_XF_Q8K, NULL, NULL, K(tile_q5_k), K(row_q5_k), dot_ref_q5_k,
                         KU(ku_q5_k), KU(ku_tile_q45k) },
    [GGUF_TYPE_Q6_K] = { "Q6_K", 256, 210, QUANT_XF_Q8K, NULL, NULL, K(tile_q6_k), K(row_q6_k), dot_ref_q6_k,
                         KU(ku_q6_k), KU(ku_tile_q6k) },
    /* dequantised by the formats, f32 kernels */
    [GGUF_TYPE_Q2_K] = { "Q2_K", 256, 84, QUANT_XF_F32, NULL, NULL, NULL, NULL, NULL },
    [GGUF_TYPE_Q3_K] = { "Q3_K", 256, 110, QUANT_XF_F32, NULL, NULL, NULL, NULL, NULL },
    [GGUF_TYPE_IQ4_XS] = { "IQ4_XS", 256, 136, QUANT_XF_F32, NULL, NULL, NULL, NULL, NULL },
};
#undef K
#undef KU

const quant_kernels *quant_kernels_of(uint32_t type)
{
    return type < GGUF_TYPE_COUNT && KERNELS[type].name ? &KERNELS[type] : NULL;
}

static size_t row_bytes(const weight *w)
{
    const quant_kernels *k = quant_kernels_of(w->type);
    return k ? (size_t)(w->cols / k->block) * k->bytes : gguf_row_bytes(w->type, w->cols);
}

size_t weight_bytes(const weight *w)
{
    return row_bytes(w) * (size_t)w->rows;
}

void weight_row_ref(const weight *w, int64_t r, float *out)
{
    gguf_dequant(w->type, (const uint8_t *)w->data + row_bytes(w) * (size_t)r, out, w->cols);
}

void weight_row(const weight *w, int64_t r, float *out)
{
    const quant_kernels *k = quant_kernels_of(w->type);
    if (k && k->row) k->row((const uint8_t *)w->data + row_bytes(w) * (size_t)r, out, w->cols);
    else if (w->type == GGUF_TYPE_F32)
        memcpy(out, (const float *)w->data + (size_t)r * w->cols, sizeof(float) * w->cols);
    else weight_row_ref(w, r, out);
}

/* ---- matrix products ------------------------------------------------------------------------
 *
 * Decode (n == 1) streams the weights once and is bound by memory bandwidth: each row is read a
 * block at a time, unpacked in registers and multiplied into x with no row buffer, four rows at
 * a time so that x's block is loaded once for the four.
 *
 * Prefill (n > 1) is bound by arithmetic. K types: over token tiles whose int8 x fits in L2,
 * four rows at a time are unpacked once per token tile into the vectors the decode tiles build,
 * and read 4 tokens at a time (ku_tile: the decode tile's arithmetic, bit for bit). Other types: four
 * weight rows are dequantised to f32 (in L1) and multiplied against three tokens at a time with
 * the twelve partial sums in ymm registers (tile_4xT); tokens go in tiles whose x rows fit in
 * L2, so each weight row is dequantised once per tile rather than once per token.
 *
 * Threads are matmul.c's: each takes parts of the rows, of equal cost, in turn. */

/* Bytes of x rows a prefill token tile may hold (L2 is 1 MB per core here; 64 tokens of 1536
 * columns in f32, 393 KB, measured faster as one tile than as three). */
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

/* The K-type tiles prefetch along each of their four rows (the rows are read side by side):
 * one tile ahead (4 row lengths) when that is at most MV_AHEAD_TILE bytes, else MV_AHEAD_ROW
 * bytes. A stream over the four rows as one run starved rows 1-3 of long rows: bench_ops
 * --types, best of 7, 1536x8960 (the feed-forward down matrix) went from 27-42 to 41-47 GB/s
 * (Q4_K) and 31-35 to 39-44 (Q6_K) at 1536 bytes (640: 33-35, 1024: 36-42, 2560: 31-44); the
 * 8960x1536 shape stayed at 42-52 GB/s; the 1.5B model decoded 1.02x llama.cpp at depth 0. */
#ifndef MV_AHEAD_ROW
#define MV_AHEAD_ROW 1536
#endif
#ifndef MV_AHEAD_TILE
#define MV_AHEAD_TILE 8192
#endif

/* Prefill tokens per K-type unpacked tile call (1 to QUANT_TILE_T). */
#ifndef MM_TILE_T
#define MM_TILE_T QUANT_TILE_T
#endif

#ifdef OPS_AVX2
static const xq16 *need_x16(quant_x *q)
{
    if (!q->have16) {
        quant_xq16(&q->x16, q->x, q->cols, q->buf, 0);
        q->have16 = 1;
    }
    return &q->x16;
}

static const xq8 *need_x8(quant_x *q)
{
    if (!q->have8) {
        quant_xq8(&q->x8, q->x, q->cols, 1, q->buf + ALIGN64((size_t)q->cols * 2 + q->cols / 32 * 8), 0);
        q->have8 = 1;
    }
    return &q->x8;
}

/* Rows [r0, r1) of y = W x for one token. */
static void matvec_rows(float *y, const weight *w, const quant_kernels *k, int64_t r0, int64_t r1, quant_x *q)
{
    const int64_t cols = w->cols;
    const size_t rb = row_bytes(w);
    const uint8_t *b = (const uint8_t *)w->data + rb * (size_t)r0;
    int64_t r = r0;
    if (k->tile) {
        const xq8 *x = need_x8(q);
        const size_t ahead = 4 * rb <= MV_AHEAD_TILE ? 4 * rb : MV_AHEAD_ROW;
        for (; r < r1; r += 4, b += 4 * rb) {
            const int nr = r1 - r < 4 ? (int)(r1 - r) : 4;
            const uint8_t *ws[4] = { b, b + rb * (nr > 1), b + rb * (nr > 2 ? 2 : 0), b + rb * (nr > 3 ? 3 : 0) };
            k->tile(y + r, 1, ws, nr, x, 1, cols, ahead);
        }
        return;
    }
    const void *x = k->xf == QUANT_XF_Q16 ? (const void *)need_x16(q) : (const void *)q->x;
    if (k->dot4)
        for (; r + 4 <= r1; r += 4, b += 4 * rb) {
            prefetch_bytes(b + MV_AHEAD, 4 * rb);
            k->dot4(y + r, b, rb, x, cols);
        }
    for (; r < r1; r++, b += rb) y[r] = k->dot1(b, x, cols);
}

/* Rows [r0, r1) of y = x W^T for n > 1 tokens, K types: int8 x per token tile. */
static void matmul_tiles_q8k(float *y, const weight *w, const quant_kernels *k, int64_t r0, int64_t r1,
                             const quant_x *q)
{
    const int64_t cols = w->cols, rows = w->rows;
    const int n = q->n;
    const size_t rb = row_bytes(w);
    int tile = (int)(MM_TILE_BYTES / cols);
    if (tile < 1) tile = 1;
    if (tile > n) tile = n;
    for (int t0 = 0; t0 < n; t0 += tile) {
        const int len = n - t0 < tile ? n - t0 : tile;
        xq8 x;
        if (q->all) x = quant_xq8_at(q->all, t0);
        else quant_xq8(&x, q->x + (size_t)t0 * cols, cols, len, q->buf, 0);
        /* four rows unpacked after x, then each group of QUANT_TILE_T tokens over them */
        uint8_t *u = q->buf + ALIGN64(quant_xq8_bytes(cols, tile));
        const size_t ub = (size_t)(cols / 256) * KU_BLOCK;
        const int tt = MM_TILE_T;
        for (int64_t r = r0; r < r1; r += 4) {
            const int nr = r1 - r < 4 ? (int)(r1 - r) : 4;
            const uint8_t *b = (const uint8_t *)w->data + rb * (size_t)r;
            for (int i = 0; i < nr; i++) k->unpack(b + rb * i, u + ub * i, cols / 256);
            for (int t = 0; t < len; t += tt) {
                const int T = len - t < tt ? len - t : tt;
                const xq8 xt = quant_xq8_at(&x, t);
                k->utile(y + (size_t)(t0 + t) * rows + r, (size_t)rows, u, ub, nr, &xt, T, cols);
            }
        }
    }
}

/* Rows [r0, r1) of y = x W^T for n > 1 tokens: f32 tiles over 4 rows dequantised at buf. */
static void matmul_tiles_f32(float *y, const weight *w, int64_t r0, int64_t r1, const quant_x *q)
{
    const int64_t cols = w->cols, rows = w->rows, ld = (cols + 7) & ~(int64_t)7;
    const int n = q->n;
    const size_t ldx = (size_t)cols;
    const float *x = q->x;
    float *buf = (float *)q->buf;
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

size_t quant_scratch_bytes(int64_t cols, int n)
{
    if (n == 1) return ALIGN64((size_t)cols * 2 + cols / 32 * 8) + quant_xq8_bytes(cols, 1) + 64;
    const size_t f32 = MM_ROWS * (size_t)((cols + 7) & ~(int64_t)7) * sizeof(float);
    int tile = (int)(MM_TILE_BYTES / cols);
    if (tile < 1) tile = 1;
    if (tile > n) tile = n;
    const size_t q8 = cols % 256 ? 0 : ALIGN64(quant_xq8_bytes(cols, tile)) + 4 * (size_t)(cols / 256) * KU_BLOCK;
    return (f32 > q8 ? f32 : q8) + 64;
}

void quant_prepare(quant_x *q, const float *x, int64_t cols, int n, void *scratch)
{
    *q = (quant_x){ .x = x, .cols = cols, .n = n };
    q->buf = (uint8_t *)(((uintptr_t)scratch + 63) & ~(uintptr_t)63);
}

/* ops_exact: every product in f32 over dequantised rows (no rounding of x) */
static int exact;

int quant_wants_xq8(const weight *w, int n)
{
#ifdef OPS_AVX2
    const quant_kernels *k = quant_kernels_of(w->type);
    return n > 1 && k && k->utile && !__atomic_load_n(&exact, __ATOMIC_RELAXED);
#else
    return 0;
#endif
}

void ops_exact(int on)
{
    __atomic_store_n(&exact, on != 0, __ATOMIC_RELAXED);
}

void quant_rows(float *y, const weight *w, int64_t r0, int64_t r1, quant_x *q)
{
#ifdef OPS_AVX2
    if (__atomic_load_n(&exact, __ATOMIC_RELAXED)) {
        if (q->n > 1) matmul_tiles_f32(y, w, r0, r1, q);
        else matmul_rows_plain(y, w, q->x, 1, r0, r1, ops_dot, weight_row);
        return;
    }
    const quant_kernels *k = quant_kernels_of(w->type);
    if (k && q->n == 1 && (k->dot1 || k->tile) && w->cols % k->block == 0) {
        matvec_rows(y, w, k, r0, r1, q);
        return;
    }
    if (k && q->n > 1 && k->utile) {
        matmul_tiles_q8k(y, w, k, r0, r1, q);
        return;
    }
    if (q->n > 1) {
        matmul_tiles_f32(y, w, r0, r1, q);
        return;
    }
    matmul_rows_plain(y, w, q->x, q->n, r0, r1, ops_dot, weight_row);
#else
    matmul_rows_plain(y, w, q->x, q->n, r0, r1, ops_dot, weight_row);
#endif
}

void ops_matmul_ref(float *y, const weight *w, const float *x, int n)
{
    matmul_rows_plain(y, w, x, n, 0, w->rows, ops_dot_ref, weight_row_ref);
}

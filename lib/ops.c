#include "ops.h"

#include <math.h>
#include <string.h>

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

/* One weight row is dequantised once into a stack buffer and reused for every input row, so a
 * batch of n tokens reads the weights once (prefill), and a single token streams them (decode). */
static void matmul_rows(float *y, const weight *w, const float *x, int n, int64_t r0, int64_t r1,
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
        for (int i = 0; i < n; i++) y[(size_t)i * w->rows + r] = dot(row, x + (size_t)i * cols, cols);
    }
}

void ops_matmul(float *y, const weight *w, const float *x, int n)
{
    const int64_t rows = w->rows, chunk = 16;
    const int64_t n_chunks = (rows + chunk - 1) / chunk;
#pragma omp parallel for schedule(static) if (rows * w->cols * (int64_t)n > 32768)
    for (int64_t c = 0; c < n_chunks; c++) {
        int64_t r0 = c * chunk, r1 = r0 + chunk < rows ? r0 + chunk : rows;
        matmul_rows(y, w, x, n, r0, r1, ops_dot, weight_row);
    }
}

void ops_matmul_ref(float *y, const weight *w, const float *x, int n)
{
    matmul_rows(y, w, x, n, 0, w->rows, ops_dot_ref, weight_row_ref);
}

void ops_rmsnorm(float *out, const float *x, const float *gamma, int n, float eps)
{
    double ss = 0;
    for (int i = 0; i < n; i++) ss += (double)x[i] * x[i];
    float scale = 1.0f / sqrtf((float)(ss / n) + eps);
    for (int i = 0; i < n; i++) out[i] = x[i] * scale * gamma[i];
}

void ops_softmax(float *x, int n)
{
    float max = x[0];
    for (int i = 1; i < n; i++) if (x[i] > max) max = x[i];
    float sum = 0;
    for (int i = 0; i < n; i++) { x[i] = expf(x[i] - max); sum += x[i]; }
    float inv = 1.0f / sum;
    for (int i = 0; i < n; i++) x[i] *= inv;
}

void ops_swiglu(float *a, const float *b, int n)
{
    for (int i = 0; i < n; i++) a[i] = a[i] / (1.0f + expf(-a[i])) * b[i];
}

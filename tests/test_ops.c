/* Every fast kernel against its scalar twin, and the sampler. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "gguf.h"
#include "ops.h"
#include "sampler.h"

static float frand(uint64_t *s)
{
    return sampler_rand(s) * 2 - 1;
}

Test(ops, dot_and_axpy_match_scalar)
{
    uint64_t r = 1;
    for (int n = 1; n < 300; n += 7) {
        float a[300], b[300], y1[300], y2[300];
        for (int i = 0; i < n; i++) a[i] = frand(&r), b[i] = frand(&r), y1[i] = y2[i] = frand(&r);
        float d = ops_dot(a, b, n), dr = ops_dot_ref(a, b, n);
        cr_expect(fabsf(d - dr) <= 1e-5f * (1 + fabsf(dr)), "n=%d: %g vs %g", n, d, dr);
        ops_axpy(y1, 0.3f, a, n);
        ops_axpy_ref(y2, 0.3f, a, n);
        for (int i = 0; i < n; i++) cr_expect(fabsf(y1[i] - y2[i]) <= 1e-6f, "n=%d i=%d", n, i);
    }
}

static void check_matmul(uint32_t type)
{
    const int rows = 37, cols = 512, n = 5;
    uint64_t r = type + 11;
    float *w = malloc(sizeof(float) * rows * cols), *x = malloc(sizeof(float) * n * cols);
    for (int i = 0; i < rows * cols; i++) w[i] = frand(&r);
    for (int i = 0; i < n * cols; i++) x[i] = frand(&r);
    size_t rb = gguf_row_bytes(type, cols);
    uint8_t *q = malloc(rb * rows);
    for (int i = 0; i < rows; i++) gguf_quantize(type, w + (size_t)i * cols, q + i * rb, cols);
    weight wt = { type, rows, cols, q };
    float y[5 * 37], yr[5 * 37], y1[37];
    ops_matmul(y, &wt, x, n);
    ops_matmul_ref(yr, &wt, x, n);
    for (int i = 0; i < n * rows; i++)
        cr_expect(fabsf(y[i] - yr[i]) <= 1e-4f * (1 + fabsf(yr[i])), "%s [%d]: %g vs %g",
                  gguf_type_name(type), i, y[i], yr[i]);
    /* n = 1 (decode) gives the same rows as the batch */
    ops_matmul(y1, &wt, x + 2 * cols, 1);
    for (int i = 0; i < rows; i++)
        cr_expect(fabsf(y1[i] - y[2 * rows + i]) <= 1e-4f * (1 + fabsf(y1[i])), "%s decode row %d", gguf_type_name(type), i);
    /* and the dequantised weights are near the originals, so the type is really exercised */
    float row[512];
    weight_row(&wt, 3, row);
    double err = 0;
    for (int i = 0; i < cols; i++) err = fmax(err, fabs(row[i] - w[3 * cols + i]));
    cr_expect_lt(err, type == GGUF_TYPE_F32 ? 1e-7 : 0.2, "%s dequant error %g", gguf_type_name(type), err);
    free(w); free(x); free(q);
}

Test(ops, matmul_f32) { check_matmul(GGUF_TYPE_F32); }
Test(ops, matmul_f16) { check_matmul(GGUF_TYPE_F16); }
Test(ops, matmul_bf16) { check_matmul(GGUF_TYPE_BF16); }
Test(ops, matmul_q8_0) { check_matmul(GGUF_TYPE_Q8_0); }
Test(ops, matmul_q4_0) { check_matmul(GGUF_TYPE_Q4_0); }
Test(ops, matmul_q4_1) { check_matmul(GGUF_TYPE_Q4_1); }
Test(ops, matmul_q4_k) { check_matmul(GGUF_TYPE_Q4_K); }
Test(ops, matmul_q6_k) { check_matmul(GGUF_TYPE_Q6_K); }

Test(ops, rmsnorm_softmax_swiglu)
{
    float x[4] = { 1, -2, 3, -4 }, g[4] = { 1, 1, 2, 0.5f }, out[4];
    ops_rmsnorm(out, x, g, 4, 0);
    float rms = sqrtf((1 + 4 + 9 + 16) / 4.0f);
    for (int i = 0; i < 4; i++) cr_expect_float_eq(out[i], x[i] / rms * g[i], 1e-6);
    float s[3] = { 1000, 1001, 999 };   /* large logits must not overflow */
    ops_softmax(s, 3);
    cr_expect_float_eq(s[0] + s[1] + s[2], 1.0f, 1e-6);
    cr_expect_float_eq(s[1], 1 / (1 + expf(-1) + expf(-2)), 1e-6);
    float a[2] = { 0, 2 }, b[2] = { 5, 3 };
    ops_swiglu(a, b, 2);
    cr_expect_float_eq(a[0], 0.0f, 1e-7);
    cr_expect_float_eq(a[1], 2 / (1 + expf(-2)) * 3, 1e-5);
}

Test(sampler, greedy_and_seeded)
{
    char err[512];
    float logits[6] = { 0.1f, 2.0f, -1.0f, 1.9f, 0.0f, 0.5f }, l2[6];
    sampler s;
    cr_assert_eq(sampler_init(&s, 6, 0, 0, 1, 1, err), 0);
    memcpy(l2, logits, sizeof l2);
    cr_expect_eq(sampler_sample(&s, l2), 1);
    sampler_free(&s);
    /* same seed, same sequence; top-k 2 never leaves {1, 3} */
    int seq[2][50];
    for (int rep = 0; rep < 2; rep++) {
        cr_assert_eq(sampler_init(&s, 6, 1.0f, 2, 1, 77, err), 0);
        for (int i = 0; i < 50; i++) {
            memcpy(l2, logits, sizeof l2);
            seq[rep][i] = sampler_sample(&s, l2);
            cr_expect(seq[rep][i] == 1 || seq[rep][i] == 3, "top-k picked %d", seq[rep][i]);
        }
        sampler_free(&s);
    }
    cr_expect_eq(memcmp(seq[0], seq[1], sizeof seq[0]), 0);
    int seen3 = 0;
    for (int i = 0; i < 50; i++) seen3 += seq[0][i] == 3;
    cr_expect(seen3 > 5 && seen3 < 45, "token 3 drawn %d/50 times", seen3);
    /* top-p 0.5 keeps only the top token here (p(1) > 0.5 at temp 0.2) */
    cr_assert_eq(sampler_init(&s, 6, 0.2f, 0, 0.5f, 5, err), 0);
    for (int i = 0; i < 20; i++) {
        memcpy(l2, logits, sizeof l2);
        cr_expect_eq(sampler_sample(&s, l2), 1);
    }
    sampler_free(&s);
    cr_expect_lt(sampler_init(&s, 6, -1, 0, 1, 5, err), 0);
}

/* Every fast kernel against its scalar twin, and the sampler. */
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

/* The integer kernels round x (lib/core/quant.c): the 32-value block types in decode to int16
 * in steps of sx = max |x| / 32767 over each block of 32, the K types (decode and prefill) to
 * int8 in steps of max |x| / 127 over each block of 256. Each value is then at most half a step
 * off, so a row is at most sum_b step_b / 2 sum_{k in b} |w_k| off: that bound for row r and
 * one token x, n the batch (the 32-value types round x only in decode). */
static double x_round_bound(const weight *wt, int64_t r, const float *x, int n)
{
    const quant_kernels *k = quant_kernels_of(wt->type);
    if (!k || k->xf == QUANT_XF_F32 || (k->xf == QUANT_XF_Q16 && n > 1)) return 0;
    const int blk = k->xf == QUANT_XF_Q16 ? 32 : 256;
    const double levels = k->xf == QUANT_XF_Q16 ? 32767 : 127;
    float *row = malloc(sizeof(float) * wt->cols);
    weight_row_ref(wt, r, row);
    double sum = 0;
    for (int64_t i = 0; i < wt->cols; i += blk) {
        double amax = 0, wsum = 0;
        for (int j = 0; j < blk; j++) amax = fmax(amax, fabs(x[i + j])), wsum += fabs(row[i + j]);
        sum += amax / levels / 2 * wsum;
    }
    free(row);
    return sum;
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
        cr_expect(fabsf(y[i] - yr[i]) <=
                      1e-4f * (1 + fabsf(yr[i])) + x_round_bound(&wt, i % rows, x + i / rows * cols, n),
                  "%s [%d]: %g vs %g", gguf_type_name(type), i, y[i], yr[i]);
    /* n = 1 (decode) gives the same rows as the batch, within the rounding of x */
    ops_matmul(y1, &wt, x + 2 * cols, 1);
    for (int i = 0; i < rows; i++)
        cr_expect(fabsf(y1[i] - y[2 * rows + i]) <= 1e-4f * (1 + fabsf(y1[i])) + x_round_bound(&wt, i, x + 2 * cols, 1),
                  "%s decode row %d: %.9g vs %.9g", gguf_type_name(type), i, y1[i], y[2 * rows + i]);
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

/* Quantised copy of random weights of the given shape (freed by the caller). */
static uint8_t *random_weight(weight *wt, uint32_t type, int rows, int cols, uint64_t seed)
{
    uint64_t r = seed;
    float *w = malloc(sizeof(float) * rows * cols);
    for (int i = 0; i < rows * cols; i++) w[i] = frand(&r);
    size_t rb = gguf_row_bytes(type, cols);
    uint8_t *q = malloc(rb * rows);
    for (int i = 0; i < rows; i++) gguf_quantize(type, w + (size_t)i * cols, q + i * rb, cols);
    free(w);
    *wt = (weight){ type, rows, cols, q };
    return q;
}

/* Tolerance of the fast matmul against ops_matmul_ref: 1e-5 of sum_k |w_k x_k| (the size of the
 * rounding errors of any summation order), plus 1e-6 of |m| sum |x| for the Q4 offsets, which the
 * fused decode kernel applies through block sums of x, plus x_round_bound. */
static void expect_matmul_close(const weight *wt, const float *x, int n, const float *y, const float *yr,
                                const char *what)
{
    const int64_t rows = wt->rows, cols = wt->cols;
    float *row = malloc(sizeof(float) * cols);
    int bad = 0;
    for (int64_t r = 0; r < rows; r++) {
        weight_row_ref(wt, r, row);
        for (int i = 0; i < n; i++) {
            double scale = 0, xs = 0;
            for (int64_t k = 0; k < cols; k++) {
                scale += fabs((double)row[k] * x[(size_t)i * cols + k]);
                xs += fabs(x[(size_t)i * cols + k]);
            }
            double tol = 1e-5 * scale + 1e-6 * xs + 1e-30;
            tol += x_round_bound(wt, r, x + (size_t)i * cols, n);
            double got = y[(size_t)i * rows + r], want = yr[(size_t)i * rows + r];
            if (fabs(got - want) > tol && bad++ < 5)
                cr_expect(0, "%s %s %lldx%lld n=%d: y[%d][%lld] = %.9g, ref %.9g (tol %.3g)", what,
                          gguf_type_name(wt->type), (long long)rows, (long long)cols, n, i, (long long)r,
                          got, want, tol);
        }
    }
    cr_expect_eq(bad, 0, "%s: %d values out of tolerance", what, bad);
    free(row);
}

/* The register-blocked prefill kernel (n > 1) and the fused decode kernel (n == 1) against the
 * scalar twin, over shapes that exercise the 4-row and 3-token tails, the token tiles, columns
 * that are not a multiple of 8 (F32/F16/BF16), and 1, 2 and 3 threads. */
static void check_matmul_shapes(uint32_t type)
{
    const int block = (int)gguf_type_block(type);
    const int cols_list[] = { 32, 64, 576, 1536, 45, 8 };
    const int rows_list[] = { 1, 3, 4, 37, 130 };
    const int n_list[] = { 1, 2, 3, 4, 5, 7, 64 };
    const int saved = omp_get_max_threads();
    ops_threads_adaptive(0);   /* the splits must run even on a busy machine */
    for (size_t ci = 0; ci < sizeof cols_list / sizeof *cols_list; ci++) {
        const int cols = cols_list[ci] < block ? block : cols_list[ci];
        if (cols % block) continue;
        for (size_t ri = 0; ri < sizeof rows_list / sizeof *rows_list; ri++) {
            const int rows = rows_list[ri];
            weight wt;
            uint8_t *q = random_weight(&wt, type, rows, cols, 1000 * ci + ri + type);
            for (size_t ni = 0; ni < sizeof n_list / sizeof *n_list; ni++) {
                const int n = n_list[ni];
                if (cols >= 1536 && n > 7 && rows > 37) continue;   /* keep the suite quick */
                uint64_t r = 77 + n;
                float *x = malloc(sizeof(float) * n * cols);
                float *y = malloc(sizeof(float) * n * rows), *yr = malloc(sizeof(float) * n * rows);
                for (int i = 0; i < n * cols; i++) x[i] = frand(&r);
                ops_matmul_ref(yr, &wt, x, n);
                float *y1 = malloc(sizeof(float) * n * rows);
                for (int threads = 1; threads <= 3; threads++) {
                    omp_set_num_threads(threads);
                    for (int i = 0; i < n * rows; i++) y[i] = NAN;
                    ops_matmul(y, &wt, x, n);
                    char what[32];
                    snprintf(what, sizeof what, "%d threads", threads);
                    expect_matmul_close(&wt, x, n, y, yr, what);
                    /* and bit for bit the same whatever the thread count */
                    if (threads == 1) memcpy(y1, y, sizeof(float) * n * rows);
                    else
                        cr_expect_eq(memcmp(y, y1, sizeof(float) * n * rows), 0,
                                     "%s %dx%d n=%d: %d threads differ from 1", gguf_type_name(type), rows, cols, n,
                                     threads);
                }
                free(x); free(y); free(yr); free(y1);
            }
            free(q);
        }
    }
    omp_set_num_threads(saved);
    ops_threads_adaptive(1);
}

/* Decode with x of a wide range within each block (one value 1e4 times the others, which x16
 * then rounds coarsely) stays within x_round_bound; a NaN or an infinity in x gives a row that
 * is not finite, as the reference does. */
Test(ops, matmul_decode_x_range)
{
    const uint32_t types[] = { GGUF_TYPE_Q4_0, GGUF_TYPE_Q4_1, GGUF_TYPE_Q8_0, GGUF_TYPE_Q4_K, GGUF_TYPE_Q6_K };
    const int rows = 37, cols = 768;
    for (size_t ti = 0; ti < sizeof types / sizeof *types; ti++) {
        weight wt;
        uint8_t *q = random_weight(&wt, types[ti], rows, cols, 4242 + ti);
        float x[768], y[37], yr[37];
        uint64_t r = 5;
        for (int i = 0; i < cols; i++) x[i] = frand(&r) * (i % 32 == 7 ? 1e4f : 1);
        ops_matmul(y, &wt, x, 1);
        ops_matmul_ref(yr, &wt, x, 1);
        expect_matmul_close(&wt, x, 1, y, yr, "wide x");
        x[100] = INFINITY;
        ops_matmul(y, &wt, x, 1);
        for (int i = 0; i < rows; i++)
            cr_expect(!isfinite(y[i]), "%s: inf in x, row %d = %g", gguf_type_name(wt.type), i, y[i]);
        x[100] = NAN;
        ops_matmul(y, &wt, x, 1);
        for (int i = 0; i < rows; i++)
            cr_expect(isnan(y[i]), "%s: NaN in x, row %d = %g", gguf_type_name(wt.type), i, y[i]);
        free(q);
    }
}

Test(ops, matmul_shapes_f32) { check_matmul_shapes(GGUF_TYPE_F32); }
Test(ops, matmul_shapes_f16) { check_matmul_shapes(GGUF_TYPE_F16); }
Test(ops, matmul_shapes_bf16) { check_matmul_shapes(GGUF_TYPE_BF16); }
Test(ops, matmul_shapes_q8_0) { check_matmul_shapes(GGUF_TYPE_Q8_0); }
Test(ops, matmul_shapes_q4_0) { check_matmul_shapes(GGUF_TYPE_Q4_0); }
Test(ops, matmul_shapes_q4_1) { check_matmul_shapes(GGUF_TYPE_Q4_1); }
Test(ops, matmul_shapes_q4_k) { check_matmul_shapes(GGUF_TYPE_Q4_K); }
Test(ops, matmul_shapes_q6_k) { check_matmul_shapes(GGUF_TYPE_Q6_K); }

/* Several products in one region give what separate calls give (bit for bit) and are close to
 * the exact products, for every split of the rows; the K types among them read x rounded once
 * for all threads (matmul.c), beside types that read it as it is. */
static void check_multi(const uint32_t types[3], int cols, int seed)
{
    const int rows[3] = { cols, 192, 37 };
    weight wt[3];
    uint8_t *q[3];
    for (int i = 0; i < 3; i++) q[i] = random_weight(&wt[i], types[i], rows[i], cols, seed + i);
    const int saved = omp_get_max_threads();
    ops_threads_adaptive(0);
    const int ns[] = { 1, 5, 64 };
    for (int ni = 0; ni < 3; ni++) {
        const int n = ns[ni];
        uint64_t r = 9;
        float *x = malloc(sizeof(float) * n * cols), *y[3], *yr[3], *ys[3];
        for (int i = 0; i < n * cols; i++) x[i] = frand(&r);
        for (int i = 0; i < 3; i++) {
            y[i] = malloc(sizeof(float) * n * rows[i]);
            yr[i] = malloc(sizeof(float) * n * rows[i]);
            ys[i] = malloc(sizeof(float) * n * rows[i]);
            ops_matmul_ref(yr[i], &wt[i], x, n);
            ops_matmul(ys[i], &wt[i], x, n);
        }
        const weight *ws[3] = { &wt[0], &wt[1], &wt[2] };
        for (int threads = 1; threads <= 4; threads++) {
            omp_set_num_threads(threads);
            for (int i = 0; i < 3; i++)
                for (int j = 0; j < n * rows[i]; j++) y[i][j] = NAN;
            ops_matmul_multi(y, ws, 3, x, n);
            for (int i = 0; i < 3; i++) {
                expect_matmul_close(&wt[i], x, n, y[i], yr[i], "multi");
                cr_expect_eq(memcmp(y[i], ys[i], sizeof(float) * n * rows[i]), 0,
                             "multi, type %u, n=%d, %d threads: differs from its own call", types[i], n, threads);
            }
        }
        for (int i = 0; i < 3; i++) { free(y[i]); free(yr[i]); free(ys[i]); }
        free(x);
    }
    omp_set_num_threads(saved);
    ops_threads_adaptive(1);
    for (int i = 0; i < 3; i++) free(q[i]);
}

Test(ops, matmul_multi)
{
    check_multi((const uint32_t[3]){ GGUF_TYPE_Q4_1, GGUF_TYPE_Q8_0, GGUF_TYPE_F16 }, 576, 500);
}

Test(ops, matmul_multi_k_types)
{
    check_multi((const uint32_t[3]){ GGUF_TYPE_Q4_K, GGUF_TYPE_Q8_0, GGUF_TYPE_Q6_K }, 768, 600);
}

/* Attention scores and accumulation, contiguous and gathered, against their twins: 1e-6 of
 * sum |q_j k_j| (resp. sum |p_i v_i|), for head dims that are and are not multiples of 8 and key
 * counts around 8. */
Test(ops, attn_scores_accum)
{
    const int d_list[] = { 8, 16, 64, 72, 128, 5, 13 };
    const int t_list[] = { 0, 1, 7, 8, 9, 17, 100, 1000 };
    for (size_t di = 0; di < sizeof d_list / sizeof *d_list; di++) {
        const int d = d_list[di];
        for (size_t ti = 0; ti < sizeof t_list / sizeof *t_list; ti++) {
            const int t = t_list[ti];
            uint64_t r = 31 * d + t;
            float *K = malloc(sizeof(float) * (t * d + 1)), *V = malloc(sizeof(float) * (t * d + 1));
            float *s = malloc(sizeof(float) * (t + 1)), *sr = malloc(sizeof(float) * (t + 1));
            float q[128], out[128], outr[128];
            for (int i = 0; i < t * d; i++) K[i] = frand(&r) * 3, V[i] = frand(&r);
            for (int i = 0; i < d; i++) q[i] = frand(&r) * 2;
            const float scale = 1 / sqrtf((float)d);
            ops_attn_scores(s, q, K, t, d, scale);
            ops_attn_scores_ref(sr, q, K, t, d, scale);
            for (int i = 0; i < t; i++) {
                double mag = 0;
                for (int j = 0; j < d; j++) mag += fabs(q[j] * K[(size_t)i * d + j]);
                cr_expect(fabs(s[i] - sr[i]) <= 1e-6 * scale * mag + 1e-30, "scores d=%d t=%d [%d]: %.9g vs %.9g",
                          d, t, i, s[i], sr[i]);
            }
            for (int i = 0; i < t; i++) s[i] = fabsf(frand(&r));   /* weights in [0, 1] */
            for (int j = 0; j < d; j++) out[j] = NAN;
            ops_attn_accum(out, s, V, t, d);
            ops_attn_accum_ref(outr, s, V, t, d);
            for (int j = 0; j < d; j++) {
                double mag = 0;
                for (int i = 0; i < t; i++) mag += fabs(s[i] * V[(size_t)i * d + j]);
                cr_expect(fabs(out[j] - outr[j]) <= 1e-6 * mag + 1e-30, "accum d=%d t=%d [%d]: %.9g vs %.9g",
                          d, t, j, out[j], outr[j]);
            }
            /* gathered rows: a scrambled selection with repeats, n = t */
            int32_t *idx = malloc(sizeof(int32_t) * (t + 1));
            for (int j = 0; j < t; j++) idx[j] = (int32_t)((j * 7 + 3) % t);
            for (int i = 0; i < t; i++) s[i] = NAN;
            ops_attn_scores_idx(s, q, K, idx, t, d, scale);
            ops_attn_scores_idx_ref(sr, q, K, idx, t, d, scale);
            for (int j = 0; j < t; j++) {
                double mag = 0;
                for (int c = 0; c < d; c++) mag += fabs(q[c] * K[(size_t)idx[j] * d + c]);
                cr_expect(fabs(s[j] - sr[j]) <= 1e-6 * scale * mag + 1e-30, "scores_idx d=%d n=%d [%d]: %.9g vs %.9g",
                          d, t, j, s[j], sr[j]);
                cr_expect(fabs(sr[j] - scale * ops_dot_ref(q, K + (size_t)idx[j] * d, d)) <=
                          1e-6 * scale * mag + 1e-30);
            }
            for (int i = 0; i < t; i++) s[i] = fabsf(frand(&r));
            ops_attn_accum_idx(out, s, V, idx, t, d);
            ops_attn_accum_idx_ref(outr, s, V, idx, t, d);
            for (int c = 0; c < d; c++) {
                double mag = 0;
                for (int j = 0; j < t; j++) mag += fabs(s[j] * V[(size_t)idx[j] * d + c]);
                cr_expect(fabs(out[c] - outr[c]) <= 1e-6 * mag + 1e-30, "accum_idx d=%d n=%d [%d]: %.9g vs %.9g",
                          d, t, c, out[c], outr[c]);
            }
            free(idx); free(K); free(V); free(s); free(sr);
        }
    }
}

/* Several queries at once against their twins (1e-6 of the magnitudes, as above), for query
 * counts around the 3-query and 4-query blocks, key counts around 4, head dims 64, 24 and 13, and
 * causal lengths (weights beyond a query's length must not be read: they are NaN here). */
Test(ops, attn_multi)
{
    const int nq_list[] = { 1, 2, 3, 4, 5, 6, 7, 9, 12 };
    const int t_list[] = { 1, 3, 4, 5, 9, 64, 130, 300 };
    const int d_list[] = { 64, 128, 24, 16, 32, 13 };
    for (size_t di = 0; di < sizeof d_list / sizeof *d_list; di++)
        for (size_t qi = 0; qi < sizeof nq_list / sizeof *nq_list; qi++)
            for (size_t ti = 0; ti < sizeof t_list / sizeof *t_list; ti++) {
                const int d = d_list[di], nq = nq_list[qi], t = t_list[ti], ldq = d + 3, ldo = d + 5;
                uint64_t r = 1000 * d + 10 * nq + t;
                float *Q = malloc(sizeof(float) * nq * ldq), *K = malloc(sizeof(float) * t * d);
                float *V = malloc(sizeof(float) * t * d), *S = malloc(sizeof(float) * nq * t);
                float *Sr = malloc(sizeof(float) * nq * t), *O = malloc(sizeof(float) * nq * ldo);
                float *Or = malloc(sizeof(float) * nq * ldo);
                int *len = malloc(sizeof(int) * nq);
                for (int i = 0; i < nq * ldq; i++) Q[i] = frand(&r) * 2;
                for (int i = 0; i < t * d; i++) K[i] = frand(&r) * 3, V[i] = frand(&r);
                const float scale = 1 / sqrtf((float)d);
                ops_attn_scores_multi(S, t, Q, nq, ldq, K, t, d, scale);
                ops_attn_scores_multi_ref(Sr, t, Q, nq, ldq, K, t, d, scale);
                for (int i = 0; i < nq; i++)
                    for (int j = 0; j < t; j++) {
                        double mag = 0;
                        for (int c = 0; c < d; c++) mag += fabs(Q[i * ldq + c] * K[j * d + c]);
                        cr_expect(fabs(S[i * t + j] - Sr[i * t + j]) <= 1e-6 * scale * mag + 1e-30,
                                  "scores_multi d=%d nq=%d t=%d [%d][%d]: %.9g vs %.9g", d, nq, t, i, j,
                                  S[i * t + j], Sr[i * t + j]);
                    }
                for (int pass = 0; pass < 2; pass++) {   /* all rows, then causal lengths */
                    for (int i = 0; i < nq; i++) {
                        len[i] = pass ? 1 + (i * 5 + t / 2) % t : t;
                        for (int j = 0; j < t; j++) S[i * t + j] = j < len[i] ? fabsf(frand(&r)) : NAN;
                    }
                    for (int i = 0; i < nq * ldo; i++) O[i] = Or[i] = -7;
                    ops_attn_accum_multi(O, ldo, S, nq, pass ? len : NULL, V, t, d);
                    ops_attn_accum_multi_ref(Or, ldo, S, nq, pass ? len : NULL, V, t, d);
                    for (int i = 0; i < nq; i++)
                        for (int c = 0; c < ldo; c++) {
                            if (c >= d) {   /* the padding of O is left alone */
                                cr_expect_eq(O[i * ldo + c], -7.0f);
                                continue;
                            }
                            double mag = 0;
                            for (int j = 0; j < len[i]; j++) mag += fabs(S[i * t + j] * V[j * d + c]);
                            cr_expect(fabs(O[i * ldo + c] - Or[i * ldo + c]) <= 1e-6 * mag + 1e-30,
                                      "accum_multi d=%d nq=%d t=%d pass %d [%d][%d]: %.9g vs %.9g", d, nq, t, pass,
                                      i, c, O[i * ldo + c], Or[i * ldo + c]);
                        }
                }
                free(Q); free(K); free(V); free(S); free(Sr); free(O); free(Or); free(len);
            }
}

/* f16 rows (the f16 KV cache): every F16C kernel against its scalar twin (1e-6 of the
 * magnitudes: both widen the same halves exactly, only the order of the sums differs), and the
 * scalar twins bit-equal to the f32 kernels' twins on the widened rows. */
static uint16_t *to_f16(const float *x, int n)
{
    uint16_t *h = malloc(sizeof(uint16_t) * (n + 1));
    ops_f32_to_f16_ref(h, x, n);
    return h;
}

static float *widen(const uint16_t *h, int n)
{
    float *x = malloc(sizeof(float) * (n + 1));
    for (int i = 0; i < n; i++) x[i] = gguf_f16_to_f32(h[i]);
    return x;
}

Test(ops, attn_f16_match_scalar)
{
    const int d_list[] = { 64, 24, 128, 8, 16, 32, 13 };
    const int t_list[] = { 0, 1, 4, 7, 9, 100, 1000 };
    const int nq_list[] = { 1, 3, 4, 5, 6 };
    for (size_t di = 0; di < sizeof d_list / sizeof *d_list; di++)
        for (size_t ti = 0; ti < sizeof t_list / sizeof *t_list; ti++) {
            const int d = d_list[di], t = t_list[ti], ldq = d + 3, ldo = d + 5;
            uint64_t r = 77 * d + t;
            float *Kf = malloc(sizeof(float) * (t * d + 1)), *Vf = malloc(sizeof(float) * (t * d + 1));
            for (int i = 0; i < t * d; i++) Kf[i] = frand(&r) * 3, Vf[i] = frand(&r);
            uint16_t *K = to_f16(Kf, t * d), *V = to_f16(Vf, t * d);
            float *Kw = widen(K, t * d), *Vw = widen(V, t * d);
            float *Q = malloc(sizeof(float) * 6 * ldq), *S = malloc(sizeof(float) * (6 * (t + 2) + 1));
            float *Sr = malloc(sizeof(float) * (6 * (t + 2) + 1)), *Sw = malloc(sizeof(float) * (6 * t + 1));
            float *O = malloc(sizeof(float) * 6 * ldo), *Or = malloc(sizeof(float) * 6 * ldo),
                  *Ow = malloc(sizeof(float) * 6 * ldo);
            int32_t *idx = malloc(sizeof(int32_t) * (t + 1));
            int len[6];
            for (int i = 0; i < 6 * ldq; i++) Q[i] = frand(&r) * 2;
            for (int j = 0; j < t; j++) idx[j] = (int32_t)((j * 7 + 3) % t);
            const float scale = 1 / sqrtf((float)d);
            for (int gathered = 0; gathered < 2; gathered++) {
                const int32_t *ix = gathered ? idx : NULL;
                ops_attn_scores_f16(S, Q, K, ix, t, d, scale);
                ops_attn_scores_f16_ref(Sr, Q, K, ix, t, d, scale);
                if (ix) ops_attn_scores_idx_ref(Sw, Q, Kw, ix, t, d, scale);
                else ops_attn_scores_ref(Sw, Q, Kw, t, d, scale);
                for (int j = 0; j < t; j++) {
                    const int row = ix ? ix[j] : j;
                    double mag = 0;
                    for (int c = 0; c < d; c++) mag += fabs(Q[c] * Kw[(size_t)row * d + c]);
                    cr_expect(fabs(S[j] - Sr[j]) <= 1e-6 * scale * mag + 1e-30,
                              "scores_f16 d=%d t=%d idx=%d [%d]: %.9g vs %.9g", d, t, gathered, j, S[j], Sr[j]);
                    cr_expect_eq(Sr[j], Sw[j], "scores_f16_ref d=%d t=%d [%d] is not the f32 twin on widened rows", d,
                                 t, j);
                }
                for (int j = 0; j < t; j++) S[j] = fabsf(frand(&r));
                ops_attn_accum_f16(O, S, V, ix, t, d);
                ops_attn_accum_f16_ref(Or, S, V, ix, t, d);
                if (ix) ops_attn_accum_idx_ref(Ow, S, Vw, ix, t, d);
                else ops_attn_accum_ref(Ow, S, Vw, t, d);
                for (int c = 0; c < d; c++) {
                    double mag = 0;
                    for (int j = 0; j < t; j++) mag += fabs(S[j] * Vw[(size_t)(ix ? ix[j] : j) * d + c]);
                    cr_expect(fabs(O[c] - Or[c]) <= 1e-6 * mag + 1e-30, "accum_f16 d=%d t=%d idx=%d [%d]: %.9g vs %.9g",
                              d, t, gathered, c, O[c], Or[c]);
                    cr_expect_eq(Or[c], Ow[c], "accum_f16_ref d=%d t=%d [%d] is not the f32 twin on widened rows", d, t,
                                 c);
                }
            }
            for (size_t qi = 0; qi < sizeof nq_list / sizeof *nq_list && t > 0; qi++) {
                const int nq = nq_list[qi], lds = t + 2;   /* rows apart by more than t: TIP's layout */
                for (int k = 0; k < nq * lds; k++) S[k] = 12345.0f;
                ops_attn_scores_multi_f16(S, lds, Q, nq, ldq, K, t, d, scale);
                ops_attn_scores_multi_f16_ref(Sr, lds, Q, nq, ldq, K, t, d, scale);
                for (int i = 0; i < nq; i++) {
                    for (int j = 0; j < t; j++) {
                        double mag = 0;
                        for (int c = 0; c < d; c++) mag += fabs(Q[i * ldq + c] * Kw[(size_t)j * d + c]);
                        cr_expect(fabs(S[i * lds + j] - Sr[i * lds + j]) <= 1e-6 * scale * mag + 1e-30,
                                  "scores_multi_f16 d=%d nq=%d t=%d [%d][%d]: %.9g vs %.9g", d, nq, t, i, j,
                                  S[i * lds + j], Sr[i * lds + j]);
                    }
                    cr_expect(S[i * lds + t] == 12345.0f && S[i * lds + t + 1] == 12345.0f,
                              "scores_multi_f16 d=%d nq=%d t=%d wrote between rows %d and %d", d, nq, t, i, i + 1);
                }
                for (int i = 0; i < nq; i++) {
                    len[i] = 1 + (i * 5 + t / 2) % t;
                    for (int j = 0; j < t; j++) S[i * t + j] = j < len[i] ? fabsf(frand(&r)) : NAN;
                }
                for (int i = 0; i < nq * ldo; i++) O[i] = Or[i] = -7;
                ops_attn_accum_multi_f16(O, ldo, S, nq, len, V, t, d);
                ops_attn_accum_multi_f16_ref(Or, ldo, S, nq, len, V, t, d);
                for (int i = 0; i < nq; i++)
                    for (int c = 0; c < ldo; c++) {
                        if (c >= d) { cr_expect_eq(O[i * ldo + c], -7.0f); continue; }
                        double mag = 0;
                        for (int j = 0; j < len[i]; j++) mag += fabs(S[i * t + j] * Vw[(size_t)j * d + c]);
                        cr_expect(fabs(O[i * ldo + c] - Or[i * ldo + c]) <= 1e-6 * mag + 1e-30,
                                  "accum_multi_f16 d=%d nq=%d t=%d [%d][%d]: %.9g vs %.9g", d, nq, t, i, c,
                                  O[i * ldo + c], Or[i * ldo + c]);
                    }
            }
            free(Kf); free(Vf); free(K); free(V); free(Kw); free(Vw); free(Q); free(S); free(Sr); free(Sw);
            free(O); free(Or); free(Ow); free(idx);
        }
}

/* f32 -> f16 -> f32: the vector conversions equal the scalar ones (round to nearest even) for
 * random values across the f16 range, the subnormals, overflow, zeros and infinities, and every
 * one of the 65536 halves widens as gguf_f16_to_f32 does. */
Test(ops, f16_conversions_match_scalar)
{
    enum { N = 4099 };
    float x[N];
    uint16_t h[N], hr[N];
    uint64_t r = 5;
    for (int i = 0; i < N; i++) {
        const float u = frand(&r);
        switch (i % 6) {
        case 0: x[i] = u * 70000; break;          /* beyond 65504: rounds to infinity */
        case 1: x[i] = u * 1e-6f; break;          /* f16 subnormals */
        case 2: x[i] = u * 1e-9f; break;          /* below them: zero */
        default: x[i] = u * 8; break;
        }
    }
    x[0] = 0, x[1] = -0.0f, x[2] = INFINITY, x[3] = -INFINITY, x[4] = 65504, x[5] = 65520;   /* 65520 ties to inf */
    ops_f32_to_f16(h, x, N);
    ops_f32_to_f16_ref(hr, x, N);
    for (int i = 0; i < N; i++) cr_expect_eq(h[i], hr[i], "f32_to_f16(%.9g): %04x vs %04x", x[i], h[i], hr[i]);
    static uint16_t all[65536];
    static float w[65536];
    for (int i = 0; i < 65536; i++) all[i] = (uint16_t)i;
    ops_f16_to_f32(w, all, 65536);
    for (int i = 0; i < 65536; i++) {
        const float want = gguf_f16_to_f32((uint16_t)i);
        if (isnan(want)) cr_expect(isnan(w[i]), "f16_to_f32(%04x) is not NaN", i);
        else cr_expect(memcmp(&w[i], &want, 4) == 0, "f16_to_f32(%04x): %.9g vs %.9g", i, w[i], want);
    }
}

/* The vectorised exp: within 2e-7 relative of exp on [-87.3, 88.3] (measured max about 1.2e-7),
 * 0 below -87.4, finite above (exp(88.376)), in the vector loop and in the scalar tail. */
Test(ops, exp_matches_expf)
{
    enum { N = 200001 };
    float *x = malloc(sizeof(float) * N), *y = malloc(sizeof(float) * N);
    for (int i = 0; i < N; i++) x[i] = -87.3f + (88.3f + 87.3f) * i / (N - 1);
    ops_exp(y, x, N);
    double worst = 0;
    for (int i = 0; i < N; i++) {
        double ref = exp((double)x[i]), rel = fabs(y[i] - ref) / ref;
        if (rel > worst) worst = rel;
    }
    cr_expect_lt(worst, 2e-7, "max relative error of ops_exp %g", worst);
    float lo[8] = { -87.4f, -90, -100, -1000, -INFINITY, -88, -87.5f, -1e30f };
    float hi[8] = { 88.4f, 89, 100, 1000, 1e30f, 88.5f, 95, 200 };
    ops_exp(lo, lo, 8);
    ops_exp(hi, hi, 8);
    for (int i = 0; i < 8; i++) {
        cr_expect_eq(lo[i], 0.0f, "exp of a very negative value: %g", lo[i]);
        cr_expect(isfinite(hi[i]) && hi[i] > 1e38f, "exp of a large value: %g", hi[i]);
    }
    float tail[3] = { -100, 100, 0 };   /* the scalar tail follows the same rule */
    ops_exp(tail, tail, 3);
    cr_expect(tail[0] == 0 && isfinite(tail[1]) && tail[1] > 1e38f && tail[2] == 1, "tail: %g %g %g",
              tail[0], tail[1], tail[2]);
    free(x); free(y);
}

/* exp((x - max) scale) and its sum against the twin, for lengths with and without a scalar tail:
 * the same max exactly, values within 1e-6 relative (1e-35 absolute where the fast exp flushes
 * an underflow to 0), sums within 1e-6 relative; a second vector holding the max, and y = x. */
Test(ops, exp_shifted_matches_scalar)
{
    uint64_t r = 11;
    const int ns[] = { 1, 7, 8, 33, 4099 };
    for (int c = 0; c < 5; c++) {
        const int n = ns[c];
        float *x = malloc(sizeof(float) * n), *a = malloc(sizeof(float) * n), *b = malloc(sizeof(float) * n);
        for (int i = 0; i < n; i++) x[i] = (float)(sampler_rand(&r) * 80 - 40);
        if (n > 9) x[9] = 45;
        double sa, sb;
        const float ma = ops_exp_shifted(a, x, n, 0.125f, &sa), mb = ops_exp_shifted_ref(b, x, n, 0.125f, &sb);
        cr_expect_eq(ma, mb, "n %d: max %g vs %g", n, ma, mb);
        for (int i = 0; i < n; i++)
            cr_expect(fabsf(a[i] - b[i]) <= 1e-6f * fabsf(b[i]) + 1e-35f, "n %d, %d: %g vs %g", n, i, a[i], b[i]);
        cr_expect(fabs(sa - sb) <= 1e-6 * sb, "n %d: sum %g vs %g", n, sa, sb);
        memcpy(a, x, sizeof(float) * n);   /* in place */
        ops_exp_shifted(a, a, n, 0.125f, &sa);
        cr_expect(fabs(sa - sb) <= 1e-6 * sb, "n %d: in place, sum %g vs %g", n, sa, sb);
        free(x); free(a); free(b);
    }
}

/* The estimate's sum against exp in double: 3e-6 relative (the polynomial's bound), over vector
 * bodies and scalar ends, values far below the max (underflow to 0), and -1 once a value is
 * above the max it was given. */
Test(ops, exp_sum_est_within_its_bound)
{
    uint64_t r = 5;
    const int ns[] = { 1, 15, 16, 17, 4099 };
    for (int c = 0; c < 5; c++) {
        const int n = ns[c];
        float *x = malloc(sizeof(float) * n);
        for (int i = 0; i < n; i++) x[i] = (float)(sampler_rand(&r) * 2000 - 1600);
        const float mx = ops_max(x, n);
        double ref = 0;
        for (int i = 0; i < n; i++) ref += exp(((double)x[i] - mx) * 0.125);
        const double s = ops_exp_sum_est(x, n, mx, 0.125f);
        cr_expect(fabs(s - ref) <= 3e-6 * ref, "n %d: %.9g vs %.9g", n, s, ref);
        cr_expect(ops_exp_sum_est(x, n, mx + 1, 0.125f) < ref, "n %d: a larger max, a smaller sum", n);
        x[n - 1] = mx + 0.5f;
        cr_expect_eq(ops_exp_sum_est(x, n, mx, 0.125f), -1, "n %d: a value above the max", n);
        free(x);
    }
}

/* ops_exp_sum_blocks: each block's sum is ops_exp_sum_est over that block's part of [lo, hi), to
 * the bit (the same body), their sum the return; -1 once a value is above the max. */
Test(ops, exp_sum_blocks_as_the_blocks)
{
    uint64_t r = 9;
    enum { n = 1000, B = 64 };
    float x[n];
    for (int i = 0; i < n; i++) x[i] = (float)(sampler_rand(&r) * 200 - 150);
    const int ranges[][2] = { { 0, n }, { 5, 64 }, { 70, 71 }, { 63, 130 }, { 129, 999 } };
    for (int c = 0; c < 5; c++) {
        const int lo = ranges[c][0], hi = ranges[c][1], nz = (hi - 1) / B - lo / B + 1;
        const float mx = ops_max(x + lo, hi - lo);
        double zb[n / B + 2], sum = 0;
        const double s = ops_exp_sum_blocks(zb, x, lo, hi, B, mx, 0.125f);
        for (int k = 0; k < nz; k++) {
            const int b = lo / B + k, a = b * B > lo ? b * B : lo, e = (b + 1) * B < hi ? (b + 1) * B : hi;
            const double want = ops_exp_sum_est(x + a, e - a, mx, 0.125f);
            cr_expect(zb[k] == want, "[%d, %d) block %d: %.9g, not %.9g", lo, hi, b, zb[k], want);
            sum += want;
        }
        cr_expect_float_eq(s, sum, 1e-12 * sum, "[%d, %d): %.12g, not %.12g", lo, hi, s, sum);
        cr_expect_eq(ops_exp_sum_blocks(zb, x, lo, hi, B, mx - 1, 0.125f), -1, "[%d, %d): a value above the max",
                     lo, hi);
    }
}

/* softmax and swiglu against their twins: 1e-6 relative, plus 1e-35 absolute where one of them
 * underflows (softmax: the fast exp flushes results below FLT_MIN to 0; swiglu of a < -88: expf
 * overflows to inf in the twin, giving 0, and the fast one gives a / 2.4e38). */
Test(ops, softmax_swiglu_match_scalar)
{
    uint64_t r = 5;
    for (int n = 1; n < 300; n += 13) {
        for (int spread = 1; spread <= 100; spread *= 10) {
            float a[300], ar[300], b[300];
            for (int i = 0; i < n; i++) a[i] = ar[i] = frand(&r) * spread, b[i] = frand(&r);
            ops_softmax(a, n);
            ops_softmax_ref(ar, n);
            for (int i = 0; i < n; i++)
                cr_expect(fabsf(a[i] - ar[i]) <= 1e-6f * ar[i] + 1e-37f, "softmax n=%d spread=%d [%d]: %.9g vs %.9g",
                          n, spread, i, a[i], ar[i]);
            for (int i = 0; i < n; i++) a[i] = ar[i] = frand(&r) * spread;
            ops_swiglu(a, b, n);
            ops_swiglu_ref(ar, b, n);
            for (int i = 0; i < n; i++)
                cr_expect(fabsf(a[i] - ar[i]) <= 1e-6f * fabsf(ar[i]) + 1e-35f,
                          "swiglu n=%d spread=%d [%d]: %.9g vs %.9g", n, spread, i, a[i], ar[i]);
        }
    }
    /* a masked score (-inf) gets probability 0 */
    float s[9] = { 1, 2, -INFINITY, 3, 0, 0, 0, 0, -INFINITY };
    ops_softmax(s, 9);
    cr_expect_eq(s[2], 0.0f);
    cr_expect_eq(s[8], 0.0f);
    cr_expect(fabsf(s[3] - s[1] * expf(1)) < 1e-6f);
}

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

/* TIP over the 4-bit copy: the fast kernel equals its twin exactly (integer sums), for 1..8
 * queries and widths of 8..136 dims, extreme nibbles and query bytes included, each query and
 * tile with its own offset product (bias); and the twin is the formula of ops.h, checked by hand
 * on one tile. */
Test(ops, tip_q4_matches_scalar)
{
    uint64_t r = 7;
    for (int tw = 8; tw <= 136; tw += 16)
        for (int nq = 1; nq <= 8; nq += 3) {
            const int nt = 3, tile = tw / 8 * 64;
            uint8_t *tiles = malloc((size_t)nt * tile);
            int8_t *qi = malloc((size_t)nq * tw);
            float kf[48], qs[8], bias[8 * 3], a[8 * 48], b[8 * 48];
            uint16_t ks[48];
            int32_t qsum[8];
            for (int i = 0; i < nt * tile; i++) tiles[i] = (uint8_t)(sampler_rand(&r) * 256);
            tiles[0] = 0xFF, tiles[1] = 0x11;
            for (int i = 0; i < 48; i++) kf[i] = frand(&r) + 1.5f;
            ops_f32_to_f16(ks, kf, 48), ops_f16_to_f32(kf, ks, 48);
            for (int h = 0; h < nq; h++) {
                qsum[h] = 0;
                for (int j = 0; j < tw; j++) qsum[h] += qi[h * tw + j] = (int8_t)(sampler_rand(&r) * 255 - 127);
                qsum[h] += 127 - qi[h * tw];
                qi[h * tw] = 127, qs[h] = frand(&r) + 2;
                for (int t = 0; t < nt; t++) bias[h * nt + t] = 1000 * frand(&r);
            }
            ops_tip_q4(a, 48, qi, tw, qsum, qs, bias, nt, nq, tiles, ks, nt, tw);
            ops_tip_q4_ref(b, 48, qi, tw, qsum, qs, bias, nt, nq, tiles, ks, nt, tw);
            for (int h = 0; h < nq; h++)
                for (int i = 0; i < 48; i++)
                    cr_expect_eq(a[h * 48 + i], b[h * 48 + i], "tw %d nq %d h %d row %d: %g vs %g", tw, nq, h, i,
                                 a[h * 48 + i], b[h * 48 + i]);
            /* row 5 of the first tile and row 5 of the third, query 0, by the layout's definition */
            for (int t = 0; t < nt; t += 2) {
                int32_t dot = 0;
                for (int d = 0; d < tw; d++) {
                    const uint8_t v = tiles[(size_t)t * tile + (d / 8) * 64 + 4 * 5 + d % 4];
                    dot += (d % 8 < 4 ? v & 15 : v >> 4) * qi[d];
                }
                cr_expect_eq(b[16 * t + 5], fmaf((float)(dot - 8 * qsum[0]), kf[16 * t + 5] * qs[0], bias[t]),
                             "tw %d tile %d: the twin is not the formula", tw, t);
            }
            free(tiles);
            free(qi);
        }
}

/* Flash attention (queries in the lanes, tiles of 256 rows, a group's heads over each tile) against
 * the scalar kernels' exact softmax, head by head: f32 and f16 rows, query counts around the
 * 8- and 16-lane registers and the 6-query blocks, lengths across tile edges, causal lengths, one head
 * and three. */
Test(ops, attn_flash_matches_softmax)
{
    const int nq_list[] = { 1, 5, 6, 8, 9, 16, 17, 33, 64 };
    const int t_list[] = { 1, 7, 255, 256, 257, 700 };
    const int d_list[] = { 16, 64, 128 };
    float one_o[16], zero[16] = { 0 }, *one_w = malloc(sizeof(float) * ops_attn_flash_floats(1, 16));
    const int one = 1;
    const int built = ops_attn_flash(one_o, 16, zero, 1, 16, 1, 16, zero, zero, 0, 1, &one, 16, 1.0f, one_w) == 0;
    free(one_w);
    if (!built) cr_skip_test("ops_attn_flash: not in this build (no AVX2)");
    for (size_t di = 0; di < sizeof d_list / sizeof *d_list; di++)
        for (size_t ti = 0; ti < sizeof t_list / sizeof *t_list; ti++)
            for (size_t qi = 0; qi < sizeof nq_list / sizeof *nq_list; qi++)
                for (int v = 0; v < 4; v++) {   /* f32 / f16 rows, one head / three */
                    const int d = d_list[di], t = t_list[ti], nq = nq_list[qi], h16 = v & 1, nh = v & 2 ? 3 : 1;
                    const int ldq = nh * d + 3, ldo = nh * d + 5;
                    uint64_t r = 31 * d + 7 * t + nq + v;
                    float *Q = malloc(sizeof(float) * nq * ldq), *K = malloc(sizeof(float) * t * d);
                    float *V = malloc(sizeof(float) * t * d), *S = malloc(sizeof(float) * nq * t);
                    float *O = malloc(sizeof(float) * nq * ldo), *Or = malloc(sizeof(float) * nq * ldo);
                    float *work = malloc(sizeof(float) * ops_attn_flash_floats(nh, d));
                    int *len = malloc(sizeof(int) * nq);
                    for (int i = 0; i < nq * ldq; i++) Q[i] = frand(&r) * 2;
                    for (int i = 0; i < t * d; i++) K[i] = frand(&r) * 3, V[i] = frand(&r);
                    uint16_t *Kh = to_f16(K, t * d), *Vh = to_f16(V, t * d);
                    if (h16) {   /* the reference reads what the f16 rows hold */
                        for (int i = 0; i < t * d; i++) K[i] = gguf_f16_to_f32(Kh[i]), V[i] = gguf_f16_to_f32(Vh[i]);
                    }
                    for (int i = 0; i < nq; i++) len[i] = t - (nq - 1 - i) * t / (2 * nq);   /* causal-like */
                    const float scale = 1 / sqrtf((float)d);
                    for (int i = 0; i < nq * ldo; i++) O[i] = Or[i] = -7;
                    const int rc = ops_attn_flash(O, ldo, Q, nq, ldq, nh, d, h16 ? (const void *)Kh : K,
                                                  h16 ? (const void *)Vh : V, h16, t, len, d, scale, work);
                    cr_assert_eq(rc, 0, "flash d=%d t=%d nq=%d nh=%d refused", d, t, nq, nh);
                    for (int k = 0; k < nh; k++) {
                        ops_attn_scores_multi_ref(S, t, Q + k * d, nq, ldq, K, t, d, scale);
                        for (int i = 0; i < nq; i++) ops_softmax(S + (size_t)i * t, len[i]);
                        ops_attn_accum_multi_ref(Or + k * d, ldo, S, nq, len, V, t, d);
                    }
                    for (int i = 0; i < nq; i++)
                        for (int c = 0; c < ldo; c++) {
                            if (c >= nh * d) {   /* the padding of O is left alone */
                                cr_expect_eq(O[i * ldo + c], -7.0f);
                                continue;
                            }
                            cr_expect(fabsf(O[i * ldo + c] - Or[i * ldo + c]) <= 2e-6f + 1e-5f * fabsf(Or[i * ldo + c]),
                                      "flash d=%d t=%d nq=%d h16=%d nh=%d [%d][%d]: %.9g vs %.9g", d, t, nq, h16, nh, i,
                                      c, O[i * ldo + c], Or[i * ldo + c]);
                        }
                    free(Q), free(K), free(V), free(S), free(O), free(Or), free(work), free(len), free(Kh), free(Vh);
                }
}

/* ops.h - the numeric kernels of the forward pass, each with a plain scalar twin.
 *
 *   weight w = { GGUF_TYPE_Q4_1, rows, cols, data };     // a view into a mapped file
 *   ops_matmul(y, &w, x, n);        // y[n][rows] = x[n][cols] . W^T, threads over rows
 *   ops_rmsnorm(out, x, norm, n, eps);
 *   ops_attn_scores(scores, q, K, t, d, 1 / sqrtf(d));   // scores[i] = q . K[i] / sqrt(d)
 *   ops_softmax(scores, t);
 *   ops_attn_accum(out, scores, V, t, d);                 // out = sum_i scores[i] V[i]
 *
 * Weights keep the type they have on disk (enum gguf_type: every type of formats/gguf.h's traits
 * table, F32 ... IQ4_XS) and are read a block at a time inside the kernels (lib/core/quant.c, one
 * table of per-type kernels): no f32 copy of the model. Fast paths (AVX2/FMA/F16C, AVX-512) are
 * chosen at compile time; the *_ref twins are what tests compare them against (tests/test_ops.c,
 * tests/test_quant.c state each tolerance). tests/tools/bench_ops.c times them.
 *
 * Threads: ops_matmul and ops_matmul_multi open one OpenMP parallel region per call (static,
 * balanced row split, no barrier inside); everything else runs on the calling thread. They time
 * themselves and run on one thread when that has been faster lately (a machine busy with other
 * processes); ops_threads() gives the current choice to other parallel loops.
 */
#ifndef FASA_OPS_H
#define FASA_OPS_H

#include <stddef.h>
#include <stdint.h>

typedef struct weight {
    uint32_t type;        /* enum gguf_type */
    int64_t rows, cols;   /* logical (rows, cols); each row is gguf_row_bytes(type, cols) bytes */
    const void *data;
} weight;

size_t weight_bytes(const weight *w);
/* Dequantise row r of w into out[cols]. */
void weight_row(const weight *w, int64_t r, float *out);
void weight_row_ref(const weight *w, int64_t r, float *out);   /* formats/gguf's scalar dequant */

/* y[i*rows + r] = dot(row r of W, x[i*cols ..]) for i < n. OpenMP over rows. Each type's
 * kernels (lib/core/quant.c) read its blocks in place: decode rounds x to 16-bit integers per 32
 * values (Q4_0 ... Q8_0, IQ4_NL) or to 8-bit per 256 (the K types, as llama.cpp's q8_K), prefill
 * runs register-blocked tiles. ops_exact(1) makes every product f32 over dequantised rows (x not
 * rounded; slower): the arithmetic an f32 reference on the dequantised weights does. */
void ops_exact(int on);
void ops_matmul(float *y, const weight *w, const float *x, int n);
void ops_matmul_ref(float *y, const weight *w, const float *x, int n);
/* ops_matmul(y[i], w[i], x, n) for i < count in one parallel region (one fork and one join
 * instead of count): e.g. q, k, v or gate, up, which read the same x. All w[i] have the same
 * cols; the rows of all of them are split evenly over the threads. */
void ops_matmul_multi(float *const *y, const weight *const *w, int count, const float *x, int n);
/* Threads the matmuls use now: omp_get_max_threads(), or 1 inside a parallel region or while
 * one thread has been the faster choice; e.g.
 *   #pragma omp parallel for num_threads(ops_threads())  */
int ops_threads(void);
/* 1 (the default): the above; 0: always omp_get_max_threads() (tests, benchmarks). */
void ops_threads_adaptive(int on);

float ops_dot(const float *a, const float *b, int n);
float ops_dot_ref(const float *a, const float *b, int n);
/* y += a * x */
void ops_axpy(float *y, float a, const float *x, int n);
void ops_axpy_ref(float *y, float a, const float *x, int n);

/* Attention of one query over t cached positions, head dim d (any; fast when a multiple of 8,
 * fastest at 64). K and V are row-major (t, d).
 * s[i] = scale * dot(q, K[i]) for i < t */
void ops_attn_scores(float *s, const float *q, const float *K, int t, int d, float scale);
void ops_attn_scores_ref(float *s, const float *q, const float *K, int t, int d, float scale);
/* out[d] = sum_i p[i] * V[i] (overwrites out) */
void ops_attn_accum(float *out, const float *p, const float *V, int t, int d);
void ops_attn_accum_ref(float *out, const float *p, const float *V, int t, int d);
/* The same over selected rows: s[j] = scale * dot(q, K[idx[j]]), out = sum_j p[j] V[idx[j]], j < n */
void ops_attn_scores_idx(float *s, const float *q, const float *K, const int32_t *idx, int n, int d, float scale);
void ops_attn_scores_idx_ref(float *s, const float *q, const float *K, const int32_t *idx, int n, int d, float scale);
void ops_attn_accum_idx(float *out, const float *p, const float *V, const int32_t *idx, int n, int d);
void ops_attn_accum_idx_ref(float *out, const float *p, const float *V, const int32_t *idx, int n, int d);
/* Several queries against the same keys and values, each row read once for all of them: the
 * heads of a GQA group in decode, or all queries of one KV head in a prefill batch.
 * S[i*lds + j] = scale * dot(Q[i*ldq ..], K[j]) for i < nq, j < t (lds >= t) */
void ops_attn_scores_multi(float *S, int lds, const float *Q, int nq, int ldq, const float *K, int t, int d,
                           float scale);
void ops_attn_scores_multi_ref(float *S, int lds, const float *Q, int nq, int ldq, const float *K, int t, int d,
                               float scale);
/* O[i*ldo + c] = sum_{j < len[i]} P[i*t + j] V[j][c] for i < nq (overwrites; len NULL: all t rows;
 * weights beyond len[i] are not read, so a causal prefill passes each query's position + 1) */
void ops_attn_accum_multi(float *O, int ldo, const float *P, int nq, const int *len, const float *V, int t, int d);
void ops_attn_accum_multi_ref(float *O, int ldo, const float *P, int nq, const int *len, const float *V, int t,
                              int d);

/* The same kernels over rows of f16 (the f16 KV cache), widened by F16C on the fly; idx NULL
 * reads rows 0..n-1, else rows idx[0..n). */
void ops_attn_scores_f16(float *s, const float *q, const uint16_t *K, const int32_t *idx, int n, int d, float scale);
void ops_attn_scores_f16_ref(float *s, const float *q, const uint16_t *K, const int32_t *idx, int n, int d,
                             float scale);
void ops_attn_accum_f16(float *out, const float *p, const uint16_t *V, const int32_t *idx, int n, int d);
void ops_attn_accum_f16_ref(float *out, const float *p, const uint16_t *V, const int32_t *idx, int n, int d);
void ops_attn_scores_multi_f16(float *S, int lds, const float *Q, int nq, int ldq, const uint16_t *K, int t, int d,
                               float scale);
void ops_attn_scores_multi_f16_ref(float *S, int lds, const float *Q, int nq, int ldq, const uint16_t *K, int t,
                                   int d, float scale);
void ops_attn_accum_multi_f16(float *O, int ldo, const float *P, int nq, const int *len, const uint16_t *V, int t,
                              int d);
void ops_attn_accum_multi_f16_ref(float *O, int ldo, const float *P, int nq, const int *len, const uint16_t *V,
                                  int t, int d);
/* Flash attention of nh <= 8 heads of nq <= 64 queries each over the same t key and value rows
 * (f32, or f16 when h16; d apart, d a multiple of 16 up to 256): head k's query i (at Q + k
 * hstride + i ldq) over rows 0..len[i]-1, into O + k hstride + i ldo = softmax(scale q . K) V.
 * By tiles of OPS_FLASH_TILE rows, read once for the heads, under a running max and sum per
 * query, with the queries in the vector lanes (each key and value element loaded once for 16 of
 * them with AVX-512, 8 with AVX2): a GQA group's heads in a prefill batch. work:
 * ops_attn_flash_floats(nh, d) floats.
 * Returns -1, writing nothing, for shapes it does not take or without AVX2 (the caller then
 * attends otherwise). */
enum { OPS_FLASH_TILE = 256 };
int ops_attn_flash(float *O, int ldo, const float *Q, int nq, int ldq, int nh, int hstride, const void *K,
                   const void *V, int h16, int t, const int *len, int d, float scale, float *work);
size_t ops_attn_flash_floats(int nh, int d);
/* f32 <-> f16, rounding to nearest even (exactly gguf_f32_to_f16 / gguf_f16_to_f32) */
void ops_f32_to_f16(uint16_t *y, const float *x, int n);
void ops_f32_to_f16_ref(uint16_t *y, const float *x, int n);
void ops_f16_to_f32(float *y, const uint16_t *x, int n);

void ops_rmsnorm(float *out, const float *x, const float *gamma, int n, float eps);
/* In place softmax over n values; returns nothing, writes exp(x - max) / sum. The fast one uses
 * a vectorised exp within 2e-7 relative of expf (values more than 87.3 below the max become 0). */
void ops_softmax(float *x, int n);
void ops_softmax_ref(float *x, int n);
/* a[i] = silu(a[i]) * b[i] (the same vectorised exp) */
void ops_swiglu(float *a, const float *b, int n);
void ops_swiglu_ref(float *a, const float *b, int n);
/* a[i] = gelu(a[i]) * b[i], GELU by its tanh form (Gemma's gelu_pytorch_tanh), tanh through
 * the same vectorised exp */
void ops_geglu(float *a, const float *b, int n);
void ops_geglu_ref(float *a, const float *b, int n);
/* y[i] = exp(x[i]), the vectorised exp: within 2e-7 relative of expf for x in [-87.3, 88.3];
 * 0 below, exp(88.3) above. y may be x. */
void ops_exp(float *y, const float *x, int n);
/* y[i] = exp((x[i] - max) * scale), the same exp, over finite x; returns max and *sum the sum of
 * the y (the unnormalised softmax of x / scale and its mass). y may be x. */
float ops_exp_shifted(float *y, const float *x, int n, float scale, double *sum);
/* The same with the max given: y[i] = exp((x[i] - mx) * scale), *sum their sum. y may be x. */
void ops_exp_from(float *y, const float *x, int n, float mx, float scale, double *sum);
/* The sum of exp((x[i] - mx) * scale) over x[0..n), each exp to 3e-6 relative (a degree-4
 * polynomial: for estimates, about twice the speed of ops_exp_from); -1 when some x[i] > mx
 * (mx was not the max: the caller takes ops_max and asks again). */
double ops_exp_sum_est(const float *x, int n, float mx, float scale);
/* The same by blocks of B rows, in one pass: zb[k] the sum over x[max(lo, bB) .. min(hi, (b + 1)B))
 * for b = lo / B + k up to (hi - 1) / B; returns their sum (-1 as above). */
double ops_exp_sum_blocks(double *zb, const float *x, int lo, int hi, int B, float mx, float scale);
/* The largest of x[0..n) (-inf when n is 0; not NaN-aware). */
float ops_max(const float *x, int n);
float ops_exp_shifted_ref(float *y, const float *x, int n, float scale, double *sum);

/* The token importance predictor over a 4-bit key copy (kvcache.h: tip copy). Keys come in tiles
 * of 16 rows; a tile holds tw / 8 groups of 64 bytes, and in group j byte 4 r + b holds dim
 * 8 j + b of row r in its low nibble and dim 8 j + 4 + b in its high one, each value stored as
 * n = (k - offset) / kscale[r] + 8 (1..15), kscale[r] an f16. Queries come as 8-bit integers qi
 * (ldq apart, tw each) with qscale, qsum = sum of qi, and bias[h ldb + t] = query h's product
 * with tile t's offsets. For rows r < 16 n_tiles and queries h < nq (at most 8):
 *   S[h ldo + r] = fmaf((float)(sum_d n[r][d] qi[h][d] - 8 qsum[h]), kscale[r] * qscale[h],
 *                       bias[h ldb + r / 16])
 * The integer sums are exact, so the fast kernels (AVX512-VNNI vpdpbusd; AVX2 vpmaddubsw) equal
 * the twin exactly. */
void ops_tip_q4(float *S, int ldo, const int8_t *qi, int ldq, const int32_t *qsum, const float *qscale,
                const float *bias, int ldb, int nq, const uint8_t *tiles, const uint16_t *kscale, int n_tiles, int tw);
void ops_tip_q4_ref(float *S, int ldo, const int8_t *qi, int ldq, const int32_t *qsum, const float *qscale,
                    const float *bias, int ldb, int nq, const uint8_t *tiles, const uint16_t *kscale, int n_tiles,
                    int tw);

#endif

/* bench_ops - times lib/ops kernels on the real model's weight shapes. Not part of the suite.
 *
 *   make build/libfasa.a && cc -O2 -march=native -fopenmp -I. -Ilib -Ilib/core -Ilib/fasa -Iformats \
 *       tests/tools/bench_ops.c build/libfasa.a -lm -o bin/bench_ops
 *   bin/bench_ops [MODEL.gguf] [-n BATCH] [-r REPEATS] [--copy] [--adaptive] [--best]
 *   bin/bench_ops --types [Q4_K,Q6_K,...] [-r REPEATS] [--best]
 *
 * --types times each weight type's kernels (lib/core/quant.c) on random blocks of the shapes of
 * a 1.5B model's feed-forward (8960x1536 and 1536x8960): decode GB/s over enough copies that
 * the weights stream from memory (96 MB per pass), and prefill GFLOP/s for batches of 64 and
 * 512 tokens on one matrix. With no list: every type with fast kernels.
 *
 * For each shape (576x576, 192x576, 1536x576, 576x1536 of every layer, and the 49152x576
 * output/embedding matrix): decode (n = 1) time per matrix and GB/s of weights streamed, and
 * prefill (n = BATCH, default 64) GFLOP/s, each beside the previous kernel ("old": one row
 * dequantised to a buffer, then ops_dot per token, OpenMP over 16-row chunks) and a whole-model
 * decode sweep (every matrix of every layer once, about 96 MB: the decode bandwidth); then
 * attention of one query (old ops_dot/ops_axpy loop against ops_attn_*) and of one KV head's
 * queries (per head against ops_attn_*_multi), on one thread. Medians of
 * REPEATS runs; the machine may be shared, so look at the spread too. --copy reads the weights
 * from anonymous memory instead of the file mapping (the copies are not freed). The matmuls use
 * all threads (OMP_NUM_THREADS) unless --adaptive lets them pick one thread when it is faster,
 * as they do in fasa. --best reports the fastest of the runs instead of the median: on a shared
 * machine that is what the kernels do when nothing preempts them.
 */
#include <immintrin.h>
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "gguf.h"
#include "ops.h"
#include "quant.h"
#include "sampler.h"

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static int use_best;   /* --best: the fastest run instead of the median */

static double median(double *v, int n)
{
    qsort(v, n, sizeof *v, cmp_double);
    if (use_best) return v[0];
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

/* The kernel before this change, kept here as the baseline. */
static void old_matmul(float *y, const weight *w, const float *x, int n)
{
    const int64_t rows = w->rows, chunk = 16, n_chunks = (rows + chunk - 1) / chunk;
#pragma omp parallel for schedule(static) if (rows * w->cols * (int64_t)n > 32768)
    for (int64_t c = 0; c < n_chunks; c++) {
        const int64_t r0 = c * chunk, r1 = r0 + chunk < rows ? r0 + chunk : rows, cols = w->cols;
        float buf[cols];
        for (int64_t r = r0; r < r1; r++) {
            const float *row = buf;
            if (w->type == GGUF_TYPE_F32) row = (const float *)w->data + (size_t)r * cols;
            else weight_row(w, r, buf);
            for (int i = 0; i < n; i++) y[(size_t)i * rows + r] = ops_dot(row, x + (size_t)i * cols, (int)cols);
        }
    }
}

typedef void (*matmul_fn)(float *, const weight *, const float *, int);

/* Median seconds for one pass over ws[0..count) with batch n. */
static double time_pass(matmul_fn fn, const weight *ws, int count, float *y, const float *x, int n, int reps)
{
    double t[reps];
    for (int r = 0; r < reps; r++) {
        double t0 = now();
        for (int i = 0; i < count; i++) fn(y, &ws[i], x, n);
        t[r] = now() - t0;
    }
    return median(t, reps);
}

static int copy_weights;

static weight tensor_weight(const gguf_file *g, const char *name)
{
    const gguf_tensor *t = gguf_find_tensor(g, name);
    if (!t) {
        fprintf(stderr, "bench_ops: no tensor '%s'\n", name);
        exit(1);
    }
    weight w = { t->type, t->ne[1], t->ne[0], t->data };
    if (copy_weights) {   /* anonymous memory instead of the file mapping */
        void *p = aligned_alloc(64, (weight_bytes(&w) + 63) / 64 * 64);
        memcpy(p, w.data, weight_bytes(&w));
        w.data = p;
    }
    return w;
}

/* A weight of random valid blocks: random bytes, f16 scales of a sensible size (no NaN, no
 * subnormals), so the timing is that of real data. */
static weight random_weight(uint32_t type, int64_t rows, int64_t cols, uint64_t *rng)
{
    const quant_kernels *k = quant_kernels_of(type);
    const size_t n = (size_t)(rows * cols / k->block), bytes = n * k->bytes;
    uint8_t *p = aligned_alloc(64, (bytes + 63) / 64 * 64);
    for (size_t i = 0; i < bytes; i++) p[i] = (uint8_t)(sampler_rand(rng) * 256);
    int a = -1, b = -1;
    if (type == GGUF_TYPE_Q6_K) a = 208;
    else if (k->block > 1) a = 0;
    if (type == GGUF_TYPE_Q4_1 || type == GGUF_TYPE_Q5_1 || type == GGUF_TYPE_Q4_K || type == GGUF_TYPE_Q5_K) b = 2;
    for (size_t i = 0; i < n; i++) {
        uint8_t *blk = p + i * k->bytes;
        const uint16_t h = gguf_f32_to_f16(0.001f + 0.01f * sampler_rand(rng));
        if (a >= 0) blk[a] = (uint8_t)h, blk[a + 1] = (uint8_t)(h >> 8);
        if (b >= 0) blk[b] = (uint8_t)h, blk[b + 1] = (uint8_t)(h >> 8);
        if (type == GGUF_TYPE_F16) blk[0] = (uint8_t)h, blk[1] = (uint8_t)(h >> 8);
    }
    return (weight){ type, rows, cols, p };
}

/* A plain read of the same bytes (all threads, each its part of every matrix), the reference
 * for the decode GB/s. */
static void read_sweep(float *y, const weight *w, const float *x, int n)
{
    const size_t bytes = weight_bytes(w);
    const uint8_t *p = w->data;
    double acc = 0;
#pragma omp parallel for schedule(static) reduction(+ : acc)
    for (size_t o = 0; o < bytes; o += 4096) {
        const size_t e = o + 4096 < bytes ? o + 4096 : bytes;
        __m256i s = _mm256_setzero_si256();
        for (size_t i = o; i + 32 <= e; i += 32) s = _mm256_add_epi64(s, _mm256_loadu_si256((const __m256i *)(p + i)));
        acc += (double)_mm256_extract_epi64(s, 0) + (double)_mm256_extract_epi64(s, 3);
    }
    y[0] = (float)acc;
}

static int bench_types(const char *list, int reps)
{
    static const uint32_t all[] = { GGUF_TYPE_Q4_0, GGUF_TYPE_Q4_1, GGUF_TYPE_Q5_0, GGUF_TYPE_Q5_1, GGUF_TYPE_Q8_0,
                                    GGUF_TYPE_IQ4_NL, GGUF_TYPE_Q4_K, GGUF_TYPE_Q5_K, GGUF_TYPE_Q6_K, GGUF_TYPE_F16 };
    const int64_t big = 8960, small = 1536;
    uint64_t rng = 1;
    float *x = malloc(sizeof(float) * 512 * big), *y = malloc(sizeof(float) * 512 * big);
    for (int64_t i = 0; i < 512 * big; i++) x[i] = sinf((float)i * 0.37f) * (i % 97 == 5 ? 20 : 1);
    printf("bench_ops --types: %d threads, %s of %d; decode GB/s over 96 MB of copies (a plain read of them), prefill "
           "GFLOP/s\n",
           omp_get_max_threads(), use_best ? "best" : "median", reps);
    printf("%-7s %14s %14s | %12s %12s\n", "type", "8960x1536", "1536x8960", "pre n=64", "pre n=512");
    printf("%-7s %14s %14s |\n", "", "dec (read)", "dec (read)");
    for (size_t ti = 0; ti < sizeof all / sizeof *all; ti++) {
        const quant_kernels *k = quant_kernels_of(all[ti]);
        if (list ? !strstr(list, k->name) : !k->dot1 && !k->tile) continue;
        double gbs[2], gf[2], rd[2];
        for (int shape = 0; shape < 2; shape++) {
            const int64_t rows = shape ? small : big, cols = shape ? big : small;
            const double bytes = (double)(rows * cols / k->block * k->bytes);
            const int copies = (int)(96e6 / bytes) + 1;
            weight *ws = malloc(sizeof(weight) * copies);
            for (int c = 0; c < copies; c++) ws[c] = random_weight(all[ti], rows, cols, &rng);
            gbs[shape] = bytes * copies / time_pass(ops_matmul, ws, copies, y, x, 1, reps) / 1e9;
            rd[shape] = bytes * copies / time_pass(read_sweep, ws, copies, y, x, 1, reps) / 1e9;
            if (shape == 0)
                for (int b = 0; b < 2; b++) {
                    const int n = b ? 512 : 64;
                    gf[b] = 2.0 * rows * cols * n / time_pass(ops_matmul, ws, 1, y, x, n, reps < 5 ? reps : 5) / 1e9;
                }
            for (int c = 0; c < copies; c++) free((void *)ws[c].data);
            free(ws);
        }
        printf("%-7s %6.1f (%5.1f) %6.1f (%5.1f) | %12.1f %12.1f\n", k->name, gbs[0], rd[0], gbs[1], rd[1], gf[0],
               gf[1]);
        fflush(stdout);
    }
    free(x); free(y);
    return 0;
}

int main(int argc, char **argv)
{
    const char *path = "models/SmolLM2-135M-Instruct.Q4_1.gguf";
    int batch = 64, reps = 15, adaptive = 0;
    const char *types = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-n") && i + 1 < argc) batch = atoi(argv[++i]);
        else if (!strcmp(argv[i], "-r") && i + 1 < argc) reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--copy")) copy_weights = 1;
        else if (!strcmp(argv[i], "--adaptive")) adaptive = 1;
        else if (!strcmp(argv[i], "--best")) use_best = 1;
        else if (!strcmp(argv[i], "--types")) types = i + 1 < argc && argv[i + 1][0] != '-' ? argv[++i] : "";
        else path = argv[i];
    }
    ops_threads_adaptive(adaptive);
    if (types) return bench_types(*types ? types : NULL, reps);
    char err[512];
    gguf_file g;
    if (gguf_open(&g, path, err) < 0) {
        fprintf(stderr, "bench_ops: %s\n", err);
        return 1;
    }
    uint32_t n_layer = 0;
    gguf_str arch = { "llama", 5 };
    gguf_get_str(&g, "general.architecture", &arch);
    char key[96];
    snprintf(key, sizeof key, "%.*s.block_count", (int)arch.len, arch.ptr);
    gguf_get_u32(&g, key, &n_layer);
    static const char *names[] = { "attn_q", "attn_k", "ffn_gate", "ffn_down", "attn_v", "attn_output", "ffn_up" };
    const int n_shapes = 4;
    weight *lw[7];
    for (int s = 0; s < 7; s++) {
        lw[s] = malloc(sizeof(weight) * n_layer);
        for (uint32_t l = 0; l < n_layer; l++) {
            char name[96];
            snprintf(name, sizeof name, "blk.%u.%s.weight", l, names[s]);
            lw[s][l] = tensor_weight(&g, name);
        }
    }
    weight out = tensor_weight(&g, gguf_find_tensor(&g, "output.weight") ? "output.weight" : "token_embd.weight");

    const size_t xmax = (size_t)batch * 1536, ymax = (size_t)batch * 49152;
    float *x = malloc(xmax * sizeof(float)), *y = malloc(ymax * sizeof(float));
    for (size_t i = 0; i < xmax; i++) x[i] = sinf((float)i * 0.37f);
    memset(y, 0, ymax * sizeof(float));
    printf("bench_ops: %s, %d threads%s, prefill batch %d, %s of %d\n", path, omp_get_max_threads(),
           adaptive ? " (adaptive)" : "", batch, use_best ? "best" : "median", reps);
    printf("%-22s %8s %8s %8s | %8s %8s %8s\n", "shape (type)", "old us", "new us", "GB/s", "old GF/s", "new GF/s",
           "speedup");

    for (int s = 0; s <= n_shapes; s++) {
        const weight *ws = s < n_shapes ? lw[s] : &out;
        const int count = s < n_shapes ? (int)n_layer : 1;
        const double bytes = (double)weight_bytes(&ws[0]) * count;
        const double flops = 2.0 * ws[0].rows * ws[0].cols * count;
        /* decode: each pass streams `count` matrices (all layers; L3-resident for the small ones) */
        double d_old = time_pass(old_matmul, ws, count, y, x, 1, reps);
        double d_new = time_pass(ops_matmul, ws, count, y, x, 1, reps);
        int pre_reps = reps < 5 ? reps : 5;
        int pre_count = count < 4 ? count : 4;
        double p_old = time_pass(old_matmul, ws, pre_count, y, x, batch, pre_reps);
        double p_new = time_pass(ops_matmul, ws, pre_count, y, x, batch, pre_reps);
        char label[64];
        snprintf(label, sizeof label, "%lldx%lld (%s)", (long long)ws[0].rows, (long long)ws[0].cols,
                 gguf_type_name(ws[0].type));
        const double pf = flops / count * pre_count * batch;
        printf("%-22s %8.1f %8.1f %8.1f | %8.1f %8.1f %7.2fx\n", label, d_old / count * 1e6,
               d_new / count * 1e6, bytes / d_new / 1e9, pf / p_old / 1e9, pf / p_new / 1e9, p_old / p_new);
    }

    /* whole-model decode sweep: every matrix once, in forward order */
    weight *all = malloc(sizeof(weight) * (7 * n_layer + 1));
    int na = 0;
    static const int order[7] = { 0, 1, 4, 5, 2, 6, 3 };
    for (uint32_t l = 0; l < n_layer; l++)
        for (int s = 0; s < 7; s++) all[na++] = lw[order[s]][l];
    all[na++] = out;
    double total = 0;
    for (int i = 0; i < na; i++) total += weight_bytes(&all[i]);
    double sw_old = time_pass(old_matmul, all, na, y, x, 1, reps);
    double sw_new = time_pass(ops_matmul, all, na, y, x, 1, reps);
    printf("decode sweep, %d matrices, %.1f MB: old %.2f ms (%.1f GB/s), new %.2f ms (%.1f GB/s)\n", na,
           total / 1e6, sw_old * 1e3, total / sw_old / 1e9, sw_new * 1e3, total / sw_new / 1e9);

    /* attention of one query over t keys, d = 64: old (ops_dot / ops_axpy per key) vs new */
    const int d = 64;
    for (int t = 256; t <= 4096; t *= 4) {
        float *K = malloc(sizeof(float) * t * d), *V = malloc(sizeof(float) * t * d), *s = malloc(sizeof(float) * t);
        float q[64], o[64];
        for (int i = 0; i < t * d; i++) K[i] = sinf(i * 0.013f), V[i] = cosf(i * 0.007f);
        for (int i = 0; i < d; i++) q[i] = cosf(i * 0.1f);
        const int inner = 20000000 / (t * d) + 1;
        double to[reps], tn[reps];
        for (int r = 0; r < reps; r++) {
            double t0 = now();
            for (int k = 0; k < inner; k++) {
                for (int i = 0; i < t; i++) s[i] = ops_dot(q, K + (size_t)i * d, d) * 0.125f;
                ops_softmax_ref(s, t);
                memset(o, 0, sizeof o);
                for (int i = 0; i < t; i++) ops_axpy(o, s[i], V + (size_t)i * d, d);
            }
            to[r] = (now() - t0) / inner;
            t0 = now();
            for (int k = 0; k < inner; k++) {
                ops_attn_scores(s, q, K, t, d, 0.125f);
                ops_softmax(s, t);
                ops_attn_accum(o, s, V, t, d);
            }
            tn[r] = (now() - t0) / inner;
        }
        double mo = median(to, reps), mn = median(tn, reps);
        printf("attention t=%-5d d=64, one thread: old %.1f us, new %.1f us (%.2fx; %.1f GB/s of K+V)\n", t,
               mo * 1e6, mn * 1e6, mo / mn, 2.0 * t * d * 4 / mn / 1e9);
        free(K); free(V); free(s);
    }
    /* one KV head of a GQA group: 3 query heads in decode, 64 tokens x 3 heads in prefill (causal
     * lengths), per head (ops_attn_scores / softmax / ops_attn_accum) against the multi kernels */
    for (int t = 512; t <= 4096; t *= 2) {
        for (int nq = 3; nq <= 192; nq *= 64) {
            float *K = malloc(sizeof(float) * t * d), *V = malloc(sizeof(float) * t * d);
            float *Q = malloc(sizeof(float) * nq * d), *O = malloc(sizeof(float) * nq * d);
            float *S = malloc(sizeof(float) * nq * t);
            int *len = malloc(sizeof(int) * nq);
            for (int i = 0; i < t * d; i++) K[i] = sinf(i * 0.013f), V[i] = cosf(i * 0.007f);
            for (int i = 0; i < nq * d; i++) Q[i] = cosf(i * 0.1f);
            for (int i = 0; i < nq; i++) len[i] = nq == 3 ? t : t - 64 + i / 3 + 1;
            const int inner = 20000000 / (t * d * nq) + 1;
            double th[reps], tm[reps];
            for (int r = 0; r < reps; r++) {
                double t0 = now();
                for (int k = 0; k < inner; k++)
                    for (int i = 0; i < nq; i++) {
                        ops_attn_scores(S + (size_t)i * t, Q + (size_t)i * d, K, len[i], d, 0.125f);
                        ops_softmax(S + (size_t)i * t, len[i]);
                        ops_attn_accum(O + (size_t)i * d, S + (size_t)i * t, V, len[i], d);
                    }
                th[r] = (now() - t0) / inner;
                t0 = now();
                for (int k = 0; k < inner; k++) {
                    ops_attn_scores_multi(S, t, Q, nq, d, K, t, d, 0.125f);
                    for (int i = 0; i < nq; i++) ops_softmax(S + (size_t)i * t, len[i]);
                    ops_attn_accum_multi(O, d, S, nq, len, V, t, d);
                }
                tm[r] = (now() - t0) / inner;
            }
            double mh = median(th, reps), mm = median(tm, reps);
            printf("attention %3d queries on one KV head, t=%-5d: per head %.1f us, multi %.1f us (%.2fx)\n", nq, t,
                   mh * 1e6, mm * 1e6, mh / mm);
            free(K); free(V); free(Q); free(O); free(S); free(len);
        }
    }
    free(all); free(x); free(y);
    for (int s = 0; s < 7; s++) free(lw[s]);
    gguf_close(&g);
    return 0;
}

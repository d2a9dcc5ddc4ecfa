/* Calibration: top-K buckets against a full sort, CA against a brute-force recount, profiles. */
#include <criterion/criterion.h>
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "calibrate.h"
#include "fixtures.h"
#include "forward.h"
#include "gguf.h"
#include "sampler.h"
#include "topk.h"

/* Kinds of scores: many ties (odd n) or smooth values (even n) with signed zeros; scores a few
 * subnormals apart (the bins' scale overflows); a NaN right after a huge value in the same vector
 * lane (a vector max that returns its NaN operand would lose the huge value, and its bin index
 * overflow). The binned path must give the full sort's buckets or step aside, never crash. */
Test(calibrate, buckets_match_full_sort)
{
    uint64_t r = 3;
    const int ks[] = { 1, 4, 16, 64, 512, 2048 };
    for (int n = 1; n < 6000; n += n < 300 ? 13 : 997)
    for (int kind = 0; kind < 3; kind++) {
        float *s = malloc(sizeof(float) * n);
        uint8_t *b1 = malloc(n), *b2 = malloc(n);
        uint64_t *scratch = malloc(sizeof(uint64_t) * (2 * n + 256));
        for (int i = 0; i < n; i++)
            s[i] = kind == 1 ? ldexpf((float)(int)(sampler_rand(&r) * 5), -149)
                 : n % 2 ? (float)(int)(sampler_rand(&r) * 20) - 10 : sampler_rand(&r) * 100 - 50;
        if (kind == 0 && n > 5) s[2] = -0.0f, s[3] = 0.0f;
        if (kind == 2 && n > 16) s[1] = 1e30f, s[9] = NAN;
        calib_buckets(s, n, ks, 6, b1, scratch);
        calib_buckets_ref(s, n, ks, 6, b2);
        cr_expect_eq(memcmp(b1, b2, n), 0, "n=%d kind=%d", n, kind);
        /* exactly min(K, n) tokens fall within each top-K */
        for (int b = 0; b < 6; b++) {
            int cnt = 0;
            for (int i = 0; i < n; i++) cnt += b1[i] <= b;
            cr_expect_eq(cnt, ks[b] < n ? ks[b] : n, "n=%d kind=%d K=%d", n, kind, ks[b]);
        }
        free(s); free(b1); free(b2); free(scratch);
    }
}

/* ------------------------------------------------ brute force: one token at a time, qsort */

typedef struct brute {
    const int *ks;
    int n_k, n_prefill, n_chunk;
    int16_t *dims;   /* (n_layer, n_kv, d) */
    double *hits;    /* (n_k, n_layer, n_head, n_chunk) */
    double *den;     /* (n_k, n_layer, n_head) */
    int n_layer, n_head, n_kv;
} brute;

static const float *sort_scores;
static int by_score(const void *a, const void *b)
{
    int i = *(const int *)a, j = *(const int *)b;
    if (sort_scores[i] != sort_scores[j]) return sort_scores[i] < sort_scores[j] ? 1 : -1;
    return i - j;
}

static void brute_obs(void *ctx, const model *m, const struct run_state *s, int layer, int head, int pos,
                      const float *q)
{
    brute *B = ctx;
    if (pos < B->n_prefill) return;
    const int t = pos + 1, d = m->cfg.d_head, g = head / (B->n_head / B->n_kv);
    const float *K = kvcache_k(&s->kv, layer, g);
    const int16_t *dims = B->dims + ((size_t)layer * B->n_kv + g) * d;
    float *full = malloc(sizeof(float) * t), *cs = malloc(sizeof(float) * t);
    int *of = malloc(sizeof(int) * t), *oc = malloc(sizeof(int) * t);
    for (int i = 0; i < t; i++) {
        double acc = 0;
        for (int c = 0; c < d / 2; c++)
            acc += q[dims[2 * c]] * K[(size_t)i * d + dims[2 * c]] +
                   q[dims[2 * c + 1]] * K[(size_t)i * d + dims[2 * c + 1]];
        full[i] = 0;
        for (int c = 0; c < d / 2; c++)   /* same summation order as the observer: chunk by chunk, float */
            full[i] += q[dims[2 * c]] * K[(size_t)i * d + dims[2 * c]] +
                       q[dims[2 * c + 1]] * K[(size_t)i * d + dims[2 * c + 1]];
        (void)acc;
        of[i] = i;
    }
    sort_scores = full;
    qsort(of, t, sizeof *of, by_score);
    for (int c = 0; c < d / 2; c++) {
        for (int i = 0; i < t; i++)
            cs[i] = q[dims[2 * c]] * K[(size_t)i * d + dims[2 * c]] +
                    q[dims[2 * c + 1]] * K[(size_t)i * d + dims[2 * c + 1]],
            oc[i] = i;
        sort_scores = cs;
        qsort(oc, t, sizeof *oc, by_score);
        for (int b = 0; b < B->n_k; b++) {
            int k = B->ks[b] < t ? B->ks[b] : t, inter = 0;
            for (int x = 0; x < k; x++)
                for (int y = 0; y < k; y++) inter += of[x] == oc[y];
            B->hits[(((size_t)b * B->n_layer + layer) * B->n_head + head) * (d / 2) + c] += inter;
        }
    }
    for (int b = 0; b < B->n_k; b++)
        B->den[((size_t)b * B->n_layer + layer) * B->n_head + head] += B->ks[b] < t ? B->ks[b] : t;
    free(full); free(cs); free(of); free(oc);
}

static void check_ca(enum chunk_def def, enum tiny_arch arch)
{
    tiny_model t;
    tiny_make(&t, &(tiny_spec){ .arch = arch, .seed = 21 });
    char *dir = tmpdir_make(), path[600], err[FASA_ERRLEN];
    snprintf(path, sizeof path, "%s/t.gguf", dir);
    cr_assert_eq(tiny_write_gguf(&t, path, GGUF_TYPE_F32), 0);
    model *m;
    cr_assert_eq(model_open(&m, path, err), 0, "%s", err);
    const int n = 150;
    int32_t ids[150];
    for (int i = 0; i < n; i++) ids[i] = (i * 31 + 7) % t.s.n_vocab;
    calib_opts o = calib_defaults(m);
    const int ks[] = { 4, 16, 64, 256 };
    o.n_k = 4;
    memcpy(o.ks, ks, sizeof ks);
    o.rank_k = 16;
    o.n_prefill = 100;
    o.chunks = def;
    profile p;
    cr_assert_eq(calibrate_run(m, ids, n, &o, &p, err), 0, "%s", err);

    const model_config *c = &m->cfg;
    brute B = { ks, 4, 100, c->d_head / 2, NULL, NULL, NULL, c->n_layer, c->n_head, c->n_kv_head };
    B.dims = malloc(sizeof(int16_t) * c->n_layer * c->n_kv_head * c->d_head);
    for (int l = 0; l < c->n_layer; l++)
        for (int g = 0; g < c->n_kv_head; g++)
            profile_chunk_dims(m, l, g, def, B.dims + ((size_t)l * c->n_kv_head + g) * c->d_head);
    B.hits = calloc((size_t)4 * c->n_layer * c->n_head * B.n_chunk, sizeof(double));
    B.den = calloc((size_t)4 * c->n_layer * c->n_head, sizeof(double));
    /* the same batches as calibrate_run, so q and K are bit-identical (batch size changes the
     * matmul kernel and so the last bits); one thread, as brute_obs is not thread-safe */
    run_state *s = run_state_new(m, n, 64, err);
    attn_obs obs = { brute_obs, &B };
    s->obs = &obs;
    omp_set_num_threads(1);
    for (int i = 0; i < n; i += 64) cr_assert_eq(model_forward(m, s, ids + i, n - i < 64 ? n - i : 64, 0, err), 0);
    omp_set_num_threads(omp_get_num_procs());
    double maxd = 0, spread = 0;
    for (int b = 0; b < 4; b++)
        for (int l = 0; l < c->n_layer; l++)
            for (int h = 0; h < c->n_head; h++)
                for (int j = 0; j < B.n_chunk; j++) {
                    double want = B.hits[(((size_t)b * c->n_layer + l) * c->n_head + h) * B.n_chunk + j] /
                                  B.den[((size_t)b * c->n_layer + l) * c->n_head + h];
                    double got = profile_ca(&p, b, l, h)[j];
                    maxd = fmax(maxd, fabs(got - want));
                    spread = fmax(spread, fabs(got - profile_ca(&p, b, l, h)[0]));
                }
    cr_expect_lt(maxd, 1e-9, "CA differs from the brute-force count by %g", maxd);
    cr_expect_gt(spread, 0.05, "chunks do not differ: the test would not see a mix-up");
    /* K = 256 > every t here: the cap makes CA exactly 1 */
    cr_expect_float_eq(profile_ca(&p, 3, 0, 0)[5], 1.0, 1e-12);
    free(B.dims); free(B.hits); free(B.den);
    run_state_free(s);
    profile_free(&p);
    model_close(m);
    tiny_free(&t);
    tmpdir_remove(dir);
}

Test(calibrate, ca_equals_brute_force_planes) { check_ca(CHUNKS_PLANE, TINY_LLAMA); }
Test(calibrate, ca_equals_brute_force_adjacent) { check_ca(CHUNKS_ADJACENT, TINY_LLAMA); }
Test(calibrate, ca_equals_brute_force_qwen2_layout) { check_ca(CHUNKS_PLANE, TINY_QWEN2); }

/* Both file layouts map chunk j to the same canonical dims; adjacent chunks are halves of two planes. */
Test(calibrate, chunk_dims_by_definition)
{
    for (int arch = 0; arch < 2; arch++) {
        tiny_model t;
        tiny_make(&t, &(tiny_spec){ .arch = arch, .seed = 1 });
        char *dir = tmpdir_make(), path[600], err[FASA_ERRLEN];
        snprintf(path, sizeof path, "%s/t.gguf", dir);
        cr_assert_eq(tiny_write_gguf(&t, path, GGUF_TYPE_F32), 0);
        model *m;
        cr_assert_eq(model_open(&m, path, err), 0, "%s", err);
        int16_t dims[16];
        profile_chunk_dims(m, 0, 0, CHUNKS_PLANE, dims);
        for (int j = 0; j < 8; j++) cr_expect(dims[2 * j] == 2 * j && dims[2 * j + 1] == 2 * j + 1);
        profile_chunk_dims(m, 1, 1, CHUNKS_ADJACENT, dims);
        /* hf dim x sits at canonical 2x (x < 8) or 2(x-8)+1 */
        for (int j = 0; j < 8; j++)
            for (int w = 0; w < 2; w++) {
                int x = 2 * j + w, want = x < 8 ? 2 * x : 2 * (x - 8) + 1;
                cr_expect_eq(dims[2 * j + w], want, "arch %d chunk %d", arch, j);
            }
        model_close(m);
        tiny_free(&t);
        tmpdir_remove(dir);
    }
}

/* Same inputs, same bytes; thread count does not matter. Loading what was saved gives it back. */
Test(calibrate, profile_deterministic_and_round_trips)
{
    tiny_model t;
    tiny_make(&t, &(tiny_spec){ .arch = TINY_LLAMA, .seed = 8 });
    char *dir = tmpdir_make(), path[600], p1[600], p2[600], err[FASA_ERRLEN];
    snprintf(path, sizeof path, "%s/t.gguf", dir);
    snprintf(p1, sizeof p1, "%s/a.json", dir);
    snprintf(p2, sizeof p2, "%s/b.json", dir);
    cr_assert_eq(tiny_write_gguf(&t, path, GGUF_TYPE_F32), 0);
    model *m;
    cr_assert_eq(model_open(&m, path, err), 0, "%s", err);
    int32_t ids[200];
    for (int i = 0; i < 200; i++) ids[i] = (i * 17 + 3) % t.s.n_vocab;
    calib_opts o = calib_defaults(m);
    o.n_prefill = 120;
    o.fcs = 2;
    o.rank_k = 64;
    profile a, b, c;
    omp_set_num_threads(1);
    cr_assert_eq(calibrate_run(m, ids, 200, &o, &a, err), 0, "%s", err);
    omp_set_num_threads(2);
    cr_assert_eq(calibrate_run(m, ids, 200, &o, &b, err), 0, "%s", err);
    cr_assert_eq(profile_save(&a, p1, err), 0, "%s", err);
    cr_assert_eq(profile_save(&b, p2, err), 0, "%s", err);
    char cmd[1300];
    snprintf(cmd, sizeof cmd, "cmp -s %s %s", p1, p2);
    cr_expect_eq(system(cmd), 0, "profiles differ between 1 and 2 threads");
    cr_assert_eq(profile_load(&c, p1, err), 0, "%s", err);
    cr_expect_eq(profile_check_model(&c, m, p1, err), 0, "%s", err);
    cr_expect_eq(memcmp(c.rank, a.rank, sizeof(int16_t) * a.n_layer * a.n_head * a.n_chunk), 0);
    cr_expect_eq(c.fcs, 2);
    for (size_t i = 0; i < (size_t)a.n_k * a.n_layer * a.n_head * a.n_chunk; i++)
        cr_expect(fabs(c.ca[i] - a.ca[i]) <= 5e-7);
    /* each head's ranking is by decreasing CA at rank_k */
    int ki = profile_k_index(&a, 64);
    for (int h = 0; h < a.n_head; h++) {
        const int16_t *r = profile_rank(&a, 1, h);
        for (int j = 1; j < a.n_chunk; j++)
            cr_expect_geq(profile_ca(&a, ki, 1, h)[r[j - 1]], profile_ca(&a, ki, 1, h)[r[j]]);
    }
    profile_free(&a); profile_free(&b); profile_free(&c);
    model_close(m);
    tiny_free(&t);
    tmpdir_remove(dir);
}

static void expect_load_fails(const char *dir, const char *content, const char *needle)
{
    char path[600], err[FASA_ERRLEN] = "";
    snprintf(path, sizeof path, "%s/bad.json", dir);
    FILE *f = fopen(path, "w");
    fputs(content, f);
    fclose(f);
    profile p;
    cr_expect_lt(profile_load(&p, path, err), 0, "loading '%s' succeeded", content);
    cr_expect(strstr(err, needle) != NULL, "'%s' lacks '%s'", err, needle);
    cr_expect(strstr(err, "bad.json") != NULL, "'%s' does not name the file", err);
}

Test(calibrate, bad_profiles)
{
    char *dir = tmpdir_make();
    expect_load_fails(dir, "{\"format\": \"fasa-profile\", \"version\": 1, \"model\": {", "not valid JSON");
    expect_load_fails(dir, "{\"format\": \"fasa-profile\", \"version\": 7}", "profile version 7");
    expect_load_fails(dir, "[1, 2]", "not a JSON object");
    expect_load_fails(dir, "{\"format\": \"other\"}", "not a fasa profile");
    expect_load_fails(
        dir,
        "{\"format\":\"fasa-profile\",\"version\":1,\"model\":{\"architecture\":\"llama\",\"n_layer\":1,"
        "\"n_head\":1,\"n_kv_head\":1,\"d_head\":2,\"qk_hash\":\"0000000000000001\"},\"chunks\":{\"definition\":"
        "\"plane\",\"count\":1},\"calibration\":{\"sample_hash\":\"0000000000000002\",\"n_tokens\":4,\"n_prefill\":2,"
        "\"n_steps\":2,\"k\":[1],\"rank_k\":1,\"fcs\":1},\"ca\":{\"1\":[[[NaN]]]}}",
        "not valid JSON");
    expect_load_fails(
        dir,
        "{\"format\":\"fasa-profile\",\"version\":1,\"model\":{\"architecture\":\"llama\",\"n_layer\":1,"
        "\"n_head\":1,\"n_kv_head\":1,\"d_head\":2,\"qk_hash\":\"0000000000000001\"},\"chunks\":{\"definition\":"
        "\"plane\",\"count\":1},\"calibration\":{\"sample_hash\":\"0000000000000002\",\"n_tokens\":4,\"n_prefill\":2,"
        "\"n_steps\":2,\"k\":[1],\"rank_k\":1,\"fcs\":1},\"ca\":{\"1\":[[[1.5]]]}}",
        "not a number in [0, 1]");
    tmpdir_remove(dir);
}

/* Found while fuzzing profiles (fuzz/fuzz_profile.c): a 440-byte header claiming 1024 layers x
 * 1024 heads x 512 chunks x 16 K values made the loader allocate 64 GiB before it looked at
 * the (absent) data; now the data's shape is checked first and the file fails as malformed. */
Test(calibrate, profile_dims_are_checked_before_allocating)
{
    char *dir = tmpdir_make();
    expect_load_fails(
        dir,
        "{\"format\":\"fasa-profile\",\"version\":1,\"model\":{\"architecture\":\"llama\","
        "\"n_layer\":1024,\"n_head\":1024,\"n_kv_head\":1,\"d_head\":1024,\"qk_hash\":"
        "\"0000000000000001\"},\"chunks\":{\"definition\":\"plane\",\"count\":512},\"calibration\":"
        "{\"sample_hash\":\"0000000000000002\",\"n_tokens\":4,\"n_prefill\":2,\"n_steps\":2,"
        "\"k\":[1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16],\"rank_k\":1,\"fcs\":1},\"ca\":{\"1\":[[[0.5]]]}}",
        "'ca' lacks K=1 for 1024 layers");
    tmpdir_remove(dir);
}

/* A profile calibrated on one model is refused for another. */
Test(calibrate, profile_for_another_model)
{
    tiny_model t1, t2;
    tiny_make(&t1, &(tiny_spec){ .arch = TINY_LLAMA, .seed = 30 });
    tiny_make(&t2, &(tiny_spec){ .arch = TINY_LLAMA, .seed = 31 });
    char *dir = tmpdir_make(), a[600], b[600], pp[600], err[FASA_ERRLEN];
    snprintf(a, sizeof a, "%s/a.gguf", dir);
    snprintf(b, sizeof b, "%s/b.gguf", dir);
    snprintf(pp, sizeof pp, "%s/a.profile.json", dir);
    cr_assert_eq(tiny_write_gguf(&t1, a, GGUF_TYPE_F32), 0);
    cr_assert_eq(tiny_write_gguf(&t2, b, GGUF_TYPE_F32), 0);
    model *ma, *mb;
    cr_assert_eq(model_open(&ma, a, err), 0);
    cr_assert_eq(model_open(&mb, b, err), 0);
    int32_t ids[100];
    for (int i = 0; i < 100; i++) ids[i] = i % t1.s.n_vocab;
    calib_opts o = calib_defaults(ma);
    o.n_prefill = 80;
    o.fcs = 2;
    o.rank_k = 64;
    profile p;
    cr_assert_eq(calibrate_run(ma, ids, 100, &o, &p, err), 0, "%s", err);
    cr_expect_eq(profile_check_model(&p, ma, pp, err), 0);
    cr_expect_lt(profile_check_model(&p, mb, pp, err), 0);
    cr_expect(strstr(err, "calibrated on other weights") != NULL, "%s", err);
    profile_free(&p);
    model_close(ma);
    model_close(mb);
    tiny_free(&t1);
    tiny_free(&t2);
    tmpdir_remove(dir);
}

static int key_desc(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? 1 : x > y ? -1 : 0;
}

/* idx[0..m) is the top k of s[0..n) by a full sort (all: n keys of scratch), ascending. */
static void expect_top_k(const float *s, int n, int k, const int32_t *idx, int m, uint64_t *all, const char *what)
{
    for (int i = 0; i < n; i++) all[i] = topk_pack(s[i], (uint32_t)i);
    qsort(all, n, sizeof *all, key_desc);
    cr_assert_eq(m, k, "%s: %d picked of %d", what, m, k);
    uint8_t *in = calloc(n, 1);
    for (int q = 0; q < k; q++) in[topk_index(all[q])] = 1;
    for (int q = 0; q < m; q++) {
        cr_assert(in[idx[q]], "%s: %d is not in the top k", what, idx[q]);
        if (q) cr_assert_gt(idx[q], idx[q - 1], "%s: not ascending", what);
    }
    free(in);
}

/* topk_indices (sampled threshold, histogram select, quickselect fallback) against a full sort:
 * smooth scores, heavy ties, a huge outlier that squeezes everything else into one bin, periodic
 * scores (every value many times over), a NaN, scores rising with the index, signed zeros
 * (-0 ranks below +0) among a few larger values, scores a few subnormals apart (the bins'
 * scale overflows: the histogram must step aside, not index out of its array), and a NaN right
 * after a huge value in the same vector lane (the lane's max must not lose the huge value). */
Test(calibrate, topk_indices_match_full_sort, .timeout = 60)
{
    uint64_t r = 77;
    const int sizes[] = { 2, 17, 248, 1000, 1024, 3073, 9220 };   /* short rows: a rerank's candidates */
    for (int si = 0; si < 7; si++) {
        const int n = sizes[si];
        float *s = malloc(sizeof(float) * n);
        int32_t *idx = malloc(sizeof(int32_t) * n);
        uint64_t *scratch = malloc(sizeof(uint64_t) * n), *all = malloc(sizeof(uint64_t) * n);
        for (int kind = 0; kind < 9; kind++) {
            for (int i = 0; i < n; i++)
                s[i] = kind == 1 ? (float)(int)(sampler_rand(&r) * 50) : sampler_rand(&r) * 8 - 4;
            if (kind == 2) s[n / 2] = 1e30f;
            if (kind == 3)   /* periodic scores, repeated many times, as a tiled benchmark cache has */
                for (int i = 0; i < n; i++) s[i] = i < 512 ? sampler_rand(&r) * 8 - 4 : s[i % 512];
            if (kind == 4) s[n / 3] = NAN;
            if (kind == 5)
                for (int i = 0; i < n; i++) s[i] = (float)i * 1e-3f;
            if (kind == 6)
                for (int i = 0; i < n; i++) s[i] = i % 97 == 0 ? (float)(i % 7) : sampler_rand(&r) < 0.5 ? -0.0f : 0.0f;
            if (kind == 7)
                for (int i = 0; i < n; i++) s[i] = ldexpf((float)(int)(sampler_rand(&r) * 5), -149);
            if (kind == 8 && n > 9) s[1] = 1e30f, s[9] = NAN;
            const int ks[] = { 1, 64, 256, n / 2, n - 1, n };
            for (int j = 0; j < 6; j++) {
                if (ks[j] < 1 || ks[j] > n) continue;
                const int k = ks[j], m = topk_indices(s, n, k, idx, scratch);
                char what[64];
                snprintf(what, sizeof what, "n=%d kind=%d k=%d", n, kind, k);
                expect_top_k(s, n, k, idx, m, all, what);
            }
        }
        free(s); free(idx); free(scratch); free(all);
    }
}

static int desc_float(const void *a, const void *b)
{
    const float x = *(const float *)a, y = *(const float *)b;
    return (x < y) - (x > y);
}

/* The budget that sets itself counts with topk_mass_cut: the fewest masses reaching a need.
 * Rows of softmax weights of spread scores, against a sort: for a need half way into the j-th
 * largest the cut keeps exactly the top j, and those are the masses at or above the bar; a need
 * of 0 keeps none, one above the total keeps all; masses tied at the cut all count. Rows long
 * enough that the cut compacts (a quarter of the row) and short ones. */
Test(calibrate, mass_cut_keeps_the_fewest_reaching_the_need, .timeout = 60)
{
    uint64_t r = 5;
    const int sizes[] = { 1, 15, 300, 4093, 16384 };
    for (int si = 0; si < 5; si++) {
        const int n = sizes[si];
        float *e = malloc(sizeof(float) * n), *sorted = malloc(sizeof(float) * n);
        float *buf = malloc(sizeof(float) * n);
        for (int sharp = 0; sharp < 3; sharp++) {   /* flat, peaked, very peaked softmax */
            for (int i = 0; i < n; i++) e[i] = (sampler_rand(&r) * 8 - 4) * (sharp ? 4 * sharp : 1);
            float mx = e[0];
            for (int i = 1; i < n; i++) mx = e[i] > mx ? e[i] : mx;
            for (int i = 0; i < n; i++) e[i] = expf(e[i] - mx) + 1e-30f;
            memcpy(sorted, e, sizeof(float) * n);
            double total = 0;
            for (int i = 0; i < n; i++) total += e[i];
            qsort(sorted, (size_t)n, sizeof(float), desc_float);
            const int js[] = { 1, 2, 10, n / 3, n - 1, n };
            for (int ji = 0; ji < 6; ji++) {
                const int j = js[ji];
                if (j < 1 || j > n || (j < n && sorted[j] == sorted[j - 1])) continue;
                double cum = 0;   /* the top j - 1, then half of the j-th */
                for (int i = 0; i < j - 1; i++) cum += sorted[i];
                const double need = cum + 0.5 * sorted[j - 1];
                if (0.5 * sorted[j - 1] < 1e-4 * cum) continue;   /* under float rounding */
                float bar;
                const int c = topk_mass_cut(e, n, total, need, &bar, buf);
                cr_expect_eq(c, j, "n %d, sharpness %d: the fewest reaching the top %d's mass are %d, not %d", n, sharp,
                             j, j, c);
                int above = 0;
                for (int i = 0; i < n; i++) above += e[i] >= bar;
                cr_expect_eq(above, c, "n %d: %d masses at or above the bar, counted %d", n, above, c);
                cr_expect(bar > (j < n ? sorted[j] : 0) && bar <= sorted[j - 1], "n %d: the bar %g is not between the "
                          "%d-th and the next", n, bar, j);
            }
            float bar;
            cr_expect_eq(topk_mass_cut(e, n, total, 0, &bar, buf), 0, "n %d: a need of 0 keeps nothing", n);
            cr_expect_eq(topk_mass_cut(e, n, total, total, &bar, buf), n, "n %d: a need of the total keeps all", n);
        }
        if (n >= 300) {   /* four masses tied at the cut: all four count */
            for (int i = 0; i < n; i++) e[i] = expf(-0.01f * (float)i);
            for (int i = 0; i < 4; i++) e[100 + i] = expf(-1.0f);
            double need = -0.5 * e[100], total = 0;   /* half way into the first tied one */
            for (int i = 0; i < 101; i++) need += e[i];
            for (int i = 0; i < n; i++) total += e[i];
            float bar;
            const int c = topk_mass_cut(e, n, total, need, &bar, buf);
            cr_expect_eq(c, 104, "n %d: the cut at four tied masses keeps %d, not 104", n, c);
        }
        free(e); free(sorted); free(buf);
    }
}

/* topk_at_least: the indices of the scores at or above a bar, in order, against a plain loop
 * (rows across the vector width and its tail). */
Test(calibrate, topk_at_least_keeps_order)
{
    uint64_t r = 9;
    for (int n = 0; n < 70; n += 7) {
        float x[70];
        int32_t idx[70];
        for (int i = 0; i < n; i++) x[i] = sampler_rand(&r) - 0.5f;
        const int k = topk_at_least(x, n, 0.0f, idx);
        int m = 0;
        for (int i = 0; i < n; i++)
            if (x[i] >= 0.0f) {
                cr_expect(m < k && idx[m] == i, "n %d: entry %d of those >= 0 is not %d", n, m, i);
                m++;
            }
        cr_expect_eq(k, m, "n %d: %d at or above 0, not %d", n, k, m);
    }
}

/* The sampled threshold at a low sample rank (k = 124 of 32,768: the guess is the second largest
 * of 256 samples) keeps fewer than k in about one row in eight; the guess is then lowered and the
 * pass repeated. 32 rows of smooth random scores, each against a full sort. */
Test(calibrate, topk_indices_lowered_guess_matches_full_sort, .timeout = 60)
{
    enum { N = 32768, K = 124 };
    uint64_t r = 4242;
    float *s = malloc(sizeof(float) * N);
    int32_t *idx = malloc(sizeof(int32_t) * N);
    uint64_t *scratch = malloc(sizeof(uint64_t) * N), *all = malloc(sizeof(uint64_t) * N);
    for (int row = 0; row < 32; row++) {
        for (int i = 0; i < N; i++) s[i] = sampler_rand(&r) + sampler_rand(&r) + sampler_rand(&r);
        const int m = topk_indices(s, N, K, idx, scratch);
        char what[32];
        snprintf(what, sizeof what, "row %d", row);
        expect_top_k(s, N, K, idx, m, all, what);
    }
    free(s); free(idx); free(scratch); free(all);
}

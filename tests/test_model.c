/* Tiny generated models: every load path against a double-precision reference forward pass. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fixtures.h"
#include "gguf.h"
#include "forward.h"
#include "model.h"
#include "session.h"

#define N_TOK 40

static void ids_for(int32_t *ids, int n, int vocab)
{
    for (int i = 0; i < n; i++) ids[i] = (i * 37 + 11) % vocab;
}

/* Runs the model over ids (in batches of `batch`) and returns (n, vocab) logits. */
static float *run_all(const char *path, const int32_t *ids, int n, int batch, int *vocab)
{
    char err[FASA_ERRLEN];
    model *m;
    int rc = model_open(&m, path, err);
    cr_assert_eq(rc, 0, "model_open(%s): %s", path, err);
    run_state *s = run_state_new(m, n > 256 ? n : 256, batch, err);
    cr_assert_not_null(s, "%s", err);
    *vocab = m->cfg.n_vocab;
    float *out = malloc(sizeof(float) * n * *vocab);
    for (int i = 0; i < n; i += batch) {
        int nb = n - i < batch ? n - i : batch;
        cr_assert_eq(model_forward(m, s, ids + i, nb, 1, err), 0, "%s", err);
        memcpy(out + (size_t)i * *vocab, s->logits, sizeof(float) * nb * *vocab);
    }
    run_state_free(s);
    model_close(m);
    return out;
}

/* max |a - ref| / max |ref| */
static double rel_diff(const float *a, const double *ref, size_t n)
{
    double md = 0, mr = 0;
    for (size_t i = 0; i < n; i++) {
        md = fmax(md, fabs(a[i] - ref[i]));
        mr = fmax(mr, fabs(ref[i]));
    }
    return md / mr;
}

static double rel_diff_ff(const float *a, const float *b, size_t n)
{
    double md = 0, mr = 0;
    for (size_t i = 0; i < n; i++) {
        md = fmax(md, fabs(a[i] - b[i]));
        mr = fmax(mr, fabs(b[i]));
    }
    return md / mr;
}

static void check_spec(const tiny_spec *spec)
{
    tiny_model t;
    tiny_make(&t, spec);
    char *dir = tmpdir_make();
    char gpath[600];
    snprintf(gpath, sizeof gpath, "%s/tiny.gguf", dir);
    cr_assert_eq(tiny_write_hf(&t, dir), 0);
    cr_assert_eq(tiny_write_gguf(&t, gpath, GGUF_TYPE_F32), 0);
    int32_t ids[N_TOK];
    ids_for(ids, N_TOK, t.s.n_vocab);
    double *ref = malloc(sizeof(double) * N_TOK * t.s.n_vocab);
    tiny_forward_ref(&t, ids, N_TOK, ref);
    int V;
    float *hf = run_all(dir, ids, N_TOK, 16, &V);
    float *gg = run_all(gpath, ids, N_TOK, 16, &V);
    double d_hf = rel_diff(hf, ref, (size_t)N_TOK * V), d_gg = rel_diff(gg, ref, (size_t)N_TOK * V);
    double d_both = rel_diff_ff(gg, hf, (size_t)N_TOK * V);
    cr_expect_lt(d_hf, 1e-5, "safetensors vs reference: %g", d_hf);
    cr_expect_lt(d_gg, 1e-5, "gguf vs reference: %g", d_gg);
    cr_expect_lt(d_both, 1e-5, "gguf vs safetensors: %g", d_both);
    /* one token at a time too: the decode paths (a sliding window's included) */
    float *one = run_all(gpath, ids, N_TOK, 1, &V);
    double d_one = rel_diff(one, ref, (size_t)N_TOK * V);
    cr_expect_lt(d_one, 1e-4, "gguf one token at a time vs reference: %g", d_one);
    free(ref); free(hf); free(gg); free(one);
    tiny_free(&t);
    tmpdir_remove(dir);
}

static void check_arch(enum tiny_arch arch, int tied)
{
    check_spec(&(tiny_spec){ .arch = arch, .tied = tied, .seed = 3 + arch });
}

Test(model, llama_hf_and_gguf_match_reference) { check_arch(TINY_LLAMA, 0); }
Test(model, qwen3_qk_norm_hf_and_gguf_match_reference) { check_arch(TINY_QWEN3, 1); }
/* Gemma 3: six layers, five local over a window of 8 tokens with RoPE base 10000, one global;
 * 40 tokens, so the window cuts in and the two bases differ */
Test(model, gemma3_hf_and_gguf_match_reference)
{
    check_spec(&(tiny_spec){ .arch = TINY_GEMMA3, .tied = 1, .seed = 21, .rope_theta = 1e6f });
}
/* A mistral-style window on every layer */
Test(model, mistral_sliding_window_matches_reference)
{
    check_spec(&(tiny_spec){ .arch = TINY_LLAMA, .seed = 22, .sliding_window = 6 });
}
Test(model, llama_tied_embeddings) { check_arch(TINY_LLAMA, 1); }
Test(model, qwen2_bias_hf_and_gguf_match_reference) { check_arch(TINY_QWEN2, 0); }

/* A GGUF whose q/k rows were not interleaved loads fine but must not match: the layout matters. */
Test(model, wrong_rope_layout_degrades)
{
    tiny_model t;
    tiny_make(&t, &(tiny_spec){ .arch = TINY_LLAMA, .seed = 5, .gguf_no_permute = 1 });
    char *dir = tmpdir_make();
    char gpath[600];
    snprintf(gpath, sizeof gpath, "%s/wrong.gguf", dir);
    cr_assert_eq(tiny_write_gguf(&t, gpath, GGUF_TYPE_F32), 0);
    int32_t ids[N_TOK];
    ids_for(ids, N_TOK, t.s.n_vocab);
    double *ref = malloc(sizeof(double) * N_TOK * t.s.n_vocab);
    tiny_forward_ref(&t, ids, N_TOK, ref);
    int V;
    float *gg = run_all(gpath, ids, N_TOK, 8, &V);
    double d = rel_diff(gg, ref, (size_t)N_TOK * V);
    cr_expect_gt(d, 1e-2, "a wrongly laid-out file matched the reference (%g)", d);
    free(ref); free(gg);
    tiny_free(&t);
    tmpdir_remove(dir);
}

/* Prefill in one batch, in odd batches, and one token at a time: the same numbers. */
Test(model, batch_sizes_agree)
{
    tiny_model t;
    tiny_make(&t, &(tiny_spec){ .arch = TINY_LLAMA, .seed = 9 });
    char *dir = tmpdir_make();
    cr_assert_eq(tiny_write_hf(&t, dir), 0);
    int32_t ids[N_TOK];
    ids_for(ids, N_TOK, t.s.n_vocab);
    int V;
    float *a = run_all(dir, ids, N_TOK, 64, &V);
    float *b = run_all(dir, ids, N_TOK, 7, &V);
    float *c = run_all(dir, ids, N_TOK, 1, &V);
    cr_expect_lt(rel_diff_ff(b, a, (size_t)N_TOK * V), 1e-6);
    cr_expect_lt(rel_diff_ff(c, a, (size_t)N_TOK * V), 1e-6);
    free(a); free(b); free(c);
    tiny_free(&t);
    tmpdir_remove(dir);
}

/* Past 2,048 cached tokens a prefill batch attends by key tiles under a running softmax (flash
 * attention's), without the statistics that need each query's weights: 2,200 tokens in batches
 * of 64 give the reference's logits, and those of one token at a time (which never takes it). */
Test(model, long_prefill_by_key_tiles_matches_reference, .timeout = 120)
{
    enum { N = 2200 };
    tiny_model t;
    tiny_make(&t, &(tiny_spec){ .arch = TINY_QWEN2, .seed = 12, .n_layer = 2 });
    char *dir = tmpdir_make(), path[600];
    snprintf(path, sizeof path, "%s/long.gguf", dir);
    cr_assert_eq(tiny_write_gguf(&t, path, GGUF_TYPE_F32), 0);
    int32_t *ids = malloc(sizeof *ids * N);
    ids_for(ids, N, t.s.n_vocab);
    double *ref = malloc(sizeof(double) * N * t.s.n_vocab);
    tiny_forward_ref(&t, ids, N, ref);
    int V;
    float *batched = run_all(path, ids, N, 64, &V), *one = run_all(path, ids, N, 1, &V);
    const size_t tail = (size_t)(N - 2048) * V;   /* the positions past the tiled path's start */
    const double d_ref = rel_diff(batched + (size_t)2048 * V, ref + (size_t)2048 * V, tail);
    const double d_one = rel_diff_ff(batched, one, (size_t)N * V);
    cr_expect_lt(d_ref, 1e-5, "tiled prefill vs reference: %g", d_ref);
    cr_expect_lt(d_one, 1e-5, "tiled prefill vs one token at a time: %g", d_one);
    free(ids), free(ref), free(batched), free(one);
    tiny_free(&t);
    tmpdir_remove(dir);
}

/* session_prefill with a progress callback runs the same batches one by one: every position's
 * logits are bit for bit those of one call, and the callback sees each batch's end. */
typedef struct progress_log { int calls, last, total, bad; } progress_log;

static void log_progress(void *ctx, int done, int total)
{
    progress_log *l = ctx;
    l->bad += done <= l->last || done > total || (l->total && total != l->total);
    l->calls++, l->last = done, l->total = total;
}

Test(model, prefill_progress_same_logits)
{
    enum { N = 100, BATCH = 16 };
    tiny_model t;
    tiny_make(&t, &(tiny_spec){ .arch = TINY_QWEN2, .seed = 13, .n_layer = 2 });
    char *dir = tmpdir_make(), path[600], err[FASA_ERRLEN];
    snprintf(path, sizeof path, "%s/p.gguf", dir);
    cr_assert_eq(tiny_write_gguf(&t, path, GGUF_TYPE_F32), 0);
    model *m;
    cr_assert_eq(model_open(&m, path, err), 0, "%s", err);
    int32_t ids[N];
    ids_for(ids, N, t.s.n_vocab);
    const size_t V = (size_t)m->cfg.n_vocab;
    float *logits[2];
    progress_log log = { 0 };
    for (int with = 0; with < 2; with++) {
        session_opts o = session_defaults();
        o.mode = FASA_MODE_FULL, o.n_ctx = N + 8, o.n_batch = BATCH;
        if (with) o.progress = log_progress, o.progress_ctx = &log;
        session *ss;
        cr_assert_eq(session_open(&ss, m, path, &o, err), 0, "%s", err);
        logits[with] = malloc(sizeof(float) * N * V);
        cr_assert_eq(session_prefill(ss, ids, N, logits[with], err), 0, "%s", err);
        session_close(ss);
    }
    cr_expect_eq(memcmp(logits[0], logits[1], sizeof(float) * N * V), 0, "logits differ with a progress callback");
    cr_expect_eq(log.calls, (N + BATCH - 1) / BATCH, "%d progress calls", log.calls);
    cr_expect(log.last == N && log.total == N && !log.bad, "progress ended at %d of %d (%d out of order)", log.last,
              log.total, log.bad);
    free(logits[0]), free(logits[1]);
    model_close(m);
    tiny_free(&t);
    tmpdir_remove(dir);
}

/* Quantised files: the forward pass on Q8_0 / Q4_1 weights stays near the f32 one. */
Test(model, quantized_gguf_close_to_f32)
{
    tiny_model t;
    tiny_make(&t, &(tiny_spec){ .arch = TINY_LLAMA, .seed = 4, .d_model = 64, .d_ff = 128 });
    char *dir = tmpdir_make();
    char p32[600], p8[600], p4[600];
    snprintf(p32, sizeof p32, "%s/f32.gguf", dir);
    snprintf(p8, sizeof p8, "%s/q8.gguf", dir);
    snprintf(p4, sizeof p4, "%s/q4.gguf", dir);
    cr_assert_eq(tiny_write_gguf(&t, p32, GGUF_TYPE_F32), 0);
    cr_assert_eq(tiny_write_gguf(&t, p8, GGUF_TYPE_Q8_0), 0);
    cr_assert_eq(tiny_write_gguf(&t, p4, GGUF_TYPE_Q4_1), 0);
    int32_t ids[16];
    ids_for(ids, 16, t.s.n_vocab);
    int V;
    float *a = run_all(p32, ids, 16, 16, &V), *b = run_all(p8, ids, 16, 16, &V), *c = run_all(p4, ids, 16, 16, &V);
    double d8 = rel_diff_ff(b, a, (size_t)16 * V), d4 = rel_diff_ff(c, a, (size_t)16 * V);
    cr_expect_lt(d8, 0.05, "q8_0 vs f32: %g", d8);
    cr_expect_lt(d4, 0.5, "q4_1 vs f32: %g", d4);
    cr_expect_gt(d4, d8, "q4_1 (%g) should be coarser than q8_0 (%g)", d4, d8);
    free(a); free(b); free(c);
    tiny_free(&t);
    tmpdir_remove(dir);
}

static void expect_open_fails(const char *path, const char *needle)
{
    char err[FASA_ERRLEN] = "";
    model *m = NULL;
    int rc = model_open(&m, path, err);
    cr_expect_lt(rc, 0, "opening %s should fail", path);
    cr_expect_null(m);
    cr_expect(strstr(err, needle) != NULL, "message '%s' lacks '%s'", err, needle);
    cr_expect(strchr(err, '\n') == NULL, "message has a newline: '%s'", err);
}

Test(model, bad_inputs_give_one_clear_line)
{
    expect_open_fails("/nonexistent/model.gguf", "/nonexistent/model.gguf");
    tiny_model t;
    tiny_make(&t, &(tiny_spec){ .arch = TINY_LLAMA, .seed = 2 });
    char *dir = tmpdir_make();
    cr_assert_eq(tiny_write_hf(&t, dir), 0);
    char path[600], cmd[1400];
    /* config.json claims more layers than the file has */
    snprintf(cmd, sizeof cmd, "sed -i 's/\"num_hidden_layers\": 2/\"num_hidden_layers\": 3/' %s/config.json", dir);
    cr_assert_eq(system(cmd), 0);
    expect_open_fails(dir, "missing tensor 'model.layers.2.self_attn.q_proj.weight'");
    /* config.json's dims disagree with the tensors */
    snprintf(cmd, sizeof cmd,
             "sed -i 's/\"num_hidden_layers\": 3/\"num_hidden_layers\": 2/; s/\"num_key_value_heads\": "
             "2/\"num_key_value_heads\": 4/' %s/config.json",
             dir);
    cr_assert_eq(system(cmd), 0);
    expect_open_fails(dir, "k_proj.weight' is 32 x 64 but the config implies 64 x 64");
    /* not JSON */
    snprintf(path, sizeof path, "%s/config.json", dir);
    FILE *f = fopen(path, "w");
    fputs("{\"model_type\": \"llama\", ", f);
    fclose(f);
    expect_open_fails(dir, "config.json': not a JSON object");
    /* an unknown architecture */
    f = fopen(path, "w");
    fputs("{\"model_type\": \"gpt_neox\"}", f);
    fclose(f);
    expect_open_fails(dir, "unsupported model_type 'gpt_neox'");
    /* a truncated GGUF */
    snprintf(path, sizeof path, "%s/t.gguf", dir);
    cr_assert_eq(tiny_write_gguf(&t, path, GGUF_TYPE_F32), 0);
    snprintf(cmd, sizeof cmd, "truncate -s 5000 %s", path);
    cr_assert_eq(system(cmd), 0);
    expect_open_fails(path, path);
    tiny_free(&t);
    tmpdir_remove(dir);
}

Test(model, rope_llama3_scaling_frequencies)
{
    model_config c = { .d_head = 128, .rope_theta = 500000, .rope_scaling = ROPE_SCALING_LLAMA3,
                       .rope_factor = 8, .rope_low_freq_factor = 1, .rope_high_freq_factor = 4,
                       .rope_orig_ctx = 8192 };
    float th[64];
    model_rope_freqs(&c, th);
    /* High frequencies (short wavelengths) are untouched, low ones divided by the factor. */
    cr_expect_float_eq(th[0], 1.0f, 1e-7);
    double base63 = pow(500000.0, -126.0 / 128);
    cr_expect(fabs(th[63] - base63 / 8) < 1e-6 * base63, "th[63] = %g", th[63]);
    for (int j = 1; j < 64; j++) cr_expect_leq(th[j], th[j - 1]);
}

/* Found by fuzz_config: config.json numbers were cast to int unchecked, undefined for 1e300,
 * -1e10 or 1e999 (inf); now the key is named in a format error. */
Test(model, config_numbers_outside_int_are_errors)
{
    static const char *const cases[][2] = {
        { "{\"model_type\":\"llama\",\"num_hidden_layers\":1e300}", "num_hidden_layers" },
        { "{\"model_type\":\"llama\",\"num_hidden_layers\":1,\"hidden_size\":1e999}", "hidden_size" },
        { "{\"model_type\":\"qwen2\",\"vocab_size\":-1e10}", "vocab_size" },
        { "{\"model_type\":\"llama\",\"max_position_embeddings\":2147483648}", "max_position_embeddings" },
        { "{\"model_type\":\"llama\",\"rope_scaling\":{\"rope_type\":\"llama3\","
          "\"original_max_position_embeddings\":4e9}}", "original_max_position_embeddings" },
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        model_config c;
        char err[FASA_ERRLEN] = "";
        int rc = model_config_parse(&c, cases[i][0], strlen(cases[i][0]), "config.json", err);
        cr_expect_eq(rc, FASA_EFORMAT, "%s: rc %d", cases[i][0], rc);
        cr_expect(strstr(err, cases[i][1]) && strstr(err, "out of range"), "%s: '%s'", cases[i][0], err);
    }
    /* the edges of the int range still load */
    model_config c;
    char err[FASA_ERRLEN];
    const char *ok = "{\"model_type\":\"llama\",\"max_position_embeddings\":2147483647.9,\"vocab_size\":-2147483648}";
    cr_expect_eq(model_config_parse(&c, ok, strlen(ok), "config.json", err), 0, "%s", err);
    cr_expect_eq(c.n_ctx_train, 2147483647);
    cr_expect_eq(c.n_vocab, -2147483647 - 1);
}

/* One token at a time past 1024 positions: decode attention split along the sequence (1, 2 and 4
 * parts, merged) stays on the double-precision reference. */
Test(model, split_decode_matches_reference, .timeout = 120)
{
    enum { N = 1100 };
    tiny_model t;
    tiny_make(&t, &(tiny_spec){ .arch = TINY_LLAMA, .seed = 12 });
    char *dir = tmpdir_make(), err[FASA_ERRLEN];
    cr_assert_eq(tiny_write_hf(&t, dir), 0);
    int32_t *ids = malloc(sizeof *ids * N);
    ids_for(ids, N, t.s.n_vocab);
    double *ref = malloc(sizeof(double) * N * t.s.n_vocab);
    tiny_forward_ref(&t, ids, N, ref);
    model *m;
    cr_assert_eq(model_open(&m, dir, err), 0, "%s", err);
    run_state *s = run_state_new(m, N, 1, err);
    cr_assert_not_null(s, "%s", err);
    const int V = m->cfg.n_vocab;
    float *out = malloc(sizeof(float) * N * V);
    for (int i = 0; i < N; i++) {
        cr_assert_eq(model_forward(m, s, ids + i, 1, 0, err), 0, "%s", err);
        memcpy(out + (size_t)i * V, s->logits, sizeof(float) * V);
    }
    double d = rel_diff(out, ref, (size_t)N * V);
    cr_expect_lt(d, 1e-5, "token-by-token decode vs reference: %g", d);
    run_state_free(s);
    model_close(m);
    free(out); free(ref); free(ids);
    tiny_free(&t);
    tmpdir_remove(dir);
}

/* Files that cannot describe their model: a gemma3 GGUF without its sliding window, a config
 * with a RoPE scaling fasa does not implement. One error line naming the file and the problem. */
Test(model, bad_architecture_inputs)
{
    tiny_model t;
    tiny_make(&t, &(tiny_spec){ .arch = TINY_GEMMA3, .seed = 23, .gguf_no_window = 1 });
    char *dir = tmpdir_make(), path[700], err[FASA_ERRLEN];
    snprintf(path, sizeof path, "%s/g.gguf", dir);
    cr_assert_eq(tiny_write_gguf(&t, path, GGUF_TYPE_F32), 0);
    model *m;
    cr_expect_lt(model_open(&m, path, err), 0);
    cr_expect(strstr(err, "g.gguf") && strstr(err, "gemma3.attention.sliding_window"), "%s", err);
    tiny_free(&t);
    tmpdir_remove(dir);
    model_config c;
    static const char yarn[] = "{\"model_type\": \"qwen2\", \"num_hidden_layers\": 2, \"hidden_size\": 64, "
                               "\"rope_scaling\": {\"rope_type\": \"yarn\", \"factor\": 4}}";
    cr_expect_lt(model_config_parse(&c, yarn, sizeof yarn - 1, "cfg.json", err), 0);
    cr_expect(strstr(err, "cfg.json") && strstr(err, "unsupported rope scaling 'yarn'"), "%s", err);
    static const char nowin[] = "{\"model_type\": \"gemma3_text\", \"num_hidden_layers\": 6, \"hidden_size\": 64}";
    cr_expect_lt(model_config_parse(&c, nowin, sizeof nowin - 1, "g.json", err), 0);
    cr_expect(strstr(err, "g.json") && strstr(err, "sliding_window"), "%s", err);
}

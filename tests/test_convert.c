/* fasa convert: FC-reordered models give the original's logits and fasa-c tokens, put every KV
 * head's dominant chunks first, export GGUF to the Hugging Face layout, and travel as verified,
 * reproducible .fasa bundles; nothing is left behind when a convert fails. */
#include <criterion/criterion.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <dirent.h>
#include <unistd.h>

#include "attention.h"
#include "bundle.h"
#include "calibrate.h"
#include "convert.h"
#include "fixtures.h"
#include "gguf.h"
#include "safetensors.h"

#define CV_PROMPT 150
#define CV_STEPS 64

typedef struct cenv {
    tiny_model t;
    char *dir;
    char src[600];       /* the original model file or directory */
    model *m;
    profile p;
    int32_t ids[300];
} cenv;

/* A tiny model written as GGUF (llama: interleaved q/k rows) or an HF directory, and its profile. */
static void cenv_open(cenv *e, enum tiny_arch arch, int gguf, int seed)
{
    char err[FASA_ERRLEN];
    /* odd seeds: tied embeddings (no lm_head) */
    tiny_make(&e->t, &(tiny_spec){ .arch = arch, .seed = seed, .n_layer = 3, .tied = seed % 2 });
    e->dir = tmpdir_make();
    if (gguf) {
        snprintf(e->src, sizeof e->src, "%s/t.gguf", e->dir);
        cr_assert_eq(tiny_write_gguf(&e->t, e->src, GGUF_TYPE_F32), 0);
    } else {
        snprintf(e->src, sizeof e->src, "%s/hf", e->dir);
        cr_assert_eq(mkdir(e->src, 0755), 0);
        cr_assert_eq(tiny_write_hf(&e->t, e->src), 0);
    }
    cr_assert_eq(model_open(&e->m, e->src, err), 0, "%s", err);
    fx_ids(e->ids, 300, e->t.s.n_vocab);
    fx_profile(e->m, e->ids, &e->p);
}

static void cenv_close(cenv *e)
{
    profile_free(&e->p);
    model_close(e->m);
    tiny_free(&e->t);
    tmpdir_remove(e->dir);
}

static void cenv_convert(cenv *e, const char *name, int reorder, int bundle, int zstd, int dtype, char *out, size_t cap)
{
    char err[FASA_ERRLEN];
    convert_opts o = convert_defaults();
    o.reorder = reorder;
    o.prof = &e->p;
    o.prof_path = "tiny profile";
    o.bundle = bundle;
    o.zstd = zstd;
    o.dtype = dtype;
    snprintf(out, cap, "%s/%s", e->dir, name);
    cr_assert_eq(convert_write(e->m, &o, out, err), 0, "%s", err);
    if (bundle && !strstr(name, ".fasa")) strncat(out, ".fasa", cap - strlen(out) - 1);
}

/* Logits of every position of ids[0..n) (n, vocab), in batches of 32. */
static float *cv_logits(const model *m, const int32_t *ids, int n)
{
    char err[FASA_ERRLEN];
    run_state *s = run_state_new(m, 256, 32, err);
    cr_assert_not_null(s, "%s", err);
    const int V = m->cfg.n_vocab;
    float *out = malloc(sizeof(float) * n * V);
    for (int i = 0; i < n; i += 32) {
        int nb = n - i < 32 ? n - i : 32;
        cr_assert_eq(model_forward(m, s, ids + i, nb, 1, err), 0, "%s", err);
        memcpy(out + (size_t)i * V, s->logits, sizeof(float) * nb * V);
    }
    run_state_free(s);
    return out;
}

/* Greedy decoding: dense prefill of the prompt, then CV_STEPS steps under pol (NULL: full).
 * Fills toks and returns the steps' logits (CV_STEPS, vocab). */
static float *cv_greedy(const model *m, policy *pol, const int32_t *prompt, int32_t *toks)
{
    char err[FASA_ERRLEN];
    run_state *s = run_state_new(m, CV_PROMPT + CV_STEPS + 1, 64, err);
    cr_assert_not_null(s, "%s", err);
    const int V = m->cfg.n_vocab;
    float *lg = malloc(sizeof(float) * CV_STEPS * V);
    for (int i = 0; i < CV_PROMPT; i += 64) {
        int nb = CV_PROMPT - i < 64 ? CV_PROMPT - i : 64;
        cr_assert_eq(model_forward(m, s, prompt + i, nb, 0, err), 0, "%s", err);
    }
    cr_assert_eq(attention_use_policy(s, pol, CV_PROMPT, err), 0, "%s", err);
    for (int k = 0; k < CV_STEPS; k++) {
        if (k) cr_assert_eq(model_forward(m, s, &toks[k - 1], 1, 0, err), 0, "%s", err);
        const float *l = s->logits;
        int best = 0;
        for (int v = 1; v < V; v++) if (l[v] > l[best]) best = v;
        toks[k] = best;
        memcpy(lg + (size_t)k * V, l, sizeof(float) * V);
    }
    run_state_free(s);
    return lg;
}

static void cv_write(const char *path, const void *buf, size_t len)
{
    FILE *f = fopen(path, "wb");
    cr_assert_not_null(f);
    cr_assert_eq(fwrite(buf, 1, len, f), len);
    fclose(f);
}

/* Names in dir, sorted and joined with spaces. */
static void cv_listing(const char *dir, char *out, size_t cap)
{
    struct dirent **names;
    int n = scandir(dir, &names, NULL, alphasort);
    out[0] = 0;
    for (int i = 0; i < n; i++) {
        if (strcmp(names[i]->d_name, ".") && strcmp(names[i]->d_name, "..")) {
            strncat(out, names[i]->d_name, cap - strlen(out) - 1);
            strncat(out, " ", cap - strlen(out) - 1);
        }
        free(names[i]);
    }
    free(names);
}

/* ---------------------------------------------------------------- reordering */

static void check_full_logits(enum tiny_arch arch, int gguf, int seed)
{
    cenv e;
    cenv_open(&e, arch, gguf, seed);
    char out[700], err[FASA_ERRLEN];
    cenv_convert(&e, "conv", 1, 0, 0, ST_F32, out, sizeof out);
    model *c;
    cr_assert_eq(model_open(&c, out, err), 0, "%s", err);
    cr_expect_eq(c->cfg.layout, ROPE_LAYOUT_PERMUTED);
    /* the order really moves chunks, so the comparison below means something */
    int moved = 0;
    for (int i = 0; i < e.p.n_layer * e.p.n_kv_head * e.p.n_chunk; i++) moved += c->chunk_order[i] != i % e.p.n_chunk;
    cr_expect_gt(moved, 0, "the profile's group ranks are all the identity");
    const size_t n = 200, V = e.m->cfg.n_vocab;
    float *a = cv_logits(e.m, e.ids, n), *b = cv_logits(c, e.ids, n);
    double d = fx_rel(b, a, n * V);
    cr_expect_leq(d, 1e-6, "converted vs original full-mode logits: max relative diff %g", d);
    /* the shipped profile matches the converted weights and has the same content */
    profile q;
    snprintf(out + strlen(out), sizeof out - strlen(out), "/profile.json");
    cr_assert_eq(profile_load(&q, out, err), 0, "%s", err);
    cr_expect_eq(profile_check_model(&q, c, out, err), 0, "%s", err);
    cr_expect_neq(q.qk_hash, e.p.qk_hash);
    cr_expect_eq(memcmp(q.group_rank, e.p.group_rank, sizeof(int16_t) * q.n_layer * q.n_kv_head * q.n_chunk), 0);
    cr_expect_eq(memcmp(q.rank, e.p.rank, sizeof(int16_t) * q.n_layer * q.n_head * q.n_chunk), 0);
    profile_free(&q);
    free(a); free(b);
    model_close(c);
    cenv_close(&e);
}

Test(convert, llama_gguf_full_logits_equal) { check_full_logits(TINY_LLAMA, 1, 60); }
Test(convert, llama_hf_full_logits_equal) { check_full_logits(TINY_LLAMA, 0, 61); }
Test(convert, qwen2_biases_full_logits_equal) { check_full_logits(TINY_QWEN2, 0, 62); }

Test(convert, fasa_c_greedy_tokens_equal, .timeout = 120)
{
    cenv e;
    cenv_open(&e, TINY_LLAMA, 1, 63);
    char out[700], pp[800], err[FASA_ERRLEN];
    cenv_convert(&e, "conv", 1, 0, 0, ST_F32, out, sizeof out);
    model *c;
    profile q;
    cr_assert_eq(model_open(&c, out, err), 0, "%s", err);
    snprintf(pp, sizeof pp, "%s/profile.json", out);
    cr_assert_eq(profile_load(&q, pp, err), 0, "%s", err);
    cr_assert_eq(profile_check_model(&q, c, pp, err), 0, "%s", err);
    policy pa, pb;
    policy_opts o = policy_defaults(POLICY_FASA, e.m, 24);
    o.prof = &e.p;
    o.fcs = 2;
    cr_assert_eq(policy_init(&pa, e.m, &o, err), 0, "%s", err);
    o.prof = &q;
    cr_assert_eq(policy_init(&pb, c, &o, err), 0, "%s", err);
    int32_t ta[CV_STEPS], tb[CV_STEPS], tf[CV_STEPS];
    float *la = cv_greedy(e.m, &pa, e.ids, ta), *lb = cv_greedy(c, &pb, e.ids, tb);
    float *lf = cv_greedy(e.m, NULL, e.ids, tf);
    int same = 0;
    for (int k = 0; k < CV_STEPS; k++) same += ta[k] == tb[k];
    cr_expect_eq(same, CV_STEPS, "fasa-c greedy tokens: %d of %d equal", same, CV_STEPS);
    const size_t V = e.m->cfg.n_vocab;
    /* sparse attention is really on (budget 24 of 150+ tokens): it moves the logits */
    double md = 0;
    for (size_t i = 0; i < CV_STEPS * V; i++) md = fmax(md, fabs(la[i] - lf[i]));
    cr_expect_gt(md, 1e-4, "fasa-c left the logits as full attention's");
    free(la); free(lb); free(lf);
    policy_free(&pa);
    policy_free(&pb);
    profile_free(&q);
    model_close(c);
    cenv_close(&e);
}

/* The first 2F canonical dims of every cached key are the group's top-F chunks, in rank order. */
Test(convert, dominant_chunks_come_first)
{
    cenv e;
    cenv_open(&e, TINY_LLAMA, 1, 65);
    char out[700], err[FASA_ERRLEN];
    cenv_convert(&e, "conv", 1, 0, 0, ST_F32, out, sizeof out);
    model *c;
    cr_assert_eq(model_open(&c, out, err), 0, "%s", err);
    const int d = c->cfg.d_head, half = d / 2;
    int16_t dims[1024], orig[1024];
    for (int l = 0; l < c->cfg.n_layer; l++)
        for (int g = 0; g < c->cfg.n_kv_head; g++) {
            const int16_t *r = profile_group_rank(&e.p, l, g);
            profile_chunk_dims(c, l, g, CHUNKS_PLANE, dims);
            profile_chunk_dims(e.m, l, g, CHUNKS_PLANE, orig);
            for (int k = 0; k < half; k++) {
                cr_expect_eq(dims[2 * r[k]], 2 * k, "layer %d KV head %d: chunk %d of rank %d at dim %d", l, g, r[k], k,
                             dims[2 * r[k]]);
                cr_expect_eq(dims[2 * r[k] + 1], 2 * k + 1);
            }
            /* the original model keeps chunk j at its frequency slot */
            for (int j = 0; j < half; j++) cr_expect_eq(orig[2 * j], 2 * j);
        }
    /* and the metadata names the order */
    char p[800];
    snprintf(p, sizeof p, "%s/model.safetensors", out);
    st_file f;
    cr_assert_eq(st_open(&f, p, err), 0, "%s", err);
    cr_expect_not_null(st_meta(&f, "fasa.chunk_order"));
    cr_expect_not_null(st_meta(&f, "fasa.profile_sample_hash"));
    cr_expect_str_eq(st_meta(&f, "format"), "pt");
    cr_expect_eq(st_find(&f, "lm_head.weight") == NULL, e.t.s.tied, "lm_head written %s tied embeddings",
                 e.t.s.tied ? "with" : "without");
    st_close(&f);
    model_close(c);
    cenv_close(&e);
}

/* ---------------------------------------------------------------- plain export */

static void check_to_hf(enum tiny_arch arch, int seed)
{
    cenv e;
    cenv_open(&e, arch, 1, seed);
    char out[700], ref[700], err[FASA_ERRLEN];
    cenv_convert(&e, "hf", 0, 0, 0, ST_F32, out, sizeof out);
    snprintf(ref, sizeof ref, "%s/ref", e.dir);
    cr_assert_eq(mkdir(ref, 0755), 0);
    cr_assert_eq(tiny_write_hf(&e.t, ref), 0);
    model *a, *b;
    cr_assert_eq(model_open(&a, out, err), 0, "%s", err);
    cr_assert_eq(model_open(&b, ref, err), 0, "%s", err);
    cr_expect_eq(a->cfg.layout, ROPE_LAYOUT_HF);
    /* the q/k rows are the Hugging Face ones again, bit for bit */
    const int D = e.t.s.d_model;
    for (int l = 0; l < e.t.s.n_layer; l++) {
        cr_expect_eq(memcmp(a->layers[l].wq.data, e.t.layers[l].wq, sizeof(float) * a->layers[l].wq.rows * D), 0,
                     "layer %d q", l);
        cr_expect_eq(memcmp(a->layers[l].wk.data, e.t.layers[l].wk, sizeof(float) * a->layers[l].wk.rows * D), 0,
                     "layer %d k", l);
    }
    const size_t n = 120, V = e.t.s.n_vocab;
    float *la = cv_logits(a, e.ids, n), *lb = cv_logits(b, e.ids, n);
    double d = fx_rel(la, lb, n * V);
    cr_expect_leq(d, 1e-6, "--to hf of the GGUF vs the HF original: %g", d);
    free(la); free(lb);
    model_close(a);
    model_close(b);
    cenv_close(&e);
}

Test(convert, to_hf_llama_gguf_equals_hf_original) { check_to_hf(TINY_LLAMA, 64); }
Test(convert, to_hf_qwen2_gguf_equals_hf_original) { check_to_hf(TINY_QWEN2, 66); }
/* q/k norms, and Gemma's (1 + w) norms, pre/post norms and window pattern in config.json */
Test(convert, to_hf_qwen3_gguf_equals_hf_original) { check_to_hf(TINY_QWEN3, 72); }
Test(convert, to_hf_gemma3_gguf_equals_hf_original) { check_to_hf(TINY_GEMMA3, 74); }

/* One q/k norm weight per layer: rows of different KV heads cannot take different orders. */
Test(convert, qk_norm_models_refuse_reordering)
{
    cenv e;
    cenv_open(&e, TINY_QWEN3, 1, 76);
    convert_opts o = convert_defaults();
    char out[700], err[FASA_ERRLEN];
    snprintf(out, sizeof out, "%s/r", e.dir);
    o.prof = &e.p;
    o.prof_path = "tiny profile";
    cr_expect_eq(convert_write(e.m, &o, out, err), FASA_EUNSUPPORTED, "%s", err);
    cr_expect(strstr(err, "cannot be reordered per KV head (use --to hf)") != NULL, "%s", err);
    struct stat st;
    cr_expect_neq(stat(out, &st), 0, "a refused convert left %s", out);
    cenv_close(&e);
}

Test(convert, half_precision_dtypes)
{
    cenv e;
    cenv_open(&e, TINY_LLAMA, 1, 67);
    const int dt[2] = { ST_BF16, ST_F16 };
    const char *names[2] = { "bf16", "f16" };
    const double tol[2] = { 3e-2, 5e-3 };
    const size_t n = 64, V = e.t.s.n_vocab;
    float *ref = cv_logits(e.m, e.ids, n);
    for (int i = 0; i < 2; i++) {
        char out[700], p[800], err[FASA_ERRLEN];
        cenv_convert(&e, names[i], 1, 0, 0, dt[i], out, sizeof out);
        snprintf(p, sizeof p, "%s/model.safetensors", out);
        st_file f;
        cr_assert_eq(st_open(&f, p, err), 0, "%s", err);
        cr_expect_eq(st_find(&f, "model.layers.0.self_attn.q_proj.weight")->dtype, (st_dtype)dt[i]);
        st_close(&f);
        model *c;
        cr_assert_eq(model_open(&c, out, err), 0, "%s", err);
        float *l = cv_logits(c, e.ids, n);
        double d = fx_rel(l, ref, n * V);
        cr_expect_leq(d, tol[i], "%s: %g", names[i], d);
        free(l);
        model_close(c);
    }
    free(ref);
    cenv_close(&e);
}

/* ---------------------------------------------------------------- bundles */

Test(convert, bundle_round_trip_and_reproducible, .timeout = 60)
{
    cenv e;
    cenv_open(&e, TINY_QWEN2, 0, 68);
    char dir[700], b1[700], b2[700], z1[700], z2[700], err[FASA_ERRLEN];
    cenv_convert(&e, "dir", 1, 0, 0, ST_F32, dir, sizeof dir);
    cenv_convert(&e, "one", 1, 1, 0, ST_F32, b1, sizeof b1);
    cenv_convert(&e, "two.fasa", 1, 1, 0, ST_F32, b2, sizeof b2);
    cenv_convert(&e, "z1", 1, 1, 1, ST_F32, z1, sizeof z1);
    cenv_convert(&e, "z2", 1, 1, 1, ST_F32, z2, sizeof z2);
    size_t n1, n2, nz1, nz2;
    char *x1 = fx_read(b1, &n1), *x2 = fx_read(b2, &n2), *y1 = fx_read(z1, &nz1), *y2 = fx_read(z2, &nz2);
    cr_assert(x1 && x2 && y1 && y2);
    cr_expect(n1 == n2 && !memcmp(x1, x2, n1), "two bundles of the same model differ");
    cr_expect(nz1 == nz2 && !memcmp(y1, y2, nz1), "two zstd bundles of the same model differ");
    cr_expect_lt(nz1, n1, "zstd did not compress (%zu vs %zu bytes)", nz1, n1);
    cr_expect_eq(memcmp(x1 + 257, "ustar", 5), 0, "not a ustar header");
    cr_expect_str_eq(x1, BUNDLE_MANIFEST, "the first member is '%s'", x1);
    struct stat st;
    cr_assert_eq(stat(b1, &st), 0);
    cr_expect_eq(st.st_mode & 0777, 0644);
    /* extracted members are the directory's files, byte for byte */
    char ex[700];
    snprintf(ex, sizeof ex, "%s/ex", e.dir);
    cr_assert_eq(mkdir(ex, 0755), 0);
    cr_assert_eq(bundle_open(z1, ex, err), 0, "%s", err);
    char la[1000], lb[1000];
    cv_listing(dir, la, sizeof la);
    cv_listing(ex, lb, sizeof lb);
    cr_expect_str_eq(lb, la);
    cr_expect_str_eq(la, "config.json model.safetensors profile.json ");
    static const char *const files[] = { "config.json", "model.safetensors", "profile.json" };
    for (int i = 0; i < 3; i++) {
        char p1[800], p2[800];
        size_t k1, k2;
        snprintf(p1, sizeof p1, "%s/%s", dir, files[i]);
        snprintf(p2, sizeof p2, "%s/%s", ex, files[i]);
        char *f1 = fx_read(p1, &k1), *f2 = fx_read(p2, &k2);
        cr_expect(f1 && f2 && k1 == k2 && !memcmp(f1, f2, k1), "'%s' differs after the round trip", files[i]);
        free(f1); free(f2);
    }
    /* model_open takes bundles; the logits are the directory's */
    model *a, *b, *z;
    cr_assert_eq(model_open(&a, dir, err), 0, "%s", err);
    cr_assert_eq(model_open(&b, b1, err), 0, "%s", err);
    cr_assert_eq(model_open(&z, z1, err), 0, "%s", err);
    cr_expect_str_eq(b->name, "one");
    cr_expect_eq(b->cfg.layout, ROPE_LAYOUT_PERMUTED);
    const size_t n = 50, V = e.t.s.n_vocab;
    float *l1 = cv_logits(a, e.ids, n), *l2 = cv_logits(b, e.ids, n), *l3 = cv_logits(z, e.ids, n);
    cr_expect_eq(memcmp(l1, l2, sizeof(float) * n * V), 0);
    cr_expect_eq(memcmp(l1, l3, sizeof(float) * n * V), 0);
    free(l1); free(l2); free(l3);
    model_close(a); model_close(b); model_close(z);
    /* a bundle converts again (its source files are read back from the bundle) */
    convert_opts o = convert_defaults();
    o.reorder = 0;
    char back[700];
    snprintf(back, sizeof back, "%s/back", e.dir);
    cr_assert_eq(model_open(&b, b1, err), 0, "%s", err);
    cr_expect_eq(convert_write(b, &o, back, err), 0, "%s", err);
    model_close(b);
    /* ... and back in the Hugging Face layout it is the original, bit for bit */
    cr_assert_eq(model_open(&b, back, err), 0, "%s", err);
    float *lo = cv_logits(e.m, e.ids, n), *lbk = cv_logits(b, e.ids, n);
    cr_expect_eq(memcmp(lo, lbk, sizeof(float) * n * V), 0, "reordered and back differs from the original");
    cr_expect_eq(profile_model_hash(b), e.p.qk_hash);
    free(lo); free(lbk);
    model_close(b);
    free(x1); free(x2); free(y1); free(y2);
    cenv_close(&e);
}

static void expect_bundle_error(const char *path, const char *needle)
{
    char err[FASA_ERRLEN] = "", dir[4096];
    model *m;
    cr_expect_lt(bundle_open(path, NULL, err), 0, "bundle_open('%s') accepted a bad bundle", path);
    cr_expect(strstr(err, path) != NULL, "'%s' does not name the bundle", err);
    cr_expect(strstr(err, needle) != NULL, "'%s' lacks '%s'", err, needle);
    cr_expect(strchr(err, '\n') == NULL, "'%s' is not one line", err);
    err[0] = 0;
    cr_expect_lt(model_open(&m, path, err), 0);
    cr_expect(strstr(err, needle) != NULL, "model_open: '%s' lacks '%s'", err, needle);
    /* nothing is left in the temporary directory */
    cr_expect_lt(bundle_extract_temp(path, dir, sizeof dir, err), 0);
}

Test(convert, corrupted_bundles_fail_with_one_line, .timeout = 60)
{
    cenv e;
    cenv_open(&e, TINY_LLAMA, 1, 69);
    char b[700], p[800], err[FASA_ERRLEN];
    cenv_convert(&e, "good", 1, 1, 0, ST_F32, b, sizeof b);
    cr_assert_eq(bundle_open(b, NULL, err), 0, "%s", err);
    size_t n;
    char *good = fx_read(b, &n);
    /* offset of the weights' tar header */
    size_t hdr = 0;
    for (size_t off = 0; off + 512 <= n; off += 512)
        if (!strcmp(good + off, "model.safetensors")) { hdr = off; break; }
    cr_assert_gt(hdr, 0);
    char *bad = malloc(n);

    memcpy(bad, good, n);
    bad[hdr + 512 + 5000] ^= 0x10;   /* one bit of a weight */
    snprintf(p, sizeof p, "%s/flip.fasa", e.dir);
    cv_write(p, bad, n);
    expect_bundle_error(p, "member 'model.safetensors' is corrupt");

    snprintf(p, sizeof p, "%s/cut.fasa", e.dir);
    cv_write(p, good, hdr + 512 + 3000);   /* ends inside the weights */
    expect_bundle_error(p, "truncated");

    snprintf(p, sizeof p, "%s/short.fasa", e.dir);
    cv_write(p, good, hdr);   /* ends before the weights' header */
    expect_bundle_error(p, "'model.safetensors' listed in the manifest is missing");

    snprintf(p, sizeof p, "%s/junk.fasa", e.dir);
    cv_write(p, "this is not a tar file at all, just some words that go on for a while ...", 70);
    expect_bundle_error(p, "not a fasa bundle");

    /* a member the manifest does not list: rename one inside the tar (fixing its header sum) */
    memcpy(bad, good, n);
    memcpy(bad + hdr, "model.safetensorz", 17);
    unsigned sum = 0;
    memset(bad + hdr + 148, ' ', 8);
    for (int i = 0; i < 512; i++) sum += (unsigned char)bad[hdr + i];
    snprintf(bad + hdr + 148, 8, "%06o", sum);
    snprintf(p, sizeof p, "%s/extra.fasa", e.dir);
    cv_write(p, bad, n);
    expect_bundle_error(p, "'model.safetensorz' is not in the manifest");

    /* a manifest that lies about a size */
    memcpy(bad, good, n);
    char *sz = strstr(bad + 512, "\"size\":");
    cr_assert_not_null(sz);
    sz[7] = sz[7] == '9' ? '8' : sz[7] + 1;
    snprintf(p, sizeof p, "%s/size.fasa", e.dir);
    cv_write(p, bad, n);
    expect_bundle_error(p, "the manifest says");

    snprintf(p, sizeof p, "%s/none.fasa", e.dir);
    char m2[FASA_ERRLEN];
    cr_expect_lt(bundle_open(p, NULL, m2), 0);
    cr_expect(strstr(m2, "cannot open") != NULL, "%s", m2);
    free(good);
    free(bad);
    cenv_close(&e);
}

/* Found while writing fuzz_bundle: the reader enabled every libarchive filter, so a file with an
 * lrzip (or grzip, lzop, ...) magic made fasa try to run that program on it. Only tar and zstd,
 * what bundle_write makes, are read now; other compressions are not a bundle. */
Test(convert, bundle_reader_runs_no_external_programs)
{
    static const struct { char magic[16]; const char *name; } magics[] = {
        { "LRZI\0\x06", "lrzip" }, { "GRZipII\0\x02\x04:)", "grzip" },
        { "\x89LZO\0\r\n\x1a\n", "lzop" }, { "\x1f\x8b\x08\0", "gzip" },
    };
    char *dir = tmpdir_make();
    for (size_t i = 0; i < sizeof magics / sizeof *magics; i++) {
        char p[600], data[1024] = { 0 }, err[FASA_ERRLEN] = "";
        memcpy(data, magics[i].magic, sizeof magics[i].magic);
        snprintf(p, sizeof p, "%s/%s.fasa", dir, magics[i].name);
        cv_write(p, data, sizeof data);
        cr_expect_lt(bundle_open(p, NULL, err), 0, "%s accepted", p);
        cr_expect(strstr(err, "not a fasa bundle") != NULL, "'%s'", err);
        cr_expect(strstr(err, "program") == NULL, "%s: '%s'", magics[i].name, err);
    }
    tmpdir_remove(dir);
}

/* ---------------------------------------------------------------- failures leave nothing */

static void expect_convert_fails(cenv *e, convert_opts *o, const char *out, const char *needle)
{
    char err[FASA_ERRLEN] = "", before[4000], after[4000];
    cv_listing(e->dir, before, sizeof before);
    cr_expect_lt(convert_write(e->m, o, out, err), 0, "convert to '%s' succeeded", out);
    cr_expect(strstr(err, needle) != NULL, "'%s' lacks '%s'", err, needle);
    cr_expect(strchr(err, '\n') == NULL, "'%s' is not one line", err);
    cv_listing(e->dir, after, sizeof after);
    cr_expect_str_eq(after, before, "a failed convert left files behind");
}

Test(convert, failed_convert_leaves_nothing, .timeout = 60)
{
    cenv e;
    cenv_open(&e, TINY_LLAMA, 1, 70);
    char out[800], err[FASA_ERRLEN];
    convert_opts o = convert_defaults();
    o.prof = &e.p;
    o.prof_path = "tiny profile";

    /* the output's parent is a file */
    snprintf(out, sizeof out, "%s/t.gguf/out", e.dir);
    expect_convert_fails(&e, &o, out, "cannot create");

    /* the disk fills up while the weights are written (file size limit: EFBIG) */
    char conv[700], p[800];
    cenv_convert(&e, "fits", 1, 0, 0, ST_F32, conv, sizeof conv);
    struct stat st;
    snprintf(p, sizeof p, "%s/model.safetensors", conv);
    cr_assert_eq(stat(p, &st), 0);
    struct rlimit old, lim;
    getrlimit(RLIMIT_FSIZE, &old);
    signal(SIGXFSZ, SIG_IGN);
    lim = old;
    lim.rlim_cur = 40000;
    cr_assert_eq(setrlimit(RLIMIT_FSIZE, &lim), 0);
    snprintf(out, sizeof out, "%s/full", e.dir);
    expect_convert_fails(&e, &o, out, "cannot write");
    o.bundle = 1;
    expect_convert_fails(&e, &o, out, "cannot write");
    /* room for every file, but not for the bundle holding them */
    lim.rlim_cur = (rlim_t)st.st_size + 1024;
    cr_assert_eq(setrlimit(RLIMIT_FSIZE, &lim), 0);
    expect_convert_fails(&e, &o, out, "cannot write");
    o.bundle = 0;
    cr_assert_eq(setrlimit(RLIMIT_FSIZE, &old), 0);

    /* an existing non-empty directory is left alone; an empty one is replaced */
    expect_convert_fails(&e, &o, conv, "exists and is not empty");
    snprintf(out, sizeof out, "%s/empty", e.dir);
    cr_assert_eq(mkdir(out, 0755), 0);
    cr_expect_eq(convert_write(e.m, &o, out, err), 0, "%s", err);

    /* bad options and profiles */
    o.dtype = ST_I32;
    snprintf(out, sizeof out, "%s/x", e.dir);
    expect_convert_fails(&e, &o, out, "dtype I32");
    o.dtype = ST_F32;
    o.prof = NULL;
    expect_convert_fails(&e, &o, out, "needs a profile");
    profile other = e.p;
    other.qk_hash ^= 1;
    o.prof = &other;
    expect_convert_fails(&e, &o, out, "calibrated on other weights");
    other.qk_hash = e.p.qk_hash;
    other.chunks = CHUNKS_ADJACENT;
    expect_convert_fails(&e, &o, out, "plane profile");
    cenv_close(&e);
}

/* ---------------------------------------------------------------- the command */

Test(convert, command_line, .timeout = 120)
{
    cenv e;
    cenv_open(&e, TINY_LLAMA, 1, 71);
    char prof[700], ids[700], args[4000], err[FASA_ERRLEN];
    snprintf(prof, sizeof prof, "%s/t.profile.json", e.dir);
    cr_assert_eq(profile_save(&e.p, prof, err), 0, "%s", err);
    snprintf(ids, sizeof ids, "%s/ids.txt", e.dir);
    FILE *f = fopen(ids, "w");
    for (int i = 0; i < CV_PROMPT; i++) fprintf(f, "%d ", e.ids[i]);
    fclose(f);
    char *out, *er, *o2, *e2;
    /* the profile beside the model is the default */
    snprintf(args, sizeof args, "convert %s -o %s/c --bundle --zstd --json", e.src, e.dir);
    cr_assert_eq(fx_fasa(args, &out, &er), 0, "%s", er);
    cr_expect(strstr(out, "\"reordered\":\ttrue") != NULL, "%s", out);
    free(out); free(er);
    /* fasa-c on the bundle (with its own profile) gives the original's greedy tokens */
    snprintf(args, sizeof args, "run %s --ids %s -n 40 --print-ids --mode fasa-c --budget 24 -p %s", e.src, ids, prof);
    cr_assert_eq(fx_fasa(args, &out, &er), 0, "%s", er);
    char ex[700];
    snprintf(ex, sizeof ex, "%s/ex", e.dir);
    cr_assert_eq(mkdir(ex, 0755), 0);
    snprintf(args, sizeof args, "%s/c.fasa", e.dir);
    cr_assert_eq(bundle_open(args, ex, err), 0, "%s", err);
    snprintf(args, sizeof args, "run %s/c.fasa --ids %s -n 40 --print-ids --mode fasa-c --budget 24 -p %s/profile.json",
             e.dir, ids, ex);
    cr_assert_eq(fx_fasa(args, &o2, &e2), 0, "%s", e2);
    cr_expect_str_eq(o2, out);
    cr_expect_gt(strlen(out), 40);
    free(out); free(er); free(o2); free(e2);
    /* run --json names the mode that ran: the default with a profile is fasa-c */
    static const char *const modes[][2] = { { "", "fasa-c" }, { "--mode full", "full" }, { "--mode fasa-c", "fasa-c" },
                                            { "--mode fasa-m", "fasa-m" } };
    for (int i = 0; i < 4; i++) {
        snprintf(args, sizeof args, "run %s --ids %s -n 4 --json --budget 24 -p %s %s", e.src, ids, prof, modes[i][0]);
        cr_assert_eq(fx_fasa(args, &out, &er), 0, "%s", er);
        char want[64];
        snprintf(want, sizeof want, "\"mode\":\t\"%s\"", modes[i][1]);
        cr_expect(strstr(out, want) != NULL, "'fasa %s' printed %s", args, out);
        free(out); free(er);
    }
    /* bench finds the bundle's own profile as run does: fasa is a known policy without -p (the
     * tiny model then stops at its missing tokenizer, after the policies are made) */
    snprintf(args, sizeof args, "bench %s/c.fasa --task ppl --policy full,fasa --budget 24 --context 64", e.dir);
    cr_expect_eq(fx_fasa(args, &out, &er), 2);
    cr_expect(strstr(er, "needs a model with a tokenizer") != NULL, "%s", er);
    free(out); free(er);
    /* --to hf needs no profile */
    snprintf(args, sizeof args, "convert %s --to hf -o %s/h --dtype bf16", e.src, e.dir);
    cr_assert_eq(fx_fasa(args, &out, &er), 0, "%s", er);
    free(out); free(er);
    /* errors: one line, nothing written */
    static const struct { const char *args, *needle; } bad[] = {
        { "convert %s -o %s/y --dtype f8", "option '--dtype' must be f32, f16 or bf16" },
        { "convert %s -o %s/y --to onnx", "option '--to' must be fasa or hf" },
        { "convert %s -o %s/y --zstd", "'--zstd' needs '--bundle'" },
        { "convert %s -o %s/y -p /nonexistent.json", "cannot open '/nonexistent.json'" },
        { "convert %s -o %s/c.fasa/y --to hf", "cannot create" },
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        snprintf(args, sizeof args, bad[i].args, e.src, e.dir);
        int rc = fx_fasa(args, &out, &er);
        cr_expect(rc != 0 && rc < 128, "'fasa %s' gave %d", args, rc);
        cr_expect(strstr(er, bad[i].needle) != NULL, "'fasa %s': '%s' lacks '%s'", args, er, bad[i].needle);
        cr_expect(!strncmp(er, "fasa: ", 6) && strchr(er, '\n') == strrchr(er, '\n'), "'%s'", er);
        char y[800];
        snprintf(y, sizeof y, "%s/y", e.dir);
        cr_expect_neq(access(y, F_OK), 0, "'fasa %s' left '%s'", args, y);
        free(out); free(er);
    }
    snprintf(args, sizeof args, "convert %s -o %s/y --to hf --help", e.src, e.dir);
    cr_expect_eq(fx_fasa(args, &out, &er), 0);
    cr_expect(strstr(out, "usage: fasa convert") != NULL);
    free(out); free(er);
    cenv_close(&e);
}

/* ---------------------------------------------------------------- the real model */

static const char *cv_real_model(void)
{
    static char path[1024];
    const char *env = getenv("FASA_MODEL");
    if (env && access(env, R_OK) == 0) return env;
    const char *bin = fx_bin(), *slash = strrchr(bin, '/');
    snprintf(path, sizeof path, "%.*s/../models/SmolLM2-135M-Instruct.Q4_1.gguf", slash ? (int)(slash - bin) : 1,
             slash ? bin : ".");
    return access(path, R_OK) == 0 ? path : NULL;
}

/* The converted bundle of the default model decodes the original's greedy tokens, full and
 * fasa-c, from a text prompt (so its generated tokenizer.json tokenises as the GGUF does). */
Test(convert, real_model_bundle_decodes_the_same, .timeout = 900)
{
    const char *m = cv_real_model();
    if (!m)
        cr_skip_test("convert::real_model_bundle_decodes_the_same: default model not installed (run scripts/setup.sh)");
    char prof[1100];
    profile_default_path(m, prof, sizeof prof);
    if (access(prof, R_OK) != 0) cr_skip_test("convert::real_model_bundle_decodes_the_same: no profile at '%s'", prof);
    char *dir = tmpdir_make(), args[4000], bundle[700], ex[700], err[FASA_ERRLEN];
    char *out, *er, *o2, *e2;
    snprintf(bundle, sizeof bundle, "%s/smol.fasa", dir);
    snprintf(ex, sizeof ex, "%s/ex", dir);
    /* f32: the reordering is exact, so the logits below must agree to float rounding (the default
     * for this quantised source is f16, checked first) */
    snprintf(args, sizeof args, "convert %s -p %s -o %s/d16 --json", m, prof, dir);
    cr_assert_eq(fx_fasa(args, &out, &er), 0, "%s", er);
    cr_expect(strstr(out, "\"dtype\":\t\"f16\"") != NULL, "a quantised source converts to f16 by default: %s", out);
    free(out); free(er);
    snprintf(args, sizeof args, "convert %s -p %s -o %s --dtype f32", m, prof, bundle);
    cr_assert_eq(fx_fasa(args, &out, &er), 0, "%s", er);
    free(out); free(er);
    cr_assert_eq(mkdir(ex, 0755), 0);
    cr_assert_eq(bundle_open(bundle, ex, err), 0, "%s", err);
    static const char *const modes[] = { "full", "fasa-c" };
    /* about 220 prompt tokens and 32 generated, budget 128: sparse from the first step, and small
     * enough that the seven runs fit the timeout under AddressSanitizer (make sanitize) */
    const char *prompt = "\"$(head -c 1000 /usr/share/common-licenses/GPL-3)\"";
    for (int i = 0; i < 2; i++) {
        snprintf(args, sizeof args, "run %s --raw -n 32 --ignore-eos --print-ids --mode %s --budget 128 -p %s %s",
                 m, modes[i], prof, prompt);
        cr_assert_eq(fx_fasa(args, &out, &er), 0, "%s", er);
        snprintf(args, sizeof args,
                 "run %s --raw -n 32 --ignore-eos --print-ids --mode %s --budget 128 -p %s/profile.json %s", bundle,
                 modes[i], ex, prompt);
        cr_assert_eq(fx_fasa(args, &o2, &e2), 0, "%s", e2);
        cr_expect_gt(strlen(out), 32);
        cr_expect_str_eq(o2, out, "%s: the bundle's greedy tokens differ from the original's", modes[i]);
        free(out); free(er); free(o2); free(e2);
    }
    /* without -p, bench takes the bundle's own profile too: fasa runs and differs from full */
    snprintf(args, sizeof args, "bench %s --task ppl --context 512 --steps 32 --budget 64 --policy full,fasa --json %s",
             bundle, "/usr/share/common-licenses/GPL-3");
    cr_assert_eq(fx_fasa(args, &out, &er), 0, "%s", er);
    cr_expect(strstr(out, "\"policy\":\t\"fasa\"") != NULL, "%s", out);
    free(out); free(er);
    /* without -p, run takes the bundle's own profile */
    snprintf(args, sizeof args, "run %s --raw -n 2 %s", bundle, prompt);
    cr_assert_eq(fx_fasa(args, &out, &er), 0, "%s", er);
    cr_expect(strstr(er, "fasa-c (profile '") && strstr(er, ".fasa (profile.json)'"), "%s", er);
    free(out); free(er);
    /* full-mode logits of every prompt position: the bundle against the original with its key
     * dims in the same (profile) order, so float sums run in the same order */
    char la[800], lb[800];
    snprintf(la, sizeof la, "%s/a.f32", dir);
    snprintf(lb, sizeof lb, "%s/b.f32", dir);
    snprintf(args, sizeof args, "run %s --mode full -p %s --order-chunks --raw -n 0 --dump-logits %s %s", m, prof, la,
             prompt);
    cr_assert_eq(fx_fasa(args, &out, &er), 0, "%s", er);
    free(out); free(er);
    snprintf(args, sizeof args, "run %s --mode full --raw -n 0 --dump-logits %s %s", bundle, lb, prompt);
    cr_assert_eq(fx_fasa(args, &out, &er), 0, "%s", er);
    free(out); free(er);
    size_t na, nb;
    char *a = fx_read(la, &na), *b = fx_read(lb, &nb);
    cr_assert(a && b && na == nb && na > 0);
    double d = fx_rel((const float *)b, (const float *)a, na / sizeof(float));
    cr_expect_leq(d, 1e-6, "converted vs original full-mode logits: max relative difference %g", d);
    free(a); free(b);
    tmpdir_remove(dir);
}

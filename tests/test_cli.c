/* End-to-end: the fasa binary on tiny generated models, on bad input, and on the real model
 * when setup has installed it. FASA_BIN names the binary (make test sets it). */
#include <cjson/cJSON.h>
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "expect_cli.h"
#include "fixtures.h"
#include "gguf.h"

Test(cli, usage_and_bad_flags)
{
    char *out, *err;
    cr_expect_eq(fx_fasa("", &out, &err), 2);
    cr_expect(strstr(err, "usage: fasa") != NULL);
    free(out); free(err);
    cr_expect_eq(fx_fasa("run --help", &out, &err), 0);
    cr_expect(strstr(out, "--mode") != NULL);
    free(out); free(err);
    expect_one_line_error("frobnicate", "'frobnicate' is not a fasa command");
    expect_one_line_error("run /nonexistent/m.gguf hi", "cannot open '/nonexistent/m.gguf'");
    expect_one_line_error("run -m /nonexistent/m.gguf -n abc hi", "option '--n-predict' needs an integer");
    expect_one_line_error("run -m /nonexistent/m.gguf --dense-budget 0x hi", "option '--dense-budget' needs N tokens");
    expect_one_line_error("bench /nonexistent/m.gguf --task speed --dense-budget 4y", "not '4y'");
    expect_one_line_error("run -m /nonexistent/m.gguf --tail maybe hi",
                          "--tail takes on, off, blocks or mean, not 'maybe'");
    expect_one_line_error("bench /nonexistent/m.gguf --task speed --tail 1",
                          "--tail takes on, off, blocks or mean, not '1'");
    expect_one_line_error("bench /nonexistent/m.gguf --task speed --recent x",
                          "option '--recent' needs an integer");
    expect_one_line_error("inspect /nonexistent/dir", "cannot open '/nonexistent/dir'");
    expect_one_line_error("bench /nonexistent/m.gguf --task ca", "cannot open '/nonexistent/m.gguf'");
    expect_one_line_error("calibrate /nonexistent/m.gguf", "cannot open");
}

/* One rule for every command (fx_fasa(1), EXIT STATUS): 2 for a command line that cannot work, 1 for
 * a valid one that fails, each with one "fasa: " line. None of these reads a model. */
Test(cli, exit_status_rule)
{
    static const struct { const char *args; int rc; } cases[] = {
        { "frobnicate", 2 },
        { "help nosuch", 2 },
        { "run -m /nonexistent/m.gguf -n abc hi", 2 },
        { "run -m /nonexistent/m.gguf --mode bogus hi", 2 },
        { "run -m /nonexistent/m.gguf one two", 2 },
        { "calibrate /nonexistent/m.gguf --chunks diagonal", 2 },
        { "calibrate /nonexistent/m.gguf --k 128,64", 2 },
        { "calibrate /nonexistent/m.gguf --tokens 300 --prefill 300", 2 },
        { "convert /nonexistent/m.gguf", 2 },
        { "convert /nonexistent/m.gguf -o x --dtype f8", 2 },
        { "convert /nonexistent/m.gguf -o x --zstd", 2 },
        { "bench /nonexistent/m.gguf --task nosuch", 2 },
        { "bench /nonexistent/m.gguf --task ca --budget 1,x", 2 },
        { "bench /nonexistent/m.gguf --task ca --k 256,64", 2 },
        { "run -m /nonexistent/m.gguf --device gpu hi", 2 },
        { "run -m /nonexistent/m.gguf --kv-type f8 hi", 2 },
        { "run -m /nonexistent/m.gguf --dense-budget 2000x hi", 2 },
        { "run -m /nonexistent/m.gguf --dense 3,x hi", 2 },
        { "run -m /nonexistent/m.gguf --device cuda --kv-type f16 hi", 2 },
        { "bench /nonexistent/m.gguf --task ppl --kv-type bf16", 2 },
        { "bench /nonexistent/m.gguf --task ca --kv-type f16", 2 },
        { "bench /nonexistent/m.gguf --task speed --repeats 0", 2 },
        { "bench /nonexistent/m.gguf --task speed --fill 0", 2 },
        { "run /nonexistent/m.gguf hi", 1 },
        { "run -m /nonexistent/m.gguf --mode fasa-m hi", 1 },
        { "inspect /nonexistent/dir", 1 },
        { "calibrate /nonexistent/m.gguf", 1 },
        { "bench /nonexistent/m.gguf --task speed", 1 },
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char *out, *err;
        int rc = fx_fasa(cases[i].args, &out, &err);
        cr_expect_eq(rc, cases[i].rc, "'fasa %s' exited %d, not %d: %s", cases[i].args, rc, cases[i].rc, err);
        cr_expect_eq(fx_lines(err), 1, "'fasa %s' stderr is not one line: %s", cases[i].args, err);
        cr_expect(strncmp(err, "fasa: ", 6) == 0, "'fasa %s': '%s'", cases[i].args, err);
        free(out);
        free(err);
    }
    /* getopt's complaint names the command, then the usage follows */
    char *out, *err;
    cr_expect_eq(fx_fasa("run --no-such-flag", &out, &err), 2);
    cr_expect(strncmp(err, "fasa run: unrecognized option", 29) == 0, "%s", err);
    free(out);
    free(err);
}

Test(cli, tiny_model_logits_and_atomic_outputs)
{
    tiny_model t;
    tiny_make(&t, &(tiny_spec){ .arch = TINY_LLAMA, .seed = 12 });
    char *dir = tmpdir_make();
    char gguf[600], ids[600], dump[600], args[2400];
    snprintf(gguf, sizeof gguf, "%s/tiny.gguf", dir);
    snprintf(ids, sizeof ids, "%s/ids.txt", dir);
    snprintf(dump, sizeof dump, "%s/logits.f32", dir);
    cr_assert_eq(tiny_write_gguf(&t, gguf, GGUF_TYPE_F32), 0);
    int32_t tok[20];
    FILE *f = fopen(ids, "w");
    for (int i = 0; i < 20; i++) fprintf(f, "%d ", tok[i] = (i * 13 + 5) % t.s.n_vocab);
    fclose(f);
    char *out, *err;
    snprintf(args, sizeof args, "run %s --ids %s -n 6 --print-ids --kv-type f32 --dump-logits %s", gguf, ids, dump);
    cr_assert_eq(fx_fasa(args, &out, &err), 0, "%s", err);
    int n = 0;
    for (char *p = out, *end;; p = end, n++) {
        long v = strtol(p, &end, 10);
        if (end == p) break;
        cr_expect(v >= 0 && v < t.s.n_vocab);
    }
    cr_expect_eq(n, 6, "printed %d ids: '%s'", n, out);
    cr_expect(strstr(err, "tok/s") != NULL, "no speed line: %s", err);
    struct stat st;
    cr_assert_eq(stat(dump, &st), 0);
    cr_assert_eq(st.st_size, (off_t)(20 * t.s.n_vocab * sizeof(float)));
    float *lg = malloc(st.st_size);
    f = fopen(dump, "rb");
    cr_assert_eq(fread(lg, 1, st.st_size, f), (size_t)st.st_size);
    fclose(f);
    double *ref = malloc(sizeof(double) * 20 * t.s.n_vocab), md = 0, mr = 0;
    tiny_forward_ref(&t, tok, 20, ref);
    for (int i = 0; i < 20 * t.s.n_vocab; i++) md = fmax(md, fabs(lg[i] - ref[i])), mr = fmax(mr, fabs(ref[i]));
    cr_expect_lt(md / mr, 1e-5, "dumped logits vs reference: %g", md / mr);
    free(out); free(err);
    /* the default f16 KV cache: within f16 rounding of the reference, and not f32 in disguise */
    snprintf(args, sizeof args, "run %s --ids %s -n 0 --dump-logits %s", gguf, ids, dump);
    cr_assert_eq(fx_fasa(args, &out, &err), 0, "%s", err);
    cr_expect(strstr(err, "f16 KV") != NULL, "the default KV cache is not f16: %s", err);
    f = fopen(dump, "rb");
    cr_assert_eq(fread(lg, 1, st.st_size, f), (size_t)st.st_size);
    fclose(f);
    md = 0;
    for (int i = 0; i < 20 * t.s.n_vocab; i++) md = fmax(md, fabs(lg[i] - ref[i]));
    cr_expect(md / mr > 1e-7 && md / mr < 2e-3, "f16 KV logits vs reference: %g", md / mr);
    free(out); free(err); free(lg); free(ref);
    /* an output that cannot be written: error, and nothing half-written left behind */
    snprintf(args, sizeof args, "run %s --ids %s -n 1 --dump-logits %s/no/such/dir/x.f32", gguf, ids, dir);
    expect_one_line_error(args, "cannot create");
    /* bad ids */
    f = fopen(ids, "w");
    fputs("1 2 99999", f);
    fclose(f);
    snprintf(args, sizeof args, "run %s --ids %s -n 1", gguf, ids);
    expect_one_line_error(args, "token id 99999 is outside the vocabulary");
    tiny_free(&t);
    tmpdir_remove(dir);
}

/* ---------------------------------------------------------------- the real model */

static const char *real_model(void)
{
    static char path[1024];
    const char *env = getenv("FASA_MODEL");
    if (env && access(env, R_OK) == 0) return env;
    const char *bin = fx_bin();
    const char *slash = strrchr(bin, '/');
    snprintf(path, sizeof path, "%.*s/../models/SmolLM2-135M-Instruct.Q4_1.gguf",
             slash ? (int)(slash - bin) : 1, slash ? bin : ".");
    return access(path, R_OK) == 0 ? path : NULL;
}

Test(cli, real_model_inspect)
{
    const char *m = real_model();
    if (!m) cr_skip_test("real_model_inspect: default model not installed (run scripts/setup.sh)");
    char *out, *err, args[1200];
    snprintf(args, sizeof args, "inspect %s --json", m);
    cr_assert_eq(fx_fasa(args, &out, &err), 0, "%s", err);
    cr_expect(strstr(out, "\"n_layer\":\t30") != NULL, "%s", out);
    cr_expect(strstr(out, "\"n_kv_head\":\t3") != NULL);
    cr_expect(strstr(out, "\"rope_layout\":\t\"interleaved\"") != NULL);
    free(out); free(err);
}

Test(cli, real_model_chat_answer, .timeout = 300)
{
    const char *m = real_model();
    if (!m) cr_skip_test("real_model_chat_answer: default model not installed (run scripts/setup.sh)");
    char *out, *err, args[1200];
    snprintf(args, sizeof args, "run %s -n 40 --temp 0 'What is the capital of France?'", m);
    cr_assert_eq(fx_fasa(args, &out, &err), 0, "%s", err);
    cr_expect(strstr(out, "Paris") != NULL, "greedy answer lacks 'Paris': %s", out);
    free(out); free(err);
}

/* bench --task speed: one row per (policy, depth) with the fields the JSON promises, and FASA-M's
 * resident KV is the dominant block only: 2F of the 2 x d_head floats a token holds. */
/* (timeouts: the sanitizer build runs these real-model commands 20-50 times slower) */
Test(cli, real_model_speed_rows, .timeout = 1800)
{
    const char *m = real_model();
    if (!m) cr_skip_test("real_model_speed_rows: default model not installed (run scripts/setup.sh)");
    char *out, *err, args[1200];
    snprintf(args, sizeof args,
             "bench %s --task speed --policy full,fasa-m,default --depths 0,700 --steps 2 --repeats 1 --bandwidth 30 "
             "--json", m);
    int rc = fx_fasa(args, &out, &err);
    if (rc != 0 && strstr(err, "profile"))
        cr_skip_test("real_model_speed_rows: no profile for the default model: %s", err);
    cr_assert_eq(rc, 0, "%s", err);
    cJSON *a = cJSON_Parse(out);
    cr_assert_not_null(a, "%s", out);
    cr_expect_eq(cJSON_GetArraySize(a), 6);
    static const char *const fields[] = { "decode_tok_s", "attn_ms", "bytes_per_token", "gb_s", "roofline",
                                          "prefill_tok_s", "kv_resident_mb", "kv_cold_mb", "peak_rss_mb" };
    for (cJSON *r = a->child; r; r = r->next) {
        for (size_t i = 0; i < sizeof fields / sizeof *fields; i++)
            cr_expect(cJSON_IsNumber(cJSON_GetObjectItem(r, fields[i])), "row lacks %s", fields[i]);
        cr_expect_gt(cJSON_GetObjectItem(r, "decode_tok_s")->valuedouble, 0);
        const char *pol = cJSON_GetObjectItem(r, "policy")->valuestring;
        double res = cJSON_GetObjectItem(r, "kv_resident_mb")->valuedouble,
               tot = cJSON_GetObjectItem(r, "kv_total_mb")->valuedouble;
        /* fasa-m keeps only what TIP reads: the 4-bit copy, and with the tail estimate the value
         * sums (d_head f32 per 64 rows: 4 bytes a key at most); 1/8 of the f16 key and value or less
         * (to 0.1%: its bytes per key are a fraction, the offsets' share, and the row rounds them) */
        if (!strcmp(pol, "fasa-m")) {
            const double tb = cJSON_GetObjectItem(r, "tip_bytes_per_key")->valuedouble;
            cr_expect_geq(res / tot, tb / (2 * 64 * 2) * (1 - 1e-3), "fasa-m resident %g of %g", res, tot);
            cr_expect_leq(res / tot, (tb + 4) / (2 * 64 * 2) * (1 + 1e-3), "fasa-m resident %g of %g", res, tot);
            cr_expect_leq(res / tot, 0.125, "fasa-m resident %g of %g", res, tot);
        } else if (!strcmp(pol, "full")) {
            cr_expect_float_eq(res, tot, 1e-9);
        } else {   /* fasa-c: the whole cache and TIP's copy */
            cr_expect_geq(res, tot, "%s resident %g of %g", pol, res, tot);
        }
        /* default is what run does without flags: with the profile, fasa-c at budget 256, 32 of it recent */
        if (!strcmp(pol, "default")) {
            cr_expect_gt(cJSON_GetObjectItem(r, "fcs")->valuedouble, 0, "default ran without FASA");
            cr_expect_eq(cJSON_GetObjectItem(r, "budget")->valuedouble, 256);
            cr_expect_eq(cJSON_GetObjectItem(r, "recent")->valuedouble, 32);
        }
    }
    cJSON_Delete(a);
    free(out); free(err);
    /* --recent sets fasa-c's window as 'fasa run --recent' does */
    snprintf(args, sizeof args,
             "bench %s --task speed --policy fasa-c --depths 0 --steps 2 --repeats 1 --bandwidth 30 --recent 128 "
             "--json", m);
    cr_assert_eq(fx_fasa(args, &out, &err), 0, "%s", err);
    cr_assert_not_null(a = cJSON_Parse(out), "%s", out);
    cr_expect_eq(cJSON_GetObjectItem(a->child, "recent")->valuedouble, 128, "%s", out);
    cJSON_Delete(a);
    free(out); free(err);
}

/* The real model's logits and greedy tokens against Hugging Face transformers (make verify). */
Test(verify, real_model_logits_vs_transformers, .timeout = 1800)
{
    const char *m = real_model();
    if (!m)
        cr_skip_test("verify::real_model_logits_vs_transformers: default model not installed (run scripts/setup.sh)");
    char root[1024];
    const char *bin = fx_bin(), *slash = strrchr(bin, '/');
    snprintf(root, sizeof root, "%.*s/..", slash ? (int)(slash - bin) : 1, slash ? bin : ".");
    char py[1200], cmd[4096];
    snprintf(py, sizeof py, "%s/.venv/bin/python", root);
    if (access(py, X_OK) != 0)
        cr_skip_test("verify::real_model_logits_vs_transformers: no reference venv (scripts/setup.sh --reference)");
    snprintf(cmd, sizeof cmd,
             "cd %s && .venv/bin/python scripts/verify_logits.py --fasa %s --model %s >build/verify.log 2>&1", root,
             bin, m);
    int st = system(cmd);
    int rc = WIFEXITED(st) ? WEXITSTATUS(st) : 128;
    if (rc == 77)
        cr_skip_test("verify::real_model_logits_vs_transformers: reference cannot be imported (see build/verify.log)");
    cr_expect_eq(rc, 0, "verify_logits.py failed (exit %d); see build/verify.log", rc);
}

/* bench --task ruler end to end on the real model: rows in RULER's JSON form, scores in range,
 * the mean over one task its score (whether this 135M model finds the needle is not asserted) */
Test(cli, real_model_ruler_rows, .timeout = 1800)
{
    const char *m = real_model();
    if (!m) cr_skip_test("real_model_ruler_rows: default model not installed (run scripts/setup.sh)");
    char *out, *err, args[1200];
    snprintf(args, sizeof args, "bench %s --task ruler --tasks niah_single_1 --context 1024 --policy full,stream "
             "--budget 64 --json", m);
    int rc = fx_fasa(args, &out, &err);
    cr_assert_eq(rc, 0, "%s", err);
    cJSON *a = cJSON_Parse(out);
    cr_assert_not_null(a, "%s", out);
    cr_expect_eq(cJSON_GetArraySize(a), 4, "niah_single_1 and mean, for full and stream: %s", out);
    for (cJSON *r = a->child; r; r = r->next) {
        static const char *const keys[] = { "task", "length", "policy", "budget", "score", "samples" };
        for (size_t i = 0; i < 6; i++) cr_expect_not_null(cJSON_GetObjectItem(r, keys[i]), "row lacks %s", keys[i]);
        const double v = cJSON_GetObjectItem(r, "score")->valuedouble;
        cr_expect(v >= 0 && v <= 1, "score %g", v);
    }
    /* one task: each policy's mean is that task's score */
    for (int i = 0; i < 2; i++) {
        const cJSON *t = cJSON_GetArrayItem(a, i), *mean = cJSON_GetArrayItem(a, i + 2);
        cr_expect_str_eq(cJSON_GetObjectItem(mean, "task")->valuestring, "mean");
        cr_expect_str_eq(cJSON_GetObjectItem(t, "policy")->valuestring,
                         cJSON_GetObjectItem(mean, "policy")->valuestring);
        cr_expect_eq(cJSON_GetObjectItem(t, "score")->valuedouble, cJSON_GetObjectItem(mean, "score")->valuedouble);
    }
    cJSON_Delete(a);
    free(out); free(err);
    cr_expect_eq(fx_fasa("bench /nonexistent.gguf --task ruler --tasks nope", &out, &err), 2);
    free(out); free(err);
}

/* The expected answers --show prints for sample k (a copy of the line, or NULL). */
static char *shown_answers(const char *err, int k)
{
    char tag[32];
    snprintf(tag, sizeof tag, "sample %d: ", k);
    const char *at = strstr(err, tag), *e = at ? strstr(at, "expected:") : NULL, *end = e ? strchr(e, '\n') : NULL;
    return end ? strndup(e, (size_t)(end - e)) : NULL;
}

/* --first-sample K runs sample K as --samples K runs it: the same question and answers */
Test(cli, real_model_ruler_first_sample, .timeout = 600)
{
    const char *m = real_model();
    if (!m) cr_skip_test("real_model_ruler_first_sample: default model not installed (run scripts/setup.sh)");
    char *out, *err, *out2, *err2, args[1200];
    snprintf(args, sizeof args, "bench %s --task ruler --tasks vt --context 1024 --policy full --samples 2 --show", m);
    cr_assert_eq(fx_fasa(args, &out, &err), 0, "%s", err);
    snprintf(args, sizeof args,
             "bench %s --task ruler --tasks vt --context 1024 --policy full --first-sample 2 --samples 1 --show"
             " --progress", m);
    cr_assert_eq(fx_fasa(args, &out2, &err2), 0, "%s", err2);
    char *a1 = shown_answers(err, 1), *a2 = shown_answers(err, 2), *b2 = shown_answers(err2, 2);
    cr_assert(a1 && a2 && b2, "no sample lines in: %s\n%s", err, err2);
    cr_expect_str_eq(b2, a2, "sample 2 differs when run alone");
    cr_expect_str_neq(a1, a2, "samples 1 and 2 ask the same");
    cr_expect_null(strstr(err2, "sample 1: "), "--first-sample 2 ran sample 1");
    /* progress reaches a log (stderr is a pipe here) only when asked for, a line each */
    cr_expect_null(strstr(err, "bench: "), "progress without --progress: %s", err);
    cr_expect_not_null(strstr(err2, "bench: 1/1, "), "no progress line with --progress: %s", err2);
    free(a1), free(a2), free(b2);
    free(out), free(err), free(out2), free(err2);
    /* on the real model, so that the flag is the only thing wrong */
    snprintf(args, sizeof args, "bench %s --task ppl --first-sample 2", m);
    expect_one_line_error(args, "--first-sample");
    snprintf(args, sizeof args, "bench %s --task ruler --first-sample 0", m);
    expect_one_line_error(args, "--first-sample");
}

/* scripts/ruler-runs.sh, with a stand-in for bin/fasa that writes a task's row and counts its
 * calls: one run per length, sample and task, named so; a second call runs none of them again; a
 * run that fails leaves no file and stops with one line, its own last one after the run's name,
 * exit 2; bad samples are one line. */
Test(cli, ruler_runs_resume)
{
    if (system("python3 -c '' >/dev/null 2>&1") != 0) cr_skip_test("ruler_runs_resume: python3 not installed");
    char *dir = tmpdir_make(), p[600], cmd[2048], *out, *err;
    snprintf(p, sizeof p, "%s/fasa", dir);
    FILE *f = fopen(p, "w");
    cr_assert(f);
    fprintf(f, "#!/bin/sh\necho x >> %s/calls\n", dir);
    fputs("while [ $# -gt 0 ]; do case $1 in --tasks) t=$2;; --first-sample) s=$2;; esac; shift; done\n"
          "[ \"$t\" = bad ] && { echo 'fasa: bad task' >&2; exit 2; }\n"
          "printf '[{\"task\":\"%s\",\"length\":1024,\"policy\":\"full\",\"budget\":0,\"score\":%d,"
          "\"samples\":1}]\\n' \"$t\" $((s - 1))\n", f);
    fclose(f);
    chmod(p, 0755);
    snprintf(cmd, sizeof cmd, "FASA=%s/fasa scripts/ruler-runs.sh -m %s/fasa -c 1024 -s 1-2 -t a,b %s/r", dir, dir,
             dir);
    cr_assert_eq(fx_sh(cmd, &out, &err), 0, "%s", err);
    /* a and b: 0 on sample 1, 1 on sample 2 */
    cr_expect(strstr(out, "| a | 0.500 |") && strstr(out, "| b | 0.500 |") && strstr(out, "| mean | 0.500 |"), "%s",
              out);
    free(out), free(err);
    static const char *const runs[] = { "1024-s1-a", "1024-s1-b", "1024-s2-a", "1024-s2-b" };
    for (int i = 0; i < 4; i++) {
        snprintf(p, sizeof p, "%s/r/%s.json", dir, runs[i]);
        cr_expect_eq(access(p, F_OK), 0, "no %s", p);
    }
    /* the options may follow DIR: the same runs, found done */
    snprintf(cmd, sizeof cmd, "FASA=%s/fasa scripts/ruler-runs.sh %s/r -m %s/fasa -c 1024 -s 1-2 -t a,b", dir, dir,
             dir);
    cr_assert_eq(fx_sh(cmd, &out, &err), 0, "%s", err);
    cr_expect(strstr(out, "| mean | 0.500 |") != NULL, "%s", out);
    free(out), free(err);
    snprintf(cmd, sizeof cmd, "grep -c x %s/calls", dir);
    cr_assert_eq(fx_sh(cmd, &out, &err), 0);
    cr_expect_eq(atoi(out), 4, "the second call ran again: %s calls", out);
    free(out), free(err);
    snprintf(cmd, sizeof cmd, "FASA=%s/fasa scripts/ruler-runs.sh -m %s/fasa -c 1024 -t a,bad %s/r", dir, dir, dir);
    cr_expect_eq(fx_sh(cmd, &out, &err), 2);
    cr_expect_eq(fx_lines(err), 1, "%s", err);
    cr_expect(strstr(err, "1024 tokens, sample 1, bad: fasa: bad task") != NULL, "%s", err);
    snprintf(p, sizeof p, "%s/r/1024-s1-bad.json", dir);
    cr_expect_neq(access(p, F_OK), 0, "a failed run left %s", p);
    free(out), free(err);
    /* bad arguments, each around DIR (and a second DIR when two): one line, exit 2 */
    static const struct { const char *before; int two; const char *after, *want; } bad[] = {
        { "-s 0", 0, "", "samples '0'" },
        { "-x", 0, "", "unknown option -x" },
        { "", 1, "-c", "-c needs a value" },
        { "", 1, "", "one DIR expected, got 2" },
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        snprintf(cmd, sizeof cmd, "FASA=%s/fasa scripts/ruler-runs.sh -m %s/fasa %s %s/r %s%s %s", dir, dir,
                 bad[i].before, dir, bad[i].two ? dir : "", bad[i].two ? "/q" : "", bad[i].after);
        cr_expect_eq(fx_sh(cmd, &out, &err), 2, "%s", cmd);
        cr_expect(fx_lines(err) == 1 && strstr(err, bad[i].want), "%s: %s", cmd, err);
        free(out), free(err);
    }
    tmpdir_remove(dir);
}

/* examples/plot_ruler.py: two runs of one table over other samples (--first-sample) merge, each
 * task weighted by its samples, and the mean over the tasks is taken again from the merged tasks
 * (not from the runs' means, which differ when a run lacks a task); a file that is not bench
 * output is one line naming it. */
Test(cli, plot_ruler_merges_runs)
{
    if (system("python3 -c '' >/dev/null 2>&1") != 0) cr_skip_test("plot_ruler_merges_runs: python3 not installed");
    char *dir = tmpdir_make(), p[600], cmd[2048], *out, *err;
    snprintf(p, sizeof p, "%s/a.json", dir);
    FILE *f = fopen(p, "w");
    cr_assert(f);
    fputs("[{\"task\":\"a\",\"length\":4096,\"policy\":\"full\",\"budget\":0,\"score\":1,\"samples\":1},"
          "{\"task\":\"b\",\"length\":4096,\"policy\":\"full\",\"budget\":0,\"score\":0.5,\"samples\":1},"
          "{\"task\":\"mean\",\"length\":4096,\"policy\":\"full\",\"budget\":0,\"score\":0.75,\"samples\":1}]\n", f);
    fclose(f);
    snprintf(p, sizeof p, "%s/b.csv", dir);
    cr_assert((f = fopen(p, "w")));
    fputs("task,policy,budget,context,depth,value,layer,extra\n"
          "a,full,0,4096,-1,0.000000,,3\nmean,full,0,4096,-1,0.000000,,3\n", f);
    fclose(f);
    snprintf(cmd, sizeof cmd, "python3 examples/plot_ruler.py %s/a.json %s/b.csv --table", dir, dir);
    cr_expect_eq(fx_sh(cmd, &out, &err), 0, "%s", err);
    /* a: (1 + 3 x 0) / 4 over 4 samples; b: 0.5 over the first run's one; the mean over the
     * tasks (0.25 + 0.5) / 2, where the runs' means weighted would give (0.75 + 3 x 0) / 4 */
    cr_expect(strstr(out, "| 4,096 tokens, 1 to 4 samples | full |") != NULL, "%s", out);
    cr_expect(strstr(out, "| a | 0.250 |") != NULL, "%s", out);
    cr_expect(strstr(out, "| b | 0.500 |") != NULL, "%s", out);
    cr_expect(strstr(out, "| mean | 0.375 |") != NULL, "%s", out);
    free(out), free(err);
    snprintf(p, sizeof p, "%s/c.json", dir);
    cr_assert((f = fopen(p, "w")));
    fputs("[1]\n", f);
    fclose(f);
    snprintf(cmd, sizeof cmd, "python3 examples/plot_ruler.py %s/a.json %s/c.json --table", dir, dir);
    cr_expect_eq(fx_sh(cmd, &out, &err), 1);
    cr_expect_eq(fx_lines(err), 1, "%s", err);
    cr_expect(strstr(err, "c.json") != NULL, "%s", err);
    free(out), free(err);
    tmpdir_remove(dir);
}

/* bench.c - `fasa bench MODEL -p PROFILE --task ca|ppl|passkey [TEXT...]`. */
#include <cjson/cJSON.h>
#include <getopt.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "bench.h"
#include "cmd.h"

/* Ordinary English text every Debian system has, other than the calibration sample. */
static const char *const default_texts[] = {
    "/usr/share/common-licenses/GPL-2", "/usr/share/common-licenses/LGPL-2.1",
    "/usr/share/common-licenses/MPL-1.1", "/usr/share/common-licenses/GFDL-1.3",
    "/usr/share/common-licenses/Apache-2.0", "/usr/share/common-licenses/MPL-2.0",
    "/usr/share/common-licenses/Artistic",
};

static const char usage_text[] =
    "usage: fasa bench MODEL [-p PROFILE] --task ca|ppl|passkey [TEXT...] [options]\n"
    "\n"
    "Accuracy of token-selection policies beside full attention. TEXT files (or - for stdin) are\n"
    "concatenated; the default is the Debian license texts other than GPL-3 (the default\n"
    "calibration sample).\n"
    "\n"
    "  -p, --profile FILE    calibration profile (default: MODEL's .profile.json when present)\n"
    "      --task T          ca: compound contextual agreement per K; ppl: perplexity after a\n"
    "                        dense prefill of C - M tokens and M decode steps under the policy;\n"
    "                        passkey: retrieval of a key hidden at a depth in filler text\n"
    "      --policy LIST     full, fasa, fasa-1/8, fasa-1/4, fasa:F, fasa-group, fasa-block, fasa-nodense,\n"
    "                        oracle, stream, snapkv, h2o, quest, random (default per task)\n"
    "      --budget LIST     tokens attended per query (ppl, passkey; default 128,256,512,1024)\n"
    "      --k LIST          K values (ca; default 64,256,512,768,1024,2048)\n"
    "      --context LIST    C (ppl; default 4096,8192) or passkey lengths (default 1024,2048,4096,8192)\n"
    "      --tokens N        text tokens for ca (default 4096)\n"
    "      --steps M         decode steps (default 256)\n"
    "      --depths LIST     passkey depths (default 0,0.25,0.5,0.75,1)\n"
    "      --seeds N         passkey samples per length and depth (default 5)\n"
    "      --csv FILE        also write the rows as CSV\n"
    "      --json            print the rows as a JSON list on stdout\n"
    "  -t, --threads N       threads (default: all cores)\n"
    "  -h, --help            this text\n";

static int parse_ints(const char *flag, const char *s, int *out, int max, long lo, long hi)
{
    int n = 0;
    const char *p = s;
    while (*p) {
        char *end;
        long v = strtol(p, &end, 10);
        if (end == p || v < lo || v > hi || n == max || (*end && *end != ','))
            return die("option '%s' needs a comma-separated list of integers in [%ld, %ld], not '%s'", flag, lo, hi, s), -1;
        out[n++] = (int)v;
        p = *end ? end + 1 : end;
    }
    if (!n) return die("option '%s' is empty", flag), -1;
    return n;
}

static int parse_doubles(const char *flag, const char *s, double *out, int max)
{
    int n = 0;
    const char *p = s;
    while (*p) {
        char *end;
        double v = strtod(p, &end);
        if (end == p || !(v >= 0 && v <= 1) || n == max || (*end && *end != ','))
            return die("option '%s' needs numbers in [0, 1] separated by commas, not '%s'", flag, s), -1;
        out[n++] = v;
        p = *end ? end + 1 : end;
    }
    return n ? n : (die("option '%s' is empty", flag), -1);
}

static void progress(void *ctx, int done, int total)
{
    fprintf(stderr, "\rbench: %d/%d, %.0f s", done, total, fasa_now() - *(double *)ctx);
    if (done == total) fputc('\n', stderr);
}

/* Reads and concatenates files (with a blank line between). */
static char *read_texts(char **paths, int n, const char *const *defaults, int n_def, size_t *len)
{
    size_t cap = 0, used = 0;
    char *all = NULL;
    int count = n ? n : n_def;
    for (int i = 0; i < count; i++) {
        const char *p = n ? paths[i] : defaults[i];
        FILE *f = strcmp(p, "-") ? fopen(p, "rb") : stdin;
        if (!f) { free(all); die("cannot open '%s': %m", p); return NULL; }
        size_t l;
        char *t = read_all(f, &l);
        if (f != stdin) fclose(f);
        if (!t) { free(all); die("cannot read '%s'", p); return NULL; }
        if (used + l + 3 > cap) {
            char *nb = realloc(all, cap = 2 * (used + l + 3));
            if (!nb) { free(t); free(all); die("out of memory"); return NULL; }
            all = nb;
        }
        memcpy(all + used, t, l);
        used += l;
        all[used++] = '\n';
        all[used] = 0;
        free(t);
    }
    *len = used;
    return all;
}

static int write_csv(const char *path, const bench_row *r, int n)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    if (!f) return die("out of memory");
    fprintf(f, "task,policy,budget,context,depth,value\n");
    for (int i = 0; i < n; i++)
        fprintf(f, "%s,%s,%d,%d,%g,%.6f\n", r[i].task, r[i].policy, r[i].budget, r[i].context,
                r[i].depth, r[i].value);
    fclose(f);
    int rc = write_file_atomic(path, buf, len);
    free(buf);
    return rc;
}

int cmd_bench(int argc, char **argv)
{
    static const struct option opts[] = {
        { "profile", required_argument, 0, 'p' }, { "task", required_argument, 0, 'T' },
        { "policy", required_argument, 0, 'P' },  { "budget", required_argument, 0, 'B' },
        { "k", required_argument, 0, 'K' },       { "context", required_argument, 0, 'C' },
        { "tokens", required_argument, 0, 'N' },  { "steps", required_argument, 0, 'M' },
        { "depths", required_argument, 0, 'D' },  { "seeds", required_argument, 0, 'S' },
        { "csv", required_argument, 0, 'c' },     { "json", no_argument, 0, 'j' },
        { "threads", required_argument, 0, 't' }, { "help", no_argument, 0, 'h' },
        { 0, 0, 0, 0 },
    };
    const char *prof_path = NULL, *task = NULL, *policies = NULL, *csv = NULL;
    const char *budgets = "128,256,512,1024", *ks = "64,256,512,768,1024,2048", *contexts = NULL, *depths = "0,0.25,0.5,0.75,1";
    long tokens = 4096, steps = 256, seeds = 5, threads = 0;
    int json = 0, c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "p:t:h", opts, NULL)) != -1) {
        switch (c) {
        case 'p': prof_path = optarg; break;
        case 'T': task = optarg; break;
        case 'P': policies = optarg; break;
        case 'B': budgets = optarg; break;
        case 'K': ks = optarg; break;
        case 'C': contexts = optarg; break;
        case 'N': if (parse_int("--tokens", optarg, 16, 1 << 22, &tokens)) return EXIT_USAGE; break;
        case 'M': if (parse_int("--steps", optarg, 1, 1 << 20, &steps)) return EXIT_USAGE; break;
        case 'D': depths = optarg; break;
        case 'S': if (parse_int("--seeds", optarg, 1, 1000, &seeds)) return EXIT_USAGE; break;
        case 'c': csv = optarg; break;
        case 'j': json = 1; break;
        case 't': if (parse_int("--threads", optarg, 1, 1024, &threads)) return EXIT_USAGE; break;
        case 'h': fputs(usage_text, stdout); return 0;
        default: fputs(usage_text, stderr); return EXIT_USAGE;
        }
    }
    if (optind >= argc || !task) {
        fputs(usage_text, stderr);
        return EXIT_USAGE;
    }
    if (!strcmp(task, "speed")) return die("--task speed is not built yet (ca, ppl, passkey)");
    if (strcmp(task, "ca") && strcmp(task, "ppl") && strcmp(task, "passkey"))
        return die_usage("--task '%s' is not available (ca, ppl, passkey)", task);
    /* the lists before the model is read */
    bench_cfg cfg = { .steps = (int)steps, .seeds = (int)seeds };
    if ((cfg.n_budget = parse_ints("--budget", budgets, cfg.budgets, BENCH_MAX, 1, 1 << 24)) < 0) return EXIT_USAGE;
    if ((cfg.n_k = parse_ints("--k", ks, cfg.ks, BENCH_MAX, 1, 1 << 24)) < 0) return EXIT_USAGE;
    if (cfg.n_k > PROFILE_MAX_K) return die_usage("at most %d values of --k", PROFILE_MAX_K);
    for (int i = 1; i < cfg.n_k; i++)
        if (cfg.ks[i] <= cfg.ks[i - 1]) return die_usage("--k values must increase");
    if (!contexts) contexts = !strcmp(task, "passkey") ? "1024,2048,4096,8192" : "4096,8192";
    if ((cfg.n_ctx = parse_ints("--context", contexts, cfg.contexts, BENCH_MAX, 16, 1 << 22)) < 0) return EXIT_USAGE;
    if ((cfg.n_depth = parse_doubles("--depths", depths, cfg.depths, BENCH_MAX)) < 0) return EXIT_USAGE;
    if (threads) omp_set_num_threads((int)threads);
    const char *model_path = argv[optind++];
    char err[FASA_ERRLEN], defp[4096];
    model *m;
    if (model_open(&m, model_path, err) < 0) return die("%s", err);
    int status = 1, n_rows = 0;
    bench_row *rows = NULL;
    profile prof = { 0 }, *pp = NULL;
    char *text = NULL;
    int32_t *ids = NULL;
    if (!prof_path) {
        if (profile_find(model_path, defp, sizeof defp)) prof_path = defp;
    }
    if (prof_path) {
        if (profile_load(&prof, prof_path, err) < 0) { die("%s", err); goto out; }
        if (profile_check_model(&prof, m, prof_path, err) < 0) { die("%s", err); goto out; }
        pp = &prof;
    }
    if (!policies)
        policies = !strcmp(task, "ca") ? "random,stream,snapkv,quest,fasa-1/8,fasa-1/4,oracle"
                                       : "full,fasa-1/4,fasa-1/8,oracle,stream,snapkv,h2o,quest";
    char list[1024];
    snprintf(list, sizeof list, "%s", policies);
    for (char *save, *tok = strtok_r(list, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        if (cfg.n_policy == BENCH_MAX) { status = die_usage("too many policies (at most %d)", BENCH_MAX); goto out; }
        /* every failure here is FASA_EARG: an unknown name, F out of range, fasa without a profile */
        if (bench_policy_parse(tok, m, pp, &cfg.policies[cfg.n_policy++], err) < 0) { status = die_usage("%s", err); goto out; }
    }
    double t0 = fasa_now();
    if (isatty(2)) cfg.progress = progress, cfg.progress_ctx = &t0;

    int rc;
    if (!strcmp(task, "passkey")) {
        rc = bench_passkey(m, &cfg, &rows, &n_rows, err);
    } else {
        if (!m->tok) { status = die_usage("--task %s needs a model with a tokenizer; '%s' has none", task, model_path); goto out; }
        size_t len;
        if (!(text = read_texts(argv + optind, argc - optind, default_texts,
                                (int)(sizeof default_texts / sizeof *default_texts), &len)))
            goto out;
        if (!(ids = malloc(sizeof *ids * (3 * len + 16)))) { die("out of memory"); goto out; }
        int n = tokenizer_encode(m->tok, text, len, 0, ids, (int)(3 * len + 16));
        if (n < 0) { die("cannot tokenize the text"); goto out; }
        if (!strcmp(task, "ca")) {
            if (n < tokens) { status = die_usage("the text has %d tokens; --tokens asks for %ld", n, tokens); goto out; }
            rc = bench_ca(m, ids, (int)tokens, &cfg, &rows, &n_rows, err);
        } else {
            rc = bench_ppl(m, ids, n, &cfg, &rows, &n_rows, err);
        }
    }
    if (rc < 0) {   /* FASA_EARG: settings the text or model cannot meet (--context longer than the text) */
        status = rc == FASA_EARG ? die_usage("%s", err) : die("%s", err);
        goto out;
    }
    double secs = fasa_now() - t0;

    if (json) {
        cJSON *a = cJSON_CreateArray();
        for (int i = 0; i < n_rows; i++) {
            cJSON *o = cJSON_CreateObject();
            if (!strcmp(task, "ca")) {
                cJSON_AddStringToObject(o, "method", rows[i].policy);
                cJSON_AddNumberToObject(o, "k", rows[i].budget);
                cJSON_AddNumberToObject(o, "ca", rows[i].value);
            } else {
                cJSON_AddStringToObject(o, "task", rows[i].task);
                cJSON_AddStringToObject(o, "policy", rows[i].policy);
                cJSON_AddNumberToObject(o, "budget", rows[i].budget);
                cJSON_AddNumberToObject(o, "context", rows[i].context);
                if (rows[i].depth >= 0) cJSON_AddNumberToObject(o, "depth", rows[i].depth);
                cJSON_AddNumberToObject(o, "value", rows[i].value);
            }
            cJSON_AddItemToArray(a, o);
        }
        char *s = cJSON_Print(a);
        puts(s);
        free(s);
        cJSON_Delete(a);
    } else if (!strcmp(task, "ca")) {
        printf("%-14s", "method \\ K");
        for (int b = 0; b < cfg.n_k; b++) printf(" %7d", cfg.ks[b]);
        printf("\n");
        for (int p = 0; p < cfg.n_policy; p++) {
            printf("%-14s", cfg.policies[p].name);
            for (int b = 0; b < cfg.n_k; b++) printf(" %7.1f", 100 * rows[p * cfg.n_k + b].value);
            printf("\n");
        }
    } else {
        printf("%-8s %-14s %8s %8s %6s %10s\n", "task", "policy", "budget", "context", "depth", "value");
        for (int i = 0; i < n_rows; i++) {
            char depth[16] = "-";
            if (rows[i].depth >= 0) snprintf(depth, sizeof depth, "%.2f", rows[i].depth);
            printf("%-8s %-14s %8d %8d %6s %10.4f\n", rows[i].task, rows[i].policy, rows[i].budget,
                   rows[i].context, depth, rows[i].value);
        }
    }
    fprintf(stderr, "fasa: bench %s: %d rows in %.1f s on %d threads\n", task, n_rows, secs, omp_get_max_threads());
    if (csv && write_csv(csv, rows, n_rows)) goto out;
    status = 0;
out:
    free(rows);
    free(ids);
    free(text);
    profile_free(&prof);
    model_close(m);
    return status;
}

/* bench.c - `fasa bench MODEL -p PROFILE --task ca|ppl|passkey|speed [TEXT...]`. */
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
#include "ruler.h"
#include "session.h"
#include "speed.h"

/* Ordinary English text every Debian system has, other than the calibration sample. */
static const char *const default_texts[] = {
    "/usr/share/common-licenses/GPL-2", "/usr/share/common-licenses/LGPL-2.1",
    "/usr/share/common-licenses/MPL-1.1", "/usr/share/common-licenses/GFDL-1.3",
    "/usr/share/common-licenses/Apache-2.0", "/usr/share/common-licenses/MPL-2.0",
    "/usr/share/common-licenses/Artistic",
};

static const char usage_text[] =
    "usage: fasa bench MODEL [-p PROFILE] --task ca|ppl|passkey|ruler|speed [TEXT...] [options]\n"
    "\n"
    "Accuracy of token-selection policies beside full attention, and decode speed. TEXT files (or -\n"
    "for stdin) are concatenated; the default is the Debian license texts other than GPL-3 (the\n"
    "default calibration sample).\n"
    "\n"
    "  -p, --profile FILE    calibration profile (default: MODEL's .profile.json when present)\n"
    "      --task T          ca: compound contextual agreement per K; ppl: perplexity after a\n"
    "                        dense prefill of C - M tokens and M decode steps under the policy\n"
    "                        (with full in the list, also each step's KL to full attention's\n"
    "                        next-token distribution and how often its top token is full's);\n"
    "                        passkey: retrieval of a key hidden at a depth in filler text;\n"
    "                        ruler: RULER's 13 long-context tasks (needles, variable tracking,\n"
    "                        word extraction, QA), generated here, prefilled once per sample and\n"
    "                        decoded under every policy and budget, scored as RULER scores;\n"
    "                        speed: decode tok/s, attention ms/token, bytes per token, GB/s and\n"
    "                        KV memory by tier at cache depths (policies default, full, fasa-c,\n"
    "                        fasa-m, quest; the cache is a real prefill of 512 tokens tiled to depth)\n"
    "      --policy LIST     default (what 'fasa run' selects without flags), full, fasa, fasa-1/8,\n"
    "                        fasa-1/4, fasa:F, fasa-group, fasa-block, fasa-nodense, fasa-q4,\n"
    "                        oracle, stream, snapkv, h2o, quest, random (default per task); fasa's\n"
    "                        variants combine, e.g. fasa-1/4-block-s0-r64@20.14: -sN sinks (default\n"
    "                        4), -rN recent tokens (default 32, at most half the budget; -rhalf\n"
    "                        half the budget, the default until 2026-12-07), @L.L dense layers,\n"
    "                        -dN or -dKx the dense layers' budget (N tokens, K times the budget),\n"
    "                        -xR rerank, -u every head TIP over its group's whole 4-bit copy (as\n"
    "                        default), -own over its own chunks only (the default until 2026-11-27),\n"
    "                        -tail the unchosen tokens as one estimate ('fasa run --tail on', as\n"
    "                        default: their values by block of 64 tokens), -tails the same with\n"
    "                        TIP's offset measured on 32 of them, -tailb their values by block (with\n"
    "                        fasa; default has it), -tailm one mean value for all (the default until\n"
    "                        2026-12-05), -notail without it (the default until 2026-11-28);\n"
    "                        default takes them too (default-d0: layer 0 attends to every token,\n"
    "                        default:F with F chunks per head)\n"
    "      --budget LIST     tokens attended per query (ppl, passkey; default 128,256,512,1024);\n"
    "                        speed: one N, or auto as 'fasa run --budget auto' (--target-mass P)\n"
    "      --k LIST          K values (ca; default 64,256,512,768,1024,2048)\n"
    "      --context LIST    C (ppl; default 4096,8192), passkey lengths (default 1024,2048,4096,8192),\n"
    "                        ruler lengths (default 4096,8192,16384,32768)\n"
    "      --samples N       ruler: samples per (task, length) (default 1)\n"
    "      --first-sample K  ruler: start at sample K (default 1): more samples of a table\n"
    "                        without running the first ones again\n"
    "      --tasks LIST      ruler: these tasks only (default all 13)\n"
    "      --quick           ruler: four tasks (niah_single_2, niah_multikey_1, vt, qa_1) at 4096 and\n"
    "                        8192 tokens, budget 1024, policies default, full, stream: a smoke check\n"
    "      --show            ruler: print each sample's question, expected answers and every\n"
    "                        policy's output on stderr\n"
    "      --progress        a progress line on stderr per step even when it is not a terminal\n"
    "                        (a log); on a terminal one line is rewritten, flag or not\n"
    "      --tokens N        text tokens for ca (default 4096)\n"
    "      --per-layer       ca: also CA and attention mass held, layer by layer\n"
    "      --heads           ca: also the attention mass held by each head (--json: every head)\n"
    "      --fill N          speed: tokens prefilled for real before the cache is tiled to depth\n"
    "                        (default 512; the deepest depth: no tiling, a real cache throughout)\n"
    "      --tip T           speed: what fasa-c and fasa-m's TIP reads, as 'fasa run --tip': q4\n"
    "                        (default), group, union\n"
    "      --per-head        speed: the same as --tip union (older name)\n"
    "      --rerank R        speed: fasa-c and fasa-m rerank as 'fasa run --rerank' (default: its)\n"
    "      --group-rerank R  speed: as 'fasa run --group-rerank' (ppl, passkey, ruler: default-gxR)\n"
    "      --tail on|off|mean  speed: as 'fasa run --tail' (ppl, passkey, ruler: default-notail,\n"
    "                        default-tailm)\n"
    "      --dense-budget N  speed: fasa-c's and fasa-m's dense layers as 'fasa run --dense-budget'\n"
    "      --recent N        speed: fasa-c's and fasa-m's recent window as 'fasa run --recent' (ppl,\n"
    "                        passkey, ruler: default-rN)\n"
    "      --target-mass P   speed, with --budget auto: the share of the estimated attention mass kept\n"
    "                        (default 0.95; ppl and passkey take it in the policy, default-aPP)\n"
    "      --steps M         decode steps (default 256)\n"
    "      --windows W       ppl: W windows of C tokens per context, spread evenly over the text (the\n"
    "                        first at its start), each prefilled on its own; the perplexity is over\n"
    "                        all their steps (default 1)\n"
    "      --depths LIST     passkey depths (default 0,0.25,0.5,0.75,1); speed: cache depths in\n"
    "                        tokens (default 0,2048,4096,8192,16384,32768)\n"
    "      --repeats R       speed: decode runs per depth; medians are reported (default 5)\n"
    "      --fcs F           speed: dominant chunks for fasa-c/fasa-m (default: the profile's)\n"
    "      --kv-cold DIR     speed: fasa-m's cold tier directory (default: $TMPDIR or /tmp)\n"
    "      --kv-type T       KV cache rows, f16 or f32: speed defaults to f16 (what fasa run does),\n"
    "                        ppl and passkey to f32 (the policy's accuracy, not the rounding's);\n"
    "                        ca reads f32 keys\n"
    "      --bandwidth GBS   speed: memory bandwidth for the roofline fraction (default: measured\n"
    "                        at the start of the run, all threads reading 512 MiB)\n"
    "      --seeds N         passkey samples per length and depth (default 5)\n"
    "      --ids FILE        token ids (whitespace-separated, '-' for stdin) instead of TEXT (ca,\n"
    "                        ppl, speed): the ids another engine reads (scripts/bench_compare.py)\n"
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
            return die("option '%s' needs a comma-separated list of integers in [%ld, %ld], not '%s'", flag, lo,
                       hi, s), -1;
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

/* Progress on stderr: one line rewritten on a terminal; with --progress elsewhere (a log), a line
 * each time. */
static int progress_lines;

/* The clock of a run: its start, and when its first report came and how far it had got. */
typedef struct progress_clock { double t0, first; int first_done; } progress_clock;

static void progress(void *ctx, int done, int total)
{
    progress_clock *pc = ctx;
    const double el = fasa_now() - pc->t0;
    if (!pc->first_done) pc->first = el, pc->first_done = done;
    /* the rate from the first report on: the first step may hold a prefill the others share (ppl) */
    const double rate = done > pc->first_done ? (el - pc->first) / (done - pc->first_done) : el / (done > 0 ? done : 1);
    fprintf(stderr, "%sbench: %d/%d, %.0f s", progress_lines ? "" : "\r", done, total, el);
    if (done > 0 && done < total) fprintf(stderr, ", about %.0f s left%s", rate * (total - done),
                                          progress_lines ? "" : " ");
    if (done == total || progress_lines) fputc('\n', stderr);
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
        char *t = fasa_read_stream(f, &l);
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
    fprintf(f, "task,policy,budget,context,depth,value,layer,extra,head\n");
    for (int i = 0; i < n; i++) {
        char layer[16] = "", head[16] = "";   /* empty: all layers, all heads */
        if (r[i].layer >= 0) snprintf(layer, sizeof layer, "%d", r[i].layer);
        if (r[i].head >= 0) snprintf(head, sizeof head, "%d", r[i].head);
        fprintf(f, "%s,%s,%d,%d,%g,%.6f,%s,%g,%s\n", r[i].task, r[i].policy, r[i].budget, r[i].context,
                r[i].depth, r[i].value, layer, r[i].extra, head);
    }
    fclose(f);
    int rc = write_file_atomic(path, buf, len);
    free(buf);
    return rc;
}

/* The profile for MODEL, found as `fasa run` finds it (session_find_profile: prof_path, else
 * the model's own, a bundle's included). Returns it, NULL when there is none, or sets *failed
 * after saying why. */
static profile *bench_profile(const model *m, const char *model_path, const char *prof_path, profile *prof, int *failed)
{
    char where[4096], err[FASA_ERRLEN];
    const int rc = session_find_profile(m, model_path, prof_path, prof, where, sizeof where, err);
    *failed = rc < 0;
    if (rc < 0) die("%s", err);
    return rc > 0 ? prof : NULL;
}

/* TEXT files (or the defaults) as token ids: returns the count (ids and text owned by the
 * caller), or -1 after saying why. */
static const char *ids_file;   /* --ids: token ids instead of TEXT */
static long rerank = -1;       /* --rerank (speed) */
static long group_rerank = -1; /* --group-rerank (speed) */
static int tail = -1;          /* --tail on|off|mean (speed) */
static long recent = -1;       /* --recent (speed) */
static int dense_budget = SESSION_DENSE_BUDGET; /* --dense-budget (speed) */
static double target_mass;     /* --target-mass (speed, with --budget auto) */

static int bench_ids(const model *m, char **paths, int n_paths, char **text, int32_t **ids)
{
    size_t len;
    if (ids_file) {
        char err[FASA_ERRLEN];
        if (n_paths > 0) return die_usage("--ids replaces TEXT: drop '%s'", paths[0]), -1;
        const int n = tokenizer_read_ids(ids_file, m->cfg.n_vocab, ids, err);
        return n < 0 ? die("%s", err), -1 : n;
    }
    if (!(*text = read_texts(paths, n_paths, default_texts, (int)(sizeof default_texts / sizeof *default_texts), &len)))
        return -1;
    if (!(*ids = malloc(sizeof **ids * (3 * len + 16)))) return die("out of memory"), -1;
    int n = tokenizer_encode(m->tok, *text, len, 0, *ids, (int)(3 * len + 16));
    if (n < 0) return die("cannot tokenize the text"), -1;
    return n;
}

/* ---------------------------------------------------------------- --task speed */

static const char default_depths[] = "0,0.25,0.5,0.75,1";

static int bench_speed_main(const char *model_path, char **texts, int n_texts, const char *prof_path,
                            const char *policies, const char *budgets, const char *depths, int steps, int repeats,
                            int fcs, int tip, int fill, const char *kv_cold, int kv_f16, double bandwidth,
                            const char *csv, int json)
{
    speed_cfg cfg = speed_defaults();
    if (fill > 0) cfg.n_fill = fill;
    cfg.kv_f16 = kv_f16;
    cfg.tip = tip;
    cfg.rerank = (int)rerank;
    cfg.group_rerank = (int)group_rerank;
    cfg.tail = tail;
    cfg.recent = (int)recent;
    cfg.dense_budget = dense_budget;
    cfg.steps = steps, cfg.repeats = repeats, cfg.fcs = fcs, cfg.bandwidth = bandwidth;
    cfg.cold_dir = kv_cold ? kv_cold : getenv("TMPDIR") && *getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
    int budget[BENCH_MAX];
    if (!strcmp(budgets, "auto")) {   /* as 'fasa run --budget auto' */
        cfg.target_mass = target_mass > 0 ? (float)target_mass : SESSION_AUTO_MASS;
        cfg.budget = SESSION_AUTO_MAX;
    } else if (target_mass > 0) {
        return die_usage("--target-mass goes with --budget auto");
    } else if (strcmp(budgets, "128,256,512,1024")) {
        if (parse_ints("--budget", budgets, budget, 1, 1, 1 << 24) < 0) return EXIT_USAGE;
        cfg.budget = budget[0];
    }
    if (depths && (cfg.n_depth = parse_ints("--depths", depths, cfg.depths, BENCH_MAX, 0, 1 << 22)) < 0)
        return EXIT_USAGE;
    if (policies) {
        char list[256];
        snprintf(list, sizeof list, "%s", policies);
        cfg.n_policy = 0;
        for (char *save, *tok = strtok_r(list, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
            if (cfg.n_policy == SPEED_COUNT) return die_usage("--policy: at most %d speed policies", SPEED_COUNT);
            if (speed_policy_parse(tok, &cfg.policies[cfg.n_policy++]) < 0)
                return die_usage("--policy '%s' is not a speed policy (default, full, fasa-c, fasa-m, quest)", tok);
        }
    }
    char err[FASA_ERRLEN];
    model *m;
    if (model_open(&m, model_path, err) < 0) return die("%s", err);
    int status = 1, n_rows = 0, n = 0;
    speed_row *rows = NULL;
    profile prof = { 0 }, *pp = NULL;
    char *text = NULL;
    int32_t *ids = NULL;
    int failed;
    pp = bench_profile(m, model_path, prof_path, &prof, &failed);
    if (failed) goto out;
    if (!m->tok) {
        status = die_usage("--task speed needs a model with a tokenizer; '%s' has none", model_path);
        goto out;
    }
    if ((n = bench_ids(m, texts, n_texts, &text, &ids)) < 0) goto out;
    progress_clock pc = { .t0 = fasa_now() };
    if (isatty(2) || progress_lines) cfg.progress = progress, cfg.progress_ctx = &pc;
    int rc = bench_speed(m, pp, ids, n, &cfg, &rows, &n_rows, err);
    if (rc < 0) { status = rc == FASA_EARG ? die_usage("%s", err) : die("%s", err); goto out; }

    cJSON *a = cJSON_CreateArray();
    for (int i = 0; i < n_rows; i++) {
        const speed_row *w = &rows[i];
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "task", "speed");
        cJSON_AddStringToObject(o, "policy", w->policy);
        cJSON_AddNumberToObject(o, "budget", w->budget);
        cJSON_AddNumberToObject(o, "fcs", w->fcs);
        if (w->fcs) cJSON_AddStringToObject(o, "tip", fasa_tip_name(cfg.tip));
        if (w->fcs) cJSON_AddNumberToObject(o, "tip_bytes_per_key", w->tip_bytes);
        if (w->fcs) cJSON_AddNumberToObject(o, "attended", w->attended);
        if (w->fcs) cJSON_AddNumberToObject(o, "recent", w->recent);
        if (w->fcs && cfg.target_mass > 0) cJSON_AddNumberToObject(o, "target_mass", cfg.target_mass);
        cJSON_AddStringToObject(o, "kv_type", kv_type_name(w->kv_f16));
        cJSON_AddNumberToObject(o, "context", w->depth);
        cJSON_AddNumberToObject(o, "value", w->decode_tok_s);
        cJSON_AddNumberToObject(o, "decode_tok_s", w->decode_tok_s);
        cJSON_AddNumberToObject(o, "attn_ms", w->attn_ms);
        cJSON_AddNumberToObject(o, "bytes_per_token", w->bytes_per_token);
        cJSON_AddNumberToObject(o, "gb_s", w->gb_s);
        cJSON_AddNumberToObject(o, "roofline", w->roofline);
        cJSON_AddNumberToObject(o, "bandwidth_gb_s", w->bandwidth);
        cJSON_AddNumberToObject(o, "prefill_tok_s", w->prefill_tok_s);
        cJSON_AddNumberToObject(o, "kv_resident_mb", w->kv_resident_mb);
        cJSON_AddNumberToObject(o, "kv_cold_mb", w->kv_cold_mb);
        cJSON_AddNumberToObject(o, "kv_total_mb", w->kv_total_mb);
        cJSON_AddNumberToObject(o, "rss_anon_mb", w->rss_anon_mb);
        cJSON_AddNumberToObject(o, "rss_file_mb", w->rss_file_mb);
        cJSON_AddNumberToObject(o, "peak_rss_mb", w->peak_rss_mb);
        cJSON_AddNumberToObject(o, "repeats", cfg.repeats);
        cJSON_AddNumberToObject(o, "steps", cfg.steps);
        cJSON_AddNumberToObject(o, "threads", omp_get_max_threads());
        cJSON_AddItemToArray(a, o);
    }
    if (json) {
        char *js = cJSON_Print(a);
        puts(js);
        free(js);
    } else {
        printf("%-7s %6s %9s %8s %9s %7s %6s %9s %9s %9s %8s\n", "policy", "depth", "tok/s", "attn ms", "MB/token",
               "GB/s", "roof", "KV res MB", "KV coldMB", "+AnonMB", "N/query");
        for (int i = 0; i < n_rows; i++) {
            const speed_row *w = &rows[i];
            printf("%-7s %6d %9.2f %8.2f %9.1f %7.2f %5.1f%% %9.1f %9.1f %9.1f", w->policy, w->depth, w->decode_tok_s,
                   w->attn_ms, w->bytes_per_token / 1e6, w->gb_s, 100 * w->roofline, w->kv_resident_mb, w->kv_cold_mb,
                   w->rss_anon_mb);
            if (w->fcs) printf(" %8.1f\n", w->attended);
            else printf(" %8s\n", "-");
        }
        /* ratios from this one run */
        for (int i = 0; i < n_rows; i++) {
            const speed_row *f = &rows[i], *full = NULL, *fc = NULL;
            for (int j = 0; j < n_rows; j++) {
                if (rows[j].depth != f->depth) continue;
                if (!strcmp(rows[j].policy, "full")) full = &rows[j];
                if (!strcmp(rows[j].policy, "fasa-c")) fc = &rows[j];
            }
            if (!strcmp(f->policy, "full") || !full) continue;
            printf("depth %6d  %-7s vs full: decode %.2fx, attention %.2fx", f->depth, f->policy,
                   f->decode_tok_s / full->decode_tok_s, f->attn_ms > 0 ? full->attn_ms / f->attn_ms : 0);
            if (!strcmp(f->policy, "fasa-m") && fc)
                printf("; time vs fasa-c %.2fx; resident KV %.3f of full", fc->decode_tok_s / f->decode_tok_s,
                       f->kv_resident_mb / full->kv_total_mb);
            printf("\n");
        }
    }
    if (csv) {
        char *buf = NULL;
        size_t blen = 0;
        FILE *f = open_memstream(&buf, &blen);
        if (!f) { cJSON_Delete(a); die("out of memory"); goto out; }
        fprintf(f, "policy,kv_type,depth,budget,fcs,decode_tok_s,attn_ms,bytes_per_token,gb_s,roofline,prefill_tok_s,"
                   "kv_resident_mb,kv_cold_mb,kv_total_mb,rss_anon_mb,rss_file_mb,peak_rss_mb,attended\n");
        for (int i = 0; i < n_rows; i++) {
            const speed_row *w = &rows[i];
            fprintf(f, "%s,%s,%d,%d,%d,%.3f,%.4f,%.0f,%.3f,%.4f,%.2f,%.3f,%.3f,%.3f,%.1f,%.1f,%.1f,%.2f\n", w->policy,
                    kv_type_name(w->kv_f16), w->depth,
                    w->budget, w->fcs, w->decode_tok_s, w->attn_ms, w->bytes_per_token, w->gb_s, w->roofline,
                    w->prefill_tok_s, w->kv_resident_mb, w->kv_cold_mb, w->kv_total_mb, w->rss_anon_mb, w->rss_file_mb,
                    w->peak_rss_mb, w->attended);
        }
        fclose(f);
        int wrc = write_file_atomic(csv, buf, blen);
        free(buf);
        if (wrc) { cJSON_Delete(a); goto out; }
    }
    cJSON_Delete(a);
    const int nt = omp_get_max_threads();
    fprintf(stderr, "fasa: bench speed: %d row%s in %.1f s on %d thread%s (medians of %d runs of %d tokens; "
            "%s KV cache: %d prefilled tokens tiled to depth%s%s; roofline against %.1f GB/s%s)\n",
            n_rows, fasa_plural(n_rows), fasa_now() - pc.t0, nt, fasa_plural(nt), cfg.repeats, cfg.steps,
            kv_type_name(cfg.kv_f16), speed_fill(&cfg),
            cfg.tip ? "; fasa: --tip " : "", cfg.tip ? fasa_tip_name(cfg.tip) : "", n_rows ? rows[0].bandwidth : 0,
            cfg.bandwidth > 0 ? ", given" : ", a read sweep measured in this run");
    status = 0;
out:
    free(rows);
    free(ids);
    free(text);
    profile_free(&prof);
    model_close(m);
    return status;
}

int cmd_bench(int argc, char **argv)
{
    static const struct option opts[] = {
        { "profile", required_argument, 0, 'p' }, { "task", required_argument, 0, 'T' },
        { "policy", required_argument, 0, 'P' },  { "budget", required_argument, 0, 'B' },
        { "k", required_argument, 0, 'K' },       { "context", required_argument, 0, 'C' },
        { "tokens", required_argument, 0, 'N' },  { "steps", required_argument, 0, 'M' },
        { "samples", required_argument, 0, 'A' }, { "tasks", required_argument, 0, 'Q' },
        { "windows", required_argument, 0, 'w' }, { "first-sample", required_argument, 0, 'a' },
        { "quick", no_argument, 0, 'q' },
        { "depths", required_argument, 0, 'D' },  { "seeds", required_argument, 0, 'S' },
        { "csv", required_argument, 0, 'c' },     { "json", no_argument, 0, 'j' },
        { "threads", required_argument, 0, 't' }, { "help", no_argument, 0, 'h' },
        { "repeats", required_argument, 0, 'R' }, { "fcs", required_argument, 0, 'F' },
        { "kv-cold", required_argument, 0, 'k' }, { "bandwidth", required_argument, 0, 'W' },
        { "kv-type", required_argument, 0, 'Y' }, { "per-layer", no_argument, 0, 'L' },
        { "per-head", no_argument, 0, 'H' },      { "fill", required_argument, 0, 'f' },
        { "tip", required_argument, 0, 'I' },     { "ids", required_argument, 0, 'i' },
        { "rerank", required_argument, 0, 'x' },  { "show", no_argument, 0, 'o' },
        { "target-mass", required_argument, 0, 'm' }, { "dense-budget", required_argument, 0, 'd' },
        { "group-rerank", required_argument, 0, 'g' }, { "progress", no_argument, 0, 'r' },
        { "tail", required_argument, 0, 'l' },    { "heads", no_argument, 0, 'e' },
        { "recent", required_argument, 0, 'n' },
        { 0, 0, 0, 0 },
    };
    const char *prof_path = NULL, *task = NULL, *policies = NULL, *csv = NULL;
    const char *budgets = "128,256,512,1024", *ks = "64,256,512,768,1024,2048", *contexts = NULL,
               *depths = default_depths;
    long tokens = 4096, steps = -1, seeds = 5, threads = 0, repeats = 5, fcs = 0, fill = 0;
    const char *kv_cold = NULL;
    int kv_f16 = -1;   /* -1: the task's default */
    double bandwidth = 0;
    int json = 0, per_layer = 0, per_head = 0, tip = FASA_TIP_Q4, quick = 0, show = 0, c;
    long samples = 1, windows = 1, first_sample = 1;
    const char *task_list = NULL;
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
        case 'R': if (parse_int("--repeats", optarg, 1, 1000, &repeats)) return EXIT_USAGE; break;
        case 'F': if (parse_int("--fcs", optarg, 1, 512, &fcs)) return EXIT_USAGE; break;
        case 'k': kv_cold = optarg; break;
        case 'L': per_layer = 1; break;
        case 'e': per_head = 1; break;
        case 'H': tip = FASA_TIP_UNION; break;
        case 'I':
            if ((tip = fasa_tip_parse(optarg)) < 0)
                return die_usage("--tip '%s' is not one of q4, group, union", optarg);
            break;
        case 'f': if (parse_int("--fill", optarg, 1, 1 << 22, &fill)) return EXIT_USAGE; break;
        case 'x': if (parse_int("--rerank", optarg, 0, 64, &rerank)) return EXIT_USAGE; break;
        case 'l': if (parse_tail(optarg, &tail)) return EXIT_USAGE; break;
        case 'n': if (parse_int("--recent", optarg, 0, 1 << 24, &recent)) return EXIT_USAGE; break;
        case 'g': if (parse_int("--group-rerank", optarg, 0, 64, &group_rerank)) return EXIT_USAGE; break;
        case 'd': if (parse_dense_budget(optarg, &dense_budget)) return EXIT_USAGE; break;
        case 'm':
            if (parse_float("--target-mass", optarg, 1e-3, 0.999, &target_mass)) return EXIT_USAGE;
            break;
        case 'Y': if (parse_kv_type(optarg, &kv_f16)) return EXIT_USAGE; break;
        case 'W': if (parse_float("--bandwidth", optarg, 0.1, 1e4, &bandwidth)) return EXIT_USAGE; break;
        case 'S': if (parse_int("--seeds", optarg, 1, 1000, &seeds)) return EXIT_USAGE; break;
        case 'A': if (parse_int("--samples", optarg, 1, 1000, &samples)) return EXIT_USAGE; break;
        case 'a': if (parse_int("--first-sample", optarg, 1, 1000000, &first_sample)) return EXIT_USAGE; break;
        case 'w': if (parse_int("--windows", optarg, 1, 64, &windows)) return EXIT_USAGE; break;
        case 'Q': task_list = optarg; break;
        case 'q': quick = 1; break;
        case 'r': progress_lines = !isatty(2); break;
        case 'o': show = 1; break;
        case 'c': csv = optarg; break;
        case 'i': ids_file = optarg; break;
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
    if (!strcmp(task, "speed")) {
        if (threads) omp_set_num_threads((int)threads);
        return bench_speed_main(argv[optind], argv + optind + 1, argc - optind - 1, prof_path, policies, budgets,
                                depths == default_depths ? NULL : depths, steps < 0 ? 16 : (int)steps,
                                (int)repeats, (int)fcs, tip, (int)fill, kv_cold, kv_f16 != 0, bandwidth, csv, json);
    }
    if (strcmp(task, "ca") && strcmp(task, "ppl") && strcmp(task, "passkey") && strcmp(task, "ruler"))
        return die_usage("--task '%s' is not available (ca, ppl, passkey, ruler, speed)", task);
    if (target_mass > 0) return die_usage("--target-mass is for --task speed with --budget auto (else: default-aPP)");
    const int ruler = !strcmp(task, "ruler");
    uint64_t ruler_tasks = 0;
    if (ruler && task_list) {
        char list[1024];
        snprintf(list, sizeof list, "%s", task_list);
        for (char *save, *tok = strtok_r(list, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
            const int t = ruler_task_find(tok);
            if (t < 0)
                return die_usage("--tasks: '%s' is not a ruler task (niah_single_1, ..., vt, cwe, fwe, qa_1, qa_2)",
                                 tok);
            ruler_tasks |= 1ull << t;
        }
    } else if (ruler && quick) {
        for (int t = 0; t < ruler_task_count(); t++)
            if (ruler_task_quick(t)) ruler_tasks |= 1ull << t;
    }
    if (!ruler && (task_list || quick || show || samples != 1 || first_sample != 1))
        return die_usage("--tasks, --quick, --show, --samples and --first-sample are for --task ruler");
    if (windows != 1 && strcmp(task, "ppl")) return die_usage("--windows is for --task ppl");
    if ((per_layer || per_head) && strcmp(task, "ca")) return die_usage("--per-layer and --heads are for --task ca");
    if (ruler && quick) {
        if (!policies) policies = "full,default,stream";
        if (!strcmp(budgets, "128,256,512,1024")) budgets = "1024";
        if (!contexts) contexts = "4096,8192";
    }
    /* the lists before the model is read */
    if (!strcmp(task, "ca") && kv_f16 == 1) return die_usage("--task ca reads f32 keys: drop --kv-type f16");
    bench_cfg cfg = { .steps = steps < 0 ? 256 : (int)steps, .seeds = ruler ? (int)samples : (int)seeds,
                      .kv_f16 = ruler ? kv_f16 != 0 : kv_f16 == 1, .per_layer = per_layer, .show = show,
                      .per_head = per_head,
                      .windows = (int)windows, .first_sample = (int)first_sample };
    if ((cfg.n_budget = parse_ints("--budget", budgets, cfg.budgets, BENCH_MAX, 1, 1 << 24)) < 0) return EXIT_USAGE;
    if ((cfg.n_k = parse_ints("--k", ks, cfg.ks, BENCH_MAX, 1, 1 << 24)) < 0) return EXIT_USAGE;
    if (cfg.n_k > PROFILE_MAX_K) return die_usage("at most %d values of --k", PROFILE_MAX_K);
    for (int i = 1; i < cfg.n_k; i++)
        if (cfg.ks[i] <= cfg.ks[i - 1]) return die_usage("--k values must increase");
    if (!contexts)
        contexts = !strcmp(task, "passkey") ? "1024,2048,4096,8192" : ruler ? "4096,8192,16384,32768" : "4096,8192";
    if (ruler && !strcmp(budgets, "128,256,512,1024")) budgets = "256,512,1024,2048";
    if ((cfg.n_ctx = parse_ints("--context", contexts, cfg.contexts, BENCH_MAX, 16, 1 << 22)) < 0) return EXIT_USAGE;
    if ((cfg.n_depth = parse_doubles("--depths", depths, cfg.depths, BENCH_MAX)) < 0) return EXIT_USAGE;
    if (threads) omp_set_num_threads((int)threads);
    const char *model_path = argv[optind++];
    char err[FASA_ERRLEN];
    model *m;
    if (model_open(&m, model_path, err) < 0) return die("%s", err);
    int status = 1, n_rows = 0;
    bench_row *rows = NULL;
    profile prof = { 0 }, *pp = NULL;
    char *text = NULL;
    int32_t *ids = NULL;
    int failed;
    pp = bench_profile(m, model_path, prof_path, &prof, &failed);
    if (failed) goto out;
    if (!policies)
        policies = !strcmp(task, "ca") ? "random,stream,snapkv,quest,fasa-1/8,fasa-1/4,fasa-1/4-s0-r0,oracle"
                       : ruler ? "full,default,oracle,stream,snapkv,h2o,quest"
                                       : "full,fasa-1/4,fasa-1/8,oracle,stream,snapkv,h2o,quest";
    char list[1024];
    snprintf(list, sizeof list, "%s", policies);
    for (char *save, *tok = strtok_r(list, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        if (cfg.n_policy == BENCH_MAX) { status = die_usage("too many policies (at most %d)", BENCH_MAX); goto out; }
        /* every failure here is FASA_EARG: an unknown name, F out of range, fasa without a profile */
        if (bench_policy_parse(tok, m, pp, &cfg.policies[cfg.n_policy++], err) < 0) {
            status = die_usage("%s", err);
            goto out;
        }
    }
    progress_clock pc = { .t0 = fasa_now() };
    if (isatty(2) || progress_lines) cfg.progress = progress, cfg.progress_ctx = &pc;

    int rc;
    if (!strcmp(task, "passkey")) {
        rc = bench_passkey(m, &cfg, &rows, &n_rows, err);
    } else if (ruler) {
        rc = bench_ruler(m, &cfg, ruler_tasks, &rows, &n_rows, err);
    } else {
        if (!m->tok) {
            status = die_usage("--task %s needs a model with a tokenizer; '%s' has none", task, model_path);
            goto out;
        }
        int n = bench_ids(m, argv + optind, argc - optind, &text, &ids);
        if (n < 0) goto out;
        if (!strcmp(task, "ca")) {
            if (n < tokens) {
                status = die_usage("the text has %d tokens; --tokens asks for %ld", n, tokens);
                goto out;
            }
            rc = bench_ca(m, ids, (int)tokens, &cfg, &rows, &n_rows, err);
        } else {
            rc = bench_ppl(m, ids, n, &cfg, &rows, &n_rows, err);
        }
    }
    if (rc < 0) {   /* FASA_EARG: settings the text or model cannot meet (--context longer than the text) */
        status = rc == FASA_EARG ? die_usage("%s", err) : die("%s", err);
        goto out;
    }
    double secs = fasa_now() - pc.t0;

    if (json) {
        cJSON *a = cJSON_CreateArray();
        for (int i = 0; i < n_rows; i++) {
            cJSON *o = cJSON_CreateObject();
            if (!strcmp(task, "ca")) {
                cJSON_AddStringToObject(o, "method", rows[i].policy);
                cJSON_AddNumberToObject(o, "k", rows[i].budget);
                if (rows[i].layer >= 0) cJSON_AddNumberToObject(o, "layer", rows[i].layer);
                if (rows[i].head >= 0) cJSON_AddNumberToObject(o, "head", rows[i].head);
                cJSON_AddNumberToObject(o, rows[i].task, rows[i].value);   /* "ca" or "mass" */
            } else if (ruler) {   /* {"task","length","policy","budget","score","samples"} */
                cJSON_AddStringToObject(o, "task", rows[i].task);
                cJSON_AddNumberToObject(o, "length", rows[i].context);
                cJSON_AddStringToObject(o, "policy", rows[i].policy);
                cJSON_AddNumberToObject(o, "budget", rows[i].budget);
                cJSON_AddNumberToObject(o, "score", rows[i].value);
                cJSON_AddNumberToObject(o, "samples", rows[i].extra);
            } else {
                cJSON_AddStringToObject(o, "task", rows[i].task);
                cJSON_AddStringToObject(o, "policy", rows[i].policy);
                cJSON_AddNumberToObject(o, "budget", rows[i].budget);
                cJSON_AddNumberToObject(o, "context", rows[i].context);
                if (rows[i].depth >= 0) cJSON_AddNumberToObject(o, "depth", rows[i].depth);
                cJSON_AddNumberToObject(o, "value", rows[i].value);
                if (rows[i].tokens > 0) cJSON_AddNumberToObject(o, "tokens_per_query", rows[i].tokens);
                if (rows[i].kl >= 0) cJSON_AddNumberToObject(o, "kl_to_full", rows[i].kl);
                if (rows[i].agree >= 0) cJSON_AddNumberToObject(o, "top1_as_full", rows[i].agree);
            }
            cJSON_AddItemToArray(a, o);
        }
        char *s = cJSON_Print(a);
        puts(s);
        free(s);
        cJSON_Delete(a);
    } else if (!strcmp(task, "ca")) {
        /* rows: (layer -1, then each) x (ca, mass) x policy x K, then (layer, head) x policy x K */
        const int per = cfg.n_policy * cfg.n_k, L = per_layer ? m->cfg.n_layer : 0, H = m->cfg.n_head;
        int cw = 9;   /* the widest policy name, at least 9: the by-layer and by-head columns */
        for (int p = 0; p < cfg.n_policy; p++)
            cw = (int)strlen(cfg.policies[p].name) > cw ? (int)strlen(cfg.policies[p].name) : cw;
        const int w = cw > 14 ? cw : 14;
        for (int what = 0; what < 2; what++) {
            printf("%s%-*s", what ? "\nattention mass held, %\n" : "compound CA, %\n", w, "method \\ K");
            for (int b = 0; b < cfg.n_k; b++) printf(" %7d", cfg.ks[b]);
            printf("\n");
            for (int p = 0; p < cfg.n_policy; p++) {
                printf("%-*s", w, cfg.policies[p].name);
                for (int b = 0; b < cfg.n_k; b++) printf(" %7.1f", 100 * rows[what * per + p * cfg.n_k + b].value);
                printf("\n");
            }
        }
        for (int b = 0; per_layer && b < cfg.n_k; b++)
            for (int what = 0; what < 2; what++) {
                printf("\n%s by layer at K = %d, %%\nlayer", what ? "attention mass held" : "compound CA", cfg.ks[b]);
                for (int p = 0; p < cfg.n_policy; p++) printf(" %*s", cw, cfg.policies[p].name);
                printf("\n");
                for (int l = 0; l < L; l++) {
                    printf("%5d", l);
                    for (int p = 0; p < cfg.n_policy; p++)
                        printf(" %*.1f", cw, 100 * rows[2 * per * (l + 1) + what * per + p * cfg.n_k + b].value);
                    printf("\n");
                }
            }
        /* the heads the first policy serves worst (beside the last policy, when there are two or
         * more: the oracle named last gives each head's gap to the exact top K), each policy beside */
        const bench_row *hr = rows + 2 * per * (1 + L);
        const int nh = per_head ? m->cfg.n_layer * H : 0, show_n = nh < 12 ? nh : 12, last = cfg.n_policy - 1;
        int *order = nh ? malloc(sizeof *order * nh) : NULL;
        for (int b = 0; order && b < cfg.n_k; b++) {
#define HEAD_KEY(i) (hr[(i) * per + b].value - (last ? hr[(i) * per + last * cfg.n_k + b].value : 0))
            for (int i = 0; i < nh; i++) order[i] = i;
            for (int i = 0; i < show_n; i++)   /* partial selection sort: the show_n lowest first */
                for (int j = i + 1; j < nh; j++)
                    if (HEAD_KEY(order[j]) < HEAD_KEY(order[i])) {
                        int t = order[i];
                        order[i] = order[j], order[j] = t;
                    }
#undef HEAD_KEY
            printf("\nattention mass held at K = %d, the %d heads %s holds least%s%s, %%\nlayer.head", cfg.ks[b],
                   show_n, cfg.policies[0].name, last ? " beside " : "", last ? cfg.policies[last].name : "");
            for (int p = 0; p < cfg.n_policy; p++) printf(" %*s", cw, cfg.policies[p].name);
            printf("\n");
            for (int i = 0; i < show_n; i++) {
                printf("%7d.%-2d", order[i] / H, order[i] % H);
                for (int p = 0; p < cfg.n_policy; p++)
                    printf(" %*.1f", cw, 100 * hr[order[i] * per + p * cfg.n_k + b].value);
                printf("\n");
            }
        }
        free(order);
    } else {
        int w = 14;   /* the widest policy name */
        for (int i = 0; i < n_rows; i++) w = (int)strlen(rows[i].policy) > w ? (int)strlen(rows[i].policy) : w;
        int tw = 8;   /* the widest task name */
        for (int i = 0; i < n_rows; i++) tw = (int)strlen(rows[i].task) > tw ? (int)strlen(rows[i].task) : tw;
        int fid = 0;   /* ppl beside full attention: KL to it and top-1 agreement columns */
        for (int i = 0; i < n_rows; i++) fid |= rows[i].kl >= 0;
        printf("%-*s %-*s %8s %8s %6s %10s %8s", tw, "task", w, "policy", "budget", "context", "depth", "value",
               "tokens");
        printf(fid ? " %9s %8s\n" : "\n", "kl_full", "top1_%");
        for (int i = 0; i < n_rows; i++) {
            char depth[16] = "-", tokens[16] = "-", kl[16] = "-", agree[16] = "-";
            if (rows[i].depth >= 0) snprintf(depth, sizeof depth, "%.2f", rows[i].depth);
            if (rows[i].tokens > 0) snprintf(tokens, sizeof tokens, "%.1f", rows[i].tokens);
            if (rows[i].kl >= 0) snprintf(kl, sizeof kl, "%.5f", rows[i].kl);
            if (rows[i].agree >= 0) snprintf(agree, sizeof agree, "%.2f", 100 * rows[i].agree);
            printf("%-*s %-*s %8d %8d %6s %10.4f %8s", tw, rows[i].task, w, rows[i].policy, rows[i].budget,
                   rows[i].context, depth, rows[i].value, tokens);
            printf(fid ? " %9s %8s\n" : "\n", kl, agree);
        }
    }
    const int nt = omp_get_max_threads();
    fprintf(stderr, "fasa: bench %s: %d row%s in %.1f s on %d thread%s\n", task, n_rows, fasa_plural(n_rows), secs, nt,
            fasa_plural(nt));
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

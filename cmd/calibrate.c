/* calibrate.c - `fasa calibrate MODEL [SAMPLE|-] -o PROFILE.json`. */
#include <getopt.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <xxhash.h>

#include "calibrate.h"
#include "cmd.h"

static const char usage_text[] =
    "usage: fasa calibrate MODEL [SAMPLE|-] [-o PROFILE.json] [options]\n"
    "\n"
    "Ranks every head's RoPE frequency chunks by contextual agreement (CA) with the head's own\n"
    "top-K tokens, on one sample of ordinary text (default: " DEFAULT_SAMPLE ").\n"
    "\n"
    "  -o, --output FILE     profile to write (default: MODEL without extension + .profile.json)\n"
    "      --tokens N        sample tokens to use (default 2048)\n"
    "      --prefill N       dense prefix; the rest are decode steps (default: tokens - 256)\n"
    "      --k LIST          K values, comma-separated (default 64,128,256,512,1024,2048)\n"
    "      --rank-k K        K that orders the chunks (default 256)\n"
    "      --fcs F           dominant chunks per head recorded as the default (default 3 d_head/16)\n"
    "      --chunks DEF      plane (RoPE rotation planes, default) or adjacent (dims 2j, 2j+1 of\n"
    "                        the Hugging Face layout, as the paper's released code)\n"
    "  -t, --threads N       threads (default: all cores)\n"
    "      --json            print a summary as JSON on stdout\n"
    "  -h, --help            this text\n";

static void progress(void *ctx, int done, int total)
{
    double t0 = *(double *)ctx, el = fasa_now() - t0;
    int w = 30, f = (int)((double)done / total * w);
    fprintf(stderr, "\rcalibrating [%.*s%*s] %d/%d tokens, %.1f s", f, "##############################",
            w - f, "", done, total, el);
    if (done == total) fputc('\n', stderr);
}

static int parse_k_list(const char *s, calib_opts *o)
{
    o->n_k = 0;
    const char *p = s;
    while (*p) {
        char *end;
        long v = strtol(p, &end, 10);
        if (end == p || v < 1 || v > 1 << 24 || o->n_k == PROFILE_MAX_K || (o->n_k && v <= o->ks[o->n_k - 1]))
            return die("option '--k' needs increasing positive integers separated by commas (at most %d), not '%s'",
                       PROFILE_MAX_K, s), -1;
        o->ks[o->n_k++] = (int)v;
        p = *end == ',' ? end + 1 : end;
        if (*end && *end != ',') return die("option '--k': unexpected '%c' in '%s'", *end, s), -1;
    }
    return o->n_k ? 0 : (die("option '--k' is empty"), -1);
}

int cmd_calibrate(int argc, char **argv)
{
    static const struct option opts[] = {
        { "output", required_argument, 0, 'o' }, { "tokens", required_argument, 0, 'N' },
        { "prefill", required_argument, 0, 'P' }, { "k", required_argument, 0, 'K' },
        { "rank-k", required_argument, 0, 'R' }, { "fcs", required_argument, 0, 'F' },
        { "chunks", required_argument, 0, 'C' }, { "threads", required_argument, 0, 't' },
        { "json", no_argument, 0, 'j' },         { "help", no_argument, 0, 'h' },
        { 0, 0, 0, 0 },
    };
    const char *out = NULL, *k_list = NULL, *chunks = "plane";
    long tokens = 2048, prefill = -1, rank_k = 256, fcs = -1, threads = 0;
    int json = 0, c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "o:t:h", opts, NULL)) != -1) {
        switch (c) {
        case 'o': out = optarg; break;
        case 'N': if (parse_int("--tokens", optarg, 2, 1 << 20, &tokens)) return EXIT_USAGE; break;
        case 'P': if (parse_int("--prefill", optarg, 1, 1 << 20, &prefill)) return EXIT_USAGE; break;
        case 'K': k_list = optarg; break;
        case 'R': if (parse_int("--rank-k", optarg, 1, 1 << 24, &rank_k)) return EXIT_USAGE; break;
        case 'F': if (parse_int("--fcs", optarg, 1, 512, &fcs)) return EXIT_USAGE; break;
        case 'C': chunks = optarg; break;
        case 't': if (parse_int("--threads", optarg, 1, 1024, &threads)) return EXIT_USAGE; break;
        case 'j': json = 1; break;
        case 'h': fputs(usage_text, stdout); return 0;
        default: fputs(usage_text, stderr); return EXIT_USAGE;
        }
    }
    if (optind >= argc || argc - optind > 2) {
        fputs(usage_text, stderr);
        return EXIT_USAGE;
    }
    const char *model_path = argv[optind], *sample = optind + 1 < argc ? argv[optind + 1] : DEFAULT_SAMPLE;
    /* every flag is checked before the model is read */
    enum chunk_def chunk_def;
    if (!strcmp(chunks, "plane")) chunk_def = CHUNKS_PLANE;
    else if (!strcmp(chunks, "adjacent")) chunk_def = CHUNKS_ADJACENT;
    else return die_usage("option '--chunks' must be 'plane' or 'adjacent', not '%s'", chunks);
    calib_opts k_opts;
    if (k_list && parse_k_list(k_list, &k_opts) < 0) return EXIT_USAGE;
    if (prefill >= tokens) return die_usage("--prefill %ld leaves no decode steps in %ld tokens", prefill, tokens);
    if (threads) omp_set_num_threads((int)threads);

    char err[FASA_ERRLEN];
    model *m;
    if (model_open(&m, model_path, err) < 0) return die("%s", err);
    calib_opts o = calib_defaults(m);
    int status = 1;
    char *text = NULL;
    int32_t *ids = NULL;
    profile p = { 0 };
    o.chunks = chunk_def;
    if (k_list) {
        o.n_k = k_opts.n_k;
        memcpy(o.ks, k_opts.ks, sizeof o.ks);
    }
    o.rank_k = (int)rank_k;
    if (fcs > 0) o.fcs = (int)fcs;
    o.n_prefill = prefill > 0 ? (int)prefill : (int)tokens - 256;
    if (o.n_prefill < 1) o.n_prefill = (int)tokens / 2;
    if (!m->tok) { die("'%s' has no tokenizer", model_path); goto done; }

    FILE *f = strcmp(sample, "-") ? fopen(sample, "rb") : stdin;
    if (!f) { die("cannot open '%s': %m", sample); goto done; }
    size_t len;
    text = fasa_read_stream(f, &len);
    if (f != stdin) fclose(f);
    if (!text) { die("cannot read '%s'", sample); goto done; }
    int cap = (int)(3 * len + 16);   /* invalid UTF-8 can give up to 3 ids a byte */
    if (!(ids = malloc(sizeof *ids * cap))) { die("out of memory"); goto done; }
    int n = tokenizer_encode(m->tok, text, len, 0, ids, cap);
    if (n < 0) { die("'%s': cannot tokenize", sample); goto done; }
    if (n < tokens) { status = die_usage("'%s' has %d tokens; --tokens asks for %ld", sample, n, tokens); goto done; }
    n = (int)tokens;
    o.sample_hash = XXH64(ids, sizeof *ids * n, 0);

    double t0 = fasa_now();
    if (isatty(2)) o.progress = progress, o.progress_ctx = &t0;
    int rc = calibrate_run(m, ids, n, &o, &p, err);
    if (rc < 0) {   /* FASA_EARG: flags that do not fit together or this model (--rank-k, --fcs) */
        status = rc == FASA_EARG ? die_usage("%s", err) : die("%s", err);
        goto done;
    }
    double secs = fasa_now() - t0;

    char def_out[4096];
    if (!out) {
        profile_default_path(model_path, def_out, sizeof def_out);
        out = def_out;
    }
    if (profile_save(&p, out, err) < 0) { die("%s", err); goto done; }

    /* mean CA of each head's own top-F chunks at rank_k, over all heads: a one-line summary */
    int ki = profile_k_index(&p, p.rank_k);
    double mean_top = 0;
    for (int l = 0; l < p.n_layer; l++)
        for (int h = 0; h < p.n_head; h++)
            mean_top += profile_ca(&p, ki, l, h)[profile_rank(&p, l, h)[0]];
    mean_top /= p.n_layer * p.n_head;
    fprintf(stderr, "fasa: calibrated %d tokens (%d prefill + %d steps) in %.1f s on %d thread%s; "
            "best chunk's CA@%d averages %.3f; wrote '%s'\n", n, p.n_prefill, p.n_steps, secs,
            omp_get_max_threads(), fasa_plural(omp_get_max_threads()), p.rank_k, mean_top, out);
    if (json)
        printf("{\"profile\": \"%s\", \"n_tokens\": %d, \"n_prefill\": %d, \"n_steps\": %d, \"seconds\": %.3f, "
               "\"threads\": %d, \"mean_best_chunk_ca\": %.6f}\n", out, n, p.n_prefill, p.n_steps, secs,
               omp_get_max_threads(), mean_top);
    status = 0;
done:
    profile_free(&p);
    free(ids);
    free(text);
    model_close(m);
    return status;
}

/* run.c - `fasa run [MODEL] [PROMPT|-]`: tokenize, prefill, decode, stream text to stdout. */
#include <cjson/cJSON.h>
#include <getopt.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cmd.h"
#include "sampler.h"
#include "session.h"

static const char usage_text[] =
    "usage: fasa run [MODEL] [PROMPT|-] [options]\n"
    "\n"
    "Generates text. MODEL is a GGUF file, a Hugging Face directory or a .safetensors file;\n"
    "without it the default model installed by setup is used. PROMPT '-' (or none) reads stdin.\n"
    "Tokens stream to stdout; speed figures go to stderr, and on a terminal the prefill's\n"
    "progress.\n"
    "\n"
    "  -m, --model PATH      model (instead of the first argument)\n"
    "      --mode MODE       attention: full; fasa-c (FASA over the whole cache); or fasa-m (only\n"
    "                        the dominant key dims in memory, the rest of the cache in a file read\n"
    "                        for the chosen tokens). The default is fasa-c when MODEL has a\n"
    "                        profile (fasa calibrate), else full\n"
    "  -p, --profile FILE    calibration profile (default: MODEL's .profile.json when present)\n"
    "      --budget N|auto   fasa: tokens attended per query (default 256). auto: per layer, head\n"
    "                        and step, the fewest tokens whose attention mass, estimated from\n"
    "                        TIP's scores, reaches --target-mass (default 0.95), between 160 and\n"
    "                        1024 tokens, with a recent window of 128\n"
    "      --target-mass P   fasa: the share of attention mass --budget auto keeps (0 < P < 1)\n"
    "      --fcs F           fasa: dominant frequency chunks per head (default: the profile's)\n"
    "      --dense-layers N  fasa: first N layers attend densely (default 1)\n"
    "      --dense-budget N  fasa: those layers attend to N tokens, chosen as the others' are\n"
    "                        (0: all of them)\n"
    "      --dense LIST      fasa: these layers attend densely too, e.g. 20,14 (the layers\n"
    "                        'fasa bench --task ca --per-layer' shows losing attention mass on\n"
    "                        the calibration text)\n"
    "      --sinks N         fasa: the first N tokens are always attended (default 4)\n"
    "      --recent N        fasa: so are the last N (default 32, at most half the budget);\n"
    "                        the budget includes both. Chosen on the calibration text\n"
    "                        (docs/results.md, Accuracy)\n"
    "      --group           fasa: one selection per KV head (sum of its query heads' scores)\n"
    "      --tip T           fasa: what the token importance predictor reads. q4 (default): a\n"
    "                        4-bit copy of the union of its KV group's heads' top F chunks, every\n"
    "                        head scoring all of it; group: the group's top F chunks for all its\n"
    "                        heads, an f16 block\n"
    "                        (faster to score, less accurate on long text); union: each head's own\n"
    "                        chunks in an f16 block of the union. docs/results.md, Accuracy\n"
    "      --per-head        the same as --tip union (older name)\n"
    "      --rerank R        fasa: TIP picks R times the tokens it chooses and their exact scores\n"
    "                        (the whole keys) keep the best (0 or 1: off)\n"
    "      --group-rerank R  fasa, --tip q4: TIP picks R times the tokens per head, and every head\n"
    "                        keeps the best of its KV group's union of picks by exact scores (0:\n"
    "                        off, the default; not with --rerank or --budget auto)\n"
    "      --tail on|off|mean  fasa: the tokens left unchosen join attention as one estimate\n"
    "                        (their logits from TIP's scores, their values each block of 64 tokens'\n"
    "                        mean value, weighted by its unchosen tokens' estimated attention; mean:\n"
    "                        one mean value for all, the default until 2026-12-05; blocks: as on;\n"
    "                        CPU, not with --group or --budget auto). Default on (docs/results.md,\n"
    "                        Accuracy)\n"
    "      --exact           every weight product in f32 over dequantised rows (activations not\n"
    "                        rounded to integers as the fast kernels do; slower): what an f32\n"
    "                        reference on the dequantised weights computes (make verify)\n"
    "      --order-chunks    full: order every key's dims by the profile's group ranking, as fasa-c\n"
    "                        does (a converted model's arithmetic, float sums in the same order)\n"
    "      --kv-type T       KV cache rows: f16 (default: half the bytes per step) or f32 (exact;\n"
    "                        the default with --device cuda)\n"
    "      --kv-cold DIR     fasa-m: directory for the cold tier's file (default: $TMPDIR or /tmp);\n"
    "                        the file is unlinked as soon as it is open\n"
    "  -n, --n-predict N     tokens to generate (default 256; 0: prompt only)\n"
    "      --temp T          temperature (default 0: greedy)\n"
    "      --top-k K         keep the K most likely tokens (default 0: off)\n"
    "      --top-p P         nucleus sampling (default 1: off)\n"
    "      --seed S          sampling seed (default 42)\n"
    "      --chat            wrap the prompt in the model's chat template (default when fasa\n"
    "                        knows it: ChatML, Llama-3, Gemma, Mistral or Llama 2 [INST])\n"
    "      --raw             do not apply a chat template\n"
    "      --system TEXT     system message for --chat\n"
    "      --ctx N           context size (default: prompt + N, at most the model's)\n"
    "      --ignore-eos      keep generating after end-of-turn\n"
    "  -t, --threads N       threads (default: all cores)\n"
    "      --device DEV      cpu (default), or cuda: the decode steps' attention on CUDA device 0\n"
    "                        (prefill, weights and selection stay on the CPU; never run on a GPU\n"
    "                        here: README, GPU)\n"
    "      --ids FILE        prompt as whitespace-separated token ids instead of text\n"
    "      --print-ids       print generated token ids instead of text\n"
    "      --dump-logits F   write every prompt position's logits to F (raw float32, n x vocab)\n"
    "      --json            print one JSON object (text, ids, timings) on stdout at the end\n"
    "  -h, --help            this text\n";

enum { OPT_MODE = 256, OPT_TEMP, OPT_TOPK, OPT_TOPP, OPT_SEED, OPT_CHAT, OPT_RAW, OPT_SYSTEM,
       OPT_CTX, OPT_IGNORE_EOS, OPT_IDS, OPT_PRINT_IDS, OPT_DUMP, OPT_JSON, OPT_BUDGET, OPT_FCS,
       OPT_DENSE, OPT_GROUP, OPT_DEVICE, OPT_PER_HEAD, OPT_KV_COLD, OPT_ORDER, OPT_EXACT, OPT_KV_TYPE, OPT_DENSE_LIST,
       OPT_DENSE_BUDGET, OPT_SINKS, OPT_RECENT, OPT_TIP, OPT_MASS, OPT_RERANK,
       OPT_GROUP_RERANK, OPT_TAIL };

static const struct option long_opts[] = {
    { "model", required_argument, 0, 'm' },      { "mode", required_argument, 0, OPT_MODE },
    { "n-predict", required_argument, 0, 'n' },  { "temp", required_argument, 0, OPT_TEMP },
    { "top-k", required_argument, 0, OPT_TOPK }, { "top-p", required_argument, 0, OPT_TOPP },
    { "seed", required_argument, 0, OPT_SEED },  { "chat", no_argument, 0, OPT_CHAT },
    { "raw", no_argument, 0, OPT_RAW },          { "system", required_argument, 0, OPT_SYSTEM },
    { "ctx", required_argument, 0, OPT_CTX },    { "ignore-eos", no_argument, 0, OPT_IGNORE_EOS },
    { "threads", required_argument, 0, 't' },    { "ids", required_argument, 0, OPT_IDS },
    { "print-ids", no_argument, 0, OPT_PRINT_IDS }, { "dump-logits", required_argument, 0, OPT_DUMP },
    { "json", no_argument, 0, OPT_JSON },        { "help", no_argument, 0, 'h' },
    { "profile", required_argument, 0, 'p' },   { "budget", required_argument, 0, OPT_BUDGET },
    { "fcs", required_argument, 0, OPT_FCS },    { "dense-layers", required_argument, 0, OPT_DENSE },
    { "group", no_argument, 0, OPT_GROUP },      { "device", required_argument, 0, OPT_DEVICE },
    { "per-head", no_argument, 0, OPT_PER_HEAD }, { "kv-cold", required_argument, 0, OPT_KV_COLD },
    { "order-chunks", no_argument, 0, OPT_ORDER }, { "kv-type", required_argument, 0, OPT_KV_TYPE },
    { "exact", no_argument, 0, OPT_EXACT },
    { "dense", required_argument, 0, OPT_DENSE_LIST }, { "sinks", required_argument, 0, OPT_SINKS },
    { "recent", required_argument, 0, OPT_RECENT }, { "tip", required_argument, 0, OPT_TIP },
    { "rerank", required_argument, 0, OPT_RERANK },
    { "group-rerank", required_argument, 0, OPT_GROUP_RERANK },
    { "tail", required_argument, 0, OPT_TAIL },
    { "target-mass", required_argument, 0, OPT_MASS }, { "dense-budget", required_argument, 0, OPT_DENSE_BUDGET },
    { 0, 0, 0, 0 },
};

static int looks_like_model(const char *p)
{
    struct stat st;
    if (stat(p, &st) != 0) return 0;
    if (S_ISDIR(st.st_mode)) return 1;
    size_t n = strlen(p);
    return (n > 5 && !strcmp(p + n - 5, ".gguf")) || (n > 12 && !strcmp(p + n - 12, ".safetensors")) ||
           (n > 5 && !strcmp(p + n - 5, ".fasa"));
}

/* The generated text, kept for --json. */
typedef struct textbuf { char *p; size_t len, cap; } textbuf;

static int text_add(textbuf *t, const char *s, size_t n)
{
    if (t->len + n + 1 > t->cap) {
        char *nb = realloc(t->p, t->cap = 2 * (t->len + n + 1));
        if (!nb) return -1;
        t->p = nb;
    }
    memcpy(t->p + t->len, s, n);
    t->p[t->len += n] = 0;
    return 0;
}

static void print_json(const textbuf *text, const int32_t *gen, int n_gen, const int32_t *prompt, int n_prompt,
                       double pre_tps, double dec_tps, double gbs, double kv_per_token, const session *ss)
{
    cJSON *o = cJSON_CreateObject();
    if (text) cJSON_AddStringToObject(o, "text", text->p ? text->p : "");
    cJSON *arr = cJSON_AddArrayToObject(o, "ids");
    for (int i = 0; i < n_gen; i++) cJSON_AddItemToArray(arr, cJSON_CreateNumber(gen[i]));
    cJSON_AddNumberToObject(o, "n_prompt", n_prompt);
    cJSON *pa = cJSON_AddArrayToObject(o, "prompt_ids");   /* as the model's template formatted it */
    for (int i = 0; i < n_prompt; i++) cJSON_AddItemToArray(pa, cJSON_CreateNumber(prompt[i]));
    cJSON_AddNumberToObject(o, "prefill_tok_s", pre_tps);
    cJSON_AddNumberToObject(o, "decode_tok_s", dec_tps);
    cJSON_AddNumberToObject(o, "decode_gb_s", gbs);
    cJSON_AddNumberToObject(o, "threads", omp_get_max_threads());
    cJSON_AddStringToObject(o, "mode", fasa_mode_name(ss->mode));
    cJSON_AddStringToObject(o, "kv_type", kv_type_name(ss->s->kv.f16));
    cJSON_AddNumberToObject(o, "kv_bytes_per_token", kv_per_token);
    char *str = cJSON_Print(o);
    if (str) puts(str);
    free(str);
    cJSON_Delete(o);
}

/* A long prefill on a terminal: one line on stderr, rewritten at most twice a second and cleared
 * at the end. The time left weighs each token by its multiply-adds: the weights', and attention's,
 * which grow with its position (a third of the work at 16k on a 1.5B model). */
typedef struct prefill_clock { const model *m; int n_past, width; double t0, last; } prefill_clock;

static double prefill_work(const prefill_clock *pc, int done)
{
    const model_config *c = &pc->m->cfg;
    const double t = done, p = pc->n_past;
    return (double)pc->m->n_params * t + (double)c->n_layer * c->n_head * c->d_head * ((p + t) * (p + t) - p * p);
}

static void prefill_progress(void *ctx, int done, int total)
{
    prefill_clock *pc = ctx;
    const double now = fasa_now(), el = now - pc->t0;
    if (done == total) {
        if (pc->width) fprintf(stderr, "\r%*s\r", pc->width, "");
        return;
    }
    if (now - pc->last < 0.5) return;
    pc->last = now;
    const double w = prefill_work(pc, done), left = el * (prefill_work(pc, total) - w) / w;
    const int len = fprintf(stderr, "\rfasa: prefill %d/%d tokens, %.0f s, about %.0f s left", done, total, el, left);
    if (len > pc->width) pc->width = len;
    else fprintf(stderr, "%*s", pc->width - len, "");
}

/* Status of a library failure: usage errors (FASA_EARG) exit 2, the rest 1. */
static int fail(int rc, const char *err)
{
    return rc == FASA_EARG ? die_usage("%s", err) : die("%s", err);
}

int cmd_run(int argc, char **argv)
{
    const char *model_path = NULL, *prompt = NULL, *system = NULL, *ids_path = NULL, *dump = NULL;
    session_opts so = session_defaults();
    long n_predict = 256, top_k = 0, seed = 42, ctx = 0, threads = 0, v;
    double temp = 0, top_p = 1;
    int chat = -1, ignore_eos = 0, print_ids = 0, json = 0, budget_auto = 0, c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "m:n:t:p:h", long_opts, NULL)) != -1) {
        switch (c) {
        case 'm': model_path = optarg; break;
        case OPT_MODE: {
            const int mode = fasa_mode_parse(optarg);
            if (mode < 0 || mode == FASA_MODE_AUTO)
                return die_usage("--mode '%s' is not one of full, fasa-c, fasa-m", optarg);
            so.mode = mode;
            break;
        }
        case 'p': so.profile = optarg; break;
        case OPT_BUDGET:
            if (!strcmp(optarg, "auto")) {
                budget_auto = 1;
                break;
            }
            if (parse_int("--budget", optarg, 1, 1 << 24, &v)) return EXIT_USAGE;
            so.budget = (int)v, budget_auto = 0;
            break;
        case OPT_MASS: {
            double mass;
            if (parse_float("--target-mass", optarg, 0.01, 0.9999, &mass)) return EXIT_USAGE;
            so.target_mass = (float)mass;
            break;
        }
        case OPT_FCS: if (parse_int("--fcs", optarg, 1, 512, &v)) return EXIT_USAGE; so.fcs = (int)v; break;
        case OPT_DENSE:
            if (parse_int("--dense-layers", optarg, 0, 1024, &v)) return EXIT_USAGE;
            so.n_dense_layers = (int)v;
            break;
        case OPT_DENSE_BUDGET:
            if (parse_dense_budget(optarg, &so.dense_budget)) return EXIT_USAGE;
            break;
        case OPT_GROUP: so.group = 1; break;
        case OPT_SINKS: if (parse_int("--sinks", optarg, 0, 1 << 24, &v)) return EXIT_USAGE; so.n_sink = (int)v; break;
        case OPT_RECENT:
            if (parse_int("--recent", optarg, 0, 1 << 24, &v)) return EXIT_USAGE;
            so.n_recent = (int)v;
            break;
        case OPT_PER_HEAD: so.tip = FASA_TIP_UNION; break;
        case OPT_TIP: {
            const int tip = fasa_tip_parse(optarg);
            if (tip < 0) return die_usage("--tip '%s' is not one of q4, group, union", optarg);
            so.tip = tip;
            break;
        }
        case OPT_RERANK:
            if (parse_int("--rerank", optarg, 0, 64, &v)) return EXIT_USAGE;
            so.rerank = (int)v;
            break;
        case OPT_GROUP_RERANK:
            if (parse_int("--group-rerank", optarg, 0, 64, &v)) return EXIT_USAGE;
            so.group_rerank = (int)v;
            break;
        case OPT_TAIL: if (parse_tail(optarg, &so.tail)) return EXIT_USAGE; break;
        case OPT_ORDER: so.order_chunks = 1; break;
        case OPT_EXACT: so.exact = 1; break;
        case OPT_KV_COLD: so.kv_cold = optarg; break;
        case OPT_DENSE_LIST:
            if (policy_parse_layers(optarg, ',', &so.dense_mask) < 0)
                return die_usage("--dense needs layer numbers 0..63 separated by commas, not '%s'", optarg);
            break;
        case OPT_KV_TYPE: if (parse_kv_type(optarg, &so.kv_f16)) return EXIT_USAGE; break;
        case OPT_DEVICE:
            if (strcmp(optarg, "cpu") && strcmp(optarg, "cuda"))
                return die_usage("--device '%s' is not one of cpu, cuda", optarg);
            so.device = !strcmp(optarg, "cuda") ? FASA_DEVICE_CUDA : FASA_DEVICE_CPU;
            break;
        case 'n': if (parse_int("--n-predict", optarg, 0, 1 << 20, &n_predict)) return EXIT_USAGE; break;
        case OPT_TEMP: if (parse_float("--temp", optarg, 0, 100, &temp)) return EXIT_USAGE; break;
        case OPT_TOPK: if (parse_int("--top-k", optarg, 0, 1 << 24, &top_k)) return EXIT_USAGE; break;
        case OPT_TOPP: if (parse_float("--top-p", optarg, 1e-6, 1, &top_p)) return EXIT_USAGE; break;
        case OPT_SEED: if (parse_int("--seed", optarg, 0, 1L << 62, &seed)) return EXIT_USAGE; break;
        case OPT_CHAT: chat = 1; break;
        case OPT_RAW: chat = 0; break;
        case OPT_SYSTEM: system = optarg; break;
        case OPT_CTX: if (parse_int("--ctx", optarg, 1, 1 << 24, &ctx)) return EXIT_USAGE; break;
        case OPT_IGNORE_EOS: ignore_eos = 1; break;
        case 't': if (parse_int("--threads", optarg, 1, 1024, &threads)) return EXIT_USAGE; break;
        case OPT_IDS: ids_path = optarg; break;
        case OPT_PRINT_IDS: print_ids = 1; break;
        case OPT_DUMP: dump = optarg; break;
        case OPT_JSON: json = 1; break;
        case 'h': fputs(usage_text, stdout); return 0;
        default: fputs(usage_text, stderr); return EXIT_USAGE;
        }
    }
    if (budget_auto || so.target_mass > 0) {   /* a budget that sets itself, at most SESSION_AUTO_MAX */
        if (!budget_auto && so.budget != session_defaults().budget)
            return die_usage("--target-mass goes with --budget auto, not a fixed budget");
        if (so.target_mass <= 0) so.target_mass = SESSION_AUTO_MASS;
        so.budget = SESSION_AUTO_MAX;
    }
    int rest = argc - optind;
    if (!model_path && rest >= 1 && (rest == 2 || looks_like_model(argv[optind]))) model_path = argv[optind++], rest--;
    if (rest > 1) return die_usage("too many arguments; see 'fasa run --help'");
    if (rest == 1) prompt = argv[optind];
    if (so.kv_cold && so.mode != FASA_MODE_FASA_M) return die_usage("--kv-cold is for --mode fasa-m");
    if (so.device == FASA_DEVICE_CUDA && so.kv_f16 == 1)
        return die_usage("--device cuda reads an f32 KV cache: drop --kv-type f16");
    char err[FASA_ERRLEN];
    /* after the usage checks, before any model is looked for */
    if (so.device == FASA_DEVICE_CUDA && session_cuda_check(err) < 0) return die("--device cuda: %s", err);
    if (!model_path && !(model_path = default_model_path()))
        return die_usage("no model given and no default model found: give MODEL or set FASA_MODEL "
                         "(scripts/setup.sh installs one)");
    if (threads) omp_set_num_threads((int)threads);

    model *m;
    double t0 = fasa_now();
    if (model_open(&m, model_path, err) < 0) return die("%s", err);
    const double t_load = fasa_now() - t0;
    const int V = m->cfg.n_vocab;
    int32_t *ids = NULL, *gen = NULL;
    char *text = NULL;
    float *all = NULL;
    session *ss = NULL;
    sampler sp = { 0 };
    textbuf out = { 0 };
    int status = 1, rc, n_prompt;

    if (ids_path) {
        if ((n_prompt = tokenizer_read_ids(ids_path, V, &ids, err)) < 0) { die("%s", err); goto out; }
    } else {
        if (!prompt || !strcmp(prompt, "-")) {
            if (isatty(0)) fprintf(stderr, "fasa: reading the prompt from stdin (end with Ctrl-D)\n");
            if (!(text = fasa_read_stream(stdin, NULL))) { die("cannot read the prompt from stdin"); goto out; }
            prompt = text;
        }
        if ((n_prompt = session_prompt_ids(m, prompt, chat, system, &ids, err)) < 0) {
            status = fail(n_prompt, err);
            goto out;
        }
    }
    so.n_ctx = (int)(ctx ? ctx : n_prompt + n_predict);
    if (n_prompt + n_predict > so.n_ctx) n_predict = so.n_ctx - n_prompt;
    if (n_predict < 0) {
        status = die_usage("the prompt (%d tokens) does not fit the context (%d)", n_prompt, so.n_ctx);
        goto out;
    }
    if (!ctx && so.n_ctx > m->cfg.n_ctx_train)
        fprintf(stderr, "fasa: warning: %d tokens exceed the model's training context (%d)\n", so.n_ctx,
                m->cfg.n_ctx_train);
    if ((rc = session_open(&ss, m, model_path, &so, err)) < 0) { status = fail(rc, err); goto out; }
    if ((rc = sampler_init(&sp, V, (float)temp, (int)top_k, (float)top_p, (uint64_t)seed, err)) < 0) {
        die("%s", err);
        goto out;
    }
    if (dump && !(all = malloc(sizeof(float) * n_prompt * V))) { die("out of memory"); goto out; }
    if (!(gen = malloc(sizeof *gen * (n_predict + 1)))) { die("out of memory"); goto out; }

    t0 = fasa_now();
    prefill_clock pc = { m, ss->s->n_past, 0, t0, t0 };
    if (isatty(2)) ss->o.progress = prefill_progress, ss->o.progress_ctx = &pc;
    if (session_prefill(ss, ids, n_prompt, all, err) < 0) {
        if (pc.width) fprintf(stderr, "\n");   /* the error on a line of its own */
        die("%s", err);
        goto out;
    }
    const double t_prefill = fasa_now() - t0;
    if (dump && write_file_atomic(dump, all, sizeof(float) * n_prompt * V)) goto out;

    int n_gen = 0;
    const uint64_t kv0 = run_state_kv_bytes_read(ss->s);
    t0 = fasa_now();
    for (; n_gen < n_predict; n_gen++) {
        const int32_t next = sampler_sample(&sp, session_logits(ss));
        gen[n_gen] = next;
        if (!ignore_eos && m->tok && next == tokenizer_eos(m->tok)) { n_gen++; break; }
        char piece[256];
        if (print_ids) {
            if (!json) printf(n_gen ? " %d" : "%d", next);
        } else if (m->tok) {
            int len = tokenizer_decode(m->tok, next, piece, sizeof piece);
            if (len > (int)sizeof piece) len = sizeof piece;
            if (len > 0 && json && text_add(&out, piece, len) < 0) { die("out of memory"); goto out; }
            if (len > 0 && !json) fwrite(piece, 1, len, stdout);
        }
        if (!json) fflush(stdout);
        if (n_gen + 1 == n_predict) { n_gen++; break; }
        if (session_step(ss, next, err) < 0) { die("%s", err); goto out; }
    }
    const double t_decode = fasa_now() - t0;
    const double kv_bytes = (double)(run_state_kv_bytes_read(ss->s) - kv0);
    const int n_steps = n_gen > 1 ? n_gen - 1 : 0;   /* forward passes in the decode loop */
    if (!json && (n_gen || print_ids)) putchar('\n'), fflush(stdout);   /* before the figures on stderr */

    const double pre_tps = n_prompt / t_prefill, dec_tps = n_steps ? n_steps / t_decode : 0;
    const double gbs = n_steps ? (n_steps * (double)m->weight_bytes + kv_bytes) / t_decode / 1e9 : 0;
    const kvcache *kv = &ss->s->kv;
    fprintf(stderr, "fasa: load %.2f s | prefill %d tokens, %.1f tok/s | decode %d tokens, %.1f tok/s, %.2f GB/s "
            "(weights %.1f MB + KV %.2f MB per token) | %d thread%s | %s KV | %s\n", t_load, n_prompt, pre_tps, n_steps,
            dec_tps, gbs, m->weight_bytes / 1e6, n_steps ? kv_bytes / n_steps / 1e6 : 0, omp_get_max_threads(),
            fasa_plural(omp_get_max_threads()), kv_type_name(kv->f16), ss->note);
    if (kv->cold)
        fprintf(stderr, "fasa: KV cache of %d tokens: %.2f MB resident (dominant key block), %.2f MB in the cold tier, "
                "of %.2f MB\n", ss->s->n_past, kvcache_resident_bytes(kv, ss->s->n_past) / 1e6,
                kvcache_cold_bytes(kv, ss->s->n_past) / 1e6, kvcache_bytes(kv, ss->s->n_past) / 1e6);
    if (json)
        print_json(print_ids ? NULL : &out, gen, n_gen, ids, n_prompt, pre_tps, dec_tps, gbs,
                   n_steps ? kv_bytes / n_steps : 0, ss);
    status = 0;
out:
    free(out.p);
    free(gen);
    free(all);
    sampler_free(&sp);
    session_close(ss);
    free(ids);
    free(text);
    model_close(m);
    return status;
}

/* run.c - `fasa run [MODEL] [PROMPT|-]`: tokenize, prefill, decode, stream text to stdout. */
#include <cjson/cJSON.h>
#include <getopt.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "attention.h"
#include "cmd.h"
#include "kernels/fasa_cuda.h"
#include "model.h"
#include "sampler.h"

static const char usage_text[] =
    "usage: fasa run [MODEL] [PROMPT|-] [options]\n"
    "\n"
    "Generates text. MODEL is a GGUF file, a Hugging Face directory or a .safetensors file;\n"
    "without it the default model installed by setup is used. PROMPT '-' (or none) reads stdin.\n"
    "Tokens stream to stdout; speed figures go to stderr.\n"
    "\n"
    "  -m, --model PATH      model (instead of the first argument)\n"
    "      --mode MODE       attention: full; fasa-c (FASA over the whole cache); or fasa-m (only\n"
    "                        the dominant key dims in memory, the rest of the cache in a file read\n"
    "                        for the chosen tokens). The default is fasa-c when MODEL has a\n"
    "                        profile (fasa calibrate), else full\n"
    "  -p, --profile FILE    calibration profile (default: MODEL's .profile.json when present)\n"
    "      --budget N        fasa: tokens attended per query (default 256)\n"
    "      --fcs F           fasa: dominant frequency chunks per head (default: the profile's)\n"
    "      --dense-layers N  fasa: first N layers attend densely (default 1)\n"
    "      --dense LIST      fasa: these layers attend densely too, e.g. 20,14 (the layers\n"
    "                        'fasa bench --task ca --per-layer' shows losing attention mass on\n"
    "                        the calibration text)\n"
    "      --sinks N         fasa: the first N tokens are always attended (default 4)\n"
    "      --recent N        fasa: so are the last N (default: half the budget); the budget\n"
    "                        includes both. Chosen on the calibration text: README, Accuracy\n"
    "      --group           fasa: one selection per KV head (sum of its query heads' scores)\n"
    "      --per-head        fasa: each head scores its own top F chunks, which the cache keeps in\n"
    "                        a block holding the union of its KV group's heads' (wider: about\n"
    "                        2.5x the bytes TIP reads at F = 8), instead of the group's top F\n"
    "                        chunks for all its heads (the default block). More accurate: README\n"
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
    "      --chat            wrap the prompt in the model's chat template (default when the\n"
    "                        vocabulary has one: ChatML or Llama-3)\n"
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
       OPT_DENSE, OPT_GROUP, OPT_DEVICE, OPT_PER_HEAD, OPT_KV_COLD, OPT_ORDER, OPT_KV_TYPE, OPT_DENSE_LIST,
       OPT_SINKS, OPT_RECENT };

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
    { "dense", required_argument, 0, OPT_DENSE_LIST }, { "sinks", required_argument, 0, OPT_SINKS },
    { "recent", required_argument, 0, OPT_RECENT },
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

/* Reads whitespace-separated ids; returns the count or -1. */
static int read_ids(const char *path, int32_t **out, int n_vocab)
{
    FILE *f = strcmp(path, "-") ? fopen(path, "r") : stdin;
    if (!f) return die("cannot open '%s': %m", path), -1;
    int cap = 1024, n = 0;
    int32_t *ids = malloc(cap * sizeof *ids);
    long v;
    int rc;
    while (ids && (rc = fscanf(f, "%ld", &v)) == 1) {
        if (v < 0 || v >= n_vocab) {
            die("'%s': token id %ld is outside the vocabulary (%d)", path, v, n_vocab);
            n = -1;
            break;
        }
        if (n == cap) {
            int32_t *nb = realloc(ids, (cap *= 2) * sizeof *ids);
            if (!nb) { free(ids); ids = NULL; break; }
            ids = nb;
        }
        ids[n++] = (int32_t)v;
    }
    if (n >= 0 && ids && !feof(f)) { die("'%s': not a list of token ids", path); n = -1; }
    if (f != stdin) fclose(f);
    if (!ids) return die("out of memory"), -1;
    if (n <= 0) { free(ids); if (n == 0) die("'%s': no token ids", path); return -1; }
    *out = ids;
    return n;
}

/* --device cuda: a device with fasa's kernels must exist; decode attention then runs on it
 * through the forward pass's attention hook (fasa_cuda_attend mirrors the CPU cache as f16). */
static int cuda_device_check(void)
{
    char err[FASA_ERRLEN];
    fasa_cuda_device dev;
    if (fasa_cuda_devices(&dev, 1, err) < 0) return die("--device cuda: %s", err);
    if (!dev.has_kernels)
        return die("--device cuda: '%s' has compute capability %d.%d; fasa's kernels are built for sm_80 and sm_90",
                   dev.name, dev.cc_major, dev.cc_minor);
    return 0;
}

typedef struct cuda_hook { fasa_cuda *cu; fasa_cuda_kv *kv; int group; } cuda_hook;

static int cuda_attend(void *ctx, const run_state *s, int layer, int head, int pos, const float *q, const int32_t *idx,
                       int n, float *out, char *err)
{
    const cuda_hook *c = ctx;
    const kvcache *kv = &s->kv;
    const int g = head / c->group;
    return fasa_cuda_attend(c->kv, layer, head, kvcache_k(kv, layer, g), kv->n_split ? kvcache_kr(kv, layer, g) : NULL,
                            kvcache_v(kv, layer, g), pos + 1, q, idx, n, out, err);
}

int cmd_run(int argc, char **argv)
{
    const char *model_path = NULL, *prompt = NULL, *system = NULL, *ids_path = NULL, *dump = NULL;
    const char *mode = NULL, *prof_path = NULL;
    long budget = 256, fcs = 0, dense_layers = 1, sinks = -1, recent = -1;
    int group = 0, on_cuda = 0, per_head = 0, order_chunks = 0;
    cuda_hook hook = { 0 };
    const char *kv_cold = NULL;
    int kv_f16 = -1;   /* -1: the default */
    uint64_t dense_mask = 0;
    long n_predict = 256, top_k = 0, seed = 42, ctx = 0, threads = 0;
    double temp = 0, top_p = 1;
    int chat = -1, ignore_eos = 0, print_ids = 0, json = 0, c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "m:n:t:p:h", long_opts, NULL)) != -1) {
        switch (c) {
        case 'm': model_path = optarg; break;
        case OPT_MODE:
            if (strcmp(optarg, "full") && strcmp(optarg, "fasa-c") && strcmp(optarg, "fasa-m") && strcmp(optarg, "fasa"))
                return die_usage("--mode '%s' is not one of full, fasa-c, fasa-m", optarg);
            mode = optarg;
            break;
        case 'p': prof_path = optarg; break;
        case OPT_BUDGET: if (parse_int("--budget", optarg, 1, 1 << 24, &budget)) return EXIT_USAGE; break;
        case OPT_FCS: if (parse_int("--fcs", optarg, 1, 512, &fcs)) return EXIT_USAGE; break;
        case OPT_DENSE: if (parse_int("--dense-layers", optarg, 0, 1024, &dense_layers)) return EXIT_USAGE; break;
        case OPT_GROUP: group = 1; break;
        case OPT_SINKS: if (parse_int("--sinks", optarg, 0, 1 << 24, &sinks)) return EXIT_USAGE; break;
        case OPT_RECENT: if (parse_int("--recent", optarg, 0, 1 << 24, &recent)) return EXIT_USAGE; break;
        case OPT_PER_HEAD: per_head = 1; break;
        case OPT_ORDER: order_chunks = 1; break;
        case OPT_KV_COLD: kv_cold = optarg; break;
        case OPT_DENSE_LIST:
            if (policy_parse_layers(optarg, ',', &dense_mask) < 0)
                return die_usage("--dense needs layer numbers 0..63 separated by commas, not '%s'", optarg);
            break;
        case OPT_KV_TYPE: if (parse_kv_type(optarg, &kv_f16)) return EXIT_USAGE; break;
        case OPT_DEVICE:
            if (strcmp(optarg, "cpu") && strcmp(optarg, "cuda")) return die_usage("--device '%s' is not one of cpu, cuda", optarg);
            on_cuda = !strcmp(optarg, "cuda");
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
    int rest = argc - optind;
    if (!model_path && rest >= 1 && (rest == 2 || looks_like_model(argv[optind]))) model_path = argv[optind++], rest--;
    if (rest > 1) return die_usage("too many arguments; see 'fasa run --help'");
    if (rest == 1) prompt = argv[optind];
    if (on_cuda && kv_f16 == 1) return die_usage("--device cuda reads an f32 KV cache: drop --kv-type f16");
    if (on_cuda && cuda_device_check()) return 1;   /* after the usage checks, before any model is looked for */
    if (!model_path && !(model_path = default_model_path()))
        return die_usage("no model given and no default model found: give MODEL or set FASA_MODEL "
                         "(scripts/setup.sh installs one)");
    if (threads) omp_set_num_threads((int)threads);

    char err[FASA_ERRLEN];
    model *m;
    double t0 = fasa_now();
    if (model_open(&m, model_path, err) < 0) return die("%s", err);
    const model_config *cfg = &m->cfg;
    double t_load = fasa_now() - t0;

    /* The prompt, as ids. */
    int32_t *ids = NULL;
    int n_prompt;
    char *text = NULL;
    int status = 1;

    /* FASA: on by default when the model has a profile. */
    profile prof = { 0 };
    policy pol = { 0 };
    kv_opts kvo = { .f16 = kv_f16 < 0 ? !on_cuda : kv_f16 };
    int fasa = 0;
    char defp[4096], mode_note[8192] = "full attention";
    char bundle_prof[4200] = "";
    if (!prof_path && (!mode || strcmp(mode, "full"))) {
        if (profile_find(model_path, defp, sizeof defp)) prof_path = defp;
        else if (m->bundle_profile) snprintf(bundle_prof, sizeof bundle_prof, "%s:profile.json", model_path), prof_path = bundle_prof;
    }
    if (kv_cold && (!mode || strcmp(mode, "fasa-m"))) {
        status = die_usage("--kv-cold is for --mode fasa-m");
        goto out;
    }
    if (mode && strcmp(mode, "full") && !prof_path) {
        status = die_usage("--mode %s needs a profile: run 'fasa calibrate %s' or give -p", mode, model_path);
        goto out;
    }
    if (order_chunks && !prof_path) { status = die_usage("--order-chunks needs a profile (-p)"); goto out; }
    const int use_fasa = prof_path && (!mode || strcmp(mode, "full"));
    if (use_fasa || order_chunks) {   /* the profile, loaded once and checked against the model */
        int lrc = prof_path == bundle_prof ? profile_parse(&prof, m->bundle_profile, m->bundle_profile_len, prof_path, err)
                                           : profile_load(&prof, prof_path, err);
        if (lrc < 0 || profile_check_model(&prof, m, prof_path, err) < 0) {
            die("%s", err);
            goto out;
        }
    }
    if (use_fasa) {
        policy_opts po = policy_defaults(POLICY_FASA, m, (int)budget);
        po.prof = &prof;
        po.fcs = fcs ? (int)fcs : prof.fcs;
        po.n_dense_layers = (int)dense_layers;
        po.dense_mask = dense_mask;
        if (cfg->n_layer < 64 && dense_mask >> cfg->n_layer) {
            status = die_usage("--dense: '%s' has %d layers", model_path, cfg->n_layer);
            goto out;
        }
        po.group = group;
        if (sinks >= 0) po.n_sink = (int)sinks;
        if (recent >= 0) po.n_recent = (int)recent;
        /* Split keys: the group's top F chunks (or the union of its heads' own) first in every
         * key, stored as their own block. */
        const int fasa_m = mode && !strcmp(mode, "fasa-m");
        const int width = model_key_block(m, &prof, po.fcs, per_head && !group, err);
        if (width < 0) { die("%s", err); goto out; }
        if (width) {
            po.block = group ? 0 : per_head ? 2 : 1;
            kvo.n_split = 2 * width;
        } else if (fasa_m) {
            status = die_usage("--mode fasa-m keeps a contiguous block of dominant key dims: it needs a profile of "
                               "RoPE-plane chunks and F below %d", cfg->d_head / 2);
            goto out;
        }
        if (fasa_m) {
            kvo.cold_dir = kv_cold ? kv_cold : getenv("TMPDIR") && *getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
        } else if (kv_cold) {
            status = die_usage("--kv-cold is for --mode fasa-m");
            goto out;
        }
        int rc = policy_init(&pol, m, &po, err);
        if (rc < 0) {   /* FASA_EARG: a flag outside what this model allows (--fcs) */
            status = rc == FASA_EARG ? die_usage("%s", err) : die("%s", err);
            goto out;
        }
        fasa = 1;
        char dense_note[256] = "";
        for (int l = 0; l < 64; l++)
            if (dense_mask >> l & 1)
                snprintf(dense_note + strlen(dense_note), sizeof dense_note - strlen(dense_note), "%s%d",
                         *dense_note ? "," : " + layers ", l);
        snprintf(mode_note, sizeof mode_note,
                 "%s (profile '%s', budget %ld with %d sink%s and %d recent, F %d of %d chunks, %ld dense layer%s%s%s%s)",
                 fasa_m ? "fasa-m" : "fasa-c", prof_path, budget, po.n_sink, po.n_sink == 1 ? "" : "s",
                 po.n_recent < 0 ? (int)budget / 2 : po.n_recent, po.fcs, cfg->d_head / 2, dense_layers,
                 dense_layers == 1 ? "" : "s", dense_note, group ? ", per-KV-head selection" : "",
                 po.block == 2 ? ", TIP over a block of the group's heads' own chunks"
                 : kvo.n_split ? ", TIP over the contiguous dominant key block" : ", TIP gathers each head's dims");
    } else if (order_chunks) {
        if (model_rank_chunks(m, &prof, err) < 0) {
            die("%s", err);
            goto out;
        }
        snprintf(mode_note, sizeof mode_note, "full attention, key dims in the order of '%s'", prof_path);
    } else if (!mode) {
        snprintf(mode_note, sizeof mode_note, "full attention (no profile: 'fasa calibrate %s' enables fasa-c)", model_path);
    }
    if (ids_path) {
        if ((n_prompt = read_ids(ids_path, &ids, cfg->n_vocab)) < 0) goto out;
    } else {
        if (!m->tok) { status = die_usage("'%s' has no tokenizer; give the prompt with --ids", model_path); goto out; }
        if (!prompt || !strcmp(prompt, "-")) {
            if (isatty(0)) fprintf(stderr, "fasa: reading the prompt from stdin (end with Ctrl-D)\n");
            if (!(text = fasa_read_stream(stdin, NULL))) { die("cannot read the prompt from stdin"); goto out; }
            prompt = text;
        }
        int has_chatml = tokenizer_find(m->tok, "<|im_start|>") >= 0;
        int has_llama3 = tokenizer_find(m->tok, "<|start_header_id|>") >= 0;
        if (chat < 0) chat = has_chatml || has_llama3;
        const char *input = prompt;
        char *rendered = NULL;
        if (chat) {
            if (!has_chatml && !has_llama3) { status = die_usage("'%s' has no chat template tokens; use --raw", model_path); goto out; }
            enum tokenizer_chat kind = has_chatml ? TOKENIZER_CHAT_CHATML : TOKENIZER_CHAT_LLAMA3;
            /* SmolLM2's own template adds this system message when none is given. */
            if (!system && has_chatml && strstr(m->name, "mol"))
                system = "You are a helpful AI assistant named SmolLM, trained by Hugging Face";
            int need = tokenizer_chat_render(kind, system, prompt, NULL, 0);
            if (need < 0 || !(rendered = malloc(need + 1))) { die("out of memory"); goto out; }
            tokenizer_chat_render(kind, system, prompt, rendered, need + 1);
            input = rendered;
        }
        size_t len = strlen(input);
        int cap = (int)(3 * len + 16);   /* invalid UTF-8 can give up to 3 ids a byte */
        ids = malloc(cap * sizeof *ids);
        n_prompt = ids ? tokenizer_encode(m->tok, input, len, chat, ids, cap) : -1;
        free(rendered);
        if (n_prompt <= 0) { die(n_prompt == 0 ? "the prompt is empty" : "cannot tokenize the prompt"); goto out; }
    }

    long n_ctx = ctx ? ctx : n_prompt + n_predict;
    if (n_prompt + n_predict > n_ctx) n_predict = n_ctx - n_prompt;
    if (n_predict < 0) { status = die_usage("the prompt (%d tokens) does not fit the context (%ld)", n_prompt, n_ctx); goto out; }
    if (!ctx && n_ctx > cfg->n_ctx_train)
        fprintf(stderr, "fasa: warning: %ld tokens exceed the model's training context (%d)\n", n_ctx, cfg->n_ctx_train);

    const int n_batch = 64;
    run_state *s = run_state_new_kv(m, (int)n_ctx, n_batch, &kvo, err);
    if (!s) { die("%s", err); goto out; }
    if (fasa) {
        if (attention_use_policy(s, &pol, n_prompt, err) < 0) { run_state_free(s); die("%s", err); goto out; }
    }
    sampler sp;
    if (sampler_init(&sp, cfg->n_vocab, (float)temp, (int)top_k, (float)top_p, (uint64_t)seed, err) < 0) {
        run_state_free(s);
        die("%s", err);
        goto out;
    }

    float *all = NULL;
    if (dump && !(all = malloc(sizeof(float) * n_prompt * cfg->n_vocab))) { die("out of memory"); goto out_state; }

    /* Prefill in batches. */
    t0 = fasa_now();
    for (int i = 0; i < n_prompt; i += n_batch) {
        int nb = n_prompt - i < n_batch ? n_prompt - i : n_batch;
        if (model_forward(m, s, ids + i, nb, dump != NULL, err) < 0) { die("%s", err); goto out_state; }
        if (dump) memcpy(all + (size_t)i * cfg->n_vocab, s->logits, sizeof(float) * nb * cfg->n_vocab);
    }
    double t_prefill = fasa_now() - t0;
    /* --device cuda: the decode steps' attention on the device (prefill stays on the CPU) */
    hook.group = cfg->n_head / cfg->n_kv_head;
    if (on_cuda) {
        if (fasa_cuda_open(&hook.cu, 0, err) < 0 ||
            fasa_cuda_kv_open(hook.cu, &hook.kv, cfg->n_layer, cfg->n_head, cfg->n_kv_head, (int)n_ctx, cfg->d_head,
                              s->kv.n_split, err) < 0) {
            die("--device cuda: %s", err);
            goto out_state;
        }
        s->attend_hook = cuda_attend;
        s->attend_ctx = &hook;
        snprintf(mode_note + strlen(mode_note), sizeof mode_note - strlen(mode_note), "; decode attention on CUDA device 0");
    }
    if (dump) {
        if (write_file_atomic(dump, all, sizeof(float) * n_prompt * cfg->n_vocab)) goto out_state;
    }
    const float *last = s->logits + (dump ? (size_t)((n_prompt - 1) % n_batch) * cfg->n_vocab : 0);
    memmove(s->logits, last, sizeof(float) * cfg->n_vocab);

    /* Decode. */
    int32_t *gen = malloc(sizeof(int32_t) * (n_predict + 1));
    cJSON *jtext = NULL;
    size_t text_cap = 256, text_len = 0;
    char *out_text = json ? malloc(text_cap) : NULL;
    int n_gen = 0;
    const uint64_t kv0 = run_state_kv_bytes_read(s);
    t0 = fasa_now();
    for (; n_gen < n_predict; n_gen++) {
        int32_t next = sampler_sample(&sp, s->logits);
        gen[n_gen] = next;
        if (!ignore_eos && m->tok && next == tokenizer_eos(m->tok)) { n_gen++; break; }
        char piece[256];
        if (print_ids) {
            if (!json) printf(n_gen ? " %d" : "%d", next);
        } else if (m->tok) {
            int len = tokenizer_decode(m->tok, next, piece, sizeof piece);
            if (len > (int)sizeof piece) len = sizeof piece;
            if (len > 0) {
                if (json) {
                    if (text_len + len + 1 > text_cap) {
                        char *nb = realloc(out_text, text_cap = 2 * (text_len + len + 1));
                        if (!nb) { die("out of memory"); goto out_gen; }
                        out_text = nb;
                    }
                    memcpy(out_text + text_len, piece, len);
                    text_len += len;
                } else {
                    fwrite(piece, 1, len, stdout);
                }
            }
        }
        if (!json) fflush(stdout);
        if (n_gen + 1 == n_predict) { n_gen++; break; }
        if (model_forward(m, s, &next, 1, 0, err) < 0) { die("%s", err); goto out_gen; }
    }
    double t_decode = fasa_now() - t0;
    double kv_bytes = (double)(run_state_kv_bytes_read(s) - kv0);
    int n_steps = n_gen > 1 ? n_gen - 1 : 0;   /* forward passes in the decode loop */
    if (!json && (n_gen || print_ids)) putchar('\n');

    double pre_tps = n_prompt / t_prefill;
    double dec_tps = n_steps ? n_steps / t_decode : 0;
    double gbs = n_steps ? (n_steps * (double)m->weight_bytes + kv_bytes) / t_decode / 1e9 : 0;
    fprintf(stderr, "fasa: load %.2f s | prefill %d tokens, %.1f tok/s | decode %d tokens, %.1f tok/s, %.2f GB/s "
            "(weights %.1f MB + KV %.2f MB per token) | %d threads | %s KV | %s\n", t_load, n_prompt, pre_tps, n_steps, dec_tps, gbs,
            m->weight_bytes / 1e6, n_steps ? kv_bytes / n_steps / 1e6 : 0, omp_get_max_threads(), kv_type_name(s->kv.f16), mode_note);
    if (s->kv.cold)
        fprintf(stderr, "fasa: KV cache of %d tokens: %.2f MB resident (dominant key block), %.2f MB in the cold tier, of %.2f MB\n",
                s->n_past, kvcache_resident_bytes(&s->kv, s->n_past) / 1e6, kvcache_cold_bytes(&s->kv, s->n_past) / 1e6,
                kvcache_bytes(&s->kv, s->n_past) / 1e6);
    if (json) {
        cJSON *o = cJSON_CreateObject();
        if (out_text) jtext = cJSON_AddStringToObject(o, "text", (out_text[text_len] = 0, out_text));
        (void)jtext;
        cJSON *arr = cJSON_AddArrayToObject(o, "ids");
        for (int i = 0; i < n_gen; i++) cJSON_AddItemToArray(arr, cJSON_CreateNumber(gen[i]));
        cJSON_AddNumberToObject(o, "n_prompt", n_prompt);
        cJSON_AddNumberToObject(o, "prefill_tok_s", pre_tps);
        cJSON_AddNumberToObject(o, "decode_tok_s", dec_tps);
        cJSON_AddNumberToObject(o, "decode_gb_s", gbs);
        cJSON_AddNumberToObject(o, "threads", omp_get_max_threads());
        cJSON_AddStringToObject(o, "mode", fasa ? "fasa-c" : "full");
        cJSON_AddNumberToObject(o, "kv_bytes_per_token", n_steps ? kv_bytes / n_steps : 0);
        char *str = cJSON_Print(o);
        puts(str);
        free(str);
        cJSON_Delete(o);
    }
    status = 0;
out_gen:
    free(gen);
    free(out_text);
out_state:
    if (hook.kv) fasa_cuda_kv_close(hook.kv);
    if (hook.cu) fasa_cuda_close(hook.cu);
    free(all);
    sampler_free(&sp);
    run_state_free(s);
out:
    policy_free(&pol);
    profile_free(&prof);
    free(ids);
    free(text);
    model_close(m);
    return status;
}

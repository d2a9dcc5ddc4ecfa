/* inspect.c - `fasa inspect MODEL|PROFILE`: what a model file holds and what running it costs, or
 * what a calibration profile found (summary, heatmap, CSV, comparison, exports for other engines). */
#include <cjson/cJSON.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cmd.h"
#include "export.h"
#include "gguf.h"
#include "heatmap.h"
#include "model.h"
#include "profile.h"
#include "safetensors.h"
#include "session.h"

static const char usage_text[] =
    "usage: fasa inspect MODEL [options]\n"
    "       fasa inspect PROFILE.json [options]\n"
    "       fasa inspect --devices [--json]\n"
    "\n"
    "Shows a model's architecture, tensors (dtype, shape, bytes), parameter count, memory, RoPE\n"
    "layout and tokenizer; or, for a calibration profile (a *.json file or any file starting with '{'),\n"
    "per layer: the chunks most often in the heads' top F, each head's best-chunk CA (min/mean/max),\n"
    "the mean CA of the top-F chunks vs all chunks, and how many distinct chunks the heads' top-F\n"
    "sets cover (union) and share.\n"
    "\n"
    "      --tensors         (model) list every tensor (default: a summary by dtype)\n"
    "      --json            print the same facts as JSON\n"
    "      --k K             (profile) the K to show: one of the profile's K list (default its rank_k)\n"
    "      --fcs F           (profile) dominant chunks per head (default the profile's fcs)\n"
    "      --csv FILE        (profile) every K as rows k,layer,head,chunk,ca,rank (rank 1 = best)\n"
    "      --heatmap FILE    (profile) PNG: a heads x chunks panel per layer, coloured by CA at K\n"
    "      --marks           (profile) dot each head's top F chunks in the heatmap\n"
    "      --compare OTHER   (profile) overlap of the dominant sets of two profiles of one model,\n"
    "                        per layer, for F = chunks/8, chunks/4 and --fcs\n"
    "      --export KIND -o FILE\n"
    "                        (profile) sglang-ds: SGLang Double Sparsity channel config (pass\n"
    "                        --ds-heavy-channel-num 2F to SGLang to keep the top F chunks); its\n"
    "                        backend needs n_head == n_kv_head. json-dims: each head's top F\n"
    "                        chunks and their Hugging Face dims\n"
    "      --type qk|q|k     (sglang-ds) the key suffix; k writes one row per KV head (group ranking)\n"
    "      --devices         the CUDA devices fasa's kernels can use (or why there are none)\n"
    "  -h, --help            this text\n";

/* One row per tensor of the file(s), whatever the format. */
typedef struct trow { char name[128]; const char *dtype; int n_dims; int64_t shape[4]; uint64_t bytes; } trow;

static int collect_tensors(const model *m, trow **out)
{
    int n = 0;
    trow *rows = NULL;
    if (m->source == MODEL_SOURCE_GGUF) {
        const gguf_file *g = m->file;
        rows = calloc(g->n_tensors + 1, sizeof *rows);
        for (uint64_t i = 0; rows && i < g->n_tensors; i++, n++) {
            const gguf_tensor *t = &g->tensors[i];
            snprintf(rows[n].name, sizeof rows[n].name, "%.*s", (int)(t->name.len < 127 ? t->name.len : 127),
                     t->name.ptr);
            rows[n].dtype = gguf_type_name(t->type);
            rows[n].n_dims = t->n_dims;
            /* Shown outermost first, as Hugging Face and numpy do. */
            for (uint32_t d = 0; d < t->n_dims; d++) rows[n].shape[d] = t->ne[t->n_dims - 1 - d];
            rows[n].bytes = t->nbytes;
        }
    } else {
        const st_sharded *s = m->file;
        int total = 0;
        for (int f = 0; f < s->n_files; f++) total += s->files[f].n_tensors;
        rows = calloc(total + 1, sizeof *rows);
        for (int f = 0; rows && f < s->n_files; f++)
            for (int i = 0; i < s->files[f].n_tensors; i++, n++) {
                const st_tensor *t = &s->files[f].tensors[i];
                snprintf(rows[n].name, sizeof rows[n].name, "%s", t->name);
                rows[n].dtype = st_dtype_name(t->dtype);
                rows[n].n_dims = t->n_dims > 4 ? 4 : t->n_dims;
                for (int d = 0; d < rows[n].n_dims; d++) rows[n].shape[d] = t->shape[d];
                rows[n].bytes = t->end - t->begin;
            }
    }
    *out = rows;
    return rows ? n : -1;
}

/* A .safetensors file with no config.json beside it: its tensors and metadata, which is all the
 * file says (the model facts need the config). */
static int inspect_safetensors(const char *path, int json)
{
    char err[FASA_ERRLEN];
    st_file f;
    if (st_open(&f, path, err) < 0) return die("%s", err);
    uint64_t total = 0;
    for (int i = 0; i < f.n_tensors; i++) total += f.tensors[i].end - f.tensors[i].begin;
    if (json) {
        cJSON *o = cJSON_CreateObject(), *md = cJSON_AddObjectToObject(o, "metadata");
        cJSON_AddStringToObject(o, "format", "safetensors");
        cJSON_AddNumberToObject(o, "tensor_bytes", (double)total);
        for (int i = 0; i < f.n_meta; i++) cJSON_AddStringToObject(md, f.meta_keys[i], f.meta_vals[i]);
        cJSON *arr = cJSON_AddArrayToObject(o, "tensors");
        for (int i = 0; i < f.n_tensors; i++) {
            const st_tensor *t = &f.tensors[i];
            cJSON *r = cJSON_CreateObject();
            cJSON_AddStringToObject(r, "name", t->name);
            cJSON_AddStringToObject(r, "dtype", st_dtype_name(t->dtype));
            cJSON *sh = cJSON_AddArrayToObject(r, "shape");
            for (int d = 0; d < t->n_dims; d++) cJSON_AddItemToArray(sh, cJSON_CreateNumber((double)t->shape[d]));
            cJSON_AddNumberToObject(r, "bytes", (double)(t->end - t->begin));
            cJSON_AddItemToArray(arr, r);
        }
        char *text = cJSON_Print(o);
        cJSON_Delete(o);
        if (text) puts(text);
        free(text);
    } else {
        printf("format        safetensors, %d tensors, %.1f MB (no config.json beside it: tensors only)\n",
               f.n_tensors, total / 1e6);
        for (int i = 0; i < f.n_meta; i++) printf("metadata      %s = %s\n", f.meta_keys[i], f.meta_vals[i]);
        for (int i = 0; i < f.n_tensors; i++) {
            const st_tensor *t = &f.tensors[i];
            char shape[96] = "";
            for (int d = 0; d < t->n_dims; d++)
                snprintf(shape + strlen(shape), sizeof shape - strlen(shape), "%s%lld", d ? " x " : "",
                         (long long)t->shape[d]);
            printf("  %-48s %-5s %-20s %12llu\n", t->name, st_dtype_name(t->dtype), shape,
                   (unsigned long long)(t->end - t->begin));
        }
    }
    st_close(&f);
    return fflush(stdout) == 0 ? 0 : die("cannot write to standard output");
}

static int inspect_model(const char *path, int json, int all)
{
    char err[FASA_ERRLEN];
    model *m;
    if (model_open(&m, path, err) < 0) return die("%s", err);
    const model_config *cf = &m->cfg;
    trow *rows;
    int n = collect_tensors(m, &rows);
    if (n < 0) { model_close(m); return die("out of memory"); }
    const double kv_tok = 2.0 * cf->n_layer * cf->n_kv_head * cf->d_head * sizeof(float);
    const char *layout = cf->layout == ROPE_LAYOUT_HF ? "rotate_half (chunk j = dims j, j+d/2)"
                         : cf->layout == ROPE_LAYOUT_INTERLEAVED
                             ? "interleaved (chunk j = dims 2j, 2j+1)"
                             : "fasa-permuted (pair r = chunk order[r], dominant first)";
    const char *scaling = cf->rope_scaling == ROPE_SCALING_LLAMA3 ? "llama3"
                          : cf->rope_scaling == ROPE_SCALING_LINEAR ? "linear" : "none";
    if (json) {
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "path", path);
        cJSON_AddStringToObject(o, "name", m->name);
        cJSON_AddStringToObject(o, "format", m->source == MODEL_SOURCE_GGUF ? "gguf" : "safetensors");
        cJSON_AddStringToObject(o, "architecture", fasa_arch_name(cf->arch));
        cJSON_AddNumberToObject(o, "n_layer", cf->n_layer);
        cJSON_AddNumberToObject(o, "d_model", cf->d_model);
        cJSON_AddNumberToObject(o, "n_head", cf->n_head);
        cJSON_AddNumberToObject(o, "n_kv_head", cf->n_kv_head);
        cJSON_AddNumberToObject(o, "d_head", cf->d_head);
        cJSON_AddNumberToObject(o, "n_chunks", cf->d_head / 2);
        cJSON_AddNumberToObject(o, "d_ff", cf->d_ff);
        cJSON_AddNumberToObject(o, "n_vocab", cf->n_vocab);
        cJSON_AddNumberToObject(o, "n_ctx_train", cf->n_ctx_train);
        cJSON_AddNumberToObject(o, "rope_theta", cf->rope_theta);
        cJSON_AddStringToObject(o, "rope_scaling", scaling);
        cJSON_AddStringToObject(o, "rope_layout",
                                cf->layout == ROPE_LAYOUT_HF            ? "rotate_half"
                                : cf->layout == ROPE_LAYOUT_INTERLEAVED ? "interleaved"
                                                                        : "fasa-permuted");
        cJSON_AddNumberToObject(o, "norm_eps", cf->norm_eps);
        cJSON_AddBoolToObject(o, "tied_embeddings", cf->tied_embeddings);
        cJSON_AddBoolToObject(o, "qkv_bias", cf->qkv_bias);
        cJSON_AddNumberToObject(o, "n_params", (double)m->n_params);
        cJSON_AddNumberToObject(o, "weight_bytes", (double)m->weight_bytes);
        cJSON_AddNumberToObject(o, "kv_bytes_per_token", kv_tok);
        if (m->tok) {
            cJSON *t = cJSON_AddObjectToObject(o, "tokenizer");
            cJSON_AddNumberToObject(t, "n_vocab", tokenizer_n_vocab(m->tok));
            cJSON_AddNumberToObject(t, "bos", tokenizer_bos(m->tok));
            cJSON_AddNumberToObject(t, "eos", tokenizer_eos(m->tok));
        }
        cJSON *ts = cJSON_AddArrayToObject(o, "tensors");
        for (int i = 0; i < n; i++) {
            cJSON *t = cJSON_CreateObject();
            cJSON_AddStringToObject(t, "name", rows[i].name);
            cJSON_AddStringToObject(t, "dtype", rows[i].dtype ? rows[i].dtype : "?");
            cJSON *sh = cJSON_AddArrayToObject(t, "shape");
            for (int d = 0; d < rows[i].n_dims; d++)
                cJSON_AddItemToArray(sh, cJSON_CreateNumber((double)rows[i].shape[d]));
            cJSON_AddNumberToObject(t, "bytes", (double)rows[i].bytes);
            cJSON_AddItemToArray(ts, t);
        }
        char *s = cJSON_Print(o);
        puts(s);
        free(s);
        cJSON_Delete(o);
    } else {
        printf("model         %s\n", path);
        printf("name          %s\n", m->name);
        printf("format        %s, %d tensors\n", m->source == MODEL_SOURCE_GGUF ? "GGUF" : "safetensors", n);
        printf("architecture  %s: %d layers, hidden %d, ffn %d, vocab %d, context %d\n", fasa_arch_name(cf->arch),
               cf->n_layer, cf->d_model, cf->d_ff, cf->n_vocab, cf->n_ctx_train);
        printf("attention     %d query heads, %d KV heads (group %d), head dim %d = %d frequency chunks%s\n",
               cf->n_head, cf->n_kv_head, cf->n_head / cf->n_kv_head, cf->d_head, cf->d_head / 2,
               cf->qkv_bias ? ", q/k/v bias" : "");
        printf("rope          theta %g, scaling %s, file layout %s\n", cf->rope_theta, scaling, layout);
        printf("norm          RMSNorm, eps %g; embeddings %s\n", cf->norm_eps,
               cf->tied_embeddings ? "tied" : "separate");
        printf("parameters    %.1f M\n", m->n_params / 1e6);
        printf("memory        weights %.1f MB; KV cache (f16) %.1f KB per token, %.1f MB at %d tokens (f32: twice)\n",
               m->weight_bytes / 1e6, kv_tok / 2e3, kv_tok / 2 * cf->n_ctx_train / 1e6, cf->n_ctx_train);
        if (m->tok)
            printf("tokenizer     byte-level BPE, %d tokens, bos %d, eos %d\n", tokenizer_n_vocab(m->tok),
                   tokenizer_bos(m->tok), tokenizer_eos(m->tok));
        else
            printf("tokenizer     none\n");
        /* dtype summary */
        printf("\n%-10s %8s %12s\n", "dtype", "tensors", "MB");
        for (int i = 0; i < n; i++) {
            int seen = 0;
            for (int k = 0; k < i && !seen; k++) seen = rows[k].dtype == rows[i].dtype;
            if (seen) continue;
            int cnt = 0;
            double mb = 0;
            for (int k = i; k < n; k++)
                if (rows[k].dtype == rows[i].dtype) cnt++, mb += rows[k].bytes / 1e6;
            printf("%-10s %8d %12.2f\n", rows[i].dtype ? rows[i].dtype : "?", cnt, mb);
        }
        if (all) {
            printf("\n%-48s %-6s %-20s %12s\n", "tensor", "dtype", "shape", "bytes");
            for (int i = 0; i < n; i++) {
                char shape[64] = "";
                for (int d = 0; d < rows[i].n_dims; d++)
                    snprintf(shape + strlen(shape), sizeof shape - strlen(shape), d ? " x %lld" : "%lld",
                             (long long)rows[i].shape[d]);
                printf("%-48s %-6s %-20s %12llu\n", rows[i].name, rows[i].dtype ? rows[i].dtype : "?", shape,
                       (unsigned long long)rows[i].bytes);
            }
        }
    }
    free(rows);
    model_close(m);
    return 0;
}

/* ---------------------------------------------------------------- profiles */

typedef struct profile_opts {
    int json, marks;
    const char *k, *fcs, *csv, *heatmap, *compare, *export_kind, *output, *type;
} profile_opts;

/* A profile is named *.json or is a regular file whose first non-blank byte is '{' (model files
 * are directories, GGUF ("GGUF") or safetensors (a length)). */
static int is_profile_path(const char *path)
{
    size_t n = strlen(path);
    if (n >= 5 && !strcmp(path + n - 5, ".json")) return 1;
    struct stat st;
    if (stat(path, &st) != 0 || !S_ISREG(st.st_mode)) return 0;
    FILE *f = fopen(path, "rb");
    if (!f) return 0;
    int c;
    while ((c = fgetc(f)) == ' ' || c == '\t' || c == '\n' || c == '\r') {}
    fclose(f);
    return c == '{';
}

static void print_votes(const int16_t *by_votes, const int16_t *votes, int n, int max)
{
    for (int i = 0; i < n && i < max && votes[by_votes[i]] > 0; i++) printf(" %d:%d", by_votes[i], votes[by_votes[i]]);
    putchar('\n');
}

static void print_summary(const profile *p, const char *path, const export_summary *s)
{
    printf("profile       %s\n", path);
    printf("model         %s, %d layers, %d query / %d KV heads, head dim %d = %d chunks (%s), q/k hash %016llx\n",
           p->arch, p->n_layer, p->n_head, p->n_kv_head, p->d_head, p->n_chunk,
           p->chunks == CHUNKS_PLANE ? "plane: dims j, j+d/2" : "adjacent: dims 2j, 2j+1",
           (unsigned long long)p->qk_hash);
    if (p->sliding_window > 0) {
        const model_config c = { .sliding_window = p->sliding_window, .swa_period = p->swa_period };
        printf("fasa layers  ");
        for (int l = 0, k = 0; l < p->n_layer; l++)
            if (!model_layer_local(&c, l)) printf("%s%d", k++ ? "," : " ", l);
        printf(" (the global ones; the rest attend over a %d-token window, densely)\n", p->sliding_window);
    }
    printf("calibration   %d tokens (%d prefill, %d decode steps), sample %016llx, K", p->n_tokens, p->n_prefill,
           p->n_steps, (unsigned long long)p->sample_hash);
    for (int i = 0; i < p->n_k; i++) printf("%s%d", i ? "," : " ", p->ks[i]);
    printf("; ranked at K=%d, fcs %d\n", p->rank_k, p->fcs);
    printf("shown         K=%d, F=%d; %s; \"c:n\" = chunk c is in n heads' top F\n\n", s->k, s->fcs,
           export_chunk_note(p->chunks));
    printf("      %-20s  %-20s  %s\n", "best-chunk CA", "mean CA", "top-F sets");
    printf("layer %6s %6s %6s  %6s %6s %6s  %5s %6s  most common top chunks\n", "min", "mean", "max", "top-F",
           "all", "ratio", "union", "shared");
    for (int l = 0; l < s->n_layer; l++) {
        const export_layer *e = &s->layers[l];
        printf("%5d %6.3f %6.3f %6.3f  %6.3f %6.3f %5.1fx  %5d %6d ", l, e->best_min, e->best_mean, e->best_max,
               e->top_mean, e->all_mean, e->all_mean > 0 ? e->top_mean / e->all_mean : 0, e->n_union, e->n_shared);
        print_votes(e->by_votes, e->votes, s->n_chunk, s->fcs);
    }
    printf("%5s %6s %6.3f %6s  %6.3f %6.3f %5.1fx  %5.1f %6s ", "all", "", s->best_mean, "", s->top_mean,
           s->all_mean, s->all_mean > 0 ? s->top_mean / s->all_mean : 0, s->n_union_mean, "");
    print_votes(s->by_votes, s->votes, s->n_chunk, s->fcs);
}

static void print_compare(const export_compare *c, const char *a, const char *b, int n_chunk)
{
    char lbl[32];
    printf("\ncompare       '%s' vs '%s'\n", a, b);
    printf("              mean over heads of |top-F(A) & top-F(B)| / F (as HF dims); kv = KV-head group rankings\n");
    printf("layer");
    for (int i = 0; i < c->n_f; i++) snprintf(lbl, sizeof lbl, "F=%d", c->f[i]), printf("  %10s", lbl);
    for (int i = 0; i < c->n_f; i++) snprintf(lbl, sizeof lbl, "kv F=%d", c->f[i]), printf("  %10s", lbl);
    putchar('\n');
    for (int l = 0; l < c->n_layer; l++) {
        printf("%5d", l);
        for (int i = 0; i < c->n_f; i++) printf("  %10.3f", c->head[(size_t)i * c->n_layer + l]);
        for (int i = 0; i < c->n_f; i++) printf("  %10.3f", c->kv[(size_t)i * c->n_layer + l]);
        putchar('\n');
    }
    printf("%5s", "all");
    for (int i = 0; i < c->n_f; i++) printf("  %10.3f", c->overall[i]);
    for (int i = 0; i < c->n_f; i++) printf("  %10.3f", c->kv_overall[i]);
    printf("\n%5s", "rand");   /* two random F-subsets of the chunks overlap by F/n_chunk on average */
    for (int k = 0; k < 2; k++)
        for (int i = 0; i < c->n_f; i++) printf("  %10.3f", (double)c->f[i] / n_chunk);
    putchar('\n');
}

static int inspect_profile(const char *path, const profile_opts *o)
{
    char err[FASA_ERRLEN];
    enum export_ds_type ds_type = EXPORT_DS_QK;
    int export_ds = 0;
    if (o->export_kind) {
        if (!strcmp(o->export_kind, "sglang-ds")) export_ds = 1;
        else if (strcmp(o->export_kind, "json-dims"))
            return die_usage("unknown export '%s' (sglang-ds or json-dims)", o->export_kind);
        if (!o->output) return die_usage("'--export %s' needs '-o FILE'", o->export_kind);
    } else if (o->output) {
        return die_usage("option '-o' needs '--export sglang-ds|json-dims'");
    }
    if (o->type) {
        if (!export_ds) return die_usage("option '--type' applies to '--export sglang-ds' only");
        if (!strcmp(o->type, "qk")) ds_type = EXPORT_DS_QK;
        else if (!strcmp(o->type, "q")) ds_type = EXPORT_DS_Q;
        else if (!strcmp(o->type, "k")) ds_type = EXPORT_DS_K;
        else return die_usage("option '--type' must be qk, q or k, not '%s'", o->type);
    }
    long k = 0, fcs = 0;   /* the syntax first; the ranges the profile sets once it is read */
    if (o->k && parse_int("--k", o->k, 1, 1L << 30, &k) < 0) return EXIT_USAGE;
    if (o->fcs && parse_int("--fcs", o->fcs, 1, 1L << 30, &fcs) < 0) return EXIT_USAGE;
    profile p, q;
    if (profile_load(&p, path, err) < 0) return die("%s", err);
    int rc = 1;
    if (!o->k) k = p.rank_k;
    if (!o->fcs) fcs = p.fcs;
    export_summary s = { 0 };
    export_compare cmp = { 0 };
    int have_q = 0;
    if (profile_k_index(&p, (int)k) < 0) {
        char ks[256] = "";
        for (int i = 0; i < p.n_k; i++)
            snprintf(ks + strlen(ks), sizeof ks - strlen(ks), "%s%d", i ? ", " : "", p.ks[i]);
        rc = die_usage("'%s' has no K=%ld (it has %s)", path, k, ks);
        goto out;
    }
    if (o->fcs && parse_int("--fcs", o->fcs, 1, p.n_chunk, &fcs) < 0) { rc = EXIT_USAGE; goto out; }
    if (export_summarize(&p, (int)k, (int)fcs, &s, err) < 0) { die("'%s': %s", path, err); goto out; }
    if (o->compare) {
        if (profile_load(&q, o->compare, err) < 0) { die("%s", err); goto out; }
        have_q = 1;
        if (export_compare_profiles(&p, path, &q, o->compare, (int)fcs, &cmp, err) < 0) { die("%s", err); goto out; }
    }
    /* every check is done: now write the files, each complete or not at all */
    if (o->csv && export_csv(&p, o->csv, err) < 0) { die("%s", err); goto out; }
    if (o->heatmap) {
        heatmap_image img;
        int r = heatmap_render(&p, s.ki, o->marks ? (int)fcs : 0, &img, err);
        if (r == 0) r = heatmap_write_png(&img, o->heatmap, err);
        heatmap_image_free(&img);
        if (r < 0) { die("%s", err); goto out; }
    }
    if (o->export_kind) {
        int r =
            export_ds ? export_sglang_ds(&p, ds_type, o->output, err) : export_json_dims(&p, (int)fcs, o->output, err);
        if (r < 0) { die("%s", err); goto out; }
    }
    if (o->json) {
        cJSON *j = export_summary_json(&p, path, &s);
        if (j && have_q) cJSON_AddItemToObject(j, "compare", export_compare_json(&cmp, path, o->compare));
        char *text = j ? cJSON_Print(j) : NULL;
        cJSON_Delete(j);
        if (!text) { die("out of memory"); goto out; }
        puts(text);
        free(text);
    } else {
        print_summary(&p, path, &s);
        if (have_q) print_compare(&cmp, path, o->compare, p.n_chunk);
    }
    rc = fflush(stdout) == 0 ? 0 : die("cannot write to standard output");
    if (rc == 0 && export_ds && p.n_head != p.n_kv_head)   /* last, so it never precedes an error line */
        fprintf(stderr, "fasa: note: SGLang's Double Sparsity backend gathers q and k with one table, which needs "
                        "n_head == n_kv_head; this model has %d query / %d KV heads\n", p.n_head, p.n_kv_head);
out:
    export_compare_free(&cmp);
    export_summary_free(&s);
    if (have_q) profile_free(&q);
    profile_free(&p);
    return rc;
}

/* --devices: what kernels/ can run on. No device is a fact to report, not a failure. */
static int inspect_devices(int json)
{
    char *text = session_devices(json);
    if (!text) return die("out of memory");
    puts(text);
    free(text);
    return fflush(stdout) == 0 ? 0 : die("cannot write to standard output");
}

int cmd_inspect(int argc, char **argv)
{
    static const struct option opts[] = {
        { "tensors", no_argument, 0, 'T' }, { "json", no_argument, 0, 'j' },
        { "k", required_argument, 0, 'k' }, { "fcs", required_argument, 0, 'F' },
        { "csv", required_argument, 0, 'c' }, { "heatmap", required_argument, 0, 'H' },
        { "marks", no_argument, 0, 'N' }, { "compare", required_argument, 0, 'C' },
        { "export", required_argument, 0, 'e' }, { "output", required_argument, 0, 'o' },
        { "type", required_argument, 0, 't' }, { "help", no_argument, 0, 'h' },
        { "devices", no_argument, 0, 'D' },
        { 0, 0, 0, 0 },
    };
    int all = 0, devices = 0, c;
    const char *profile_flag = NULL;
    profile_opts po = { 0 };
    optind = 1;
    while ((c = getopt_long(argc, argv, "ho:", opts, NULL)) != -1) {
        switch (c) {
        case 'T': all = 1; break;
        case 'j': po.json = 1; break;
        case 'k': po.k = optarg, profile_flag = "--k"; break;
        case 'F': po.fcs = optarg, profile_flag = "--fcs"; break;
        case 'c': po.csv = optarg, profile_flag = "--csv"; break;
        case 'H': po.heatmap = optarg, profile_flag = "--heatmap"; break;
        case 'N': po.marks = 1, profile_flag = "--marks"; break;
        case 'C': po.compare = optarg, profile_flag = "--compare"; break;
        case 'e': po.export_kind = optarg, profile_flag = "--export"; break;
        case 'o': po.output = optarg, profile_flag = "-o"; break;
        case 't': po.type = optarg, profile_flag = "--type"; break;
        case 'D': devices = 1; break;
        case 'h': fputs(usage_text, stdout); return 0;
        default: fputs(usage_text, stderr); return EXIT_USAGE;
        }
    }
    if (devices) {
        if (optind != argc || all || profile_flag)
            return die_usage("--devices takes no model, profile or other option but --json");
        return inspect_devices(po.json);
    }
    if (optind != argc - 1) {
        fputs(usage_text, stderr);
        return EXIT_USAGE;
    }
    const char *path = argv[optind];
    if (is_profile_path(path)) {
        if (all) return die_usage("option '--tensors' applies to models; '%s' is a profile", path);
        return inspect_profile(path, &po);
    }
    if (profile_flag)
        return die_usage("option '%s' applies to calibration profiles; '%s' is not one", profile_flag, path);
    /* a lone .safetensors file: its tensors; with a config.json beside it, the model too */
    size_t pl = strlen(path);
    if (pl > 12 && !strcmp(path + pl - 12, ".safetensors")) {
        char cfg[4096];
        const char *slash = strrchr(path, '/');
        snprintf(cfg, sizeof cfg, "%.*sconfig.json", slash ? (int)(slash - path + 1) : 0, path);
        if (access(cfg, F_OK) != 0) return inspect_safetensors(path, po.json);
    }
    return inspect_model(path, po.json, all);
}

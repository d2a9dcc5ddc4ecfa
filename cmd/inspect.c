/* inspect.c - `fasa inspect MODEL`: what a model file holds and what running it costs. */
#include <cjson/cJSON.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cmd.h"
#include "gguf.h"
#include "model.h"
#include "safetensors.h"

static const char usage_text[] =
    "usage: fasa inspect MODEL [options]\n"
    "\n"
    "Shows a model's architecture, tensors (dtype, shape, bytes), parameter count, memory, RoPE\n"
    "layout and tokenizer.\n"
    "\n"
    "      --tensors         list every tensor (default: a summary by dtype)\n"
    "      --json            print the same facts as JSON\n"
    "  -h, --help            this text\n";

static const char *arch_name(enum model_arch a)
{
    return a == MODEL_ARCH_QWEN2 ? "qwen2" : a == MODEL_ARCH_MISTRAL ? "mistral" : "llama";
}

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
            snprintf(rows[n].name, sizeof rows[n].name, "%.*s", (int)(t->name.len < 127 ? t->name.len : 127), t->name.ptr);
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

int cmd_inspect(int argc, char **argv)
{
    static const struct option opts[] = {
        { "tensors", no_argument, 0, 'T' }, { "json", no_argument, 0, 'j' },
        { "help", no_argument, 0, 'h' },    { 0, 0, 0, 0 },
    };
    int json = 0, all = 0, c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        switch (c) {
        case 'T': all = 1; break;
        case 'j': json = 1; break;
        case 'h': fputs(usage_text, stdout); return 0;
        default: fputs(usage_text, stderr); return 2;
        }
    }
    if (optind != argc - 1) {
        fputs(usage_text, stderr);
        return 2;
    }
    const char *path = argv[optind];
    char err[FASA_ERRLEN];
    model *m;
    if (model_open(&m, path, err) < 0) return die("%s", err);
    const model_config *cf = &m->cfg;
    trow *rows;
    int n = collect_tensors(m, &rows);
    if (n < 0) { model_close(m); return die("out of memory"); }
    const double kv_tok = 2.0 * cf->n_layer * cf->n_kv_head * cf->d_head * sizeof(float);
    const char *layout = cf->layout == ROPE_LAYOUT_HF ? "rotate_half (chunk j = dims j, j+d/2)"
                                                      : "interleaved (chunk j = dims 2j, 2j+1)";
    const char *scaling = cf->rope_scaling == ROPE_SCALING_LLAMA3 ? "llama3"
                          : cf->rope_scaling == ROPE_SCALING_LINEAR ? "linear" : "none";
    if (json) {
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "path", path);
        cJSON_AddStringToObject(o, "name", m->name);
        cJSON_AddStringToObject(o, "format", m->source == MODEL_SOURCE_GGUF ? "gguf" : "safetensors");
        cJSON_AddStringToObject(o, "architecture", arch_name(cf->arch));
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
        cJSON_AddStringToObject(o, "rope_layout", cf->layout == ROPE_LAYOUT_HF ? "rotate_half" : "interleaved");
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
            for (int d = 0; d < rows[i].n_dims; d++) cJSON_AddItemToArray(sh, cJSON_CreateNumber((double)rows[i].shape[d]));
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
        printf("architecture  %s: %d layers, hidden %d, ffn %d, vocab %d, context %d\n", arch_name(cf->arch),
               cf->n_layer, cf->d_model, cf->d_ff, cf->n_vocab, cf->n_ctx_train);
        printf("attention     %d query heads, %d KV heads (group %d), head dim %d = %d frequency chunks%s\n",
               cf->n_head, cf->n_kv_head, cf->n_head / cf->n_kv_head, cf->d_head, cf->d_head / 2,
               cf->qkv_bias ? ", q/k/v bias" : "");
        printf("rope          theta %g, scaling %s, file layout %s\n", cf->rope_theta, scaling, layout);
        printf("norm          RMSNorm, eps %g; embeddings %s\n", cf->norm_eps, cf->tied_embeddings ? "tied" : "separate");
        printf("parameters    %.1f M\n", m->n_params / 1e6);
        printf("memory        weights %.1f MB; KV cache (f32) %.1f KB per token, %.1f MB at %d tokens\n",
               m->weight_bytes / 1e6, kv_tok / 1e3, kv_tok * cf->n_ctx_train / 1e6, cf->n_ctx_train);
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

/* convert.c - `fasa convert MODEL -p PROFILE -o OUT` and `fasa convert MODEL --to hf -o DIR`. */
#include <cjson/cJSON.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cmd.h"
#include "convert.h"
#include "safetensors.h"

static const char usage_text[] =
    "usage: fasa convert MODEL [-p PROFILE] -o OUT [options]\n"
    "       fasa convert MODEL --to hf -o DIR [options]\n"
    "\n"
    "Writes MODEL as a Hugging Face directory (model.safetensors, config.json, tokenizer.json,\n"
    "profile.json). By default every KV head's q/k projection rows are reordered so its frequency\n"
    "chunks follow the profile's group ranking: the dominant key dims come first and contiguous,\n"
    "and the chunk order is recorded in the safetensors metadata (fasa.chunk_order). Logits are\n"
    "unchanged. With --to hf nothing is reordered: a plain export (llama.cpp's q/k interleave\n"
    "undone) that Hugging Face transformers loads.\n"
    "\n"
    "  -p, --profile FILE    calibration profile of MODEL (default: MODEL's .profile.json)\n"
    "  -o, --output OUT      output directory (must not exist, or be empty); OUT.fasa with --bundle\n"
    "                        (an OUT ending in .fasa implies --bundle)\n"
    "      --to FORMAT       fasa (default: reordered) or hf (Hugging Face layout)\n"
    "      --dtype T         f32, f16 or bf16 (default: the source's where it is one of them, else\n"
    "                        f16)\n"
    "      --bundle          write one .fasa file (tar with a checksummed manifest) instead\n"
    "      --zstd            compress the bundle with zstd\n"
    "      --json            print a summary as JSON on stdout\n"
    "  -h, --help            this text\n"
    "\n"
    "The output is built beside OUT and renamed into place: a failed convert leaves nothing there.\n";

int cmd_convert(int argc, char **argv)
{
    enum { OPT_TO = 256, OPT_DTYPE, OPT_BUNDLE, OPT_ZSTD, OPT_JSON };
    static const struct option opts[] = {
        { "profile", required_argument, 0, 'p' }, { "output", required_argument, 0, 'o' },
        { "to", required_argument, 0, OPT_TO },    { "dtype", required_argument, 0, OPT_DTYPE },
        { "bundle", no_argument, 0, OPT_BUNDLE },  { "zstd", no_argument, 0, OPT_ZSTD },
        { "json", no_argument, 0, OPT_JSON },      { "help", no_argument, 0, 'h' },
        { 0, 0, 0, 0 },
    };
    const char *prof_path = NULL, *out = NULL, *to = "fasa", *dtype = NULL;
    convert_opts o = convert_defaults();
    int json = 0, c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "p:o:h", opts, NULL)) != -1) {
        switch (c) {
        case 'p': prof_path = optarg; break;
        case 'o': out = optarg; break;
        case OPT_TO: to = optarg; break;
        case OPT_DTYPE: dtype = optarg; break;
        case OPT_BUNDLE: o.bundle = 1; break;
        case OPT_ZSTD: o.zstd = 1; break;
        case OPT_JSON: json = 1; break;
        case 'h': fputs(usage_text, stdout); return 0;
        default: fputs(usage_text, stderr); return EXIT_USAGE;
        }
    }
    if (optind + 1 != argc) {
        fputs(usage_text, stderr);
        return EXIT_USAGE;
    }
    const char *model_path = argv[optind];
    if (!dtype) o.dtype = -1;
    else if (!strcmp(dtype, "f32")) o.dtype = ST_F32;
    else if (!strcmp(dtype, "f16")) o.dtype = ST_F16;
    else if (!strcmp(dtype, "bf16")) o.dtype = ST_BF16;
    else return die_usage("option '--dtype' must be f32, f16 or bf16, not '%s'", dtype);
    if (!strcmp(to, "hf")) o.reorder = 0;
    else if (strcmp(to, "fasa")) return die_usage("option '--to' must be fasa or hf, not '%s'", to);
    if (!out) return die_usage("no output: give -o OUT");
    size_t olen = strlen(out);
    if (olen > 5 && !strcmp(out + olen - 5, ".fasa")) o.bundle = 1;   /* -o X.fasa means a bundle */
    if (o.zstd && !o.bundle) return die_usage("option '--zstd' needs '--bundle'");

    char defp[4096];
    if (!prof_path && o.reorder) {
        profile_default_path(model_path, defp, sizeof defp);
        if (access(defp, R_OK) != 0)
            return die_usage("'%s' has no profile: run 'fasa calibrate %s' or give -p (or --to hf for no reordering)",
                             model_path, model_path);
        prof_path = defp;
    }

    char err[FASA_ERRLEN];
    model *m;
    if (model_open(&m, model_path, err) < 0) return die("%s", err);
    profile prof = { 0 };
    int status = 1;
    if (prof_path) {
        if (profile_load(&prof, prof_path, err) < 0) { die("%s", err); goto done; }
        o.prof = &prof;
        o.prof_path = prof_path;
    }
    double t0 = fasa_now();
    if (convert_write(m, &o, out, err) < 0) { die("%s", err); goto done; }
    double secs = fasa_now() - t0;
    char final[4096];
    convert_out_path(&o, out, final, sizeof final);
    const int dt = convert_dtype(m, &o);
    const char *dname = dt == ST_F32 ? "f32" : dt == ST_F16 ? "f16" : "bf16";
    fprintf(stderr, "fasa: wrote '%s' (%s, %s%s) in %.1f s\n", final,
            o.reorder ? "q/k chunks in profile order" : "Hugging Face layout", dname,
            o.bundle ? (o.zstd ? ", zstd bundle" : ", bundle") : "", secs);
    if (json) {
        cJSON *j = cJSON_CreateObject();
        cJSON_AddStringToObject(j, "output", final);
        cJSON_AddBoolToObject(j, "reordered", o.reorder);
        cJSON_AddStringToObject(j, "dtype", dname);
        cJSON_AddBoolToObject(j, "bundle", o.bundle);
        cJSON_AddBoolToObject(j, "zstd", o.zstd);
        if (prof_path) cJSON_AddStringToObject(j, "profile", prof_path);
        else cJSON_AddNullToObject(j, "profile");
        cJSON_AddNumberToObject(j, "seconds", secs);
        char *s = cJSON_Print(j);
        if (s) puts(s);
        free(s);
        cJSON_Delete(j);
    }
    status = 0;
done:
    profile_free(&prof);
    model_close(m);
    return status;
}

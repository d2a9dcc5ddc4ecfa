/* `fasa inspect PROFILE`: summaries, comparisons, exports (SGLang Double Sparsity channels,
 * engine-neutral dims), CSV and the heatmap PNG, on synthetic profiles with a known pattern, on
 * broken profiles, and on the real profile when FASA_PROFILE names one. */
#include <criterion/criterion.h>
#include <cjson/cJSON.h>
#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "export.h"
#include "expect_cli.h"
#include "fixtures.h"
#include "safetensors.h"
#include "heatmap.h"
#include "profile.h"

/* PNG decoding for the heatmap check; the only stb_image implementation in the test binary. */
#define STB_IMAGE_IMPLEMENTATION
#define STBI_ONLY_PNG
#include <stb/stb_image.h>

/* ---------------------------------------------------------------- helpers */

static cJSON *insp_load_json(const char *path)
{
    char *text = fx_read(path, NULL);
    cr_assert(text, "cannot read '%s'", path);
    cJSON *o = cJSON_Parse(text);
    free(text);
    cr_assert(o, "'%s' is not JSON", path);
    return o;
}

/* Files in dir whose name contains needle (temp files left behind, for instance). */
static int insp_count_files(const char *dir, const char *needle)
{
    DIR *d = opendir(dir);
    int n = 0;
    for (struct dirent *e; d && (e = readdir(d));) n += strstr(e->d_name, needle) != NULL;
    if (d) closedir(d);
    return n;
}

/* A synthetic profile: 3 layers x 4 heads (2 KV) x dim 16 = 8 chunks, K = 4, 8, 16, ranked at 8.
 * CA of chunk c = a permutation of the chunks (slope 5 or 3, both coprime to 8) shifted per
 * layer and head, so every head has its own clear ranking. */
static void insp_make(profile *p, enum chunk_def def, int slope, int d_head)
{
    memset(p, 0, sizeof *p);
    strcpy(p->arch, "llama");
    p->n_layer = 3, p->n_head = 4, p->n_kv_head = 2, p->d_head = d_head, p->n_chunk = d_head / 2;
    p->qk_hash = 0x0123456789abcdefULL, p->chunks = def, p->sample_hash = 0xfedcba9876543210ULL;
    p->n_tokens = 64, p->n_prefill = 48, p->n_steps = 16;
    p->n_k = 3, p->ks[0] = 4, p->ks[1] = 8, p->ks[2] = 16, p->rank_k = 8, p->fcs = 2;
    char err[FASA_ERRLEN];
    cr_assert_eq(profile_alloc(p, err), 0, "%s", err);
    const int C = p->n_chunk;
    for (int ki = 0; ki < p->n_k; ki++)
        for (int l = 0; l < p->n_layer; l++)
            for (int h = 0; h < p->n_head; h++) {
                double *ca = profile_ca(p, ki, l, h);
                for (int c = 0; c < C; c++)
                    ca[c] = 0.05 + 0.8 * ((c * slope + l * 3 + h * 7 + ki) % C) / C + 0.01 * ki;
            }
    profile_rank_all(p);
}

static void insp_save(const profile *p, const char *dir, const char *name, char *path, size_t cap)
{
    char err[FASA_ERRLEN];
    snprintf(path, cap, "%s/%s", dir, name);
    cr_assert_eq(profile_save(p, path, err), 0, "%s", err);
}

/* The first 2F channels of a row are the dims of the ranking's first F chunks. */
static void insp_expect_row(const profile *p, const cJSON *row, const int16_t *rank, const char *what)
{
    cr_assert(cJSON_IsArray(row) && cJSON_GetArraySize(row) == p->d_head, "%s: not %d channels", what, p->d_head);
    char seen[64] = { 0 };
    int i = 0, dims[2];
    const cJSON *v;
    cJSON_ArrayForEach(v, row) {
        cr_assert(cJSON_IsNumber(v) && v->valuedouble == floor(v->valuedouble), "%s: not an integer", what);
        int x = (int)v->valuedouble;
        cr_assert(x >= 0 && x < p->d_head && !seen[x]++, "%s: not a permutation of 0..%d", what, p->d_head - 1);
        export_chunk_dims(p->chunks, p->d_head, rank[i / 2], dims);
        cr_expect_eq(x, dims[i % 2], "%s: channel %d is %d, want %d", what, i, x, dims[i % 2]);
        i++;
    }
}

/* The SGLang loader: channel_config["model.layers.<i>.self_attn.<type>_proj"], a rectangular
 * integer table (torch.tensor), sliced to its first C columns. */
static void insp_check_sglang(const profile *p, const char *path, const char *type, int C)
{
    cJSON *o = insp_load_json(path);
    cr_assert(cJSON_IsObject(o));
    cr_expect_eq(cJSON_GetArraySize(o), p->n_layer, "one key per layer");
    const int by_kv = !strcmp(type, "k");
    for (int l = 0; l < p->n_layer; l++) {
        char key[96], what[128];
        snprintf(key, sizeof key, "model.layers.%d.self_attn.%s_proj", l, type);
        const cJSON *t = cJSON_GetObjectItemCaseSensitive(o, key);
        cr_assert(cJSON_IsArray(t), "'%s' lacks '%s'", path, key);
        const int rows = by_kv ? p->n_kv_head : p->n_head;
        cr_assert_eq(cJSON_GetArraySize(t), rows, "%s: %d rows, want %d", key, cJSON_GetArraySize(t), rows);
        for (int r = 0; r < rows; r++) {
            const cJSON *row = cJSON_GetArrayItem(t, r);
            snprintf(what, sizeof what, "%s row %d", key, r);
            const int16_t *rank = by_kv ? profile_group_rank(p, l, r) : profile_rank(p, l, r);
            insp_expect_row(p, row, rank, what);
            /* the slice [:, :C] is the top C/2 chunks' dims, as a set */
            int want[64] = { 0 }, got[64] = { 0 }, d[2];
            for (int i = 0; i < C / 2; i++)
                export_chunk_dims(p->chunks, p->d_head, rank[i], d), want[d[0]] = want[d[1]] = 1;
            for (int i = 0; i < C; i++) got[(int)cJSON_GetArrayItem(row, i)->valuedouble] = 1;
            cr_expect(!memcmp(want, got, sizeof want), "%s: the first %d channels are not the top %d chunks", what, C,
                      C / 2);
        }
    }
    cJSON_Delete(o);
}

/* ---------------------------------------------------------------- library */

Test(inspect, summary_of_a_known_pattern)
{
    profile p;
    insp_make(&p, CHUNKS_PLANE, 5, 16);
    export_summary s;
    char err[FASA_ERRLEN];
    cr_assert_eq(export_summarize(&p, 8, 2, &s, err), 0, "%s", err);
    cr_expect_eq(s.ki, 1);
    for (int l = 0; l < p.n_layer; l++) {
        /* every head's best chunk has pattern value C-1: CA 0.05 + 0.8*7/8 + 0.01 */
        const double best = 0.05 + 0.8 * 7 / 8 + 0.01;
        cr_expect_float_eq(s.layers[l].best_min, best, 1e-12);
        cr_expect_float_eq(s.layers[l].best_max, best, 1e-12);
        cr_expect_float_eq(s.layers[l].top_mean, 0.05 + 0.8 * 6.5 / 8 + 0.01, 1e-12);
        cr_expect_float_eq(s.layers[l].all_mean, 0.05 + 0.8 * 3.5 / 8 + 0.01, 1e-12);
        int votes = 0, in_union = 0;
        for (int c = 0; c < p.n_chunk; c++) votes += s.layers[l].votes[c], in_union += s.layers[l].votes[c] > 0;
        cr_expect_eq(votes, p.n_head * 2);
        cr_expect_eq(s.layers[l].n_union, in_union);
        cr_expect_eq(s.layers[l].votes[s.layers[l].by_votes[0]] >= s.layers[l].votes[s.layers[l].by_votes[1]], 1);
        for (int h = 0; h < p.n_head; h++)
            cr_expect(!memcmp(s.rank + ((size_t)l * p.n_head + h) * p.n_chunk, profile_rank(&p, l, h), 2 * p.n_chunk),
                      "at rank_k the summary uses the stored ranking");
    }
    /* heads differ by h*7 in the pattern: 4 heads with shift 7*h mod 8 = 0, 7, 6, 5 -> in layer 0
     * the best chunks of the heads are all different, so the union of top-2 sets is 5 chunks */
    cr_expect_eq(s.layers[0].n_union, 5, "union %d", s.layers[0].n_union);
    cr_expect_eq(s.layers[0].n_shared, 0);
    export_summary_free(&s);
    cr_expect_lt(export_summarize(&p, 5, 2, &s, err), 0, "K=5 is not in the profile");
    cr_expect_lt(export_summarize(&p, 8, 9, &s, err), 0, "F=9 > 8 chunks");
    profile_free(&p);
}

Test(inspect, rank_at_other_k_follows_ca)
{
    profile p;
    insp_make(&p, CHUNKS_PLANE, 5, 16);
    int16_t r[8];
    for (int ki = 0; ki < p.n_k; ki++) {
        export_rank_at(&p, ki, 1, 2, r);
        const double *ca = profile_ca(&p, ki, 1, 2);
        for (int i = 1; i < p.n_chunk; i++) cr_expect_geq(ca[r[i - 1]], ca[r[i]], "K=%d position %d", p.ks[ki], i);
    }
    profile_free(&p);
}

Test(inspect, chunk_dims_by_definition)
{
    int d[2];
    export_chunk_dims(CHUNKS_PLANE, 64, 5, d);
    cr_expect(d[0] == 5 && d[1] == 37);
    export_chunk_dims(CHUNKS_ADJACENT, 64, 5, d);
    cr_expect(d[0] == 10 && d[1] == 11);
}

Test(inspect, compare_self_shuffled_and_mismatched)
{
    profile a, b, c, other;
    insp_make(&a, CHUNKS_PLANE, 5, 16);
    insp_make(&b, CHUNKS_PLANE, 3, 16);   /* another ranking of the same model */
    insp_make(&c, CHUNKS_ADJACENT, 5, 16);
    insp_make(&other, CHUNKS_PLANE, 5, 32);
    export_compare cmp;
    char err[FASA_ERRLEN];
    cr_assert_eq(export_compare_profiles(&a, "a.json", &a, "a.json", 2, &cmp, err), 0, "%s", err);
    cr_expect_eq(cmp.n_f, 2, "8 chunks: F = 1, 2 and fcs 2 -> {1, 2}, got %d", cmp.n_f);
    cr_expect(cmp.f[0] == 1 && cmp.f[1] == 2);
    for (int i = 0; i < cmp.n_f; i++) {
        cr_expect_float_eq(cmp.overall[i], 1.0, 1e-12);
        cr_expect_float_eq(cmp.kv_overall[i], 1.0, 1e-12);
    }
    export_compare_free(&cmp);
    cr_assert_eq(export_compare_profiles(&a, "a.json", &b, "b.json", 3, &cmp, err), 0, "%s", err);
    cr_expect_eq(cmp.n_f, 3);
    for (int i = 0; i < cmp.n_f; i++) {
        cr_expect_lt(cmp.overall[i], 1.0, "F=%d overlap %g", cmp.f[i], cmp.overall[i]);
        cr_expect_geq(cmp.overall[i], 0.0);
    }
    export_compare_free(&cmp);
    /* same chunk ids under another definition are other dims: plane chunk j = {j, j+8},
     * adjacent chunk j = {2j, 2j+1}; only the dims decide */
    cr_assert_eq(export_compare_profiles(&a, "a.json", &c, "c.json", 2, &cmp, err), 0, "%s", err);
    cr_expect_lt(cmp.overall[cmp.n_f - 1], 1.0);
    export_compare_free(&cmp);
    cr_expect_eq(export_compare_profiles(&a, "a.json", &other, "other.json", 2, &cmp, err), FASA_EMISMATCH);
    cr_expect(strstr(err, "'other.json'") && strstr(err, "'a.json'") && strstr(err, "dim 32"), "%s", err);
    profile_free(&a), profile_free(&b), profile_free(&c), profile_free(&other);
}

Test(inspect, heatmap_image_and_font)
{
    profile p;
    insp_make(&p, CHUNKS_PLANE, 5, 16);
    heatmap_image img;
    char err[FASA_ERRLEN];
    cr_assert_eq(heatmap_render(&p, 1, 2, &img, err), 0, "%s", err);
    cr_expect_gt(img.w, 3 * 8 * 3);
    cr_expect_gt(img.h, 4 * 3);
    /* the colour scale's ends appear: viridis' first and last colours */
    int dark = 0, bright = 0;
    for (size_t i = 0; i < (size_t)img.w * img.h; i++) {
        const uint8_t *px = img.rgb + 3 * i;
        dark |= px[0] == 68 && px[1] == 1 && px[2] == 84;
        bright |= px[0] == 253 && px[1] == 231 && px[2] == 37;
    }
    cr_expect(dark && bright, "the lowest and highest CA colours are missing");
    heatmap_image_free(&img);
    cr_expect_lt(heatmap_render(&p, 7, 2, &img, err), 0);
    /* text: width and ink inside its box only */
    cr_expect_eq(heatmap_text_width("chunk", 2), (5 * 6 - 1) * 2);
    heatmap_image t = { 40, 20, calloc(40 * 20, 3) };
    const uint8_t ink[3] = { 255, 0, 0 };
    heatmap_draw_text(&t, 1, 1, "Ag5", 1, ink, 0);
    int inked = 0, outside = 0;
    for (int y = 0; y < t.h; y++)
        for (int x = 0; x < t.w; x++) {
            int on = t.rgb[(y * t.w + x) * 3] == 255;
            inked += on;
            outside += on && (x < 1 || x >= 1 + heatmap_text_width("Ag5", 1) || y < 1 || y >= 9);
        }
    cr_expect_gt(inked, 20);
    cr_expect_eq(outside, 0);
    free(t.rgb);
    profile_free(&p);
}

/* ---------------------------------------------------------------- through the binary */

Test(inspect, sglang_ds_export)
{
    profile p;
    insp_make(&p, CHUNKS_PLANE, 5, 16);
    char *dir = tmpdir_make(), path[600], out[600], args[2000];
    insp_save(&p, dir, "p.json", path, sizeof path);
    snprintf(out, sizeof out, "%s/channels.json", dir);
    char *so, *se;
    snprintf(args, sizeof args, "inspect %s --export sglang-ds -o %s", path, out);
    cr_assert_eq(fx_fasa(args, &so, &se), 0, "%s", se);
    free(so), free(se);
    for (int C = 2; C <= p.d_head; C += 2) insp_check_sglang(&p, out, "qk", C);
    snprintf(args, sizeof args, "inspect %s --export sglang-ds -o %s --type q", path, out);
    cr_assert_eq(fx_fasa(args, &so, &se), 0, "%s", se);
    free(so), free(se);
    insp_check_sglang(&p, out, "q", 4);
    snprintf(args, sizeof args, "inspect %s --export sglang-ds -o %s --type k", path, out);
    cr_assert_eq(fx_fasa(args, &so, &se), 0, "%s", se);
    cr_expect(strstr(se, "n_head == n_kv_head") != NULL, "no GQA note: %s", se);
    free(so), free(se);
    for (int C = 2; C <= p.d_head; C += 2) insp_check_sglang(&p, out, "k", C);
    /* group ranks are not just the first head's ranks */
    int differs = 0;
    for (int l = 0; l < p.n_layer; l++)
        differs |= memcmp(profile_group_rank(&p, l, 1), profile_rank(&p, l, 2), 2 * p.n_chunk) != 0;
    cr_expect(differs, "the synthetic pattern should make group ranks differ from head ranks");
    cr_expect_eq(insp_count_files(dir, ".tmp."), 0, "temp files left behind");
    /* adjacent chunks export 2j, 2j+1 */
    profile a;
    insp_make(&a, CHUNKS_ADJACENT, 3, 16);
    insp_save(&a, dir, "a.json", path, sizeof path);
    snprintf(args, sizeof args, "inspect %s --export sglang-ds -o %s", path, out);
    cr_assert_eq(fx_fasa(args, &so, &se), 0, "%s", se);
    free(so), free(se);
    insp_check_sglang(&a, out, "qk", 6);
    profile_free(&a);
    profile_free(&p);
    tmpdir_remove(dir);
}

Test(inspect, json_dims_export)
{
    profile p;
    insp_make(&p, CHUNKS_PLANE, 5, 16);
    char *dir = tmpdir_make(), path[600], out[600], args[2000];
    insp_save(&p, dir, "p.json", path, sizeof path);
    snprintf(out, sizeof out, "%s/dims.json", dir);
    snprintf(args, sizeof args, "inspect %s --export json-dims -o %s --fcs 3", path, out);
    char *so, *se;
    cr_assert_eq(fx_fasa(args, &so, &se), 0, "%s", se);
    free(so), free(se);
    cJSON *o = insp_load_json(out);
    cr_expect_eq(cJSON_GetObjectItem(o, "d_head")->valueint, 16);
    cr_expect_str_eq(cJSON_GetObjectItem(o, "chunk_definition")->valuestring, "plane");
    cr_expect_eq(cJSON_GetObjectItem(o, "fcs")->valueint, 3);
    const cJSON *layers = cJSON_GetObjectItem(o, "layers");
    cr_assert_eq(cJSON_GetArraySize(layers), p.n_layer);
    for (int l = 0; l < p.n_layer; l++) {
        const cJSON *lo = cJSON_GetArrayItem(layers, l);
        cr_expect_eq(cJSON_GetObjectItem(lo, "layer")->valueint, l);
        const cJSON *heads = cJSON_GetObjectItem(lo, "heads");
        cr_assert_eq(cJSON_GetArraySize(heads), p.n_head);
        for (int h = 0; h < p.n_head; h++) {
            const cJSON *ho = cJSON_GetArrayItem(heads, h);
            cr_expect_eq(cJSON_GetObjectItem(ho, "head")->valueint, h);
            cr_expect_eq(cJSON_GetObjectItem(ho, "kv_head")->valueint, h / 2);
            const cJSON *dom = cJSON_GetObjectItem(ho, "dominant_chunks"), *dims = cJSON_GetObjectItem(ho, "dims_hf");
            cr_assert_eq(cJSON_GetArraySize(dom), 3);
            cr_assert_eq(cJSON_GetArraySize(dims), 6);
            for (int i = 0; i < 3; i++) {
                int c = profile_rank(&p, l, h)[i];
                cr_expect_eq(cJSON_GetArrayItem(dom, i)->valueint, c);
                cr_expect_eq(cJSON_GetArrayItem(dims, 2 * i)->valueint, c);
                cr_expect_eq(cJSON_GetArrayItem(dims, 2 * i + 1)->valueint, c + 8);
            }
        }
        const cJSON *kvs = cJSON_GetObjectItem(lo, "kv_heads");
        cr_assert_eq(cJSON_GetArraySize(kvs), p.n_kv_head);
        for (int g = 0; g < p.n_kv_head; g++)
            cr_expect_eq(
                cJSON_GetArrayItem(cJSON_GetObjectItem(cJSON_GetArrayItem(kvs, g), "dominant_chunks"), 0)->valueint,
                profile_group_rank(&p, l, g)[0]);
    }
    cJSON_Delete(o);
    profile_free(&p);
    tmpdir_remove(dir);
}

Test(inspect, summary_text_json_and_csv)
{
    profile p;
    insp_make(&p, CHUNKS_PLANE, 5, 16);
    char *dir = tmpdir_make(), path[600], csv[600], args[2000];
    insp_save(&p, dir, "p.json", path, sizeof path);
    char *so, *se;
    snprintf(args, sizeof args, "inspect %s", path);
    cr_assert_eq(fx_fasa(args, &so, &se), 0, "%s", se);
    cr_expect(strstr(so, "K=8, F=2") != NULL, "%s", so);
    cr_expect(strstr(so, "most common top chunks") != NULL, "%s", so);
    free(so), free(se);
    /* --json at another K: the same facts as export_summarize */
    snprintf(csv, sizeof csv, "%s/ca.csv", dir);
    snprintf(args, sizeof args, "inspect %s --json --k 16 --fcs 3 --csv %s", path, csv);
    cr_assert_eq(fx_fasa(args, &so, &se), 0, "%s", se);
    cJSON *o = cJSON_Parse(so);
    cr_assert(o, "not JSON: %s", so);
    cr_expect_eq(cJSON_GetObjectItem(o, "k")->valueint, 16);
    cr_expect_eq(cJSON_GetObjectItem(o, "fcs")->valueint, 3);
    export_summary s;
    char err[FASA_ERRLEN];
    cr_assert_eq(export_summarize(&p, 16, 3, &s, err), 0);
    const cJSON *layers = cJSON_GetObjectItem(o, "layers");
    cr_assert_eq(cJSON_GetArraySize(layers), p.n_layer);
    for (int l = 0; l < p.n_layer; l++) {
        const cJSON *lo = cJSON_GetArrayItem(layers, l);
        cr_expect_float_eq(cJSON_GetObjectItem(cJSON_GetObjectItem(lo, "best_ca"), "mean")->valuedouble,
                           s.layers[l].best_mean, 1e-6);
        cr_expect_eq(cJSON_GetObjectItem(lo, "union_size")->valueint, s.layers[l].n_union);
        cr_expect_eq(cJSON_GetArraySize(cJSON_GetObjectItem(lo, "dominant_chunks")), p.n_head);
    }
    export_summary_free(&s);
    cJSON_Delete(o);
    free(so), free(se);
    /* CSV: a header and one row per (K, layer, head, chunk); ranks 1..C per head */
    char *text = fx_read(csv, NULL);
    cr_assert(text);
    cr_expect(!strncmp(text, "k,layer,head,chunk,ca,rank\n", 27));
    cr_expect_eq(fx_lines(text), 1 + p.n_k * p.n_layer * p.n_head * p.n_chunk, "%d lines", fx_lines(text));
    int k, l, h, c, rank, rank_sum = 0, rows = 0;
    double ca;
    for (char *line = strchr(text, '\n') + 1; *line; line = strchr(line, '\n') + 1, rows++) {
        cr_assert_eq(sscanf(line, "%d,%d,%d,%d,%lf,%d", &k, &l, &h, &c, &ca, &rank), 6);
        int ki = profile_k_index(&p, k);
        cr_assert_geq(ki, 0);
        cr_expect_float_eq(ca, profile_ca(&p, ki, l, h)[c], 1e-6);
        if (k == p.rank_k && rank == 1) cr_expect_eq(c, profile_rank(&p, l, h)[0]);
        rank_sum += rank;
    }
    cr_expect_eq(rank_sum, rows / p.n_chunk * (p.n_chunk * (p.n_chunk + 1) / 2));
    free(text);
    profile_free(&p);
    tmpdir_remove(dir);
}

Test(inspect, heatmap_png)
{
    profile p;
    insp_make(&p, CHUNKS_PLANE, 5, 16);
    char *dir = tmpdir_make(), path[600], png[600], args[2000];
    insp_save(&p, dir, "p.json", path, sizeof path);
    snprintf(png, sizeof png, "%s/ca.png", dir);
    snprintf(args, sizeof args, "inspect %s --heatmap %s --k 4 --marks", path, png);
    char *so, *se;
    cr_assert_eq(fx_fasa(args, &so, &se), 0, "%s", se);
    free(so), free(se);
    size_t len;
    unsigned char *b = (unsigned char *)fx_read(png, &len);
    cr_assert(b && len > 33, "no PNG");
    cr_expect(!memcmp(b, "\x89PNG\r\n\x1a\n", 8), "PNG signature");
    cr_expect(!memcmp(b + 12, "IHDR", 4));
    unsigned w = (unsigned)b[16] << 24 | b[17] << 16 | b[18] << 8 | b[19];
    unsigned h = (unsigned)b[20] << 24 | b[21] << 16 | b[22] << 8 | b[23];
    heatmap_image img;
    char err[FASA_ERRLEN];
    cr_assert_eq(heatmap_render(&p, 0, 2, &img, err), 0);
    cr_expect_eq(w, (unsigned)img.w, "width %u, want %d", w, img.w);
    cr_expect_eq(h, (unsigned)img.h, "height %u, want %d", h, img.h);
    cr_expect_eq(b[24], 8, "bit depth");
    cr_expect_eq(b[25], 2, "colour type RGB");
    /* decoded, the picture is the rendered one, and not uniform */
    int dw, dh, dc;
    unsigned char *px = stbi_load_from_memory(b, (int)len, &dw, &dh, &dc, 3);
    cr_assert(px, "PNG does not decode");
    cr_expect(dw == img.w && dh == img.h);
    cr_expect(!memcmp(px, img.rgb, (size_t)img.w * img.h * 3), "decoded pixels differ from the render");
    int distinct = 0;
    for (size_t i = 3; i < (size_t)dw * dh * 3 && distinct < 50; i += 3) distinct += memcmp(px + i, px + i - 3, 3) != 0;
    cr_expect_geq(distinct, 50, "the heatmap is (nearly) uniform");
    stbi_image_free(px);
    heatmap_image_free(&img);
    free(b);
    profile_free(&p);
    tmpdir_remove(dir);
}

Test(inspect, compare_through_the_binary)
{
    profile a, b, other;
    insp_make(&a, CHUNKS_PLANE, 5, 16);
    insp_make(&b, CHUNKS_PLANE, 3, 16);
    insp_make(&other, CHUNKS_PLANE, 5, 32);
    char *dir = tmpdir_make(), pa[600], pb[600], po[600], csv[600], args[3000];
    insp_save(&a, dir, "a.json", pa, sizeof pa);
    insp_save(&b, dir, "b.json", pb, sizeof pb);
    insp_save(&other, dir, "other.json", po, sizeof po);
    char *so, *se;
    snprintf(args, sizeof args, "inspect %s --compare %s --json", pa, pa);
    cr_assert_eq(fx_fasa(args, &so, &se), 0, "%s", se);
    cJSON *o = cJSON_Parse(so);
    cr_assert(o);
    const cJSON *f;
    cJSON_ArrayForEach(f, cJSON_GetObjectItem(cJSON_GetObjectItem(o, "compare"), "f"))
        cr_expect_float_eq(cJSON_GetObjectItem(f, "overlap")->valuedouble, 1.0, 1e-9);
    cJSON_Delete(o);
    free(so), free(se);
    snprintf(args, sizeof args, "inspect %s --compare %s --json", pa, pb);
    cr_assert_eq(fx_fasa(args, &so, &se), 0, "%s", se);
    o = cJSON_Parse(so);
    cr_assert(o);
    int n = 0;
    cJSON_ArrayForEach(f, cJSON_GetObjectItem(cJSON_GetObjectItem(o, "compare"), "f"))
    {
        n++;
        cr_expect_lt(cJSON_GetObjectItem(f, "overlap")->valuedouble, 1.0);
    }
    cr_expect_eq(n, 2, "8 chunks, fcs 2: F in {1, 2}, got %d F values", n);
    cJSON_Delete(o);
    free(so), free(se);
    snprintf(args, sizeof args, "inspect %s --compare %s", pa, pb);
    cr_assert_eq(fx_fasa(args, &so, &se), 0, "%s", se);
    cr_expect(strstr(so, "compare") && strstr(so, "F=1"), "%s", so);
    free(so), free(se);
    /* other dims: an error, and the CSV asked for in the same call is not written */
    snprintf(csv, sizeof csv, "%s/ca.csv", dir);
    snprintf(args, sizeof args, "inspect %s --compare %s --csv %s", pa, po, csv);
    expect_one_line_error(args, "other.json");
    cr_expect_neq(access(csv, F_OK), 0, "a CSV was written although the command failed");
    profile_free(&a), profile_free(&b), profile_free(&other);
    tmpdir_remove(dir);
}

/* Writes text with the first occurrence of from (after the marker) replaced by to. */
static void insp_write_edited(const char *src, const char *dst, const char *marker, const char *from, const char *to)
{
    char *t = fx_read(src, NULL);
    cr_assert(t);
    char *m = strstr(t, marker), *at = m ? strstr(m, from) : NULL;
    cr_assert(at, "'%s' lacks '%s' after '%s'", src, from, marker);
    FILE *f = fopen(dst, "w");
    fwrite(t, 1, at - t, f);
    fputs(to, f);
    fputs(at + strlen(from), f);
    fclose(f);
    free(t);
}

Test(inspect, bad_profiles)
{
    profile p;
    insp_make(&p, CHUNKS_PLANE, 5, 16);
    char *dir = tmpdir_make(), path[600], bad[600], args[2000], out[600];
    insp_save(&p, dir, "p.json", path, sizeof path);
    /* truncated */
    size_t len;
    char *t = fx_read(path, &len);
    snprintf(bad, sizeof bad, "%s/truncated.json", dir);
    FILE *f = fopen(bad, "w");
    fwrite(t, 1, len / 2, f);
    fclose(f);
    free(t);
    snprintf(args, sizeof args, "inspect %s", bad);
    expect_one_line_error(args, "not valid JSON");
    /* a truncated file without the .json name is still recognised by its first byte */
    snprintf(out, sizeof out, "%s/truncated.profile", dir);
    cr_assert_eq(rename(bad, out), 0);
    snprintf(args, sizeof args, "inspect %s", out);
    expect_one_line_error(args, "truncated.profile");
    /* wrong version */
    snprintf(bad, sizeof bad, "%s/version.json", dir);
    insp_write_edited(path, bad, "\"version\"", "1", "7");
    snprintf(args, sizeof args, "inspect %s", bad);
    expect_one_line_error(args, "version 7");
    /* NaN is not JSON; a CA above 1 is out of range */
    snprintf(bad, sizeof bad, "%s/nan.json", dir);
    insp_write_edited(path, bad, "\"ca\"", "0.", "NaN, 0.");
    snprintf(args, sizeof args, "inspect %s", bad);
    expect_one_line_error(args, "nan.json");
    snprintf(bad, sizeof bad, "%s/range.json", dir);
    insp_write_edited(path, bad, "\"ca\"", "0.", "1.5, 0.");
    snprintf(args, sizeof args, "inspect %s", bad);
    expect_one_line_error(args, "chunks");   /* 9 values in an 8-chunk row */
    insp_write_edited(path, bad, "\"ca\"", "0.", "1");   /* "0.xxxxxx" -> "1xxxxxx": > 1 */
    expect_one_line_error(args, "not a number in [0, 1]");
    /* a rank that is not a permutation */
    snprintf(bad, sizeof bad, "%s/rank.json", dir);
    insp_write_edited(path, bad, "\"rank\"", "[[[", "[[[0,");
    snprintf(args, sizeof args, "inspect %s", bad);
    expect_one_line_error(args, "rank.json");
    /* options */
    snprintf(args, sizeof args, "inspect %s --k 5", path);
    expect_one_line_error(args, "has no K=5 (it has 4, 8, 16)");
    snprintf(args, sizeof args, "inspect %s --fcs 9", path);
    expect_one_line_error(args, "--fcs");
    snprintf(args, sizeof args, "inspect %s --export sglang-ds", path);
    expect_one_line_error(args, "needs '-o FILE'");
    snprintf(args, sizeof args, "inspect %s --export vllm -o %s/x.json", path, dir);
    expect_one_line_error(args, "unknown export 'vllm'");
    snprintf(args, sizeof args, "inspect %s --export sglang-ds -o %s/x.json --type v", path, dir);
    expect_one_line_error(args, "--type");
    snprintf(args, sizeof args, "inspect %s --export json-dims -o %s/no/such/dir/x.json", path, dir);
    expect_one_line_error(args, "cannot create");
    snprintf(args, sizeof args, "inspect %s --heatmap %s/no/such/dir/x.png", path, dir);
    expect_one_line_error(args, "cannot create");
    snprintf(args, sizeof args, "inspect %s --tensors", path);
    expect_one_line_error(args, "'--tensors' applies to models");
    expect_one_line_error("inspect /nonexistent/p.json", "cannot open '/nonexistent/p.json'");
    expect_one_line_error("inspect /nonexistent/m.gguf --k 64", "'--k' applies to calibration profiles");
    snprintf(args, sizeof args, "inspect %s --compare /nonexistent/q.json", path);
    expect_one_line_error(args, "cannot open '/nonexistent/q.json'");
    cr_expect_eq(insp_count_files(dir, ".tmp."), 0, "temp files left behind");
    cr_expect_eq(insp_count_files(dir, "x.json"), 0);
    profile_free(&p);
    tmpdir_remove(dir);
}

/* ---------------------------------------------------------------- the real profile */

/* $FASA_PROFILE, else the profile setup writes next to the default model (models/ beside bin/). */
static const char *insp_real_profile(void)
{
    static char path[512];
    const char *env = getenv("FASA_PROFILE");
    if (env && *env) return access(env, R_OK) == 0 && strlen(env) < 512 ? env : NULL;
    const char *bin = getenv("FASA_BIN");
    const char *slash = bin ? strrchr(bin, '/') : NULL;
    if (!slash) return NULL;
    snprintf(path, sizeof path, "%.*s/../models/SmolLM2-135M-Instruct.Q4_1.profile.json", (int)(slash - bin), bin);
    return access(path, R_OK) == 0 ? path : NULL;
}

Test(inspect, real_profile, .timeout = 120)
{
    const char *rp = insp_real_profile();
    if (!rp)
        cr_skip_test("inspect::real_profile: no profile of the default model (scripts/setup.sh, or set FASA_PROFILE)");
    profile p;
    char err[FASA_ERRLEN];
    cr_assert_eq(profile_load(&p, rp, err), 0, "%s", err);
    char *dir = tmpdir_make(), out[600], png[600], args[3000];
    snprintf(out, sizeof out, "%s/channels.json", dir);
    snprintf(png, sizeof png, "%s/ca.png", dir);
    char *so, *se;
    snprintf(args, sizeof args, "inspect %s --export sglang-ds -o %s --heatmap %s --compare %s --json", rp, out, png,
             rp);
    cr_assert_eq(fx_fasa(args, &so, &se), 0, "%s", se);
    cJSON *o = cJSON_Parse(so);
    cr_assert(o, "not JSON");
    cr_expect_eq(cJSON_GetArraySize(cJSON_GetObjectItem(o, "layers")), p.n_layer);
    const cJSON *f;
    cJSON_ArrayForEach(f, cJSON_GetObjectItem(cJSON_GetObjectItem(o, "compare"), "f"))
        cr_expect_float_eq(cJSON_GetObjectItem(f, "overlap")->valuedouble, 1.0, 1e-9);
    /* calibrated heads concentrate: the top-F chunks agree more than the average chunk */
    const cJSON *all = cJSON_GetObjectItem(o, "overall");
    cr_expect_gt(cJSON_GetObjectItem(all, "top_f_mean_ca")->valuedouble,
                 cJSON_GetObjectItem(all, "all_mean_ca")->valuedouble);
    cJSON_Delete(o);
    free(so), free(se);
    insp_check_sglang(&p, out, "qk", 2 * p.fcs);
    struct stat st;
    cr_expect(stat(png, &st) == 0 && st.st_size > 1000);
    profile_free(&p);
    tmpdir_remove(dir);
}

/* A lone .safetensors file (no config.json beside it): its tensors and metadata; with a config
 * beside it, the model summary instead. */
Test(inspect, lone_safetensors_lists_tensors)
{
    char *dir = tmpdir_make(), path[700], args[1600], err[ST_ERRLEN];
    snprintf(path, sizeof path, "%s/w.safetensors", dir);
    st_writer *w = st_writer_new();
    const float a[6] = { 1, 2, 3, 4, 5, 6 };
    const int64_t sa[2] = { 2, 3 }, sb[1] = { 6 };
    st_writer_add(w, "layer.a", ST_F32, 2, sa, a);
    st_writer_add(w, "layer.b", ST_F32, 1, sb, a);
    st_writer_meta(w, "origin", "test");
    cr_assert_eq(st_writer_write(w, path, err), 0, "%s", err);
    st_writer_free(w);
    char *out, *er;
    snprintf(args, sizeof args, "inspect %s", path);
    cr_assert_eq(fx_fasa(args, &out, &er), 0, "%s", er);
    cr_expect(strstr(out, "2 tensors") && strstr(out, "layer.a") && strstr(out, "2 x 3") &&
                  strstr(out, "origin = test"),
              "%s", out);
    free(out); free(er);
    snprintf(args, sizeof args, "inspect --json %s", path);
    cr_assert_eq(fx_fasa(args, &out, &er), 0, "%s", er);
    cJSON *o = cJSON_Parse(out);
    cr_assert_not_null(o, "%s", out);
    cr_expect_eq(cJSON_GetArraySize(cJSON_GetObjectItem(o, "tensors")), 2);
    cr_expect_eq(cJSON_GetObjectItem(o, "tensor_bytes")->valuedouble, 48);
    cJSON_Delete(o);
    free(out); free(er);
    /* a config beside it: model_open reads both (and this config does not fit: one error line) */
    char cfg[800];
    snprintf(cfg, sizeof cfg, "%s/config.json", dir);
    FILE *f = fopen(cfg, "w");
    fputs("{\"model_type\": \"llama\"}", f);
    fclose(f);
    snprintf(args, sizeof args, "inspect %s", path);
    cr_expect_eq(fx_fasa(args, &out, &er), 1, "%s", out);
    free(out); free(er);
    tmpdir_remove(dir);
}

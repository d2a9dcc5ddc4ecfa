/* export.c - profile summaries, comparisons, and exports for other engines. */
#include "export.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---------------------------------------------------------------- helpers */

/* cJSON text with a line break after every comma (outside strings) at depth <= max_depth, so
 * big tables read one row per line. Returns a malloc'd string or NULL. */
static char *json_lines(const cJSON *o, int max_depth)
{
    char *text = cJSON_PrintUnformatted(o);
    if (!text) return NULL;
    size_t len = strlen(text), extra = 2;
    for (size_t i = 0; i < len; i++) extra += text[i] == ',';
    char *out = malloc(len + extra), *w = out;
    if (!out) { free(text); return NULL; }
    int depth = 0, in_str = 0;
    for (const char *r = text; *r; r++) {
        *w++ = *r;
        if (in_str) {
            if (*r == '\\' && r[1]) *w++ = *++r;
            else if (*r == '"') in_str = 0;
            continue;
        }
        if (*r == '"') in_str = 1;
        else if (*r == '[' || *r == '{') depth++;
        else if (*r == ']' || *r == '}') depth--;
        else if (*r == ',' && depth <= max_depth) *w++ = '\n';
    }
    *w++ = '\n';
    *w = 0;
    free(text);
    return out;
}

static int write_json(const cJSON *o, int max_depth, const char *path, char *err)
{
    char *text = json_lines(o, max_depth);
    if (!text) return fasa_error(err, FASA_ENOMEM, "out of memory writing '%s'", path);
    int rc = fasa_write_file(path, text, strlen(text), err);
    free(text);
    return rc;
}

void export_chunk_dims(enum chunk_def def, int d_head, int chunk, int dims[2])
{
    if (def == CHUNKS_PLANE) dims[0] = chunk, dims[1] = chunk + d_head / 2;
    else dims[0] = 2 * chunk, dims[1] = 2 * chunk + 1;
}

const char *export_chunk_note(enum chunk_def def)
{
    /* adjacent chunk j = dims 2j, 2j+1, which are halves of RoPE planes 2j and 2j+1 (mod d/2) */
    return def == CHUNKS_PLANE ? "chunk 0 = highest frequency"
                               : "chunks j and j+d/4 hold halves of planes 2j, 2j+1 (plane 0 = highest frequency)";
}

/* Stable insertion sort by decreasing score: equal scores keep the lower id first. */
static void rank_by(const double *score, int n, int16_t *out)
{
    for (int i = 0; i < n; i++) out[i] = (int16_t)i;
    for (int i = 1; i < n; i++) {
        int16_t v = out[i];
        int j = i - 1;
        while (j >= 0 && score[out[j]] < score[v]) out[j + 1] = out[j], j--;
        out[j + 1] = v;
    }
}

void export_rank_at(const profile *p, int ki, int layer, int head, int16_t *out)
{
    if (p->ks[ki] == p->rank_k) memcpy(out, profile_rank(p, layer, head), sizeof *out * p->n_chunk);
    else rank_by(profile_ca(p, ki, layer, head), p->n_chunk, out);
}

/* Orders chunks by votes, then by summed CA, then by id. */
static void order_votes(const int16_t *votes, const double *ca_sum, int n, int16_t *out)
{
    for (int i = 0; i < n; i++) out[i] = (int16_t)i;
    for (int i = 1; i < n; i++) {
        int16_t v = out[i];
        int j = i - 1;
        while (j >= 0 && (votes[out[j]] < votes[v] || (votes[out[j]] == votes[v] && ca_sum[out[j]] < ca_sum[v])))
            out[j + 1] = out[j], j--;
        out[j + 1] = v;
    }
}

/* ---------------------------------------------------------------- summary */

void export_summary_free(export_summary *s)
{
    if (s->layers)
        for (int l = 0; l < s->n_layer; l++) free(s->layers[l].by_votes), free(s->layers[l].votes);
    free(s->layers);
    free(s->rank);
    free(s->by_votes);
    free(s->votes);
    memset(s, 0, sizeof *s);
}

int export_summarize(const profile *p, int k, int fcs, export_summary *s, char *err)
{
    memset(s, 0, sizeof *s);
    int ki = profile_k_index(p, k);
    if (ki < 0) return fasa_error(err, FASA_EARG, "the profile has no K=%d", k);
    if (fcs < 1 || fcs > p->n_chunk)
        return fasa_error(err, FASA_EARG, "F=%d is outside [1, %d]", fcs, p->n_chunk);
    const int L = p->n_layer, H = p->n_head, C = p->n_chunk;
    s->k = k, s->ki = ki, s->fcs = fcs, s->n_layer = L, s->n_head = H, s->n_chunk = C;
    s->rank = malloc(sizeof *s->rank * L * H * C);
    s->layers = calloc(L, sizeof *s->layers);
    s->by_votes = calloc(C, sizeof *s->by_votes);
    s->votes = calloc(C, sizeof *s->votes);
    double *sum = calloc(C, sizeof *sum), *all_sum = calloc(C, sizeof *all_sum);
    int ok = s->rank && s->layers && s->by_votes && s->votes && sum && all_sum;
    for (int l = 0; ok && l < L; l++) {
        export_layer *e = &s->layers[l];
        e->by_votes = calloc(C, sizeof *e->by_votes);
        e->votes = calloc(C, sizeof *e->votes);
        if (!e->by_votes || !e->votes) { ok = 0; break; }
        memset(sum, 0, sizeof *sum * C);
        e->best_min = 2, e->best_max = -1;
        double top = 0, all = 0;
        for (int h = 0; h < H; h++) {
            int16_t *r = s->rank + ((size_t)l * H + h) * C;
            export_rank_at(p, ki, l, h, r);
            const double *ca = profile_ca(p, ki, l, h);
            double best = ca[r[0]];
            if (best < e->best_min) e->best_min = best;
            if (best > e->best_max) e->best_max = best;
            e->best_mean += best / H;
            for (int i = 0; i < fcs; i++) top += ca[r[i]], e->votes[r[i]]++, s->votes[r[i]]++;
            for (int c = 0; c < C; c++) all += ca[c], sum[c] += ca[c], all_sum[c] += ca[c];
        }
        e->top_mean = top / ((double)H * fcs);
        e->all_mean = all / ((double)H * C);
        for (int c = 0; c < C; c++) e->n_union += e->votes[c] > 0, e->n_shared += e->votes[c] == H;
        order_votes(e->votes, sum, C, e->by_votes);
        s->best_mean += e->best_mean / L;
        s->top_mean += e->top_mean / L;
        s->all_mean += e->all_mean / L;
        s->n_union_mean += (double)e->n_union / L;
    }
    if (ok) order_votes(s->votes, all_sum, C, s->by_votes);
    free(sum);
    free(all_sum);
    if (!ok) {
        export_summary_free(s);
        return fasa_error(err, FASA_ENOMEM, "out of memory summarising a profile");
    }
    return 0;
}

static cJSON *chunk_votes_json(const int16_t *by_votes, const int16_t *votes, int n)
{
    cJSON *a = cJSON_CreateArray();
    for (int i = 0; i < n && votes[by_votes[i]] > 0; i++) {
        cJSON *o = cJSON_CreateObject();
        cJSON_AddNumberToObject(o, "chunk", by_votes[i]);
        cJSON_AddNumberToObject(o, "heads", votes[by_votes[i]]);
        cJSON_AddItemToArray(a, o);
    }
    return a;
}

static cJSON *rounded(double v)
{
    char buf[32];
    snprintf(buf, sizeof buf, "%.6f", v);
    return cJSON_CreateRaw(buf);
}

cJSON *export_summary_json(const profile *p, const char *path, const export_summary *s)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "profile", path);
    profile_json_identity(p, o);
    cJSON_AddNumberToObject(o, "k", s->k);
    cJSON_AddNumberToObject(o, "fcs", s->fcs);
    cJSON *la = cJSON_AddArrayToObject(o, "layers");
    for (int l = 0; l < s->n_layer; l++) {
        const export_layer *e = &s->layers[l];
        cJSON *lo = cJSON_CreateObject();
        cJSON_AddNumberToObject(lo, "layer", l);
        cJSON *b = cJSON_AddObjectToObject(lo, "best_ca");
        cJSON_AddItemToObject(b, "min", rounded(e->best_min));
        cJSON_AddItemToObject(b, "mean", rounded(e->best_mean));
        cJSON_AddItemToObject(b, "max", rounded(e->best_max));
        cJSON_AddItemToObject(lo, "top_f_mean_ca", rounded(e->top_mean));
        cJSON_AddItemToObject(lo, "all_mean_ca", rounded(e->all_mean));
        cJSON_AddItemToObject(lo, "concentration", rounded(e->all_mean > 0 ? e->top_mean / e->all_mean : 0));
        cJSON_AddNumberToObject(lo, "union_size", e->n_union);
        cJSON_AddNumberToObject(lo, "shared_size", e->n_shared);
        cJSON_AddItemToObject(lo, "top_chunks", chunk_votes_json(e->by_votes, e->votes, s->n_chunk));
        cJSON *heads = cJSON_AddArrayToObject(lo, "dominant_chunks");
        for (int h = 0; h < s->n_head; h++) {
            int tmp[1024];
            const int16_t *r = s->rank + ((size_t)l * s->n_head + h) * s->n_chunk;
            for (int i = 0; i < s->fcs; i++) tmp[i] = r[i];
            cJSON_AddItemToArray(heads, cJSON_CreateIntArray(tmp, s->fcs));
        }
        cJSON_AddItemToArray(la, lo);
    }
    cJSON *all = cJSON_AddObjectToObject(o, "overall");
    cJSON_AddItemToObject(all, "best_ca_mean", rounded(s->best_mean));
    cJSON_AddItemToObject(all, "top_f_mean_ca", rounded(s->top_mean));
    cJSON_AddItemToObject(all, "all_mean_ca", rounded(s->all_mean));
    cJSON_AddItemToObject(all, "concentration", rounded(s->all_mean > 0 ? s->top_mean / s->all_mean : 0));
    cJSON_AddItemToObject(all, "union_size_mean", rounded(s->n_union_mean));
    cJSON_AddItemToObject(all, "top_chunks", chunk_votes_json(s->by_votes, s->votes, s->n_chunk));
    return o;
}

/* ---------------------------------------------------------------- compare */

void export_compare_free(export_compare *c)
{
    free(c->head);
    free(c->kv);
    memset(c, 0, sizeof *c);
}

/* |dims(top F of ra) ∩ dims(top F of rb)| / 2F */
static double overlap(const profile *a, const int16_t *ra, const profile *b, const int16_t *rb, int f)
{
    unsigned char in_a[2048] = { 0 };
    int d[2], n = 0;
    for (int i = 0; i < f; i++) {
        export_chunk_dims(a->chunks, a->d_head, ra[i], d);
        in_a[d[0]] = in_a[d[1]] = 1;
    }
    for (int i = 0; i < f; i++) {
        export_chunk_dims(b->chunks, b->d_head, rb[i], d);
        n += in_a[d[0]] + in_a[d[1]];
    }
    return n / (2.0 * f);
}

int export_compare_profiles(const profile *a, const char *path_a, const profile *b, const char *path_b,
                            int fcs, export_compare *c, char *err)
{
    memset(c, 0, sizeof *c);
    if (a->n_layer != b->n_layer || a->n_head != b->n_head || a->n_kv_head != b->n_kv_head || a->d_head != b->d_head)
        return fasa_error(err, FASA_EMISMATCH,
                          "'%s' is for %d layers x %d/%d heads x dim %d, but '%s' for %d x %d/%d x %d",
                          path_b, b->n_layer, b->n_head, b->n_kv_head, b->d_head, path_a, a->n_layer, a->n_head,
                          a->n_kv_head, a->d_head);
    const int C = a->n_chunk, L = a->n_layer;
    if (fcs < 1 || fcs > C) return fasa_error(err, FASA_EARG, "F=%d is outside [1, %d]", fcs, C);
    int cand[3] = { C / 8 > 0 ? C / 8 : 1, C / 4 > 0 ? C / 4 : 1, fcs };
    for (int i = 0; i < 3; i++) {
        int dup = 0;
        for (int j = 0; j < c->n_f; j++) dup |= c->f[j] == cand[i];
        if (dup) continue;
        int j = c->n_f++;
        while (j > 0 && c->f[j - 1] > cand[i]) c->f[j] = c->f[j - 1], j--;
        c->f[j] = cand[i];
    }
    c->n_layer = L, c->n_chunk = C;
    c->head = calloc((size_t)c->n_f * L, sizeof *c->head);
    c->kv = calloc((size_t)c->n_f * L, sizeof *c->kv);
    if (!c->head || !c->kv) {
        export_compare_free(c);
        return fasa_error(err, FASA_ENOMEM, "out of memory comparing profiles");
    }
    for (int fi = 0; fi < c->n_f; fi++) {
        int f = c->f[fi];
        for (int l = 0; l < L; l++) {
            double sh = 0, sk = 0;
            for (int h = 0; h < a->n_head; h++) sh += overlap(a, profile_rank(a, l, h), b, profile_rank(b, l, h), f);
            for (int g = 0; g < a->n_kv_head; g++)
                sk += overlap(a, profile_group_rank(a, l, g), b, profile_group_rank(b, l, g), f);
            c->head[(size_t)fi * L + l] = sh / a->n_head;
            c->kv[(size_t)fi * L + l] = sk / a->n_kv_head;
            c->overall[fi] += sh / a->n_head / L;
            c->kv_overall[fi] += sk / a->n_kv_head / L;
        }
    }
    return 0;
}

cJSON *export_compare_json(const export_compare *c, const char *path_a, const char *path_b)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "a", path_a);
    cJSON_AddStringToObject(o, "b", path_b);
    cJSON *fa = cJSON_AddArrayToObject(o, "f");
    for (int fi = 0; fi < c->n_f; fi++) {
        cJSON *e = cJSON_CreateObject();
        cJSON_AddNumberToObject(e, "f", c->f[fi]);
        cJSON_AddItemToObject(e, "overlap", rounded(c->overall[fi]));
        cJSON_AddItemToObject(e, "kv_overlap", rounded(c->kv_overall[fi]));
        cJSON_AddItemToObject(e, "chance", rounded((double)c->f[fi] / c->n_chunk));
        cJSON *h = cJSON_AddArrayToObject(e, "layers");
        cJSON *k = cJSON_AddArrayToObject(e, "kv_layers");
        for (int l = 0; l < c->n_layer; l++) {
            cJSON_AddItemToArray(h, rounded(c->head[(size_t)fi * c->n_layer + l]));
            cJSON_AddItemToArray(k, rounded(c->kv[(size_t)fi * c->n_layer + l]));
        }
        cJSON_AddItemToArray(fa, e);
    }
    return o;
}

/* ---------------------------------------------------------------- exports */

/* A ranking as Hugging Face dims: each chunk's two dims, best chunk first. */
static cJSON *ranked_dims(const profile *p, const int16_t *r, int n_chunk)
{
    int dims[2048], d[2];
    for (int i = 0; i < n_chunk; i++) {
        export_chunk_dims(p->chunks, p->d_head, r[i], d);
        dims[2 * i] = d[0], dims[2 * i + 1] = d[1];
    }
    return cJSON_CreateIntArray(dims, 2 * n_chunk);
}

int export_sglang_ds(const profile *p, enum export_ds_type type, const char *path, char *err)
{
    static const char *const suffix[] = { "qk", "q", "k" };
    cJSON *o = cJSON_CreateObject();
    for (int l = 0; o && l < p->n_layer; l++) {
        char key[96];
        snprintf(key, sizeof key, "model.layers.%d.self_attn.%s_proj", l, suffix[type]);
        cJSON *rows = cJSON_AddArrayToObject(o, key);
        int n = type == EXPORT_DS_K ? p->n_kv_head : p->n_head;
        for (int h = 0; h < n; h++) {
            const int16_t *r = type == EXPORT_DS_K ? profile_group_rank(p, l, h) : profile_rank(p, l, h);
            cJSON_AddItemToArray(rows, ranked_dims(p, r, p->n_chunk));
        }
    }
    if (!o) return fasa_error(err, FASA_ENOMEM, "out of memory writing '%s'", path);
    int rc = write_json(o, 1, path, err);   /* one layer per line */
    cJSON_Delete(o);
    return rc;
}

static cJSON *dominant_json(const profile *p, const int16_t *r, int fcs)
{
    int ids[1024];
    for (int i = 0; i < fcs; i++) ids[i] = r[i];
    return cJSON_CreateIntArray(ids, fcs);
}

int export_json_dims(const profile *p, int fcs, const char *path, char *err)
{
    if (fcs < 1 || fcs > p->n_chunk) return fasa_error(err, FASA_EARG, "F=%d is outside [1, %d]", fcs, p->n_chunk);
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "format", "fasa-dims");
    cJSON_AddNumberToObject(o, "version", 1);
    profile_json_identity(p, o);   /* "model", "chunks", "calibration" as a profile has them */
    cJSON_AddNumberToObject(o, "d_head", p->d_head);
    cJSON_AddStringToObject(o, "chunk_definition", p->chunks == CHUNKS_PLANE ? "plane" : "adjacent");
    cJSON_AddStringToObject(o, "dims_layout", "huggingface-rotate-half");   /* dims of one head, 0..d_head-1 */
    cJSON_AddNumberToObject(o, "rank_k", p->rank_k);
    cJSON_AddNumberToObject(o, "fcs", fcs);
    cJSON *layers = cJSON_AddArrayToObject(o, "layers");
    const int group = p->n_head / p->n_kv_head;
    for (int l = 0; l < p->n_layer; l++) {
        cJSON *lo = cJSON_CreateObject();
        cJSON_AddNumberToObject(lo, "layer", l);
        cJSON *heads = cJSON_AddArrayToObject(lo, "heads");
        for (int h = 0; h < p->n_head; h++) {
            cJSON *ho = cJSON_CreateObject();
            cJSON_AddNumberToObject(ho, "head", h);
            cJSON_AddNumberToObject(ho, "kv_head", h / group);
            cJSON_AddItemToObject(ho, "dominant_chunks", dominant_json(p, profile_rank(p, l, h), fcs));
            cJSON_AddItemToObject(ho, "dims_hf", ranked_dims(p, profile_rank(p, l, h), fcs));
            cJSON_AddItemToArray(heads, ho);
        }
        cJSON *kvs = cJSON_AddArrayToObject(lo, "kv_heads");
        for (int g = 0; g < p->n_kv_head; g++) {
            cJSON *go = cJSON_CreateObject();
            cJSON_AddNumberToObject(go, "kv_head", g);
            cJSON_AddItemToObject(go, "dominant_chunks", dominant_json(p, profile_group_rank(p, l, g), fcs));
            cJSON_AddItemToObject(go, "dims_hf", ranked_dims(p, profile_group_rank(p, l, g), fcs));
            cJSON_AddItemToArray(kvs, go);
        }
        cJSON_AddItemToArray(layers, lo);
    }
    char *text = cJSON_Print(o);
    cJSON_Delete(o);
    if (!text) return fasa_error(err, FASA_ENOMEM, "out of memory writing '%s'", path);
    size_t n = strlen(text);
    text[n] = '\n';   /* cJSON_Print's terminator becomes the final newline */
    int rc = fasa_write_file(path, text, n + 1, err);
    free(text);
    return rc;
}

int export_csv(const profile *p, const char *path, char *err)
{
    size_t rows = (size_t)p->n_k * p->n_layer * p->n_head * p->n_chunk;
    size_t cap = 64 + rows * 48, len = 0;
    char *buf = malloc(cap);
    int16_t *r = malloc(sizeof *r * p->n_chunk), *pos = malloc(sizeof *pos * p->n_chunk);
    if (!buf || !r || !pos) {
        free(buf), free(r), free(pos);
        return fasa_error(err, FASA_ENOMEM, "out of memory writing '%s'", path);
    }
    len += snprintf(buf, cap, "k,layer,head,chunk,ca,rank\n");
    for (int ki = 0; ki < p->n_k; ki++)
        for (int l = 0; l < p->n_layer; l++)
            for (int h = 0; h < p->n_head; h++) {
                export_rank_at(p, ki, l, h, r);
                for (int i = 0; i < p->n_chunk; i++) pos[r[i]] = (int16_t)i;
                const double *ca = profile_ca(p, ki, l, h);
                for (int c = 0; c < p->n_chunk; c++)
                    len +=
                        snprintf(buf + len, cap - len, "%d,%d,%d,%d,%.6f,%d\n", p->ks[ki], l, h, c, ca[c], pos[c] + 1);
            }
    int rc = fasa_write_file(path, buf, len, err);
    free(buf), free(r), free(pos);
    return rc;
}

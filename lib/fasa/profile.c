/* profile.c - calibration profiles: memory layout, JSON in and out, checks against a model. */
#include "profile.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include "model.h"

int profile_alloc(profile *p, char *err)
{
    size_t per = (size_t)p->n_layer * p->n_head * p->n_chunk;
    p->ca = calloc((size_t)p->n_k * per, sizeof *p->ca);
    p->rank = calloc(per, sizeof *p->rank);
    p->group_rank = calloc((size_t)p->n_layer * p->n_kv_head * p->n_chunk, sizeof *p->group_rank);
    if (!p->ca || !p->rank || !p->group_rank) {
        profile_free(p);
        return fasa_error(err, FASA_ENOMEM, "out of memory for a profile");
    }
    return 0;
}

void profile_free(profile *p)
{
    free(p->ca);
    free(p->rank);
    free(p->group_rank);
    p->ca = NULL;
    p->rank = p->group_rank = NULL;
}

int profile_k_index(const profile *p, int k)
{
    for (int i = 0; i < p->n_k; i++)
        if (p->ks[i] == k) return i;
    return -1;
}

/* Sorts chunk ids by decreasing score; equal scores keep the lower id first. */
static void rank_by(const double *score, int n, int16_t *out)
{
    for (int i = 0; i < n; i++) out[i] = (int16_t)i;
    for (int i = 1; i < n; i++) {   /* insertion sort: n is d_head/2, and it is stable */
        int16_t v = out[i];
        int j = i - 1;
        while (j >= 0 && score[out[j]] < score[v]) out[j + 1] = out[j], j--;
        out[j + 1] = v;
    }
}

void profile_rank_all(profile *p)
{
    int ki = profile_k_index(p, p->rank_k);
    if (ki < 0) ki = 0;
    const int group = p->n_head / p->n_kv_head;
    double *mean = malloc(sizeof(double) * p->n_chunk);
    for (int l = 0; l < p->n_layer; l++) {
        for (int h = 0; h < p->n_head; h++)
            rank_by(profile_ca(p, ki, l, h), p->n_chunk, p->rank + ((size_t)l * p->n_head + h) * p->n_chunk);
        for (int g = 0; g < p->n_kv_head; g++) {
            for (int c = 0; c < p->n_chunk; c++) {
                double s = 0;
                for (int h = g * group; h < (g + 1) * group; h++) s += profile_ca(p, ki, l, h)[c];
                mean[c] = s / group;
            }
            rank_by(mean, p->n_chunk, p->group_rank + ((size_t)l * p->n_kv_head + g) * p->n_chunk);
        }
    }
    free(mean);
}

void profile_default_path(const char *model_path, char *out, size_t cap)
{
    size_t n = strlen(model_path);
    while (n > 1 && model_path[n - 1] == '/') n--;
    static const char *const exts[] = { ".gguf", ".safetensors", ".fasa" };
    for (size_t i = 0; i < sizeof exts / sizeof *exts; i++) {
        size_t e = strlen(exts[i]);
        if (n > e && !memcmp(model_path + n - e, exts[i], e)) { n -= e; break; }
    }
    snprintf(out, cap, "%.*s.profile.json", (int)n, model_path);
}

int profile_find(const char *model_path, char *out, size_t cap)
{
    struct stat st;
    profile_default_path(model_path, out, cap);
    if (access(out, R_OK) == 0) return 1;
    if (stat(model_path, &st) == 0 && S_ISDIR(st.st_mode)) {
        snprintf(out, cap, "%s/profile.json", model_path);
        if (access(out, R_OK) == 0) return 1;
    }
    return 0;
}

uint64_t profile_model_hash(const model *m)
{
    XXH64_state_t *st = XXH64_createState();
    XXH64_reset(st, 0);
    for (int l = 0; l < m->cfg.n_layer; l++) {
        const layer_weights *L = &m->layers[l];
        XXH64_update(st, L->wq.data, weight_bytes(&L->wq));
        XXH64_update(st, L->wk.data, weight_bytes(&L->wk));
    }
    uint64_t h = XXH64_digest(st);
    XXH64_freeState(st);
    return h;
}

void profile_chunk_dims(const model *m, int layer, int kv_head, enum chunk_def def, int16_t *dims)
{
    const int d = m->cfg.d_head, half = d / 2;
    const int16_t *src = m->rope_src + ((size_t)layer * m->cfg.n_kv_head + kv_head) * d;
    for (int c = 0; c < d; c++) {
        int hf = model_hf_dim(m, layer, kv_head, src[c]);
        /* plane: chunk j = hf dims (j, j + d/2); adjacent: chunk j = hf dims (2j, 2j + 1) */
        int chunk = def == CHUNKS_PLANE ? hf % half : hf / 2;
        int which = def == CHUNKS_PLANE ? hf / half : hf % 2;
        dims[2 * chunk + which] = (int16_t)c;
    }
}

/* ---------------------------------------------------------------- JSON out */

static cJSON *num6(double v)
{
    char buf[32];
    snprintf(buf, sizeof buf, "%.6f", v);
    return cJSON_CreateRaw(buf);
}

static cJSON *rank_json(const int16_t *r, int n_outer, int n_inner, int n_chunk)
{
    cJSON *a = cJSON_CreateArray();
    for (int l = 0; l < n_outer; l++) {
        cJSON *la = cJSON_CreateArray();
        for (int h = 0; h < n_inner; h++) {
            cJSON *ha = cJSON_CreateArray();
            for (int c = 0; c < n_chunk; c++)
                cJSON_AddItemToArray(ha, cJSON_CreateNumber(r[((size_t)l * n_inner + h) * n_chunk + c]));
            cJSON_AddItemToArray(la, ha);
        }
        cJSON_AddItemToArray(a, la);
    }
    return a;
}

void profile_json_identity(const profile *p, cJSON *o)
{
    char hex[32];
    cJSON *mo = cJSON_AddObjectToObject(o, "model");
    cJSON_AddStringToObject(mo, "architecture", p->arch);
    cJSON_AddNumberToObject(mo, "n_layer", p->n_layer);
    cJSON_AddNumberToObject(mo, "n_head", p->n_head);
    cJSON_AddNumberToObject(mo, "n_kv_head", p->n_kv_head);
    cJSON_AddNumberToObject(mo, "d_head", p->d_head);
    snprintf(hex, sizeof hex, "%016llx", (unsigned long long)p->qk_hash);
    cJSON_AddStringToObject(mo, "qk_hash", hex);
    if (p->sliding_window > 0) {   /* the layers FASA covers: the global ones */
        cJSON_AddNumberToObject(mo, "sliding_window", p->sliding_window);
        cJSON_AddNumberToObject(mo, "swa_period", p->swa_period);
        cJSON *fl = cJSON_AddArrayToObject(mo, "fasa_layers");
        const model_config c = { .sliding_window = p->sliding_window, .swa_period = p->swa_period };
        for (int l = 0; l < p->n_layer; l++)
            if (!model_layer_local(&c, l)) cJSON_AddItemToArray(fl, cJSON_CreateNumber(l));
    }
    cJSON *co = cJSON_AddObjectToObject(o, "chunks");
    cJSON_AddStringToObject(co, "definition", p->chunks == CHUNKS_PLANE ? "plane" : "adjacent");
    cJSON_AddNumberToObject(co, "count", p->n_chunk);
    cJSON *ko = cJSON_AddObjectToObject(o, "calibration");
    snprintf(hex, sizeof hex, "%016llx", (unsigned long long)p->sample_hash);
    cJSON_AddStringToObject(ko, "sample_hash", hex);
    cJSON_AddNumberToObject(ko, "n_tokens", p->n_tokens);
    cJSON_AddNumberToObject(ko, "n_prefill", p->n_prefill);
    cJSON_AddNumberToObject(ko, "n_steps", p->n_steps);
    cJSON_AddItemToObject(ko, "k", cJSON_CreateIntArray(p->ks, p->n_k));
    cJSON_AddNumberToObject(ko, "rank_k", p->rank_k);
    cJSON_AddNumberToObject(ko, "fcs", p->fcs);
}

int profile_save(const profile *p, const char *path, char *err)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "format", "fasa-profile");
    cJSON_AddNumberToObject(o, "version", PROFILE_VERSION);
    profile_json_identity(p, o);
    cJSON *ca = cJSON_AddObjectToObject(o, "ca");
    for (int ki = 0; ki < p->n_k; ki++) {
        char key[16];
        snprintf(key, sizeof key, "%d", p->ks[ki]);
        cJSON *ka = cJSON_AddArrayToObject(ca, key);
        for (int l = 0; l < p->n_layer; l++) {
            cJSON *la = cJSON_CreateArray();
            for (int h = 0; h < p->n_head; h++) {
                cJSON *ha = cJSON_CreateArray();
                const double *v = profile_ca(p, ki, l, h);
                for (int c = 0; c < p->n_chunk; c++) cJSON_AddItemToArray(ha, num6(v[c]));
                cJSON_AddItemToArray(la, ha);
            }
            cJSON_AddItemToArray(ka, la);
        }
    }
    cJSON_AddItemToObject(o, "rank", rank_json(p->rank, p->n_layer, p->n_head, p->n_chunk));
    cJSON_AddItemToObject(o, "group_rank", rank_json(p->group_rank, p->n_layer, p->n_kv_head, p->n_chunk));
    char *text = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    if (!text) return fasa_error(err, FASA_ENOMEM, "out of memory writing '%s'", path);

    /* One line per array of chunks keeps the file readable and diffable. */
    size_t len = strlen(text);
    char *pretty = malloc(len * 2 + 2), *w = pretty;
    int depth = 0;
    for (const char *r = text; pretty && *r; r++) {
        *w++ = *r;
        if (*r == '[' || *r == '{') depth++;
        if (*r == ']' || *r == '}') depth--;
        if (*r == ',' && (r[-1] == ']' || r[-1] == '}' || depth <= 1)) *w++ = '\n';
    }
    if (pretty) *w++ = '\n', *w = 0;
    free(text);
    if (!pretty) return fasa_error(err, FASA_ENOMEM, "out of memory writing '%s'", path);

    const int rc = fasa_write_file(path, pretty, strlen(pretty), err);
    free(pretty);
    return rc;
}

/* ---------------------------------------------------------------- JSON in */

static int get_int(const cJSON *o, const char *key, int lo, int hi, int *out, const char *path, char *err)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!cJSON_IsNumber(v) || v->valuedouble != floor(v->valuedouble) || v->valuedouble < lo || v->valuedouble > hi)
        return fasa_error(err, FASA_EFORMAT, "'%s': '%s' is missing or not an integer in [%d, %d]", path, key, lo, hi);
    *out = (int)v->valuedouble;
    return 0;
}

static int get_hex(const cJSON *o, const char *key, uint64_t *out, const char *path, char *err)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    char *end;
    if (!cJSON_IsString(v) || strlen(v->valuestring) != 16 ||
        (errno = 0, *out = strtoull(v->valuestring, &end, 16), errno || *end))
        return fasa_error(err, FASA_EFORMAT, "'%s': '%s' is not a 16-digit hex hash", path, key);
    return 0;
}

/* A [n_outer][n_inner][n_chunk] array of permutations of 0..n_chunk-1. */
static int load_rank(const cJSON *a, int n_outer, int n_inner, int n_chunk, int16_t *out,
                     const char *what, const char *path, char *err)
{
    if (!cJSON_IsArray(a) || cJSON_GetArraySize(a) != n_outer)
        return fasa_error(err, FASA_EFORMAT, "'%s': '%s' must have %d layers", path, what, n_outer);
    char seen[1024];
    for (int l = 0; l < n_outer; l++) {
        const cJSON *la = cJSON_GetArrayItem(a, l);
        if (!cJSON_IsArray(la) || cJSON_GetArraySize(la) != n_inner)
            return fasa_error(err, FASA_EFORMAT, "'%s': '%s' layer %d must have %d heads", path, what, l, n_inner);
        for (int h = 0; h < n_inner; h++) {
            const cJSON *ha = cJSON_GetArrayItem(la, h);
            if (!cJSON_IsArray(ha) || cJSON_GetArraySize(ha) != n_chunk)
                return fasa_error(err, FASA_EFORMAT, "'%s': '%s' layer %d head %d must list %d chunks", path, what, l,
                                  h, n_chunk);
            memset(seen, 0, n_chunk);
            int c = 0;
            const cJSON *v;
            cJSON_ArrayForEach(v, ha) {
                double x = cJSON_IsNumber(v) ? v->valuedouble : -1;
                if (x < 0 || x >= n_chunk || x != floor(x) || seen[(int)x]++)
                    return fasa_error(err, FASA_EFORMAT,
                                      "'%s': '%s' layer %d head %d is not a permutation of the chunks", path, what, l,
                                      h);
                out[((size_t)l * n_inner + h) * n_chunk + c++] = (int16_t)x;
            }
        }
    }
    return 0;
}

/* The 'ca' object: checked (fill 0) or copied into p->ca (fill 1, once allocated). */
static int load_ca(profile *p, const cJSON *ca, int fill, const char *path, char *err)
{
    const cJSON *v;
    for (int ki = 0; ki < p->n_k; ki++) {
        char key[16];
        snprintf(key, sizeof key, "%d", p->ks[ki]);
        const cJSON *ka = cJSON_IsObject(ca) ? cJSON_GetObjectItemCaseSensitive(ca, key) : NULL;
        if (!cJSON_IsArray(ka) || cJSON_GetArraySize(ka) != p->n_layer)
            return fasa_error(err, FASA_EFORMAT, "'%s': 'ca' lacks K=%d for %d layers", path, p->ks[ki], p->n_layer);
        for (int l = 0; l < p->n_layer; l++) {
            const cJSON *la = cJSON_GetArrayItem(ka, l);
            if (!cJSON_IsArray(la) || cJSON_GetArraySize(la) != p->n_head)
                return fasa_error(err, FASA_EFORMAT, "'%s': 'ca' K=%d layer %d must have %d heads", path, p->ks[ki], l,
                                  p->n_head);
            for (int h = 0; h < p->n_head; h++) {
                const cJSON *ha = cJSON_GetArrayItem(la, h);
                if (!cJSON_IsArray(ha) || cJSON_GetArraySize(ha) != p->n_chunk)
                    return fasa_error(err, FASA_EFORMAT, "'%s': 'ca' K=%d layer %d head %d must have %d chunks", path,
                                      p->ks[ki], l, h, p->n_chunk);
                double *dst = fill ? profile_ca(p, ki, l, h) : NULL;
                int c = 0;
                cJSON_ArrayForEach(v, ha) {
                    if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble) || v->valuedouble < 0 || v->valuedouble > 1)
                        return fasa_error(err, FASA_EFORMAT,
                                          "'%s': 'ca' K=%d layer %d head %d chunk %d is not a number in [0, 1]", path,
                                          p->ks[ki], l, h, c);
                    if (dst) dst[c] = v->valuedouble;
                    c++;
                }
            }
        }
    }
    return 0;
}

static int profile_from_json(profile *p, const cJSON *o, const char *path, char *err)
{
    const cJSON *fmt = cJSON_GetObjectItemCaseSensitive(o, "format");
    if (!cJSON_IsString(fmt) || strcmp(fmt->valuestring, "fasa-profile"))
        return fasa_error(err, FASA_EFORMAT, "'%s': not a fasa profile (no \"format\": \"fasa-profile\")", path);
    int version = 0, rc;
    if ((rc = get_int(o, "version", 0, 1 << 30, &version, path, err)) < 0) return rc;
    if (version != PROFILE_VERSION)
        return fasa_error(err, FASA_EFORMAT, "'%s': profile version %d, this fasa reads version %d", path, version,
                          PROFILE_VERSION);
    const cJSON *mo = cJSON_GetObjectItemCaseSensitive(o, "model");
    const cJSON *co = cJSON_GetObjectItemCaseSensitive(o, "chunks");
    const cJSON *ko = cJSON_GetObjectItemCaseSensitive(o, "calibration");
    if (!cJSON_IsObject(mo) || !cJSON_IsObject(co) || !cJSON_IsObject(ko))
        return fasa_error(err, FASA_EFORMAT, "'%s': 'model', 'chunks' and 'calibration' objects are required", path);
    const cJSON *arch = cJSON_GetObjectItemCaseSensitive(mo, "architecture");
    if (!cJSON_IsString(arch) || strlen(arch->valuestring) >= sizeof p->arch)
        return fasa_error(err, FASA_EFORMAT, "'%s': 'architecture' is missing", path);
    strcpy(p->arch, arch->valuestring);
    if ((rc = get_int(mo, "n_layer", 1, 1024, &p->n_layer, path, err)) < 0 ||
        (rc = get_int(mo, "n_head", 1, 1024, &p->n_head, path, err)) < 0 ||
        (rc = get_int(mo, "n_kv_head", 1, p->n_head, &p->n_kv_head, path, err)) < 0 ||
        (rc = get_int(mo, "d_head", 2, 1024, &p->d_head, path, err)) < 0 ||
        (rc = get_hex(mo, "qk_hash", &p->qk_hash, path, err)) < 0)
        return rc;
    if (p->n_head % p->n_kv_head || p->d_head % 2)
        return fasa_error(err, FASA_EFORMAT, "'%s': inconsistent head counts or head dim", path);
    if (cJSON_GetObjectItemCaseSensitive(mo, "sliding_window") &&
        ((rc = get_int(mo, "sliding_window", 1, 1 << 30, &p->sliding_window, path, err)) < 0 ||
         (rc = get_int(mo, "swa_period", 0, 1024, &p->swa_period, path, err)) < 0))
        return rc;
    p->n_chunk = p->d_head / 2;
    const cJSON *def = cJSON_GetObjectItemCaseSensitive(co, "definition");
    if (cJSON_IsString(def) && !strcmp(def->valuestring, "plane")) p->chunks = CHUNKS_PLANE;
    else if (cJSON_IsString(def) && !strcmp(def->valuestring, "adjacent")) p->chunks = CHUNKS_ADJACENT;
    else return fasa_error(err, FASA_EFORMAT, "'%s': chunk definition must be \"plane\" or \"adjacent\"", path);
    int count;
    if ((rc = get_int(co, "count", 1, 512, &count, path, err)) < 0) return rc;
    if (count != p->n_chunk)
        return fasa_error(err, FASA_EFORMAT, "'%s': %d chunks for head dim %d", path, count, p->d_head);
    if ((rc = get_hex(ko, "sample_hash", &p->sample_hash, path, err)) < 0 ||
        (rc = get_int(ko, "n_tokens", 1, 1 << 30, &p->n_tokens, path, err)) < 0 ||
        (rc = get_int(ko, "n_prefill", 1, 1 << 30, &p->n_prefill, path, err)) < 0 ||
        (rc = get_int(ko, "n_steps", 1, 1 << 30, &p->n_steps, path, err)) < 0 ||
        (rc = get_int(ko, "rank_k", 1, 1 << 30, &p->rank_k, path, err)) < 0 ||
        (rc = get_int(ko, "fcs", 1, p->n_chunk, &p->fcs, path, err)) < 0)
        return rc;
    const cJSON *ks = cJSON_GetObjectItemCaseSensitive(ko, "k"), *v;
    if (!cJSON_IsArray(ks) || cJSON_GetArraySize(ks) < 1 || cJSON_GetArraySize(ks) > PROFILE_MAX_K)
        return fasa_error(err, FASA_EFORMAT, "'%s': 'k' must list 1 to %d values", path, PROFILE_MAX_K);
    p->n_k = 0;
    cJSON_ArrayForEach(v, ks) {
        if (!cJSON_IsNumber(v) || v->valuedouble < 1 || v->valuedouble > (1 << 30) ||
            v->valuedouble != floor(v->valuedouble))
            return fasa_error(err, FASA_EFORMAT, "'%s': 'k' values must be positive integers", path);
        p->ks[p->n_k++] = (int)v->valuedouble;
    }
    if (profile_k_index(p, p->rank_k) < 0)
        return fasa_error(err, FASA_EFORMAT, "'%s': rank_k %d is not one of the k values", path, p->rank_k);
    /* The whole 'ca' object is checked before anything sized by the header's dims is allocated:
     * a few hundred bytes must not make the loader ask for gigabytes. */
    const cJSON *ca = cJSON_GetObjectItemCaseSensitive(o, "ca");
    if ((rc = load_ca(p, ca, 0, path, err)) < 0 || (rc = profile_alloc(p, err)) < 0 ||
        (rc = load_ca(p, ca, 1, path, err)) < 0)
        return rc;
    if ((rc = load_rank(cJSON_GetObjectItemCaseSensitive(o, "rank"), p->n_layer, p->n_head, p->n_chunk, p->rank, "rank",
                        path, err)) < 0 ||
        (rc = load_rank(cJSON_GetObjectItemCaseSensitive(o, "group_rank"), p->n_layer, p->n_kv_head, p->n_chunk,
                        p->group_rank, "group_rank", path, err)) < 0)
        return rc;
    return 0;
}

int profile_load(profile *p, const char *path, char *err)
{
    memset(p, 0, sizeof *p);
    FILE *f = fopen(path, "rb");
    if (!f) return fasa_error(err, FASA_EIO, "cannot open '%s': %s", path, strerror(errno));
    char *buf = NULL;
    long len = -1;
    if (fseek(f, 0, SEEK_END) == 0) len = ftell(f);
    if (len < 0 || len > (256L << 20) || fseek(f, 0, SEEK_SET) != 0 || !(buf = malloc(len + 1)) ||
        fread(buf, 1, len, f) != (size_t)len) {
        free(buf);
        fclose(f);
        return fasa_error(err, FASA_EIO, "cannot read '%s'", path);
    }
    fclose(f);
    int rc = profile_parse(p, buf, (size_t)len, path, err);
    free(buf);
    return rc;
}

int profile_parse(profile *p, const char *json, size_t len, const char *path, char *err)
{
    memset(p, 0, sizeof *p);
    const char *end = NULL;
    cJSON *o = cJSON_ParseWithLengthOpts(json, len, &end, 0);
    if (!o) {
        long at = end ? (long)(end - json) : -1;
        return fasa_error(err, FASA_EFORMAT, "'%s': not valid JSON (at byte %ld of %ld)", path, at, (long)len);
    }
    int rc = cJSON_IsObject(o) ? profile_from_json(p, o, path, err)
                               : fasa_error(err, FASA_EFORMAT, "'%s': not a JSON object", path);
    cJSON_Delete(o);
    if (rc < 0) profile_free(p);
    return rc;
}

int profile_check_model(const profile *p, const model *m, const char *path, char *err)
{
    const model_config *c = &m->cfg;
    if (p->n_layer != c->n_layer || p->n_head != c->n_head || p->n_kv_head != c->n_kv_head || p->d_head != c->d_head)
        return fasa_error(err, FASA_EMISMATCH,
                          "'%s' was calibrated for %d layers x %d/%d heads x dim %d, but '%s' has %d x %d/%d x %d",
                          path, p->n_layer, p->n_head, p->n_kv_head, p->d_head, m->path, c->n_layer, c->n_head,
                          c->n_kv_head, c->d_head);
    uint64_t h = profile_model_hash(m);
    if (h != p->qk_hash)
        return fasa_error(err, FASA_EMISMATCH,
                          "'%s' was calibrated on other weights (q/k hash %016llx, '%s' has %016llx)",
                          path, (unsigned long long)p->qk_hash, m->path, (unsigned long long)h);
    return 0;
}

/* session.c - profile, policy, key layout, cache and device for a model, from one options struct
 * (session.h). */
#include "session.h"

#include <cjson/cJSON.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/fasa_cuda.h"

static const char *const mode_names[] = { "auto", "full", "fasa-c", "fasa-m" };

const char *fasa_mode_name(enum fasa_mode m)
{
    return m >= FASA_MODE_AUTO && m <= FASA_MODE_FASA_M ? mode_names[m] : "?";
}

int fasa_mode_parse(const char *s)
{
    for (int i = 0; i <= FASA_MODE_FASA_M; i++)
        if (!strcmp(s, mode_names[i])) return i;
    return !strcmp(s, "fasa") ? FASA_MODE_FASA_C : -1;
}

session_opts session_defaults(void)
{
    return (session_opts){ .budget = 256, .n_dense_layers = 1, .dense_budget = SESSION_DENSE_BUDGET, .n_sink = -1,
                           .n_recent = -1, .tail = -1, .kv_f16 = -1, .n_batch = 64 };
}

int session_find_profile(const model *m, const char *model_path, const char *path, profile *out, char *where,
                         size_t where_cap, char *err)
{
    char found[4096];
    int rc;
    if (!path && profile_find(model_path, found, sizeof found)) path = found;
    if (path) {
        snprintf(where, where_cap, "%s", path);
        rc = profile_load(out, path, err);
    } else if (m->bundle_profile) {
        snprintf(where, where_cap, "%s (profile.json)", model_path);
        rc = profile_parse(out, m->bundle_profile, m->bundle_profile_len, where, err);
    } else {
        return 0;
    }
    if (rc < 0) return rc;
    if ((rc = profile_check_model(out, m, where, err)) < 0) {
        profile_free(out);
        return rc;
    }
    return 1;
}

/* ---------------------------------------------------------------- CUDA */

typedef struct cuda_state { fasa_cuda *cu; fasa_cuda_kv *kv; int group; } cuda_state;

static int cuda_attend(void *ctx, const run_state *s, int layer, int head, int pos, const float *q, const int32_t *idx,
                       int n, float *out, char *err)
{
    const cuda_state *c = ctx;
    const kvcache *kv = &s->kv;
    const int g = head / c->group;
    return fasa_cuda_attend(c->kv, layer, head, kvcache_k(kv, layer, g), kv->n_split ? kvcache_kr(kv, layer, g) : NULL,
                            kvcache_v(kv, layer, g), pos + 1, q, idx, n, out, err);
}

int session_cuda_check(char *err)
{
    fasa_cuda_device dev;
    if (fasa_cuda_devices(&dev, 1, err) < 0) return FASA_EUNSUPPORTED;
    if (!dev.has_kernels)
        return fasa_error(err, FASA_EUNSUPPORTED,
                          "'%s' has compute capability %d.%d; fasa's kernels are built for sm_80 and sm_90", dev.name,
                          dev.cc_major, dev.cc_minor);
    return 0;
}

char *session_devices(int json)
{
    char err[FASA_ERRLEN];
    fasa_cuda_device dev[16];
    const int n = fasa_cuda_devices(dev, 16, err);
    if (json) {
        cJSON *o = cJSON_CreateObject(), *arr = cJSON_AddArrayToObject(o, "devices");
        cJSON_AddBoolToObject(o, "built_with_cuda", fasa_cuda_built());
        if (n < 0) cJSON_AddStringToObject(o, "note", err);
        for (int i = 0; i < n && i < 16; i++) {
            cJSON *d = cJSON_CreateObject();
            cJSON_AddNumberToObject(d, "index", dev[i].index);
            cJSON_AddStringToObject(d, "name", dev[i].name);
            char cc[16];
            snprintf(cc, sizeof cc, "%d.%d", dev[i].cc_major, dev[i].cc_minor);
            cJSON_AddStringToObject(d, "compute_capability", cc);
            cJSON_AddNumberToObject(d, "sm_count", dev[i].n_sm);
            cJSON_AddNumberToObject(d, "mem_total", (double)dev[i].mem_total);
            cJSON_AddNumberToObject(d, "mem_free", (double)dev[i].mem_free);
            cJSON_AddBoolToObject(d, "maps_host_memory", dev[i].can_map_host);
            cJSON_AddBoolToObject(d, "runs_fasa_kernels", dev[i].has_kernels);
            cJSON_AddItemToArray(arr, d);
        }
        char *text = cJSON_Print(o);
        cJSON_Delete(o);
        return text;
    }
    if (n < 0) return strdup(err);
    size_t cap = 16 * 512, len = 0;
    char *text = malloc(cap);
    for (int i = 0; text && i < n && i < 16; i++)
        len += snprintf(text + len, cap - len,
                        "%scuda:%d  %s  compute %d.%d  %d SMs  %.1f GB (%.1f GB free)  mapped host memory: %s  "
                        "fasa kernels: %s",
                        i ? "\n" : "", dev[i].index, dev[i].name, dev[i].cc_major, dev[i].cc_minor, dev[i].n_sm,
                        dev[i].mem_total / 1e9, dev[i].mem_free / 1e9, dev[i].can_map_host ? "yes" : "no",
                        dev[i].has_kernels ? "yes" : "no (built for sm_80 and sm_90)");
    return text;
}

static int cuda_open(session *ss, char *err)
{
    const model_config *c = &ss->m->cfg;
    cuda_state *cs = calloc(1, sizeof *cs);
    if (!cs) return fasa_error(err, FASA_ENOMEM, "out of memory");
    ss->cuda = cs;
    cs->group = c->n_head / c->n_kv_head;
    char why[FASA_ERRLEN];
    if (fasa_cuda_open(&cs->cu, 0, why) < 0 ||
        fasa_cuda_kv_open(cs->cu, &cs->kv, c->n_layer, c->n_head, c->n_kv_head, ss->s->n_ctx, c->d_head,
                          ss->s->kv.n_split, why) < 0)
        return fasa_error(err, FASA_EUNSUPPORTED, "--device cuda: %s", why);
    return 0;
}

static void cuda_close(session *ss)
{
    cuda_state *cs = ss->cuda;
    if (!cs) return;
    if (cs->kv) fasa_cuda_kv_close(cs->kv);
    if (cs->cu) fasa_cuda_close(cs->cu);
    free(cs);
    ss->cuda = NULL;
}

/* ---------------------------------------------------------------- open */

static const char *const tip_names[] = { "q4", "group", "union" };

const char *fasa_tip_name(enum fasa_tip t) { return t >= FASA_TIP_Q4 && t <= FASA_TIP_UNION ? tip_names[t] : "?"; }

int fasa_tip_parse(const char *s)
{
    for (int i = 0; i <= FASA_TIP_UNION; i++)
        if (!strcmp(s, tip_names[i])) return i;
    return -1;
}

/* The tail estimate goes with the selection po makes (policy_tail_fits) on the CPU. */
static int session_tail_fits(const session_opts *o, const policy_opts *po)
{
    return policy_tail_fits(po) && o->device != FASA_DEVICE_CUDA;
}

void session_policy_opts(const model *m, const profile *prof, const session_opts *o, policy_opts *po)
{
    *po = policy_defaults(POLICY_FASA, m, o->budget);
    po->prof = prof;
    po->fcs = o->fcs ? o->fcs : prof->fcs;
    po->n_dense_layers = o->n_dense_layers;
    po->dense_mask = o->dense_mask;
    po->dense_budget = o->dense_budget;
    po->group = o->group;
    if (o->n_sink >= 0) po->n_sink = o->n_sink;
    if (o->n_recent >= 0) po->n_recent = o->n_recent;
    po->tip_bits = o->tip == FASA_TIP_Q4 && !o->group ? 4 : 0;
    /* every head scores its group's whole copy: chosen on the calibration text by KL to full
     * attention (docs/results.md, "Every head over its group's whole copy"); the same bytes and kernel */
    po->tip_union = po->tip_bits == 4;
    po->rerank = o->rerank;
    po->group_rerank = o->group_rerank;
    if (o->target_mass > 0) {
        po->auto_mass = o->target_mass;
        po->auto_min = o->auto_min > 0 ? o->auto_min : SESSION_AUTO_MIN;
        if (o->n_recent < 0) po->n_recent = SESSION_AUTO_RECENT;
    }
    const int tail = o->tail < 0 ? SESSION_TAIL : o->tail;
    po->tail = tail && session_tail_fits(o, po);
    po->tail_blocks = po->tail && tail == 2;
}

int session_fasa(model *m, const profile *prof, const session_opts *o, int fasa_m, policy *pol, kv_opts *kvo,
                 char *err)
{
    const model_config *c = &m->cfg;
    policy_opts po;
    session_policy_opts(m, prof, o, &po);
    if (c->n_layer < 64 && o->dense_mask >> c->n_layer)
        return fasa_error(err, FASA_EARG, "--dense: the model has %d layers", c->n_layer);
    if (o->tail >= 1 && !session_tail_fits(o, &po))
        return fasa_error(err, FASA_EARG, "--tail on, blocks or mean takes per-head selection and a fixed budget on "
                                          "the CPU: not --group, --group-rerank, --budget auto or --device cuda");
    if (!po.tip_bits) {
        /* the f16 block layouts: the group's top F chunks (or the union of its heads' own) first
         * in every key, stored as their own block */
        const int width = keys_block(m, prof, po.fcs, o->tip == FASA_TIP_UNION && !o->group, err);
        if (width < 0) return width;
        if (width) {
            po.block = o->group ? 0 : o->tip == FASA_TIP_UNION ? 2 : 1;
            kvo->n_split = 2 * width;
        } else if (fasa_m) {
            return fasa_error(err, FASA_EARG, "--mode fasa-m keeps a contiguous block of dominant key dims: it needs "
                              "a profile of RoPE-plane chunks and F below %d", c->d_head / 2);
        }
    }
    int rc = policy_init(pol, m, &po, err);   /* FASA_EARG: a flag outside what this model allows (--fcs) */
    if (rc < 0) return rc;
    policy_kv_opts(pol, kvo);
    if (fasa_m) {
        const char *tmp = getenv("TMPDIR");
        kvo->cold_dir = o->kv_cold ? o->kv_cold : tmp && *tmp ? tmp : "/tmp";
    }
    return 0;
}

/* The FASA policy of the options and the cache layout it needs; the note saying so. */
static int fasa_setup(session *ss, const char *model_path, kv_opts *kvo, char *err)
{
    const session_opts *o = &ss->o;
    const model_config *c = &ss->m->cfg;
    if (c->n_layer < 64 && o->dense_mask >> c->n_layer)
        return fasa_error(err, FASA_EARG, "--dense: '%s' has %d layers", model_path, c->n_layer);
    const int rc = session_fasa(ss->m, &ss->prof, o, ss->mode == FASA_MODE_FASA_M, &ss->pol, kvo, err);
    if (rc < 0) return rc;
    ss->has_policy = 1;
    const policy_opts *po = &ss->pol.o;
    char dense[256] = "", tip[160];
    for (int l = 0; l < 64; l++)
        if (o->dense_mask >> l & 1)
            snprintf(dense + strlen(dense), sizeof dense - strlen(dense), "%s%d", *dense ? "," : " + layers ", l);
    if (po->tip_bits) {
        const int tw = ss->pol.tip_width, lg = c->n_layer * c->n_kv_head;
        snprintf(tip, sizeof tip,
                 "TIP: %s 4-bit copy of its group's union of chunks (%d dims at most, %.1f bytes a key on "
                 "average)",
                 po->tip_union ? "every head over a" : "each head's own chunks, from a", tw,
                 (double)kvcache_tip_map_bytes(ss->pol.tip_map, (size_t)lg, tw) / lg);
    } else
        snprintf(tip, sizeof tip, "%s",
                 po->block == 2 ? "TIP: each head's own chunks, in an f16 block of its group's union"
                 : kvo->n_split ? "TIP: the group's top chunks, an f16 block"
                                : "TIP gathers each head's dims");
    const int recent = policy_recent(po, po->budget);
    char budget[96];
    if (po->auto_mass > 0)
        snprintf(budget, sizeof budget, "auto: %.0f%% of the estimated mass, %d to %d tokens", 100 * po->auto_mass,
                 po->auto_min, po->budget);
    else
        snprintf(budget, sizeof budget, "%d", po->budget);
    char wide[48] = "";   /* what the dense layers attend to, when not every token */
    if (po->dense_budget && (po->n_dense_layers || o->dense_mask))
        snprintf(wide, sizeof wide, " attending to %d tokens", policy_dense_budget(po));
    snprintf(ss->note, sizeof ss->note,
             "%s (profile '%s', budget %s with %d sink%s and %d recent, F %d of %d chunks, %d dense layer%s%s%s%s; %s)",
             fasa_mode_name(ss->mode), ss->profile_path, budget, po->n_sink, fasa_plural(po->n_sink), recent,
             po->fcs, c->d_head / 2, po->n_dense_layers, fasa_plural(po->n_dense_layers), dense, wide,
             o->group ? ", per-KV-head selection" : "", tip);
    if (po->rerank > 1 || po->group_rerank > 0)
        snprintf(ss->note + strlen(ss->note) - 1, sizeof ss->note - strlen(ss->note) + 1, "; %s %dx)",
                 po->group_rerank > 0 ? "the group's picks reranked" : "TIP's picks reranked",
                 po->group_rerank > 0 ? po->group_rerank : po->rerank);
    if (po->tail)
        snprintf(ss->note + strlen(ss->note) - 1, sizeof ss->note - strlen(ss->note) + 1,
                 "; the unchosen rows as one estimate%s)", po->tail_blocks ? ", valued by block" : "");
    return 0;
}

int session_open(session **out, model *m, const char *model_path, const session_opts *o, char *err)
{
    *out = NULL;
    if (o->n_ctx < 1) return fasa_error(err, FASA_EARG, "the context must hold at least one token");
    if (o->kv_cold && o->mode != FASA_MODE_FASA_M) return fasa_error(err, FASA_EARG, "--kv-cold is for --mode fasa-m");
    if (o->device == FASA_DEVICE_CUDA && o->kv_f16 == 1)
        return fasa_error(err, FASA_EARG, "--device cuda reads an f32 KV cache: drop --kv-type f16");
    session *ss = calloc(1, sizeof *ss);
    if (!ss) return fasa_error(err, FASA_ENOMEM, "out of memory");
    ss->m = m;
    ss->o = *o;
    ops_exact(o->exact);
    if (ss->o.n_batch < 1) ss->o.n_batch = 64;
    ss->mode = o->mode;
    kv_opts kvo = { .f16 = o->kv_f16 < 0 ? o->device != FASA_DEVICE_CUDA : o->kv_f16 };
    int rc = 0;
    /* the profile: wanted by every mode but full, and by --order-chunks */
    if (o->mode != FASA_MODE_FULL || o->order_chunks) {
        rc = session_find_profile(m, model_path, o->profile, &ss->prof, ss->profile_path, sizeof ss->profile_path, err);
        if (rc < 0) goto fail;
        ss->has_profile = rc;
        rc = 0;
    }
    if (!ss->has_profile && (o->mode == FASA_MODE_FASA_C || o->mode == FASA_MODE_FASA_M)) {
        rc = fasa_error(err, FASA_EARG, "--mode %s needs a profile: run 'fasa calibrate %s' or give -p",
                        fasa_mode_name(o->mode), model_path);
        goto fail;
    }
    if (o->order_chunks && !ss->has_profile) {
        rc = fasa_error(err, FASA_EARG, "--order-chunks needs a profile (-p)");
        goto fail;
    }
    if (ss->mode == FASA_MODE_AUTO) ss->mode = ss->has_profile ? FASA_MODE_FASA_C : FASA_MODE_FULL;
    if (ss->mode != FASA_MODE_FULL) {
        if ((rc = fasa_setup(ss, model_path, &kvo, err)) < 0) goto fail;
    } else if (o->order_chunks) {
        if ((rc = keys_order(m, &ss->prof, err)) < 0) goto fail;
        snprintf(ss->note, sizeof ss->note, "full attention, key dims in the order of '%s'", ss->profile_path);
    } else if (o->mode == FASA_MODE_AUTO) {
        snprintf(ss->note, sizeof ss->note, "full attention (no profile: 'fasa calibrate %s' enables fasa-c)",
                 model_path);
    } else {
        snprintf(ss->note, sizeof ss->note, "full attention");
    }
    if (!(ss->s = run_state_new_kv(m, o->n_ctx, ss->o.n_batch, &kvo, err))) {
        rc = FASA_ENOMEM;
        goto fail;
    }
    /* prefill is dense: session_prefill moves sparse_from to the end of what it ran */
    if (ss->has_policy && (rc = attention_use_policy(ss->s, &ss->pol, INT_MAX, err)) < 0) goto fail;
    if (o->device == FASA_DEVICE_CUDA) {
        if ((rc = cuda_open(ss, err)) < 0) goto fail;
        snprintf(ss->note + strlen(ss->note), sizeof ss->note - strlen(ss->note),
                 "; decode attention on CUDA device 0");
    }
    *out = ss;
    return 0;
fail:
    session_close(ss);
    return rc;
}

void session_close(session *ss)
{
    if (!ss) return;
    cuda_close(ss);
    run_state_free(ss->s);
    if (ss->has_policy) policy_free(&ss->pol);
    if (ss->has_profile) profile_free(&ss->prof);
    free(ss);
}

int session_prefill(session *ss, const int32_t *ids, int n, float *all_logits, char *err)
{
    run_state *s = ss->s;
    if (s->n_past + n > s->n_ctx)
        return fasa_error(err, FASA_EARG, "%d tokens do not fit the context (%d of %d used)", n, s->n_past, s->n_ctx);
    const int step = ss->o.progress ? s->n_batch : n;
    for (int i = 0; i < n; i += step) {
        const int k = n - i < step ? n - i : step;
        float *al = all_logits ? all_logits + (size_t)i * ss->m->cfg.n_vocab : NULL;
        const int rc = model_prefill(ss->m, s, ids + i, k, al, err);
        if (rc < 0) return rc;
        if (ss->o.progress) ss->o.progress(ss->o.progress_ctx, i + k, n);
    }
    s->sparse_from = s->n_past;
    /* the device takes the decode steps' attention; prefill stayed on the CPU */
    if (ss->cuda) s->attend_hook = cuda_attend, s->attend_ctx = ss->cuda;
    return 0;
}

int session_step(session *ss, int32_t id, char *err)
{
    return model_forward(ss->m, ss->s, &id, 1, 0, err);
}

/* ---------------------------------------------------------------- prompts */

int session_prompt_ids(const model *m, const char *text, int chat, const char *system, int32_t **ids, char *err)
{
    *ids = NULL;
    if (!m->tok) return fasa_error(err, FASA_EARG, "'%s' has no tokenizer; give the prompt as token ids", m->path);
    /* the model's own chat template (or, without one, its chat tokens) decides the format */
    tokenizer_chat fmt;
    const int has_chat = tokenizer_chat_of(m->tok, &fmt) == 0;
    if (chat < 0) chat = has_chat;
    if (chat && !has_chat)
        return fasa_error(err, FASA_EARG, "'%s' has no chat template fasa knows; use --raw", m->path);
    const int need = tokenizer_encode_prompt(m->tok, chat ? &fmt : NULL, system, text, NULL, 0);
    int32_t *buf = need > 0 ? malloc(sizeof *buf * need) : NULL;
    const int n = need <= 0 ? need : buf ? tokenizer_encode_prompt(m->tok, chat ? &fmt : NULL, system, text, buf, need)
                                         : FASA_ENOMEM;
    if (n <= 0) {
        free(buf);
        return n == 0 ? fasa_error(err, FASA_EARG, "the prompt is empty")
                      : fasa_error(err, n == FASA_ENOMEM ? FASA_ENOMEM : FASA_EFORMAT, "cannot tokenize the prompt");
    }
    *ids = buf;
    return n;
}

/* fuzz_profile.c - libFuzzer target for lib/profile.c's calibration profile loader.
 *
 * Any bytes go to profile_parse (what profile_load does after reading the file). A profile that
 * loads must be internally consistent (dims in range, rank_k one of the K values, every ranking
 * a permutation, CA values in [0, 1]); it is then checked against a fixed tiny model
 * (FUZZ_TINY_SPEC, the model make_seeds calibrates), and one that matches drives a FASA policy
 * through a short prefill and two sparse decode steps, as `fasa run` would use it.
 */
#include <math.h>

#include "attention.h"
#include "fixtures.h"
#include "fuzz_common.h"
#include "forward.h"
#include "model.h"
#include "profile.h"

static model *tiny;
static volatile float fsink;

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    char err[FASA_ERRLEN];
    tiny_model t;
    tiny_make(&t, &FUZZ_TINY_SPEC);
    FUZZ_CHECK(tiny_write_hf(&t, fuzz_dir()) == 0);
    tiny_free(&t);
    FUZZ_CHECK(model_open(&tiny, fuzz_dir(), err) == 0);
    return 0;
}

static void check_perm(const int16_t *r, int n)
{
    char seen[512] = { 0 };
    for (int c = 0; c < n; c++) {
        FUZZ_CHECK(r[c] >= 0 && r[c] < n && !seen[r[c]]);
        seen[r[c]] = 1;
    }
}

static void check_profile(const profile *p)
{
    FUZZ_CHECK(p->n_layer >= 1 && p->n_head >= 1 && p->n_kv_head >= 1 && p->n_head % p->n_kv_head == 0);
    FUZZ_CHECK(p->d_head >= 2 && p->d_head % 2 == 0 && p->n_chunk == p->d_head / 2 && p->n_chunk <= 512);
    FUZZ_CHECK(p->n_k >= 1 && p->n_k <= PROFILE_MAX_K && profile_k_index(p, p->rank_k) >= 0);
    FUZZ_CHECK(p->fcs >= 1 && p->fcs <= p->n_chunk);
    FUZZ_CHECK(p->ca && p->rank && p->group_rank);
    for (int ki = 0; ki < p->n_k; ki++)
        for (int l = 0; l < p->n_layer; l++)
            for (int h = 0; h < p->n_head; h++) {
                const double *v = profile_ca(p, ki, l, h);
                for (int c = 0; c < p->n_chunk; c++) FUZZ_CHECK(v[c] >= 0 && v[c] <= 1);
            }
    for (int l = 0; l < p->n_layer; l++) {
        for (int h = 0; h < p->n_head; h++) check_perm(profile_rank(p, l, h), p->n_chunk);
        for (int g = 0; g < p->n_kv_head; g++) check_perm(profile_group_rank(p, l, g), p->n_chunk);
    }
}

static void run_policy(const profile *p, int group)
{
    char err[FASA_ERRLEN];
    policy pol;
    policy_opts o = policy_defaults(POLICY_FASA, tiny, 2);
    o.prof = p;
    o.fcs = p->fcs;
    o.group = group;
    o.n_dense_layers = 0;
    if (policy_init(&pol, tiny, &o, err) < 0) return;
    run_state *s = run_state_new(tiny, 8, 4, err);
    FUZZ_CHECK(s);
    int32_t ids[6] = { 1, 5, 9, 13, 17, 21 };
    s->policy = &pol;
    s->sparse_from = 4;
    FUZZ_CHECK(model_forward(tiny, s, ids, 4, 0, err) == 0);
    FUZZ_CHECK(model_forward(tiny, s, ids + 4, 1, 0, err) == 0);
    FUZZ_CHECK(model_forward(tiny, s, ids + 5, 1, 0, err) == 0);
    fsink += s->logits[0];
    run_state_free(s);
    policy_free(&pol);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char err[FASA_ERRLEN];
    profile p;
    char *json = malloc(size ? size : 1);   /* exactly size bytes: ASan sees overreads */
    FUZZ_CHECK(json);
    memcpy(json, data, size);
    int rc = profile_parse(&p, json, size, "fuzz.profile.json", err);
    free(json);
    if (rc < 0) {
        FUZZ_CHECK(p.ca == NULL && p.rank == NULL && p.group_rank == NULL);
        return 0;
    }
    check_profile(&p);
    if (profile_check_model(&p, tiny, "fuzz.profile.json", err) == 0) {
        run_policy(&p, 0);
        run_policy(&p, 1);
    }
    profile_rank_all(&p);   /* re-ranking from the loaded CA gives permutations too */
    check_profile(&p);
    profile_free(&p);
    return 0;
}

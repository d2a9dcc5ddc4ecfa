/* fuzz_config.c - libFuzzer target for the model loader's Hugging Face config.json parsing.
 *
 * Input: config.json bytes, optionally followed by a NUL and a fasa.chunk_order value (the JSON
 * a converted model keeps in its safetensors metadata). The config goes to model_config_parse
 * and model_config_check; one that passes gets its RoPE frequencies computed and, with a chunk
 * order, model_parse_chunk_order. Then, as model_open would see it, the config is written beside
 * a fixed tiny model (FUZZ_TINY_SPEC; with a chunk order, a copy whose metadata holds a valid
 * one) and the directory is opened: the config's dimensions meet real tensors, and a model
 * that loads runs two tokens.
 */
#include "fixtures.h"
#include "fuzz_common.h"
#include "forward.h"
#include "model.h"
#include "safetensors.h"

static char cfg_path[160], plain_path[160], perm_path[160];
static volatile float fsink;

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    char err[ST_ERRLEN];
    const char *dir = fuzz_dir();
    tiny_model t;
    st_file f;
    tiny_make(&t, &FUZZ_TINY_SPEC);
    FUZZ_CHECK(tiny_write_hf(&t, dir) == 0);
    tiny_free(&t);
    snprintf(cfg_path, sizeof cfg_path, "%s/config.json", dir);
    snprintf(plain_path, sizeof plain_path, "%s/model.safetensors", dir);
    snprintf(perm_path, sizeof perm_path, "%s/perm.safetensors", dir);
    /* perm.safetensors: the same tensors, read as a converted model (chunks in reverse order). */
    FUZZ_CHECK(st_open(&f, plain_path, err) == 0);
    st_writer *w = st_writer_new();
    FUZZ_CHECK(w);
    for (int i = 0; i < f.n_tensors; i++) {
        const st_tensor *x = &f.tensors[i];
        FUZZ_CHECK(st_writer_add(w, x->name, x->dtype, x->n_dims, x->shape, x->data) == 0);
    }
    FUZZ_CHECK(st_writer_meta(w, "fasa.chunk_order", "[[[7,6,5,4,3,2,1,0]]]") == 0);
    FUZZ_CHECK(st_writer_write(w, perm_path, err) == 0);
    st_writer_free(w);
    st_close(&f);
    unlink(cfg_path);   /* each input writes its own */
    return 0;
}

static void try_open(const char *json, size_t len, int permuted)
{
    char err[FASA_ERRLEN];
    model *m = NULL;
    if (fuzz_write(cfg_path, json, len) < 0) return;
    if (model_open(&m, permuted ? perm_path : plain_path, err) < 0) {
        FUZZ_CHECK(m == NULL);
        return;
    }
    run_state *s = run_state_new(m, 4, 2, err);
    if (s) {
        int32_t ids[2] = { 1, m->cfg.n_vocab - 1 };
        if (model_forward(m, s, ids, 2, 0, err) == 0) fsink += s->logits[0];
        run_state_free(s);
    }
    model_close(m);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char err[FASA_ERRLEN];
    model_config c;
    const uint8_t *nul = memchr(data, 0, size);
    size_t jlen = nul ? (size_t)(nul - data) : size;
    /* exactly jlen bytes, so ASan sees a read past the end of the text */
    char *json = malloc(jlen ? jlen : 1);
    FUZZ_CHECK(json);
    memcpy(json, data, jlen);
    if (model_config_parse(&c, json, jlen, "config.json", err) < 0 ||
        model_config_check(&c, "config.json", err) < 0) {
        free(json);
        return 0;
    }
    float theta[512];
    model_rope_freqs(&c, theta);
    for (int j = 0; j < c.d_head / 2; j++) fsink += theta[j];

    char *order_json = NULL;
    if (nul) {
        size_t olen = size - jlen - 1;
        order_json = malloc(olen + 1);
        FUZZ_CHECK(order_json);
        memcpy(order_json, nul + 1, olen);
        order_json[olen] = 0;
        /* what open_hf allocates for it; skip sizes that only measure malloc */
        size_t n = (size_t)c.n_layer * (size_t)c.n_kv_head * (size_t)(c.d_head / 2);
        if (n <= (1u << 20)) {
            int16_t *order = malloc((n ? n : 1) * sizeof *order);
            FUZZ_CHECK(order);
            if (model_parse_chunk_order(order_json, &c, order, "fuzz", err) == 0)
                for (size_t i = 0; i < n; i++) FUZZ_CHECK(order[i] >= 0 && order[i] < c.d_head / 2);
            free(order);
        }
    }
    try_open(json, jlen, nul != NULL);
    free(order_json);
    free(json);
    return 0;
}

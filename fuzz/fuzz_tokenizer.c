/* fuzz_tokenizer.c - libFuzzer target for lib/core/tokenizer.c's loaders and chat templates.
 *
 * Input: tokenizer.json bytes, or a GGUF (starting "GGUF": its tokenizer.ggml.* keys), optionally
 * followed by a NUL and a text to encode (else a fixed short string with digits, an added-token
 * name, non-ASCII, a "▁" and an invalid byte). A tokenizer that loads encodes the text with and
 * without special-token parsing; every id must be in the vocabulary and decode, alone and as a
 * text; bos/eos must be ids or -1; and the first ids decode whether or not they have a token.
 * The text is also read as a chat template: a recognised one renders, and a prompt encodes.
 */
#include "fuzz_common.h"
#include "gguf.h"
#include "tokenizer.h"

#define MAX_IDS 4096

static volatile uint8_t sink;

static void check_ids(const tokenizer *t, const int32_t *ids, int n, int max)
{
    char piece[128];
    for (int i = 0; i < n && i < max; i++) {
        FUZZ_CHECK(ids[i] >= 0 && ids[i] < tokenizer_n_vocab(t));
        int k = tokenizer_decode(t, ids[i], piece, sizeof piece);
        FUZZ_CHECK(k >= 0);
        if (k > 0) sink ^= (uint8_t)piece[(size_t)k < sizeof piece ? (size_t)k - 1 : sizeof piece - 1];
        sink ^= (uint8_t)tokenizer_is_special(t, ids[i]);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static const char fixed[] = "Hello, world! 12345 <|im_end|><s>  caf\xc3\xa9 \xe4\xbd\xa0\xe5\xa5\xbd \xff\n\tend's"
                                "\xe2\x96\x81x [INST]";
    static int32_t ids[MAX_IDS];
    char err[FASA_ERRLEN];
    tokenizer *t = NULL;
    const uint8_t *nul = memchr(data, 0, size);
    size_t jlen = nul ? (size_t)(nul - data) : size;
    char *json = malloc(jlen ? jlen : 1);   /* exactly jlen bytes: ASan sees overreads */
    int rc;
    FUZZ_CHECK(json);
    memcpy(json, data, jlen);
    if (jlen >= 4 && !memcmp(json, "GGUF", 4)) {
        /* A GGUF holds NULs: the whole input is the file, the text is the fixed one. */
        gguf_file g;
        nul = NULL;
        jlen = size;
        free(json);
        FUZZ_CHECK((json = malloc(size)));
        memcpy(json, data, size);
        if (gguf_parse(&g, json, size, err) < 0) { free(json); return 0; }
        rc = tokenizer_load_gguf(&t, &g, err);
        gguf_close(&g);
        if (rc == 0 && !t) rc = -1;
    } else {
        rc = tokenizer_parse_json(&t, json, jlen, "tokenizer.json", err);
    }
    free(json);
    if (rc < 0) {
        FUZZ_CHECK(t == NULL);
        return 0;
    }
    FUZZ_CHECK(t != NULL);
    int nv = tokenizer_n_vocab(t);
    FUZZ_CHECK(nv > 0);
    FUZZ_CHECK(tokenizer_bos(t) >= -1 && tokenizer_bos(t) < nv);
    FUZZ_CHECK(tokenizer_eos(t) >= -1 && tokenizer_eos(t) < nv);

    const char *text = nul ? (const char *)nul + 1 : fixed;
    size_t tlen = nul ? size - jlen - 1 : sizeof fixed - 1;
    for (int special = 0; special < 2; special++) {
        int n = tokenizer_encode(t, text, tlen, special, ids, MAX_IDS);
        FUZZ_CHECK(n >= 0 || n == FASA_ENOMEM);
        FUZZ_CHECK(n <= 3 * (int)tlen);
        check_ids(t, ids, n, MAX_IDS);
    }
    /* counting only (no output) must give the same count as writing */
    int n1 = tokenizer_encode(t, text, tlen, 1, NULL, 0);
    int n2 = tokenizer_encode(t, text, tlen, 1, ids, MAX_IDS);
    FUZZ_CHECK(n1 == n2);
    if (n2 >= 0 && n2 <= MAX_IDS) {
        static char out[8 * MAX_IDS];
        int l1 = tokenizer_decode_text(t, ids, n2, NULL, 0), l2 = tokenizer_decode_text(t, ids, n2, out, sizeof out);
        FUZZ_CHECK(l1 == l2 && l1 >= 0);
    }

    /* the text as a chat template (a NUL-terminated copy) */
    char *tmpl = malloc(tlen + 1);
    tokenizer_chat chat;
    FUZZ_CHECK(tmpl);
    memcpy(tmpl, text, tlen);
    tmpl[tlen] = 0;
    if (tokenizer_chat_detect(tmpl, &chat) == 0) {
        FUZZ_CHECK(strlen(chat.system) < sizeof chat.system && strlen(chat.bos_text) < sizeof chat.bos_text);
        int need = tokenizer_chat_render(&chat, NULL, "hi", NULL, 0);
        FUZZ_CHECK(need > 0);
        FUZZ_CHECK(tokenizer_encode_prompt(t, &chat, NULL, "hi", ids, MAX_IDS) >= 0);
    }
    FUZZ_CHECK(tokenizer_set_chat_template(t, tmpl, "fuzz") == 0);
    if (tokenizer_chat_of(t, &chat) == 0) FUZZ_CHECK(tokenizer_encode_prompt(t, &chat, "sys", "hi", NULL, 0) >= 0);
    FUZZ_CHECK(tokenizer_encode_prompt(t, NULL, NULL, tmpl, NULL, 0) >= 0);
    free(tmpl);

    char piece[64];
    for (int id = -1; id < nv && id < 512; id++) {
        int k = tokenizer_decode(t, id, piece, sizeof piece);
        if (id < 0) FUZZ_CHECK(k < 0);
        sink ^= (uint8_t)k;
    }
    static const char *const names[] = { "<|im_end|>", "<s>", "</s>", "\xc4\xa0", "a", "" };
    for (size_t i = 0; i < sizeof names / sizeof *names; i++) {
        int id = tokenizer_find(t, names[i]);
        FUZZ_CHECK(id >= -1 && id < nv);
    }
    tokenizer_free(t);
    return 0;
}

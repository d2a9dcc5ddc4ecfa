/* fuzz_tokenizer.c - libFuzzer target for lib/tokenizer.c's tokenizer.json loader.
 *
 * Input: tokenizer.json bytes, optionally followed by a NUL and a text to encode (else a fixed
 * short string with digits, an added-token name, non-ASCII and an invalid byte). A tokenizer
 * that loads encodes the text with and without special-token parsing; every id must be in the
 * vocabulary and decode; bos/eos must be ids or -1; and the first ids decode whether or not
 * they have a token.
 */
#include "fuzz_common.h"
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
    static const char fixed[] = "Hello, world! 12345 <|im_end|><s>  caf\xc3\xa9 \xe4\xbd\xa0\xe5\xa5\xbd \xff\n\tend's";
    static int32_t ids[MAX_IDS];
    char err[FASA_ERRLEN];
    tokenizer *t = NULL;
    const uint8_t *nul = memchr(data, 0, size);
    size_t jlen = nul ? (size_t)(nul - data) : size;
    char *json = malloc(jlen ? jlen : 1);   /* exactly jlen bytes: ASan sees overreads */
    FUZZ_CHECK(json);
    memcpy(json, data, jlen);
    int rc = tokenizer_parse_json(&t, json, jlen, "tokenizer.json", err);
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

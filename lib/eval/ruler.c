/* ruler.c - RULER-style long-context tasks (ruler.h). */
#include "ruler.h"

#include <ctype.h>
#include <dirent.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "base.h"

#define LICENSES "/usr/share/common-licenses"
#define NOISE "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."

/* ---------------------------------------------------------------- tasks */

enum kind { K_NIAH, K_VT, K_CWE, K_FWE, K_QA1, K_QA2 };
enum hay { H_REPEAT, H_ESSAY, H_NEEDLE };
enum val { V_NUMBER, V_WORD, V_UUID };

static const struct task {
    const char *name;
    enum kind kind;
    enum hay hay;
    enum val key, value;
    int n_keys, n_values, n_queries;   /* needles with different keys; values per key; keys asked */
    int max_new, quick;
} tasks[] = {
    { "niah_single_1", K_NIAH, H_REPEAT, V_WORD, V_NUMBER, 1, 1, 1, 128, 0 },
    { "niah_single_2", K_NIAH, H_ESSAY, V_WORD, V_NUMBER, 1, 1, 1, 128, 1 },
    { "niah_single_3", K_NIAH, H_ESSAY, V_WORD, V_UUID, 1, 1, 1, 128, 0 },
    { "niah_multikey_1", K_NIAH, H_ESSAY, V_WORD, V_NUMBER, 4, 1, 1, 128, 1 },
    { "niah_multikey_2", K_NIAH, H_NEEDLE, V_WORD, V_NUMBER, 1, 1, 1, 128, 0 },
    { "niah_multikey_3", K_NIAH, H_NEEDLE, V_UUID, V_UUID, 1, 1, 1, 128, 0 },
    { "niah_multivalue", K_NIAH, H_ESSAY, V_WORD, V_NUMBER, 1, 4, 1, 128, 0 },
    { "niah_multiquery", K_NIAH, H_ESSAY, V_WORD, V_NUMBER, 4, 1, 4, 128, 0 },
    { "vt", K_VT, H_REPEAT, 0, 0, 0, 0, 0, 30, 1 },
    { "cwe", K_CWE, 0, 0, 0, 0, 0, 0, 120, 0 },
    { "fwe", K_FWE, 0, 0, 0, 0, 0, 0, 50, 0 },
    { "qa_1", K_QA1, 0, 0, 0, 0, 0, 0, 32, 1 },
    { "qa_2", K_QA2, 0, 0, 0, 0, 0, 0, 32, 0 },
};
#define N_TASKS (int)(sizeof tasks / sizeof *tasks)

int ruler_task_count(void) { return N_TASKS; }
const char *ruler_task_name(int t) { return t >= 0 && t < N_TASKS ? tasks[t].name : "?"; }
int ruler_task_quick(int t) { return t >= 0 && t < N_TASKS && tasks[t].quick; }

int ruler_task_find(const char *name)
{
    for (int t = 0; t < N_TASKS; t++)
        if (!strcmp(name, tasks[t].name)) return t;
    return -1;
}

/* ---------------------------------------------------------------- text helpers */

typedef struct sbuf { char *p; size_t len, cap; int oom; } sbuf;

static void sb_add(sbuf *b, const char *s, size_t n)
{
    if (b->oom) return;
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 4096;
        while (b->len + n + 1 > cap) cap *= 2;
        char *p = realloc(b->p, cap);
        if (!p) { b->oom = 1; return; }
        b->p = p, b->cap = cap;
    }
    memcpy(b->p + b->len, s, n);
    b->p[b->len += n] = 0;
}

static void sb_puts(sbuf *b, const char *s) { sb_add(b, s, strlen(s)); }

static void sb_printf(sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void sb_printf(sbuf *b, const char *fmt, ...)
{
    char tmp[1024];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (n > 0) sb_add(b, tmp, (size_t)n < sizeof tmp ? (size_t)n : sizeof tmp - 1);
}

static uint64_t rng(uint64_t *s)
{
    uint64_t x = *s += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}
static int rng_below(uint64_t *s, int n) { return n > 0 ? (int)(rng(s) % (uint64_t)n) : 0; }

static void shuffle(int *v, int n, uint64_t *s)
{
    for (int i = n - 1; i > 0; i--) {
        const int j = rng_below(s, i + 1), t = v[i];
        v[i] = v[j], v[j] = t;
    }
}

/* ---------------------------------------------------------------- the corpus */

/* The license texts, once: their sentences (the essay haystack), paragraphs (QA documents) and
 * vocabulary (keys, cwe words). Files are read in name order, each real file once. */
static struct corpus {
    int ready;
    char *text;
    char **sent; int n_sent;
    char **para; int n_para;
    char **word; int n_word;
} C;

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

static char *dup_range(const char *a, const char *b)
{
    char *s = malloc((size_t)(b - a) + 1);
    if (s) memcpy(s, a, (size_t)(b - a)), s[b - a] = 0;
    return s;
}

/* Collapses runs of whitespace to one space and trims. */
static void squeeze(char *s)
{
    char *w = s;
    int sp = 1;
    for (char *r = s; *r; r++) {
        if (isspace((unsigned char)*r)) {
            if (!sp) *w++ = ' ', sp = 1;
        } else {
            *w++ = *r, sp = 0;
        }
    }
    while (w > s && w[-1] == ' ') w--;
    *w = 0;
}

static int n_words(const char *s)
{
    int n = 0, in = 0;
    for (; *s; s++) {
        const int w = !isspace((unsigned char)*s);
        n += w && !in, in = w;
    }
    return n;
}

static int n_words_range(const char *a, const char *b)
{
    int n = 0, in = 0;
    for (; a < b; a++) {
        const int w = !isspace((unsigned char)*a);
        n += w && !in, in = w;
    }
    return n;
}

static int push(char ***v, int *n, char *s)
{
    if (!s) return -1;
    char **p = realloc(*v, sizeof **v * (*n + 1));
    if (!p) { free(s); return -1; }
    *v = p;
    (*v)[(*n)++] = s;
    return 0;
}

static int corpus_load(char *err)
{
    if (C.ready) return 0;
    DIR *d = opendir(LICENSES);
    if (!d)
        return fasa_error(err, FASA_EIO, "ruler: cannot open '%s' (the license texts the tasks are made of)", LICENSES);
    char **names = NULL, **seen = NULL;
    int n = 0, n_seen = 0, rc = 0;
    for (struct dirent *e; (e = readdir(d));)
        if (e->d_name[0] != '.' && push(&names, &n, strdup(e->d_name)) < 0) rc = -1;
    closedir(d);
    qsort(names, n, sizeof *names, cmp_str);
    sbuf all = { 0 };
    for (int i = 0; i < n && rc == 0; i++) {
        char path[4096], real[PATH_MAX];
        snprintf(path, sizeof path, "%s/%s", LICENSES, names[i]);
        if (!realpath(path, real)) continue;
        int dup = 0;
        for (int j = 0; j < n_seen && !dup; j++) dup = !strcmp(seen[j], real);
        if (dup) continue;
        if (push(&seen, &n_seen, strdup(real)) < 0) { rc = -1; break; }
        char *t;
        size_t len;
        if (fasa_read_file(real, 1 << 24, &t, &len, NULL) < 0) continue;
        /* paragraphs: blocks between blank lines, squeezed */
        for (char *p = t; *p;) {
            char *q = strstr(p, "\n\n");
            char *end = q ? q : p + strlen(p);
            char *para = dup_range(p, end);
            if (para) {
                squeeze(para);
                if (n_words(para) >= 40) {
                    if (push(&C.para, &C.n_para, strdup(para)) < 0) rc = -1;
                    sb_puts(&all, para), sb_puts(&all, " ");
                }
                free(para);
            }
            p = q ? q + 2 : end;
        }
        free(t);
    }
    for (int i = 0; i < n; i++) free(names[i]);
    for (int i = 0; i < n_seen; i++) free(seen[i]);
    free(names), free(seen);
    if (rc < 0 || all.oom || !C.n_para) {
        free(all.p);
        return fasa_error(err, rc < 0 || all.oom ? FASA_ENOMEM : FASA_EIO, "ruler: no usable text in '%s'", LICENSES);
    }
    C.text = all.p;
    /* sentences: ". " boundaries of the paragraphs' text, each ending with its period */
    for (char *p = C.text; *p && rc == 0;) {
        char *q = strstr(p, ". ");
        char *end = q ? q + 1 : p + strlen(p);
        char *s = dup_range(p, end);
        if (s && n_words(s) >= 6) rc = push(&C.sent, &C.n_sent, s);
        else free(s);
        p = q ? q + 2 : end;
    }
    /* vocabulary: lower-case alphabetic words of 4..10 letters, sorted, unique */
    char **w = NULL;
    int nw = 0;
    for (const char *p = C.text; *p && rc == 0;) {
        while (*p && !isalpha((unsigned char)*p)) p++;
        const char *a = p;
        while (isalpha((unsigned char)*p)) p++;
        const int len = (int)(p - a);
        if (len < 4 || len > 10) continue;
        char buf[16];
        for (int i = 0; i < len; i++) buf[i] = (char)tolower((unsigned char)a[i]);
        buf[len] = 0;
        rc = push(&w, &nw, strdup(buf));
    }
    qsort(w, nw, sizeof *w, cmp_str);
    for (int i = 0; i < nw && rc == 0; i++)
        if (i == 0 || strcmp(w[i], w[i - 1])) rc = push(&C.word, &C.n_word, strdup(w[i]));
    for (int i = 0; i < nw; i++) free(w[i]);
    free(w);
    if (rc < 0) return fasa_error(err, FASA_ENOMEM, "out of memory");
    C.ready = 1;
    return 0;
}

/* ---------------------------------------------------------------- values */

static void make_value(enum val v, uint64_t *s, char *out, size_t cap)
{
    if (v == V_NUMBER) {
        snprintf(out, cap, "%d", 1000000 + rng_below(s, 9000000));
    } else if (v == V_UUID) {
        static const char hex[] = "0123456789abcdef";
        static const int groups[] = { 8, 4, 4, 4, 12 };
        size_t k = 0;
        for (int g = 0; g < 5; g++) {
            for (int i = 0; i < groups[g] && k + 2 < cap; i++) out[k++] = hex[rng_below(s, 16)];
            if (g < 4 && k + 2 < cap) out[k++] = '-';
        }
        out[k] = 0;
    } else {   /* two vocabulary words, as RULER's wonderwords adjective-noun keys */
        snprintf(out, cap, "%s-%s", C.word[rng_below(s, C.n_word)], C.word[rng_below(s, C.n_word)]);
    }
}

static const char *val_name(enum val v) { return v == V_UUID ? "uuids" : v == V_WORD ? "words" : "numbers"; }

/* ---------------------------------------------------------------- building a sample */

typedef struct gen {
    const struct task *t;
    uint64_t seed;
    ruler_sample *s;
    /* filled by the task's setup, read by build */
    char keys[8][64], vals[8][4][64];
    int n_needles;            /* niah: (key, value) needles; vt: chain links */
    char vt_names[8][8], vt_value[16];
    int cw[10], n_cw;         /* cwe: common word indices */
    int *fwe_words; int n_fwe; int fwe_vocab;
    char **codes;
    int gold;   /* qa */
    char passage[2048], hint[2048], answer[64];
} gen;

/* Where, among n units, needle k of m goes: sorted random positions from the seed. */
static void positions(int n, int m, uint64_t seed, int *pos)
{
    uint64_t s = seed * 31 + 7;
    for (int k = 0; k < m; k++) pos[k] = rng_below(&s, n + 1);
    for (int i = 1; i < m; i++)
        for (int j = i; j > 0 && pos[j] < pos[j - 1]; j--) {
            const int t = pos[j];
            pos[j] = pos[j - 1], pos[j - 1] = t;
        }
}

/* The prompt with n haystack units, into s->prompt / s->answer_prefix. */
static int build(gen *g, int n)
{
    const struct task *t = g->t;
    sbuf b = { 0 }, a = { 0 };
    uint64_t s = g->seed * 1000003 + 11;
    switch (t->kind) {
    case K_NIAH: {
        const char *tv = val_name(t->value);
        sb_printf(&b, "Some special magic %s are hidden within the following text. Make sure to memorize it. "
                      "I will quiz you about the %s afterwards.\n", tv, tv);
        const int m = g->n_needles;
        int pos[32];
        positions(n, m, g->seed, pos);
        for (int u = 0, k = 0; u <= n; u++) {
            for (; k < m && pos[k] == u; k++)
                sb_printf(&b, "One of the special magic %s for %s is: %s. ", tv, g->keys[k / t->n_values],
                          g->vals[k / t->n_values][k % t->n_values]);
            if (u == n) break;
            if (t->hay == H_REPEAT) {
                sb_puts(&b, NOISE), sb_puts(&b, " ");
            } else if (t->hay == H_ESSAY) {
                sb_puts(&b, C.sent[u % C.n_sent]), sb_puts(&b, " ");
            } else {   /* a haystack of distractor needles, their keys never the asked ones */
                uint64_t ds = g->seed * 7919 + (uint64_t)u;
                char k2[64], v2[64];
                make_value(t->key, &ds, k2, sizeof k2);
                make_value(t->value, &ds, v2, sizeof v2);
                sb_printf(&b, "One of the special magic %s for %s is: %s. ", tv, k2, v2);
            }
        }
        char query[512] = "";
        for (int q = 0; q < t->n_queries; q++)
            snprintf(query + strlen(query), sizeof query - strlen(query), "%s%s",
                     q == 0 ? "" : q == t->n_queries - 1 ? " and " : ", ", g->keys[q]);
        sb_printf(&b, "\nWhat are all the special magic %s for %s mentioned in the provided text?", tv, query);
        sb_printf(&a, " The special magic %s for %s mentioned in the provided text are", tv, query);
        break;
    }
    case K_VT: {
        sb_puts(&b, "Memorize and track the chain(s) of variable assignment hidden in the following text.\n\n");
        int pos[8];
        positions(n, g->n_needles, g->seed, pos);
        for (int u = 0, k = 0; u <= n; u++) {
            for (; k < g->n_needles && pos[k] == u; k++) {
                if (k == 0) sb_printf(&b, "VAR %s = %s. ", g->vt_names[0], g->vt_value);
                else sb_printf(&b, "VAR %s = VAR %s. ", g->vt_names[k], g->vt_names[k - 1]);
            }
            if (u < n) sb_puts(&b, NOISE), sb_puts(&b, " ");
        }
        sb_printf(&b, "\nQuestion: Find all variables that are assigned the value %s in the text above.", g->vt_value);
        sb_printf(&a, " Answer: According to the chain(s) of variable assignment in the text above, %d variables are "
                      "assgined the value %s, they are: ", g->n_needles, g->vt_value);
        break;
    }
    case K_CWE: {
        /* the 10 common words 30 times each, n uncommon words 3 times each, shuffled */
        const int total = 10 * 30 + 3 * n;
        int *list = malloc(sizeof *list * (total ? total : 1));
        if (!list) return FASA_ENOMEM;
        int k = 0;
        for (int i = 0; i < 10; i++)
            for (int r = 0; r < 30; r++) list[k++] = g->cw[i];
        for (int i = 0; i < n; i++) {
            const int w = (int)((g->seed * 2654435761u + 97u * (uint64_t)i + 13) % (uint64_t)C.n_word);
            int common = 0;
            for (int c = 0; c < 10; c++) common |= g->cw[c] == w;
            for (int r = 0; r < 3; r++) list[k++] = common ? (w + 1) % C.n_word : w;
        }
        shuffle(list, k, &s);
        sb_puts(&b, "Below is a numbered list of words. In these words, some appear more often than others. "
                    "Memorize the ones that appear most often.\n");
        for (int i = 0; i < k; i++) sb_printf(&b, "%d. %s\n", i + 1, C.word[list[i]]);
        free(list);
        sb_puts(&b, "Question: What are the 10 most common words in the above list?");
        sb_puts(&a, " Answer: The top 10 words that appear most often in the list are:");
        break;
    }
    case K_FWE: {
        /* n coded words, word r (1-based) about n / (zeta(2) r^2) times: Zipf with alpha 2 */
        int *list = malloc(sizeof *list * (n ? n : 1));
        if (!list) return FASA_ENOMEM;
        int k = 0;
        for (int r = 1; r <= g->fwe_vocab && k < n; r++) {
            int c = (int)(n / (1.6449 * r * r));
            if (r > 3 && c >= (int)(n / (1.6449 * 9))) c = (int)(n / (1.6449 * 9)) - 1;   /* the top 3 stay apart */
            for (int i = 0; i < c && k < n; i++) list[k++] = r - 1;
        }
        for (; k < n; k++) list[k] = g->fwe_vocab - 1 - k % (g->fwe_vocab / 2);
        shuffle(list, k, &s);
        sb_puts(&b, "Read the following coded text and track the frequency of each coded word. Find the three most "
                    "frequently appeared coded words. ");
        for (int i = 0; i < k; i++) sb_puts(&b, g->codes[list[i]]), sb_puts(&b, i % 10 == 9 ? " .... " : " ");
        free(list);
        sb_puts(&b, "\nQuestion: Do not provide any explanation. Please ignore the dots '....'. What are the three "
                    "most frequently appeared words in the above coded text?");
        sb_puts(&a, " Answer: According to the coded text above, the three most frequently appeared words are:");
        break;
    }
    case K_QA1: case K_QA2: {
        const char *ask = "Answer the question based on the given documents. Only give me the answer and do not output "
                          "any other words.";
        sb_printf(&b, "%s\n\nThe following are given documents.\n\n", ask);
        /* n distractor documents (never a copy of the gold one), the gold one among them */
        int gpos[1];
        positions(n, 1, g->seed, gpos);
        for (int u = 0, doc = 1; u <= n; u++) {
            if (u == gpos[0]) sb_printf(&b, "Document %d:\n%s\n\n", doc++, C.para[g->gold]);
            if (u == n) break;
            int p = (int)((g->seed * 40503u + 7919u * (uint64_t)u) % (uint64_t)C.n_para);
            while (p == g->gold || !strcmp(C.para[p], C.para[g->gold])) p = (p + 1) % C.n_para;
            sb_printf(&b, "Document %d:\n%s\n\n", doc++, C.para[p]);
        }
        if (t->kind == K_QA1)
            sb_printf(&b, "%s\n\nQuestion: In the documents above, which word comes right after \"%s\"?", ask,
                      g->passage);
        else
            sb_printf(&b, "%s\n\nQuestion: What is the last word of the document that contains the sentence \"%s\"",
                      ask, g->hint);
        sb_puts(&a, " Answer:");
        break;
    }
    }
    if (b.oom || a.oom) { free(b.p), free(a.p); return FASA_ENOMEM; }
    free(g->s->prompt), free(g->s->answer_prefix);
    g->s->prompt = b.p, g->s->answer_prefix = a.p;
    return 0;
}

/* A word of the sentence to ask for: alphabetic, 5+ letters, not the first. Copies it into word
 * and returns where it starts in the sentence, or -1 when there is none. */
static int pick_word(const char *sent, uint64_t *s, char *word, size_t cap)
{
    int idx[256], n = 0, w = 0;
    for (const char *p = sent; *p && n < 256;) {
        while (*p == ' ') p++;
        const char *a = p;
        while (*p && *p != ' ') p++;
        int alpha = p - a >= 5;
        for (const char *c = a; c < p && alpha; c++) alpha = isalpha((unsigned char)*c);
        if (alpha && w > 0) idx[n++] = w;
        w++;
    }
    if (!n) return -1;
    const int pick = idx[rng_below(s, n)];
    w = 0;
    for (const char *p = sent; *p;) {
        while (*p == ' ') p++;
        const char *a = p;
        while (*p && *p != ' ') p++;
        if (w++ == pick) {
            snprintf(word, cap, "%.*s", (int)(p - a), a);
            return (int)(a - sent);
        }
    }
    return -1;
}

static int count_of(const char *hay, const char *needle)
{
    int n = 0;
    for (const char *p = hay; (p = strstr(p, needle)); p++) n++;
    return n;
}

/* out contains needle, ignoring case */
static int contains(const char *out, const char *needle)
{
    const size_t n = strlen(needle);
    if (!n) return 0;
    for (const char *p = out; *p; p++)
        if (!strncasecmp(p, needle, n)) return 1;
    return 0;
}

/* The task's fixed parts (keys, values, the gold document...), from the seed. */
static int setup(gen *g, char *err)
{
    const struct task *t = g->t;
    ruler_sample *s = g->s;
    uint64_t r = g->seed * 6364136223846793005ull + 1442695040888963407ull;
    switch (t->kind) {
    case K_NIAH:
        g->n_needles = t->n_keys * t->n_values;
        for (int k = 0; k < t->n_keys; k++) {
            make_value(t->key, &r, g->keys[k], sizeof g->keys[k]);
            for (int j = 0; j < k; j++)
                if (!strcmp(g->keys[j], g->keys[k])) make_value(t->key, &r, g->keys[k], sizeof g->keys[k]), j = -1;
            for (int v = 0; v < t->n_values; v++) make_value(t->value, &r, g->vals[k][v], sizeof g->vals[k][v]);
        }
        /* the asked keys' values are the answers */
        for (int q = 0; q < t->n_queries; q++)
            for (int v = 0; v < t->n_values; v++) s->answers[s->n_answers++] = strdup(g->vals[q][v]);
        break;
    case K_VT:
        g->n_needles = 5;
        for (int k = 0; k < 5; k++) {
            for (int i = 0; i < 5; i++) g->vt_names[k][i] = (char)('A' + rng_below(&r, 26));
            g->vt_names[k][5] = 0;
            s->answers[s->n_answers++] = strdup(g->vt_names[k]);
        }
        snprintf(g->vt_value, sizeof g->vt_value, "%d", 10000 + rng_below(&r, 90000));
        break;
    case K_CWE:
        for (int i = 0; i < 10; i++) {
            int w;
            do {
                w = rng_below(&r, C.n_word);
                for (int j = 0; j < i && w >= 0; j++) w = g->cw[j] == w ? -1 : w;
            } while (w < 0);
            g->cw[i] = w;
            s->answers[s->n_answers++] = strdup(C.word[w]);
        }
        break;
    case K_FWE:
        g->fwe_vocab = 100;
        if (!(g->codes = calloc(g->fwe_vocab, sizeof *g->codes))) return fasa_error(err, FASA_ENOMEM, "out of memory");
        for (int i = 0; i < g->fwe_vocab; i++) {
            char code[8];
            int len = 4 + rng_below(&r, 3), dup;
            do {
                for (int c = 0; c < len; c++) code[c] = (char)('a' + rng_below(&r, 26));
                code[len] = 0;
                dup = 0;
                for (int j = 0; j < i; j++) dup |= !strcmp(g->codes[j], code);
            } while (dup);
            if (!(g->codes[i] = strdup(code))) return fasa_error(err, FASA_ENOMEM, "out of memory");
        }
        for (int i = 0; i < 3; i++) s->answers[s->n_answers++] = strdup(g->codes[i]);
        break;
    case K_QA1: case K_QA2:
        /* a gold paragraph, a sentence of it the whole corpus has once, and in it a word to ask */
        for (int tries = 0; tries < 10000; tries++) {
            g->gold = rng_below(&r, C.n_para);
            const char *para = C.para[g->gold];
            if (count_of(C.text, para) != 1) continue;
            /* its sentences */
            char sent[8][1024];
            int ns = 0;
            for (const char *p = para; *p && ns < 8;) {
                const char *q = strstr(p, ". ");
                const char *end = q ? q + 1 : p + strlen(p);
                if (end - p < 1000 && n_words_range(p, end) >= 8)
                    snprintf(sent[ns++], sizeof sent[0], "%.*s", (int)(end - p), p);
                p = q ? q + 2 : end;
            }
            if (t->kind == K_QA1) {
                if (!ns) continue;
                const char *pick = sent[rng_below(&r, ns)];
                if (count_of(C.text, pick) != 1) continue;
                int at = pick_word(pick, &r, g->answer, sizeof g->answer);
                if (at < 0 || count_of(C.text, g->answer) > 40) continue;   /* not a word one could guess */
                /* the words before it, which must name one place in the corpus */
                while (at > 0 && pick[at - 1] == ' ') at--;
                snprintf(g->passage, sizeof g->passage, "%.*s", at, pick);
                if (strlen(g->passage) < 20 || count_of(C.text, g->passage) != 1) continue;
                if (contains(g->passage, g->answer)) continue;   /* echoing the question must not score */
            } else {
                if (ns < 2) continue;
                const char *hint = sent[rng_below(&r, ns - 1)];   /* not the last sentence */
                if (count_of(C.text, hint) != 1) continue;
                snprintf(g->hint, sizeof g->hint, "%s", hint);
                const char *e = para + strlen(para);
                while (e > para && !isalpha((unsigned char)e[-1])) e--;
                const char *a = e;
                while (a > para && isalpha((unsigned char)a[-1])) a--;
                if (e - a < 3) continue;
                snprintf(g->answer, sizeof g->answer, "%.*s", (int)(e - a), a);
                if (count_of(C.text, g->answer) > 40) continue;   /* not a word one could guess */
                if (contains(g->hint, g->answer)) continue;        /* nor one the question holds */
            }
            s->answers[s->n_answers++] = strdup(g->answer);
            return 0;
        }
        return fasa_error(err, FASA_EFORMAT, "ruler: no usable question in the license texts");
    }
    for (int i = 0; i < s->n_answers; i++)
        if (!s->answers[i]) return fasa_error(err, FASA_ENOMEM, "out of memory");
    return 0;
}

/* ---------------------------------------------------------------- generate, score */

static int measure(gen *g, int n, ruler_count_fn count, void *ctx, int *tokens)
{
    int rc = build(g, n);
    if (rc < 0) return rc;
    sbuf all = { 0 };
    sb_puts(&all, g->s->prompt), sb_puts(&all, g->s->answer_prefix);
    if (all.oom) return FASA_ENOMEM;
    *tokens = count(ctx, all.p, all.len);
    free(all.p);
    return *tokens < 0 ? FASA_EFORMAT : 0;
}

int ruler_generate(int task, int target, uint64_t seed, ruler_count_fn count, void *ctx, ruler_sample *out, char *err)
{
    memset(out, 0, sizeof *out);
    if (task < 0 || task >= N_TASKS) return fasa_error(err, FASA_EARG, "ruler: no task %d", task);
    int rc = corpus_load(err);
    if (rc < 0) return rc;
    gen g = { .t = &tasks[task], .seed = seed, .s = out };
    snprintf(out->task, sizeof out->task, "%s", tasks[task].name);
    out->max_new_tokens = tasks[task].max_new;
    out->match_all = tasks[task].kind != K_QA1 && tasks[task].kind != K_QA2;
    if ((rc = setup(&g, err)) < 0) goto out;
    /* the most haystack units that fit: double, then bisect */
    int lo = 0, hi = 16, tok;
    if ((rc = measure(&g, 0, count, ctx, &tok)) < 0) goto fail;
    if (tok > target) {
        rc = fasa_error(err, FASA_EARG, "ruler: %s needs %d tokens without any haystack; the target is %d", out->task,
                        tok, target);
        goto out;
    }
    for (;;) {
        if ((rc = measure(&g, hi, count, ctx, &tok)) < 0) goto fail;
        if (tok > target) break;
        lo = hi, hi *= 2;
        if (hi > 1 << 22) break;
    }
    while (hi - lo > 1) {
        const int mid = lo + (hi - lo) / 2;
        if ((rc = measure(&g, mid, count, ctx, &tok)) < 0) goto fail;
        if (tok <= target) lo = mid;
        else hi = mid;
    }
    if ((rc = measure(&g, lo, count, ctx, &tok)) < 0) goto fail;
    out->n_tokens = tok;
    goto out;
fail:
    if (rc == FASA_ENOMEM) fasa_error(err, rc, "out of memory");
    else fasa_error(err, rc, "ruler: cannot count the tokens of a %s prompt", out->task);
out:
    for (int i = 0; g.codes && i < g.fwe_vocab; i++) free(g.codes[i]);
    free(g.codes);
    if (rc < 0) ruler_sample_free(out);
    return rc;
}

double ruler_score(const ruler_sample *s, const char *output)
{
    if (!s->n_answers) return 0;
    int hit = 0;
    for (int i = 0; i < s->n_answers; i++) hit += contains(output ? output : "", s->answers[i]);
    return s->match_all ? (double)hit / s->n_answers : hit > 0;
}

void ruler_sample_free(ruler_sample *s)
{
    free(s->prompt), free(s->answer_prefix);
    for (int i = 0; i < s->n_answers; i++) free(s->answers[i]);
    memset(s, 0, sizeof *s);
}

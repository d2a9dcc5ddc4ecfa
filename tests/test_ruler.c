/* RULER-style tasks: deterministic, the answers really in the context, lengths on target,
 * scoring as RULER scores. A cheap counter (words) stands in for a tokenizer. */
#include <criterion/criterion.h>
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base.h"
#include "ruler.h"

static int words(void *ctx, const char *text, size_t len)
{
    (void)ctx;
    int n = 0, in = 0;
    for (size_t i = 0; i < len; i++) {
        const int w = !isspace((unsigned char)text[i]);
        n += w && !in, in = w;
    }
    return n;
}

static int have_corpus(void) { return access("/usr/share/common-licenses/GPL-3", R_OK) == 0; }

static int occurrences(const char *hay, const char *needle)
{
    int n = 0;
    for (const char *p = hay; (p = strstr(p, needle)); p++) n++;
    return n;
}

Test(ruler, every_task_deterministic_answers_present_on_target)
{
    if (!have_corpus()) cr_skip_test("ruler::every_task: no /usr/share/common-licenses");
    char err[FASA_ERRLEN];
    static const int lengths[] = { 1000, 4000, 16000 };
    for (int t = 0; t < ruler_task_count(); t++)
        for (int li = 0; li < 3; li++) {
            ruler_sample a, b, c;
            const int L = lengths[li];
            cr_assert_eq(ruler_generate(t, L, 3, words, NULL, &a, err), 0, "%s: %s", ruler_task_name(t), err);
            cr_assert_eq(ruler_generate(t, L, 3, words, NULL, &b, err), 0, "%s", err);
            cr_assert_eq(ruler_generate(t, L, 4, words, NULL, &c, err), 0, "%s", err);
            cr_expect_str_eq(a.prompt, b.prompt, "%s: the same seed gave another prompt", a.task);
            cr_expect_str_neq(a.prompt, c.prompt, "%s: another seed gave the same prompt", a.task);
            /* on target: within 5% below (QA and cwe step by whole documents or words) */
            cr_expect(a.n_tokens <= L && a.n_tokens >= L * 0.93, "%s at %d: %d words", a.task, L, a.n_tokens);
            cr_expect_eq(words(NULL, a.prompt, strlen(a.prompt)) +
                             words(NULL, a.answer_prefix, strlen(a.answer_prefix)),
                         a.n_tokens);
            cr_expect_gt(a.n_answers, 0);
            cr_expect_gt(a.max_new_tokens, 0);
            for (int i = 0; i < a.n_answers; i++) {
                const char *ans = a.answers[i];
                if (!strncmp(a.task, "niah", 4)) {
                    /* each value is in exactly one needle, and that needle is the asked key's */
                    cr_expect_eq(occurrences(a.prompt, ans), 1, "%s: '%s' appears %d times", a.task, ans,
                                 occurrences(a.prompt, ans));
                } else if (!strcmp(a.task, "vt")) {
                    char var[32];
                    snprintf(var, sizeof var, "VAR %s =", ans);
                    cr_expect_eq(occurrences(a.prompt, var), 1, "%s: '%s'", a.task, var);
                } else if (!strcmp(a.task, "qa_1")) {
                    /* the quoted words and the answer after them: in the documents, once */
                    const char *q = strstr(a.prompt, "comes right after \"");
                    cr_assert(q != NULL, "%s: no question", a.task);
                    q += strlen("comes right after \"");
                    char want[2200];
                    snprintf(want, sizeof want, "%.*s %s", (int)(strstr(q, "\"?") - q), q, ans);
                    cr_expect_eq(occurrences(a.prompt, want), 1, "%s: '%s'", a.task, want);
                } else {
                    cr_expect_geq(occurrences(a.prompt, ans), 1, "%s: '%s' not in the context", a.task, ans);
                }
                cr_expect_eq(ruler_score(&a, ans), a.match_all ? 1.0 / a.n_answers : 1.0, "%s", a.task);
            }
            ruler_sample_free(&a), ruler_sample_free(&b), ruler_sample_free(&c);
        }
}

/* cwe: the 10 answers are the list's most common words; fwe: the 3 answers its most frequent */
Test(ruler, extraction_answers_are_the_most_frequent)
{
    if (!have_corpus()) cr_skip_test("ruler::extraction: no /usr/share/common-licenses");
    char err[FASA_ERRLEN];
    static const char *const names[] = { "cwe", "fwe" };
    for (int k = 0; k < 2; k++) {
        ruler_sample s;
        cr_assert_eq(ruler_generate(ruler_task_find(names[k]), 6000, 9, words, NULL, &s, err), 0, "%s", err);
        int least = 1 << 30;
        for (int i = 0; i < s.n_answers; i++) {
            char w[64];
            snprintf(w, sizeof w, k == 0 ? ". %s\n" : " %s ", s.answers[i]);
            const int n = occurrences(s.prompt, w);
            least = n < least ? n : least;
        }
        cr_expect_geq(least, k == 0 ? 30 : 20, "%s: an answer appears only %d times", names[k], least);
        ruler_sample_free(&s);
    }
}

Test(ruler, scoring_as_ruler_scores)
{
    ruler_sample s = { .match_all = 1, .n_answers = 2 };
    s.answers[0] = strdup("1234567"), s.answers[1] = strdup("Apple-Pie");
    cr_expect_eq(ruler_score(&s, "They are 1234567 and apple-pie."), 1.0);
    cr_expect_eq(ruler_score(&s, "It is 1234567."), 0.5);
    cr_expect_eq(ruler_score(&s, "I do not know."), 0.0);
    cr_expect_eq(ruler_score(&s, ""), 0.0);
    cr_expect_eq(ruler_score(&s, "123456"), 0.0, "a prefix of a number is not the number");
    s.match_all = 0;
    cr_expect_eq(ruler_score(&s, "apple-pie"), 1.0);
    cr_expect_eq(ruler_score(&s, "wrong"), 0.0);
    free(s.answers[0]), free(s.answers[1]);
    cr_expect_eq(ruler_task_find("niah_multikey_1"), 3);
    cr_expect_eq(ruler_task_find("nope"), -1);
    cr_expect_eq(ruler_task_count(), 13);
}

/* a target smaller than the task's fixed text: one error naming the task */
Test(ruler, too_short_a_target)
{
    if (!have_corpus()) cr_skip_test("ruler::too_short: no /usr/share/common-licenses");
    char err[FASA_ERRLEN];
    ruler_sample s;
    cr_expect_eq(ruler_generate(ruler_task_find("cwe"), 50, 1, words, NULL, &s, err), FASA_EARG);
    cr_expect(strstr(err, "cwe") != NULL, "%s", err);
}

/* qa: repeating the question back never scores (its sentence does not hold the answer) */
Test(ruler, qa_questions_do_not_hold_their_answers)
{
    if (!have_corpus()) cr_skip_test("ruler::qa_questions: no /usr/share/common-licenses");
    char err[FASA_ERRLEN];
    static const char *const names[] = { "qa_1", "qa_2" };
    for (int k = 0; k < 2; k++)
        for (uint64_t seed = 1; seed <= 60; seed++) {
            ruler_sample s;
            cr_assert_eq(ruler_generate(ruler_task_find(names[k]), 1500, seed, words, NULL, &s, err), 0, "%s", err);
            const char *q = strstr(s.prompt, "Question:");
            cr_assert(q != NULL, "%s: no question", names[k]);
            cr_expect_eq(ruler_score(&s, q), 0.0, "%s, seed %d: the question holds its answer '%s'", names[k],
                         (int)seed, s.answers[0]);
            ruler_sample_free(&s);
        }
}

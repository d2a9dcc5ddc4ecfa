/* ruler.h - long-context tasks after RULER (Hsieh et al. 2024, "RULER: What's the Real Context
 * Size of Your Long-Context Language Models?"): samples generated here from RULER's task rules,
 * at a length in the model's tokens, and scored as RULER scores them.
 *
 *   ruler_sample s;
 *   int t = ruler_task_find("niah_multikey_1");
 *   if (ruler_generate(t, 8192, 7, count_tokens, ctx, &s, err) < 0) ...;   // seed 7, <= 8192 tokens
 *   // s.prompt: instruction, context, question; s.answer_prefix goes after the assistant's turn
 *   // begins; decode up to s.max_new_tokens greedily, then:
 *   double score = ruler_score(&s, output);                           // in [0, 1]
 *   ruler_sample_free(&s);
 *
 * The 13 tasks (RULER's names and parameters):
 *   niah_single_1    one needle (word key, 7-digit number) in a repeated-noise haystack
 *   niah_single_2    the same in an essay haystack
 *   niah_single_3    essay haystack, a UUID-like value
 *   niah_multikey_1  four needles with different keys, one asked (essay)
 *   niah_multikey_2  the haystack is all needles, one asked (word keys, numbers)
 *   niah_multikey_3  the haystack is all needles, UUID-like keys and values
 *   niah_multivalue  one key with four values, all asked (essay)
 *   niah_multiquery  four needles, four keys asked at once (essay)
 *   vt               variable tracking: a chain of 5 VAR assignments in noise, all names asked
 *   cwe              common words: a numbered word list, the 10 words of 30 repeats among
 *                    words of 3 (RULER's lower-frequency setting for long lists)
 *   fwe              frequent words: coded words with Zipf(2) frequencies, the top 3 asked
 *   qa_1, qa_2       question answering over real documents with distractors (below)
 * Scoring: string_match_all (the share of expected answers the output contains, ignoring
 * case) for all but QA; string_match_part (1 when any expected answer appears) for QA.
 *
 * What differs from RULER, and why: no dataset is downloaded, so the essay haystack is the
 * license texts every Debian system has (/usr/share/common-licenses; RULER uses Paul Graham's
 * essays), word keys and the cwe words come from those texts' vocabulary (RULER: wonderwords),
 * and QA asks about the same documents instead of SQuAD / HotpotQA: qa_1 quotes the start of
 * a sentence of one document among distractor documents (words that occur once in the corpus)
 * and asks for the word that follows; qa_2 (two hops) names the document by one of its
 * sentences and asks for its last word. Neither question holds its answer.
 * Everything is a function of (task, length, seed, the model's tokenizer).
 */
#ifndef FASA_RULER_H
#define FASA_RULER_H

#include <stddef.h>
#include <stdint.h>

#define RULER_MAX_ANSWERS 16

typedef struct ruler_sample {
    char task[24];
    char *prompt;           /* instruction + context + question (the user's turn) */
    char *answer_prefix;    /* what the assistant's turn starts with */
    int n_answers;
    char *answers[RULER_MAX_ANSWERS];
    int max_new_tokens;     /* RULER's tokens_to_generate */
    int match_all;          /* 1: string_match_all; 0: string_match_part */
    int n_tokens;           /* the prompt's tokens as counted (prompt + answer prefix) */
} ruler_sample;

/* Tokens of text (the model's tokenizer, chat template included as the caller sees fit). */
typedef int (*ruler_count_fn)(void *ctx, const char *text, size_t len);

int ruler_task_count(void);
const char *ruler_task_name(int task);
int ruler_task_find(const char *name);           /* -1 when unknown */
/* A few tasks for a smoke run (`--quick`): niah_single_2, niah_multikey_1, vt, qa_1. */
int ruler_task_quick(int task);

/* A sample of task with at most target_tokens tokens (by count), as close below as the
 * haystack's units allow; FASA_EARG when even an empty haystack does not fit. */
int ruler_generate(int task, int target_tokens, uint64_t seed, ruler_count_fn count, void *ctx, ruler_sample *out,
                   char *err);
double ruler_score(const ruler_sample *s, const char *output);
void ruler_sample_free(ruler_sample *s);

#endif

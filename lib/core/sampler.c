#include "sampler.h"

#include <math.h>
#include <stdlib.h>

#include "base.h"

int sampler_init(sampler *s, int n_vocab, float temp, int top_k, float top_p, uint64_t seed, char *err)
{
    if (!(temp >= 0) || !(top_p > 0 && top_p <= 1) || top_k < 0)
        return fasa_error(err, FASA_EARG, "bad sampling parameters (temp %g, top-k %d, top-p %g)",
                          temp, top_k, top_p);
    *s = (sampler){ n_vocab, temp, top_p, top_k, seed ? seed : 0x9E3779B97F4A7C15ull, NULL };
    if (!(s->cand = malloc(sizeof *s->cand * n_vocab))) return fasa_error(err, FASA_ENOMEM, "out of memory");
    return 0;
}

void sampler_free(sampler *s)
{
    free(s->cand);
    s->cand = NULL;
}

float sampler_rand(uint64_t *state)
{
    uint64_t x = *state;
    x ^= x >> 12; x ^= x << 25; x ^= x >> 27;
    *state = x;
    return (float)((x * 0x2545F4914F6CDD1Dull) >> 40) / (float)(1u << 24);
}

int sampler_argmax(const float *logits, int n)
{
    int best = 0;
    for (int i = 1; i < n; i++) if (logits[i] > logits[best]) best = i;
    return best;
}

static int cand_desc(const void *a, const void *b)
{
    const struct sampler_cand *x = a, *y = b;
    if (x->p != y->p) return x->p < y->p ? 1 : -1;
    return x->id - y->id;   /* ties by id: the order is total, so results are reproducible */
}

int sampler_sample(sampler *s, float *logits)
{
    const int n = s->n_vocab;
    if (s->temp == 0) return sampler_argmax(logits, n);
    float max = logits[0];
    for (int i = 1; i < n; i++) if (logits[i] > max) max = logits[i];
    double sum = 0;
    for (int i = 0; i < n; i++) {
        s->cand[i].p = expf((logits[i] - max) / s->temp);
        s->cand[i].id = i;
        sum += s->cand[i].p;
    }
    int k = n;
    if (s->top_k > 0 || s->top_p < 1) {
        qsort(s->cand, n, sizeof *s->cand, cand_desc);
        if (s->top_k > 0 && s->top_k < k) k = s->top_k;
        double kept = 0;
        for (int i = 0; i < k; i++) kept += s->cand[i].p;
        if (s->top_p < 1) {
            double acc = 0;
            for (int i = 0; i < k; i++) {
                acc += s->cand[i].p;
                if (acc >= s->top_p * kept) { k = i + 1; break; }
            }
        }
        sum = 0;
        for (int i = 0; i < k; i++) sum += s->cand[i].p;
    }
    double r = sampler_rand(&s->rng) * sum, acc = 0;
    for (int i = 0; i < k; i++) {
        acc += s->cand[i].p;
        if (r < acc) return s->cand[i].id;
    }
    return s->cand[k - 1].id;
}

/* sampler.h - next-token choice from logits: greedy, temperature, top-k, top-p. Seeded.
 *
 *   sampler sp;
 *   sampler_init(&sp, n_vocab, 0.8f, 40, 0.95f, 42, err);   // temp 0 means greedy
 *   int id = sampler_sample(&sp, logits);                     // logits are overwritten
 *   sampler_free(&sp);
 */
#ifndef FASA_SAMPLER_H
#define FASA_SAMPLER_H

#include <stdint.h>

typedef struct sampler {
    int n_vocab;
    float temp, top_p;
    int top_k;               /* 0: off */
    uint64_t rng;
    struct sampler_cand { float p; int id; } *cand;   /* (n_vocab) scratch */
} sampler;

int  sampler_init(sampler *s, int n_vocab, float temp, int top_k, float top_p, uint64_t seed, char *err);
void sampler_free(sampler *s);
int  sampler_argmax(const float *logits, int n);
int  sampler_sample(sampler *s, float *logits);
/* Uniform float in [0, 1) from the sampler's generator (xorshift64*). */
float sampler_rand(uint64_t *state);

#endif

/* bench_topk - times topk_indices, one selection of K among N scores as FASA decode makes them
 * (N: a 32k and an 8k cache's row between the forced tokens, and their halves and quarters as
 * threads cut them).
 * Not part of the suite.
 *
 *   make build/libfasa.a && cc -O2 -march=native -fopenmp -I. -Ilib -Ilib/core tests/tools/bench_topk.c \
 *       build/libfasa.a -lm -o bin/bench_topk
 *   bin/bench_topk [K] [pairs] (K: default 124, budget 256 less 4 sinks and 128 recent tokens;
 *                               pairs: every score twice, as the speed bench's tiled cache gives)
 *
 * Scores are normal with a spread of 3, like TIP's, rising by 2 over the row towards the recent
 * end (each size its own rows, from the same seed); each call
 * takes the next of 16 such rows, so that no branch can learn one row's data (a fixed row timed
 * the old selection at half its cost in decode). The best of 20 rounds of 1000 calls. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "topk.h"

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

int main(int argc, char **argv)
{
    const int k = argc > 1 ? atoi(argv[1]) : 124, pairs = argc > 2, sizes[] = { 32636, 16318, 8060, 4030, 2015 };
    if (k < 1 || k > 2015) {
        fprintf(stderr, "bench_topk: K must be 1..2015, not '%s'\n", argv[1]);
        return 2;
    }
    enum { ROWS = 16, NMAX = 32636 };
    float *s = malloc(sizeof(float) * NMAX * ROWS);
    int32_t *idx = malloc(sizeof(int32_t) * NMAX);
    uint64_t *scratch = malloc(sizeof(uint64_t) * NMAX);
    if (!s || !idx || !scratch) return 1;
    for (int j = 0; j < 5; j++) {
        const int n = sizes[j];
        srand(1);
        for (int i = 0; i < n * ROWS; i++) {   /* Box-Muller */
            const float u = (rand() + 1.0f) / ((float)RAND_MAX + 2), v = (rand() + 1.0f) / ((float)RAND_MAX + 2);
            s[i] = 3 * sqrtf(-2 * logf(u)) * cosf(6.2831853f * v) + 2.0f * (i % n) / n;
        }
        if (pairs)   /* row r's scores i and i + n / 2 equal */
            for (int i = 0; i < n * ROWS; i++)
                if (i % n >= n / 2 && i % n - n / 2 < n / 2) s[i] = s[i - n / 2];
        double best = 1e9;
        long sink = 0;
        for (int r = 0; r < 20; r++) {
            const double t0 = now();
            for (int it = 0; it < 1000; it++) sink += topk_indices(s + (size_t)(it % ROWS) * n, n, k, idx, scratch);
            const double t = (now() - t0) / 1000;
            best = t < best ? t : best;
        }
        printf("bench_topk: %d of %d scores%s: %.2f us (%ld selected)\n", k, n, pairs ? " (pairs)" : "", best * 1e6,
               sink / 20000);
    }
    free(s); free(idx); free(scratch);
    return 0;
}

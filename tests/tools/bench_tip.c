/* bench_tip - times ops_tip_q4, TIP over the 4-bit key copy, for three queries (a KV group of the
 * default model) on one thread: tiles cache-resident (256 tiles) and streamed from memory (a copy
 * of 128k tiles, far beyond the caches). Not part of the suite.
 *
 *   make build/libfasa.a && cc -O2 -march=native -fopenmp -I. -Ilib -Ilib/core tests/tools/bench_tip.c \
 *       build/libfasa.a -lm -o bin/bench_tip
 *   bin/bench_tip [DIMS...]     (default 16 24 40: the copy's widths, a multiple of 8)
 *
 * Cycles by the time-stamp counter; the best of 20 passes over the tiles, 128 tiles a call. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <x86intrin.h>

#include "ops.h"

static void run(int tw, size_t n_tiles)
{
    const size_t tile = (size_t)tw / 8 * 64;
    uint8_t *t = malloc(n_tiles * tile);
    uint16_t *ks = malloc(n_tiles * 16 * sizeof *ks);
    float *S = malloc(3 * 16 * n_tiles * sizeof *S);
    int8_t qi[3 * 1032];
    int32_t qsum[3] = { 0, 0, 0 };
    const float qs[3] = { 1, 1, 1 };
    static float bias[3 * 128];
    if (!t || !ks || !S) exit(1);
    memset(t, 0x5a, n_tiles * tile);
    for (size_t i = 0; i < n_tiles * 16; i++) ks[i] = 0x3c00;   /* f16 1.0 */
    for (int i = 0; i < 3 * tw; i++) qsum[i / tw] += qi[i] = (int8_t)(i * 7 % 255 - 127);
    unsigned long long best = ~0ull;
    for (int rep = 0; rep < 20; rep++) {
        const unsigned long long c0 = __rdtsc();
        for (size_t a = 0; a + 128 <= n_tiles; a += 128)
            ops_tip_q4(S + 16 * a, (int)(16 * n_tiles), qi, tw, qsum, qs, bias, 128, 3, t + a * tile, ks + 16 * a, 128,
                       tw);
        const unsigned long long c = __rdtsc() - c0;
        best = c < best ? c : best;
    }
    printf("bench_tip: %d dims, %zu tiles (%.1f MB): %.1f cycles a tile, %.2f bytes a cycle\n", tw, n_tiles,
           n_tiles * (tile + 32) / 1e6, (double)best / n_tiles, (double)n_tiles * (tile + 32) / best);
    free(t), free(ks), free(S);
}

int main(int argc, char **argv)
{
    int dims[16] = { 16, 24, 40 }, n = argc > 1 ? 0 : 3;
    for (int i = 1; i < argc && n < 16; i++) {
        dims[n] = atoi(argv[i]);
        if (dims[n] < 8 || dims[n] > 1024 || dims[n] % 8) {
            fprintf(stderr, "bench_tip: DIMS must be a multiple of 8 in 8..1024, not '%s'\n", argv[i]);
            return 2;
        }
        n++;
    }
    for (int i = 0; i < n; i++) run(dims[i], 256), run(dims[i], 131072);
    return 0;
}

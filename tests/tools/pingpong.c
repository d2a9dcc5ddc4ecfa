/* pingpong - how far apart this machine's two OpenMP threads are: one cache line handed back and
 * forth between them, the one-way time printed (median of 9 rounds). Not part of the suite.
 *
 *   cc -O2 -fopenmp tests/tools/pingpong.c -o bin/pingpong && bin/pingpong
 *
 * On the 2-vCPU machines fasa is measured on it read 26-50 ns in some minutes and 160-200 ns in
 * others (the vCPUs on different dies); FASA decode's speed notes say which minutes they saw. */
#include <omp.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static int cmp_double(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int main(void)
{
    if (omp_get_num_procs() < 2) {   /* one core: the two would take turns by time slice */
        fprintf(stderr, "pingpong: needs two cores, this machine has one\n");
        return 1;
    }
    static _Alignas(128) _Atomic long flag;
    enum { ROUNDS = 9, TRIPS = 100000 };
    double ns[ROUNDS];
    for (int r = 0; r < ROUNDS; r++) {
        double t0 = 0, t1 = 0;
        atomic_store(&flag, 0);
#pragma omp parallel num_threads(2)
        {
            const int me = omp_get_thread_num();
#pragma omp barrier
            if (me == 0) t0 = now();
            for (long i = 0; i < TRIPS; i++) {   /* thread 0 turns 2i into 2i + 1, thread 1 back */
                const long want = 2 * i + me;
                while (atomic_load_explicit(&flag, memory_order_acquire) != want) {}
                atomic_store_explicit(&flag, want + 1, memory_order_release);
            }
#pragma omp barrier
            if (me == 0) t1 = now();
        }
        ns[r] = (t1 - t0) / (2.0 * TRIPS) * 1e9;
    }
    qsort(ns, ROUNDS, sizeof *ns, cmp_double);
    printf("pingpong: %.0f ns one way (median of %d rounds of %d round trips; min %.0f, max %.0f)\n", ns[ROUNDS / 2],
           ROUNDS, TRIPS, ns[0], ns[ROUNDS - 1]);
    return 0;
}

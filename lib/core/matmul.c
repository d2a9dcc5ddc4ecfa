/* matmul.c - y = x W^T over threads: the balanced split of rows, and the choice between one
 * thread and all of them (quant.c does the rows of each weight type). */
#include "ops.h"

#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "base.h"
#include "gguf.h"
#include "quant.h"

/* Below this many multiply-adds a call stays on one thread. */
#define MM_PARALLEL_MIN 32768

/* Threads: one parallel region per call. The rows are cut into MM_PARTS_PER_THREAD parts a
 * thread of equal cost (bytes for decode, multiply-adds for prefill), and each thread takes the
 * next part left until none is: a thread that a neighbour on the machine slows down takes fewer
 * parts, where an even split of the rows would leave the others waiting for it at the region's
 * end (a 2-thread decode step of the 1.5B model waited about a tenth of its matmul time so).
 * Parts stay large enough to stream: at least MM_PART_MIN units each. In prefill of the K types
 * the threads first round x to int8 together, a share of the tokens each, then meet at the
 * region's one barrier; where each part rounded all of x again, that was 4% of the samples in a
 * 2,269-token prefill of that model. */
#define MM_PARTS_PER_THREAD 8
#define MM_PART_MIN 65536.0

/* Cost of one row, for balancing threads: bytes streamed in decode, multiply-adds in prefill. */
static double row_cost(const weight *w, int n)
{
    return n == 1 ? (double)weight_bytes(w) / (double)w->rows : (double)w->cols;
}

/* Boundary k of nt over the rows of ws[0..count) taken end to end, placed so that every thread
 * gets the same cost: (weight index, row), the row a multiple of MM_ROWS or the weight's end.
 * Neighbouring threads compute the same boundary, so the parts tile the rows exactly. */
static void split_at(const weight *const *ws, int count, int n, int k, int nt, int *wi, int64_t *row)
{
    if (k >= nt) {
        *wi = count - 1;
        *row = ws[count - 1]->rows;
        return;
    }
    double total = 0;
    for (int i = 0; i < count; i++) total += row_cost(ws[i], n) * (double)ws[i]->rows;
    double target = total * k / nt;
    for (int i = 0; i < count; i++) {
        const double c = row_cost(ws[i], n), all = c * (double)ws[i]->rows;
        if (target < all || i == count - 1) {
            int64_t r = (int64_t)(target / c / MM_ROWS + 0.5) * MM_ROWS;
            *wi = i;
            *row = r < ws[i]->rows ? r : ws[i]->rows;
            return;
        }
        target -= all;
    }
}

/* ---- threads ----------------------------------------------------------------------------------
 *
 * A parallel region ends when its slowest thread does. On a machine shared with other busy
 * processes our threads are often off their cores for a scheduler slice (milliseconds), and a
 * decode step has hundreds of regions of a few microseconds each: with the load average at 7
 * on 2 cores, 2 threads decoded at 0.4 tok/s and 1 thread at 37. So matmuls measure both: every
 * call is timed, and a moving average of seconds per unit of work (weight bytes for decode,
 * multiply-adds for prefill) is kept per size class for one thread and for all threads. Each
 * call uses the faster; every explore-th call of a class tries the other (64 calls, doubling up
 * to 4096 while it keeps losing, back to 64 when the choice flips). On an idle machine that costs
 * one slower call in 64 at first and far fewer later; on a busy one it avoids most waits. The
 * results do not depend on the thread count (every row is computed the same way wherever the
 * split falls), so this changes speed only. ops_threads() lets other parallel loops follow the
 * latest choice; ops_threads_adaptive(0) turns it off (always all threads). */

enum { SCHED_CLASSES = 16, SCHED_EXPLORE_MIN = 64, SCHED_EXPLORE_MAX = 4096 };

static struct {
    double cost[SCHED_CLASSES][2];   /* seconds per unit of work, [class][0 one thread, 1 all]; 0 unknown */
    unsigned calls[SCHED_CLASSES];
    unsigned explore[SCHED_CLASSES]; /* the other choice is tried every explore-th call */
    int last;                        /* the latest choice: 0 one thread, 1 all */
    int fixed;                       /* ops_threads_adaptive(0) */
} sched = { .last = 1 };


/* Relaxed atomic access: concurrent callers may each update the policy; any interleaving is a
 * valid (if slightly different) policy. */
#define SCHED_GET(f) __extension__({ __typeof__(sched.f) v_; __atomic_load(&sched.f, &v_, __ATOMIC_RELAXED); v_; })
#define SCHED_SET(f, v) do { __typeof__(sched.f) v_ = (v); __atomic_store(&sched.f, &v_, __ATOMIC_RELAXED); } while (0)

/* Size class of a call: decode and prefill apart, then by powers of 4 of the work. */
static int sched_class(double work, int n)
{
    int c = 0;
    for (double w = work / MM_PARALLEL_MIN; w >= 4 && c < SCHED_CLASSES / 2 - 1; w /= 4) c++;
    return (n > 1) * (SCHED_CLASSES / 2) + c;
}

/* 1: use all threads for a call of class k. */
static int sched_pick(int k)
{
    if (SCHED_GET(fixed)) return 1;
    const double one = SCHED_GET(cost[k][0]), all = SCHED_GET(cost[k][1]);
    if (all == 0) return 1;
    if (one == 0) return 0;
    const int best = all <= one;
    const unsigned c = SCHED_GET(calls[k]) + 1, e = SCHED_GET(explore[k]);
    SCHED_SET(calls[k], c);
    return c % (e ? e : SCHED_EXPLORE_MIN) == 0 ? !best : best;
}

/* A call of class k on one thread (par 0) or all (par 1) took sec seconds per unit of work. */
static void sched_note(int k, int par, double sec)
{
    const double one = SCHED_GET(cost[k][0]), all = SCHED_GET(cost[k][1]);
    const int best_before = all <= one;
    /* the choice in use is averaged; a tried one replaces its stale estimate outright, so that
     * a machine that became idle again is noticed at the first try */
    const double old = par ? all : one, now = old == 0 || par != best_before ? sec : 0.75 * old + 0.25 * sec;
    SCHED_SET(cost[k][par], now);
    const int best_after = par ? now <= one : all <= now;
    if (one == 0 || all == 0) return;   /* still learning both */
    const unsigned e = SCHED_GET(explore[k]);
    if (best_after != best_before)
        SCHED_SET(explore[k], SCHED_EXPLORE_MIN);
    else if (par != best_after)   /* tried the other choice and it lost again */
        SCHED_SET(explore[k], e * 2 > SCHED_EXPLORE_MAX ? SCHED_EXPLORE_MAX : (e ? e * 2 : 2 * SCHED_EXPLORE_MIN));
    SCHED_SET(last, best_after);
}

int ops_threads(void)
{
    if (omp_in_parallel()) return 1;
    const int nt = omp_get_max_threads();
    return SCHED_GET(fixed) || SCHED_GET(last) ? nt : 1;
}

void ops_threads_adaptive(int on)
{
    memset(&sched, 0, sizeof sched);
    sched.last = 1;
    SCHED_SET(fixed, !on);
}

typedef struct mm_call {
    float *const *y;
    const weight *const *w;
    int count, n;
    const float *x;
    int parts;   /* the rows cut into this many parts of equal cost */
    int next;    /* the next part no thread has taken (atomic) */
    xq8 *all;    /* prefill: x rounded once for every part (quant_wants_xq8), or NULL */
} mm_call;

/* One thread's share of a call: parts taken in turn until none is left. */
static void mm_thread(mm_call *c)
{
    const int64_t cols = c->w[0]->cols;
    /* the dequantised rows (prefill) or x quantised (decode) of this thread */
    uint8_t scratch[quant_scratch_bytes(cols, c->n)];
    quant_x q;
    quant_prepare(&q, c->x, cols, c->n, scratch);
    q.all = c->all;
    for (int k; (k = __atomic_fetch_add(&c->next, 1, __ATOMIC_RELAXED)) < c->parts;) {
        int wa, wb;
        int64_t ra, rb;
        split_at(c->w, c->count, c->n, k, c->parts, &wa, &ra);
        split_at(c->w, c->count, c->n, k + 1, c->parts, &wb, &rb);
        for (int i = wa; i <= wb; i++) {
            const int64_t r0 = i == wa ? ra : 0, r1 = i == wb ? rb : c->w[i]->rows;
            if (r0 < r1) quant_rows(c->y[i], c->w[i], r0, r1, &q);
        }
    }
}

/* Tokens [n i / m, n (i + 1) / m) of x rounded into c->all: thread i of m's share. */
static void mm_round_x(mm_call *c, int i, int m)
{
    quant_xq8_fill(c->all, c->x, (int)((int64_t)c->n * i / m), (int)((int64_t)c->n * (i + 1) / m), 0);
}

void ops_matmul_multi(float *const *y, const weight *const *w, int count, const float *x, int n)
{
    if (count < 1) return;
    mm_call c = { y, w, count, n, x, 1, 0, NULL };
    /* x as int8 for all parts; without the memory each part rounds its own (quant.c) */
    int round_x = 0;
    for (int i = 0; i < count; i++) round_x |= quant_wants_xq8(w[i], n);
    const size_t xbytes = round_x ? (quant_xq8_bytes(w[0]->cols, n) + 63) & ~(size_t)63 : 0;
    void *xbuf = round_x ? aligned_alloc(64, xbytes) : NULL;
    xq8 all;
    if (xbuf) {
        quant_xq8_layout(&all, w[0]->cols, n, xbuf);
        c.all = &all;
    }
    double work = 0;
    for (int i = 0; i < count; i++) work += (double)w[i]->rows * (double)w[0]->cols * n;
    const int nt = work > MM_PARALLEL_MIN && !omp_in_parallel() ? omp_get_max_threads() : 1;
    if (nt == 1) {
        if (c.all) mm_round_x(&c, 0, 1);
        mm_thread(&c);
        free(xbuf);
        return;
    }
    /* work in the unit the policy compares: weight bytes (decode) or multiply-adds (prefill) */
    double units = work;
    if (n == 1) {
        units = 0;
        for (int i = 0; i < count; i++) units += (double)weight_bytes(w[i]);
    }
    const int k = sched_class(work, n), par = sched_pick(k);
    const double t0 = fasa_now();
    if (par) {
        const double most = units / MM_PART_MIN;
        c.parts = most < nt ? nt : most < nt * MM_PARTS_PER_THREAD ? (int)most : nt * MM_PARTS_PER_THREAD;
#pragma omp parallel num_threads(nt)
        {
            if (c.all) {
                mm_round_x(&c, omp_get_thread_num(), omp_get_num_threads());
#pragma omp barrier
            }
            mm_thread(&c);
        }
    } else {
        if (c.all) mm_round_x(&c, 0, 1);
        mm_thread(&c);
    }
    sched_note(k, par, (fasa_now() - t0) / units);
    free(xbuf);
}

void ops_matmul(float *y, const weight *w, const float *x, int n)
{
    ops_matmul_multi(&y, &w, 1, x, n);
}


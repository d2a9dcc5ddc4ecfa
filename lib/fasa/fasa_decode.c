/* fasa_decode.c - FASA's decode step over split keys: the token importance predictor (TIP) over
 * the contiguous dominant key block, each head's selection, and focused attention over the
 * chosen rows beside the forced ones (attention sinks and the recent window).
 *
 * fasa_decode runs all of it in one parallel region. TIP's work, the G groups' rows between the
 * forced ones (lo..hi), is cut into equal shares, one per thread, at cache lines of the score
 * rows: a thread scores its rows (the heads of a group in one pass over the dominant block) and
 * picks each head's best `mid` among them. A head whose row one thread scored whole is thereby
 * selected; the others (a group cut between threads) take, after a barrier, the best mid of the
 * threads' picks, which is the best mid of the row: the same set as one selection over it. Then
 * each head attends to its rows, and the forced rows are attended once per group (the same rows
 * for all its heads), the parts merged as flash-decoding merges them. Under the budget that sets
 * itself nothing is picked before the barrier: a head's rows come from a cut on its whole row's
 * estimated masses (auto_rows), which needs the row whole. Under group_rerank a KV group's heads
 * attend together after the barrier (group_item): each keeps the best of the group's union of
 * picks by exact scores.
 * A thread reads only TIP scores it wrote: when the two cores of a VM sit on different dies,
 * handing a layer's scores (300 KB at 8k for the default model) from one core to the other made
 * TIP 2.5x slower (docs/results.md, Speed).
 * p->cand holds, per (thread, head), mid packed keys (topk_pack) or, when the thread scored the
 * whole row, the head's indices (int32, ascending); p->cand_n their count, -1 - count for the
 * latter. */
#include <math.h>
#include <omp.h>
#include <string.h>

#include "attn_impl.h"
#include "ops.h"
#include "topk.h"

/* Where thread t's share of the G rows of L = hi - lo tokens, laid end to end, starts: the
 * threads' shares cost the same, a row of group g costing cost[g] (its group's bytes in the TIP
 * copy differ), at a multiple of 16 tokens (a cache line of scores) within its row. */
static int tip_cut(const int *cost, int t, int nt, int G, int lo, int hi)
{
    const int L = hi - lo;
    int64_t all = 0;
    for (int g = 0; g < G; g++) all += (int64_t)cost[g] * L;
    int64_t left = all * t / nt;
    int g = 0;
    while (g < G - 1 && left >= (int64_t)cost[g] * L) left -= (int64_t)cost[g] * L, g++;
    const int64_t in = left / cost[g];
    int r = (lo + (int)(in < L ? in : L)) & ~15;
    return g * L + (r < lo ? 0 : r - lo);
}

/* Thread t's share [*p0, *p1) of the rows laid end to end. */
static void tip_share(const int *cost, int t, int nt, int G, int lo, int hi, int *p0, int *p1)
{
    *p0 = tip_cut(cost, t, nt, G, lo, hi);
    *p1 = t == nt - 1 ? G * (hi - lo) : tip_cut(cost, t + 1, nt, G, lo, hi);
}

/* The thread whose share holds group g's row whole, or -1 when the row is cut between threads. */
static int tip_owner(const int *cost, int g, int nt, int G, int lo, int hi)
{
    const int L = hi - lo;
    for (int t = 0; t < nt; t++) {
        int p0, p1;
        tip_share(cost, t, nt, G, lo, hi, &p0, &p1);
        if (p0 <= g * L && p1 >= (g + 1) * L) return t;
    }
    return -1;
}

/* TIP of heads h0..h0 + nh - 1 (of group g) over rows [a, b), into p->tip: from the 4-bit copy,
 * or from the contiguous dominant block. */
static void tip_heads(run_state *s, int l, int g, int h0, int nh, int a, int b, const float *tq, int ldq)
{
    policy *p = s->policy;
    float *out = p->tip + (size_t)h0 * p->tip_ld;
    if (p->o.tip_bits)
        kvcache_tip_scores(&s->kv, l, g, a, b, tq + (size_t)h0 * ldq, nh, ldq, out, p->tip_ld);
    else
        kvcache_scores(&s->kv, KV_KEYS, l, g, a, NULL, b - a, tq + (size_t)h0 * ldq, nh, ldq, 1.0f, out + a,
                       p->tip_ld);
}

/* TIP of group g's heads over rows [a, b). */
static void tip_rows(run_state *s, int l, int g, int a, int b, const float *tq, int ldq)
{
    const int grp = s->policy->m->cfg.n_head / s->policy->m->cfg.n_kv_head;
    tip_heads(s, l, g, g * grp, grp, a, b, tq, ldq);
}

/* The budget that sets itself (policy_opts.auto_mass), as policy_select chooses it: head h's
 * fewest rows of [lo, hi) whose mass, estimated from TIP's scores, reaches the target beside the
 * forced rows' (their scores computed here), at least the minimum and at most keep; ascending into
 * idx, their count. scratch: t1 entries. */
static int auto_rows(const model *m, run_state *s, int l, int h, int lo, int hi, int keep, const float *tq, int ldq,
                     int32_t *idx, uint64_t *scratch)
{
    policy *p = s->policy;
    const int t1 = s->n_past + 1, g = h / (m->cfg.n_head / m->cfg.n_kv_head), forced = lo + (t1 - hi);
    const float *row = p->tip + (size_t)h * p->tip_ld;
    if (lo > 0) tip_heads(s, l, g, h, 1, 0, lo, tq, ldq);   /* the sinks and the recent window */
    if (t1 > hi) tip_heads(s, l, g, h, 1, hi, t1, tq, ldq);
    float bar;
    const int c = policy_auto_count(row, t1, lo, hi, 1 / sqrtf((float)m->cfg.d_head), p->o.auto_mass,
                                    (float *)scratch, idx, &bar);
    const int least = p->o.auto_min - forced;
    if (c >= least && c <= keep) return c;
    const int n = topk_indices(row + lo, hi - lo, c < least ? least : keep, idx, scratch);
    for (int j = 0; j < n; j++) idx[j] += lo;
    return n;
}

/* Head h's picks of mid rows: whole from the thread that scored its row, or the best mid of the
 * threads' picks (keys: scratch); their count, the rows in *rows (idx or p->cand). */
static int head_picks(const policy *p, int h, int nt, int mid, int t1, int32_t *idx, uint64_t *keys,
                      const int32_t **rows)
{
    const int H = p->m->cfg.n_head;
    int n = 0;
    for (int i = 0; i < nt; i++) {
        const int ni = p->cand_n[(size_t)i * H + h];
        const uint64_t *cand = p->cand + ((size_t)i * H + h) * mid;
        if (ni < 0) return *rows = (const int32_t *)cand, -1 - ni;
        memcpy(keys + n, cand, sizeof *keys * ni), n += ni;
    }
    *rows = idx;
    return topk_keys(keys, n, mid, t1, idx);
}

/* Item it of the second half: head it (it < n_head) takes its rows and attends to them; item
 * n_head + 2 g + r attends to group g's sinks (r = 0) or recent window (r = 1). */
static void fasa_item(const model *m, run_state *s, int l, int it, int lo, int hi, int mid, int keep, int nt,
                      const float *tq, int ldq)
{
    const int H = m->cfg.n_head, t1 = s->n_past + 1, tid = omp_get_thread_num();
    policy *p = s->policy;
    if (it >= H) {
        const int g = (it - H) / 2, r = (it - H) % 2;
        attn_rows(m, s, l, g, r, r ? hi : 0, r ? t1 : lo);
        return;
    }
    int32_t *idx = p->idx + (size_t)tid * p->n_ctx;
    uint64_t *keys = p->keys + (size_t)tid * p->n_ctx;
    const int32_t *rows = idx;
    int k;
    if (p->o.auto_mass > 0) k = auto_rows(m, s, l, it, lo, hi, keep, tq, ldq, idx, keys);
    else k = head_picks(p, it, nt, mid, t1, idx, keys, &rows);
    if (k > keep && p->rr) {   /* rerank: the exact scores of TIP's picks keep the best */
        if (rows != idx) memcpy(idx, rows, sizeof *idx * k);
        s->bytes_kv[8 * tid] += (uint64_t)(k - keep) * m->cfg.d_head * kvcache_esz(&s->kv);
        k = policy_rerank(&s->kv, l, it / (H / m->cfg.n_kv_head), s->q + (size_t)it * m->cfg.d_head, idx, k, keep,
                          p->rr + (size_t)tid * POLICY_RR_FLOATS(p->n_ctx), keys);
        rows = idx;
    }
    attn_chosen(m, s, l, it, rows, k, lo, hi);
    policy_count(p, tid, k + lo + (t1 - hi));
}

/* Group g under group_rerank: the union of its heads' picks, whose keys are read once (the
 * group's heads score them one after another while they stay in cache), and each head attends
 * to the best keep of it by exact scores. */
static void group_item(const model *m, run_state *s, int l, int g, int lo, int hi, int mid, int keep, int nt)
{
    const int H = m->cfg.n_head, grp = H / m->cfg.n_kv_head, d = m->cfg.d_head, t1 = s->n_past + 1;
    const int tid = omp_get_thread_num();
    policy *p = s->policy;
    int32_t *idx = p->idx + (size_t)tid * p->n_ctx;
    uint64_t *keys = p->keys + (size_t)tid * p->n_ctx;
    float *rr = p->rr + (size_t)tid * POLICY_RR_FLOATS(p->n_ctx);
    int32_t *U = (int32_t *)(rr + 4 * (size_t)p->n_ctx);
    uint8_t *mark = POLICY_RR_MARK(rr, p->n_ctx);
    for (int h = g * grp; h < (g + 1) * grp; h++) {
        const int32_t *rows;
        const int k = head_picks(p, h, nt, mid, t1, idx, keys, &rows);
        for (int j = 0; j < k; j++) mark[rows[j]] = 1;
    }
    const int u = policy_marked(mark, lo, hi, U);
    s->bytes_kv[8 * tid] += (uint64_t)u * d * kvcache_esz(&s->kv);
    for (int h = g * grp; h < (g + 1) * grp; h++) {
        memcpy(idx, U, sizeof *idx * u);
        const int k = u > keep ? policy_rerank(&s->kv, l, g, s->q + (size_t)h * d, idx, u, keep, rr, keys) : u;
        attn_chosen(m, s, l, h, idx, k, lo, hi);
        policy_count(p, tid, k + lo + (t1 - hi));
    }
}

void fasa_decode(const model *m, run_state *s, int l, int lo, int hi, int mid, int keep, const float *tq, int ldq,
                 int threads)
{
    const model_config *c = &m->cfg;
    policy *p = s->policy;
    const int H = c->n_head, G = c->n_kv_head, grp = H / G, L = hi - lo;
    /* a row's cost: its bytes in the copy (or 1 each), and its group's scores written and read */
    int cost[G];
    for (int g = 0; g < G; g++) cost[g] = (p->o.tip_bits ? (int)kvcache_tip_row_bytes(&s->kv, l, g) : 1) + 4 * grp;
#pragma omp parallel num_threads(threads)
    {
        const int tid = omp_get_thread_num(), nt = omp_get_num_threads();
        int32_t *idx = p->idx + (size_t)tid * p->n_ctx;
        uint64_t *keys = p->keys + (size_t)tid * p->n_ctx;
        int *cn = p->cand_n + (size_t)tid * H;
        for (int h = 0; h < H; h++) cn[h] = 0;
        int p0, p1;
        if (p->o.tail)   /* the tail's mean values, once per group (its heads' tails read them) */
            for (int g = tid; g < G; g += nt)
                kvcache_value_mean(&s->kv, l, g, s->n_past + 1, s->attn->vmean + (size_t)g * c->d_head);
        tip_share(cost, tid, nt, G, lo, hi, &p0, &p1);
        for (int g = p0 / L; g < G && g * L < p1; g++) {
            const int a = lo + (p0 > g * L ? p0 - g * L : 0), b = lo + (p1 < (g + 1) * L ? p1 - g * L : L);
            if (b <= a) continue;
            tip_rows(s, l, g, a, b, tq, ldq);
            s->bytes_kv[8 * tid] += attn_select_bytes(p, &s->kv, l, g, b - a);
            for (int h = g * grp; h < (g + 1) * grp; h++) {
                if (p->o.auto_mass > 0) {   /* chosen after the barrier, when the whole row is scored */
                    cn[h] = a == lo && b == hi ? -1 : 0;
                    continue;
                }
                const float *row = p->tip + (size_t)h * p->tip_ld + a;
                uint64_t *cand = p->cand + ((size_t)tid * H + h) * mid;
                const int n = topk_indices(row, b - a, mid, idx, keys);
                if (a == lo && b == hi) {   /* the whole row: these are the head's rows */
                    int32_t *out = (int32_t *)cand;
                    for (int j = 0; j < n; j++) out[j] = lo + idx[j];
                    cn[h] = -1 - n;
                    /* its rows are read after the barrier: on their way meanwhile (attn_chosen
                     * prefetches them again, which measured faster than relying on this alone:
                     * 1,024 lines per head are more than stay in flight, or in cache, while TIP
                     * streams the next group) */
                    kvcache_prefetch(&s->kv, l, g, out, n);
                } else {
                    for (int j = 0; j < n; j++) cand[j] = topk_pack(row[idx[j]], (uint32_t)(a + idx[j]));
                    cn[h] = n;
                }
            }
        }
#pragma omp barrier
        if (p->o.group_rerank > 0) {   /* the groups (the heads together) and their forced rows */
#pragma omp for schedule(dynamic, 1) nowait
            for (int j = 0; j < 3 * G; j++) {
                if (j >= G && j < 2 * G) group_item(m, s, l, j - G, lo, hi, mid, keep, nt);
                else fasa_item(m, s, l, j < G ? H + 2 * j + 1 : H + 2 * (j - 2 * G), lo, hi, mid, keep, nt, tq, ldq);
            }
        } else {
            /* the heads and the groups' forced rows: a head whose whole row this thread selected stays
             * here (its picks are in this core's cache); the rest, the recent windows first, then the
             * cut heads, the sinks last, go to whichever thread is free */
            for (int h = 0; h < H; h++)
                if (cn[h] < 0) fasa_item(m, s, l, h, lo, hi, mid, keep, nt, tq, ldq);
#pragma omp for schedule(dynamic, 1) nowait
            for (int j = 0; j < G + H + G; j++) {
                if (j >= G && j < G + H && tip_owner(cost, (j - G) / grp, nt, G, lo, hi) >= 0) continue;
                fasa_item(m, s, l, j < G ? H + 2 * j + 1 : j < G + H ? j - G : H + 2 * (j - G - H), lo, hi, mid, keep,
                          nt, tq, ldq);
            }
        }
    }
    attn_merge(m, s, p->o.tail ? 4 : 3);
}

void fasa_tip_all(const model *m, run_state *s, int l, const float *tq, int ldq)
{
    const int t1 = s->n_past + 1, P = decode_parts(t1);
    /* parts cut at multiples of 16 rows: the copy's tiles are never shared between threads */
#pragma omp parallel for schedule(dynamic, 1) num_threads(ops_threads()) if (t1 >= DECODE_PARALLEL_MIN)
    for (int it = 0; it < m->cfg.n_kv_head * P; it++) {
        const int g = it / P, part = it % P;
        const int a = part ? (int)((int64_t)part * t1 / P) & ~15 : 0;
        const int b = part + 1 < P ? (int)((int64_t)(part + 1) * t1 / P) & ~15 : t1;
        if (b > a) tip_rows(s, l, g, a, b, tq, ldq);
    }
}

const float *fasa_tip_queries(const model *m, const run_state *s, int l, int *ldq)
{
    const policy *p = s->policy;
    const int H = m->cfg.n_head, dh = m->cfg.d_head, ns = s->kv.n_split, nd = p->n_dom;
    *ldq = dh;
    if (p->o.tip_bits) {   /* each head's own dims at their places in the copy */
        for (int h = 0; h < H; h++)
            policy_tip_query(p, l, h, s->q + (size_t)h * dh, p->tipq + (size_t)h * p->tip_width);
        *ldq = p->tip_width;
        return p->tipq;
    }
    if (p->o.block != 2) return s->q;
    memset(p->tipq, 0, sizeof(float) * H * ns);
    for (int h = 0; h < H; h++) {
        const int16_t *dom = p->dom + ((size_t)l * H + h) * nd;
        for (int j = 0; j < nd; j++) p->tipq[(size_t)h * ns + dom[j]] = s->q[(size_t)h * dh + dom[j]];
    }
    *ldq = ns;
    return p->tipq;
}

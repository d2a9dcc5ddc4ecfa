/* topk.h - O(n) top-k selection over float scores, deterministic under ties (lower index wins).
 *
 *   int n_sel = topk_indices(scores, n, k, idx, scratch);   // idx ascending, scratch: n entries
 */
#ifndef FASA_TOPK_H
#define FASA_TOPK_H

#include <stdint.h>
#include <string.h>

/* A score and its index in one integer that orders like (score desc, index asc). */
static inline uint64_t topk_pack(float s, uint32_t i)
{
    uint32_t u;
    memcpy(&u, &s, 4);
    u = (u & 0x80000000u) ? ~u : u | 0x80000000u;
    return (uint64_t)u << 32 | (uint32_t)~i;
}
static inline uint32_t topk_index(uint64_t key) { return ~(uint32_t)key; }

/* Afterwards a[0..k) hold the k largest keys of a[0..n), in no particular order. */
void topk_select(uint64_t *a, int n, int k);

/* Smallest and largest of x[0..n); returns 1 when there is no NaN and their difference is finite
 * and positive. */
int topk_minmax(const float *x, int n, float *mn, float *mx);

/* The bin of s >= mn among nbins over [mn, mn + (nbins - 1) / scale], clamped as a float before
 * the conversion: neither rounding nor a scale that overflowed (a subnormal range; then everything
 * lands in the last bin) can index past the last bin. */
static inline int topk_bin(float s, float mn, float scale, int nbins)
{
    const float x = (s - mn) * scale;
    return x < nbins - 1 ? (int)x : nbins - 1;
}

/* The min(k, n) best of n scores, as ascending indices (idx: room for min(k, n); scratch for n).
 * Returns the count. */
int topk_indices(const float *score, int n, int k, int32_t *idx, uint64_t *scratch);

/* The min(k, n) best of n packed keys (topk_pack of distinct indices below n_index), as ascending
 * indices.
 * key[] is overwritten and must hold max(n, (n_index + 63) / 64) entries. Returns the count. */
int topk_keys(uint64_t *key, int n, int k, int n_index, int32_t *idx);

/* The fewest of the n masses e (0 <= e <= 1, summing to total) that sum to need, as a cut:
 * returns their count, and *bar such that they are the e >= *bar (masses tied at the cut all
 * count). None (0, *bar = +inf) when need <= 0; all n (*bar = -inf) when need >= total. Those
 * under (total - need) / n cannot be needed and are dropped first; then a bisection on the
 * masses' float bits (on their logarithm: as on the scores they come from), each step one vector
 * pass summing those at or above it, over only those once they are a quarter of the rest.
 * buf: n floats. */
int topk_mass_cut(const float *e, int n, double total, double need, float *bar, float *buf);

/* The indices of x[0..n) >= bar, ascending, into idx; their count. */
int topk_at_least(const float *x, int n, float bar, int32_t *idx);

#endif

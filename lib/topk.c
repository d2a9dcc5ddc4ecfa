#include "topk.h"

#include <string.h>

void topk_select(uint64_t *a, int n, int k)
{
    int lo = 0, hi = n - 1;
    if (k <= 0 || k >= n) return;
    while (lo < hi) {
        int mid = lo + (hi - lo) / 2;   /* median of three: sorted or reversed input stays O(n) */
        uint64_t x = a[lo], y = a[mid], z = a[hi];
        uint64_t piv = x > y ? (y > z ? y : (x > z ? z : x)) : (x > z ? x : (y > z ? z : y));
        int i = lo, j = hi;
        while (i <= j) {
            while (a[i] > piv) i++;
            while (a[j] < piv) j--;
            if (i <= j) {
                uint64_t t = a[i];
                a[i++] = a[j];
                a[j--] = t;
            }
        }
        if (k - 1 <= j) hi = j;
        else if (k - 1 >= i) lo = i;
        else break;
    }
}

int topk_indices(const float *score, int n, int k, int32_t *idx, uint64_t *scratch)
{
    if (k > n) k = n;
    for (int i = 0; i < n; i++) scratch[i] = topk_pack(score[i], (uint32_t)i);
    topk_select(scratch, n, k);
    for (int j = 0; j < k; j++) idx[j] = (int32_t)topk_index(scratch[j]);
    /* ascending order through a bitmap in the (now free) scratch: O(n/64 + k), no sort */
    const int words = (n + 63) / 64;
    memset(scratch, 0, sizeof *scratch * words);
    for (int j = 0; j < k; j++) scratch[idx[j] >> 6] |= 1ull << (idx[j] & 63);
    int m = 0;
    for (int w = 0; w < words; w++)
        for (uint64_t bits = scratch[w]; bits; bits &= bits - 1) idx[m++] = w * 64 + __builtin_ctzll(bits);
    return k;
}

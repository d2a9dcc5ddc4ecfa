#include "topk.h"

#include <math.h>
#include <string.h>
#ifdef __AVX2__
#include <immintrin.h>
#endif

void topk_select(uint64_t *a, int n, int k)
{
    int lo = 0, hi = n - 1;
    if (k <= 0 || k >= n) return;
    /* pivots: the median of three pseudo-random positions, so no input order (sorted runs with
     * interleaved outliers, as attention scores with many exact zeros give) makes it quadratic;
     * keys are distinct, so the selected set does not depend on the pivots */
    uint64_t rng = 0x9E3779B97F4A7C15ull ^ (uint64_t)n;
    while (lo < hi) {
        const uint64_t span = (uint64_t)(hi - lo + 1);
        rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
        const int p0 = lo + (int)(rng % span), p1 = lo + (int)((rng >> 21) % span), p2 = lo + (int)((rng >> 42) % span);
        uint64_t x = a[p0], y = a[p1], z = a[p2];
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

/* The k-th largest of a[0..n) (1 <= k <= n); a is reordered as by topk_select. */
static uint64_t kth_largest(uint64_t *a, int n, int k)
{
    topk_select(a, n, k);
    uint64_t v = a[0];
    for (int j = 1; j < k; j++) v = a[j] < v ? a[j] : v;
    return v;
}

/* A float's bits as an int32 that orders as the floats do (not NaN; -0 below +0, as topk_pack). */
static inline int32_t fkey(float x)
{
    int32_t u;
    memcpy(&u, &x, 4);
    return u >= 0 ? u : u ^ 0x7FFFFFFF;
}

static inline float fkey_value(int32_t u)
{
    u = u >= 0 ? u : u ^ 0x7FFFFFFF;
    float x;
    memcpy(&x, &u, 4);
    return x;
}

/* How many of v[0..n) are >= t. */
static int count_ge(const int32_t *v, int n, int32_t t)
{
    int c = 0, i = 0;
#ifdef __AVX512F__
    const __m512i wt = _mm512_set1_epi32(t);
    for (; i + 16 <= n; i += 16)
        c += __builtin_popcount(_mm512_cmpge_epi32_mask(_mm512_loadu_si512(v + i), wt));
    if (i < n) {
        const __mmask16 tail = (__mmask16)((1u << (n - i)) - 1);
        c += __builtin_popcount(_mm512_mask_cmpge_epi32_mask(tail, _mm512_maskz_loadu_epi32(tail, v + i), wt));
    }
    return c;
#elif defined(__AVX2__)
    const __m256i vt = _mm256_set1_epi32(t);
    __m256i below = _mm256_setzero_si256();   /* minus the count of v < t, per lane */
    for (; i + 8 <= n; i += 8)
        below = _mm256_add_epi32(below, _mm256_cmpgt_epi32(vt, _mm256_loadu_si256((const __m256i *)(v + i))));
    int32_t l[8];
    _mm256_storeu_si256((__m256i *)l, below);
    c = i;
    for (int j = 0; j < 8; j++) c += l[j];
#endif
    for (; i < n; i++) c += v[i] >= t;
    return c;
}

/* The largest of v[0..n) at or below t (INT32_MIN when there is none). */
static int32_t max_at_most(const int32_t *v, int n, int32_t t)
{
    int32_t mx = INT32_MIN;
    int i = 0;
#ifdef __AVX2__
    const __m256i vt = _mm256_set1_epi32(t), lowest = _mm256_set1_epi32(INT32_MIN);
    __m256i vm = lowest;
    for (; i + 8 <= n; i += 8) {   /* those above t count as INT32_MIN */
        const __m256i x = _mm256_loadu_si256((const __m256i *)(v + i));
        vm = _mm256_max_epi32(vm, _mm256_blendv_epi8(x, lowest, _mm256_cmpgt_epi32(x, vt)));
    }
    int32_t a[8];
    _mm256_storeu_si256((__m256i *)a, vm);
    for (int j = 0; j < 8; j++) mx = a[j] > mx ? a[j] : mx;
#endif
    for (; i < n; i++) mx = v[i] <= t && v[i] > mx ? v[i] : mx;
    return mx;
}

/* A cut t with exactly k of v[0..n) at or above it when there is one, else the k-th largest
 * (then values equal to it straddle the k-th place); *c: how many are >= t. A bisection on the
 * value, each step one vector count and no data-dependent branch (a quickselect over a few hundred
 * keys mispredicts about every other compare); it stops at the first t that cuts at k, about
 * log2(n) steps for spread values instead of up to 32. A value repeated at the k-th place (as a
 * tiled cache gives) leaves no such t: there, once a step splits off nothing and few values are
 * left between the bounds, the largest of them is tried as the answer, which it is when it alone
 * reaches k (it had kept bisecting to the last of 32 steps). 1 <= k <= n. */
static int32_t key_cut(const int32_t *v, int n, int k, int *c)
{
    int32_t mn = v[0], mx = v[0];
    int i = 0;
#ifdef __AVX2__
    __m256i vmn = _mm256_set1_epi32(mn), vmx = vmn;
    for (; i + 8 <= n; i += 8) {
        const __m256i x = _mm256_loadu_si256((const __m256i *)(v + i));
        vmn = _mm256_min_epi32(vmn, x), vmx = _mm256_max_epi32(vmx, x);
    }
    int32_t a[8], b[8];
    _mm256_storeu_si256((__m256i *)a, vmn), _mm256_storeu_si256((__m256i *)b, vmx);
    for (int j = 0; j < 8; j++) mn = a[j] < mn ? a[j] : mn, mx = b[j] > mx ? b[j] : mx;
#endif
    for (; i < n; i++) mn = v[i] < mn ? v[i] : mn, mx = v[i] > mx ? v[i] : mx;
    int64_t lo = mn, hi = mx;   /* count_ge(lo) = c_lo >= k > count_ge(hi + 1) = c_hi throughout */
    int c_lo = n, c_hi = 0;
    while (lo < hi && c_lo != k) {
        const int64_t mid = lo + (hi - lo + 1) / 2;
        const int cm = count_ge(v, n, (int32_t)mid), same = cm == c_lo || cm == c_hi;
        if (cm >= k) lo = mid, c_lo = cm;
        else hi = mid - 1, c_hi = cm;
        if (same && lo < hi && c_lo - c_hi <= 16) {
            const int32_t x = max_at_most(v, n, (int32_t)hi);   /* in [lo, hi]: c_lo > c_hi */
            const int cx = count_ge(v, n, x);
            if (cx >= k) {
                lo = x, c_lo = cx;
                break;
            }
            hi = x - 1, c_hi = cx;
        }
    }
    *c = c_lo;
    return (int32_t)lo;
}

int topk_minmax(const float *x, int n, float *mn_out, float *mx_out)
{
    float mn = x[0], mx = x[0];
    int i = 0;
#ifdef __AVX2__
    if (n >= 8) {
        /* min/max return their second operand when one is NaN, which would drop the lane's
         * extreme seen so far: NaN is tracked on its own */
        __m256 vmn = _mm256_loadu_ps(x), vmx = vmn, vnan = _mm256_cmp_ps(vmn, vmn, _CMP_UNORD_Q);
        for (i = 8; i + 8 <= n; i += 8) {
            __m256 v = _mm256_loadu_ps(x + i);
            vmn = _mm256_min_ps(vmn, v), vmx = _mm256_max_ps(vmx, v);
            vnan = _mm256_or_ps(vnan, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
        }
        if (_mm256_movemask_ps(vnan)) return 0;
        float a[8], b[8];
        _mm256_storeu_ps(a, vmn), _mm256_storeu_ps(b, vmx);
        for (int j = 0; j < 8; j++) mn = a[j] < mn ? a[j] : mn, mx = b[j] > mx ? b[j] : mx;
    }
#endif
    for (; i < n; i++) {
        if (x[i] != x[i]) return 0;
        mn = x[i] < mn ? x[i] : mn, mx = x[i] > mx ? x[i] : mx;
    }
    *mn_out = mn, *mx_out = mx;
    const float range = mx - mn;
    return range > 0 && range < 3e38f;   /* 0: NaN, infinite or all equal */
}

/* Histogram select (the bins are a monotone map of the scores, so they never reorder them): the
 * bin holding the k-th largest is found from counts, and only its tokens are ranked by packed
 * key. Returns -1 when the scores do not spread over the bins (NaN, infinities, huge outliers such
 * as forced tokens, or one bin holding an eighth of everything): the quickselect takes over. */
#define HBINS 1024
static int topk_hist(const float *score, int n, int k, int32_t *idx, uint64_t *scratch)
{
    float mn, mx;
    if (!topk_minmax(score, n, &mn, &mx)) return -1;
    const float scale = (HBINS - 1) / (mx - mn);
    uint32_t hist[HBINS] = { 0 };
    for (int i = 0; i < n; i++) hist[topk_bin(score[i], mn, scale, HBINS)]++;
    int B = HBINS - 1, above = 0;
    while (above + (int)hist[B] < k) above += hist[B--];
    if ((int)hist[B] > n / 8) return -1;
    int nb = 0;
    for (int i = 0; i < n; i++) {
        if (topk_bin(score[i], mn, scale, HBINS) == B) scratch[nb++] = topk_pack(score[i], (uint32_t)i);
    }
    const int need = k - above;
    const uint64_t thr = kth_largest(scratch, nb, need);
    int m = 0;
    for (int i = 0; i < n; i++) {
        const int b = topk_bin(score[i], mn, scale, HBINS);
        if (b > B || (b == B && topk_pack(score[i], (uint32_t)i) >= thr)) idx[m++] = i;
    }
    return m;
}

/* Which of x[0..64) are not below t (NaN is not below), as the bits of a mask: the filter's
 * candidates are a few percent, so their bits are walked (packing every vector with a compress
 * measured 2x slower on this machine's kind). */
static inline uint64_t not_below64(const float *x, float t)
{
    uint64_t bits = 0;
#ifdef __AVX512F__
    const __m512 wt = _mm512_set1_ps(t);
    for (int q = 0; q < 4; q++)
        bits |= (uint64_t)_mm512_cmp_ps_mask(_mm512_loadu_ps(x + 16 * q), wt, _CMP_NLT_UQ) << 16 * q;
#elif defined(__AVX2__)
    const __m256 vt = _mm256_set1_ps(t);
    for (int q = 0; q < 8; q++)
        bits |= (uint64_t)(unsigned)_mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(x + 8 * q), vt, _CMP_NLT_UQ))
                << 8 * q;
#else
    for (int q = 0; q < 64; q++) bits |= (uint64_t)!(x[q] < t) << q;
#endif
    return bits;
}

/* The indices of score[0..n) not below t, ascending, into cand; returns their count. */
static int not_below_all(const float *score, int n, float t, int32_t *cand)
{
    int m = 0, i = 0;
    for (; i + 64 <= n; i += 64)
        for (uint64_t bits = not_below64(score + i, t); bits; bits &= bits - 1) cand[m++] = i + __builtin_ctzll(bits);
    for (; i < n; i++) cand[m] = i, m += !(score[i] < t);
    return m;
}

/* The k best of the m scores score[cand[j]] (cand ascending), as their indices into idx, ascending;
 * key: room for m int32. -1 on NaN. 1 <= k <= m. */
static int top_among(const float *score, const int32_t *cand, int m, int k, int32_t *idx, int32_t *key)
{
    int nan = 0, c, j;
    for (j = 0; j < m; j++) {   /* the candidates' keys (fkey) */
        const float x = score[cand[j]];
        nan |= x != x;
        key[j] = fkey(x);
    }
    if (nan) return -1;
    const int32_t t = key_cut(key, m, k, &c);
    /* keep those above t and, of those equal to it, the first `ties` (the lower index wins, as
     * topk_pack orders them) */
    int ties = c == k || t == INT32_MAX ? k : k - count_ge(key, m, t + 1), out = 0;
    j = 0;
#if defined(__AVX512F__) && defined(__BMI2__)
    {   /* 16 at a time: pdep keeps the lowest `ties` bits of the equal ones */
        const __m512i wk = _mm512_set1_epi32(t);
        for (; j + 16 <= m; j += 16) {
            const __m512i x = _mm512_loadu_si512(key + j);
            const unsigned eq = _mm512_cmpeq_epi32_mask(x, wk);
            const unsigned take_eq = _pdep_u32(ties >= 16 ? 0xFFFFu : (1u << ties) - 1, eq);
            const __mmask16 in = (__mmask16)(_mm512_cmpgt_epi32_mask(x, wk) | take_eq);
            const int cnt = __builtin_popcount(in);
            _mm512_mask_storeu_epi32(idx + out, (__mmask16)((1u << cnt) - 1),
                                     _mm512_maskz_compress_epi32(in, _mm512_loadu_si512(cand + j)));
            out += cnt, ties -= __builtin_popcount(take_eq);
        }
    }
#endif
    for (; j < m && out < k; j++) {   /* exactly k are taken: none after the k-th (idx holds k) */
        const int eq = key[j] == t, take = key[j] > t || (eq && ties > 0);
        ties -= eq & take;
        idx[out] = cand[j], out += take;
    }
    return out;
}

/* Sampled threshold, for k well below n (FASA's budget over a long cache): the scores at 256
 * spread positions give a value that about 1.5 k + 64 scores should reach; one vector pass
 * keeps every score >= it (a superset of the top k when there are at least k of them, since every
 * score left out is smaller than every one kept), and the exact top k is selected among those few.
 * Returns -1 when the guess keeps fewer than k or more than n / 4, or on NaN: the caller falls
 * back. Every step is branch-free over the data: on scores that change from call to call (TIP's,
 * a new query each step) branches on them mispredicted often enough to triple its time. */
#define TSAMPLE 256
static int topk_sampled(const float *score, int n, int k, int32_t *idx, uint64_t *scratch)
{
    /* one position in each of 256 equal strata, jittered by a 16-bit hash of the stratum so that
     * periodic scores are not sampled in phase (n < 2^23: every product fits in 32 bits) */
    int32_t smp[TSAMPLE];
    int nan = 0, j = 0;
#ifdef __AVX512F__
    const __m512i lane = _mm512_setr_epi32(1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16);
    const __m512i wn = _mm512_set1_epi32(n), golden = _mm512_set1_epi32((int32_t)2654435761u);
    const __m512i flip = _mm512_set1_epi32(0x7FFFFFFF);
    for (; j < TSAMPLE; j += 16) {
        const __m512i j1 = _mm512_add_epi32(lane, _mm512_set1_epi32(j));   /* stratum + 1 */
        const __m512i lo = _mm512_srli_epi32(_mm512_mullo_epi32(_mm512_sub_epi32(j1, _mm512_set1_epi32(1)), wn), 8);
        const __m512i hi = _mm512_srli_epi32(_mm512_mullo_epi32(j1, wn), 8);
        const __m512i h = _mm512_srli_epi32(_mm512_mullo_epi32(j1, golden), 16);
        const __m512i off = _mm512_srli_epi32(_mm512_mullo_epi32(h, _mm512_sub_epi32(hi, lo)), 16);
        const __m512i pos = _mm512_add_epi32(lo, off);
        const __m512 x = _mm512_i32gather_ps(pos, score, 4);
        nan |= _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q) != 0;
        const __m512i u = _mm512_castps_si512(x);
        _mm512_storeu_si512(smp + j, _mm512_mask_xor_epi32(u, _mm512_movepi32_mask(u), u, flip));   /* fkey */
    }
#endif
    for (; j < TSAMPLE; j++) {
        const uint32_t lo = (uint32_t)j * (uint32_t)n >> 8, hi = (uint32_t)(j + 1) * (uint32_t)n >> 8;
        const uint32_t h = (uint32_t)(j + 1) * 2654435761u >> 16;
        const float x = score[lo + (h * (hi - lo) >> 16)];
        nan |= x != x;
        smp[j] = fkey(x);
    }
    int r = (int)((int64_t)TSAMPLE * (3 * k / 2 + 64) / n) + 1;   /* sample rank of the guess */
    if (nan || r >= TSAMPLE / 4) return -1;
    /* the candidates' indices, ascending, in scratch; a NaN (unordered: "not less") is let in and
     * found below. A guess that keeps fewer than k (a low sample rank leaves a wide spread: about
     * one call in eight at rank 2) is lowered to four times its rank and the pass repeated, once or
     * twice, before anything else is tried. */
    int32_t *cand = (int32_t *)scratch, *key = cand + n;   /* 2 n int32 in scratch: n >= 1024 */
    int c, m = not_below_all(score, n, fkey_value(key_cut(smp, TSAMPLE, r, &c)), cand);
    while (m < k && 4 * r < TSAMPLE / 4)
        r *= 4, m = not_below_all(score, n, fkey_value(key_cut(smp, TSAMPLE, r, &c)), cand);
    if (m < k || m > n / 4) return -1;
    return top_among(score, cand, m, k, idx, key);
}

int topk_indices(const float *score, int n, int k, int32_t *idx, uint64_t *scratch)
{
    if (k > n) k = n;
    if (n >= 1024 && n < 1 << 23 && k <= n / 6) {   /* (it gives up early when its sample cannot resolve k) */
        int m = topk_sampled(score, n, k, idx, scratch);
        if (m >= 0) return m;
    }
    if (n >= 1024 && k < n) {
        int m = topk_hist(score, n, k, idx, scratch);
        if (m >= 0) return m;
    }
    if (n < 1024 && k >= 1 && k < n) {   /* a short row (a rerank's candidates): one cut over its keys */
        int32_t *cand = (int32_t *)scratch, *key = cand + n;
        for (int i = 0; i < n; i++) cand[i] = i;
        int m = top_among(score, cand, n, k, idx, key);
        if (m >= 0) return m;
    }
    for (int i = 0; i < n; i++) scratch[i] = topk_pack(score[i], (uint32_t)i);
    return topk_keys(scratch, n, k, n, idx);
}

/* How many of a[0..n) are >= t. */
static int count_ge64(const uint64_t *a, int n, uint64_t t)
{
    int c = 0, i = 0;
#ifdef __AVX512F__
    const __m512i wt = _mm512_set1_epi64((long long)t);
    for (; i + 8 <= n; i += 8) c += __builtin_popcount(_mm512_cmpge_epu64_mask(_mm512_loadu_si512(a + i), wt));
#endif
    for (; i < n; i++) c += a[i] >= t;
    return c;
}

/* *t: the k-th largest of a[0..n), found as key_cut finds its cut (a branch-free bisection that
 * stops at exactly k at or above it). Returns 0 when no value cuts at k (repeated keys). */
static int cut64(const uint64_t *a, int n, int k, uint64_t *t)
{
    uint64_t lo = a[0], hi = a[0];
    for (int i = 1; i < n; i++) lo = a[i] < lo ? a[i] : lo, hi = a[i] > hi ? a[i] : hi;
    int c_lo = n;   /* count_ge64(lo) >= k throughout */
    while (lo < hi && c_lo != k) {
        const uint64_t mid = lo + (hi - lo) / 2 + 1;   /* in (lo, hi], with no overflow */
        const int cm = count_ge64(a, n, mid);
        if (cm >= k) lo = mid, c_lo = cm;
        else hi = mid - 1;
    }
    *t = lo;
    return c_lo == k;
}

int topk_keys(uint64_t *key, int n, int k, int n_index, int32_t *idx)
{
    if (k > n) k = n;
    if (k <= 0) return 0;
    uint64_t t = 0;
    int m = 0;
    if (k < n && !cut64(key, n, k, &t)) {   /* repeated keys (not topk_pack's of distinct indices) */
        topk_select(key, n, k);
        for (; m < k; m++) idx[m] = (int32_t)topk_index(key[m]);
    } else {   /* the k keys >= t */
        int i = 0;
#ifdef __AVX512F__
        const __m512i wt = _mm512_set1_epi64((long long)t);
        for (; i + 8 <= n; i += 8) {
            const __mmask8 in = _mm512_cmpge_epu64_mask(_mm512_loadu_si512(key + i), wt);
            const int cnt = __builtin_popcount(in);
            const __m256i ix = _mm512_cvtepi64_epi32(_mm512_maskz_compress_epi64(in, _mm512_loadu_si512(key + i)));
            _mm256_mask_storeu_epi32(idx + m, (__mmask8)((1u << cnt) - 1), _mm256_xor_si256(ix, _mm256_set1_epi32(-1)));
            m += cnt;
        }
#endif
        for (; i < n; i++)
            if (key[i] >= t) idx[m++] = (int32_t)topk_index(key[i]);
    }
    /* ascending order through a bitmap in the (now free) keys: O(n_index/64 + k), no sort */
    const int words = (n_index + 63) / 64;
    memset(key, 0, sizeof *key * words);
    for (int j = 0; j < k; j++) key[idx[j] >> 6] |= 1ull << (idx[j] & 63);
    m = 0;
    for (int w = 0; w < words; w++)
        for (uint64_t bits = key[w]; bits; bits &= bits - 1) idx[m++] = w * 64 + __builtin_ctzll(bits);
    return k;
}

/* How many of e[0..n) are >= t, and their sum, into *c and *m. */
static void mass_ge(const float *e, int n, float t, int *c, double *m)
{
    int i = 0, cnt = 0;
    double sum = 0;
#ifdef __AVX512F__
    const __m512 vt = _mm512_set1_ps(t);
    __m512 acc = _mm512_setzero_ps();
    __m512i vc = _mm512_setzero_si512();
    for (; i + 16 <= n; i += 16) {
        const __m512 v = _mm512_loadu_ps(e + i);
        const __mmask16 in = _mm512_cmp_ps_mask(v, vt, _CMP_GE_OQ);
        acc = _mm512_mask_add_ps(acc, in, acc, v);
        vc = _mm512_mask_sub_epi32(vc, in, vc, _mm512_set1_epi32(-1));
    }
    sum = _mm512_reduce_add_ps(acc), cnt = _mm512_reduce_add_epi32(vc);
#endif
    for (; i < n; i++)
        if (e[i] >= t) sum += e[i], cnt++;
    *c = cnt, *m = sum;
}

static inline float bits_float(int32_t u)
{
    float x;
    memcpy(&x, &u, 4);
    return x;
}

/* The e[0..n) >= t, to the front of out (which may be e: it moves them down); their count. */
static int compact_ge(const float *e, int n, float t, float *out)
{
    int k = 0, i = 0;
#ifdef __AVX512F__
    const __m512 vt = _mm512_set1_ps(t);
    for (; i + 16 <= n; i += 16) {
        const __m512 v = _mm512_loadu_ps(e + i);
        const __mmask16 in = _mm512_cmp_ps_mask(v, vt, _CMP_GE_OQ);
        _mm512_mask_compressstoreu_ps(out + k, in, v);
        k += __builtin_popcount(in);
    }
#endif
    for (; i < n; i++)
        if (e[i] >= t) out[k++] = e[i];
    return k;
}

int topk_mass_cut(const float *e, int n, double total, double need, float *bar, float *buf)
{
    *bar = INFINITY;
    if (n <= 0 || !(need > 0)) return 0;
    if (!(need < total)) {   /* all of them */
        *bar = -INFINITY;
        return n;
    }
    /* those under (total - need) / n sum to less than total - need: the rest reach need, and
     * only they take part (for a peaked softmax a few of the n) */
    const float floor = (float)((total - need) / n * (1 - 1e-6));
    int cn = compact_ge(e, n, floor, buf);
    /* a: a cut the masses reach (c_a of them at or above it), b: one they do not (c_b), as float
     * bits (which order as the floats do, >= 0): the fewest are c_a once c_a = c_b + 1, or when
     * a and b are adjacent floats (masses tied at the cut: all of them count). The bits' middle
     * is about the geometric mean: the bisection halves the range of log-mass, as of the score. */
    int32_t a, b;
    const float one = 1.0f;
    memcpy(&a, &floor, 4), memcpy(&b, &one, 4);
    b++;
    int c_a = cn, c_b = 0;
    while (c_a - c_b > 1 && b - a > 1) {
        const int32_t t = a + (b - a) / 2;
        int c;
        double m;
        mass_ge(buf, cn, bits_float(t), &c, &m);
        if (m >= need) a = t, c_a = c;
        else b = t, c_b = c;
        if (c_a <= cn / 4) cn = compact_ge(buf, cn, bits_float(a), buf);   /* only those >= a from here on */
    }
    *bar = bits_float(a);
    return c_a;
}

int topk_at_least(const float *x, int n, float bar, int32_t *idx)
{
    int i = 0, k = 0;
#ifdef __AVX512F__
    const __m512 vt = _mm512_set1_ps(bar);
    const __m512i step = _mm512_set1_epi32(16);
    __m512i ix = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    for (; i + 16 <= n; i += 16, ix = _mm512_add_epi32(ix, step)) {
        const __mmask16 in = _mm512_cmp_ps_mask(_mm512_loadu_ps(x + i), vt, _CMP_GE_OQ);
        _mm512_mask_compressstoreu_epi32(idx + k, in, ix);
        k += __builtin_popcount(in);
    }
#endif
    for (; i < n; i++)
        if (x[i] >= bar) idx[k++] = i;
    return k;
}

/* fasa_cuda_math.h - the per-element arithmetic of every CUDA kernel, shared with the CPU.
 *
 *   float s = fasa_tip_score(qdom, kdom_row, n_dom);            // TIP: 2F dims, f16 keys
 *   fasa_softmax st = fasa_softmax_init();
 *   fasa_softmax_push(&st, s, &alpha, &p);  acc = fasa_acc_push(acc, alpha, p, v);
 *   fasa_softmax_merge(&a, b, &wa, &wb);    acc = fasa_acc_merge(acc_a, wa, acc_b, wb);
 *   out = fasa_softmax_finish(acc, a.l);
 *
 * Every kernel (the .cu files here) computes its values only through these functions, in the order
 * their comments state, and tests/test_kernels.c runs the same functions on the CPU against
 * scalar references. They are plain C99 (FASA_HD is empty outside nvcc), use fmaf for every
 * multiply-add and their own exp (fasa_expf), so host and device produce the same bits; the one
 * exception is f16 -> f32 / f32 -> f16 on the device, which uses the hardware conversion (IEEE,
 * round to nearest even: the same results as the software twins for every non-NaN value).
 *
 * Layouts the kernels use (f16 values are stored as uint16_t bit patterns):
 *   dominant keys  (n_kv, n_ctx, n_dom)      n_dom = 2F dims of the dominant chunks, first in a
 *                                            converted model's canonical rows
 *   rest keys      (n_kv, n_ctx, d - n_dom)  the other dims, same order
 *   values         (n_kv, n_ctx, d)
 *   cold tier      (n_layer, n_kv, n_ctx, width) in pinned host memory (FASA-M)
 *   staging        (n_head, n, width)        the rows a query head chose, gathered
 */
#ifndef FASA_CUDA_MATH_H
#define FASA_CUDA_MATH_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#if defined(__CUDACC__)
#include <cuda_fp16.h>
#define FASA_HD __host__ __device__
#else
#define FASA_HD
#endif

/* --- bits ------------------------------------------------------------------------------------ */

static inline FASA_HD float fasa_f32_from_bits(uint32_t u)
{
#if defined(__CUDA_ARCH__)
    return __uint_as_float(u);
#else
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
#endif
}

static inline FASA_HD uint32_t fasa_f32_bits(float f)
{
#if defined(__CUDA_ARCH__)
    return __float_as_uint(f);
#else
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
#endif
}

/* --- f16 <-> f32 ----------------------------------------------------------------------------- */

/* IEEE half to float, exactly (every half is a float). NaNs keep their payload and come out
 * quiet, as x86's F16C does. */
static inline FASA_HD float fasa_f16_to_f32_soft(uint16_t h)
{
    const uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu, man = h & 0x3ffu, u;
    if (exp == 0x1f) {
        u = sign | 0x7f800000u | (man << 13) | (man ? 0x00400000u : 0);
    } else if (exp) {
        u = sign | ((exp + 112) << 23) | (man << 13);
    } else if (!man) {
        u = sign;
    } else {   /* subnormal: man * 2^-24, normalised; 113 is the biased exponent of 2^-14 */
        uint32_t e = 113;
        do {
            man <<= 1;
            e--;
        } while (!(man & 0x400u));
        u = sign | (e << 23) | ((man & 0x3ffu) << 13);
    }
    return fasa_f32_from_bits(u);
}

/* Float to IEEE half, rounding to nearest even; overflow gives infinity, NaN stays NaN (quiet,
 * top payload bits kept), as x86's F16C does with rounding mode 0. */
static inline FASA_HD uint16_t fasa_f32_to_f16_soft(float f)
{
    const uint32_t u = fasa_f32_bits(f);
    const uint32_t sign = (u >> 16) & 0x8000u, exp = (u >> 23) & 0xffu;
    uint32_t man = u & 0x7fffffu, q, rem, half;
    if (exp == 0xff) return (uint16_t)(sign | 0x7c00u | (man ? 0x200u | (man >> 13) : 0));
    const int e = (int)exp - 127 + 15;   /* the half's biased exponent */
    if (e >= 0x1f) return (uint16_t)(sign | 0x7c00u);
    if (e <= 0) {   /* half subnormal (or zero): units of 2^-24 */
        if (e < -10) return (uint16_t)sign;   /* below 2^-25: 2^-25 itself ties to even (0) */
        man |= 0x800000u;
        const int shift = 14 - e;            /* 14 .. 24 */
        q = man >> shift;
        rem = man & ((1u << shift) - 1);
        half = 1u << (shift - 1);
    } else {
        q = ((uint32_t)e << 10) | (man >> 13);
        rem = man & 0x1fffu;
        half = 0x1000u;
    }
    if (rem > half || (rem == half && (q & 1))) q++;   /* a carry moves into the exponent, up to inf */
    return (uint16_t)(sign | q);
}

static inline FASA_HD float fasa_f16_to_f32(uint16_t h)
{
#if defined(__CUDA_ARCH__)
    return __half2float(__ushort_as_half(h));
#else
    return fasa_f16_to_f32_soft(h);
#endif
}

static inline FASA_HD uint16_t fasa_f32_to_f16(float f)
{
#if defined(__CUDA_ARCH__)
    return __half_as_ushort(__float2half_rn(f));
#else
    return fasa_f32_to_f16_soft(f);
#endif
}

/* --- exp ------------------------------------------------------------------------------------- */

/* e^x with the same operations on host and device (so both give the same bits): x = n ln2 + r,
 * |r| <= ln2/2, a degree-7 Taylor polynomial of e^r, times 2^n. Within 2 ulp of expf on
 * [-87.3, 88.3]; 0 below -87.3 (like ops_exp: a softmax weight that small is 0), e^88.3 above;
 * NaN stays NaN. */
static inline FASA_HD float fasa_expf(float x)
{
    if (x != x) return x;
    if (!(x >= -87.3f)) return 0.0f;
    if (x > 88.3f) x = 88.3f;
    const float n = rintf(x * 1.44269504088896341f);
    float r = fmaf(n, -0.693145751953125f, x);       /* ln2, high part: n * it is exact */
    r = fmaf(n, -1.42860682030941723e-6f, r);        /* ln2, low part */
    float p = 1.0f / 5040;
    p = fmaf(p, r, 1.0f / 720);
    p = fmaf(p, r, 1.0f / 120);
    p = fmaf(p, r, 1.0f / 24);
    p = fmaf(p, r, 1.0f / 6);
    p = fmaf(p, r, 0.5f);
    p = fmaf(p, r, 1.0f);
    p = fmaf(p, r, 1.0f);
    /* n is in [-126, 127] here, so 2^n is a normal float */
    return p * fasa_f32_from_bits((uint32_t)((int)n + 127) << 23);
}

/* --- scores ---------------------------------------------------------------------------------- */

/* acc + q0 k0 + q1 k1 for one frequency chunk: w holds the chunk's two f16 key components
 * (dim 2c in the low half, 2c+1 in the high half: little-endian, as two uint16_t in memory). */
static inline FASA_HD float fasa_chunk_fma(float acc, float q0, float q1, uint32_t w)
{
    acc = fmaf(q0, fasa_f16_to_f32((uint16_t)(w & 0xffffu)), acc);
    return fmaf(q1, fasa_f16_to_f32((uint16_t)(w >> 16)), acc);
}

/* acc + sum_j q[j] k[j], j = 0, 1, .. n-1 in that order (one fmaf each). Kernels that load
 * keys in wider words feed fasa_chunk_fma in the same order and get the same bits. */
static inline FASA_HD float fasa_dot_f16(float acc, const float *q, const uint16_t *k, int n)
{
    for (int j = 0; j < n; j++) acc = fmaf(q[j], fasa_f16_to_f32(k[j]), acc);
    return acc;
}

/* TIP: the partial score of one cached token, sum over the dominant block (n_dom = 2F dims)
 * of q^(c) . k^(c); qdom is the query gathered to the same dims. Unscaled (a ranking). */
static inline FASA_HD float fasa_tip_score(const float *qdom, const uint16_t *kdom, int n_dom)
{
    return fasa_dot_f16(0.0f, qdom, kdom, n_dom);
}

/* The full logit scale * q.k of one token whose key is split into its dominant block
 * (n_dom dims) and the rest (d - n_dom dims): dominant dims first, then the rest. */
static inline FASA_HD float fasa_full_score(const float *q, const uint16_t *kdom, const uint16_t *krest,
                                            int n_dom, int d, float scale)
{
    float acc = fasa_dot_f16(0.0f, q, kdom, n_dom);
    return scale * fasa_dot_f16(acc, q + n_dom, krest, d - n_dom);
}

/* --- online softmax -------------------------------------------------------------------------- */

/* Running state of a softmax over a stream of scores: max m and l = sum exp(s - m). The
 * matching accumulator (one float per output dim) is acc = sum exp(s - m) v. */
typedef struct fasa_softmax {
    float m, l;
} fasa_softmax;

static inline FASA_HD fasa_softmax fasa_softmax_init(void)
{
    fasa_softmax st;
    st.m = -INFINITY;
    st.l = 0.0f;
    return st;
}

/* Folds score s into st. The accumulator follows with fasa_acc_push(acc, alpha, p, v):
 * alpha rescales what was summed under the old max, p is the new value's weight. */
static inline FASA_HD void fasa_softmax_push(fasa_softmax *st, float s, float *alpha, float *p)
{
    if (s > st->m) {
        *alpha = fasa_expf(st->m - s);   /* 0 for the first score (m = -inf) */
        *p = 1.0f;
        st->m = s;
    } else {
        *alpha = 1.0f;
        *p = fasa_expf(s - st->m);
    }
    st->l = fmaf(st->l, *alpha, *p);
}

static inline FASA_HD float fasa_acc_push(float acc, float alpha, float p, float v)
{
    return fmaf(p, v, acc * alpha);
}

/* Split-K combine: folds partial state b into a; each accumulator then follows with
 * fasa_acc_merge(acc_a, wa, acc_b, wb). An empty part (m = -inf, l = 0) weighs 0. */
static inline FASA_HD void fasa_softmax_merge(fasa_softmax *a, fasa_softmax b, float *wa, float *wb)
{
    const float m = a->m > b.m ? a->m : b.m;
    if (m == -INFINITY) {   /* both empty */
        *wa = 1.0f;
        *wb = 0.0f;
        return;
    }
    *wa = fasa_expf(a->m - m);
    *wb = fasa_expf(b.m - m);
    a->l = fmaf(a->l, *wa, b.l * *wb);
    a->m = m;
}

static inline FASA_HD float fasa_acc_merge(float acc_a, float wa, float acc_b, float wb)
{
    return fmaf(acc_a, wa, acc_b * wb);
}

/* The attention output of one dim: acc / l (0 when nothing was attended). */
static inline FASA_HD float fasa_softmax_finish(float acc, float l)
{
    return l > 0.0f ? acc / l : 0.0f;
}

/* Split-K: how many parts the n tokens of one query head are cut into (each part one thread
 * block, parts of at least FASA_SPLIT_MIN tokens, at most FASA_SPLIT_MAX parts), and the tokens
 * [lo, hi) of part s. The CPU twins cut the same way, so they merge in the same order. */
#define FASA_SPLIT_MIN 128
#define FASA_SPLIT_MAX 64

static inline FASA_HD int fasa_split_count(int n)
{
    int s = (n + FASA_SPLIT_MIN - 1) / FASA_SPLIT_MIN;
    return s < 1 ? 1 : s > FASA_SPLIT_MAX ? FASA_SPLIT_MAX : s;
}

static inline FASA_HD void fasa_split_range(int n, int n_split, int s, int *lo, int *hi)
{
    const int per = (n + n_split - 1) / n_split;
    *lo = s * per < n ? s * per : n;
    *hi = (s + 1) * per < n ? (s + 1) * per : n;
}

/* --- top-N ----------------------------------------------------------------------------------- */

/* A score and its index in one integer that orders like (score desc, index asc): the same
 * packing as lib/topk.h's topk_pack, so ties go to the lower index. */
static inline FASA_HD uint64_t fasa_topn_pack(float s, uint32_t i)
{
    uint32_t u = fasa_f32_bits(s);
    u = (u & 0x80000000u) ? ~u : u | 0x80000000u;
    return (uint64_t)u << 32 | (uint32_t)~i;
}

static inline FASA_HD uint32_t fasa_topn_index(uint64_t key) { return ~(uint32_t)key; }

/* Radix select of the k-th largest key, 8 bits a pass from the top (8 passes at most):
 *   prefix = 0, rank = k
 *   for pass 0..7: histogram the pass's digit over keys matching prefix on the passes before;
 *                  digit = fasa_radix_pick(hist, rank, &rank, &count); prefix |= digit << shift;
 *                  stop when count == rank (the whole bucket is selected)
 *   selected: key >= prefix (exactly k keys, since keys are distinct). */
static inline FASA_HD uint32_t fasa_radix_digit(uint64_t key, int pass)
{
    return (uint32_t)(key >> (56 - 8 * pass)) & 0xffu;
}

static inline FASA_HD int fasa_radix_match(uint64_t key, uint64_t prefix, int pass)
{
    return pass == 0 || (key >> (64 - 8 * pass)) == (prefix >> (64 - 8 * pass));
}

/* hist[256]: counts of the matching keys' digits; rank: 1-based rank among them, from the top.
 * Returns the digit holding that rank; *rank_in = its rank inside the bucket, *count = the
 * bucket's size. */
static inline FASA_HD uint32_t fasa_radix_pick(const uint32_t *hist, uint32_t rank, uint32_t *rank_in, uint32_t *count)
{
    uint32_t above = 0;
    for (int dgt = 255; dgt >= 0; dgt--) {
        if (above + hist[dgt] >= rank) {
            *rank_in = rank - above;
            *count = hist[dgt];
            return (uint32_t)dgt;
        }
        above += hist[dgt];
    }
    *rank_in = 0;
    *count = 0;
    return 0;   /* rank > number of keys: a caller bug */
}

static inline FASA_HD uint64_t fasa_radix_prefix(uint64_t prefix, uint32_t digit, int pass)
{
    return prefix | (uint64_t)digit << (56 - 8 * pass);
}

/* --- FASA-M cold rows ------------------------------------------------------------------------ */

/* Element offset of token tok's row in a cold-tier tensor (n_layer, n_kv, n_ctx, width). */
static inline FASA_HD size_t fasa_cold_row(int layer, int kv_head, int tok, int n_kv, int n_ctx, int width)
{
    return (((size_t)layer * n_kv + kv_head) * n_ctx + tok) * width;
}

/* Element offset of the j-th chosen row of query head h in a staging buffer (n_head, n, width). */
static inline FASA_HD size_t fasa_stage_row(int head, int j, int n, int width)
{
    return ((size_t)head * n + j) * width;
}

/* The row a gathered tensor is read at: idx[j] in the full cache, j in a staging buffer. */
static inline FASA_HD int fasa_gather_row(const int32_t *idx, int j, int compact)
{
    return compact ? j : idx[j];
}

/* Length of the run of consecutive token indices starting at idx[j] (idx ascending): one
 * cudaMemcpyAsync moves a whole run of cold rows. */
static inline FASA_HD int fasa_run_length(const int32_t *idx, int n, int j)
{
    int r = 1;
    while (j + r < n && idx[j + r] == idx[j] + r) r++;
    return r;
}

/* --- matvec ---------------------------------------------------------------------------------- */

/* Lane `lane` of a 32-lane warp computing y = W x for one f16 row: the lane takes columns
 * 8 lane + 256 i .. +8 (i = 0, 1, ..) in ascending order, one fmaf each. */
static inline FASA_HD float fasa_matvec_lane(const uint16_t *row, const float *x, int cols, int lane)
{
    float acc = 0.0f;
    for (int base = 8 * lane; base < cols; base += 256) {
        const int end = base + 8 < cols ? base + 8 : cols;
        for (int j = base; j < end; j++) acc = fmaf(x[j], fasa_f16_to_f32(row[j]), acc);
    }
    return acc;
}

/* The warp's butterfly sum of 32 lane partials, in the order __shfl_xor_sync performs it
 * (offsets 16, 8, 4, 2, 1; every lane ends with the same value): the CPU twin. */
static inline FASA_HD float fasa_warp_sum_ref(const float *p)
{
    float a[32], b[32];
    for (int l = 0; l < 32; l++) a[l] = p[l];
    for (int off = 16; off; off >>= 1) {
        for (int l = 0; l < 32; l++) b[l] = a[l] + a[l ^ off];
        for (int l = 0; l < 32; l++) a[l] = b[l];
    }
    return a[0];
}

#endif

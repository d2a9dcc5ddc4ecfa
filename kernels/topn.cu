/* topn.cu - exact top-N of each query head's TIP scores: radix select on fasa_topn_pack keys
 * (score desc, index asc: lib/topk's order), then the selected indices in ascending order. */
#include "fasa_cuda_internal.cuh"

#define TOPN_THREADS 512

/* Block h. Each radix pass re-reads the head's t scores (they stay in L2) and histograms one
 * 8-bit digit of the keys that still match the chosen prefix; thread 0 picks the digit
 * (fasa_radix_pick). Usually 4 passes (the score's bits) settle it; ties need more. Then a
 * block-wide scan, tile by tile, writes the indices whose key >= the threshold in order. */
static __global__ void __launch_bounds__(TOPN_THREADS) topn_kernel(int32_t *idx, const float *scores, int t, int k)
{
    __shared__ uint32_t hist[256];
    __shared__ uint32_t warp_count[TOPN_THREADS / 32];
    __shared__ uint64_t s_prefix;
    __shared__ uint32_t s_rank;
    __shared__ int s_done;
    const int h = blockIdx.x, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const float *sc = scores + (size_t)h * t;
    int32_t *out = idx + (size_t)h * k;
    uint64_t thr = 0;   /* k == t: every key */
    if (k < t) {
        if (tid == 0) {
            s_prefix = 0;
            s_rank = (uint32_t)k;
            s_done = 0;
        }
        for (int pass = 0; pass < 8; pass++) {
            for (int i = tid; i < 256; i += TOPN_THREADS) hist[i] = 0;
            __syncthreads();
            const uint64_t prefix = s_prefix;
            for (int i = tid; i < t; i += TOPN_THREADS) {
                const uint64_t key = fasa_topn_pack(sc[i], (uint32_t)i);
                if (fasa_radix_match(key, prefix, pass)) atomicAdd(&hist[fasa_radix_digit(key, pass)], 1u);
            }
            __syncthreads();
            if (tid == 0) {
                uint32_t rank_in, count;
                const uint32_t digit = fasa_radix_pick(hist, s_rank, &rank_in, &count);
                s_prefix = fasa_radix_prefix(s_prefix, digit, pass);
                s_rank = rank_in;
                s_done = count == rank_in;
            }
            __syncthreads();
            if (s_done) break;
        }
        thr = s_prefix;
    }
    uint32_t base = 0;
    for (int i0 = 0; i0 < t; i0 += TOPN_THREADS) {
        const int i = i0 + tid;
        const int sel = i < t && fasa_topn_pack(sc[i], (uint32_t)i) >= thr;
        const unsigned ballot = __ballot_sync(0xffffffffu, sel);
        if (lane == 0) warp_count[warp] = (uint32_t)__popc(ballot);
        __syncthreads();
        uint32_t before = 0, total = 0;
        for (int w = 0; w < TOPN_THREADS / 32; w++) {
            if (w < warp) before += warp_count[w];
            total += warp_count[w];
        }
        if (sel) out[base + before + (uint32_t)__popc(ballot & ((1u << lane) - 1))] = i;
        base += total;
        __syncthreads();
    }
}

extern "C" int fasa_cuda_topn(fasa_cuda *cu, int32_t *idx, const float *scores, int n_head, int t, int n, char *err)
{
    if (n_head < 1 || t < 0 || n < 1)
        return fasa_error(err, FASA_EARG, "top-%d of %d tokens for %d heads", n, t, n_head);
    const int k = n < t ? n : t;
    if (k == 0) return 0;
    topn_kernel<<<n_head, TOPN_THREADS, 0, cu->stream>>>(idx, scores, t, k);
    const int r = fasa_cuda_launched(err, "topn_kernel");
    return r < 0 ? r : k;
}

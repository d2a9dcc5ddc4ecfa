/* quant.h - the per-type row kernels under ops_matmul (lib/core only; matmul.c's threads call
 * them), and their scalar twins for tests/test_quant.c.
 *
 * One table row per weight type (quant_kernels_of), in the manner of ggml's CPU type traits:
 * the block, the form x must take for the integer kernels, the decode row-dot (4 rows and 1), the
 * prefill tile, the fast row dequantiser. Each thread prepares its scratch once per product: x
 * rounded for the integer decode kernels, or the dequantised or unpacked rows of prefill; the K
 * types' prefill reads x rounded once for all threads (matmul.c, quant_x.all). */
#ifndef FASA_QUANT_H
#define FASA_QUANT_H

#include <stddef.h>
#include <stdint.h>

#include "ops.h"

/* The forms of x the kernels read. */
enum quant_xf {
    QUANT_XF_F32,   /* x as it is */
    QUANT_XF_Q16,   /* int16 per 32 values (xq16): the 32-value block types */
    QUANT_XF_Q8K,   /* int8 per 256 values with block sums (xq8): the 256-value K types */
};

/* x rounded to int16 per 32-value block b: sx[b] = max |x| / 32767, x16 = round(x / sx), xs[b]
 * the exact f32 sum of the block's x (for the offsets of Q4_0, Q4_1, Q5_0, Q5_1). One token. */
typedef struct xq16 {
    const float *xs, *sx;   /* (cols / 32) */
    const int16_t *x16;     /* (cols) */
} xq16;

/* x rounded to int8 per 256-value block b, for n tokens (token t at q + t cols, d + t cols / 256,
 * ...): d[b] = max |x| / 127, q = round(x / d) (|q| <= 127), s16 / s32 the sums of q over each
 * 16 / 32 values (for the -32 of Q6_K and the mins of Q4_K and Q5_K). qp holds the same q with
 * each 128 values in the order [0, 32) [64, 96) [32, 64) [96, 128): the order in which a 64-byte
 * load of Q4_K's or Q5_K's nibbles yields them (AVX-512 kernels; NULL otherwise). */
typedef struct xq8 {
    const int8_t *q, *qp;        /* (n, cols) */
    const float *d;              /* (n, cols / 256) */
    const int16_t *s16, *s32;    /* (n, cols / 16), (n, cols / 32) */
    int64_t cols;
} xq8;

/* Rows w[0..3] (of cols values each; w[nr..3] repeat a row, their y is not written) dotted with
 * T tokens of x: y[t ldy + r] for r < nr, t < T (T <= QUANT_TILE_T). ahead (decode; 0: none):
 * each row is prefetched that many bytes beyond where the tile reads it, as many as it reads. */
#define QUANT_TILE_T 4
typedef void (*quant_tile_fn)(float *y, size_t ldy, const uint8_t *const w[4], int nr, const xq8 *x, int T,
                              int64_t cols, size_t ahead);

typedef struct quant_kernels {
    const char *name;
    int64_t block;        /* values per block */
    size_t bytes;         /* bytes per block */
    int xf;               /* enum quant_xf: the x the integer kernels read (F32: none) */
    /* decode: y[0..3] = rows b, b + rb, b + 2 rb, b + 3 rb dotted with x (xq16 or x itself) */
    void (*dot4)(float *y, const uint8_t *b, size_t rb, const void *x, int64_t cols);
    float (*dot1)(const uint8_t *b, const void *x, int64_t cols);
    /* Q8K types: decode (T = 1), in place of dot4/dot1; prefill reads the same vectors unpacked (utile) */
    quant_tile_fn tile;
    /* n values from a block boundary to f32; NULL: formats/gguf's scalar gguf_dequant */
    void (*row)(const uint8_t *b, float *y, int64_t n);
    /* the scalar twin of the integer kernels: one row and one token, the same rounded x (xq16 or
     * xq8), plain C; NULL for the f32 types */
    float (*dot_ref)(const uint8_t *b, const void *x, int64_t cols);
    /* prefill (K types): a row of nb super-blocks unpacked once into the vectors the tiles build
     * (KU_BLOCK bytes a super-block, quant.c), then rows u + r ub (r < nr) by T <= QUANT_TILE_T
     * tokens of x: y[t ldy + r], bit for bit the tile's */
    void (*unpack)(const uint8_t *b, uint8_t *u, int64_t nb);
    void (*utile)(float *y, size_t ldy, const uint8_t *u, size_t ub, int nr, const xq8 *x, int T, int64_t cols);
} quant_kernels;

/* The table row of a type; a row whose dot1 and tile are NULL runs the generic path (rows
 * dequantised by gguf_dequant, f32 kernels). NULL for a type fasa cannot read. */
const quant_kernels *quant_kernels_of(uint32_t type);

/* x rounded for the kernels (the fast code, or the scalar twin when ref): xq16 of one token of
 * cols values (cols / 2 + 2 cols / 32 floats at buf); xq8 of n tokens (quant_xq8_bytes at buf,
 * 64-byte aligned). */
void   quant_xq16(xq16 *o, const float *x, int64_t cols, void *buf, int ref);
size_t quant_xq8_bytes(int64_t cols, int n);
void   quant_xq8(xq8 *o, const float *x, int64_t cols, int n, void *buf, int ref);
/* The same in two steps, so that threads can each round some of the tokens into one buffer:
 * the layout of n tokens at buf, then tokens [t0, t1) of x (n tokens of cols) rounded into it. */
void   quant_xq8_layout(xq8 *o, int64_t cols, int n, void *buf);
void   quant_xq8_fill(const xq8 *o, const float *x, int t0, int t1, int ref);
/* x from token t on. */
static inline xq8 quant_xq8_at(const xq8 *x, int t)
{
    const int64_t c = x->cols;
    return (xq8){ x->q + (size_t)t * c, x->qp ? x->qp + (size_t)t * c : NULL, x->d + (size_t)t * (c / 256),
                  x->s16 + (size_t)t * (c / 16), x->s32 + (size_t)t * (c / 32), c };
}

/* Per-thread state of one product. */
typedef struct quant_x {
    const float *x;
    int64_t cols;
    int n;
    uint8_t *buf;           /* scratch: quant_scratch_bytes */
    int have16, have8;      /* decode: x16 / x8 prepared (lazily, per form) */
    xq16 x16;
    xq8 x8;
    const xq8 *all;         /* prefill: all n tokens already rounded (quant_wants_xq8), or NULL */
} quant_x;

/* Products and cost balancing split rows at multiples of this. */
#define MM_ROWS 4

/* Bytes of per-thread scratch a product of n tokens over cols columns needs. */
size_t quant_scratch_bytes(int64_t cols, int n);
void   quant_prepare(quant_x *q, const float *x, int64_t cols, int n, void *scratch);
/* 1 if the rows of w read n > 1 tokens of x as xq8: the caller may round x once for all its
 * threads and pass it in quant_x.all, where each would otherwise round it again per call. */
int    quant_wants_xq8(const weight *w, int n);
/* Rows [r0, r1) of y = x W^T (n tokens), on the calling thread. */
void   quant_rows(float *y, const weight *w, int64_t r0, int64_t r1, quant_x *q);

#endif

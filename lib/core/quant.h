/* quant.h - the per-type row kernels under ops_matmul (lib/core only; matmul.c's threads call
 * them). Each thread prepares its scratch once per product: the dequantised rows of a prefill
 * tile, or x rounded for the integer decode kernels. */
#ifndef FASA_QUANT_H
#define FASA_QUANT_H

#include <stddef.h>
#include <stdint.h>

#include "ops.h"

/* x rounded to int16 per 32-value block (quant.c) */
typedef struct xq {
    const float *xs, *sx;   /* (cols / 32) */
    const int16_t *x16;     /* (cols) */
} xq;

typedef struct quant_x {
    float *buf;             /* prefill: MM_ROWS dequantised rows of ld floats */
    int64_t ld;
    const xq *xq;           /* decode: x for the integer kernels, or NULL */
    xq xq_;
} quant_x;

/* Products and cost balancing split rows at multiples of this. */
#define MM_ROWS 4

/* Floats of per-thread scratch a product of n tokens over cols columns needs. */
size_t quant_scratch_floats(int64_t cols, int n);
void   quant_prepare(quant_x *q, const float *x, int64_t cols, int n, float *scratch);
/* Rows [r0, r1) of y = x W^T (n tokens), on the calling thread. */
void   quant_rows(float *y, const weight *w, const float *x, int n, int64_t r0, int64_t r1, const quant_x *q);

#endif

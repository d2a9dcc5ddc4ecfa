/* ops.h - the numeric kernels of the forward pass, each with a plain scalar twin.
 *
 *   weight w = { GGUF_TYPE_Q4_1, rows, cols, data };     // a view into a mapped file
 *   ops_matmul(y, &w, x, n);        // y[n][rows] = x[n][cols] . W^T, threads over rows
 *   ops_rmsnorm(out, x, gamma, n, eps);
 *
 * Weights keep the type they have on disk (enum gguf_type: F32, F16, BF16, Q8_0, Q4_0, Q4_1,
 * Q4_K, Q6_K) and are dequantised a block at a time inside the kernels: no f32 copy of the model.
 * Fast paths (AVX2/FMA/F16C) are chosen at compile time; the *_ref twins are what tests compare
 * them against.
 */
#ifndef FASA_OPS_H
#define FASA_OPS_H

#include <stddef.h>
#include <stdint.h>

typedef struct weight {
    uint32_t type;        /* enum gguf_type */
    int64_t rows, cols;   /* logical (rows, cols); each row is gguf_row_bytes(type, cols) bytes */
    const void *data;
} weight;

size_t weight_bytes(const weight *w);
/* Dequantise row r of w into out[cols]. */
void weight_row(const weight *w, int64_t r, float *out);
void weight_row_ref(const weight *w, int64_t r, float *out);   /* formats/gguf's scalar dequant */

/* y[i*rows + r] = dot(row r of W, x[i*cols ..]) for i < n. OpenMP over rows. */
void ops_matmul(float *y, const weight *w, const float *x, int n);
void ops_matmul_ref(float *y, const weight *w, const float *x, int n);

float ops_dot(const float *a, const float *b, int n);
float ops_dot_ref(const float *a, const float *b, int n);
/* y += a * x */
void ops_axpy(float *y, float a, const float *x, int n);
void ops_axpy_ref(float *y, float a, const float *x, int n);

void ops_rmsnorm(float *out, const float *x, const float *gamma, int n, float eps);
/* In place softmax over n values; returns nothing, writes exp(x - max) / sum. */
void ops_softmax(float *x, int n);
/* a[i] = silu(a[i]) * b[i] */
void ops_swiglu(float *a, const float *b, int n);

#endif

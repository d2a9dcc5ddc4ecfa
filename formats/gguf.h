/* gguf.h - GGUF v2/v3 reader, writer for fixtures, and block dequantisers. No model logic.
 *
 *   gguf_file g;
 *   char err[FASA_ERRLEN];
 *   if (gguf_open(&g, "model.gguf", err) < 0) ...;          // mmap + gguf_parse
 *   uint32_t n_layer; gguf_get_u32(&g, "llama.block_count", &n_layer);
 *   const gguf_tensor *t = gguf_find_tensor(&g, "blk.0.attn_q.weight");
 *   if (gguf_check_tensor(&g, t, err) < 0) ...;              // a NaN or inf block scale
 *   gguf_dequant(t->type, t->data, row, t->ne[0]);           // one row of ne[0] values
 *   const gguf_type_traits *tt = gguf_type_traits_of(t->type);   // the same, by hand:
 *   tt->to_float(t->data, row, t->ne[0]);                    // ne[0] / tt->block blocks of tt->bytes
 *   gguf_close(&g);
 *
 * Byte layout (little-endian): magic "GGUF", u32 version (2 or 3), u64 n_tensors, u64 n_kv
 * (v1 used u32: rejected); n_kv x {string key, u32 type, value}; n_tensors x {string name,
 * u32 n_dims, u64 ne[n_dims], u32 type, u64 offset}; padding to general.alignment (default 32);
 * tensor data, each at data_start + offset (offset a multiple of the alignment).
 * A string is u64 length + bytes (no NUL). An array is u32 elem type + u64 count + elems.
 * ne[0] is the innermost (fastest varying) dimension: a weight of ne = {in, out} has `out`
 * rows of `in` values each.
 */
#ifndef FASA_GGUF_H
#define FASA_GGUF_H

#include <stddef.h>
#include <stdint.h>
#include "base.h"

enum gguf_vtype {
    GGUF_VT_U8 = 0, GGUF_VT_I8 = 1, GGUF_VT_U16 = 2, GGUF_VT_I16 = 3, GGUF_VT_U32 = 4,
    GGUF_VT_I32 = 5, GGUF_VT_F32 = 6, GGUF_VT_BOOL = 7, GGUF_VT_STRING = 8, GGUF_VT_ARRAY = 9,
    GGUF_VT_U64 = 10, GGUF_VT_I64 = 11, GGUF_VT_F64 = 12,
};

/* ggml tensor types (numbering as in ggml; 4 and 5 were removed there). gguf_type_known says
 * which of them this reader dequantises: F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K,
 * Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL, IQ4_XS. */
enum gguf_type {
    GGUF_TYPE_F32 = 0, GGUF_TYPE_F16 = 1, GGUF_TYPE_Q4_0 = 2, GGUF_TYPE_Q4_1 = 3,
    GGUF_TYPE_Q5_0 = 6, GGUF_TYPE_Q5_1 = 7, GGUF_TYPE_Q8_0 = 8, GGUF_TYPE_Q8_1 = 9,
    GGUF_TYPE_Q2_K = 10, GGUF_TYPE_Q3_K = 11, GGUF_TYPE_Q4_K = 12, GGUF_TYPE_Q5_K = 13,
    GGUF_TYPE_Q6_K = 14, GGUF_TYPE_Q8_K = 15, GGUF_TYPE_IQ2_XXS = 16, GGUF_TYPE_IQ2_XS = 17,
    GGUF_TYPE_IQ3_XXS = 18, GGUF_TYPE_IQ1_S = 19, GGUF_TYPE_IQ4_NL = 20, GGUF_TYPE_IQ3_S = 21,
    GGUF_TYPE_IQ2_S = 22, GGUF_TYPE_IQ4_XS = 23, GGUF_TYPE_I8 = 24, GGUF_TYPE_I16 = 25,
    GGUF_TYPE_I32 = 26, GGUF_TYPE_I64 = 27, GGUF_TYPE_F64 = 28, GGUF_TYPE_IQ1_M = 29,
    GGUF_TYPE_BF16 = 30, GGUF_TYPE_COUNT = 31,
};

typedef struct gguf_str { const char *ptr; uint64_t len; } gguf_str;   /* view, not NUL-terminated */

typedef struct gguf_kv {
    gguf_str key;
    uint32_t type;          /* enum gguf_vtype */
    uint32_t arr_type;      /* element type when type == GGUF_VT_ARRAY */
    uint64_t arr_n;         /* element count when type == GGUF_VT_ARRAY */
    const uint8_t *value;   /* points at the value bytes (for arrays: at the first element) */
} gguf_kv;

typedef struct gguf_tensor {
    gguf_str name;
    uint32_t n_dims;
    int64_t ne[4];          /* ne[0] innermost; unused dims are 1 */
    uint32_t type;          /* enum gguf_type */
    uint64_t offset;        /* relative to the data section */
    uint64_t nbytes;
    const void *data;       /* into the buffer */
} gguf_tensor;

typedef struct gguf_file {
    uint32_t version;
    uint64_t n_kv, n_tensors;
    gguf_kv *kv;
    gguf_tensor *tensors;
    uint64_t alignment;
    const uint8_t *buf;     /* whole file */
    size_t len;
    void *map;              /* mmap owned by gguf_open, NULL after gguf_parse */
    char path[256];         /* for messages; empty when parsed from memory */
} gguf_file;

/* Pure parser: no I/O. Checks every length, count, offset and size for bounds and overflow.
 * Tensor data must lie inside buf, be aligned, and not overlap. Does not copy buf.
 * Also rejected: duplicate keys or tensor names, unknown value or tensor types, arrays nested
 * more than 8 deep, n_dims outside 1..4, any ne of 0 (ggml tolerates empty tensors; no model we
 * load has one), ne[0] not a multiple of the block, general.alignment that is not a non-zero
 * u32 power of two. Bools are one byte, any non-zero value reads as true. On failure *g is
 * zeroed (gguf_close is harmless) and err names g's file ("gguf: ..." for a bare buffer). */
int  gguf_parse(gguf_file *g, const void *buf, size_t len, char *err);
int  gguf_open(gguf_file *g, const char *path, char *err);   /* mmap + parse; messages name path */
void gguf_close(gguf_file *g);                               /* also frees what gguf_parse allocated */

const gguf_kv     *gguf_find_kv(const gguf_file *g, const char *key);
const gguf_tensor *gguf_find_tensor(const gguf_file *g, const char *name);

/* Typed getters: 0 on success, FASA_EARG when the key is missing, FASA_EFORMAT when its value
 * has an incompatible type or does not fit. Integer getters accept any integer type whose value
 * fits (not bools). */
int gguf_get_u32(const gguf_file *g, const char *key, uint32_t *out);
int gguf_get_i64(const gguf_file *g, const char *key, int64_t *out);
int gguf_get_f32(const gguf_file *g, const char *key, float *out);    /* F32 or F64 */
int gguf_get_bool(const gguf_file *g, const char *key, int *out);
int gguf_get_str(const gguf_file *g, const char *key, gguf_str *out);
/* Array elements. Strings of an array are found by walking; gguf_arr_strs fills out[0..n) in one
 * pass (caller allocates kv->arr_n entries). */
int gguf_arr_strs(const gguf_kv *kv, gguf_str *out);
int gguf_arr_i32(const gguf_kv *kv, int32_t *out);   /* I32/U32/I8/U8/... converted; FASA_EFORMAT
                                                      * if one does not fit in int32 */
int gguf_arr_f32(const gguf_kv *kv, float *out);     /* F32 or F64 elements */

/* Types: one row of facts per ggml type, in the manner of ggml's type traits. Every function
 * below reads this table; lib/ may read it too (gguf_type_traits_of).
 *
 * Block layouts (little-endian; f16 = IEEE half; "nibble" = 4 bits, low nibble first; QK_K = 256):
 *   F32 / F16 / BF16   one value per "block"
 *   Q4_0   (32, 18 B)  f16 d; u8 qs[16]                 value j: low nibble of qs[j], j+16: high
 *                                                       nibble; y = d * (q - 8)
 *   Q4_1   (32, 20 B)  f16 d, m; u8 qs[16]              as Q4_0; y = d * q + m
 *   Q5_0   (32, 22 B)  f16 d; u8 qh[4]; u8 qs[16]       as Q4_0 plus a 5th bit: bit j of the u32 qh
 *                                                       for value j (and j+16); y = d * (q - 16)
 *   Q5_1   (32, 24 B)  f16 d, m; u8 qh[4]; u8 qs[16]    as Q5_0; y = d * q + m
 *   Q8_0   (32, 34 B)  f16 d; i8 qs[32]                 y = d * q
 *   Q2_K  (256, 84 B)  u8 scales[16]; u8 qs[64]; f16 d, dmin    16 sub-blocks of 16: scale = low
 *                      nibble, min = high nibble; 2-bit q, value v at bits 2*(v%128/32) of
 *                      qs[32*(v/128) + v%32]; y = d*scale * q - dmin*min
 *   Q3_K  (256, 110 B) u8 hmask[32]; u8 qs[64]; u8 scales[12]; f16 d    2 low bits as Q2_K, third
 *                      bit = bit v/32 of hmask[v%32] (clear: subtract 4); sixteen 6-bit scales,
 *                      low nibble in scales[s] (s < 8) or scales[s-8] >> 4, top 2 bits at bits
 *                      2*(s/4) of scales[8 + s%4]; y = d * (scale - 32) * q
 *   Q4_K  (256, 144 B) f16 d, dmin; u8 scales[12]; u8 qs[128]    8 sub-blocks of 32, 6-bit scale
 *                      and min each: for j < 4 the low 6 bits of scales[j] and scales[j+4]; for
 *                      j >= 4 the low / high nibble of scales[j+4] with the top two bits in bits
 *                      6-7 of scales[j-4] / scales[j]. Value v: nibble v%64/32 of qs[32*(v/64) +
 *                      v%32]; y = d*scale * q - dmin*min
 *   Q5_K  (256, 176 B) f16 d, dmin; u8 scales[12]; u8 qh[32]; u8 qs[128]    as Q4_K plus a 5th bit:
 *                      bit v/32 of qh[v%32]
 *   Q6_K  (256, 210 B) u8 ql[128]; u8 qh[64]; i8 scales[16]; f16 d    half h = v/128, r = v%128:
 *                      low 4 bits = nibble r/64 of ql[64h + r%64], high 2 bits = bits 2*(r/32) of
 *                      qh[32h + r%32]; scale v/16; y = d*scale * (q - 32)
 *   IQ4_NL (32, 18 B)  f16 d; u8 qs[16]                 as Q4_0 but y = d * kvalues[q], kvalues =
 *                      {-127,-104,-83,-65,-49,-35,-22,-10,1,13,25,38,53,69,89,113}
 *   IQ4_XS(256, 136 B) f16 d; u16 scales_h; u8 scales_l[4]; u8 qs[128]    8 sub-blocks of 32, each
 *                      16 bytes of qs as IQ4_NL; 6-bit scale = nibble s%2 of scales_l[s/2] | bits
 *                      2s..2s+1 of scales_h << 4; y = d * (scale - 32) * kvalues[q]
 * Dequantisation does ggml's reference arithmetic in its order: step = d * scale, then step * q,
 * then - dmin * min or + m, all in f32 (so it agrees with ggml and gguf-py to the bit). */
typedef struct gguf_type_traits {
    const char *name;          /* "Q4_K" */
    int64_t block;             /* values per block (1 for F32/F16/BF16) */
    size_t bytes;              /* bytes per block */
    int n_scales;              /* f16 scale fields per block (d; d and dmin / m): 0, 1 or 2 */
    uint16_t scale_at[2];      /* their byte offsets in the block (for gguf_check_tensor) */
    /* n values (a multiple of block) from a block boundary: the scalar reference */
    void (*to_float)(const void *src, float *dst, int64_t n);
    /* reference quantiser for fixtures and tests (not fast, not ggml's search); never NULL here */
    void (*from_float_ref)(const float *src, void *dst, int64_t n);
} gguf_type_traits;

const gguf_type_traits *gguf_type_traits_of(uint32_t type);   /* NULL for a type we do not read */
const char *gguf_type_name(uint32_t type);       /* "Q4_1"; NULL if unknown */
int      gguf_type_known(uint32_t type);         /* one of the types this file supports */
int64_t  gguf_type_block(uint32_t type);         /* values per block (1 for F32/F16/BF16) */
size_t   gguf_type_block_bytes(uint32_t type);   /* bytes per block */
size_t   gguf_row_bytes(uint32_t type, int64_t n); /* n must be a multiple of the block */

/* Dequantise n values (a multiple of the block size) starting at a block boundary. */
void gguf_dequant(uint32_t type, const void *src, float *dst, int64_t n);

/* Scans every block's f16 scales (the traits' scale_at) of a tensor parsed from g: FASA_EFORMAT
 * with "'file': tensor 'name': block N has a non-finite scale" on a NaN or infinity, else 0.
 * Reads only the scale bytes (one or two u16 per block), so it costs about a pass over the
 * tensor's pages; model loading runs it over every tensor. */
int gguf_check_tensor(const gguf_file *g, const gguf_tensor *t, char *err);

/* fp16 / bf16 conversions (scalar, exact round-to-nearest-even on the way in). */
float    gguf_f16_to_f32(uint16_t h);
uint16_t gguf_f32_to_f16(float f);
float    gguf_bf16_to_f32(uint16_t h);
uint16_t gguf_f32_to_bf16(float f);

/* Quantisers for fixtures and tests (reference, not fast): n a multiple of the block. Plain
 * round-to-nearest (IQ4_*: the nearest table value) with scales chosen so that nothing clips,
 * except that Q4_0/Q5_0 map the block's extreme to -8/-16 exactly as ggml does, so a value of
 * the opposite sign and equal size lands one step short. Valid blocks for any reader, but not
 * ggml's error-minimising search. */
void gguf_quantize(uint32_t type, const float *src, void *dst, int64_t n);

/* Writer for fixtures: builds a GGUF v3 file in memory, then writes it atomically. Metadata is
 * kept in insertion order; each tensor's data is padded to general.alignment (32 unless set
 * with gguf_w_u32). Errors (bad tensor shape, out of memory) are remembered and reported by
 * gguf_writer_write; the bytes are checked with gguf_parse before anything is written. */
typedef struct gguf_writer gguf_writer;
gguf_writer *gguf_writer_new(void);
void gguf_writer_free(gguf_writer *w);
void gguf_w_u32(gguf_writer *w, const char *key, uint32_t v);
void gguf_w_f32(gguf_writer *w, const char *key, float v);
void gguf_w_bool(gguf_writer *w, const char *key, int v);
void gguf_w_str(gguf_writer *w, const char *key, const char *v);
void gguf_w_arr_str(gguf_writer *w, const char *key, const char *const *v, uint64_t n);
void gguf_w_arr_i32(gguf_writer *w, const char *key, const int32_t *v, uint64_t n);
void gguf_w_arr_f32(gguf_writer *w, const char *key, const float *v, uint64_t n);
/* data holds ggml-format bytes of the given type (gguf_row_bytes(type, ne[0]) * rows); copied. */
void gguf_w_tensor(gguf_writer *w, const char *name, uint32_t type, uint32_t n_dims,
                   const int64_t *ne, const void *data);
int  gguf_writer_write(gguf_writer *w, const char *path, char *err);  /* temp file + rename */
/* Any metadata value given as its encoded bytes (what follows the u32 type in the file), for
 * the types without a helper: U8..F64, nested arrays. */
void gguf_w_value(gguf_writer *w, const char *key, uint32_t vtype, const void *value, size_t nbytes);
/* The file's bytes without writing it: *out is malloc'ed, the caller frees it. */
int  gguf_writer_bytes(gguf_writer *w, uint8_t **out, size_t *len, char *err);

#endif

/* safetensors.h - stb-style single-header reader and writer for .safetensors files.
 *
 * In exactly one C file:   #define SAFETENSORS_IMPLEMENTATION
 *                          #include "safetensors.h"
 *
 *   st_file f;
 *   char err[ST_ERRLEN];
 *   if (st_open(&f, "model.safetensors", err) < 0) ...;     // mmap + st_parse
 *   const st_tensor *t = st_find(&f, "model.embed_tokens.weight");
 *   // t->dtype == ST_BF16, t->shape = {49152, 576}, t->data points into the mapping
 *   st_close(&f);
 *
 * Byte layout: u64 little-endian N (header length; rejected when N > 100,000,000), N bytes of
 * UTF-8 JSON object {name: {"dtype": "F32", "shape": [..], "data_offsets": [begin, end]}, ...,
 * "__metadata__": {string: string}}, then the data section. Offsets are relative to the data
 * section; tensors are contiguous with no gaps or overlaps; end - begin = prod(shape) x dtype
 * size; the last end + 8 + N equals the file size. Writers pad the header with spaces to a
 * multiple of 8 and sort tensors by name.
 *
 * Sharded models: model.safetensors.index.json {"weight_map": {tensor: file}}; st_sharded_open
 * opens every shard and finds tensors across them.
 *
 * The header is parsed by a small strict JSON parser inside this file (no dependencies).
 */
#ifndef SAFETENSORS_H
#define SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#define ST_ERRLEN 512
#define ST_MAX_DIMS 8

typedef enum st_dtype {
    ST_BOOL, ST_U8, ST_I8, ST_I16, ST_U16, ST_F16, ST_BF16, ST_I32, ST_U32, ST_F32,
    ST_I64, ST_U64, ST_F64, ST_F8_E4M3, ST_F8_E5M2, ST_NDTYPE
} st_dtype;

typedef struct st_tensor {
    char *name;
    st_dtype dtype;
    int n_dims;
    int64_t shape[ST_MAX_DIMS];   /* shape[0] outermost, as in the file */
    uint64_t begin, end;          /* relative to the data section */
    const void *data;             /* into the buffer */
} st_tensor;

typedef struct st_file {
    st_tensor *tensors;   /* sorted by data offset */
    int n_tensors;
    char **meta_keys, **meta_vals;   /* __metadata__, string values only */
    int n_meta;
    const uint8_t *buf;   /* whole file */
    size_t len;
    void *map;            /* mmap owned by st_open */
    char path[256];       /* for messages; empty when parsed from memory */
} st_file;

/* Pure parser: no I/O, validates everything listed above; err gets one line. Returns 0 or < 0. */
int  st_parse(st_file *f, const void *buf, size_t len, char *err);
int  st_open(st_file *f, const char *path, char *err);     /* messages name path */
void st_close(st_file *f);

const st_tensor *st_find(const st_file *f, const char *name);
const char *st_meta(const st_file *f, const char *key);
const char *st_dtype_name(st_dtype t);        /* "F32" */
int         st_dtype_from_name(const char *s);/* -1 if unknown */
size_t      st_dtype_size(st_dtype t);
int64_t     st_numel(const st_tensor *t);

/* Writer: collects tensors (data is referenced, not copied, until st_writer_write returns) and
 * metadata, then writes sorted, padded, via a temporary file renamed into place. */
typedef struct st_writer st_writer;
st_writer *st_writer_new(void);
void st_writer_free(st_writer *w);
int  st_writer_add(st_writer *w, const char *name, st_dtype dtype, int n_dims,
                   const int64_t *shape, const void *data);
int  st_writer_meta(st_writer *w, const char *key, const char *value);
int  st_writer_write(st_writer *w, const char *path, char *err);

/* Sharded: path is a directory holding model.safetensors.index.json, or the index file itself. */
typedef struct st_sharded {
    st_file *files;
    int n_files;
} st_sharded;
int  st_sharded_open(st_sharded *s, const char *path, char *err);
void st_sharded_close(st_sharded *s);
const st_tensor *st_sharded_find(const st_sharded *s, const char *name, const st_file **owner);

#endif /* SAFETENSORS_H */

#ifdef SAFETENSORS_IMPLEMENTATION
/* implementation goes here */
#endif

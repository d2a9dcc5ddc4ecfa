/* fuzz_safetensors.c - libFuzzer target for formats/safetensors.h.
 *
 * Any bytes go to st_parse; an accepted file must then satisfy what the header promises (every
 * tensor inside the buffer, contiguous, sized by its shape, findable by name, metadata strings
 * readable), and its data is read end to end so ASan sees any range that escaped the checks.
 * Input that starts with '{' is also tried as a sharded index (model.safetensors.index.json)
 * beside two fixed shards, through st_sharded_open.
 *
 * Self-contained like any user of an stb-style header: this file compiles the implementation.
 */
#define SAFETENSORS_IMPLEMENTATION
#include "safetensors.h"

#include "fuzz_common.h"

static char shard_index[128];

/* Two small valid shards, a.safetensors {"x", "y"} and b.safetensors {"z"}, for the index. */
static void make_shards(void)
{
    static const float data[4] = { 1, 2, 3, 4 };
    const int64_t two[1] = { 2 }, one[2] = { 1, 1 };
    char path[160], err[ST_ERRLEN];
    const char *dir = fuzz_dir();
    st_writer *w = st_writer_new();
    FUZZ_CHECK(w);
    st_writer_add(w, "x", ST_F32, 1, two, data);
    st_writer_add(w, "y", ST_F16, 2, one, data);
    st_writer_meta(w, "format", "pt");
    snprintf(path, sizeof path, "%s/a.safetensors", dir);
    FUZZ_CHECK(st_writer_write(w, path, err) == 0);
    st_writer_free(w);
    w = st_writer_new();
    FUZZ_CHECK(w);
    st_writer_add(w, "z", ST_I8, 0, NULL, data);
    snprintf(path, sizeof path, "%s/b.safetensors", dir);
    FUZZ_CHECK(st_writer_write(w, path, err) == 0);
    st_writer_free(w);
    snprintf(shard_index, sizeof shard_index, "%s/model.safetensors.index.json", dir);
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    make_shards();
    return 0;
}

static volatile uint8_t sink;

static void check_file(const st_file *f, const uint8_t *buf, size_t len)
{
    uint64_t n = 0;
    for (int i = 0; i < 8; i++) n |= (uint64_t)buf[i] << 8 * i;
    const uint8_t *data = buf + 8 + n;
    uint64_t dlen = len - 8 - n, pos = 0;
    for (int i = 0; i < f->n_tensors; i++) {
        const st_tensor *t = &f->tensors[i];
        FUZZ_CHECK(t->name && t->n_dims >= 0 && t->n_dims <= ST_MAX_DIMS);
        FUZZ_CHECK((unsigned)t->dtype < ST_NDTYPE && st_dtype_size(t->dtype) > 0);
        FUZZ_CHECK(strcmp(st_dtype_name(t->dtype), "?") != 0);
        FUZZ_CHECK(st_dtype_from_name(st_dtype_name(t->dtype)) == (int)t->dtype);
        int64_t numel = st_numel(t);
        FUZZ_CHECK(numel >= 0);
        FUZZ_CHECK(t->begin == pos && t->end >= t->begin && t->end <= dlen);
        FUZZ_CHECK(t->end - t->begin == (uint64_t)numel * st_dtype_size(t->dtype));
        FUZZ_CHECK((const uint8_t *)t->data == data + t->begin);
        const uint8_t *p = t->data;
        for (uint64_t k = 0; k < t->end - t->begin; k++) sink ^= p[k];
        FUZZ_CHECK(st_find(f, t->name) != NULL);
        pos = t->end;
    }
    FUZZ_CHECK(pos == dlen);
    for (int i = 0; i < f->n_meta; i++) {
        FUZZ_CHECK(f->meta_keys[i] && f->meta_vals[i]);
        FUZZ_CHECK(st_meta(f, f->meta_keys[i]) != NULL);
        sink ^= (uint8_t)strlen(f->meta_vals[i]);
    }
    FUZZ_CHECK(st_find(f, "__metadata__") == NULL);
}

static void try_index(const uint8_t *data, size_t size)
{
    char err[ST_ERRLEN];
    st_sharded s;
    if (fuzz_write(shard_index, data, size) < 0) return;
    memset(err, 0, sizeof err);
    if (st_sharded_open(&s, shard_index, err) == 0) {
        for (int i = 0; i < s.n_files; i++)
            for (int k = 0; k < s.files[i].n_tensors; k++) {
                const st_file *owner = NULL;
                FUZZ_CHECK(st_sharded_find(&s, s.files[i].tensors[k].name, &owner) != NULL && owner);
            }
        st_sharded_close(&s);
    } else {
        FUZZ_CHECK(s.files == NULL && s.n_files == 0);
        FUZZ_CHECK(fuzz_one_line(err, sizeof err));
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char err[ST_ERRLEN];
    st_file f = { 0 };
    memset(err, 0, sizeof err);
    /* A copy of exactly size bytes: ASan then flags any read past the end. */
    uint8_t *buf = malloc(size ? size : 1);
    FUZZ_CHECK(buf);
    if (size) memcpy(buf, data, size);
    int rc = st_parse(&f, buf, size, err);
    if (rc == 0) {
        check_file(&f, buf, size);
    } else {
        FUZZ_CHECK(rc == ST_EFORMAT || rc == ST_ENOMEM);
        FUZZ_CHECK(f.tensors == NULL && f.n_tensors == 0 && f.n_meta == 0);
        FUZZ_CHECK(fuzz_one_line(err, sizeof err));
    }
    st_close(&f);
    free(buf);
    if (size && data[0] == '{') try_index(data, size);
    return 0;
}

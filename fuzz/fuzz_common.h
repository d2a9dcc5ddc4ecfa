/* fuzz_common.h - helpers shared by the libFuzzer targets in fuzz/ and the seed generator.
 *
 * Targets are built by `make fuzz-build` (clang, -fsanitize=address,undefined,fuzzer) and run by
 * `make fuzz` on corpora in build-fuzz/corpus/<target>, seeded by build-fuzz/make_seeds. A target
 * that needs files (an index beside its shards, a model to check a profile against) keeps them in
 * one scratch directory under /dev/shm (else /tmp), made once and removed at exit.
 *
 * Invariant violations the sanitizers cannot see (a parser accepting what it promised to reject)
 * end in FUZZ_CHECK, which aborts so libFuzzer saves the input.
 */
#ifndef FASA_FUZZ_COMMON_H
#define FASA_FUZZ_COMMON_H

#include <dirent.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define FUZZ_CHECK(cond)                                                                      \
    do {                                                                                      \
        if (!(cond)) {                                                                        \
            fprintf(stderr, "%s:%d: invariant failed: %s\n", __FILE__, __LINE__, #cond);      \
            abort();                                                                          \
        }                                                                                     \
    } while (0)

/* The tiny model the profile and config targets load, and make_seeds calibrates: the same spec
 * and seed give the same weights, so seed profiles match its q/k hash. Every dim is a multiple
 * of 32 so that the quantised GGUF seeds can use it too. */
#define FUZZ_TINY_SPEC                                                                        \
    ((tiny_spec){ .arch = TINY_LLAMA, .n_layer = 1, .d_model = 32, .n_head = 2, .n_kv_head = 1, \
                  .d_head = 16, .d_ff = 32, .n_vocab = 32, .seed = 8 })

static char fuzz__dir[64];

static void fuzz__cleanup(void)
{
    DIR *d;
    struct dirent *de;
    if (!fuzz__dir[0] || !(d = opendir(fuzz__dir))) return;
    while ((de = readdir(d)))
        if (strcmp(de->d_name, ".") && strcmp(de->d_name, "..")) unlinkat(dirfd(d), de->d_name, 0);
    closedir(d);
    rmdir(fuzz__dir);
}

/* The scratch directory (flat: files only), made on first use. Aborts if it cannot be made. */
static inline const char *fuzz_dir(void)
{
    if (fuzz__dir[0]) return fuzz__dir;
    snprintf(fuzz__dir, sizeof fuzz__dir, "/dev/shm/fasa-fuzz-XXXXXX");
    if (!mkdtemp(fuzz__dir)) {
        snprintf(fuzz__dir, sizeof fuzz__dir, "/tmp/fasa-fuzz-XXXXXX");
        FUZZ_CHECK(mkdtemp(fuzz__dir) != NULL);
    }
    atexit(fuzz__cleanup);
    return fuzz__dir;
}

/* Writes n bytes to path (replacing it); 0 or -1. */
static inline int fuzz_write(const char *path, const void *data, size_t n)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    const char *p = data;
    if (fd < 0) return -1;
    while (n) {
        ssize_t k = write(fd, p, n);
        if (k <= 0) { close(fd); return -1; }
        p += k;
        n -= (size_t)k;
    }
    return close(fd);
}

/* An error message is one NUL-terminated line (STYLE.md: the library never prints more). */
static inline int fuzz_one_line(const char *err, size_t cap)
{
    const char *nul = memchr(err, 0, cap);
    return nul && !memchr(err, '\n', (size_t)(nul - err));
}

#endif

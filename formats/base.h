/* base.h - the bottom layer every other file builds on: status codes and error messages, a
 * clock, whole files in and out, architecture names. Includes only the C library.
 *
 *   char err[FASA_ERRLEN];
 *   char *text; size_t len;
 *   if (fasa_read_file("config.json", 0, &text, &len, err) < 0) { fprintf(stderr, "fasa: %s\n", err); ... }
 *   if (fasa_write_file("out.json", text, len, err) < 0) ...;   // temp file + fsync + rename
 *   free(text);
 *
 * Library functions never print or exit. They return 0 (or a count) on success and a negative
 * status on failure, after writing one line into err that names the file and the problem,
 * in the house style: "cannot open 'model.gguf': no such file".
 *
 * Every output file is written the same way (fasa_atomic_*): into a temporary file beside it
 * (same directory, so the rename is atomic), given the mode a plain fopen would give (0666 less
 * the umask), flushed to disk with one fsync, then renamed over the target. A failed or
 * interrupted write leaves the target as it was and no temporary file behind.
 */
#ifndef FASA_BASE_H
#define FASA_BASE_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#define FASA_ERRLEN 512

enum fasa_status {
    FASA_OK = 0,
    FASA_EIO = -1,      /* cannot open / read / write */
    FASA_EFORMAT = -2,  /* malformed or hostile file */
    FASA_EMISMATCH = -3,/* files that do not fit together (config vs tensors, profile vs model) */
    FASA_ENOMEM = -4,
    FASA_EARG = -5,     /* bad argument from the caller */
    FASA_EUNSUPPORTED = -6,
};

/* Writes a formatted message into err (which may be NULL) and returns status. */
int fasa_error(char *err, int status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Monotonic wall-clock seconds. */
double fasa_now(void);
/* "s" after a count other than one, for messages: "%d thread%s", n, fasa_plural(n). */
static inline const char *fasa_plural(long n) { return n == 1 ? "" : "s"; }

/* The whole file at path, malloc'ed and NUL-terminated (*len excludes the NUL; len may be
 * NULL). Files over max_len bytes (0: no limit) are refused as FASA_EFORMAT. */
int fasa_read_file(const char *path, size_t max_len, char **out, size_t *len, char *err);
/* All of f until end of file, NUL-terminated; NULL on a read error or out of memory. */
char *fasa_read_stream(FILE *f, size_t *len);

/* An output file under construction (see above). */
typedef struct fasa_atomic {
    char tmp[4096];     /* the temporary file's path */
    const char *path;   /* the target */
    int fd;
} fasa_atomic;

int  fasa_atomic_open(fasa_atomic *a, const char *path, char *err);
/* Writes all len bytes (retrying short writes). */
int  fasa_atomic_write(fasa_atomic *a, const void *buf, size_t len, char *err);
/* fsync, close, rename over the target. On failure the temporary file is removed. */
int  fasa_atomic_commit(fasa_atomic *a, char *err);
/* Closes and removes the temporary file (after a failure of the caller's own). */
void fasa_atomic_abort(fasa_atomic *a);
/* The three above for a buffer in memory. */
int  fasa_write_file(const char *path, const void *buf, size_t len, char *err);

/* Architectures fasa reads, by their names in GGUF's general.architecture and in config.json's
 * model_type (the same strings). */
enum fasa_arch { FASA_ARCH_LLAMA, FASA_ARCH_MISTRAL, FASA_ARCH_QWEN2, FASA_ARCH_QWEN3, FASA_ARCH_GEMMA3,
                 FASA_ARCH_COUNT };
const char *fasa_arch_name(enum fasa_arch a);
/* The architecture called name ("gemma3_text", Hugging Face's text-only Gemma 3, is gemma3), or -1. */
int fasa_arch_parse(const char *name);

#endif

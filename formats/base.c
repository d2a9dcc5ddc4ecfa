/* base.c - errors, clock, whole files, architecture names (base.h). */
#include "base.h"

#include <errno.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

int fasa_error(char *err, int status, const char *fmt, ...)
{
    if (err) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, FASA_ERRLEN, fmt, ap);
        va_end(ap);
    }
    return status;
}

double fasa_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

char *fasa_read_stream(FILE *f, size_t *len)
{
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    while (buf) {
        n += fread(buf + n, 1, cap - n - 1, f);
        if (ferror(f)) break;
        if (feof(f)) {
            buf[n] = 0;
            if (len) *len = n;
            return buf;
        }
        if (n + 1 == cap) {
            char *nb = realloc(buf, cap *= 2);
            if (!nb) break;
            buf = nb;
        }
    }
    free(buf);
    return NULL;
}

int fasa_read_file(const char *path, size_t max_len, char **out, size_t *len, char *err)
{
    FILE *f = fopen(path, "rb");
    if (!f) return fasa_error(err, FASA_EIO, "cannot open '%s': %s", path, strerror(errno));
    struct stat st;
    if (fstat(fileno(f), &st) == 0 && S_ISDIR(st.st_mode)) {
        fclose(f);
        return fasa_error(err, FASA_EIO, "cannot read '%s': is a directory", path);
    }
    if (max_len && fstat(fileno(f), &st) == 0 && (uint64_t)st.st_size > max_len) {
        fclose(f);
        return fasa_error(err, FASA_EFORMAT, "'%s' is too large (%lld bytes; at most %zu)", path,
                          (long long)st.st_size, max_len);
    }
    size_t n;
    errno = 0;
    char *buf = fasa_read_stream(f, &n);
    const int e = errno;
    fclose(f);
    if (!buf) return e == ENOMEM || !e ? fasa_error(err, FASA_ENOMEM, "out of memory reading '%s'", path)
                                       : fasa_error(err, FASA_EIO, "cannot read '%s': %s", path, strerror(e));
    if (max_len && n > max_len) {   /* grew while we read it */
        free(buf);
        return fasa_error(err, FASA_EFORMAT, "'%s' is too large (at most %zu bytes)", path, max_len);
    }
    *out = buf;
    if (len) *len = n;
    return 0;
}

int fasa_atomic_open(fasa_atomic *a, const char *path, char *err)
{
    a->path = path;
    a->fd = -1;
    if (snprintf(a->tmp, sizeof a->tmp, "%s.tmp.XXXXXX", path) >= (int)sizeof a->tmp)
        return fasa_error(err, FASA_EARG, "cannot create '%s': path too long", path);
    if ((a->fd = mkstemp(a->tmp)) < 0)
        return fasa_error(err, FASA_EIO, "cannot create '%s': %s", path, strerror(errno));
    /* mkstemp makes 0600 files; give the output the mode a plain fopen would */
    const mode_t mask = umask(0);
    umask(mask);
    if (fchmod(a->fd, 0666 & ~mask) != 0) {
        const int e = errno;
        fasa_atomic_abort(a);
        return fasa_error(err, FASA_EIO, "cannot create '%s': %s", path, strerror(e));
    }
    return 0;
}

int fasa_atomic_write(fasa_atomic *a, const void *buf, size_t len, char *err)
{
    const char *p = buf;
    while (len) {
        const ssize_t w = write(a->fd, p, len);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return fasa_error(err, FASA_EIO, "cannot write '%s': %s", a->path, strerror(w < 0 ? errno : EIO));
        p += w, len -= (size_t)w;
    }
    return 0;
}

int fasa_atomic_commit(fasa_atomic *a, char *err)
{
    int e = fsync(a->fd) == 0 ? 0 : errno;
    if (close(a->fd) != 0 && !e) e = errno;
    a->fd = -1;
    if (!e && rename(a->tmp, a->path) != 0) e = errno;
    if (e) {
        unlink(a->tmp);
        return fasa_error(err, FASA_EIO, "cannot write '%s': %s", a->path, strerror(e));
    }
    return 0;
}

void fasa_atomic_abort(fasa_atomic *a)
{
    if (a->fd >= 0) close(a->fd);
    a->fd = -1;
    unlink(a->tmp);
}

int fasa_write_file(const char *path, const void *buf, size_t len, char *err)
{
    fasa_atomic a;
    int rc = fasa_atomic_open(&a, path, err);
    if (rc < 0) return rc;
    if ((rc = fasa_atomic_write(&a, buf, len, err)) < 0) {
        fasa_atomic_abort(&a);
        return rc;
    }
    return fasa_atomic_commit(&a, err);
}

static const char *const arch_names[FASA_ARCH_COUNT] = {
    [FASA_ARCH_LLAMA] = "llama", [FASA_ARCH_MISTRAL] = "mistral", [FASA_ARCH_QWEN2] = "qwen2",
    [FASA_ARCH_QWEN3] = "qwen3", [FASA_ARCH_GEMMA3] = "gemma3",
};

const char *fasa_arch_name(enum fasa_arch a)
{
    return a >= 0 && a < FASA_ARCH_COUNT ? arch_names[a] : "?";
}

int fasa_arch_parse(const char *name)
{
    for (int a = 0; a < FASA_ARCH_COUNT; a++)
        if (!strcmp(name, arch_names[a])) return a;
    return !strcmp(name, "gemma3_text") ? FASA_ARCH_GEMMA3 : -1;
}

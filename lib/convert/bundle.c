/* bundle.c - .fasa bundles: reproducible tar (libarchive) + MANIFEST.json with xxh64 checksums. */
#include "bundle.h"

#include <archive.h>
#include <archive_entry.h>
#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#define IO_CHUNK (1 << 20)
#define MANIFEST_MAX (1 << 20)

typedef struct member {
    char name[128];
    uint64_t size, hash;
    int seen;
} member;

/* Flat, portable member names only: nothing a tar reader could resolve outside its directory. */
static int name_ok(const char *s)
{
    size_t n = strlen(s);
    if (n == 0 || n >= sizeof ((member *)0)->name || s[0] == '.') return 0;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
              c == '_' || c == '-'))
            return 0;
    }
    return 1;
}

static int write_all(int fd, const void *p, size_t n)
{
    const char *c = p;
    while (n) {
        ssize_t k = write(fd, c, n);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) {
            if (k == 0) errno = EIO;
            return -1;
        }
        c += k;
        n -= (size_t)k;
    }
    return 0;
}

/* ---------------------------------------------------------------- writing */

/* Size and xxh64 of a member file, read once before the archive is written. */
static int member_stat(const char *dir, const char *name, member *mb, void *buf, char *err)
{
    char p[8192];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    int fd = open(p, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return fasa_error(err, FASA_EIO, "cannot open '%s': %s", p, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return fasa_error(err, FASA_EIO, "cannot bundle '%s': not a regular file", p);
    }
    XXH64_state_t *h = XXH64_createState();
    XXH64_reset(h, 0);
    uint64_t total = 0;
    ssize_t k;
    while ((k = read(fd, buf, IO_CHUNK)) != 0) {
        if (k < 0 && errno == EINTR) continue;
        if (k < 0) {
            int e = errno;
            XXH64_freeState(h);
            close(fd);
            return fasa_error(err, FASA_EIO, "cannot read '%s': %s", p, strerror(e));
        }
        XXH64_update(h, buf, (size_t)k);
        total += (uint64_t)k;
    }
    close(fd);
    snprintf(mb->name, sizeof mb->name, "%s", name);
    mb->size = total;
    mb->hash = XXH64_digest(h);
    XXH64_freeState(h);
    return 0;
}

static char *manifest_json(const member *mb, int n)
{
    cJSON *o = cJSON_CreateObject(), *arr;
    char hex[32];
    cJSON_AddStringToObject(o, "format", "fasa-bundle");
    cJSON_AddNumberToObject(o, "version", 1);
    cJSON_AddStringToObject(o, "checksum", "xxh64");
    arr = cJSON_AddArrayToObject(o, "members");
    for (int i = 0; i < n; i++) {
        cJSON *e = cJSON_CreateObject();
        cJSON_AddStringToObject(e, "name", mb[i].name);
        cJSON_AddNumberToObject(e, "size", (double)mb[i].size);
        snprintf(hex, sizeof hex, "%016" PRIx64, mb[i].hash);
        cJSON_AddStringToObject(e, "xxh64", hex);
        cJSON_AddItemToArray(arr, e);
    }
    char *s = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    return s;
}

/* One header with the fixed metadata that makes the bytes reproducible. */
static int entry_header(struct archive *a, const char *name, uint64_t size)
{
    struct archive_entry *e = archive_entry_new();
    if (!e) return ARCHIVE_FATAL;
    archive_entry_set_pathname(e, name);
    archive_entry_set_size(e, (la_int64_t)size);
    archive_entry_set_filetype(e, AE_IFREG);
    archive_entry_set_perm(e, 0644);
    archive_entry_set_mtime(e, 0, 0);
    archive_entry_set_uid(e, 0);
    archive_entry_set_gid(e, 0);
    int r = archive_write_header(a, e);
    archive_entry_free(e);
    return r;
}

static int archive_put(struct archive *a, const void *p, size_t n)
{
    return archive_write_data(a, p, n) == (la_ssize_t)n ? 0 : -1;
}

/* Streams one member into the archive, checking it still has the size and hash measured before. */
static int member_copy(struct archive *a, const char *dir, const member *mb, void *buf,
                       const char *path, char *err)
{
    char p[8192];
    snprintf(p, sizeof p, "%s/%s", dir, mb->name);
    int fd = open(p, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return fasa_error(err, FASA_EIO, "cannot open '%s': %s", p, strerror(errno));
    if (entry_header(a, mb->name, mb->size) < ARCHIVE_WARN) {
        close(fd);
        return fasa_error(err, FASA_EIO, "cannot write '%s': %s", path, archive_error_string(a));
    }
    XXH64_state_t *h = XXH64_createState();
    XXH64_reset(h, 0);
    uint64_t total = 0;
    ssize_t k;
    int rc = 0;
    while (rc == 0 && (k = read(fd, buf, IO_CHUNK)) != 0) {
        if (k < 0 && errno == EINTR) continue;
        if (k < 0) { rc = fasa_error(err, FASA_EIO, "cannot read '%s': %s", p, strerror(errno)); break; }
        XXH64_update(h, buf, (size_t)k);
        total += (uint64_t)k;
        if (total > mb->size) break;
        if (archive_put(a, buf, (size_t)k) < 0)
            rc = fasa_error(err, FASA_EIO, "cannot write '%s': %s", path, archive_error_string(a));
    }
    if (rc == 0 && (total != mb->size || XXH64_digest(h) != mb->hash))
        rc = fasa_error(err, FASA_EIO, "cannot bundle '%s': it changed while being written", p);
    XXH64_freeState(h);
    close(fd);
    return rc;
}

int bundle_write(const char *path, const char *dir, const char *const *names, int n, int zstd, char *err)
{
    if (n < 0 || n > BUNDLE_MAX_MEMBERS) return fasa_error(err, FASA_EARG, "cannot write '%s': %d members", path, n);
    for (int i = 0; i < n; i++) {
        if (!name_ok(names[i]) || !strcmp(names[i], BUNDLE_MANIFEST))
            return fasa_error(err, FASA_EARG, "cannot write '%s': bad member name '%s'", path, names[i]);
        for (int j = 0; j < i; j++)
            if (!strcmp(names[i], names[j]))
                return fasa_error(err, FASA_EARG, "cannot write '%s': member '%s' given twice", path, names[i]);
    }
    member *mb = calloc(n ? n : 1, sizeof *mb);
    void *buf = malloc(IO_CHUNK);
    char *manifest = NULL;
    struct archive *a = NULL;
    fasa_atomic out;
    int opened = 0, rc = 0;
    if (!mb || !buf) { rc = fasa_error(err, FASA_ENOMEM, "out of memory"); goto out; }
    for (int i = 0; i < n && rc == 0; i++) rc = member_stat(dir, names[i], &mb[i], buf, err);
    if (rc < 0) goto out;
    if (!(manifest = manifest_json(mb, n))) { rc = fasa_error(err, FASA_ENOMEM, "out of memory"); goto out; }

    if ((rc = fasa_atomic_open(&out, path, err)) < 0) goto out;
    opened = 1;
    a = archive_write_new();
    if (!a || archive_write_set_format_pax_restricted(a) != ARCHIVE_OK) {
        rc = fasa_error(err, FASA_EIO, "cannot write '%s': libarchive has no pax writer", path);
        goto out;
    }
    /* ARCHIVE_WARN: libarchive runs the external zstd program instead; output is the same. */
    if (zstd && archive_write_add_filter_zstd(a) < ARCHIVE_WARN) {
        rc =
            fasa_error(err, FASA_EUNSUPPORTED, "cannot write '%s': no zstd support: %s", path, archive_error_string(a));
        goto out;
    }
    if (archive_write_open_fd(a, out.fd) != ARCHIVE_OK) {
        rc = fasa_error(err, FASA_EIO, "cannot write '%s': %s", path, archive_error_string(a));
        goto out;
    }
    size_t mlen = strlen(manifest);
    if (entry_header(a, BUNDLE_MANIFEST, mlen) < ARCHIVE_WARN || archive_put(a, manifest, mlen) < 0) {
        rc = fasa_error(err, FASA_EIO, "cannot write '%s': %s", path, archive_error_string(a));
        goto out;
    }
    for (int i = 0; i < n && rc == 0; i++) rc = member_copy(a, dir, &mb[i], buf, path, err);
    if (rc < 0) goto out;
    if (archive_write_close(a) != ARCHIVE_OK) {
        rc = fasa_error(err, FASA_EIO, "cannot write '%s': %s", path, archive_error_string(a));
        goto out;
    }
    archive_write_free(a);   /* the fd stays ours */
    a = NULL;
    opened = 0;
    rc = fasa_atomic_commit(&out, err);
out:
    if (a) archive_write_free(a);   /* closes first when still open */
    if (opened) fasa_atomic_abort(&out);
    free(manifest);
    free(buf);
    free(mb);
    return rc;
}

/* ---------------------------------------------------------------- reading */

static int parse_manifest(const char *text, size_t len, member **out, int *n_out, const char *path, char *err)
{
    cJSON *o = cJSON_ParseWithLength(text, len);
    const cJSON *fmt = cJSON_GetObjectItemCaseSensitive(o, "format");
    const cJSON *ver = cJSON_GetObjectItemCaseSensitive(o, "version");
    const cJSON *sum = cJSON_GetObjectItemCaseSensitive(o, "checksum");
    const cJSON *arr = cJSON_GetObjectItemCaseSensitive(o, "members"), *e;
    int rc = 0, n = 0;
    member *mb = NULL;
    if (!cJSON_IsObject(o) || !cJSON_IsString(fmt) || strcmp(fmt->valuestring, "fasa-bundle")) {
        rc = fasa_error(err, FASA_EFORMAT, "'%s': %s is not a fasa bundle manifest", path, BUNDLE_MANIFEST);
        goto out;
    }
    if (!cJSON_IsNumber(ver) || ver->valuedouble != 1) {
        rc = fasa_error(err, FASA_EFORMAT, "'%s': bundle version %g, this fasa reads version 1", path,
                        cJSON_IsNumber(ver) ? ver->valuedouble : -1.0);
        goto out;
    }
    if (!cJSON_IsString(sum) || strcmp(sum->valuestring, "xxh64")) {
        rc = fasa_error(err, FASA_EUNSUPPORTED, "'%s': manifest checksum '%s' is not supported (xxh64 only)", path,
                        cJSON_IsString(sum) ? sum->valuestring : "?");
        goto out;
    }
    if (!cJSON_IsArray(arr) || cJSON_GetArraySize(arr) > BUNDLE_MAX_MEMBERS) {
        rc = fasa_error(err, FASA_EFORMAT, "'%s': manifest 'members' must list at most %d files", path,
                        BUNDLE_MAX_MEMBERS);
        goto out;
    }
    if (!(mb = calloc(cJSON_GetArraySize(arr) + 1, sizeof *mb))) {
        rc = fasa_error(err, FASA_ENOMEM, "out of memory");
        goto out;
    }
    cJSON_ArrayForEach(e, arr) {
        const cJSON *nm = cJSON_GetObjectItemCaseSensitive(e, "name");
        const cJSON *sz = cJSON_GetObjectItemCaseSensitive(e, "size");
        const cJSON *hx = cJSON_GetObjectItemCaseSensitive(e, "xxh64");
        char *end = NULL;
        if (!cJSON_IsString(nm) || !name_ok(nm->valuestring) || !strcmp(nm->valuestring, BUNDLE_MANIFEST) ||
            !cJSON_IsNumber(sz) || sz->valuedouble < 0 || sz->valuedouble > 9007199254740992.0 ||
            sz->valuedouble != (double)(uint64_t)sz->valuedouble || !cJSON_IsString(hx) ||
            strlen(hx->valuestring) != 16 ||
            (mb[n].hash = strtoull(hx->valuestring, &end, 16), *end)) {
            rc = fasa_error(err, FASA_EFORMAT, "'%s': manifest entry %d is malformed", path, n);
            goto out;
        }
        for (int j = 0; j < n; j++)
            if (!strcmp(mb[j].name, nm->valuestring)) {
                rc = fasa_error(err, FASA_EFORMAT, "'%s': manifest lists '%s' twice", path, nm->valuestring);
                goto out;
            }
        snprintf(mb[n].name, sizeof mb[n].name, "%s", nm->valuestring);
        mb[n].size = (uint64_t)sz->valuedouble;
        n++;
    }
out:
    cJSON_Delete(o);
    if (rc < 0) { free(mb); mb = NULL; n = 0; }
    *out = mb;
    *n_out = n;
    return rc;
}

/* The data of the current entry: into fd (>= 0) or nowhere, hashing and counting as it goes. */
static int entry_read(struct archive *a, int fd, void *buf, uint64_t *size, uint64_t *hash,
                      const char *path, const char *name, const char *outp, char *err)
{
    XXH64_state_t *h = XXH64_createState();
    XXH64_reset(h, 0);
    uint64_t total = 0;
    la_ssize_t k;
    int rc = 0;
    while ((k = archive_read_data(a, buf, IO_CHUNK)) != 0) {
        if (k < 0) {
            rc = fasa_error(err, FASA_EFORMAT, "'%s': truncated or damaged at member '%s': %s", path, name,
                            archive_error_string(a) ? archive_error_string(a) : "read error");
            break;
        }
        XXH64_update(h, buf, (size_t)k);
        total += (uint64_t)k;
        if (fd >= 0 && write_all(fd, buf, (size_t)k) < 0) {
            rc = fasa_error(err, FASA_EIO, "cannot write '%s': %s", outp, strerror(errno));
            break;
        }
    }
    *size = total;
    *hash = XXH64_digest(h);
    XXH64_freeState(h);
    return rc;
}

static const char *arch_msg(struct archive *a)
{
    const char *s = archive_error_string(a);
    return s ? s : "unknown error";
}

/* Verifies (and with outdir extracts) the bundle a has been opened on; path names it. */
static int bundle_read(struct archive *a, const char *path, const char *outdir, char *err)
{
    struct archive_entry *e;
    member *mb = NULL;
    int n = 0, rc = 0, r;
    char *text = NULL;
    void *buf = malloc(IO_CHUNK);
    if (!buf) { rc = fasa_error(err, FASA_ENOMEM, "out of memory"); goto out; }

    /* The manifest comes first. */
    r = archive_read_next_header(a, &e);
    if (r == ARCHIVE_EOF) {
        rc = fasa_error(err, FASA_EFORMAT, "'%s': empty archive, no %s", path, BUNDLE_MANIFEST);
        goto out;
    }
    if (r < ARCHIVE_WARN) {
        rc = fasa_error(err, FASA_EFORMAT, "'%s': not a fasa bundle: %s", path, arch_msg(a));
        goto out;
    }
    if (strcmp(archive_entry_pathname(e) ? archive_entry_pathname(e) : "", BUNDLE_MANIFEST) ||
        archive_entry_size(e) <= 0 || archive_entry_size(e) > MANIFEST_MAX) {
        rc = fasa_error(err, FASA_EFORMAT, "'%s': not a fasa bundle (the first member is not %s)", path,
                        BUNDLE_MANIFEST);
        goto out;
    }
    size_t mlen = (size_t)archive_entry_size(e), got = 0;
    if (!(text = malloc(mlen + 1))) { rc = fasa_error(err, FASA_ENOMEM, "out of memory"); goto out; }
    while (got < mlen) {
        la_ssize_t k = archive_read_data(a, text + got, mlen - got);
        if (k <= 0) {
            rc = fasa_error(err, FASA_EFORMAT, "'%s': truncated or damaged at member '%s': %s", path, BUNDLE_MANIFEST,
                            k < 0 ? arch_msg(a) : "short read");
            goto out;
        }
        got += (size_t)k;
    }
    if ((rc = parse_manifest(text, mlen, &mb, &n, path, err)) < 0) goto out;

    for (;;) {
        r = archive_read_next_header(a, &e);
        if (r == ARCHIVE_EOF) break;
        if (r < ARCHIVE_WARN) {
            rc = fasa_error(err, FASA_EFORMAT, "'%s': truncated or damaged: %s", path, arch_msg(a));
            goto out;
        }
        const char *name = archive_entry_pathname(e);
        if (!name || !name_ok(name)) {
            rc = fasa_error(err, FASA_EFORMAT, "'%s': member name '%.64s' is not allowed", path, name ? name : "");
            goto out;
        }
        int i = 0;
        while (i < n && strcmp(mb[i].name, name)) i++;
        if (i == n) {
            rc = fasa_error(err, FASA_EFORMAT, "'%s': member '%s' is not in the manifest", path, name);
            goto out;
        }
        if (mb[i].seen) { rc = fasa_error(err, FASA_EFORMAT, "'%s': member '%s' appears twice", path, name); goto out; }
        if (archive_entry_filetype(e) != AE_IFREG) {
            rc = fasa_error(err, FASA_EFORMAT, "'%s': member '%s' is not a regular file", path, name);
            goto out;
        }
        char outp[8192];
        int fd = -1;
        if (outdir) {
            snprintf(outp, sizeof outp, "%s/%s", outdir, name);
            if ((fd = open(outp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644)) < 0) {
                rc = fasa_error(err, FASA_EIO, "cannot create '%s': %s", outp, strerror(errno));
                goto out;
            }
        }
        mb[i].seen = 1 + (outdir != NULL);   /* 2: a file to remove if a later member fails */
        uint64_t size, hash;
        rc = entry_read(a, fd, buf, &size, &hash, path, name, outdir ? outp : "", err);
        if (fd >= 0 && close(fd) != 0 && rc == 0)
            rc = fasa_error(err, FASA_EIO, "cannot write '%s': %s", outp, strerror(errno));
        if (rc < 0) goto out;
        if (size != mb[i].size) {
            rc = fasa_error(err, FASA_EFORMAT, "'%s': member '%s' has %" PRIu64 " bytes, the manifest says %" PRIu64,
                            path, name, size, mb[i].size);
            goto out;
        }
        if (hash != mb[i].hash) {
            rc = fasa_error(err, FASA_EFORMAT,
                            "'%s': member '%s' is corrupt (xxh64 %016" PRIx64 ", the manifest says %016" PRIx64 ")",
                            path, name, hash, mb[i].hash);
            goto out;
        }
    }
    for (int i = 0; i < n; i++)
        if (!mb[i].seen) {
            rc =
                fasa_error(err, FASA_EFORMAT, "'%s': member '%s' listed in the manifest is missing (truncated bundle?)",
                           path, mb[i].name);
            goto out;
        }
out:
    if (rc < 0 && outdir)
        for (int i = 0; i < n; i++)
            if (mb[i].seen == 2) {
                char p[8192];
                snprintf(p, sizeof p, "%s/%s", outdir, mb[i].name);
                unlink(p);
            }
    free(text);
    free(mb);
    free(buf);
    return rc;
}

/* Only what bundle_write makes: tar, plain or zstd. Not archive_read_support_filter_all, whose
 * lrzip, grzip, lzop (and others, depending on the build) run an external program on the
 * file's bytes: a hostile .fasa must not choose what fasa executes. */
static struct archive *reader_new(void)
{
    struct archive *a = archive_read_new();
    if (a) {
        archive_read_support_filter_zstd(a);   /* ARCHIVE_WARN: runs zstd -d, as the writer would */
        archive_read_support_format_tar(a);
    }
    return a;
}

int bundle_open(const char *path, const char *outdir, char *err)
{
    struct archive *a = reader_new();
    struct stat st;
    int rc;
    if (!a) rc = fasa_error(err, FASA_ENOMEM, "out of memory");
    else if (stat(path, &st) != 0) rc = fasa_error(err, FASA_EIO, "cannot open '%s': %s", path, strerror(errno));
    else if (!S_ISREG(st.st_mode)) rc = fasa_error(err, FASA_EIO, "cannot open '%s': not a regular file", path);
    else if (archive_read_open_filename(a, path, 1 << 16) != ARCHIVE_OK)
        rc = fasa_error(err, FASA_EFORMAT, "'%s': not a fasa bundle: %s", path, arch_msg(a));
    else
        rc = bundle_read(a, path, outdir, err);
    if (a) archive_read_free(a);
    return rc;
}

int bundle_open_mem(const void *data, size_t len, const char *name, const char *outdir, char *err)
{
    struct archive *a = reader_new();
    int rc;
    if (!name) name = "bundle";
    if (!a) rc = fasa_error(err, FASA_ENOMEM, "out of memory");
    else if (archive_read_open_memory(a, data, len) != ARCHIVE_OK)
        rc = fasa_error(err, FASA_EFORMAT, "'%s': not a fasa bundle: %s", name, arch_msg(a));
    else
        rc = bundle_read(a, name, outdir, err);
    if (a) archive_read_free(a);
    return rc;
}

int bundle_extract_temp(const char *path, char *dir, size_t cap, char *err)
{
    const char *base = getenv("TMPDIR");
    if (!base || !*base) base = "/tmp";
    if ((size_t)snprintf(dir, cap, "%s/fasa-bundle-XXXXXX", base) >= cap)
        return fasa_error(err, FASA_EARG, "'%s': temporary directory name too long", path);
    if (!mkdtemp(dir))
        return fasa_error(err, FASA_EIO, "cannot create a directory in '%s' to open '%s': %s", base, path,
                          strerror(errno));
    int rc = bundle_open(path, dir, err);
    if (rc < 0) rmdir(dir);
    return rc;
}

void bundle_remove_dir(const char *dir)
{
    DIR *d = opendir(dir);
    if (d) {
        struct dirent *de;
        while ((de = readdir(d)))
            if (strcmp(de->d_name, ".") && strcmp(de->d_name, ".."))
                unlinkat(dirfd(d), de->d_name, 0);
        closedir(d);
    }
    rmdir(dir);
}

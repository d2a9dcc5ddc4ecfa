/* fuzz_bundle.c - libFuzzer target for lib/bundle.c's .fasa reader (libarchive + manifest).
 *
 * Any bytes go to bundle_open_mem without an output directory (verify only: manifest first,
 * every member listed once, sizes and xxh64 checksums). A bundle that verifies is then
 * extracted into an empty scratch directory, which must then hold only regular files, and the
 * directory is emptied again.
 */
#include <sys/stat.h>

#include "bundle.h"
#include "fuzz_common.h"

static char out_dir[160];

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    snprintf(out_dir, sizeof out_dir, "%s", fuzz_dir());
    return 0;
}

/* Files in out_dir; removes them. */
static int drain(void)
{
    DIR *d = opendir(out_dir);
    struct dirent *de;
    int n = 0;
    FUZZ_CHECK(d);
    while ((de = readdir(d)))
        if (strcmp(de->d_name, ".") && strcmp(de->d_name, "..")) {
            struct stat st;
            FUZZ_CHECK(fstatat(dirfd(d), de->d_name, &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISREG(st.st_mode));
            unlinkat(dirfd(d), de->d_name, 0);
            n++;
        }
    closedir(d);
    return n;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char err[FASA_ERRLEN];
    uint8_t *buf = malloc(size ? size : 1);   /* exactly size bytes: ASan sees overreads */
    FUZZ_CHECK(buf);
    memcpy(buf, data, size);
    memset(err, 0, sizeof err);
    int rc = bundle_open_mem(buf, size, "fuzz.fasa", NULL, err);
    if (rc == 0) {
        FUZZ_CHECK(bundle_open_mem(buf, size, "fuzz.fasa", out_dir, err) == 0);
        drain();
    } else {
        FUZZ_CHECK(rc == FASA_EFORMAT || rc == FASA_EUNSUPPORTED || rc == FASA_ENOMEM);
        FUZZ_CHECK(drain() == 0);
    }
    free(buf);
    return 0;
}

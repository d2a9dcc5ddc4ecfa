/* `fasa help`, the manual pages and `make install`: the binary named by FASA_BIN (make test sets
 * it), the source tree found above it. */
#include <criterion/criterion.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "fixtures.h"

/* The source tree: the nearest directory above the binary with a Makefile and man/fasa.1
 * (bin/fasa -> .., build-asan/bin/fasa -> ../..). */
static const char *source_root(void)
{
    static char root[PATH_MAX];
    char p[PATH_MAX + 32];
    if (!realpath(fx_bin(), root)) return NULL;
    for (int up = 0; up < 4; up++) {
        char *slash = strrchr(root, '/');
        if (!slash || slash == root) return NULL;
        *slash = 0;
        snprintf(p, sizeof p, "%s/man/fasa.1", root);
        if (access(p, R_OK) == 0) {
            snprintf(p, sizeof p, "%s/Makefile", root);
            if (access(p, R_OK) == 0) return root;
        }
    }
    return NULL;
}

Test(help, run_page_mentions_budget)
{
    char *out, *err, line[PATH_MAX + 64];
    snprintf(line, sizeof line, "%s help run", fx_bin());
    cr_assert_eq(fx_sh(line, &out, &err), 0, "'fasa help run' failed: %s", err);
    cr_expect(strstr(out, "--budget") != NULL, "'fasa help run' does not mention --budget:\n%s", out);
    cr_expect(strstr(out, "EXIT STATUS") != NULL || strstr(out, "usage: fasa run") != NULL,
              "neither the manual page nor the --help text:\n%s", out);
    free(out); free(err);
}

/* Without man(1) on PATH, help prints the command's --help text. */
Test(help, falls_back_to_usage_without_man)
{
    char *out, *err, line[PATH_MAX + 64];
    snprintf(line, sizeof line, "PATH=/nonexistent %s help bench", fx_bin());
    cr_assert_eq(fx_sh(line, &out, &err), 0, "%s", err);
    cr_expect(strncmp(out, "usage: fasa bench", 17) == 0, "%s", out);
    cr_expect(strstr(out, "--policy") != NULL);
    free(out); free(err);
    snprintf(line, sizeof line, "PATH=/nonexistent %s help", fx_bin());
    cr_assert_eq(fx_sh(line, &out, &err), 0, "%s", err);
    cr_expect(strstr(out, "usage: fasa <command>") != NULL, "%s", out);
    cr_expect(strstr(out, "help") != NULL);
    free(out); free(err);
}

Test(help, unknown_command_is_one_line_and_exit_2)
{
    char *out, *err, line[PATH_MAX + 64];
    snprintf(line, sizeof line, "%s help nosuch", fx_bin());
    cr_expect_eq(fx_sh(line, &out, &err), 2);
    cr_expect_eq(fx_lines(err), 1, "stderr is not one line: %s", err);
    cr_expect(strstr(err, "fasa: 'nosuch' is not a fasa command") != NULL, "%s", err);
    cr_expect_eq(out[0], 0, "stdout: %s", out);
    free(out); free(err);
    snprintf(line, sizeof line, "%s help run bench", fx_bin());
    cr_expect_eq(fx_sh(line, &out, &err), 2);
    cr_expect_eq(fx_lines(err), 1, "%s", err);
    free(out); free(err);
}

/* Every page the commands point to exists in the source tree. */
Test(help, every_command_has_a_page)
{
    const char *root = source_root();
    cr_assert(root != NULL, "no source tree above '%s'", fx_bin());
    const char *pages[] = { "fasa", "fasa-inspect", "fasa-run", "fasa-calibrate", "fasa-convert", "fasa-bench" };
    char p[PATH_MAX + 64];
    for (size_t i = 0; i < sizeof pages / sizeof *pages; i++) {
        snprintf(p, sizeof p, "%s/man/%s.1", root, pages[i]);
        cr_expect_eq(access(p, R_OK), 0, "missing %s", p);
    }
}

/* make install PREFIX=tmp: a binary that runs and finds its installed pages, the library, its
 * headers, a pkg-config file, the completion; make uninstall takes them away again. */
Test(help, make_install_prefix, .timeout = 120)
{
    const char *root = source_root();
    cr_assert(root != NULL, "no source tree above '%s'", fx_bin());
    char *prefix = tmpdir_make();
    char line[3 * PATH_MAX], p[PATH_MAX + 128], *out, *err;
    /* make test's own flags (BUILD, BIN of a sanitizer run) reach this make through MAKEFLAGS;
     * -o all: install what make test built, never relink it under the other tests' feet */
    snprintf(line, sizeof line, "make -s -C %s -o all install PREFIX=%s", root, prefix);
    cr_assert_eq(fx_sh(line, &out, &err), 0, "make install failed:\n%s\n%s", out, err);
    free(out); free(err);

    snprintf(line, sizeof line, "cd / && %s/bin/fasa --help", prefix);
    cr_expect_eq(fx_sh(line, &out, &err), 0, "%s", err);
    cr_expect(strstr(out, "usage: fasa") != NULL, "%s", out);
    free(out); free(err);
    snprintf(line, sizeof line, "cd / && %s/bin/fasa help convert", prefix);
    cr_expect_eq(fx_sh(line, &out, &err), 0, "%s", err);
    cr_expect(strstr(out, "--bundle") != NULL, "%s", out);
    free(out); free(err);

    const char *files[] = { "share/man/man1/fasa.1", "share/man/man1/fasa-run.1", "lib/libfasa.a",
                            "include/fasa/model.h", "include/fasa/gguf.h", "lib/pkgconfig/fasa.pc",
                            "share/bash-completion/completions/fasa" };
    for (size_t i = 0; i < sizeof files / sizeof *files; i++) {
        snprintf(p, sizeof p, "%s/%s", prefix, files[i]);
        cr_expect_eq(access(p, R_OK), 0, "make install did not write %s", p);
    }
    snprintf(p, sizeof p, "%s/lib/pkgconfig/fasa.pc", prefix);
    FILE *f = fopen(p, "r");
    char pc[4096] = "";
    if (f) { size_t n = fread(pc, 1, sizeof pc - 1, f); pc[n] = 0; fclose(f); }
    char want[PATH_MAX + 16];
    snprintf(want, sizeof want, "prefix=%s\n", prefix);
    cr_expect(strstr(pc, want) != NULL, "fasa.pc lacks '%s':\n%s", want, pc);
    cr_expect(strstr(pc, "-lfasa") != NULL && strstr(pc, "-lcjson") != NULL, "%s", pc);

    snprintf(line, sizeof line, "make -s -C %s uninstall PREFIX=%s", root, prefix);
    cr_expect_eq(fx_sh(line, &out, &err), 0, "make uninstall failed:\n%s\n%s", out, err);
    free(out); free(err);
    for (size_t i = 0; i < sizeof files / sizeof *files; i++) {
        snprintf(p, sizeof p, "%s/%s", prefix, files[i]);
        cr_expect_neq(access(p, F_OK), 0, "make uninstall left %s", p);
    }
    snprintf(p, sizeof p, "%s/bin/fasa", prefix);
    cr_expect_neq(access(p, F_OK), 0, "make uninstall left %s", p);
    tmpdir_remove(prefix);
}

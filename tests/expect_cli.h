/* expect_cli.h - the CLI tests' expectation of a command that must fail, by the rule of fasa(1),
 * EXIT STATUS: "fasa ARGS" exits non-zero, not by a signal, with one line on stderr that starts
 * "fasa: " and holds needle. Criterion; the runner is fixtures.h's fx_fasa. */
#ifndef FASA_TEST_EXPECT_CLI_H
#define FASA_TEST_EXPECT_CLI_H

#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "fixtures.h"

static inline void expect_one_line_error(const char *args, const char *needle)
{
    char *out, *err;
    int rc = fx_fasa(args, &out, &err);
    cr_expect_neq(rc, 0, "'fasa %s' succeeded", args);
    cr_expect_lt(rc, 128, "'fasa %s' crashed", args);
    cr_expect_eq(fx_lines(err), 1, "'fasa %s' stderr is not one line: %s", args, err);
    cr_expect(strncmp(err, "fasa: ", 6) == 0, "'%s'", err);
    cr_expect(strstr(err, needle) != NULL, "'fasa %s': '%s' lacks '%s'", args, err, needle);
    free(out);
    free(err);
}

#endif

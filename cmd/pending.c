/* pending.c - subcommands that are planned but not built yet: they say so and fail. */
#include <stdio.h>
#include <string.h>

#include "cmd.h"

static int pending(const char *name, int argc, char **argv)
{
    if (argc > 1 && (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h"))) {
        printf("usage: fasa %s ...\n\n'fasa %s' is not built yet.\n", name, name);
        return 0;
    }
    return die("'%s' is not built yet in this version", name);
}

int cmd_convert(int argc, char **argv) { return pending("convert", argc, argv); }

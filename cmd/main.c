/* main.c - the command table. Each subcommand lives in its own file as cmd_<name>(). */
#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cmd.h"

static const struct command {
    const char *name;
    int (*fn)(int, char **);
    const char *help;
} commands[] = {
    { "inspect", cmd_inspect, "show a model's architecture, tensors, RoPE layout and tokenizer" },
    { "run", cmd_run, "generate text from a prompt (stdin with -)" },
    { "calibrate", cmd_calibrate, "rank every head's frequency chunks by contextual agreement" },
    { "convert", cmd_convert, "write a model with dominant key dims first, or as a .fasa bundle" },
    { "bench", cmd_bench, "measure perplexity, passkey, contextual agreement and speed" },
};

static void usage(FILE *f)
{
    fprintf(f, "usage: fasa <command> [options]\n\ncommands:\n");
    for (size_t i = 0; i < sizeof commands / sizeof *commands; i++)
        fprintf(f, "  %-10s %s\n", commands[i].name, commands[i].help);
    fprintf(f, "\n'fasa <command> --help' shows a command's options.\n");
}

int die(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fputs("fasa: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    return 1;
}

const char *default_model_path(void)
{
    static char buf[PATH_MAX + 64];
    const char *name = "SmolLM2-135M-Instruct.Q4_1.gguf";
    const char *env = getenv("FASA_MODEL");
    if (env && *env) return env;
    char exe[PATH_MAX - 64];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n > 0) {
        exe[n] = 0;
        char *slash = strrchr(exe, '/');
        if (slash) {
            *slash = 0;
            /* bin/fasa in a checkout -> ../models; $PREFIX/bin/fasa -> ../share/fasa/models */
            snprintf(buf, sizeof buf, "%s/../models/%s", exe, name);
            if (access(buf, R_OK) == 0) return buf;
            snprintf(buf, sizeof buf, "%s/../share/fasa/models/%s", exe, name);
            if (access(buf, R_OK) == 0) return buf;
        }
    }
    const char *home = getenv("HOME");
    if (home) {
        snprintf(buf, sizeof buf, "%s/.local/share/fasa/models/%s", home, name);
        if (access(buf, R_OK) == 0) return buf;
    }
    return NULL;
}

int parse_int(const char *flag, const char *s, long lo, long hi, long *out)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi) {
        die("option '%s' needs an integer in [%ld, %ld], not '%s'", flag, lo, hi, s);
        return -1;
    }
    *out = v;
    return 0;
}

int parse_float(const char *flag, const char *s, double lo, double hi, double *out)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end || !(v >= lo && v <= hi)) {
        die("option '%s' needs a number in [%g, %g], not '%s'", flag, lo, hi, s);
        return -1;
    }
    *out = v;
    return 0;
}

char *read_all(FILE *f, size_t *len)
{
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    if (!buf) return NULL;
    for (;;) {
        if (n + 1 >= cap) {
            char *nb = realloc(buf, cap *= 2);
            if (!nb) { free(buf); return NULL; }
            buf = nb;
        }
        size_t r = fread(buf + n, 1, cap - n - 1, f);
        n += r;
        if (r == 0) break;
    }
    if (ferror(f)) { free(buf); return NULL; }
    buf[n] = 0;
    if (len) *len = n;
    return buf;
}

/* Writes buf to path through a temporary file renamed into place. */
int write_file_atomic(const char *path, const void *buf, size_t len)
{
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s.tmp.XXXXXX", path);
    int fd = mkstemp(tmp);
    if (fd < 0) return die("cannot create '%s': %m", path);
    fchmod(fd, 0644);
    FILE *f = fdopen(fd, "wb");
    int ok = f && fwrite(buf, 1, len, f) == len;
    ok = (f ? fclose(f) == 0 : (close(fd), 0)) && ok;
    if (!ok || rename(tmp, path) != 0) {
        unlink(tmp);
        return die("cannot write '%s': %m", path);
    }
    return 0;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    const char *name = argv[1];
    if (!strcmp(name, "--help") || !strcmp(name, "-h") || !strcmp(name, "help")) {
        usage(stdout);
        return 0;
    }
    if (!strcmp(name, "--version")) {
        puts("fasa 0.1");
        return 0;
    }
    for (size_t i = 0; i < sizeof commands / sizeof *commands; i++)
        if (!strcmp(name, commands[i].name)) return commands[i].fn(argc - 1, argv + 1);
    die("'%s' is not a fasa command; see 'fasa --help'", name);
    return 2;
}

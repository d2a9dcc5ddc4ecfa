/* main.c - the command table. Each subcommand lives in its own file as cmd_<name>(). */
#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "attention.h"
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

#define N_COMMANDS (sizeof commands / sizeof *commands)

static void usage(FILE *f)
{
    fprintf(f, "usage: fasa <command> [options]\n\ncommands:\n");
    for (size_t i = 0; i < N_COMMANDS; i++)
        fprintf(f, "  %-10s %s\n", commands[i].name, commands[i].help);
    fprintf(f, "  %-10s %s\n", "help", "show the manual page of fasa or of a command: fasa help [COMMAND]");
    fprintf(f, "\n'fasa <command> --help' shows a command's options.\n");
}

static int vdie(int status, const char *fmt, va_list ap)
{
    fputs("fasa: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    return status;
}

int die(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int rc = vdie(EXIT_FAIL, fmt, ap);
    va_end(ap);
    return rc;
}

int die_usage(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int rc = vdie(EXIT_USAGE, fmt, ap);
    va_end(ap);
    return rc;
}

/* The directory holding the running binary, or 0 when /proc cannot tell. */
static int exe_dir(char *buf, size_t cap)
{
    ssize_t n = readlink("/proc/self/exe", buf, cap - 1);
    if (n <= 0) return 0;
    buf[n] = 0;
    char *slash = strrchr(buf, '/');
    if (!slash) return 0;
    *slash = 0;
    return 1;
}

const char *default_model_path(void)
{
    static char buf[PATH_MAX + 64];
    const char *name = "SmolLM2-135M-Instruct.Q4_1.gguf";
    const char *env = getenv("FASA_MODEL");
    if (env && *env) return env;
    char exe[PATH_MAX - 64];
    if (exe_dir(exe, sizeof exe)) {
        /* bin/fasa in a checkout -> ../models; $PREFIX/bin/fasa -> ../share/fasa/models */
        snprintf(buf, sizeof buf, "%s/../models/%s", exe, name);
        if (access(buf, R_OK) == 0) return buf;
        snprintf(buf, sizeof buf, "%s/../share/fasa/models/%s", exe, name);
        if (access(buf, R_OK) == 0) return buf;
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

int parse_dense_budget(const char *s, int *out)
{
    if (policy_parse_dense_budget(s, out) == 0) return 0;
    die("option '--dense-budget' needs N tokens (0 to %d) or Kx, K times the budget (1x to 1024x), not '%s'", 1 << 24,
        s);
    return -1;
}

int parse_kv_type(const char *s, int *f16)
{
    if (strcmp(s, "f16") && strcmp(s, "f32")) {
        die("--kv-type '%s' is not one of f16, f32", s);
        return -1;
    }
    *f16 = !strcmp(s, "f16");
    return 0;
}

int parse_on_off(const char *flag, const char *s, int *out)
{
    if (strcmp(s, "on") && strcmp(s, "off")) {
        die("%s takes on or off, not '%s'", flag, s);
        return -1;
    }
    *out = !strcmp(s, "on");
    return 0;
}

/* --tail: on (the default: values by block) and blocks 2, mean 1, off 0 (session_opts.tail) */
int parse_tail(const char *s, int *out)
{
    static const char *const names[] = { "off", "mean", "on", "blocks" };
    for (int i = 0; i < 4; i++)
        if (!strcmp(s, names[i])) {
            *out = i < 2 ? i : 2;
            return 0;
        }
    die("--tail takes on, off, blocks or mean, not '%s'", s);
    return -1;
}

/* Writes buf to path atomically (base.h); prints the error, returns 1. */
int write_file_atomic(const char *path, const void *buf, size_t len)
{
    char err[FASA_ERRLEN];
    return fasa_write_file(path, buf, len, err) < 0 ? die("%s", err) : 0;
}

/* ---------------------------------------------------------------- fasa help */

/* 1 when PATH has an executable called name. */
static int in_path(const char *name)
{
    const char *path = getenv("PATH");
    char buf[PATH_MAX];
    while (path && *path) {
        size_t n = strcspn(path, ":");
        snprintf(buf, sizeof buf, "%.*s/%s", n ? (int)n : 1, n ? path : ".", name);
        if (access(buf, X_OK) == 0) return 1;
        path += n + (path[n] == ':');
    }
    return 0;
}

/* Runs man with args (NULL-terminated); returns its exit status, 127 when it cannot start.
 * quiet sends its output and errors to /dev/null (for `man -w`, which only asks). */
static int run_man(char *const args[], int quiet)
{
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid < 0) return 127;
    if (pid == 0) {
        if (quiet && !freopen("/dev/null", "w", stdout)) _exit(127);
        if (quiet && !freopen("/dev/null", "w", stderr)) _exit(127);
        execvp("man", args);
        _exit(127);
    }
    int st;
    while (waitpid(pid, &st, 0) < 0)
        if (errno != EINTR) return 127;
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128;
}

/* The page beside the binary: $PREFIX/share/man/man1 for an installed fasa, the source tree's
 * man/ for bin/fasa in a checkout. */
static int find_page(const char *page, char *out, size_t cap)
{
    char dir[PATH_MAX - 64];
    if (!exe_dir(dir, sizeof dir)) return 0;
    static const char *const rel[] = { "../share/man/man1", "../man" };
    for (size_t i = 0; i < sizeof rel / sizeof *rel; i++) {
        if ((size_t)snprintf(out, cap, "%s/%s/%s.1", dir, rel[i], page) < cap && access(out, R_OK) == 0) return 1;
    }
    return 0;
}

/* `fasa help [COMMAND]`: the manual page through man(1) when both exist; otherwise the same
 * text as `--help`. */
static int help(int argc, char **argv)
{
    if (argc > 2) return die_usage("'help' takes at most one command name; see 'fasa --help'");
    const char *name = argc == 2 && strcmp(argv[1], "help") ? argv[1] : NULL;
    const struct command *cmd = NULL;
    if (name) {
        for (size_t i = 0; i < N_COMMANDS && !cmd; i++)
            if (!strcmp(name, commands[i].name)) cmd = &commands[i];
        if (!cmd) return die_usage("'%s' is not a fasa command; see 'fasa --help'", name);
    }
    char page[64], path[PATH_MAX];
    snprintf(page, sizeof page, name ? "fasa-%s" : "fasa", name);
    if (in_path("man")) {
        int rc = 127;
        if (find_page(page, path, sizeof path))
            rc = run_man((char *[]){ "man", "-l", path, NULL }, 0);
        else if (run_man((char *[]){ "man", "-w", page, NULL }, 1) == 0)
            rc = run_man((char *[]){ "man", page, NULL }, 0);
        if (rc != 127) return rc ? EXIT_FAIL : 0;
    }
    if (!cmd) {
        usage(stdout);
        return 0;
    }
    return cmd->fn(2, (char *[]){ (char *)cmd->name, "--help", NULL });
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        usage(stderr);
        return EXIT_USAGE;
    }
    const char *name = argv[1];
    if (!strcmp(name, "--help") || !strcmp(name, "-h")) {
        usage(stdout);
        return 0;
    }
    if (!strcmp(name, "help")) return help(argc - 1, argv + 1);
    if (!strcmp(name, "--version")) {
        puts("fasa 0.1");
        return 0;
    }
    for (size_t i = 0; i < N_COMMANDS; i++)
        if (!strcmp(name, commands[i].name)) {
            /* getopt names argv[0] in its messages: "fasa run: unrecognized option '--x'" */
            static char prog[32];
            snprintf(prog, sizeof prog, "fasa %s", name);
            argv[1] = prog;
            return commands[i].fn(argc - 1, argv + 1);
        }
    return die_usage("'%s' is not a fasa command; see 'fasa --help'", name);
}

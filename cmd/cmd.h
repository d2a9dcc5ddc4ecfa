/* cmd.h - what the subcommands share: the command table's entries and a few CLI helpers. */
#ifndef FASA_CMD_H
#define FASA_CMD_H

#include <stdio.h>

#include "base.h"

int cmd_calibrate(int argc, char **argv);
int cmd_inspect(int argc, char **argv);
int cmd_convert(int argc, char **argv);
int cmd_run(int argc, char **argv);
int cmd_bench(int argc, char **argv);

/* Exit statuses, one rule for every subcommand (documented in man/fasa.1, EXIT STATUS):
 * 0 success; 1 a well-formed command that failed (a file missing, unreadable or malformed, a model
 * and profile that do not fit, out of memory, a mode that is not built); 2 a command line that
 * cannot work whatever the files hold (unknown command or option, missing or extra operands, a
 * malformed or out-of-range option value, options that conflict or do not apply to the input). */
#define EXIT_FAIL 1
#define EXIT_USAGE 2

/* Prints "fasa: <message>" on stderr and returns EXIT_FAIL. */
int die(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* The same for a usage error: returns EXIT_USAGE. */
int die_usage(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* The default model installed by scripts/setup.sh: $FASA_MODEL, else models/ next to the
 * binary's bin/ directory, else ~/.local/share/fasa/models/. NULL if none exists. */
const char *default_model_path(void);

/* Parses a positive integer / float flag value; returns -1 (after printing) on garbage: the
 * caller exits with EXIT_USAGE. */
int parse_int(const char *flag, const char *s, long lo, long hi, long *out);
int parse_float(const char *flag, const char *s, double lo, double hi, double *out);
/* --dense-budget: N tokens (*out = N) or Kx, K times the budget (*out = -K); 0 is every token.
 * -1, as above, on anything else. */
int parse_dense_budget(const char *s, int *out);
/* --kv-type: "f16" sets *f16 to 1, "f32" to 0; anything else: -1, as above. */
int parse_kv_type(const char *s, int *f16);
/* An on|off flag (--tail): *out 1 or 0; anything else: -1, as above. */
int parse_on_off(const char *flag, const char *s, int *out);
/* --tail on|off|blocks: 1, 0, 2 (session_opts.tail); an error line and -1 otherwise. */
int parse_tail(const char *s, int *out);
static inline const char *kv_type_name(int f16) { return f16 ? "f16" : "f32"; }

/* Plain English text that every Debian system has: the default calibration sample. */
#define DEFAULT_SAMPLE "/usr/share/common-licenses/GPL-3"

/* Writes buf to path atomically (fasa_write_file); prints the error and returns 1 on failure. */
int write_file_atomic(const char *path, const void *buf, size_t len);

#endif

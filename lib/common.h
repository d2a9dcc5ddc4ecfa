/* common.h - status codes and error messages shared by every module.
 *
 *   char err[FASA_ERRLEN];
 *   if (model_load(&m, path, err) < 0) { fprintf(stderr, "fasa: %s\n", err); return 1; }
 *
 * Library functions never print or exit. They return 0 (or a count) on success and a negative
 * status on failure, after writing one line into err that names the file and the problem,
 * in the house style: "cannot open 'model.gguf': no such file".
 */
#ifndef FASA_COMMON_H
#define FASA_COMMON_H

#include <stddef.h>
#include <stdint.h>

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

#endif

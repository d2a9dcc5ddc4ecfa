#include "common.h"

#include <stdarg.h>
#include <stdio.h>
#include <time.h>

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

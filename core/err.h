/*
 * err.h - how core/ reports errors.
 *
 * Functions that can fail take a `char *err` buffer of ERR_LEN bytes (NULL is
 * allowed: the message is dropped), fill it with one line that names the
 * problem (file, tensor, expected vs found), and return -1 or NULL. Callers
 * show the message once; nothing in core/ prints or exits.
 */
#ifndef SPANSERVE_ERR_H
#define SPANSERVE_ERR_H

#include <stdarg.h>
#include <stdio.h>

#define ERR_LEN 512

#if defined(__GNUC__)
__attribute__((format(printf, 2, 3)))
#endif
static inline int err_set(char *err, const char *fmt, ...)
{
    if (err) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, ERR_LEN, fmt, ap);
        va_end(ap);
    }
    return -1;
}

#endif

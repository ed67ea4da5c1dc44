/* log: formatted output that never allocates.
 *
 * Owns the printf-like formatter and the write(2) loop used for every line qmalloc prints
 * (warnings from options.c, the fatal error from check.c, the statistics dump from stats.c).
 * Everything here is safe to call from inside malloc, before main and before libc has finished
 * initialising: no malloc, no stdio, no locale, no locks; output goes straight to write(2) from a
 * stack buffer. It keeps no state, so any thread may call it at any time.
 *
 * Deliberately not a full printf: no floating point, no %n, no positional arguments. */
#ifndef QM_LOG_H
#define QM_LOG_H

#include <stdarg.h>
#include <stddef.h>

/* Size of the stack buffer behind log_printf and log_fatal: longer output is truncated. */
#define LOG_LINE_MAX 1024

/* Formats into buf[0..cap) and always NUL-terminates (when cap > 0). Output that does not fit is
 * cut off cleanly. Returns the number of characters stored, excluding the NUL (so at most
 * cap - 1; 0 when cap == 0).
 *
 * Conversions: %s %c %d %i %u %x %X %p %% with the length modifiers l, ll and z (%ld %lu %lld
 * %llu %zu %zd %lx %llx %zx ...). Flags '-' (left-justify) and '0' (zero-pad numbers); a field
 * width as digits or '*'; a precision as '.digits' or '.*', which limits the bytes taken from a
 * %s argument (so a string that is not NUL-terminated can be printed as "%.*s", len, ptr) and is
 * ignored by the other conversions.
 * %s of NULL prints "(null)"; %p prints "0x" and lowercase hex, "0x0" for NULL. An unknown
 * conversion is copied through as written, so a bad format shows up in the output. */
size_t log_format(char *buf, size_t cap, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
size_t log_vformat(char *buf, size_t cap, const char *fmt, va_list ap)
    __attribute__((format(printf, 3, 0)));

/* Writes all n bytes of s to fd, retrying on EINTR and after partial writes; gives up silently on
 * any other error (there is nowhere to report it). errno is preserved. */
void log_write(int fd, const char *s, size_t n);

/* Formats into a LOG_LINE_MAX stack buffer (truncating) and writes the result to fd with one
 * log_write. */
void log_printf(int fd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Writes "qmalloc: <message>\n" to fd 2 in a single write(2) and aborts. The newline survives
 * truncation, so the error is always one complete line. */
_Noreturn void log_fatal(const char *fmt, ...) __attribute__((format(printf, 1, 2), cold));

#endif

/* log: non-allocating formatter and write(2) output (contracts in log.h).
 *
 * The formatter appends through a small cursor that drops whatever does not fit, so every
 * conversion can be written as if the buffer were unbounded and truncation is handled in one
 * place. No state outside the caller's stack: reentrant and thread-safe. */
#include "log.h"
#include "os_file.h"

#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <unistd.h>

/* ---- output cursor --------------------------------------------------------------------------- */

typedef struct log_cursor_s {
  char *buf;
  size_t cap; /* bytes available for characters, i.e. the caller's cap minus the NUL */
  size_t len; /* characters stored so far, never more than cap */
} log_cursor_t;

static void log_put(log_cursor_t *c, char ch) {
  if (c->len < c->cap)
    c->buf[c->len++] = ch;
}

static void log_put_n(log_cursor_t *c, const char *s, size_t n) {
  for (size_t i = 0; i < n; i++)
    log_put(c, s[i]);
}

static void log_pad(log_cursor_t *c, char ch, size_t n) {
  for (size_t i = 0; i < n; i++)
    log_put(c, ch);
}

/* ---- conversions ----------------------------------------------------------------------------- */

typedef struct log_spec_s {
  bool left;      /* '-' flag */
  bool zero;      /* '0' flag */
  size_t width;   /* minimum field width, 0 if none */
  long precision; /* -1 if none */
} log_spec_t;

/* Emits prefix + body justified in the field; zero padding goes between prefix and body so
 * "%08x"-style output and "-0042" come out the way printf does it. */
static void log_emit_field(log_cursor_t *c, const log_spec_t *spec, const char *prefix,
                           size_t prefix_len, const char *body, size_t body_len) {
  size_t total = prefix_len + body_len;
  size_t pad = spec->width > total ? spec->width - total : 0;
  if (spec->left) {
    log_put_n(c, prefix, prefix_len);
    log_put_n(c, body, body_len);
    log_pad(c, ' ', pad);
  } else if (spec->zero) {
    log_put_n(c, prefix, prefix_len);
    log_pad(c, '0', pad);
    log_put_n(c, body, body_len);
  } else {
    log_pad(c, ' ', pad);
    log_put_n(c, prefix, prefix_len);
    log_put_n(c, body, body_len);
  }
}

/* Digits of v in the given base, written backwards into the end of tmp; returns the start. */
static char *log_digits(char *tmp_end, unsigned long long v, unsigned base, bool upper) {
  const char *digits = upper ? "0123456789ABCDEF" : "0123456789abcdef";
  char *p = tmp_end;
  do {
    *--p = digits[v % base];
    v /= base;
  } while (v != 0);
  return p;
}

static void log_emit_unsigned(log_cursor_t *c, const log_spec_t *spec, unsigned long long v,
                              unsigned base, bool upper, const char *prefix) {
  char tmp[24]; /* 2^64 has 20 decimal digits, 16 hex */
  char *end = tmp + sizeof tmp;
  char *start = log_digits(end, v, base, upper);
  size_t prefix_len = 0;
  while (prefix[prefix_len] != '\0')
    prefix_len++;
  log_emit_field(c, spec, prefix, prefix_len, start, (size_t)(end - start));
}

static void log_emit_signed(log_cursor_t *c, const log_spec_t *spec, long long v) {
  /* Negate in unsigned arithmetic: -LLONG_MIN does not fit a long long. */
  unsigned long long magnitude = v < 0 ? 0ULL - (unsigned long long)v : (unsigned long long)v;
  log_emit_unsigned(c, spec, magnitude, 10, false, v < 0 ? "-" : "");
}

static void log_emit_string(log_cursor_t *c, const log_spec_t *spec, const char *s) {
  if (s == NULL)
    s = "(null)";
  size_t n = 0;
  /* With a precision, never read past it: the argument need not be NUL-terminated. */
  while ((spec->precision < 0 || n < (size_t)spec->precision) && s[n] != '\0')
    n++;
  log_spec_t plain = *spec;
  plain.zero = false;
  log_emit_field(c, &plain, "", 0, s, n);
}

/* ---- the formatter --------------------------------------------------------------------------- */

enum { LOG_LEN_INT, LOG_LEN_LONG, LOG_LEN_LLONG, LOG_LEN_SIZE };

size_t log_vformat(char *buf, size_t cap, const char *fmt, va_list ap) {
  if (cap == 0)
    return 0;
  log_cursor_t c = {buf, cap - 1, 0};
  va_list args;
  va_copy(args, ap);

  for (const char *p = fmt; *p != '\0'; p++) {
    if (*p != '%') {
      log_put(&c, *p);
      continue;
    }
    const char *conv_start = p++;
    log_spec_t spec = {false, false, 0, -1};
    for (;; p++) {
      if (*p == '-')
        spec.left = true;
      else if (*p == '0')
        spec.zero = true;
      else
        break;
    }
    if (*p == '*') {
      int w = va_arg(args, int);
      if (w < 0) { /* printf: a negative '*' width means '-' and its magnitude */
        spec.left = true;
        w = -w;
      }
      spec.width = (size_t)w;
      p++;
    } else {
      while (*p >= '0' && *p <= '9')
        spec.width = spec.width * 10 + (size_t)(*p++ - '0');
    }
    if (*p == '.') {
      p++;
      spec.precision = 0;
      if (*p == '*') {
        int prec = va_arg(args, int);
        spec.precision = prec < 0 ? -1 : prec;
        p++;
      } else {
        while (*p >= '0' && *p <= '9')
          spec.precision = spec.precision * 10 + (*p++ - '0');
      }
    }
    int length = LOG_LEN_INT;
    if (*p == 'l') {
      p++;
      length = LOG_LEN_LONG;
      if (*p == 'l') {
        p++;
        length = LOG_LEN_LLONG;
      }
    } else if (*p == 'z') {
      p++;
      length = LOG_LEN_SIZE;
    }

    switch (*p) {
    case 'd':
    case 'i': {
      long long v = length == LOG_LEN_LLONG  ? va_arg(args, long long)
                    : length == LOG_LEN_LONG ? va_arg(args, long)
                    : length == LOG_LEN_SIZE ? (long long)va_arg(args, ssize_t)
                                             : va_arg(args, int);
      log_emit_signed(&c, &spec, v);
      break;
    }
    case 'u':
    case 'x':
    case 'X': {
      unsigned long long v = length == LOG_LEN_LLONG  ? va_arg(args, unsigned long long)
                             : length == LOG_LEN_LONG ? va_arg(args, unsigned long)
                             : length == LOG_LEN_SIZE ? va_arg(args, size_t)
                                                      : va_arg(args, unsigned int);
      log_emit_unsigned(&c, &spec, v, *p == 'u' ? 10 : 16, *p == 'X', "");
      break;
    }
    case 'p':
      log_emit_unsigned(&c, &spec, (unsigned long long)(uintptr_t)va_arg(args, void *), 16, false,
                        "0x");
      break;
    case 's':
      log_emit_string(&c, &spec, va_arg(args, const char *));
      break;
    case 'c': {
      char ch = (char)va_arg(args, int);
      log_spec_t plain = spec;
      plain.zero = false;
      log_emit_field(&c, &plain, "", 0, &ch, 1);
      break;
    }
    case '%':
      log_put(&c, '%');
      break;
    default:
      /* Unknown (or truncated) conversion: copy it through so the mistake is visible. */
      if (*p == '\0')
        p--;
      log_put_n(&c, conv_start, (size_t)(p - conv_start) + 1);
      break;
    }
  }
  va_end(args);
  buf[c.len] = '\0';
  return c.len;
}

size_t log_format(char *buf, size_t cap, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  size_t n = log_vformat(buf, cap, fmt, ap);
  va_end(ap);
  return n;
}

/* ---- output ---------------------------------------------------------------------------------- */

void log_write(int fd, const char *s, size_t n) {
  int saved_errno = errno;
  while (n > 0) {
    ssize_t w = os_file_write(fd, s, n);
    if (w < 0) {
      if (errno == EINTR)
        continue;
      break;
    }
    if (w == 0)
      break; /* cannot make progress; do not spin */
    s += w;
    n -= (size_t)w;
  }
  errno = saved_errno;
}

void log_printf(int fd, const char *fmt, ...) {
  char buf[LOG_LINE_MAX];
  va_list ap;
  va_start(ap, fmt);
  size_t n = log_vformat(buf, sizeof buf, fmt, ap);
  va_end(ap);
  log_write(fd, buf, n);
}

void log_fatal(const char *fmt, ...) {
  static const char prefix[] = "qmalloc: ";
  char buf[LOG_LINE_MAX];
  size_t n = log_format(buf, sizeof buf, "%s", prefix);
  va_list ap;
  va_start(ap, fmt);
  /* log_vformat keeps the last byte for its NUL; the newline goes there instead. */
  n += log_vformat(buf + n, sizeof buf - n, fmt, ap);
  va_end(ap);
  buf[n++] = '\n';
  log_write(2, buf, n);
  abort();
}

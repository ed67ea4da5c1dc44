/* Unit test of src/log.c: every conversion agrees with the C library's snprintf (except %p of
 * NULL, which is "0x0" by contract), field widths and flags, truncation at every small capacity
 * with the NUL always stored, log_write delivering every byte through partial writes and EINTR,
 * and log_fatal printing exactly one "qmalloc: ...\n" line before dying of SIGABRT. */
#include "log.h"
#include "testutil.h"

#include <errno.h>
#include <limits.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

/* Formats with both log_format and snprintf and checks they agree, byte for byte and in length. */
#define SAME_AS_LIBC(...)                                                                          \
  do {                                                                                             \
    char ours[256], theirs[256];                                                                   \
    size_t n = log_format(ours, sizeof ours, __VA_ARGS__);                                         \
    int m = snprintf(theirs, sizeof theirs, __VA_ARGS__);                                          \
    CHECK_MSG(strcmp(ours, theirs) == 0 && (int)n == m, "format %s: got \"%s\" (%zu), libc \"%s\" (%d)", \
              #__VA_ARGS__, ours, n, theirs, m);                                                   \
  } while (0)

static void test_conversions(void) {
  SAME_AS_LIBC("plain text, no conversions");
  SAME_AS_LIBC("%s|%s", "hello", "");
  SAME_AS_LIBC("%c%c%c", 'a', 'Z', '0');
  SAME_AS_LIBC("%d %d %d %d", 0, 42, -42, INT_MIN);
  SAME_AS_LIBC("%i %i", INT_MAX, -1);
  SAME_AS_LIBC("%u %u", 0u, UINT_MAX);
  SAME_AS_LIBC("%ld %ld %ld", 0L, LONG_MAX, LONG_MIN);
  SAME_AS_LIBC("%lu", ULONG_MAX);
  SAME_AS_LIBC("%lld %lld", LLONG_MAX, LLONG_MIN);
  SAME_AS_LIBC("%llu", ULLONG_MAX);
  SAME_AS_LIBC("%zu %zu", (size_t)0, SIZE_MAX);
  SAME_AS_LIBC("%zd %zd", (ssize_t)-5, (ssize_t)SSIZE_MAX);
  SAME_AS_LIBC("%x %x %x", 0u, 0xdeadbeefu, UINT_MAX);
  SAME_AS_LIBC("%X", 0xabcdefu);
  SAME_AS_LIBC("%lx", ULONG_MAX);
  SAME_AS_LIBC("%llx", 0x123456789abcdefULL);
  SAME_AS_LIBC("%zx", (size_t)0x7fff1234);
  SAME_AS_LIBC("100%% sure, %d%%", 5);
  int local;
  SAME_AS_LIBC("%p", (void *)&local);
  SAME_AS_LIBC("%p", (void *)(uintptr_t)0x7f0000001000ULL);

  char buf[64];
  CHECK_EQ(log_format(buf, sizeof buf, "%p", (void *)NULL), 3);
  CHECK(strcmp(buf, "0x0") == 0);
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wformat-overflow"
  log_format(buf, sizeof buf, "%s", (const char *)NULL);
#pragma GCC diagnostic pop
  CHECK(strcmp(buf, "(null)") == 0);
  /* An unknown conversion is copied through, and a '%' at the very end does not overrun. */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wformat"
#pragma GCC diagnostic ignored "-Wformat-extra-args"
  log_format(buf, sizeof buf, "a%qb");
  CHECK_MSG(strcmp(buf, "a%qb") == 0, "got \"%s\"", buf);
  log_format(buf, sizeof buf, "end%");
#pragma GCC diagnostic pop
  CHECK_MSG(strcmp(buf, "end%") == 0, "got \"%s\"", buf);
}

static void test_widths_and_flags(void) {
  SAME_AS_LIBC("[%12zu]", (size_t)12345);
  SAME_AS_LIBC("[%-12zu]", (size_t)12345);
  SAME_AS_LIBC("[%-20s]", "left");
  SAME_AS_LIBC("[%20s]", "right");
  SAME_AS_LIBC("[%3s]", "longer than width");
  SAME_AS_LIBC("[%08x]", 0xbeefu);
  SAME_AS_LIBC("[%06d]", -42);
  SAME_AS_LIBC("[%-6d]", -42);
  SAME_AS_LIBC("[%5c]", 'x');
  SAME_AS_LIBC("[%-5c]", 'x');
  SAME_AS_LIBC("[%*d]", 7, 99);
  SAME_AS_LIBC("[%*d]", -7, 99);
  SAME_AS_LIBC("[%-*s]", 10, "name");
  SAME_AS_LIBC("[%20p]", (void *)(uintptr_t)0x1000);
  SAME_AS_LIBC("[%.3s]", "abcdef");
  SAME_AS_LIBC("[%.*s]", 2, "abcdef");
  SAME_AS_LIBC("[%8.3s]", "abcdef");

  /* %.*s must not read past the precision: the argument need not be NUL-terminated. */
  char not_terminated[4] = {'w', 'x', 'y', 'z'};
  char buf[32];
  log_format(buf, sizeof buf, "<%.*s>", 4, not_terminated);
  CHECK(strcmp(buf, "<wxyz>") == 0);
}

static void test_truncation(void) {
  const char *full = "value=12345 name=abcdef";
  size_t full_len = strlen(full);
  for (size_t cap = 0; cap <= full_len + 2; cap++) {
    char buf[64];
    memset(buf, '#', sizeof buf);
    size_t n = log_format(buf, cap, "value=%d name=%s", 12345, "abcdef");
    size_t expect = cap == 0 ? 0 : (cap - 1 < full_len ? cap - 1 : full_len);
    CHECK_MSG(n == expect, "cap %zu: returned %zu, expected %zu", cap, n, expect);
    if (cap > 0) {
      CHECK_MSG(buf[n] == '\0', "cap %zu: no NUL at %zu", cap, n);
      CHECK_MSG(memcmp(buf, full, n) == 0, "cap %zu: wrong prefix", cap);
    } else {
      CHECK_MSG(buf[0] == '#', "cap 0 wrote into the buffer");
    }
    CHECK_MSG(buf[cap] == '#', "cap %zu: wrote past the buffer", cap);
  }
  /* Padding and number digits are cut the same way. */
  char buf[8];
  CHECK_EQ(log_format(buf, sizeof buf, "%20s", "x"), 7);
  CHECK(strcmp(buf, "       ") == 0);
  CHECK_EQ(log_format(buf, 4, "%llu", 123456789ULL), 3);
  CHECK(strcmp(buf, "123") == 0);
}

/* Helper that forwards to log_vformat, to exercise the va_list entry point. */
static size_t format_via_va_list(char *buf, size_t cap, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  size_t n = log_vformat(buf, cap, fmt, ap);
  va_end(ap);
  return n;
}

static void test_va_list_variant(void) {
  char buf[64];
  size_t n = format_via_va_list(buf, sizeof buf, "%s=%zu", "bytes", (size_t)4096);
  CHECK_EQ(n, 10);
  CHECK(strcmp(buf, "bytes=4096") == 0);
}

/* Reads everything from fd until EOF into buf; returns the length. */
static size_t read_all(int fd, char *buf, size_t cap) {
  size_t len = 0;
  for (;;) {
    ssize_t r = read(fd, buf + len, cap - len);
    if (r < 0 && errno == EINTR)
      continue;
    if (r <= 0)
      break;
    len += (size_t)r;
    if (len == cap)
      break;
  }
  return len;
}

/* The timer switches itself off after a bounded number of interrupts, so a slow machine (or
 * valgrind, where delivering a signal can take longer than the interval) cannot livelock. */
enum { ALARMS_MAX = 200 };
static volatile sig_atomic_t alarms_seen;
static void on_alarm(int sig) {
  (void)sig;
  if (++alarms_seen >= ALARMS_MAX) {
    struct itimerval off = {{0, 0}, {0, 0}};
    setitimer(ITIMER_REAL, &off, NULL); /* a plain system call: safe in a handler on Linux */
  }
}

/* 1 MiB through a pipe whose reader is slow, with a 1 ms interval timer interrupting the writer
 * (no SA_RESTART, at most ALARMS_MAX times): write(2) returns short counts or EINTR, and every
 * byte must still arrive in order. The check does not depend on how many interruptions happen. */
static void test_write_retries(void) {
  enum { TOTAL = 1 << 20 };
  static char data[TOTAL];
  for (size_t i = 0; i < TOTAL; i++)
    data[i] = (char)(i * 131 + 7);

  int fds[2];
  CHECK(pipe(fds) == 0);
  pid_t reader = fork();
  if (reader == 0) {
    close(fds[1]);
    static char got[TOTAL + 1];
    size_t len = 0;
    for (;;) {
      ssize_t r = read(fds[0], got + len, 4096 < TOTAL + 1 - len ? 4096 : TOTAL + 1 - len);
      if (r <= 0)
        break;
      len += (size_t)r;
      usleep(50);
    }
    _exit(len == TOTAL && memcmp(got, data, TOTAL) == 0 ? 0 : 1);
  }
  close(fds[0]);

  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_alarm; /* no SA_RESTART: interrupted writes return early */
  sigaction(SIGALRM, &sa, NULL);
  struct itimerval every_ms = {{0, 1000}, {0, 1000}}, off = {{0, 0}, {0, 0}};
  setitimer(ITIMER_REAL, &every_ms, NULL);
  errno = 12345;
  log_write(fds[1], data, TOTAL);
  CHECK_EQ(errno, 12345); /* errno is preserved */
  setitimer(ITIMER_REAL, &off, NULL);
  signal(SIGALRM, SIG_DFL);
  close(fds[1]);

  int status = 0;
  while (waitpid(reader, &status, 0) < 0 && errno == EINTR) {
  }
  CHECK_MSG(WIFEXITED(status) && WEXITSTATUS(status) == 0,
            "reader did not receive the 1 MiB intact (%d timer interrupts happened)", (int)alarms_seen);

  /* A write error (bad fd) gives up without looping and still preserves errno. */
  errno = 777;
  log_write(-1, "x", 1);
  CHECK_EQ(errno, 777);
}

static void test_printf(void) {
  int fds[2];
  CHECK(pipe(fds) == 0);
  log_printf(fds[1], "%s %d %p\n", "line", -3, (void *)(uintptr_t)0xabc);
  /* Longer than the stack buffer: truncated to LOG_LINE_MAX - 1 characters. */
  char big[3 * LOG_LINE_MAX];
  memset(big, 'y', sizeof big - 1);
  big[sizeof big - 1] = '\0';
  log_printf(fds[1], "%s", big);
  close(fds[1]);
  char got[4 * LOG_LINE_MAX];
  size_t n = read_all(fds[0], got, sizeof got);
  close(fds[0]);
  const char *first = "line -3 0xabc\n";
  CHECK_EQ(n, strlen(first) + LOG_LINE_MAX - 1);
  CHECK(memcmp(got, first, strlen(first)) == 0);
}

/* What log_fatal prints in a child (tu_stderr_of_child): variant 0 a short line, 1 one too long. */
static void fatal_body(void *variant) {
  if (*(int *)variant == 0) log_fatal("free(): invalid pointer %p", (void *)(uintptr_t)0x7f12345678f0ULL);
  char big[2 * LOG_LINE_MAX];
  memset(big, 'z', sizeof big - 1);
  big[sizeof big - 1] = '\0';
  log_fatal("long: %s", big);
}

static size_t fatal_in_child(char *out, size_t cap, int *status, int variant) {
  return tu_stderr_of_child(fatal_body, &variant, out, cap, status);
}

static void test_fatal(void) {
  char out[4 * LOG_LINE_MAX];
  int status = 0;
  fatal_in_child(out, sizeof out, &status, 0);
  CHECK_MSG(strcmp(out, "qmalloc: free(): invalid pointer 0x7f12345678f0\n") == 0, "got \"%s\"", out);
  CHECK(WIFSIGNALED(status) && WTERMSIG(status) == SIGABRT);

  /* A message too long for the buffer still ends in exactly one newline, as one line. */
  size_t n = fatal_in_child(out, sizeof out, &status, 1);
  CHECK_EQ(n, LOG_LINE_MAX);
  CHECK(strncmp(out, "qmalloc: long: zzz", 18) == 0);
  CHECK(n > 0 && out[n - 1] == '\n');
  CHECK(strchr(out, '\n') == out + n - 1);
  CHECK(WIFSIGNALED(status) && WTERMSIG(status) == SIGABRT);
}

int main(void) {
  test_conversions();
  test_widths_and_flags();
  test_truncation();
  test_va_list_variant();
  test_write_retries();
  test_printf();
  test_fatal();
  return tu_summary("unit-log");
}

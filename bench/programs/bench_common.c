/* bench_common.c - option parsing, the RESULT line, clocks and memory figures for the mtbench
 * programs (contract in bench_common.h). Runs outside every timed loop; may allocate freely. */
#define _GNU_SOURCE
#include "bench_common.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

/* ---- errors ------------------------------------------------------------------------------- */

__attribute__((noreturn)) static void vfail(const char *prog, int code, const char *fmt, va_list ap) {
  fprintf(stderr, "%s: ", prog);
  vfprintf(stderr, fmt, ap);
  fputc('\n', stderr);
  exit(code);
}

void bench_usage_error(const char *prog, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vfail(prog, BENCH_EXIT_USAGE, fmt, ap);
}

void bench_die(const char *prog, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vfail(prog, 1, fmt, ap);
}

/* ---- options ------------------------------------------------------------------------------ */

static void print_help(const char *prog, const char *summary, const opt_t *opts) {
  printf("usage: %s [options]\n%s\n\noptions:\n", prog, summary);
  for (const opt_t *o = opts; o->name; o++) {
    char arg[32] = "";
    if (o->kind == OPT_U64) snprintf(arg, sizeof arg, " N");
    else if (o->kind == OPT_DOUBLE) snprintf(arg, sizeof arg, " X");
    else if (o->kind == OPT_STR) snprintf(arg, sizeof arg, " NAME");
    char def[48] = "";
    if (o->kind == OPT_U64) snprintf(def, sizeof def, " (default %llu)", (unsigned long long)*(uint64_t *)o->target);
    else if (o->kind == OPT_DOUBLE) snprintf(def, sizeof def, " (default %g)", *(double *)o->target);
    else if (o->kind == OPT_STR && *(const char **)o->target) snprintf(def, sizeof def, " (default %s)", *(const char **)o->target);
    printf("  --%s%s\t%s%s\n", o->name, arg, o->help, def);
  }
  printf("  --help\tthis text\n\nPrints one line: RESULT bench=... key=value ... (see docs/mtbench.md).\n");
}

/* Integers with an optional K/M/G suffix; rejects signs, blanks and trailing junk. */
static bool parse_u64(const char *s, uint64_t *out) {
  if (!*s || *s == '-' || *s == '+' || *s == ' ') return false;
  errno = 0;
  char *end;
  unsigned long long v = strtoull(s, &end, 10);
  if (errno || end == s) return false;
  uint64_t mult = 1;
  if (*end == 'K' || *end == 'k') mult = 1ULL << 10, end++;
  else if (*end == 'M' || *end == 'm') mult = 1ULL << 20, end++;
  else if (*end == 'G' || *end == 'g') mult = 1ULL << 30, end++;
  if (*end) return false;
  if (v > UINT64_MAX / mult) return false;
  *out = v * mult;
  return true;
}

static bool parse_double(const char *s, double *out) {
  if (!*s) return false;
  errno = 0;
  char *end;
  double v = strtod(s, &end);
  if (errno || end == s || *end || !isfinite(v)) return false;
  *out = v;
  return true;
}

void bench_parse(const char *prog, const char *summary, const opt_t *opts, int argc, char **argv) {
  for (int i = 1; i < argc; i++) {
    const char *arg = argv[i];
    if (!strcmp(arg, "--help") || !strcmp(arg, "-h")) {
      print_help(prog, summary, opts);
      exit(0);
    }
    if (strncmp(arg, "--", 2) != 0)
      bench_usage_error(prog, "unexpected argument '%s' (options are --name value; try --help)", arg);
    const char *name = arg + 2;
    const char *eq = strchr(name, '=');
    size_t name_len = eq ? (size_t)(eq - name) : strlen(name);
    const opt_t *o = opts;
    for (; o->name; o++)
      if (strlen(o->name) == name_len && !strncmp(o->name, name, name_len)) break;
    if (!o->name) bench_usage_error(prog, "unknown option '--%.*s' (try --help)", (int)name_len, name);
    if (o->kind == OPT_FLAG) {
      if (eq) bench_usage_error(prog, "--%s takes no value", o->name);
      *(bool *)o->target = true;
      continue;
    }
    const char *val = eq ? eq + 1 : (i + 1 < argc ? argv[++i] : NULL);
    if (!val) bench_usage_error(prog, "--%s needs a value", o->name);
    if (o->kind == OPT_STR) {
      /* Names only (they become file names and RESULT values): no paths, blanks or '='. */
      bool ok = *val != 0 && strlen(val) <= 64;
      for (const char *c = val; *c; c++)
        if (!((*c >= 'a' && *c <= 'z') || (*c >= '0' && *c <= '9') || *c == '-')) ok = false;
      if (!ok) bench_usage_error(prog, "--%s: expected a name of a-z, 0-9 and '-', got '%s'", o->name, val);
      *(const char **)o->target = val;
    } else if (o->kind == OPT_U64) {
      uint64_t v;
      if (!parse_u64(val, &v) || (double)v < o->min || (double)v > o->max)
        bench_usage_error(prog, "--%s: expected an integer in [%.0f, %.0f], got '%s'", o->name, o->min, o->max, val);
      *(uint64_t *)o->target = v;
    } else {
      double v;
      if (!parse_double(val, &v) || v < o->min || v > o->max)
        bench_usage_error(prog, "--%s: expected a number in [%g, %g], got '%s'", o->name, o->min, o->max, val);
      *(double *)o->target = v;
    }
  }
}

/* ---- the result line ---------------------------------------------------------------------- */

static char result_buf[4096];
static size_t result_len;

static void result_append(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void result_append(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(result_buf + result_len, sizeof result_buf - result_len, fmt, ap);
  va_end(ap);
  if (n < 0 || (size_t)n >= sizeof result_buf - result_len) {
    fprintf(stderr, "bench_common: result line too long\n");
    abort();
  }
  result_len += (size_t)n;
}

void result_begin(const char *bench) {
  result_len = 0;
  result_append("RESULT bench=%s", bench);
}

void result_u64(const char *key, uint64_t v) { result_append(" %s=%llu", key, (unsigned long long)v); }
void result_f(const char *key, double v) { result_append(" %s=%.6g", key, v); }

void result_str(const char *key, const char *v) {
  result_append(" %s=", key);
  for (const char *c = v; *c; c++) result_append("%c", (*c == ' ' || *c == '=') ? '_' : *c);
}

void result_end(void) {
  /* Children count too: malloc-test --processes does its work in forked, waited-for children. */
  struct rusage self, kids;
  getrusage(RUSAGE_SELF, &self);
  getrusage(RUSAGE_CHILDREN, &kids);
  result_f("cpu_user_s", self.ru_utime.tv_sec + self.ru_utime.tv_usec / 1e6 + kids.ru_utime.tv_sec + kids.ru_utime.tv_usec / 1e6);
  result_f("cpu_sys_s", self.ru_stime.tv_sec + self.ru_stime.tv_usec / 1e6 + kids.ru_stime.tv_sec + kids.ru_stime.tv_usec / 1e6);
  result_u64("minflt", (uint64_t)(self.ru_minflt + kids.ru_minflt));
  result_u64("peak_rss_kb", peak_rss_kb());
  result_u64("rss_end_kb", rss_now_kb());
  printf("%s\n", result_buf);
  fflush(stdout);
}

/* ---- clocks, randomness, memory ----------------------------------------------------------- */

double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec / 1e9;
}

double process_cpu_s(void) {
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  return ru.ru_utime.tv_sec + ru.ru_utime.tv_usec / 1e6 + ru.ru_stime.tv_sec + ru.ru_stime.tv_usec / 1e6;
}

/* Reads a small /proc file into buf with open/read: no stdio, so no malloc, so the memory figures
 * can be taken while a program must make no allocator call (two-phase's idle reading). */
static bool read_proc(const char *path, char *buf, size_t size) {
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  size_t len = 0;
  for (ssize_t n; len < size - 1 && (n = read(fd, buf + len, size - 1 - len)) != 0;) {
    if (n < 0) {
      if (errno == EINTR) continue;
      close(fd);
      return false;
    }
    len += (size_t)n;
  }
  close(fd);
  buf[len] = 0;
  return true;
}

uint64_t rss_now_kb(void) {
  char buf[256];
  unsigned long long size = 0, resident = 0;
  if (!read_proc("/proc/self/statm", buf, sizeof buf) || sscanf(buf, "%llu %llu", &size, &resident) != 2) return 0;
  return resident * (uint64_t)sysconf(_SC_PAGESIZE) / 1024;
}

uint64_t peak_rss_kb(void) {
  /* VmHWM, not getrusage's ru_maxrss: Linux carries ru_maxrss over exec from the process image
   * that exec replaced, so a program started by a 20 MB Python driver would never report less
   * than 20 MB. VmHWM belongs to the current address space alone. */
  char buf[4096];
  if (!read_proc("/proc/self/status", buf, sizeof buf)) return 0;
  const char *line = strstr(buf, "\nVmHWM:");
  unsigned long long kb = 0;
  if (!line || sscanf(line + 1, "VmHWM: %llu kB", &kb) != 1) return 0;
  return kb;
}

long online_cpus(void) {
  long n = sysconf(_SC_NPROCESSORS_ONLN);
  return n > 0 ? n : 1;
}

void sleep_s(double s) {
  struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
  while (nanosleep(&ts, &ts) == -1 && errno == EINTR) {}
}

void rng_seed(rng_t *r, uint64_t seed, uint64_t stream) {
  uint64_t z = seed + 0x9E3779B97F4A7C15ULL * (stream + 1);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  z ^= z >> 31;
  r->s = z ? z : 0x9E3779B97F4A7C15ULL;
}

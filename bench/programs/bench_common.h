/* bench_common.h - what every mtbench program shares: the option table parser, the one RESULT
 * line, clocks, a small per-thread random generator and process memory figures.
 *
 * The programs know nothing of any allocator: they call plain malloc/free and are run under
 * LD_PRELOAD by the driver. Nothing here allocates on a hot path, so the helpers never show up
 * in what is being measured. Contract for all programs (docs/mtbench.md): bad arguments print
 * one line on stderr and exit 2; a successful run prints exactly one line starting "RESULT ". */
#ifndef BENCH_COMMON_H
#define BENCH_COMMON_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define BENCH_EXIT_USAGE 2

/* ---- options ------------------------------------------------------------------------------ */

typedef enum { OPT_U64, OPT_DOUBLE, OPT_FLAG, OPT_STR } opt_kind_t;

/* One row per accepted --name. Integers accept K/M/G suffixes (powers of 1024) and the bounds
 * are inclusive; a value outside them is an error rather than being clamped, so a typo never
 * silently runs a different experiment. */
typedef struct {
  const char *name;   /* without the leading "--" */
  opt_kind_t kind;
  void *target;       /* uint64_t*, double*, bool* or const char** (OPT_STR: [a-z0-9-]+, min/max unused) */
  double min, max;
  const char *help;
} opt_t;

/* Parses argv against the table (terminated by a row with name == NULL); prints --help and exits 0,
 * or prints one error line and exits BENCH_EXIT_USAGE. */
void bench_parse(const char *prog, const char *summary, const opt_t *opts, int argc, char **argv);

/* Fails like a bad option: "prog: message" on stderr, exit BENCH_EXIT_USAGE. For cross-option checks. */
void bench_usage_error(const char *prog, const char *fmt, ...) __attribute__((format(printf, 2, 3), noreturn));
/* Fails at run time (a thread could not be created, memory ran out): exit 1. */
void bench_die(const char *prog, const char *fmt, ...) __attribute__((format(printf, 2, 3), noreturn));

/* ---- the result line ---------------------------------------------------------------------- */

/* RESULT bench=NAME key=value ... on one line of stdout, flushed at result_end(). Keys are
 * [a-z0-9_]; values never contain spaces. result_end() appends the process-wide figures every
 * program reports: cpu_user_s, cpu_sys_s, minflt (children included), peak_rss_kb, rss_end_kb. */
void result_begin(const char *bench);
void result_u64(const char *key, uint64_t v);
void result_f(const char *key, double v);
void result_str(const char *key, const char *v);
void result_end(void);

/* ---- clocks, randomness, memory ----------------------------------------------------------- */

double now_s(void);                 /* CLOCK_MONOTONIC in seconds */
double process_cpu_s(void);         /* user + system of the whole process so far */
uint64_t rss_now_kb(void);          /* resident set now, from /proc/self/statm */
uint64_t peak_rss_kb(void);         /* high-water resident set of this address space (VmHWM) */
long online_cpus(void);
void sleep_s(double s);

/* splitmix64-seeded xorshift64*: cheap, no shared state, so it never adds contention. */
typedef struct { uint64_t s; } rng_t;
void rng_seed(rng_t *r, uint64_t seed, uint64_t stream);
static inline uint64_t rng_next(rng_t *r) {
  r->s ^= r->s >> 12; r->s ^= r->s << 25; r->s ^= r->s >> 27;
  return r->s * 0x2545F4914F6CDD1DULL;
}
/* Uniform in [0, n) for n > 0 (multiply-shift; bias is irrelevant at these n). */
static inline uint64_t rng_below(rng_t *r, uint64_t n) {
  return (uint64_t)(((unsigned __int128)rng_next(r) * n) >> 64);
}

/* Keeps the compiler from proving a pointer unused and deleting a malloc/free pair. */
static inline void escape(void *p) { __asm__ volatile("" : : "g"(p) : "memory"); }

#endif

/* prof_accuracy.c - how close a sampling heap profiler's live-heap estimate is to the truth.
 *
 * Seven known call sites allocate known amounts (--megabytes each) in one block size each, from
 * 16 B to 1 MiB; four keep everything they allocate (the "leaks": keep_16, keep_1k, keep_32k,
 * keep_1m), three free everything (free_64, free_4k, free_256k). Then the live heap is dumped
 * through the allocator's profiler, if it has one the program knows: qmalloc's qm_prof_dump, found
 * with dlsym, so other allocators still run (profiler=none, no accuracy figures). The dump is a
 * gperftools heap profile ("heap_v2/<rate>"); each stack line is scaled as google-pprof scales it
 * (1 / (1 - exp(-average size / rate))) and attributed to the site whose function is on its stack
 * (dladdr: the program is linked with -rdynamic).
 * Figures: per site the estimated live bytes against the truth (err_pct, worst: max_err_pct), the
 * share of the live total (worst error in points: max_share_err_pts), and whether the sites with
 * live bytes are exactly the keeping ones (leak_sites_exact; other_bytes: live bytes attributed
 * to no site). Also the allocation phase's time (alloc_s), to set sampling on against off, and the
 * whole run's (elapsed_s). */
#define _GNU_SOURCE
#include "bench_common.h"

#include <dlfcn.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define PROG "prof-accuracy"

static uint64_t opt_megabytes = 256;

typedef struct {
  const char *name;
  size_t size;
  bool keep;
  double truth, estimate;
} site_t;

static site_t sites[] = {
    {"keep_16", 16, true, 0, 0},      {"free_64", 64, false, 0, 0},     {"keep_1k", 1024, true, 0, 0},
    {"free_4k", 4096, false, 0, 0},   {"keep_32k", 32768, true, 0, 0},  {"free_256k", 262144, false, 0, 0},
    {"keep_1m", 1048576, true, 0, 0},
};
#define SITES (sizeof sites / sizeof sites[0])

static size_t blocks_of(size_t size) { return (size_t)(opt_megabytes << 20) / size; }

/* Each site is its own function, so its stack tells it apart. The kept blocks are never freed:
 * the process ends with them (that is the leak the profile must show). */
#define KEEP_SITE(fn, bytes)                                                                       \
  __attribute__((noinline)) void fn(void) {                                                       \
    for (size_t i = 0, n = blocks_of(bytes); i < n; i++) {                                        \
      char *p = malloc(bytes);                                                                    \
      if (p == NULL) bench_die(PROG, "malloc(%d) returned NULL", (int)(bytes));                   \
      p[0] = 1;                                                                                   \
      escape(p);                                                                                  \
    }                                                                                             \
  }
#define FREE_SITE(fn, bytes)                                                                       \
  __attribute__((noinline)) void fn(void) {                                                       \
    for (size_t i = 0, n = blocks_of(bytes); i < n; i++) {                                        \
      char *p = malloc(bytes);                                                                    \
      if (p == NULL) bench_die(PROG, "malloc(%d) returned NULL", (int)(bytes));                   \
      p[0] = 1;                                                                                   \
      escape(p);                                                                                  \
      free(p);                                                                                    \
    }                                                                                             \
  }
KEEP_SITE(keep_16, 16)
FREE_SITE(free_64, 64)
KEEP_SITE(keep_1k, 1024)
FREE_SITE(free_4k, 4096)
KEEP_SITE(keep_32k, 32768)
FREE_SITE(free_256k, 262144)
KEEP_SITE(keep_1m, 1048576)
static void (*const site_fns[SITES])(void) = {keep_16, free_64, keep_1k, free_4k, keep_32k, free_256k, keep_1m};

static int site_of_frame(uintptr_t pc) {
  Dl_info info;
  if (dladdr((void *)(pc - 1), &info) == 0 || info.dli_sname == NULL) return -1;
  for (size_t s = 0; s < SITES; s++)
    if (strcmp(info.dli_sname, sites[s].name) == 0) return (int)s;
  return -1;
}

/* Reads the dump; returns the sampling rate (0 if the file is not a heap profile). */
static double read_profile(const char *path, double *other_bytes, uint64_t *samples) {
  FILE *f = fopen(path, "r");
  if (f == NULL) return 0;
  static char line[8192];
  double rate = 0;
  if (fgets(line, sizeof line, f) != NULL) {
    const char *v2 = strstr(line, "@ heap_v2/");
    if (strncmp(line, "heap profile:", 13) == 0 && v2 != NULL) rate = strtod(v2 + 10, NULL);
  }
  while (rate > 0 && fgets(line, sizeof line, f) != NULL) {
    if (strncmp(line, "MAPPED_LIBRARIES:", 17) == 0) break;
    char *at = strchr(line, '@');
    if (at == NULL) continue;
    char *end;
    double objs = strtod(line, &end);
    double bytes = strtod(end + 1, NULL); /* after the ':' */
    if (objs <= 0) continue;
    *samples += (uint64_t)objs;
    double scale = 1 / (1 - exp(-(bytes / objs) / rate));
    int site = -1;
    for (char *p = at + 1; site < 0 && *p != '\0' && *p != '\n';) {
      uintptr_t pc = (uintptr_t)strtoull(p, &p, 16);
      if (pc == 0) break;
      site = site_of_frame(pc);
    }
    if (site >= 0) sites[site].estimate += bytes * scale;
    else *other_bytes += bytes * scale;
  }
  fclose(f);
  return rate;
}

int main(int argc, char **argv) {
  const opt_t opts[] = {
    {"megabytes", OPT_U64, &opt_megabytes, 1, 65536, "MiB allocated at each of the 7 sites"},
    {NULL, 0, NULL, 0, 0, NULL},
  };
  bench_parse(PROG, "Seven known sites allocate known amounts (4 keep, 3 free); how close is the heap profiler's estimate?",
              opts, argc, argv);
  double t0 = now_s();
  for (size_t s = 0; s < SITES; s++) {
    site_fns[s]();
    sites[s].truth = sites[s].keep ? (double)(blocks_of(sites[s].size) * sites[s].size) : 0;
  }
  double alloc_s = now_s() - t0;

  int (*dump)(const char *, int) = (int (*)(const char *, int))dlsym(RTLD_DEFAULT, "qm_prof_dump");
  result_begin(PROG);
  result_u64("megabytes", opt_megabytes);
  result_f("alloc_s", alloc_s);
  if (dump == NULL) {
    result_str("profiler", "none");
    result_f("elapsed_s", now_s() - t0);
    result_end();
    return 0;
  }
  char path[] = "/tmp/prof-accuracy-XXXXXX";
  int fd = mkstemp(path);
  if (fd < 0) bench_die(PROG, "mkstemp failed");
  close(fd);
  if (dump(path, 0) != 0) bench_die(PROG, "qm_prof_dump(%s) failed", path);
  double other = 0;
  uint64_t samples = 0;
  double rate = read_profile(path, &other, &samples);
  unlink(path);
  if (rate <= 0) bench_die(PROG, "the profile is not a heap_v2 heap profile");

  double truth_total = 0, est_total = other;
  for (size_t s = 0; s < SITES; s++) {
    truth_total += sites[s].truth;
    est_total += sites[s].estimate;
  }
  double max_err = 0, max_share_err = 0;
  bool exact = true;
  result_str("profiler", "qm_prof_dump");
  result_u64("rate", (uint64_t)rate);
  result_u64("samples", samples);
  for (size_t s = 0; s < SITES; s++) {
    site_t *st = &sites[s];
    exact = exact && (st->estimate > 0) == st->keep;
    double share_err = est_total > 0 ? fabs(st->estimate / est_total - st->truth / truth_total) * 100 : 100;
    if (share_err > max_share_err) max_share_err = share_err;
    char key[48];
    snprintf(key, sizeof key, "%s_mb", st->name);
    result_f(key, st->estimate / (1 << 20));
    if (st->keep) {
      double err = fabs(st->estimate - st->truth) / st->truth * 100;
      if (err > max_err) max_err = err;
      snprintf(key, sizeof key, "%s_err_pct", st->name);
      result_f(key, err);
    }
  }
  result_f("max_err_pct", max_err);
  result_f("max_share_err_pts", max_share_err);
  result_u64("leak_sites_exact", exact);
  result_f("other_mb", other / (1 << 20));
  result_f("elapsed_s", now_s() - t0); /* allocation, dump and reading it back */
  result_end();
  return 0;
}

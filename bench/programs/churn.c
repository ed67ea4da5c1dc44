/* churn.c - small-object churn in one thread: a working set of --live small objects in which
 * each step frees a random one and allocates its replacement, with now and then a burst of
 * short-lived temporaries freed in reverse order (a parser's or interpreter's pattern: lots of
 * small nodes, most dying young, some staying). Sizes are skewed to the small end (the minimum
 * of two uniform draws in [--min-size, --max-size]), as in object-heavy programs. One thread, so
 * no lock is ever contended: the figure is the allocator's own path length and its cache
 * behaviour with a working set larger than any thread cache.
 *
 * Objects are stamped at both ends when allocated and checked before they are freed. */
#define _GNU_SOURCE
#include "bench_common.h"

#include <stdlib.h>

#define PROG "churn"
#define BURST_MAX 64

static uint64_t opt_ops = 10000000, opt_live = 100000, opt_min_size = 8, opt_max_size = 256, opt_seed = 1;

static size_t skewed_size(rng_t *r) {
  uint64_t span = opt_max_size - opt_min_size + 1;
  uint64_t a = rng_below(r, span), b = rng_below(r, span);
  return opt_min_size + (a < b ? a : b);
}

static unsigned char *obj_new(rng_t *r) {
  size_t size = skewed_size(r);
  unsigned char *p = malloc(size);
  if (!p) bench_die(PROG, "malloc(%zu) returned NULL", size);
  /* The stamp is derived from the address, so it needs no room of its own (objects may be 1 byte). */
  p[0] = (unsigned char)((uintptr_t)p >> 4);
  return p;
}

static void obj_free(unsigned char *p) {
  if (p[0] != (unsigned char)((uintptr_t)p >> 4)) bench_die(PROG, "object %p lost its stamp", (void *)p);
  free(p);
}

int main(int argc, char **argv) {
  const opt_t opts[] = {
    {"ops", OPT_U64, &opt_ops, 1, 1e12, "replacements (each a free and a malloc)"},
    {"live", OPT_U64, &opt_live, 1, 1 << 28, "objects alive at once"},
    {"min-size", OPT_U64, &opt_min_size, 1, 1 << 20, "smallest object in bytes"},
    {"max-size", OPT_U64, &opt_max_size, 1, 1 << 20, "largest object in bytes"},
    {"seed", OPT_U64, &opt_seed, 0, 1.8e19, "random seed"},
    {NULL, 0, NULL, 0, 0, NULL},
  };
  bench_parse(PROG, "Small-object churn in one thread: replace random members of a live set, with bursts of temporaries.",
              opts, argc, argv);
  if (opt_min_size > opt_max_size) bench_usage_error(PROG, "--min-size exceeds --max-size");

  rng_t rng;
  rng_seed(&rng, opt_seed, 0);
  unsigned char **live = malloc(opt_live * sizeof *live);
  if (!live) bench_die(PROG, "out of memory for the live set");
  for (uint64_t i = 0; i < opt_live; i++) live[i] = obj_new(&rng);
  unsigned char *burst[BURST_MAX];
  uint64_t mallocs = 0;
  double start = now_s();
  for (uint64_t k = 0; k < opt_ops; k++) {
    uint64_t i = rng_below(&rng, opt_live);
    obj_free(live[i]);
    live[i] = obj_new(&rng);
    mallocs++;
    if ((k & 15) == 0) { /* one step in 16: a burst of temporaries, freed last-in first-out */
      uint64_t n = 1 + rng_below(&rng, BURST_MAX);
      for (uint64_t j = 0; j < n; j++) burst[j] = obj_new(&rng);
      for (uint64_t j = n; j-- > 0;) obj_free(burst[j]);
      mallocs += n;
    }
  }
  double elapsed = now_s() - start;
  for (uint64_t i = 0; i < opt_live; i++) obj_free(live[i]);
  free(live);

  result_begin(PROG);
  result_u64("ops", opt_ops);
  result_u64("live", opt_live);
  result_u64("min_size", opt_min_size);
  result_u64("max_size", opt_max_size);
  result_u64("mallocs", mallocs);
  result_f("elapsed_s", elapsed);
  result_f("ops_per_s", 2 * mallocs / elapsed);
  result_end();
  return 0;
}

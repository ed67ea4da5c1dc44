/* t_test1.c - the random malloc/free/realloc test that ships with ptmalloc as t-test1, as
 * TCMalloc's paper ran it (seed 002, "Performance Notes"): T threads that never share objects,
 * each doing a stream of random operations on its own table of slots, sizes uniform in
 * [1, --max-size]. Only the allocator synchronizes the threads, so the figures are its
 * scalability: operations per wall second and per CPU second (spinning on locks burns the latter).
 *
 * Each block is stamped (both ends and one byte per 4 KiB page) when allocated and checked
 * before it is freed, and realloc must preserve the stamped prefix, so an allocator that hands
 * out overlapping memory fails loudly (exit 1) instead of producing a fast figure. */
#define _GNU_SOURCE
#include "bench_common.h"

#include <pthread.h>
#include <stdlib.h>

#define PROG "t-test1"
#define STAMP_STRIDE 4096

static uint64_t opt_threads = 1, opt_iterations = 1000000, opt_max_size = 4096, opt_bins = 1000, opt_seed = 1;

typedef struct {
  unsigned char *p;
  size_t size;
  unsigned char stamp;
} slot_t;

typedef struct {
  uint64_t index;
  uint64_t ops;
  double start, end;
} worker_t;

static pthread_barrier_t start_line;

static void stamp(unsigned char *p, size_t size, unsigned char v) {
  for (size_t off = 0; off < size; off += STAMP_STRIDE) p[off] = v;
  p[size - 1] = v;
}

/* Checks the stamps within the first `size` bytes. */
static void check(const unsigned char *p, size_t size, unsigned char v, const char *when) {
  for (size_t off = 0; off < size; off += STAMP_STRIDE)
    if (p[off] != v) bench_die(PROG, "block %p of %zu bytes lost its contents at offset %zu (%s)", (void *)p, size, off, when);
  if (p[size - 1] != v) bench_die(PROG, "block %p of %zu bytes lost its last byte (%s)", (void *)p, size, when);
}

static size_t random_size(rng_t *r) { return 1 + (size_t)rng_below(r, opt_max_size); }

static void *worker_main(void *arg) {
  worker_t *w = arg;
  rng_t rng;
  rng_seed(&rng, opt_seed, w->index);
  slot_t *slots = calloc(opt_bins, sizeof *slots);
  if (!slots) bench_die(PROG, "out of memory for the slot table");
  pthread_barrier_wait(&start_line);
  w->start = now_s();
  for (uint64_t op = 0; op < opt_iterations; op++) {
    uint64_t r = rng_next(&rng);
    slot_t *s = &slots[rng_below(&rng, opt_bins)];
    if (!s->p) {
      s->size = random_size(&rng);
      s->p = malloc(s->size);
      if (!s->p) bench_die(PROG, "malloc(%zu) returned NULL", s->size);
      s->stamp = (unsigned char)r;
      stamp(s->p, s->size, s->stamp);
    } else if ((r & 3) == 0) { /* a quarter of the operations on a live block resize it */
      size_t new_size = random_size(&rng);
      size_t kept = new_size < s->size ? new_size : s->size;
      unsigned char *q = realloc(s->p, new_size);
      if (!q) bench_die(PROG, "realloc(%zu) returned NULL", new_size);
      /* The kept prefix still holds the stamps at multiples of the stride; its new last byte does not. */
      for (size_t off = 0; off < kept; off += STAMP_STRIDE)
        if (q[off] != s->stamp) bench_die(PROG, "realloc lost the contents of a %zu-byte block", s->size);
      s->p = q;
      s->size = new_size;
      s->stamp = (unsigned char)(r >> 8);
      stamp(s->p, s->size, s->stamp);
    } else {
      check(s->p, s->size, s->stamp, "before free");
      free(s->p);
      s->p = NULL;
    }
  }
  w->end = now_s();
  w->ops = opt_iterations;
  for (uint64_t i = 0; i < opt_bins; i++) free(slots[i].p);
  free(slots);
  return NULL;
}

int main(int argc, char **argv) {
  const opt_t opts[] = {
    {"threads", OPT_U64, &opt_threads, 1, 4096, "worker threads"},
    {"iterations", OPT_U64, &opt_iterations, 1, 1e12, "operations per thread"},
    {"max-size", OPT_U64, &opt_max_size, 1, 1ULL << 30, "largest request in bytes (sizes are uniform in [1, max])"},
    {"bins", OPT_U64, &opt_bins, 1, 1e8, "slots per thread (bounds each thread's live blocks)"},
    {"seed", OPT_U64, &opt_seed, 0, 1.8e19, "random seed"},
    {NULL, 0, NULL, 0, 0, NULL},
  };
  bench_parse(PROG, "ptmalloc's t-test1 as run in the TCMalloc paper: random malloc/free/realloc per thread.",
              opts, argc, argv);

  worker_t *w = calloc(opt_threads, sizeof *w);
  pthread_t *tids = calloc(opt_threads, sizeof *tids);
  if (!w || !tids) bench_die(PROG, "out of memory");
  pthread_barrier_init(&start_line, NULL, (unsigned)opt_threads);
  double cpu0 = process_cpu_s();
  for (uint64_t i = 0; i < opt_threads; i++) {
    w[i].index = i;
    if (pthread_create(&tids[i], NULL, worker_main, &w[i])) bench_die(PROG, "pthread_create failed");
  }
  for (uint64_t i = 0; i < opt_threads; i++) pthread_join(tids[i], NULL);
  double cpu = process_cpu_s() - cpu0;
  double first = w[0].start, last = w[0].end;
  uint64_t ops = 0;
  for (uint64_t i = 0; i < opt_threads; i++) {
    if (w[i].start < first) first = w[i].start;
    if (w[i].end > last) last = w[i].end;
    ops += w[i].ops;
  }
  double elapsed = last - first;

  result_begin(PROG);
  result_u64("threads", opt_threads);
  result_u64("iterations", opt_iterations);
  result_u64("max_size", opt_max_size);
  result_u64("bins", opt_bins);
  result_u64("ops", ops);
  result_f("elapsed_s", elapsed);
  result_f("ops_per_s", ops / elapsed);
  /* getrusage's tick-granular CPU time can read 0 for a tiny run; report 0 rather than infinity. */
  result_f("ops_per_cpu_s", cpu > 0 ? ops / cpu : 0);
  result_end();
  free(w);
  free(tids);
  return 0;
}

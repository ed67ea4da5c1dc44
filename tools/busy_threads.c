/* More threads than CPUs, each churning blocks of its own, for the thread-cache total
 * (docs/design.md, "the total bounds budgets"): T threads, each R rounds of allocating K blocks
 * of random sizes in [LO, HI], writing them, then freeing them all. The peak RSS (/usr/bin/time
 * -f %M) shows what the allocator's per-thread caches keep while threads that lose budget wait
 * for a CPU. WRITE=all (the default) writes every byte, WRITE=ends only the first 4 KiB and the
 * last byte (so the allocator's own time shows, not the writes).
 *   cc -O2 -pthread -o busy_threads tools/busy_threads.c
 *   LD_PRELOAD=build/libqmalloc.so /usr/bin/time -f '%e s %M KB' ./busy_threads 64 64 2000 1024 16384
 * Knows nothing of qmalloc: the allocator is whatever LD_PRELOAD says. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static long blocks, rounds;
static size_t smallest, largest;
static int write_all = 1;

static void *churn(void *arg) {
  unsigned seed = (unsigned)(long)arg * 7 + 1;
  void **live = malloc((size_t)blocks * sizeof *live);
  if (live == NULL) {
    fprintf(stderr, "busy_threads: out of memory\n");
    exit(1);
  }
  for (long r = 0; r < rounds; r++) {
    for (long i = 0; i < blocks; i++) {
      seed = seed * 1103515245u + 12345u;
      size_t size = smallest + (seed >> 4) % (largest - smallest + 1);
      char *p = malloc(size);
      if (p == NULL) {
        fprintf(stderr, "busy_threads: malloc(%zu) failed\n", size);
        exit(1);
      }
      memset(p, 1, write_all || size < 4096 ? size : 4096);
      p[size - 1] = 1;
      live[i] = p;
    }
    for (long i = 0; i < blocks; i++) free(live[i]);
  }
  free(live);
  return NULL;
}

int main(int argc, char **argv) {
  if (argc != 6) {
    fprintf(stderr, "usage: busy_threads THREADS BLOCKS ROUNDS SMALLEST LARGEST (bytes; WRITE=ends in the environment)\n");
    return 2;
  }
  long threads = atol(argv[1]);
  blocks = atol(argv[2]);
  rounds = atol(argv[3]);
  smallest = (size_t)atol(argv[4]);
  largest = (size_t)atol(argv[5]);
  const char *write = getenv("WRITE");
  write_all = write == NULL || strcmp(write, "ends") != 0;
  if (threads < 1 || threads > 4096 || blocks < 1 || rounds < 1 || smallest < 1 || largest < smallest) {
    fprintf(stderr, "busy_threads: THREADS 1..4096, BLOCKS and ROUNDS at least 1, 1 <= SMALLEST <= LARGEST\n");
    return 2;
  }
  pthread_t *tids = malloc((size_t)threads * sizeof *tids);
  if (tids == NULL) return 1;
  for (long i = 0; i < threads; i++) {
    if (pthread_create(&tids[i], NULL, churn, (void *)i) != 0) {
      fprintf(stderr, "busy_threads: pthread_create failed\n");
      return 1;
    }
  }
  for (long i = 0; i < threads; i++) pthread_join(tids[i], NULL);
  free(tids);
  puts("ok");
  return 0;
}

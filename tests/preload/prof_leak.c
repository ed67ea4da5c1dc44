/* A program with one deliberate leak, for tests/preload/test_prof.sh and docs/profiling.md:
 * leak_here() keeps 64 blocks of 16 KiB (1 MiB, malloc) and 512 of 1 KiB (512 KiB, calloc, so that
 * its stacks must start past qmalloc's own calloc frame); churn_and_free()
 * allocates 40 MiB in blocks of 100 B..8 KiB and frees every one of them. With "signal" as its
 * argument it sends itself SIGUSR2 (QMALLOC_PROF_SIGNAL=12 writes a profile then) while 20 MiB of
 * churn is live. Writes nothing to stdio, so no libc buffer stays allocated: at exit the only
 * blocks never freed are leak_here's. */
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void *volatile kept[64 + 512];

__attribute__((noinline)) static void leak_here(void) {
  for (int i = 0; i < 64; i++) kept[i] = memset(malloc(16384), 1, 16384);
  for (int i = 0; i < 512; i++) kept[64 + i] = memset(calloc(1, 1024), 2, 1024);
}

__attribute__((noinline)) static void churn_and_free(int signal_midway) {
  enum { LIVE = 4096 };
  static void *live[LIVE];
  size_t total = 0, n = 0;
  unsigned seed = 1;
  while (total < (40u << 20)) {
    seed = seed * 1103515245u + 12345u;
    size_t size = 100 + (seed >> 8) % 8092;
    size_t slot = n++ % LIVE;
    free(live[slot]);
    live[slot] = malloc(size);
    memset(live[slot], 3, size);
    total += size;
    if (signal_midway && n == LIVE) raise(SIGUSR2);
  }
  for (size_t i = 0; i < LIVE; i++) free(live[i]);
}

int main(int argc, char **argv) {
  int signal_midway = argc > 1 && strcmp(argv[1], "signal") == 0;
  leak_here();
  churn_and_free(signal_midway);
  static const char done[] = "done\n";
  return write(1, done, sizeof done - 1) == sizeof done - 1 ? 0 : 1;
}

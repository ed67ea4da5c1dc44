/* Two threads freeing one block at the same instant: a double free whose two calls overlap must
 * stop the program with "qmalloc: free(): double free <p>" every time, never return from both.
 * For the blocks whose free takes the page heap's path, where each call finds the block's span
 * without a lock and the check is made under it (pageheap_free_block) or by claiming a flag:
 *   - a large block (2 MiB) and a huge one (64 MiB, a mapping of its own), not sampled;
 *   - the same sampled by the heap profiler (its flag claimed by the free, api.c's free_large).
 * A sampled small block (a page of its own, kept for the next sample) is tested in unit-prof
 * (test_claim: the two claims made by hand, in the race's order; racing two threads for them hit
 * the window in none of 3,000 trials). Small blocks that are not sampled are left out: their free
 * tag is claimed with a plain store, a window docs/hardening.md describes.
 * The program runs itself twice more, with sampling off and with every block sampled
 * (QMALLOC_PROF_SAMPLE=0 and 1). Each trial forks a child, which allocates the block (a forked
 * child starts with an empty profile: a block the parent allocated is not sampled there) and
 * tells the parent its address through a shared page; two threads, their caches live, spin until
 * both are ready and then free it. */
#include <sys/mman.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "testutil.h"

enum { TRIALS = 48 };
#define HUGE_FROM ((size_t)32 << 20) /* release_large's default: a mapping of its own from there */

static void *shared_block;
static size_t block_size;
static int ready;

/* Each of the two threads spins until both are ready (the main thread waits in pthread_join: a
 * third spinning thread on two cores ran them one after the other). */
static void *free_at_once(void *unused) {
  (void)unused;
  free(malloc(100)); /* a live thread cache: a sampled page is then kept by this thread */
  __atomic_add_fetch(&ready, 1, __ATOMIC_ACQ_REL);
  while (__atomic_load_n(&ready, __ATOMIC_ACQUIRE) < 2) {
  }
  free(shared_block);
  return NULL;
}

/* In the child: allocates shared_block and tells the parent where (*told), then both threads free
 * it; if both calls return, the child exits 0. */
static void race_body(void *told) {
  shared_block = malloc(block_size);
  if (shared_block == NULL) _exit(3);
  memset(shared_block, 'r', block_size < 4096 ? block_size : 4096);
  *(void *volatile *)told = shared_block;
  pthread_t t[2];
  for (int i = 0; i < 2; i++)
    if (pthread_create(&t[i], NULL, free_at_once, NULL) != 0) _exit(2);
  for (int i = 0; i < 2; i++) pthread_join(t[i], NULL);
}

static void race(size_t size, const char *what) {
  void **told = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  CHECK(told != MAP_FAILED);
  if (told == MAP_FAILED) return;
  block_size = size;
  int stopped = 0;
  for (int trial = 0; trial < TRIALS; trial++) {
    *told = NULL;
    char out[256], want[80], unmapped[80];
    int status = 0;
    tu_stderr_of_child(race_body, told, out, sizeof out, &status);
    snprintf(want, sizeof want, "qmalloc: free(): double free %p\n", *told);
    /* A huge block's first free unmaps it: a second free that finds no span there names an address
     * qmalloc does not know (as a later double free of it does, tests/preload/test_death.sh). */
    snprintf(unmapped, sizeof unmapped, "qmalloc: free(): invalid pointer %p\n", *told);
    bool line_ok = strcmp(out, want) == 0 || (size > HUGE_FROM && strcmp(out, unmapped) == 0);
    bool ok = *told != NULL && line_ok && WIFSIGNALED(status) && WTERMSIG(status) == SIGABRT;
    CHECK_MSG(ok, "%s, trial %d: the child ended with status %#x and printed \"%s\"", what, trial, status, out);
    stopped += ok;
  }
  printf("%s: %d of %d overlapping double frees stopped\n", what, stopped, TRIALS);
  munmap(told, 4096);
}

/* Runs this program again with QMALLOC_PROF_SAMPLE=rate and argument phase; its exit status. */
static int run_phase(char *argv0, const char *phase, const char *rate) {
  pid_t child = fork();
  if (child == 0) {
    setenv("QMALLOC_PROF_SAMPLE", rate, 1);
    char *args[] = {argv0, (char *)phase, NULL};
    tu_exec_self(args, NULL);
    _exit(127);
  }
  int status = -1;
  if (child > 0) waitpid(child, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 1;
}

int main(int argc, char **argv) {
  if (argc < 2) {
    int unsampled = run_phase(argv[0], "unsampled", "0");
    int sampled = run_phase(argv[0], "sampled", "1");
    CHECK_MSG(unsampled == 0, "the phase with sampling off failed (exit %d)", unsampled);
    CHECK_MSG(sampled == 0, "the phase with every block sampled failed (exit %d)", sampled);
    return tu_summary("double_free_race");
  }
  /* The hardened build samples nothing: its second phase races the same blocks unsampled. */
  bool sampled = strcmp(argv[1], "sampled") == 0 && !tu_hardened();
  race((size_t)2 << 20, sampled ? "a sampled 2 MiB block" : "a 2 MiB block");
  race((size_t)64 << 20, sampled ? "a sampled 64 MiB block" : "a 64 MiB block");
  return tu_summary(argv[1]);
}

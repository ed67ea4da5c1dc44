/* The background releaser is never started by a free the dynamic loader makes (src/release.c):
 * glibc frees a joined thread's TLS (its DTV, the blocks of a dlopen'd module's TLS) from ld.so
 * while it holds its stack cache's lock, and pthread_create takes that lock: a releaser started
 * from such a free hung the process. Each case runs in a child of its own, watched (a hang is a failure, after a
 * generous 60 s: not a timing assumption):
 *  - fork: a parent with a releaser forks from a thread that never allocated; the child (which asks
 *    for a releaser of its own) joins a thread, and glibc, its stack cache over 40 MiB with the
 *    parent's inherited stacks, frees their DTVs: the child's first allocator calls. It must end,
 *    and an allocation must then start its releaser;
 *  - frees: one thread allocates 64 MiB of large blocks and frees them, its last allocator calls;
 *    the program's own frees start the releaser, and RSS must come back to within 12 MiB of the
 *    start with no further call (bounded by 20 s; the decay is 250 ms). Had only allocating calls
 *    started it, the retain cap would keep all 64 MiB;
 *  - loader: the frees case in this program run through its dynamic loader (`ld.so ./prog`, as
 *    some launchers do), where getauxval(AT_BASE) is 0: qmalloc then finds the loader from its
 *    debugger record. Before, it took the program for a static one and no free started the thread;
 *  - callback: threads allocate inside dl_iterate_phdr callbacks (holding the loader's list lock)
 *    while another loads and unloads a module (holding the loader's TLS lock, and waiting for the
 *    list's): a releaser started from such a callback waited for the TLS lock in pthread_create.
 *    16 processes run the race a while each; none may hang, and afterwards an allocation outside
 *    any callback must start the releaser. Before, about 1 process in 12 hung.
 * The third case, a dlopen'd module's TLS, runs preloaded: preload-releaser_tls. */
#include <dlfcn.h>
#include <elf.h>
#include <link.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/auxv.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "testutil.h"

#define PARKED 6
#define STACK_BYTES ((size_t)8 << 20) /* 6 of them: over glibc's 40 MiB stack cache in the child */


/* Whether the releaser thread is in this process, waiting up to 5 s for it. */
static int releaser_seen(void) {
  for (int tries = 0; tries < 500; tries++) {
    if (tu_thread_named("qmalloc-release")) return 1;
    tu_sleep_ms(10);
  }
  return 0;
}

/* ---- fork ---- */
static pthread_barrier_t parked_barrier;

static void *parked(void *arg) {
  void *volatile p = malloc(100); /* a thread cache each: the parent asks for its releaser */
  free(p);
  pthread_barrier_wait(&parked_barrier); /* alive at the fork: its stack is the child's to cache */
  pthread_barrier_wait(&parked_barrier);
  return arg;
}

static void *nothing(void *arg) { return arg; }

static void *forker(void *arg) {
  (void)arg; /* no allocator call on this thread before the fork: no thread cache */
  pid_t pid = fork();
  if (pid == 0) {
    pthread_t t;
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setstacksize(&attr, STACK_BYTES);
    if (pthread_create(&t, &attr, nothing, NULL) != 0) _exit(2);
    pthread_join(t, NULL); /* glibc trims its stack cache here, freeing the DTVs it held */
    void *volatile big = malloc(1 << 20); /* an allocating call: the child's releaser starts */
    free(big);
    _exit(releaser_seen() ? 0 : 3);
  }
  int status;
  if (!tu_wait_child(pid, 60, &status)) return (void *)"the forked child hung (60 s)";
  if (!WIFEXITED(status)) return (void *)"the forked child was killed by a signal";
  if (WEXITSTATUS(status) == 3) return (void *)"the forked child's allocation did not start its releaser";
  return WEXITSTATUS(status) == 0 ? NULL : (void *)"the forked child failed";
}

static int case_fork(void) {
  pthread_barrier_init(&parked_barrier, NULL, PARKED + 1);
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setstacksize(&attr, STACK_BYTES);
  pthread_t threads[PARKED], f;
  for (int i = 0; i < PARKED; i++) pthread_create(&threads[i], &attr, parked, NULL);
  pthread_barrier_wait(&parked_barrier);
  void *volatile big = malloc(1 << 20); /* an allocating call after the request: the start */
  free(big);
  CHECK_MSG(releaser_seen(), "the parent has no releaser: the case would prove nothing");
  pthread_create(&f, NULL, forker, NULL);
  void *failure = NULL;
  pthread_join(f, &failure);
  CHECK_MSG(failure == NULL, "%s", failure ? (const char *)failure : "");
  pthread_barrier_wait(&parked_barrier);
  for (int i = 0; i < PARKED; i++) pthread_join(threads[i], NULL);
  return tu_summary("api-releaser_start (fork)");
}

/* ---- frees ---- */
static const char *frees_label = "api-releaser_start (frees)";

static int case_frees(void) {
  enum { BLOCKS = 64 };
  static void *blocks[BLOCKS];
  size_t base = tu_statm_bytes(1);
  for (int i = 0; i < BLOCKS; i++) {
    blocks[i] = malloc(1 << 20);
    if (blocks[i] != NULL) memset(blocks[i], 0x5a, 1 << 20);
  }
  size_t peak = tu_statm_bytes(1);
  CHECK_MSG(peak > base + (48u << 20), "the blocks did not grow RSS (%zu -> %zu)", base, peak);
  for (int i = 0; i < BLOCKS; i++) free(blocks[i]); /* the last allocator calls */
  size_t now = peak;
  for (int waited = 0; waited < 2000 && now >= base + (12u << 20); waited++) {
    tu_sleep_ms(10);
    now = tu_statm_bytes(1);
  }
  CHECK_MSG(now < base + (12u << 20), "RSS %zu MiB above the start 20 s after the frees (peak %zu MiB above)",
            (now - base) >> 20, (peak - base) >> 20);
  return tu_summary(frees_label);
}

/* ---- callback ---- */
static volatile int callbacks_stop;

static int allocating_callback(struct dl_phdr_info *info, size_t size, void *arg) {
  (void)info, (void)size, (void)arg;
  void *volatile p = malloc(3000);
  free(p);
  return 0;
}

static void *phdr_walker(void *arg) {
  (void)arg;
  while (!callbacks_stop) dl_iterate_phdr(allocating_callback, NULL);
  return NULL;
}

static void *module_reloader(void *arg) {
  (void)arg;
  for (int round = 0; round < 150; round++) {
    void *module = dlopen(QM_TEST_MODULE, RTLD_NOW | RTLD_LOCAL);
    if (module != NULL) dlclose(module);
  }
  return NULL;
}

/* One process's race; exits 0 if it ended and the releaser then started. */
static int callback_race(void) {
  pthread_t walkers[2], reloader;
  for (int i = 0; i < 2; i++) pthread_create(&walkers[i], NULL, phdr_walker, NULL);
  pthread_create(&reloader, NULL, module_reloader, NULL);
  pthread_join(reloader, NULL);
  callbacks_stop = 1;
  for (int i = 0; i < 2; i++) pthread_join(walkers[i], NULL);
  for (int i = 0; i < 600; i++) { /* large blocks, each a poll outside any callback: a refused start is tried again */
    void *volatile p = malloc((size_t)300 << 10);
    free(p);
  }
  return releaser_seen() ? 0 : 2;
}

static int case_callback(void) {
  enum { PROCESSES = 16 };
  for (int k = 0; k < PROCESSES; k++) {
    pid_t pid = fork();
    if (pid == 0) _exit(callback_race());
    int status;
    if (!tu_wait_child(pid, 30, &status)) {
      CHECK_MSG(0, "process %d of %d hung (30 s): a releaser started inside a dl_iterate_phdr callback?", k + 1, PROCESSES);
      break;
    }
    CHECK_MSG(WIFEXITED(status) && WEXITSTATUS(status) == 0, "process %d: %s %d (exit 2: no releaser after the race)", k + 1,
              WIFEXITED(status) ? "exit" : "signal", WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status));
  }
  return tu_summary("api-releaser_start (callback)");
}

/* ---- loader ---- */
#define THROUGH_LOADER "--through-loader"

/* This program's interpreter (PT_INTERP), from its program headers; NULL if it has none. */
static const char *own_interpreter(void) {
  const ElfW(Phdr) *phdrs = (const ElfW(Phdr) *)getauxval(AT_PHDR);
  size_t count = getauxval(AT_PHNUM);
  uintptr_t bias = 0;
  for (size_t i = 0; i < count; i++)
    if (phdrs[i].p_type == PT_PHDR) bias = (uintptr_t)phdrs - phdrs[i].p_vaddr;
  for (size_t i = 0; i < count; i++)
    if (phdrs[i].p_type == PT_INTERP) return (const char *)(bias + phdrs[i].p_vaddr);
  return NULL;
}

/* Runs this program again through its loader, which runs case_frees (main, THROUGH_LOADER). */
static int case_loader(void) {
  const char *interpreter = own_interpreter();
  static char self[4096];
  ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
  CHECK_MSG(interpreter != NULL && n > 0, "no interpreter (%p) or no path to this program", (const void *)interpreter);
  if (interpreter == NULL || n <= 0) return tu_summary("api-releaser_start (loader)");
  self[n] = '\0';
  execl(interpreter, interpreter, self, THROUGH_LOADER, (char *)NULL);
  CHECK_MSG(0, "exec of %s failed", interpreter);
  return tu_summary("api-releaser_start (loader)");
}

int main(int argc, char **argv) {
  if (argc > 1 && strcmp(argv[1], THROUGH_LOADER) == 0) {
    CHECK_MSG(getauxval(AT_BASE) == 0, "AT_BASE is %#lx: not run as the loader's program", getauxval(AT_BASE));
    frees_label = "api-releaser_start (loader)";
    if (getauxval(AT_BASE) != 0) return tu_summary(frees_label);
    return case_frees();
  }
  const char *thread = getenv("QMALLOC_RELEASE_THREAD");
  if (thread != NULL && strcmp(thread, "0") == 0) { /* tests/cross, where the emulator cannot fork threads */
    printf("api-releaser_start: skipped: QMALLOC_RELEASE_THREAD=0 turns off the background releaser this tests\n");
    return 77;
  }
  /* Each case in a fresh single-threaded process, no releaser yet. */
  int (*const cases[])(void) = {case_fork, case_frees, case_loader, case_callback};
  const char *const names[] = {"fork", "frees", "loader", "callback"};
  return tu_run_cases("api-releaser_start", cases, names, sizeof cases / sizeof cases[0], 60);
}

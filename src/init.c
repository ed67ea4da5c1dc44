/* Process life: one-time initialization (usable before main and from any thread, reentrant for
 * the allocations its own library calls make); registers the fork protocol (fork.c).
 * Lock: init_lock for the one-time part. Callers: api.c and tcache.c slow paths. */
#include <pthread.h>
#include <stdlib.h>

#include "internal.h"
#include "prof.h"

QM_EARLY_DATA bool init_done;
QM_EARLY_DATA static pthread_mutex_t init_lock = PTHREAD_MUTEX_INITIALIZER;
QM_EARLY_DATA static bool init_hooks_registered;

void init_process(void) {
  if (__atomic_load_n(&init_done, __ATOMIC_ACQUIRE)) return;
  pthread_mutex_lock(&init_lock);
  if (!init_done) {
    /* Nothing here may allocate: this runs inside the first malloc. */
    options_init();
    check_init(); /* the free tags' secret, before the first object exists */
    sizeclass_init((unsigned)option(OPTION_MIN_ALIGN), (unsigned)option(OPTION_TRANSFER_BATCH));
    central_init();
    tcache_init();
    release_init();
    __atomic_store_n(&init_done, true, __ATOMIC_RELEASE);
  }
  bool register_hooks = !init_hooks_registered;
  init_hooks_registered = true;
  pthread_mutex_unlock(&init_lock);
  if (register_hooks) {
    /* These may call malloc, which now works. */
    /* At the first malloc, so usually before any other handler: prepare handlers run last
     * registered first, so ours then runs after those that allocate. */
    /* The profiler's handlers first: its prepare runs after fork.c's, so its lock (a leaf, taken
     * by a thread that may hold a stream lock inside getline) comes after libc's stream-list lock
     * and qmalloc's; taken before them it deadlocked against fflush(NULL) (preload-fork_safety). */
    prof_start();
    fork_register();
    if (option(OPTION_STATS) != 0) {
      stats_at_exit_prepare();
      atexit(stats_at_exit);
    }
  }
}

/* Initialize before main too, so options (verbose) take effect even in a program that never
 * allocates, and the first malloc of a thread pays only for its own cache. */
__attribute__((constructor)) static void init_constructor(void) { init_process(); }

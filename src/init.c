/* Process life: one-time initialization (usable before main and from any thread, reentrant for
 * the allocations its own library calls make), and the fork handlers.
 * Lock: init_lock for the one-time part. Callers: api.c and tcache.c slow paths. */
#include <pthread.h>
#include <stdlib.h>

#include "internal.h"

bool init_done;
static pthread_mutex_t init_lock = PTHREAD_MUTEX_INITIALIZER;
static bool init_hooks_registered;

/* fork: every lock is taken in the documented order before, and released (parent) or
 * re-initialized (child, where only this thread exists) after. */
static void init_fork_prepare(void) {
  tcache_lock_for_fork();
  central_lock_for_fork();
  pageheap_lock_for_fork();
}

static void init_fork_release(bool child) {
  pageheap_unlock_after_fork(child);
  central_unlock_after_fork(child);
  tcache_unlock_after_fork(child);
}

static void init_fork_parent(void) { init_fork_release(false); }

static void init_fork_child(void) {
  init_fork_release(true);
  release_after_fork_child();
}

void init_process(void) {
  if (__atomic_load_n(&init_done, __ATOMIC_ACQUIRE)) return;
  pthread_mutex_lock(&init_lock);
  if (!init_done) {
    /* Nothing here may allocate: this runs inside the first malloc. */
    options_init();
    check_init(); /* the free tags' secret, before the first object exists */
    sizeclass_init((unsigned)option(OPTION_MIN_ALIGN), (unsigned)option(OPTION_TRANSFER_BATCH));
    api_verify_sizes = option(OPTION_CHECK) >= 2;
    central_init();
    tcache_init();
    __atomic_store_n(&init_done, true, __ATOMIC_RELEASE);
  }
  bool register_hooks = !init_hooks_registered;
  init_hooks_registered = true;
  pthread_mutex_unlock(&init_lock);
  if (register_hooks) {
    /* These may call malloc, which now works. */
    pthread_atfork(init_fork_prepare, init_fork_parent, init_fork_child);
    if (option(OPTION_STATS) != 0) {
      stats_at_exit_prepare();
      atexit(stats_at_exit);
    }
  }
}

/* Initialize before main too, so options (verbose) take effect even in a program that never
 * allocates, and the first malloc of a thread pays only for its own cache. */
__attribute__((constructor)) static void init_constructor(void) { init_process(); }

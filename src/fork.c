/* The fork protocol: what qmalloc does around fork() so that the child finds a heap it can use,
 * whichever thread forks, whatever the other threads were doing, even from a signal handler that
 * interrupted the allocator. docs/design.md ("Fork") has the reasoning and the choices of glibc,
 * jemalloc, mimalloc and TCMalloc it was weighed against.
 *   prepare: single-threaded: nothing (nobody else can change the heap while this thread forks).
 *            Otherwise libc's stream-list lock first (glibc's own order: its fork takes that lock
 *            before its malloc locks), then every qmalloc lock in the documented order, except a
 *            lock the forking thread itself holds (the code a signal handler interrupted).
 *   parent:  releases what prepare took, in reverse.
 *   child:   re-initializes every qmalloc lock (one thread is left, and it holds none of them),
 *            resets the stream-list lock if prepare took it.
 * Not here: what each layer does with its own state in the child (tcache.c, central.c,
 * pageheap.c: the *_for_fork functions call fork_lock and fork_unlock). No lock of its own: the
 * record of what was taken is per thread, as two threads may fork at once. Callers: init.c
 * registers the handlers; the *_for_fork functions. */
#include <errno.h>
#include <pthread.h>
#include <sys/single_threaded.h>
#include <unistd.h>

#include "internal.h"

/* glibc exports these (GLIBC_2.2.5) though no header declares them: the lock of the list of all
 * streams that fflush(NULL) and fork take. A recursive lock, so taking it before glibc's fork
 * takes it again is fine. */
extern void _IO_list_lock(void);
extern void _IO_list_unlock(void);
extern void _IO_list_resetlock(void);

#define FORK_WORDS ((FORK_SLOTS + 63) / 64)

/* What this thread's prepare did; read by its parent or child handler. */
static __thread struct {
  bool locking;              /* other threads may exist: locks are taken */
  pid_t tid;                 /* the kernel's id of this thread, as glibc records a mutex owner */
  uint64_t taken[FORK_WORDS]; /* slot -> taken by prepare */
} fork_self;

bool fork_lock(pthread_mutex_t *lock, unsigned slot) {
  if (!fork_self.locking) return false;
  if (pthread_mutex_trylock(lock) != 0) {
    /* Busy. If this very thread holds it, the holder is the code below a signal handler that
     * called fork: it cannot go on before fork returns, so waiting would never end. glibc records
     * the owner's thread id in every mutex it locks (the field is part of its public
     * pthread_mutex_t); any other holder is another thread, which will let go. */
    if (lock->__data.__owner == fork_self.tid) return false;
    pthread_mutex_lock(lock);
  }
  fork_self.taken[slot / 64] |= (uint64_t)1 << (slot % 64);
  return true;
}

void fork_unlock(pthread_mutex_t *lock, unsigned slot, bool child) {
  uint64_t bit = (uint64_t)1 << (slot % 64);
  bool taken = (fork_self.taken[slot / 64] & bit) != 0;
  fork_self.taken[slot / 64] &= ~bit;
  if (child) { /* taken or not: whoever held it is gone */
    /* Of the same kind as before (the page heap's is adaptive): code below a signal handler that
     * forked may be inside pthread_mutex_lock or unlock, which read the kind again after its first
     * test, and stop on an assertion when it changed (a child of a timer's handler, in 4 of 7 runs
     * of 300 forks before this; none in 5 runs since). */
    int kind = lock->__data.__kind;
    pthread_mutex_init(lock, NULL);
    lock->__data.__kind = kind;
  } else if (taken) {
    pthread_mutex_unlock(lock);
  }
}

static void fork_prepare(void) {
  /* __libc_single_threaded is false from the first pthread_create on, so "true" means no other
   * thread exists: the heap cannot change while this thread is in fork, locks or not. glibc skips
   * its own malloc locks in that case too, which is what lets a single-threaded program fork from
   * a signal handler that interrupted malloc. */
  fork_self.locking = !__libc_single_threaded;
  if (!fork_self.locking) return;
  fork_self.tid = gettid();
  _IO_list_lock();
  tcache_lock_for_fork();
  central_lock_for_fork();
  pageheap_lock_for_fork();
}

static void fork_release(bool child) {
  pageheap_unlock_after_fork(child);
  central_unlock_after_fork(child);
  tcache_unlock_after_fork(child);
  if (!fork_self.locking) return;
  fork_self.locking = false;
  /* glibc resets the list lock in a child forked while several threads ran; this covers the
   * case where its view (taken before the prepare handlers) and ours differ. One thread is left
   * in the child, so resetting a lock it held is right in both. */
  if (child) _IO_list_resetlock();
  else _IO_list_unlock();
}

static void fork_parent(void) { fork_release(false); }

static void fork_child(void) {
  fork_release(true);
  release_after_fork_child(); /* the releaser thread did not come along: start one lazily */
}

void fork_register(void) { pthread_atfork(fork_prepare, fork_parent, fork_child); }

/* The background releaser: one thread that returns idle memory to the OS when the program makes no
 * allocator calls at all. Everything else in qmalloc runs on some thread's slow path (decay of free
 * pages, idle thread caches taken back, unused transfer-cache batches returned to their spans), so a
 * process that frees its memory and then only waits would otherwise keep it resident forever: the
 * "RSS does not go down" report users file against jemalloc, TCMalloc and mimalloc alike.
 *
 * - Started lazily, and only once there is something to give back: when the page heap holds at
 *   least RELEASE_START_BYTES of free backed pages, or a second thread cache exists (an idle
 *   thread's cache is then something to take back). A program that stays small and single-threaded,
 *   or must stay single-threaded until it has freed much (a sandbox set up before a big free),
 *   never gets the thread; release_thread=0 turns it off. The thread is created outside any
 *   slow-path window of the calling thread (pthread_create allocates: tcache_window.h's marks must
 *   not nest), by an allocating call (release_poll: malloc's slow paths) or by a free the program
 *   itself made (release_poll_in_free), never by one the dynamic loader made: glibc frees a joined
 *   thread's TLS (its DTV, a dlopen'd module's blocks) from ld.so while it holds the lock of its
 *   stack cache, which pthread_create takes too. Started from such a free, the releaser hung the
 *   process: a forked child whose first allocator call was one (the child of a parent with a
 *   releaser asks for its own), or a join whose frees took the free pages past the start's
 *   threshold (api-releaser_start, preload-releaser_tls). Nor by code libc or the loader called
 *   back (a dl_iterate_phdr callback holds the loader's list lock, against pthread_create's TLS
 *   lock: callers.h). glibc allocates under neither that lock
 *   nor, with a stack size given, the other one pthread_create may take (its default
 *   attributes', release_start). A program with no dynamic loader (static) gets the thread from
 *   allocating calls only. Started before the call's page-heap work, as it was from the free
 *   before it: started after it, the release before a growth ran differently from then on (a
 *   60-step growth peaked at 137-143 MiB instead of 120).
 * - Wakes every RELEASE_PERIOD_MS and runs the slow paths' housekeeping (tcache_housekeeping): the
 *   decay, and the idle scan every tcache_idle_ms. It allocates nothing, blocks every signal (the
 *   program's handlers never run on it), and holds no lock while it sleeps.
 * - Takes the retain cap's work off the program's threads: while it runs, a free that leaves more
 *   free backed pages than retain_max allows wakes it (release_wake) instead of giving them back
 *   itself, under the page heap's lock, in the middle of the program's call (mtbench large-blocks
 *   --live 3: the last free gave back 29 MB, a 2 ms madvise, 5% of the run). The pages go back
 *   a wakeup later; retain_max 0 (mallopt's M_TRIM_THRESHOLD 0) still means at once, by the
 *   freeing thread (pageheap.c, pageheap_decay). The wake and the thread's stop exchange `running`
 *   under wake_lock, so a wake it accepts is one it will still serve: its stop gives everything
 *   back (release_all_free) after it refused the last one.
 * - Ends when no thread holds a cache (release_stop): a process whose threads have all ended must
 *   end too, and this thread would keep it alive. If it was the last thread, glibc runs the
 *   program's exit on it, with the program's code: hence a default-sized stack (release_start).
 * - Fork: only the forking thread exists in the child, so the child marks the releaser not started,
 *   and starts its own the same lazy way (release_after_fork_child, from the fork handlers).
 * Lock: release_state.lock guards the start. Callers: pageheap.c and tcache.c (requests), api.c
 * (polls, in allocating calls and free's slow paths, outside windows), init.c (fork), api.c
 * (release_all_free, for malloc_trim). */
#include <pthread.h>
#include <signal.h>
#include <sys/resource.h>
#include <time.h>

#include "callers.h"
#include "internal.h"
#include "prof.h"

/* How often the thread wakes: the decay and idle scans are due at most this late (one to two
 * periods past decay_ms). Twice a second costs nothing measurable and keeps release timely; shorter
 * decay or idle intervals shorten it to half of theirs (down to RELEASE_PERIOD_MIN_MS). */
#define RELEASE_PERIOD_MS 500
#define RELEASE_PERIOD_MIN_MS 10

static uint64_t release_period_ms(void) {
  uint64_t period = RELEASE_PERIOD_MS;
  uint64_t intervals[2] = {(uint64_t)option(OPTION_DECAY_MS), (uint64_t)option(OPTION_TCACHE_IDLE_MS)};
  for (int i = 0; i < 2; i++)
    if (intervals[i] != 0 && intervals[i] / 2 < period) period = intervals[i] / 2;
  return period < RELEASE_PERIOD_MIN_MS ? RELEASE_PERIOD_MIN_MS : period;
}

static struct {
  pthread_mutex_t lock;
  bool started;   /* read without the lock by the first tests */
  bool requested; /* something to release appeared; started at the next release_poll */
  uint64_t wakeups;
  /* The sleep, and a wake from release_wake. wake_lock is its own lock, never held while calling
   * anything that allocates or takes another lock: release_wake is called under the page heap's
   * lock, and release_start holds `lock` across pthread_create, which allocates. Under wake_lock: */
  pthread_mutex_t wake_lock;
  pthread_cond_t wake_cond; /* on CLOCK_MONOTONIC (release_init) */
  bool running;             /* the thread is in its loop (started stays true when pthread_create failed) */
  pthread_t thread;         /* which thread that is, while running */
  bool wake;
} release_state QM_EARLY_DATA = {.lock = PTHREAD_MUTEX_INITIALIZER, .wake_lock = PTHREAD_MUTEX_INITIALIZER};

size_t release_all_free(void) {
  central_drain_transfer();
  return pageheap_release_all();
}

/* The thread ends when no thread holds a cache: no thread of the program allocates (its first call
 * would make one), so nothing will be asked for again soon; everything free goes back to the OS at
 * once (as malloc_trim does), and the thread returns. Sleeping on would keep the process alive: a
 * process whose last thread ends with pthread_exit lives until its last thread does, and glibc's
 * start_thread then calls exit(0) in whichever thread that is; with the releaser asleep the
 * process never ended (python3's test_threading hung on such a child, forked from a thread; so
 * does any C program whose main calls pthread_exit). The next release_request starts a new one. */
static void release_stop(void) {
  /* Frees from now on give back over the cap themselves (release_wake refuses); what the wakes
   * this thread accepted left for it goes back here. */
  pthread_mutex_lock(&release_state.wake_lock);
  release_state.running = false;
  pthread_mutex_unlock(&release_state.wake_lock);
  release_all_free();
  pthread_mutex_lock(&release_state.lock);
  __atomic_store_n(&release_state.started, false, __ATOMIC_RELEASE);
  /* A thread that made a cache since the test found the releaser still started, and asked for
   * nothing: ask again for it, so that its next slow path starts a new one. */
  if (tcache_live_caches() != 0) release_request();
  pthread_mutex_unlock(&release_state.lock);
}

static void *release_main(void *unused) {
  /* Named by itself: glibc names its own thread with one prctl, where naming another thread
   * formats a /proc path with sprintf, whose code (two 64 KiB fault-around windows of libc's text)
   * then counted in the resident set of a program that does not print: 128 KiB (mtbench prodcons
   * before it prints, docs/design.md). */
  pthread_setname_np(pthread_self(), "qmalloc-release");
  sigset_t all;
  sigfillset(&all);
  pthread_sigmask(SIG_BLOCK, &all, NULL);
  pthread_mutex_lock(&release_state.wake_lock);
  release_state.thread = pthread_self();
  release_state.running = true;
  pthread_mutex_unlock(&release_state.wake_lock);
  for (;;) {
    uint64_t ms = release_period_ms();
    struct timespec until;
    clock_gettime(CLOCK_MONOTONIC, &until);
    until.tv_sec += (time_t)(ms / 1000);
    until.tv_nsec += (long)(ms % 1000) * 1000000L;
    if (until.tv_nsec >= 1000000000L) until.tv_sec++, until.tv_nsec -= 1000000000L;
    pthread_mutex_lock(&release_state.wake_lock);
    while (!release_state.wake && pthread_cond_timedwait(&release_state.wake_cond, &release_state.wake_lock, &until) == 0) {
    }
    bool woken = release_state.wake;
    release_state.wake = false;
    pthread_mutex_unlock(&release_state.wake_lock);
    __atomic_add_fetch(&release_state.wakeups, 1, __ATOMIC_RELAXED);
    if (tcache_live_caches() == 0) break;
    if (woken) pageheap_decay_now(); /* a free went over the retain cap (release_wake) */
    tcache_housekeeping();
  }
  release_stop();
  return NULL;
}

/* The wake's condition waits on the monotonic clock: a change of the wall clock must not stretch
 * or skip the period. Made at init, before any thread can signal it, and again in a forked child
 * (with the callers' ranges, the same there). */
void release_init(void) {
  callers_init();
  pthread_condattr_t attr;
  pthread_condattr_init(&attr);
  pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
  pthread_cond_init(&release_state.wake_cond, &attr);
  pthread_condattr_destroy(&attr);
}

static size_t release_stack_size(void) {
  struct rlimit limit;
  size_t size = (size_t)8 << 20; /* an unlimited RLIMIT_STACK: glibc takes its own default, 2-8 MiB */
  if (getrlimit(RLIMIT_STACK, &limit) == 0 && limit.rlim_cur != RLIM_INFINITY) size = (size_t)limit.rlim_cur;
  if (size < (size_t)1 << 20) size = (size_t)1 << 20;
  if (size > (size_t)1 << 30) size = (size_t)1 << 30;
  return size;
}

static void release_start(void) {
  if (pthread_mutex_trylock(&release_state.lock) != 0) return; /* another thread is starting it */
  if (!release_state.started) {
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    /* A program thread's stack size, as glibc sets its default: when the releaser is the process's
     * last thread, glibc runs the program's exit (atexit handlers, C++ destructors) on it
     * (release_stop). On 64 KiB, an exit handler using 256 KiB of stack crashed
     * (preload-last_thread). The pages it does not touch are address space only. Given here rather
     * than left 0: with 0, pthread_create reads the default under a lock that glibc holds while
     * it allocates (copying default attributes a program set with pthread_setattr_default_np;
     * read in glibc 2.36's source, not reproduced). */
    pthread_attr_setstacksize(&attr, release_stack_size());
    pthread_t thread;
    bool was = prof_suspend(); /* its allocations are qmalloc's, not the program's: no samples */
    /* Marked started even if pthread_create fails: the program runs on as before (slow paths do
     * the housekeeping), without retrying a failing create on every free. */
    pthread_create(&thread, &attr, release_main, NULL);
    pthread_attr_destroy(&attr);
    prof_resume(was);
    __atomic_store_n(&release_state.started, true, __ATOMIC_RELEASE);
  }
  pthread_mutex_unlock(&release_state.lock);
}

bool release_wake(void) {
  pthread_mutex_lock(&release_state.wake_lock);
  bool accepted = release_state.running && !pthread_equal(pthread_self(), release_state.thread);
  if (accepted) {
    release_state.wake = true;
    pthread_cond_signal(&release_state.wake_cond);
  }
  pthread_mutex_unlock(&release_state.wake_lock);
  return accepted;
}

void release_request(void) {
  if (!__atomic_load_n(&release_state.started, __ATOMIC_ACQUIRE) && option(OPTION_RELEASE_THREAD))
    __atomic_store_n(&release_state.requested, true, __ATOMIC_RELAXED);
}

/* A refused start waits this many polls before the next try (release_poll): none after the first
 * refusal, then twice as many after each further one, up to 255. */
static unsigned release_refusals, release_refusal_streak;

void release_poll(void) {
  /* started is written atomically by release_start while other threads poll (ThreadSanitizer
   * found the plain read here in stress-stress). */
  if (__atomic_load_n(&release_state.requested, __ATOMIC_RELAXED) &&
      !__atomic_load_n(&release_state.started, __ATOMIC_ACQUIRE) && init_done) {
    unsigned wait = __atomic_load_n(&release_refusals, __ATOMIC_RELAXED);
    if (wait > 0) { /* a start was refused lately: not yet (a racing decrement only shortens the wait) */
      __atomic_store_n(&release_refusals, wait - 1, __ATOMIC_RELAXED);
      return;
    }
    /* Not from code libc or the loader called back (callers.h). A program that allocates in
     * callbacks pays for a stack walk at fewer and fewer polls, one in 256 at most; one refusal
     * costs nothing more (a forked child's thread creation, whose allocations are the loader's,
     * then one malloc of its own: api-releaser_start, whose child started no releaser when a
     * refusal made it wait 255 polls). At the next poll if the walk could not tell. */
    callers_verdict_t verdict = callers_may_create_thread();
    if (verdict != CALLERS_YES) {
      if (verdict == CALLERS_NO) {
        unsigned streak = __atomic_load_n(&release_refusal_streak, __ATOMIC_RELAXED);
        if (streak < 8) __atomic_store_n(&release_refusal_streak, streak + 1, __ATOMIC_RELAXED);
        __atomic_store_n(&release_refusals, (1u << streak) - 1, __ATOMIC_RELAXED);
      }
      return;
    }
    __atomic_store_n(&release_state.requested, false, __ATOMIC_RELAXED);
    release_start();
  }
}

/* A program whose last calls are frees still gets the thread that gives their pages back: its own
 * frees may start it, the loader's may not (callers.h). */
void release_poll_in_free(const void *ret) {
  /* release_poll's own first test, before the caller's address is looked up: most large frees come
   * with no start requested, or once the thread runs. */
  if (!__atomic_load_n(&release_state.requested, __ATOMIC_RELAXED)) return;
  if (callers_free_may_start_thread(ret)) release_poll();
}

uint64_t release_wakeups(void) { return __atomic_load_n(&release_state.wakeups, __ATOMIC_RELAXED); }

void release_after_fork_child(void) {
  pthread_mutex_init(&release_state.lock, NULL);
  release_refusals = release_refusal_streak = 0; /* the parent's refusals are not the child's */
  /* The parent's releaser, or a free waking it, may have held these at the fork. */
  pthread_mutex_init(&release_state.wake_lock, NULL);
  release_init();
  release_state.wake = false;
  release_state.running = false;
  /* The parent had one: so will the child, at its first slow path (if the option still allows). */
  release_state.requested = release_state.started && option(OPTION_RELEASE_THREAD);
  release_state.started = false;
}

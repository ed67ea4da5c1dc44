/* fork() while other threads are inside the allocator. Worker threads allocate, pass around
 * (through a shared array of atomic slots) and free objects without pause while the main thread
 * forks again and again, so some forks land while a worker holds an allocator lock. Each child
 * must find a working heap:
 *  - mode 0: it takes every object the (now vanished) workers left in the slots and the objects
 *    the main thread allocated before forking, verifies and frees them, then allocates, verifies
 *    and frees a few thousand objects of its own, large ones (up to 16 MiB) included;
 *  - mode 1: it does that and then starts threads of its own that run the same cross-thread
 *    traffic as the parent's workers;
 *  - mode 2: it forks a grandchild that does mode 0, and passes its status on.
 * Children leave with _exit; the parent checks every child's exit status. A child that hangs
 * (an allocator lock left held across fork) is killed by its own alarm after 120 s and reported
 * as such rather than hanging the test run; no check depends on timing otherwise.
 *
 * --no-child-threads leaves mode 1 out, for emulators that cannot start a thread in such a child
 * (tests/cross/run.sh passes it only where its probe shows that; the count of each mode is printed).
 *
 * usage: stress_fork [--smoke] [--forks N] [--no-child-threads] */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include "testutil.h"

#define NSLOTS 1024
#define PARENT_OBJECTS 256
#define CHILD_WATCHDOG_SECONDS 120

/* Objects carry their own size and seed in a 16-byte header, so whoever finds one can check it. */
typedef struct {
  uint64_t size, seed;
} header_t;

static _Atomic(header_t *) slots[NSLOTS];
static atomic_int stop_workers;

/* child exit codes */
enum { CHILD_OK = 0, CHILD_CORRUPT = 1, CHILD_NULL = 2, CHILD_THREADS = 3, CHILD_GRANDCHILD = 4, CHILD_FORK = 5 };

static header_t *make(uint64_t *rng, size_t max_small, int allow_large) {
  uint64_t r = tu_rand(rng);
  size_t size = 16 + (r >> 8) % max_small;
  if (allow_large && r % 256 == 0) size = (256u << 10) + (r >> 8) % (2u << 20);
  header_t *h = malloc(size);
  if (!h) return NULL;
  h->size = size;
  h->seed = tu_rand(rng);
  tu_fill(h + 1, size - sizeof *h, h->seed);
  return h;
}

static int check(const header_t *h) {
  return h->size >= sizeof *h && h->size < (64u << 20) && tu_verify(h + 1, h->size - sizeof *h, h->seed) < 0;
}

/* One unit of cross-thread traffic: a new object in, whatever was in the slot checked and freed. */
static int exchange_once(uint64_t *rng) {
  header_t *h = make(rng, 16384, 1);
  if (!h) return CHILD_NULL;
  header_t *old = atomic_exchange(&slots[tu_rand(rng) % NSLOTS], h);
  if (old) {
    if (!check(old)) return CHILD_CORRUPT;
    free(old);
  }
  return CHILD_OK;
}

static atomic_long worker_errors;
static void *parent_worker(void *arg) {
  uint64_t rng = 0xf0f0 + (uint64_t)(uintptr_t)arg;
  while (!atomic_load(&stop_workers))
    if (exchange_once(&rng) != CHILD_OK && atomic_fetch_add(&worker_errors, 1) < 5)
      fprintf(stderr, "FAIL parent worker %d: corrupt object or NULL from malloc\n", (int)(uintptr_t)arg);
  return NULL;
}

typedef struct {
  uint64_t seed;
  int result;
} child_thread_t;
static void *child_worker(void *arg) {
  child_thread_t *c = arg;
  for (int i = 0; i < 1000 && c->result == CHILD_OK; i++) c->result = exchange_once(&c->seed);
  return NULL;
}

static header_t *parent_objects[PARENT_OBJECTS];

static int child_mode0(uint64_t seed) {
  for (int i = 0; i < NSLOTS; i++) { /* objects of threads that do not exist here */
    header_t *h = atomic_exchange(&slots[i], NULL);
    if (h && !check(h)) return CHILD_CORRUPT;
    free(h);
  }
  for (int i = 0; i < PARENT_OBJECTS; i++) {
    if (!check(parent_objects[i])) return CHILD_CORRUPT;
    free(parent_objects[i]);
  }
  enum { N = 2000 };
  static header_t *mine[N];
  uint64_t rng = seed;
  for (int i = 0; i < N; i++)
    if (!(mine[i] = make(&rng, 4096, 0))) return CHILD_NULL;
  for (int i = 0; i < 3; i++) { /* large, also beyond the workers' sizes: 1, 4, 16 MiB */
    size_t size = (1u << 20) << (2 * i);
    unsigned char *p = malloc(size);
    if (!p) return CHILD_NULL;
    memset(p, i, size);
    if (p[size - 1] != (unsigned char)i) return CHILD_CORRUPT;
    free(p);
  }
  for (int i = 0; i < N; i++) {
    if (!check(mine[i])) return CHILD_CORRUPT;
    free(mine[i]);
  }
  return CHILD_OK;
}

static int child_mode1(uint64_t seed) {
  int rc = child_mode0(seed);
  if (rc != CHILD_OK) return rc;
  enum { T = 4 };
  pthread_t t[T];
  child_thread_t c[T];
  for (int i = 0; i < T; i++) {
    c[i] = (child_thread_t){seed * 31 + (uint64_t)i, CHILD_OK};
    if (pthread_create(&t[i], NULL, child_worker, &c[i]) != 0) return CHILD_THREADS;
  }
  for (int i = 0; i < T; i++) pthread_join(t[i], NULL);
  for (int i = 0; i < T; i++)
    if (c[i].result != CHILD_OK) return c[i].result;
  for (int i = 0; i < NSLOTS; i++) {
    header_t *h = atomic_exchange(&slots[i], NULL);
    if (h && !check(h)) return CHILD_CORRUPT;
    free(h);
  }
  return CHILD_OK;
}

static int child_mode2(uint64_t seed) {
  pid_t pid = fork();
  if (pid < 0) return CHILD_FORK;
  if (pid == 0) {
    alarm(CHILD_WATCHDOG_SECONDS);
    _exit(child_mode0(seed + 1));
  }
  int status;
  if (waitpid(pid, &status, 0) != pid || !WIFEXITED(status)) return CHILD_GRANDCHILD;
  return WEXITSTATUS(status);
}

static const char *describe(int status, char *buf, size_t n) {
  static const char *const codes[] = {"ok", "corrupt object", "malloc returned NULL", "pthread_create failed",
                                      "grandchild died", "fork failed"};
  if (WIFEXITED(status))
    snprintf(buf, n, "exit %d (%s)", WEXITSTATUS(status), WEXITSTATUS(status) < 6 ? codes[WEXITSTATUS(status)] : "?");
  else if (WIFSIGNALED(status) && WTERMSIG(status) == SIGALRM)
    snprintf(buf, n, "hung for %d s and was killed by its watchdog (deadlock after fork?)", CHILD_WATCHDOG_SECONDS);
  else
    snprintf(buf, n, "killed by signal %d", WIFSIGNALED(status) ? WTERMSIG(status) : -1);
  return buf;
}

int main(int argc, char **argv) {
  int n_forks = 1000, n_workers = 8, n_modes = 3;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--smoke")) {
      n_forks = 90;
      n_workers = 4;
    } else if (!strcmp(argv[i], "--forks") && i + 1 < argc) {
      char *end;
      errno = 0;
      long v = strtol(argv[++i], &end, 10);
      if (errno || *end || v < 1 || v > 1000000) {
        fprintf(stderr, "fork: --forks needs an integer in [1, 1000000], got '%s'\n", argv[i]);
        return 2;
      }
      n_forks = (int)v;
    } else if (!strcmp(argv[i], "--no-child-threads")) {
      n_modes = 2; /* modes 0 and 2 */
    } else {
      fprintf(stderr, "fork: unknown argument '%s' (expected --smoke, --forks N or --no-child-threads)\n", argv[i]);
      return 2;
    }
  }
  uint64_t rng = 0xf02c;
  for (int i = 0; i < PARENT_OBJECTS; i++) parent_objects[i] = make(&rng, 16384, 1);
  pthread_t workers[16];
  for (int i = 0; i < n_workers; i++) pthread_create(&workers[i], NULL, parent_worker, (void *)(intptr_t)i);

  int failed_children = 0, modes[3] = {0};
  for (int i = 0; i < n_forks; i++) {
    /* give the workers something in the slots and keep the main thread allocating too */
    for (int k = 0; k < 20; k++) exchange_once(&rng);
    fflush(stdout);
    int mode = n_modes == 3 ? i % 3 : 2 * (i % 2);
    pid_t pid = fork();
    if (pid == 0) {
      alarm(CHILD_WATCHDOG_SECONDS);
      uint64_t seed = 0x5eed + (uint64_t)i;
      _exit(mode == 0 ? child_mode0(seed) : mode == 1 ? child_mode1(seed) : child_mode2(seed));
    }
    if (pid < 0) {
      CHECK_MSG(0, "fork %d failed: %s", i, strerror(errno));
      break;
    }
    int status;
    CHECK(waitpid(pid, &status, 0) == pid);
    modes[mode]++;
    if (!(WIFEXITED(status) && WEXITSTATUS(status) == 0)) {
      char buf[160];
      if (failed_children++ < 10) fprintf(stderr, "FAIL child %d (mode %d): %s\n", i, mode, describe(status, buf, sizeof buf));
    }
  }
  atomic_store(&stop_workers, 1);
  for (int i = 0; i < n_workers; i++) pthread_join(workers[i], NULL);

  printf("fork: %d forks (modes %d/%d/%d) with %d threads allocating, %d failed children\n", n_forks, modes[0],
         modes[1], modes[2], n_workers, failed_children);
  CHECK_MSG(failed_children == 0, "%d of %d children failed (first ones above)", failed_children, n_forks);
  CHECK_MSG(atomic_load(&worker_errors) == 0, "%ld errors in the parent's workers", atomic_load(&worker_errors));
  int parent_ok = 1;
  for (int i = 0; i < PARENT_OBJECTS; i++) {
    parent_ok &= parent_objects[i] && check(parent_objects[i]);
    free(parent_objects[i]);
  }
  CHECK_MSG(parent_ok, "the parent's own objects were damaged by its children");
  for (int i = 0; i < NSLOTS; i++) {
    header_t *h = atomic_exchange(&slots[i], NULL);
    if (h) CHECK(check(h));
    free(h);
  }
  return tu_summary("stress-fork");
}

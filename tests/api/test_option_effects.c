/* Every option changes what it says. The test runs itself again as a child with QMALLOC_*
 * settings (options are read at load time), the child runs a small workload and prints qmalloc's
 * statistics as JSON, and the parent compares the numbers against a run with the defaults. */
#include <malloc.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include "qmalloc.h"
#include "testutil.h"

void free_sized(void *ptr, size_t size);

/* ---- child side: workloads ---- */

static void churn(void) { /* many small objects out and back: exercises the thread cache */
  static void *objs[4000];
  for (int round = 0; round < 20; round++) {
    for (int i = 0; i < 4000; i++) objs[i] = malloc(64 + (i % 4) * 64);
    for (int i = 0; i < 4000; i++) free(objs[i]);
  }
}

static int idle_pipe[2];
static pthread_barrier_t idle_now;
static void *fill_cache_then_idle(void *unused) {
  churn();
  pthread_barrier_wait(&idle_now);
  char c;
  return read(idle_pipe[0], &c, 1) >= 0 ? NULL : NULL; /* blocks until the process exits */
}

static int child(const char *workload) {
  if (strcmp(workload, "churn") == 0) churn();
  if (strcmp(workload, "idle-thread") == 0) { /* one thread fills its cache and blocks; main works 0.4 s */
    pthread_t t;
    pthread_barrier_init(&idle_now, NULL, 2);
    if (pipe(idle_pipe) || pthread_create(&t, NULL, fill_cache_then_idle, NULL)) abort();
    pthread_barrier_wait(&idle_now);
    for (int i = 0; i < 40; i++) { /* after the first round all hits: scans run in the releaser */
      churn();
      usleep(10 * 1000);
    }
  }
  if (strcmp(workload, "large-free") == 0) { /* 4 MiB freed, then some time and activity */
    char *p = malloc(4 << 20);
    memset(p, 1, 4 << 20);
    free(p);
    usleep(50 * 1000);
    free(malloc(300 << 10));
  }
  if (strcmp(workload, "grow-steps") == 0) { /* a block grown by steps, each too large for the last one freed */
    size_t size = 1 << 20;
    char *p = memset(malloc(size), 1, size);
    for (int i = 0; i < 4; i++, size *= 2) {
      char *q = memset(malloc(2 * size), 2, 2 * size);
      free(p);
      p = q;
    }
  }
  if (strcmp(workload, "partly-touched") == 0) { /* 8 MiB freed, of which the program wrote 1 MiB */
    char *p = malloc(8 << 20);
    memset(p, 1, 1 << 20);
    usleep(30 * 1000); /* a block that lived (PAGEHEAP_RESIDENCY_MIN_AGE_MS): a young one is not asked */
    free(p);
    fflush(stdout);
    qm_stats_print(1, QM_STATS_JSON); /* the statistics the parent reads: the first printed */
    size_t mapped = mallinfo2().arena;
    char *q = malloc(8 << 20); /* a block of that size again, from the freed one's pieces joined */
    printf("heap grown: %s\n", q == NULL || mallinfo2().arena != mapped ? "yes" : "no");
    memset(q, 2, 8 << 20);
    free(q);
  }
  if (strcmp(workload, "shrunk-untouched") == 0) { /* 8 MiB written to 1 MiB, then cut to 1.5 MiB in place */
    char *p = malloc(8 << 20);
    memset(p, 1, 1 << 20);
    usleep(30 * 1000);
    char *q = realloc(p, 3 << 19);
    printf("shrunk in place: %s\n", q == p ? "yes" : "no");
    fflush(stdout);
    qm_stats_print(1, QM_STATS_JSON); /* the statistics the parent reads: the first printed */
    free(q);
  }
  if (strcmp(workload, "calloc-joined") == 0) { /* calloc(8 MiB) over 2 MiB freed and the released pages after them */
    char *p = malloc(2 << 20);
    memset(p, 7, 2 << 20);
    free(p);
    struct rusage before, after;
    getrusage(RUSAGE_SELF, &before);
    char *q = calloc(1, 8 << 20);
    getrusage(RUSAGE_SELF, &after);
    size_t nonzero = 0;
    for (size_t at = 0; at < (8 << 20); at++) nonzero += q[at] != 0;
    printf("calloc: same place %s, %ld page faults, %zu bytes not zero\n", q == p ? "yes" : "no",
           after.ru_minflt - before.ru_minflt, nonzero);
  }
  if (strcmp(workload, "keep-2m") == 0) memset(malloc(2 << 20), 1, 2 << 20);
  if (strcmp(workload, "usable-8") == 0) printf("usable %zu\n", malloc_usable_size(malloc(8)));
  if (strcmp(workload, "bad-sized-free") == 0) free_sized(malloc(100), 5000);
  if (strcmp(workload, "good-sized-free") == 0) free_sized(malloc(100), 100);
  if (strcmp(workload, "tag-overwritten") == 0) { /* a write after free over a cached object's tag */
    long *p = malloc(64);
    free(p);
    p[1] = 42;
    for (int i = 0; i < 1000; i++) free(malloc(3000)); /* slow paths of another class; p stays */
  }
  fflush(stdout);
  qm_stats_print(1, QM_STATS_JSON);
  return 0;
}

/* ---- parent side ---- */

typedef struct {
  char out[1 << 16], err[1 << 14];
  int status;
} run_t;

static void drain(int fd, char *buf, size_t cap) {
  size_t at = 0;
  ssize_t n;
  while (at + 1 < cap && (n = read(fd, buf + at, cap - 1 - at)) > 0) at += (size_t)n;
  buf[at] = '\0';
}

/* Runs this program as a child: workload, with the given "NAME=value" settings (or NULL). */
static void run(run_t *r, const char *workload, const char *setting) {
  int out[2], err[2];
  if (pipe(out) || pipe(err)) abort();
  pid_t pid = fork();
  if (pid == 0) {
    dup2(out[1], 1);
    dup2(err[1], 2);
    close(out[0]);
    close(err[0]);
    if (setting) putenv((char *)setting);
    char *argv[] = {"test_option_effects", "child", (char *)workload, NULL};
    tu_exec_self(argv, NULL);
    _exit(127);
  }
  close(out[1]);
  close(err[1]);
  drain(out[0], r->out, sizeof r->out); /* small outputs: reading one after the other is safe */
  drain(err[0], r->err, sizeof r->err);
  close(out[0]);
  close(err[0]);
  waitpid(pid, &r->status, 0);
}

static long long field(const run_t *r, const char *name) {
  char key[64];
  snprintf(key, sizeof key, "\"%s\": ", name);
  const char *at = strstr(r->out, key);
  return at ? atoll(at + strlen(key)) : -1;
}

static bool exited_ok(const run_t *r) { return WIFEXITED(r->status) && WEXITSTATUS(r->status) == 0; }

int main(int argc, char **argv) {
  if (argc == 3 && strcmp(argv[1], "child") == 0) return child(argv[2]);
  static run_t base, r;
  /* The children count what other options change: the heap profiler, on by default, serves a
   * sampled block as whole pages of its own (its usable size, a large block that would have been a
   * huge one), and which allocation it samples is random. */
  setenv("QMALLOC_PROF_SAMPLE", "0", 1);

  run(&base, "churn", NULL);
  CHECK(exited_ok(&base) && field(&base, "refills") > 0);
  run(&r, "churn", "QMALLOC_TCACHE_MAX=64K");
  CHECK_MSG(field(&r, "flushes") + field(&r, "gc_runs") > field(&base, "flushes") + field(&base, "gc_runs"),
            "tcache_max: flushes+gc %lld vs %lld", field(&r, "flushes") + field(&r, "gc_runs"),
            field(&base, "flushes") + field(&base, "gc_runs"));
  run(&r, "churn", "QMALLOC_TRANSFER_BATCH=2");
  CHECK_MSG(field(&r, "refills") > 4 * field(&base, "refills"), "transfer_batch: refills %lld vs %lld",
            field(&r, "refills"), field(&base, "refills"));
  run(&r, "churn", "QMALLOC_TCACHE_TOTAL=1M");
  CHECK_MSG(field(&r, "unclaimed_budget") <= (1 << 20) && field(&base, "unclaimed_budget") > (8 << 20),
            "tcache_total: unclaimed %lld vs %lld", field(&r, "unclaimed_budget"), field(&base, "unclaimed_budget"));

  run(&base, "large-free", NULL);
  /* tcache_idle_ms: a blocked thread's cache comes back after two scans 20 ms apart (the main
   * thread's churn runs them, for at least 0.4 s); an hour is too long to see one, and 0 turns
   * them off. */
  run(&r, "idle-thread", "QMALLOC_TCACHE_IDLE_MS=3600s");
  CHECK(exited_ok(&r) && field(&r, "threads") == 2);
  CHECK_EQ(field(&r, "idle_reclaims"), 0);
  run(&r, "idle-thread", "QMALLOC_TCACHE_IDLE_MS=20");
  const char *releaser = getenv("QMALLOC_RELEASE_THREAD");
  if (releaser != NULL && strcmp(releaser, "0") == 0) /* tests/cross: no background releaser there */
    printf("option_effects: note: tcache_idle_ms not checked: the idle scans run in the background releaser, off here\n");
  else
    CHECK_MSG(field(&r, "idle_reclaims") >= 1 && field(&r, "idle_reclaimed_bytes") > (64 << 10),
              "tcache_idle_ms: %lld reclaims, %lld bytes", field(&r, "idle_reclaims"), field(&r, "idle_reclaimed_bytes"));
  run(&r, "idle-thread", "QMALLOC_OPTIONS=tcache_idle_ms=20,tcache_idle_ms=0");
  CHECK_EQ(field(&r, "idle_reclaims"), 0);

  CHECK(exited_ok(&base));
  CHECK_EQ(field(&base, "released_bytes_total"), 0); /* 10 s decay: still backed */
  CHECK(field(&base, "pageheap_free") >= (4 << 20) - (64 << 10)); /* less what later small spans took */
  run(&r, "large-free", "QMALLOC_DECAY_MS=0");
  CHECK(field(&r, "released_bytes_total") >= (4 << 20));
  run(&r, "large-free", "QMALLOC_RETAIN_MAX=0");
  CHECK(field(&r, "released_bytes_total") >= (4 << 20));
  /* All released; where kernel pages are larger than qmalloc's (the -page64k run), a free run too
   * small to hold a whole kernel page cannot be, and stays. */
  const char *os_page = getenv("QMALLOC_OS_PAGE");
  CHECK(field(&r, "pageheap_free") == 0 || (os_page && !strcmp(os_page, "64K") && field(&r, "pageheap_free") < (64 << 10)));

  /* Steps of 1, 2, 4 and 8 MiB freed, 16 MiB live: each step's pages are faulted in while the
   * steps before it, too small for it, sit free. With the decay far off, those go back as the
   * growth faults pages in (about 7 MiB), so only the last step freed stays resident and free; with
   * the decay "never", nothing goes back but by malloc_trim (15 MiB free and resident). */
  run(&r, "grow-steps", "QMALLOC_DECAY_MS=10s");
  CHECK(exited_ok(&r) && field(&r, "large_in_use") == (16 << 20));
  CHECK_MSG(field(&r, "growth_released_bytes") >= (6 << 20) && field(&r, "pageheap_free") <= (9 << 20),
            "grow-steps: %lld bytes released as the heap grew, %lld free and resident", field(&r, "growth_released_bytes"),
            field(&r, "pageheap_free"));
  CHECK(field(&r, "growth_released_bytes") <= field(&r, "released_bytes_total"));
  run(&r, "grow-steps", "QMALLOC_DECAY_MS=never");
  CHECK(exited_ok(&r) && field(&r, "released_bytes_total") == 0 && field(&r, "growth_released_bytes") == 0 &&
        field(&r, "pageheap_free") >= (14 << 20));

  /* A freed block's pages the program never touched are not counted (nor reused first) as free and
   * resident: of 8 MiB written to 1 MiB, about 1 MiB stays backed after its free (all 8 MiB
   * before, with the decay far off), and the two pieces still serve a block of that size again
   * without a new mapping. */
  run(&r, "partly-touched", "QMALLOC_DECAY_MS=10s");
  CHECK_MSG(exited_ok(&r) && strstr(r.out, "heap grown: no\n") != NULL, "partly-touched: %s", r.out);
  CHECK_MSG(field(&r, "pageheap_free") >= 0 && field(&r, "pageheap_free") <= (2 << 20),
            "partly-touched: %lld bytes free and counted resident after freeing 8 MiB of which 1 MiB was written",
            field(&r, "pageheap_free"));

  /* The same for the tail a shrink in place gives up: 6.5 MiB never written, not counted resident. */
  run(&r, "shrunk-untouched", "QMALLOC_DECAY_MS=10s");
  CHECK_MSG(exited_ok(&r) && strstr(r.out, "shrunk in place: yes\n") != NULL && field(&r, "pageheap_free") >= 0 &&
                field(&r, "pageheap_free") <= (1 << 20),
            "shrunk-untouched: %lld bytes free and counted resident; %s", field(&r, "pageheap_free"), r.out);

  /* calloc clears only what may hold data: over 2 MiB just freed and the 6 MiB of released pages
   * after them (joined: pageheap_join), it clears the 2 MiB, and reads zero everywhere; clearing
   * all 8 MiB faulted in the 6 MiB (1,536 faults of 4 KiB pages). */
  run(&r, "calloc-joined", "QMALLOC_DECAY_MS=10s");
  long calloc_faults = -1;
  size_t calloc_nonzero = 1;
  const char *line = strstr(r.out, "calloc: same place yes, ");
  CHECK_MSG(exited_ok(&r) && line && sscanf(line, "calloc: same place yes, %ld page faults, %zu bytes not zero", &calloc_faults,
                                            &calloc_nonzero) == 2 && calloc_nonzero == 0 && calloc_faults < 256,
            "calloc-joined: %s", r.out);

  run(&base, "keep-2m", NULL);
  CHECK_EQ(field(&base, "huge_blocks"), 0);
  run(&r, "keep-2m", "QMALLOC_RELEASE_LARGE=1M");
  CHECK_EQ(field(&r, "huge_blocks"), 1);

  run(&base, "usable-8", NULL);
  CHECK(strstr(base.out, "usable 16\n") != NULL);
  run(&r, "usable-8", "QMALLOC_MIN_ALIGN=8");
  CHECK(strstr(r.out, "usable 8\n") != NULL);

  /* A wrong size is stopped by default; check=2 adds the walk of every thread-cache list on slow
   * paths, which finds a free object whose tag was overwritten before it is handed out again. */
  run(&r, "bad-sized-free", NULL);
  CHECK(WIFSIGNALED(r.status) && WTERMSIG(r.status) == SIGABRT);
  CHECK_MSG(strstr(r.err, "qmalloc: free_sized(): size 5000 does not match the block 0x") != NULL, "stderr: %s", r.err);
  run(&r, "good-sized-free", "QMALLOC_CHECK=2");
  CHECK(exited_ok(&r));
  run(&r, "tag-overwritten", NULL);
  CHECK_MSG(exited_ok(&r), "default checks: an overwritten tag is found only when its object is popped");
  run(&r, "tag-overwritten", "QMALLOC_CHECK=2");
  CHECK(WIFSIGNALED(r.status) && WTERMSIG(r.status) == SIGABRT);
  CHECK_MSG(strstr(r.err, "an object on a list without its free tag") != NULL, "stderr: %s", r.err);

  run(&r, "good-sized-free", "QMALLOC_VERBOSE=1");
  CHECK_MSG(strstr(r.err, "tcache_max") != NULL && strstr(r.err, "decay_ms") != NULL, "stderr: %s", r.err);
  run(&r, "good-sized-free", "QMALLOC_STATS=1");
  CHECK(strstr(r.err, "bytes mapped from the OS") != NULL);
  run(&r, "good-sized-free", "QMALLOC_STATS=2");
  CHECK(strstr(r.err, "{\"qmalloc\": ") != NULL);
  run(&base, "good-sized-free", NULL);
  CHECK_EQ(strlen(base.err), 0); /* defaults: qmalloc prints nothing */

  run(&r, "good-sized-free", "QMALLOC_DECAY_MS=soon");
  CHECK(exited_ok(&r));
  CHECK_MSG(strstr(r.err, "qmalloc: warning: QMALLOC_DECAY_MS=soon is not valid") != NULL, "stderr: %s", r.err);
  return tu_summary("option_effects");
}

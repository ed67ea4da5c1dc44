/* Tiny test harness shared by every C/C++ test: named checks that report file:line on failure and
 * keep going, a summary line, and the exit code (0 only if every check passed). */
#ifndef QM_TESTUTIL_H
#define QM_TESTUTIL_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int tu_checks_run;
static int tu_checks_failed;

/* Whether this test runs under the hardened build: CMake's hardened-* tests preload it and name it
 * in QMALLOC_SO (libqmalloc-hardened.so), the others name the default library or nothing. */
static inline int tu_hardened(void) {
  const char *so = getenv("QMALLOC_SO");
  return so != NULL && strstr(so, "hardened") != NULL;
}

#define CHECK(cond) tu_check((cond) != 0, #cond, __FILE__, __LINE__)
#define CHECK_MSG(cond, ...)                                                                       \
  do {                                                                                             \
    if (!tu_check((cond) != 0, #cond, __FILE__, __LINE__)) {                                       \
      fprintf(stderr, "    ");                                                                     \
      fprintf(stderr, __VA_ARGS__);                                                                \
      fprintf(stderr, "\n");                                                                       \
    }                                                                                              \
  } while (0)
#define CHECK_EQ(a, b)                                                                             \
  do {                                                                                             \
    long long tu_a = (long long)(a), tu_b = (long long)(b);                                        \
    if (!tu_check(tu_a == tu_b, #a " == " #b, __FILE__, __LINE__))                                \
      fprintf(stderr, "    got %lld, expected %lld\n", tu_a, tu_b);                                \
  } while (0)

static inline int tu_check(int ok, const char *expr, const char *file, int line) {
  tu_checks_run++;
  if (!ok) {
    tu_checks_failed++;
    fprintf(stderr, "FAIL %s:%d: %s\n", file, line, expr);
  }
  return ok;
}

/* Call at the end of main: prints "N passed, N failed" and returns the exit code. */
static inline int tu_summary(const char *name) {
  printf("%s: %d passed, %d failed\n", name, tu_checks_run - tu_checks_failed, tu_checks_failed);
  return tu_checks_failed == 0 && tu_checks_run > 0 ? 0 : 1;
}

/* ---- helpers shared by the api and stress tests (added for issue 2) ---------------------------
 * A deterministic PRNG (fixed seeds, never time), a position- and seed-dependent fill pattern so a
 * byte that moved or was overwritten by another object is caught, and the resident set size. */
#include <stdint.h>
#include <unistd.h>

/* splitmix64: one 64-bit word of state, good enough to pick sizes and slots. */
static inline uint64_t tu_rand(uint64_t *state) {
  uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

/* Byte i of an object filled with seed s; every position and every seed gives a different stream. */
static inline unsigned char tu_pattern_byte(uint64_t seed, size_t i) {
  uint64_t w = (seed ^ ((uint64_t)(i >> 3) * 0x9E3779B97F4A7C15ull)) * 0xD6E8FEB86659FD93ull;
  return (unsigned char)(w >> ((i & 7) * 8));
}

static inline void tu_fill(void *p, size_t n, uint64_t seed) {
  unsigned char *b = (unsigned char *)p;
  size_t i = 0;
  for (; i + 8 <= n; i += 8) { /* whole words at a time: stress tests fill megabytes */
    uint64_t w = (seed ^ ((uint64_t)(i >> 3) * 0x9E3779B97F4A7C15ull)) * 0xD6E8FEB86659FD93ull;
    memcpy(b + i, &w, 8);
  }
  for (; i < n; i++) b[i] = tu_pattern_byte(seed, i);
}

/* Returns the first offset that does not hold the pattern, or -1 if all n bytes do. */
static inline long tu_verify(const void *p, size_t n, uint64_t seed) {
  const unsigned char *b = (const unsigned char *)p;
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    uint64_t w = (seed ^ ((uint64_t)(i >> 3) * 0x9E3779B97F4A7C15ull)) * 0xD6E8FEB86659FD93ull, got;
    memcpy(&got, b + i, 8);
    if (got != w) break;
  }
  for (; i < n; i++)
    if (b[i] != tu_pattern_byte(seed, i)) return (long)i;
  return -1;
}

/* Resident set size of this process in bytes, from /proc/self/statm (0 if unreadable). */
static inline size_t tu_rss_bytes(void) {
  FILE *f = fopen("/proc/self/statm", "r");
  unsigned long vm = 0, rss = 0;
  if (!f) return 0;
  if (fscanf(f, "%lu %lu", &vm, &rss) != 2) rss = 0;
  fclose(f);
  return (size_t)rss * (size_t)sysconf(_SC_PAGESIZE);
}

/* How many bytes a release loop churns through ("allocate, write, release: the RSS must stay within
 * rss_bound"): 512 MiB, eight times the tests' 64 MiB bound. An emulated run (tests/cross/run.sh,
 * 10-30 times slower) lowers it with QM_TEST_CHURN_MIB, never below twice the bound, so that an
 * allocator whose release does nothing still grows past the bound and fails. */
static inline size_t tu_churn_bytes(size_t rss_bound) {
  size_t churn = (size_t)512 << 20;
  const char *mib = getenv("QM_TEST_CHURN_MIB");
  if (mib != NULL && atol(mib) > 0 && ((size_t)atol(mib) << 20) < churn) churn = (size_t)atol(mib) << 20;
  return churn < 2 * rss_bound ? 2 * rss_bound : churn;
}

/* ---- running this program again (added for issue 13) -----------------------------------------
 * Tests that need a fresh process with other settings execute themselves again. Under a user-mode
 * emulator (qemu-user runs a program but not the programs it executes) the new process must be
 * started through the emulator too: QM_TEST_EMULATOR holds its command, words separated by
 * spaces (tests/cross/run.sh sets it). argv[0] is the caller's; envp NULL keeps the environment.
 * Returns only on failure, as execve does. */
extern char **environ;
static inline int tu_exec_self(char *const argv[], char *const envp[]) {
  char self[4096], words[1024];
  char *args[64];
  ssize_t len = readlink("/proc/self/exe", self, sizeof self - 1); /* the path, not the link: */
  if (len <= 0) return -1;                                          /* under valgrind it is valgrind */
  self[len] = '\0';
  int n = 0;
  const char *emulator = getenv("QM_TEST_EMULATOR");
  if (emulator != NULL && emulator[0] != '\0') {
    snprintf(words, sizeof words, "%s", emulator);
    for (char *w = strtok(words, " "); w != NULL && n < 32; w = strtok(NULL, " ")) args[n++] = w;
  }
  args[n++] = self;
  for (int i = 1; argv[i] != NULL && n < 63; i++) args[n++] = argv[i];
  args[n] = NULL;
  return execve(args[0], args, envp != NULL ? envp : environ);
}

/* ---- children that may hang ------------------------------------------------------------------ */
#include <signal.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static inline void tu_sleep_ms(long ms) {
  struct timespec t = {ms / 1000, (ms % 1000) * 1000000L};
  nanosleep(&t, NULL);
}

/* Waits up to `seconds` for child `pid` to end; a child still running then is killed (SIGKILL) and
 * reaped. Returns 1 if it ended by itself, 0 if it was killed: a hang is a test's failure, reported
 * after a bound generous enough not to be a timing assumption. *status: how it ended. */
static inline int tu_wait_child(pid_t pid, int seconds, int *status) {
  *status = 0;
  for (int waited = 0; waitpid(pid, status, WNOHANG) == 0; waited++) {
    if (waited == seconds * 100) {
      kill(pid, SIGKILL);
      waitpid(pid, status, 0);
      return 0;
    }
    tu_sleep_ms(10);
  }
  return 1;
}

/* Runs each case in a forked child of its own (a fresh process: a hang or a crash stays there),
 * watched for `seconds`; prints a FAIL line for each case that hung or did not exit 0, then
 * "<test>: N of M cases failed". Returns main's exit status. */
static inline int tu_run_cases(const char *test, int (*const cases[])(void), const char *const names[], int count, int seconds) {
  int failed = 0;
  for (int i = 0; i < count; i++) {
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
      int rc = cases[i]();
      fflush(stdout);
      _exit(rc);
    }
    int status;
    if (!tu_wait_child(pid, seconds, &status)) {
      printf("FAIL: case %s hung (%d s)\n", names[i], seconds);
      failed++;
    } else if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      printf("FAIL: case %s: %s %d\n", names[i], WIFEXITED(status) ? "exit" : "signal",
             WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status));
      failed++;
    }
  }
  printf("%s: %d of %d cases failed\n", test, failed, count);
  return failed != 0;
}

/* ---- what a dying child prints ------------------------------------------------------------------
 * Runs body(arg) in a forked child with its stderr on a pipe (SIGABRT at its default, so that a
 * fatal check ends it as in a program); puts what it printed in out (NUL-terminated, at most cap - 1
 * bytes) and how it ended in *status. qemu-user (tests/cross) reports the abort on the same stderr
 * after the child's own line: that line is cut off. Returns the length kept. */
#include <errno.h>
static inline size_t tu_stderr_of_child(void (*body)(void *), void *arg, char *out, size_t cap, int *status) {
  int fds[2];
  out[0] = '\0';
  *status = -1;
  if (pipe(fds) != 0) return 0;
  pid_t child = fork();
  if (child == 0) {
    close(fds[0]);
    dup2(fds[1], 2);
    signal(SIGABRT, SIG_DFL);
    body(arg);
    _exit(0);
  }
  close(fds[1]);
  size_t n = 0;
  for (ssize_t got; n < cap - 1 && ((got = read(fds[0], out + n, cap - 1 - n)) > 0 || (got < 0 && errno == EINTR));)
    if (got > 0) n += (size_t)got;
  out[n] = '\0';
  close(fds[0]);
  if (child > 0) waitpid(child, status, 0);
  char *emulator_line = strstr(out, "\nqemu: uncaught target signal ");
  if (emulator_line != NULL) {
    emulator_line[1] = '\0';
    n = (size_t)(emulator_line + 1 - out);
  }
  return n;
}

/* ---- whether RLIMIT_AS is enforced (added for issue 13) ----------------------------------------
 * A forked child limits its address space to what it uses plus 64 MiB and maps 256 MiB: the
 * kernel refuses; a user-mode emulator (qemu-user accepts setrlimit(RLIMIT_AS) and ignores it, the
 * limit would cap the emulator itself) does not. Tests of running out of address space call this
 * first and say so when they cannot run. */
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/wait.h>
static inline int tu_address_limit_enforced(void) {
  fflush(stdout);
  pid_t pid = fork();
  if (pid == 0) {
    unsigned long vm = 0;
    FILE *f = fopen("/proc/self/statm", "r");
    if (f == NULL || fscanf(f, "%lu", &vm) != 1) _exit(2);
    fclose(f);
    struct rlimit rl;
    getrlimit(RLIMIT_AS, &rl);
    rl.rlim_cur = (rlim_t)vm * (rlim_t)sysconf(_SC_PAGESIZE) + ((rlim_t)64 << 20);
    if (setrlimit(RLIMIT_AS, &rl) != 0) _exit(2);
    void *p = mmap(NULL, (size_t)256 << 20, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    _exit(p == MAP_FAILED ? 0 : 1);
  }
  int status = 0;
  return pid > 0 && waitpid(pid, &status, 0) == pid && WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

/* ---- /proc/self/statm without allocating --------------------------------------------------------
 * Field 0 is the address space (VmSize), field 1 the resident set, each returned in bytes. It uses
 * open/read, not stdio, because fopen mallocs: tests that watch the heap (a reused range, idle
 * release) must not allocate while they look. 0 if unreadable. */
#include <fcntl.h>
static inline size_t tu_statm_bytes(int field) {
  char buf[128] = {0};
  int fd = open("/proc/self/statm", O_RDONLY);
  if (fd < 0 || read(fd, buf, sizeof buf - 1) <= 0) buf[0] = 0;
  if (fd >= 0) close(fd);
  char *at = buf;
  for (int i = 0; i < field && at != NULL; i++) {
    at = strchr(at, ' ');
    if (at) at++;
  }
  return at ? (size_t)strtoul(at, NULL, 10) * (size_t)sysconf(_SC_PAGESIZE) : 0;
}

/* Whether a thread of this process is named `name` (its /proc/self/task/N/comm begins with it):
 * qmalloc's background releaser names itself qmalloc-release. Uses stdio, so it allocates. */
#include <dirent.h>
static inline int tu_thread_named(const char *name) {
  DIR *tasks = opendir("/proc/self/task");
  struct dirent *e;
  int found = 0;
  while (tasks != NULL && !found && (e = readdir(tasks)) != NULL) {
    char path[300], comm[64] = "";
    snprintf(path, sizeof path, "/proc/self/task/%s/comm", e->d_name);
    FILE *f = fopen(path, "r");
    if (f == NULL) continue;
    found = fgets(comm, sizeof comm, f) != NULL && strncmp(comm, name, strlen(name)) == 0;
    fclose(f);
  }
  if (tasks != NULL) closedir(tasks);
  return found;
}

/* ---- a test program's numeric flags ------------------------------------------------------------
 * A whole decimal number in [min, max], or a one-line error naming the program and the flag, and
 * exit 2 (value NULL: the flag came last, without its number). */
static inline long tu_parse_long(const char *prog, const char *flag, const char *value, long min, long max) {
  char *end = NULL;
  errno = 0;
  long v = value ? strtol(value, &end, 10) : 0;
  if (value == NULL || *value == '\0' || errno != 0 || *end != '\0' || v < min || v > max) {
    fprintf(stderr, "%s: %s needs an integer in [%ld, %ld], got '%s'\n", prog, flag, min, max, value ? value : "");
    exit(2);
  }
  return v;
}

/* ---- one field of qmalloc's statistics, in the process itself ----------------------------------
 * Only where qmalloc.h was included first (programs linked with the library): the JSON statistics
 * written to a memory file and read back; -1 if the field is missing. */
#ifdef QMALLOC_H
static inline long long tu_stats_field(const char *name) {
  int fd = memfd_create("qm-stats", 0);
  if (fd < 0) return -1;
  qm_stats_print(fd, QM_STATS_JSON);
  static char text[1 << 16];
  ssize_t n = pread(fd, text, sizeof text - 1, 0);
  close(fd);
  if (n <= 0) return -1;
  text[n] = '\0';
  char key[64];
  snprintf(key, sizeof key, "\"%s\": ", name);
  const char *at = strstr(text, key);
  return at ? atoll(at + strlen(key)) : -1;
}
#endif

#endif

/* fork() where other code holds libc's or the allocator's locks, as a plain program (no qmalloc
 * link) for tests/preload/test_fork_safety.sh. Each scenario runs in a process group of its own
 * under a watchdog: a scenario that has not finished after WATCHDOG_SECONDS (it takes well under
 * a second when nothing hangs) is killed, group and all, and reported as a hang. Nothing else
 * depends on time: every scenario stops after a fixed amount of work.
 *   stdio   threads fork in a loop while reader threads read a file whose one line is 50,000 bytes
 *           long with getline (the stream stays locked while getline grows its buffer with
 *           realloc) and a thread calls fflush(NULL) (the stream-list lock, then each stream's).
 *           Children allocate, free what the parent allocated, and exit; every tenth also starts
 *           a thread that allocates and forks a grandchild that allocates.
 *   signal  one thread allocates, frees and reallocates sizes up to 70 KB while a fast interval
 *           timer's handler calls fork(); the child allocates, frees and exits.
 *   spawn   threads allocate while the main thread runs posix_spawn and vfork+exec of /bin/true.
 * Prints "<scenario>: ok (<n> forks)" and exits 0, or one line saying what failed and exits 1.
 * usage: fork_safety stdio|signal|spawn [FILE-DIR] */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <spawn.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

#define WATCHDOG_SECONDS 60
#define LINE_BYTES 50000

extern char **environ;

static const char *scenario;
static atomic_int stop_threads;
static atomic_int child_failures;

static void die(const char *what) {
  fprintf(stderr, "%s: %s (%s)\n", scenario, what, strerror(errno));
  exit(1);
}

/* A child of a fork: allocates sizes up to 70 KB, checks what it wrote, frees what the parent
 * allocated (`parent_block`, filled with 0x5a), and leaves with _exit (no atexit, no stdio). */
static void child_work(unsigned char *parent_block, size_t parent_size) {
  for (size_t i = 0; i < parent_size; i++)
    if (parent_block != NULL && parent_block[i] != 0x5a) _exit(2);
  free(parent_block);
  void *keep[64];
  for (unsigned i = 0; i < 64; i++) {
    size_t size = 16 + (size_t)i * 1111;
    keep[i] = malloc(size);
    if (keep[i] == NULL) _exit(3);
    memset(keep[i], (int)i, size);
  }
  for (unsigned i = 0; i < 64; i++) {
    if (((unsigned char *)keep[i])[16 + (size_t)i * 1111 - 1] != (unsigned char)i) _exit(4);
    free(keep[i]);
  }
}

static void *child_thread(void *arg) {
  for (int i = 0; i < 1000; i++) free(malloc(16 + (size_t)i * 64));
  return arg;
}

/* ---- stdio: fork storm beside getline and fflush(NULL) ---------------------------------------- */

static char line_file[4096];

/* One read of the long line. A new thread each time, so its cache is empty and every step of
 * getline's buffer growth takes the allocator's slow path (and its locks) while the stream is
 * locked. */
static void *read_long_line(void *arg) {
  FILE *f = fopen(line_file, "r");
  if (f == NULL) die("cannot open the long-line file");
  char *line = NULL;
  size_t cap = 0;
  ssize_t n = getline(&line, &cap, f);
  if (n != LINE_BYTES + 1) {
    fprintf(stderr, "stdio: getline read %zd bytes, expected %d\n", n, LINE_BYTES + 1);
    exit(1);
  }
  free(line);
  fclose(f);
  return arg;
}

static void *reader(void *arg) {
  while (!atomic_load(&stop_threads)) {
    pthread_t t;
    if (pthread_create(&t, NULL, read_long_line, NULL) != 0) die("pthread_create");
    pthread_join(t, NULL);
  }
  return arg;
}

static void *flusher(void *arg) {
  while (!atomic_load(&stop_threads)) {
    fflush(NULL);
  }
  return arg;
}

static int wait_child(pid_t pid) {
  int status;
  while (waitpid(pid, &status, 0) < 0)
    if (errno != EINTR) return -1;
  return WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 0 : -1;
}

#define STORM_FORKS 150
#define STORM_PENDING 8 /* children are reaped in groups, so forks follow each other closely */
static void *forker(void *arg) {
  pid_t pending[STORM_PENDING];
  int npending = 0;
  for (int i = 0; i < STORM_FORKS; i++) {
    size_t size = 100 + (size_t)(i % 7) * 9000;
    unsigned char *block = malloc(size);
    if (block == NULL) die("malloc failed in the parent");
    memset(block, 0x5a, size);
    pid_t pid = fork();
    if (pid < 0) die("fork failed");
    if (pid == 0) {
      child_work(block, size);
      if (i % 10 == 0) {
        pthread_t t;
        if (pthread_create(&t, NULL, child_thread, NULL) != 0 || pthread_join(t, NULL) != 0) _exit(5);
        pid_t grandchild = fork();
        if (grandchild < 0) _exit(6);
        if (grandchild == 0) {
          child_work(NULL, 0);
          _exit(0);
        }
        if (wait_child(grandchild) != 0) _exit(7);
      }
      _exit(0);
    }
    free(block);
    pending[npending++] = pid;
    if (npending == STORM_PENDING || i == STORM_FORKS - 1) {
      for (int k = 0; k < npending; k++)
        if (wait_child(pending[k]) != 0) atomic_fetch_add(&child_failures, 1);
      npending = 0;
    }
  }
  return arg;
}

static int run_stdio(const char *dir) {
  snprintf(line_file, sizeof line_file, "%s/long_line.%d", dir, (int)getpid());
  FILE *f = fopen(line_file, "w");
  if (f == NULL) die("cannot create the long-line file");
  for (int i = 0; i < LINE_BYTES; i++) fputc('a' + i % 26, f);
  fputc('\n', f);
  fclose(f);
  pthread_t readers[3], flush, forkers[2];
  for (int i = 0; i < 3; i++)
    if (pthread_create(&readers[i], NULL, reader, NULL) != 0) die("pthread_create");
  if (pthread_create(&flush, NULL, flusher, NULL) != 0) die("pthread_create");
  for (int i = 0; i < 2; i++)
    if (pthread_create(&forkers[i], NULL, forker, NULL) != 0) die("pthread_create");
  for (int i = 0; i < 2; i++) pthread_join(forkers[i], NULL);
  atomic_store(&stop_threads, 1);
  for (int i = 0; i < 3; i++) pthread_join(readers[i], NULL);
  pthread_join(flush, NULL);
  unlink(line_file);
  return 2 * STORM_FORKS;
}

/* ---- signal: fork from a timer's handler that interrupted malloc, free or realloc ------------- */

#define SIGNAL_FORKS 300
static volatile sig_atomic_t signal_forks, signal_failures;

static void on_timer(int sig) {
  int saved = errno;
  if (signal_forks < SIGNAL_FORKS) {
    pid_t pid = fork();
    if (pid == 0) {
      child_work(NULL, 0);
      _exit(0);
    }
    if (pid < 0 || wait_child(pid) != 0) signal_failures++;
    signal_forks++;
  }
  errno = saved;
}

static int run_signal(void) {
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_timer;
  sa.sa_flags = SA_RESTART;
  sigemptyset(&sa.sa_mask);
  if (sigaction(SIGALRM, &sa, NULL) != 0) die("sigaction");
  struct itimerval every = {{0, 200}, {0, 200}};
  if (setitimer(ITIMER_REAL, &every, NULL) != 0) die("setitimer");
  enum { SLOTS = 256 };
  void *slots[SLOTS] = {0};
  uint64_t rng = 12345;
  /* The loop ends by the fork count; the watchdog bounds it if the timer or fork stalls. */
  while (signal_forks < SIGNAL_FORKS) {
    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
    unsigned slot = (unsigned)(rng >> 33) % SLOTS;
    size_t size = 1 + (size_t)(rng >> 40) % (70u << 10);
    switch ((rng >> 20) % 3) {
      case 0: free(slots[slot]); slots[slot] = malloc(size); break;
      case 1: {
        void *p = realloc(slots[slot], size);
        if (p != NULL) slots[slot] = p;
        break;
      }
      default: free(slots[slot]); slots[slot] = NULL; break;
    }
    if (slots[slot] != NULL) memset(slots[slot], 1, size < 64 ? size : 64);
  }
  struct itimerval off = {{0, 0}, {0, 0}};
  setitimer(ITIMER_REAL, &off, NULL);
  for (unsigned i = 0; i < SLOTS; i++) free(slots[i]);
  child_failures = signal_failures;
  return signal_forks;
}

/* ---- spawn: posix_spawn and vfork while threads allocate --------------------------------------- */

static void *allocator_thread(void *arg) {
  void *keep[32] = {0};
  for (unsigned i = 0; !atomic_load(&stop_threads); i++) {
    free(keep[i % 32]);
    keep[i % 32] = malloc(16 + (size_t)(i * 7919) % 80000);
  }
  for (unsigned i = 0; i < 32; i++) free(keep[i]);
  return arg;
}

#define SPAWNS 100
static int run_spawn(void) {
  pthread_t threads[3];
  for (int i = 0; i < 3; i++)
    if (pthread_create(&threads[i], NULL, allocator_thread, NULL) != 0) die("pthread_create");
  char *argv[] = {"true", NULL};
  for (int i = 0; i < SPAWNS; i++) {
    pid_t pid;
    int rc = posix_spawn(&pid, "/bin/true", NULL, NULL, argv, environ);
    if (rc != 0 || wait_child(pid) != 0) atomic_fetch_add(&child_failures, 1);
    pid = vfork();
    if (pid == 0) {
      execve("/bin/true", argv, environ);
      _exit(127);
    }
    if (pid < 0 || wait_child(pid) != 0) atomic_fetch_add(&child_failures, 1);
  }
  atomic_store(&stop_threads, 1);
  for (int i = 0; i < 3; i++) pthread_join(threads[i], NULL);
  return 2 * SPAWNS;
}

/* ---- watchdog ------------------------------------------------------------------------------------ */

static volatile sig_atomic_t watchdog_fired;
static void on_watchdog(int sig) { watchdog_fired = 1; }

int main(int argc, char **argv) {
  if (argc < 2 || (strcmp(argv[1], "stdio") && strcmp(argv[1], "signal") && strcmp(argv[1], "spawn"))) {
    fprintf(stderr, "usage: fork_safety stdio|signal|spawn [FILE-DIR]\n");
    return 2;
  }
  scenario = argv[1];
  fflush(stdout);
  pid_t runner = fork();
  if (runner < 0) die("fork of the scenario failed");
  if (runner == 0) {
    setpgid(0, 0); /* the watchdog kills the scenario with everything it forked */
    int forks = !strcmp(scenario, "stdio") ? run_stdio(argc > 2 ? argv[2] : "/tmp")
                : !strcmp(scenario, "signal") ? run_signal()
                                              : run_spawn();
    if (child_failures != 0) {
      fprintf(stderr, "%s: %d of %d children failed (status not 0)\n", scenario, (int)child_failures, forks);
      _exit(1);
    }
    printf("%s: ok (%d forks)\n", scenario, forks);
    fflush(stdout);
    _exit(0);
  }
  setpgid(runner, runner); /* either side may get there first */
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_watchdog; /* no SA_RESTART: the alarm interrupts waitpid */
  sigaction(SIGALRM, &sa, NULL);
  const char *bound = getenv("FORK_SAFETY_WATCHDOG"); /* seconds; for trying old builds quickly */
  int watchdog = bound != NULL && atoi(bound) > 0 ? atoi(bound) : WATCHDOG_SECONDS;
  alarm((unsigned)watchdog);
  int status = 0;
  pid_t got;
  while ((got = waitpid(runner, &status, 0)) < 0 && errno == EINTR && !watchdog_fired) {
  }
  if (got != runner) {
    kill(-runner, SIGKILL);
    waitpid(runner, &status, 0);
    fprintf(stderr, "%s: hang: not done after %d s (a deadlock in or after fork), killed\n", scenario, watchdog);
    return 1;
  }
  if (WIFSIGNALED(status)) {
    fprintf(stderr, "%s: the scenario died by signal %d\n", scenario, WTERMSIG(status));
    return 1;
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : 1;
}

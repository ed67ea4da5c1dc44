/* A thread cancelled while it writes a heap profile must not leave the profiler's lock held.
 * qm_prof_dump writes under that lock; glibc's write(2) is a cancellation point, so a thread
 * cancelled there unwound with the lock held, and every later sampled allocation of any thread
 * waited for ever. qmalloc's own I/O is raw system calls now (src/os_file.h): qm_prof_dump is not
 * a cancellation point, the cancel acts at the thread's next one, and allocation goes on.
 * Deterministic: the dump goes to a pipe of one page that nobody reads, so the dumper is parked
 * in write(2) under the lock when the cancel comes; the pipe is then drained. A hang is reported
 * after 60 s (a watchdog, not a timing assumption). The hardened build takes no samples (its
 * dump is empty), and must not hang either. */
#include <fcntl.h>
#include <poll.h>
#include <sys/syscall.h>
#include <pthread.h>
#include <semaphore.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "qmalloc.h"
#include "testutil.h"

static char pipe_path[64];
static int pipe_read_end;
static sem_t drain_now;
static volatile int dumps;

static volatile pid_t dumper_tid;

static void *dumper(void *arg) {
  (void)arg;
  dumper_tid = (pid_t)syscall(SYS_gettid);
  for (;;) {
    qm_prof_dump(pipe_path, QM_PROF_LIVE); /* the pipe is full within a few dumps */
    dumps++;
    pthread_testcancel();
  }
  return NULL;
}

/* Whether thread tid is blocked in write(2): the first field of its /proc syscall file. Read
 * without allocating (a sampled malloc here would wait for the dumper's lock). */
static bool in_write(pid_t tid) {
  char path[64], line[64];
  if (tid == 0) return false;
  snprintf(path, sizeof path, "/proc/self/task/%d/syscall", (int)tid);
  int fd = open(path, O_RDONLY);
  if (fd < 0) return false;
  ssize_t n = read(fd, line, sizeof line - 1);
  close(fd);
  if (n <= 0) return false;
  line[n] = '\0';
  return strtol(line, NULL, 10) == SYS_write;
}

static void *drainer(void *arg) {
  (void)arg;
  char buf[4096];
  sem_wait(&drain_now);
  while (read(pipe_read_end, buf, sizeof buf) > 0) {
  }
  return NULL;
}

static void *idle(void *arg) {
  (void)arg;
  for (;;) pause();
  return NULL;
}

static void watchdog(int sig) {
  (void)sig;
  static const char msg[] = "FAIL: hung for 60 s after the dumping thread was cancelled (the profiler's lock kept?)\n";
  ssize_t unused = write(1, msg, sizeof msg - 1);
  (void)unused;
  _exit(1);
}


int main(int argc, char **argv) {
  if (argc < 2) { /* again, sampling one allocation per 4 KiB (the options are read at start) */
    setenv("QMALLOC_PROF_SAMPLE", "4096", 1);
    char *args[] = {argv[0], "run", NULL};
    tu_exec_self(args, NULL);
    printf("FAIL: could not run this program again\n");
    return 1;
  }
  signal(SIGALRM, watchdog);
  alarm(60);
  enum { KEPT = 2000 };
  static void *kept[KEPT];
  for (int i = 0; i < KEPT; i++) kept[i] = malloc(100 + (size_t)i); /* sites for the dump to list */
  int fds[2];
  CHECK(pipe(fds) == 0);
  CHECK(fcntl(fds[1], F_SETPIPE_SZ, 4096) > 0);
  pipe_read_end = fds[0];
  snprintf(pipe_path, sizeof pipe_path, "/proc/self/fd/%d", fds[1]);
  /* glibc loads libgcc_s at a process's first pthread_cancel (allocating, maybe sampled): made
   * here, on a thread that is not in the profiler. */
  pthread_t t;
  pthread_create(&t, NULL, idle, NULL);
  pthread_cancel(t);
  pthread_join(t, NULL);

  /* Made first: a thread's creation allocates, and could be sampled while the dumper waits. */
  sem_init(&drain_now, 0, 0);
  pthread_t d;
  pthread_create(&d, NULL, drainer, NULL);
  pthread_create(&t, NULL, dumper, NULL);
  /* Its dumps fill the pipe: then the dumper waits in write(2), inside the profiler, which the
   * kernel shows (/proc/.../syscall). Polled, not slept on: cancelled between two dumps, the
   * dumper held no lock, and the build before passed too. Under qemu-user that file shows the
   * host's system call numbers: there, a second after the pipe is full (the dumper's next write
   * blocks at once). */
  struct pollfd full = {.fd = fds[1], .events = POLLOUT};
  while (poll(&full, 1, 0) == 1) tu_sleep_ms(1);
  for (int waited = 0; !in_write(dumper_tid) && waited < 1000; waited++) tu_sleep_ms(1);
  pthread_cancel(t);
  sem_post(&drain_now);
  pthread_join(t, NULL); /* its dump ends, then its pthread_testcancel acts */
  CHECK_MSG(dumps > 0, "the dump in progress did not finish (the cancel acted inside it)");

  /* Sampled allocations from this thread and another: each takes the profiler's lock. */
  for (int i = 0; i < 100000; i++) {
    void *volatile p = malloc(200);
    free(p);
  }
  dumps = 0;
  pthread_t again;
  pthread_create(&again, NULL, dumper, NULL); /* dumps of its own: the lock is free */
  while (dumps < 2) tu_sleep_ms(10);
  pthread_cancel(again);
  pthread_join(again, NULL);
  for (int i = 0; i < KEPT; i++) free(kept[i]);
  close(fds[1]); /* the drainer reads the end of the file and returns */
  pthread_join(d, NULL);
  return tu_summary("api-prof_cancel");
}

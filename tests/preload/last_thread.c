/* A plain program (not linked with qmalloc) whose last thread ends with pthread_exit, run by
 * test_last_thread.sh under LD_PRELOAD. POSIX has such a process end when its last thread does
 * (glibc's start_thread calls exit(0) then, which runs the atexit handlers); qmalloc's background
 * releaser, a thread of the process, must not keep it alive.
 *   main: main frees 64 MiB (which starts the releaser), starts a worker, and calls pthread_exit;
 *         the worker allocates for 200 ms and returns;
 *   fork: a thread forks; in the child, that thread frees 64 MiB and returns, its thread's end
 *         being the child's last (python3's test_threading does this); the parent waits for the
 *         child and reports its status.
 * Prints "releaser running" once a thread named qmalloc-release exists (so that the run tests
 * something), and the atexit handler, on 256 KiB of stack, prints "atexit ran". */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../testutil.h"

/* Uses 256 KiB of stack, as a program's exit-time code may (C++ destructors, atexit handlers):
 * glibc runs it in the process's last thread, which may be qmalloc's releaser. */
static void at_exit(void) {
  volatile char deep[256 << 10];
  memset((char *)deep, 1, sizeof deep);
  printf("atexit ran in %d (%d)\n", (int)getpid(), deep[sizeof deep - 1]);
  fflush(stdout);
}

/* Frees 64 MiB of 1 MiB blocks, then makes small calls for up to 2 s until a thread named
 * qmalloc-release exists (a slow path after the frees starts it). */
static void start_releaser(void) {
  static void *blocks[64];
  for (int i = 0; i < 64; i++) memset(blocks[i] = malloc(1 << 20), 1, 1 << 20);
  for (int i = 0; i < 64; i++) free(blocks[i]);
  for (int tries = 0; tries < 200; tries++) {
    for (int i = 0; i < 2000; i++) free(malloc(64 + i % 4000));
    if (tu_thread_named("qmalloc-release")) {
      printf("releaser running in %d\n", (int)getpid());
      fflush(stdout);
      return;
    }
    usleep(10000);
  }
  printf("releaser absent in %d\n", (int)getpid());
  fflush(stdout);
}

static void *worker(void *arg) {
  (void)arg;
  for (int i = 0; i < 20; i++) {
    free(malloc(1000));
    usleep(10000);
  }
  return NULL;
}

static void *forker(void *arg) {
  (void)arg;
  pid_t child = fork();
  if (child == 0) {
    atexit(at_exit);
    start_releaser();
    return NULL; /* the child's only program thread ends here */
  }
  int status;
  if (child < 0 || waitpid(child, &status, 0) != child) {
    printf("fork or waitpid failed\n");
    exit(2);
  }
  printf("child status %d\n", WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status));
  return NULL;
}

int main(int argc, char **argv) {
  pthread_t t;
  if (argc == 2 && strcmp(argv[1], "main") == 0) {
    atexit(at_exit);
    start_releaser();
    pthread_create(&t, NULL, worker, NULL);
    pthread_exit(NULL);
  }
  if (argc == 2 && strcmp(argv[1], "fork") == 0) {
    pthread_create(&t, NULL, forker, NULL);
    pthread_join(t, NULL);
    return 0;
  }
  fprintf(stderr, "usage: last_thread main|fork\n");
  return 2;
}

/* Probe run by tests/cross/run.sh, not a test of qmalloc (it is linked with the C library's malloc
 * only): can the emulator start a thread in a child forked from a process that has threads?
 * Debian 12's qemu-aarch64 (7.2) cannot: the child dies in qemu's own assertions. stress-fork's
 * mode 1 does exactly that, so the script runs it without that mode where this probe fails.
 * Exit 0: it can; 1: it cannot. */
#include <pthread.h>
#include <stdio.h>
#include <sys/wait.h>
#include <unistd.h>

static void *sleeper(void *arg) {
  for (;;) pause();
  return arg;
}
static void *nothing(void *arg) { return arg; }

int main(void) {
  pthread_t parent_thread;
  if (pthread_create(&parent_thread, NULL, sleeper, NULL) != 0) return 1;
  pid_t pid = fork();
  if (pid == 0) {
    pthread_t child_thread;
    if (pthread_create(&child_thread, NULL, nothing, NULL) != 0) _exit(1);
    pthread_join(child_thread, NULL);
    _exit(0);
  }
  int status = 0;
  if (pid < 0 || waitpid(pid, &status, 0) != pid) return 1;
  return WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 0 : 1;
}

/* Forks beside the profiler's walks of the loader's objects (src/prof_unwind.c): no signal handler
 * runs on a thread while it walks, so a handler that forks never leaves its child the loader's
 * lock held by the parent's thread (glibc's recursive lock, which the child could then never
 * take: its first sample, dlopen or C++ throw waited for ever); the fork handlers, which take
 * the walks' flag with the thread's signals blocked, give the parent and the child their signal
 * masks back; and so does a walk inside which another was tried. Each case in a child of its own,
 * watched for a hang. */
#include <link.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include "internal.h"
#include "prof.h"
#include "testutil.h"

static volatile sig_atomic_t walking, handler_saw_walking = -1;
static volatile pid_t forked = -1;

static int count_objects(struct dl_phdr_info *info, size_t size, void *arg) {
  (void)info, (void)size;
  ++*(int *)arg;
  return 0;
}

/* The child of a fork from the handler: the loader's list must be free to walk, by the program
 * and by qmalloc's own walk. */
static void fork_from_handler(int sig) {
  (void)sig;
  handler_saw_walking = walking;
  pid_t pid = fork();
  if (pid == 0) {
    int objects = 0;
    dl_iterate_phdr(count_objects, &objects);
    int again = 0;
    bool walked = prof_unwind_loader_walk(count_objects, &again);
    _exit(objects > 0 && walked && again == objects ? 0 : 2);
  }
  forked = pid;
}

static int raise_while_walking(struct dl_phdr_info *info, size_t size, void *arg) {
  (void)info, (void)size;
  walking = 1;
  raise(SIGUSR1); /* pending until the walk ends */
  walking = 0;
  *(int *)arg = 1;
  return 1;
}

static int case_handler_forks_after_walk(void) {
  struct sigaction sa = {.sa_handler = fork_from_handler};
  sigaction(SIGUSR1, &sa, NULL);
  int ran = 0;
  CHECK(prof_unwind_loader_walk(raise_while_walking, &ran));
  CHECK_EQ(ran, 1);
  CHECK_EQ(handler_saw_walking, 0); /* it ran, and after the walk */
  CHECK(forked > 0);
  int status = -1;
  CHECK(tu_wait_child(forked, 10, &status)); /* a child on the loader's lock never ends */
  CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  return tu_checks_failed != 0;
}

/* The mask a fork's child and parent run with: SIGUSR2 blocked by the program, SIGUSR1 not. */
static bool mask_is_the_programs(void) {
  sigset_t now;
  pthread_sigmask(SIG_SETMASK, NULL, &now);
  return sigismember(&now, SIGUSR2) == 1 && sigismember(&now, SIGUSR1) == 0 && sigismember(&now, SIGTERM) == 0;
}

static int case_fork_keeps_masks(void) {
  sigset_t usr2;
  sigemptyset(&usr2);
  sigaddset(&usr2, SIGUSR2);
  pthread_sigmask(SIG_BLOCK, &usr2, NULL);
  pid_t pid = fork();
  if (pid == 0) _exit(mask_is_the_programs() ? 0 : 3);
  CHECK(pid > 0);
  CHECK(mask_is_the_programs());
  int status = -1;
  CHECK(tu_wait_child(pid, 10, &status));
  CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  return tu_checks_failed != 0;
}

/* A walk tried inside this thread's own walk (a malloc there whose slow path looks for libc's
 * range) finds the flag taken and walks nothing; the outer walk's end gives the thread back the
 * mask it had, not one with every signal blocked. */
static int nested_walk(struct dl_phdr_info *info, size_t size, void *arg) {
  (void)info, (void)size;
  int inner = 0;
  *(int *)arg = prof_unwind_loader_walk(count_objects, &inner) ? 2 : inner == 0 ? 1 : 3;
  return 1;
}

static int case_nested_walk_keeps_mask(void) {
  sigset_t usr2;
  sigemptyset(&usr2);
  sigaddset(&usr2, SIGUSR2);
  pthread_sigmask(SIG_BLOCK, &usr2, NULL);
  int verdict = 0;
  CHECK(prof_unwind_loader_walk(nested_walk, &verdict));
  CHECK_EQ(verdict, 1); /* refused, nothing walked */
  CHECK(mask_is_the_programs());
  return tu_checks_failed != 0;
}

int main(void) {
  init_process();
  int (*const cases[])(void) = {case_handler_forks_after_walk, case_fork_keeps_masks, case_nested_walk_keeps_mask};
  const char *const names[] = {"handler_forks_after_walk", "fork_keeps_masks", "nested_walk_keeps_mask"};
  return tu_run_cases("unit-fork_walk", cases, names, 3, 30);
}

/* malloc_stats() and thread cancellation (issue 11): glibc's malloc_stats is not a cancellation
 * point, so a thread with a cancel pending still gets the whole report, from "Arena 0:" to the
 * closing "(every line is explained in docs/stats.md)", and is cancelled at its next cancellation
 * point; the caller's own cancel state comes back as it was (disabled stays disabled). The cancel
 * is made pending before the call, so the case is the same on every run (no timing). */
#include <errno.h>
#include <fcntl.h>
#include <malloc.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "testutil.h"

#define LAST_LINE "(every line is explained in docs/stats.md)\n"

/* Deferred cancel pending, then malloc_stats, then a cancellation point. */
static void *cancelled_inside(void *arg) {
  pthread_cancel(pthread_self());
  malloc_stats();
  *(int *)arg = 1; /* reached: malloc_stats did not act on the cancel */
  pthread_testcancel();
  *(int *)arg = 2; /* not reached: the cancel is still pending and acts here */
  return NULL;
}

/* Cancellation disabled by the caller: malloc_stats must leave it disabled. */
static void *disabled_caller(void *arg) {
  int old;
  pthread_setcancelstate(PTHREAD_CANCEL_DISABLE, &old);
  pthread_cancel(pthread_self());
  malloc_stats();
  int now;
  pthread_setcancelstate(PTHREAD_CANCEL_DISABLE, &now);
  *(int *)arg = now;
  return NULL;
}

/* Runs fn in a thread with stderr redirected to a fresh file; returns what was written there. */
static char *run_with_stderr_captured(void *(*fn)(void *), int *flag, void **thread_result) {
  char path[] = "/tmp/qm_malloc_stats.XXXXXX";
  int fd = mkstemp(path);
  if (fd < 0) return NULL;
  unlink(path);
  fflush(stderr);
  int saved = dup(2);
  dup2(fd, 2);
  pthread_t t;
  pthread_create(&t, NULL, fn, flag);
  pthread_join(t, thread_result);
  dup2(saved, 2);
  close(saved);
  off_t size = lseek(fd, 0, SEEK_END);
  char *text = calloc(1, (size_t)size + 1);
  if (text && pread(fd, text, (size_t)size, 0) != size) text[0] = 0;
  close(fd);
  return text;
}

static int ends_with(const char *s, const char *tail) {
  size_t n = strlen(s), m = strlen(tail);
  return n >= m && memcmp(s + n - m, tail, m) == 0;
}

int main(void) {
  int reached = 0;
  void *result = NULL;
  char *out = run_with_stderr_captured(cancelled_inside, &reached, &result);
  CHECK(out != NULL);
  if (out) {
    CHECK_MSG(strncmp(out, "Arena 0:\n", 9) == 0, "the report does not start with 'Arena 0:' (%zu bytes written)",
              strlen(out));
    CHECK_MSG(ends_with(out, LAST_LINE), "the report of a thread with a cancel pending is cut short: %zu bytes, ends '%.60s'",
              strlen(out), strlen(out) > 60 ? out + strlen(out) - 60 : out);
  }
  CHECK_MSG(reached == 1, "malloc_stats acted on the pending cancel (or the cancel was lost): stage %d", reached);
  CHECK_MSG(result == PTHREAD_CANCELED, "the thread was not cancelled at its next cancellation point");
  free(out);

  int state = -1;
  out = run_with_stderr_captured(disabled_caller, &state, &result);
  CHECK(out != NULL && ends_with(out, LAST_LINE));
  CHECK_MSG(state == PTHREAD_CANCEL_DISABLE, "malloc_stats turned a caller's disabled cancellation back on");
  free(out);
  return tu_summary("api-malloc_stats_cancel");
}

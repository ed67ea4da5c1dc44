/* What a forked child makes of qmalloc's locks (src/fork.c, fork_unlock): each is re-initialized,
 * unlocked, as the kind it was. glibc's pthread_mutex_lock and unlock read a mutex's kind again
 * after their first test, so code below a signal handler that forked in the middle of one of them
 * (an adaptive lock's unlock) stopped on glibc's assertion in the child when the kind had become
 * the plain one (docs/design.md, "Fork"). */
#include <pthread.h>

#include "internal.h"
#include "testutil.h"

int main(void) {
  pthread_mutex_t adaptive = PTHREAD_ADAPTIVE_MUTEX_INITIALIZER_NP, plain = PTHREAD_MUTEX_INITIALIZER;
  pthread_mutex_lock(&adaptive); /* held, as by a thread the child does not have */
  fork_unlock(&adaptive, FORK_SLOT_PAGEHEAP, true);
  fork_unlock(&plain, FORK_SLOT_PROF, true);
  CHECK_EQ(adaptive.__data.__kind, PTHREAD_MUTEX_ADAPTIVE_NP);
  CHECK_EQ(plain.__data.__kind, PTHREAD_MUTEX_TIMED_NP);
  CHECK_EQ(pthread_mutex_trylock(&adaptive), 0); /* unlocked */
  CHECK_EQ(pthread_mutex_unlock(&adaptive), 0);
  CHECK_EQ(pthread_mutex_trylock(&plain), 0);
  CHECK_EQ(pthread_mutex_unlock(&plain), 0);
  return tu_summary("unit-fork_locks");
}

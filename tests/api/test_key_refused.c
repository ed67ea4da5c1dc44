/* Threads when pthread_key_create fails (every key of the process in use: PTHREAD_KEYS_MAX).
 * qmalloc's thread-exit key is how a thread's cache is handed back; its creation once went
 * unchecked, and every thread then called pthread_setspecific on an uninitialised key: key 0,
 * which belongs to someone else, whose per-thread value it overwrote with the cache's address.
 * Now the threads run without caches. This program defines pthread_key_create, which interposes
 * it for libqmalloc too (an executable's definitions come first): it refuses every caller but
 * this program's own key (created after qmalloc's refusal, so it gets the lowest free key, 0),
 * then checks that threads allocating, freeing across threads and exiting keep their own value
 * of that key, and that every block stays intact. */
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"

static void own_destructor(void *value) { (void)value; }

static int refused;

int pthread_key_create(pthread_key_t *key, void (*destructor)(void *)) {
  if (destructor != own_destructor) {
    refused++;
    return EAGAIN;
  }
  int (*real)(pthread_key_t *, void (*)(void *)) = (int (*)(pthread_key_t *, void (*)(void *)))dlsym(RTLD_NEXT, "pthread_key_create");
  return real ? real(key, destructor) : EAGAIN;
}

enum { THREADS = 6, BLOCKS = 2000 };
static pthread_key_t own_key;
static char *handed[THREADS][BLOCKS]; /* thread t's blocks, freed by thread t + 1 */
static pthread_barrier_t made;

static void *worker(void *arg) {
  size_t t = (size_t)arg;
  pthread_setspecific(own_key, (void *)(t + 1000));
  for (size_t i = 0; i < BLOCKS; i++) {
    size_t size = 1 + (i * 37 + t * 101) % 3000;
    handed[t][i] = malloc(size);
    if (handed[t][i]) memset(handed[t][i], (int)(t + 1), size);
    free(malloc(size * 2));
  }
  pthread_barrier_wait(&made);
  size_t from = (t + THREADS - 1) % THREADS, bad = 0;
  for (size_t i = 0; i < BLOCKS; i++) {
    size_t size = 1 + (i * 37 + from * 101) % 3000;
    char *p = handed[from][i];
    if (!p || p[0] != (char)(from + 1) || p[size - 1] != (char)(from + 1)) bad++;
    free(p);
  }
  void *mine = pthread_getspecific(own_key);
  return (void *)(uintptr_t)(bad != 0 ? 1 : mine != (void *)(t + 1000) ? 2 : 0);
}

int main(void) {
  free(malloc(100)); /* qmalloc starts here: its key is refused */
  CHECK_MSG(refused >= 1, "qmalloc did not ask for its thread-exit key (refused %d)", refused);
  CHECK(pthread_key_create(&own_key, own_destructor) == 0);
  pthread_barrier_init(&made, NULL, THREADS);
  pthread_t threads[THREADS];
  for (size_t t = 0; t < THREADS; t++) CHECK(pthread_create(&threads[t], NULL, worker, (void *)t) == 0);
  for (size_t t = 0; t < THREADS; t++) {
    void *result;
    pthread_join(threads[t], &result);
    CHECK_MSG(result != (void *)1, "thread %zu found a block changed", t);
    CHECK_MSG(result != (void *)2, "thread %zu's own value of key %u was overwritten (qmalloc set a key not its own)", t, (unsigned)own_key);
  }
  /* and again, with new threads in the dead ones' memory */
  for (size_t t = 0; t < THREADS; t++) CHECK(pthread_create(&threads[t], NULL, worker, (void *)t) == 0);
  for (size_t t = 0; t < THREADS; t++) {
    void *result;
    pthread_join(threads[t], &result);
    CHECK_MSG(result == NULL, "second round: thread %zu returned %p", t, result);
  }
  return tu_summary("api-key_refused");
}

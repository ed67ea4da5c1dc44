/* Linked with libqmalloc.a by tests/preload/test_static.sh (once against the shared libc, once
 * fully static). Proves that the program's malloc family IS qmalloc's, not just that it works:
 *  - a block from malloc() is freed with qm_free() and one from qm_malloc() with free(): a foreign
 *    pointer in either direction would stop the program (qmalloc's pointer check, glibc's);
 *  - a string from libc's own strdup() (malloc called inside libc) is freed with qm_free(), so libc's
 *    internal calls reach qmalloc too;
 *  - qm_malloc_usable_size() agrees with malloc_usable_size() on a malloc() block;
 *  - threads allocate and free across each other;
 * then prints "static_prog: OK". Any failure prints a line and exits 1. */
#include <malloc.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "qmalloc.h"

static int failures;
#define EXPECT(c)                                                                                  \
  do {                                                                                             \
    if (!(c)) {                                                                                    \
      printf("static_prog: FAILED %s (line %d)\n", #c, __LINE__);                                 \
      failures++;                                                                                  \
    }                                                                                              \
  } while (0)

static void *handed[8];

static void *producer(void *arg) {
  long i = (long)arg;
  handed[i] = malloc(1000 + 100 * i);
  if (handed[i]) memset(handed[i], (int)i, 1000);
  return NULL;
}

int main(void) {
  char *p = malloc(100);
  EXPECT(p != NULL);
  memset(p, 1, 100);
  EXPECT(qm_malloc_usable_size(p) >= 100);
  EXPECT(qm_malloc_usable_size(p) == malloc_usable_size(p));
  qm_free(p);

  char *q = qm_malloc(200);
  EXPECT(q != NULL);
  memset(q, 2, 200);
  free(q);

  char *s = strdup("allocated inside libc");
  EXPECT(s != NULL && strcmp(s, "allocated inside libc") == 0);
  EXPECT(qm_malloc_usable_size(s) >= strlen(s) + 1);
  qm_free(s);

  void *big = malloc(8u << 20);
  EXPECT(big != NULL);
  memset(big, 3, 8u << 20);
  qm_free(big);

  pthread_t t[8];
  for (long i = 0; i < 8; i++) EXPECT(pthread_create(&t[i], NULL, producer, (void *)i) == 0);
  for (int i = 0; i < 8; i++) pthread_join(t[i], NULL);
  for (int i = 0; i < 8; i++) { /* freed by another thread than the one that allocated */
    EXPECT(handed[i] != NULL && ((unsigned char *)handed[i])[999] == i);
    qm_free(handed[i]);
  }
  if (failures) return 1;
  printf("static_prog: OK\n");
  return 0;
}

/* The page faults of a process that makes one allocation: one malloc of 40 bytes, written, and its
 * free, then the process's minor faults so far (getrusage) on stdout. Run with and without qmalloc
 * preloaded by test_startup_pages.sh, whose difference is what loading and starting qmalloc costs
 * every process. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

int main(void) {
  char *volatile p = malloc(40);
  if (p == NULL) return 1;
  memset(p, 1, 40);
  free(p);
  struct rusage ru;
  if (getrusage(RUSAGE_SELF, &ru) != 0) return 1;
  printf("%ld\n", ru.ru_minflt);
  return 0;
}

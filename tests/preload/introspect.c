/* A plain glibc program (not linked with qmalloc) that uses glibc's introspection API; run by
 * test_introspection.sh under LD_PRELOAD. Prints "uordblks N hblkhd N keepcost N" after
 * allocating 1000 x 1000 bytes and one 64 MiB block, then the malloc_info XML after a line
 * "--xml--", then trims and tunes. */
#include <malloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int main(void) {
  static void *objs[1000];
  for (int i = 0; i < 1000; i++) memset(objs[i] = malloc(1000), 7, 1000);
  void *big = malloc(64 << 20);
  struct mallinfo2 mi = mallinfo2();
  printf("uordblks %zu hblkhd %zu arena %zu\n", mi.uordblks, mi.hblkhd, mi.arena);
  for (int i = 0; i < 1000; i++) free(objs[i]);
  free(big);
  mi = mallinfo2();
  printf("after-free uordblks %zu fsmblks %zu keepcost %zu\n", mi.uordblks, mi.fsmblks, mi.keepcost);
  printf("trim %d\n", malloc_trim(0));
  mi = mallinfo2();
  printf("after-trim keepcost %zu\n", mi.keepcost);
  printf("mallopt %d %d %d\n", mallopt(M_MMAP_THRESHOLD, 1 << 20), mallopt(M_ARENA_MAX, 2), mallopt(M_MXFAST, 161));
  printf("--xml--\n");
  fflush(stdout);
  malloc_info(0, stdout);
  malloc_stats();
  return 0;
}

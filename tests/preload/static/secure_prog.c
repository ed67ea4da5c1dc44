/* Linked with libqmalloc.a by test_secure_exec.sh and run both as it is and set-user-ID (ld.so
 * preloads nothing by path into a set-user-ID program, so the library is linked in). It allocates
 * enough for the heap profiler to sample at one byte per sample, and prints its real and effective
 * user ids, so that the script knows which run was in secure-execution mode. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int main(void) {
  static void *blocks[64];
  for (int i = 0; i < 64; i++) memset(blocks[i] = malloc(4096), i, 4096);
  printf("uid %d euid %d\n", (int)getuid(), (int)geteuid());
  fflush(stdout);
  return 0; /* blocks stay live: the leak profile at exit has them */
}

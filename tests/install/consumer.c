/* A C program built against an installed qmalloc (by tests/install/test_roundtrip.sh, through
 * pkg-config and through find_package, linked shared and static). It checks that it really got
 * qmalloc: the library's qm_version() equals the header's QM_VERSION, which spells out the
 * QMALLOC_VERSION_* macros; and a block from plain malloc() is one qmalloc knows
 * (qm_malloc_usable_size stops the program with "invalid pointer" on any other allocator's block).
 * Prints one line "consumer: qmalloc VERSION, malloc(1000) usable N" and exits 0, or says what
 * is wrong and exits 1. */
#include <qmalloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int main(void) {
  char spelled[64];
  snprintf(spelled, sizeof spelled, "%d.%d.%d", QMALLOC_VERSION_MAJOR, QMALLOC_VERSION_MINOR, QMALLOC_VERSION_PATCH);
  if (strcmp(QM_VERSION, spelled) != 0 || strcmp(qm_version(), QM_VERSION) != 0) {
    printf("consumer: version mismatch: qm_version() %s, QM_VERSION %s, macros %s\n", qm_version(), QM_VERSION, spelled);
    return 1;
  }
  char *p = malloc(1000);
  if (p == NULL) return 1;
  memset(p, 1, 1000);
  size_t usable = qm_malloc_usable_size(p);
  free(p);
  if (usable < 1000) {
    printf("consumer: malloc(1000) has %zu usable bytes\n", usable);
    return 1;
  }
  printf("consumer: qmalloc %s, malloc(1000) usable %zu\n", qm_version(), usable);
  return 0;
}

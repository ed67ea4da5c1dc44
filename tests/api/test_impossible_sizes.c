/* Impossible sizes fail with ENOMEM before anything lasting is reserved (issue 16, defect 4).
 * malloc(64 GiB), malloc(1 TiB) and malloc(16 TiB) once returned pointers on a 23 GiB machine without
 * swap, because every mapping skipped the kernel's overcommit check (MAP_NORESERVE): a program that
 * probes for memory got a pointer that faults later. Memory for the program is now mapped so that
 * the kernel's policy applies, as glibc's is; the checks that depend on that policy run only under
 * the policies that refuse such requests (overcommit_memory 0, heuristic, or 2, strict; under 1,
 * "always", glibc succeeds too, and the test says so). Independent of the policy:
 * memalign(1 TiB, 100) three times must not leave terabytes of address space or gigabytes of
 * page-map mappings behind, and every call that fails leaves the heap working. */
#include <errno.h>
#include <malloc.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "family.h"
#include "testutil.h"

static size_t total_ram_and_swap(void) {
  FILE *f = fopen("/proc/meminfo", "r");
  char key[64];
  unsigned long kb, total = 0;
  while (f && fscanf(f, "%63s %lu kB\n", key, &kb) == 2)
    if (!strcmp(key, "MemTotal:") || !strcmp(key, "SwapTotal:")) total += kb;
  if (f) fclose(f);
  return (size_t)total << 10;
}

int main(void) {
  if (getenv("QM_TEST_EMULATOR") != NULL) { /* qemu-user maps the guest's address space itself */
    printf("api-impossible_sizes: skipped: under an emulator the host's overcommit policy does not see the guest's mappings\n");
    return 77;
  }
  int policy = -1;
  FILE *f = fopen("/proc/sys/vm/overcommit_memory", "r");
  if (f && fscanf(f, "%d", &policy) != 1) policy = -1;
  if (f) fclose(f);
  size_t have = total_ram_and_swap();
  static const size_t sizes[] = {(size_t)64 << 30, (size_t)1 << 40, (size_t)16 << 40};
  if (policy == 1) printf("overcommit_memory = 1 (always): the kernel grants any mapping; ENOMEM checks not applicable\n");
  for (size_t k = 0; k < QM_NFAMILIES; k++) {
    const family_t *fam = &QM_FAMILIES[k];
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
      size_t n = sizes[i];
      if (policy == 1 || n <= have) continue; /* only what the machine cannot possibly have */
      errno = 0;
      void *p = fam->malloc(n);
      CHECK_MSG(p == NULL && errno == ENOMEM, "%s: malloc(%zu GiB) = %p, errno %d (machine: %zu GiB RAM+swap)",
                fam->name, n >> 30, p, errno, have >> 30);
      errno = 0;
      p = fam->calloc(n >> 20, 1 << 20);
      CHECK_MSG(p == NULL && errno == ENOMEM, "%s: calloc(%zu GiB) = %p, errno %d", fam->name, n >> 30, p, errno);
      void *r = NULL;
      CHECK_EQ(fam->posix_memalign(&r, 64, n), ENOMEM);
      void *small = fam->malloc(100); /* and the heap still works */
      CHECK(small != NULL);
      fam->free(small);
    }
  }
  size_t before = tu_statm_bytes(0);
  for (int i = 0; i < 3; i++) {
    void *p = memalign((size_t)1 << 40, 100);
    if (p) {
      CHECK(((uintptr_t)p & (((size_t)1 << 40) - 1)) == 0);
      ((char *)p)[99] = 1;
    }
    free(p);
  }
  size_t grown = tu_statm_bytes(0) - before;
  CHECK_MSG(grown < ((size_t)64 << 20), "three memalign(1 TiB, 100) left %zu MiB of address space mapped", grown >> 20);
  return tu_summary("api-impossible_sizes");
}

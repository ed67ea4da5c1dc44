/* The dynamic symbol table of libqmalloc.so ($QMALLOC_SO), read with `nm -D --defined-only`:
 *  - every malloc-family name (glibc's __libc_ names and cfree too), every qm_* function of
 *    include/qmalloc.h and every standard C++ operator new/delete is exported;
 *  - nothing else is, apart from the optional glibc extras (mallinfo, mallinfo2, malloc_stats,
 *    malloc_info, malloc_trim, mallopt) and further qm_* names: an internal symbol leaking out
 *    (a missing `static` or visibility attribute) fails, and the unexpected names are listed;
 *  - the library does not depend on libstdc++ (C programs preload it). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"

static const char *const REQUIRED[] = {
  /* C and POSIX */
  "malloc", "free", "calloc", "realloc", "reallocarray", "posix_memalign", "aligned_alloc", "memalign",
  "valloc", "pvalloc", "malloc_usable_size", "free_sized", "free_aligned_sized",
  /* glibc's other names for its allocator, and cfree: a block from any name is freed by any other */
  "__libc_malloc", "__libc_free", "__libc_calloc", "__libc_realloc", "__libc_memalign", "__libc_valloc",
  "__libc_pvalloc", "cfree",
  /* include/qmalloc.h */
  "qm_malloc", "qm_free", "qm_calloc", "qm_realloc", "qm_reallocarray", "qm_posix_memalign", "qm_aligned_alloc",
  "qm_memalign", "qm_valloc", "qm_pvalloc", "qm_malloc_usable_size", "qm_free_sized", "qm_free_aligned_sized",
  "qm_trim", "qm_stats_print", "qm_version",
  /* C++: new, new[] x {plain, nothrow, aligned, aligned+nothrow} */
  "_Znwm", "_Znam", "_ZnwmRKSt9nothrow_t", "_ZnamRKSt9nothrow_t", "_ZnwmSt11align_val_t", "_ZnamSt11align_val_t",
  "_ZnwmSt11align_val_tRKSt9nothrow_t", "_ZnamSt11align_val_tRKSt9nothrow_t",
  /* C++: delete, delete[] x {plain, nothrow, sized, aligned, aligned+nothrow, sized+aligned} */
  "_ZdlPv", "_ZdaPv", "_ZdlPvRKSt9nothrow_t", "_ZdaPvRKSt9nothrow_t", "_ZdlPvm", "_ZdaPvm", "_ZdlPvSt11align_val_t",
  "_ZdaPvSt11align_val_t", "_ZdlPvSt11align_val_tRKSt9nothrow_t", "_ZdaPvSt11align_val_tRKSt9nothrow_t",
  "_ZdlPvmSt11align_val_t", "_ZdaPvmSt11align_val_t",
};
static const char *const OPTIONAL[] = {"mallinfo", "mallinfo2", "malloc_stats", "malloc_info", "malloc_trim",
                                       "mallopt"};
#define COUNT(a) (sizeof a / sizeof a[0])

static int in_list(const char *name, const char *const *list, size_t n) {
  for (size_t i = 0; i < n; i++)
    if (strcmp(name, list[i]) == 0) return (int)i;
  return -1;
}

int main(void) {
  const char *so = getenv("QMALLOC_SO");
  if (!so || !*so) {
    fprintf(stderr, "test_exports: QMALLOC_SO is not set (ctest sets it to the built libqmalloc.so)\n");
    return 2;
  }
  char cmd[4096];
  snprintf(cmd, sizeof cmd, "nm -D --defined-only '%s'", so);
  FILE *nm = popen(cmd, "r");
  CHECK_MSG(nm != NULL, "cannot run: %s", cmd);
  if (!nm) return tu_summary("api-exports");

  int seen[COUNT(REQUIRED)] = {0};
  int symbols = 0, unexpected = 0;
  char line[1024];
  while (fgets(line, sizeof line, nm)) {
    char addr[64], type[8], name[900];
    int fields = sscanf(line, "%63s %7s %899s", addr, type, name);
    if (fields == 2) { /* "T name" without an address */
      strcpy(name, type);
      strcpy(type, addr);
    } else if (fields != 3) {
      continue;
    }
    char *at = strchr(name, '@'); /* symbol version: malloc@@QMALLOC_1 */
    if (at) *at = '\0';
    if (strcmp(type, "A") == 0) continue; /* a version node definition, not a symbol */
    symbols++;
    int r = in_list(name, REQUIRED, COUNT(REQUIRED));
    if (r >= 0) {
      seen[r] = 1;
      continue;
    }
    if (in_list(name, OPTIONAL, COUNT(OPTIONAL)) >= 0 || strncmp(name, "qm_", 3) == 0) continue;
    unexpected++;
    CHECK_MSG(0, "unexpected exported symbol: %s %s", type, name);
  }
  int rc = pclose(nm);
  CHECK_MSG(rc == 0, "`%s` failed (exit status %d)", cmd, rc);
  CHECK_MSG(symbols > 0, "`%s` listed no symbols", cmd);
  CHECK_MSG(unexpected == 0, "%d unexpected exported symbols (listed above)", unexpected);
  for (size_t i = 0; i < COUNT(REQUIRED); i++) CHECK_MSG(seen[i], "required symbol not exported: %s", REQUIRED[i]);

  /* No DT_NEEDED on libstdc++: a C program that preloads qmalloc must not drag the C++ runtime in. */
  snprintf(cmd, sizeof cmd, "readelf -d '%s'", so);
  FILE *re = popen(cmd, "r");
  int needs_cxx = 0, lines = 0;
  while (re && fgets(line, sizeof line, re)) {
    lines++;
    if (strstr(line, "(NEEDED)") && strstr(line, "libstdc++")) needs_cxx = 1;
  }
  CHECK_MSG(re && pclose(re) == 0 && lines > 0, "`%s` failed", cmd);
  CHECK_MSG(!needs_cxx, "%s needs libstdc++ (NEEDED entry)", so);
  return tu_summary("api-exports");
}

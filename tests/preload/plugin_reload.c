/* A plugin reloaded while the heap profiler samples (run preloaded by test_prof.sh, with
 * QMALLOC_PROF_SAMPLE=64: every allocation sampled). The profiler's unwinder caches a rule per
 * return address; a plugin built with a 4 MiB frame is called and unloaded, and one with a 4 KiB
 * frame is loaded at the same address and called on a thread with a 64 KiB stack. Stepped with the
 * old rule, that frame's caller was looked for 4 MiB up: past the thread's stack (a crash, 96 runs
 * in 100). The samples of the second plugin must instead have their whole stacks: the rules read
 * again after the unload, each sample reaching this program's own code.
 * Prints "done" and exits 0, or prints what failed and exits 1. */
#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef void *(*alloc_fn)(size_t);
enum { KEPT = 20 };
static void *kept[KEPT];

static void *base_of(const void *addr) {
  Dl_info info;
  return dladdr(addr, &info) != 0 ? info.dli_fbase : NULL;
}

static void *big_plugin_run(void *handle) {
  alloc_fn f = (alloc_fn)dlsym(handle, "plug_alloc");
  for (int i = 0; i < 100; i++) free(f(100000));
  return (void *)f;
}

static void *small_plugin_run(void *f) {
  for (int i = 0; i < KEPT; i++) kept[i] = ((alloc_fn)f)(100000);
  return NULL;
}

int main(void) {
  int (*dump)(const char *, int) = (int (*)(const char *, int))dlsym(RTLD_DEFAULT, "qm_prof_dump");
  if (dump == NULL) {
    printf("FAIL: qm_prof_dump not found (not run under libqmalloc)\n");
    return 1;
  }
  void *small = NULL, *small_fn = NULL;
  for (int attempt = 0; attempt < 10 && small_fn == NULL; attempt++) { /* the loader reuses the range */
    void *big = dlopen(QM_PLUGIN_BIG, RTLD_NOW);
    if (big == NULL) {
      printf("FAIL: %s\n", dlerror());
      return 1;
    }
    void *big_fn = big_plugin_run(big); /* on main's stack, where the 4 MiB frame fits */
    dlclose(big);
    small = dlopen(QM_PLUGIN_SMALL, RTLD_NOW);
    if (small == NULL) {
      printf("FAIL: %s\n", dlerror());
      return 1;
    }
    void *fn = dlsym(small, "plug_alloc");
    if (fn == big_fn) small_fn = fn;
    else dlclose(small);
  }
  if (small_fn == NULL) {
    printf("FAIL: the second plugin was never loaded where the first was (10 tries)\n");
    return 1;
  }
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setstacksize(&attr, 64 << 10);
  pthread_t t;
  pthread_create(&t, &attr, small_plugin_run, small_fn);
  pthread_join(t, NULL);

  char path[] = "/tmp/qm-plugin-reload-XXXXXX";
  int fd = mkstemp(path);
  if (fd < 0 || dump(path, 0) != 0) {
    printf("FAIL: the live profile could not be written to %s\n", path);
    return 1;
  }
  close(fd);
  FILE *f = fopen(path, "r");
  void *plugin = base_of(small_fn), *program = base_of((void *)main);
  int stacks = 0, whole = 0;
  char line[8192];
  while (f != NULL && fgets(line, sizeof line, f) != NULL) {
    char *at = strstr(line, " @ ");
    if (at == NULL) continue;
    uintptr_t frames[64];
    int n = 0;
    for (char *p = at + 3; n < 64;) {
      char *end;
      unsigned long long v = strtoull(p, &end, 16);
      if (end == p) break;
      frames[n++] = (uintptr_t)v;
      p = end;
    }
    if (n == 0 || base_of((void *)(frames[0] - 1)) != plugin) continue; /* not a block of the plugin */
    stacks++;
    for (int i = 1; i < n; i++)
      if (base_of((void *)(frames[i] - 1)) == program) {
        whole++;
        break;
      }
  }
  if (f != NULL) fclose(f);
  unlink(path);
  for (int i = 0; i < KEPT; i++) free(kept[i]);
  if (stacks == 0 || whole != stacks) {
    printf("FAIL: %d of the second plugin's sampled stacks reach this program, of %d\n", whole, stacks);
    return 1;
  }
  printf("%d sampled stacks through the reloaded plugin, all whole\ndone\n", stacks);
  return 0;
}

/* For preload-releaser_tls: threads touch 1 MiB each of a dlopen'd module's TLS, which glibc
 * allocates with malloc in each thread and frees, under its stack cache's lock, when the thread's
 * stack leaves that cache (several threads' 8 MiB stacks at once overflow its 40 MiB). Those frees
 * take the page heap's free pages past the releaser's start threshold; a releaser started by one
 * of them (pthread_create takes the same lock) hung the process. Prints "done" at the end. */
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>

static void (*touch_tls)(void);

static void *worker(void *arg) {
  touch_tls();
  return arg;
}

static int run_threads(int n) {
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setstacksize(&attr, (size_t)8 << 20);
  pthread_t threads[8];
  for (int i = 0; i < n; i++)
    if (pthread_create(&threads[i], &attr, worker, NULL) != 0) return 0;
  for (int i = 0; i < n; i++) pthread_join(threads[i], NULL);
  return 1;
}

int main(void) {
  void *module = dlopen(QM_BIGTLS_MODULE, RTLD_NOW);
  if (module == NULL) {
    printf("dlopen: %s\n", dlerror());
    return 2;
  }
  touch_tls = (void (*)(void))dlsym(module, "qm_test_touch_tls");
  if (touch_tls == NULL) return 2;
  for (int round = 0; round < 20; round++) /* one at a time: the main thread's cache the only one */
    if (!run_threads(1)) return 3;
  if (!run_threads(8) || !run_threads(8)) return 3;
  puts("done");
  return 0;
}

/* Options set while other threads read them: what mallopt does in a running program (it goes
 * through options_set, as here). Two threads allocate, stamp, check and free blocks from 16 bytes
 * to 4 MiB, whose paths read the page heap's options (decay_ms, retain_max, release_large) and the
 * thread caches' (tcache_max; transfer_batch is read at init only), while the background releaser
 * wakes as often as every 10 ms and reads decay_ms and tcache_idle_ms. The main thread meanwhile
 * sets retain_max, decay_ms and release_large to one value after another. Every set must be
 * accepted, the last values must be the ones read back, and every block must keep its stamps.
 * Under ThreadSanitizer (tools/checked_build.sh tsan) a plain read or write of a value is reported:
 * with the values plain `long long`s, as they were, it reported a set of retain_max against the
 * page heap's read of it in an allocating thread, in 3 runs of 3. Bounded by counts, not time. */
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>
#include <time.h>

#include "internal.h"
#include "testutil.h"

#define ROUNDS 400
static atomic_int stop;
static atomic_long bad_stamps, blocks_done;

static bool set(const char *name, const char *value) {
  return options_set(name, strlen(name), value, strlen(value), "unit-options_race");
}

static void *allocator_thread(void *arg) {
  uint64_t seed = (uint64_t)(uintptr_t)arg;
  void *held[8] = {0};
  size_t sizes[8] = {0};
  while (!atomic_load(&stop)) {
    unsigned k = (unsigned)(tu_rand(&seed) % 8);
    if (held[k] != NULL) {
      unsigned char *p = held[k];
      if (p[0] != (unsigned char)k || p[sizes[k] - 1] != (unsigned char)(k + 1)) atomic_fetch_add(&bad_stamps, 1);
      free(p);
      held[k] = NULL;
    }
    uint64_t r = tu_rand(&seed);
    size_t size = r % 4 == 0 ? ((size_t)1 << 20) + r % (3u << 20) : 16 + r % 60000;
    unsigned char *p = malloc(size);
    if (p == NULL) continue;
    p[0] = (unsigned char)k;
    p[size - 1] = (unsigned char)(k + 1);
    held[k] = p;
    sizes[k] = size;
    atomic_fetch_add(&blocks_done, 1);
  }
  for (unsigned k = 0; k < 8; k++) free(held[k]);
  return NULL;
}

int main(void) {
  init_process();
  /* No idle reclaim: its membarrier protocol is checked by unit-reclaim alone under ThreadSanitizer
   * (tools/checked_build.sh). The releaser's period follows decay_ms, down to 10 ms. */
  CHECK(set("tcache_idle_ms", "0"));
  free(malloc(64));
  pthread_t threads[2];
  for (uintptr_t i = 0; i < 2; i++) pthread_create(&threads[i], NULL, allocator_thread, (void *)(i + 3));
  static const char *retain[] = {"0", "1M", "64M", "4096"};
  static const char *decay[] = {"0", "1", "250", "never"};
  static const char *large[] = {"1M", "32M", "0", "2M"};
  int accepted = 0;
  struct timespec pause = {0, 200 * 1000L};
  for (int i = 0; i < ROUNDS; i++) {
    accepted += set("retain_max", retain[i % 4]);
    accepted += set("decay_ms", decay[(i / 4) % 4]);
    accepted += set("release_large", large[(i / 16) % 4]);
    nanosleep(&pause, NULL); /* let the other threads run between sets */
  }
  /* The last round's values, read back as any thread reads them. */
  CHECK(set("retain_max", "8M") && set("decay_ms", "300") && set("release_large", "32M"));
  atomic_store(&stop, 1);
  for (int i = 0; i < 2; i++) pthread_join(threads[i], NULL);
  CHECK_EQ(accepted, 3 * ROUNDS);
  CHECK_EQ(option(OPTION_RETAIN_MAX), 8LL << 20);
  CHECK_EQ(option(OPTION_DECAY_MS), 300);
  CHECK_EQ(option(OPTION_RELEASE_LARGE), 32LL << 20);
  CHECK_MSG(atomic_load(&bad_stamps) == 0, "%ld blocks lost their stamps", atomic_load(&bad_stamps));
  CHECK_MSG(atomic_load(&blocks_done) > 0, "the allocating threads made no block: the sets raced nothing");
  return tu_summary("unit-options_race");
}

/* The hardened build's slow halves (libqmalloc-hardened, QM_HARDENED=1; docs/hardening.md): the
 * one-line errors, realloc's and malloc_usable_size's view of small blocks, the quarantine's byte
 * bound and its end at thread and process exit, the zero-size region, page protection of large
 * blocks, and the randomized carving of new spans. The layout of blocks and the checks every malloc
 * and free makes are harden.h's (inline, on the thread-cache path).
 * Does not: take any lock of its own, or decide anything in the default build (every caller tests
 * qm_hardened, a constant). Callers: api.c (the hardened build's slow halves), central.c
 * (carving), tcache.c (thread exit), pageheap.c (protection of freed large blocks). */
#include <errno.h>
#include <pthread.h>
#include <string.h>

#include "freelist.h"
#include "harden.h"
#include "internal.h"
#include "log.h"
#include "os.h"

__thread harden_thread_t harden_self __attribute__((tls_model("initial-exec"), visibility("hidden")));

/* ---- the one-line errors of the hardened build (check.c's format) ---------------------------- */

QM_NOINLINE QM_COLD void harden_fail_overflow(const char *call, const void *obj) {
  log_fatal("%s: overflow past the end of the block %p", call, obj);
}

QM_NOINLINE QM_COLD void harden_fail_underflow(const char *call, const void *obj) {
  log_fatal("%s: underflow (the bytes before the block were overwritten) %p", call, obj);
}

QM_NOINLINE QM_COLD void harden_fail_write_after_free(const char *call, const void *obj) {
  log_fatal("%s: write after free %p", call, obj);
}

/* ---- realloc and malloc_usable_size of small blocks ------------------------------------------- */

static bool harden_quarantined(const void *obj) {
  return __atomic_load_n(&((const uintptr_t *)obj)[1], __ATOMIC_RELAXED) == (freelist_key(obj) ^ HARDEN_QUARANTINED);
}

size_t harden_request_size(void *obj, unsigned cls, const char *call) {
  if (harden_quarantined(obj)) check_fail_invalid(call, obj); /* freed: it waits in a quarantine */
  return harden_live_size(obj, sizeclass_size[cls], call);
}

/* From n_old to n bytes: the new canary is written, exactly [n, its end) (harden_write_tail's
 * vector may start below n, over what are here the program's bytes), and the new record. Nothing
 * else need hold the pattern while the block is live. */
void harden_resize(void *obj, unsigned cls, size_t n_old, size_t n) {
  (void)n_old;
  size_t slot = sizeclass_size[cls], record = slot - 8, end = n + HARDEN_CANARY_LEN < record ? n + HARDEN_CANARY_LEN : record;
  memset((char *)obj + n, HARDEN_PATTERN, end - n);
  __atomic_store_n(harden_last_word(obj, slot), harden_record(obj, n), __ATOMIC_RELAXED);
}

/* ---- the quarantine's slow half: its byte bound, trim, thread exit ---------------------------- */

/* Takes block i out of the ring (the last one takes its place), checked. */
static void *harden_leave(harden_thread_t *t, uint32_t i, unsigned *cls) {
  void *obj = t->blocks[i];
  *cls = t->classes[i];
  t->count--;
  t->blocks[i] = t->blocks[t->count];
  t->classes[i] = t->classes[t->count];
  t->bytes -= sizeclass_size[*cls];
  t->next = HARDEN_QUARANTINE_SLOTS; /* the next free takes the slow half, which may grow the ring again */
  harden_check_leaving(obj);
  return obj;
}

void harden_seed(harden_thread_t *t) {
  if (t->rng == 0) t->rng = (freelist_secret ^ (uintptr_t)t) * 0x9E3779B97F4A7C15ull;
}

void *harden_quarantine_add(void *obj, unsigned cls, unsigned *leaving_cls) {
  harden_thread_t *t = &harden_self;
  size_t size = sizeclass_size[cls];
  if (t->closed) { /* no ring any more: the caller pushes obj now */
    *leaving_cls = cls;
    return obj;
  }
  harden_seed(t);
  void *leaving = NULL;
  if (t->count < HARDEN_QUARANTINE_SLOTS && size <= HARDEN_QUARANTINE_BYTES - t->bytes) {
    t->blocks[t->count] = obj;
    t->classes[t->count] = (uint8_t)cls;
    t->bytes += size;
    t->count++;
  } else { /* short of its slots by its byte bound: a block drawn now leaves */
    uint32_t i = harden_below(t, t->count);
    leaving = t->blocks[i];
    *leaving_cls = t->classes[i];
    t->blocks[i] = obj;
    t->classes[i] = (uint8_t)cls;
    t->bytes += size - sizeclass_size[*leaving_cls];
    harden_check_leaving(leaving);
  }
  /* Full: the fast path takes over, with the next slot to leave drawn. Otherwise none is drawn
   * (count <= next), and the next free comes here again. */
  t->next = t->count == HARDEN_QUARANTINE_SLOTS ? harden_below(t, t->count) : HARDEN_QUARANTINE_SLOTS;
  return leaving;
}

void *harden_quarantine_over(unsigned *cls) {
  harden_thread_t *t = &harden_self;
  if (t->bytes <= HARDEN_QUARANTINE_BYTES) return NULL;
  return harden_leave(t, harden_below(t, t->count), cls);
}

void *harden_quarantine_evict(unsigned *cls) {
  harden_thread_t *t = &harden_self;
  if (t->closed || t->count == 0) return NULL;
  return harden_leave(t, harden_below(t, t->count), cls);
}

void harden_thread_exit(void) {
  harden_thread_t *t = &harden_self;
  t->closed = true;
  while (t->count > 0) {
    unsigned cls;
    void *obj = harden_leave(t, t->count - 1, &cls);
    freelist_mark(obj, NULL, freelist_key(obj));
    central_insert(cls, obj, 1);
  }
}

/* At exit, the blocks still waiting in the exiting thread's quarantine are checked as if they were
 * handed out: a write after free into a block freed in the last few hundred frees is reported,
 * however the program ends (return from main, exit). Other threads' quarantines are out of reach. */
__attribute__((destructor)) static void harden_check_at_exit(void) {
  if (!qm_hardened) return;
  harden_thread_t *t = &harden_self;
  for (uint32_t i = 0; i < t->count; i++) {
    void *obj = t->blocks[i];
    unsigned cls = t->classes[i];
    uintptr_t key = freelist_key(obj);
    if (((uintptr_t *)obj)[0] != ~key || !harden_quarantined(obj) || !harden_holds_fill(obj, sizeclass_size[cls]))
      harden_fail_write_after_free("exit()", obj);
  }
}

/* ---- new spans: every slot free, in random order --------------------------------------------- */

void harden_carve(span_t *span, unsigned cls) {
  uint32_t size = sizeclass_size[cls];
  uint32_t n = (uint32_t)(sizeclass_pages[cls] * PAGE_SIZE / size);
  if (size <= HARDEN_FILL_END) memset((void *)span->start, HARDEN_PATTERN, (size_t)n * size); /* every byte is fill */
  else
    for (uint32_t i = 0; i < n; i++) harden_fill((void *)(span->start + (uintptr_t)i * size), size);
  uint16_t order[1024]; /* the most objects a span holds (sizeclass_table.h) */
  harden_seed(&harden_self);
  if (size < 16 || n > 1024) { /* never in this build: the 8-byte class serves no request here */
    for (uint32_t i = 0; i < n; i++) *(void **)(span->start + (uintptr_t)i * size) = i + 1 < n ? (void *)(span->start + (uintptr_t)(i + 1) * size) : NULL;
    span->u.small.freelist = (void *)span->start;
    return;
  }
  for (uint32_t i = 0; i < n; i++) order[i] = (uint16_t)i;
  for (uint32_t i = n - 1; i > 0; i--) { /* Fisher-Yates */
    uint32_t j = harden_below(&harden_self, i + 1);
    uint16_t tmp = order[i];
    order[i] = order[j];
    order[j] = tmp;
  }
  void *next = NULL;
  for (uint32_t i = n; i-- > 0;) {
    void *obj = (void *)(span->start + (uintptr_t)order[i] * size);
    freelist_mark(obj, next, freelist_key(obj));
    next = obj;
  }
  span->u.small.freelist = next;
}

/* ---- zero-size allocations ----------------------------------------------------------------------- */

/* malloc(0) hands out addresses 16 bytes apart in a reserved range that is never accessible: any
 * access faults, free() recognises them and does nothing. 64 MiB of address space (no memory):
 * four million distinct pointers before the addresses come round again. */
#define HARDEN_ZERO_BYTES ((size_t)64 << 20)
static uintptr_t harden_zero_base;
static uintptr_t harden_zero_next;
static pthread_mutex_t harden_zero_lock = PTHREAD_MUTEX_INITIALIZER; /* the one reservation */

void *harden_zero_alloc(void) {
  uintptr_t base = __atomic_load_n(&harden_zero_base, __ATOMIC_ACQUIRE);
  if (base == 0) {
    pthread_mutex_lock(&harden_zero_lock);
    base = harden_zero_base;
    if (base == 0) {
      base = (uintptr_t)os_reserve(HARDEN_ZERO_BYTES);
      __atomic_store_n(&harden_zero_base, base, __ATOMIC_RELEASE);
    }
    pthread_mutex_unlock(&harden_zero_lock);
    if (base == 0) {
      errno = ENOMEM;
      return NULL;
    }
  }
  uintptr_t offset = __atomic_fetch_add(&harden_zero_next, 16, __ATOMIC_RELAXED) % HARDEN_ZERO_BYTES;
  return (void *)(base + offset);
}

bool harden_is_zero(const void *ptr) {
  uintptr_t base = __atomic_load_n(&harden_zero_base, __ATOMIC_ACQUIRE);
  return base != 0 && (uintptr_t)ptr - base < HARDEN_ZERO_BYTES;
}

/* ---- large blocks ---------------------------------------------------------------------------------- */

/* A large span's last page is its guard: an overflow past the block faults. */
void harden_guard_large(span_t *span) {
  os_protect((void *)(span->start + ((uintptr_t)span->npages - 1) * PAGE_SIZE), PAGE_SIZE, false);
}

void harden_unguard_large(span_t *span) {
  os_protect((void *)(span->start + ((uintptr_t)span->npages - 1) * PAGE_SIZE), PAGE_SIZE, true);
}

void harden_protect_freed(span_t *span) { os_protect((void *)span->start, (size_t)span->npages * PAGE_SIZE, false); }

void harden_unprotect(span_t *span) { os_protect((void *)span->start, (size_t)span->npages * PAGE_SIZE, true); }

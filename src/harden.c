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
#include <stdlib.h>
#include <string.h>

#include "freelist.h"
#include "harden.h"
#include "internal.h"
#include "log.h"
#include "os.h"

__thread harden_thread_t harden_self __attribute__((tls_model("initial-exec"), visibility("hidden")));

/* Each class's fill offsets (harden.h), computed by the compiler from the class table: read-only
 * data. Slots of 16 bytes (and the 8-byte class, which this build never uses) take no fill; their
 * entries are never read. */
#define HARDEN_FILL_MID_ROW(cls, size, pages) [cls] = (size) >= 48 ? 32 : 16,
#define HARDEN_FILL_END_ROW(cls, size, pages) [cls] = (size) >= 64 ? 48 : (size) >= 48 ? 32 : 16,
const harden_fill_at_t harden_fill_at = {{SIZECLASS_ROWS(HARDEN_FILL_MID_ROW)}, {SIZECLASS_ROWS(HARDEN_FILL_END_ROW)}};

/* ---- the one-line errors of the hardened build (check.c's format) ---------------------------- */

__attribute__((noreturn)) static QM_NOINLINE QM_COLD void harden_fail_overflow(const char *call, const void *obj) {
  log_fatal("%s: overflow past the end of the block %p", call, obj);
}

__attribute__((noreturn)) static QM_NOINLINE QM_COLD void harden_fail_underflow(const char *call, const void *obj) {
  log_fatal("%s: underflow (the bytes before the block were overwritten) %p", call, obj);
}

QM_NOINLINE QM_COLD void harden_fail_write_after_free(const char *call, const void *obj) {
  log_fatal("%s: write after free %p", call, obj);
}

/* For the errors below: the block after obj in obj's span (NULL if obj is its last slot: whatever
 * follows is another span's, or none), obj's slot size in *slot and its slot's last word in *last. */
static const void *harden_next_block(const void *obj, size_t *slot, uint64_t *last) {
  uintptr_t entry = pagemap_small_of((uintptr_t)obj);
  unsigned cls = pagemap_entry_class(entry);
  *slot = sizeclass_size[cls];
  *last = *(const uint64_t *)(const void *)((const char *)obj + *slot - 8);
  uintptr_t next = (uintptr_t)obj + *slot, end = pagemap_entry_span_start(entry) + (uintptr_t)sizeclass_span_objects[cls] * *slot;
  return entry != 0 && next < end ? (const void *)next : NULL;
}

/* Whether a slot's damaged last word w, whose low byte should be `low`, is an underflow of the
 * block after it: its top 16 bits (HARDEN_WORD_TOP in every word a last word holds), which that
 * underflow writes first, changed, and its low byte, which it writes last, not. */
static bool harden_top_intact(uint64_t w) { return w >> 48 == HARDEN_WORD_TOP; }
static bool harden_underflow_shape(uint64_t w, uint8_t low) { return !harden_top_intact(w) && (uint8_t)w == low; }

QM_NOINLINE QM_COLD void harden_fail_tail(const char *call, const void *obj) {
  size_t slot;
  uint64_t w;
  const void *next = harden_next_block(obj, &slot, &w);
  /* A record's low byte is its key's (n << 8 leaves it alone). */
  if (next != NULL && harden_underflow_shape(w, (uint8_t)freelist_key(obj))) harden_fail_underflow(call, next);
  /* The whole word: an 8-byte overflow that reaches the record and an 8-byte underflow of the next
   * block write the same bytes. */
  if (next != NULL && !harden_top_intact(w))
    log_fatal("%s: overflow past the end of the block, or underflow of the block after it %p", call, obj);
  harden_fail_overflow(call, obj);
}

QM_NOINLINE QM_COLD void harden_fail_free_block(const char *call, const void *obj) {
  size_t slot;
  uint64_t w;
  const void *next = harden_next_block(obj, &slot, &w);
  /* The last word (in 16-byte slots the free tag, whose low byte is the key's) changed as an
   * underflow changes it, and the fill before it, from byte 16, intact (the first two words are the
   * pop's and the leaving block's to check). */
  bool fill_intact = true;
  for (size_t at = 16; at < HARDEN_FILL_END && at < slot - 8; at++) fill_intact &= ((const uint8_t *)obj)[at] == HARDEN_PATTERN;
  uint8_t low = slot <= 16 ? (uint8_t)freelist_key(obj) : HARDEN_PATTERN;
  if (next != NULL && fill_intact && harden_underflow_shape(w, low)) harden_fail_underflow(call, next);
  harden_fail_write_after_free(call, obj);
}

QM_NOINLINE QM_COLD void *harden_fail_handout(void *obj) { harden_fail_free_block("malloc()", obj); }

/* A free block's tag and fill, off the hand-out (a thread's exit, the exit check): as the hand-out
 * checks the fill, with the tag too, which is this slot's last word in 16-byte slots. */
static void harden_check_free_block(const void *obj, unsigned cls, const char *call) {
  if (!freelist_tagged(obj, freelist_key(obj)) || !harden_holds_fill(obj, cls)) harden_fail_free_block(call, obj);
}

void harden_explain_corrupted(const char *call, const void *obj) {
  size_t slot;
  uint64_t w;
  const void *next = harden_next_block(obj, &slot, &w);
  uintptr_t key = freelist_key(obj);
  /* A 16-byte slot's last word is its tag; the link sound: not a link overwritten. */
  if (slot == 16 && next != NULL && harden_underflow_shape(w, (uint8_t)key) && (int64_t)(((const uint64_t *)obj)[0] ^ key) >= 0)
    harden_fail_underflow(call, next);
}

QM_NOINLINE QM_COLD void harden_reject(harden_defect_t defect, const char *call, const void *obj, size_t size) {
  switch (defect) {
  case HARDEN_DOUBLE_FREE: check_fail_double_free(call, obj);
  case HARDEN_DAMAGED_TAIL: harden_fail_tail(call, obj);
  case HARDEN_WRONG_SIZE: check_fail_size(call, size, obj);
  case HARDEN_WRITE_AFTER_FREE: harden_fail_write_after_free(call, obj);
  }
  abort(); /* no other defect exists */
}

/* ---- realloc and malloc_usable_size of small blocks ------------------------------------------- */

size_t harden_request_size(void *obj, unsigned cls, const char *call) {
  if (freelist_tagged(obj, freelist_key(obj))) check_fail_invalid(call, obj); /* freed: in a quarantine or a list */
  size_t n;
  if (!harden_tail_intact(obj, sizeclass_size[cls], &n)) harden_fail_tail(call, obj);
  return n;
}

/* To n bytes: the new canary is written, exactly [n, its end) (harden_write_tail's vector may
 * start below n, over what are here the program's bytes), and the new record. Nothing else need
 * hold the pattern while the block is live. */
void harden_resize(void *obj, unsigned cls, size_t n) {
  size_t slot = sizeclass_size[cls], record = slot - 8, end = n + HARDEN_CANARY_LEN < record ? n + HARDEN_CANARY_LEN : record;
  memset((char *)obj + n, HARDEN_PATTERN, end - n);
  *harden_last_word(obj, slot) = harden_record(obj, n);
}

/* ---- the quarantine's slow half: its byte bound, trim, thread exit ---------------------------- */

/* Takes block i out of ring r (the last one takes its place), checked. The small ring is no longer
 * full: its next free takes the slow half, which fills it again. */
static void *harden_leave(harden_ring_t *r, uint32_t i, unsigned *cls) {
  void *obj = r->blocks[i];
  *cls = r->classes[i];
  r->count--;
  r->blocks[i] = r->blocks[r->count];
  r->classes[i] = r->classes[r->count];
  r->bytes -= sizeclass_size[*cls];
  r->next = HARDEN_QUARANTINE_SLOTS;
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
  bool small = size <= HARDEN_QUARANTINE_SMALL;
  harden_ring_t *r = small ? &t->small : &t->large;
  void *leaving = NULL;
  if (r->count < HARDEN_QUARANTINE_SLOTS && (small || size <= HARDEN_QUARANTINE_BYTES - r->bytes)) {
    r->blocks[r->count] = obj;
    r->classes[r->count] = (uint8_t)cls;
    r->bytes += size;
    r->count++;
  } else { /* the large ring, full or at its byte bound: a block drawn now leaves */
    uint32_t i = harden_below(t, r->count);
    leaving = harden_ring_replace(r, i, obj, cls, size - sizeclass_size[r->classes[i]], leaving_cls);
  }
  /* The small ring full: its fast path takes over, with the next slot to leave drawn. Until then
   * next stays at the ring's length, which fails the fast path's test: a new thread's ring reads
   * next 0, and with that its second free took the fast path and let its first block leave. */
  if (small) r->next = r->count == HARDEN_QUARANTINE_SLOTS ? harden_below(t, r->count) : HARDEN_QUARANTINE_SLOTS;
  return leaving;
}

void *harden_quarantine_over(unsigned *cls) {
  harden_thread_t *t = &harden_self;
  if (t->large.bytes <= HARDEN_QUARANTINE_BYTES) return NULL;
  return harden_leave(&t->large, harden_below(t, t->large.count), cls);
}

void *harden_quarantine_evict(unsigned *cls) {
  harden_thread_t *t = &harden_self;
  if (t->closed) return NULL;
  harden_ring_t *r = t->small.count > 0 ? &t->small : &t->large;
  if (r->count == 0) return NULL;
  return harden_leave(r, harden_below(t, r->count), cls);
}

void harden_thread_exit(void) {
  harden_thread_t *t = &harden_self;
  t->closed = true;
  harden_ring_t *rings[2] = {&t->small, &t->large};
  for (int k = 0; k < 2; k++) {
    while (rings[k]->count > 0) {
      unsigned cls;
      void *obj = harden_leave(rings[k], rings[k]->count - 1, &cls);
      /* Checked as the exit check below checks: the push that follows writes the tag afresh, and a
       * write after free over it, or over the fill, would otherwise go with the block unseen (the
       * fill until the block's next hand-out). */
      harden_check_free_block(obj, cls, "free()");
      tcache_free_uncached(obj, cls);
    }
  }
}

/* At exit, the blocks still waiting in the exiting thread's quarantine are checked as if they were
 * handed out: a write after free into a block freed in the last few dozen frees is reported,
 * however the program ends (return from main, exit). Other threads' quarantines are out of reach. */
__attribute__((destructor)) static void harden_check_at_exit(void) {
  if (!qm_hardened) return;
  harden_thread_t *t = &harden_self;
  harden_ring_t *rings[2] = {&t->small, &t->large};
  for (int k = 0; k < 2; k++) {
    for (uint32_t i = 0; i < rings[k]->count; i++) {
      void *obj = rings[k]->blocks[i];
      unsigned cls = rings[k]->classes[i];
      if (!harden_leaving_intact(obj)) harden_fail_write_after_free("exit()", obj);
      harden_check_free_block(obj, cls, "exit()");
    }
  }
}

/* ---- new spans: every slot free, in random order --------------------------------------------- */

/* A span with no slot out goes back to the page heap, which may give its pages to the kernel or to
 * another class: a write after free into one of its slots would be lost there, where the slot's
 * next hand-out would have found it. So each slot is checked first as a hand-out checks it, and
 * its tag and link as a pop does (the walk). As many slots as harden_carve filled, once a span. */
void harden_check_emptied_span(const span_t *span) {
  unsigned cls = span->sizeclass;
  if (sizeclass_size[cls] < 16) return; /* (never in this build: untagged links) */
  for (const void *obj = span->u.small.freelist; obj != NULL; obj = freelist_next_checked(obj, "free()"))
    if (!harden_holds_fill(obj, cls)) harden_fail_free_block("free()", obj);
}

void harden_carve(span_t *span, unsigned cls) {
  uint32_t size = sizeclass_size[cls];
  uint32_t n = sizeclass_span_objects[cls];
  if (size <= HARDEN_FILL_END) memset((void *)span->start, HARDEN_PATTERN, (size_t)n * size); /* every byte is fill */
  else
    for (uint32_t i = 0; i < n; i++) harden_fill((void *)(span->start + (uintptr_t)i * size), cls);
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

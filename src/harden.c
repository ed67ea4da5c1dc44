/* The hardened build's checks (libqmalloc-hardened, QM_HARDENED=1; docs/hardening.md): what every
 * small block carries besides the program's bytes, the per-thread quarantine of freed small blocks,
 * the zero-size region, page protection of large blocks, and the randomized carving of new spans.
 * A live small block of request size n in a slot of S bytes (the class of n + HARDEN_TAIL) holds:
 *   [0, n)        the program's bytes,
 *   [n, S - 8)    the canary: at least one byte of HARDEN_PATTERN, checked at free (overflows),
 *   [S - 8, S)    the record: key(obj) ^ ~n, so that free knows n (and a damaged record is seen).
 * A free small block (quarantined, in a list, or never handed out) holds HARDEN_PATTERN from byte 16
 * to byte 16 + HARDEN_FILL_MAX (or its end) and in its last word, checked when it is handed out
 * again (writes after free); bytes 0..16 are the free
 * tag and link (freelist.h), or in quarantine the quarantine tag (word 1 = key ^ HARDEN_QUARANTINED,
 * word 0 = ~key), checked when it leaves.
 * Does not: take any lock of its own, or decide anything in the default build (every caller tests
 * qm_hardened, a constant). Callers: api.c (malloc/free/realloc of the hardened build), central.c
 * (carving), tcache.c (thread exit), pageheap.c (protection of freed large blocks). */
#include <errno.h>
#include <pthread.h>
#include <string.h>

#include "freelist.h"
#include "internal.h"
#include "log.h"
#include "os.h"

/* The pattern of canaries and of freed memory. Not zero (the commonest stray write after free is
 * a NULL stored into a freed structure), and as a word (0xa5a5...a5) not a user-space address, so a
 * freed pointer field read back and followed faults. */
#define HARDEN_PATTERN 0xa5
#define HARDEN_PATTERN_WORD ((uintptr_t)0xa5a5a5a5a5a5a5a5ull)
/* Word 1 of a quarantined block is its key with this bit flipped: not the free tag (so the block
 * is not free for the lists' checks), and still a value only qmalloc writes. */
#define HARDEN_QUARANTINED ((uintptr_t)2)

/* The quarantine: freed small blocks wait in their thread's ring and leave it in random order.
 * 256 blocks: a block is reused only after about 256 further frees of its thread (its chance to
 * leave at each is 1/256), long enough for the common use after free (the freeing function's caller
 * still holds the pointer) to meet the pattern check instead of a new owner, and the next owner of
 * a freed block cannot be predicted by spraying allocations of its size. 1 MiB: the most one
 * thread keeps out of use that way (four of the largest small blocks): peak RSS 1.1 to 1.3x the
 * default build's on mtbench's quick preset (docs/hardening.md). 2.3 KiB of TLS a thread. */
#define HARDEN_QUARANTINE_SLOTS (QM_HARDENED_BUILD ? 256 : 1) /* the default build's threads carry no ring */
#define HARDEN_QUARANTINE_BYTES ((size_t)1 << 20)

typedef struct harden_thread_s {
  void *blocks[HARDEN_QUARANTINE_SLOTS];
  uint8_t classes[HARDEN_QUARANTINE_SLOTS];
  uint32_t count;
  size_t bytes;
  uint64_t rng;  /* xorshift64 state, seeded from the secret and the thread's address */
  bool closed;   /* the thread is exiting: its frees no longer wait */
} harden_thread_t;

static __thread harden_thread_t harden_self __attribute__((tls_model("initial-exec")));

static uint64_t harden_random(void) {
  harden_thread_t *t = &harden_self;
  uint64_t x = t->rng;
  if (x == 0) x = (freelist_secret ^ (uintptr_t)t) * 0x9E3779B97F4A7C15ull | 1;
  x ^= x << 13;
  x ^= x >> 7;
  x ^= x << 17;
  t->rng = x;
  return x;
}

/* A random number below n (n > 0): a multiply and a shift, not a division. */
static uint32_t harden_below(uint32_t n) { return (uint32_t)(((harden_random() >> 32) * n) >> 32); }

/* ---- the one-line errors of the hardened build (check.c's format) ---------------------------- */

static QM_NOINLINE QM_COLD __attribute__((noreturn)) void harden_fail_overflow(const char *call, const void *obj) {
  log_fatal("%s: overflow past the end of the block %p", call, obj);
}

static QM_NOINLINE QM_COLD __attribute__((noreturn)) void harden_fail_underflow(const char *call, const void *obj) {
  log_fatal("%s: underflow (the bytes before the block were overwritten) %p", call, obj);
}

static QM_NOINLINE QM_COLD __attribute__((noreturn)) void harden_fail_write_after_free(const char *call, const void *obj) {
  log_fatal("%s: write after free %p", call, obj);
}

/* ---- small blocks: record, canary, pattern --------------------------------------------------- */

static uintptr_t *harden_record_at(void *obj, unsigned cls) {
  return (uintptr_t *)((char *)obj + sizeclass_size[cls] - sizeof(uintptr_t));
}

static const unsigned char harden_pattern_block[4096] = {[0 ... 4095] = HARDEN_PATTERN};

/* Whether [from, to) of obj is all HARDEN_PATTERN. The whole words are OR-ed together without an
 * early exit and without memcpy (a library call under -fno-builtin: 40% of a hardened malloc-test
 * run under callgrind), in four independent chains; runs of 256 bytes and more by memcmp (the
 * check runs on every malloc: an 8 KiB block took 3300 instructions in the word loop). */
static bool harden_is_pattern(const void *obj, size_t from, size_t to) {
  const unsigned char *p = (const unsigned char *)obj;
  for (; from < to && (from & 7) != 0; from++)
    if (p[from] != HARDEN_PATTERN) return false;
  /* Long runs: the C library's memcmp (vectorized) against a block of the pattern. */
  for (; to - from >= sizeof harden_pattern_block; from += sizeof harden_pattern_block)
    if (memcmp(p + from, harden_pattern_block, sizeof harden_pattern_block) != 0) return false;
  if (to - from >= 256) return memcmp(p + from, harden_pattern_block, to - from) == 0;
  const uint64_t *w = (const uint64_t *)(const void *)(p + from);
  size_t words = (to - from) / 8;
  uint64_t diff = 0;
  size_t i = 0;
  for (uint64_t d1 = 0, d2 = 0, d3 = 0; ; i += 4) { /* four chains: one word a cycle */
    if (i + 4 > words) {
      diff |= d1 | d2 | d3;
      break;
    }
    diff |= w[i] ^ HARDEN_PATTERN_WORD;
    d1 |= w[i + 1] ^ HARDEN_PATTERN_WORD;
    d2 |= w[i + 2] ^ HARDEN_PATTERN_WORD;
    d3 |= w[i + 3] ^ HARDEN_PATTERN_WORD;
  }
  for (; i < words; i++) diff |= w[i] ^ HARDEN_PATTERN_WORD;
  if (diff != 0) return false;
  for (from += words * 8; from < to; from++)
    if (p[from] != HARDEN_PATTERN) return false;
  return true;
}

/* A free block holds the pattern in its first HARDEN_FILL_MAX bytes past the free tag and in its
 * last word, not all through: the writes after free that matter most hit the first fields of a
 * structure, and filling and checking whole blocks made the hardened build 4 to 50 times slower than
 * the default one on mtbench's quick preset (docs/hardening.md). */
#define HARDEN_FILL_MAX 256

static size_t harden_fill_end(size_t slot) {
  size_t end = slot - sizeof(uintptr_t);
  return end > 16 + HARDEN_FILL_MAX ? 16 + HARDEN_FILL_MAX : end;
}

static void harden_fill(void *obj, size_t slot) {
  if (slot <= 16) return; /* the tag and link are all there is */
  memset((char *)obj + 16, HARDEN_PATTERN, harden_fill_end(slot) - 16);
  __atomic_store_n((uintptr_t *)((char *)obj + slot - sizeof(uintptr_t)), HARDEN_PATTERN_WORD, __ATOMIC_RELAXED); /* one store */
}

static bool harden_holds_fill(const void *obj, size_t slot) {
  if (slot <= 16) return true;
  return harden_is_pattern(obj, 16, harden_fill_end(slot)) &&
         *(const uintptr_t *)(const void *)((const char *)obj + slot - sizeof(uintptr_t)) == HARDEN_PATTERN_WORD;
}

/* The canary runs from the request's end for at most HARDEN_CANARY_MAX bytes (to the record if
 * nearer): an overflow that starts at the end of the block runs through it whatever its length, and
 * the slack of the large classes (up to 8 KiB past a 32 KiB request) need not be written and read
 * on every call (5200 instructions a pair at 32 KiB before). */
#define HARDEN_CANARY_MAX 64

static size_t harden_canary_end(size_t n, size_t record) {
  return record - n > HARDEN_CANARY_MAX ? n + HARDEN_CANARY_MAX : record;
}

static bool harden_quarantined(const void *obj) {
  return __atomic_load_n(&((const uintptr_t *)obj)[1], __ATOMIC_RELAXED) == (freelist_key(obj) ^ HARDEN_QUARANTINED);
}

void *harden_handout(void *obj, unsigned cls, size_t n) {
  size_t slot = sizeclass_size[cls], record = slot - sizeof(uintptr_t);
  if (!harden_holds_fill(obj, slot)) harden_fail_write_after_free("malloc()", obj);
  /* The canary: its first bytes may lie in the two words the free tag and link used, its last past
   * the filled part. */
  size_t canary_end = harden_canary_end(n, record);
  if (n < 16) memset((char *)obj + n, HARDEN_PATTERN, (canary_end < 16 ? canary_end : 16) - n);
  size_t from = n > harden_fill_end(slot) ? n : harden_fill_end(slot);
  if (from < canary_end) memset((char *)obj + from, HARDEN_PATTERN, canary_end - from);
  __atomic_store_n(harden_record_at(obj, cls), freelist_key(obj) ^ ~(uintptr_t)n, __ATOMIC_RELAXED);
  return obj;
}

size_t harden_request_size(void *obj, unsigned cls, const char *call) {
  if (harden_quarantined(obj)) check_fail_invalid(call, obj); /* freed: it waits in a quarantine */
  size_t slot = sizeclass_size[cls], record = slot - sizeof(uintptr_t);
  size_t n = ~(*harden_record_at(obj, cls) ^ freelist_key(obj));
  if (n >= record || !harden_is_pattern(obj, n, harden_canary_end(n, record))) harden_fail_overflow(call, obj);
  return n;
}

void harden_resize(void *obj, unsigned cls, size_t n) {
  size_t record = sizeclass_size[cls] - sizeof(uintptr_t);
  memset((char *)obj + n, HARDEN_PATTERN, harden_canary_end(n, record) - n);
  __atomic_store_n(harden_record_at(obj, cls), freelist_key(obj) ^ ~(uintptr_t)n, __ATOMIC_RELAXED);
}

/* The last word of the slot before obj (obj not its span's first): a valid record (that block is
 * live), the pattern (free, of 32 bytes or more), or for 16-byte slots the free or quarantine tag
 * or 0 (the moment between a pop and the record's store). Anything else: an underflow of obj (or
 * an overflow of the block before that reached its record). */
static void harden_check_before(void *obj, unsigned cls, const char *call) {
  uintptr_t addr = (uintptr_t)obj;
  pagemap_leaf_t *leaf = pagemap_leaf_of(addr);
  uintptr_t entry = leaf->small[(addr >> PAGE_SHIFT) & (PAGEMAP_LEAF_LEN - 1)];
  uintptr_t span_start = pagemap_entry_span_start(entry);
  size_t slot = sizeclass_size[cls];
  if (addr == span_start) return;
  void *before = (void *)(addr - slot);
  uintptr_t w = __atomic_load_n(harden_record_at(before, cls), __ATOMIC_RELAXED), key = freelist_key(before);
  if (w == HARDEN_PATTERN_WORD && slot > 16) return;
  if (~(w ^ key) < slot - sizeof(uintptr_t)) return;
  if (slot == 16 && (w == key || w == (key ^ HARDEN_QUARANTINED) || w == 0)) return;
  harden_fail_underflow(call, obj);
}

void harden_retire(void *obj, unsigned cls, bool sized, size_t size, const char *call) {
  uintptr_t *words = (uintptr_t *)obj, key = freelist_key(obj);
  uintptr_t word1 = __atomic_load_n(&words[1], __ATOMIC_RELAXED);
  if (word1 == (key ^ HARDEN_QUARANTINED)) check_fail_double_free(call, obj);
  size_t n = harden_request_size(obj, cls, call);
  harden_check_before(obj, cls, call);
  if (sized && size != n) check_fail_size(call, size, obj);
  /* Claimed with a compare-and-swap: of two threads freeing it at once, one finds it taken. */
  if (!__atomic_compare_exchange_n(&words[1], &word1, key ^ HARDEN_QUARANTINED, false, __ATOMIC_ACQ_REL, __ATOMIC_RELAXED))
    check_fail_double_free(call, obj);
  harden_fill(obj, sizeclass_size[cls]);
  words[0] = ~key;
}

/* ---- the quarantine ---------------------------------------------------------------------------- */

/* A block leaving the quarantine: its tag words must be as its free left them. */
static void *harden_leave(uint32_t i, unsigned *cls) {
  harden_thread_t *t = &harden_self;
  void *obj = t->blocks[i];
  *cls = t->classes[i];
  t->count--;
  t->blocks[i] = t->blocks[t->count];
  t->classes[i] = t->classes[t->count];
  t->bytes -= sizeclass_size[*cls];
  uintptr_t key = freelist_key(obj);
  if (((uintptr_t *)obj)[0] != ~key || !harden_quarantined(obj)) harden_fail_write_after_free("free()", obj);
  return obj;
}

void *harden_quarantine_evict(size_t incoming, unsigned *cls) {
  harden_thread_t *t = &harden_self;
  if (t->closed || t->count == 0) return NULL;
  if (t->count < HARDEN_QUARANTINE_SLOTS && incoming <= HARDEN_QUARANTINE_BYTES - t->bytes) return NULL;
  return harden_leave(harden_below(t->count), cls);
}

bool harden_quarantine_put(void *obj, unsigned cls) {
  harden_thread_t *t = &harden_self;
  if (t->closed) return false;
  t->blocks[t->count] = obj;
  t->classes[t->count] = (uint8_t)cls;
  t->count++;
  t->bytes += sizeclass_size[cls];
  return true;
}

void harden_thread_exit(void) {
  harden_thread_t *t = &harden_self;
  t->closed = true;
  while (t->count > 0) {
    unsigned cls;
    void *obj = harden_leave(t->count - 1, &cls);
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
  if (size <= 16 + HARDEN_FILL_MAX + sizeof(uintptr_t)) memset((void *)span->start, HARDEN_PATTERN, (size_t)n * size);
  else
    for (uint32_t i = 0; i < n; i++) harden_fill((void *)(span->start + (uintptr_t)i * size), size);
  uint16_t order[1024]; /* the most objects a span holds (sizeclass_table.h) */
  if (size < 16 || n > 1024) { /* never in this build: the 8-byte class serves no request here */
    for (uint32_t i = 0; i < n; i++) *(void **)(span->start + (uintptr_t)i * size) = i + 1 < n ? (void *)(span->start + (uintptr_t)(i + 1) * size) : NULL;
    span->u.small.freelist = (void *)span->start;
    return;
  }
  for (uint32_t i = 0; i < n; i++) order[i] = (uint16_t)i;
  for (uint32_t i = n - 1; i > 0; i--) { /* Fisher-Yates */
    uint32_t j = harden_below(i + 1);
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

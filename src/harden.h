/* The hardened build's thread-cache path (libqmalloc-hardened, QM_HARDENED=1; docs/hardening.md):
 * the checks every hardened malloc and free makes, inline, so that the common case stays on the
 * thread cache with no lock, no atomic read-modify-write and no call: the block's layout (pattern,
 * canary, record), the hand-out's and the free's checks, and the per-thread quarantine.
 * A live small block of request size n in a slot of S bytes (the class of n + HARDEN_TAIL) holds:
 *   [0, n)        the program's bytes,
 *   [n, S - 8)    the canary: HARDEN_PATTERN for at least 1 and at most HARDEN_CANARY_MAX bytes,
 *                 checked at free (overflows); the bytes up to harden_fill_end(S) hold it too,
 *   [S - 8, S)    the record: harden_record(obj, n), so that free knows n (and a damaged record
 *                 is seen).
 * A free small block (quarantined, in a list, or never handed out) holds HARDEN_PATTERN from byte 16
 * to harden_fill_end(S) (all of it up to 272 bytes) and in its last word, checked when it is handed
 * out again (writes after free); bytes 0..16 are the free tag and link (freelist.h), or in
 * quarantine the quarantine tag (word 1 = key ^ HARDEN_QUARANTINED, word 0 = ~key), checked when it
 * leaves.
 * Does not: decide anything in the default build (its callers test qm_hardened, a constant), reach
 * the thread cache's lists (api.c pops and pushes), or handle large, zero-size or foreign pointers
 * (api.c's slow halves, harden.c). Callers: api.c (malloc_hardened, free_hardened and the slow
 * halves), harden.c (thread exit, the exit check, carving, realloc). */
#ifndef QM_HARDEN_H
#define QM_HARDEN_H

#include <stdbool.h>
#include <stdint.h>

#include "freelist.h"
#include "internal.h"

/* The pattern of canaries and of freed memory. Not zero (the commonest stray write after free is
 * a NULL stored into a freed structure), and as a word (0xa5a5...a5) not a user-space address, so a
 * freed pointer field read back and followed faults. */
#define HARDEN_PATTERN 0xa5
#define HARDEN_PATTERN_WORD ((uint64_t)0xa5a5a5a5a5a5a5a5ull)
/* Word 1 of a quarantined block is its key with this bit flipped: not the free tag (so the block
 * is not free for the lists' checks), and still a value only qmalloc writes. */
#define HARDEN_QUARANTINED ((uintptr_t)2)
/* A live block's record: key(obj) ^ ~n with its top byte flipped back, so that the record's top
 * byte is the key's, whose bit 7 is set (the secret's bit 63): a 1-byte underflow of the next
 * block, which lands there, is always seen when it writes text or a zero (0x00-0x7f), and misses
 * with odds 1 in 128 otherwise. (With ~n that byte had bit 7 clear, and a written 'x' matched it
 * in 1 process in 128.) Never the free tag, the quarantine tag or 0, for any n below 2^56. */
#define HARDEN_RECORD_TOP ((uintptr_t)0xff << 56)
QM_INLINE uint64_t harden_record(const void *obj, size_t n) { return freelist_key(obj) ^ ~(uintptr_t)n ^ HARDEN_RECORD_TOP; }
/* The request size a record w of obj names (huge if w is not a record). */
QM_INLINE size_t harden_record_size(const void *obj, uint64_t w) { return ~(w ^ freelist_key(obj) ^ HARDEN_RECORD_TOP); }
/* A free block holds the pattern from byte 16 to byte 16 + HARDEN_FILL_MAX (or its end), and in its
 * last word: the writes after free that matter most hit the first fields of a structure, and
 * filling and checking whole blocks made the hardened build 4 to 50 times slower than the default
 * one on mtbench's quick preset (docs/hardening.md). */
#define HARDEN_FILL_MAX 256
_Static_assert(HARDEN_FILL_MAX % 32 == 0, "the fill's check goes two vectors at a time");
/* The canary runs from the request's end for at most HARDEN_CANARY_MAX bytes (to the record if
 * nearer): an overflow that starts at the end of the block runs through it whatever its length. */
#define HARDEN_CANARY_MAX 64

/* The quarantine: freed small blocks wait in their thread's ring and leave it in random order.
 * 256 blocks: a block is reused only after about 256 further frees of its thread (its chance to
 * leave at each is 1/256), long enough for the common use after free (the freeing function's caller
 * still holds the pointer) to meet the pattern check instead of a new owner, and the next owner of
 * a freed block cannot be predicted by spraying allocations of its size. 1 MiB: the most one
 * thread keeps out of use that way (four of the largest small blocks). 2.3 KiB of TLS a thread. */
#define HARDEN_QUARANTINE_SLOTS (QM_HARDENED_BUILD ? 256 : 1) /* the default build's threads carry no ring */
#define HARDEN_QUARANTINE_BYTES ((size_t)1 << 20)

typedef struct harden_thread_s {
  void *blocks[HARDEN_QUARANTINE_SLOTS];
  uint8_t classes[HARDEN_QUARANTINE_SLOTS];
  uint32_t count;
  uint32_t next; /* once the ring is full: the slot whose block leaves at the next free, drawn (and
                  * its block prefetched) one free ahead, so that the leaving block's check and its
                  * reuse by the next malloc do not wait for the cache miss */
  size_t bytes;
  uint64_t rng;  /* xorshift64 state, seeded from the secret and the thread's address */
  bool closed;   /* the thread is exiting: its frees no longer wait */
} harden_thread_t;

extern __thread harden_thread_t harden_self __attribute__((tls_model("initial-exec"), visibility("hidden")));

/* The one-line errors of the hardened build (check.c's format), in harden.c. */
__attribute__((noreturn)) QM_COLD void harden_fail_overflow(const char *call, const void *obj);
__attribute__((noreturn)) QM_COLD void harden_fail_underflow(const char *call, const void *obj);
__attribute__((noreturn)) QM_COLD void harden_fail_write_after_free(const char *call, const void *obj);

/* 16 bytes of the pattern: the fill and its check go 16 bytes at a time (SSE2 on x86-64, NEON on
 * aarch64: the baseline of both), with no call (memset and memcmp are library calls under
 * -fno-builtin; they took a quarter of a hardened malloc-test run). */
typedef uint64_t harden_vec_t __attribute__((vector_size(16), may_alias));
typedef uint64_t harden_word_t __attribute__((aligned(1), may_alias)); /* an unaligned word */
#define HARDEN_PATTERN_VEC ((harden_vec_t){HARDEN_PATTERN_WORD, HARDEN_PATTERN_WORD})
typedef uint64_t harden_uvec_t __attribute__((vector_size(16), aligned(1), may_alias)); /* unaligned */
QM_INLINE harden_vec_t harden_load_vec(const void *at) { return *(const harden_uvec_t *)at; }

/* The end of the filled part of a free block of `slot` bytes: a multiple of 16 (the vectors), the
 * whole slot up to 16 + HARDEN_FILL_MAX. Past it only the last word is filled. */
QM_INLINE size_t harden_fill_end(size_t slot) { return slot < 16 + HARDEN_FILL_MAX ? slot : 16 + HARDEN_FILL_MAX; }

QM_INLINE uint64_t *harden_last_word(void *obj, size_t slot) { return (uint64_t *)(void *)((char *)obj + slot - 8); }

/* Fills [16, end) of obj (end a multiple of 16, at most 16 + HARDEN_FILL_MAX) with the pattern. */
QM_INLINE void harden_fill_to(void *obj, size_t end) {
  harden_vec_t *v = (harden_vec_t *)(void *)((char *)obj + 16);
  if (end == 16 + HARDEN_FILL_MAX) { /* slots of 272 bytes and more: no jump */
#pragma GCC unroll 16
    for (size_t i = 0; i < HARDEN_FILL_MAX / 16; i++) v[i] = HARDEN_PATTERN_VEC;
    return;
  }
  switch ((end - 16) / 16) { /* one jump into straight-line stores, not a loop */
    case 16: v[15] = HARDEN_PATTERN_VEC; __attribute__((fallthrough));
    case 15: v[14] = HARDEN_PATTERN_VEC; __attribute__((fallthrough));
    case 14: v[13] = HARDEN_PATTERN_VEC; __attribute__((fallthrough));
    case 13: v[12] = HARDEN_PATTERN_VEC; __attribute__((fallthrough));
    case 12: v[11] = HARDEN_PATTERN_VEC; __attribute__((fallthrough));
    case 11: v[10] = HARDEN_PATTERN_VEC; __attribute__((fallthrough));
    case 10: v[9] = HARDEN_PATTERN_VEC; __attribute__((fallthrough));
    case 9: v[8] = HARDEN_PATTERN_VEC; __attribute__((fallthrough));
    case 8: v[7] = HARDEN_PATTERN_VEC; __attribute__((fallthrough));
    case 7: v[6] = HARDEN_PATTERN_VEC; __attribute__((fallthrough));
    case 6: v[5] = HARDEN_PATTERN_VEC; __attribute__((fallthrough));
    case 5: v[4] = HARDEN_PATTERN_VEC; __attribute__((fallthrough));
    case 4: v[3] = HARDEN_PATTERN_VEC; __attribute__((fallthrough));
    case 3: v[2] = HARDEN_PATTERN_VEC; __attribute__((fallthrough));
    case 2: v[1] = HARDEN_PATTERN_VEC; __attribute__((fallthrough));
    case 1: v[0] = HARDEN_PATTERN_VEC; __attribute__((fallthrough));
    default: break;
  }
}

/* A freed block's fill: [16, fill end) and its last word. (Slots of 16 bytes are all tag.) */
QM_INLINE void harden_fill(void *obj, size_t slot) {
  if (slot <= 16) return;
  harden_fill_to(obj, harden_fill_end(slot));
  *harden_last_word(obj, slot) = HARDEN_PATTERN_WORD;
}

/* Whether obj's fill is intact: [16, fill end) and its last word all pattern. The vectors are
 * OR-ed together without an early exit, in two chains. */
QM_INLINE bool harden_holds_fill(const void *obj, size_t slot) {
  if (slot <= 16) return true;
  const harden_vec_t *v = (const harden_vec_t *)(const void *)((const char *)obj + 16);
  harden_vec_t a = {0, 0}, b = {0, 0};
  size_t k = (harden_fill_end(slot) - 16) / 16;
  if (k == HARDEN_FILL_MAX / 16) { /* slots of 272 bytes and more: no jump */
#pragma GCC unroll 8
    for (size_t i = 0; i < HARDEN_FILL_MAX / 16; i += 2) {
      a |= v[i] ^ HARDEN_PATTERN_VEC;
      b |= v[i + 1] ^ HARDEN_PATTERN_VEC;
    }
    k = 0;
  }
  switch (k) { /* one jump into straight-line code, not a loop */
    case 16: b |= v[15] ^ HARDEN_PATTERN_VEC; __attribute__((fallthrough));
    case 15: a |= v[14] ^ HARDEN_PATTERN_VEC; __attribute__((fallthrough));
    case 14: b |= v[13] ^ HARDEN_PATTERN_VEC; __attribute__((fallthrough));
    case 13: a |= v[12] ^ HARDEN_PATTERN_VEC; __attribute__((fallthrough));
    case 12: b |= v[11] ^ HARDEN_PATTERN_VEC; __attribute__((fallthrough));
    case 11: a |= v[10] ^ HARDEN_PATTERN_VEC; __attribute__((fallthrough));
    case 10: b |= v[9] ^ HARDEN_PATTERN_VEC; __attribute__((fallthrough));
    case 9: a |= v[8] ^ HARDEN_PATTERN_VEC; __attribute__((fallthrough));
    case 8: b |= v[7] ^ HARDEN_PATTERN_VEC; __attribute__((fallthrough));
    case 7: a |= v[6] ^ HARDEN_PATTERN_VEC; __attribute__((fallthrough));
    case 6: b |= v[5] ^ HARDEN_PATTERN_VEC; __attribute__((fallthrough));
    case 5: a |= v[4] ^ HARDEN_PATTERN_VEC; __attribute__((fallthrough));
    case 4: b |= v[3] ^ HARDEN_PATTERN_VEC; __attribute__((fallthrough));
    case 3: a |= v[2] ^ HARDEN_PATTERN_VEC; __attribute__((fallthrough));
    case 2: b |= v[1] ^ HARDEN_PATTERN_VEC; __attribute__((fallthrough));
    case 1: a |= v[0] ^ HARDEN_PATTERN_VEC; __attribute__((fallthrough));
    default: break;
  }
  a |= b;
  uint64_t last = *(const uint64_t *)(const void *)((const char *)obj + slot - 8);
  return ((a[0] | a[1]) | (last ^ HARDEN_PATTERN_WORD)) == 0;
}

QM_INLINE size_t harden_canary_end(size_t n, size_t record) {
  return record - n > HARDEN_CANARY_MAX ? n + HARDEN_CANARY_MAX : record;
}

/* Whether the canary [n, end) (1 to 64 bytes, end >= 8) holds the pattern, straight-line: from 16
 * bytes on, four unaligned vectors from n to end (overlapping where it is shorter than 64); below,
 * two words, the last one ending at `end` (below n, the program's bytes are masked off). */
QM_INLINE bool harden_canary_intact(const void *obj, size_t n, size_t end) {
  const char *p = (const char *)obj;
  size_t len = end - n;
  if (len >= 16) {
    size_t last = end - 16, at1 = n + 16 < last ? n + 16 : last, at2 = n + 32 < last ? n + 32 : last;
    harden_vec_t a = harden_load_vec(p + n) ^ HARDEN_PATTERN_VEC, b = harden_load_vec(p + at1) ^ HARDEN_PATTERN_VEC;
    a |= harden_load_vec(p + at2) ^ HARDEN_PATTERN_VEC;
    b |= harden_load_vec(p + last) ^ HARDEN_PATTERN_VEC;
    a |= b;
    return (a[0] | a[1]) == 0;
  }
  uint64_t first = len > 8 ? *(const harden_word_t *)(const void *)(p + n) ^ HARDEN_PATTERN_WORD : 0;
  uint64_t mask = len >= 8 ? ~(uint64_t)0 : ~(uint64_t)0 << (8 * (8 - len)); /* little-endian: n's byte and up */
  return (first | ((*(const harden_word_t *)(const void *)(p + end - 8) ^ HARDEN_PATTERN_WORD) & mask)) == 0;
}

/* Writes the canary and the record of obj for a request of n bytes, where [16, fill end) already
 * holds the pattern: only the canary's part in the tag words (n < 16) or past the fill end needs
 * writing. Bytes below n may be written too: they are the new owner's, not yet its data. */
QM_INLINE void harden_write_tail(void *obj, size_t slot, size_t n) {
  size_t record = slot - 8, end = harden_canary_end(n, record);
  uint64_t *w = (uint64_t *)obj;
  if (n < 16) {
    w[0] = HARDEN_PATTERN_WORD;
    if (slot > 16) w[1] = HARDEN_PATTERN_WORD; /* in 16-byte slots word 1 is the record */
  }
  if (end > harden_fill_end(slot)) { /* slots past 272 bytes only: end - 64 >= 208 */
    harden_uvec_t *c = (harden_uvec_t *)(void *)((char *)obj + end - HARDEN_CANARY_MAX);
#pragma GCC unroll 4
    for (size_t i = 0; i < HARDEN_CANARY_MAX / 16; i++) c[i] = HARDEN_PATTERN_VEC;
  }
  /* one store: another thread's underflow check may read it (harden_check_before) */
  __atomic_store_n(harden_last_word(obj, slot), harden_record(obj, n), __ATOMIC_RELAXED);
}

/* Hands out obj (just popped, of class cls) for a request of n bytes: its fill must be intact
 * (else "malloc(): write after free"), then canary and record. */
QM_INLINE void *harden_handout(void *obj, unsigned cls, size_t n) {
  size_t slot = sizeclass_size[cls];
  if (QM_UNLIKELY(!harden_holds_fill(obj, slot))) harden_fail_write_after_free("malloc()", obj);
  harden_write_tail(obj, slot, n);
  return obj;
}

/* The request size of live obj (slot bytes), read from its record, with its canary checked (else
 * "<call>: overflow past the end of the block"). */
QM_INLINE size_t harden_live_size(const void *obj, size_t slot, const char *call) {
  size_t record = slot - 8;
  size_t n = harden_record_size(obj, *(const uint64_t *)(const void *)((const char *)obj + record));
  if (QM_UNLIKELY(n >= record || !harden_canary_intact(obj, n, harden_canary_end(n, record)))) harden_fail_overflow(call, obj);
  return n;
}

/* The last word of the slot before obj (span_start: the first slot of obj's span): a valid record
 * (that block is live), the pattern (free, of 32 bytes or more), or for 16-byte slots the free or
 * quarantine tag or 0 (the moment between a pop and the record's store). Anything else: an
 * underflow of obj (or an overflow of the block before that reached its record). */
QM_INLINE void harden_check_before(void *obj, size_t slot, uintptr_t span_start, const char *call) {
  uintptr_t addr = (uintptr_t)obj;
  if (addr == span_start) return;
  void *before = (void *)(addr - slot);
  uintptr_t w = __atomic_load_n(harden_last_word(before, slot), __ATOMIC_RELAXED), key = freelist_key(before);
  if (QM_LIKELY(w == HARDEN_PATTERN_WORD && slot > 16)) return;
  if (QM_LIKELY(harden_record_size(before, w) < slot - 8)) return;
  if (slot == 16 && (w == key || w == (key ^ HARDEN_QUARANTINED) || w == 0)) return;
  harden_fail_underflow(call, obj);
}

/* The free of small block obj of class cls (span_start: its span's first slot): not free already
 * (in a list: the free tag; in a quarantine: the quarantine tag), its record and canary intact,
 * the slot before it sane, the size of a sized free its request size. Then it is marked
 * quarantined and filled. Plain loads and stores: two threads freeing one block at the same
 * instant may both pass, and the second of them to let it leave its quarantine finds the tag
 * changed ("free(): write after free") or its free tag (a double free) when it pushes it. */
QM_INLINE void harden_retire(void *obj, unsigned cls, uintptr_t span_start, bool sized, size_t size, const char *call) {
  uintptr_t *words = (uintptr_t *)obj, key = freelist_key(obj);
  uintptr_t word1 = words[1];
  if (QM_UNLIKELY(word1 == key || word1 == (key ^ HARDEN_QUARANTINED))) check_fail_double_free(call, obj);
  size_t slot = sizeclass_size[cls];
  size_t n = harden_live_size(obj, slot, call);
  harden_check_before(obj, slot, span_start, call);
  if (QM_UNLIKELY(sized && size != n)) check_fail_size(call, size, obj);
  words[1] = key ^ HARDEN_QUARANTINED;
  words[0] = ~key;
  if (slot <= 16) return;
  /* Past the program's bytes the fill is intact (the canary was just checked; the rest was checked
   * at the hand-out and the program had no business there): only [16, n) is filled again, rounded
   * up to the vectors, and the last word (the record). */
  size_t fill_end = harden_fill_end(slot), to = n < fill_end ? (n + 15) & ~(size_t)15 : fill_end;
  if (to < 16) to = 16; /* n = 0: aligned_alloc(64, 0) */
  harden_fill_to(obj, to);
  *harden_last_word(obj, slot) = HARDEN_PATTERN_WORD;
}

/* xorshift64, seeded on first use from the secret and the thread's address. */
QM_INLINE uint64_t harden_random(harden_thread_t *t) {
  uint64_t x = t->rng;
  if (QM_UNLIKELY(x == 0)) x = (freelist_secret ^ (uintptr_t)t) * 0x9E3779B97F4A7C15ull | 1;
  x ^= x << 13;
  x ^= x >> 7;
  x ^= x << 17;
  t->rng = x;
  return x;
}

/* A random number below n (n > 0): a multiply and a shift, not a division. */
QM_INLINE uint32_t harden_below(harden_thread_t *t, uint32_t n) { return (uint32_t)(((harden_random(t) >> 32) * n) >> 32); }

/* A block leaving the quarantine: its tag words must be as its free left them (else
 * "free(): write after free"). */
QM_INLINE void harden_check_leaving(void *obj) {
  uintptr_t key = freelist_key(obj);
  if (QM_UNLIKELY(((uintptr_t *)obj)[0] != ~key || ((uintptr_t *)obj)[1] != (key ^ HARDEN_QUARANTINED)))
    harden_fail_write_after_free("free()", obj);
}

/* Puts retired obj in this thread's quarantine. Once the ring is full (256 blocks, or 1 MiB), the
 * block in a slot drawn at random leaves it and obj takes its place: returned, with *leaving_cls,
 * for the caller to push on a free list (NULL while the ring fills). The slot is drawn one free
 * ahead, and its block's lines prefetched, so that the check of the leaving block and its reuse by
 * the next malloc do not wait for a cache miss. Returns obj itself once the thread is exiting (no
 * ring any more: push it now). The ring may end over its byte bound (a larger block took a smaller
 * one's place): the caller then calls harden_quarantine_over until it is not. */
QM_INLINE void *harden_quarantine_swap(void *obj, unsigned cls, unsigned *leaving_cls) {
  harden_thread_t *t = &harden_self;
  size_t size = sizeclass_size[cls];
  if (QM_UNLIKELY(t->closed)) {
    *leaving_cls = cls;
    return obj;
  }
  if (t->count < HARDEN_QUARANTINE_SLOTS && size <= HARDEN_QUARANTINE_BYTES - t->bytes) {
    t->blocks[t->count] = obj;
    t->classes[t->count] = (uint8_t)cls;
    t->bytes += size;
    t->count++;
    t->next = HARDEN_QUARANTINE_SLOTS; /* none drawn yet */
    return NULL;
  }
  uint32_t i = t->next < t->count ? t->next : harden_below(t, t->count);
  void *leaving = t->blocks[i];
  unsigned lcls = t->classes[i];
  t->blocks[i] = obj;
  t->classes[i] = (uint8_t)cls;
  t->bytes += size - sizeclass_size[lcls];
  harden_check_leaving(leaving);
  *leaving_cls = lcls;
  /* The next one to leave (obj itself, 1 time in count), and the line of its tag words.
   * (Prefetching all the lines the hand-out reads, or only the first, measured the same on
   * malloc-test at 512 bytes and worse at 8 KiB.) */
  t->next = harden_below(t, t->count);
  const char *ahead = (const char *)t->blocks[t->next];
  __builtin_prefetch(ahead); /* its first line; the hand-out's check streams through the rest */
  return leaving;
}

/* Whether the quarantine holds more than its byte bound (after harden_quarantine_swap). */
QM_INLINE bool harden_quarantine_is_over(void) { return harden_self.bytes > HARDEN_QUARANTINE_BYTES; }

/* A block, chosen at random, that leaves the quarantine to bring it back under its byte bound
 * (checked), with *cls; NULL when it is not over. (harden.c) */
void *harden_quarantine_over(unsigned *cls);

/* For malloc_trim: every block of the quarantine, one at a time, chosen at random (checked), with
 * *cls; NULL when it is empty or the thread is exiting. (harden.c) */
void *harden_quarantine_evict(unsigned *cls);

#endif

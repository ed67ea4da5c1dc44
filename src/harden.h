/* The hardened build's thread-cache path (libqmalloc-hardened, QM_HARDENED=1; docs/hardening.md):
 * the checks every hardened malloc and free makes, inline, so that the common case stays on the
 * thread cache with no lock, no atomic read-modify-write and no call: the block's layout (pattern,
 * canary, record), the hand-out's and the free's checks, and the per-thread quarantine.
 * A live small block of request size n in a slot of S bytes (the class of n + HARDEN_TAIL) holds:
 *   [0, n)        the program's bytes,
 *   [n, S - 8)    its first HARDEN_CANARY_LEN bytes (all of them if fewer; none if n = S - 8): the
 *                 canary, HARDEN_PATTERN, checked at free (overflows); the rest is not looked at,
 *   [S - 8, S)    the record: harden_record(obj, n), so that free knows n (and a damaged record
 *                 is seen: it names a size past the record, or one whose canary bytes are the
 *                 program's, not the pattern; so with n = S - 8 the record is the canary).
 *                 It is also the guard before the next slot: an underflow of the block there
 *                 overwrites it from its top byte down, which this block's own checks find.
 * A free small block (quarantined, in a list, or never handed out) holds HARDEN_PATTERN in bytes 16
 * to HARDEN_FILL_END (to its end if smaller) and in its last word, checked when it is handed out
 * again (writes after free, and the next block's underflows); bytes 0..16 are the free tag (word 1
 * = key, freelist.h) and the link, or in quarantine the free tag in both words, checked when it
 * leaves (word 0; the tag by the pop that hands it out, as any free block's).
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
/* A live block's record: key(obj) ^ (n << 8). Its low byte and its top byte then hold no bit of n,
 * so that a write over the low byte (an overflow past a request that reaches the record:
 * HARDEN_TAIL, no canary bytes then) or over the top byte (a 1-byte underflow of the next block)
 * makes the record name a huge size, whatever the byte written. (With n in the low bits, a changed
 * low byte named another small size, and only that size's canary, over the program's own bytes,
 * could tell.) The top byte is the key's, whose bit 7 is set (the secret's bit 63), so a record is
 * never 0; nor the free tag (the key) but for n = 0, which only an aligned request of 0 bytes
 * makes, in a slot of 32 bytes or more, where the record is not word 1. (It was
 * key ^ ~(n << 8) with the top byte flipped back: the same properties for n > 0, and a 10-byte
 * constant loaded at every hand-out and free: 5 instructions a pair, make fastpath.) */
QM_INLINE uint64_t harden_record(const void *obj, size_t n) { return freelist_key(obj) ^ ((uint64_t)n << 8); }
/* The request size a record w of obj names: huge if w is not a record, at most S - 8 if it is. A
 * rotate, not a shift: a low byte that is not 0 comes out as the top byte. */
QM_INLINE size_t harden_record_size_keyed(uintptr_t key, uint64_t w) {
  uint64_t v = w ^ key;
  return (v >> 8) | (v << 56);
}
QM_INLINE size_t harden_record_size(const void *obj, uint64_t w) { return harden_record_size_keyed(freelist_key(obj), w); }
/* A free block holds the pattern in bytes [16, HARDEN_FILL_END) (its first 64 bytes past the free
 * tag's two words) and in its last word. The writes after free that matter most hit the first
 * fields of a structure (and a freed pointer field there reads back as a non-canonical address);
 * filling and checking whole blocks made the hardened build 4 to 50 times slower than the default
 * one, and 256 bytes about 2 times on mtbench's quick preset: three 16-byte vectors, stored at free
 * and checked at the hand-out, are what is left (docs/hardening.md, Cost). */
#define HARDEN_FILL_END 64
/* The canary runs from the request's end for HARDEN_CANARY_LEN bytes (to the record if nearer: at
 * least 1 byte): an overflow that starts at the end of the block runs through it whatever its
 * length, and one 16-byte vector stores it at the hand-out and checks it at free. */
#define HARDEN_CANARY_LEN 16

/* The quarantine: freed small blocks wait in their thread's rings and leave them in random order.
 * HARDEN_QUARANTINE_SLOTS blocks a ring: a block is reused only after about that many further frees
 * of its size range in its thread (its chance to leave at each is 1 in the ring's length), long
 * enough for the common use after free (the freeing function's caller still holds the pointer) to
 * meet the pattern check instead of a new owner, and the next owner of a freed block cannot be
 * predicted by spraying allocations of its size. Two rings, so that the common case counts no
 * bytes: blocks of up to HARDEN_QUARANTINE_SMALL bytes wait in one of 32 slots (32 x 16 KiB: at
 * most 512 KiB), larger ones in another, bounded also by HARDEN_QUARANTINE_BYTES (filled by the
 * slow half, harden.c; once at its bound, harden_quarantine_swap_large). 32 and not 64: over the
 * quick preset 0.959 of the time with 64 (0.929-0.998), malloc-test 0.91 of its pairs' time, most
 * at 8 KiB, where the 64 blocks a loop cycles through spanned 144 pages; the wait is half as long
 * (docs/hardening.md, Cost). */
#define HARDEN_QUARANTINE_SHIFT 5
#define HARDEN_QUARANTINE_SLOTS (QM_HARDENED_BUILD ? 1 << HARDEN_QUARANTINE_SHIFT : 1) /* the default build's threads carry none */
#define HARDEN_QUARANTINE_SMALL ((size_t)16 << 10)
#define HARDEN_QUARANTINE_BYTES ((size_t)1 << 20)

typedef struct harden_ring_s {
  void *blocks[HARDEN_QUARANTINE_SLOTS];
  uint8_t classes[HARDEN_QUARANTINE_SLOTS];
  uint32_t count;
  uint32_t next; /* small ring, once full: the slot whose block leaves at the next free, drawn (and
                  * its block prefetched) one free ahead, so that the leaving block's check and its
                  * reuse by the next malloc do not wait for the cache miss; at least count otherwise */
  size_t bytes;  /* large ring only (the small one's bound is its length) */
} harden_ring_t;

typedef struct harden_thread_s {
  harden_ring_t small, large;
  uint64_t rng;  /* the generator's state (harden_random), seeded from the secret and the thread's address */
  bool closed;   /* the thread is exiting: its frees no longer wait */
} harden_thread_t;

extern __thread harden_thread_t harden_self __attribute__((tls_model("initial-exec"), visibility("hidden")));

/* The one-line errors of the hardened build (check.c's format), in harden.c. */
__attribute__((noreturn)) QM_COLD void harden_fail_write_after_free(const char *call, const void *obj);
/* A live block whose record or canary is damaged (its free, realloc, malloc_usable_size): an
 * overflow past its end, or an underflow of the block after it, which lands in its last word (the
 * record) first. Which one the damage shows: the record's top 16 bits (HARDEN_WORD_TOP in every
 * record) changed and its low byte not, the block after underflowed (named); the low byte or the
 * canary changed and the top bits not, obj overflowed; the whole word changed, either. */
__attribute__((noreturn)) QM_COLD void harden_fail_tail(const char *call, const void *obj);
/* A free block whose fill or free tag is damaged (its hand-out, the exit check): a write after free,
 * or, when only the last word's top bits changed, an underflow of the block after it (named). */
__attribute__((noreturn)) QM_COLD void harden_fail_free_block(const char *call, const void *obj);
/* malloc's check of the fill, failed: harden_fail_free_block("malloc()", obj), declared as
 * returning the block so that the hand-out reaches it with a jump: with a second call that does not
 * return (the pop's corrupted list), GCC set up a stack frame on malloc's common path (2
 * instructions a pair, make fastpath). It never returns. */
QM_COLD void *harden_fail_handout(void *obj);
/* check_fail_corrupted's question in this build: whether a 16-byte slot's damaged free tag (its last
 * word) is an underflow of the block after it; if so it says so and does not return. */
void harden_explain_corrupted(const char *call, const void *obj);
/* The free's defects, and the one call that reports them (the functions above, check.c's double
 * free and wrong size), declared as returning for the same reason: each check of the hardened free
 * calls it last on a path that then returns, so that it is a jump, and the free sets up no stack
 * frame (with calls that do not return, it did: 2 instructions a pair, make fastpath). It never
 * returns. */
typedef enum { HARDEN_DOUBLE_FREE, HARDEN_DAMAGED_TAIL, HARDEN_WRONG_SIZE, HARDEN_WRITE_AFTER_FREE } harden_defect_t;
QM_COLD void harden_reject(harden_defect_t defect, const char *call, const void *obj, size_t size);

/* 16 bytes of the pattern: the fill and its check go 16 bytes at a time (SSE2 on x86-64, NEON on
 * aarch64: the baseline of both), with no call (memset and memcmp are library calls under
 * -fno-builtin; they took a quarter of a hardened malloc-test run). */
typedef uint64_t harden_vec_t __attribute__((vector_size(16), may_alias));
#define HARDEN_PATTERN_VEC ((harden_vec_t){HARDEN_PATTERN_WORD, HARDEN_PATTERN_WORD})
typedef uint64_t harden_uvec_t __attribute__((vector_size(16), aligned(1), may_alias)); /* unaligned */
QM_INLINE harden_vec_t harden_load_vec(const void *at) { return *(const harden_uvec_t *)at; }

QM_INLINE uint64_t *harden_last_word(void *obj, size_t slot) { return (uint64_t *)(void *)((char *)obj + slot - 8); }

/* Where the fill's second and third vectors go in a class's slots (the first is at 16): at 32 and
 * 48 in slots of 64 bytes and more, at 32 twice in 48-byte slots, at 16 (the first's place) in
 * 32-byte slots. From a table and not from a test of the slot size: where sizes are mixed (t-test1,
 * churn) that test went either way at random, 87 k mispredictions at the free and as many at the
 * hand-out in 400 k operations of t-test1 --max-size 64 (cachegrind's branch simulation,
 * docs/hardening.md). A table of its own, apart from sizeclass_size: with the slot size and the
 * offsets in one 8-byte entry, GCC kept the base and the index in registers from the slot size's
 * load to the fill, and saved two more on the free's path (+5 instructions a pair, make fastpath). */
typedef struct {
  uint8_t mid[SIZECLASS_COUNT], end[SIZECLASS_COUNT];
} harden_fill_at_t;
extern const harden_fill_at_t harden_fill_at __attribute__((visibility("hidden")));

/* A freed block's fill: [16, HARDEN_FILL_END) (to its end if smaller) and its last word. (Slots of
 * 16 bytes are all tag.) harden_holds_fill reads the same vectors. */
QM_INLINE void harden_fill(void *obj, unsigned cls) {
  size_t slot = sizeclass_size[cls];
  if (slot <= 16) return;
  char *p = (char *)obj;
  *(harden_uvec_t *)(void *)(p + 16) = HARDEN_PATTERN_VEC;
  *(harden_uvec_t *)(void *)(p + harden_fill_at.mid[cls]) = HARDEN_PATTERN_VEC;
  *(harden_uvec_t *)(void *)(p + harden_fill_at.end[cls]) = HARDEN_PATTERN_VEC;
  *harden_last_word(obj, slot) = HARDEN_PATTERN_WORD;
}
_Static_assert(HARDEN_FILL_END == 64, "harden_fill and harden_holds_fill store and check three vectors from byte 16");

/* Whether obj's fill is intact: [16, HARDEN_FILL_END) and its last word all pattern, without an
 * early exit. (The vectors are 16-byte aligned: slots are multiples of 16 on aligned spans.) */
QM_INLINE bool harden_holds_fill(const void *obj, unsigned cls) {
  size_t slot = sizeclass_size[cls];
  if (slot <= 16) return true;
  const char *p = (const char *)obj;
  harden_vec_t v0 = *(const harden_vec_t *)(const void *)(p + 16);
  harden_vec_t v1 = *(const harden_vec_t *)(const void *)(p + harden_fill_at.mid[cls]);
  harden_vec_t v2 = *(const harden_vec_t *)(const void *)(p + harden_fill_at.end[cls]);
  uint64_t last = *(const uint64_t *)(const void *)(p + slot - 8);
#if defined(__x86_64__)
  /* Byte compares ANDed and one mask (SSE2): a compare can take its operand from memory. */
  typedef char harden_bytes_t __attribute__((vector_size(16)));
  harden_bytes_t pattern = (harden_bytes_t)HARDEN_PATTERN_VEC;
  harden_bytes_t same = ((harden_bytes_t)v0 == pattern) & ((harden_bytes_t)v1 == pattern) & ((harden_bytes_t)v2 == pattern);
  return (__builtin_ia32_pmovmskb128(same) == 0xffff) & (last == HARDEN_PATTERN_WORD);
#else
  harden_vec_t a = (v0 ^ HARDEN_PATTERN_VEC) | (v1 ^ HARDEN_PATTERN_VEC) | (v2 ^ HARDEN_PATTERN_VEC);
  return ((a[0] | a[1]) | (last ^ HARDEN_PATTERN_WORD)) == 0;
#endif
}

/* Where the canary's vector starts for a request of n bytes in a slot of more than 16 bytes: at n,
 * or, where fewer than 16 bytes are left before the record, 16 bytes before the record (its first
 * n - at bytes are the program's and are not checked). */
QM_INLINE size_t harden_canary_at(size_t n, size_t slot) { return n < slot - 24 ? n : slot - 24; }

/* Whether the canary of a request of n bytes holds the pattern: [n, n + 16) or [n, the record). */
QM_INLINE bool harden_canary_intact(const void *obj, size_t n, size_t slot) {
  const char *p = (const char *)obj;
  if (slot <= 16) { /* [n, 8): word 0 above the program's n bytes (n <= 8, little-endian; in two
                     * shifts, as n = 8 shifts by 64) */
    return ((*(const uint64_t *)(const void *)p ^ HARDEN_PATTERN_WORD) & (~(uint64_t)0 << (4 * n) << (4 * n))) == 0;
  }
  size_t at = harden_canary_at(n, slot), skip = n - at; /* 0 to 16 of the program's bytes */
  harden_vec_t v = harden_load_vec(p + at);
#if defined(__x86_64__)
  /* One bit per byte that differs from the pattern (SSE2's byte compare and mask), the program's
   * bytes shifted out: five instructions where the two words' masks took a dozen and two branches. */
  typedef char harden_bytes_t __attribute__((vector_size(16)));
  unsigned same = (unsigned)__builtin_ia32_pmovmskb128((harden_bytes_t)v == (harden_bytes_t)HARDEN_PATTERN_VEC);
  return ((same ^ 0xffffu) >> skip) == 0;
#else
  harden_vec_t x = v ^ HARDEN_PATTERN_VEC;
  uint64_t lo_mask = skip >= 8 ? 0 : ~(uint64_t)0 << (8 * skip);
  uint64_t hi_mask = skip <= 8 ? ~(uint64_t)0 : skip >= 16 ? 0 : ~(uint64_t)0 << (8 * (skip - 8));
  return ((x[0] & lo_mask) | (x[1] & hi_mask)) == 0;
#endif
}

/* Writes the canary and the record of obj for a request of n bytes. The canary's vector may also
 * cover program bytes below n (harden_canary_at): they are the new owner's, not yet its data. */
QM_INLINE void harden_write_tail(void *obj, size_t slot, size_t n) {
  if (slot <= 16) *(uint64_t *)obj = HARDEN_PATTERN_WORD; /* word 1 is the record */
  else *(harden_uvec_t *)(void *)((char *)obj + harden_canary_at(n, slot)) = HARDEN_PATTERN_VEC;
  *harden_last_word(obj, slot) = harden_record(obj, n);
}

/* Hands out obj (just popped, of class cls) for a request of n bytes: its fill must be intact
 * (else "malloc(): write after free"), then canary and record. */
QM_INLINE void *harden_handout(void *obj, unsigned cls, size_t n) {
  size_t slot = sizeclass_size[cls];
  if (QM_UNLIKELY(!harden_holds_fill(obj, cls))) return harden_fail_handout(obj);
  harden_write_tail(obj, slot, n);
  return obj;
}

/* Whether live obj's (slot bytes) record names a size that fits and its canary is intact; the
 * request size in *n. */
QM_INLINE bool harden_tail_intact(const void *obj, size_t slot, size_t *n) {
  size_t record = slot - 8;
  *n = harden_record_size(obj, *(const uint64_t *)(const void *)((const char *)obj + record));
  return QM_LIKELY(*n <= record && harden_canary_intact(obj, *n, slot));
}

/* The top 16 bits of every word the last word of a small slot can hold, live or free: the
 * pattern's (0xa5a5...), and so, in this build, the secret's (harden_secret), which makes them
 * every key's (an address's top 16 bits are 0), every free tag's and every record's (key ^ n << 8,
 * n < 2^40). An underflow of the next block overwrites them first (the word's top byte is the
 * byte just before that block), an overflow of this one last: that is how a damaged last word
 * tells the two apart (harden_fail_tail). */
#define HARDEN_WORD_TOP ((uint64_t)0xa5a5)
/* The secret as this build uses it: its top 16 bits HARDEN_WORD_TOP, 47 random ones below (check.c
 * draws it). Bit 63 stays set (0xa5), as freelist_take's sign test needs. */
QM_INLINE uintptr_t harden_secret(uintptr_t drawn) { return (drawn & (((uint64_t)1 << 48) - 1)) | (HARDEN_WORD_TOP << 48); }

/* The free of small block obj of class cls: not free already (the free tag: in a list or in a
 * quarantine), its record and canary intact, the size of a sized free its request size; else false,
 * the defect reported (harden_reject, which does not return: the caller's return after it makes the
 * report a jump). Then it takes its free tag, in word 0 too, and the fill: so that the block leaves
 * the quarantine for a list with only its link to write and word 0 to check
 * (harden_leaving_intact; with a quarantine tag of its own, ~key in word 0, the leaving block's
 * check of both words, the push's test of the tag and its store cost 14 instructions a pair more,
 * make fastpath). Plain loads and stores: two threads freeing one block at the same instant may
 * both pass, and the second of them to let it leave its quarantine finds word 0 changed ("free():
 * write after free").
 * It reads nothing of the slot before obj: an underflow of obj lands in that slot's last word, which
 * that block's own checks find (its free, its hand-out, the exit check; harden_fail_tail and
 * harden_fail_free_block name obj as the block that underflowed). Reading it here, the free read a
 * line that another thread writes whenever its block is the one before (two threads' blocks share
 * spans), and a line no other part of the free touches in slots of 64 bytes and more: 9
 * instructions a pair, and 0.974 of the time on mtbench's quick preset (docs/hardening.md,
 * "Underflows"). */
QM_INLINE bool harden_retire(void *obj, unsigned cls, bool sized, size_t size, const char *call) {
  uintptr_t *words = (uintptr_t *)obj, key = freelist_key(obj);
  harden_defect_t defect;
  size_t slot = sizeclass_size[cls], n;
  if (QM_UNLIKELY(words[1] == key)) defect = HARDEN_DOUBLE_FREE;
  else if (!harden_tail_intact(obj, slot, &n)) defect = HARDEN_DAMAGED_TAIL;
  else if (QM_UNLIKELY(sized && size != n)) defect = HARDEN_WRONG_SIZE;
  else {
    words[1] = key;
    words[0] = key; /* as a list's last block's link would read (NULL): never followed, checked as it leaves */
    harden_fill(obj, cls);
    return true;
  }
  harden_reject(defect, call, obj, size);
  return false;
}

/* The quarantine's and the carving's random numbers: a 64-bit linear congruential generator, of
 * which only the high 32 bits are used (the low ones of an LCG are weak). Its multiplier and
 * increment fit an instruction's 32-bit immediate (the multiplier 1 modulo 4 and the increment odd:
 * the full period of 2^64), so that a draw is a multiply and an add: Knuth's 64-bit MMIX constants
 * took a 10-byte load each, 2 instructions a free (make fastpath). Where xorshift64 took eight and a
 * test for the unseeded state: the state is seeded, from the secret and the thread's address, by the
 * slow halves that run before any fast use (harden_seed). Not cryptographic: no output is ever seen
 * by the program, only the order in which freed blocks come back, as with xorshift before it. */
QM_INLINE uint64_t harden_random(harden_thread_t *t) {
  uint64_t x = t->rng * 0x2545f491u + 0x55fdc781u;
  t->rng = x;
  return x;
}

/* Seeds this thread's generator if it is not yet (harden.c; the slow halves). */
void harden_seed(harden_thread_t *t);

/* A random number below n (n > 0): a multiply and a shift, not a division. */
QM_INLINE uint32_t harden_below(harden_thread_t *t, uint32_t n) { return (uint32_t)(((harden_random(t) >> 32) * n) >> 32); }

/* A block leaving the quarantine: its word 0 must be as its free left it (else "free(): write after
 * free"); its free tag, word 1, is checked by the pop that hands it out ("malloc(): corrupted free
 * list"), or by its span's list's checks if it goes back there first. The small ring's common case
 * tests it in free_small_hardened (api.c), which then returns after harden_reject; the others
 * check it here. */
QM_INLINE bool harden_leaving_intact(const void *obj) { return QM_LIKELY(((const uintptr_t *)obj)[0] == freelist_key(obj)); }
QM_INLINE void harden_check_leaving(void *obj) {
  if (!harden_leaving_intact(obj)) harden_fail_write_after_free("free()", obj);
}

/* The quarantine's slow half (harden.c): while the small ring fills, for blocks over
 * HARDEN_QUARANTINE_SMALL (the large ring and its byte bound), once the thread is exiting. Puts
 * retired obj of class cls in this thread's quarantine and returns the block that leaves it, with
 * *leaving_cls (NULL if none; obj itself if the thread is exiting). The large ring may end over its
 * byte bound (a larger block took a smaller one's place): the caller then calls
 * harden_quarantine_over until it is not. */
void *harden_quarantine_add(void *obj, unsigned cls, unsigned *leaving_cls);

/* The classes of at most HARDEN_QUARANTINE_SMALL bytes are 1 to this (sizes ascend with the class),
 * so that free tests the class, which it holds in a register, rather than reload the slot size (the
 * reload, and the registers kept live for it, cost 3 instructions a pair, make fastpath). */
#define HARDEN_SMALL_RING_ROW(cls, size, pages) +((size) <= HARDEN_QUARANTINE_SMALL)
enum { HARDEN_SMALL_RING_CLASSES = 0 SIZECLASS_ROWS(HARDEN_SMALL_RING_ROW) };

/* Whether a free of class cls takes the quarantine's fast path: a full small ring. */
QM_INLINE bool harden_quarantine_fast(unsigned cls) {
  /* (next < count: a ring still filling, next at its length, a ring that lost a block, and an
   * exiting thread's and a new thread's, count 0, fail it) */
  return QM_LIKELY(harden_self.small.next < harden_self.small.count && cls <= HARDEN_SMALL_RING_CLASSES);
}

/* Puts retired obj in this thread's full small ring (harden_quarantine_fast): the block in the slot
 * drawn one free ahead leaves and obj takes its place; returns it, with *leaving_cls, for the caller
 * to check (harden_leaving_intact) and push on a free list. The next slot is drawn now (the ring's
 * length is a power of two: the generator's top bits), and its block's first line prefetched. */
QM_INLINE void *harden_quarantine_swap(void *obj, unsigned cls, unsigned *leaving_cls) {
  harden_thread_t *t = &harden_self;
  uint32_t i = t->small.next;
  void *leaving = t->small.blocks[i];
  *leaving_cls = t->small.classes[i];
  t->small.blocks[i] = obj;
  t->small.classes[i] = (uint8_t)cls;
  i = (uint32_t)(harden_random(t) >> (64 - HARDEN_QUARANTINE_SHIFT)); /* obj itself, 1 time in 32 */
  t->small.next = i;
  __builtin_prefetch(t->small.blocks[i]); /* its first line; the hand-out's check reads it and the last word */
  return leaving;
}

/* Puts obj (of class cls) in slot i of the large ring r, whose byte count changes by `grows` (obj's
 * slot bytes less the leaving block's, computed by the caller, who checks the bound with it);
 * returns the block that was there (checked), with *leaving_cls. */
QM_INLINE void *harden_ring_replace(harden_ring_t *r, uint32_t i, void *obj, unsigned cls, size_t grows, unsigned *leaving_cls) {
  void *leaving = r->blocks[i];
  *leaving_cls = r->classes[i];
  r->blocks[i] = obj;
  r->classes[i] = (uint8_t)cls;
  r->bytes += grows; /* unsigned: a smaller block wraps around and back */
  harden_check_leaving(leaving);
  return leaving;
}

/* The large ring's common case, once it is at its bound (its length or its bytes): the block in a
 * slot drawn now leaves and obj (slot bytes, over HARDEN_QUARANTINE_SMALL) takes its place, if that
 * keeps the ring within its byte bound. Returns the block that leaves (checked), with *leaving_cls,
 * for the caller to push; NULL sends obj to the slow half: a small block, a ring still filling, an
 * exiting thread's (its rings are emptied: count 0), or a swap that would pass the bound. Before
 * it, every free of a block over 16 KiB took the slow half (about 60 instructions more). */
QM_INLINE void *harden_quarantine_swap_large(void *obj, unsigned cls, size_t slot, unsigned *leaving_cls) {
  harden_thread_t *t = &harden_self;
  harden_ring_t *r = &t->large;
  if (slot <= HARDEN_QUARANTINE_SMALL || r->count == 0) return NULL;
  if (r->count < HARDEN_QUARANTINE_SLOTS && slot <= HARDEN_QUARANTINE_BYTES - r->bytes) return NULL; /* room left */
  uint32_t i = harden_below(t, r->count);
  size_t grows = slot - sizeclass_size[r->classes[i]];
  if (r->bytes + grows > HARDEN_QUARANTINE_BYTES) return NULL;
  return harden_ring_replace(r, i, obj, cls, grows, leaving_cls);
}

/* A block, chosen at random, that leaves the large ring to bring it back under its byte bound
 * (checked), with *cls; NULL when it is not over it. (harden.c; after harden_quarantine_add) */
void *harden_quarantine_over(unsigned *cls);

/* For malloc_trim: every block of the quarantine, one at a time, chosen at random (checked), with
 * *cls; NULL when it is empty or the thread is exiting. (harden.c) */
void *harden_quarantine_evict(unsigned *cls);

#endif

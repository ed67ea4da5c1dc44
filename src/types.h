/* The core structures shared by more than one layer. Each is owned by one file (named in its
 * comment) and touched elsewhere only through that file's functions, except where noted. */
#ifndef QM_TYPES_H
#define QM_TYPES_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "config.h"
#include "sizeclass_table.h"

/* ---- span (span.c, pageheap.c, central.c) ------------------------------------------------- */

typedef enum {
  SPAN_DEAD = 0,      /* struct on the span free list, describes nothing */
  SPAN_FREE_BACKED,   /* free pages that may be resident (recently used) */
  SPAN_FREE_RELEASED, /* free pages returned to the OS (or never touched) */
  SPAN_SMALL,         /* carved into objects of one size class, owned by central.c */
  SPAN_LARGE,         /* one large object handed to the program */
  SPAN_RELEASING,     /* free pages on their way back to the OS: in no set (pageheap.c) */
  SPAN_GUARD          /* pagemap.c only: the guard after a page-heap chunk (one static header) */
} span_state_t;

/* A run of pages. 64 bytes, so the header of a 1-page span of 8-byte objects is 0.8% of it. */
typedef struct span_s {
  uintptr_t start;     /* address of the first page */
  uint32_t npages;
  uint8_t sizeclass;   /* SPAN_SMALL: its class; a sampled SPAN_LARGE: its request's (api.c) */
  uint8_t state;       /* span_state_t */
  uint8_t direct;      /* SPAN_LARGE: a mapping of its own (huge block), unmapped when freed */
  uint8_t aged;        /* SPAN_FREE_BACKED: on the age list (it holds a whole kernel page to release) */
  uint8_t sampled;     /* SPAN_LARGE: a block the heap profiler sampled (prof.c); its free tells it */
  uint8_t parked;      /* free, hardened build: may hold parked or protected pages (harden_park.c) */
  uint8_t guard_lost;  /* direct: no guard after it (its place was taken while it grew: os_grow_guarded) */
  struct span_s *next; /* page-heap free list, or the central list of spans with free objects */
  struct span_s *prev;
  union {
    struct {            /* SPAN_SMALL */
      void *freelist;   /* its free objects (freelist.h); slots past `carved` are in none */
      uint32_t allocated; /* objects out of this span: in programs, thread or transfer caches */
      uint16_t carved;    /* slots linked so far, from the first (central.c carves on demand); the
                           * pages holding their starts are those with a page-map small entry */
    } small;
    struct {            /* SPAN_FREE_BACKED: list of backed free spans, oldest first (decay) */
      struct span_s *newer;
      struct span_s *older;
    } age;
    const void *releaser; /* SPAN_RELEASING: the batch it is in, on its thread's stack (pageheap.c) */
  } u;
  uint64_t freed_ms;    /* SPAN_FREE_BACKED: when it became free (decay clock); SPAN_LARGE: when
                         * it was handed out (pageheap_unresident_runs: its age at its free) */
} span_t;

/* ---- page map (pagemap.c) ----------------------------------------------------------------- */

/* small[] is what free()'s fast path reads: for a page of a small span, the span's start address
 * with the size class in its low 8 bits (spans are page-aligned, so the bits are free), from which
 * the object's offset and class follow without touching the span; 0 for every other page.
 * spans[] is set for every page of a small span and for the first and last pages of other spans
 * (all that coalescing and large frees need). */
typedef struct pagemap_leaf_s {
  uintptr_t small[PAGEMAP_LEAF_LEN];
  span_t *spans[PAGEMAP_LEAF_LEN];
} pagemap_leaf_t;

/* A small entry: the span's start (page-aligned) | class * 2. Twice the class, so that free's
 * fast path indexes both the magic table (8-byte rows: scale 4) and the thread's lists (16-byte
 * rows: scale 8) with the entry's low byte as it is, in x86-64 addressing modes (api.c). */
#define PAGEMAP_SMALL_ENTRY(span_start, cls) ((uintptr_t)(span_start) | ((uintptr_t)(cls) << 1))
_Static_assert(SIZECLASS_COUNT * 2 <= 256, "class * 2 must fit the entry's low byte");
static inline unsigned pagemap_entry_class(uintptr_t entry) { return (unsigned)(entry & 0xff) >> 1; }
static inline uintptr_t pagemap_entry_span_start(uintptr_t entry) { return entry & ~(uintptr_t)0xff; }

/* ---- thread cache (tcache.c; the fast paths in api.c read and write it too) ---------------- */

/* 16 bytes, so a list is found with one shift. Lengths fit 16 bits: TCACHE_LIST_MAX_LENGTH.
 * The fast paths never compare against the low-water mark: count and max_count are kept above a
 * floor (the low-water mark, to within a quarter), so a pop that reaches the floor finds its count
 * at 0 and takes the slow path, which lowers it (tcache.c, list_pop_slow). Both are in halves:
 * twice the number of objects (a pop subtracts 2, a push adds 2: the low bit once said "the owner
 * is inside a pop", and costs nothing now), and a count's top bit says "stopped by a taker"
 * (tcache_window.h; list_length() and friends give objects). */
typedef struct tcache_list_s {
  void *head;          /* singly linked through each object's first word, NULL-terminated */
  uint16_t count;      /* 2 * (length - floor) (+LIST_STOP when stopped) */
  uint16_t max_count;  /* 2 * (maximum length - floor): the maximum grows on misses within the
                        * budget; 0 sends every free to the slow path */
  uint16_t floor;      /* objects; no pop took the list below it since the last collection */
  uint16_t unused;     /* keeps the list 16 bytes (one shift from the class) */
} tcache_list_t;
_Static_assert(sizeof(tcache_list_t) == 16, "sizeclass_lookup holds class * 16 (SIZECLASS_LOOKUP_SHIFT)");

typedef enum { TCACHE_UNINIT = 0, TCACHE_LIVE, TCACHE_DEAD } tcache_state_t;

typedef struct tcache_s {
  tcache_list_t lists[SIZECLASS_COUNT];
  /* Bytes malloc's fast path may still hand out before its slow half must look: the bytes left
   * before the heap profiler's next sample, but never more than SMALL_MAX (prof_beyond holds the
   * rest). The fast path subtracts each request and leaves when that borrows (the request was
   * larger), so the one subtract and branch also send every request over SMALL_MAX to the slow
   * half: malloc has no size test of its own. prof.c refills it (prof_should_sample), once per
   * SMALL_MAX bytes at most when no sample is due. 0 (and prof_beyond 0) in a new thread, so that
   * its first malloc draws the interval. */
  uint64_t prof_countdown;
  uint64_t prof_beyond; /* bytes to the next sample beyond prof_countdown (UINT64_MAX: sampling off) */
  /* free's cache of the page map (api.c, pagemap_small_entry): the root index (address >> 30) of
   * the leaf it last used, and that leaf's small[] array minus the index's first page, so that the
   * entry of any page in that 1 GiB is leaf_base[address >> PAGE_SHIFT]. Starts at an index no
   * address has (tcache.c's initializer). Leaves are never freed: a cached one stays valid. */
  uintptr_t leaf_key;
  uintptr_t leaf_base;
  /* sizeclass_magic, copied at the thread's init (0 before: every free takes the slow path, as the
   * lists' maxima of 0 make it anyway). free's divisibility test reads it through %fs with the
   * cache's TLS offset it already holds, where the shared table needs its address formed first:
   * one instruction fewer a pair (make fastpath). */
  uint64_t magic[SIZECLASS_COUNT];
  /* The slow paths' window (tcache_window.h): odd while the owner is in a slow path; bit 31 set
   * by a thread taking the cache back. */
  int32_t op_seq;
  /* The budget bounds capacity, not contents: capacity = sum of maximum length * class size, so the
   * bytes a cache holds never exceed max_size (until another thread takes a step of it: docs/design.md,
   * "the total bounds budgets"), and neither fast path has to count bytes. */
  size_t capacity;
  size_t max_size;            /* this thread's budget in bytes; others may lower it (stealing) */
  uint8_t overages[SIZECLASS_COUNT]; /* times a list overflowed its maximum since it last shrank */
  uint8_t state;              /* tcache_state_t */
  uint8_t gc_idle;            /* growth attempts to let pass before collecting again */
  bool budget_denied;         /* no budget was to be had: none asked for until the next timed collection */
  struct tcache_s *next, *prev; /* registry of live caches, under tcache's registry lock */
  /* Under the registry lock, for idle scans: what the cache looked like at the last scan, and
   * the caches one scan stopped. */
  uint64_t idle_seen;
  struct tcache_s *reclaim_next;
  int32_t stopped_seq;                             /* op_seq as the scan stopped it */
  /* Lists the scan stopped, by class; once it is done, the ones it took (the owner's repair reads
   * them under reclaim_lock). */
  uint64_t stopped_lists[(SIZECLASS_COUNT + 63) / 64];
  /* Held by a thread taking this cache back; the owner takes it when it finds itself stopped. */
  pthread_mutex_t reclaim_lock;
  /* statistics, written only by the owner */
  uint64_t refills, flushes, gc_runs;
  uint64_t reclaims;          /* times taken back while idle; written under the registry lock */
  uint64_t next_gc_ms;        /* the owner's slow paths collect garbage from then on (tcache_gc_if_due) */
} tcache_t;

/* ---- central free lists (central.c) ------------------------------------------------------- */

typedef struct central_s {
  pthread_mutex_t lock;   /* protects the spans and their counts; not the transfer cache */
  span_t *nonempty;       /* spans of this class with an object to hand out (doubly linked) */
  /* (The batch is sizeclass_batch[cls], the transfer cache's slots central_transfer_max[cls]: set
   * at init, when writing them here touched every page of central_lists in every process.) */
  uint32_t transfer_capacity; /* batches it may hold now, at most central_transfer_max[cls]; 0 (not
                               * set yet) stands for TRANSFER_MIN (atomic; central.c) */
  uint32_t transfer_count;    /* full batches held now (atomic; exact whenever no exchange is under way) */
  uint32_t transfer_low;      /* least transfer_count since the last idle drain (atomic, approximate) */
  uint64_t spans_in_use;  /* small spans of this class (statistics) */
  uint64_t free_in_spans; /* objects free inside those spans */
  uintptr_t first_touch;  /* only ever added 0 to, atomically: the class's first write (central_lock) */
} __attribute__((aligned(QM_CACHELINE))) central_t;

#endif

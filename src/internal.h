/* Cross-file contracts, grouped by the file that defines them. Lock order (outermost first):
 *   tcache registry lock  ->  a cache's reclaim_lock  ->  central[cls].lock (ascending cls)
 *   ->  page heap lock  ->  stats lock
 * A function that takes a lock says so; none is taken on the malloc/free fast paths.
 * The heap profiler's prof_lock (prof.c) is outside this order: taken with no other qmalloc lock
 * held, and nothing under it takes one. */
#ifndef QM_INTERNAL_H
#define QM_INTERNAL_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "config.h"
#include "options.h"
#include "types.h"

/* ---- sizeclass.c: read-only after sizeclass_init, but for the lookup table's lazy pages ---- */
#define SIZECLASS_LOOKUP_SLOTS (SMALL_MAX / 8 + 1)
/* class << 4: the byte offset of the class's list in tcache_t.lists (16-byte lists, types.h) */
#define SIZECLASS_LOOKUP_SHIFT 4
extern uint16_t sizeclass_lookup[SIZECLASS_LOOKUP_SLOTS];
extern const uint32_t sizeclass_size[SIZECLASS_COUNT];
extern const uint8_t sizeclass_pages[SIZECLASS_COUNT];
extern const uint64_t sizeclass_magic[SIZECLASS_COUNT];
extern uint16_t sizeclass_batch[SIZECLASS_COUNT];
extern const uint16_t sizeclass_span_objects[SIZECLASS_COUNT]; /* slots in a span of the class (no division on slow paths) */
/* Requires n <= SMALL_MAX. */
QM_INLINE size_t sizeclass_slot(size_t n) { return (n + 7) >> 3; }
/* The table is filled a page of it at a time (SIZECLASS_LOOKUP_CHUNK slots): the first, requests
 * up to 16 KiB, at init, each other one when a request first falls in it (sizeclass_fill). Until
 * then its entries are 0, class 0, whose thread-cache list is always empty: malloc's fast path
 * goes to its slow path, which fills the page. Relaxed atomic loads (plain loads on x86-64 and
 * AArch64): another thread may be filling the page, with the same values. */
#define SIZECLASS_LOOKUP_CHUNK (4096 / sizeof(uint16_t))
QM_INLINE size_t sizeclass_list_offset_of(size_t n) {
  return __atomic_load_n(&sizeclass_lookup[sizeclass_slot(n)], __ATOMIC_RELAXED);
}
/* The class of n, or 0 if its page of the table is not filled yet (the sized free's fast path:
 * a 0 matches no block's class, and its slow path asks sizeclass_of). */
QM_INLINE unsigned sizeclass_of_list_offset(size_t list_offset) { return (unsigned)(list_offset >> SIZECLASS_LOOKUP_SHIFT); }
QM_INLINE unsigned sizeclass_of_if_filled(size_t n) { return sizeclass_of_list_offset(sizeclass_list_offset_of(n)); }
/* Fills the page of the table that holds n's slot; returns n's class. */
unsigned sizeclass_fill(size_t n);
QM_INLINE unsigned sizeclass_of(size_t n) {
  unsigned cls = sizeclass_of_if_filled(n);
  return QM_LIKELY(cls != 0) ? cls : sizeclass_fill(n);
}
/* Sets the transfer batches (from an option) and fills the first page of the lookup table,
 * patching the tiny slots for min_align 8 or 16. (Sizes, spans and magic are compile-time tables.) */
void sizeclass_init(unsigned min_align, unsigned batch_max);
/* From class cls (that of the request), the first class whose size is a multiple of `alignment`
 * (a power of two), or 0: every span starts on a page, so such a class aligns every object up to
 * PAGE_SIZE. A mask, not a division. */
QM_INLINE unsigned sizeclass_aligned_from(unsigned cls, size_t alignment) {
  for (; cls != 0 && cls < SIZECLASS_COUNT; cls++)
    if ((sizeclass_size[cls] & (alignment - 1)) == 0) return cls;
  return 0;
}
/* The smallest class that can hold `size` bytes at an `alignment`-aligned address, or 0 (also for
 * an alignment that is not a power of two). */
unsigned sizeclass_for_aligned(size_t size, size_t alignment);
/* Invariants of the table (monotonic, 16-byte multiples, fits its span, smallest fit). */
bool sizeclass_check(void);

/* ---- pagemap.c: reads lock-free; writes require the page heap lock ---- */
extern pagemap_leaf_t *pagemap_root[PAGEMAP_ROOT_LEN];
/* The leaf covering addr, or NULL (nothing of ours is there, or addr is beyond 48 bits). */
QM_INLINE pagemap_leaf_t *pagemap_leaf_of(uintptr_t addr) {
  uintptr_t i = addr >> PAGEMAP_LEAF_SHIFT;
  return i < PAGEMAP_ROOT_LEN ? __atomic_load_n(&pagemap_root[i], __ATOMIC_ACQUIRE) : NULL;
}
/* The small entry of addr's page (types.h: a small span's start and class, 0 for any other page). */
QM_INLINE uintptr_t pagemap_small_of(uintptr_t addr) {
  pagemap_leaf_t *leaf = pagemap_leaf_of(addr);
  return leaf ? __atomic_load_n(&leaf->small[(addr >> PAGE_SHIFT) & (PAGEMAP_LEAF_LEN - 1)], __ATOMIC_RELAXED) : 0;
}
span_t *pagemap_span(uintptr_t addr);
/* Maps the leaves covering [start, start + npages pages); false if out of range or no memory. */
bool pagemap_ensure(uintptr_t start, size_t npages);
/* spans[] only: the small entries of the pages they set are 0 already (pagemap.c) */
void pagemap_set_ends(span_t *span);   /* first and last page -> span */
void pagemap_set_page(uintptr_t addr, span_t *span); /* one page -> span */
void pagemap_clear_ends(span_t *span);
void pagemap_set_small(span_t *span);  /* every page -> span (small entry 0 until carved) */
/* Pages [from, to) of a small span get their small entry (span start | class * 2): free()'s fast
 * path accepts pointers there. Called by central.c as it carves them; the class lock suffices, as
 * the span is the class's alone and its other pages' entries are not touched. */
void pagemap_set_carved(span_t *span, uint32_t from, uint32_t to);
void pagemap_clear_small(span_t *span);

/* ---- span.c: requires the page heap lock ---- */
span_t *span_new(uintptr_t start, size_t npages, span_state_t state); /* NULL if out of memory */
void span_delete(span_t *span);

/* ---- pageheap.c: every function takes the page heap lock itself ---- */
/* The part of a span from pageheap_alloc known to read as zero: [lo, hi) (empty if lo == hi),
 * pages given back to the OS or never touched. */
typedef struct {
  uintptr_t lo, hi;
} zero_range_t;
/* A span of npages pages whose start is a multiple of align_pages pages, set up as a small span
 * of `sizeclass` (page map filled) or, with sizeclass 0, as a large object. NULL if out of
 * memory. *zero: which of its pages are known to read as zero (may be NULL). */
span_t *pageheap_alloc(size_t npages, size_t align_pages, unsigned sizeclass, zero_range_t *zero);
/* Returns a small or large span to the free lists (coalescing), or unmaps a direct mapping. */
void pageheap_free(span_t *span);
/* Whether a request of npages pages would find no free backed span and raise the heap in use to a
 * new high: its pages would be faulted in (api.c, alloc_large). Takes the lock. */
bool pageheap_would_fault_at_high(size_t npages);
/* Whether span is still the large block the program was given at start: false once the block was
 * freed, or once its header went to another block. The check of a free that found the span
 * without the page heap's lock (pageheap_free_block, prof_pages_claim). */
QM_INLINE bool span_is_large_block(const span_t *span, uintptr_t start) {
  return span->state == SPAN_LARGE && span->start == start;
}
/* Whether span holds free pages of the page heap: in a free set, or on their way back to the OS.
 * A pointer to one was a block once (a double free) or never (invalid). */
QM_INLINE bool span_is_free(const span_t *span) {
  return span->state == SPAN_FREE_BACKED || span->state == SPAN_FREE_RELEASED || span->state == SPAN_RELEASING;
}
/* The program's free of the large block at start, whose span the page map named without the lock:
 * pageheap_free once the span is found, under the lock, to be that block still. A second free of
 * it at the same instant from another thread may have freed it first, and a third thread may then
 * have been given its header for a block elsewhere: that, or a span no longer in use, stops the
 * program as a double free of start. */
void pageheap_free_block(span_t *span, uintptr_t start);
/* Resizes a large span in place (shrinks, or grows into a free right neighbour); true if done. */
bool pageheap_resize_in_place(span_t *span, size_t new_npages);
/* Huge blocks (>= release_large) are direct mappings; this grows or shrinks one with mremap, under
 * the lock (see pageheap.c). NULL if impossible; the block is then unchanged. */
span_t *pageheap_remap(span_t *span, size_t new_npages);
/* Runs the decay if a backed span is due (cheap check without the lock otherwise). */
void pageheap_maybe_decay(uint64_t now);
/* Runs the decay, and gives back what exceeds the retain cap (the releaser, woken for it). */
void pageheap_decay_now(void);
/* Releases every free backed page to the OS, and unmaps free runs of at least a chunk; returns the
 * bytes released or unmapped. */
size_t pageheap_release_all(void);
void pageheap_lock_for_fork(void);
void pageheap_unlock_after_fork(bool child);
typedef struct pageheap_stats_s {
  size_t free_backed_bytes, free_released_bytes, small_span_bytes, large_bytes, direct_bytes;
  size_t free_spans, direct_blocks;
  uint64_t release_calls, released_bytes_total, release_failures, unmap_failures, unmapped_bytes_total;
  uint64_t growth_released_bytes;
} pageheap_stats_t;
void pageheap_stats(pageheap_stats_t *out);

/* ---- central.c: each function takes central[cls].lock, and may take the page heap lock ---- */
extern central_t central_lists[SIZECLASS_COUNT];
extern uint8_t central_transfer_max[SIZECLASS_COUNT]; /* slots of each class's transfer cache */
void central_init(void);
/* Moves up to `want` objects of class cls into a NULL-terminated chain at *head; returns how many
 * (0 only when out of memory). */
unsigned central_remove(unsigned cls, void **head, unsigned want);
/* Takes back a NULL-terminated chain of `count` objects of class cls. A span left with no
 * object out goes back to the page heap. */
void central_insert(unsigned cls, void *head, unsigned count);
/* The same, straight to the spans: not kept whole in the transfer cache. */
void central_insert_to_spans(unsigned cls, void *head);
/* Empties every transfer cache into the spans (malloc_trim). */
void central_drain_transfer(void);
/* Returns to their spans the transfer-cache batches no thread took since the last call (the idle
 * scan calls it every tcache_idle_ms). */
void central_drain_idle_transfer(void);
void central_lock_for_fork(void);
void central_unlock_after_fork(bool child);

/* ---- tcache.c ---- */
extern __thread tcache_t tcache_self __attribute__((tls_model("initial-exec")));
/* Slow half of malloc for a small class: initializes the thread's cache if needed, refills the
 * list from the central list. Returns an object or NULL (ENOMEM). */
void *tcache_alloc_slow(tcache_t *tc, unsigned cls);
/* Slow half of free for a small object the fast path could not push (cache not live, list at
 * its maximum): pushes it and flushes as needed. */
void tcache_free_slow(tcache_t *tc, void *obj, unsigned cls);
/* Frees live obj of class cls straight to its span, past the thread cache: for an exiting thread
 * (and its quarantine, harden.c), the class too small to cache, and realloc's old block once moved
 * to a larger class (api.c), which the program will not ask for again. */
void tcache_free_uncached(void *obj, unsigned cls);
/* Seed 002's garbage collection: moves half of each list's low-water mark to the central lists
 * and gives the capacity they held back to the budget. */
void tcache_gc(tcache_t *tc);
/* NULL if the cache's invariants hold, else what is broken (chains against lengths, maxima,
 * low-water marks, capacity, classes of the objects). Only the owner may call it. */
const char *tcache_check(const tcache_t *tc);
/* Flushes the calling thread's cache entirely (malloc_trim, thread exit). */
void tcache_flush_self(void);
/* Before a large block of npages pages: if its pages would be faulted in at a new high of the heap
 * in use (pageheap_would_fault_at_high), the calling thread's objects of the classes from
 * TCACHE_GROWTH_FLUSH_MIN up go back to their spans (api.c, alloc_large). */
void tcache_flush_for_growth(size_t npages);
/* Every slow path that touches the calling thread's lists runs between these two (the window,
 * tcache_window.h); tcache_open waits if another thread is taking the cache back. */
tcache_t *tcache_open(void);
void tcache_close(tcache_t *tc);
/* Idle scan: takes back the caches of other threads that did not operate on them since the
 * previous scan (all other caches not in use right now if `everyone`). Returns the bytes taken.
 * Runs by itself every tcache_idle_ms from slow paths; tests and malloc_trim call it directly. */
size_t tcache_reclaim_idle(bool everyone);
/* For unit-reclaim only: called by a scan between reading a stopped cache's heads and the barrier
 * that settles them (tcache_window.h), so that a test can end an operation in flight there. */
extern void (*tcache_test_settle_hook)(void);
/* What waits for a slow path: page decay (pageheap_maybe_decay), and an idle scan with the
 * transfer-cache drain if tcache_idle_ms passed since the last one. Slow paths call it: refills,
 * flushes, collections, new threads, and the background releaser (release.c). A scan finds idle
 * the caches that look the same as at the previous one, so a thread that stops operating gives its
 * cache back one to two intervals later, at the first of those events elsewhere. Takes the
 * registry lock (try-lock), central and page-heap locks. */
void tcache_housekeeping(void);
/* Whether caches can be taken back at all (membarrier(2) works). */
bool tcache_reclaim_available(void);
/* How many threads hold a live cache now (read without the lock: a value that was true). */
size_t tcache_live_caches(void);
/* Process init: the thread-exit hook and the budget. Does not allocate. */
void tcache_init(void);
/* Recomputes the unclaimed budget from tcache_total and the live caches (init, option change). */
void tcache_budget_init(void);
void tcache_lock_for_fork(void);
void tcache_unlock_after_fork(bool child);
/* Process-wide sums over live caches (and counters of exited ones), for statistics; fills
 * objects_per_class[cls] (adds to it) and up to max_threads per-thread rows. Takes the registry
 * lock. */
typedef struct tcache_thread_stats_s {
  size_t bytes, capacity, budget;
  uint64_t refills, flushes, gc_runs, reclaims;
} tcache_thread_stats_t;
typedef struct tcache_totals_s {
  size_t bytes, threads;
  intptr_t unclaimed;
  uint64_t refills, flushes, gc_runs;
  uint64_t reclaims, reclaimed_bytes; /* idle caches taken back, and what they held */
} tcache_totals_t;
void tcache_totals(tcache_totals_t *out, size_t *objects_per_class, tcache_thread_stats_t *threads, size_t max_threads);

/* ---- release.c: the background releaser ---- */
/* Asks for the releaser thread (something to release appeared); one load once it runs. */
void release_request(void);
/* Starts it if asked for. Call from an allocating call (malloc and the like; a free uses
 * release_poll_in_free), with no allocator lock held and outside any slow-path window: it may
 * create a thread, which allocates, and glibc frees memory while holding a lock pthread_create
 * takes (release.c). */
void release_poll(void);
/* The same from a free whose slow path was jumped to from the exported call, so that `ret` is that
 * call's return address: starts the releaser unless the dynamic loader (or qmalloc itself, for a
 * slow path called rather than jumped to) made the call (release.c). */
void release_poll_in_free(const void *ret);
uint64_t release_wakeups(void); /* times the thread woke (statistics) */
/* Makes the wake's condition (init_process; nothing allocated). */
void release_init(void);
/* Hands the retain cap's release to the releaser thread and wakes it before its period ends: true
 * if it runs and is not the caller, which then leaves the pages to it (pageheap_decay). Takes only
 * the wake's own lock (callable under the page heap's). */
bool release_wake(void);
/* Empties the transfer caches into their spans and gives every free page back to the OS (what
 * malloc_trim does once the thread caches are flushed); returns the bytes released or unmapped. */
size_t release_all_free(void);
void release_after_fork_child(void);

/* ---- fork.c: the fork protocol (docs/design.md "Fork") ---- */
/* One slot per lock the protocol knows, for the record of what prepare took. */
#define FORK_SLOT_REGISTRY 0
#define FORK_SLOT_CENTRAL(cls) (cls) /* 1 .. SIZECLASS_COUNT - 1 */
#define FORK_SLOT_PAGEHEAP SIZECLASS_COUNT
#define FORK_SLOT_PROF (SIZECLASS_COUNT + 1) /* prof.c's handlers take it after all the above, then
                                              prof_unwind.c's flag of the loader's list (no slot) */
#define FORK_SLOTS (SIZECLASS_COUNT + 2)
/* Registers the fork handlers (once, from init_process: pthread_atfork may allocate). */
void fork_register(void);
/* For the *_lock_for_fork functions: takes `lock` unless the process is single-threaded or the
 * forking thread holds it itself (below a signal handler); returns whether it took it. */
bool fork_lock(pthread_mutex_t *lock, unsigned slot);
/* For the *_unlock_after_fork functions: the parent releases `lock` if fork_lock took it; the
 * child re-initializes it in every case. */
void fork_unlock(pthread_mutex_t *lock, unsigned slot, bool child);

/* ---- init.c ---- */
extern bool init_done;
/* Idempotent; safe to call from any thread at any time, including before main. */
void init_process(void);

/* ---- check.c: the secret of the free tags (freelist.h), and the one-line fatal errors ---- */
void check_init(void); /* draws the secret; before any object exists (init_process) */
__attribute__((noreturn)) QM_COLD void check_fail_invalid(const char *call, const void *ptr);
/* A sized free (free_sized, sized delete) whose size does not name the block's size class. */
__attribute__((noreturn)) QM_COLD void check_fail_size(const char *call, size_t size, const void *ptr);
__attribute__((noreturn)) QM_COLD void check_fail_double_free(const char *call, const void *ptr);
__attribute__((noreturn)) QM_COLD void check_fail(const char *what, const void *ptr);

/* ---- harden.c: the hardened build only (every caller tests qm_hardened); no lock of its own ---- */
/* Bytes a small block needs past its request: the 8-byte record (harden.h). A request of n bytes
 * takes the class of n + HARDEN_TAIL; the canary is what is left before the record, up to 16
 * bytes, and none when the request reaches the record, whose keyed value is then the canary: an
 * overflow that changes its first byte makes it name a huge size. (9, one canary byte always, put
 * a request of 40 bytes, five pointers, in a 64-byte slot instead of 48: mtbench heap-leak's page
 * faults 1.20 times the default build's.) */
#define HARDEN_TAIL 8
/* The hand-out's and the free's checks, and the quarantine: harden.h (inline, api.c). */
/* The request size of live small block obj, read from its record, with the canary checked (else
 * "<call>: overflow past the end of the block", abort); a quarantined obj is an invalid pointer. */
size_t harden_request_size(void *obj, unsigned cls, const char *call);
/* Live obj of class cls now holds n bytes (realloc within its class): its canary and record
 * rewritten. */
void harden_resize(void *obj, unsigned cls, size_t n);
/* Thread exit (tcache.c): the quarantine's blocks go to the central lists; later frees skip it.
 * Takes central locks. */
void harden_thread_exit(void);
/* Links every slot of a new small span in random order, each free and filled with the pattern. */
void harden_carve(span_t *span, unsigned cls);
/* Checks every slot of a small span that has none out any more, before the span goes back to the
 * page heap (central.c): a write after free into one is reported ("free(): write after free"). */
void harden_check_emptied_span(const span_t *span);
/* malloc(0): an address in a reserved range where every access faults (NULL, ENOMEM, if the range
 * cannot be reserved); harden_is_zero tells such addresses (free does nothing with them). */
void *harden_zero_alloc(void);
bool harden_is_zero(const void *ptr);
/* Large spans: the last page made a guard (PROT_NONE), or accessible again. */
void harden_guard_large(span_t *span);
void harden_unguard_large(span_t *span); /* before a huge block is remapped (realloc) */
/* ---- harden_park.c (the hardened build; pageheap.c calls them under its lock) ---- */
/* A new page-heap chunk: gets a shadow, where its free spans' pages can wait. */
void harden_park_add_chunk(uintptr_t start, size_t bytes);
/* A range of page-heap address space was unmapped: its shadow goes too. */
void harden_park_forget(uintptr_t start, size_t bytes);
/* A freed range made inaccessible, its pages moved to its shadow where it has one. */
void harden_park(uintptr_t start, size_t bytes);
/* A range handed out again made accessible, with the pages its shadow holds. */
void harden_unpark(uintptr_t start, size_t bytes);
/* Releases the pages a free range's shadow holds; false if the kernel kept some (the range must
 * not then be counted as released: calloc trusts released pages to read as zero). */
bool harden_park_release(uintptr_t start, size_t bytes);
/* Where the shadow of [start, start + bytes) is, if the range lies in one chunk that has one; 0
 * otherwise. A shadow stays where it is while its range is not unmapped (harden_park_forget), so
 * its pages can be released after the lock is dropped, while the range is in no one's hands. */
uintptr_t harden_park_shadow_of(uintptr_t start, size_t bytes);

/* ---- stats.c ---- */
void stats_mapped_add(intptr_t bytes);
void stats_metadata_add(intptr_t bytes);
size_t stats_mapped(void); /* bytes mapped from the OS now */
#define STATS_THREADS_SHOWN 64
/* One consistent-enough picture of the whole heap (each layer read under its own lock). */
typedef struct stats_snapshot_s {
  /* the accounting identity: these add up to mapped */
  size_t in_use, thread_caches, transfer_caches, central_free, pageheap_free, released, metadata, mapped;
  /* how in_use splits, and counters */
  size_t small_in_use, large_in_use, huge_in_use, huge_blocks, free_spans, threads;
  intptr_t unclaimed_budget;
  uint64_t refills, flushes, gc_runs, idle_reclaims, idle_reclaimed_bytes, release_calls, released_bytes_total;
  uint64_t growth_released_bytes, release_failures, unmapped_bytes_total, unmap_failures, releaser_wakeups;
  uint64_t prof_sample_rate, prof_samples, prof_samples_stretched, prof_live_samples, prof_live_bytes; /* prof.c */
  size_t class_in_use[SIZECLASS_COUNT], class_free[SIZECLASS_COUNT], class_spans[SIZECLASS_COUNT];
  tcache_thread_stats_t thread[STATS_THREADS_SHOWN]; /* the first live caches (threads counts all) */
} stats_snapshot_t;
void stats_snapshot(stats_snapshot_t *out);
void stats_print(int fd, int format);
void stats_at_exit_prepare(void); /* keeps a copy of stderr for the report at exit */
void stats_at_exit(void);

#endif

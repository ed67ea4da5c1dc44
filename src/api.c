/* The allocation API: the two fast paths, every qm_* entry point, and the standard names
 * (malloc, free, ...) as aliases of them. Everything that is not a fast path is a QM_NOINLINE
 * *_slow function in this file or a call into tcache.c / pageheap.c.
 * Lock: none here. Callers: programs, new_delete.c. */
#include <errno.h>
#include <sched.h>
#include <stddef.h>
#include <string.h>

#include "freelist.h"
#include "harden.h"
#include "internal.h"
#include "log.h"
#include "os.h"
#include "prof.h"
#include "qmalloc.h"
#include "tcache_window.h"


static void *malloc_slow(size_t size);
static void *malloc_countdown_slow(size_t size);
static void *malloc_sample_slow(size_t size);
static void free_slow(void *ptr, bool sized, size_t size);
static void free_push_slow(void *ptr, tcache_fast_list_t *list);
/* The hardened build's malloc and free (qm_hardened: their own thread-cache paths, harden.h). */
QM_INLINE void *malloc_hardened(size_t size);
QM_INLINE void free_hardened(void *ptr, size_t size, bool sized, const char *call);

/* ================================ the fast paths ============================================= */

/* The fast paths reach this thread's lists through the thread pointer's segment (x86-64's %fs:
 * a tcache_fast_list_t pointer is an offset from it, tcache_window.h), so that an access costs no
 * instruction to turn the thread pointer into an address: a list is %fs:(the cache's offset +
 * class * 16). Measured with make fastpath: one instruction fewer on malloc and on free. */

/* The cache's offset from the thread pointer (initial-exec TLS: one GOT load), loaded once by
 * malloc for the profiler's countdown and the list. */
QM_INLINE uintptr_t tcache_tls_offset(void) {
#if defined(__x86_64__)
  uintptr_t off;
  __asm__("movq tcache_self@gottpoff(%%rip), %0" : "=r"(off));
  return off;
#else
  return 0;
#endif
}

/* This thread's list at `offset` (class * 16) in its cache, given the cache's tls_offset. */
QM_INLINE tcache_fast_list_t *tcache_list_from(size_t offset, uintptr_t tls_offset) {
#if QM_FAST_LIST_IN_FS
  return (tcache_fast_list_t *)(tls_offset + offset);
#else
  (void)tls_offset;
  return (tcache_fast_list_t *)((char *)tcache_self.lists + offset);
#endif
}

/* Subtracts size from this thread's countdown (types.h); true if that borrowed: size was larger
 * than the countdown, so a sample may be due, or size is over SMALL_MAX (the countdown never
 * holds more). On x86-64 one subtract on the thread-relative address and the carry flag (GCC
 * would otherwise compute the address again, measured with make fastpath). */
QM_INLINE bool prof_countdown_expired(size_t size, uintptr_t tls_offset) {
#if defined(__x86_64__)
  bool borrowed;
  __asm__ volatile("subq %2, %%fs:%c3(%1)"
                   : "=@ccc"(borrowed)
                   : "r"(tls_offset), "r"(size), "i"(offsetof(tcache_t, prof_countdown))
                   : "memory");
  return borrowed;
#else
  (void)tls_offset;
  uint64_t before = tcache_self.prof_countdown;
  tcache_self.prof_countdown = before - size;
  return size > before;
#endif
}

/* malloc stays here when: size <= SMALL_MAX, this thread's list for its class has an object above
 * its floor (the low-water mark, types.h), and is not being taken back
 * by another thread (the window, tcache_window.h). (A thread whose cache is not set up yet, or is
 * exiting, has empty lists.) The object handed out must carry its free tag, which is cleared
 * (freelist.h): a list whose link was overwritten stops the program here. */
QM_INLINE void *tcache_pop(tcache_fast_list_t *list) {
  /* The head is read before the pop's subtract: a pop that gives up does not use it, and the
   * head-to-next chain starts earlier (malloc-test 3% faster, measured). */
  void *obj = list->head;
#if defined(__x86_64__)
  __asm__("" : "+a"(obj)); /* in the return register from the start: no copy at the end */
#endif
  if (QM_LIKELY(list_begin_pop(list))) {
    list->head = freelist_take(obj); /* the pop's last write to the list (tcache_window.h) */
    return obj;
  }
  list_undo_pop(list);
  return NULL;
}

/* A request of at most SMALL_MAX bytes from this thread's list, or the slow path. */
QM_INLINE void *malloc_cached(size_t size, uintptr_t tls_offset) {
  void *obj = tcache_pop(tcache_list_from(sizeclass_list_offset_of(size), tls_offset));
  if (QM_LIKELY(obj != NULL)) return obj;
  return malloc_slow(size);
}

/* The countdown's one subtract and branch (types.h): a request it holds is at most SMALL_MAX bytes
 * and no sample is due, so it goes to the thread's list with no size test; any other goes to the
 * slow half (a request over SMALL_MAX, or the countdown ran out: refilled, or a sample). (The
 * hardened build, a compile-time constant, has its own path: docs/hardening.md.) */
QM_INLINE void *malloc_fast(size_t size) {
  if (qm_hardened) return malloc_hardened(size);
  uintptr_t tls_offset = tcache_tls_offset();
  if (QM_UNLIKELY(prof_countdown_expired(size, tls_offset))) return malloc_countdown_slow(size);
  return malloc_cached(size, tls_offset);
}

/* Pushes an object of class cls on this thread's list. Stays here when: the list is below its
 * maximum (0 for a thread not set up or exiting, and for the 8-byte class; a stopped list is above
 * any) and the object does not carry its free tag already (a double free, however delayed, and from
 * whichever thread the first free came; or a slot never handed out). Gives up before writing.
 * `tagged` (a constant at every call) says the object carries its tag already and rightly: the
 * hardened build's block leaving its quarantine (harden.h), whose free made the double free's test;
 * then the push writes its link alone, and the slow path, which tests the tag as any free's, gets
 * it with the tag taken off. */
QM_INLINE void free_push_to(void *ptr, tcache_fast_list_t *list, bool tagged) {
  uint16_t count = list_load_count(list);
  void *head = list->head;
  uintptr_t key = freelist_key(ptr);
  if (QM_LIKELY(count < list->max_count && (tagged || !freelist_tagged(ptr, key)))) {
    if (tagged) freelist_set_next(ptr, head);
    else freelist_mark(ptr, head, key);
    list_store_head_release(list, ptr); /* the link first: a taker may follow it */
    list_end_push(list);
    return;
  }
  if (tagged) freelist_forget_tag(ptr);
  free_push_slow(ptr, list);
}

/* This thread's list of class cls. */
QM_INLINE tcache_fast_list_t *class_list(unsigned cls) {
  return tcache_list_from((size_t)cls * sizeof(tcache_list_t), tcache_tls_offset());
}

QM_INLINE void free_push(void *ptr, unsigned cls) { free_push_to(ptr, class_list(cls), false); }

/* The hardened build's push of a block leaving its quarantine: it carries its free tag already. */
QM_INLINE void free_push_leaving(void *ptr, unsigned cls) { free_push_to(ptr, class_list(cls), true); }

/* The thread's cache as the fast paths see it (through %fs where the lists are, tcache_window.h). */
#if QM_FAST_LIST_IN_FS
typedef tcache_t __seg_fs tcache_fast_t;
#else
typedef tcache_t tcache_fast_t;
#endif
QM_INLINE tcache_fast_t *tcache_fast(uintptr_t tls_offset) {
#if QM_FAST_LIST_IN_FS
  return (tcache_fast_t *)tls_offset;
#else
  (void)tls_offset;
  return &tcache_self;
#endif
}

/* The page map's small entry for addr (PAGEMAP_SMALL_ENTRY: span start | class * 2; 0 for anything
 * but a page of a small span). A free usually lands in the same 1 GiB leaf as this thread's last
 * one (the heap grows as one contiguous range, docs/design.md), so the thread keeps that leaf:
 * a compare of the root index instead of the root's bounds check, load and NULL test (3
 * instructions fewer, make fastpath); a free elsewhere takes the root and moves the cache.
 * *null says addr was NULL, found on that cold branch, so that free(NULL) returns from there: 10
 * instructions, where it went through the divisibility test to free_slow in 26 (glibc takes 9),
 * and the fast path tests nothing more. (A thread that cached the leaf of the first 1 GiB sends
 * NULL the old way, page 0 having no entry: under valgrind, whose mappings land there.) */
QM_INLINE uintptr_t pagemap_small_entry(uintptr_t addr, uintptr_t tls_offset, bool *null) {
  uintptr_t page = addr >> PAGE_SHIFT, key = page >> PAGEMAP_LEAF_BITS;
  tcache_fast_t *tc = tcache_fast(tls_offset);
  *null = false;
  if (QM_UNLIKELY(key != tc->leaf_key)) {
    /* Inline, not a call: a call would make GCC set up a stack frame on the fast path too. */
    if (addr == 0) { /* free(NULL): the root's first page, which nothing else reads, stays untouched */
      *null = true;
      return 0;
    }
    pagemap_leaf_t *leaf = pagemap_leaf_of(addr);
    if (leaf == NULL) return 0;
    tc->leaf_base = (uintptr_t)leaf->small - (key << PAGEMAP_LEAF_BITS) * sizeof(uintptr_t);
    tc->leaf_key = key;
  }
  return __atomic_load_n((const uintptr_t *)(tc->leaf_base + page * sizeof(uintptr_t)), __ATOMIC_RELAXED);
}

/* The class's divisibility magic (sizeclass_magic[twice_cls / 2]) from this thread's copy
 * (tcache_t.magic) in one load: %fs, the cache's TLS offset free holds already, and the scaled
 * index (GCC would halve the index, or form the shared table's address first: one instruction
 * more each, make fastpath). No memory operand: naming tcache_self.magic made GCC load the TLS
 * offset a second time to form it. The copy is written once, at the thread's init, before which
 * it reads 0 (the slow path, which sets the thread up); so a value the compiler kept from earlier
 * is either that 0 or the value itself, never wrong. */
QM_INLINE uint64_t tcache_magic_of_twice(size_t twice_cls, uintptr_t tls_offset) {
#if QM_FAST_LIST_IN_FS
  uint64_t magic;
  __asm__("movq %%fs:%c3(%1,%2,4), %0" : "=r"(magic) : "r"(tls_offset), "r"(twice_cls), "i"(offsetof(tcache_t, magic)));
  return magic;
#else
  (void)tls_offset;
  return tcache_self.magic[twice_cls / 2];
#endif
}

/* Whether addr is at an object boundary of a small span, the page map's entry in *entry (class * 2
 * in its low byte, the span's start above): one multiply rejects interior pointers, foreign pointers
 * and pages that are not small alike (class 0's magic is 0). *null: addr was NULL
 * (pagemap_small_entry). The fast paths of free (both builds), realloc and malloc_usable_size. */
QM_INLINE bool small_object_at(uintptr_t addr, uintptr_t tls_offset, uintptr_t *entry, bool *null) {
  *entry = pagemap_small_entry(addr, tls_offset, null);
  size_t twice_cls = *entry & 0xff; /* the class * 2 (PAGEMAP_SMALL_ENTRY): a scaled index as it is */
  /* From the span's first object: addr is on a page of that span, so the offset is below the
   * span's length (< 2^32, which the divisibility test requires) without truncating. */
  uint64_t offset = addr + twice_cls;
  __asm__("" : "+r"(offset)); /* (addr + twice_cls) - entry: a lea and a subtract, not a copy and two */
  offset -= *entry;
  uint64_t magic = tcache_magic_of_twice(twice_cls, tls_offset);
  return offset * magic < magic;
}

/* free stays here when: ptr is at an object boundary of a small span (small_object_at), the class
 * is the one of the size a sized free names (expected_offset:
 * the class table's entry for the size, class * 16; the size must name the block's real class,
 * one compare with the entry as it is: 0, a size whose page of the table is not filled yet, names
 * none and goes the slow way), and free_push stays on its fast path. NULL, large and invalid
 * pointers go to free_slow. (size: the sized free's size, for its message.) */
QM_INLINE void free_fast(void *ptr, bool sized, size_t expected_offset, size_t size) {
  if (qm_hardened) {
    free_hardened(ptr, 0, false, "free()");
    return;
  }
  uintptr_t tls_offset = tcache_tls_offset(), entry;
  bool null, at_object = small_object_at((uintptr_t)ptr, tls_offset, &entry, &null);
  if (null) return; /* decided on the page map's cold branch: nothing on the fast path */
  size_t twice_cls = entry & 0xff;
  if (QM_LIKELY(at_object && (!sized || twice_cls * (sizeof(tcache_list_t) / 2) == expected_offset))) {
    free_push_to(ptr, tcache_list_from(twice_cls * (sizeof(tcache_list_t) / 2), tls_offset), false);
    return;
  }
  free_slow(ptr, sized, size);
}

/* ================================ slow halves ================================================= */

static QM_NOINLINE QM_COLD void *fail_enomem(void) {
  errno = ENOMEM;
  return NULL;
}

/* The last resort before ENOMEM, for a request of `bytes`: the kernel refused a mapping (RLIMIT_AS,
 * strict overcommit) even after the page heap unmapped its free spans, while free memory may sit
 * in the thread caches (up to tcache_total between them) and the transfer caches, keeping whole
 * spans out of the page heap or its free runs too short. malloc_trim's work gives them back (this
 * thread's cache and quarantine, every other cache not in use right now, the transfer caches, the
 * address space of free regions), and the caller tries again: OOM_GIVE_BACK_ROUNDS times at most,
 * yielding the CPU before each round after the first, since a thread in the middle of a call keeps
 * its cache until the call ends, and two threads out of memory at once race for what each round
 * frees. Not for a request that, with its alignment, is larger than all the process has mapped,
 * which no giving back can serve (a program probing sizes keeps its caches; so does
 * aligned_alloc(2^63, 10)). Seen in api-rlimit_as_threads, hardened, one run in
 * 200 under load: 27 MiB in four threads' caches, and the page heap's 39 MiB free in 39 spans,
 * none with room for an aligned 1 MiB block; with one round, two runs in 1,000 still failed. */
static QM_NOINLINE QM_COLD bool give_back_before_enomem(size_t bytes, unsigned round) {
  if (round >= OOM_GIVE_BACK_ROUNDS || bytes > stats_mapped()) return false;
  if (round > 0) sched_yield();
  (void)qm_trim(0);
  return true;
}

/* An object of class cls off the fast path (aligned requests, the slow half of malloc). */
static void *alloc_class(unsigned cls) {
  for (unsigned round = 0;; round++) {
    tcache_t *tc = tcache_open();
    void *obj = tcache_alloc_slow(tc, cls);
    tcache_close(tc);
    release_poll(); /* outside the window, in an allocating call: may create the releaser thread */
    if (obj != NULL) return obj;
    if (!give_back_before_enomem(sizeclass_size[cls], round)) return fail_enomem();
  }
}

/* A large block: whole pages from the page heap, aligned to `alignment` (a power of two); *zero
 * (may be NULL): the part of it known to read as zero (pageheap_alloc). */
static void *alloc_large(size_t size, size_t alignment, zero_range_t *zero) {
  if (size > PTRDIFF_MAX) return fail_enomem();
  size_t npages = (size + PAGE_MASK) >> PAGE_SHIFT;
  if (qm_hardened) npages++; /* a guard page after the block */
  size_t align_pages = alignment > PAGE_SIZE ? alignment >> PAGE_SHIFT : 1;
  zero_range_t known;
  release_poll(); /* an allocating call: may create the releaser thread, before the page heap's work */
  if (npages >= PAGEHEAP_GROWTH_RELEASE_PAGES) tcache_flush_for_growth(npages);
  span_t *span = pageheap_alloc(npages, align_pages, 0, &known);
  size_t need = alignment > SIZE_MAX - size ? SIZE_MAX : size + alignment; /* at most, with its alignment */
  for (unsigned round = 0; span == NULL && give_back_before_enomem(need, round); round++)
    span = pageheap_alloc(npages, align_pages, 0, &known);
  if (span == NULL) return fail_enomem();
  if (qm_hardened) harden_guard_large(span);
  if (zero) *zero = known;
  if (known.lo != span->start) freelist_forget_tag((void *)span->start);
  return (void *)span->start;
}

static QM_NOINLINE void *malloc_slow(size_t size) {
  if (QM_UNLIKELY(!init_done)) init_process();
  if (size <= SMALL_MAX) return alloc_class(sizeclass_of(size));
  return alloc_large(size, PAGE_SIZE, NULL);
}

/* Marks span as a sampled block of `size` bytes: flagged, so that its free tells the profiler, and
 * with the class its request would have had (0 above SMALL_MAX) in its sizeclass, so that a sized
 * free of it is checked as one of a block of that class would be (block_named_by), not accepted
 * for any size its whole pages hold. */
static void sampled_mark(span_t *span, size_t size) {
  span->sampled = PROF_PAGE_SAMPLED;
  span->sizeclass = (uint8_t)(size <= SMALL_MAX ? sizeclass_of(size) : 0);
}

/* The request reached the next sample (malloc_countdown_slow): prof.c draws the next interval and
 * decides whether this allocation is sampled; if not, the request goes on as malloc_fast's would
 * have (over SMALL_MAX: the slow path). A sampled block is served as whole pages of its own (a
 * large span, flagged), whatever its size, so that its free reaches free_slow (the page map's small
 * entry is 0 there) and nothing on the fast paths has to look for samples. One page per sample,
 * one sample per prof_sample bytes: 0.4% at 2 MiB. A sample of up to one page reuses a page this
 * thread kept from a sampled block it freed (prof_pages.c): no page-heap lock, no page-map write. */
static QM_NOINLINE void *malloc_sample_slow(size_t size) {
  if (QM_UNLIKELY(!init_done)) init_process();
  if (!prof_should_sample(size)) return size <= SMALL_MAX ? malloc_cached(size, tcache_tls_offset()) : malloc_slow(size);
  span_t *kept = size <= PAGE_SIZE ? prof_pages_take() : NULL;
  void *p = kept != NULL ? (void *)kept->start : alloc_large(size ? size : 1, PAGE_SIZE, NULL);
  if (p != NULL) {
    sampled_mark(pagemap_span((uintptr_t)p), size);
    prof_record(p, size);
  }
  return p;
}

/* The countdown borrowed (types.h): the request is over SMALL_MAX, or took the countdown's last
 * bytes. Unless it reaches the next sample (what the countdown held before the subtract and what
 * waits beyond it: never more than UINT64_MAX, since prof_beyond stays SMALL_MAX under it), the
 * countdown is refilled with up to SMALL_MAX of the bytes left and the request goes on, once per
 * SMALL_MAX bytes allocated at most below SMALL_MAX, so that at every size up to 32 KiB the refill
 * costs no more than the size test it replaces (make fastpath, docs/fastpath.md). A function apart
 * from malloc_sample_slow, so that it saves no registers. The borrow left the countdown near
 * UINT64_MAX, where a malloc would pass the fast path at any size: its first store makes it sane,
 * before anything that may allocate (init_process, the profiler). */
static QM_NOINLINE void *malloc_countdown_slow(size_t size) {
  tcache_t *tc = &tcache_self;
  uint64_t left = tc->prof_countdown + size + tc->prof_beyond; /* bytes to the next sample before size */
  if (QM_LIKELY(size <= left)) {
    prof_countdown_set(tc, left - size);
    return size <= SMALL_MAX ? malloc_cached(size, tcache_tls_offset()) : malloc_slow(size);
  }
  tc->prof_countdown = 0;
  return malloc_sample_slow(size);
}

/* Frees a large block; a sampled one is claimed (prof_pages_claim: of two frees of it at the same
 * instant one only has it), tells the profiler, and is kept for this thread's next sample or goes
 * to the page heap, which checks the rest under its lock (pageheap_free_block). */
static void free_large(span_t *span, void *ptr) {
  if (__atomic_load_n(&span->sampled, __ATOMIC_RELAXED)) {
    if (!prof_pages_claim(span, (uintptr_t)ptr)) check_fail_double_free("free()", ptr);
    prof_forget(ptr);
    if (prof_pages_keep(span)) return; /* for this thread's next sample */
  }
  pageheap_free_block(span, (uintptr_t)ptr);
}

/* What a pointer the program hands back is: its small class, or its large span. Stops the
 * program with one line if qmalloc did not hand it out. */
typedef struct block_s {
  unsigned cls;
  span_t *span;
} block_t;

static QM_NOINLINE QM_COLD __attribute__((noreturn)) void free_fail(void *ptr, const char *call);

/* Whether `size` can name a small block of class cls to free_sized and sized delete: its own
 * class, or a size down to half the block's, because realloc keeps a block in place down to half
 * its size (realloc_impl), as TCMalloc does, which saves the copy of a shrinking block (t-test1
 * to 128 KiB: a third of its instructions, in memcpy). A size outside that names another block
 * (a delete on a new[] array, a size from another object): the program stops. A size inside it
 * but not the one asked is accepted: harmless, since the block goes back to its real class.
 * The class table as filled so far is enough: a size in a page of it not filled yet has a class
 * that holds no block (each class but the first page's holds only sizes above half of it, which
 * the second test accepts; the first page is filled at init), so realloc's fast path calls this
 * with no call of its own. */
QM_INLINE bool sized_free_names(unsigned cls, size_t size) {
  size_t block = sizeclass_size[cls];
  return size <= SMALL_MAX && (sizeclass_of_if_filled(size) == cls || (size <= block && block <= 2 * size));
}


/* Whether a sized free's size (and alignment, above 16) names block b: for a small block as
 * sized_free_names says, or the aligned class; a sampled block (whole pages whatever its size) as
 * the class its request would have had; for a large block, its pages as alloc_large rounds them
 * (a huge block's mapping also to whole kernel pages), asked by a size no class holds.
 * free_slow and free_sized_slow. */
static bool block_named_by(block_t b, size_t size, size_t alignment) {
  unsigned expected = size > SMALL_MAX ? 0 : alignment > 16 ? sizeclass_for_aligned(size, alignment) : sizeclass_of(size);
  unsigned cls = b.cls != 0 ? b.cls : b.span->sizeclass; /* a large span's: sampled, or kept by realloc */
  if (cls != 0) return expected == cls || (alignment <= 16 && sized_free_names(cls, size));
  size_t pages = size ? (size + PAGE_MASK) >> PAGE_SHIFT : 1;
  size_t slack = b.span->direct && os_page_size() > PAGE_SIZE ? os_page_size() / PAGE_SIZE : 1;
  return expected == 0 && pages <= b.span->npages && b.span->npages - pages < slack;
}

/* A block that is free (a small one carries its free tag; a large one's pages are a free span, or
 * kept for the next sample) is not live: freeing it again is a double free, any other use
 * (realloc, malloc_usable_size) names an invalid pointer. */
static block_t block_of(void *ptr, const char *call, bool freeing) {
  uintptr_t addr = (uintptr_t)ptr;
  pagemap_leaf_t *leaf = pagemap_leaf_of(addr);
  if (leaf != NULL) {
    size_t i = (addr >> PAGE_SHIFT) & (PAGEMAP_LEAF_LEN - 1);
    uintptr_t entry = __atomic_load_n(&leaf->small[i], __ATOMIC_RELAXED);
    unsigned cls = pagemap_entry_class(entry);
    if (cls != 0) {
      uint64_t offset = addr - pagemap_entry_span_start(entry), magic = sizeclass_magic[cls];
      if (offset * magic < magic) { /* a multiple of the class size: free_fast's test, no division */
        if (sizeclass_size[cls] >= 16 && freelist_tagged(ptr, freelist_key(ptr))) {
          if (freeing) check_fail_double_free(call, ptr);
          check_fail_invalid(call, ptr);
        }
        return (block_t){cls, NULL};
      }
    } else {
      span_t *span = __atomic_load_n(&leaf->spans[i], __ATOMIC_RELAXED);
      if (span != NULL && span->start == addr) {
        /* A sampled block's page kept for the next sample (prof_pages.c) is no live block either. */
        bool kept = span->state == SPAN_LARGE && span->sampled == PROF_PAGE_STASHED;
        if (span->state == SPAN_LARGE && !kept) return (block_t){0, span};
        if (span_is_free(span) || kept) {
          if (freeing) check_fail_double_free(call, ptr);
          check_fail_invalid(call, ptr); /* as for a freed small block */
        }
      }
    }
  }
  free_fail(ptr, call);
}

static size_t block_usable(block_t b) {
  return b.cls ? sizeclass_size[b.cls] : (size_t)b.span->npages * PAGE_SIZE;
}

/* list: this thread's list of the object's class (its class is its index: the fast path need not
 * keep the class in a register for this call). */
static QM_NOINLINE void free_push_slow(void *ptr, tcache_fast_list_t *list) {
  const void *ret = __builtin_return_address(0); /* free's caller: the fast path jumps here */
  if (freelist_tagged(ptr, freelist_key(ptr))) check_fail_double_free("free()", ptr);
#if QM_FAST_LIST_IN_FS
  unsigned cls = (unsigned)(((uintptr_t)list - tcache_tls_offset()) / sizeof(tcache_list_t));
#else
  unsigned cls = (unsigned)((tcache_list_t *)list - tcache_self.lists);
#endif
  tcache_t *tc = tcache_open();
  tcache_free_slow(tc, ptr, cls);
  tcache_close(tc);
  release_poll_in_free(ret);
}

/* A pointer that is not a live block start, explained: inside a free span of the page heap at a
 * page boundary is a large block freed before (a double free); anything else is invalid. The page
 * map has entries only at a free span's ends, so this walks back page by page to the span that
 * contains ptr (error path only). */
static QM_NOINLINE QM_COLD __attribute__((noreturn)) void free_fail(void *ptr, const char *call) {
  uintptr_t addr = (uintptr_t)ptr;
  if ((addr & PAGE_MASK) == 0) {
    for (uintptr_t page = addr; page >= PAGE_SIZE && addr - page <= ((uintptr_t)UINT32_MAX << PAGE_SHIFT); page -= PAGE_SIZE) {
      pagemap_leaf_t *leaf = pagemap_leaf_of(page);
      if (leaf == NULL) break;
      span_t *span = __atomic_load_n(&leaf->spans[(page >> PAGE_SHIFT) & (PAGEMAP_LEAF_LEN - 1)], __ATOMIC_RELAXED);
      if (span == NULL || span->start != page || pagemap_span(span->start) != span) continue;
      bool inside = addr < span->start + (uintptr_t)span->npages * PAGE_SIZE;
      if (inside && span_is_free(span)) check_fail_double_free(call, ptr);
      break;
    }
  }
  check_fail_invalid(call, ptr);
}

/* The free of a pointer free_fast could not handle: NULL, a large block, a sized free whose size
 * names another class, or something qmalloc did not hand out. */
static QM_NOINLINE void free_slow(void *ptr, bool sized, size_t size) {
  const void *ret = __builtin_return_address(0); /* free's caller: the fast path jumps here */
  if (ptr == NULL) return;
  block_t b = block_of(ptr, sized ? "free_sized()" : "free()", true);
  if (sized && !block_named_by(b, size, 0)) check_fail_size("free_sized()", size, ptr);
  if (b.cls != 0) {
    free_push(ptr, b.cls);
  } else {
    free_large(b.span, ptr);
    release_poll_in_free(ret);
  }
}

static void *calloc_impl(size_t count, size_t size) {
  size_t total;
  if (QM_UNLIKELY(__builtin_mul_overflow(count, size, &total))) return fail_enomem();
  if (total <= SMALL_MAX) {
    void *p = malloc_fast(total);
    if (p) memset(p, 0, total);
    return p;
  }
  if (QM_UNLIKELY(!init_done)) init_process();
  /* Only what may hold data is cleared: pages given back or never touched read as zero, and a
   * clear would fault them in. A block made of a freed block's pages and the released pages next
   * to them (pageheap_join) has both kinds: calloc(8 MiB) there, 2 MiB of them freed just before,
   * took 1,537 page faults, now 1 (api-option_effects, calloc-joined). */
  zero_range_t zero;
  char *p = alloc_large(total, PAGE_SIZE, &zero);
  if (p == NULL) return NULL;
  uintptr_t start = (uintptr_t)p, end = start + total;
  if (zero.lo >= end || zero.hi <= start) zero.lo = zero.hi = end; /* none of it */
  if (zero.lo > start) memset(p, 0, (size_t)(zero.lo - start));
  if (zero.hi < end) memset((void *)zero.hi, 0, (size_t)(end - zero.hi));
  return p;
}

/* alignment: a power of two. Up to 16, plain malloc of at least `alignment` bytes: every class is a
 * multiple of 16 on page-aligned spans except the 8-byte one (min_align 8), which serves only
 * requests of at most 8 bytes. (free_aligned_sized mirrors the rounding.) */
static size_t aligned_small_size(size_t alignment, size_t size) { return size < alignment ? alignment : size; }

static void *aligned_hardened(size_t alignment, size_t size);

/* Aligned requests off aligned_impl's path: before init, a page of the class table not filled,
 * an empty list, large blocks and alignments over PAGE_SIZE. */
static QM_NOINLINE void *aligned_slow(size_t alignment, size_t size) {
  if (QM_UNLIKELY(!init_done)) init_process();
  unsigned cls = sizeclass_for_aligned(size, alignment);
  if (cls != 0) return alloc_class(cls);
  return alloc_large(size ? size : 1, alignment, NULL);
}

/* alignment: a power of two (every caller checks). Above 16, the first class from the request's
 * that is a multiple of it, popped from this thread's list as malloc pops it, with no call but in
 * tail position (alloc_class's slow path for every request, a division per class tried and the
 * registers it saved made a posix_memalign(64, 64) + free pair 163 instructions, TCMalloc's 90;
 * now 85, make fastpath). Not sampled: no countdown here, as before. */
QM_INLINE void *aligned_impl(size_t alignment, size_t size) {
  if (qm_hardened) return aligned_hardened(alignment, size);
  if (alignment <= 16) return malloc_fast(aligned_small_size(alignment, size));
  if (QM_LIKELY(size <= SMALL_MAX && alignment <= PAGE_SIZE)) {
    unsigned cls = sizeclass_aligned_from(sizeclass_of_if_filled(size < alignment ? alignment : size), alignment);
    if (QM_LIKELY(cls != 0)) {
      void *obj = tcache_pop(class_list(cls));
      if (QM_LIKELY(obj != NULL)) return obj;
    }
  }
  return aligned_slow(alignment, size);
}

/* Large block `span` resized to npages without a copy: in its pages, over the free pages after it
 * or shrunk where it is, or, a huge block, in its mapping or by a move of it (the kernel moves the
 * pages; shrunk to any large size, it stays in its mapping, as glibc's mmapped chunks do: a buffer
 * resized between 1 MB and 70 MB was copied each way, 0.3 ms a round). Its address, or NULL if it
 * must be copied. Both builds: the hardened one's npages count its guard page. */
static void *large_resize_no_copy(span_t *span, size_t npages) {
  if (npages == span->npages) return (void *)span->start;
  bool kept = span->direct ? pageheap_remap(span, npages) != NULL : pageheap_resize_in_place(span, npages);
  return kept ? (void *)span->start : NULL; /* a remap moves the span's start, the span stays */
}

/* A block realloc kept without a copy, from `was` to `now`: if it was sampled, the sample follows
 * it with its new size. */
static void sampled_resized(span_t *span, void *was, void *now, size_t size) {
  if (!span->sampled) return;
  sampled_mark(span, size);
  prof_resized(was, now, size);
}

static void *realloc_hardened(void *ptr, size_t size);

/* A live small block of class cls that realloc cannot keep in place: a new one, the contents
 * copied, the old one freed. */
static QM_NOINLINE void *realloc_move_small(void *ptr, size_t size, unsigned cls) {
  size_t old = sizeclass_size[cls];
  void *fresh = malloc_fast(size);
  if (fresh == NULL) return NULL; /* the old block stays valid, as C requires */
  memcpy(fresh, ptr, old < size ? old : size);
  if (size > old && old >= REALLOC_UNCACHED_MIN) {
    /* A block that grew out of a large class: the program keeps growing it (a list, a buffer), so
     * the old one goes to its span rather than the thread cache, where it would wait for a request
     * of its size that does not come (python3 growing lists: 14 MB of peak RSS at scale 10 of
     * mtbench's python-objects). An emptied span goes back to the page heap, whose free runs
     * coalesce and serve the next, larger block. */
    tcache_free_uncached(ptr, cls);
    return fresh;
  }
  free_push(ptr, cls); /* its class is known: no second page-map walk */
  return fresh;
}

/* Everything realloc_impl does not: NULL, size 0, sizes over SMALL_MAX, large and sampled blocks,
 * the 8-byte class, and pointers that are not live blocks (the one-line error). */
static QM_NOINLINE void *realloc_slow(void *ptr, size_t size) {
  if (ptr == NULL) return malloc_fast(size);
  if (size == 0) { /* glibc: frees and returns NULL */
    free_fast(ptr, false, 0, 0);
    return NULL;
  }
  block_t b = block_of(ptr, "realloc()", false);
  if (b.cls != 0) {
    if (size <= SMALL_MAX && sized_free_names(b.cls, size)) return ptr; /* in place */
    return realloc_move_small(ptr, size, b.cls);
  }
  size_t old = block_usable(b);
  if (size <= SMALL_MAX && size <= old && old <= 2 * size) {
    /* A large block (or a sampled one: whole pages whatever its size) shrunk to a small size keeps
     * its place down to half, as a block of a class does; the span files the class of the new
     * size, so that a sized free of it names the block (block_named_by). Moving it each way copied
     * a buffer resized back and forth across 256 KiB at every call: 8 us, where glibc and TCMalloc
     * copy nothing. */
    b.span->sizeclass = (uint8_t)sizeclass_of(size);
    sampled_resized(b.span, ptr, ptr, size);
    return ptr;
  }
  if (size > SMALL_MAX && size <= PTRDIFF_MAX) {
    void *same = large_resize_no_copy(b.span, (size + PAGE_MASK) >> PAGE_SHIFT);
    if (same != NULL) {
      b.span->sizeclass = 0; /* a large size again (a small one may have been filed, above) */
      sampled_resized(b.span, ptr, same, size);
      return same;
    }
  }
  void *fresh = malloc_fast(size);
  if (fresh == NULL) return NULL; /* the old block stays valid, as C requires */
  memcpy(fresh, ptr, old < size ? old : size);
  free_fast(ptr, false, 0, 0);
  return fresh;
}

/* The class of ptr if it is a live small block of a class with a free tag (16 bytes and more),
 * found as free_fast finds it (the thread's page-map leaf, one multiply) and not carrying its free
 * tag; 0 for anything else (NULL, large and sampled blocks, the 8-byte class, a freed block, a
 * foreign or interior pointer), which the caller's slow path sorts out and reports. *null: ptr was
 * NULL (pagemap_small_entry). */
QM_INLINE unsigned live_small_class(void *ptr, uintptr_t tls_offset, bool *null) {
  uintptr_t entry;
  bool at_object = small_object_at((uintptr_t)ptr, tls_offset, &entry, null);
  size_t twice_cls = entry & 0xff;
  if (QM_LIKELY(at_object && twice_cls > 2 * SIZECLASS_EIGHT && !freelist_tagged(ptr, freelist_key(ptr))))
    return (unsigned)(twice_cls / 2);
  return 0;
}

/* block_of for a caller that is not freeing, a live small block found first without its walk of
 * the page map's root. */
QM_INLINE block_t live_block_of(void *ptr, const char *call) {
  bool null; /* (its callers took NULL aside) */
  unsigned cls = live_small_class(ptr, tcache_tls_offset(), &null);
  return cls != 0 ? (block_t){cls, NULL} : block_of(ptr, call, false);
}

/* realloc stays here when ptr is a live small block (live_small_class) and the new size keeps it
 * in place: the block's class, or a smaller one down to half the block (sized_free_names). A
 * move of such a block knows its class (realloc_move_small); anything else is realloc_slow's. Only
 * calls in tail position, so that staying in place saves no registers: with block_of called first
 * for every block, a realloc that kept its block took 105 instructions, TCMalloc's 55, now 36
 * (make fastpath, docs/fastpath.md). */
QM_INLINE void *realloc_impl(void *ptr, size_t size) {
  if (qm_hardened) return realloc_hardened(ptr, size);
  bool null = false;
  unsigned cls = size - 1 < SMALL_MAX ? live_small_class(ptr, tcache_tls_offset(), &null) : 0;
  if (null) return malloc_fast(size); /* realloc(NULL, n), found on the page map's cold branch */
  if (QM_LIKELY(cls != 0)) return sized_free_names(cls, size) ? ptr : realloc_move_small(ptr, size, cls);
  return realloc_slow(ptr, size);
}

static bool is_power_of_two(size_t x) { return x != 0 && (x & (x - 1)) == 0; }

/* ================================ the hardened build ========================================== */
/* With qm_hardened (libqmalloc-hardened) every malloc and free takes these paths: the checks and
 * the layout of blocks are harden.h's and harden.c's (docs/hardening.md); what is here is which
 * layer to call. Small blocks take the class of request + HARDEN_TAIL (canary and record) from the
 * thread cache as malloc_cached does, and go back through the thread's quarantine to free_push; large
 * ones get one page more (the guard); zero-size ones point into an inaccessible range. */

static QM_NOINLINE void *malloc_hardened_slow(size_t size) {
  if (size == 0) return harden_zero_alloc();
  if (size > PTRDIFF_MAX) return fail_enomem();
  if (QM_UNLIKELY(!init_done)) init_process();
  return alloc_large(size, PAGE_SIZE, NULL);
}

/* A small request whose pop failed: the slow half fills the list (and the class table's page of
 * this size), then the hand-out. A call of its own, so that malloc_hardened calls nothing but in
 * tail position and saves no registers (6 instructions a pair, make fastpath). */
static QM_NOINLINE void *malloc_hardened_refill(size_t size) {
  void *obj = malloc_slow(size + HARDEN_TAIL);
  return obj ? harden_handout(obj, sizeclass_of_if_filled(size + HARDEN_TAIL), size) : NULL;
}

QM_INLINE void *malloc_hardened(size_t size) {
  if (QM_LIKELY(size - 1 < SMALL_MAX - HARDEN_TAIL)) { /* 1 .. SMALL_MAX - HARDEN_TAIL */
    size_t list_offset = sizeclass_list_offset_of(size + HARDEN_TAIL);
    void *obj = tcache_pop(tcache_list_from(list_offset, tcache_tls_offset()));
    /* A pop found the class through a filled entry (class 0's list is always empty): the class is
     * the entry, not a second lookup. */
    if (QM_LIKELY(obj != NULL)) return harden_handout(obj, sizeclass_of_list_offset(list_offset), size);
    return malloc_hardened_refill(size);
  }
  return malloc_hardened_slow(size);
}

static QM_NOINLINE void *aligned_hardened(size_t alignment, size_t size) {
  if (alignment <= 16) return malloc_hardened(aligned_small_size(alignment, size));
  if (QM_UNLIKELY(!init_done)) init_process();
  if (size > PTRDIFF_MAX) return fail_enomem();
  unsigned cls = sizeclass_for_aligned(size + HARDEN_TAIL, alignment);
  if (cls != 0) {
    /* The class's list as malloc_hardened pops it; alloc_class's slow path when it is empty. */
    void *obj = tcache_pop(class_list(cls));
    if (obj == NULL) obj = alloc_class(cls);
    return obj ? harden_handout(obj, cls, size) : NULL;
  }
  return alloc_large(size ? size : 1, alignment, NULL);
}

/* Large blocks: their pages but the guard. */
static size_t large_usable_hardened(const span_t *span) { return ((size_t)span->npages - 1) * PAGE_SIZE; }

/* Off the quarantine's one-test path: the small ring filling, a block over HARDEN_QUARANTINE_SMALL
 * (the large ring), the thread exiting. A large ring at its bound swaps in place
 * (harden_quarantine_swap_large: no call into harden.c, no byte trim); otherwise the slow half
 * (harden_quarantine_add). The block that leaves goes to this thread's list; if a larger block took
 * a smaller one's place in the large ring, random blocks leave it until it is back under its byte
 * bound. */
static QM_NOINLINE void quarantine_add_hardened(void *ptr, unsigned cls) {
  unsigned leaving_cls;
  void *leaving = harden_quarantine_swap_large(ptr, cls, sizeclass_size[cls], &leaving_cls);
  if (leaving != NULL) {
    free_push_leaving(leaving, leaving_cls);
    return;
  }
  leaving = harden_quarantine_add(ptr, cls, &leaving_cls);
  if (leaving != NULL) free_push_leaving(leaving, leaving_cls);
  while ((leaving = harden_quarantine_over(&leaving_cls)) != NULL) free_push_leaving(leaving, leaving_cls);
}

/* A small block's free after its class and span are known: checked and filled, into the
 * quarantine, and the block that leaves it (if any) onto this thread's list. */
QM_INLINE void free_small_hardened(void *ptr, unsigned cls, size_t size, bool sized, const char *call) {
  if (!harden_retire(ptr, cls, sized, size, call)) return; /* reported: harden_reject does not return */
  if (QM_UNLIKELY(!harden_quarantine_fast(cls))) {
    quarantine_add_hardened(ptr, cls);
    return;
  }
  unsigned leaving_cls;
  void *leaving = harden_quarantine_swap(ptr, cls, &leaving_cls);
  if (!harden_leaving_intact(leaving)) {
    harden_reject(HARDEN_WRITE_AFTER_FREE, "free()", leaving, 0);
    return;
  }
  free_push_leaving(leaving, leaving_cls);
}

/* NULL, zero-size, large, invalid and double-freed pointers. */
static QM_NOINLINE void free_hardened_slow(void *ptr, size_t size, bool sized, const char *call) {
  const void *ret = __builtin_return_address(0); /* free's caller: free_hardened jumps here */
  if (ptr == NULL || harden_is_zero(ptr)) return;
  block_t b = block_of(ptr, call, true);
  if (b.cls == 0) {
    size_t pages = size ? (size + PAGE_MASK) >> PAGE_SHIFT : 1;
    if (sized && pages + 1 != b.span->npages) check_fail_size(call, size, ptr); /* + the guard */
    pageheap_free_block(b.span, (uintptr_t)ptr);
    release_poll_in_free(ret);
    return;
  }
  free_small_hardened(ptr, b.cls, size, sized, call);
}

/* As free_fast: the page map says ptr is at an object boundary of a small span (one multiply). */
QM_INLINE void free_hardened(void *ptr, size_t size, bool sized, const char *call) {
  uintptr_t tls_offset = tcache_tls_offset(), entry;
  bool null, at_object = small_object_at((uintptr_t)ptr, tls_offset, &entry, &null);
  if (null) return; /* free(NULL), found on the page map's cold branch, as free_fast does */
  if (QM_LIKELY(at_object)) {
    free_small_hardened(ptr, pagemap_entry_class(entry), size, sized, call);
    return;
  }
  free_hardened_slow(ptr, size, sized, call);
}

static QM_NOINLINE void quarantine_flush_hardened(void) {
  unsigned cls;
  for (void *leaving; (leaving = harden_quarantine_evict(&cls)) != NULL;) free_push_leaving(leaving, cls);
}

/* Within its class a small block is resized in place; anything else moves (the old block then
 * goes through the quarantine, or is made inaccessible if large, like any freed block). */
static QM_NOINLINE void *realloc_hardened(void *ptr, size_t size) {
  if (ptr == NULL) return malloc_hardened(size);
  if (size == 0) { /* glibc: frees and returns NULL */
    free_hardened(ptr, 0, false, "realloc()");
    return NULL;
  }
  if (harden_is_zero(ptr)) return malloc_hardened(size);
  /* (a quarantined block carries its free tag: block_of reports it) */
  block_t b = live_block_of(ptr, "realloc()");
  size_t old;
  if (b.cls != 0) {
    old = harden_request_size(ptr, b.cls, "realloc()");
    /* In place where the default build keeps a block (its class, or down to half its slot), for
     * the request and its tail: the record and canary move to the new size, so every check holds
     * as for a fresh block. */
    if (size <= SMALL_MAX - HARDEN_TAIL && sized_free_names(b.cls, size + HARDEN_TAIL)) {
      harden_resize(ptr, b.cls, size);
      return ptr;
    }
  } else {
    old = large_usable_hardened(b.span);
    if (size > SMALL_MAX && size <= PTRDIFF_MAX) {
      /* Without a copy where the default build does it (large_resize_no_copy), its guard moved
       * to its new last page; the pages a shrink gives up become inaccessible (pageheap.c), a huge
       * block's old range is unmapped. Each was a copy: growing one to 32 MiB in 8 KiB steps took
       * 6.7 s, shrinking one from 16 MiB 1.7 s (glibc 0.02 and 0.01 s). */
      size_t npages = ((size + PAGE_MASK) >> PAGE_SHIFT) + 1; /* + the guard */
      if (npages == b.span->npages) return ptr; /* (nothing is sampled here: no countdown) */
      harden_unguard_large(b.span);
      void *same = large_resize_no_copy(b.span, npages);
      harden_guard_large(b.span);
      if (same != NULL) return same;
    }
  }
  void *fresh = malloc_hardened(size);
  if (fresh == NULL) return NULL; /* the old block stays valid, as C requires */
  memcpy(fresh, ptr, old < size ? old : size);
  free_hardened(ptr, 0, false, "realloc()");
  return fresh;
}

/* The request size of a small block (its canary checked), the pages but the guard of a large one. */
static QM_NOINLINE size_t usable_hardened(void *ptr) {
  if (harden_is_zero(ptr)) return 0;
  block_t b = live_block_of(ptr, "malloc_usable_size()");
  return b.cls ? harden_request_size(ptr, b.cls, "malloc_usable_size()") : large_usable_hardened(b.span);
}

/* ================================ entry points ================================================ */

QM_EXPORT void *qm_malloc(size_t size) { return malloc_fast(size); }

QM_EXPORT void qm_free(void *ptr) { free_fast(ptr, false, 0, 0); }

QM_EXPORT void *qm_calloc(size_t count, size_t size) { return calloc_impl(count, size); }

QM_EXPORT void *qm_realloc(void *ptr, size_t size) { return realloc_impl(ptr, size); }

QM_EXPORT void *qm_reallocarray(void *ptr, size_t count, size_t size) {
  size_t total;
  if (__builtin_mul_overflow(count, size, &total)) return fail_enomem();
  return realloc_impl(ptr, total);
}

QM_EXPORT int qm_posix_memalign(void **result, size_t alignment, size_t size) {
  if (!is_power_of_two(alignment) || alignment % sizeof(void *) != 0) return EINVAL;
  void *p = aligned_impl(alignment, size);
  if (p == NULL) return errno = ENOMEM; /* glibc leaves ENOMEM in errno too; programs check it */
  *result = p;
  return 0;
}

/* C11/C17 and glibc 2.38+: an alignment that is not a power of two is an error. */
QM_EXPORT void *qm_aligned_alloc(size_t alignment, size_t size) {
  if (!is_power_of_two(alignment)) {
    errno = EINVAL;
    return NULL;
  }
  return aligned_impl(alignment, size);
}

/* glibc: an alignment that is not a power of two is rounded up to one; absurd ones fail. */
QM_EXPORT void *qm_memalign(size_t alignment, size_t size) {
  if (alignment > SIZE_MAX / 2 + 1) {
    errno = EINVAL;
    return NULL;
  }
  if (!is_power_of_two(alignment)) {
    size_t a = 16;
    while (a < alignment) a <<= 1;
    alignment = a;
  }
  return aligned_impl(alignment, size);
}

QM_EXPORT void *qm_valloc(size_t size) { return aligned_impl(os_page_size(), size); }

QM_EXPORT void *qm_pvalloc(size_t size) {
  size_t page = os_page_size();
  if (size > SIZE_MAX - page) return fail_enomem();
  size_t rounded = size ? (size + page - 1) & ~(page - 1) : page;
  return aligned_impl(page, rounded);
}

static size_t usable_hardened(void *ptr);

/* A live small block's class size without block_of's walk of the page map's root (a loop of calls
 * under callgrind, loop included: 60 a call before, now 36; TCMalloc 38, mimalloc 35, glibc 20). */
QM_EXPORT size_t qm_malloc_usable_size(void *ptr) {
  if (ptr == NULL) return 0;
  if (qm_hardened) return usable_hardened(ptr);
  return block_usable(live_block_of(ptr, "malloc_usable_size()"));
}

/* A sized free off the fast path: a block above SMALL_MAX, or an alignment above 16. The
 * size must name the block: its size class, or for a large block its number of pages; otherwise the
 * program stops (a wrong size would file the object under another class). */
static QM_NOINLINE void free_sized_slow(void *ptr, size_t size, size_t alignment) {
  if (qm_hardened) {
    free_hardened(ptr, size, true, "free_sized()");
    return;
  }
  if (ptr == NULL) return;
  block_t b = block_of(ptr, "free_sized()", true);
  if (!block_named_by(b, size, alignment)) check_fail_size("free_sized()", size, ptr);
  if (b.cls != 0) free_push(ptr, b.cls);
  else free_large(b.span, ptr);
}

/* free_sized and sized delete: the size names the class, and the page map's class must be that one
 * (one compare more than free()). Sizes above SMALL_MAX go the slow way, checked as well. */
QM_EXPORT void qm_free_sized(void *ptr, size_t size) {
  if (qm_hardened) {
    free_hardened(ptr, size, true, "free_sized()");
    return;
  }
  if (QM_LIKELY(size <= SMALL_MAX)) {
    free_fast(ptr, true, sizeclass_list_offset_of(size), size);
    return;
  }
  free_sized_slow(ptr, size, 0);
}

QM_EXPORT void qm_free_aligned_sized(void *ptr, size_t alignment, size_t size) {
  if (alignment <= 16) {
    qm_free_sized(ptr, aligned_small_size(alignment, size));
    return;
  }
  free_sized_slow(ptr, size, alignment);
}

static void quarantine_flush_hardened(void);

QM_EXPORT int qm_trim(size_t pad) {
  if (!init_done) return 0;
  if (qm_hardened) quarantine_flush_hardened();
  tcache_flush_self();
  prof_pages_release(false); /* this thread's kept sampled page (other threads' stay: one page each at most) */
  tcache_reclaim_idle(true); /* every other cache not in use right now */
  return release_all_free() > 0;
}

QM_EXPORT void qm_stats_print(int fd, int format) { stats_print(fd, format); }

/* ================================ the standard names ========================================== */

/* Left out when QM_STD_NAMES is 0 (the sanitizer build: its runtime owns these names). An #if and
 * not a plain `if (config)`: these are symbol definitions, which only the preprocessor removes. */
#if QM_STD_NAMES
#define QM_ALIAS(target) __attribute__((alias(#target), visibility("default"), used))
void *malloc(size_t size) QM_ALIAS(qm_malloc);
void free(void *ptr) QM_ALIAS(qm_free);
void *calloc(size_t count, size_t size) QM_ALIAS(qm_calloc);
void *realloc(void *ptr, size_t size) QM_ALIAS(qm_realloc);
void *reallocarray(void *ptr, size_t count, size_t size) QM_ALIAS(qm_reallocarray);
int posix_memalign(void **result, size_t alignment, size_t size) QM_ALIAS(qm_posix_memalign);
void *aligned_alloc(size_t alignment, size_t size) QM_ALIAS(qm_aligned_alloc);
void *memalign(size_t alignment, size_t size) QM_ALIAS(qm_memalign);
void *valloc(size_t size) QM_ALIAS(qm_valloc);
void *pvalloc(size_t size) QM_ALIAS(qm_pvalloc);
size_t malloc_usable_size(void *ptr) QM_ALIAS(qm_malloc_usable_size);
void free_sized(void *ptr, size_t size) QM_ALIAS(qm_free_sized);
void free_aligned_sized(void *ptr, size_t alignment, size_t size) QM_ALIAS(qm_free_aligned_sized);
int malloc_trim(size_t pad) QM_ALIAS(qm_trim);
/* glibc exports its allocator under these names too, and some programs and interposers call them
 * directly (a wrapper that forwards malloc to __libc_malloc, a binary from before glibc 2.26
 * calling cfree). Left to glibc, such a block reaches qmalloc's free, or one of qmalloc's reaches
 * glibc's free, which may take qmalloc's memory for one of its chunks: both allocators must never
 * see each other's blocks, so these names are qmalloc's as well (TCMalloc and mimalloc do the
 * same). */
void *__libc_malloc(size_t size) QM_ALIAS(qm_malloc);
void __libc_free(void *ptr) QM_ALIAS(qm_free);
void *__libc_calloc(size_t count, size_t size) QM_ALIAS(qm_calloc);
void *__libc_realloc(void *ptr, size_t size) QM_ALIAS(qm_realloc);
void *__libc_memalign(size_t alignment, size_t size) QM_ALIAS(qm_memalign);
void *__libc_valloc(size_t size) QM_ALIAS(qm_valloc);
void *__libc_pvalloc(size_t size) QM_ALIAS(qm_pvalloc);
void cfree(void *ptr) QM_ALIAS(qm_free);
#endif

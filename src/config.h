/* Compile-time constants and the hot/cold markers. Each constant says why it has its value.
 * Tunables that an operator may want to change at run time are options (options.h), not here. */
#ifndef QM_CONFIG_H
#define QM_CONFIG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define QM_LIKELY(x) __builtin_expect(!!(x), 1)
#define QM_UNLIKELY(x) __builtin_expect(!!(x), 0)
#define QM_INLINE static inline __attribute__((always_inline))
#define QM_NOINLINE __attribute__((noinline))
#define QM_COLD __attribute__((cold))
#define QM_EXPORT __attribute__((visibility("default")))
/* For a small global that every process writes at start (init, options, the first span; and the
 * heap profiler's, which the first sample writes, and most processes take one): it goes
 * with the library's .data, a page the process writes anyway, rather than on a .bss page between
 * the large arrays (page map root, option strings, class table), which costs a page fault when
 * first touched and two when that touch is a read (docs/design.md, "What a process pays at
 * start"). Not for anything large: .data is one page. */
#define QM_EARLY_DATA __attribute__((section(".data.qm_early")))
/* What structs shared between threads (central_t) are aligned to, against false sharing. 64 bytes:
 * the line of x86-64 and of most aarch64 cores (Neoverse, Cortex-A). Some aarch64 parts have longer
 * lines (Apple M-series and Cavium ThunderX 128 bytes, Fujitsu A64FX 256), and Intel's adjacent-line
 * prefetcher pairs 64-byte lines: there two neighbours can still share a unit. Kept at 64 (no
 * measurement on those parts says the padding pays); only speed depends on it, never correctness. */
#define QM_CACHELINE 64

/* The hardened build (libqmalloc-hardened.so, -DQM_HARDENED=1): canaries, write-after-free checks,
 * quarantine, protected freed large blocks, guard pages, randomized spans (harden.c,
 * docs/hardening.md). A constant, tested with a plain if: the default build compiles none of it. */
#if defined(QM_HARDENED) && QM_HARDENED
#define QM_HARDENED_BUILD 1 /* the same as a constant expression (array sizes) */
#else
#define QM_HARDENED_BUILD 0
#endif
static const bool qm_hardened = QM_HARDENED_BUILD;

#ifdef QM_DEBUG
static const int qm_debug = 1; /* run the <module>_check() invariants on slow paths */
#else
static const int qm_debug = 0;
#endif

/* QM_STD_NAMES (CMake option, default 1): export malloc, free, ... and the C++ operators. 0 keeps
 * only the qm_* names, for the sanitizer build, whose runtime defines the standard ones itself. */
#ifndef QM_STD_NAMES
#define QM_STD_NAMES 1
#endif

/* 8 KiB pages, as TCMalloc: a 1-page span holds 1024 8-byte objects, which keeps the span header
 * (64 bytes) under 1% of the memory of the smallest objects, and halves page-map entries. */
#define PAGE_SHIFT 13
#define PAGE_SIZE ((size_t)1 << PAGE_SHIFT)
#define PAGE_MASK (PAGE_SIZE - 1)

/* Requests up to SMALL_MAX are served from size classes and thread caches (no lock); above it the
 * page heap serves them under its lock. 256 KiB (not the 2005 TCMalloc's 32 KiB) keeps the common
 * medium sizes (buffers, hash tables) off the one global lock. */
#define SMALL_MAX ((size_t)256 * 1024)

/* Page map: a two-level radix tree over 48-bit addresses (x86-64 and aarch64 user space).
 * 2^18 root slots in .bss (2 MiB of address space, touched only where memory is) and leaves of
 * 2^17 pages (1 GiB of address space each), mapped when first needed. */
#define ADDRESS_BITS 48
#define PAGEMAP_LEAF_BITS 17
#define PAGEMAP_LEAF_LEN ((size_t)1 << PAGEMAP_LEAF_BITS)
#define PAGEMAP_LEAF_SHIFT (PAGE_SHIFT + PAGEMAP_LEAF_BITS)
#define PAGEMAP_ROOT_LEN ((size_t)1 << (ADDRESS_BITS - PAGEMAP_LEAF_SHIFT))

/* The page heap takes address space from the OS in chunks of at least this size: one mmap per
 * 32 MiB keeps system calls off the allocation path; untouched pages cost no RSS. */
#define OS_CHUNK_SIZE ((size_t)32 << 20)

/* Out of memory (api.c, give_back_before_enomem): how many times a request the kernel refused
 * gives back what the caches hold and tries again before it fails with ENOMEM. */
#define OOM_GIVE_BACK_ROUNDS 3

/* A request of at least this many pages that faults pages in at a new high of the heap in use first
 * releases free backed ones (pageheap.c, pageheap_release_for_growth). Measured with a first version
 * that released any free span: for requests of every size, at every request, t-test1 and
 * mixed-stress (blocks to 128 KiB, spans coming and going) took 1.069 and 1.146 times the time
 * (mtbench's quick preset, 5 repetitions side by side), their small free spans gone back and faulted
 * in again; at new highs only, mixed-stress 1.076 (0.937-1.289); with this bound too, 0.990 and 1.006. */
#define PAGEHEAP_GROWTH_RELEASE_PAGES (((size_t)1 << 20) / PAGE_SIZE)
/* Such a request, when it is a large block, first sends the calling thread's cached objects of the
 * classes from this size up to their spans (tcache.c, tcache_flush_for_growth). Their spans hold one
 * or two objects each, so each one idle in a thread cache keeps a span out of the page heap, where
 * it could serve the block or be released as the block's pages are faulted in. python3 -m test
 * test_dict held 2.4 MB there as it made its largest dict table (6.7 MB): mtbench's python-tests
 * peaked at 27.4 MB instead of 28.9 (glibc 24.5; quick preset, 3 repetitions side by side), the
 * other real programs unchanged. Other bounds, two runs each of test_dict under another python3
 * (pyenv's 3.11.7): 31.8 MB with none, 30.2-30.4 from 64 KiB, 30.5-30.9 from 16 KiB (spans of two to
 * four objects, most not emptied by it), 31.1-31.2 with every class. */
#define TCACHE_GROWTH_FLUSH_MIN ((size_t)64 << 10)
/* How many of the free backed spans such a request looks at, the ones free longest first: a bound
 * on the time a request spends there, taken under the page heap's lock. */
#define PAGEHEAP_GROWTH_SCAN 64

/* A freed large block of at least PAGEHEAP_RESIDENCY_MIN_PAGES pages (256 KiB: not the heap
 * profiler's sampled blocks, a page or two each) whose last page holds no memory has its runs of
 * pages that hold none filed released, not backed (pageheap_file_freed). Only runs of at least
 * PAGEHEAP_RESIDENCY_RUN_PAGES (128 KiB), and the first PAGEHEAP_RESIDENCY_RUNS of them, are cut
 * off: a block touched here and there is not cut into pieces that no longer serve a request of its
 * size in one. */
#define PAGEHEAP_RESIDENCY_MIN_PAGES 32
#define PAGEHEAP_RESIDENCY_RUN_PAGES 16
#define PAGEHEAP_RESIDENCY_RUNS 8
/* ... and that lived at least this long. A block freed soon after it was handed out (a scratch
 * buffer of each request, a loop's) is taken again as soon, whatever its pages hold, and its
 * system calls were most of such a loop's time: 1 MiB allocated, 4 KiB of it written and freed,
 * 0.24 us a round, 4.7 us with the question asked every time (glibc 0.09 us). Blocks that live
 * (sqlite3's sorter buffer: 16-30 ms) are the ones whose free pages stay around. The clock is the
 * coarse one (os_now_ms): a tick of 1 to 4 ms. */
#define PAGEHEAP_RESIDENCY_MIN_AGE_MS 10

/* How many spans a thread takes out of the free sets for release at a time (pageheap.c,
 * release_batch_t): their madvise calls run with the page heap's lock released, and the lock is
 * taken once to file them all. */
#define PAGEHEAP_RELEASE_BATCH 32

/* Free spans shorter than this many pages live in exact-length lists; longer ones in one list
 * searched best-fit (few and large, so the search is short). */
#define PAGEHEAP_EXACT_LISTS 128

/* Slots smaller than CARVE_LANE_MIN_BYTES are handed out from CARVE_LANES lanes in turn, each a
 * run of consecutive slots a quarter of the page(s) carved at once (central.c): four objects
 * allocated one after another sit at least CARVE_LANE_MIN_BYTES apart, so up to four threads
 * given one each share no cache line and no pair the adjacent-line prefetcher fetches together. */
#define CARVE_LANES 4
#define CARVE_LANE_MIN_BYTES 128

/* A thread-cache list never grows past this many objects, whatever its budget. */
#define TCACHE_LIST_MAX_LENGTH 8192
/* Times a list may overflow its maximum length before the maximum shrinks (gperftools' value). */
#define TCACHE_MAX_OVERAGES 3
/* Budget a thread cache starts with, and the step by which it grows or is stolen. */
#define TCACHE_START_SIZE ((size_t)256 << 10)
#define TCACHE_STEAL_STEP ((size_t)64 << 10)
/* A thread's slow paths collect its cache's garbage at least this often (tcache.c): redis under
 * redis-benchmark (mtbench real, scale 20) peaks at 48.4 MB with collections only on budget
 * pressure, 38.3 MB every 1000 ms, 36.9 MB every 100 ms (glibc 39.2), and mtbench's quick preset
 * side by side (3 repetitions) showed no cost at either interval. */
#define TCACHE_GC_MS 100
/* While a thread's request for budget went unmet (tcache.c, tcache_grow_list), it collects on at
 * most one growth attempt in this many: a collection walks every class, and with 64 threads on
 * 2 CPUs wanting more than the total (mtbench busy-threads --write-all 0, 3 runs each) collecting
 * on every attempt took 4.6-5.5 s, one in 32 1.0-1.3 s, one in 255 0.90-0.96 s. One in 255 moved
 * no peak RSS on the quick preset (server-mix, realloc-mix, mixed-stress, prodcons, remote-stream:
 * 1.00-1.03, 5 repetitions); none at all, in a first version, left server-mix and realloc-mix 4-5%
 * more. 32 stays between the two. */
#define TCACHE_GC_IDLE_DENIED 32
/* realloc sends a block it moved to a larger class to its span, not the thread cache, from this
 * size up (api.c, realloc_impl). */
#define REALLOC_UNCACHED_MIN ((size_t)16 << 10)

/* Free backed bytes in the page heap at which the background releaser (release.c) is started:
 * below it, what the decay would give back is not worth a thread (and a small program never has
 * one). */
#define RELEASE_START_BYTES ((size_t)4 << 20)

/* A transfer cache holds at most this many bytes of whole batches per size class, and at most
 * TRANSFER_SLOTS batches. Within that, its capacity follows the class's use (central.c), which is
 * what keeps it from parking memory (a fixed 512 KiB held 8.6 MB at the end of mtbench's
 * steady-state scenario; with the use-based capacity it ends at the same RSS as 128 KiB). 512 KiB
 * lets a stream of thousands of remote frees in flight pass without trips through the spans:
 * remote-stream --producers 2 --consumers 2 --batches 100: 17% fewer instructions than 128 KiB. */
#define TRANSFER_BYTES_MAX ((size_t)512 << 10)
#define TRANSFER_SLOTS 64
/* The least capacity of a transfer cache, whatever the class's use (central_fit_capacity). */
#define TRANSFER_MIN 2

#endif

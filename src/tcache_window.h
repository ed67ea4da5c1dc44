/* Windows: how another thread can take back the cache of a thread that stopped allocating, with
 * no lock and no atomic instruction on the owner's fast paths, and no test added to them.
 *
 * What the owner already does serves as its marks:
 *   - a pop subtracts one from its list's count before it touches the list (an exchange-and-add,
 *     which also hands it the count it found), and stores that count less two after it (counts
 *     are in halves: odd = inside a pop). The subtract's sign is the test a pop needs anyway (an
 *     empty list, or one at its floor, has count 0), so the mark adds no test; the -1 in a
 *     register and the count's subtract before the end's store are 2 instructions (list_begin_pop);
 *   - a push reads the count, compares it with max_count, links the object, and adds two to the
 *     count in memory as its last step. It makes no mark: a taker copes with one push in flight
 *     instead (below);
 *   - a slow path adds 1 to the cache's op_seq when it starts and again when it ends (odd =
 *     inside); slow paths are the only ones that touch several lists, capacity and budget.
 * A taker (tcache.c, tcache_reclaim_scan) works like one side of Dekker's algorithm, with the
 * owner's fence paid by the kernel: it stops a list's count (adds LIST_STOP, which sets bit 15)
 * or op_seq (sets bit 31) with a compare-and-swap from an even value, calls membarrier(2) so that
 * every running thread of the process executes a full barrier, and reads the value again. Still
 * stopped means that every operation that starts later sees the stop:
 *   - a pop's subtract comes out negative, and the pop gives up;
 *   - a push's count is above any maximum, and the push gives up before writing anything;
 *   - a slow path's add on op_seq comes out negative, and it waits (tcache_wake).
 * An add or subtract that raced the compare-and-swap (read before it, wrote after) erases the bit,
 * which the second read sees. On x86-64 each is one instruction, so no preemption falls between
 * its read and its write; it needs no lock prefix because a lost bit is detected, not relied on.
 * Elsewhere (aarch64) a plain add is a load and a store, and the membarrier's interrupt can fall
 * between them: the owner would store a count read before the stop after the taker's second read,
 * and go on popping a list being taken. So there every mark is an atomic read-modify-write (seq_cst
 * __atomic: LDADDAL with LSE, an exclusive-pair loop without, through libgcc's out-of-line helper
 * by default), which never loses the bit, and the argument holds on aarch64's weaker ordering:
 *   - a pop's subtract reads the latest count, stopped or not, barrier or no barrier; the list's
 *     loads and stores come after it (its acquire half), and its end is a release store the taker's
 *     acquire compare-and-swap reads, so a taker that stops a list sees the head that pop left;
 *   - only a push reads the count with a plain load: that is the push in flight, below;
 *   - membarrier(2) runs a full barrier (DMB ISH) on every running thread of the process, which
 *     splits each of the owner's operations into before it (seen by the taker's second read) and
 *     after it (sees the stop), as on x86-64.
 * The seq_cst RMW costs aarch64 a call and a stack frame on malloc's fast path (objdump of an
 * aarch64 build: bl __aarch64_ldadd2_acq_rel); not measured on hardware.
 * A pop in flight makes the count odd, and the compare-and-swap (from even) fails. A push in
 * flight (count read before the bit was set) may still write its object's link and the head,
 * and add to the count, after the second read: it saw the bit too late, but the bit survives its
 * add. So the taker takes the chain from whatever head it reads, to its NULL end, and clears the
 * head only with a compare-and-swap from that value; a push landing after that leaves the head
 * pointing at its one object, which the owner's repair hands to the central list. (A push stores
 * the link before the head, with a release store, so a head the taker reads leads to a chain.)
 * unit-reclaim stops a push by hand at each of these points.
 * The taker stops op_seq first, then, once that held, the lists: so a slow path never sees a
 * stopped list, and whatever a taker leaves stopped is repaired by the owner's next slow path. */
#ifndef QM_TCACHE_WINDOW_H
#define QM_TCACHE_WINDOW_H

#include <stdbool.h>
#include <stdint.h>

#include "types.h"

/* A taker stops a list by adding LIST_STOP to its count: counts are at most 2 *
 * TCACHE_LIST_MAX_LENGTH = 0x4000, so a stopped count is at least 0xA000 - 1 even after a pop's
 * subtract from 0 (a list at its floor) and at most 0xE002 after a push in flight: bit 15 set,
 * and above any maximum. */
#define LIST_STOP 0xA000u
#define LIST_STOPPED(count) (((count) & 0x8000u) != 0)
_Static_assert(LIST_STOP - 1 >= 0x8000u && LIST_STOP + 2 * TCACHE_LIST_MAX_LENGTH + 2 <= 0xFFFFu,
               "a stopped count must keep bit 15 through a pop's subtract and a push's add");
#define WINDOW_STOP INT32_MIN /* in op_seq */

#define QM_WINDOW_INLINE static inline __attribute__((always_inline))

/* A list as the fast paths see it: on x86-64 an offset from the thread pointer, read and written
 * through %fs (GCC's __seg_fs named address space), so that no instruction turns the thread
 * pointer into an address (api.c, tcache_list_from). Elsewhere an ordinary pointer. */
/* Not under ThreadSanitizer, which takes the %fs-relative offset for an address (checked-tsan). */
#if defined(__x86_64__) && defined(__SEG_FS) && !defined(__SANITIZE_THREAD__)
#define QM_FAST_LIST_IN_FS 1
typedef tcache_list_t __seg_fs tcache_fast_list_t;
#else
#define QM_FAST_LIST_IN_FS 0
typedef tcache_list_t tcache_fast_list_t;
#endif

/* The fast paths' view of one of this thread's own lists (unit-reclaim plays a push by hand). */
QM_WINDOW_INLINE tcache_fast_list_t *list_as_fast(tcache_list_t *list) {
#if QM_FAST_LIST_IN_FS
  uintptr_t thread_pointer;
  __asm__("movq %%fs:0, %0" : "=r"(thread_pointer));
  return (tcache_fast_list_t *)((uintptr_t)list - thread_pointer);
#else
  return list;
#endif
}

/* The fast paths' loads and stores of a list's shared fields (a taker reads them). GCC's __atomic
 * builtins do not take a named address space; on x86-64 (the only place one is used) every aligned
 * load is an acquire and every store a release (TSO), so a volatile access, kept after the
 * list's other stores by a compiler barrier, is what a relaxed load and a release store compile to
 * anyway. */
#if QM_FAST_LIST_IN_FS
QM_WINDOW_INLINE uint16_t list_load_count(tcache_fast_list_t *list) { return ((volatile tcache_fast_list_t *)list)->count; }
QM_WINDOW_INLINE void list_store_count_release(tcache_fast_list_t *list, uint16_t count) {
  __asm__ volatile("" : : : "memory");
  ((volatile tcache_fast_list_t *)list)->count = count;
}
QM_WINDOW_INLINE void list_store_head_release(tcache_fast_list_t *list, void *head) {
  __asm__ volatile("" : : : "memory");
  ((volatile tcache_fast_list_t *)list)->head = head;
}
#else
QM_WINDOW_INLINE uint16_t list_load_count(tcache_fast_list_t *list) { return __atomic_load_n(&list->count, __ATOMIC_RELAXED); }
QM_WINDOW_INLINE void list_store_count_release(tcache_fast_list_t *list, uint16_t count) {
  __atomic_store_n(&list->count, count, __ATOMIC_RELEASE);
}
QM_WINDOW_INLINE void list_store_head_release(tcache_fast_list_t *list, void *head) {
  __atomic_store_n(&list->head, head, __ATOMIC_RELEASE);
}
#endif

/* Compiler ordering: a pop's begin needs no "memory" clobber. Loads the compiler moves above it
 * are harmless (a stopped pop gives up without using them), and the list's stores depend on the
 * branch that follows it. An end must keep the list's stores before it. */
#if defined(__x86_64__)
#define QM_ADD_MEM(suffix, field, delta, ...) \
  __asm__ volatile("add" suffix " %1, %0" : "+m"(field) : "i"(delta) : __VA_ARGS__)
/* A pop: the marking subtract, an exchange-and-add of -1 in memory (one instruction, as the
 * window needs), whose sign decides and which leaves the count it found in *before; at its end
 * a plain store of that count less two (list_end_pop, below, as on aarch64). While the count is
 * odd no taker can stop the list (its compare-and-swap expects an even count), so nothing but
 * this pop writes the count between the two, and the end need not read it again. Each
 * read-modify-write of the count in memory waits for the store before it (a store-to-load
 * forward, several cycles), and the count's chain runs from pair to pair: with a second subtract
 * in memory at the end the chain was three of them a malloc+free pair (the push's add is the
 * third), and, as the timings show (no hardware counters here to say more), it set the pace of a
 * hot pair; now it is two. 2 instructions more on malloc (the -1 in a register and the end's
 * subtract), and malloc-test at 512 bytes about a quarter faster (docs/fastpath.md). False when
 * the list is empty, at its floor, or stopped. */
QM_WINDOW_INLINE bool list_begin_pop(tcache_fast_list_t *list, uint16_t *before) {
  bool negative;
  uint16_t v = (uint16_t)-1;
  __asm__ volatile("xaddw %1, %0" : "+m"(list->count), "+r"(v), "=@ccs"(negative));
  *before = v;
  return !negative;
}
/* Slow paths: false when a taker stopped the cache. */
QM_WINDOW_INLINE bool window_enter(tcache_t *tc) {
  bool negative;
  __asm__ volatile("addl $1, %0" : "+m"(tc->op_seq), "=@ccs"(negative) : : "memory");
  return !negative;
}
#else
#define QM_ADD_MEM(suffix, field, delta, ...) __atomic_add_fetch(&(field), (delta), __ATOMIC_SEQ_CST)
QM_WINDOW_INLINE bool list_begin_pop(tcache_fast_list_t *list, uint16_t *before) {
  *before = __atomic_fetch_sub(&list->count, 1, __ATOMIC_SEQ_CST);
  return (int16_t)(*before - 1) >= 0;
}
QM_WINDOW_INLINE bool window_enter(tcache_t *tc) {
  return __atomic_add_fetch(&tc->op_seq, 1, __ATOMIC_SEQ_CST) >= 0;
}
#endif

/* A pop's end, on every architecture: the count its begin found, less two (odd to even: one
 * object fewer), stored after the list's stores. */
QM_WINDOW_INLINE void list_end_pop(tcache_fast_list_t *list, uint16_t before) {
  list_store_count_release(list, (uint16_t)(before - 2));
}
QM_WINDOW_INLINE void list_undo_pop(tcache_fast_list_t *list) { QM_ADD_MEM("w", list->count, 1, "cc"); }
/* A push's end: an add in memory, not a store of the count it read, so that a stop bit set since
 * survives it ("memory": the link and head stores stay before it). */
QM_WINDOW_INLINE void list_end_push(tcache_fast_list_t *list) { QM_ADD_MEM("w", list->count, 2, "cc", "memory"); }
QM_WINDOW_INLINE void window_leave(tcache_t *tc) { QM_ADD_MEM("l", tc->op_seq, 1, "cc", "memory"); }

/* The slow half's view of a list, in objects (the owner's, outside any push or pop). */
QM_WINDOW_INLINE uint32_t list_length(const tcache_list_t *list) { return (list->count >> 1) + list->floor; }
QM_WINDOW_INLINE uint32_t list_max(const tcache_list_t *list) { return (list->max_count >> 1) + list->floor; }
QM_WINDOW_INLINE uint32_t list_low_water(const tcache_list_t *list) { return list->floor; }
/* Moves the floor to `floor` objects (at most the length and the maximum), keeping both. */
QM_WINDOW_INLINE void list_set_floor(tcache_list_t *list, uint32_t floor) {
  uint32_t length = list_length(list), max = list_max(list);
  list->floor = (uint16_t)floor;
  list->count = (uint16_t)((length - floor) << 1);
  list->max_count = (uint16_t)((max - floor) << 1);
}
/* Setting a length or a maximum below the floor lowers the floor with it. */
QM_WINDOW_INLINE void list_set_length(tcache_list_t *list, uint32_t n) {
  if (n < list->floor) list_set_floor(list, n);
  list->count = (uint16_t)((n - list->floor) << 1);
}
QM_WINDOW_INLINE void list_set_max(tcache_list_t *list, uint32_t n) {
  if (n < list->floor) list_set_floor(list, n);
  list->max_count = (uint16_t)((n - list->floor) << 1);
}

#endif

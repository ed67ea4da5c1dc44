/* Windows: how another thread can take back the cache of a thread that stopped allocating, with
 * no lock and no atomic instruction on the owner's fast paths, and no test added to them.
 *
 * What the owner already does serves as its marks:
 *   - a pop subtracts two from its list's count in memory before it touches the list (counts are
 *     twice the length above the floor: the previous protocol, below, used the odd values; they
 *     cost nothing, and stayed), one instruction whose sign is the test a pop needs anyway
 *     (an empty list, or one at its floor, has count 0), then unlinks its object and stores the
 *     new head. The object is counted out before it leaves the chain: for that one moment the
 *     chain from the head is one object longer than the count says, which is how a taker tells a
 *     pop in flight (below);
 *   - a push reads the count, compares it with max_count, links the object, stores the head, and
 *     adds two to the count in memory as its last step;
 *   - a slow path adds 1 to the cache's op_seq when it starts and again when it ends (odd =
 *     inside); slow paths are the only ones that touch several lists, capacity and budget.
 * A taker (tcache.c, tcache_reclaim_scan) works like one side of Dekker's algorithm, with the
 * owner's fence paid by the kernel: it stops a list's count (adds LIST_STOP, which sets bit 15)
 * or op_seq (sets bit 31) with a compare-and-swap, calls membarrier(2) so that every running thread
 * of the process executes a full barrier, and reads the value again. Still stopped means that every
 * operation that starts later sees the stop:
 *   - a pop's subtract comes out negative, and the pop gives up (and adds the two back);
 *   - a push's count is above any maximum, and the push gives up before writing anything;
 *   - a slow path's add on op_seq comes out negative, and it waits (tcache_wake).
 * An add or subtract that raced the compare-and-swap (read before it, wrote after) erases the bit,
 * which the second read sees. On x86-64 each is one instruction, so no preemption falls between
 * its read and its write; it needs no lock prefix because a lost bit is detected, not relied on.
 * Elsewhere (aarch64) a plain add is a load and a store, and the membarrier's interrupt can fall
 * between them: the owner would store a count read before the stop after the taker's second read,
 * and go on popping a list being taken. So there every mark is an atomic read-modify-write (seq_cst
 * __atomic: LDADDAL with LSE, an exclusive-pair loop without, through libgcc's out-of-line helper
 * by default), which never loses the bit; membarrier(2) runs a full barrier (DMB ISH) on every
 * running thread of the process, which splits each of the owner's operations into before it (its
 * stores seen by every read the taker makes after the call) and after it (sees the stop), as on
 * x86-64.
 * The seq_cst RMW costs aarch64 a call and a stack frame on malloc's fast path (objdump of an
 * aarch64 build: bl __aarch64_ldadd2_acq_rel); not measured on hardware.
 *
 * So once the stops held, the owner has at most one operation in flight, begun before them, on
 * one of its lists; it may still write that list's head (and a push its count) at any time. The
 * taker reads each stopped list's head and that object's first word (its encoded link), calls
 * membarrier(2) once more, reads the head again and the count, and walks the chain:
 *   - a head that changed since the first read was stored by the operation in flight, which has
 *     no more links to write: the chain from it is final;
 *   - a head still the same: the operation in flight had not stored a head by the barrier, so the
 *     program had not written into a popped object yet either (it gets the object after the head
 *     store), and the first word read before the barrier is the object's link as the list had it.
 *     The head's tag is not checked there: a pop in flight may be clearing it;
 *   - the chain as long as the count says (its length above the floor, twice): no pop is in flight
 *     (a pop's object is counted out but still at the head), and the taker takes the whole chain
 *     and clears the head with a compare-and-swap from the value it walked from. A push in flight
 *     that has not stored its head yet may do so after that: its object stays at the head, linked
 *     to the chain taken, and the owner's repair hands that one object to the central list;
 *   - any other length (a pop in flight; a push that stored its head and has not added to the
 *     count; a pop giving up between its subtract and its add back): the list is left as it is,
 *     stopped, and the owner's repair lifts the stop, the operation having ended by then.
 * At most one list of an idle thread is left that way, as a list with a pop in flight was before
 * (the previous protocol made the count odd for the pop's duration and stored it again at the
 * end: one store and two instructions more on every malloc).
 * unit-reclaim stops a push and a pop by hand at each of these points.
 * The taker stops op_seq first, then, once that held, the lists: so a slow path never sees a
 * stopped list, and whatever a taker leaves stopped is repaired by the owner's next slow path. */
#ifndef QM_TCACHE_WINDOW_H
#define QM_TCACHE_WINDOW_H

#include <stdbool.h>
#include <stdint.h>

#include "types.h"

/* A taker stops a list by adding LIST_STOP to its count: counts are at most 2 *
 * TCACHE_LIST_MAX_LENGTH = 0x4000, so a stopped count is at least 0xA000 - 2 even after a pop's
 * subtract from 0 (a list at its floor) and at most 0xE002 after a push in flight: bit 15 set,
 * and above any maximum. */
#define LIST_STOP 0xA000u
#define LIST_STOPPED(count) (((count) & 0x8000u) != 0)
_Static_assert(LIST_STOP - 2 >= 0x8000u && LIST_STOP + 2 * TCACHE_LIST_MAX_LENGTH + 2 <= 0xFFFFu,
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
 * object's stores by a compiler barrier, is what a relaxed load and a release store compile to
 * anyway. */
#if QM_FAST_LIST_IN_FS
QM_WINDOW_INLINE uint16_t list_load_count(tcache_fast_list_t *list) { return ((volatile tcache_fast_list_t *)list)->count; }
QM_WINDOW_INLINE void list_store_head_release(tcache_fast_list_t *list, void *head) {
  __asm__ volatile("" : : : "memory");
  ((volatile tcache_fast_list_t *)list)->head = head;
}
#else
QM_WINDOW_INLINE uint16_t list_load_count(tcache_fast_list_t *list) { return __atomic_load_n(&list->count, __ATOMIC_RELAXED); }
QM_WINDOW_INLINE void list_store_head_release(tcache_fast_list_t *list, void *head) {
  __atomic_store_n(&list->head, head, __ATOMIC_RELEASE);
}
#endif

/* Compiler ordering: a pop's begin needs no "memory" clobber. Loads the compiler moves above it
 * are harmless (a stopped pop gives up without using them), and the head's store depends on the
 * branch that follows it. A push's end must keep the list's stores before it. */
#if defined(__x86_64__)
#define QM_ADD_MEM(suffix, field, delta, ...) \
  __asm__ volatile("add" suffix " %1, %0" : "+m"(field) : "i"(delta) : __VA_ARGS__)
/* A pop's begin: two subtracted from the count in memory, one instruction whose sign decides.
 * False when the list is empty, at its floor, or stopped; then list_undo_pop adds the two back.
 * Nothing else marks the pop: the object it counted out stays at the head until the pop stores
 * the next one, which is what a taker sees (above). The previous protocol's mark (an odd count
 * for the pop's duration, stored again at its end) cost malloc two instructions and a store. */
QM_WINDOW_INLINE bool list_begin_pop(tcache_fast_list_t *list) {
  bool negative;
  __asm__ volatile("subw $2, %0" : "+m"(list->count), "=@ccs"(negative));
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
QM_WINDOW_INLINE bool list_begin_pop(tcache_fast_list_t *list) {
  return (int16_t)__atomic_sub_fetch(&list->count, 2, __ATOMIC_SEQ_CST) >= 0;
}
QM_WINDOW_INLINE bool window_enter(tcache_t *tc) {
  return __atomic_add_fetch(&tc->op_seq, 1, __ATOMIC_SEQ_CST) >= 0;
}
#endif

QM_WINDOW_INLINE void list_undo_pop(tcache_fast_list_t *list) { QM_ADD_MEM("w", list->count, 2, "cc"); }
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

/* Windows: how another thread can take back the cache of a thread that stopped allocating, with
 * no lock and no atomic instruction on the owner's fast paths.
 *
 * The owner marks when it is inside an operation, in two places:
 *   - each list's count is twice its length, plus one while the owner pushes or pops (odd =
 *     inside). The fast paths' existing length update becomes two: a one-instruction add
 *     before touching the list, a store after.
 *   - the cache's op_seq gets 1 added when a slow path starts and again when it ends (odd =
 *     inside); slow paths are the only ones that touch several lists, capacity and budget.
 * A taker (tcache.c, tcache_reclaim_scan) works like one side of Dekker's algorithm, with the
 * owner's fence paid by the kernel: it reads a mark (even: the owner is outside), sets bit 15
 * (lists) or 31 (op_seq) with a compare-and-swap from that value (STOP), calls membarrier(2) so
 * that every running thread of the process executes a full barrier, and reads the mark again. A
 * mark still exactly as it was set means no operation started in between, and every later one
 * sees the bit:
 *   - a pop's first add (count - 1) comes out negative and the pop gives up; an empty list (count
 *     0) gives up the same way, so this branch replaces the empty-list test;
 *   - a push compares the count it found with max_count, and a stopped count is above any maximum;
 *   - a slow path's first add on op_seq comes out negative and it waits (tcache_wake).
 * An add that raced the compare-and-swap (read before it, wrote after) erases the bit, which the
 * second read sees. On x86-64 an add to memory is one instruction, so no preemption can fall
 * between its read and its write; it needs no lock prefix because the taker never writes a mark
 * that is odd. Elsewhere the begins are atomic read-modify-writes (correct, slower).
 * The taker stops op_seq first, then, once that held, the lists: so a slow path never sees a
 * stopped list, and whatever a taker leaves stopped is repaired by the owner's next slow path. */
#ifndef QM_TCACHE_WINDOW_H
#define QM_TCACHE_WINDOW_H

#include <stdbool.h>
#include <stdint.h>

#include "types.h"

#define LIST_STOP 0x8000u    /* in a list's count; counts are at most 2 * TCACHE_LIST_MAX_LENGTH */
#define WINDOW_STOP INT32_MIN /* in op_seq */

#define QM_WINDOW_INLINE static inline __attribute__((always_inline))

/* Compiler ordering: a begin needs no "memory" clobber. Loads the compiler moves above it are
 * harmless (a stopped operation gives up without using them), and the list's stores depend on
 * the branch that follows it. An end must keep the list's stores before it: a release store. */
#if defined(__x86_64__)
#define QM_ADD_MEM(suffix, field, delta, ...) \
  __asm__ volatile("add" suffix " %1, %0" : "+m"(field) : "i"(delta) : __VA_ARGS__)
/* The begins give the count as it was before their add in a register, and the end stores a value
 * computed from it instead of adding to memory again: a malloc/free pair on one list then waits
 * for two store-to-load forwards, as it did before the windows, not four (measured: the first
 * version, with adds at both ends, made mtbench's malloc-test 1.7 times slower).
 * Pop: a plain load, then the marking subtract, whose sign decides. Between the two only a taker
 * can change the count, and what it sets (LIST_STOP) makes the subtract negative, so a pop that
 * goes on read the count it marked. False when the list is empty or stopped. */
QM_WINDOW_INLINE bool list_begin_pop(tcache_list_t *list, uint16_t *before) {
  *before = __atomic_load_n(&list->count, __ATOMIC_RELAXED);
  bool negative;
  __asm__ volatile("subw $1, %0" : "+m"(list->count), "=@ccs"(negative));
  return !negative;
}
/* Push: xadd (one instruction, no lock prefix: not atomic against other CPUs, which the
 * protocol does not need) returns the count it marked; a stopped list's is above any maximum. */
QM_WINDOW_INLINE uint16_t list_begin_push(tcache_list_t *list) {
  uint16_t old = 1;
  __asm__ volatile("xaddw %1, %0" : "+m"(list->count), "+r"(old) : : "cc");
  return old;
}
/* Slow paths: false when a taker stopped the cache. */
QM_WINDOW_INLINE bool window_enter(tcache_t *tc) {
  bool negative;
  __asm__ volatile("addl $1, %0" : "+m"(tc->op_seq), "=@ccs"(negative) : : "memory");
  return !negative;
}
#else
#define QM_ADD_MEM(suffix, field, delta, ...) __atomic_add_fetch(&(field), (delta), __ATOMIC_SEQ_CST)
QM_WINDOW_INLINE bool list_begin_pop(tcache_list_t *list, uint16_t *before) {
  *before = __atomic_fetch_sub(&list->count, 1, __ATOMIC_SEQ_CST);
  return (int16_t)(*before - 1) >= 0;
}
QM_WINDOW_INLINE uint16_t list_begin_push(tcache_list_t *list) {
  return __atomic_fetch_add(&list->count, 1, __ATOMIC_SEQ_CST);
}
QM_WINDOW_INLINE bool window_enter(tcache_t *tc) {
  return __atomic_add_fetch(&tc->op_seq, 1, __ATOMIC_SEQ_CST) >= 0;
}
#endif

QM_WINDOW_INLINE void list_undo_pop(tcache_list_t *list) { QM_ADD_MEM("w", list->count, 1, "cc"); }
QM_WINDOW_INLINE void list_undo_push(tcache_list_t *list) { QM_ADD_MEM("w", list->count, -1, "cc"); }
/* Ends: count is the count after the operation (even). The release store keeps the list's own
 * stores before it. */
QM_WINDOW_INLINE void list_end(tcache_list_t *list, uint16_t count) {
  __atomic_store_n(&list->count, count, __ATOMIC_RELEASE);
}
QM_WINDOW_INLINE void window_leave(tcache_t *tc) { QM_ADD_MEM("l", tc->op_seq, 1, "cc", "memory"); }

/* The slow half's view of a list, in objects (the owner's, outside any push or pop). */
QM_WINDOW_INLINE uint32_t list_length(const tcache_list_t *list) { return list->count >> 1; }
QM_WINDOW_INLINE uint32_t list_max(const tcache_list_t *list) { return list->max_count >> 1; }
QM_WINDOW_INLINE uint32_t list_low_water(const tcache_list_t *list) { return list->low_count >> 1; }
QM_WINDOW_INLINE void list_set_length(tcache_list_t *list, uint32_t n) { list->count = (uint16_t)(n << 1); }
QM_WINDOW_INLINE void list_set_max(tcache_list_t *list, uint32_t n) { list->max_count = (uint16_t)(n << 1); }

#endif

/* The OS contract. os_linux.c is the only file that makes memory system calls.
 * - Addresses and sizes passed in and out are multiples of PAGE_SIZE.
 * - Functions that can fail return NULL/false; none aborts, and none changes errno (a free() that
 *   unmaps must leave the program's errno alone, POSIX.1-2024).
 * - Policy (when to release, accounting, what to do when a call fails) stays above this layer. */
#ifndef QM_OS_H
#define QM_OS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* The kernel's page size (4 KiB on x86-64; 4, 16 or 64 KiB on aarch64), read at start, or the
 * os_page option if that is larger (a test runs a 4 KiB machine as a 64 KiB one): what mappings are
 * aligned to, the unit the kernel releases and protects, and what valloc and pvalloc mean by a
 * page. A power of two; qmalloc's own pages (PAGE_SIZE, 8 KiB) may be smaller. */
size_t os_page_size(void);

/* How a mapping is charged against the kernel's overcommit policy. */
typedef enum {
  OS_COMMIT,  /* memory the program will use: checked by the kernel's overcommit policy, so an
               * impossible request (malloc(1 TiB) on a 23 GiB machine) fails here, as glibc's does */
  OS_SPARSE   /* metadata touched only where memory is (page-map leaves): MAP_NORESERVE */
} os_map_kind_t;

/* Reads *word (an integer or a pointer) that the caller is about to write if it holds 0, of memory
 * that may never have been touched (.bss, a fresh mapping), as a write: a locked add of 0. The
 * kernel maps a page first read to the shared zero page, and the write that follows faults again
 * to give it a page of its own: two page faults where one does. For slow paths only (a locked
 * instruction, and each such read makes its page resident). A macro: it keeps the word's type. */
#define os_read_to_write(word) __atomic_fetch_add((word), 0, __ATOMIC_ACQUIRE)

/* Inaccessible pages kept next to a mapping: an overflow off its end faults instead of running into
 * whatever the kernel put there. */
typedef enum {
  OS_GUARD_NONE,
  OS_GUARD_AFTER,  /* page-heap chunks: one guard after (their spans sit side by side inside) */
  OS_GUARD_AROUND  /* huge blocks: one before and one after */
} os_guard_t;

/* Bytes of one guard: a qmalloc page, or the kernel's page if that is larger (a guard must be a
 * whole kernel page to be protected on its own). A multiple of PAGE_SIZE. */
size_t os_guard_size(void);
/* Maps `size` bytes of zeroed, readable and writable memory aligned to `alignment` (a power of
 * two, at least PAGE_SIZE), with the guards asked for (PROT_NONE, not counted as mapped); only
 * `size` bytes and the guards stay mapped. NULL if the kernel refused. */
void *os_map(size_t size, size_t alignment, os_map_kind_t kind, os_guard_t guard);
/* Maps `size` bytes of zeroed, readable and writable memory (OS_COMMIT) with a guard on each side,
 * at the same offset modulo 2 MiB as `like` (to the kernel page): the target of a huge block's move
 * (os_move), which the kernel then makes by shifting whole page tables, not every page's entry.
 * NULL if refused. */
void *os_map_guarded_like(size_t size, uintptr_t like);
typedef enum {
  OS_GROWN,                /* grown in place, its guard at the new end */
  OS_NOT_GROWN,            /* nothing changed */
  OS_NOT_GROWN_GUARD_LOST, /* not grown, and its guard's place taken meanwhile: it has none now */
} os_grow_t;
/* Grows the mapping at addr, made with a guard on each side (os_map's OS_GUARD_AROUND), from
 * old_size to new_size bytes where it is, its guard moved to the new end: only if the address
 * space past it is free. */
os_grow_t os_grow_guarded(void *addr, size_t old_size, size_t new_size);
/* Maps `size` bytes of zeroed memory (OS_COMMIT) ending exactly at `end` (both multiples of the
 * kernel page), only if nothing is mapped there: so that the page heap grows as one region whose
 * free runs coalesce across chunks. NULL if the range is taken or the kernel refused. */
void *os_map_below(uintptr_t end, size_t size);
/* Unmaps a mapping made with guards, guards included. */
bool os_unmap_guarded(void *addr, size_t size, os_guard_t guard);
/* Unmaps a guard (addr, os_guard_size() bytes), not counted as mapped. */
bool os_unmap_guard(void *addr);
/* Unmaps; false if the kernel refused (e.g. the map-count limit: unmapping part of a merged
 * mapping splits it), in which case the range is still mapped and still the caller's. */
bool os_unmap(void *addr, size_t size);
/* Gives the pages back to the OS: true only if the kernel dropped them, so that they read as zero
 * on the next touch. False (mlock'ed memory, for one) leaves their contents as they were. */
bool os_release(void *addr, size_t size);
/* Which of `units` consecutive units of `unit` bytes from addr hold a page in memory (mincore):
 * resident[i] = 1 if any of unit i's kernel pages does, else 0. A page never touched, given back,
 * or swapped out holds none. `unit` is a multiple of the kernel's page (os_page_size() or more).
 * False if the kernel refused; resident[] is then undefined. */
bool os_resident_units(const void *addr, size_t unit, size_t units, uint8_t *resident);
/* Moves a mapping onto `target`, a mapping of at least new_size bytes that the caller owns and
 * gives up (mremap MREMAP_FIXED replaces it); the old range is unmapped. False if impossible, and
 * then both ranges are as they were. */
bool os_move(void *addr, size_t old_size, size_t new_size, void *target);
/* Maps `size` bytes of readable and writable memory, not counted as mapped, at the same offset
 * modulo 2 MiB as `like`: the hardened build's shadow of the page-heap chunk at `like`
 * (harden_park.c), which only ever holds pages moved there from it (see os_move_pages). NULL if
 * refused. */
void *os_map_shadow(size_t size, uintptr_t like);
/* Unmaps (part of) a shadow. */
bool os_unmap_shadow(void *addr, size_t size);
/* Moves the pages of [from, from + size) onto `to` (a writable mapping the caller owns, which they
 * replace), leaving `from` mapped and empty (mremap's MREMAP_DONTUNMAP, Linux 5.7 and later): the
 * kernel moves whole page tables where both ranges are alike modulo 2 MiB, so a move costs little
 * more than a system call, where mprotect rewrites every page-table entry. False if impossible (an
 * older kernel, a range over two mappings), and then both ranges are as they were. */
bool os_move_pages(void *from, size_t size, void *to);
/* Registers the process for membarrier(2)'s expedited private barrier; false if the kernel (or a
 * seccomp filter, or valgrind) does not offer it. */
bool os_membarrier_init(void);
/* Makes every running thread of the process execute a full memory barrier before it returns;
 * false if it could not (then nothing may be concluded from it). */
bool os_membarrier(void);
/* Reserves `size` bytes of address space that is never accessible (PROT_NONE, no commit charge,
 * not counted as mapped); NULL if refused. The hardened build's zero-size allocations point there. */
void *os_reserve(size_t size);
/* Makes a mapped range inaccessible (every access faults) or readable and writable again; false if
 * the kernel refused (the map-count limit), and the range is then as it was. */
bool os_protect(void *addr, size_t size, bool accessible);
/* Monotonic milliseconds, from the vDSO (no system call on Linux). */
uint64_t os_now_ms(void);

#endif

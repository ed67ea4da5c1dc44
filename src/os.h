/* The OS contract. os_linux.c is the only file that makes memory system calls.
 * - Addresses and sizes passed in and out are multiples of PAGE_SIZE.
 * - Functions that can fail return NULL/false and leave errno as the kernel set it; none aborts.
 * - Policy (when to release, accounting) stays above this layer. */
#ifndef QM_OS_H
#define QM_OS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* The kernel's page size (4 KiB on x86-64, up to 64 KiB on aarch64): what mmap aligns to, and
 * what valloc and pvalloc mean by a page. */
size_t os_page_size(void);
/* Maps `size` bytes of zeroed, readable and writable memory aligned to `alignment` (a power of
 * two, at least PAGE_SIZE). */
void *os_map(size_t size, size_t alignment);
void os_unmap(void *addr, size_t size);
/* Gives the pages back to the OS; their contents become zero; the range stays mapped. */
bool os_release(void *addr, size_t size);
/* Grows or shrinks a mapping, moving it if needed (mremap); NULL if impossible. */
void *os_remap(void *addr, size_t old_size, size_t new_size);
/* Moves a mapping back to a given address (undo of os_remap); false if impossible. */
bool os_remap_fixed(void *addr, size_t old_size, size_t new_size, void *target);
/* Registers the process for membarrier(2)'s expedited private barrier; false if the kernel (or a
 * seccomp filter, or valgrind) does not offer it. */
bool os_membarrier_init(void);
/* Makes every running thread of the process execute a full memory barrier before it returns;
 * false if it could not (then nothing may be concluded from it). */
bool os_membarrier(void);
/* Monotonic milliseconds, from the vDSO (no system call on Linux). */
uint64_t os_now_ms(void);

#endif

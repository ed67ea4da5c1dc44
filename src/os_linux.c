/* Linux implementation of os.h: mmap, munmap, madvise, mremap, membarrier, clock_gettime.
 * Release uses MADV_DONTNEED, not MADV_FREE: DONTNEED drops the pages from RSS at once and
 * guarantees zeroes on the next touch, so the RSS a user measures is what the heap really holds
 * and released spans can serve calloc without memset; MADV_FREE defers both to memory pressure. */
#include <errno.h>
#include <linux/membarrier.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "internal.h"
#include "os.h"

size_t os_page_size(void) {
  static size_t cached;
  if (cached == 0) cached = (size_t)sysconf(_SC_PAGESIZE);
  return cached;
}

void *os_map(size_t size, size_t alignment) {
  int saved = errno;
  /* mmap aligns only to the kernel's page; reserve enough to move the start up to `alignment`
   * (qmalloc's 8 KiB pages are already twice x86-64's) and unmap what is left at both ends. */
  size_t kernel_page = os_page_size();
  size_t reserve = size + (alignment > kernel_page ? alignment - kernel_page : 0);
  if (reserve < size) return NULL;
  char *p = mmap(NULL, reserve, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) return NULL;
  errno = saved;
  uintptr_t aligned = ((uintptr_t)p + alignment - 1) & ~(uintptr_t)(alignment - 1);
  if (aligned > (uintptr_t)p) munmap(p, aligned - (uintptr_t)p);
  uintptr_t end = (uintptr_t)p + reserve, used_end = aligned + size;
  if (end > used_end) munmap((void *)used_end, end - used_end);
  stats_mapped_add((intptr_t)size);
  return (void *)aligned;
}

void os_unmap(void *addr, size_t size) {
  munmap(addr, size);
  stats_mapped_add(-(intptr_t)size);
}

bool os_release(void *addr, size_t size) {
  int saved = errno;
  bool ok = madvise(addr, size, MADV_DONTNEED) == 0;
  errno = saved;
  return ok;
}

void *os_remap(void *addr, size_t old_size, size_t new_size) {
  int saved = errno;
  void *p = mremap(addr, old_size, new_size, MREMAP_MAYMOVE);
  errno = saved;
  if (p == MAP_FAILED) return NULL;
  stats_mapped_add((intptr_t)new_size - (intptr_t)old_size);
  return p;
}

bool os_remap_fixed(void *addr, size_t old_size, size_t new_size, void *target) {
  int saved = errno;
  void *p = mremap(addr, old_size, new_size, MREMAP_MAYMOVE | MREMAP_FIXED, target);
  errno = saved;
  if (p == MAP_FAILED) return false;
  stats_mapped_add((intptr_t)new_size - (intptr_t)old_size);
  return true;
}

bool os_membarrier_init(void) {
  int saved = errno;
  bool ok = syscall(SYS_membarrier, MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED, 0, 0) == 0;
  errno = saved;
  return ok;
}

bool os_membarrier(void) {
  int saved = errno;
  bool ok = syscall(SYS_membarrier, MEMBARRIER_CMD_PRIVATE_EXPEDITED, 0, 0) == 0;
  errno = saved;
  return ok;
}

uint64_t os_now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
  return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

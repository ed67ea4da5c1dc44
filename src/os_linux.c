/* Linux implementation of os.h: mmap, munmap, madvise, mremap, mincore, membarrier, clock_gettime.
 * Release uses MADV_DONTNEED, not MADV_FREE: DONTNEED drops the pages from RSS at once and
 * guarantees zeroes on the next touch, so the RSS a user measures is what the heap really holds
 * and released spans can serve calloc without memset; MADV_FREE defers both to memory pressure.
 * MAP_NORESERVE only for OS_SPARSE metadata: memory handed to the program is mapped the ordinary
 * way, so the kernel's overcommit policy sees it and refuses what cannot be had (heuristic mode
 * refuses a single mapping larger than RAM + swap; strict mode charges what is mapped), as it does
 * for glibc. Alignment slack is reserved PROT_NONE + MAP_NORESERVE (no commit charge) and the
 * aligned part mapped over it, so a huge alignment costs address space only while mapping.
 * Every function keeps errno. */
#include <errno.h>
#include <linux/membarrier.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "internal.h"
#include "os.h"

/* The kernel's own page: what mmap really aligns to. Asked once; threads that ask at the same time
 * store the same value (atomically: central_remove asks with no lock held). */
static size_t os_kernel_page(void) {
  QM_EARLY_DATA static size_t kernel;
  size_t known = __atomic_load_n(&kernel, __ATOMIC_RELAXED);
  if (known == 0) __atomic_store_n(&kernel, known = (size_t)sysconf(_SC_PAGESIZE), __ATOMIC_RELAXED);
  return known;
}

size_t os_page_size(void) {
  size_t assumed = (size_t)option(OPTION_OS_PAGE), kernel = os_kernel_page();
  return assumed > kernel && (assumed & (assumed - 1)) == 0 ? assumed : kernel;
}

static int os_flags(os_map_kind_t kind) {
  return MAP_PRIVATE | MAP_ANONYMOUS | (kind == OS_SPARSE ? MAP_NORESERVE : 0);
}

size_t os_guard_size(void) {
  size_t kernel_page = os_page_size();
  return kernel_page > PAGE_SIZE ? kernel_page : PAGE_SIZE;
}

/* Page tables cover 2 MiB each on x86-64 (and on aarch64 with 4 KiB pages): a move shifts whole
 * tables only between ranges alike modulo this. */
#define OS_TABLE_SPAN ((uintptr_t)2 << 20)

/* Maps `size` bytes at the first address that is `offset` modulo `period` (a power of two; offset
 * a multiple of the kernel page below it) past the start of a reservation plus `before`, with
 * `before` and `after` bytes kept reserved PROT_NONE around it (guards), and gives back the rest
 * of the reservation (at least `room` bytes of it past `after`: free address space there). NULL
 * if refused; *stranded then holds the bytes left reserved if not even the reservation could be
 * given back (the map-count limit), else 0. */
static char *os_map_placed(size_t size, size_t period, uintptr_t offset, os_map_kind_t kind, size_t before, size_t after,
                           size_t room, size_t *stranded) {
  size_t kernel_page = os_kernel_page();
  size_t slack = period > kernel_page ? period - kernel_page : 0;
  size_t reserve = before + size + after + slack + room;
  *stranded = 0;
  char *r = reserve < size ? MAP_FAILED : mmap(NULL, reserve, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (r == MAP_FAILED) return NULL;
  uintptr_t placed = (((uintptr_t)r + before - offset + period - 1) & ~(uintptr_t)(period - 1)) + offset;
  char *p = mmap((void *)placed, size, PROT_READ | PROT_WRITE, os_flags(kind) | MAP_FIXED, -1, 0);
  uintptr_t keep_start = placed - before, end = (uintptr_t)r + reserve, keep_end = placed + size + after;
  bool trimmed = (keep_start == (uintptr_t)r || munmap(r, keep_start - (uintptr_t)r) == 0) &&
                 (end == keep_end || munmap((void *)keep_end, end - keep_end) == 0);
  if (p != MAP_FAILED && trimmed) return p;
  if (munmap(r, reserve) != 0) *stranded = reserve;
  return NULL;
}

void *os_map(size_t size, size_t alignment, os_map_kind_t kind, os_guard_t guard) {
  int saved = errno;
  char *result = NULL;
  if (alignment < os_page_size()) alignment = os_page_size(); /* mappings start on a (assumed) page */
  size_t before = guard == OS_GUARD_AROUND ? os_guard_size() : 0, after = guard != OS_GUARD_NONE ? os_guard_size() : 0;
  if (alignment <= os_kernel_page() && guard == OS_GUARD_NONE) {
    char *p = mmap(NULL, size, PROT_READ | PROT_WRITE, os_flags(kind), -1, 0);
    if (p != MAP_FAILED) result = p;
  } else {
    /* Aligned, or with guards: placed in a reservation that has room for both. A reservation
     * that could not be given back is counted as mapped, so that the statistics say where it went. */
    size_t stranded;
    result = os_map_placed(size, alignment, 0, kind, before, after, 0, &stranded);
    if (stranded) stats_mapped_add((intptr_t)stranded);
  }
  errno = saved;
  if (result != NULL) stats_mapped_add((intptr_t)size);
  return result;
}

void *os_map_guarded_like(size_t size, uintptr_t like) {
  int saved = errno;
  size_t stranded, guard = os_guard_size();
  /* An eighth of the size more reserved and given back past the guard: room to grow into where
   * it is (os_grow_guarded), so that a block grown a little at a time moves once per eighth. */
  size_t room = (size / 8) & ~(os_kernel_page() - 1);
  char *p = os_map_placed(size, OS_TABLE_SPAN, like & (OS_TABLE_SPAN - 1) & ~(uintptr_t)(os_kernel_page() - 1), OS_COMMIT,
                          guard, guard, room, &stranded);
  if (stranded) stats_mapped_add((intptr_t)stranded);
  errno = saved;
  if (p != NULL) stats_mapped_add((intptr_t)size);
  return p;
}

os_grow_t os_grow_guarded(void *addr, size_t old_size, size_t new_size) {
  size_t guard = os_guard_size(), grow = new_size - old_size;
  uintptr_t old_end = (uintptr_t)addr + old_size, new_end = old_end + grow;
  if (new_size <= old_size || grow < guard) return OS_NOT_GROWN;
  int saved = errno;
  os_grow_t result = OS_NOT_GROWN;
  /* The address space past the guard claimed first, only if free: then the old guard and all of
   * the claim but its last guard's worth (the new guard) unmapped, and the mapping extended over
   * them where it is (mremap without MREMAP_MAYMOVE). So the block stays one mapping, which its
   * next move needs (mremap moves one mapping only); writable pages mapped in its place would be a
   * second one (another page offset). Until the mremap, the old guard's range is a hole, where
   * another thread's mapping could land: then the old guard cannot come back either. */
  const int flags = MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED_NOREPLACE;
  char *claim = mmap((void *)(old_end + guard), grow, PROT_NONE, flags, -1, 0);
  if (claim != MAP_FAILED && claim != (char *)(old_end + guard)) { /* before 4.17: a hint only */
    munmap(claim, grow);
  } else if (claim != MAP_FAILED) {
    if (munmap((void *)old_end, grow) != 0) { /* refused (the map count): nothing unmapped */
      munmap(claim, grow);
    } else if (mremap(addr, old_size, new_size, 0) != MAP_FAILED) {
      result = OS_GROWN;
    } else {
      void *back = mmap((void *)old_end, grow, PROT_NONE, flags, -1, 0);
      if (back == (void *)old_end) {
        munmap((void *)(old_end + guard), grow); /* back as before: the old guard, nothing past it */
      } else {
        if (back != MAP_FAILED) munmap(back, grow);
        munmap((void *)new_end, guard); /* the claim's last piece: still ours */
        result = OS_NOT_GROWN_GUARD_LOST;
      }
    }
  }
  errno = saved;
  if (result == OS_GROWN) stats_mapped_add((intptr_t)grow);
  return result;
}

void *os_map_below(uintptr_t end, size_t size) {
  if (end < size || end % os_page_size() != 0) return NULL;
  int saved = errno;
  void *want = (void *)(end - size);
  char *p = mmap(want, size, PROT_READ | PROT_WRITE, os_flags(OS_COMMIT) | MAP_FIXED_NOREPLACE, -1, 0);
  if (p != MAP_FAILED && p != want) { /* a kernel before 4.17 takes the address as a hint only */
    munmap(p, size);
    p = MAP_FAILED;
  }
  errno = saved;
  if (p == MAP_FAILED) return NULL;
  stats_mapped_add((intptr_t)size);
  return p;
}

bool os_unmap_guarded(void *addr, size_t size, os_guard_t guard) {
  size_t before = guard == OS_GUARD_AROUND ? os_guard_size() : 0, after = guard != OS_GUARD_NONE ? os_guard_size() : 0;
  int saved = errno;
  bool ok = munmap((char *)addr - before, before + size + after) == 0;
  errno = saved;
  if (ok) stats_mapped_add(-(intptr_t)size);
  return ok;
}

/* munmap, keeping errno. */
static bool os_munmap(void *addr, size_t size) {
  int saved = errno;
  bool ok = munmap(addr, size) == 0;
  errno = saved;
  return ok;
}

bool os_unmap_guard(void *addr) { return os_munmap(addr, os_guard_size()); }

bool os_unmap(void *addr, size_t size) {
  bool ok = os_munmap(addr, size);
  if (ok) stats_mapped_add(-(intptr_t)size);
  return ok;
}

bool os_release(void *addr, size_t size) {
  int saved = errno;
  bool ok = madvise(addr, size, MADV_DONTNEED) == 0;
  errno = saved;
  return ok;
}

bool os_resident_units(const void *addr, size_t unit, size_t units, uint8_t *resident) {
  size_t kernel = os_kernel_page(), per = unit / kernel;
  unsigned char vec[256]; /* kernel pages asked about at once */
  size_t batch_units = per <= sizeof vec ? sizeof vec / per : 0;
  if (per == 0 || unit % kernel != 0 || batch_units == 0) return false;
  int saved = errno;
  bool ok = true;
  for (size_t done = 0; ok && done < units; done += batch_units) {
    size_t n = units - done < batch_units ? units - done : batch_units;
    ok = mincore((void *)((uintptr_t)addr + done * unit), n * unit, vec) == 0;
    for (size_t i = 0; ok && i < n; i++) {
      uint8_t any = 0;
      for (size_t k = 0; k < per; k++) any |= vec[i * per + k] & 1;
      resident[done + i] = any;
    }
  }
  errno = saved;
  return ok;
}

bool os_move(void *addr, size_t old_size, size_t new_size, void *target) {
  int saved = errno;
  bool ok = mremap(addr, old_size, new_size, MREMAP_MAYMOVE | MREMAP_FIXED, target) != MAP_FAILED;
  errno = saved;
  if (ok) stats_mapped_add(-(intptr_t)old_size); /* target was counted when it was mapped */
  return ok;
}

void *os_map_shadow(size_t size, uintptr_t like) {
  int saved = errno;
  size_t stranded; /* (not counted: shadows are not) */
  /* Charged like the chunk (OS_COMMIT), so that pieces moved in and out can merge with it. */
  void *p = os_map_placed(size, OS_TABLE_SPAN, like & (OS_TABLE_SPAN - 1), OS_COMMIT, 0, 0, 0, &stranded);
  errno = saved;
  return p;
}

bool os_unmap_shadow(void *addr, size_t size) { return os_munmap(addr, size); }

#ifndef MREMAP_DONTUNMAP
#define MREMAP_DONTUNMAP 4 /* linux/mman.h since 5.7; older headers lack it */
#endif

bool os_move_pages(void *from, size_t size, void *to) {
  int saved = errno;
  bool ok = mremap(from, size, size, MREMAP_MAYMOVE | MREMAP_FIXED | MREMAP_DONTUNMAP, to) != MAP_FAILED;
  errno = saved;
  return ok;
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

void *os_reserve(size_t size) {
  int saved = errno;
  void *p = mmap(NULL, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  errno = saved;
  return p == MAP_FAILED ? NULL : p;
}

bool os_protect(void *addr, size_t size, bool accessible) {
  int saved = errno;
  bool ok = mprotect(addr, size, accessible ? PROT_READ | PROT_WRITE : PROT_NONE) == 0;
  errno = saved;
  return ok;
}

uint64_t os_now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
  return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

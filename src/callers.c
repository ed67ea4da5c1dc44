/* Where a call into qmalloc comes from (contracts in callers.h). */
#include "callers.h"

#include <elf.h>
#include <link.h>
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <string.h>
#include <sys/auxv.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "internal.h"
#include "prof.h"

typedef struct {
  uintptr_t lo, hi;
} addr_range_t;

/* The addresses an object's PT_LOAD segments span, loaded at `bias`; empty (lo > hi) if none. */
static addr_range_t load_range(uintptr_t bias, const ElfW(Phdr) *phdrs, unsigned phnum) {
  addr_range_t range = {UINTPTR_MAX, 0};
  for (unsigned i = 0; i < phnum; i++) {
    if (phdrs[i].p_type != PT_LOAD) continue;
    uintptr_t lo = bias + phdrs[i].p_vaddr, hi = lo + phdrs[i].p_memsz;
    if (lo < range.lo) range.lo = lo;
    if (hi > range.hi) range.hi = hi;
  }
  return range;
}

/* The addresses an ELF object loaded at `header` spans; empty if header is NULL or not an ELF
 * header. Reads the mapped headers: no lock, no allocation. */
static addr_range_t elf_range(const ElfW(Ehdr) *header) {
  if (header == NULL || memcmp(header->e_ident, ELFMAG, SELFMAG) != 0) return (addr_range_t){UINTPTR_MAX, 0};
  const ElfW(Phdr) *phdrs = (const ElfW(Phdr) *)((const char *)header + header->e_phoff);
  uintptr_t bias = 0;
  for (unsigned i = 0; i < header->e_phnum; i++) /* the segment that maps the header gives the bias */
    if (phdrs[i].p_type == PT_LOAD && phdrs[i].p_offset == 0) bias = (uintptr_t)header - phdrs[i].p_vaddr;
  return load_range(bias, phdrs, header->e_phnum);
}

extern const ElfW(Ehdr) __ehdr_start __attribute__((visibility("hidden"))); /* this object's (ld) */

/* The ranges, set by callers_init before any call can ask (init, a forked child), but libc's,
 * found at the first walk (dl_iterate_phdr, which init must not call). frees_may_start is false
 * before init and in a program with no dynamic loader (static: glibc's loader code is then in the
 * program itself). */
static struct {
  addr_range_t loader, self, libc;
  bool frees_may_start;
  int libc_state; /* LIBC_UNKNOWN, then LIBC_WRITING by the first finder, LIBC_FOUND (release) */
} callers;
enum { LIBC_UNKNOWN, LIBC_WRITING, LIBC_FOUND };

static bool in_range(addr_range_t range, uintptr_t at) { return at >= range.lo && at < range.hi; }

void callers_init(void) {
  /* AT_BASE is 0 when ld.so was run as the program (`ld.so ./prog`, as some launchers do): the
   * kernel loaded it as the executable. Its debugger record holds its address in both cases (0 in
   * a static program, which has no loader to find). */
  uintptr_t loader_base = (uintptr_t)getauxval(AT_BASE);
  if (loader_base == 0) loader_base = (uintptr_t)_r_debug.r_ldbase;
  callers.loader = elf_range((const ElfW(Ehdr) *)loader_base);
  callers.self = elf_range(&__ehdr_start);
  callers.frees_may_start = callers.loader.lo < callers.loader.hi;
}

bool callers_free_may_start_thread(const void *ret) {
  uintptr_t at = (uintptr_t)ret;
  return callers.frees_may_start && !in_range(callers.loader, at) && !in_range(callers.self, at);
}

static int libc_range_of(struct dl_phdr_info *info, size_t size, void *arg) {
  (void)size;
  uintptr_t libc_code = (uintptr_t)&pthread_create; /* libc's since glibc 2.34 */
  addr_range_t range = load_range(info->dlpi_addr, info->dlpi_phdr, info->dlpi_phnum);
  if (!in_range(range, libc_code)) return 0;
  *(addr_range_t *)arg = range;
  return 1;
}

/* Each frame of the caller's stack, innermost first, qmalloc's own left out: the loader's, libc's
 * or another object's (the program's, here). */
typedef enum { FRAME_LOADER, FRAME_LIBC, FRAME_PROGRAM } frame_kind_t;

/* libc's range into *libc: published once found, looked up by every caller until then; false when
 * another thread's walk held the loader's list (prof_unwind_loader_walk: under the profiler's
 * lock, signals blocked, since a fork from a handler inside it left the child a loader lock it
 * could never take). */
static bool callers_libc(addr_range_t *libc) {
  if (__atomic_load_n(&callers.libc_state, __ATOMIC_ACQUIRE) == LIBC_FOUND) {
    *libc = callers.libc;
    return true;
  }
  if (!prof_unwind_loader_walk(libc_range_of, libc)) return false;
  int unknown = LIBC_UNKNOWN;
  if (__atomic_compare_exchange_n(&callers.libc_state, &unknown, LIBC_WRITING, false, __ATOMIC_ACQUIRE, __ATOMIC_RELAXED)) {
    callers.libc = *libc;
    __atomic_store_n(&callers.libc_state, LIBC_FOUND, __ATOMIC_RELEASE);
  }
  return true;
}

/* The kinds of the caller's frames; -1 if the walk did not see the whole stack, 0 frames where
 * nothing is walked. A walk cut short because another thread's walk held the loader's list (libc's
 * range or the frames) is tried again a few times (threads starting together walk together). */
static int callers_walk(frame_kind_t kinds[PROF_MAX_FRAMES]) {
  addr_range_t libc = {UINTPTR_MAX, 0};
  uintptr_t frames[PROF_MAX_FRAMES];
  bool was = prof_suspend(), whole = false; /* nothing here is sampled */
  unsigned n = 0;
  for (int attempt = 0; attempt < 4 && !whole; attempt++) {
    if (attempt > 0) sched_yield();
    if (callers_libc(&libc)) n = prof_unwind_caller_frames(frames, &whole);
  }
  prof_resume(was);
  if (!whole) return -1;
  int count = 0;
  for (unsigned i = 0; i < n; i++) {
    uintptr_t at = frames[i] - 1; /* inside the call instruction */
    if (in_range(callers.self, at)) continue;
    kinds[count++] = in_range(callers.loader, at) ? FRAME_LOADER : in_range(libc, at) ? FRAME_LIBC : FRAME_PROGRAM;
  }
  return count;
}

/* A program's dl_iterate_phdr callback holds the loader's list lock, which a dlopen in another
 * thread, holding the loader's TLS lock, waits for; pthread_create takes the TLS lock. A malloc in
 * such a callback that started the releaser hung the process (two threads allocating in callbacks
 * beside one loading and unloading a module: 1 run in 12, none under glibc; api-releaser_start's
 * callback case). A walk cut short (another thread's walk held the loader's list: a start that
 * passed so hung 1 run in 30) refuses too. The thread's entry (start_thread; __libc_start_main,
 * whose caller _start is the outermost frame) has program code inside it only. */
callers_verdict_t callers_may_create_thread(void) {
  frame_kind_t kinds[PROF_MAX_FRAMES];
  int n = callers_walk(kinds);
  if (n < 0) return CALLERS_UNKNOWN;
  bool program_inside = false, libc_around_program = false;
  for (int i = 0; i < n; i++) {
    if (kinds[i] == FRAME_LOADER) return CALLERS_NO;
    if (kinds[i] == FRAME_LIBC) libc_around_program |= program_inside;
    else if (libc_around_program && i + 1 < n) return CALLERS_NO; /* program code outside it: a callback */
    else program_inside = true;
  }
  return CALLERS_YES;
}

/* glibc runs a thread's C++ thread_local destructors and then its pthread key destructors from its
 * entry (start_thread), after the thread's function returned: libc frames between the entry and
 * the program's code, which a running thread's function (called by start_thread itself) has not.
 * The outermost frames of a thread are libc's (start_thread, clone3); the main thread's end in
 * the program's _start, and its first call is never made there: not walked. */
bool callers_thread_exiting(void) {
  if ((pid_t)syscall(SYS_gettid) == getpid()) return false;
  frame_kind_t kinds[PROF_MAX_FRAMES];
  int n = callers_walk(kinds);
  if (n <= 0) return false;
  int outer_libc = 0; /* libc frames outside the outermost program frame */
  while (outer_libc < n && kinds[n - 1 - outer_libc] == FRAME_LIBC) outer_libc++;
  return outer_libc < n && outer_libc >= 3; /* more than start_thread and clone3 */
}

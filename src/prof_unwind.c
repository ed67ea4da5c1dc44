/* The heap profiler's stack capture: the return addresses of the calling thread's frames, without
 * frame pointers (Debian's binaries have none) and without allocating. On x86-64 each frame is
 * stepped with a rule cached per return address (where the frame's CFA is, where the caller's
 * return address and rbp were saved), read once from the DWARF call-frame information (the FDE
 * found through the object's .eh_frame_hdr table, below) and kept in a lock-free table: a stack of
 * known sites costs a few loads per frame instead of libgcc's ~2,000 instructions of FDE search
 * and CFA interpretation, and a C program need not load libgcc_s at all.
 * Anything the rule cannot say (a CFA given by an expression, a signal frame, a register moved
 * to another) goes back to libgcc's _Unwind_Backtrace for the whole stack where the process has
 * libgcc already, and ends the stack there where it has not; other architectures use libgcc for
 * every sample. Not here: the sampling decision and the tables (prof.c). Called by prof.c's
 * prof_record only, with its per-thread guard set (a malloc made by libgcc here is served
 * unsampled).
 * Code unloaded by dlclose and other code loaded at its address (a plugin reloaded) would be
 * stepped with the old code's rules: the walk forgets every rule when the loader has unloaded an
 * object since they were read (prof_rules_current), and never reads past its thread's stack
 * (prof_stack_limit), whatever a rule says. A reloaded plugin whose frame at the same return address
 * was 4 KiB where the old one's was 4 MiB made the walk read 4 MiB up from a thread's stack: a
 * crash in 96 runs of 100 (preload-prof's plugin case). */
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <link.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <unwind.h>

#include "internal.h"
#include "log.h"
#include "os.h"
#include "os_file.h"
#include "prof.h"

/* ---- libgcc's unwinder, found at run time ------------------------------------------------------
 * Weak references, so that linking qmalloc does not make libgcc_s a dependency: a C program
 * would load it for nothing but samples it does not take (70-100 KiB resident, measured with
 * /proc/self/smaps: half of what qmalloc adds to a small process). Where the program has libgcc
 * already (C++ programs, a static link with libgcc_eh), the references resolve at load. Otherwise
 * prof_unwind_load opens libgcc_s.so.1: at start on architectures without the cached walk, and
 * for tests; never from inside a sample on x86-64, whose walk needs no libgcc (prof_unwind_present).
 * Opening it at start cost a sampling process 20-25 page faults and 0.25 ms (perf stat -r 200, a
 * program making two allocations, both sampled: 128 faults and 0.83 ms with it, 104-109 and
 * 0.57 ms without, 82-83 and 0.52-0.57 ms with sampling off). */
#pragma weak _Unwind_Backtrace
#pragma weak _Unwind_GetIP
struct dwarf_eh_bases; /* what libgcc fills in with an FDE (prof_rule_read) */
extern const void *_Unwind_Find_FDE(void *pc, struct dwarf_eh_bases *bases) __attribute__((weak));

QM_EARLY_DATA static _Unwind_Reason_Code (*unwind_backtrace)(_Unwind_Trace_Fn, void *);
QM_EARLY_DATA static _Unwind_Ptr (*unwind_get_ip)(struct _Unwind_Context *);
QM_EARLY_DATA static const void *(*unwind_find_fde)(void *, struct dwarf_eh_bases *);
QM_EARLY_DATA static bool unwind_loaded; /* stored (release) once the three above are set, or found missing */
QM_EARLY_DATA static pthread_mutex_t unwind_load_lock = PTHREAD_MUTEX_INITIALIZER;
/* Held around every walk of the loader's list of objects (dl_iterate_phdr: ours, and libgcc's
 * inside its unwinder), and by the fork handlers (prof_unwind_lock_for_fork): glibc 2.36 does not
 * reset the loader's lock for that list in a fork child, so a child forked while another thread
 * sampled inside it waited on it forever (tests/preload/test_fork_safety.sh, stdio: 2 hangs in
 * 95 runs beside each other; a forked child's first sample reads its rules). Only ever tried from
 * a sample, never waited for (prof_rule_read says why), so a flag rather than a mutex: glibc's
 * pthread_mutex_trylock reads a jump table in libc's read-only data, whose page (and the 64 KiB
 * the kernel maps around it) a sampling process then had resident for nothing (unit-prof's
 * read-from-file check saw those pages in 3 runs of 40).
 * A walk blocks its thread's signals while it holds the flag. A fork from a signal handler that
 * interrupted one left the child with the loader's lock held by the parent's thread id (glibc's
 * recursive lock, which the interrupted call's unlock in the child then refused to release): the
 * child's first sample, dlopen or C++ throw waited on it for ever (the review's fork_signal_timer:
 * a timer's handler forks while a single-threaded loop mallocs 24 MiB blocks, each one sampled;
 * 2 runs of 12 stopped so). Two system calls a walk, one walk or two a sample.
 * The flag holds its holder, the address of that thread's unwind_phdr_tag (0: free), taken by one
 * compare-and-swap: a fork handler on the holding thread knows at every instruction that the flag
 * is its own. A boolean in the thread's storage, set after the exchange, left a window between the
 * two where that handler waited for its own thread in prof_unwind_lock_for_fork, for ever (the
 * same program, before the signals were blocked). */
QM_EARLY_DATA static uintptr_t unwind_phdr_owner;
static __thread char unwind_phdr_tag;
static __thread sigset_t unwind_phdr_signals; /* the holder's mask before its walk */

static uintptr_t unwind_phdr_self(void) { return (uintptr_t)&unwind_phdr_tag; }

/* The mask is kept for the release only once the flag is taken: a try that fails inside this
 * thread's own walk (libgcc's unwinder allocating there, whose slow path looks for libc's range)
 * must not replace the walk's mask with its own, all blocked, which the walk's release would then
 * leave in place. */
static bool unwind_phdr_try(void) {
  sigset_t all, before;
  sigfillset(&all);
  pthread_sigmask(SIG_BLOCK, &all, &before);
  uintptr_t free_flag = 0;
  if (__atomic_compare_exchange_n(&unwind_phdr_owner, &free_flag, unwind_phdr_self(), false, __ATOMIC_ACQUIRE,
                                  __ATOMIC_RELAXED)) {
    unwind_phdr_signals = before;
    return true;
  }
  pthread_sigmask(SIG_SETMASK, &before, NULL);
  return false;
}

static void unwind_phdr_release(void) {
  __atomic_store_n(&unwind_phdr_owner, 0, __ATOMIC_RELEASE);
  pthread_sigmask(SIG_SETMASK, &unwind_phdr_signals, NULL);
}

bool prof_unwind_loader_walk(int (*callback)(struct dl_phdr_info *, size_t, void *), void *arg) {
  if (!unwind_phdr_try()) return false;
  dl_iterate_phdr(callback, arg);
  unwind_phdr_release();
  return true;
}

/* open: dlopen libgcc_s.so.1 if the process has no libgcc; without it, a process that has none
 * stays "not loaded", so that a later call with open can still load it. */
static bool prof_unwind_find(bool open) {
  if (QM_LIKELY(__atomic_load_n(&unwind_loaded, __ATOMIC_ACQUIRE))) return unwind_backtrace != NULL;
  /* Another thread is loading it (or was, in the parent of a fork): this sample goes without
   * libgcc rather than wait. */
  if (pthread_mutex_trylock(&unwind_load_lock) != 0) return false;
  if (!__atomic_load_n(&unwind_loaded, __ATOMIC_RELAXED)) {
    void *backtrace = (void *)_Unwind_Backtrace, *get_ip = (void *)_Unwind_GetIP, *find_fde = (void *)_Unwind_Find_FDE;
    bool present = backtrace != NULL && get_ip != NULL && find_fde != NULL;
    if (!present && open) {
      /* dlopen found through dlsym, not named: a -static link (whose libc.a brings libgcc_eh's
       * unwinder anyway, resolving the references above) would otherwise draw glibc's link-time
       * warning about dlopen; there dlsym finds none and this is skipped. */
      void *(*open_lib)(const char *, int) = (void *(*)(const char *, int))dlsym(RTLD_DEFAULT, "dlopen");
      void *lib = open_lib != NULL ? open_lib("libgcc_s.so.1", RTLD_NOW | RTLD_LOCAL) : NULL; /* kept open */
      backtrace = lib ? dlsym(lib, "_Unwind_Backtrace") : NULL;
      get_ip = lib ? dlsym(lib, "_Unwind_GetIP") : NULL;
      find_fde = lib ? dlsym(lib, "_Unwind_Find_FDE") : NULL;
      present = backtrace != NULL && get_ip != NULL && find_fde != NULL;
    }
    if (present || open) {
      unwind_backtrace = present ? (_Unwind_Reason_Code(*)(_Unwind_Trace_Fn, void *))backtrace : NULL;
      unwind_get_ip = present ? (_Unwind_Ptr(*)(struct _Unwind_Context *))get_ip : NULL;
      unwind_find_fde = present ? (const void *(*)(void *, struct dwarf_eh_bases *))find_fde : NULL;
      __atomic_store_n(&unwind_loaded, true, __ATOMIC_RELEASE);
    }
  }
  pthread_mutex_unlock(&unwind_load_lock);
  return unwind_backtrace != NULL;
}

bool prof_unwind_load(void) { return prof_unwind_find(true); }

/* libgcc's unwinder if the process has it (linked, or loaded before), without loading it: the
 * captures run inside malloc, where opening a library (the loader's lock, its own mallocs) is
 * not something to start. */
static bool prof_unwind_present(void) { return prof_unwind_find(false); }

/* ---- the slow, general way: libgcc's unwinder, frame by frame -------------------------------- */

typedef struct prof_unwind_s {
  uintptr_t *frames;
  unsigned depth, skip;
} prof_unwind_t;

static _Unwind_Reason_Code prof_unwind_frame(struct _Unwind_Context *ctx, void *arg) {
  prof_unwind_t *u = arg;
  if (QM_UNLIKELY(prof_test_unwind_hook != NULL)) prof_test_unwind_hook();
  uintptr_t ip = (uintptr_t)unwind_get_ip(ctx);
  if (ip == 0) return _URC_END_OF_STACK;
  if (u->skip > 0) {
    u->skip--;
    return _URC_NO_REASON;
  }
  u->frames[u->depth++] = ip;
  return u->depth == PROF_MAX_FRAMES ? _URC_END_OF_STACK : _URC_NO_REASON;
}

/* _Unwind_Backtrace reports first the frame that called it, this one (its pc here): one more
 * than the frames counted from this function's caller. */
QM_NOINLINE unsigned prof_stack_capture_libgcc(uintptr_t *frames, unsigned skip) {
  prof_unwind_t u = {frames, 0, skip + 1};
  if (!prof_unwind_present()) return 0;
  if (!unwind_phdr_try()) return 0; /* busy: see prof_rule_read */
  unwind_backtrace(prof_unwind_frame, &u);
  unwind_phdr_release();
  __asm__ volatile("" ::: "memory"); /* not a tail call: the frame must stay for the count above */
  return u.depth;
}

#if defined(__x86_64__)

/* ---- rules: one 64-bit word per return address ------------------------------------------------ */

/* The DWARF numbers of the registers the walk follows on x86-64. */
enum { DW_RBP = 6, DW_RSP = 7, DW_RA = 16 };

/* A frame's rule, read at the instruction before a return address:
 *   CFA = (cfa_on_rbp ? rbp : rsp) + cfa_offset; the return address is at CFA - 8 (checked when
 *   the rule is read); the caller's rbp is at CFA + rbp_offset if rbp_saved, else unchanged.
 * Packed: bits 0-31 cfa_offset, 32 cfa_on_rbp, 33 end (the return address is undefined: the
 * outermost frame), 34 rbp_saved, 35 rbp_lost (undefined: a later rbp-based CFA is refused),
 * 36 general (only libgcc can step this frame), 37 busy (not read now: not cached, the walk ends
 * there), 48-63 rbp_offset. */
#define RULE_ON_RBP ((uint64_t)1 << 32)
#define RULE_END ((uint64_t)1 << 33)
#define RULE_RBP_SAVED ((uint64_t)1 << 34)
#define RULE_RBP_LOST ((uint64_t)1 << 35)
#define RULE_GENERAL ((uint64_t)1 << 36)
#define RULE_BUSY ((uint64_t)1 << 37) /* not read: another thread was in the loader's list (prof_rule_read) */

/* A frame larger than this is taken for a wrong rule and ends the walk. */
#define PROF_UNWIND_MAX_FRAME ((uintptr_t)16 << 20)

/* The cache: open addressing, a slot's key goes from 0 to a return address once and never
 * changes, its rule is written before the key is published (release), so readers take no lock.
 * Writers take a try-lock and skip caching when another holds it (a fork child resets it).
 * The table starts at 256 slots (4 KiB) at the first rule and grows by 4 when half full, or when
 * a new rule's window of PROF_RULE_PROBES slots is full, up to 64K slots: a new table is filled
 * with the old one's rules, then published (release); a reader still on the old one finds the
 * rules it had, or reads one again. Old tables are never unmapped (1.3 MiB in all once the
 * largest is reached). A table of 4096 slots from the start took 6 of its 16 pages in a small
 * program, each a read and a write fault on the zero page: 12 of the 24 page faults sampling
 * added to heap-leak (perf record -e page-faults). */
#define PROF_RULE_FIRST_SLOTS 256
#define PROF_RULE_MAX_SLOTS 65536
#define PROF_RULE_PROBES 8
typedef struct prof_rule_slot_s {
  uintptr_t key; /* the return address minus 1 */
  uint64_t rule;
} prof_rule_slot_t;
typedef struct prof_rule_table_s {
  size_t mask;  /* slots - 1, a power of two less one */
  size_t count; /* rules in it (the writer's) */
  prof_rule_slot_t slots[];
} prof_rule_table_t;
QM_EARLY_DATA static prof_rule_table_t *prof_rules; /* NULL until the first rule */
QM_EARLY_DATA static int prof_rules_writer;
QM_EARLY_DATA static uint64_t prof_rules_filled; /* rules read from DWARF (tests, statistics) */
/* The loader's count of unloaded objects (dl_iterate_phdr's dlpi_subs) the cached rules were read
 * at, written with prof_rules_writer held; ~0 before the first check. */
QM_EARLY_DATA static unsigned long long prof_rules_unloads = ~0ull;

/* Where key's probe window starts (masked by the table): the address mixed through every bit
 * (splitmix64's finalizer), as tables of every size index it by their low bits. Fibonacci hashing
 * alone (the product's high half) gave addresses a few bytes apart that shared a window in one
 * table the same window after a growth too (unit-prof's test_rule_cache_full_window). */
static size_t prof_rule_home(uintptr_t key) {
  uint64_t h = (uint64_t)key;
  h = (h ^ (h >> 30)) * 0xBF58476D1CE4E5B9ull;
  h = (h ^ (h >> 27)) * 0x94D049BB133111EBull;
  return (size_t)(h ^ (h >> 31));
}

/* key's probe window in t: the slot holding key, else the window's first empty slot (where a
 * writer puts it), else NULL (no table, or the window full). Lock-free for readers. */
static prof_rule_slot_t *prof_rule_window(prof_rule_table_t *t, uintptr_t key) {
  size_t home = prof_rule_home(key);
  for (unsigned i = 0; t != NULL && i < PROF_RULE_PROBES; i++) {
    prof_rule_slot_t *slot = &t->slots[(home + i) & t->mask];
    uintptr_t k = __atomic_load_n(&slot->key, __ATOMIC_ACQUIRE);
    if (k == key || k == 0) return slot;
  }
  return NULL;
}

/* key's rule slot in t, or NULL. */
static const prof_rule_slot_t *prof_rule_find(prof_rule_table_t *t, uintptr_t key) {
  const prof_rule_slot_t *slot = prof_rule_window(t, key);
  return slot != NULL && __atomic_load_n(&slot->key, __ATOMIC_ACQUIRE) == key ? slot : NULL;
}

/* Publishes a table of `slots` holding the current one's rules. A failed mapping leaves the
 * table as it is (rules that find no slot are read each time they are met). The writer's. */
static void prof_rules_grow(size_t slots) {
  size_t bytes = (sizeof(prof_rule_table_t) + slots * sizeof(prof_rule_slot_t) + PAGE_MASK) & ~(size_t)PAGE_MASK;
  prof_rule_table_t *fresh = os_map(bytes, PAGE_SIZE, OS_COMMIT, OS_GUARD_NONE);
  if (fresh == NULL) return;
  stats_metadata_add((intptr_t)bytes);
  fresh->mask = slots - 1;
  prof_rule_table_t *old = prof_rules;
  for (size_t i = 0; old != NULL && i <= old->mask; i++) {
    prof_rule_slot_t *slot = old->slots[i].key ? prof_rule_window(fresh, old->slots[i].key) : NULL;
    if (slot == NULL) continue; /* empty, or its window is full even here: read again when met */
    *slot = old->slots[i];
    fresh->count++;
  }
  __atomic_store_n(&prof_rules, fresh, __ATOMIC_RELEASE);
}

/* ---- reading the DWARF call-frame information ------------------------------------------------- */

/* What libgcc's _Unwind_Find_FDE fills in with the FDE: the function's start is in func. */
struct dwarf_eh_bases {
  void *tbase, *dbase, *func;
};

typedef struct cfi_reader_s {
  const uint8_t *at, *end;
  bool bad;
} cfi_reader_t;

static uint64_t cfi_uleb(cfi_reader_t *r) {
  uint64_t v = 0;
  for (unsigned shift = 0; r->at < r->end; shift += 7) {
    uint8_t b = *r->at++;
    if (shift < 64) v |= (uint64_t)(b & 0x7f) << shift;
    if (!(b & 0x80)) return v;
  }
  r->bad = true;
  return 0;
}

static int64_t cfi_sleb(cfi_reader_t *r) {
  uint64_t v = 0;
  unsigned shift = 0;
  for (; r->at < r->end; shift += 7) {
    uint8_t b = *r->at++;
    if (shift < 64) v |= (uint64_t)(b & 0x7f) << shift;
    if (!(b & 0x80)) {
      if (shift + 7 < 64 && (b & 0x40)) v |= ~(uint64_t)0 << (shift + 7);
      return (int64_t)v;
    }
  }
  r->bad = true;
  return 0;
}

static uint8_t cfi_byte(cfi_reader_t *r) {
  if (r->at >= r->end) {
    r->bad = true;
    return 0;
  }
  return *r->at++;
}

static void cfi_skip(cfi_reader_t *r, uint64_t n) {
  if (n > (uint64_t)(r->end - r->at)) r->bad = true;
  else r->at += n;
}

/* A fixed-size little-endian field of n bytes (x86-64 is little-endian), sign-extended if asked. */
static uintptr_t cfi_fixed(cfi_reader_t *r, unsigned n, bool is_signed) {
  uint64_t v = 0;
  if (r->end - r->at >= (ptrdiff_t)n) memcpy(&v, r->at, n);
  cfi_skip(r, n);
  if (is_signed && n < 8 && (v >> (8 * n - 1)) & 1) v |= ~(uint64_t)0 << (8 * n);
  return (uintptr_t)v;
}

/* One value in the format of pointer encoding `enc` (its low 4 bits), with nothing applied. */
static uintptr_t cfi_value(cfi_reader_t *r, uint8_t enc) {
  switch (enc & 0x0f) {
  case 0x00: case 0x04: case 0x0c: return cfi_fixed(r, 8, false); /* absptr (8 bytes here), udata8, sdata8 */
  case 0x01: return (uintptr_t)cfi_uleb(r);
  case 0x09: return (uintptr_t)cfi_sleb(r);
  case 0x02: return cfi_fixed(r, 2, false);
  case 0x0a: return cfi_fixed(r, 2, true);
  case 0x03: return cfi_fixed(r, 4, false);
  case 0x0b: return cfi_fixed(r, 4, true);
  default: r->bad = true; return 0;
  }
}

/* Skips one value in pointer encoding `enc` (only its size matters: the function's start comes
 * from the table). */
static void cfi_skip_encoded(cfi_reader_t *r, uint8_t enc) {
  if (enc != 0xff) cfi_value(r, enc); /* DW_EH_PE_omit: nothing there */
}

/* Reads one value in pointer encoding `enc`: its format, and relative to its own address (pcrel)
 * or to `data_base` (datarel); false for what .eh_frame_hdr does not use (omit, indirect,
 * aligned, text- or function-relative). */
static bool cfi_read_encoded(cfi_reader_t *r, uint8_t enc, uintptr_t data_base, uintptr_t *out) {
  if (enc == 0xff) return false;
  uintptr_t here = (uintptr_t)r->at, v = cfi_value(r, enc);
  switch (enc & 0xf0) {
  case 0x00: break;
  case 0x10: v += here; break;
  case 0x30: v += data_base; break;
  default: return false;
  }
  *out = v;
  return !r->bad;
}

/* ---- where the tables are read from: the object's file, not its mapping -----------------------
 * A page of a library's .eh_frame read through its mapping is faulted in with its neighbours (the
 * kernel maps every page of the 64 KiB around a fault that is in the page cache, and libc's are),
 * and they stay in the process's RSS: a first sample whose stack passes through libc (any thread's
 * start_thread) read two such windows, 128 KiB of libc's read-only data, more than the profiler's
 * own tables (mtbench prodcons --pairs 1: 2,250 KB of peak RSS; 2,130 reading the file). Read
 * with pread from the object's file instead, the same bytes come from the page cache and map nothing. The file
 * is used only if it is the object that is mapped: its GNU build ID, in a note the loader has read
 * already (so resident), must be the same bytes in the file. Otherwise (no build ID, no file: the
 * vDSO; a file replaced since it was loaded, or that cannot be opened: a sandbox that refuses open
 * with an error, a process out of descriptors) the mapping is read, as before. The descriptor is
 * open from the table's search to the rule's end (prof_rule_read): no descriptor is kept. The
 * calls are system calls, not libc's wrappers, which a program's interposer (fakeroot, a sandbox
 * library) may replace with code that allocates or takes the loader's lock, held here by
 * dl_iterate_phdr; and errno is restored, as a malloc that succeeds leaves it. */
typedef struct cfi_source_s {
  int fd;                  /* -1: the mapping */
  uintptr_t base;          /* the object's load bias (dlpi_addr) */
  const ElfW(Phdr) *phdr;  /* its program headers, to turn an address into a file offset */
  unsigned phnum;
} cfi_source_t;

/* The bytes of the object at [addr, addr + len) are in one PT_LOAD segment's file bytes: how many
 * of them are, from addr to that segment's end (0: none). */
static size_t cfi_in_segment(const cfi_source_t *src, uintptr_t addr, size_t len, off_t *offset) {
  for (unsigned i = 0; i < src->phnum; i++) {
    const ElfW(Phdr) *ph = &src->phdr[i];
    uintptr_t start = src->base + ph->p_vaddr;
    if (ph->p_type != PT_LOAD || addr - start >= ph->p_filesz) continue;
    *offset = (off_t)(ph->p_offset + (addr - start));
    return len < ph->p_filesz - (addr - start) ? len : ph->p_filesz - (addr - start);
  }
  return 0;
}

/* Copies up to len bytes at address addr of the object into buf, no further than the end of the
 * segment that holds addr (where the source knows its segments: as many as asked otherwise), from
 * its file if the source has one, else from memory; how many, 0 if none could be read. */
static size_t cfi_fetch_upto(const cfi_source_t *src, uintptr_t addr, void *buf, size_t len) {
  off_t offset = 0;
  size_t n = src->phnum > 0 ? cfi_in_segment(src, addr, len, &offset) : len;
  if (n == 0) return 0;
  if (src->fd < 0) {
    memcpy(buf, (const void *)addr, n);
    return n;
  }
  long got = syscall(SYS_pread64, src->fd, buf, n, offset);
  return got > 0 ? (size_t)got : 0;
}

/* Copies exactly len bytes at addr into buf (cfi_fetch_upto); false if it could not. */
static bool cfi_fetch(const cfi_source_t *src, uintptr_t addr, void *buf, size_t len) {
  return cfi_fetch_upto(src, addr, buf, len) == len;
}

/* The object's build ID note's descriptor, in memory: NULL if it has none. */
static const uint8_t *cfi_build_id(struct dl_phdr_info *info, size_t *len) {
  for (int i = 0; i < info->dlpi_phnum; i++) {
    const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
    if (ph->p_type != PT_NOTE) continue;
    const uint8_t *at = (const uint8_t *)(info->dlpi_addr + ph->p_vaddr), *end = at + ph->p_memsz;
    while (end - at >= 12) {
      uint32_t namesz, descsz, type;
      memcpy(&namesz, at, 4), memcpy(&descsz, at + 4, 4), memcpy(&type, at + 8, 4);
      const uint8_t *name = at + 12, *desc = name + ((namesz + 3) & ~3u);
      if (desc > end || descsz > (size_t)(end - desc)) break;
      if (type == NT_GNU_BUILD_ID && namesz == 4 && memcmp(name, "GNU", 4) == 0 && descsz > 0) {
        *len = descsz;
        return desc;
      }
      at = desc + ((descsz + 3) & ~3u);
    }
  }
  return NULL;
}

/* The object's file, if it is the one mapped (its build ID the same); -1 otherwise. */
static int cfi_open_file(struct dl_phdr_info *info, const cfi_source_t *src) {
  size_t id_len;
  const uint8_t *id = cfi_build_id(info, &id_len);
  const char *path = info->dlpi_name != NULL && info->dlpi_name[0] != '\0' ? info->dlpi_name : "/proc/self/exe"; /* "": the program */
  if (id == NULL || id_len > 64 || path[0] != '/') return -1; /* a relative name was relative to another directory, maybe */
  int fd = os_file_open(path, O_RDONLY | O_CLOEXEC, 0);
  if (fd < 0) return -1;
  uint8_t copy[64];
  cfi_source_t file = *src;
  file.fd = fd;
  if (!cfi_fetch(&file, (uintptr_t)id, copy, id_len) || memcmp(copy, id, id_len) != 0) {
    os_file_close(fd);
    return -1;
  }
  return fd;
}

/* ---- finding a return address's FDE: the object's .eh_frame_hdr, without libgcc -------------
 * The linker writes PT_GNU_EH_FRAME: a header and a table of (function start, FDE) pairs sorted by
 * start, as 4-byte offsets from the header (datarel sdata4, the only table encoding GNU ld, gold
 * and lld write). A search in the table of the object holding pc finds the FDE, as libgcc's
 * _Unwind_Find_FDE does for such objects (it bisects; fde_search_table interpolates, below).
 * dl_iterate_phdr takes the loader's lock, as libgcc's search does; it runs once per return
 * address (the rules are cached). */
typedef struct fde_search_s {
  uintptr_t pc;
  uintptr_t fde;      /* 0: no FDE covers pc */
  uintptr_t func;     /* the function's start */
  bool searched;      /* the object holding pc has a table this code reads */
  cfi_source_t src;   /* where its bytes are read from (an open file is closed by the caller) */
  unsigned long long unloads; /* the loader's count of unloaded objects as the search saw it */
} fde_search_t;

#define FDE_WINDOW 64 /* table entries a read fetches: 512 bytes */

static void fde_search_table(uintptr_t hdr, size_t hdr_size, fde_search_t *s) {
  uint8_t head[4 + 8 + 8 + 4]; /* version, encodings; eh_frame_ptr, fde_count (at most 8 bytes each); the first start */
  size_t head_len = hdr_size < sizeof head ? hdr_size : sizeof head;
  if (hdr_size < 4 || !cfi_fetch(&s->src, hdr, head, head_len)) return;
  if (head[0] != 1 || head[3] != 0x3b) return; /* version 1; table: datarel sdata4 */
  /* eh_frame_ptr is read for its size alone (its value, pcrel or not, is not used); the count's
   * encoding is absolute or datarel in every linker's output. */
  cfi_reader_t r = {head + 4, head + head_len, false};
  uintptr_t eh_frame, count;
  if (!cfi_read_encoded(&r, head[1], 0, &eh_frame) || (head[2] & 0x70) == 0x10 || !cfi_read_encoded(&r, head[2], hdr, &count)) return;
  size_t table_off = (size_t)(r.at - head);
  if (count > (hdr_size - table_off) / 8) return;
  s->searched = true;
  uintptr_t table = hdr + table_off;
  /* The entries [0, lo) start at or below pc, [hi, count) above it. Each read fetches a window of
   * FDE_WINDOW entries (one pread from a file), placed where pc falls between the starts known at
   * lo - 1 and hi (functions are spread roughly evenly over the text): an interpolation search, 3
   * or 4 reads for libc's 3,700 entries (2,000 return addresses in 16 KiB of its text: 3.26 on
   * average, strace), where a binary search of single entries took 12. */
  int32_t window[2 * FDE_WINDOW];
  int32_t ends[2]; /* the first entry's start (in the header's read, as a rule) and the last's */
  if (count == 0) return;
  if (table_off + 4 <= head_len) memcpy(&ends[0], head + table_off, 4);
  else if (!cfi_fetch(&s->src, table, &ends[0], 4)) return;
  if (!cfi_fetch(&s->src, table + (count - 1) * 8, &ends[1], 4)) return;
  uintptr_t low = hdr + (intptr_t)ends[0], high = hdr + (intptr_t)ends[1]; /* starts known below and above pc's entry, for the guesses */
  size_t lo = 0, hi = count, n = 0, from = 0;
  while (lo < hi) {
    size_t guess = s->pc <= low ? lo : s->pc >= high ? hi - 1 : lo + (size_t)((unsigned __int128)(s->pc - low) * (hi - 1 - lo) / (high - low));
    n = hi - lo < FDE_WINDOW ? hi - lo : FDE_WINDOW;
    from = guess > lo + n / 2 ? guess - n / 2 : lo;
    if (from > hi - n) from = hi - n;
    if (!cfi_fetch(&s->src, table + from * 8, window, n * 8)) return;
    size_t k = 0;
    while (k < n && hdr + (intptr_t)window[2 * k] <= s->pc) k++;
    if (k == 0) hi = from, high = hdr + (intptr_t)window[0];
    else if (k == n) lo = from + n, low = hdr + (intptr_t)window[2 * (n - 1)];
    else lo = hi = from + k;
  }
  /* The entry before lo: in the last window read, or one read more. */
  int32_t entry[2]; /* start, FDE */
  if (lo == 0) return;
  if (n > 0 && lo - 1 >= from && lo - 1 < from + n) memcpy(entry, &window[2 * (lo - 1 - from)], 8);
  else if (!cfi_fetch(&s->src, table + (lo - 1) * 8, entry, 8)) return;
  s->func = hdr + (intptr_t)entry[0];
  s->fde = hdr + (intptr_t)entry[1];
}

static int fde_search_object(struct dl_phdr_info *info, size_t size, void *arg) {
  fde_search_t *s = arg;
  s->unloads = info->dlpi_subs;
  const ElfW(Phdr) *eh = NULL;
  bool holds_pc = false;
  for (int i = 0; i < info->dlpi_phnum; i++) {
    const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
    if (ph->p_type == PT_LOAD && s->pc - (info->dlpi_addr + ph->p_vaddr) < ph->p_memsz) holds_pc = true;
    else if (ph->p_type == PT_GNU_EH_FRAME) eh = ph;
  }
  if (!holds_pc) return 0;
  if (eh != NULL) {
    s->src = (cfi_source_t){-1, info->dlpi_addr, info->dlpi_phdr, info->dlpi_phnum};
    s->src.fd = cfi_open_file(info, &s->src);
    fde_search_table(info->dlpi_addr + eh->p_vaddr, eh->p_memsz, s);
  }
  return 1; /* only one object holds pc */
}

/* The rules the walk follows, as the CFA program runs. */
typedef struct cfi_state_s {
  uint8_t cfa_reg;
  int64_t cfa_offset;
  enum { REG_SAME, REG_AT, REG_UNDEFINED, REG_OTHER } rbp, ra;
  int64_t rbp_at, ra_at;
} cfi_state_t;

typedef struct cfi_program_s {
  uint64_t code_align;
  int64_t data_align;
  uint8_t fde_enc;
  uint64_t ra_reg;
  cfi_state_t initial; /* after the CIE's instructions: what DW_CFA_restore goes back to */
} cfi_program_t;

static void cfi_set_reg(cfi_state_t *s, uint64_t reg, int how, int64_t at, const cfi_program_t *cie) {
  if (reg == DW_RBP) {
    s->rbp = how;
    s->rbp_at = at;
  } else if (reg == cie->ra_reg) {
    s->ra = how;
    s->ra_at = at;
  }
}

static void cfi_restore_reg(cfi_state_t *s, uint64_t reg, const cfi_program_t *cie) {
  if (reg == DW_RBP) {
    s->rbp = cie->initial.rbp;
    s->rbp_at = cie->initial.rbp_at;
  } else if (reg == cie->ra_reg) {
    s->ra = cie->initial.ra;
    s->ra_at = cie->initial.ra_at;
  }
}

/* Runs a CFA program until the row that covers `target` (loc starts at `loc`; a CIE's program
 * has no advances). False on an instruction the rule cannot express for the registers it
 * follows. */
static bool cfi_run(cfi_reader_t *r, cfi_state_t *s, const cfi_program_t *cie, uintptr_t loc, uintptr_t target) {
  cfi_state_t remembered[8];
  unsigned depth = 0;
  while (r->at < r->end && !r->bad) {
    uint8_t op = cfi_byte(r);
    uint64_t reg, delta = 0;
    switch (op >> 6) {
    case 1: delta = op & 0x3f; goto advance;
    case 2: reg = op & 0x3f; cfi_set_reg(s, reg, REG_AT, (int64_t)cfi_uleb(r) * cie->data_align, cie); continue;
    case 3: cfi_restore_reg(s, op & 0x3f, cie); continue;
    }
    switch (op) {
    case 0x00: continue; /* nop */
    case 0x02: delta = cfi_byte(r); goto advance;
    case 0x03: delta = cfi_byte(r); delta |= (uint64_t)cfi_byte(r) << 8; goto advance;
    case 0x04: delta = 0; for (int i = 0; i < 4; i++) delta |= (uint64_t)cfi_byte(r) << (8 * i); goto advance;
    case 0x05: reg = cfi_uleb(r); cfi_set_reg(s, reg, REG_AT, (int64_t)cfi_uleb(r) * cie->data_align, cie); continue;
    case 0x06: cfi_restore_reg(s, cfi_uleb(r), cie); continue;
    case 0x07: cfi_set_reg(s, cfi_uleb(r), REG_UNDEFINED, 0, cie); continue;
    case 0x08: cfi_set_reg(s, cfi_uleb(r), REG_SAME, 0, cie); continue;
    case 0x09: reg = cfi_uleb(r); cfi_uleb(r); cfi_set_reg(s, reg, REG_OTHER, 0, cie); continue;
    case 0x0a: /* remember_state (the CFA too, as GCC expects) */
      if (depth == sizeof remembered / sizeof remembered[0]) return false;
      remembered[depth++] = *s;
      continue;
    case 0x0b:
      if (depth == 0) return false;
      *s = remembered[--depth];
      continue;
    case 0x0c: s->cfa_reg = (uint8_t)cfi_uleb(r); s->cfa_offset = (int64_t)cfi_uleb(r); continue;
    case 0x0d: s->cfa_reg = (uint8_t)cfi_uleb(r); continue;
    case 0x0e: s->cfa_offset = (int64_t)cfi_uleb(r); continue;
    case 0x0f: return false; /* def_cfa_expression */
    case 0x10: case 0x16: /* expression, val_expression */
      reg = cfi_uleb(r);
      cfi_skip(r, cfi_uleb(r));
      cfi_set_reg(s, reg, REG_OTHER, 0, cie);
      continue;
    case 0x11: reg = cfi_uleb(r); cfi_set_reg(s, reg, REG_AT, cfi_sleb(r) * cie->data_align, cie); continue;
    case 0x12: s->cfa_reg = (uint8_t)cfi_uleb(r); s->cfa_offset = cfi_sleb(r) * cie->data_align; continue;
    case 0x13: s->cfa_offset = cfi_sleb(r) * cie->data_align; continue;
    case 0x14: case 0x15: reg = cfi_uleb(r); cfi_uleb(r); cfi_set_reg(s, reg, REG_OTHER, 0, cie); continue;
    case 0x2e: cfi_uleb(r); continue; /* GNU_args_size */
    case 0x2f: reg = cfi_uleb(r); cfi_set_reg(s, reg, REG_AT, -(int64_t)cfi_uleb(r) * cie->data_align, cie); continue;
    default: return false; /* set_loc, window_save, vendor extensions */
    }
  advance:
    if (loc + delta * cie->code_align > target) return !r->bad;
    loc += delta * cie->code_align;
  }
  return !r->bad;
}

/* The rule of the frame whose return address is key + 1, or RULE_GENERAL. libgcc_only: the FDE
 * found by libgcc's _Unwind_Find_FDE alone (tests compare the two ways). */
/* The longest FDE and CIE read (their length field included); a longer one (a function with a
 * very long CFA program) is left to libgcc. GCC's and the assembler's are tens of bytes. */
#define CFI_ENTRY_MAX 512

/* The rule at key from the FDE found (found->fde, its function's start found->func). */
static uint64_t prof_rule_from_fde(const fde_search_t *found, uintptr_t key) {
  if (found->fde == 0) return RULE_END; /* no unwind information: libgcc would stop here too */
  /* Each read at once as far as the longest one taken, or the segment's end: one pread each. (An
   * FDE from libgcc, whose source knows no segments, is read by its length, as before.) */
  uint8_t fde[CFI_ENTRY_MAX], cie[CFI_ENTRY_MAX];
  uint32_t len, cie_delta, cie_len;
  bool bounded = found->src.phnum > 0;
  size_t got = cfi_fetch_upto(&found->src, found->fde, fde, bounded ? sizeof fde : 8);
  if (got < 8) return RULE_GENERAL;
  memcpy(&len, fde, 4);
  memcpy(&cie_delta, fde + 4, 4);
  if (len == 0xffffffffu || len < 8 || len > CFI_ENTRY_MAX - 4) return RULE_GENERAL;
  if (got < 4 + len && !cfi_fetch(&found->src, found->fde, fde, 4 + len)) return RULE_GENERAL;
  uintptr_t cie_at = found->fde + 4 - cie_delta;
  got = cfi_fetch_upto(&found->src, cie_at, cie, bounded ? sizeof cie : 4);
  if (got < 4) return RULE_GENERAL;
  memcpy(&cie_len, cie, 4);
  if (cie_len == 0xffffffffu || cie_len < 8 || cie_len > CFI_ENTRY_MAX - 4) return RULE_GENERAL;
  if (got < 4 + cie_len && !cfi_fetch(&found->src, cie_at, cie, 4 + cie_len)) return RULE_GENERAL;

  cfi_program_t prog = {.fde_enc = 0x00};
  cfi_reader_t r = {cie + 8, cie + 4 + cie_len, false};
  uint8_t version = cfi_byte(&r);
  const char *aug = (const char *)r.at;
  while (r.at < r.end && *r.at) r.at++;
  cfi_byte(&r);
  if (aug[0] != '\0' && aug[0] != 'z') return RULE_GENERAL;
  if (version >= 4) cfi_skip(&r, 2); /* address and segment sizes */
  prog.code_align = cfi_uleb(&r);
  prog.data_align = cfi_sleb(&r);
  prog.ra_reg = version == 1 ? cfi_byte(&r) : cfi_uleb(&r);
  if (aug[0] == 'z') {
    uint64_t aug_len = cfi_uleb(&r);
    const uint8_t *after = r.at + aug_len;
    for (const char *a = aug + 1; *a && !r.bad; a++) {
      if (*a == 'R') prog.fde_enc = cfi_byte(&r);
      else if (*a == 'L') cfi_byte(&r);
      else if (*a == 'P') {
        uint8_t enc = cfi_byte(&r);
        if ((enc & 0x70) == 0x50) return RULE_GENERAL; /* aligned */
        cfi_skip_encoded(&r, enc);
      } else if (*a == 'S') return RULE_GENERAL; /* a signal frame: registers come from the kernel's */
    }
    if (r.bad || after > r.end) return RULE_GENERAL;
    r.at = after;
  }
  if (prog.ra_reg != DW_RA || r.bad) return RULE_GENERAL;
  cfi_state_t s = {.cfa_reg = DW_RSP, .rbp = REG_SAME, .ra = REG_SAME};
  if (!cfi_run(&r, &s, &prog, 0, 0)) return RULE_GENERAL;
  prog.initial = s;

  cfi_reader_t f = {fde + 8, fde + 4 + len, false};
  uintptr_t range;
  cfi_skip_encoded(&f, prog.fde_enc); /* the function's start: the table had it */
  if (!cfi_read_encoded(&f, prog.fde_enc & 0x0f, 0, &range)) return RULE_GENERAL; /* its length */
  if (key - found->func >= range) return RULE_END; /* past the last function: no FDE covers pc */
  if (aug[0] == 'z') cfi_skip(&f, cfi_uleb(&f));
  if (f.bad || !cfi_run(&f, &s, &prog, found->func, key)) return RULE_GENERAL;

  if (s.ra == REG_UNDEFINED) return RULE_END;
  if (s.ra != REG_AT || s.ra_at != -8) return RULE_GENERAL;
  if (s.cfa_reg != DW_RSP && s.cfa_reg != DW_RBP) return RULE_GENERAL;
  if (s.cfa_offset < 0 || s.cfa_offset > (int64_t)PROF_UNWIND_MAX_FRAME) return RULE_GENERAL;
  if (s.rbp == REG_OTHER || (s.rbp == REG_AT && (s.rbp_at < -32768 || s.rbp_at > 32767))) return RULE_GENERAL;
  uint64_t rule = (uint64_t)(uint32_t)s.cfa_offset;
  if (s.cfa_reg == DW_RBP) rule |= RULE_ON_RBP;
  if (s.rbp == REG_AT) rule |= RULE_RBP_SAVED | (uint64_t)(uint16_t)(int16_t)s.rbp_at << 48;
  if (s.rbp == REG_UNDEFINED) rule |= RULE_RBP_LOST;
  return rule;
}

static uint64_t prof_rule_read(uintptr_t key, bool libgcc_only, unsigned long long *unloads) {
  int saved_errno = errno; /* a sampled malloc that succeeds leaves errno as it was */
  fde_search_t found = {.pc = key, .src = {.fd = -1}, .unloads = ~0ull};
  /* Only tried: a thread that holds the loader's lock (a program's dl_iterate_phdr callback that
   * allocates, sampled) would wait here for one that holds this lock and waits for the loader's. */
  if (!unwind_phdr_try()) {
    if (unloads != NULL) *unloads = ~0ull;
    return RULE_BUSY;
  }
  if (!libgcc_only) dl_iterate_phdr(fde_search_object, &found);
  if (!found.searched && prof_unwind_present()) { /* an object without a table: libgcc has other ways */
    if (found.src.fd >= 0) os_file_close(found.src.fd);
    found.src.fd = -1; /* libgcc's FDE is read in memory */
    struct dwarf_eh_bases bases;
    found.fde = (uintptr_t)unwind_find_fde((void *)key, &bases);
    found.func = (uintptr_t)bases.func;
  }
  unwind_phdr_release();
  uint64_t rule = prof_rule_from_fde(&found, key);
  if (found.src.fd >= 0) os_file_close(found.src.fd);
  errno = saved_errno;
  if (unloads != NULL) *unloads = found.unloads;
  return rule;
}

static int loader_unloads_of(struct dl_phdr_info *info, size_t size, void *arg) {
  (void)size;
  *(unsigned long long *)arg = info->dlpi_subs;
  return 1; /* the count is the same in every object's record: the first is enough */
}

/* Whether the cached rules may be used: no object has been unloaded since they were read, or the
 * table was just cleared for it (in place: its pages are kept). A walk that finds another thread
 * in the loader's list or writing rules trusts the table as it is: its stack limit still bounds
 * what a rule made stale that moment could make it read. One dl_iterate_phdr per walk, which
 * stops at the first object. */
static bool prof_rules_current(void) {
  unsigned long long unloads;
  if (!prof_unwind_loader_walk(loader_unloads_of, &unloads)) return true;
  if (QM_LIKELY(unloads == __atomic_load_n(&prof_rules_unloads, __ATOMIC_RELAXED))) return true;
  if (__atomic_exchange_n(&prof_rules_writer, 1, __ATOMIC_ACQUIRE) != 0) return false;
  prof_rule_table_t *t = prof_rules;
  for (size_t i = 0; t != NULL && i <= t->mask; i++) __atomic_store_n(&t->slots[i].key, 0, __ATOMIC_RELAXED);
  if (t != NULL) t->count = 0;
  __atomic_store_n(&prof_rules_unloads, unloads, __ATOMIC_RELAXED);
  __atomic_store_n(&prof_rules_writer, 0, __ATOMIC_RELEASE);
  return true;
}

/* key's rule: cached, or read and cached. A walk that could not check the cache against the
 * loader's unloads (cached false) reads every rule and caches none. */
static uint64_t prof_rule_of(uintptr_t key, bool cached) {
  const prof_rule_slot_t *found = cached ? prof_rule_find(__atomic_load_n(&prof_rules, __ATOMIC_ACQUIRE), key) : NULL;
  if (found != NULL) return found->rule;
  if (QM_UNLIKELY(prof_test_unwind_hook != NULL)) prof_test_unwind_hook();
  unsigned long long unloads;
  uint64_t rule = prof_rule_read(key, false, &unloads);
  if (rule & RULE_BUSY) return rule;
  if (cached && __atomic_exchange_n(&prof_rules_writer, 1, __ATOMIC_ACQUIRE) == 0) {
    prof_rule_table_t *current = prof_rules;
    prof_rule_slot_t *slot = prof_rule_window(current, key);
    /* The table grows when it has none, is half full, or key's window is full: at up to half
     * full a run of 8 taken slots is rare but not negligible (in unit-prof, 2,000 addresses of
     * libc's text left one rule uncached in a few runs in a hundred, by where ASLR put libc), and
     * an uncached rule is read from the DWARF every time a walk meets it. */
    size_t slots = current == NULL ? PROF_RULE_FIRST_SLOTS : (current->mask + 1) * 4;
    if ((slot == NULL || current->count + 1 > (current->mask + 1) / 2) && slots <= PROF_RULE_MAX_SLOTS) {
      prof_rules_grow(slots);
      slot = prof_rule_window(prof_rules, key);
    }
    /* Not a rule read before an unload the table has been cleared for since (prof_rules_current). */
    if (slot != NULL && slot->key == 0 && unloads == prof_rules_unloads) { /* an empty slot (key's own: an earlier writer cached it) */
      slot->rule = rule;
      __atomic_store_n(&slot->key, key, __ATOMIC_RELEASE);
      prof_rules->count++;
      __atomic_fetch_add(&prof_rules_filled, 1, __ATOMIC_RELAXED);
    }
    __atomic_store_n(&prof_rules_writer, 0, __ATOMIC_RELEASE);
  }
  return rule;
}

uint64_t prof_unwind_rules_read(void) { return __atomic_load_n(&prof_rules_filled, __ATOMIC_RELAXED); }

bool prof_unwind_rule_at(uintptr_t pc) {
  prof_rule_of(pc, prof_rules_current());
  return true;
}

bool prof_unwind_rule_cached(uintptr_t pc) { return prof_rule_find(__atomic_load_n(&prof_rules, __ATOMIC_ACQUIRE), pc) != NULL; }

size_t prof_unwind_rule_home(uintptr_t pc, size_t *slots) {
  const prof_rule_table_t *t = __atomic_load_n(&prof_rules, __ATOMIC_ACQUIRE);
  *slots = t != NULL ? t->mask + 1 : 0;
  return t != NULL ? prof_rule_home(pc) & t->mask : 0;
}

bool prof_unwind_rules_agree(uintptr_t pc, uint64_t *ours, uint64_t *libgcc) {
  if (!prof_unwind_present()) return false;
  *ours = prof_rule_read(pc, false, NULL);
  *libgcc = prof_rule_read(pc, true, NULL);
  return true;
}

static void prof_rules_fork_child(void) { prof_rules_writer = 0; }

/* ---- the walk ---------------------------------------------------------------------------------- */

extern void *__libc_stack_end; /* glibc's: the stack pointer at the program's entry */

/* A stack larger than this is not taken for the thread's own (prof_stack_limit). */
#define PROF_STACK_MAX ((uintptr_t)1 << 30)

/* The end of the stack sp is in: no read of the walk goes past it. glibc puts a thread's control
 * block (where its thread pointer points, %fs:0 holding its own address) and static TLS at the top
 * of the thread's stack mapping, one the program gave included, so its frames lie below the thread
 * pointer; the main thread's lie below __libc_stack_end, above which are argc, argv[0] and argv's
 * end. A stack in neither (a coroutine's, a signal stack) has no end known here: UINTPTR_MAX, and
 * only PROF_UNWIND_MAX_FRAME bounds each step, as it did every step before. */
static uintptr_t prof_stack_limit(uintptr_t sp) {
  uintptr_t tp;
  __asm__("mov %%fs:0, %0" : "=r"(tp));
  if (sp < tp && tp - sp <= PROF_STACK_MAX) return tp;
  uintptr_t end = (uintptr_t)__libc_stack_end;
  if (sp < end && end - sp <= PROF_STACK_MAX) return end + 3 * sizeof(uintptr_t);
  return UINTPTR_MAX;
}

/* Steps from this function's own frame (its registers read at a known instruction) to the
 * outermost one; *general when it stopped at a frame only libgcc can step, *ended when it stopped
 * where the unwind information ends (the outermost frame, or code without any), not at a wrong
 * rule, a busy loader list or PROF_MAX_FRAMES. */
static QM_NOINLINE unsigned prof_stack_walk(uintptr_t *frames, unsigned skip, bool *general, bool *ended) {
  uintptr_t pc, sp, bp;
  __asm__ volatile("lea 0(%%rip), %0\n\tmov %%rsp, %1\n\tmov %%rbp, %2" : "=&r"(pc), "=&r"(sp), "=&r"(bp));
  uintptr_t key = pc; /* the rule at the instruction after the lea, whose rsp was read */
  unsigned depth = 0;
  bool bp_lost = false, cached = prof_rules_current();
  uintptr_t limit = prof_stack_limit(sp);
  *ended = false;
  skip++; /* this frame's caller is prof_stack_capture, not recorded */
  for (;;) {
    if (QM_UNLIKELY(prof_test_unwind_hook != NULL)) prof_test_unwind_hook();
    uint64_t rule = prof_rule_of(key, cached);
    if (rule & RULE_GENERAL) {
      *general = true;
      break;
    }
    if (rule & (RULE_END | RULE_BUSY)) {
      *ended = !(rule & RULE_BUSY);
      break;
    }
    if ((rule & RULE_ON_RBP) && bp_lost) break;
    uintptr_t cfa = ((rule & RULE_ON_RBP) ? bp : sp) + (uint32_t)rule;
    /* A CFA below the frame's own stack pointer, past the stack's end or implausibly far: a
     * wrong rule, so stop rather than read from it. */
    if (cfa <= sp || cfa - sp > PROF_UNWIND_MAX_FRAME || (cfa & 7) != 0 || cfa > limit) break;
    uintptr_t ra = ((const uintptr_t *)cfa)[-1];
    if (rule & RULE_RBP_SAVED) {
      uintptr_t saved_at = cfa + (uintptr_t)(intptr_t)(int16_t)(rule >> 48);
      if (saved_at < sp || saved_at > limit - sizeof(uintptr_t)) break;
      bp = *(const uintptr_t *)saved_at;
    }
    if (rule & RULE_RBP_LOST) bp_lost = true;
    sp = cfa;
    if (ra == 0) {
      *ended = true;
      break;
    }
    if (skip > 0) skip--;
    else {
      frames[depth++] = ra;
      if (depth == PROF_MAX_FRAMES) break;
    }
    key = ra - 1; /* inside the call instruction: the caller's rule there */
  }
  return depth;
}

unsigned prof_unwind_caller_frames(uintptr_t *frames, bool *whole) {
  bool general = false;
  unsigned depth = prof_stack_walk(frames, 0, &general, whole);
  __asm__ volatile("" ::: "memory"); /* not a tail call: the frame counts as the walk's skipped one */
  return depth;
}

/* A frame the rules cannot step (a signal frame, a CFA computed by an expression) has libgcc walk
 * the whole stack if the process has it; if not, the stack ends there: loading libgcc from inside
 * a malloc is not worth the frames beyond a signal handler. */
QM_NOINLINE unsigned prof_stack_capture(uintptr_t *frames, unsigned skip) {
  bool general = false, ended;
  unsigned depth = prof_stack_walk(frames, skip, &general, &ended);
  if (general && prof_unwind_present()) {
    unsigned whole = prof_stack_capture_libgcc(frames, skip + 1);
    if (whole > 0) depth = whole; /* 0: the loader's list was busy; the frames walked stay */
  }
  __asm__ volatile("" ::: "memory"); /* not a tail call: the frame counts in `skip` */
  return depth;
}

void prof_unwind_start(void) {} /* the rules need no libgcc */

#else /* other architectures: libgcc's unwinder for every sample */

uint64_t prof_unwind_rules_read(void) { return 0; }
bool prof_unwind_rule_at(uintptr_t pc) { return false; }
bool prof_unwind_rule_cached(uintptr_t pc) { return false; }
size_t prof_unwind_rule_home(uintptr_t pc, size_t *slots) {
  *slots = 0;
  return 0;
}
bool prof_unwind_rules_agree(uintptr_t pc, uint64_t *ours, uint64_t *libgcc) { return false; }
static void prof_rules_fork_child(void) {}

unsigned prof_unwind_caller_frames(uintptr_t *frames, bool *whole) {
  (void)frames;
  *whole = true; /* no frames to walk here: nothing cut short */
  return 0;
}

QM_NOINLINE unsigned prof_stack_capture(uintptr_t *frames, unsigned skip) {
  unsigned depth = prof_unwind_load() ? prof_stack_capture_libgcc(frames, skip + 1) : 0;
  __asm__ volatile("" ::: "memory");
  return depth;
}

/* Loaded at start, outside any lock, rather than at the first sample. Sampling is on by default:
 * only a process that asked for profiles (a dump at exit or on a signal) is told they will have
 * no stacks; the others run as they would without the profiler. */
void prof_unwind_start(void) {
  bool asked = option_string(OPTION_PROF_DUMP)[0] != '\0' || option(OPTION_PROF_SIGNAL) != 0;
  if (!prof_unwind_load() && asked)
    log_printf(2, "qmalloc: libgcc_s.so.1 not found; heap profile samples will have no stacks\n");
}

#endif

/* A fork child: the loader's lock and the rule table's writer lock may have been held by a thread
 * that is gone. */
void prof_unwind_fork_child(void) {
  pthread_mutex_init(&unwind_load_lock, NULL);
  prof_rules_fork_child();
}

/* Whether prepare took the flag (this thread's fork). */
static __thread bool unwind_phdr_taken_for_fork;

/* Waits for another thread's walk to end. Not for this thread's own: no signal handler runs while
 * it holds the flag, but a fork there could never see it released. */
void prof_unwind_lock_for_fork(void) {
  if (__atomic_load_n(&unwind_phdr_owner, __ATOMIC_RELAXED) == unwind_phdr_self()) return;
  while (!unwind_phdr_try()) sched_yield();
  unwind_phdr_taken_for_fork = true;
}

void prof_unwind_unlock_after_fork(bool child) {
  bool taken = unwind_phdr_taken_for_fork;
  unwind_phdr_taken_for_fork = false;
  if (child) { /* whoever held it is gone */
    __atomic_store_n(&unwind_phdr_owner, 0, __ATOMIC_RELAXED);
    if (taken) pthread_sigmask(SIG_SETMASK, &unwind_phdr_signals, NULL);
  } else if (taken) {
    unwind_phdr_release();
  }
}

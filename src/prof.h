/* The sampled heap profiler's contract between its files (prof.c: sampling, stack capture,
 * the tables; prof_dump.c: the profile formats; prof_unwind.c: the stack walk; prof_pages.c: the
 * sampled blocks' pages kept per thread) and its callers (api.c, init.c, stats.c).
 * Everything here runs off the fast paths; the fast path's only part is the countdown in
 * tcache_t (types.h), which api.c decrements and prof_should_sample refills. */
#ifndef QM_PROF_H
#define QM_PROF_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "internal.h"

#define PROF_MAX_FRAMES 64

/* Counts of one stack: its samples and their requested bytes as samples at the base interval
 * (prof_sample) would count them, for the profile files, whose readers scale each line by
 * 1 / (1 - exp(-average size / interval)): a sample drawn at an interval the budget stretched
 * (prof.c) stands for more than one; any other for exactly 1024. (The estimated bytes and objects
 * kept here before were never read: the files are scaled by their readers, and the totals'
 * estimate is prof.c's live_est_bytes.) */
typedef struct prof_counts_s {
  uint64_t equiv_x1024, equiv_bytes;
} prof_counts_t;

/* One distinct allocation stack (innermost first). Never freed: a fork child zeroes the counts. */
typedef struct prof_stack_s {
  struct prof_stack_s *next_in_bucket, *next_in_list;
  uint64_t hash;
  uint32_t depth;
  uintptr_t frames[PROF_MAX_FRAMES];
  prof_counts_t live, peak, allocated;
  uint64_t peak_epoch; /* the heap's peak this stack's `peak` belongs to (prof.c, prof_touch) */
} prof_stack_t;

typedef enum { PROF_KIND_LIVE = 0, PROF_KIND_PEAK, PROF_KIND_ALLOCATED } prof_kind_t;

/* ---- prof.c ---- */
/* The sample budget's bucket (prof.c): samples taken at the base interval before the budget's
 * rate applies. 256 stretched the bursts of mtbench's prof-accuracy (1 GiB at 1 MiB blocks in a
 * few milliseconds): its worst site was 4.5%, 21% and 100% off in three runs, against 3.7-5.4%
 * without a budget; 2048 gave 4.9-8.3%. */
#define PROF_BUDGET_BURST 2048
/* Sets this thread's countdown (types.h) to `bytes` before the next sample: at most SMALL_MAX of
 * them in the part malloc's fast path subtracts from, the rest beyond it. The one place both are
 * written (api.c's refill, prof.c's draws). */
QM_INLINE void prof_countdown_set(tcache_t *tc, uint64_t bytes) {
  uint64_t now = bytes < SMALL_MAX ? bytes : SMALL_MAX;
  tc->prof_countdown = now;
  tc->prof_beyond = bytes - now;
}
/* Called by api.c's slow half of malloc when a request of `size` bytes reached the next sample
 * (or the thread has drawn no interval yet). Draws the next interval, and says whether this
 * allocation is sampled (never while the thread is inside the profiler, never with sampling off,
 * whose next sample is parked UINT64_MAX bytes away). No lock. */
bool prof_should_sample(size_t size);
/* Records a sampled block (the caller flagged its span): captures the stack with no qmalloc lock
 * held, then takes prof_lock. A nested malloc in the unwinder is served unsampled. */
void prof_record(void *ptr, size_t size);
/* The calling thread's allocations are not sampled between these two (qmalloc's own, e.g. the
 * background releaser's thread, which would otherwise show as a leak). prof_suspend returns what
 * prof_resume restores. */
bool prof_suspend(void);
void prof_resume(bool was);
/* A flagged block is being freed: drops its sample (nothing if a fork child forgot it). */
void prof_forget(void *ptr);
/* A sampled block was resized without a copy (realloc in place or by mremap): the sample follows
 * it to `now` with `size` bytes (its stack kept, its estimate redone). */
void prof_resized(void *was, void *now, size_t size);
/* Draws one sampling interval in bytes (geometric with mean `rate`) from *state (xorshift). */
uint64_t prof_draw_interval(uint64_t *state, uint64_t rate);
/* The estimated bytes a sample of `size` stands for at `rate` (see prof_counts_t). */
uint64_t prof_estimate_bytes(size_t size, uint64_t rate);
/* How many samples at interval `base` one of `size` bytes drawn at interval `mean` stands for, x1024. */
uint64_t prof_equiv_x1024(size_t size, uint64_t mean, uint64_t base);
/* Process start (from init.c, after malloc works): fork handlers, the dump signal, the exit dump. */
void prof_start(void);
/* What the dump signal's handler does (async-signal-safe): writes the live profile to
 * <prof_dump or "qmalloc">.<pid>.signal<k>.live.heap now, or, if this thread is inside the
 * profiler or another holds its lock, leaves it to the next thread that leaves the profiler. */
void prof_dump_request(void);
/* Forgets the "allocated" counts (qm_prof_reset). */
void prof_reset_allocated(void);
/* Writes a profile of `kind` to fd under prof_lock (qm_prof_dump). Returns false if the write
 * failed. */
bool prof_dump_fd(int fd, prof_kind_t kind);
typedef struct prof_totals_s {
  uint64_t rate, samples_taken, samples_dropped, live_samples, live_est_bytes, peak_est_bytes;
  uint64_t samples_stretched; /* drawn at an interval the sample budget stretched */
} prof_totals_t;
void prof_totals(prof_totals_t *out); /* takes prof_lock */
/* Tests only: called from inside the unwinder's frame callback, to make "the unwinder allocates"
 * happen on demand. */
extern void (*prof_test_unwind_hook)(void);

/* ---- prof_unwind.c: stack capture, no allocation, no lock ---- */
/* The return addresses of the calling thread's frames, innermost first, up to PROF_MAX_FRAMES,
 * leaving out the first `skip` (the first is the return into the caller of prof_stack_capture).
 * Cached per-return-address rules on x86-64, libgcc's unwinder where they cannot say. */
unsigned prof_stack_capture(uintptr_t *frames, unsigned skip);
/* The same through libgcc's _Unwind_Backtrace alone (tests compare the two); it counts from its
 * own caller, as prof_stack_capture does. */
unsigned prof_stack_capture_libgcc(uintptr_t *frames, unsigned skip);
/* For callers outside the profiler (the releaser's start, release.c): the return addresses of the
 * caller's frames, innermost first (qmalloc's own included), up to PROF_MAX_FRAMES, by x86-64's
 * cached walk alone: never libgcc, which such a caller must not load. *whole: the walk went as far
 * as the unwind information does (not cut by PROF_MAX_FRAMES, a frame it cannot step, or another
 * thread in the loader's list). 0 frames, whole, on other architectures (nothing is walked). */
unsigned prof_unwind_caller_frames(uintptr_t *frames, bool *whole);
/* How many frame rules were read from the DWARF call-frame information so far (tests). */
uint64_t prof_unwind_rules_read(void);
/* Tests: the rule at code address pc looked up as a walk does (read and cached if new); false on
 * architectures without the rule cache. */
bool prof_unwind_rule_at(uintptr_t pc);
/* Tests: whether the rule at pc is in the cache (looked up, never read); false without the cache. */
bool prof_unwind_rule_cached(uintptr_t pc);
/* Tests: the first slot of pc's probe window in the cache's table, and the table's slots in
 * *slots (0 without a table or without the cache). */
size_t prof_unwind_rule_home(uintptr_t pc, size_t *slots);
/* Tests: the rule at pc read with the FDE found through .eh_frame_hdr (*ours) and through
 * libgcc's _Unwind_Find_FDE (*libgcc); false without libgcc or the rule cache. */
bool prof_unwind_rules_agree(uintptr_t pc, uint64_t *ours, uint64_t *libgcc);
/* Finds libgcc's unwinder (in the process, else by opening libgcc_s.so.1) once; false if there is
 * none. For architectures without the cached walk (prof_unwind_start) and tests. */
bool prof_unwind_load(void);
/* At start with sampling on: loads libgcc where the walk needs it for every sample (not x86-64). */
void prof_unwind_start(void);
/* A fork child: the rule table's writer lock and the unwinder's loading lock may have been held by a
 * thread that is gone. */
void prof_unwind_fork_child(void);
/* dl_iterate_phdr(callback, arg) under the lock around walks of the loader's objects, with this
 * thread's signals blocked (prof_unwind.c says why); false, nothing walked, if another thread's walk
 * holds it. Never waits: callers may run inside a program's own dl_iterate_phdr callback. */
struct dl_phdr_info;
bool prof_unwind_loader_walk(int (*callback)(struct dl_phdr_info *, size_t, void *), void *arg);
/* The fork handlers' side of the lock around walks of the loader's objects (prof_unwind.c). */
void prof_unwind_lock_for_fork(void);
void prof_unwind_unlock_after_fork(bool child);

/* ---- prof_pages.c: the one-page spans of freed sampled blocks, kept per thread, no lock ---- */
#define PROF_PAGE_SAMPLED 1 /* span_t.sampled of a live sampled block (api.c's sampled_mark) */
#define PROF_PAGE_STASHED 2 /* span_t.sampled of a span kept there (a free of it is a double free) */
/* Kept per thread: one. Four made a steady stream of samples in one thread free of the page
 * heap's lock; with the sample budget (prof.c) that stream is at most 10,000 a second, and 0, 1 or
 * 4 kept pages measured the same (malloc-test --threads 2 --size 8192, five runs each), while a
 * consumer thread that frees what others sampled kept four pages it never reused: prodcons
 * --pairs 2 peaked at 2.50-2.64 MB with four, 2.47-2.50 with one, 2.30-2.36 with sampling off. */
#define PROF_PAGES_KEPT 1
struct span_s;
/* A kept span for the calling thread's next sample of up to one page, or NULL. */
struct span_s *prof_pages_take(void);
/* The free of the sampled block at start claims its span first: its flag from sampled to kept
 * (PROF_PAGE_STASHED) with one compare-and-swap, so that of two frees of the block at the same
 * instant, from two threads that both found it live through the page map, one only has it; then
 * the header must still be that block's (the other free may have come first, and the header gone
 * to a sampled block elsewhere since). false: no live sampled block at start, a double free (the
 * caller stops the program: a claim taken from a block elsewhere is not given back). */
bool prof_pages_claim(struct span_s *span, uintptr_t start);
/* Keeps the claimed span of a sampled block being freed (one page, its sample forgotten) for this
 * thread's next sample; false when it is not kept: its claim is dropped (flag 0), and the caller
 * frees it to the page heap. */
bool prof_pages_keep(struct span_s *span);
/* Hands every kept span back to the page heap (malloc_trim); `closing`: the thread is exiting,
 * and keeps nothing after this. */
void prof_pages_release(bool closing);

/* ---- prof_dump.c: requires prof_lock held (or a fork child / signal holding it by try-lock) ---- */
/* The legacy gperftools heap profile ("heap_v2/<rate>", read by google-pprof and jeprof): the
 * in-use pair is the chosen kind, the second pair everything allocated since the last reset;
 * then MAPPED_LIBRARIES (a copy of /proc/self/maps). Writes with write(2) only; no allocation. */
bool prof_dump_write(int fd, prof_kind_t kind, const prof_stack_t *stacks, uint64_t rate);

#endif

/* The sampled heap profiler: the sampling decision (a geometric interval per thread, mean
 * QMALLOC_PROF_SAMPLE bytes), the stack of a sample (captured by prof_unwind.c, trimmed here), and
 * the tables the profiles are made from (live samples by address, stacks with live, peak and
 * allocated counts). Not here: the fast path's countdown (api.c subtracts, this file refills),
 * the allocation of a sampled block as whole pages (api.c), the file formats (prof_dump.c).
 * Lock: prof_lock protects the tables and totals. It is a leaf: nothing taken under it takes
 * another qmalloc lock or allocates (records come from os_map). Stacks are captured before it is
 * taken, with no qmalloc lock held, under a per-thread guard that serves nested mallocs unsampled.
 * Callers: api.c (slow halves of malloc and free), init.c (prof_start), stats.c, qm_prof_*. */
#include <dlfcn.h>
#include <errno.h>
#include <link.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "internal.h"
#include "log.h"
#include "os.h"
#include "os_file.h"
#include "prof.h"
#include "qmalloc.h"

/* Per thread: the guard, the random state. Initial-exec, so the signal handler and the unwinder's
 * nested mallocs can read it without the dynamic loader. */
typedef struct prof_thread_s {
  uint64_t random;
  uint64_t mean;         /* the mean the running interval was drawn with (the budget stretches it) */
  uint64_t mean_base;    /* the prof_sample it was stretched from */
  uint64_t sampled_mean; /* the mean of the interval that ended at the sample being recorded */
  bool started; /* the first interval was drawn */
  bool inside;  /* in prof_record/prof_forget/a dump: nested mallocs are not sampled */
} prof_thread_t;
static __thread prof_thread_t prof_self __attribute__((tls_model("initial-exec")));

QM_EARLY_DATA void (*prof_test_unwind_hook)(void); /* read by every stack walk: .data, see prof_lock */

bool prof_suspend(void) {
  bool was = prof_self.inside;
  prof_self.inside = true;
  return was;
}

void prof_resume(bool was) { prof_self.inside = was; }

/* ---- the tables (under prof_lock) ---------------------------------------------------------- */

/* Touched at random, a page at a time: at 4096 and 16384 buckets a small program's first samples
 * faulted in a page of each for every sample. Chains stay short where it matters: a sample (at
 * most prof_max_samples a second) walks one stack chain, a sampled block's free one live chain. */
#define PROF_STACK_BUCKETS 1024
#define PROF_LIVE_BUCKETS 2048
#define PROF_POOL_CHUNK ((size_t)1 << 20)

typedef struct prof_sample_s {
  struct prof_sample_s *next; /* in its live bucket, or on the free list */
  uintptr_t ptr;
  size_t size;
  uint64_t mean; /* the mean interval it was drawn at (prof_budget_spend) */
  uint64_t base; /* prof_sample when it was taken: what the profile files count samples at */
  uint64_t time_ms; /* when it was allocated (monotonic) */
  prof_stack_t *stack;
} prof_sample_t;

/* The small state every sample reads and writes goes with the library's .data (QM_EARLY_DATA):
 * on .bss pages of their own, around the hash tables, the first sample of a process read and then
 * wrote two of them, four page faults (heap-leak, perf record -e page-faults). */
QM_EARLY_DATA static pthread_mutex_t prof_lock = PTHREAD_MUTEX_INITIALIZER;
static prof_stack_t *prof_stack_buckets[PROF_STACK_BUCKETS];
QM_EARLY_DATA static prof_stack_t *prof_stacks; /* every stack, newest first */
static prof_sample_t *prof_live_buckets[PROF_LIVE_BUCKETS];
QM_EARLY_DATA static prof_sample_t *prof_free_samples;
QM_EARLY_DATA static char *prof_pool_bump, *prof_pool_end;
QM_EARLY_DATA static prof_totals_t prof_total;
QM_EARLY_DATA static int prof_dump_pending; /* a signal asked for a dump while the profiler was busy */

/* Bump allocation from os_map'd chunks: profiler memory never comes from qmalloc itself. */
static void *prof_pool_take(size_t size) {
  size = (size + 15) & ~(size_t)15;
  if (prof_pool_bump == NULL || prof_pool_bump + size > prof_pool_end) {
    char *chunk = os_map(PROF_POOL_CHUNK, PAGE_SIZE, OS_COMMIT, OS_GUARD_NONE);
    if (chunk == NULL) return NULL;
    stats_metadata_add(PROF_POOL_CHUNK);
    prof_pool_bump = chunk;
    prof_pool_end = chunk + PROF_POOL_CHUNK;
  }
  void *p = prof_pool_bump;
  prof_pool_bump += size;
  return p;
}

/* The tables above are reached a page at a time as samples hash into them, and each access reads
 * before it writes. A page's first access being a read maps the kernel's shared zero page, and the
 * write that follows takes a second fault, which in a threaded process also flushes the other
 * CPUs' TLBs by interrupt (as alloc_large's read did for every sampled block). A no-op atomic
 * write first (lock or $0 on x86-64) makes it one fault: a program allocating 8 MiB in 16 KiB
 * blocks paid 5.5 faults a run in prof_record, read then write on three pages, and 2.9 since
 * (perf record -e page-faults, 40 runs). Once a sample, under prof_lock. */
static inline void prof_touch_for_write(void *slot) { __atomic_fetch_or((uintptr_t *)slot, 0, __ATOMIC_RELAXED); }

static uint64_t prof_hash_frames(const uintptr_t *frames, unsigned depth) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned i = 0; i < depth; i++) h = (h ^ frames[i]) * 0x100000001b3ull;
  return h ^ depth;
}

static prof_stack_t *prof_stack_intern(const uintptr_t *frames, unsigned depth) {
  uint64_t h = prof_hash_frames(frames, depth);
  prof_stack_t **bucket = &prof_stack_buckets[h % PROF_STACK_BUCKETS];
  prof_touch_for_write(bucket);
  for (prof_stack_t *s = *bucket; s != NULL; s = s->next_in_bucket)
    if (s->hash == h && s->depth == depth && memcmp(s->frames, frames, depth * sizeof frames[0]) == 0) return s;
  prof_stack_t *s = prof_pool_take(sizeof *s);
  if (s == NULL) return NULL;
  memset(s, 0, sizeof *s);
  s->hash = h;
  s->depth = depth;
  memcpy(s->frames, frames, depth * sizeof frames[0]);
  s->next_in_bucket = *bucket;
  *bucket = s;
  s->next_in_list = prof_stacks;
  prof_stacks = s;
  return s;
}

static size_t prof_live_bucket(uintptr_t ptr) { return (ptr >> PAGE_SHIFT) % PROF_LIVE_BUCKETS; }

/* What a sample stands for follows from its size and the intervals it was drawn at, computed
 * where needed rather than kept beside them (a resized block's copies went stale). */
static uint64_t prof_sample_est_bytes(const prof_sample_t *s) { return prof_estimate_bytes(s->size, s->mean); }

/* Adds (sign 1) or takes away (sign -1, unsigned arithmetic) sample s in counts c. */
static void prof_counts_apply(prof_counts_t *c, const prof_sample_t *s, uint64_t sign) {
  uint64_t equiv_x1024 = prof_equiv_x1024(s->size, s->mean, s->base);
  c->equiv_x1024 += sign * equiv_x1024;
  c->equiv_bytes += sign * ((s->size * equiv_x1024 + 512) / 1024);
}

/* Puts s in its live bucket; takes the sample of ptr out of its bucket (NULL if none). */
static void prof_live_put(prof_sample_t *s) {
  size_t b = prof_live_bucket(s->ptr);
  prof_touch_for_write(&prof_live_buckets[b]);
  s->next = prof_live_buckets[b];
  prof_live_buckets[b] = s;
}

static prof_sample_t *prof_live_take(uintptr_t ptr) {
  prof_sample_t **at = &prof_live_buckets[prof_live_bucket(ptr)];
  while (*at != NULL && (*at)->ptr != ptr) at = &(*at)->next;
  prof_sample_t *s = *at;
  if (s != NULL) *at = s->next;
  return s;
}

/* The peak is kept as it passes, at no more than a stack's own update per sample: each time the
 * estimated live bytes pass the last peak, a new peak epoch begins, and a stack's counts at that
 * moment are its live counts until it next changes. So a stack copies live to peak only when it
 * changes for the first time in an epoch (prof_touch, before the change), and a dump of the peak
 * brings every stack up to the current epoch first (prof_peak_sync). The copy of every stack's
 * counts at each new peak that this replaces cost 7,000 instructions a sample with 1,580 stacks
 * in a growing heap (callgrind), six times the sample itself. Requires prof_lock, as all below. */
QM_EARLY_DATA static uint64_t prof_peak_epoch;

static void prof_touch(prof_stack_t *s) {
  if (s->peak_epoch == prof_peak_epoch) return;
  s->peak = s->live;
  s->peak_epoch = prof_peak_epoch;
}

/* After a change of `changed`, which prof_touch'ed it: a new peak when the total passed the last. */
static void prof_note_peak(prof_stack_t *changed) {
  if (prof_total.live_est_bytes <= prof_total.peak_est_bytes) return;
  prof_total.peak_est_bytes = prof_total.live_est_bytes;
  prof_peak_epoch++;
  changed->peak = changed->live;
  changed->peak_epoch = prof_peak_epoch;
}

static void prof_peak_sync(void) {
  for (prof_stack_t *s = prof_stacks; s != NULL; s = s->next_in_list) prof_touch(s);
}

static bool prof_dump_locked(int fd, prof_kind_t kind) {
  if (kind == PROF_KIND_PEAK) prof_peak_sync();
  return prof_dump_write(fd, kind, prof_stacks, (uint64_t)option(OPTION_PROF_SAMPLE));
}

/* ---- numbers: no libm (the library's only new dependency is libgcc_s's unwinder) ----------- */

/* ln(u) for u in (0, 1]: u = m * 2^e with m in [1, 2), ln m = 2 atanh(t), t = (m - 1) / (m + 1) in
 * [0, 1/3): the atanh series to t^15 (ln m within 1.5e-9 of itself over [1, 2), against Python's
 * math.log at 200,000 points; the draws need far less), in Horner form with the
 * reciprocals as constants. One division per draw: the series with a division per term was 280
 * instructions of a sample's 2250 (callgrind, every 8 KiB malloc sampled). */
static double prof_ln(double u) {
  uint64_t bits;
  memcpy(&bits, &u, sizeof bits);
  int e = (int)((bits >> 52) & 0x7ff) - 1023;
  bits = (bits & ~(0x7ffull << 52)) | (1023ull << 52);
  double m;
  memcpy(&m, &bits, sizeof m);
  double t = (m - 1) / (m + 1), t2 = t * t;
  double series = 1.0 / 13 + t2 * (1.0 / 15);
  series = 1.0 / 11 + t2 * series;
  series = 1.0 / 9 + t2 * series;
  series = 1.0 / 7 + t2 * series;
  series = 1.0 / 5 + t2 * series;
  series = 1.0 / 3 + t2 * series;
  series = 1.0 + t2 * series;
  return e * 0.69314718055994530942 + 2 * t * series;
}

/* 1 - exp(-x) for x >= 0 (the chance that a block of x sampling intervals is sampled): halve x
 * until it is below 1/8, where the Taylor series of 1 - exp(-x) to x^9 leaves out less than 3e-15
 * of it (x^10 / 10!; unit-prof checks the estimates against libm's expm1 to 1e-9);
 * then square back with (1 - a)^2 = 1 - (2a - a^2), which keeps the precision of a small result
 * (x = 16 / 2 MiB: 1 - exp(-x) computed as 1 - e would lose five digits). */
static double prof_one_minus_exp_neg(double x) {
  if (x > 700) return 1;
  int halvings = 0;
  while (x > 0.125) {
    x *= 0.5;
    halvings++;
  }
  /* a = 1 - exp(-x) = x - x^2/2! + x^3/3! - ... */
  double series = 1.0 / 362880;
  series = 1.0 / 40320 - x * series;
  series = 1.0 / 5040 - x * series;
  series = 1.0 / 720 - x * series;
  series = 1.0 / 120 - x * series;
  series = 1.0 / 24 - x * series;
  series = 1.0 / 6 - x * series;
  series = 0.5 - x * series;
  double a = x * (1 - x * series);
  while (halvings-- > 0) a = 2 * a - a * a;
  return a;
}

static uint64_t prof_next_random(uint64_t *state) {
  uint64_t x = *state;
  x ^= x >> 12;
  x ^= x << 25;
  x ^= x >> 27;
  *state = x;
  return x * 0x2545F4914F6CDD1Dull;
}

uint64_t prof_draw_interval(uint64_t *state, uint64_t rate) {
  double u = (double)((prof_next_random(state) >> 11) + 1) * (1.0 / 9007199254740992.0); /* (0, 1] */
  double interval = -prof_ln(u) * (double)rate;
  if (interval > 4e18) interval = 4e18;
  return (uint64_t)interval + 1;
}

uint64_t prof_estimate_bytes(size_t size, uint64_t rate) {
  if (size == 0) size = 1;
  double p = prof_one_minus_exp_neg((double)size / (double)rate); /* the chance a block this size is sampled */
  return (uint64_t)((double)size / p + 0.5);
}

/* How many samples at `base` a sample of `size` bytes drawn at `mean` stands for: the ratio of
 * the chances, 1 at the base interval, about mean / base for blocks far smaller than it, 1 for
 * blocks far larger (always sampled). x1024. */
uint64_t prof_equiv_x1024(size_t size, uint64_t mean, uint64_t base) {
  if (mean <= base) return 1024;
  double x = (double)(size ? size : 1);
  return (uint64_t)(1024 * prof_one_minus_exp_neg(x / (double)base) / prof_one_minus_exp_neg(x / (double)mean) + 0.5);
}

/* ---- the sample budget ----------------------------------------------------------------------
 * A sample costs about 2,000 instructions (callgrind: mixed-stress, 1,933 samples). At one per
 * 2 MiB that is nothing where a program does anything with its memory, but a loop that allocates
 * 8 KiB blocks without touching them crosses 2 MiB every 256 pairs, where samples cost it 5% of
 * its time on one thread (malloc-test: 0.351 s against 0.368 s) and up to 25% on short
 * multi-threaded runs. So the process takes at most prof_max_samples samples a second on
 * average: a bucket of PROF_BUDGET_BURST samples (prof.h: a program's start, a burst of large blocks),
 * refilled at that rate. Once it is empty, the sample rate is measured over a period
 * (PROF_BUDGET_PERIOD_NS, or the period's share of samples if that comes first) and the mean
 * interval every thread draws its next samples with is multiplied by the power of two that brings
 * the rate under the limit; when the bucket is over half full again and the rate under half the
 * limit, it halves back, a period at a time. A sample is weighed at the mean its interval was
 * drawn with, so the estimates stay unbiased, and with the stretch settled between two powers of
 * two the weights differ by 2 at most: the estimates keep about the precision of their count.
 * One try-lock, taken once a sample (at most the limit's rate): a thread that finds it held
 * skips the bookkeeping for that sample. */
#define PROF_BUDGET_PERIOD_NS 8000000ull
#define PROF_STRETCH_MAX 24
QM_EARLY_DATA static struct {
  int lock;
  int64_t tokens;
  uint64_t refilled_ns;     /* the bucket holds the refills up to here */
  uint64_t period_start_ns; /* the rate is measured from here */
  uint64_t period_samples;
  unsigned stretch;
  uint64_t stretched; /* samples drawn at a stretched interval (statistics) */
} prof_budget;

static uint64_t prof_now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts); /* the vDSO: tens of nanoseconds, once a sample */
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* Spends one sample of the budget; returns the stretch (a power of two) for the next interval. */
static unsigned prof_budget_spend(void) {
  uint64_t per_second = (uint64_t)option(OPTION_PROF_MAX_SAMPLES);
  unsigned stretch = __atomic_load_n(&prof_budget.stretch, __ATOMIC_RELAXED);
  if (per_second == 0) return 0;
  if (__atomic_exchange_n(&prof_budget.lock, 1, __ATOMIC_ACQUIRE) != 0) return stretch;
  uint64_t now = prof_now_ns();
  if (prof_budget.refilled_ns == 0) { /* the first sample: a full bucket */
    prof_budget.tokens = PROF_BUDGET_BURST;
    prof_budget.refilled_ns = prof_budget.period_start_ns = now;
  }
  uint64_t refill = (now - prof_budget.refilled_ns) * per_second / 1000000000ull;
  if (refill > 0) { /* whole samples only: the remainder stays in the clock */
    prof_budget.refilled_ns += refill * 1000000000ull / per_second;
    prof_budget.tokens = prof_budget.tokens + (int64_t)refill > PROF_BUDGET_BURST ? PROF_BUDGET_BURST : prof_budget.tokens + (int64_t)refill;
  }
  if (prof_budget.tokens > 0) prof_budget.tokens--; /* no debt: the stretch pays */
  uint64_t samples = ++prof_budget.period_samples, span = now - prof_budget.period_start_ns;
  uint64_t share = per_second * PROF_BUDGET_PERIOD_NS / 1000000000ull;
  if (samples >= (share ? share : 1) || span >= PROF_BUDGET_PERIOD_NS) {
    uint64_t rate = samples * 1000000000ull / (span > 1000 ? span : 1000); /* a second's worth */
    if (prof_budget.tokens == 0 && rate > per_second) {
      while (rate > per_second && stretch < PROF_STRETCH_MAX) { /* the power of two that fits */
        rate /= 2;
        stretch++;
      }
    } else if (prof_budget.tokens > PROF_BUDGET_BURST / 2 && stretch > 0 && span >= PROF_BUDGET_PERIOD_NS &&
               rate < per_second / 2) {
      stretch--;
    }
    __atomic_store_n(&prof_budget.stretch, stretch, __ATOMIC_RELAXED);
    prof_budget.period_start_ns = now;
    prof_budget.period_samples = 0;
  }
  __atomic_store_n(&prof_budget.lock, 0, __ATOMIC_RELEASE);
  return stretch;
}

/* ---- the sampling decision ---------------------------------------------------------------- */

bool prof_should_sample(size_t size) {
  tcache_t *tc = &tcache_self;
  uint64_t rate = (uint64_t)option(OPTION_PROF_SAMPLE);
  if (rate == 0) { /* off: park the countdown where no allocation reaches the next sample */
    prof_countdown_set(tc, UINT64_MAX);
    return false;
  }
  prof_thread_t *self = &prof_self;
  if (QM_UNLIKELY(!self->started)) {
    self->started = true;
    self->random = (uint64_t)(uintptr_t)self * 0x9E3779B97F4A7C15ull ^ os_now_ms() ^ ((uint64_t)getpid() << 32);
    if (self->random == 0) self->random = 1;
    self->mean = self->mean_base = rate;
    uint64_t first = prof_draw_interval(&self->random, rate);
    if (size <= first) {
      prof_countdown_set(tc, first - size);
      return false;
    }
  }
  /* The countdown crossed zero inside this allocation; by memorylessness the next interval
   * starts afresh after it, at the mean the budget allows. */
  self->sampled_mean = self->mean_base == rate ? self->mean : rate; /* prof_sample changed: the new one */
  unsigned stretch = prof_budget_spend();
  self->mean = rate > (UINT64_MAX >> stretch) ? UINT64_MAX : rate << stretch;
  self->mean_base = rate;
  if (stretch > 0) __atomic_add_fetch(&prof_budget.stretched, 1, __ATOMIC_RELAXED);
  prof_countdown_set(tc, prof_draw_interval(&self->random, self->mean));
  return !self->inside;
}

/* ---- stack capture (prof_unwind.c walks; this trims qmalloc's own frames) ------------------ */

/* libqmalloc.so's executable pages, when it is a library of its own (not linked into the
 * program): leading frames there (calloc, realloc, operator new calling into malloc) are qmalloc's,
 * not the program's. Found once at start; [0, 0) when qmalloc is part of the program. */
QM_EARLY_DATA static uintptr_t prof_own_text_lo, prof_own_text_hi;

static int prof_find_own_text(struct dl_phdr_info *info, size_t size, void *arg) {
  uintptr_t base = (uintptr_t)arg;
  if (info->dlpi_addr != base) return 0;
  for (int i = 0; i < info->dlpi_phnum; i++) {
    const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
    if (ph->p_type == PT_LOAD && (ph->p_flags & PF_X)) {
      prof_own_text_lo = base + ph->p_vaddr;
      prof_own_text_hi = prof_own_text_lo + ph->p_memsz;
    }
  }
  return 1;
}

static int prof_first_object(struct dl_phdr_info *info, size_t size, void *arg) {
  *(uintptr_t *)arg = info->dlpi_addr; /* the program comes first */
  return 1;
}

static void prof_locate_own_text(void) {
  Dl_info self;
  uintptr_t program = 1;
  if (dladdr((void *)prof_locate_own_text, &self) == 0) return;
  dl_iterate_phdr(prof_first_object, &program);
  if ((uintptr_t)self.dli_fbase == program) return; /* linked into the program */
  /* dli_fbase is the lowest mapped address; dlpi_addr the load bias: equal for shared objects
   * linked at 0, which every shared library is. */
  dl_iterate_phdr(prof_find_own_text, self.dli_fbase);
}

/* Innermost first, starting at the program's call into qmalloc: the frames of prof_record
 * (this is inlined into it) and api.c's malloc_sample_slow are skipped (both noinline), then any
 * frame still in libqmalloc.so's own code. */
QM_INLINE unsigned prof_capture(uintptr_t *frames) {
  unsigned depth = prof_stack_capture(frames, 2);
  unsigned first = 0;
  while (first < depth && frames[first] - 1 - prof_own_text_lo < prof_own_text_hi - prof_own_text_lo) first++;
  if (first > 0 && first < depth) {
    memmove(frames, frames + first, (depth - first) * sizeof frames[0]);
    depth -= first;
  }
  return depth;
}

/* ---- recording and forgetting ------------------------------------------------------------- */

static void prof_dump_signalled(void);

static void prof_unlock(void) {
  pthread_mutex_unlock(&prof_lock);
  if (QM_UNLIKELY(__atomic_load_n(&prof_dump_pending, __ATOMIC_RELAXED))) prof_dump_signalled();
}

QM_NOINLINE void prof_record(void *ptr, size_t size) {
  prof_thread_t *self = &prof_self;
  self->inside = true;
  uintptr_t frames[PROF_MAX_FRAMES];
  unsigned depth = prof_capture(frames);
  uint64_t rate = (uint64_t)option(OPTION_PROF_SAMPLE);
  uint64_t mean = self->sampled_mean; /* set by prof_should_sample, which decided this sample */
  uint64_t est = prof_estimate_bytes(size, mean); /* prof_sample_est_bytes, outside the lock */
  uint64_t now = os_now_ms();
  pthread_mutex_lock(&prof_lock);
  prof_touch_for_write(&prof_stacks); /* the page of the profiler's own variables */
  prof_stack_t *stack = prof_stack_intern(frames, depth);
  prof_sample_t *s = prof_free_samples;
  if (s != NULL) prof_free_samples = s->next;
  else s = prof_pool_take(sizeof *s);
  if (stack == NULL || s == NULL) { /* out of memory for the profiler: the block lives on unsampled */
    if (s != NULL) {
      s->next = prof_free_samples;
      prof_free_samples = s;
    }
    prof_total.samples_dropped++;
  } else {
    s->ptr = (uintptr_t)ptr;
    s->size = size;
    s->mean = mean;
    s->base = rate;
    s->time_ms = now;
    s->stack = stack;
    prof_live_put(s);
    prof_touch(stack);
    prof_counts_apply(&stack->live, s, 1);
    prof_counts_apply(&stack->allocated, s, 1);
    prof_total.samples_taken++;
    prof_total.live_samples++;
    prof_total.live_est_bytes += est;
    prof_note_peak(stack);
  }
  self->inside = false;
  prof_unlock();
}

void prof_forget(void *ptr) {
  prof_thread_t *self = &prof_self;
  bool was_inside = self->inside;
  self->inside = true;
  pthread_mutex_lock(&prof_lock);
  prof_sample_t *s = prof_live_take((uintptr_t)ptr);
  if (s != NULL) {
    prof_touch(s->stack);
    prof_counts_apply(&s->stack->live, s, (uint64_t)-1);
    prof_total.live_samples--;
    prof_total.live_est_bytes -= prof_sample_est_bytes(s);
    s->next = prof_free_samples;
    prof_free_samples = s;
  }
  self->inside = was_inside;
  prof_unlock();
}

void prof_resized(void *was, void *now, size_t size) {
  prof_thread_t *self = &prof_self;
  bool was_inside = self->inside;
  self->inside = true;
  pthread_mutex_lock(&prof_lock);
  prof_sample_t *s = prof_live_take((uintptr_t)was);
  if (s != NULL) {
    /* The same object, with its new bytes: out of the counts at its old size, in at its new. */
    prof_touch(s->stack);
    prof_counts_apply(&s->stack->live, s, (uint64_t)-1);
    prof_total.live_est_bytes -= prof_sample_est_bytes(s);
    s->size = size;
    s->ptr = (uintptr_t)now;
    prof_counts_apply(&s->stack->live, s, 1);
    prof_total.live_est_bytes += prof_sample_est_bytes(s);
    prof_note_peak(s->stack);
    prof_live_put(s);
  }
  self->inside = was_inside;
  prof_unlock();
}

void prof_reset_allocated(void) {
  pthread_mutex_lock(&prof_lock);
  for (prof_stack_t *s = prof_stacks; s != NULL; s = s->next_in_list) memset(&s->allocated, 0, sizeof s->allocated);
  prof_unlock();
}

void prof_totals(prof_totals_t *out) {
  pthread_mutex_lock(&prof_lock);
  *out = prof_total;
  prof_unlock();
  out->rate = (uint64_t)option(OPTION_PROF_SAMPLE);
  out->samples_stretched = __atomic_load_n(&prof_budget.stretched, __ATOMIC_RELAXED);
}

bool prof_dump_fd(int fd, prof_kind_t kind) {
  prof_thread_t *self = &prof_self;
  bool was_inside = self->inside;
  self->inside = true;
  pthread_mutex_lock(&prof_lock);
  bool ok = prof_dump_locked(fd, kind);
  self->inside = was_inside;
  prof_unlock();
  return ok;
}

/* ---- dumps to files: the API, the exit, the signal ---------------------------------------- */


static bool prof_dump_path(const char *path, prof_kind_t kind, bool locked) {
  int fd = os_file_open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return false;
  bool ok = locked ? prof_dump_locked(fd, kind) : prof_dump_fd(fd, kind);
  if (os_file_close(fd) != 0) ok = false;
  return ok;
}

/* "<prefix>.<pid>.<what>.heap" */
static void prof_file_name(char *buf, size_t cap, const char *what) {
  const char *prefix = option_string(OPTION_PROF_DUMP);
  log_format(buf, cap, "%s.%d.%s.heap", prefix[0] ? prefix : "qmalloc", (int)getpid(), what);
}

/* Requires prof_lock held. Signal dumps are numbered, so successive ones do not overwrite. */
static void prof_dump_signal_files(void) {
  static unsigned seq;
  char what[32], path[320];
  log_format(what, sizeof what, "signal%u.live", ++seq);
  prof_file_name(path, sizeof path, what);
  if (!prof_dump_path(path, PROF_KIND_LIVE, true))
    log_printf(2, "qmalloc: profile dump to %s failed (errno %d)\n", path, errno);
}

/* A dump the signal handler left for later: made by the next thread leaving the profiler. */
static void prof_dump_signalled(void) {
  if (prof_self.inside || pthread_mutex_trylock(&prof_lock) != 0) return;
  if (__atomic_exchange_n(&prof_dump_pending, 0, __ATOMIC_ACQ_REL)) {
    prof_self.inside = true;
    prof_dump_signal_files();
    prof_self.inside = false;
  }
  pthread_mutex_unlock(&prof_lock);
}

/* The dump signal. The handler uses only async-signal-safe calls (open, write, read, close) and
 * no allocation. It never waits for prof_lock: if it interrupted the profiler on this thread (the
 * guard is set) or another thread holds the lock, it leaves the dump to whoever unlocks next. */
void prof_dump_request(void) {
  int saved = errno;
  __atomic_store_n(&prof_dump_pending, 1, __ATOMIC_RELEASE);
  prof_dump_signalled();
  errno = saved;
}

static void prof_signal_handler(int sig) { prof_dump_request(); }

/* At exit (QMALLOC_PROF_DUMP set): the leak report (what is still live), the peak, everything
 * allocated, and one line on stderr saying what was written. */
static void prof_at_exit(void) {
  char path[320];
  prof_totals_t t;
  prof_totals(&t);
  prof_file_name(path, sizeof path, "leak");
  bool ok = prof_dump_path(path, PROF_KIND_LIVE, false);
  char peak[320], allocated[320];
  prof_file_name(peak, sizeof peak, "peak");
  prof_file_name(allocated, sizeof allocated, "allocated");
  ok = prof_dump_path(peak, PROF_KIND_PEAK, false) && ok;
  ok = prof_dump_path(allocated, PROF_KIND_ALLOCATED, false) && ok;
  if (!ok) {
    log_printf(2, "qmalloc: could not write the heap profiles %s (errno %d)\n", path, errno);
    return;
  }
  log_printf(2, "qmalloc: leak report: %llu sampled blocks never freed, about %llu bytes: %s (also .peak, .allocated)\n",
             (unsigned long long)t.live_samples, (unsigned long long)t.live_est_bytes, path);
}

/* ---- fork: the child starts with an empty profile ------------------------------------------ */

/* Registered before fork.c's handlers (init.c), so this prepare runs after libc's stream-list
 * lock and every other qmalloc lock are taken: a thread that holds a stream (getline growing its
 * buffer) may wait for prof_lock, never the other way round. fork_lock skips the lock where the
 * forking thread holds it itself (a signal handler that interrupted a sample) or is alone. */
static void prof_fork_prepare(void) {
  fork_lock(&prof_lock, FORK_SLOT_PROF);
  prof_unwind_lock_for_fork();
}

static void prof_fork_parent(void) {
  prof_unwind_unlock_after_fork(false);
  fork_unlock(&prof_lock, FORK_SLOT_PROF, false);
}

/* Only this thread exists. Inherited sampled blocks stay whole-page blocks; their spans lose
 * the flag, so freeing them is an ordinary large free. */
static void prof_fork_child(void) {
  for (size_t b = 0; b < PROF_LIVE_BUCKETS; b++) {
    prof_sample_t *s = prof_live_buckets[b];
    while (s != NULL) {
      prof_sample_t *next = s->next;
      span_t *span = pagemap_span(s->ptr);
      if (span != NULL) span->sampled = 0;
      s->next = prof_free_samples;
      prof_free_samples = s;
      s = next;
    }
    prof_live_buckets[b] = NULL;
  }
  for (prof_stack_t *s = prof_stacks; s != NULL; s = s->next_in_list) {
    memset(&s->live, 0, sizeof s->live);
    memset(&s->peak, 0, sizeof s->peak);
    s->peak_epoch = 0;
    memset(&s->allocated, 0, sizeof s->allocated);
  }
  memset(&prof_total, 0, sizeof prof_total);
  prof_peak_epoch = 0;
  prof_dump_pending = 0;
  prof_budget.lock = 0; /* a thread of the parent may have held it */
  prof_unwind_fork_child();
  prof_unwind_unlock_after_fork(true);
  fork_unlock(&prof_lock, FORK_SLOT_PROF, true);
}

void prof_start(void) {
  prof_locate_own_text();
  /* Here, outside any lock, rather than at the first sample: opening libgcc_s (where the walk
   * needs it) takes the loader's lock. */
  if (option(OPTION_PROF_SAMPLE) != 0) {
    bool was = prof_suspend(); /* the loader's own allocations are qmalloc's, not the program's */
    prof_unwind_start();
    prof_resume(was);
  }
  pthread_atfork(prof_fork_prepare, prof_fork_parent, prof_fork_child);
  int sig = (int)option(OPTION_PROF_SIGNAL);
  if (sig != 0) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = prof_signal_handler;
    sa.sa_flags = SA_RESTART;
    sigemptyset(&sa.sa_mask);
    if (sigaction(sig, &sa, NULL) != 0) log_printf(2, "qmalloc: prof_signal %d cannot be caught; no signal dumps\n", sig);
  }
  if (option_string(OPTION_PROF_DUMP)[0] != '\0') atexit(prof_at_exit);
}

/* ================================ public entry points ========================================= */

QM_EXPORT int qm_prof_dump(const char *path, int kind) {
  if (path == NULL || kind < QM_PROF_LIVE || kind > QM_PROF_ALLOCATED) {
    errno = EINVAL;
    return -1;
  }
  init_process();
  return prof_dump_path(path, (prof_kind_t)kind, false) ? 0 : -1;
}

QM_EXPORT void qm_prof_reset(void) { prof_reset_allocated(); }

/* The heap profiler (src/prof.c, src/prof_dump.c), white-box: the sampling intervals are
 * exponential with the configured mean (mean and spread over many draws); the estimate of a
 * sample is unbiased for its size; a sampled allocation's recorded stack holds the function that
 * called malloc; the unwinder may allocate (a hook inside its frame callback does) without
 * recursing into the profiler; a dump requested by the signal while the profiler runs is deferred,
 * not deadlocked, and written when it leaves; sampled blocks work with realloc, malloc_usable_size
 * and sized frees; the peak is kept, each stack as it was at the last peak; a thread that exits
 * with live samples leaves them valid; a fork child starts with an empty profile and can free what
 * it inherited. */
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <link.h>
#include <malloc.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "internal.h"
#include "prof.h"
#include "qmalloc.h"
#include "testutil.h"

/* Every allocation from now on is sampled (rate 1), or none (rate 0). */
static void set_rate(const char *rate) {
  CHECK(options_set("prof_sample", 11, rate, strlen(rate), "test"));
  tcache_self.prof_countdown = 0; /* the next malloc draws with the new rate */
  tcache_self.prof_beyond = 0;
}

static prof_totals_t totals(void) {
  prof_totals_t t;
  prof_totals(&t);
  return t;
}

/* ---- intervals and estimates ----------------------------------------------------------------- */

static void test_interval_distribution(void) {
  const uint64_t rate = 64 << 10;
  const int n = 200000;
  uint64_t state = 0x1234567887654321ull;
  double sum = 0, sum_sq = 0;
  int below_mean = 0;
  for (int i = 0; i < n; i++) {
    double x = (double)prof_draw_interval(&state, rate);
    sum += x;
    sum_sq += x * x;
    below_mean += x < rate;
  }
  double mean = sum / n, sd = __builtin_sqrt(sum_sq / n - mean * mean);
  /* Exponential: standard deviation = mean, P(x < mean) = 1 - 1/e = 0.632. With 200k draws the
   * standard error of the mean is 0.22% of it; the bounds are over 4 standard errors. */
  CHECK_MSG(mean > rate * 0.99 && mean < rate * 1.01, "mean interval %.0f, expected %llu", mean, (unsigned long long)rate);
  CHECK_MSG(sd > rate * 0.97 && sd < rate * 1.03, "standard deviation %.0f, expected %llu", sd, (unsigned long long)rate);
  double frac = (double)below_mean / n;
  CHECK_MSG(frac > 0.625 && frac < 0.639, "share below the mean %.4f, expected 0.632", frac);
  /* Two states give different sequences; one state repeats itself. */
  uint64_t a = 1, b = 2, a2 = 1;
  CHECK(prof_draw_interval(&a, rate) != prof_draw_interval(&b, rate));
  a = 1;
  CHECK(prof_draw_interval(&a, rate) == prof_draw_interval(&a2, rate));
}

/* The countdown malloc's fast path subtracts from (src/types.h): never more than SMALL_MAX, so that
 * its borrow is also malloc's size test; refilled from prof_beyond without losing a byte of the
 * interval; a request over SMALL_MAX, or one that wraps it, leaves the fast path whatever it held. */
static void test_countdown(void) {
  const size_t sizes[] = {16, 4096, 40000, SMALL_MAX, SMALL_MAX + 1, 300000, 1 << 20, 24};
  set_rate("64M"); /* few samples: most steps must account exactly */
  void *first = malloc(16); /* draws the interval */
  free(first);
  int exact = 0;
  for (int i = 0; i < 400; i++) {
    size_t size = sizes[i % (sizeof sizes / sizeof sizes[0])];
    uint64_t left = tcache_self.prof_countdown + tcache_self.prof_beyond, samples = totals().samples_taken;
    void *p = malloc(size);
    CHECK(p != NULL);
    CHECK_MSG(malloc_usable_size(p) >= size, "malloc(%zu) has %zu usable bytes", size, malloc_usable_size(p));
    CHECK_MSG(tcache_self.prof_countdown <= SMALL_MAX, "countdown %llu after malloc(%zu)",
              (unsigned long long)tcache_self.prof_countdown, size);
    if (totals().samples_taken == samples) { /* no sample: the bytes left went down by the request */
      CHECK_MSG(tcache_self.prof_countdown + tcache_self.prof_beyond == left - size, "malloc(%zu): %llu left, was %llu",
                size, (unsigned long long)(tcache_self.prof_countdown + tcache_self.prof_beyond), (unsigned long long)left);
      exact++;
    }
    free(p);
  }
  CHECK_MSG(exact > 300, "only %d of 400 mallocs were not sampled at 64 MiB", exact);
  /* Sampling off: the countdown still bounds the fast path. A full countdown and a request over
   * SMALL_MAX, or one that would wrap it, still leave it: a large block, or ENOMEM. */
  set_rate("0");
  free(malloc(16));
  for (size_t k = 0; k < 3; k++) {
    tcache_self.prof_countdown = k == 0 ? SMALL_MAX : k == 1 ? SMALL_MAX - 1 : 0;
    void *big = malloc(SMALL_MAX + 1);
    CHECK(big != NULL && malloc_usable_size(big) >= SMALL_MAX + 1);
    CHECK(pagemap_span((uintptr_t)big) != NULL && pagemap_span((uintptr_t)big)->state == SPAN_LARGE);
    free(big);
    volatile size_t huge = SIZE_MAX; /* volatile: GCC warns of a constant size over PTRDIFF_MAX */
    errno = 0;
    CHECK(malloc(huge) == NULL && errno == ENOMEM);
    CHECK(malloc(huge - SMALL_MAX) == NULL);
    CHECK(tcache_self.prof_countdown <= SMALL_MAX);
  }
  tcache_self.prof_countdown = 0;
  tcache_self.prof_beyond = 0;
}

static void test_estimates(void) {
  /* A block far smaller than the rate stands for about rate bytes; one far larger for itself. */
  uint64_t small = prof_estimate_bytes(16, 2 << 20);
  CHECK_MSG(small > (2 << 20) && small < (2 << 20) + 16, "16 B at 2 MiB estimates %llu", (unsigned long long)small);
  CHECK_EQ(prof_estimate_bytes(64 << 20, 64 << 10), 64 << 20);
  /* size = rate: p = 1 - 1/e. */
  uint64_t equal = prof_estimate_bytes(1 << 20, 1 << 20);
  CHECK_MSG(equal > 1658000 && equal < 1659000, "1 MiB at 1 MiB estimates %llu (expected 1658880)", (unsigned long long)equal);
  /* Against libm's expm1, from one byte to 50 intervals: prof.c's series agree to 1e-9. */
  const uint64_t rate = 2 << 20;
  const size_t sizes[] = {1, 16, 1000, 8192, 100000, 1 << 20, 2 << 20, 3 << 20, 7 << 20, 100 << 20};
  for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
    double exact = (double)sizes[i] / -expm1(-(double)sizes[i] / (double)rate);
    double got = (double)prof_estimate_bytes(sizes[i], rate);
    CHECK_MSG(fabs(got - exact) <= 1 + exact * 1e-9, "%zu B at 2 MiB estimates %.0f, libm says %.3f", sizes[i], got, exact);
  }
}

/* ---- the recorded stack ---------------------------------------------------------------------- */

/* Reads the dump of `kind` into buf; returns its length. */
static size_t dump(int kind, char *buf, size_t cap) {
  char path[] = "/tmp/qm-unit-prof-XXXXXX";
  int fd = mkstemp(path);
  CHECK(fd >= 0);
  close(fd);
  CHECK_EQ(qm_prof_dump(path, kind), 0);
  FILE *f = fopen(path, "r");
  size_t n = f ? fread(buf, 1, cap - 1, f) : 0;
  buf[n] = '\0';
  if (f) fclose(f);
  unlink(path);
  return n;
}

static char dump_buf[1 << 20];

/* Whether a stack line of a dump (line up to end) has a frame in [lo, hi). */
static bool line_has_frame(const char *line, const char *end, uintptr_t lo, uintptr_t hi) {
  const char *at = strchr(line, '@');
  for (const char *p = at ? strstr(at, " 0x") : NULL; p != NULL && p < end; p = strstr(p + 1, " 0x")) {
    uintptr_t pc = (uintptr_t)strtoull(p + 1, NULL, 16);
    if (pc >= lo && pc < hi) return true;
  }
  return false;
}

/* The stack lines of a dump whose in-use pair is not 0: how many, how many of them have a frame in
 * [lo, hi) (*with_frame), and their in-use samples summed (*samples_with_frame, if not NULL). */
static int stack_lines(const char *text, uintptr_t lo, uintptr_t hi, int *with_frame, unsigned long long *samples_with_frame) {
  int lines = 0;
  *with_frame = 0;
  if (samples_with_frame) *samples_with_frame = 0;
  const char *line = strchr(text, '\n');
  while (line != NULL && line[1] != '\0' && line[1] != '\n') {
    line++;
    unsigned long long objs = strtoull(line, NULL, 10);
    const char *end = strchr(line, '\n');
    if (objs > 0) {
      lines++;
      if (line_has_frame(line, end, lo, hi)) {
        (*with_frame)++;
        if (samples_with_frame) *samples_with_frame += objs;
      }
    }
    line = end;
  }
  return lines;
}

static int live_lines(const char *text, uintptr_t lo, uintptr_t hi, int *with_frame) {
  return stack_lines(text, lo, hi, with_frame, NULL);
}

/* The in-use bytes (a line's second figure) of the lines of a dump with a frame in [lo, hi). */
static unsigned long long live_bytes_through(const char *text, uintptr_t lo, uintptr_t hi) {
  unsigned long long bytes = 0;
  for (const char *line = strchr(text, '\n'); line != NULL && line[1] != '\0'; line = strchr(line + 1, '\n')) {
    const char *end = strchr(line + 1, '\n');
    if (end == NULL) end = line + strlen(line);
    unsigned long long n, b;
    if (sscanf(line + 1, "%llu: %llu [", &n, &b) == 2 && line_has_frame(line + 1, end, lo, hi)) bytes += b;
  }
  return bytes;
}

/* Small and noinline: the return address of its malloc call is within its first 64 bytes. */
__attribute__((noinline)) void *prof_test_site(size_t n) {
  void *p = malloc(n);
  __asm__ volatile("" ::: "memory");
  return p;
}

static void test_stack_has_caller(void) {
  set_rate("1");
  prof_totals_t before = totals();
  void *p = prof_test_site(100);
  prof_totals_t after = totals();
  CHECK_EQ(after.samples_taken, before.samples_taken + 1);
  CHECK_EQ(after.live_samples, before.live_samples + 1);
  set_rate("0");
  dump(QM_PROF_LIVE, dump_buf, sizeof dump_buf);
  int with_site;
  int lines = live_lines(dump_buf, (uintptr_t)prof_test_site, (uintptr_t)prof_test_site + 64, &with_site);
  CHECK_MSG(lines >= 1 && with_site == 1, "%d live stacks, %d of them through prof_test_site:\n%.400s", lines, with_site, dump_buf);
  CHECK(strncmp(dump_buf, "heap profile:", 13) == 0 && strstr(dump_buf, "@ heap_v2/") != NULL);
  CHECK(strstr(dump_buf, "\nMAPPED_LIBRARIES:\n") != NULL);
  free(p);
  CHECK_EQ(totals().live_samples, before.live_samples);
}

/* ---- the cached stack walk against libgcc's unwinder ------------------------------------------ */

/* Each entry compares the two captures made from the same frame: their first entries are the two
 * call sites in compare_here, the rest must be equal, frame for frame. */
static int walks_compared, walks_differing;

__attribute__((noinline)) static void compare_here(void) {
  uintptr_t fast[PROF_MAX_FRAMES], slow[PROF_MAX_FRAMES];
  unsigned nfast = prof_stack_capture(fast, 0);
  unsigned nslow = prof_stack_capture_libgcc(slow, 0);
  __asm__ volatile("" ::: "memory");
  walks_compared++;
  bool same = nfast == nslow && nfast >= 2 && memcmp(fast + 1, slow + 1, (nfast - 1) * sizeof fast[0]) == 0;
  if (!same) {
    walks_differing++;
    fprintf(stderr, "unit-prof: walk %d: cached %u frames, libgcc %u\n", walks_compared, nfast, nslow);
    for (unsigned i = 0; i < nfast || i < nslow; i++)
      fprintf(stderr, "  %2u %#18lx %#18lx\n", i, i < nfast ? (unsigned long)fast[i] : 0ul, i < nslow ? (unsigned long)slow[i] : 0ul);
  }
}

/* Frames of every shape the walk meets: no frame pointer (-O1 omits it), a frame pointer, a
 * variable-sized frame (alloca: the CFA is on rbp), deep recursion (the 64-frame cut). */
__attribute__((noinline)) static int frame_plain(int n);
__attribute__((noinline, optimize("no-omit-frame-pointer"))) static int frame_pointer(int n) {
  int r = frame_plain(n - 1);
  __asm__ volatile("" ::: "memory");
  return r + 1;
}
__attribute__((noinline)) static int frame_alloca(int n) {
  volatile char *buf = __builtin_alloca(16 + (size_t)n * 24);
  buf[0] = (char)n;
  int r = frame_pointer(n - 1);
  return r + buf[0];
}
__attribute__((noinline)) static int frame_plain(int n) {
  if (n <= 0) {
    compare_here();
    return 0;
  }
  int r = (n % 3 == 0) ? frame_alloca(n - 1) : frame_plain(n - 1);
  __asm__ volatile("" ::: "memory");
  return r + 1;
}

static void on_signal(int sig) { frame_plain(4); } /* through the kernel's signal frame: libgcc's way */

static void *walk_in_thread(void *arg) {
  frame_plain(7);
  return NULL;
}

static void test_stack_walk(void) {
  CHECK(prof_unwind_load()); /* the reference walk is libgcc's: opened here, as samples never do */
  uint64_t rules_before = prof_unwind_rules_read();
  frame_plain(0);
  uint64_t rules_after[2];
  volatile int twice = 2; /* a loop, not unrolled: both walks pass through the same call sites */
  for (int i = 0; i < twice; i++) { /* the second time every rule comes from the cache */
    frame_plain(10);
    rules_after[i] = prof_unwind_rules_read();
  }
#if defined(__x86_64__)
  CHECK(rules_after[0] > rules_before);
#else
  CHECK_EQ(rules_after[0], 0); /* no rule cache: libgcc's unwinder every time */
#endif
  CHECK_EQ(rules_after[1], rules_after[0]);
  frame_plain(200); /* deeper than PROF_MAX_FRAMES */
  pthread_t t;
  CHECK(pthread_create(&t, NULL, walk_in_thread, NULL) == 0);
  pthread_join(t, NULL);
  signal(SIGUSR1, on_signal);
  raise(SIGUSR1);
  signal(SIGUSR1, SIG_DFL);
  CHECK_EQ(walks_compared, 6);
  CHECK_EQ(walks_differing, 0);
}

/* The rule cache grows from one page: 2,000 code addresses (every 8th byte of 16 KiB of libc's text
 * from printf on) are each read once, through four growths of the table, and the second pass
 * finds all of them cached. */
static void test_rule_cache_grows(void) {
  uintptr_t base = (uintptr_t)dlsym(RTLD_DEFAULT, "printf");
  CHECK(base != 0);
  uint64_t before = prof_unwind_rules_read();
  for (uintptr_t i = 0; i < 2000; i++) prof_unwind_rule_at(base + 8 * i + 1);
  uint64_t first = prof_unwind_rules_read();
  for (uintptr_t i = 0; i < 2000; i++) prof_unwind_rule_at(base + 8 * i + 1);
  uint64_t second = prof_unwind_rules_read();
#if defined(__x86_64__)
  CHECK_MSG(first - before == 2000, "%llu rules read for 2000 addresses", (unsigned long long)(first - before));
  CHECK_MSG(second == first, "%llu read again on the second pass", (unsigned long long)(second - first));
#else
  CHECK_EQ(second, before);
#endif
}

/* A rule whose probe window (8 slots) is full grows the table, so it is cached like any other:
 * 9 addresses in 256 KiB of libc's text from printf on (even offsets: test_rule_cache_grows takes
 * odd ones) that share one window, none cached yet, are each read once and then all found in the
 * cache. (Before, the ninth was read again at every walk that met it; unit-prof's 2,000 addresses
 * above met such a window in a few runs in a hundred, depending on where ASLR put libc.) */
static void test_rule_cache_full_window(void) {
#if defined(__x86_64__)
  uintptr_t base = (uintptr_t)dlsym(RTLD_DEFAULT, "printf");
  CHECK(base != 0);
  prof_unwind_rule_at(base); /* a table, whatever came before */
  size_t slots = 0, want = 0;
  uintptr_t crowd[9];
  unsigned n = 0;
  for (uintptr_t pc = base + 2; n < 9 && pc < base + (256 << 10); pc += 2) { /* not test_rule_cache_grows' */
    size_t home = prof_unwind_rule_home(pc, &slots);
    if (n == 0 && !prof_unwind_rule_cached(pc)) want = home, crowd[n++] = pc;
    else if (n > 0 && home == want && !prof_unwind_rule_cached(pc)) crowd[n++] = pc;
  }
  CHECK_MSG(n == 9 && slots > 0 && slots <= 16384, "%u addresses share a window of a table of %zu slots", n, slots);
  uint64_t before = prof_unwind_rules_read();
  for (unsigned i = 0; i < n; i++) prof_unwind_rule_at(crowd[i]);
  size_t grown = 0;
  prof_unwind_rule_home(base, &grown);
  CHECK_MSG(prof_unwind_rules_read() - before == n, "%llu rules read for %u addresses (the table went from %zu to %zu slots)",
            (unsigned long long)(prof_unwind_rules_read() - before), n, slots, grown);
  CHECK(grown > slots);
  for (unsigned i = 0; i < n; i++) CHECK_MSG(prof_unwind_rule_cached(crowd[i]), "address %u of 9 sharing a window not cached", i);
  for (unsigned i = 0; i < n; i++) prof_unwind_rule_at(crowd[i]);
  CHECK_EQ(prof_unwind_rules_read() - before, n);
#endif
}

/* The FDE found through the object's .eh_frame_hdr table gives the rule libgcc's _Unwind_Find_FDE
 * gives, at every 4th byte of 16 KiB of libc's text from printf on, of this program's text from
 * main on, and of libqmalloc's (or the program's, when linked in) from malloc on: inside
 * functions, at their starts and past their ends. */
int main(void);

static void test_fde_lookup_matches_libgcc(void) {
  CHECK(prof_unwind_load());
  const uintptr_t starts[] = {(uintptr_t)dlsym(RTLD_DEFAULT, "printf"), (uintptr_t)main, (uintptr_t)dlsym(RTLD_DEFAULT, "malloc")};
  int compared = 0, differing = 0, found = 0;
  for (size_t s = 0; s < sizeof starts / sizeof starts[0]; s++) {
    CHECK(starts[s] != 0);
    for (uintptr_t pc = starts[s]; pc < starts[s] + (16 << 10); pc += 4) {
      uint64_t ours = 0, libgcc = 0;
      if (!prof_unwind_rules_agree(pc, &ours, &libgcc)) continue;
      compared++;
      found += libgcc != (1ull << 33); /* not RULE_END: an FDE covered pc */
      if (ours != libgcc && differing++ < 5)
        fprintf(stderr, "unit-prof: rule at %#lx: %#llx through .eh_frame_hdr, %#llx through libgcc\n", (unsigned long)pc,
                (unsigned long long)ours, (unsigned long long)libgcc);
    }
  }
#if defined(__x86_64__)
  CHECK_EQ(compared, 3 * 4096);
  CHECK_MSG(found > compared / 2, "only %d of %d addresses had an FDE", found, compared);
#endif
  CHECK_EQ(differing, 0);
}

/* The rules are read from the object's file, not through its mapping (prof_unwind.c): reading
 * the rules of 2,000 addresses of libc's text maps no page of the segment that holds libc's
 * .eh_frame_hdr and .eh_frame. In a child, where fork left those read-only file pages unmapped
 * (the kernel maps them again as they are touched): through the mapping, the table's search and
 * the FDEs would map them, each with up to 15 neighbours. Then, with no descriptor left to open,
 * the rules are read through the mapping and errno is left as it was. */
typedef struct eh_segment_s {
  uintptr_t pc, start, end;
} eh_segment_t;

static int find_eh_segment(struct dl_phdr_info *info, size_t size, void *arg) {
  (void)size;
  eh_segment_t *e = arg;
  uintptr_t hdr = 0;
  bool holds_pc = false;
  for (int i = 0; i < info->dlpi_phnum; i++) {
    const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
    if (ph->p_type == PT_LOAD && e->pc - (info->dlpi_addr + ph->p_vaddr) < ph->p_memsz) holds_pc = true;
    if (ph->p_type == PT_GNU_EH_FRAME) hdr = info->dlpi_addr + ph->p_vaddr;
  }
  if (!holds_pc) return 0;
  for (int i = 0; i < info->dlpi_phnum; i++) {
    const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
    if (ph->p_type == PT_LOAD && hdr - (info->dlpi_addr + ph->p_vaddr) < ph->p_memsz) {
      e->start = info->dlpi_addr + ph->p_vaddr;
      e->end = e->start + ph->p_memsz;
    }
  }
  return 1;
}

/* Pages of [start, end) mapped in this process (/proc/self/pagemap's present bit), or -1. */
static long pages_mapped(uintptr_t start, uintptr_t end) {
  int fd = open("/proc/self/pagemap", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -1;
  long n = 0;
  size_t page = (size_t)sysconf(_SC_PAGESIZE);
  for (uintptr_t p = start & ~(page - 1); p < end; p += page) {
    uint64_t entry;
    if (pread(fd, &entry, 8, (off_t)(p / page * 8)) != 8) n = -1;
    else if (n >= 0 && (entry >> 63)) n++;
  }
  close(fd);
  return n;
}

static void test_rules_read_from_file(void) {
#if defined(__x86_64__)
  uintptr_t text = (uintptr_t)dlsym(RTLD_DEFAULT, "getaddrinfo"); /* libc's, and no other test reads its rules */
  CHECK(text != 0);
  eh_segment_t e = {.pc = text};
  dl_iterate_phdr(find_eh_segment, &e);
  CHECK(e.end > e.start);
  pid_t pid = fork();
  CHECK(pid >= 0);
  if (pid == 0) {
    long before = pages_mapped(e.start, e.end);
    uint64_t rules_before = prof_unwind_rules_read();
    for (uintptr_t i = 0; i < 2000; i++) prof_unwind_rule_at(text + 8 * i + 1);
    uint64_t rules = prof_unwind_rules_read() - rules_before;
    long after = pages_mapped(e.start, e.end);
    if (before < 0 || after != before || rules < 1000) {
      fprintf(stderr, "unit-prof: %llu rules read; pages of libc's unwind tables' segment mapped: %ld before, %ld after\n",
              (unsigned long long)rules, before, after);
      _exit(1);
    }
    /* No descriptor to open (a limit of 0): the rules are read through the mapping instead, and
     * errno is as it was (a sampled malloc that succeeds does not change it). */
    struct rlimit none = {0, 0};
    uintptr_t other = (uintptr_t)dlsym(RTLD_DEFAULT, "getpwnam");
    if (other == 0 || setrlimit(RLIMIT_NOFILE, &none) != 0) _exit(2);
    errno = 4242;
    rules_before = prof_unwind_rules_read();
    for (uintptr_t i = 0; i < 200; i++) prof_unwind_rule_at(other + 8 * i + 1);
    rules = prof_unwind_rules_read() - rules_before;
    if (errno != 4242 || rules < 100) {
      fprintf(stderr, "unit-prof: with no descriptor left, %llu rules read, errno %d\n", (unsigned long long)rules, errno);
      _exit(3);
    }
    _exit(0);
  }
  int status;
  CHECK(waitpid(pid, &status, 0) == pid);
  CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
#endif
}

/* ---- the unwinder allocates ------------------------------------------------------------------ */

static int hook_depth, hook_max_depth, hook_calls;

static void allocating_hook(void) {
  hook_depth++;
  hook_calls++;
  if (hook_depth > hook_max_depth) hook_max_depth = hook_depth;
  /* Small and large: both would be sampled at rate 1 if the guard failed. */
  void *a = malloc(48), *b = malloc(300 << 10);
  free(a);
  free(b);
  hook_depth--;
}

static void test_unwinder_allocates(void) {
  set_rate("1");
  prof_totals_t before = totals();
  prof_test_unwind_hook = allocating_hook;
  void *blocks[20];
  for (int i = 0; i < 20; i++) blocks[i] = prof_test_site(64 + i);
  prof_test_unwind_hook = NULL;
  prof_totals_t after = totals();
  set_rate("0");
  CHECK(hook_calls >= 20);
  CHECK_EQ(hook_max_depth, 1);
  CHECK_EQ(after.samples_taken, before.samples_taken + 20); /* the nested mallocs were not sampled */
  CHECK_EQ(after.live_samples, before.live_samples + 20);
  for (int i = 0; i < 20; i++) free(blocks[i]);
  CHECK_EQ(totals().live_samples, before.live_samples);
}

/* ---- the dump signal arriving inside the profiler ------------------------------------------------ */

static char signal_prefix[64];
static int signal_requests;

static bool signal_file_exists(int k) {
  char path[128];
  snprintf(path, sizeof path, "%s.%d.signal%d.live.heap", signal_prefix, (int)getpid(), k);
  return access(path, F_OK) == 0;
}

/* As if the signal interrupted the unwinder: the profiler's guard is set, so the handler must not
 * wait for anything, and the dump must come out once the sample is recorded. */
static void signal_inside_hook(void) {
  if (signal_requests++ == 0) {
    prof_dump_request();
    CHECK(!signal_file_exists(1)); /* deferred, not written from inside */
  }
}

static void test_signal_inside_profiler(void) {
  snprintf(signal_prefix, sizeof signal_prefix, "/tmp/qm-unit-prof-%d", (int)getpid());
  CHECK(options_set("prof_dump", 9, signal_prefix, strlen(signal_prefix), "test"));
  set_rate("1");
  prof_test_unwind_hook = signal_inside_hook;
  void *p = prof_test_site(100);
  prof_test_unwind_hook = NULL;
  set_rate("0");
  CHECK_EQ(signal_requests >= 1, 1);
  CHECK(signal_file_exists(1)); /* written as the sample left the profiler */
  prof_dump_request(); /* outside the profiler: written at once */
  CHECK(signal_file_exists(2));
  free(p);
  for (int k = 1; k <= 2; k++) {
    char path[128];
    snprintf(path, sizeof path, "%s.%d.signal%d.live.heap", signal_prefix, (int)getpid(), k);
    unlink(path);
  }
}

/* ---- sampled blocks through the rest of the API ----------------------------------------------- */

static void test_sampled_block_api(void) {
  set_rate("1");
  prof_totals_t before = totals();
  char *p = prof_test_site(100);
  char *q = prof_test_site(200);
  char *r = prof_test_site(5000);
  set_rate("0");
  CHECK_EQ(totals().live_samples, before.live_samples + 3);
  CHECK(pagemap_span((uintptr_t)p)->sampled == PROF_PAGE_SAMPLED);
  CHECK(qm_malloc_usable_size(p) >= 100);
  memset(p, 'x', 100);
  p = realloc(p, 150); /* moves to an unsampled block: the sample goes */
  CHECK(p != NULL && p[0] == 'x' && p[99] == 'x');
  CHECK_EQ(totals().live_samples, before.live_samples + 2);
  /* Shrunk within its page (down to half of it), a sampled block stays in place, as a block of a
   * class does, and its sample's size follows; a sized free of the new size names it. */
  set_rate("1");
  char *w = prof_test_site(PAGE_SIZE - 100);
  set_rate("0");
  prof_totals_t whole = totals();
  char *w2 = realloc(w, PAGE_SIZE / 2 + 1);
  CHECK_MSG(w2 == w, "a sampled block shrunk within its page moved (%p -> %p)", (void *)w, (void *)w2);
  CHECK(pagemap_span((uintptr_t)w2)->sampled == PROF_PAGE_SAMPLED);
  CHECK_EQ(totals().live_samples, whole.live_samples);
  CHECK_MSG(totals().live_est_bytes < whole.live_est_bytes, "estimate %llu after the shrink, %llu before",
            (unsigned long long)totals().live_est_bytes, (unsigned long long)whole.live_est_bytes);
  qm_free_sized(w2, PAGE_SIZE / 2 + 1);
  CHECK_EQ(totals().live_samples, whole.live_samples - 1);
  qm_free_sized(q, 200); /* the page map decides, not the size's class */
  CHECK_EQ(totals().live_samples, before.live_samples + 1);
  qm_free_sized(r, 5000);
  CHECK_EQ(totals().live_samples, before.live_samples);
  /* A large sampled block grown in place or by mremap stays sampled, at its new place and size. */
  set_rate("1");
  char *big = prof_test_site(40 << 20); /* a huge block: its own mapping */
  set_rate("0");
  prof_totals_t one = totals();
  CHECK_EQ(one.live_samples, before.live_samples + 1);
  dump(QM_PROF_LIVE, dump_buf, sizeof dump_buf);
  unsigned long long site_bytes = live_bytes_through(dump_buf, (uintptr_t)prof_test_site, (uintptr_t)prof_test_site + 64);
  big[0] = 'b';
  big = realloc(big, 64 << 20); /* grown by mremap, not copied */
  CHECK(big != NULL && big[0] == 'b' && pagemap_span((uintptr_t)big)->sampled == PROF_PAGE_SAMPLED);
  /* The site's line in the live profile follows: its bytes grew by the 24 MiB. */
  dump(QM_PROF_LIVE, dump_buf, sizeof dump_buf);
  unsigned long long site_grown = live_bytes_through(dump_buf, (uintptr_t)prof_test_site, (uintptr_t)prof_test_site + 64);
  CHECK_MSG(site_grown - site_bytes == (24ull << 20), "the site's live bytes went from %llu to %llu", site_bytes, site_grown);
  prof_totals_t grown = totals();
  CHECK_EQ(grown.live_samples, one.live_samples);
  CHECK_MSG(grown.live_est_bytes >= (64u << 20), "after the grow %llu bytes estimated", (unsigned long long)grown.live_est_bytes);
  free(big);
  CHECK_EQ(totals().live_samples, before.live_samples);
  CHECK_EQ(totals().live_est_bytes, before.live_est_bytes);
  /* The freed pages serve ordinary blocks again, unflagged. */
  void *s = malloc(300 << 10);
  CHECK(pagemap_span((uintptr_t)s)->sampled == 0);
  free(s);
  free(p);
  CHECK(qm_prof_dump("/tmp/x", 7) == -1);
}

/* ---- the kept pages of sampled blocks (prof_pages.c) ---------------------------------------- */

static size_t large_bytes(void) {
  pageheap_stats_t st;
  pageheap_stats(&st);
  return st.large_bytes;
}

static void free_body(void *ptr) { free(ptr); }

static void *keep_three(void *unused) {
  (void)unused;
  set_rate("0");
  free(malloc(16)); /* its thread cache, whose exit hands the kept pages back */
  set_rate("1");
  void *b[3];
  for (int i = 0; i < 3; i++) b[i] = prof_test_site(64);
  set_rate("0");
  for (int i = 0; i < 3; i++) free(b[i]);
  return (void *)(uintptr_t)large_bytes();
}

static void test_kept_pages(void) {
  qm_trim(0); /* this thread keeps no page from the tests before */
  size_t before = large_bytes();
  set_rate("1");
  char *p = prof_test_site(100);
  set_rate("0");
  span_t *span = pagemap_span((uintptr_t)p);
  CHECK(span->sampled == PROF_PAGE_SAMPLED && span->npages == 1);
  free(p);
  /* Kept for this thread's next sample: still a large span of the page heap's, flagged. */
  CHECK(span->state == SPAN_LARGE && span->sampled == PROF_PAGE_STASHED);
  CHECK_EQ(large_bytes(), before + PAGE_SIZE);
  set_rate("1");
  char *q = prof_test_site(PAGE_SIZE);
  set_rate("0");
  CHECK_MSG(q == p, "the next sample of a page took %p, not the kept page %p", (void *)q, (void *)p);
  CHECK(span->sampled == PROF_PAGE_SAMPLED);
  memset(q, 'q', PAGE_SIZE);
  free(q);
  /* Its second free, now that the page is kept, stops the program. */
  char out[256];
  int status = 0;
  tu_stderr_of_child(free_body, q, out, sizeof out, &status);
  char want[64];
  snprintf(want, sizeof want, "qmalloc: free(): double free %p\n", (void *)q);
  CHECK_MSG(strcmp(out, want) == 0, "a free of a kept page printed \"%s\"", out);
  CHECK(WIFSIGNALED(status) && WTERMSIG(status) == SIGABRT);
  /* malloc_trim hands the calling thread's kept pages back. */
  qm_trim(0);
  CHECK_EQ(large_bytes(), before);
  /* A thread's kept pages go back when it exits (it freed three sampled blocks, and kept what
   * PROF_PAGES_KEPT allows). */
  pthread_t t;
  void *kept_by_thread = NULL;
  CHECK(pthread_create(&t, NULL, keep_three, NULL) == 0);
  pthread_join(t, &kept_by_thread);
  CHECK_EQ((size_t)(uintptr_t)kept_by_thread, before + (PROF_PAGES_KEPT < 3 ? PROF_PAGES_KEPT : 3) * PAGE_SIZE);
  CHECK_EQ(large_bytes(), before);
}

/* Two frees of one sampled page at the same instant, from two threads that both found it live
 * through the page map: free claims the span before anything else (prof_pages_claim, api.c's
 * free_large), and of the two claims the first has it, the second fails and that free stops the
 * program. Before the claim both could keep the page, each for its own thread's next sample. The
 * claims are made here by hand, in the order the race runs them (two threads racing for them hit
 * the window in none of 3,000 trials here, before the claim or after). A claim through a header
 * that now describes a block elsewhere (the first free came, the header went to another sampled
 * block) fails too. */
static void test_claim(void) {
  set_rate("1");
  char *p = prof_test_site(100);
  set_rate("0");
  span_t *span = pagemap_span((uintptr_t)p);
  CHECK(span != NULL && span->sampled == PROF_PAGE_SAMPLED && span->npages == 1);
  if (span == NULL) return;
  CHECK(prof_pages_claim(span, (uintptr_t)p)); /* the first free */
  CHECK(span->sampled == PROF_PAGE_STASHED);
  CHECK(!prof_pages_claim(span, (uintptr_t)p)); /* the second: it stops */
  span->sampled = PROF_PAGE_SAMPLED; /* the test's own undo: the block is live again */
  CHECK(!prof_pages_claim(span, (uintptr_t)p + PAGE_SIZE)); /* the header names another block */
  span->sampled = PROF_PAGE_SAMPLED;
  free(p);
  CHECK(span->state != SPAN_LARGE || span->sampled == PROF_PAGE_STASHED); /* kept, or given back */
  qm_trim(0);
}

/* ---- the peak ---------------------------------------------------------------------------------- */

__attribute__((noinline)) void *prof_test_peak_site(size_t n) {
  void *p = malloc(n);
  __asm__ volatile("" ::: "memory");
  return p;
}

static void test_peak(void) {
  set_rate("1");
  void *blocks[10];
  for (int i = 0; i < 10; i++) blocks[i] = prof_test_peak_site(3000);
  for (int i = 0; i < 10; i++) free(blocks[i]);
  void *one = prof_test_peak_site(3000);
  set_rate("0");
  prof_totals_t t = totals();
  CHECK(t.peak_est_bytes >= 10 * 3000);
  dump(QM_PROF_PEAK, dump_buf, sizeof dump_buf);
  /* The peak line of this site holds the 10 blocks (maybe more if the peak was earlier). */
  const char *line = dump_buf;
  int found = 0;
  while ((line = strchr(line, '\n')) != NULL) {
    line++;
    int with_site;
    char copy[4096];
    const char *end = strchr(line, '\n');
    size_t len = end ? (size_t)(end - line) : strlen(line);
    if (len == 0 || len >= sizeof copy - 2) break;
    snprintf(copy, sizeof copy, "h\n%.*s\n", (int)len, line);
    if (live_lines(copy, (uintptr_t)prof_test_peak_site, (uintptr_t)prof_test_peak_site + 64, &with_site) && with_site) {
      found = 1;
      CHECK_MSG(strtoull(line, NULL, 10) == 10, "peak line: %.*s", (int)len, line);
    }
  }
  CHECK(found);
  dump(QM_PROF_LIVE, dump_buf, sizeof dump_buf);
  int with_site;
  live_lines(dump_buf, (uintptr_t)prof_test_peak_site, (uintptr_t)prof_test_peak_site + 64, &with_site);
  CHECK_MSG(with_site == 1, "%d live stacks through the site:\n%.2000s", with_site, dump_buf);
  free(one);
  /* Allocated since reset: the site is there, then gone after qm_prof_reset. */
  dump(QM_PROF_ALLOCATED, dump_buf, sizeof dump_buf);
  live_lines(dump_buf, (uintptr_t)prof_test_peak_site, (uintptr_t)prof_test_peak_site + 64, &with_site);
  CHECK_EQ(with_site, 2); /* the loop's call and the last one */
  qm_prof_reset();
  dump(QM_PROF_ALLOCATED, dump_buf, sizeof dump_buf);
  live_lines(dump_buf, (uintptr_t)prof_test_peak_site, (uintptr_t)prof_test_peak_site + 64, &with_site);
  CHECK_EQ(with_site, 0);
}

void *prof_test_peak_site_x(size_t n);
void *prof_test_peak_site_y(size_t n);

/* Samples in the peak profile's stacks through site: its first 64 bytes, or up to the other site
 * of this test where that comes first (the two are small and may sit side by side). */
static unsigned long long peak_samples_through(void *(*site)(size_t)) {
  dump(QM_PROF_PEAK, dump_buf, sizeof dump_buf);
  uintptr_t lo = (uintptr_t)site, hi = lo + 64;
  uintptr_t other = (uintptr_t)(site == prof_test_peak_site_x ? prof_test_peak_site_y : prof_test_peak_site_x);
  if (other > lo && other < hi) hi = other;
  int lines_with_site;
  unsigned long long samples;
  stack_lines(dump_buf, lo, hi, &lines_with_site, &samples);
  return samples;
}

__attribute__((noinline)) void *prof_test_peak_site_x(size_t n) {
  void *p = malloc(n);
  __asm__ volatile("" ::: "memory");
  return p;
}

__attribute__((noinline)) void *prof_test_peak_site_y(size_t n) {
  void *p = malloc(n + 1);
  __asm__ volatile("" ::: "memory");
  return p;
}

/* The peak is kept per stack lazily (a stack copies its live counts when it first changes after a
 * new peak, prof_touch): each stack must show its own count at the last peak, whether it changed
 * after it, was created after it, or never changed since. Blocks of 256 KiB, far above what the
 * other tests keep live, so that each new peak here is set by this test's blocks. */
static void test_peak_per_stack(void) {
  const size_t big = 256 << 10;
  set_rate("1");
  void *x[4], *y[3];
  for (int i = 0; i < 4; i++) x[i] = prof_test_peak_site_x(big); /* the peak: x 4 */
  free(x[3]);
  free(x[2]); /* x changes after the peak: 2 live */
  y[0] = prof_test_peak_site_y(big); /* y is new after it; 3 blocks live, below the 4 of the peak */
  set_rate("0");
  CHECK_EQ(peak_samples_through(prof_test_peak_site_x), 4);
  CHECK_EQ(peak_samples_through(prof_test_peak_site_y), 0);
  set_rate("1");
  y[1] = prof_test_peak_site_y(big);
  y[2] = prof_test_peak_site_y(big); /* 5 live: a new peak, x unchanged since its frees */
  set_rate("0");
  CHECK_EQ(peak_samples_through(prof_test_peak_site_x), 2);
  CHECK_EQ(peak_samples_through(prof_test_peak_site_y), 3);
  free(x[0]); /* x and y change after the peak: it stays as it was */
  free(y[2]);
  CHECK_EQ(peak_samples_through(prof_test_peak_site_x), 2);
  CHECK_EQ(peak_samples_through(prof_test_peak_site_y), 3);
  free(x[1]);
  free(y[0]);
  free(y[1]);
}

/* ---- thread exit and fork ---------------------------------------------------------------------- */

static void *thread_body(void *arg) {
  void **out = arg;
  set_rate("1");
  for (int i = 0; i < 8; i++) out[i] = prof_test_site(1000 + i);
  return NULL; /* exits with 8 live samples */
}

static void test_thread_exit(void) {
  prof_totals_t before = totals();
  void *blocks[8];
  pthread_t t;
  CHECK(pthread_create(&t, NULL, thread_body, blocks) == 0);
  pthread_join(t, NULL);
  set_rate("0");
  CHECK(totals().live_samples >= before.live_samples + 8);
  for (int i = 0; i < 8; i++) {
    CHECK(((char *)blocks[i])[0] == ((char *)blocks[i])[0]); /* still mapped */
    free(blocks[i]);
  }
  CHECK_EQ(totals().live_samples, before.live_samples);
}

static void test_fork(void) {
  set_rate("1");
  void *kept[5];
  for (int i = 0; i < 5; i++) kept[i] = prof_test_site(700);
  set_rate("0");
  prof_totals_t parent = totals();
  CHECK(parent.live_samples >= 5);
  pid_t pid = fork();
  if (pid == 0) {
    /* Exit codes say which check failed (the harness counts only in the parent). */
    prof_totals_t t = totals();
    if (t.live_samples != 0 || t.samples_taken != 0 || t.live_est_bytes != 0) _exit(10);
    int with_site;
    dump(QM_PROF_LIVE, dump_buf, sizeof dump_buf);
    if (live_lines(dump_buf, 0, UINTPTR_MAX, &with_site) != 0) _exit(11);
    for (int i = 0; i < 5; i++) free(kept[i]); /* inherited samples: ordinary frees now */
    set_rate("1");
    void *p = prof_test_site(100);
    t = totals();
    if (t.samples_taken != 1 || t.live_samples != 1) _exit(12);
    free(p);
    if (totals().live_samples != 0) _exit(13);
    _exit(0);
  }
  int status = 0;
  CHECK(waitpid(pid, &status, 0) == pid);
  CHECK_MSG(WIFEXITED(status) && WEXITSTATUS(status) == 0, "child status %d", status);
  CHECK_EQ(totals().live_samples, parent.live_samples); /* the parent keeps its profile */
  for (int i = 0; i < 5; i++) free(kept[i]);
}

/* ---- the sample budget (prof.c): a loop that would take hundreds of thousands of samples a second */

__attribute__((noinline)) void *prof_test_budget_site(size_t n) {
  void *p = malloc(n);
  __asm__ volatile("" ::: "memory");
  return p;
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* The second pair ("allocated") of the dump's line through [lo, hi), scaled as google-pprof does. */
static double allocated_estimate(const char *text, uintptr_t lo, uintptr_t hi, double rate) {
  for (const char *line = strchr(text, '\n'); line != NULL && line[1] != '\0'; line = strchr(line + 1, '\n')) {
    const char *end = strchr(line + 1, '\n'), *pair = strchr(line + 1, '[');
    if (pair == NULL || pair > end || !line_has_frame(line + 1, end, lo, hi)) continue;
    char *after;
    double objs = strtod(pair + 1, &after), bytes = strtod(after + 1, NULL);
    return objs > 0 ? bytes / -expm1(-(bytes / objs) / rate) : 0;
  }
  return 0;
}

static void test_budget(void) {
  CHECK(options_set("prof_max_samples", 16, "2000", 4, "test"));
  set_rate("16K");
  qm_prof_reset(); /* the allocated profile from here */
  prof_totals_t before = totals();
  double start = now_s(), elapsed;
  uint64_t pairs = 0;
  /* Unsampled, this is a sample every 16 pairs: a few hundred thousand a second. At least 0.3 s,
   * and on until 400 samples were taken at stretched intervals (at most 5 s): the estimate below
   * rests on them, and on a loaded machine 0.3 s gave as few as 104 (an estimate 1.31 times the
   * truth, in a checked-debug run of make test). */
  do {
    for (int i = 0; i < 1000; i++) free(prof_test_budget_site(1024));
    pairs += 1000;
    elapsed = now_s() - start;
  } while (elapsed < 0.3 || (totals().samples_stretched - before.samples_stretched < 400 && elapsed < 5.0));
  prof_totals_t after = totals();
  set_rate("0");
  CHECK(options_set("prof_max_samples", 16, "0", 1, "test"));
  uint64_t taken = after.samples_taken - before.samples_taken;
  /* At most a full bucket and 2,000 a second (the margin: the period's granularity). */
  double most = PROF_BUDGET_BURST + 2000 * elapsed * 1.25 + 64;
  CHECK_MSG(taken <= most && taken >= 100, "%llu samples in %.3f s of %llu pairs (at most %.0f)", (unsigned long long)taken,
            elapsed, (unsigned long long)pairs, most);
  CHECK(after.samples_stretched > before.samples_stretched);
  /* Each sample weighed at the interval it was drawn at: the estimate of what the site allocated
   * stays unbiased (20 runs, 2,266 to 2,484 samples, most of the bytes in the few hundred taken
   * after the bucket: 0.870 to 1.130 of the truth). Unweighted, it would be a few percent of it. */
  dump(QM_PROF_ALLOCATED, dump_buf, sizeof dump_buf);
  double est = allocated_estimate(dump_buf, (uintptr_t)prof_test_budget_site, (uintptr_t)prof_test_budget_site + 64, 16 << 10);
  double truth = (double)pairs * 1024;
  CHECK_MSG(fabs(est - truth) <= 0.25 * truth, "allocated estimate %.0f against %.0f (%llu samples, %llu stretched)", est, truth,
            (unsigned long long)taken, (unsigned long long)(after.samples_stretched - before.samples_stretched));
}

int main(void) {
  init_process();
  /* Every test but test_budget counts samples exactly, at rates that would exceed the budget. */
  CHECK(options_set("prof_max_samples", 16, "0", 1, "test"));
  test_interval_distribution();
  test_estimates();
  test_stack_has_caller();
  test_stack_walk();
  test_rule_cache_full_window(); /* while the table is small: many addresses share a window */
  test_rule_cache_grows();
  test_fde_lookup_matches_libgcc();
  test_rules_read_from_file();
  test_unwinder_allocates();
  test_signal_inside_profiler();
  test_peak(); /* before any large sample: the peak must be the one it makes */
  test_peak_per_stack();
  test_sampled_block_api();
  test_kept_pages();
  test_claim();
  test_budget();
  test_thread_exit();
  test_fork();
  test_countdown(); /* last: its large blocks may be sampled, and test_peak needs none before it */
  return tu_summary("unit-prof");
}

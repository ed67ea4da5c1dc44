/* options: every run-time tunable of qmalloc, declared once in OPTIONS_TABLE below.
 *
 * The table generates the option_id_t enum, the static defaults, the range checks, the
 * environment parser, the verbose dump and the completeness check of docs/options.md
 * (tests/unit/test_options.c). Adding an option is one line in the table plus its row in the docs.
 *
 * Values are plain globals initialised statically, so option() is valid before options_init()
 * and costs one load. They are written only by options_init() (once, while the allocator
 * initialises) and by options_set() (the environment parser, later mallopt); nothing here
 * allocates, takes a lock, or uses stdio, so it is safe inside malloc before main. */
#ifndef QM_OPTIONS_H
#define QM_OPTIONS_H

#include <stdbool.h>
#include <stddef.h>

/* Build switch (CMake QM_MIN_ALIGN): the default of min_align. */
#ifndef QM_MIN_ALIGN_DEFAULT
#define QM_MIN_ALIGN_DEFAULT 16
#endif

#define OPTIONS_KIB (1024LL)
#define OPTIONS_MIB (1024LL * OPTIONS_KIB)
#define OPTIONS_GIB (1024LL * OPTIONS_MIB)
#define OPTIONS_TIB (1024LL * OPTIONS_GIB)
/* Longest PATH value, with its NUL. */
#define OPTIONS_PATH_MAX 256

/* X(ID, name, type, default, min, max, help)
 *   ID    the enum suffix: OPTION_<ID>. It must be the upper case of name (checked by the unit
 *         test); the preprocessor cannot change case, so both spellings are written out.
 *   name  lower_snake; the environment variable is QMALLOC_<NAME>.
 *   type  BOOL, COUNT (plain integer), POW2 (integer that must be a power of two), BYTES (K/M/G/T
 *         suffixes accepted), PAGE (a page size: bytes as BYTES, 0 or a power of two), MS (milliseconds, "ms" or "s" suffix accepted; with min -1, "never"
 *         or "-1" is the value -1: an interval that never ends), PATH (a string: default, min and
 *         max bound its length).
 *   help  one line, shown in docs/options.md word for word. */
/* Why the defaults:
 * - tcache_max 16 MiB, measured twice. First on t-test1 alone (2 threads, sizes up to 32 KiB, 200k
 *   ops each, median of 3 interleaved runs): 256K 3.7M ops/s, 28.1 MB peak RSS; 1M 7.9M, 29.1 MB;
 *   4M 10.0M, 31.9 MB; 16M 12.8M, 35.5 MB, and 4M was taken. Then on mtbench's quick preset, 4M,
 *   8M, 16M and 32M side by side in one run (3 repetitions, scores against the best): 16M took
 *   server-mix from 1.52 to 1.00, realloc-mix 1.52 to 1.09, mixed-stress 1.57 to 1.01, churn 1.48
 *   to 1.07, t-test1 1.18 to 1.07, with peak RSS equal or lower except realloc-mix (+9%); in the
 *   memory preset the same end RSS, idle threads 3.0 against 3.4 MB once idle. The budget bounds
 *   capacity (each list's maximum length times its class size), not contents: a list of 64 KiB
 *   blocks allowed 8 reserves 512 KiB while empty, so 4M left workloads of mixed sizes up to 64 KiB
 *   refilling from the central lists on one operation in ten. A thread never holds more than this.
 * - transfer_batch 16 (was 32): a class holds at most this many objects in each list that only
 *   fills (a producer's) or only empties (a consumer's), and moves them a batch at a time, so it is
 *   what producer/consumer programs keep in flight per class and thread. Side by side on mtbench's
 *   quick preset (QMALLOC_TRANSFER_BATCH=16 against 32, 5 repetitions): prodcons peak RSS 1.14
 *   against 1.24 of glibc's (issue 15's target 1.15), remote-stream's 1.03 against 1.12, at 1.20
 *   against 1.01 of the best prodcons throughput (a 3-repetition run: 1.07 against 1.02; the next
 *   allocator, tcmalloc, is at 2.0); malloc-test, t-test1, mallbench, server-mix, mixed-stress and
 *   the real programs within 1-5% either way. Classes from 4 KiB up move as many as before (64 KiB).
 * - tcache_total 32 MiB: two threads at the maximum (eight at the 4 MiB of old); beyond that
 *   threads take budget from each other. Measured against 64M and 128M, side by side on mtbench's
 *   quick preset (5 repetitions, nine benchmarks; then 64M again, 7 repetitions, eight with the
 *   real family): the speed metrics 0.961 and 0.990 of 32M's time for 64M, 0.951 for 128M, every
 *   interval reaching 1.0; mixed-stress (4 threads) faster, 0.907 (0.836-0.986) in the second run;
 *   peak RSS higher where qmalloc leads, server-mix +2.3% to +5.0% and realloc-mix +1.2% to +2.6%.
 *   With four threads wanting more than 8 MiB each (realloc-mix --threads 4), 32M makes them take
 *   budget from each other: 466 collections and 24,330 refills against 60 and 11,681 at 128M, and
 *   0.923 of the time at 128M (9 interleaved runs): the cost of a bounded total, kept. Since the
 *   total bounds what threads that lose budget hold (tcache_grow_budget), 64 threads on 2 CPUs
 *   churning blocks that do not fit their 512 KiB shares are slower at 32M than at 64M (mtbench
 *   busy-threads --write-all 0, 3 runs: 1.20-1.38 s against 0.58-0.63, 41-44 MB against 35-45 MB
 *   peak RSS; docs/design.md, "the total bounds budgets"), and 64M still costs server-mix 4.7% and
 *   realloc-mix 2.4% more peak RSS (quick preset, 5 repetitions, the total bounded): kept too, the
 *   option says how to trade.
 * - tcache_idle_ms 1 s: a cache taken back from a thread that was not idle after all costs that
 *   thread one refill per list it uses again (microseconds), against at least a second of not
 *   operating; the scan runs at most once per interval. With it, mtbench idle-threads (8 threads
 *   x 4 MiB, then idle) went from 34.7 MB to 3.0 MB resident in 14.5 s, the decay included. The
 *   same interval paces the return of unused transfer-cache batches to their spans.
 * - decay_ms 250 ms (was 10 s, jemalloc's dirty-page decay; mimalloc purges after 10 ms, glibc trims
 *   at once). Side by side on mtbench's real family at the paper preset (2 repetitions, decay 10 s,
 *   1 s and 250 ms): peak RSS against the best (glibc) python-tests 1.16, 1.09, 1.01, python-objects
 *   1.09, 1.09, 1.04, the others unchanged (git-gc 1.12, sqlite 1.11, gcc 1.01, perl and redis
 *   best), times within the run's noise (sqlite 1.02 -> 1.06 at both shorter decays, perl 1.07 ->
 *   1.04, gcc 1.01 -> 1.00); the quick preset moved within its noise. Memory a program frees stays
 *   backed that long for reuse without page faults, and a block that turns over faster (large-blocks)
 *   is unaffected. retain_max 64 MiB: not measured; it caps what waits meanwhile.
 * - release_large 32 MiB (glibc's largest dynamic mmap threshold).
 * - prof_sample 2M by default (TCMalloc's), on since the sampled blocks stopped costing a second
 *   page fault each (alloc_large, fe95089): side by side in mtbench's quick preset, 22 repetitions
 *   over four runs, sampling at 2M against 0 costs +0.9% over all points (95% interval
 *   0.992-1.027; docs/profiling.md), within this machine's noise; heap-leak's page faults +2%, the
 *   peak RSS of small benchmarks +3% to +7% (the profiler's tables, the sampled blocks' pages). A sample costs
 *   about 1,800 instructions (stacks are walked with cached per-return-address rules, prof_unwind.c),
 *   and prof_max_samples bounds how many a process takes. Accuracy goes the other way (a site's
 *   spread is 1/sqrt(live bytes / interval)), and a leak of L bytes is seen with probability
 *   1 - exp(-L / interval): at 8M a 4 MiB leak is missed 61% of the time, at 2M 14%. */
#define OPTIONS_TABLE(X)                                                                           \
  X(TCACHE_MAX, tcache_max, BYTES, 16 * OPTIONS_MIB, 64 * OPTIONS_KIB, 1 * OPTIONS_GIB,            \
    "largest cache a single thread may hold")                                                      \
  X(TCACHE_TOTAL, tcache_total, BYTES, 32 * OPTIONS_MIB, 256 * OPTIONS_KIB, 16 * OPTIONS_GIB,      \
    "total thread-cache budget shared by all threads")                                             \
  X(TCACHE_IDLE_MS, tcache_idle_ms, MS, 1000, 0, 3600000,                                          \
    "a thread that neither allocates nor frees for this long gives its cache back (0: never)")     \
  X(TRANSFER_BATCH, transfer_batch, COUNT, 16, 1, 1024,                                            \
    "most objects moved between a thread cache and the central lists at once")                     \
  X(DECAY_MS, decay_ms, MS, 250, -1, 3600000,                                                      \
    "free pages unused this long are returned to the OS (0: at once; never or -1: only by malloc_trim), and those a growing heap cannot use when it faults in new ones") \
  X(RETAIN_MAX, retain_max, BYTES, 64 * OPTIONS_MIB, 0, 1 * OPTIONS_TIB,                           \
    "free but not yet returned bytes above which pages are returned at once (plus the heap in use, up to as much again), by the background releaser while it runs (0: every free page, by the free)") \
  X(RELEASE_LARGE, release_large, BYTES, 32 * OPTIONS_MIB, 0, 1 * OPTIONS_TIB,                     \
    "large blocks at least this big are returned to the OS as soon as freed (0: every one)")       \
  X(RELEASE_THREAD, release_thread, BOOL, 1, 0, 1,                                                 \
    "a background thread returns idle memory when the program makes no allocator calls")          \
  X(OS_PAGE, os_page, PAGE, 0, 0, 64 * OPTIONS_KIB,                                               \
    "page size assumed for the kernel when a larger power of two than its own (64K tests a 64 KiB-page system)") \
  X(MIN_ALIGN, min_align, POW2, QM_MIN_ALIGN_DEFAULT, 8, 16,                                       \
    "alignment of the smallest objects; 8 adds an 8-byte class")                                   \
  X(CHECK, check, COUNT, 1, 1, 2,                                                                  \
    "1: invalid, double and wrong-size frees stop the program; 2: also check every thread-cache list on slow paths (slower)") \
  X(VERBOSE, verbose, BOOL, 0, 0, 1, "print the effective options to stderr at start")             \
  X(STATS, stats, COUNT, 0, 0, 2, "print statistics to stderr at exit: 1 text, 2 JSON")          \
  X(PROF_SAMPLE, prof_sample, BYTES, 2 * OPTIONS_MIB, 0, 1 * OPTIONS_TIB,                        \
    "heap profiler: one sample per this many bytes allocated, on average (0: off)")               \
  X(PROF_MAX_SAMPLES, prof_max_samples, COUNT, 10000, 0, 10000000,                                \
    "heap profiler: most samples a second in the process, on average; beyond, the intervals stretch (0: no limit)") \
  X(PROF_DUMP, prof_dump, PATH, 0, 0, OPTIONS_PATH_MAX - 1,                                        \
    "heap profiler: write the leak, peak and allocated profiles to PATH.<pid>.<kind>.heap at exit") \
  X(PROF_SIGNAL, prof_signal, COUNT, 0, 0, 64,                                                     \
    "heap profiler: this signal writes the live profile from a running program (0: none)")

typedef enum {
#define OPTIONS_X_ENUM(ID, name, type, def, min, max, help) OPTION_##ID,
  OPTIONS_TABLE(OPTIONS_X_ENUM)
#undef OPTIONS_X_ENUM
  OPTION_COUNT
} option_id_t;

typedef enum {
  OPTION_TYPE_BOOL,
  OPTION_TYPE_COUNT,
  OPTION_TYPE_POW2,
  OPTION_TYPE_BYTES,
  OPTION_TYPE_PAGE,
  OPTION_TYPE_MS,
  OPTION_TYPE_PATH, /* a string; the value is its length (0: not set), the text option_string() */
} option_type_t;


typedef struct option_info_s {
  const char *id;   /* "TCACHE_MAX": also the variable name after "QMALLOC_" */
  const char *name; /* "tcache_max" */
  option_type_t type;
  long long def, min, max; /* bools are 0/1 */
  const char *help;
} option_info_t;

/* The table itself, indexed by option_id_t (for the docs check and mallopt). */
extern const option_info_t options_table[OPTION_COUNT];

/* Current values, statically initialised to the defaults. Read them through option(). mallopt
 * sets them while other threads (the background releaser among them) read them, so every access
 * is atomic and relaxed: the same plain load or store on x86-64 and aarch64, no ordering promised
 * (a thread sees a new value at its next read). */
extern long long options_values[OPTION_COUNT];

static inline long long option(option_id_t id) {
  return __atomic_load_n(&options_values[id], __ATOMIC_RELAXED);
}

/* The text of a PATH option ("" when not set). */
const char *option_string(option_id_t id);

/* ---- setting options --------------------------------------------------------------------------- */

/* Reads QMALLOC_OPTIONS and every QMALLOC_<NAME> from the environment (walking environ, or
 * /proc/self/environ into a static buffer when environ is not set up yet), then prints the
 * effective options to fd 2 if verbose. Idempotent and safe to race: the first caller does the
 * work and any concurrent caller waits for it. Makes system calls (write; open/read/close only in
 * the /proc fallback); never allocates; takes no lock. Bad input produces one warning line each. */
void options_init(void);

/* Parses value[0..value_len) for the option called name[0..name_len) (case-insensitive) and sets
 * it. Neither string needs a NUL. source names where the setting came from ("QMALLOC_DECAY_MS",
 * "QMALLOC_OPTIONS", "mallopt"); it is remembered for options_print and used in the warning.
 * On an unknown name, a malformed value or one out of range: writes one warning line to fd 2,
 * keeps the old value and returns false. Never aborts. */
bool options_set(const char *name, size_t name_len, const char *value, size_t value_len,
                 const char *source);

/* ---- reading back -------------------------------------------------------------------------------- */

/* Writes one line per option to fd: name, value, default, and what set it. */
void options_print(int fd);

/* "tcache_max" */
const char *options_name(option_id_t id);

/* "bytes", "ms", ...: the type column of docs/options.md. */
const char *options_type_name(option_type_t type);

/* The source that last set the option (as passed to options_set), or NULL if it has its default. */
const char *options_source(option_id_t id);

/* Formats v the way options_print shows values of this option and the docs show defaults: bools
 * as true/false, bytes with the largest exact K/M/G/T suffix ("4M", "65537"), others in decimal.
 * Every such string is accepted back by options_set. Returns the length (see log_format). */
size_t options_format_value(option_id_t id, long long v, char *buf, size_t cap);

/* The accepted range as shown in warnings and the docs: "64K..1G", "0..3600000", "8 or 16", ... */
size_t options_format_range(option_id_t id, char *buf, size_t cap);

/* "QMALLOC_TCACHE_MAX" */
size_t options_variable_name(option_id_t id, char *buf, size_t cap);

/* True if the environment variable name[0..len) is one qmalloc knows: an option's variable,
 * QMALLOC_OPTIONS, or one of the names the project's test and benchmark tools export for their own
 * use (QMALLOC_SO, ...), which are accepted silently. Anything else starting with QMALLOC_ gets a
 * warning from options_init. */
bool options_is_known_variable(const char *name, size_t len);

/* ---- tests --------------------------------------------------------------------------------------- */

/* Puts every option back to its default and forgets that options_init ran, so a test can change
 * the environment and call options_init again. Not for use while other threads run. */
void options_reset_for_test(void);

#endif

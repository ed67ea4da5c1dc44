/* Unit test of src/options.c. Pins down:
 *  - the table: enum names are the upper case of the option names, names are unique lower_snake,
 *    values start at the defaults;
 *  - value syntax per type (bool words, decimal counts, byte suffixes, ms/s), and rejection of
 *    empty, signed, fractional, trailing-garbage, overflowing and out-of-range values, which keep
 *    the previous value and print exactly one warning line (the exact text is checked);
 *  - the environment: QMALLOC_<NAME>, QMALLOC_OPTIONS lists (several entries, empty entries,
 *    unknown names), QMALLOC_<NAME> winning over QMALLOC_OPTIONS in either order, warnings for
 *    unknown QMALLOC_ variables, the /proc/self/environ fallback when environ is NULL (in a
 *    re-executed child), idempotence, concurrent callers, the verbose dump;
 *  - docs/options.md: one row per option matching the table, and no QMALLOC_ name that is not one. */
#include "options.h"
#include "testutil.h"

#include <errno.h>
#include <pthread.h>
#include <strings.h>
#include <sys/wait.h>
#include <unistd.h>

extern char **environ;

/* ---- capturing fd 2 ---------------------------------------------------------------------------- */

static int capture_pipe_read = -1, capture_saved_stderr = -1;
static char captured[16384];

static void capture_begin(void) {
  int fds[2];
  fflush(stderr);
  if (pipe(fds) != 0) {
    perror("pipe");
    exit(2);
  }
  capture_saved_stderr = dup(2);
  dup2(fds[1], 2);
  close(fds[1]);
  capture_pipe_read = fds[0];
}

/* Restores fd 2 and returns everything written to it since capture_begin (NUL-terminated). */
static const char *capture_end(void) {
  dup2(capture_saved_stderr, 2); /* the pipe's last write end closes here, so read sees EOF */
  close(capture_saved_stderr);
  size_t len = 0;
  for (;;) {
    ssize_t r = read(capture_pipe_read, captured + len, sizeof captured - 1 - len);
    if (r < 0 && errno == EINTR)
      continue;
    if (r <= 0)
      break;
    len += (size_t)r;
  }
  close(capture_pipe_read);
  captured[len] = '\0';
  return captured;
}

static int count_lines(const char *s) {
  int n = 0;
  for (; *s != '\0'; s++)
    n += *s == '\n';
  return n;
}

/* ---- helpers ------------------------------------------------------------------------------------- */

static option_id_t id_of(const char *name) {
  for (int id = 0; id < OPTION_COUNT; id++) {
    if (strcasecmp(options_name((option_id_t)id), name) == 0)
      return (option_id_t)id;
  }
  fprintf(stderr, "test bug: no option %s\n", name);
  exit(2);
}

/* Sets name=value through options_set and expects success, silence and the given value. */
static void expect_accepted(const char *name, const char *value, long long expect) {
  option_id_t id = id_of(name);
  capture_begin();
  bool ok = options_set(name, strlen(name), value, strlen(value), "test");
  const char *out = capture_end();
  CHECK_MSG(ok, "%s=\"%s\" rejected", name, value);
  CHECK_MSG(out[0] == '\0', "%s=\"%s\" printed: %s", name, value, out);
  CHECK_MSG(option(id) == expect, "%s=\"%s\" gave %lld, expected %lld", name, value, option(id), expect);
  CHECK(options_source(id) != NULL && strcmp(options_source(id), "test") == 0);
}

/* Expects options_set to fail, keep the previous value and print exactly one warning line. */
static void expect_rejected(const char *name, const char *value) {
  option_id_t id = id_of(name);
  long long before = option(id);
  capture_begin();
  bool ok = options_set(name, strlen(name), value, strlen(value), "test");
  const char *out = capture_end();
  CHECK_MSG(!ok, "%s=\"%s\" accepted (value %lld)", name, value, option(id));
  CHECK_MSG(option(id) == before, "%s=\"%s\" changed the value to %lld", name, value, option(id));
  CHECK_MSG(count_lines(out) == 1 && out[strlen(out) - 1] == '\n' &&
                strncmp(out, "qmalloc: warning: test: ", 24) == 0,
            "%s=\"%s\": expected one warning line, got \"%s\"", name, value, out);
}

/* Removes every QMALLOC_* variable (the names are copied first: unsetenv edits environ). */
static void clear_qmalloc_environment(void) {
  char names[64][128];
  int n = 0;
  for (char **e = environ; *e != NULL && n < 64; e++) {
    if (strncmp(*e, "QMALLOC_", 8) != 0)
      continue;
    const char *eq = strchr(*e, '=');
    size_t len = eq ? (size_t)(eq - *e) : strlen(*e);
    if (len < sizeof names[0]) {
      memcpy(names[n], *e, len);
      names[n++][len] = '\0';
    }
  }
  for (int i = 0; i < n; i++)
    unsetenv(names[i]);
}

/* Resets the options, runs options_init on the current environment and returns its stderr. */
static const char *reinit(void) {
  options_reset_for_test();
  capture_begin();
  options_init();
  return capture_end();
}

/* ---- the table ----------------------------------------------------------------------------------- */

static void test_table(void) {
  for (int id = 0; id < OPTION_COUNT; id++) {
    const option_info_t *info = &options_table[id];
    char upper[64];
    size_t n = strlen(info->name);
    CHECK(n > 0 && n < sizeof upper);
    for (size_t i = 0; i <= n; i++) {
      char c = info->name[i];
      CHECK_MSG(i == n || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_',
                "option name %s is not lower_snake", info->name);
      upper[i] = (c >= 'a' && c <= 'z') ? (char)(c - 'a' + 'A') : c;
    }
    CHECK_MSG(strcmp(upper, info->id) == 0, "OPTION_%s does not match name %s", info->id, info->name);
    CHECK(strcmp(options_name((option_id_t)id), info->name) == 0);
    CHECK(info->help != NULL && strlen(info->help) > 10 && strchr(info->help, '|') == NULL);
    for (int other = 0; other < id; other++)
      CHECK_MSG(strcmp(options_table[other].name, info->name) != 0, "duplicate option %s", info->name);
    char var[64];
    options_variable_name((option_id_t)id, var, sizeof var);
    CHECK(strncmp(var, "QMALLOC_", 8) == 0 && strcmp(var + 8, info->id) == 0);
    CHECK(options_is_known_variable(var, strlen(var)));
  }
  /* The names the core relies on, with the defaults the core chose. */
  CHECK_EQ(options_table[OPTION_TCACHE_MAX].def, 16LL << 20);
  CHECK_EQ(options_table[OPTION_TCACHE_TOTAL].def, 32LL << 20);
  CHECK_EQ(options_table[OPTION_TRANSFER_BATCH].def, 16);
  CHECK_EQ(options_table[OPTION_DECAY_MS].def, 250);
  CHECK_EQ(options_table[OPTION_RETAIN_MAX].def, 64LL << 20);
  CHECK_EQ(options_table[OPTION_RELEASE_LARGE].def, 32LL << 20);
  CHECK_EQ(options_table[OPTION_MIN_ALIGN].def, QM_MIN_ALIGN_DEFAULT);
  CHECK_EQ(options_table[OPTION_CHECK].def, 1);
  CHECK_EQ(options_table[OPTION_VERBOSE].def, 0);
  CHECK_EQ(options_table[OPTION_STATS].def, 0);

  CHECK(options_is_known_variable("QMALLOC_OPTIONS", 15));
  CHECK(options_is_known_variable("QMALLOC_SO", 10));
  CHECK(!options_is_known_variable("QMALLOC_DECAY", 13));
  CHECK(!options_is_known_variable("QMALLOC_decay_ms", 16));
  CHECK(!options_is_known_variable("QMALLOC_", 8));
}

/* Before any options_init (or if it ran without settings), every value is its default. */
static void test_static_defaults(void) {
  for (int id = 0; id < OPTION_COUNT; id++) {
    CHECK_MSG(options_source((option_id_t)id) != NULL || option((option_id_t)id) == options_table[id].def,
              "%s starts at %lld, not its default", options_name((option_id_t)id), option((option_id_t)id));
  }
}

/* ---- values -------------------------------------------------------------------------------------- */

static void test_good_values(void) {
  options_reset_for_test();
  static const char *const truthy[] = {"1", "true", "TRUE", "True", "yes", "YES", "on", "On"};
  static const char *const falsy[] = {"0", "false", "FALSE", "no", "No", "off", "OFF"};
  for (size_t i = 0; i < sizeof truthy / sizeof truthy[0]; i++) {
    expect_accepted("verbose", "0", 0);
    expect_accepted("verbose", truthy[i], 1);
  }
  for (size_t i = 0; i < sizeof falsy / sizeof falsy[0]; i++) {
    expect_accepted("verbose", "1", 1);
    expect_accepted("verbose", falsy[i], 0);
  }

  expect_accepted("transfer_batch", "1", 1);
  expect_accepted("transfer_batch", "1024", 1024);
  expect_accepted("transfer_batch", "007", 7);
  expect_accepted("check", "1", 1);
  expect_accepted("check", "2", 2);
  expect_accepted("stats", "2", 2);
  expect_accepted("min_align", "8", 8);
  expect_accepted("min_align", "16", 16);

  expect_accepted("tcache_max", "65536", 65536);
  expect_accepted("tcache_max", "64K", 64 << 10);
  expect_accepted("tcache_max", "100k", 100 << 10);
  expect_accepted("tcache_max", "64KB", 64 << 10);
  expect_accepted("tcache_max", "96KiB", 96 << 10);
  expect_accepted("tcache_max", "80kib", 80 << 10);
  expect_accepted("tcache_max", "1m", 1 << 20);
  expect_accepted("tcache_max", "3MB", 3 << 20);
  expect_accepted("tcache_max", "1G", 1 << 30);
  expect_accepted("tcache_max", "1gib", 1 << 30);
  expect_accepted("retain_max", "0", 0);
  expect_accepted("retain_max", "4096B", 4096);
  expect_accepted("retain_max", "4096b", 4096);
  expect_accepted("retain_max", "1T", 1LL << 40);
  expect_accepted("retain_max", "1024G", 1LL << 40);
  expect_accepted("tcache_total", "16G", 16LL << 30);
  expect_accepted("tcache_total", "256K", 256 << 10);
  expect_accepted("release_large", "0", 0);

  expect_accepted("prof_dump", "/tmp/profile", 12);
  CHECK(strcmp(option_string(OPTION_PROF_DUMP), "/tmp/profile") == 0);
  char long_path[OPTIONS_PATH_MAX + 1];
  memset(long_path, 'x', OPTIONS_PATH_MAX);
  long_path[OPTIONS_PATH_MAX] = '\0';
  expect_rejected("prof_dump", long_path); /* no room for the NUL */
  expect_rejected("prof_dump", "");
  CHECK(strcmp(option_string(OPTION_PROF_DUMP), "/tmp/profile") == 0);
  long_path[OPTIONS_PATH_MAX - 1] = '\0';
  expect_accepted("prof_dump", long_path, OPTIONS_PATH_MAX - 1);
  expect_accepted("prof_sample", "0", 0);
  expect_accepted("prof_sample", "512K", 512 << 10);
  expect_accepted("prof_signal", "12", 12);
  expect_accepted("prof_max_samples", "0", 0);
  expect_accepted("prof_max_samples", "1000", 1000);
  expect_rejected("prof_max_samples", "10000001");
  expect_rejected("prof_signal", "65");

  expect_accepted("decay_ms", "0", 0);
  expect_accepted("decay_ms", "500", 500);
  expect_accepted("decay_ms", "250ms", 250);
  expect_accepted("decay_ms", "250MS", 250);
  expect_accepted("decay_ms", "10s", 10000);
  expect_accepted("decay_ms", "3600s", 3600000);
  expect_accepted("decay_ms", "3600000", 3600000);
  /* An interval that never ends: decay_ms only (mallopt(M_TRIM_THRESHOLD, -1) sets it). */
  expect_accepted("decay_ms", "never", -1);
  expect_accepted("decay_ms", "NEVER", -1);
  expect_accepted("decay_ms", "-1", -1);
  expect_rejected("tcache_idle_ms", "never");
  expect_rejected("tcache_idle_ms", "-1");

  /* Names are matched without regard to case. */
  expect_accepted("DECAY_MS", "42", 42);
}

static void test_bad_values(void) {
  options_reset_for_test();
  expect_accepted("decay_ms", "777", 777); /* a non-default previous value must survive */
  static const char *const bad_ms[] = {"",   "12x",  "-2",  "+1",  "99999999999999999999", "1.5",
                                       " 5", "5 ",   "0x10", "1e3", "5m",  "ms",   "3600001",
                                       "3601s", "5 ms", "abc", "18446744073709551616s", "-1ms", "nevers", "never "};
  for (size_t i = 0; i < sizeof bad_ms / sizeof bad_ms[0]; i++)
    expect_rejected("decay_ms", bad_ms[i]);

  expect_accepted("tcache_max", "1M", 1 << 20);
  static const char *const bad_bytes[] = {"",     "K",        "64KiBB", "64iB", "1.5M", "1 M",
                                          "-64K", "64KK",     "64X",    "1P",   "1K",   "2G",
                                          "65535", "99999999999T", "18446744073709551615",
                                          "99999999999999999999"};
  for (size_t i = 0; i < sizeof bad_bytes / sizeof bad_bytes[0]; i++)
    expect_rejected("tcache_max", bad_bytes[i]);
  /* Fits a long long but not the range; just past LLONG_MAX must not wrap negative. */
  expect_rejected("retain_max", "9223372036854775807");
  expect_rejected("retain_max", "9223372036854775808");
  expect_rejected("retain_max", "8388608T");

  static const char *const bad_count[] = {"", "0", "1025", "-1", "1.5", "12x", "1K", "99999999999999999999"};
  for (size_t i = 0; i < sizeof bad_count / sizeof bad_count[0]; i++)
    expect_rejected("transfer_batch", bad_count[i]);
  expect_rejected("check", "3");
  expect_rejected("check", "0");
  expect_rejected("stats", "3");

  static const char *const bad_bool[] = {"", "2", "yess", "y", "tru", "-1", "onn", "1.0"};
  for (size_t i = 0; i < sizeof bad_bool / sizeof bad_bool[0]; i++)
    expect_rejected("verbose", bad_bool[i]);

  static const char *const bad_align[] = {"4", "12", "32", "0", "", "8K"};
  for (size_t i = 0; i < sizeof bad_align / sizeof bad_align[0]; i++)
    expect_rejected("min_align", bad_align[i]);

  /* A page size is 0 (the kernel's) or a power of two: 3K was taken and did nothing. */
  static const char *const bad_page[] = {"3K", "12K", "100", "65K", "128K"};
  for (size_t i = 0; i < sizeof bad_page / sizeof bad_page[0]; i++)
    expect_rejected("os_page", bad_page[i]);
  expect_accepted("os_page", "0", 0);
  expect_accepted("os_page", "64K", 64 << 10);
  expect_accepted("os_page", "16K", 16 << 10);

  /* Unknown option name through options_set. */
  capture_begin();
  bool ok = options_set("no_such", 7, "1", 1, "mallopt");
  const char *out = capture_end();
  CHECK(!ok);
  CHECK_MSG(strcmp(out, "qmalloc: warning: mallopt: unknown option 'no_such' ignored "
                        "(options are listed in docs/options.md)\n") == 0, "got \"%s\"", out);

  /* Neither string needs a NUL: lengths are honoured. */
  options_reset_for_test();
  CHECK(options_set("decay_msXXXX", 8, "1234567", 3, "test"));
  CHECK_EQ(option(OPTION_DECAY_MS), 123);
}

/* The exact warning lines, from options_set, from the environment, and from QMALLOC_OPTIONS. */
static void test_warning_text(void) {
  char expect[512];
  options_reset_for_test();
  capture_begin();
  options_set("decay_ms", 8, "abc", 3, "QMALLOC_DECAY_MS");
  CHECK_MSG(strcmp(capture_end(), "qmalloc: warning: QMALLOC_DECAY_MS=abc is not valid "
                                  "(expected milliseconds 0..3600000 or never); using 250\n") == 0,
            "got \"%s\"", captured);

  clear_qmalloc_environment();
  setenv("QMALLOC_DECAY_MS", "abc", 1);
  const char *out = reinit();
  CHECK_MSG(strcmp(out, "qmalloc: warning: QMALLOC_DECAY_MS=abc is not valid "
                        "(expected milliseconds 0..3600000 or never); using 250\n") == 0,
            "got \"%s\"", out);
  CHECK_EQ(option(OPTION_DECAY_MS), 250);
  CHECK(options_source(OPTION_DECAY_MS) == NULL);

  clear_qmalloc_environment();
  setenv("QMALLOC_OPTIONS", "decay_ms=abc", 1);
  out = reinit();
  CHECK_MSG(strcmp(out, "qmalloc: warning: QMALLOC_OPTIONS: decay_ms=abc is not valid "
                        "(expected milliseconds 0..3600000 or never); using 250\n") == 0,
            "got \"%s\"", out);

  clear_qmalloc_environment();
  setenv("QMALLOC_MIN_ALIGN", "12", 1);
  out = reinit();
  snprintf(expect, sizeof expect,
           "qmalloc: warning: QMALLOC_MIN_ALIGN=12 is not valid (expected 8 or 16); using %d\n",
           QM_MIN_ALIGN_DEFAULT);
  CHECK_MSG(strcmp(out, expect) == 0, "got \"%s\"", out);

  clear_qmalloc_environment();
  setenv("QMALLOC_TCACHE_MAX", "1K", 1);
  setenv("QMALLOC_VERBOSE", "maybe", 1);
  setenv("QMALLOC_TRANSFER_BATCH", "0", 1);
  setenv("QMALLOC_OS_PAGE", "3K", 1);
  out = reinit();
  CHECK(strstr(out, "qmalloc: warning: QMALLOC_TCACHE_MAX=1K is not valid (expected bytes 64K..1G); using 16M\n"));
  CHECK(strstr(out, "qmalloc: warning: QMALLOC_OS_PAGE=3K is not valid "
                    "(expected bytes 0 or a power of two up to 64K); using 0\n"));
  CHECK(strstr(out, "qmalloc: warning: QMALLOC_VERBOSE=maybe is not valid "
                    "(expected 0/1, true/false, yes/no, on/off); using false\n"));
  CHECK(strstr(out, "qmalloc: warning: QMALLOC_TRANSFER_BATCH=0 is not valid "
                    "(expected an integer 1..1024); using 16\n"));
  CHECK_EQ(count_lines(out), 4);

  /* A hostile value stays on one line and is cut short. */
  clear_qmalloc_environment();
  char longval[300];
  memset(longval, 'x', sizeof longval - 1);
  longval[sizeof longval - 1] = '\0';
  longval[5] = '\n';
  longval[6] = '\033';
  setenv("QMALLOC_STATS", longval, 1);
  out = reinit();
  CHECK_EQ(count_lines(out), 1);
  CHECK(strncmp(out, "qmalloc: warning: QMALLOC_STATS=xxxxx??xxx", 42) == 0);
  CHECK(strstr(out, "...") != NULL && strlen(out) < 200);

  clear_qmalloc_environment();
  setenv("QMALLOC_TYPO", "1", 1);
  setenv("QMALLOC_decay_ms", "1", 1);
  out = reinit();
  CHECK(strstr(out, "qmalloc: warning: unknown variable QMALLOC_TYPO ignored "
                    "(options are listed in docs/options.md)\n"));
  CHECK(strstr(out, "qmalloc: warning: unknown variable QMALLOC_decay_ms ignored "
                    "(options are listed in docs/options.md)\n"));
  CHECK_EQ(count_lines(out), 2);
  CHECK_EQ(option(OPTION_DECAY_MS), 250);
}

/* ---- the environment ----------------------------------------------------------------------------- */

static void test_environment(void) {
  clear_qmalloc_environment();
  setenv("QMALLOC_TCACHE_MAX", "1M", 1);
  setenv("QMALLOC_VERBOSE", "no", 1);
  setenv("XQMALLOC_DECAY_MS", "5", 1); /* not ours */
  setenv("QMALLOC_SO", "/some/path/libqmalloc.so", 1);
  setenv("QMALLOC_STATIC_LIB", "/some/path/libqmalloc.a", 1);
  const char *out = reinit();
  CHECK_MSG(out[0] == '\0', "unexpected output: %s", out);
  CHECK_EQ(option(OPTION_TCACHE_MAX), 1 << 20);
  CHECK_EQ(option(OPTION_DECAY_MS), 250);
  CHECK(strcmp(options_source(OPTION_TCACHE_MAX), "QMALLOC_TCACHE_MAX") == 0);
  unsetenv("XQMALLOC_DECAY_MS");

  /* Several entries, spaces, empty entries, a trailing comma. */
  clear_qmalloc_environment();
  setenv("QMALLOC_OPTIONS", " decay_ms=5s, tcache_max = 1M ,,verbose=off,stats=2,", 1);
  out = reinit();
  CHECK_MSG(out[0] == '\0', "unexpected output: %s", out);
  CHECK_EQ(option(OPTION_DECAY_MS), 5000);
  CHECK_EQ(option(OPTION_TCACHE_MAX), 1 << 20);
  CHECK_EQ(option(OPTION_STATS), 2);
  CHECK_EQ(option(OPTION_VERBOSE), 0);
  CHECK(strcmp(options_source(OPTION_STATS), "QMALLOC_OPTIONS") == 0);
  CHECK(options_source(OPTION_CHECK) == NULL);

  /* Unknown names and entries without '=' warn once each; the rest still applies. */
  clear_qmalloc_environment();
  setenv("QMALLOC_OPTIONS", "bogus=1,check=2,,justaword,transfer_batch=64", 1);
  out = reinit();
  CHECK(strstr(out, "qmalloc: warning: QMALLOC_OPTIONS: unknown option 'bogus' ignored "
                    "(options are listed in docs/options.md)\n"));
  CHECK(strstr(out, "qmalloc: warning: QMALLOC_OPTIONS: 'justaword' is not name=value; ignored\n"));
  CHECK_EQ(count_lines(out), 2);
  CHECK_EQ(option(OPTION_CHECK), 2);
  CHECK_EQ(option(OPTION_TRANSFER_BATCH), 64);

  /* The last valid entry for an option wins inside QMALLOC_OPTIONS. */
  clear_qmalloc_environment();
  setenv("QMALLOC_OPTIONS", "stats=1,stats=2,stats=9", 1);
  out = reinit();
  CHECK_EQ(count_lines(out), 1);
  CHECK_EQ(option(OPTION_STATS), 2);
}

static void test_precedence(void) {
  /* QMALLOC_<NAME> wins, whichever comes first in environ (setenv appends new names). */
  for (int order = 0; order < 2; order++) {
    clear_qmalloc_environment();
    if (order == 0) {
      setenv("QMALLOC_OPTIONS", "decay_ms=5s,stats=1", 1);
      setenv("QMALLOC_DECAY_MS", "7", 1);
    } else {
      setenv("QMALLOC_DECAY_MS", "7", 1);
      setenv("QMALLOC_OPTIONS", "decay_ms=5s,stats=1", 1);
    }
    const char *out = reinit();
    CHECK_MSG(out[0] == '\0', "unexpected output: %s", out);
    CHECK_MSG(option(OPTION_DECAY_MS) == 7, "order %d: decay_ms %lld", order, option(OPTION_DECAY_MS));
    CHECK(strcmp(options_source(OPTION_DECAY_MS), "QMALLOC_DECAY_MS") == 0);
    CHECK_EQ(option(OPTION_STATS), 1);
  }
  /* A rejected variable leaves the QMALLOC_OPTIONS value in place, and says so. */
  clear_qmalloc_environment();
  setenv("QMALLOC_DECAY_MS", "abc", 1);
  setenv("QMALLOC_OPTIONS", "decay_ms=5s", 1);
  const char *out = reinit();
  CHECK_MSG(strcmp(out, "qmalloc: warning: QMALLOC_DECAY_MS=abc is not valid "
                        "(expected milliseconds 0..3600000 or never); using 5000\n") == 0, "got \"%s\"", out);
  CHECK_EQ(option(OPTION_DECAY_MS), 5000);
}

static void test_idempotent(void) {
  clear_qmalloc_environment();
  setenv("QMALLOC_TYPO", "1", 1);
  setenv("QMALLOC_STATS", "1", 1);
  const char *out = reinit();
  CHECK_EQ(count_lines(out), 1);
  setenv("QMALLOC_STATS", "2", 1); /* read once: later changes are not seen */
  capture_begin();
  options_init();
  out = capture_end();
  CHECK_MSG(out[0] == '\0', "second options_init printed: %s", out);
  CHECK_EQ(option(OPTION_STATS), 1);
}

static void *init_from_thread(void *arg) {
  options_init();
  *(long long *)arg = option(OPTION_TRANSFER_BATCH); /* must already be parsed on return */
  return NULL;
}

static void test_concurrent_init(void) {
  clear_qmalloc_environment();
  setenv("QMALLOC_TRANSFER_BATCH", "99", 1);
  setenv("QMALLOC_TYPO", "1", 1);
  options_reset_for_test();
  enum { THREADS = 8 };
  pthread_t threads[THREADS];
  long long seen[THREADS];
  capture_begin();
  for (int i = 0; i < THREADS; i++)
    pthread_create(&threads[i], NULL, init_from_thread, &seen[i]);
  for (int i = 0; i < THREADS; i++)
    pthread_join(threads[i], NULL);
  const char *out = capture_end();
  CHECK_EQ(count_lines(out), 1); /* parsed once */
  for (int i = 0; i < THREADS; i++)
    CHECK_EQ(seen[i], 99);
}

static void test_verbose_dump(void) {
  clear_qmalloc_environment();
  setenv("QMALLOC_VERBOSE", "1", 1);
  setenv("QMALLOC_TCACHE_MAX", "1M", 1);
  const char *out = reinit();
  CHECK_EQ(count_lines(out), OPTION_COUNT);
  for (int id = 0; id < OPTION_COUNT; id++) {
    char prefix[96];
    snprintf(prefix, sizeof prefix, "qmalloc: option %s ", options_name((option_id_t)id));
    CHECK_MSG(strstr(out, prefix) != NULL, "no line for %s in:\n%s", options_name((option_id_t)id), out);
  }
  CHECK(strstr(out, "= true     (default false; set by QMALLOC_VERBOSE)\n") != NULL);
  CHECK(strstr(out, "= 1M       (default 16M; set by QMALLOC_TCACHE_MAX)\n") != NULL);
  int width = 0; /* names are padded to the longest */
  for (int id = 0; id < OPTION_COUNT; id++) {
    int len = (int)strlen(options_name((option_id_t)id));
    width = len > width ? len : width;
  }
  char decay_line[128];
  snprintf(decay_line, sizeof decay_line, "qmalloc: option %-*s = 250      (default)\n", width, "decay_ms");
  CHECK_MSG(strstr(out, decay_line) != NULL, "no line '%s' in:\n%s", decay_line, out);
}

/* Whatever options_print and the docs show is accepted back by options_set. */
static void test_format_round_trip(void) {
  options_reset_for_test();
  for (int id = 0; id < OPTION_COUNT; id++) {
    const option_info_t *info = &options_table[id];
    if (info->type == OPTION_TYPE_PATH) { /* the value is the text's length; the text comes back */
      char text[32];
      expect_accepted(info->name, "/tmp/a b,c", 10);
      options_format_value((option_id_t)id, option((option_id_t)id), text, sizeof text);
      CHECK_MSG(strcmp(text, "/tmp/a b,c") == 0 && strcmp(option_string((option_id_t)id), text) == 0,
                "%s shows '%s'", info->name, text);
      continue;
    }
    long long samples[] = {info->min, info->def, info->max};
    for (int s = 0; s < 3; s++) {
      char text[32];
      options_format_value((option_id_t)id, samples[s], text, sizeof text);
      expect_accepted(info->name, text, samples[s]);
    }
  }
  char buf[32];
  options_format_value(OPTION_TCACHE_MAX, 65537, buf, sizeof buf);
  CHECK(strcmp(buf, "65537") == 0);
  options_format_value(OPTION_TCACHE_MAX, 3LL << 30, buf, sizeof buf);
  CHECK(strcmp(buf, "3G") == 0);
  options_format_value(OPTION_RETAIN_MAX, 0, buf, sizeof buf);
  CHECK(strcmp(buf, "0") == 0);
  options_format_range(OPTION_MIN_ALIGN, buf, sizeof buf);
  CHECK(strcmp(buf, "8 or 16") == 0);
  options_format_range(OPTION_TCACHE_TOTAL, buf, sizeof buf);
  CHECK(strcmp(buf, "256K..16G") == 0);
}

/* ---- /proc/self/environ fallback (runs in a re-executed child) -------------------------------- */

static const char proc_child_flag[] = "--proc-environ-child";

static int proc_environ_child(void) {
  environ = NULL; /* as very early in a static binary: options must read /proc/self/environ */
  const char *out = reinit();
  CHECK_EQ(option(OPTION_DECAY_MS), 1234);
  CHECK_EQ(option(OPTION_STATS), 2);
  CHECK_EQ(option(OPTION_TCACHE_MAX), 2 << 20); /* the variable beats QMALLOC_OPTIONS */
  CHECK(options_source(OPTION_DECAY_MS) && strcmp(options_source(OPTION_DECAY_MS), "QMALLOC_DECAY_MS") == 0);
  CHECK_MSG(strcmp(out, "qmalloc: warning: unknown variable QMALLOC_BAD ignored "
                        "(options are listed in docs/options.md)\n") == 0, "got \"%s\"", out);
  return tu_summary("unit-options (/proc/self/environ child)");
}

static void test_proc_environ_fallback(void) {
  pid_t child = fork();
  if (child == 0) {
    char *argv[] = {"unit_options", (char *)proc_child_flag, NULL};
    char *envp[] = {"PATH=/usr/bin:/bin", "QMALLOC_OPTIONS=stats=2,tcache_max=1M",
                    "QMALLOC_DECAY_MS=1234", "QMALLOC_BAD=1", "QMALLOC_TCACHE_MAX=2M", NULL};
    tu_exec_self(argv, envp);
    _exit(127);
  }
  int status = 0;
  waitpid(child, &status, 0);
  CHECK_MSG(WIFEXITED(status) && WEXITSTATUS(status) == 0,
            "the /proc/self/environ child failed (status 0x%x)", status);
}

/* ---- docs/options.md ----------------------------------------------------------------------------- */

static char *read_docs(void) {
  char path[4096];
  const char *source_dir = getenv("QM_SOURCE_DIR");
  if (source_dir != NULL) {
    snprintf(path, sizeof path, "%s/docs/options.md", source_dir);
  } else {
    /* CMake passes the absolute source path, so __FILE__ locates the tree. */
    snprintf(path, sizeof path, "%s", __FILE__);
    char *tests = strstr(path, "/tests/unit/");
    if (tests == NULL) {
      fprintf(stderr, "cannot locate docs from %s; set QM_SOURCE_DIR\n", __FILE__);
      return NULL;
    }
    snprintf(tests, sizeof path - (size_t)(tests - path), "/docs/options.md");
  }
  FILE *f = fopen(path, "r");
  if (f == NULL) {
    fprintf(stderr, "cannot open %s\n", path);
    return NULL;
  }
  static char text[65536];
  size_t n = fread(text, 1, sizeof text - 1, f);
  fclose(f);
  text[n] = '\0';
  return text;
}

/* Splits a "| a | b | c |" row into trimmed cells (in place). Returns the number of cells. */
static int split_row(char *row, char **cells, int max) {
  int n = 0;
  char *p = row;
  if (*p != '|')
    return 0;
  p++;
  while (*p != '\0' && n < max) {
    char *bar = strchr(p, '|');
    if (bar == NULL)
      break;
    *bar = '\0';
    while (*p == ' ')
      p++;
    char *end = bar;
    while (end > p && end[-1] == ' ')
      *--end = '\0';
    cells[n++] = p;
    p = bar + 1;
  }
  return n;
}

static void test_docs(void) {
  char *text = read_docs();
  CHECK_MSG(text != NULL, "docs/options.md not found");
  if (text == NULL)
    return;

  /* Every option has exactly one row, and the row says what the table says. */
  for (int id = 0; id < OPTION_COUNT; id++) {
    char var[64], start[80];
    options_variable_name((option_id_t)id, var, sizeof var);
    snprintf(start, sizeof start, "| `%s` |", var);
    int rows = 0;
    for (char *line = text; line != NULL && *line != '\0';) {
      char *nl = strchr(line, '\n');
      size_t len = nl ? (size_t)(nl - line) : strlen(line);
      if (strncmp(line, start, strlen(start)) == 0 && len < 1024) {
        rows++;
        char row[1024], *cells[8];
        memcpy(row, line, len);
        row[len] = '\0';
        int n = split_row(row, cells, 8);
        char want_default[40], want_range[80], range[64], def[24];
        options_format_value((option_id_t)id, options_table[id].def, def, sizeof def);
        snprintf(want_default, sizeof want_default, "`%s`", def);
        options_format_range((option_id_t)id, range, sizeof range);
        snprintf(want_range, sizeof want_range, "`%s`", range);
        CHECK_MSG(n == 5, "%s: row has %d cells, expected 5", var, n);
        if (n == 5) {
          CHECK_MSG(strcmp(cells[1], options_type_name(options_table[id].type)) == 0,
                    "%s: docs type '%s', table '%s'", var, cells[1], options_type_name(options_table[id].type));
          CHECK_MSG(strstr(cells[2], want_default) != NULL, "%s: docs default '%s' lacks %s", var, cells[2], want_default);
          CHECK_MSG(strcmp(cells[3], want_range) == 0, "%s: docs range '%s', table %s", var, cells[3], want_range);
          CHECK_MSG(strcmp(cells[4], options_table[id].help) == 0, "%s: docs meaning '%s', table '%s'", var,
                    cells[4], options_table[id].help);
        }
      }
      line = nl ? nl + 1 : NULL;
    }
    CHECK_MSG(rows == 1, "docs/options.md has %d rows for %s (expected 1)", rows, var);
  }

  /* Every QMALLOC_ name mentioned is one the library knows. */
  int names = 0;
  for (const char *p = strstr(text, "QMALLOC_"); p != NULL; p = strstr(p + 1, "QMALLOC_")) {
    size_t len = 8;
    while ((p[len] >= 'A' && p[len] <= 'Z') || (p[len] >= '0' && p[len] <= '9') || p[len] == '_')
      len++;
    if (len == 8)
      continue; /* "QMALLOC_<NAME>": the pattern, not a name */
    names++;
    CHECK_MSG(options_is_known_variable(p, len), "docs/options.md mentions %.*s, which is not an option",
              (int)len, p);
  }
  CHECK(names >= OPTION_COUNT);
}

int main(int argc, char **argv) {
  if (argc > 1 && strcmp(argv[1], proc_child_flag) == 0)
    return proc_environ_child();
  test_static_defaults();
  test_table();
  test_good_values();
  test_bad_values();
  test_warning_text();
  test_environment();
  test_precedence();
  test_idempotent();
  test_concurrent_init();
  test_verbose_dump();
  test_format_round_trip();
  test_proc_environ_fallback();
  test_docs();
  clear_qmalloc_environment();
  options_reset_for_test();
  return tu_summary("unit-options");
}

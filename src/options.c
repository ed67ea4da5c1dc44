/* options: the option table, value parsing, the environment reader and the verbose dump
 * (contracts in options.h).
 *
 * Runs inside malloc, possibly before main and before libc is fully initialised: no allocation,
 * no stdio, no getenv. The environment is walked in place (environ, or /proc/self/environ read
 * into a static buffer), every string is handled as pointer + length, and all output goes
 * through log.c. State: options_values and options_sources, written by options_init (guarded by
 * options_init_state) and options_set; readers take no lock (the values are read and written
 * atomically, options.h). */
#include "options.h"

#include "config.h"

#include "log.h"
#include "os_file.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <sched.h>
#include <stdint.h>
#include <sys/auxv.h>
#include <unistd.h>

/* ---- the table ------------------------------------------------------------------------------- */

#define OPTIONS_X_INFO(ID, name, type, def, min, max, help)                                       \
  [OPTION_##ID] = {#ID, #name, OPTION_TYPE_##type, (def), (min), (max), help},
const option_info_t options_table[OPTION_COUNT] = {OPTIONS_TABLE(OPTIONS_X_INFO)};
#undef OPTIONS_X_INFO

#define OPTIONS_X_DEFAULT(ID, name, type, def, min, max, help) [OPTION_##ID] = (def),
long long options_values[OPTION_COUNT] = {OPTIONS_TABLE(OPTIONS_X_DEFAULT)};
#undef OPTIONS_X_DEFAULT

/* A table row that contradicts itself fails the build, not a run. */
#define OPTIONS_X_CHECK(ID, name, type, def, min, max, help)                                      \
  _Static_assert((min) <= (def) && (def) <= (max), #name ": default outside [min, max]");       \
  _Static_assert(OPTION_TYPE_##type != OPTION_TYPE_BOOL || ((min) == 0 && (max) == 1),           \
                 #name ": a bool ranges over 0..1");                                              \
  _Static_assert(OPTION_TYPE_##type != OPTION_TYPE_POW2 ||                                        \
                     ((def) > 0 && ((def) & ((def)-1)) == 0 && (min) > 0),                        \
                 #name ": a power-of-two option needs a power-of-two default and min > 0");
OPTIONS_TABLE(OPTIONS_X_CHECK)
#undef OPTIONS_X_CHECK

/* Where each value came from: "" for the default, else the source given to options_set (copied,
 * so callers may pass a temporary string; cut to fit). */
#define OPTIONS_SOURCE_MAX 40
static char options_sources[OPTION_COUNT][OPTIONS_SOURCE_MAX];

/* The text of PATH options (copied: a QMALLOC_OPTIONS entry is not NUL-terminated). */
static char options_strings[OPTION_COUNT][OPTIONS_PATH_MAX];

/* An unset one is "" without a read of options_strings (its value, the length, is 0): a page that
 * a process which sets no path then never touches (a page fault in every process, read at start). */
const char *option_string(option_id_t id) {
  return option(id) != 0 ? options_strings[id] : "";
}

static const char options_prefix[] = "QMALLOC_";
#define OPTIONS_PREFIX_LEN (sizeof options_prefix - 1)
static const char options_list_variable[] = "QMALLOC_OPTIONS";

/* Exported by the project's own test harness and mtbench for their use, never read by the
 * library: accepted silently so that every process they start does not warn. */
static const char *const options_tooling_variables[] = {"QMALLOC_SO", "QMALLOC_STATIC_LIB"};

/* ---- small string helpers (no libc string calls: nothing here may depend on libc state) ------ */

static char options_lower(char c) {
  return c >= 'A' && c <= 'Z' ? (char)(c - 'A' + 'a') : c;
}

static size_t options_strlen(const char *s) {
  size_t n = 0;
  while (s[n] != '\0')
    n++;
  return n;
}

/* s[0..n) equals the NUL-terminated word, ignoring ASCII case. */
static bool options_equal_nocase(const char *s, size_t n, const char *word) {
  size_t i = 0;
  for (; i < n; i++) {
    if (word[i] == '\0' || options_lower(s[i]) != options_lower(word[i]))
      return false;
  }
  return word[i] == '\0';
}

/* s[0..n) equals the NUL-terminated word exactly. */
static bool options_equal(const char *s, size_t n, const char *word) {
  size_t i = 0;
  for (; i < n; i++) {
    if (word[i] == '\0' || s[i] != word[i])
      return false;
  }
  return word[i] == '\0';
}

static bool options_is_space(char c) {
  return c == ' ' || c == '\t';
}

static void options_trim(const char **s, size_t *n) {
  while (*n > 0 && options_is_space(**s)) {
    (*s)++;
    (*n)--;
  }
  while (*n > 0 && options_is_space((*s)[*n - 1]))
    (*n)--;
}

/* Copies s[0..n) for quoting in a warning: at most 64 bytes, control and non-ASCII bytes as '?',
 * so a hostile value can neither break the one-line format nor flood stderr. */
static void options_quote(char *out, size_t cap, const char *s, size_t n) {
  size_t limit = cap - 4; /* room for "..." and the NUL */
  size_t k = 0;
  for (; k < n && k < limit; k++)
    out[k] = (s[k] >= 0x20 && s[k] < 0x7f) ? s[k] : '?';
  if (k < n) {
    out[k++] = '.';
    out[k++] = '.';
    out[k++] = '.';
  }
  out[k] = '\0';
}

/* ---- value parsing ----------------------------------------------------------------------------- */

/* Leading decimal digits of s[0..n): at least one, no sign, no overflow. Returns the count used,
 * 0 on failure. */
static size_t options_parse_digits(const char *s, size_t n, unsigned long long *out) {
  unsigned long long v = 0;
  size_t i = 0;
  for (; i < n && s[i] >= '0' && s[i] <= '9'; i++) {
    unsigned d = (unsigned)(s[i] - '0');
    if (v > (ULLONG_MAX - d) / 10)
      return 0;
    v = v * 10 + d;
  }
  *out = v;
  return i;
}

/* K/M/G/T (powers of 1024) with an optional B or iB after it, or a lone B; case-insensitive. */
static bool options_parse_byte_suffix(const char *s, size_t n, unsigned long long *multiplier) {
  *multiplier = 1;
  if (n == 0 || options_equal_nocase(s, n, "b"))
    return true;
  static const char units[] = "kmgt";
  for (int u = 0; units[u] != '\0'; u++) {
    if (options_lower(s[0]) != units[u])
      continue;
    *multiplier = 1ULL << (10 * (u + 1));
    return n == 1 || options_equal_nocase(s + 1, n - 1, "b") ||
           options_equal_nocase(s + 1, n - 1, "ib");
  }
  return false;
}

/* Parses s[0..n) as a value of the given type (range is checked by the caller). */
static bool options_parse_value(option_type_t type, const char *s, size_t n, long long *out) {
  if (type == OPTION_TYPE_BOOL) {
    static const char *const yes[] = {"1", "true", "yes", "on"};
    static const char *const no[] = {"0", "false", "no", "off"};
    for (size_t i = 0; i < sizeof yes / sizeof yes[0]; i++) {
      if (options_equal_nocase(s, n, yes[i])) {
        *out = 1;
        return true;
      }
      if (options_equal_nocase(s, n, no[i])) {
        *out = 0;
        return true;
      }
    }
    return false;
  }

  /* An interval that never ends (decay_ms): the range check refuses it where min is not -1. */
  if (type == OPTION_TYPE_MS && (options_equal_nocase(s, n, "never") || options_equal(s, n, "-1"))) {
    *out = -1;
    return true;
  }
  unsigned long long v;
  size_t used = options_parse_digits(s, n, &v);
  if (used == 0)
    return false;
  const char *suffix = s + used;
  size_t suffix_len = n - used;
  unsigned long long multiplier = 1;
  switch (type) {
  case OPTION_TYPE_BYTES:
  case OPTION_TYPE_PAGE:
    if (!options_parse_byte_suffix(suffix, suffix_len, &multiplier))
      return false;
    break;
  case OPTION_TYPE_MS:
    if (options_equal_nocase(suffix, suffix_len, "s"))
      multiplier = 1000;
    else if (suffix_len != 0 && !options_equal_nocase(suffix, suffix_len, "ms"))
      return false;
    break;
  default:
    if (suffix_len != 0)
      return false;
    break;
  }
  if (__builtin_mul_overflow(v, multiplier, &v) || v > (unsigned long long)LLONG_MAX)
    return false;
  *out = (long long)v;
  return true;
}

static bool options_in_range(const option_info_t *info, long long v) {
  if (v < info->min || v > info->max)
    return false;
  /* A page size may be 0 (the kernel's), a POW2 may not (min > 0); 3K was taken for os_page and
   * did nothing (os_page_size). */
  if ((info->type == OPTION_TYPE_POW2 || info->type == OPTION_TYPE_PAGE) && (v & (v - 1)) != 0)
    return false;
  return true;
}

/* ---- formatting -------------------------------------------------------------------------------- */

const char *options_name(option_id_t id) {
  return options_table[id].name;
}

const char *options_type_name(option_type_t type) {
  switch (type) {
  case OPTION_TYPE_BOOL:
    return "bool";
  case OPTION_TYPE_COUNT:
    return "count";
  case OPTION_TYPE_POW2:
    return "power of two";
  case OPTION_TYPE_BYTES:
    return "bytes";
  case OPTION_TYPE_PAGE:
    return "page size";
  case OPTION_TYPE_MS:
    return "ms";
  case OPTION_TYPE_PATH:
    return "path";
  }
  return "?";
}

const char *options_source(option_id_t id) {
  return options_sources[id][0] != '\0' ? options_sources[id] : NULL;
}

size_t options_format_value(option_id_t id, long long v, char *buf, size_t cap) {
  switch (options_table[id].type) {
  case OPTION_TYPE_BOOL:
    return log_format(buf, cap, "%s", v ? "true" : "false");
  case OPTION_TYPE_MS:
    return v < 0 ? log_format(buf, cap, "never") : log_format(buf, cap, "%lld", v);
  case OPTION_TYPE_PATH: /* the value is a length: show the text, which only the current value has */
    return log_format(buf, cap, "%s", v == 0 ? "none" : options_strings[id]);
  case OPTION_TYPE_BYTES:
  case OPTION_TYPE_PAGE: {
    static const char units[] = "TGMK";
    for (int u = 0; units[u] != '\0'; u++) {
      long long unit = 1LL << (10 * (4 - u));
      if (v != 0 && v % unit == 0)
        return log_format(buf, cap, "%lld%c", v / unit, units[u]);
    }
    return log_format(buf, cap, "%lld", v);
  }
  default:
    return log_format(buf, cap, "%lld", v);
  }
}

size_t options_format_range(option_id_t id, char *buf, size_t cap) {
  const option_info_t *info = &options_table[id];
  if (info->type == OPTION_TYPE_BOOL)
    return log_format(buf, cap, "0/1, true/false, yes/no, on/off");
  if (info->type == OPTION_TYPE_PATH)
    return log_format(buf, cap, "1..%lld characters", info->max);
  if (info->type == OPTION_TYPE_POW2) {
    /* Spell out a short list ("8 or 16"); describe a long one. */
    int count = 0;
    for (long long p = info->min; p <= info->max; p *= 2)
      count++;
    if (count > 4)
      return log_format(buf, cap, "a power of two %lld..%lld", info->min, info->max);
    size_t n = 0;
    for (long long p = info->min; p <= info->max; p *= 2) {
      const char *sep = p == info->min ? "" : p * 2 > info->max ? " or " : ", ";
      n += log_format(buf + n, cap - n, "%s%lld", sep, p);
    }
    return n;
  }
  if (info->type == OPTION_TYPE_MS && info->min < 0)
    return log_format(buf, cap, "0..%lld or never", info->max);
  char lo[24], hi[24];
  options_format_value(id, info->min, lo, sizeof lo);
  options_format_value(id, info->max, hi, sizeof hi);
  if (info->type == OPTION_TYPE_PAGE)
    return log_format(buf, cap, "0 or a power of two up to %s", hi);
  return log_format(buf, cap, "%s..%s", lo, hi);
}

/* "milliseconds 0..3600000", "bytes 64K..1G", ...: the parenthesis of the warning. */
static void options_format_expected(option_id_t id, char *buf, size_t cap) {
  static const char *const words[] = {
      [OPTION_TYPE_BOOL] = "",           [OPTION_TYPE_COUNT] = "an integer ",
      [OPTION_TYPE_POW2] = "",           [OPTION_TYPE_BYTES] = "bytes ",     [OPTION_TYPE_PAGE] = "bytes ",
      [OPTION_TYPE_MS] = "milliseconds ",  [OPTION_TYPE_PATH] = "a path of ",
  };
  size_t n = log_format(buf, cap, "%s", words[options_table[id].type]);
  options_format_range(id, buf + n, cap - n);
}

size_t options_variable_name(option_id_t id, char *buf, size_t cap) {
  return log_format(buf, cap, "%s%s", options_prefix, options_table[id].id);
}

/* ---- setting ----------------------------------------------------------------------------------- */

static int options_find(const char *name, size_t len) {
  for (int id = 0; id < OPTION_COUNT; id++) {
    if (options_equal_nocase(name, len, options_table[id].name))
      return id;
  }
  return -1;
}

static void options_warn_invalid(option_id_t id, const char *value, size_t value_len,
                                 const char *source) {
  char var[OPTIONS_SOURCE_MAX], quoted[72], expected[96], kept[24];
  options_variable_name(id, var, sizeof var);
  options_quote(quoted, sizeof quoted, value, value_len);
  options_format_expected(id, expected, sizeof expected);
  options_format_value(id, option(id), kept, sizeof kept);
  /* From the option's own variable: "QMALLOC_X=v"; from elsewhere: "SOURCE: name=v". */
  if (options_equal(source, options_strlen(source), var))
    log_printf(2, "qmalloc: warning: %s=%s is not valid (expected %s); using %s\n", source, quoted,
               expected, kept);
  else
    log_printf(2, "qmalloc: warning: %s: %s=%s is not valid (expected %s); using %s\n", source,
               options_table[id].name, quoted, expected, kept);
}

static bool options_set_id(option_id_t id, const char *value, size_t value_len,
                           const char *source) {
  long long v;
  if (options_table[id].type == OPTION_TYPE_PATH) {
    if (value_len == 0 || value_len > (size_t)options_table[id].max) {
      options_warn_invalid(id, value, value_len, source);
      return false;
    }
    for (size_t i = 0; i < value_len; i++)
      options_strings[id][i] = value[i];
    options_strings[id][value_len] = '\0';
    __atomic_store_n(&options_values[id], (long long)value_len, __ATOMIC_RELAXED);
    log_format(options_sources[id], OPTIONS_SOURCE_MAX, "%s", source);
    return true;
  }
  if (!options_parse_value(options_table[id].type, value, value_len, &v) ||
      !options_in_range(&options_table[id], v)) {
    options_warn_invalid(id, value, value_len, source);
    return false;
  }
  __atomic_store_n(&options_values[id], v, __ATOMIC_RELAXED);
  log_format(options_sources[id], OPTIONS_SOURCE_MAX, "%s", source);
  return true;
}

bool options_set(const char *name, size_t name_len, const char *value, size_t value_len,
                 const char *source) {
  if (source == NULL)
    source = "options_set";
  int id = options_find(name, name_len);
  if (id < 0) {
    char quoted[72];
    options_quote(quoted, sizeof quoted, name, name_len);
    log_printf(2, "qmalloc: warning: %s: unknown option '%s' ignored (options are listed in docs/options.md)\n",
               source, quoted);
    return false;
  }
  return options_set_id((option_id_t)id, value, value_len, source);
}

/* ---- the environment --------------------------------------------------------------------------- */

/* The option whose variable is exactly QMALLOC_<suffix> (upper case), or -1. */
static int options_find_variable(const char *suffix, size_t len) {
  for (int id = 0; id < OPTION_COUNT; id++) {
    if (options_equal(suffix, len, options_table[id].id))
      return id;
  }
  return -1;
}

bool options_is_known_variable(const char *name, size_t len) {
  if (options_equal(name, len, options_list_variable))
    return true;
  for (size_t i = 0; i < sizeof options_tooling_variables / sizeof options_tooling_variables[0]; i++) {
    if (options_equal(name, len, options_tooling_variables[i]))
      return true;
  }
  return len > OPTIONS_PREFIX_LEN && options_equal(name, OPTIONS_PREFIX_LEN, options_prefix) &&
         options_find_variable(name + OPTIONS_PREFIX_LEN, len - OPTIONS_PREFIX_LEN) >= 0;
}

/* "name=value,name=value": each entry through options_set; empty entries are skipped. */
static void options_apply_list(const char *list, size_t len) {
  size_t start = 0;
  while (start <= len) {
    size_t end = start;
    while (end < len && list[end] != ',')
      end++;
    const char *entry = list + start;
    size_t entry_len = end - start;
    options_trim(&entry, &entry_len);
    if (entry_len > 0) {
      size_t eq = 0;
      while (eq < entry_len && entry[eq] != '=')
        eq++;
      if (eq == entry_len) {
        char quoted[72];
        options_quote(quoted, sizeof quoted, entry, entry_len);
        log_printf(2, "qmalloc: warning: %s: '%s' is not name=value; ignored\n",
                   options_list_variable, quoted);
      } else {
        const char *name = entry, *value = entry + eq + 1;
        size_t name_len = eq, value_len = entry_len - eq - 1;
        options_trim(&name, &name_len);
        options_trim(&value, &value_len);
        options_set(name, name_len, value, value_len, options_list_variable);
      }
    }
    start = end + 1;
  }
}

/* Pass 1 applies QMALLOC_OPTIONS, pass 2 the single variables, so that QMALLOC_<NAME> wins over
 * the same option inside QMALLOC_OPTIONS whatever their order in the environment. */
enum { OPTIONS_PASS_LIST, OPTIONS_PASS_VARIABLES };

static void options_apply_entry(const char *entry, size_t len, int pass) {
  if (len < OPTIONS_PREFIX_LEN || !options_equal(entry, OPTIONS_PREFIX_LEN, options_prefix))
    return;
  size_t eq = 0;
  while (eq < len && entry[eq] != '=')
    eq++;
  if (eq == len)
    return; /* not a NAME=value entry: nothing we can use */
  const char *value = entry + eq + 1;
  size_t value_len = len - eq - 1;

  if (options_equal(entry, eq, options_list_variable)) {
    if (pass == OPTIONS_PASS_LIST)
      options_apply_list(value, value_len);
    return;
  }
  if (pass != OPTIONS_PASS_VARIABLES)
    return;
  int id = options_find_variable(entry + OPTIONS_PREFIX_LEN, eq - OPTIONS_PREFIX_LEN);
  if (id >= 0) {
    char var[OPTIONS_SOURCE_MAX];
    options_variable_name((option_id_t)id, var, sizeof var);
    options_set_id((option_id_t)id, value, value_len, var);
  } else if (!options_is_known_variable(entry, eq)) {
    char quoted[72];
    options_quote(quoted, sizeof quoted, entry, eq);
    log_printf(2, "qmalloc: warning: unknown variable %s ignored (options are listed in docs/options.md)\n",
               quoted);
  }
}

static void options_apply_environ(char *const *env) {
  for (int pass = OPTIONS_PASS_LIST; pass <= OPTIONS_PASS_VARIABLES; pass++) {
    for (char *const *e = env; *e != NULL; e++)
      options_apply_entry(*e, options_strlen(*e), pass);
  }
}

/* Big enough for any ordinary environment; a bigger one is read up to this size, with a warning.
 * Static (zero pages until touched) because this runs before anything could allocate it. */
#define OPTIONS_PROC_ENVIRON_MAX (256 * 1024)
static char options_proc_environ[OPTIONS_PROC_ENVIRON_MAX];

/* environ is not set up yet (very early in a static binary or the loader): read the
 * environment the kernel gave the process instead. */
static void options_apply_proc_environ(void) {
  int fd = os_file_open("/proc/self/environ", O_RDONLY | O_CLOEXEC, 0);
  if (fd < 0)
    return; /* no /proc: run with the defaults */
  size_t len = 0;
  while (len < sizeof options_proc_environ) {
    ssize_t r = os_file_read(fd, options_proc_environ + len, sizeof options_proc_environ - len);
    if (r < 0 && errno == EINTR)
      continue;
    if (r <= 0)
      break;
    len += (size_t)r;
  }
  os_file_close(fd);
  if (len == sizeof options_proc_environ)
    log_printf(2, "qmalloc: warning: environment larger than %d KiB; variables past it ignored\n",
               OPTIONS_PROC_ENVIRON_MAX / 1024);

  for (int pass = OPTIONS_PASS_LIST; pass <= OPTIONS_PASS_VARIABLES; pass++) {
    size_t start = 0;
    for (size_t i = 0; i < len; i++) {
      if (options_proc_environ[i] != '\0')
        continue;
      options_apply_entry(options_proc_environ + start, i - start, pass);
      start = i + 1;
    }
    /* An entry cut off by the buffer's end (no NUL) is dropped rather than half-read. */
  }
}

/* ---- init and dump ----------------------------------------------------------------------------- */

extern char **environ;

enum { OPTIONS_INIT_NONE, OPTIONS_INIT_RUNNING, OPTIONS_INIT_DONE };
QM_EARLY_DATA static int options_init_state = OPTIONS_INIT_NONE;

/* A set-user-ID or set-group-ID program, or one that gained capabilities at exec, runs with the
 * environment of a less privileged user, who must not steer it: QMALLOC_PROF_DUMP would have it
 * create and truncate files of that user's choosing with its own privileges. As glibc ignores its
 * malloc variables there and jemalloc reads MALLOC_CONF with secure_getenv, such a process reads
 * no QMALLOC_ variable (the defaults apply; mallopt still works). Secure execution is the
 * kernel's AT_SECURE, or real and effective ids that differ (which also holds before libc has
 * read the auxiliary vector, early in a static binary). */
static bool options_secure_execution(void) {
  return getauxval(AT_SECURE) != 0 || getuid() != geteuid() || getgid() != getegid();
}

void options_init(void) {
  if (__atomic_load_n(&options_init_state, __ATOMIC_ACQUIRE) == OPTIONS_INIT_DONE)
    return;
  int expected = OPTIONS_INIT_NONE;
  if (!__atomic_compare_exchange_n(&options_init_state, &expected, OPTIONS_INIT_RUNNING, false,
                                   __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
    /* Another thread is parsing; it neither allocates nor blocks, so this wait is short. */
    while (__atomic_load_n(&options_init_state, __ATOMIC_ACQUIRE) != OPTIONS_INIT_DONE)
      sched_yield();
    return;
  }
  char **env = environ;
  if (!options_secure_execution()) { /* else the environment is not the program's to trust */
    if (env != NULL)
      options_apply_environ(env);
    else
      options_apply_proc_environ();
  }
  if (option(OPTION_VERBOSE))
    options_print(2);
  __atomic_store_n(&options_init_state, OPTIONS_INIT_DONE, __ATOMIC_RELEASE);
}

void options_print(int fd) {
  int width = 0;
  for (int id = 0; id < OPTION_COUNT; id++) {
    int len = (int)options_strlen(options_table[id].name);
    width = len > width ? len : width;
  }
  for (int id = 0; id < OPTION_COUNT; id++) {
    char value[24], def[24];
    options_format_value((option_id_t)id, option((option_id_t)id), value, sizeof value);
    options_format_value((option_id_t)id, options_table[id].def, def, sizeof def);
    const char *source = options_source((option_id_t)id);
    if (source == NULL)
      log_printf(fd, "qmalloc: option %-*s = %-8s (default)\n", width, options_table[id].name,
                 value);
    else
      log_printf(fd, "qmalloc: option %-*s = %-8s (default %s; set by %s)\n", width,
                 options_table[id].name, value, def, source);
  }
}

void options_reset_for_test(void) {
  for (int id = 0; id < OPTION_COUNT; id++) {
    __atomic_store_n(&options_values[id], options_table[id].def, __ATOMIC_RELAXED);
    options_sources[id][0] = '\0';
    options_strings[id][0] = '\0';
  }
  __atomic_store_n(&options_init_state, OPTIONS_INIT_NONE, __ATOMIC_RELEASE);
}

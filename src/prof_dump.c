/* Profile formats: the profiler's tables written as the legacy gperftools heap profile, the text
 * format Debian's google-pprof and jemalloc's jeprof read:
 *
 *   heap profile:   <objs>: <bytes> [ <objs>: <bytes>] @ heap_v2/<sampling rate>
 *   <objs>: <bytes> [<objs>: <bytes>] @ 0x<pc> 0x<pc> ...      one line per stack, innermost first
 *
 *   MAPPED_LIBRARIES:
 *   <a copy of /proc/self/maps>                                 (so the reader can symbolise)
 *
 * The counts are the samples and their requested bytes, counted as samples at the interval <rate>
 * (a sample the budget drew at a stretched interval counts for more: prof_counts_t); "heap_v2/<rate>"
 * tells the reader to scale each line by 1 / (1 - exp(-average size / rate)), the chance such a
 * block is sampled.
 * The first pair is the profile's kind (live, peak or allocated), the second everything allocated
 * since start or the last reset, as gperftools writes it. Not here: what is sampled (prof.c).
 * Lock: the caller holds prof_lock. Only write/open/read/close: safe in the dump signal's handler
 * and without allocating. Callers: prof.c. */
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <unistd.h>

#include "internal.h"
#include "log.h"
#include "os_file.h"
#include "prof.h"

/* Output through a stack buffer, in write(2)-sized pieces. */
typedef struct prof_out_s {
  int fd;
  bool failed;
  size_t used;
  char buf[4096];
} prof_out_t;

static void prof_out_flush(prof_out_t *o) {
  size_t done = 0;
  while (done < o->used) {
    ssize_t n = os_file_write(o->fd, o->buf + done, o->used - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      o->failed = true;
      break;
    }
    done += (size_t)n;
  }
  o->used = 0;
}

/* One piece of at most 256 characters (a frame, a count pair). */
#define PROF_OUT_PIECE 256
static void prof_out(prof_out_t *o, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void prof_out(prof_out_t *o, const char *fmt, ...) {
  if (o->used + PROF_OUT_PIECE > sizeof o->buf) prof_out_flush(o);
  va_list ap;
  va_start(ap, fmt);
  o->used += log_vformat(o->buf + o->used, PROF_OUT_PIECE, fmt, ap);
  va_end(ap);
}

static const prof_counts_t *prof_counts_of(const prof_stack_t *s, prof_kind_t kind) {
  return kind == PROF_KIND_LIVE ? &s->live : kind == PROF_KIND_PEAK ? &s->peak : &s->allocated;
}

static void prof_copy_maps(prof_out_t *o) {
  prof_out(o, "\nMAPPED_LIBRARIES:\n");
  prof_out_flush(o);
  int fd = os_file_open("/proc/self/maps", O_RDONLY | O_CLOEXEC, 0);
  if (fd < 0) {
    o->failed = true;
    return;
  }
  for (;;) {
    ssize_t n = os_file_read(fd, o->buf, sizeof o->buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    o->used = (size_t)n;
    prof_out_flush(o);
  }
  os_file_close(fd);
}

/* A line's counts as the file's readers count samples: at the header's interval (prof_counts_t). */
static unsigned long long prof_line_samples(const prof_counts_t *c) { return (unsigned long long)((c->equiv_x1024 + 512) / 1024); }

bool prof_dump_write(int fd, prof_kind_t kind, const prof_stack_t *stacks, uint64_t rate) {
  prof_out_t o = {.fd = fd};
  prof_counts_t shown = {0}, allocated = {0};
  for (const prof_stack_t *s = stacks; s != NULL; s = s->next_in_list) {
    const prof_counts_t *c = prof_counts_of(s, kind);
    shown.equiv_x1024 += c->equiv_x1024;
    shown.equiv_bytes += c->equiv_bytes;
    allocated.equiv_x1024 += s->allocated.equiv_x1024;
    allocated.equiv_bytes += s->allocated.equiv_bytes;
  }
  /* Rate 0 (sampling off) still makes a valid, empty profile; the readers divide by it. */
  prof_out(&o, "heap profile: %6llu: %8llu [%6llu: %8llu] @ heap_v2/%llu\n", prof_line_samples(&shown),
           (unsigned long long)shown.equiv_bytes, prof_line_samples(&allocated),
           (unsigned long long)allocated.equiv_bytes, (unsigned long long)(rate ? rate : 1));
  for (const prof_stack_t *s = stacks; s != NULL; s = s->next_in_list) {
    const prof_counts_t *c = prof_counts_of(s, kind);
    if (c->equiv_x1024 == 0 && s->allocated.equiv_x1024 == 0) continue;
    prof_out(&o, "%6llu: %8llu [%6llu: %8llu] @", prof_line_samples(c), (unsigned long long)c->equiv_bytes,
             prof_line_samples(&s->allocated), (unsigned long long)s->allocated.equiv_bytes);
    for (uint32_t i = 0; i < s->depth; i++) prof_out(&o, " 0x%zx", (size_t)s->frames[i]);
    prof_out(&o, "\n");
  }
  prof_copy_maps(&o);
  return !o.failed;
}

/* Checks on what programs hand back, and the one-line fatal errors: one line on stderr naming the
 * call and the address, then abort() (log_fatal writes it from a stack buffer: the heap may be the
 * thing that is broken). Also owns the per-process secret of the free tags and links (freelist.h).
 * Callers: api.c (invalid and double frees, sized-free mismatches), tcache.c and central.c
 * (corrupted lists, double frees found on the way), pageheap.c (large double frees), init.c. */
#include <errno.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include "freelist.h"
#include "harden.h"
#include "internal.h"
#include "log.h"

QM_EARLY_DATA uintptr_t freelist_secret;

void check_init(void) {
  int saved = errno;
  uintptr_t s = 0;
  if (getrandom(&s, sizeof s, GRND_NONBLOCK) != (ssize_t)sizeof s) {
    /* No entropy yet (very early boot) or no getrandom: mix what differs between runs. */
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    s = ((uintptr_t)&s * 0x9E3779B97F4A7C15ull) ^ ((uintptr_t)ts.tv_nsec << 20) ^ (uintptr_t)getpid();
  }
  errno = saved;
  /* Bit 63 set: keys of user-space objects are negative, so a link overwritten with a user-space
   * address decodes negative (freelist_take). Bit 0 set: a zeroed word is never a tag. */
  s |= 1 | ((uintptr_t)1 << 63);
  /* The hardened build tells an underflow of a block from an overflow of the one before it by the
   * top 16 bits of a slot's last word, the same for the pattern and every key (harden.h): 47 random
   * bits there (bit 0 set). */
  if (qm_hardened) s = harden_secret(s);
  freelist_secret = s;
}

void check_fail_invalid(const char *call, const void *ptr) { log_fatal("%s: invalid pointer %p", call, ptr); }

void check_fail_double_free(const char *call, const void *ptr) { log_fatal("%s: double free %p", call, ptr); }

void check_fail_corrupted(const char *call, const void *obj) {
  if (qm_hardened) harden_explain_corrupted(call, obj); /* a 16-byte slot's tag is where the next block's underflow lands */
  log_fatal("%s: corrupted free list (a write after free?) at %p", call, obj);
}

void check_fail_size(const char *call, size_t size, const void *ptr) {
  log_fatal("%s: size %zu does not match the block %p", call, size, ptr);
}

void check_fail(const char *what, const void *ptr) { log_fatal("%s %p", what, ptr); }

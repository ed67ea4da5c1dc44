/* Misuses of free/realloc for tests/preload/test_death.sh (run under LD_PRELOAD=libqmalloc.so).
 * Each mode prints the exact address it is about to pass on stdout (flushed first), then makes the
 * bad call; the allocator is expected to stop the program with one line naming the call and the
 * address. "valid" is the control: correct use, exit 0, nothing on stderr.
 *
 * usage: bad_free MODE   (MODE: see the list in main's last branch)
 * The heap-bug classes of issue 12 (each for small, medium >= 16 KiB and large >= 1 MiB blocks
 * where the class applies): delayed double free (free p, free q, free p), a double free whose first
 * free came from another thread, a free of a slot of a live span that is free or never handed out,
 * sized frees with a wrong size (delete on a new[] array, free_sized), and a write after free over a
 * free object's link followed by mallocs.
 * The hardened build's classes (docs/hardening.md; test_death.sh runs them under
 * libqmalloc-hardened.so): 1- and 8-byte overflows, 1- and 8-byte underflows, a write after free,
 * a read or write after free of a large block, an access to malloc(0)'s block. A mode expected to
 * fault announces the address it is about to touch; the SIGSEGV handler prints "fault <address>"
 * (the address the kernel reports) and lets the signal kill the program. */
#include <malloc.h>
#include <stdalign.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dlfcn.h>
#include <pthread.h>
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

/* Hides where a pointer came from, so the compiler neither warns about nor folds the bad call. */
static void *launder(void *p) {
  void *volatile v = p;
  return v;
}

static void announce(const void *p) {
  printf("%p\n", p);
  fflush(stdout);
}

static alignas(64) char static_array[4096];

/* Sized frees come from the preloaded allocator (glibc 2.36 has no free_sized; this C program has
 * no C++ runtime): looked up at run time. */
static void sized_free(const char *name, void *p, size_t n) {
  void (*fn)(void *, size_t) = (void (*)(void *, size_t))dlsym(RTLD_DEFAULT, name);
  if (fn == NULL) {
    fprintf(stderr, "bad_free: %s not found (is qmalloc preloaded?)\n", name);
    exit(2);
  }
  fn(p, n);
}

static void *free_in_thread(void *p) {
  free(p);
  return NULL;
}

/* size of each class of block: small, medium (>= 16 KiB, still a size class), large (page heap) */
static size_t size_of(const char *mode) {
  size_t n = strlen(mode);
  if (n > 6 && !strcmp(mode + n - 6, "_large")) return 1u << 20;
  if (n > 7 && !strcmp(mode + n - 7, "_medium")) return 200000;
  /* Requests that reach their slot's record in the hardened build (slots of 48 and 20480 bytes,
   * its last 8 bytes the record): no canary bytes between them. */
  if (n > 9 && !strcmp(mode + n - 9, "_smallfit")) return 40;
  if (n > 10 && !strcmp(mode + n - 10, "_mediumfit")) return 20472;
  return 32;
}

/* Medium blocks for underflows: 20000 bytes (a class of several blocks per span, so that a block
 * with a live block of its class just before it can be found); tiny ones, 8 bytes (the hardened
 * build's 16-byte slots, whose last word is a free block's tag rather than the pattern). */
static size_t underflow_size(const char *mode) {
  size_t n = strlen(mode);
  if (n > 5 && !strcmp(mode + n - 5, "_tiny")) return 8;
  return size_of(mode) == 32 ? 32 : 20000;
}

/* A block whose slot follows another block of the same batch directly (the one before it is live):
 * a write before it lands in that block's last bytes, which that block's checks read. Slots are
 * handed out in random order (the hardened build), so the pair is the closest one of `count` blocks
 * (at most 256): enough that two of them are neighbours (the closest pair's distance is then the
 * slot size) except with a negligible chance. Never a block at an 8 KiB boundary: that may be its
 * span's first slot, with the block before it at the end of another span, which the report does not
 * name (1 run in 100 picked one). NULL if none qualifies. */
static char *blocks[256]; /* block_after_live_block's, all of them */
static int blocks_count;
static char *block_after_live_block(size_t size, int count, char **before) {
  blocks_count = count;
  for (int i = 0; i < count; i++) blocks[i] = malloc(size);
  char *best = NULL;
  size_t best_distance = SIZE_MAX;
  for (int i = 0; i < count; i++)
    for (int j = 0; j < count; j++)
      if (((uintptr_t)blocks[i] & 8191) != 0 && blocks[j] < blocks[i] && (size_t)(blocks[i] - blocks[j]) < best_distance) {
        best_distance = (size_t)(blocks[i] - blocks[j]);
        best = blocks[i];
        if (before) *before = blocks[j];
      }
  return best;
}

static void on_fault(int sig, siginfo_t *info, void *context) {
  char line[64];
  int n = snprintf(line, sizeof line, "fault %p\n", info->si_addr);
  if (write(1, line, (size_t)n) < 0) _exit(5);
  /* SA_RESETHAND: returning re-runs the access, which now kills the program with SIGSEGV */
}

/* Frees a block, clears its second word (its free tag) and exits: the thread's exit hands its
 * cache (and, hardened, its quarantine) back, which must check the block on its way. */
static void *clear_tag_then_exit(void *unused) {
  (void)unused;
  void **p = malloc(64);
  free(p);
  announce(p);
  p[1] = 0;
  return NULL;
}

/* A new thread frees two blocks and allocates their size again: in the hardened build both wait in
 * its quarantine (32 blocks), so neither comes back; *result is the one that did, if any. */
static void *quarantine_in_new_thread(void *result) {
  void *a = malloc(32), *b = malloc(32);
  free(a);
  free(b);
  for (int i = 0; i < 8; i++) {
    void *c = malloc(32);
    if (c == a || c == b) *(void **)result = c;
  }
  return NULL;
}

static int starts(const char *mode, const char *prefix) { return strncmp(mode, prefix, strlen(prefix)) == 0; }

int main(int argc, char **argv) {
  const char *mode = argc == 2 ? argv[1] : "";
  alignas(64) char stack_buf[256];
  memset(stack_buf, 0, sizeof stack_buf);
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_sigaction = on_fault;
  sa.sa_flags = SA_SIGINFO | SA_RESETHAND;
  sigaction(SIGSEGV, &sa, NULL);

  if (!strcmp(mode, "valid")) {
    char *p = malloc(100), *q = malloc(1u << 20);
    memset(p, 1, 100);
    memset(q, 1, 1u << 20);
    p = realloc(p, 5000);
    free(p);
    free(q);
    free(NULL);
    char *z = malloc(0), *e = malloc(24); /* a zero-size block, and a block used to its last byte */
    memset(e, 1, 24);
    free(z);
    free(e);
    return 0;
  }
  if (!strcmp(mode, "stack")) {
    void *p = launder(stack_buf + 64);
    announce(p);
    free(p);
  } else if (!strcmp(mode, "static")) {
    void *p = launder(static_array + 128);
    announce(p);
    free(p);
  } else if (!strcmp(mode, "mmap")) {
    void *m = mmap(NULL, 1u << 16, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) return 3;
    announce(m);
    free(m);
  } else if (!strcmp(mode, "noncanonical") || !strcmp(mode, "low_address")) {
    /* In a new thread, whose free has no page-map leaf cached yet (api.c, pagemap_small_entry):
     * a non-canonical address, and one in the first GiB, where no leaf is: neither may pass for
     * ours through whatever that cache starts with. */
    void *p = launder((void *)(!strcmp(mode, "low_address") ? (uintptr_t)0x10000 : ((uintptr_t)1 << 63) + 64));
    announce(p);
    pthread_t t;
    if (pthread_create(&t, NULL, free_in_thread, p) != 0) return 3;
    pthread_join(t, NULL);
  } else if (!strcmp(mode, "interior")) {
    char *p = malloc(100);
    void *bad = launder(p + 16);
    announce(bad);
    free(bad);
  } else if (!strcmp(mode, "interior_large")) {
    char *p = malloc(1u << 20);
    void *bad = launder(p + 4096);
    announce(bad);
    free(bad);
  } else if (!strcmp(mode, "realloc_stack")) {
    void *p = launder(stack_buf + 64);
    announce(p);
    void *q = realloc(p, 100);
    printf("realloc returned %p\n", q);
  } else if (!strcmp(mode, "realloc_interior")) {
    char *p = malloc(100);
    void *bad = launder(p + 16);
    announce(bad);
    void *q = realloc(bad, 200);
    printf("realloc returned %p\n", q);
  } else if (!strcmp(mode, "realloc_freed") || !strcmp(mode, "realloc_freed_move")) {
    /* realloc of a small block freed just before, to a size its class holds (it would stay in
     * place) or to one that moves it: realloc's fast path tests the free tag in both cases. */
    char *p = malloc(100);
    announce(p); /* before the free: its printf allocates (stdout's buffer), which could take p */
    free(p);
    void *q = realloc(launder(p), mode[13] == '_' ? 1000 : 100);
    printf("realloc returned %p\n", q);
  } else if (!strcmp(mode, "usable_freed") || !strcmp(mode, "usable_interior")) {
    /* malloc_usable_size of a block freed before, or of a pointer inside a live one */
    char *p = malloc(100);
    announce(mode[7] == 'f' ? p : p + 16);
    if (mode[7] == 'f') free(p);
    printf("usable %zu\n", malloc_usable_size(launder(mode[7] == 'f' ? p : p + 16)));
  } else if (!strcmp(mode, "double")) {
    void *p = malloc(100);
    announce(p);
    free(p);
    free(launder(p));
  } else if (!strcmp(mode, "double_large")) {
    void *p = malloc(1u << 20);
    announce(p);
    free(p);
    free(launder(p));
  } else if (!strcmp(mode, "double_later")) {
    void *p = malloc(100), *q = malloc(100);
    announce(p);
    free(p);
    free(q);
    free(launder(p));
  } else if (starts(mode, "later_")) { /* later_small|_medium|_large: free p, free q, free p */
    size_t size = size_of(mode);
    void *p = malloc(size), *q = malloc(size), *r = malloc(size);
    announce(p);
    free(p);
    free(q);
    free(launder(p));
    free(r);
  } else if (starts(mode, "remote_")) { /* p freed by another thread, then again here */
    size_t size = size_of(mode);
    void *p = malloc(size), *q = malloc(size);
    announce(p); /* before the first free: stdio's buffer must not take p's freed pages */
    pthread_t t;
    pthread_create(&t, NULL, free_in_thread, p);
    pthread_join(t, NULL);
    free(q);
    free(launder(p));
  } else if (starts(mode, "slot_free_")) { /* free(p + k * size) at a slot that is free */
    size_t size = size_of(mode);
    char *p = malloc(size), *q = malloc(size);
    free(q);
    void *slot = launder(q);
    (void)p;
    announce(slot);
    free(slot);
  } else if (starts(mode, "slot_new_")) { /* a slot of a live span that was never handed out */
    size_t size = size_of(mode);
    char *p = malloc(size);
    char *slot = p + size; /* the next slot: not handed out yet in a fresh process */
    if (size >= 100000) slot = p; /* one object per span: free p, then its slot is free */
    if (slot == p) free(p);
    announce(slot);
    free(launder(slot));
  } else if (!strcmp(mode, "slot_uncarved")) { /* a slot on a page of the span no object was taken from */
    char *p = malloc(20000); /* 20480-byte slots, 2.5 pages each: the first malloc carves only the first */
    char *slot = p + malloc_usable_size(p);
    announce(slot);
    free(launder(slot));
  } else if (!strcmp(mode, "sized_wrong")) { /* free_sized with the size of another class */
    void *p = malloc(100);
    announce(p);
    sized_free("free_sized", launder(p), 1000);
  } else if (!strcmp(mode, "delete_array")) { /* delete (sized) on a new[] array: a smaller size */
    char *p = malloc(400 + 8); /* what new char-like T[50] with a cookie asks for */
    announce(p);
    sized_free("_ZdlPvm", launder(p), 8); /* operator delete(void *, size_t) */
  } else if (!strcmp(mode, "sized_wrong_large")) {
    void *p = malloc(1u << 20);
    announce(p);
    sized_free("free_sized", launder(p), 3u << 20);
  } else if (!strcmp(mode, "guard_after") || !strcmp(mode, "guard_before")) {
    /* a huge block (a mapping of its own) has guard pages on both sides: an access just off either
     * end faults instead of reaching another mapping */
    size_t size = 64u << 20;
    volatile char *above = malloc(size), *p = malloc(size), *below = malloc(size);
    (void)above, (void)below; /* the kernel maps top-down: without guards, p's neighbours touch it */
    announce((void *)p);
    if (mode[6] == 'a') p[size] = 1;
    else p[-1] = 1;
  } else if (!strcmp(mode, "corrupt_link")) { /* write after free over the link, then malloc */
    void **p = malloc(64), **q = malloc(64);
    free(q);
    free(p); /* p is the list head, linked to q */
    announce(p);
    p[0] = (void *)static_array; /* a chosen address, as an exploit would write */
    void *a = malloc(64), *b = malloc(64);
    printf("malloc returned %p and %p\n", a, b);
  } else if (!strcmp(mode, "corrupt_tag_trim") || !strcmp(mode, "corrupt_link_trim")) {
    /* a write after free over the tag (the second word) or the link of a block that then goes
     * back to its span with its thread's list, not out through a malloc: malloc_trim(0) flushes
     * the thread's cache and the central lists */
    void **p = malloc(64), **live = malloc(64);
    free(p);
    announce(p);
    if (mode[8] == 't') p[1] = 0; /* a field at offset 8, cleared after the free */
    else p[0] = (void *)live;     /* the address of a live block of the class, as an exploit would write */
    malloc_trim(0);
    void *a = malloc(64), *b = malloc(64);
    printf("not stopped: malloc returned %p and %p, %p is live\n", a, b, (void *)live);
  } else if (!strcmp(mode, "corrupt_tag_thread_exit")) {
    pthread_t t;
    if (pthread_create(&t, NULL, clear_tag_then_exit, NULL) != 0 || pthread_join(t, NULL) != 0) return 3;
  } else if (starts(mode, "overflow1_") || starts(mode, "overflow8_")) { /* past the requested size */
    size_t size = size_of(mode), k = mode[8] == '1' ? 1 : 8;
    char *p = malloc(size);
    announce(size >= (1u << 20) ? p + size : p); /* large: the guard page faults at p + size */
    volatile char *past = (char *)launder(p) + size;
    /* 'x' over the canary; a request that reaches the record gets its bytes changed (what is
     * there depends on the process's secret, and a write of the byte already there changes
     * nothing) */
    bool fit = strstr(mode, "fit") != NULL;
    if (fit) memset(launder(p), 0xa5, size); /* the program's bytes look like a canary: the record must tell */
    for (size_t i = 0; i < k; i++) past[i] = fit ? (char)~past[i] : 'x';
    free(p);
  } else if (!strcmp(mode, "quarantine_new_thread")) { /* not a death: exit 0 if the quarantine holds */
    pthread_t t;
    void *reused = NULL;
    if (pthread_create(&t, NULL, quarantine_in_new_thread, &reused) != 0 || pthread_join(t, NULL) != 0) return 3;
    if (reused != NULL) {
      fprintf(stderr, "bad_free: a new thread's malloc(32) returned %p, freed two frees before\n", reused);
      return 1;
    }
  } else if (!strcmp(mode, "overflow_shrunk")) { /* past a block realloc shrank where it is */
    char *p = malloc(1000), *q = realloc(launder(p), 600);
    if (q != p) {
      fprintf(stderr, "bad_free: realloc(1000 -> 600) moved the block\n");
      return 4;
    }
    announce(q);
    ((volatile char *)launder(q))[600] = 'x';
    free(q);
  } else if (starts(mode, "underflow1_") || starts(mode, "underflow8_")) { /* before the block */
    /* The bytes before p are the last word of the block before it (its record; the pattern, or in
     * 16-byte slots its free tag, once freed), which that block's own checks read: its free
     * (underflowK_*), its hand-out (underflowK_free_*: freed before, then its class reused),
     * realloc (underflow1_realloc), the exit check of the quarantine (underflow1_exit), and, in
     * 16-byte slots, whose last word is the free tag, its list going back to its span
     * (underflow1_trim_tiny: malloc_trim flushes the quarantine and the thread's lists), and in
     * any slot the check of a span going back to the page heap (underflow1_trim_medium: every
     * block of the span freed, then malloc_trim). One byte
     * changes the word's top byte alone, and the report names p; eight change all of it, which
     * an overflow of the block before (or a write after free) would do too, and the report names
     * that block: announced here is the block the report must name. */
    size_t size = underflow_size(mode), k = mode[9] == '1' ? 1 : 8;
    char *before = NULL, *p = block_after_live_block(size, size > 1000 ? 8 : 256, &before);
    if (p == NULL) {
      fprintf(stderr, "bad_free: no block with a live block just before it\n");
      return 4;
    }
    bool freed_before = starts(mode + 11, "free_") || starts(mode + 11, "exit") || starts(mode + 11, "trim_");
    if (freed_before) free(before);
    announce(k == 1 ? p : before);
    memset((char *)launder(p) - k, 'x', k);
    free(p);
    if (starts(mode + 11, "realloc")) before = realloc(launder(before), 2 * size); /* moves: a larger class */
    else if (!freed_before) free(before);
    else if (starts(mode + 11, "free_"))
      for (int i = 0; i < 20000; i++) free(malloc(size)); /* until the block before leaves the quarantine and is handed out */
    else if (starts(mode + 11, "trim_")) {
      for (int i = 0; i < blocks_count; i++)
        if (blocks[i] != p && blocks[i] != before) free(blocks[i]);
      malloc_trim(0);
    }
    /* underflow1_exit: the block before is still in the quarantine (not full yet), checked at exit */
  } else if (starts(mode, "uaf_write_")) { /* write after free, then the block's class is reused */
    /* Past the free tag's 16 bytes, inside the hardened build's fill (bytes 16 to 64 and the last
     * word of a freed block: docs/hardening.md); for large blocks anywhere, here 48.
     * uaf_write_trim_medium: instead of reusing the class, malloc_trim(0) sends the block back to
     * its span (one block a span at this size), which goes back to the page heap. */
    size_t size = size_of(mode), at = size > 100 ? 48 : 20;
    char *p = malloc(size);
    /* large: announced before the free, so that stdio's buffer does not take the freed pages */
    if (size >= (1u << 20)) announce(p + at);
    free(p);
    if (size < (1u << 20)) announce(p);
    ((volatile char *)launder(p))[at] = 'x';
    if (starts(mode, "uaf_write_trim_")) malloc_trim(0);
    else
      for (int i = 0; i < 20000; i++) free(malloc(size));
  } else if (starts(mode, "uaf_read_")) { /* read after free */
    size_t size = size_of(mode);
    char *p = malloc(size);
    memset(p, 1, size);
    announce(p + 100);
    free(p);
    printf("read %d\n", ((volatile char *)launder(p))[100]);
  } else if (!strcmp(mode, "zero_read") || !strcmp(mode, "zero_write")) { /* malloc(0)'s block */
    char *p = malloc(0);
    announce(p);
    if (mode[5] == 'r') printf("read %d\n", ((volatile char *)launder(p))[0]);
    else ((volatile char *)launder(p))[0] = 'x';
    free(p);
  } else {
    fprintf(stderr, "bad_free: unknown mode '%s' (expected valid, stack, static, mmap, interior, interior_large, "
                    "realloc_stack, realloc_interior, realloc_freed, realloc_freed_move, usable_freed, usable_interior, double, double_large, double_later, later_|remote_|slot_free_|"
                    "slot_new_|overflow1_|overflow8_|underflow1_|underflow8_|uaf_write_|uaf_read_ + small|medium|large "
                    "(overflow: also smallfit|mediumfit; underflow: also tiny, free_ + small|medium|tiny), underflow1_realloc, "
                    "underflow1_exit, underflow1_trim_tiny|medium, uaf_write_trim_medium, overflow_shrunk, quarantine_new_thread, "
                    "slot_uncarved, sized_wrong, sized_wrong_large, delete_array, corrupt_link, corrupt_tag_trim, corrupt_link_trim, corrupt_tag_thread_exit, zero_read, zero_write)\n", mode);
    return 2;
  }
  /* Still running: the misuse went unnoticed. */
  printf("survived\n");
  return 0;
}

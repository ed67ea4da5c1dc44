/* A huge block (a mapping of its own, at least release_large: 32 MiB) that realloc grows a little
 * at a time, as perl's Storable grows its buffer (8 KiB steps):
 *  - it grows where it is while the address space past it is free, so it moves a handful of times,
 *    not at every step (each move was an mremap that rewrote every page-table entry: growing one
 *    block to 256 MiB took 16 s where glibc takes 0.2), and keeps its contents;
 *  - grown so, it is still one mapping: when something else then sits past it, the next growth
 *    moves it with mremap (no copy: the kernel moves one mapping only, and a block made of two
 *    would have been copied), contents intact;
 *  - its guard follows its end: a read just past the grown block faults (in a child);
 *  - a large block inside the page heap grows so too, in both builds, and shrinks where it is
 *    (test_large_growth, test_large_shrink);
 *  - shrunk below release_large and grown again, it stays in its mapping (test_huge_ping_pong). */
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "family.h"
#include "testutil.h"

#define START ((size_t)33 << 20)
#define STEP ((size_t)8 << 10)
#define STEPS 512

/* The bytes of each step carry the step's number, so a lost or shifted page shows. */
static void fill(char *p, size_t from, size_t to) {
  for (size_t i = from; i < to; i += 4096) p[i] = (char)(i / STEP);
}

static size_t damaged(const char *p, size_t n) {
  size_t bad = 0;
  for (size_t i = 0; i < n; i += 4096) bad += p[i] != (char)(i / STEP);
  return bad;
}

/* Whether [p, p + n) lies inside one line of /proc/self/maps: one mapping. */
static bool one_mapping(const void *p, size_t n) {
  FILE *maps = fopen("/proc/self/maps", "r");
  if (maps == NULL) return false;
  char line[512];
  bool found = false;
  while (!found && fgets(line, sizeof line, maps)) {
    unsigned long lo, hi;
    if (sscanf(line, "%lx-%lx", &lo, &hi) == 2 && lo <= (uintptr_t)p && (uintptr_t)p + n <= hi) found = true;
  }
  fclose(maps);
  return found;
}

/* Reads the byte at p in a child: true if that faults. */
static bool read_faults(const volatile char *p) {
  fflush(NULL);
  pid_t pid = fork();
  if (pid == 0) {
    (void)*p;
    _exit(0);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFSIGNALED(status) && (WTERMSIG(status) == SIGSEGV || WTERMSIG(status) == SIGBUS);
}

/* A block of *size bytes grown by `steps` reallocs of STEP bytes, filled as it grows; *size is its
 * size then, *moves how many of the reallocs moved it. */
static char *grown_block(const family_t *f, size_t *size, int steps, unsigned *moves) {
  char *p = f->malloc(*size);
  CHECK_MSG(p != NULL, "%s: malloc(%zu) failed", f->name, *size);
  if (p == NULL) return NULL;
  fill(p, 0, *size);
  for (int i = 0; i < steps; i++) {
    char *q = f->realloc(p, *size + STEP);
    CHECK_MSG(q != NULL, "%s: realloc(%zu -> %zu) failed", f->name, *size, *size + STEP);
    if (q == NULL) break;
    *moves += q != p;
    fill(q, *size, *size + STEP);
    p = q;
    *size += STEP;
  }
  return p;
}

static void test_growth(const family_t *f) {
  size_t size = START;
  unsigned moves = 0;
  char *p = grown_block(f, &size, STEPS, &moves);
  if (p == NULL) return;
  /* Room past a moved block is an eighth of its size (4 MiB here): at most the first growth and
   * one more move. 8 leaves the kernel free to place a few mappings of its own there. */
  CHECK_MSG(moves <= 8, "%s: %d growths of %zu bytes moved the block %u times", f->name, STEPS, STEP, moves);
  CHECK_MSG(damaged(p, size) == 0, "%s: %zu pages lost their contents while the block grew", f->name, damaged(p, size));
  CHECK_MSG(one_mapping(p, size), "%s: the grown block %p (%zu bytes) is not one mapping", f->name, (void *)p, size);
  size_t usable = f->usable_size(p);
  CHECK_MSG(read_faults(p + usable), "%s: a read at the end of the grown block (%p + %zu) did not fault", f->name,
            (void *)p, usable);

  /* Something else past the guard: the next growth must move the block, in one piece. */
  size_t page = (size_t)sysconf(_SC_PAGESIZE);
  const char *assumed = getenv("QMALLOC_OS_PAGE"); /* the page64k run: qmalloc's pages are 64 KiB */
  if (assumed != NULL && strcmp(assumed, "64K") == 0) page = 64 << 10;
  size_t guard = page > 8192 ? page : 8192;
  char *past = p + ((usable + page - 1) & ~(page - 1)) + guard;
  void *blocker = mmap(past, page, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
  bool blocked = blocker == past;
  if (blocker != MAP_FAILED && !blocked) munmap(blocker, page);
  char *q = f->realloc(p, size + 4 * guard);
  CHECK_MSG(q != NULL, "%s: realloc past a mapping failed", f->name);
  if (q == NULL) {
    f->free(p);
  } else {
    if (blocked) CHECK_MSG(q != p, "%s: the block grew over a mapping at %p", f->name, (void *)past);
    CHECK_MSG(damaged(q, size) == 0, "%s: %zu pages lost their contents in the move", f->name, damaged(q, size));
    f->free(q);
  }
  CHECK_MSG(!blocked || *(volatile char *)past == 0, "%s: the mapping past the block changed", f->name);
  if (blocked) munmap(past, page);
}

/* The same for a large block inside the page heap (1 MiB to 3 MiB): it grows over the free pages
 * after it; the hardened build, which copied it at every step, moves its guard page along. */
static void test_large_growth(const family_t *f) {
  size_t size = (size_t)1 << 20;
  unsigned moves = 0;
  char *p = grown_block(f, &size, 256, &moves);
  if (p == NULL) return;
  CHECK_MSG(moves <= 8, "%s: 256 growths of a large block moved it %u times", f->name, moves);
  CHECK_MSG(damaged(p, size) == 0, "%s: %zu pages of the large block lost their contents", f->name, damaged(p, size));
  if (tu_hardened())
    CHECK_MSG(read_faults(p + f->usable_size(p)), "%s: a read past the grown large block did not fault", f->name);
  f->free(p);
}

/* A large block resized within its pages, or shrunk a page at a time, stays where it is; in the
 * hardened build the pages it gives up become inaccessible (as a freed large block's) and its
 * guard follows its end. */
static void test_large_shrink(const family_t *f) {
  size_t size = (size_t)2 << 20, first = size;
  char *p = f->malloc(size);
  CHECK_MSG(p != NULL, "%s: malloc(%zu) failed", f->name, size);
  if (p == NULL) return;
  fill(p, 0, size);
  unsigned moves = 0;
  /* Sizes on the same pages first: nothing to move (the hardened build copied each time). */
  for (size_t less = 1; less < 4096 && p != NULL; less += 97) {
    char *q = f->realloc(p, size - less);
    moves += q != p;
    p = q;
  }
  CHECK_MSG(moves == 0, "%s: %u reallocs to the same pages moved the block", f->name, moves);
  if (p != NULL) p = f->realloc(p, size);
  CHECK_MSG(p != NULL, "%s: realloc back to %zu failed", f->name, size);
  if (p == NULL) return;
  moves = 0;
  for (int i = 0; i < 64; i++) {
    char *q = f->realloc(p, size - STEP);
    CHECK_MSG(q != NULL, "%s: realloc(%zu -> %zu) failed", f->name, size, size - STEP);
    if (q == NULL) break;
    moves += q != p;
    p = q;
    size -= STEP;
  }
  CHECK_MSG(moves == 0, "%s: 64 shrinks of a large block moved it %u times", f->name, moves);
  CHECK_MSG(damaged(p, size) == 0, "%s: %zu pages of the shrunk block lost their contents", f->name, damaged(p, size));
  if (moves == 0 && tu_hardened()) {
    CHECK_MSG(read_faults(p + f->usable_size(p)), "%s: a read past the shrunk large block did not fault", f->name);
    CHECK_MSG(read_faults(p + first - 1), "%s: a read of a page the block gave up did not fault", f->name);
  }
  f->free(p);
}

/* A buffer resized back and forth across release_large (70 MB <-> 1 MB, as a program's scratch
 * buffer): shrunk, a huge block stays in its mapping, and grown again it grows there while the
 * address space it gave up is free; before, every round copied the 1 MB and faulted its pages in
 * (0.3 ms a round; glibc's mmapped chunks do the same with mremap). */
static void test_huge_ping_pong(const family_t *f) {
  size_t big = (size_t)70 << 20, small = (size_t)1 << 20;
  char *p = f->malloc(big);
  CHECK_MSG(p != NULL, "%s: malloc(%zu) failed", f->name, big);
  if (p == NULL) return;
  fill(p, 0, small);
  unsigned shrink_moves = 0, growth_moves = 0;
  for (int round = 0; round < 100; round++) {
    char *q = f->realloc(p, small);
    CHECK_MSG(q != NULL, "%s: realloc(%zu -> %zu) failed", f->name, big, small);
    if (q == NULL) break;
    shrink_moves += q != p;
    p = q;
    q = f->realloc(p, big);
    CHECK_MSG(q != NULL, "%s: realloc(%zu -> %zu) failed", f->name, small, big);
    if (q == NULL) break;
    growth_moves += q != p;
    p = q;
    p[big - 1] = 1; /* the grown range is the block's */
  }
  CHECK_MSG(shrink_moves == 0, "%s: 100 shrinks of a huge block to %zu moved it %u times", f->name, small, shrink_moves);
  CHECK_MSG(growth_moves <= 8, "%s: 100 growths back to %zu moved it %u times", f->name, big, growth_moves);
  if (p != NULL) {
    CHECK_MSG(damaged(p, small) == 0, "%s: %zu pages lost their contents", f->name, damaged(p, small));
    f->free(p);
  }
}

int main(void) {
  for (size_t k = 0; k < QM_NFAMILIES; k++) {
    test_growth(&QM_FAMILIES[k]);
    test_large_growth(&QM_FAMILIES[k]);
    test_large_shrink(&QM_FAMILIES[k]);
    test_huge_ping_pong(&QM_FAMILIES[k]);
  }
  return tu_summary("api-huge_growth");
}

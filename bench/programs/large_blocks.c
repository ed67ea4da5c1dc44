/* large_blocks.c - a program that repeatedly allocates a block of several MiB, writes every page
 * of it and frees it again, as image, compression or parsing code does with a per-item buffer.
 * An allocator that gives such a block's pages back to the system at free has them faulted in
 * again by the next allocation: the time goes to the kernel (cpu_sys_s) and shows as minor
 * faults. One that keeps a freed block for a while reuses it without faults; peak RSS tells what
 * that costs. --live keeps that many blocks alive at once (each step replaces a random one), so
 * the working set is steady and anything retained beyond it is the allocator's choice.
 * --write-kb N writes only the pages of a block's first N KiB (and its last byte): a scratch
 * buffer sized for the worst case and filled little, where the page faults are few and the
 * allocator's own path for a large block is what the time measures.
 *
 * Every page of a block is stamped and checked before the block is freed, so an allocator that
 * hands out overlapping memory fails (exit 1) instead of producing a figure. */
#define _GNU_SOURCE
#include "bench_common.h"

#include <stdlib.h>

#define PROG "large-blocks"
#define PAGE 4096

static uint64_t opt_iterations = 200, opt_min_mb = 5, opt_max_mb = 25, opt_live = 1, opt_seed = 1, opt_write_kb = 0;

/* The bytes of a block that are written and checked: its first --write-kb KiB (0: all of it). */
static size_t written_part(size_t size) {
  size_t part = (size_t)opt_write_kb << 10;
  return part == 0 || part > size ? size : part;
}

typedef struct {
  unsigned char *p;
  size_t size;
  unsigned char stamp;
} block_t;

static void fill(block_t *b) {
  for (size_t off = 0; off < written_part(b->size); off += PAGE) b->p[off] = b->stamp;
  b->p[b->size - 1] = b->stamp;
}

static void check_and_free(block_t *b) {
  if (!b->p) return;
  for (size_t off = 0; off < written_part(b->size); off += PAGE)
    if (b->p[off] != b->stamp) bench_die(PROG, "block %p of %zu bytes lost its contents at offset %zu", (void *)b->p, b->size, off);
  if (b->p[b->size - 1] != b->stamp) bench_die(PROG, "block %p of %zu bytes lost its last byte", (void *)b->p, b->size);
  free(b->p);
  b->p = NULL;
}

int main(int argc, char **argv) {
  const opt_t opts[] = {
    {"iterations", OPT_U64, &opt_iterations, 1, 1e9, "blocks allocated, written and freed"},
    {"min-mb", OPT_U64, &opt_min_mb, 1, 4096, "smallest block in MiB"},
    {"max-mb", OPT_U64, &opt_max_mb, 1, 4096, "largest block in MiB"},
    {"live", OPT_U64, &opt_live, 1, 64, "blocks alive at once (each step replaces a random one)"},
    {"write-kb", OPT_U64, &opt_write_kb, 0, 4194304, "KiB written at the start of each block (0: every page)"},
    {"seed", OPT_U64, &opt_seed, 0, 1.8e19, "random seed"},
    {NULL, 0, NULL, 0, 0, NULL},
  };
  bench_parse(PROG, "Large blocks: allocate 5-25 MiB, write every page, free; again and again.", opts, argc, argv);
  if (opt_min_mb > opt_max_mb) bench_usage_error(PROG, "--min-mb exceeds --max-mb");

  block_t *live = calloc(opt_live, sizeof *live);
  if (!live) bench_die(PROG, "out of memory for the block table");
  rng_t rng;
  rng_seed(&rng, opt_seed, 0);
  double start = now_s();
  double cpu_start = process_cpu_s();
  uint64_t bytes = 0;
  for (uint64_t i = 0; i < opt_iterations; i++) {
    block_t *b = &live[rng_below(&rng, opt_live)];
    check_and_free(b);
    /* Any byte count in the range, not only whole MiB: real buffers are not page multiples. */
    b->size = (opt_min_mb << 20) + rng_below(&rng, ((opt_max_mb - opt_min_mb) << 20) + 1);
    b->p = malloc(b->size);
    if (!b->p) bench_die(PROG, "malloc(%zu) returned NULL", b->size);
    b->stamp = (unsigned char)(i * 7 + 1);
    fill(b);
    bytes += written_part(b->size);
  }
  for (uint64_t i = 0; i < opt_live; i++) check_and_free(&live[i]);
  double elapsed = now_s() - start;
  double cpu = process_cpu_s() - cpu_start;
  free(live);

  result_begin(PROG);
  result_u64("iterations", opt_iterations);
  result_u64("min_mb", opt_min_mb);
  result_u64("max_mb", opt_max_mb);
  result_u64("live", opt_live);
  result_u64("write_kb", opt_write_kb);
  result_f("elapsed_s", elapsed);
  result_f("blocks_per_s", opt_iterations / elapsed);
  result_f("gib_written_per_s", bytes / elapsed / (1 << 30));
  result_f("cpu_s", cpu);
  result_end();
  return 0;
}

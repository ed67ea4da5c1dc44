// Every standard replaceable operator new / delete form, called explicitly and through new/delete
// expressions:
//  - the operator this program calls is libqmalloc's (dladdr on its address), not libstdc++'s;
//  - plain forms give __STDCPP_DEFAULT_NEW_ALIGNMENT__ (16) alignment, aligned forms (align_val_t)
//    honour every alignment from 16 to 2 MiB; the whole size is writable and usable size >= size;
//  - each allocation form is released with each matching delete form (plain, sized, nothrow,
//    aligned, sized+aligned, aligned+nothrow), and every delete form really frees: 512 MiB of churn
//    through one form may not grow the RSS by 64 MiB;
//  - new-expressions of over-aligned types and standard containers work on top.
#include <dlfcn.h>
#include <malloc.h>
#include <stdint.h>

#include <cstddef>
#include <cstring>
#include <map>
#include <new>
#include <string>
#include <vector>

#include "testutil.h"

#define RSS_BOUND (64u << 20)
static const size_t SIZES[] = {0, 1, 8, 16, 17, 100, 255, 1024, 4097, 70000, 262145, 3u << 20};
static const size_t NSIZES = sizeof SIZES / sizeof SIZES[0];

static bool aligned_to(const void *p, size_t a) { return ((uintptr_t)p & (a - 1)) == 0; }

// Which shared object holds the code at `fn`.
static bool from_qmalloc(const void *fn, const char *what) {
  Dl_info info;
  bool ok = dladdr(fn, &info) != 0 && info.dli_fname && strstr(info.dli_fname, "libqmalloc") != nullptr;
  CHECK_MSG(ok, "%s resolves to %s, not libqmalloc", what, info.dli_fname ? info.dli_fname : "(unknown)");
  return ok;
}

static void test_operators_are_qmallocs() {
  using std::align_val_t;
  using std::nothrow_t;
  from_qmalloc((void *)static_cast<void *(*)(size_t)>(&::operator new), "operator new(size_t)");
  from_qmalloc((void *)static_cast<void *(*)(size_t)>(&::operator new[]), "operator new[](size_t)");
  from_qmalloc((void *)static_cast<void *(*)(size_t, const nothrow_t &) noexcept>(&::operator new), "operator new(nothrow)");
  from_qmalloc((void *)static_cast<void *(*)(size_t, const nothrow_t &) noexcept>(&::operator new[]), "operator new[](nothrow)");
  from_qmalloc((void *)static_cast<void *(*)(size_t, align_val_t)>(&::operator new), "operator new(align)");
  from_qmalloc((void *)static_cast<void *(*)(size_t, align_val_t)>(&::operator new[]), "operator new[](align)");
  from_qmalloc((void *)static_cast<void *(*)(size_t, align_val_t, const nothrow_t &) noexcept>(&::operator new),
               "operator new(align, nothrow)");
  from_qmalloc((void *)static_cast<void *(*)(size_t, align_val_t, const nothrow_t &) noexcept>(&::operator new[]),
               "operator new[](align, nothrow)");
  from_qmalloc((void *)static_cast<void (*)(void *) noexcept>(&::operator delete), "operator delete(void*)");
  from_qmalloc((void *)static_cast<void (*)(void *) noexcept>(&::operator delete[]), "operator delete[](void*)");
  from_qmalloc((void *)static_cast<void (*)(void *, size_t) noexcept>(&::operator delete), "operator delete(sized)");
  from_qmalloc((void *)static_cast<void (*)(void *, size_t) noexcept>(&::operator delete[]), "operator delete[](sized)");
  from_qmalloc((void *)static_cast<void (*)(void *, const nothrow_t &) noexcept>(&::operator delete),
               "operator delete(nothrow)");
  from_qmalloc((void *)static_cast<void (*)(void *, const nothrow_t &) noexcept>(&::operator delete[]),
               "operator delete[](nothrow)");
  from_qmalloc((void *)static_cast<void (*)(void *, align_val_t) noexcept>(&::operator delete), "operator delete(align)");
  from_qmalloc((void *)static_cast<void (*)(void *, align_val_t) noexcept>(&::operator delete[]),
               "operator delete[](align)");
  from_qmalloc((void *)static_cast<void (*)(void *, size_t, align_val_t) noexcept>(&::operator delete),
               "operator delete(sized, align)");
  from_qmalloc((void *)static_cast<void (*)(void *, size_t, align_val_t) noexcept>(&::operator delete[]),
               "operator delete[](sized, align)");
  from_qmalloc((void *)static_cast<void (*)(void *, align_val_t, const nothrow_t &) noexcept>(&::operator delete),
               "operator delete(align, nothrow)");
  from_qmalloc((void *)static_cast<void (*)(void *, align_val_t, const nothrow_t &) noexcept>(&::operator delete[]),
               "operator delete[](align, nothrow)");
}

// ---- one allocation, checked, then released by one delete form -------------------------------

enum Alloc { NEW, NEW_ARR, NEW_NT, NEW_ARR_NT, NEW_AL, NEW_ARR_AL, NEW_AL_NT, NEW_ARR_AL_NT };
enum Release { PLAIN, SIZED, NOTHROW };
static const char *const ALLOC_NAMES[] = {"new", "new[]", "new(nothrow)", "new[](nothrow)", "new(align)",
                                          "new[](align)", "new(align, nothrow)", "new[](align, nothrow)"};
static const char *const RELEASE_NAMES[] = {"delete", "sized delete", "nothrow delete"};

static bool is_array(Alloc a) { return a == NEW_ARR || a == NEW_ARR_NT || a == NEW_ARR_AL || a == NEW_ARR_AL_NT; }
static bool is_aligned(Alloc a) { return a >= NEW_AL; }

static void *allocate(Alloc a, size_t n, size_t al) {
  std::align_val_t av{al};
  switch (a) {
  case NEW: return ::operator new(n);
  case NEW_ARR: return ::operator new[](n);
  case NEW_NT: return ::operator new(n, std::nothrow);
  case NEW_ARR_NT: return ::operator new[](n, std::nothrow);
  case NEW_AL: return ::operator new(n, av);
  case NEW_ARR_AL: return ::operator new[](n, av);
  case NEW_AL_NT: return ::operator new(n, av, std::nothrow);
  case NEW_ARR_AL_NT: return ::operator new[](n, av, std::nothrow);
  }
  return nullptr;
}

// The delete that matches the allocation form, in the requested variant.
static void release(Alloc a, Release r, void *p, size_t n, size_t al) {
  std::align_val_t av{al};
  bool arr = is_array(a);
  if (!is_aligned(a)) {
    if (r == PLAIN) arr ? ::operator delete[](p) : ::operator delete(p);
    else if (r == SIZED) arr ? ::operator delete[](p, n) : ::operator delete(p, n);
    else arr ? ::operator delete[](p, std::nothrow) : ::operator delete(p, std::nothrow);
  } else {
    if (r == PLAIN) arr ? ::operator delete[](p, av) : ::operator delete(p, av);
    else if (r == SIZED) arr ? ::operator delete[](p, n, av) : ::operator delete(p, n, av);
    else arr ? ::operator delete[](p, av, std::nothrow) : ::operator delete(p, av, std::nothrow);
  }
}

static void test_every_form() {
  for (int a = NEW; a <= NEW_ARR_AL_NT; a++)
    for (int r = PLAIN; r <= NOTHROW; r++)
      for (size_t al = 16; al <= (is_aligned(Alloc(a)) ? (2u << 20) : 16); al *= 4)
        for (size_t i = 0; i < NSIZES; i++) {
          size_t n = SIZES[i];
          void *p = allocate(Alloc(a), n, al);
          CHECK_MSG(p != nullptr, "%s(%zu, align %zu) returned null", ALLOC_NAMES[a], n, al);
          if (!p) continue;
          CHECK_MSG(aligned_to(p, al), "%s(%zu, align %zu) = %p misaligned", ALLOC_NAMES[a], n, al, p);
          CHECK_MSG(malloc_usable_size(p) >= n, "%s(%zu): usable size %zu", ALLOC_NAMES[a], n, malloc_usable_size(p));
          tu_fill(p, n, a * 1000 + i);
          CHECK(tu_verify(p, n, a * 1000 + i) < 0);
          release(Alloc(a), Release(r), p, n, al);
        }
}

// Each delete form must give the memory back: a no-op delete would grow the RSS by 512 MiB.
static void test_every_delete_frees() {
  const size_t size = 200000, churn = tu_churn_bytes(RSS_BOUND);
  for (int a = NEW; a <= NEW_ARR_AL_NT; a++)
    for (int r = PLAIN; r <= NOTHROW; r++) {
      size_t al = is_aligned(Alloc(a)) ? 4096 : 16, before = 0;
      for (size_t done = 0; done < churn; done += size) {
        void *p = allocate(Alloc(a), size, al);
        if (!p) { CHECK(0); break; }
        memset(p, 0x3c, size);
        release(Alloc(a), Release(r), p, size, al);
        if (done == 0) before = tu_rss_bytes();
      }
      size_t after = tu_rss_bytes();
      CHECK_MSG(after < before + RSS_BOUND, "%s released by %s does not free: RSS %zu -> %zu KiB", ALLOC_NAMES[a],
                RELEASE_NAMES[r], before >> 10, after >> 10);
    }
}

// ---- new-expressions -------------------------------------------------------------------------

struct alignas(64) Line { char b[64]; };
struct alignas(4096) Page { char b[100]; };
struct alignas(1 << 20) Huge { int x; };

static void test_expressions() {
  std::vector<Line *> lines;
  for (int i = 0; i < 1000; i++) {
    lines.push_back(new Line);
    CHECK_MSG(aligned_to(lines.back(), 64), "new Line (alignas 64) = %p", (void *)lines.back());
    memset(lines.back()->b, i, sizeof(Line));
  }
  for (Line *l : lines) delete l; // sized + aligned delete
  Page *pages = new Page[37];
  CHECK_MSG(aligned_to(pages, 4096), "new Page[37] (alignas 4096) = %p", (void *)pages);
  memset(pages, 1, sizeof(Page) * 37);
  delete[] pages;
  Huge *h = new Huge{7};
  CHECK_MSG(aligned_to(h, 1 << 20), "new Huge (alignas 1 MiB) = %p", (void *)h);
  delete h;
  Page *nt = new (std::nothrow) Page;
  CHECK(nt && aligned_to(nt, 4096));
  delete nt;

  // the standard library on top: strings, vectors, maps
  std::map<std::string, std::vector<int>> m;
  for (int i = 0; i < 20000; i++) {
    std::string key = "key-" + std::to_string(i * 7919 % 20011) + std::string(i % 50, 'x');
    m[key].assign(i % 300, i);
  }
  long sum = 0;
  for (auto &kv : m) for (int v : kv.second) sum += v;
  long expect = 0;
  for (int i = 0; i < 20000; i++) expect += (long)(i % 300) * i;
  CHECK_EQ(sum, expect);
  CHECK_EQ(m.size(), 20000);
}

int main() {
  test_operators_are_qmallocs();
  test_every_form();
  test_every_delete_frees();
  test_expressions();
  return tu_summary("api-cxx_new_delete");
}

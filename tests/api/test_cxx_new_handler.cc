// Failure paths of operator new (libqmalloc's; see test_cxx_new_delete for the proof of whose):
//  - an impossible size throws std::bad_alloc from every throwing form, and returns nullptr from
//    every nothrow form;
//  - the installed new_handler is called on failure, again and again while it returns, until it
//    uninstalls itself (then bad_alloc / nullptr); an exception it throws comes out of the
//    throwing forms, and the nothrow forms turn it into nullptr;
//  - a new_handler that frees memory lets the allocation succeed: in a child whose address space
//    is limited (RLIMIT_AS) to what it uses plus 64 MiB, a 128 MiB request fails, the handler frees
//    a 256 MiB reserve, and the request then succeeds with the handler called exactly once.
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <new>

#include "testutil.h"

static const size_t IMPOSSIBLE[] = {SIZE_MAX, SIZE_MAX - 4095, (size_t)PTRDIFF_MAX + 1, (size_t)1 << 60};

enum Form { NEW, NEW_ARR, NEW_NT, NEW_ARR_NT, NEW_AL, NEW_ARR_AL, NEW_AL_NT, NEW_ARR_AL_NT, NFORMS };
static const char *const NAMES[] = {"new", "new[]", "new(nothrow)", "new[](nothrow)", "new(align 4096)",
                                    "new[](align 4096)", "new(align 4096, nothrow)", "new[](align 4096, nothrow)"};
static bool is_nothrow(int f) { return f == NEW_NT || f == NEW_ARR_NT || f == NEW_AL_NT || f == NEW_ARR_AL_NT; }
static bool is_aligned(int f) { return f >= NEW_AL; }
static bool is_array(int f) { return f == NEW_ARR || f == NEW_ARR_NT || f == NEW_ARR_AL || f == NEW_ARR_AL_NT; }

static void *call_new(int f, size_t n) {
  std::align_val_t al{4096};
  switch (f) {
  case NEW: return ::operator new(n);
  case NEW_ARR: return ::operator new[](n);
  case NEW_NT: return ::operator new(n, std::nothrow);
  case NEW_ARR_NT: return ::operator new[](n, std::nothrow);
  case NEW_AL: return ::operator new(n, al);
  case NEW_ARR_AL: return ::operator new[](n, al);
  case NEW_AL_NT: return ::operator new(n, al, std::nothrow);
  case NEW_ARR_AL_NT: return ::operator new[](n, al, std::nothrow);
  }
  return nullptr;
}

static void call_delete(int f, void *p) {
  std::align_val_t al{4096};
  if (is_aligned(f)) is_array(f) ? ::operator delete[](p, al) : ::operator delete(p, al);
  else is_array(f) ? ::operator delete[](p) : ::operator delete(p);
}

// What an attempt did: returned a pointer, returned null, or threw bad_alloc / something else.
enum Outcome { GOT_POINTER, GOT_NULL, THREW_BAD_ALLOC, THREW_OTHER };
static const char *const OUTCOMES[] = {"a pointer", "nullptr", "std::bad_alloc", "another exception"};

static Outcome attempt(int f, size_t n, void **out) {
  *out = nullptr;
  try {
    *out = call_new(f, n);
    return *out ? GOT_POINTER : GOT_NULL;
  } catch (const std::bad_alloc &) {
    return THREW_BAD_ALLOC;
  } catch (...) {
    return THREW_OTHER;
  }
}

static void test_impossible_sizes() {
  std::set_new_handler(nullptr);
  for (int f = 0; f < NFORMS; f++)
    for (size_t i = 0; i < sizeof IMPOSSIBLE / sizeof IMPOSSIBLE[0]; i++) {
      void *p;
      Outcome o = attempt(f, IMPOSSIBLE[i], &p);
      Outcome want = is_nothrow(f) ? GOT_NULL : THREW_BAD_ALLOC;
      CHECK_MSG(o == want, "%s(%zu) gave %s, expected %s", NAMES[f], IMPOSSIBLE[i], OUTCOMES[o], OUTCOMES[want]);
      if (p) call_delete(f, p);
    }
}

// A handler that gives up (uninstalls itself) on its third call.
static int handler_calls;
static void give_up_on_third_call() {
  if (++handler_calls == 3) std::set_new_handler(nullptr);
}

struct handler_error : std::bad_alloc {};
static void throw_from_handler() {
  handler_calls++;
  throw handler_error();
}

static void test_handler_loop() {
  for (int f = 0; f < NFORMS; f++) {
    handler_calls = 0;
    std::set_new_handler(give_up_on_third_call);
    void *p;
    Outcome o = attempt(f, SIZE_MAX, &p);
    Outcome want = is_nothrow(f) ? GOT_NULL : THREW_BAD_ALLOC;
    CHECK_MSG(o == want, "%s(SIZE_MAX) with a handler gave %s, expected %s", NAMES[f], OUTCOMES[o], OUTCOMES[want]);
    CHECK_MSG(handler_calls == 3, "%s(SIZE_MAX): new_handler called %d times, expected 3 (it gives up on the 3rd)",
              NAMES[f], handler_calls);

    handler_calls = 0;
    std::set_new_handler(throw_from_handler);
    bool caught_own = false;
    p = nullptr;
    try {
      p = call_new(f, SIZE_MAX);
    } catch (const handler_error &) {
      caught_own = true;
    } catch (...) {
    }
    if (is_nothrow(f))
      CHECK_MSG(!caught_own && p == nullptr, "%s: the handler's std::bad_alloc-derived exception must become nullptr"
                " ([new.delete.single]: nothrow new returns null if the throwing form exits via an exception);"
                " got: %s", NAMES[f], caught_own ? "the exception escaped the noexcept operator" : "a non-null pointer");
    else
      CHECK_MSG(caught_own, "%s: the exception thrown by the new_handler did not come out of operator new", NAMES[f]);
    CHECK_MSG(handler_calls == 1, "%s: throwing handler called %d times, expected 1", NAMES[f], handler_calls);
    std::set_new_handler(nullptr);
  }
}

// ---- the handler frees memory, and the allocation then succeeds ------------------------------

static void *reserve;
static int reserve_frees;
static void free_the_reserve() {
  reserve_frees++;
  if (reserve) {
    free(reserve);
    reserve = nullptr;
  } else {
    std::set_new_handler(nullptr); // nothing left to give: let operator new fail
  }
}

static size_t vm_size_bytes() {
  FILE *f = fopen("/proc/self/statm", "r");
  unsigned long vm = 0;
  if (!f) return 0;
  if (fscanf(f, "%lu", &vm) != 1) vm = 0;
  fclose(f);
  return (size_t)vm * (size_t)sysconf(_SC_PAGESIZE);
}

// Runs in a child: exit 0 if the request succeeded after exactly one handler call.
static int handler_frees_reserve_child(int f) {
  const size_t reserve_size = 256u << 20, request = 128u << 20;
  reserve = malloc(reserve_size);
  if (!reserve) {
    fprintf(stderr, "%s: could not allocate the reserve\n", NAMES[f]);
    return 3;
  }
  struct rlimit rl;
  getrlimit(RLIMIT_AS, &rl);
  rl.rlim_cur = vm_size_bytes() + (64u << 20);
  if (setrlimit(RLIMIT_AS, &rl) != 0) return 4;
  std::set_new_handler(free_the_reserve);
  void *p;
  Outcome o = attempt(f, request, &p);
  if (o != GOT_POINTER || reserve_frees != 1) {
    fprintf(stderr, "%s(128 MiB) under RLIMIT_AS with a reserve-freeing handler gave %s after %d handler calls;"
                    " expected a pointer after 1 call\n", NAMES[f], OUTCOMES[o], reserve_frees);
    return 1;
  }
  memset(p, 0x6b, request); // the memory is real
  call_delete(f, p);
  return 0;
}

static void test_handler_frees_memory() {
  for (int f = 0; f < NFORMS; f++) {
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) _exit(handler_frees_reserve_child(f));
    int status = 0;
    CHECK(pid > 0 && waitpid(pid, &status, 0) == pid);
    CHECK_MSG(WIFEXITED(status) && WEXITSTATUS(status) == 0, "%s: reserve-freeing new_handler child: %s %d", NAMES[f],
              WIFEXITED(status) ? "exit status" : "killed by signal",
              WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status));
  }
}

int main() {
  test_impossible_sizes();
  test_handler_loop();
  if (tu_address_limit_enforced())
    test_handler_frees_memory();
  else
    printf("api-cxx_new_handler: not run: a handler freeing memory under RLIMIT_AS (the limit is not enforced"
           " here: a mapping past it succeeded; qemu-user ignores it)\n");
  return tu_summary("api-cxx_new_handler");
}

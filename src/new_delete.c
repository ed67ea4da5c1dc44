/* C++ operator new and delete, every standard form, as C functions under their Itanium-ABI
 * mangled names (x86-64 and aarch64: size_t is `unsigned long`, mangled `m`). Written in C so the
 * library needs no libstdc++: the two libstdc++ functions used (the new-handler and the throw of
 * std::bad_alloc) are weak references, present whenever a C++ program is running.
 * Callers: C++ programs. */
#include <stdlib.h>

#include "internal.h"
#include "qmalloc.h"

typedef void (*new_handler_t)(void);
extern new_handler_t _ZSt15get_new_handlerv(void) __attribute__((weak));  /* std::get_new_handler */
extern void _ZSt17__throw_bad_allocv(void) __attribute__((weak, noreturn)); /* std::__throw_bad_alloc */

/* new_handler.cc: 1 if handler() returned, 0 if it threw. */
int new_call_handler_nothrow(new_handler_t handler);

/* [new.delete.single]: call the new-handler until it gives up; then throw, or return NULL for
 * the nothrow forms (which also return NULL when the handler throws). */
static QM_NOINLINE void *new_retry(size_t size, size_t alignment, bool nothrow) {
  for (;;) {
    void *p = alignment ? qm_aligned_alloc(alignment, size) : qm_malloc(size);
    if (p != NULL) return p;
    new_handler_t handler = _ZSt15get_new_handlerv ? _ZSt15get_new_handlerv() : NULL;
    if (handler == NULL) break;
    if (!nothrow) handler();
    else if (!new_call_handler_nothrow(handler)) return NULL;
  }
  if (nothrow) return NULL;
  if (_ZSt17__throw_bad_allocv) _ZSt17__throw_bad_allocv();
  check_fail("operator new: out of memory and no C++ runtime to throw std::bad_alloc", NULL);
}

static inline void *new_impl(size_t size, bool nothrow) {
  void *p = qm_malloc(size);
  return QM_LIKELY(p != NULL) ? p : new_retry(size, 0, nothrow);
}

static inline void *new_aligned_impl(size_t size, size_t alignment, bool nothrow) {
  void *p = qm_aligned_alloc(alignment, size);
  return QM_LIKELY(p != NULL) ? p : new_retry(size, alignment, nothrow);
}

/* Left out when QM_STD_NAMES is 0 (the sanitizer build, whose runtime defines the operators): an
 * #if, not a plain `if`, because these are symbol definitions. */
#if QM_STD_NAMES
typedef struct { char unused; } nothrow_t_;

QM_EXPORT void *_Znwm(size_t n) { return new_impl(n, false); }
QM_EXPORT void *_Znam(size_t n) { return new_impl(n, false); }
QM_EXPORT void *_ZnwmRKSt9nothrow_t(size_t n, const nothrow_t_ *t) { return new_impl(n, true); }
QM_EXPORT void *_ZnamRKSt9nothrow_t(size_t n, const nothrow_t_ *t) { return new_impl(n, true); }
QM_EXPORT void *_ZnwmSt11align_val_t(size_t n, size_t a) { return new_aligned_impl(n, a, false); }
QM_EXPORT void *_ZnamSt11align_val_t(size_t n, size_t a) { return new_aligned_impl(n, a, false); }
QM_EXPORT void *_ZnwmSt11align_val_tRKSt9nothrow_t(size_t n, size_t a, const nothrow_t_ *t) { return new_aligned_impl(n, a, true); }
QM_EXPORT void *_ZnamSt11align_val_tRKSt9nothrow_t(size_t n, size_t a, const nothrow_t_ *t) { return new_aligned_impl(n, a, true); }

QM_EXPORT void _ZdlPv(void *p) { qm_free(p); }
QM_EXPORT void _ZdaPv(void *p) { qm_free(p); }
QM_EXPORT void _ZdlPvm(void *p, size_t n) { qm_free_sized(p, n); }
QM_EXPORT void _ZdaPvm(void *p, size_t n) { qm_free_sized(p, n); }
QM_EXPORT void _ZdlPvRKSt9nothrow_t(void *p, const nothrow_t_ *t) { qm_free(p); }
QM_EXPORT void _ZdaPvRKSt9nothrow_t(void *p, const nothrow_t_ *t) { qm_free(p); }
QM_EXPORT void _ZdlPvSt11align_val_t(void *p, size_t a) { qm_free(p); }
QM_EXPORT void _ZdaPvSt11align_val_t(void *p, size_t a) { qm_free(p); }
QM_EXPORT void _ZdlPvmSt11align_val_t(void *p, size_t n, size_t a) { qm_free_aligned_sized(p, a, n); }
QM_EXPORT void _ZdaPvmSt11align_val_t(void *p, size_t n, size_t a) { qm_free_aligned_sized(p, a, n); }
QM_EXPORT void _ZdlPvSt11align_val_tRKSt9nothrow_t(void *p, size_t a, const nothrow_t_ *t) { qm_free(p); }
QM_EXPORT void _ZdaPvSt11align_val_tRKSt9nothrow_t(void *p, size_t a, const nothrow_t_ *t) { qm_free(p); }
#endif

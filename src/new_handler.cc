// The one piece of qmalloc that needs C++: calling the new-handler for the nothrow forms of
// operator new, which must return NULL when the handler throws std::bad_alloc ([new.delete]).
// C cannot catch, so this file does. The C++ runtime's catch machinery is referenced weakly:
// the handler exists only in a program whose C++ runtime is loaded, so libqmalloc.so itself does
// not depend on libstdc++ (C programs preload it without loading a C++ runtime).
// Caller: new_delete.c.
extern "C" {
void *__cxa_begin_catch(void *) noexcept __attribute__((weak));
void __cxa_end_catch() __attribute__((weak));
}
// The compiler refers to the personality routine on its own; this makes that reference weak.
__asm__(".weak __gxx_personality_v0");
extern "C" {

// Calls handler(); returns 1 if it returned, 0 if it threw (the exception is swallowed).
__attribute__((visibility("hidden"))) int new_call_handler_nothrow(void (*handler)()) noexcept {
  try {
    handler();
    return 1;
  } catch (...) {
    return 0;
  }
}
}

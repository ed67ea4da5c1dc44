/* A plugin for preload-prof's reload case (tests/preload/plugin_reload.c): one function that
 * allocates with FRAME bytes of locals. Built twice with different FRAME values, the two builds
 * have the same layout, and only the prologue's stack adjustment differs (and so the unwinding
 * rule at the return address of its malloc call). */
#include <stdlib.h>

#ifndef FRAME
#define FRAME 256
#endif

void *plug_alloc(size_t n) {
  volatile char buf[FRAME];
  buf[0] = 1;
  buf[FRAME - 1] = 2;
  void *p = malloc(n);
  buf[1] = 3;
  return p;
}

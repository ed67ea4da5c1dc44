/* For preload-releaser_tls (releaser_tls.c): a module dlopen'd at run time has dynamic TLS, which
 * glibc allocates with malloc in each thread that touches it and frees when that thread's stack
 * leaves glibc's stack cache, under the cache's lock. 1 MiB a thread: a few threads' blocks take
 * the page heap's free pages past the releaser's start threshold. */
__thread char qm_test_tls_block[1 << 20];

void qm_test_touch_tls(void) {
  for (int i = 0; i < (1 << 20); i += 4096) qm_test_tls_block[i] = 1;
}

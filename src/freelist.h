/* Free-list links and free tags: how every free small object is marked, wherever it is (a thread
 * cache list, a transfer-cache batch, its span's free list), and how it links to the next one.
 *
 * A free object holds, in its first two words:
 *   word 0: the next object's address XOR the object's key (a NULL next reads as the key),
 *   word 1: the key itself: the "free tag",
 * where key(obj) = obj XOR a per-process secret (check.c, drawn from getrandom at start).
 * - Double and invalid frees: free() finds the tag already in place on a block that is free
 *   (freed before, by any thread, however many frees ago; or a slot never handed out: spans are
 *   carved whole, every slot tagged) and stops the program. A live object never holds its tag: the
 *   pop that hands it out clears word 1, and a program cannot write its key without knowing the
 *   secret (a write after free aside, which is what the hardened build is for).
 * - Corrupted lists: a pop checks the tag of the object it hands out, so an overwritten link (a write
 *   after free) that points anywhere but at a free object of ours stops the program with "corrupted
 *   free list" instead of handing out a chosen address (glibc's safe-linking is one public design of
 *   this kind; its key is only the address, here the address and a secret).
 * Objects of fewer than 16 bytes (the 8-byte class, min_align 8) have no room for the tag: that class
 * is never cached per thread, and its span lists are plain links (central.c), checked by the span's
 * count of objects out.
 * Who calls it: api.c (fast paths), tcache.c, central.c. No lock, no state but the secret. */
#ifndef QM_FREELIST_H
#define QM_FREELIST_H

#include <stdbool.h>
#include <stdint.h>

#include "config.h"

extern uintptr_t freelist_secret __attribute__((visibility("hidden"))); /* written once by check_init, before any object exists */

__attribute__((noreturn)) QM_COLD void check_fail_corrupted(const char *call, const void *obj);

QM_INLINE uintptr_t freelist_key(const void *obj) { return (uintptr_t)obj ^ freelist_secret; }

/* Whether obj carries its free tag (key is freelist_key(obj)). */
QM_INLINE bool freelist_tagged(const void *obj, uintptr_t key) { return ((const uintptr_t *)obj)[1] == key; }

/* Marks obj free and links it to next. */
QM_INLINE void freelist_mark(void *obj, void *next, uintptr_t key) {
  ((uintptr_t *)obj)[1] = key;
  ((uintptr_t *)obj)[0] = (uintptr_t)next ^ key;
}

/* The object a free obj's first word `link` (read earlier: tcache.c's taker) names. */
QM_INLINE void *freelist_link_target(const void *obj, uintptr_t link) { return (void *)(link ^ freelist_key(obj)); }

/* The next object after free obj. */
QM_INLINE void *freelist_next(const void *obj) { return freelist_link_target(obj, ((const uintptr_t *)obj)[0]); }

/* Relinks free obj to next (cutting or joining chains). */
QM_INLINE void freelist_set_next(void *obj, void *next) { ((uintptr_t *)obj)[0] = (uintptr_t)next ^ freelist_key(obj); }

/* The next object after free obj, which must carry its tag and whose link must decode to a
 * user-space address (or NULL); else the list is corrupted and the program stops ("corrupted free
 * list", call naming the side that found it). The secret has bit 63 set and user addresses have it
 * clear, so a link overwritten with any user-space value (an address an exploit would choose)
 * decodes to a negative value: the sign of the decoding XOR is the test, one branch. A pop's check (freelist_take), and
 * the walks of the chains that leave a thread cache other ways (a flush, a collection, a thread's
 * exit, an idle cache taken back, malloc_trim: free()) or a span's list (a refill: malloc()):
 * unchecked, a write after free there went unseen or crashed. A lost tag was written again; an
 * overwritten link sent the walk to whatever it decoded to (a fault; a link decoding to a live
 * block of the class, which takes the secret to write, would have put that block on its span's
 * list, to be handed out twice). */
QM_INLINE void *freelist_next_checked(const void *obj, const char *call) {
  uintptr_t key = freelist_key(obj);
  intptr_t next;
  /* The tag before the link: the decoding XOR then consumes the key in its register (no copy). */
  if (QM_UNLIKELY(!freelist_tagged(obj, key) || (next = (intptr_t)(((const uintptr_t *)obj)[0] ^ key)) < 0))
    check_fail_corrupted(call, obj);
  return (void *)next;
}

/* Takes obj off the head of a list to hand it out: checked (freelist_next_checked), its tag
 * cleared; returns the next object. */
QM_INLINE void *freelist_take(void *obj) {
  void *next = freelist_next_checked(obj, "malloc()");
  ((uintptr_t *)obj)[1] = 0;
  return next;
}

/* A block handed out as whole pages (a large block) starts where a free small object may have
 * been: its second word may still hold that object's tag, which is this block's key. The program
 * need not write there, and realloc copies a block's first words to the block it moves to, so
 * the stale tag could travel and, once a small object is handed out at this address again, make
 * a live object look free (a false "double free", seen with the heap profiler's one-page blocks:
 * t-test1, 4 threads, in 1 run of 8). So it is wiped, by a store and not a test first: the page
 * may be one of a backed span's that nobody touched (the middle of a large block that was only
 * written at its ends), and a read there maps the shared zero page, so that the program's first
 * write takes a second fault, which must flush the other CPUs' TLBs of the read-only entry (an
 * interrupt each): a tenth of server-mix's time with the heap profiler sampling, whose blocks
 * are all large. A store faults once, as the program's own first write would. alloc_large skips
 * spans whose pages were all released: they read as zero and stay unbacked. */
QM_INLINE void freelist_forget_tag(void *block) { ((uintptr_t *)block)[1] = 0; }

#endif

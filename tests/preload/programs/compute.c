/* Compiled by gcc running under LD_PRELOAD=libqmalloc.so in tests/preload/test_programs.sh, then
 * run: a sieve, a qsort of pseudo-random numbers and a linked list, all in malloc'ed memory, each
 * checked by the program itself. Prints "compute: primes=9592 sorted=yes list=ok" when all is well
 * (9592 is the number of primes below 100000). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct node { struct node *next; long value; };

static int cmp_long(const void *a, const void *b) {
  long x = *(const long *)a, y = *(const long *)b;
  return x < y ? -1 : x > y;
}

int main(void) {
  enum { LIMIT = 100000, COUNT = 200000 };
  char *composite = calloc(LIMIT, 1);
  int primes = 0;
  for (long i = 2; i < LIMIT; i++) {
    if (composite[i]) continue;
    primes++;
    for (long j = i * i; j < LIMIT; j += i) composite[j] = 1;
  }
  free(composite);

  long *v = malloc(COUNT * sizeof *v);
  unsigned long x = 88172645463325252ul;
  for (int i = 0; i < COUNT; i++) {
    x ^= x << 13; x ^= x >> 7; x ^= x << 17;
    v[i] = (long)(x % 1000000007ul);
  }
  qsort(v, COUNT, sizeof *v, cmp_long);
  int sorted = 1;
  for (int i = 1; i < COUNT; i++) sorted &= v[i - 1] <= v[i];
  free(v);

  struct node *head = NULL;
  for (long i = 0; i < COUNT; i++) {
    struct node *n = malloc(sizeof *n);
    n->next = head;
    n->value = i;
    head = n;
  }
  long sum = 0;
  while (head) {
    struct node *n = head;
    head = n->next;
    sum += n->value;
    free(n);
  }
  int list_ok = sum == (long)COUNT * (COUNT - 1) / 2;
  printf("compute: primes=%d sorted=%s list=%s\n", primes, sorted ? "yes" : "NO", list_ok ? "ok" : "BAD");
  return primes == 9592 && sorted && list_ok ? 0 : 1;
}

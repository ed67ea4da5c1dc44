/* TEMPORARY stand-in until the options module lands. */
#include <stdlib.h>
#include "options.h"
long long options_values[OPTION_COUNT] = {4 << 20, 32 << 20, 32, 10000, 64 << 20, 32 << 20, QM_MIN_ALIGN_DEFAULT, 1, 0, 0};
void options_init(void) {
  extern char **environ;
  for (char **e = environ; e && *e; e++) {
    const char *s = *e;
    if (s[0]=='Q' && !__builtin_memcmp(s, "QMALLOC_STATS=", 14)) options_values[OPTION_STATS] = s[14]-'0';
    if (s[0]=='Q' && !__builtin_memcmp(s, "QMALLOC_MIN_ALIGN=", 18)) options_values[OPTION_MIN_ALIGN] = atoi(s+18);
    if (s[0]=='Q' && !__builtin_memcmp(s, "QMALLOC_DECAY_MS=", 17)) options_values[OPTION_DECAY_MS] = atoi(s+17);
  }
}

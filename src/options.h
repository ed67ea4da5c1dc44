/* TEMPORARY stand-in until the options module lands (same interface): defaults only. */
#ifndef QM_OPTIONS_H
#define QM_OPTIONS_H
#include <stdint.h>
#ifndef QM_MIN_ALIGN_DEFAULT
#define QM_MIN_ALIGN_DEFAULT 16
#endif
typedef enum { OPTION_TCACHE_MAX, OPTION_TCACHE_TOTAL, OPTION_TRANSFER_BATCH, OPTION_DECAY_MS, OPTION_RETAIN_MAX,
  OPTION_RELEASE_LARGE, OPTION_MIN_ALIGN, OPTION_CHECK, OPTION_VERBOSE, OPTION_STATS, OPTION_COUNT } option_id_t;
extern long long options_values[OPTION_COUNT];
static inline long long option(option_id_t id) { return options_values[id]; }
void options_init(void);
#endif

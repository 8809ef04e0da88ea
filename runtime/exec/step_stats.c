/* Writing a step's statistics into the caller's remat_step_stats field by
 * field, as far as the caller's `size` reaches, so that remat_step_stats
 * can grow at its end without breaking programs built against an older
 * header. */
#include <string.h>

#include "base/error.h"
#include "runtime/exec/step_stats.h"

_Static_assert(REMAT_MEM_NUM_CATEGORIES <= REMAT_MEM_CATEGORY_SLOTS,
               "remat_step_stats has no slot for every memory category");

typedef struct stats_field {
  size_t offset, size;
} stats_field;

#define FIELD(f)                                                               \
  {offsetof(remat_step_stats, f), sizeof(((remat_step_stats *)0)->f)}

/* Every field but `size`, in order. A field added to remat_step_stats is
 * added here too (the assertion below checks that the last one ends the
 * struct). */
static const stats_field fields[] = {
    FIELD(loss),
    FIELD(nonfinite),
    FIELD(seconds),
    FIELD(flops),
    FIELD(recompute_flops),
    FIELD(executed_recompute_flops),
    FIELD(peak_bytes),
    FIELD(activation_peak_bytes),
    FIELD(predicted_peak_bytes),
    FIELD(peak),
    FIELD(current),
    FIELD(tasks),
    FIELD(trace_status),
    FIELD(remote_bytes),
    FIELD(remote_bytes_unplaced),
    FIELD(grad_norm),
    FIELD(accumulated),
};

_Static_assert(offsetof(remat_step_stats, accumulated) +
                       sizeof(((remat_step_stats *)0)->accumulated) ==
                   sizeof(remat_step_stats),
               "a field was added to remat_step_stats: add it to fields[]");

remat_status step_stats_check(const remat_step_stats *stats,
                              const char *what) {
  if (stats == NULL || stats->size >= STEP_STATS_MIN_SIZE)
    return REMAT_OK;
  return remat__fail(REMAT_ERR_INVALID_ARG,
                     "%s: stats->size is %zu, less than the %zu bytes of "
                     "remat_step_stats in version 0.2.0 (the least "
                     "accepted): set it to sizeof(remat_step_stats)",
                     what, stats->size, (size_t)STEP_STATS_MIN_SIZE);
}

void step_stats_write(remat_step_stats *dst, const remat_step_stats *src) {
  for (size_t i = 0; i < sizeof fields / sizeof fields[0]; i++) {
    const stats_field *f = &fields[i];
    if (f->offset + f->size > dst->size)
      break;
    memcpy((char *)dst + f->offset, (const char *)src + f->offset, f->size);
  }
}

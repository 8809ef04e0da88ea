/* The state of a remat-train run beyond the model: the learning-rate
 * schedule (and the one that --resume starts when it changes the
 * schedule: train_ckpt.c). The signals that stop a run are
 * train_signals.c's; checkpoints are train_ckpt.c's. */
#include <math.h>
#include <string.h>

#include "tools/train.h"

int train_horizon(const train_options *o) {
  return o->schedule_steps > 0 ? o->schedule_steps : o->steps;
}

int train_warmup(const train_options *o) {
  if (o->warmup >= 0)
    return o->warmup;
  if (o->schedule == SCHEDULE_CONSTANT)
    return 0;
  int tenth = train_horizon(o) / 10;
  return tenth < 100 ? tenth : 100;
}

/* The decay factor at `progress` (0 to 1) of the schedule. */
static double decay(train_schedule schedule, double progress) {
  if (schedule == SCHEDULE_CONSTANT)
    return 1.0;
  return schedule == SCHEDULE_COSINE ? 0.5 * (1.0 + cos(M_PI * progress))
                                     : 1.0 - progress;
}

/* The rate of step `step` >= decay_from on the segment that --resume
 * started: from lr_start to --lr-min (a tenth of --lr by default). */
static float segment_lr_at(const train_options *o, int step) {
  const train_segment *sg = &o->segment;
  if (o->schedule == SCHEDULE_CONSTANT)
    return sg->lr_start;
  int horizon = train_horizon(o);
  double lr_min = o->lr_min >= 0.0f ? (double)o->lr_min : 0.1 * o->lr;
  double progress = horizon > sg->decay_from
                        ? (double)(step - sg->decay_from) /
                              (double)(horizon - sg->decay_from)
                        : 1.0;
  double f = decay(o->schedule, progress);
  return (float)(lr_min + ((double)sg->lr_start - lr_min) * f);
}

float train_lr_at(const train_options *o, int step) {
  int warmup = train_warmup(o), horizon = train_horizon(o);
  if (o->segment.decay_from >= 0 && step >= o->segment.decay_from)
    return segment_lr_at(o, step);
  if (step < warmup)
    return o->lr * (float)(step + 1) / (float)(warmup + 1);
  if (o->schedule == SCHEDULE_CONSTANT)
    return o->lr;
  /* lr * (r + (1 - r) f), r = lr_min / lr, in this order of rounding:
   * the default run's trajectory is sensitive to the last bit of the
   * learning rate (another order of the same arithmetic changed the loss
   * at step 137 by 1e-6 and the accuracy after 2000 steps from 98.4% to
   * 14.3%), so this keeps the rounding that the README's figures come
   * from. */
  double r = o->lr_min >= 0.0f ? (double)o->lr_min / (double)o->lr : 0.1;
  double progress = horizon > warmup
                        ? (double)(step - warmup) / (double)(horizon - warmup)
                        : 1.0;
  double f = decay(o->schedule, progress);
  return o->lr * (float)(r + (1.0 - r) * f);
}


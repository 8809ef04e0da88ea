/* The progress line of remat-train: "step 120/1000 [=====>    ] loss 1.2340
 * | val 1.3012 98.4% | 52.1k tok/s | peak 12.3 MiB | ETA 1m05s" (val: the
 * latest held-out loss and accuracy, with --eval-every), fitted to the
 * width (at most 80 columns, fewer when COLUMNS or the terminal says so)
 * by narrowing the bar and then dropping fields, least useful first. */
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include "tools/train.h"

enum { WIDTH_MAX = 80, BAR_MAX = 30, BAR_MIN = 8 };

int progress_width(int fd) {
  const char *env = getenv("COLUMNS");
  char *end;
  long cols = env != NULL ? strtol(env, &end, 10) : 0;
  if (env == NULL || *env == '\0' || *end != '\0' || cols <= 0) {
    struct winsize ws;
    cols = isatty(fd) && ioctl(fd, TIOCGWINSZ, &ws) == 0 && ws.ws_col > 0
               ? ws.ws_col
               : WIDTH_MAX;
  }
  return cols < WIDTH_MAX ? (int)cols : WIDTH_MAX;
}

/* "[=====>    ]" with `inner` cells inside the brackets. */
static void draw_bar(char *buf, int inner, int step, int steps) {
  int fill = (int)((double)inner * step / steps);
  buf[0] = '[';
  for (int i = 0; i < inner; i++)
    buf[1 + i] = i < fill ? '=' : i == fill ? '>' : ' ';
  buf[inner + 1] = ']';
  buf[inner + 2] = '\0';
}

void progress_format(char *out, size_t len, int width,
                     const progress_fields *f) {
  char head[48], loss[32], fields[4][40] = {""}, bar[BAR_MAX + 3] = "";
  int digits = snprintf(NULL, 0, "%d", f->steps); /* a steady layout */
  snprintf(head, sizeof head, "step %*d/%d", digits, f->step, f->steps);
  snprintf(loss, sizeof loss, " loss %.4f", f->loss);
  /* in order of dropping: peak, speed, ETA, then the held-out figures */
  snprintf(fields[0], sizeof fields[0], " | peak %s", f->peak);
  snprintf(fields[1], sizeof fields[1], " | %.1fk tok/s", f->tokens_per_s / 1000.0);
  snprintf(fields[2], sizeof fields[2], " | ETA %dm%02ds", f->eta_s / 60,
           f->eta_s % 60);
  if (f->evaluated && f->accuracy >= 0.0)
    snprintf(fields[3], sizeof fields[3], " | val %.4f %.1f%%",
             f->heldout_loss, 100.0 * f->accuracy);
  else if (f->evaluated)
    snprintf(fields[3], sizeof fields[3], " | val %.4f", f->heldout_loss);
  int room = width - 1; /* the last column stays free: no wrap */
  int used = (int)(strlen(head) + strlen(loss)), keep = 0;
  for (int i = 0; i < 4; i++)
    used += (int)strlen(fields[i]);
  while (keep < 4 && used + BAR_MIN + 3 > room)
    used -= (int)strlen(fields[keep++]);
  int inner = room - used - 3 < BAR_MAX ? room - used - 3 : BAR_MAX;
  if (inner >= BAR_MIN)
    draw_bar(bar, inner, f->step, f->steps);
  snprintf(out, len, "%s%s%s%s%s%s%s%s", head, bar[0] ? " " : "", bar, loss,
           keep <= 3 ? fields[3] : "", keep <= 1 ? fields[1] : "",
           keep <= 0 ? fields[0] : "", keep <= 2 ? fields[2] : "");
  if (room > 0 && (int)strlen(out) > room)
    out[room] = '\0';
}

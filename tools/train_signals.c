/* The signals that stop a remat-train run. The first SIGINT or SIGTERM
 * asks the loop to stop after its step (with a last checkpoint); a second
 * one ends the process at once, saying on stderr that no checkpoint was
 * written (exit status EXIT_SIGNAL_UNSAVED), except while a file is being
 * written (a checkpoint, a traced step's trace): then it waits for the
 * file to be whole, so that no temporary file is left beside its target. */
#include <signal.h>
#include <string.h>
#include <unistd.h>

#include "base/error.h"
#include "tools/train.h"

static volatile sig_atomic_t stop_signal, writing, second_signal;
/* What a second signal prints, prepared outside the handler. */
static char at_once[2][512];
static size_t at_once_len[2];

static void on_signal(int sig) {
  if (stop_signal == 0) {
    stop_signal = sig;
    return;
  }
  if (writing) {
    second_signal = sig;
    return;
  }
  int k = sig == SIGTERM;
  ssize_t n = write(STDERR_FILENO, at_once[k], at_once_len[k]);
  (void)n;
  _exit(EXIT_SIGNAL_UNSAVED);
}

void signals_prepare(const char *save_path, int tty) {
  for (int k = 0; k < 2; k++) {
    int n = snprintf(at_once[k], sizeof at_once[k],
                     "%sremat-train: stopped at once by a second %s: no "
                     "checkpoint written%s%s%s\n", tty ? "\n" : "",
                     k ? "SIGTERM" : "SIGINT",
                     save_path != NULL ? " to '" : "",
                     save_path != NULL
                         ? remat__quote(&(remat__quoted){0}, save_path)
                         : "",
                     save_path != NULL ? "' (it is as it was)" : "");
    at_once_len[k] = n > 0 && (size_t)n < sizeof at_once[k]
                         ? (size_t)n
                         : strlen(at_once[k]);
  }
}

void signals_catch(int on) {
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on ? on_signal : SIG_DFL;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, NULL);
  sigaction(SIGTERM, &sa, NULL);
}

void signals_writing(int on) { writing = on; }

int signals_stop(void) { return stop_signal; }

int signals_second(void) { return second_signal; }

/* The watchdog of the suite's MPI programs: a rank that waits longer than WATCHDOG_S seconds
 * (default 60) prints where it hangs (its round and step, which the program keeps up to date)
 * and exits with status 3, so a hang fails the job rather than its launcher's timeout. */
#pragma once

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

static volatile sig_atomic_t round_now = -1;
static volatile const char* step_now = "starting";
static int me_world = 0;
static const char* watchdog_program = "mpi";

static void hung(int sig) {
  (void)sig;
  char text[200];
  const int n = snprintf(text, sizeof text, "%s: rank %d HUNG in round %d at %s (watchdog)\n", watchdog_program, me_world, (int)round_now,
                         (const char*)step_now);
  if (n > 0) (void)!write(2, text, (size_t)n);
  _exit(3);
}

/* Arms the watchdog for `program` on world rank `me`; alarm(0) disarms it. */
static void start_watchdog(const char* program, int me) {
  watchdog_program = program;
  me_world = me;
  const char* limit = getenv("WATCHDOG_S");
  signal(SIGALRM, hung);
  alarm(limit != NULL ? (unsigned)atoi(limit) : 60U);
}

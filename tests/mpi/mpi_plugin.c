/* mpi-plugin: an MPI program that is not the process's executable but a shared object that a
 * host program loads with dlopen(RTLD_LOCAL) (mpi_plugin_host.cpp), as Python loads mpi4py's
 * MPI module and, through it, the MPI library: neither is then in the process's global scope.
 * Debian's MPICH 4.0.2 (UCX) loaded that way hangs in its first exchange between machines, with
 * and without libaapc-mpi; where the library is preloaded, it makes the MPI global at
 * MPI_Init (as mpi4py does for Open MPI itself), and the program runs.
 *
 * It asks for MPI_THREAD_MULTIPLE, as mpi4py does, and checks every byte of an MPI_Alltoall
 * and an MPI_Ialltoall.
 *
 *   mpi-plugin-host mpi-plugin-MPI.so [BLOCK_BYTES]
 *                                        rank 0 prints "mpi-plugin: N ranks, all cases ok"
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>

#include "pattern.h"
#include "watchdog.h"

/* One all-to-all of `block` bytes per pair, blocking or not; the wrong bytes received. */
static long exchange(int me, int n, size_t block, int nonblocking, unsigned char* s, unsigned char* r) {
  for (int d = 0; d < n; ++d)
    for (size_t k = 0; k < block; ++k) s[(size_t)d * block + k] = aapc_pattern(me, d, nonblocking, k);
  if (nonblocking) {
    MPI_Request req;
    MPI_Ialltoall(s, (int)block, MPI_BYTE, r, (int)block, MPI_BYTE, MPI_COMM_WORLD, &req);
    MPI_Wait(&req, MPI_STATUS_IGNORE);
  } else {
    MPI_Alltoall(s, (int)block, MPI_BYTE, r, (int)block, MPI_BYTE, MPI_COMM_WORLD);
  }
  long wrong = 0;
  for (int src = 0; src < n; ++src)
    for (size_t k = 0; k < block; ++k) wrong += r[(size_t)src * block + k] != aapc_pattern(src, me, nonblocking, k);
  return wrong;
}

int plugin_main(int argc, char** argv) {
  start_watchdog("mpi-plugin", -1); /* MPI_Init_thread itself is what hung */
  int provided = 0, me = 0, n = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  MPI_Comm_rank(MPI_COMM_WORLD, &me);
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  me_world = me;
  const size_t block = argc > 1 ? (size_t)atol(argv[1]) : 1024;
  unsigned char* s = malloc((size_t)n * block + 1);
  unsigned char* r = malloc((size_t)n * block + 1);
  if (s == NULL || r == NULL) MPI_Abort(MPI_COMM_WORLD, 1);
  long wrong = 0, all = 0;
  for (int nonblocking = 0; nonblocking < 2; ++nonblocking) {
    round_now = nonblocking;
    step_now = nonblocking ? "MPI_Ialltoall" : "MPI_Alltoall";
    wrong += exchange(me, n, block, nonblocking, s, r);
  }
  step_now = "MPI_Allreduce";
  MPI_Allreduce(&wrong, &all, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
  if (me == 0) {
    if (all == 0) printf("mpi-plugin: %d ranks, all cases ok\n", n);
    else printf("mpi-plugin: %d ranks, WRONG: %ld bytes\n", n, all);
  }
  alarm(0);
  free(s);
  free(r);
  MPI_Finalize();
  return all == 0 ? 0 : 1;
}

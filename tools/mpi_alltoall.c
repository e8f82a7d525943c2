/* mpi-alltoall: the MPI baseline of aapc-bench. MPI_Alltoall timed as in the papers (Faraj,
 * Yuan, Patarasuk, Figure 5): warm-up exchanges, a barrier, then iterations of an exchange
 * followed by a barrier, averaged ("seconds"); and the call alone ("call_seconds", below). Rank
 * 0 prints one JSON line per size.
 *
 *   mpi-alltoall [--check] [--split K] [--persistent] [--alltoallv] SIZE:ITERS [SIZE:ITERS ...]
 *
 * --persistent: MPI-4's persistent all-to-all (Open MPI 4.1: MPIX_Alltoall_init), initialized
 * once per size and then started (MPI_Start, MPI_Wait) for the warm-up and every iteration.
 *
 * --alltoallv: MPI_Alltoallv (or its persistent init) with SIZE bytes for every pair, as
 * programs that know only their own counts call it.
 *
 * --split K: the world is cut into K communicators of consecutive ranks (MPI_Comm_split), each
 * on its own machines when the ranks are placed machine by machine, and each runs its
 * all-to-all at the same time; the slowest one's time is printed.
 */
#include <mpi.h>
#if defined(OPEN_MPI) && OPEN_MPI
#include <mpi-ext.h>
#define ALLTOALL_INIT MPIX_Alltoall_init
#define ALLTOALLV_INIT MPIX_Alltoallv_init
#else
#define ALLTOALL_INIT MPI_Alltoall_init
#define ALLTOALLV_INIT MPI_Alltoallv_init
#endif
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <unistd.h>

#include "pattern.h"

static void finalize_hung(int sig) {
  (void)sig;
  _exit(0);
}

/* Never 0 (the cleared buffer) and different from one iteration to the next. */
static unsigned char stamp(int src, int dst, int iter) { return (unsigned char)(1 + (aapc_pattern(src, dst, 0, 0) + iter) % 255); }

/* An MPI_Alltoallv's counts and displacements: `size` bytes for each of `n` ranks. */
static int *counts, *displs;

/* One all-to-all: the blocking call, or a start of the persistent one. */
static void exchange(MPI_Request* persistent, unsigned char* send, unsigned char* recv, size_t size, MPI_Comm comm) {
  if (*persistent == MPI_REQUEST_NULL) {
    if (counts != NULL) MPI_Alltoallv(send, counts, displs, MPI_BYTE, recv, counts, displs, MPI_BYTE, comm);
    else MPI_Alltoall(send, (int)size, MPI_BYTE, recv, (int)size, MPI_BYTE, comm);
    return;
  }
  MPI_Start(persistent);
  MPI_Wait(persistent, MPI_STATUS_IGNORE);
}

/* A guard: should MPI_Finalize hang on a rank, every result is out and every rank has passed
 * the barrier, so an alarm ends such a rank after 20 s. Debian's MPICH hung there in most jobs
 * on the emulated cluster until libaapc-mpich-yield.so gave its endpoint closes a deadline
 * (tools/common/mpich_yield.cpp). */
static int finish(void) {
  MPI_Barrier(MPI_COMM_WORLD);
  signal(SIGALRM, finalize_hung);
  alarm(20);
  MPI_Finalize();
  return 0;
}

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int me = 0, n = 0, check = 0, world_me = 0, world_n = 0, parts = 1, persistent = 0, vector = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &world_me);
  MPI_Comm_size(MPI_COMM_WORLD, &world_n);
  MPI_Comm comm = MPI_COMM_WORLD;
  for (int a = 1; a < argc; ++a) {
    if (strcmp(argv[a], "--help") == 0 || strcmp(argv[a], "-h") == 0) {
      if (world_me == 0)
        printf("mpi-alltoall: MPI_Alltoall timed as in the papers (warm-up, then an exchange and a barrier per iteration)\n"
               "usage: mpi-alltoall [--check] [--split K] [--persistent] [--alltoallv] SIZE:ITERS [SIZE:ITERS ...]\n"
               "  SIZE:ITERS  bytes per rank pair, and timed iterations; rank 0 prints one JSON line per size\n"
               "  --check     validate every received byte\n"
               "  --split K   K communicators of consecutive ranks, each exchanging at once (the slowest is printed)\n"
               "  --persistent  MPI_Alltoall_init once per size, then MPI_Start and MPI_Wait per exchange\n"
               "  --alltoallv   MPI_Alltoallv (with --persistent its init) with SIZE bytes for every pair\n");
      return finish();
    }
    if (strcmp(argv[a], "--check") == 0) {
      check = 1;
      continue;
    }
    if (strcmp(argv[a], "--persistent") == 0) {
      persistent = 1;
      continue;
    }
    if (strcmp(argv[a], "--alltoallv") == 0) {
      vector = 1;
      continue;
    }
    if (strcmp(argv[a], "--split") == 0) {
      if (a + 1 >= argc || (parts = atoi(argv[a + 1])) < 1 || parts > world_n) {
        if (world_me == 0) fprintf(stderr, "mpi-alltoall: --split needs a number of parts from 1 to the number of ranks (%d)\n", world_n);
        MPI_Abort(MPI_COMM_WORLD, 2);
      }
      ++a;
      if (comm != MPI_COMM_WORLD) MPI_Comm_free(&comm);
      MPI_Comm_split(MPI_COMM_WORLD, (int)((long)world_me * parts / world_n), world_me, &comm);
      continue;
    }
    MPI_Comm_rank(comm, &me);
    MPI_Comm_size(comm, &n);
    size_t size = 0;
    int iters = 0;
    if (sscanf(argv[a], "%zu:%d", &size, &iters) != 2 || size == 0 || iters <= 0) {
      if (world_me == 0) fprintf(stderr, "mpi-alltoall: '%s' is not SIZE:ITERS\n", argv[a]);
      MPI_Abort(MPI_COMM_WORLD, 2);
    }
    unsigned char* send = malloc((size_t)n * size);
    unsigned char* recv = malloc((size_t)n * size);
    if (send == NULL || recv == NULL) MPI_Abort(MPI_COMM_WORLD, 1);
    for (int d = 0; d < n; ++d)
      for (size_t k = 0; k < size; ++k) send[(size_t)d * size + k] = aapc_pattern(me, d, 0, k);
    if (vector) {
      counts = malloc(2 * (size_t)n * sizeof(int));
      if (counts == NULL) MPI_Abort(MPI_COMM_WORLD, 1);
      displs = counts + n;
      for (int d = 0; d < n; ++d) counts[d] = (int)size, displs[d] = (int)((size_t)d * size);
    }
    MPI_Request request = MPI_REQUEST_NULL;
    if (persistent && vector) ALLTOALLV_INIT(send, counts, displs, MPI_BYTE, recv, counts, displs, MPI_BYTE, comm, MPI_INFO_NULL, &request);
    else if (persistent) ALLTOALL_INIT(send, (int)size, MPI_BYTE, recv, (int)size, MPI_BYTE, comm, MPI_INFO_NULL, &request);
    for (int w = 0; w < 2; ++w) exchange(&request, send, recv, size, comm);
    /* The check must see the timed exchanges' data, not the warm-up's: the receive buffer is
     * cleared, and every iteration stamps the first byte of each block with its number. */
    memset(recv, 0, (size_t)n * size);
    double* in_call = malloc((size_t)iters * sizeof(double));
    double* slowest = malloc((size_t)iters * sizeof(double));
    if (in_call == NULL || slowest == NULL) MPI_Abort(MPI_COMM_WORLD, 1);
    MPI_Barrier(MPI_COMM_WORLD);
    double t0 = MPI_Wtime();
    for (int i = 0; i < iters; ++i) {
      for (int d = 0; d < n; ++d) send[(size_t)d * size] = stamp(me, d, i);
      const double c0 = MPI_Wtime();
      exchange(&request, send, recv, size, comm);
      in_call[i] = MPI_Wtime() - c0;
      MPI_Barrier(comm);
    }
    double mine = (MPI_Wtime() - t0) / iters, seconds = 0;
    if (request != MPI_REQUEST_NULL) MPI_Request_free(&request);
    MPI_Reduce(&mine, &seconds, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);  /* the slowest part's */
    /* The call alone, as OSU's benchmarks time it: each iteration's slowest rank from its
     * entry into MPI_Alltoall to its return, the barrier after it left out; averaged. With an
     * MPI whose barrier is slow (MPICH's ranks spin in it, and on a box with fewer cores than
     * processes one barrier took 79 ms here), this shows what the all-to-all itself costs. */
    MPI_Reduce(in_call, slowest, iters, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
    double call_seconds = 0;
    for (int i = 0; i < iters; ++i) call_seconds += slowest[i] / iters;
    free(in_call);
    free(slowest);
    int ok = 1;
    if (check)
      for (int s = 0; s < n && ok; ++s) {
        if (recv[(size_t)s * size] != stamp(s, me, iters - 1)) ok = 0;
        for (size_t k = 1; k < size && ok; ++k)
          if (recv[(size_t)s * size + k] != aapc_pattern(s, me, 0, k)) ok = 0;
      }
    int all_ok = 0;
    MPI_Reduce(&ok, &all_ok, 1, MPI_INT, MPI_LAND, 0, MPI_COMM_WORLD);
    if (world_me == 0) {
      printf("{\"size\": %zu, \"iters\": %d, \"parts\": %d, \"ranks\": %d, \"persistent\": %s, \"alltoallv\": %s, \"seconds\": %.9f, "
             "\"call_seconds\": %.9f, \"checked\": %s, \"check_ok\": %s}\n",
             size, iters, parts, n, persistent ? "true" : "false", vector ? "true" : "false", seconds, call_seconds, check ? "true" : "false",
             all_ok ? "true" : "false");
      fflush(stdout);
    }
    free(send);
    free(recv);
    free(counts);
    counts = displs = NULL;
  }
  return finish();
}

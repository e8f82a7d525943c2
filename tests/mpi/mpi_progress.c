/* mpi-progress: an ordinary MPI program (nothing of aapc in it) that counts on MPI's progress
 * rule. Rank 0 starts a large MPI_Isend to rank 1 and then calls MPI_Alltoall; rank 1 calls
 * MPI_Alltoall only once its MPI_Recv has the message. A large message goes by rendezvous, so
 * its bytes leave rank 0 only while rank 0's MPI runs: inside the all-to-all. MPI allows the
 * program; an all-to-all that waits without moving the MPI hangs it until the all-to-all's
 * deadline. Every byte of the message and of every all-to-all is checked.
 *
 * A rank that waits longer than the watchdog (WATCHDOG_S, default 60) says where it hangs and
 * exits with status 3, so a hang fails the job rather than its launcher's timeout.
 *
 *   mpi-progress [MESSAGE_BYTES] [BLOCK_BYTES] [ROUNDS]
 *       rank 0 prints "mpi-progress: N ranks, R rounds, all results ok"
 */
#include <mpi.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "watchdog.h"

static unsigned char value(int s, int d, size_t k, int round) { return (unsigned char)(s * 131 + d * 31 + k * 7 + round * 17 + 1); }

static int fail(const char* what, int round) {
  fprintf(stderr, "mpi-progress: rank %d round %d: %s\n", me_world, round, what);
  MPI_Abort(MPI_COMM_WORLD, 2);
  return 2;
}

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int me = 0, n = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &me);
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  const size_t message = argc > 1 ? (size_t)strtoul(argv[1], NULL, 10) : (size_t)8 << 20;
  const size_t block = argc > 2 ? (size_t)strtoul(argv[2], NULL, 10) : 4096;
  const int rounds = argc > 3 ? atoi(argv[3]) : 3;
  start_watchdog("mpi-progress", me);
  if (n < 2) {
    if (me == 0) printf("mpi-progress: needs 2 ranks or more\n");
    MPI_Finalize();
    return 1;
  }
  unsigned char* big = malloc(message);
  unsigned char* out = malloc(block * (size_t)n);
  unsigned char* in = malloc(block * (size_t)n);
  if (big == NULL || out == NULL || in == NULL) return fail("out of memory", -1);
  for (int round = 0; round < rounds; ++round) {
    round_now = round;
    for (int d = 0; d < n; ++d)
      for (size_t k = 0; k < block; ++k) out[(size_t)d * block + k] = value(me, d, k, round);
    memset(in, 0, block * (size_t)n);
    if (me == 0) {
      for (size_t k = 0; k < message; ++k) big[k] = (unsigned char)(k * 13 + (size_t)round);
      MPI_Request send;
      step_now = "MPI_Alltoall with the MPI_Isend to rank 1 pending";
      MPI_Isend(big, (int)message, MPI_BYTE, 1, 7, MPI_COMM_WORLD, &send);
      MPI_Alltoall(out, (int)block, MPI_BYTE, in, (int)block, MPI_BYTE, MPI_COMM_WORLD);
      step_now = "MPI_Wait for the MPI_Isend";
      MPI_Wait(&send, MPI_STATUS_IGNORE);
    } else {
      if (me == 1) {
        step_now = "MPI_Recv of rank 0's message";
        memset(big, 0, message);
        MPI_Recv(big, (int)message, MPI_BYTE, 0, 7, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        for (size_t k = 0; k < message; ++k)
          if (big[k] != (unsigned char)(k * 13 + (size_t)round)) return fail("the message from rank 0 is wrong", round);
      }
      step_now = "MPI_Alltoall";
      MPI_Alltoall(out, (int)block, MPI_BYTE, in, (int)block, MPI_BYTE, MPI_COMM_WORLD);
    }
    for (int s = 0; s < n; ++s)
      for (size_t k = 0; k < block; ++k)
        if (in[(size_t)s * block + k] != value(s, me, k, round)) return fail("an all-to-all block is wrong", round);
  }
  step_now = "MPI_Finalize";
  alarm(0);
  if (me == 0) printf("mpi-progress: %d ranks, %d rounds, all results ok\n", n, rounds);
  free(big);
  free(out);
  free(in);
  MPI_Finalize();
  return 0;
}

/* mpi-finalize: the shortest ordinary MPI program that exchanges and ends: an all-to-all on the
 * world and on two halves, a barrier, MPI_Finalize. No alarm and no exit of its own: the
 * cluster suite requires its job to end by itself with status 0 (Debian's MPICH hung in
 * MPI_Finalize in most such jobs on the emulated cluster; tools/common/mpich_yield.cpp).
 *
 *   mpi-finalize      rank 0 prints "mpi-finalize: N ranks exchanged" before MPI_Finalize
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>

static int exchange(MPI_Comm comm) {
  int me = 0, n = 0, ok = 1;
  MPI_Comm_rank(comm, &me);
  MPI_Comm_size(comm, &n);
  int* send = malloc(sizeof(int) * (size_t)n * 16);
  int* recv = malloc(sizeof(int) * (size_t)n * 16);
  if (send == NULL || recv == NULL) MPI_Abort(MPI_COMM_WORLD, 1);
  for (int i = 0; i < n * 16; ++i) send[i] = me * 100000 + i;
  MPI_Alltoall(send, 16, MPI_INT, recv, 16, MPI_INT, comm);
  for (int s = 0; s < n; ++s)
    for (int k = 0; k < 16; ++k) ok &= recv[s * 16 + k] == s * 100000 + me * 16 + k;
  free(send);
  free(recv);
  return ok;
}

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int me = 0, n = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &me);
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  MPI_Comm half;
  MPI_Comm_split(MPI_COMM_WORLD, me < n / 2, me, &half);
  int ok = exchange(MPI_COMM_WORLD) & exchange(half), all = 0;
  MPI_Comm_free(&half);
  MPI_Allreduce(&ok, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  MPI_Barrier(MPI_COMM_WORLD);
  if (me == 0) {
    printf("mpi-finalize: %d ranks exchanged%s\n", n, all ? "" : ", WRONG values");
    fflush(stdout);
  }
  MPI_Finalize();
  return all ? 0 : 1;
}

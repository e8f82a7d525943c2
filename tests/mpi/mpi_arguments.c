/* mpi-arguments: an erroneous MPI program, as test suites write them (MPICH's errors/coll):
 * with MPI_ERRORS_RETURN, every rank makes the same erroneous all-to-all call, one after
 * another, and each must return the MPI error class that MPI prescribes, on every rank,
 * without hanging:
 *   - send and receive buffers at one address (MPI_Alltoall, MPI_Ialltoall, MPI_Alltoallv,
 *     MPI_Alltoallw): MPI_ERR_BUFFER (MPI 4.0, 2.6.1: no OUT argument may alias another);
 *   - a negative count (MPI_Alltoall, MPI_Alltoallv): MPI_ERR_COUNT;
 *   - MPI_DATATYPE_NULL: MPI_ERR_TYPE;
 *   - MPI_IN_PLACE as the receive buffer: an error (MPICH's class is MPI_ERR_BUFFER, Open
 *     MPI's MPI_ERR_ARG).
 * One buffer whose send and receive blocks lie apart is no alias: that MPI_Alltoallv must
 * deliver. Then the program goes on as one that handled the errors: an MPI_Alltoall of the
 * same size must succeed and deliver every block. Exit status 0 when all of that held. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>

#include "watchdog.h"

enum { kCount = 4096 }; /* ints to each peer: carried at the library's default AAPC_MPI_MIN_BLOCK */

static int all = 1;

/* `rc` was what `call` returned on this rank; every rank must have got an error of `want`
 * (MPI_SUCCESS: any error). */
static void expect(const char* call, int rc, int want, int me) {
  int cls = MPI_SUCCESS;
  if (rc != MPI_SUCCESS) MPI_Error_class(rc, &cls);
  const int mine = rc != MPI_SUCCESS && (want == MPI_SUCCESS || cls == want);
  int every = 0;
  MPI_Allreduce(&mine, &every, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  if (!mine) printf("mpi-arguments: rank %d: %s returned %d (class %d), not class %d\n", me, call, rc, cls, want);
  if (me == 0) printf("mpi-arguments: %s: %s\n", call, every ? "every rank got the error" : "NOT every rank got the error");
  all &= every;
}

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  int me = 0, n = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &me);
  start_watchdog("mpi-arguments", me);
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  int* s = calloc((size_t)n * kCount, sizeof(int));
  int* r = calloc((size_t)n * kCount, sizeof(int));
  int* counts = malloc((size_t)n * sizeof(int));
  int* negative = malloc((size_t)n * sizeof(int));
  int* displs = malloc((size_t)n * sizeof(int));
  MPI_Datatype* types = malloc((size_t)n * sizeof(MPI_Datatype));
  for (int p = 0; p < n; ++p) counts[p] = negative[p] = kCount, displs[p] = p * kCount, types[p] = MPI_INT;
  negative[n - 1] = -1;
  MPI_Request req = MPI_REQUEST_NULL;

  step_now = "the erroneous calls";
  expect("MPI_Alltoall with one buffer for both", MPI_Alltoall(s, kCount, MPI_INT, s, kCount, MPI_INT, MPI_COMM_WORLD), MPI_ERR_BUFFER, me);
  expect("MPI_Ialltoall with one buffer for both", MPI_Ialltoall(s, kCount, MPI_INT, s, kCount, MPI_INT, MPI_COMM_WORLD, &req), MPI_ERR_BUFFER,
         me);
  expect("MPI_Alltoallv with one buffer for both", MPI_Alltoallv(s, counts, displs, MPI_INT, s, counts, displs, MPI_INT, MPI_COMM_WORLD),
         MPI_ERR_BUFFER, me);
  expect("MPI_Alltoallw with one buffer for both", MPI_Alltoallw(s, counts, displs, types, s, counts, displs, types, MPI_COMM_WORLD),
         MPI_ERR_BUFFER, me);
  expect("MPI_Alltoall with a negative count", MPI_Alltoall(s, -kCount, MPI_INT, r, -kCount, MPI_INT, MPI_COMM_WORLD), MPI_ERR_COUNT, me);
  expect("MPI_Alltoallv with a negative count", MPI_Alltoallv(s, negative, displs, MPI_INT, r, negative, displs, MPI_INT, MPI_COMM_WORLD),
         MPI_ERR_COUNT, me);
  expect("MPI_Alltoall of MPI_DATATYPE_NULL",
         MPI_Alltoall(s, kCount, MPI_DATATYPE_NULL, r, kCount, MPI_DATATYPE_NULL, MPI_COMM_WORLD), MPI_ERR_TYPE, me);
  expect("MPI_Alltoall into MPI_IN_PLACE", MPI_Alltoall(s, kCount, MPI_INT, MPI_IN_PLACE, kCount, MPI_INT, MPI_COMM_WORLD), MPI_SUCCESS, me);

  /* Not erroneous: one buffer, the received blocks after the sent ones (count arrays of
   * their own, as MPICH asks). It must go on, and deliver. */
  step_now = "one buffer, blocks apart";
  int* both = malloc((size_t)n * kCount * 2 * sizeof(int));
  int* rcounts = malloc((size_t)n * sizeof(int));
  int* rdispls = malloc((size_t)n * sizeof(int));
  for (int p = 0; p < n; ++p) {
    rcounts[p] = kCount, rdispls[p] = (n + p) * kCount;
    for (int k = 0; k < kCount; ++k) both[p * kCount + k] = (me * n + p) * kCount + k, both[(n + p) * kCount + k] = -1;
  }
  int apart = MPI_Alltoallv(both, counts, displs, MPI_INT, both, rcounts, rdispls, MPI_INT, MPI_COMM_WORLD) == MPI_SUCCESS;
  for (int from = 0; from < n && apart; ++from)
    for (int k = 0; k < kCount; ++k) apart &= both[(n + from) * kCount + k] == (from * n + me) * kCount + k;
  int every_apart = 0;
  MPI_Allreduce(&apart, &every_apart, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  if (me == 0)
    printf("mpi-arguments: MPI_Alltoallv within one buffer, blocks apart: %s\n", every_apart ? "every rank got its blocks" : "NOT every rank got its blocks");
  all &= every_apart;
  free(both), free(rcounts), free(rdispls);

  step_now = "the all-to-all after them";
  for (int d = 0; d < n; ++d)
    for (int k = 0; k < kCount; ++k) s[d * kCount + k] = (me * n + d) * kCount + k;
  const int rc = MPI_Alltoall(s, kCount, MPI_INT, r, kCount, MPI_INT, MPI_COMM_WORLD);
  int right = rc == MPI_SUCCESS;
  for (int from = 0; from < n && right; ++from)
    for (int k = 0; k < kCount; ++k) right &= r[from * kCount + k] == (from * n + me) * kCount + k;
  int every = 0;
  MPI_Allreduce(&right, &every, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  if (me == 0) printf("mpi-arguments: after the errors, an MPI_Alltoall: %s\n", every ? "every rank got its blocks" : "NOT every rank got its blocks");
  all &= every;
  free(s), free(r), free(counts), free(negative), free(displs), free(types);
  MPI_Finalize();
  return all ? 0 : 1;
}

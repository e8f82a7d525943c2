/* mpi-error: an ordinary MPI program that asks for errors to be returned (MPI_ERRORS_RETURN)
 * and reports what MPI_Alltoall, MPI_Wait of an MPI_Ialltoall, and MPI_Waitall and
 * MPI_Waitsome of another with a receive returned on every rank.
 * Run with a libaapc-mpi setting that makes the exchange fail
 * (AAPC_MPI_SCHEDULE=no-such-schedule), every rank must get an MPI error whose
 * MPI_Error_string is aapc's message, and none may hang. `mpi-error mismatch` is an erroneous
 * program instead: rank 1 sends twice the count of the others in one MPI_Ialltoall.
 * `mpi-error mixed` is another: rank 1 calls MPI_Ialltoallv where the others call
 * MPI_Ialltoall. In both, rank 2 (rank 1's machine at 3 ranks a machine) calls a second late:
 * a leader that finds the error at once must still tell rank 2 the outcome of its own call.
 * Without `mismatch`, the program then goes on as one that handled the error: it drops the
 * setting (libaapc-mpi reads it at each call) and its next 40 MPI_Alltoalls must all succeed
 * and deliver, more calls than a rank keeps hand-over slots for (32): a slot whose earlier
 * call failed must not pass that failure on to a later one.
 * Exit status 0 when every rank got such an error, and then the later calls' blocks. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  int me = 0, n = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &me);
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  const int mismatch = argc > 1 && strcmp(argv[1], "mismatch") == 0;
  const int mixed = argc > 1 && strcmp(argv[1], "mixed") == 0;
  const int erroneous = mismatch || mixed;
  const int count = mismatch && me == 1 ? 128 : 64;
  int* counts = malloc((size_t)n * sizeof(int));
  int* displs = malloc((size_t)n * sizeof(int));
  for (int d = 0; d < n; ++d) counts[d] = 64, displs[d] = 64 * d;
  int* s = calloc((size_t)n, sizeof(int) * 128);
  int* r = calloc((size_t)n, sizeof(int) * 128);
  int all = 1;
  /* 0: MPI_Alltoall; 1: MPI_Wait of an MPI_Ialltoall; 2: MPI_Waitall of a receive and one,
   * 3: MPI_Waitsome of them until both are in. Those two must return MPI_ERR_IN_STATUS with
   * the error in the all-to-all's status and MPI_SUCCESS in the receive's (MPI 4.0, 3.7.5). */
  const char* calls[] = {"MPI_Alltoall", "MPI_Wait of MPI_Ialltoall", "MPI_Waitall of MPI_Ialltoall and a receive",
                         "MPI_Waitsome of MPI_Ialltoall and a receive"};
  for (int how = erroneous; how < (erroneous ? 2 : 4); ++how) {
    const char* call = calls[how];
    int rc = MPI_SUCCESS, in_status = how < 2;
    if (how > 0) {
      MPI_Request req[2];
      if (erroneous && me == 2) sleep(1);
      if (mixed && me == 1)
        rc = MPI_Ialltoallv(s, counts, displs, MPI_INT, r, counts, displs, MPI_INT, MPI_COMM_WORLD, &req[0]);
      else
        rc = MPI_Ialltoall(s, count, MPI_INT, r, count, MPI_INT, MPI_COMM_WORLD, &req[0]);
      if (rc == MPI_SUCCESS && how == 1) rc = MPI_Wait(&req[0], MPI_STATUS_IGNORE);
      int none = 0;
      if (rc == MPI_SUCCESS && how >= 2) rc = MPI_Irecv(&none, 0, MPI_INT, MPI_PROC_NULL, 0, MPI_COMM_WORLD, &req[1]);
      if (rc == MPI_SUCCESS && how >= 2) {
        MPI_Status st[2];
        int failed = MPI_SUCCESS, received = 0, out = 0, at[2];
        for (int left = 2, tries = 0; left > 0 && tries < 2; ++tries) { /* Waitall: one call */
          rc = how == 2 ? MPI_Waitall(2, req, st) : MPI_Waitsome(2, req, &out, at, st);
          if (how == 2) out = 2, at[0] = 0, at[1] = 1;
          if (rc != MPI_ERR_IN_STATUS && rc != MPI_SUCCESS) break;
          for (int k = 0; k < out; ++k, --left) {
            const int e = rc == MPI_ERR_IN_STATUS ? st[k].MPI_ERROR : MPI_SUCCESS;
            if (at[k] == 0) failed = e;
            else received = e == MPI_SUCCESS;
          }
        }
        if (failed != MPI_SUCCESS) in_status = received, rc = failed;
        else printf("mpi-error: rank %d: %s returned %d, not MPI_ERR_IN_STATUS\n", me, how == 2 ? "MPI_Waitall" : "MPI_Waitsome", rc);
      }
    } else {
      rc = MPI_Alltoall(s, 64, MPI_INT, r, 64, MPI_INT, MPI_COMM_WORLD);
    }
    char text[MPI_MAX_ERROR_STRING] = "";
    int len = 0;
    if (rc != MPI_SUCCESS) MPI_Error_string(rc, text, &len);
    int mine = in_status && rc != MPI_SUCCESS && strstr(text, "aapc") != NULL, every = 0;
    /* The error handler left MPI usable: the other ranks can still be asked. */
    MPI_Allreduce(&mine, &every, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    printf("mpi-error: rank %d: %s returned %d: %s\n", me, call, rc, rc == MPI_SUCCESS ? "success" : text);
    if (me == 0) printf("mpi-error: %s: %s\n", call, every ? "every rank got aapc's error" : "NOT every rank got aapc's error");
    all &= every;
  }
  if (!erroneous) {
    unsetenv("AAPC_MPI_SCHEDULE");
    int mine = 1, every = 0;
    for (int call = 0; call < 40; ++call) {
      for (int d = 0; d < n; ++d)
        for (int k = 0; k < 64; ++k) s[d * 64 + k] = (me * n + d) * 1000 + call * 64 + k;
      const int rc = MPI_Alltoall(s, 64, MPI_INT, r, 64, MPI_INT, MPI_COMM_WORLD);
      int right = rc == MPI_SUCCESS;
      for (int from = 0; from < n && right; ++from)
        for (int k = 0; k < 64; ++k) right &= r[from * 64 + k] == (from * n + me) * 1000 + call * 64 + k;
      if (!right) printf("mpi-error: rank %d: call %d after the errors returned %d%s\n", me, call, rc, rc == MPI_SUCCESS ? " with wrong blocks" : "");
      mine &= right;
    }
    MPI_Allreduce(&mine, &every, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    if (me == 0) printf("mpi-error: after the errors, 40 all-to-alls: %s\n", every ? "every rank got its blocks" : "NOT every rank got its blocks");
    all &= every;
  }
  free(s), free(r), free(counts), free(displs);
  MPI_Finalize();
  return all ? 0 : 1;
}

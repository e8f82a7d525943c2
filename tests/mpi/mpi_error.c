/* mpi-error: an ordinary MPI program that asks for errors to be returned (MPI_ERRORS_RETURN)
 * and reports what MPI_Alltoall, and MPI_Wait of an MPI_Ialltoall, returned on every rank.
 * Run with a libaapc-mpi setting that makes the exchange fail
 * (AAPC_MPI_SCHEDULE=no-such-schedule), every rank must get an MPI error whose
 * MPI_Error_string is aapc's message, and none may hang. `mpi-error mismatch` is an erroneous
 * program instead: rank 1 sends twice the count of the others in one MPI_Ialltoall.
 * Exit status 0 when every rank got such an error. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  int me = 0, n = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &me);
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  const int mismatch = argc > 1 && strcmp(argv[1], "mismatch") == 0;
  const int count = mismatch && me == 1 ? 128 : 64;
  int* s = calloc((size_t)n, sizeof(int) * 128);
  int* r = calloc((size_t)n, sizeof(int) * 128);
  int all = 1;
  for (int nonblocking = mismatch; nonblocking < 2; ++nonblocking) {
    const char* call = nonblocking ? "MPI_Wait of MPI_Ialltoall" : "MPI_Alltoall";
    int rc = MPI_SUCCESS;
    if (nonblocking) {
      MPI_Request req;
      rc = MPI_Ialltoall(s, count, MPI_INT, r, count, MPI_INT, MPI_COMM_WORLD, &req);
      if (rc == MPI_SUCCESS) rc = MPI_Wait(&req, MPI_STATUS_IGNORE);
    } else {
      rc = MPI_Alltoall(s, 64, MPI_INT, r, 64, MPI_INT, MPI_COMM_WORLD);
    }
    char text[MPI_MAX_ERROR_STRING] = "";
    int len = 0;
    if (rc != MPI_SUCCESS) MPI_Error_string(rc, text, &len);
    int mine = rc != MPI_SUCCESS && strstr(text, "aapc") != NULL, every = 0;
    /* The error handler left MPI usable: the other ranks can still be asked. */
    MPI_Allreduce(&mine, &every, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    printf("mpi-error: rank %d: %s returned %d: %s\n", me, call, rc, rc == MPI_SUCCESS ? "success" : text);
    if (me == 0) printf("mpi-error: %s: %s\n", call, every ? "every rank got aapc's error" : "NOT every rank got aapc's error");
    all &= every;
  }
  free(s), free(r);
  MPI_Finalize();
  return all ? 0 : 1;
}

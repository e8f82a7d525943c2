// The MPI completion calls that libaapc-mpi takes over, so that they drive the process's
// nonblocking all-to-alls (requests.cpp). Each behaves as its PMPI_* does. Not installed.
#pragma once

#include <mpi.h>

namespace aapc::mpi {

int wait(MPI_Request* req, MPI_Status* status);
int waitall(int count, MPI_Request* reqs, MPI_Status* statuses);
int waitany(int count, MPI_Request* reqs, int* index, MPI_Status* status);
int waitsome(int count, MPI_Request* reqs, int* outcount, int* indices, MPI_Status* statuses);
int test(MPI_Request* req, int* flag, MPI_Status* status);
int testall(int count, MPI_Request* reqs, int* flag, MPI_Status* statuses);
int testany(int count, MPI_Request* reqs, int* index, int* flag, MPI_Status* status);
int testsome(int count, MPI_Request* reqs, int* outcount, int* indices, MPI_Status* statuses);
int request_get_status(MPI_Request req, int* flag, MPI_Status* status);

}  // namespace aapc::mpi

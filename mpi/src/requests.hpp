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

// The blocking point-to-point calls. MPICH has no progress hook: while a nonblocking
// all-to-all waits for a step that only the library's calls make (its plan, its agreement, a
// hand-over through the MPI), each runs as its nonblocking form completed by wait() above,
// which moves it, as MPI's progress rule asks. Else, and always with Open MPI (whose progress
// loop moves it), the MPI's own.
int recv(void* buf, int count, MPI_Datatype type, int source, int tag, MPI_Comm comm, MPI_Status* status);
int send(const void* buf, int count, MPI_Datatype type, int dest, int tag, MPI_Comm comm, bool synchronous);
int sendrecv(const void* sbuf, int scount, MPI_Datatype stype, int dest, int stag, void* rbuf, int rcount, MPI_Datatype rtype, int source,
             int rtag, MPI_Comm comm, MPI_Status* status);
int probe(int source, int tag, MPI_Comm comm, MPI_Status* status);

}  // namespace aapc::mpi

// MPI-4's persistent all-to-alls, through libaapc-mpi's nonblocking ones (persistent.cpp).
// Not installed.
#pragma once

#include <mpi.h>

#include <utility>
#include <vector>

namespace aapc::mpi {

// MPI_Alltoall_init, MPI_Alltoallv_init and MPI_Alltoallw_init (Open MPI: MPIX_*): `*request` stands for the
// persistent call until MPI_Request_free. The plan of `comm` is started here.
int alltoall_init(const void* sbuf, int scount, MPI_Datatype stype, void* rbuf, int rcount, MPI_Datatype rtype, MPI_Comm comm,
                  MPI_Request* request);
int alltoallv_init(const void* sbuf, const int* scounts, const int* sdispls, MPI_Datatype stype, void* rbuf, const int* rcounts,
                   const int* rdispls, MPI_Datatype rtype, MPI_Comm comm, MPI_Request* request);
int alltoallw_init(const void* sbuf, const int* scounts, const int* sdispls, const MPI_Datatype* stypes, void* rbuf, const int* rcounts,
                   const int* rdispls, const MPI_Datatype* rtypes, MPI_Comm comm, MPI_Request* request);

// MPI_Start, MPI_Startall and MPI_Request_free: a persistent all-to-all's here, any other
// request's the MPI's own.
int start(MPI_Request* request);
int startall(int count, MPI_Request* requests);
int request_free(MPI_Request* request);

// For the lifetime of a completion call: each started persistent all-to-all among `reqs` is
// replaced by its running start's request, and put back after; a start that completed leaves
// its handle inactive.
class StandIns {
 public:
  StandIns(int count, MPI_Request* reqs);
  ~StandIns();
  StandIns(const StandIns&) = delete;
  StandIns& operator=(const StandIns&) = delete;

 private:
  MPI_Request* reqs_;
  std::vector<std::pair<int, MPI_Request>> swapped_;
};

}  // namespace aapc::mpi

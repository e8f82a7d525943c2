// An all-to-all's arguments, judged on the calling rank before anything is planned or sent
// (plan.hpp, Arguments). Others' test suites pass erroneous calls on purpose, with
// MPI_ERRORS_RETURN, and expect the MPI's error back (MPICH's errors/coll tests).
#include <cstdio>

#include "plan.hpp"

namespace aapc::mpi {

int peers_of(MPI_Comm comm) {
  int inter = 0, n = 0;
  PMPI_Comm_test_inter(comm, &inter);
  if (inter != 0) PMPI_Comm_remote_size(comm, &n);
  else PMPI_Comm_size(comm, &n);
  return n;
}

Arguments::Arguments(MPI_Comm comm, const void* sbuf, const void* rbuf)
    : comm_(comm), sbuf_(sbuf), rbuf_(rbuf), for_the_mpi_(comm == MPI_COMM_NULL || rbuf == MPI_IN_PLACE) {}

Arguments::Shape Arguments::shape(MPI_Datatype type) {
  Shape s;
  if (type == MPI_DATATYPE_NULL) return s;
  MPI_Count size = 0;
  PMPI_Type_size_x(type, &size);
  PMPI_Type_get_extent(type, &s.lb, &s.extent);
  s.size = static_cast<std::uint64_t>(size);
  return s;
}

Arguments::Block Arguments::block(int count, MPI_Datatype type, const Shape& of, std::int64_t at) {
  if (count < 0 || (count > 0 && type == MPI_DATATYPE_NULL)) for_the_mpi_ = true;
  if (for_the_mpi_ || count == 0) return {};
  return {static_cast<std::uint64_t>(count) * of.size, at + of.lb};
}

void Arguments::add(bool send, int count, MPI_Datatype type) {
  if (!(send && sbuf_ == MPI_IN_PLACE)) (send ? sends_ : recvs_).push_back(block(count, type, shape(type), 0));
}

void Arguments::add(bool send, const int* counts, const int* displs, MPI_Datatype type) { blocks(send, counts, displs, type, nullptr); }
void Arguments::add(bool send, const int* counts, const int* displs, const MPI_Datatype* types) {
  if (types == nullptr && !(send && sbuf_ == MPI_IN_PLACE)) for_the_mpi_ = true;
  blocks(send, counts, displs, MPI_DATATYPE_NULL, types);
}

void Arguments::blocks(bool send, const int* counts, const int* displs, MPI_Datatype type, const MPI_Datatype* types) {
  if ((send && sbuf_ == MPI_IN_PLACE) || for_the_mpi_) return;  // a null communicator has no peers to count
  if (counts == nullptr || displs == nullptr) {
    for_the_mpi_ = true;
    return;
  }
  const int n = peers_of(comm_);
  auto& side = send ? sends_ : recvs_;
  const Shape all = types == nullptr ? shape(type) : Shape{};  // one datatype: displacements in its extents
  for (int p = 0; p < n && !for_the_mpi_; ++p) {
    if (types == nullptr) side.push_back(block(counts[p], type, all, static_cast<std::int64_t>(displs[p]) * all.extent));
    else side.push_back(block(counts[p], types[p], shape(types[p]), displs[p]));
  }
}

std::optional<int> Arguments::verdict(const char* call, const std::function<int()>& mpis_own) const {
  if (for_the_mpi_) return mpis_own();
  // MPI 4.0, 2.6.1: no OUT argument may alias another. A rank whose bytes to a peer and from it
  // would start at one address has its call refused here, as MPICH refuses it (MPI_ERR_BUFFER);
  // neither aapc nor Open MPI's own would say so, and would overwrite blocks before sending
  // them. One buffer whose send and receive blocks lie apart goes on, as both MPIs let it.
  // MPI_BOTTOM (types of absolute addresses) is no alias.
  if (sbuf_ != rbuf_ || sbuf_ == MPI_BOTTOM) return std::nullopt;
  for (std::size_t p = 0; p < sends_.size() && p < recvs_.size(); ++p)
    if (sends_[p].bytes > 0 && recvs_[p].bytes > 0 && sends_[p].at == recvs_[p].at) {
      std::fprintf(stderr, "aapc-mpi: %s: the send and receive buffers are one address; pass MPI_IN_PLACE as the send buffer instead\n", call);
      PMPI_Comm_call_errhandler(comm_, MPI_ERR_BUFFER);
      return MPI_ERR_BUFFER;
    }
  return std::nullopt;
}

}  // namespace aapc::mpi

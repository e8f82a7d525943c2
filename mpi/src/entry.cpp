// What libaapc-mpi-<mpi>.so exports to libaapc-mpi.so (dispatch.cpp): the entry points with
// every MPI handle as a machine word, because the dispatcher is built without an mpi.h. Open
// MPI's handles are pointers, MPICH's are ints; either fits in a word, in the same register.
#include <cstdint>
#include <type_traits>

#include "plan.hpp"

namespace {

using Word = std::uintptr_t;

template <typename Handle>
Handle handle(Word w) {
  if constexpr (std::is_pointer_v<Handle>)
    return reinterpret_cast<Handle>(w);
  else
    return static_cast<Handle>(static_cast<std::uint32_t>(w));
}

}  // namespace

extern "C" {

__attribute__((visibility("default"))) int aapc_mpi_init(int* argc, char*** argv) {
  const int rc = PMPI_Init(argc, argv);
  if (rc == MPI_SUCCESS) aapc::mpi::on_init();
  return rc;
}

__attribute__((visibility("default"))) int aapc_mpi_init_thread(int* argc, char*** argv, int required, int* provided) {
  const int rc = PMPI_Init_thread(argc, argv, required, provided);
  if (rc == MPI_SUCCESS) aapc::mpi::on_init();
  return rc;
}

__attribute__((visibility("default"))) int aapc_mpi_alltoall(const void* sbuf, int scount, Word stype, void* rbuf, int rcount, Word rtype,
                                                             Word comm) {
  return aapc::mpi::alltoall(sbuf, scount, handle<MPI_Datatype>(stype), rbuf, rcount, handle<MPI_Datatype>(rtype), handle<MPI_Comm>(comm));
}

__attribute__((visibility("default"))) int aapc_mpi_alltoallv(const void* sbuf, const int* scounts, const int* sdispls, Word stype, void* rbuf,
                                                              const int* rcounts, const int* rdispls, Word rtype, Word comm) {
  return aapc::mpi::alltoallv(sbuf, scounts, sdispls, handle<MPI_Datatype>(stype), rbuf, rcounts, rdispls, handle<MPI_Datatype>(rtype),
                              handle<MPI_Comm>(comm));
}

}  // extern "C"

// What libaapc-mpi-<mpi>.so exports to libaapc-mpi.so (dispatch.cpp): the entry points with
// every MPI handle as a machine word, because the dispatcher is built without an mpi.h. Open
// MPI's handles are pointers, MPICH's are ints; either fits in a word, in the same register.
#include <dlfcn.h>

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

// Open MPI's Fortran MPI_IN_PLACE is the address of one of these common blocks.
const void* fortran_buffer(const void* buf) {
  for (const char* name : {"mpi_fortran_in_place_", "mpi_fortran_in_place", "mpi_fortran_in_place__", "MPI_FORTRAN_IN_PLACE"})
    if (void* sentinel = dlsym(RTLD_DEFAULT, name); sentinel != nullptr && sentinel == buf) return MPI_IN_PLACE;
  return buf;
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

// Fortran, for Open MPI (dispatch.cpp): handles converted, its MPI_IN_PLACE recognised.
__attribute__((visibility("default"))) void aapc_mpi_f_alltoall(const void* sbuf, const MPI_Fint* scount, const MPI_Fint* stype, void* rbuf,
                                                                const MPI_Fint* rcount, const MPI_Fint* rtype, const MPI_Fint* comm, MPI_Fint* ierr) {
  *ierr = aapc::mpi::alltoall(fortran_buffer(sbuf), *scount, PMPI_Type_f2c(*stype), rbuf, *rcount, PMPI_Type_f2c(*rtype), PMPI_Comm_f2c(*comm));
}

__attribute__((visibility("default"))) void aapc_mpi_f_alltoallv(const void* sbuf, const MPI_Fint* scounts, const MPI_Fint* sdispls,
                                                                 const MPI_Fint* stype, void* rbuf, const MPI_Fint* rcounts, const MPI_Fint* rdispls,
                                                                 const MPI_Fint* rtype, const MPI_Fint* comm, MPI_Fint* ierr) {
  *ierr = aapc::mpi::alltoallv(fortran_buffer(sbuf), scounts, sdispls, PMPI_Type_f2c(*stype), rbuf, rcounts, rdispls, PMPI_Type_f2c(*rtype),
                               PMPI_Comm_f2c(*comm));
}

}  // extern "C"

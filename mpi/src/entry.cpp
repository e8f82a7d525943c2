// What libaapc-mpi-<mpi>.so exports to libaapc-mpi.so (dispatch.cpp): the entry points with
// every MPI handle as a machine word, because the dispatcher is built without an mpi.h. Open
// MPI's handles are pointers, MPICH's are ints; either fits in a word, in the same register.
#include <dlfcn.h>

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

#include "persistent.hpp"
#include "plan.hpp"
#include "requests.hpp"

namespace {

using Word = std::uintptr_t;

template <typename Handle>
Handle handle(Word w) {
  if constexpr (std::is_pointer_v<Handle>)
    return reinterpret_cast<Handle>(w);
  else
    return static_cast<Handle>(static_cast<std::uint32_t>(w));
}

// Open MPI's Fortran MPI_BOTTOM and MPI_IN_PLACE are the addresses of common blocks: those
// named `stem`, with each compiler's decorations (Open MPI defines them all).
std::vector<const void*> common_blocks(const std::string& stem) {
  std::string upper = stem;
  for (char& ch : upper) ch = static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
  std::vector<const void*> found;
  for (const std::string& name : {stem + "_", stem, stem + "__", upper})
    if (void* block = dlsym(RTLD_DEFAULT, name.c_str()); block != nullptr) found.push_back(block);
  return found;
}

// `buf` as C has it: MPI_BOTTOM, MPI_IN_PLACE where it may stand (`send`: a send buffer), or
// itself. Looked up at the first Fortran call, when the Fortran library is loaded.
void* fortran_buffer(const void* buf, bool send) {
  static const std::vector<const void*> bottom = common_blocks("mpi_fortran_bottom");
  static const std::vector<const void*> in_place = common_blocks("mpi_fortran_in_place");
  auto among = [buf](const std::vector<const void*>& v) { return buf != nullptr && std::find(v.begin(), v.end(), buf) != v.end(); };
  if (among(bottom)) return MPI_BOTTOM;
  if (send && among(in_place)) return MPI_IN_PLACE;
  return const_cast<void*>(buf);
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

__attribute__((visibility("default"))) int aapc_mpi_ialltoall(const void* sbuf, int scount, Word stype, void* rbuf, int rcount, Word rtype,
                                                              Word comm, MPI_Request* request) {
  return aapc::mpi::alltoall(sbuf, scount, handle<MPI_Datatype>(stype), rbuf, rcount, handle<MPI_Datatype>(rtype), handle<MPI_Comm>(comm),
                             request);
}

__attribute__((visibility("default"))) int aapc_mpi_ialltoallv(const void* sbuf, const int* scounts, const int* sdispls, Word stype, void* rbuf,
                                                               const int* rcounts, const int* rdispls, Word rtype, Word comm, MPI_Request* request) {
  return aapc::mpi::alltoallv(sbuf, scounts, sdispls, handle<MPI_Datatype>(stype), rbuf, rcounts, rdispls, handle<MPI_Datatype>(rtype),
                              handle<MPI_Comm>(comm), request);
}

// MPI_Alltoallw and MPI_Ialltoallw (alltoallw.cpp): the datatypes by address, an array of the MPI's handles.
__attribute__((visibility("default"))) int aapc_mpi_alltoallw(const void* sbuf, const int* scounts, const int* sdispls, const MPI_Datatype* stypes,
                                                              void* rbuf, const int* rcounts, const int* rdispls, const MPI_Datatype* rtypes, Word comm) {
  return aapc::mpi::alltoallw(sbuf, scounts, sdispls, stypes, rbuf, rcounts, rdispls, rtypes, handle<MPI_Comm>(comm));
}

__attribute__((visibility("default"))) int aapc_mpi_ialltoallw(const void* sbuf, const int* scounts, const int* sdispls, const MPI_Datatype* stypes,
                                                               void* rbuf, const int* rcounts, const int* rdispls, const MPI_Datatype* rtypes,
                                                               Word comm, MPI_Request* request) {
  return aapc::mpi::alltoallw(sbuf, scounts, sdispls, stypes, rbuf, rcounts, rdispls, rtypes, handle<MPI_Comm>(comm), request);
}

// MPI-4's persistent all-to-alls (persistent.cpp): MPI_Alltoall(v,w)_init, Open MPI's MPIX_*
// alike (the info is not used), and the calls that start and free them.
__attribute__((visibility("default"))) int aapc_mpi_alltoall_init(const void* sbuf, int scount, Word stype, void* rbuf, int rcount, Word rtype,
                                                                  Word comm, Word, MPI_Request* request) {
  return aapc::mpi::alltoall_init(sbuf, scount, handle<MPI_Datatype>(stype), rbuf, rcount, handle<MPI_Datatype>(rtype), handle<MPI_Comm>(comm),
                                  request);
}

__attribute__((visibility("default"))) int aapc_mpi_alltoallv_init(const void* sbuf, const int* scounts, const int* sdispls, Word stype, void* rbuf,
                                                                   const int* rcounts, const int* rdispls, Word rtype, Word comm, Word,
                                                                   MPI_Request* request) {
  return aapc::mpi::alltoallv_init(sbuf, scounts, sdispls, handle<MPI_Datatype>(stype), rbuf, rcounts, rdispls, handle<MPI_Datatype>(rtype),
                                   handle<MPI_Comm>(comm), request);
}

__attribute__((visibility("default"))) int aapc_mpi_alltoallw_init(const void* sbuf, const int* scounts, const int* sdispls,
                                                                   const MPI_Datatype* stypes, void* rbuf, const int* rcounts, const int* rdispls,
                                                                   const MPI_Datatype* rtypes, Word comm, Word, MPI_Request* request) {
  return aapc::mpi::alltoallw_init(sbuf, scounts, sdispls, stypes, rbuf, rcounts, rdispls, rtypes, handle<MPI_Comm>(comm), request);
}

__attribute__((visibility("default"))) int aapc_mpi_start(MPI_Request* request) { return aapc::mpi::start(request); }
__attribute__((visibility("default"))) int aapc_mpi_startall(int count, MPI_Request* requests) { return aapc::mpi::startall(count, requests); }
__attribute__((visibility("default"))) int aapc_mpi_request_free(MPI_Request* request) { return aapc::mpi::request_free(request); }

// The completion calls, which drive the nonblocking all-to-alls (requests.cpp).
__attribute__((visibility("default"))) int aapc_mpi_wait(MPI_Request* req, MPI_Status* status) { return aapc::mpi::wait(req, status); }
__attribute__((visibility("default"))) int aapc_mpi_waitall(int count, MPI_Request* reqs, MPI_Status* statuses) {
  return aapc::mpi::waitall(count, reqs, statuses);
}
__attribute__((visibility("default"))) int aapc_mpi_waitany(int count, MPI_Request* reqs, int* index, MPI_Status* status) {
  return aapc::mpi::waitany(count, reqs, index, status);
}
__attribute__((visibility("default"))) int aapc_mpi_waitsome(int count, MPI_Request* reqs, int* outcount, int* indices, MPI_Status* statuses) {
  return aapc::mpi::waitsome(count, reqs, outcount, indices, statuses);
}
__attribute__((visibility("default"))) int aapc_mpi_test(MPI_Request* req, int* flag, MPI_Status* status) {
  return aapc::mpi::test(req, flag, status);
}
__attribute__((visibility("default"))) int aapc_mpi_testall(int count, MPI_Request* reqs, int* flag, MPI_Status* statuses) {
  return aapc::mpi::testall(count, reqs, flag, statuses);
}
__attribute__((visibility("default"))) int aapc_mpi_testany(int count, MPI_Request* reqs, int* index, int* flag, MPI_Status* status) {
  return aapc::mpi::testany(count, reqs, index, flag, status);
}
__attribute__((visibility("default"))) int aapc_mpi_testsome(int count, MPI_Request* reqs, int* outcount, int* indices, MPI_Status* statuses) {
  return aapc::mpi::testsome(count, reqs, outcount, indices, statuses);
}

__attribute__((visibility("default"))) int aapc_mpi_request_get_status(Word req, int* flag, MPI_Status* status) {
  return aapc::mpi::request_get_status(handle<MPI_Request>(req), flag, status);
}

// The blocking point-to-point calls (requests.cpp): the MPI's own unless an all-to-all needs
// them to move it.
__attribute__((visibility("default"))) int aapc_mpi_recv(void* buf, int count, Word type, int source, int tag, Word comm, MPI_Status* status) {
  return aapc::mpi::recv(buf, count, handle<MPI_Datatype>(type), source, tag, handle<MPI_Comm>(comm), status);
}
__attribute__((visibility("default"))) int aapc_mpi_send(const void* buf, int count, Word type, int dest, int tag, Word comm) {
  return aapc::mpi::send(buf, count, handle<MPI_Datatype>(type), dest, tag, handle<MPI_Comm>(comm), false);
}
__attribute__((visibility("default"))) int aapc_mpi_ssend(const void* buf, int count, Word type, int dest, int tag, Word comm) {
  return aapc::mpi::send(buf, count, handle<MPI_Datatype>(type), dest, tag, handle<MPI_Comm>(comm), true);
}
__attribute__((visibility("default"))) int aapc_mpi_sendrecv(const void* sbuf, int scount, Word stype, int dest, int stag, void* rbuf, int rcount,
                                                             Word rtype, int source, int rtag, Word comm, MPI_Status* status) {
  return aapc::mpi::sendrecv(sbuf, scount, handle<MPI_Datatype>(stype), dest, stag, rbuf, rcount, handle<MPI_Datatype>(rtype), source, rtag,
                             handle<MPI_Comm>(comm), status);
}
__attribute__((visibility("default"))) int aapc_mpi_probe(int source, int tag, Word comm, MPI_Status* status) {
  return aapc::mpi::probe(source, tag, handle<MPI_Comm>(comm), status);
}

// Before the program's other collectives on `comm` (dispatch.cpp's guarded calls): a plan's
// duplication of `comm` in flight is waited for with Open MPI (plan.hpp, settle_duplicate).
__attribute__((visibility("default"))) void aapc_mpi_before_collective(Word comm) { aapc::mpi::settle_duplicate(handle<MPI_Comm>(comm)); }

// Fortran, for Open MPI (dispatch.cpp): handles converted, its MPI_IN_PLACE and MPI_BOTTOM
// recognised.
__attribute__((visibility("default"))) void aapc_mpi_f_alltoall(const void* sbuf, const MPI_Fint* scount, const MPI_Fint* stype, void* rbuf,
                                                                const MPI_Fint* rcount, const MPI_Fint* rtype, const MPI_Fint* comm, MPI_Fint* ierr) {
  *ierr = aapc::mpi::alltoall(fortran_buffer(sbuf, true), *scount, PMPI_Type_f2c(*stype), fortran_buffer(rbuf, false), *rcount,
                              PMPI_Type_f2c(*rtype), PMPI_Comm_f2c(*comm));
}

__attribute__((visibility("default"))) void aapc_mpi_f_alltoallv(const void* sbuf, const MPI_Fint* scounts, const MPI_Fint* sdispls,
                                                                 const MPI_Fint* stype, void* rbuf, const MPI_Fint* rcounts, const MPI_Fint* rdispls,
                                                                 const MPI_Fint* rtype, const MPI_Fint* comm, MPI_Fint* ierr) {
  *ierr = aapc::mpi::alltoallv(fortran_buffer(sbuf, true), scounts, sdispls, PMPI_Type_f2c(*stype), fortran_buffer(rbuf, false), rcounts,
                               rdispls, PMPI_Type_f2c(*rtype), PMPI_Comm_f2c(*comm));
}

}  // extern "C"

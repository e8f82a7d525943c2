// MPI_Alltoallw: one datatype per peer on each side (FFT and PETSc transposes use it). The
// blocks are packed one after another in peer order (MPI_Pack), carried as a byte
// MPI_Alltoallv, decided as every all-to-all of the communicator is (plan.cpp: through aapc
// or the MPI's own, the same on every rank), and unpacked into place (MPI_Unpack): the
// packing that derived datatypes get in datatypes.cpp, per peer.
#include <cstdint>
#include <limits>
#include <vector>

#include "plan.hpp"

namespace aapc::mpi {

namespace {

// Bytes of `count` elements of `type`, as MPI_Pack writes them on one machine (its size).
std::int64_t bytes_of(int count, MPI_Datatype type) {
  MPI_Count size = 0;
  PMPI_Type_size_x(type, &size);
  return static_cast<std::int64_t>(count) * static_cast<std::int64_t>(size);
}

// Offsets of consecutive blocks of `lengths`; false where they pass an int (alltoallv's).
bool prefix(const std::vector<int>& lengths, std::vector<int>& at, int& total) {
  std::int64_t sum = 0;
  at.resize(lengths.size());
  for (std::size_t i = 0; i < lengths.size(); ++i) at[i] = static_cast<int>(sum), sum += lengths[i];
  total = static_cast<int>(sum);
  return sum <= std::numeric_limits<int>::max();
}

}  // namespace

int alltoallw(const void* sbuf, const int* scounts, const int* sdispls, const MPI_Datatype* stypes, void* rbuf, const int* rcounts,
              const int* rdispls, const MPI_Datatype* rtypes, MPI_Comm comm) {
  int inter = 0, n = 0;
  PMPI_Comm_test_inter(comm, &inter);
  if (inter != 0) return PMPI_Alltoallw(sbuf, scounts, sdispls, stypes, rbuf, rcounts, rdispls, rtypes, comm);
  PMPI_Comm_size(comm, &n);
  // With MPI_IN_PLACE the receive side is sent: everything is packed before anything lands.
  if (sbuf == MPI_IN_PLACE) sbuf = rbuf, scounts = rcounts, sdispls = rdispls, stypes = rtypes;
  const auto un = static_cast<std::size_t>(n);
  std::vector<int> slen(un), rlen(un), sat, rat;
  bool fits = true;
  for (std::size_t p = 0; p < un; ++p) {
    const std::int64_t s = bytes_of(scounts[p], stypes[p]), r = bytes_of(rcounts[p], rtypes[p]);
    fits = fits && s <= std::numeric_limits<int>::max() && r <= std::numeric_limits<int>::max();
    slen[p] = static_cast<int>(s), rlen[p] = static_cast<int>(r);
  }
  int stotal = 0, rtotal = 0;
  fits = prefix(slen, sat, stotal) && fits;
  fits = prefix(rlen, rat, rtotal) && fits;
  if (!fits) return raise(comm, "MPI_Alltoallw of more than 2 GiB per rank on one side is not carried (its packed blocks' offsets are ints)");
  std::vector<std::uint8_t> spacked(static_cast<std::size_t>(stotal) + 1), rpacked(static_cast<std::size_t>(rtotal) + 1);
  const auto* sbase = static_cast<const std::uint8_t*>(sbuf);
  // A block of no bytes (a count of zero, or a type of size zero) is neither packed nor
  // unpacked: MPICH 4.0's MPI_Unpack divides by the type's size.
  for (std::size_t p = 0; p < un; ++p) {
    int position = sat[p];
    if (slen[p] > 0) PMPI_Pack(sbase + sdispls[p], scounts[p], stypes[p], spacked.data(), stotal, &position, comm);
  }
  const int rc = alltoallv(spacked.data(), slen.data(), sat.data(), MPI_BYTE, rpacked.data(), rlen.data(), rat.data(), MPI_BYTE, comm);
  if (rc != MPI_SUCCESS) return rc;
  auto* rbase = static_cast<std::uint8_t*>(rbuf);
  for (std::size_t p = 0; p < un; ++p) {
    int position = rat[p];
    if (rlen[p] > 0) PMPI_Unpack(rpacked.data(), rtotal, &position, rbase + rdispls[p], rcounts[p], rtypes[p], comm);
  }
  return MPI_SUCCESS;
}

}  // namespace aapc::mpi

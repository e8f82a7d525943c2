// MPI_Alltoallw: one datatype per peer on each side (FFT and PETSc transposes use it). The
// blocks are packed one after another in peer order (MPI_Pack), carried as a byte
// MPI_Alltoallv, decided as every all-to-all of the communicator is (plan.cpp: through aapc
// or the MPI's own, the same on every rank), and unpacked into place (MPI_Unpack): the
// packing that derived datatypes get in datatypes.cpp, per peer.
#include <cstdint>
#include <limits>
#include <memory>
#include <utility>
#include <vector>

#include "op.hpp"

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

// One call's packed blocks, kept until the call is over (with a request, until the program
// collects it): where each peer's block lies, and the call's arguments, with a request its
// derived datatypes duplicated (the program may free its own once the call returned, and the
// MPI's own may start only once the communicator's plan is made).
struct Packed {
  template <typename... A>
  explicit Packed(A&&... kept) : args(std::forward<A>(kept)...) {}  // AlltoallwArgs's
  std::vector<int> slen, rlen, sat, rat;
  int stotal = 0, rtotal = 0;
  std::vector<std::uint8_t> s, r;
  void* rbuf = nullptr;
  AlltoallwArgs args;
  // The received blocks into place. A block of no bytes (a count of zero, or a type of size
  // zero) is not unpacked: MPICH 4.0's MPI_Unpack divides by the type's size.
  void unpack(MPI_Comm comm) {
    auto* rbase = static_cast<std::uint8_t*>(rbuf);
    for (std::size_t p = 0; p < rlen.size(); ++p) {
      int position = rat[p];
      if (rlen[p] > 0) unpack_into(r.data(), rtotal, &position, rbase + args.rdispls[p], args.rcounts[p], args.rtypes[p], comm);
    }
  }
};

}  // namespace

AlltoallwArgs::AlltoallwArgs(int n, bool in_place, const int* sc, const int* sd, const MPI_Datatype* st, const int* rc, const int* rd,
                             const MPI_Datatype* rt, bool hold) {
  auto ints = [n](const int* v, std::vector<int>& into) { into.assign(v, v + n); };
  auto types = [&](const MPI_Datatype* t, std::vector<MPI_Datatype>& into) {
    for (int p = 0; p < n; ++p) into.push_back(hold ? held.hold(t[p]) : t[p]);
  };
  ints(rc, rcounts), ints(rd, rdispls), types(rt, rtypes);
  if (!in_place) ints(sc, scounts), ints(sd, sdispls), types(st, stypes);
}

int alltoallw(const void* sbuf, const int* scounts, const int* sdispls, const MPI_Datatype* stypes, void* rbuf, const int* rcounts,
              const int* rdispls, const MPI_Datatype* rtypes, MPI_Comm comm, MPI_Request* request) {
  auto mpis_own_here = [&] {  // on the communicator itself
    return request != nullptr ? PMPI_Ialltoallw(sbuf, scounts, sdispls, stypes, rbuf, rcounts, rdispls, rtypes, comm, request)
                              : PMPI_Alltoallw(sbuf, scounts, sdispls, stypes, rbuf, rcounts, rdispls, rtypes, comm);
  };
  Arguments given(comm, sbuf, rbuf);
  given.add(true, scounts, sdispls, stypes), given.add(false, rcounts, rdispls, rtypes);
  if (auto over = given.verdict(request != nullptr ? "MPI_Ialltoallw" : "MPI_Alltoallw", mpis_own_here)) return *over;
  int inter = 0, n = 0;
  PMPI_Comm_test_inter(comm, &inter);
  if (inter != 0) return mpis_own_here();
  PMPI_Comm_size(comm, &n);
  // With MPI_IN_PLACE the receive side is sent: everything is packed before anything lands.
  const bool in_place = sbuf == MPI_IN_PLACE;
  const void* from = in_place ? rbuf : sbuf;
  const int* fcounts = in_place ? rcounts : scounts;
  const int* fdispls = in_place ? rdispls : sdispls;
  const MPI_Datatype* ftypes = in_place ? rtypes : stypes;
  const auto un = static_cast<std::size_t>(n);
  auto k = std::make_shared<Packed>(n, in_place, scounts, sdispls, stypes, rcounts, rdispls, rtypes, request != nullptr);
  k->slen.resize(un), k->rlen.resize(un);
  bool fits = true;
  for (std::size_t p = 0; p < un; ++p) {
    const std::int64_t s = bytes_of(fcounts[p], ftypes[p]), r = bytes_of(rcounts[p], rtypes[p]);
    fits = fits && s <= std::numeric_limits<int>::max() && r <= std::numeric_limits<int>::max();
    k->slen[p] = static_cast<int>(s), k->rlen[p] = static_cast<int>(r);
  }
  fits = prefix(k->slen, k->sat, k->stotal) && fits;
  fits = prefix(k->rlen, k->rat, k->rtotal) && fits;
  if (!fits) return raise(comm, "MPI_Alltoallw of more than 2 GiB per rank on one side is not carried (its packed blocks' offsets are ints)");
  k->s.resize(static_cast<std::size_t>(k->stotal) + 1), k->r.resize(static_cast<std::size_t>(k->rtotal) + 1);
  const auto* base = static_cast<const std::uint8_t*>(from);
  for (std::size_t p = 0; p < un; ++p) {
    int position = k->sat[p];
    if (k->slen[p] > 0) pack_from(base + fdispls[p], fcounts[p], ftypes[p], k->s.data(), k->stotal, &position, comm);
  }
  k->rbuf = rbuf;
  // The MPI's own in its place, with the kept arguments (in place, the send side's are ignored).
  auto mpis_own = [k, sbuf](MPI_Comm on, MPI_Request* r) {
    const AlltoallwArgs& a = k->args;
    return r != nullptr ? PMPI_Ialltoallw(sbuf, a.scounts.data(), a.sdispls.data(), a.stypes.data(), k->rbuf, a.rcounts.data(),
                                          a.rdispls.data(), a.rtypes.data(), on, r)
                        : PMPI_Alltoallw(sbuf, a.scounts.data(), a.sdispls.data(), a.stypes.data(), k->rbuf, a.rcounts.data(),
                                         a.rdispls.data(), a.rtypes.data(), on);
  };
  const StandsFor w{mpis_own, [k](MPI_Comm on) { k->unpack(on); }};
  return alltoallv(k->s.data(), k->slen.data(), k->sat.data(), MPI_BYTE, k->r.data(), k->rlen.data(), k->rat.data(), MPI_BYTE, comm, request,
                   nullptr, &w);
}

}  // namespace aapc::mpi

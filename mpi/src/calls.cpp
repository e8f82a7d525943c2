// The MPI entry points of the all-to-alls (MPI_Alltoall(v) and MPI_Ialltoall(v), by way of
// entry.cpp): each call goes through aapc or to the MPI's own, as its communicator's plan says
// (plan.cpp), and becomes an op (op.cpp) where the library takes it.
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <vector>

#include "op.hpp"

namespace aapc::mpi {

namespace {

// One all-to-all call, as the plan decides it: through aapc, or the MPI's own (`mpi` starts
// it on a communicator with the call's datatypes: blocking without a request).
struct Call {
  const void* sbuf = nullptr;
  MPI_Datatype stype = MPI_BYTE, rtype = MPI_BYTE;
  bool alltoall = false;
  std::uint64_t block = 0;  // an MPI_Alltoall's, in bytes
  std::function<int(MPI_Comm, MPI_Datatype, MPI_Datatype, MPI_Request*)> mpi;
  // Its blocks by rank, made only where the library takes the call (small calls are many).
  std::function<void(Call&)> make_sides;
  Side send, recv;

  bool through_aapc(const Plan& p) const { return p.aapc && !(alltoall && too_small(p, block)); }
};

// Whether calls on the plan's communicator start at once: it is ready, and no earlier call
// waits for it. Once so, so until the communicator goes (its calls come one at a time).
bool settled(const Plan& p) {
  std::lock_guard<std::recursive_mutex> hold(process().mutex);
  return p.ready() && p.waiting == 0;
}

// A call on `comm`: the MPI's own at once where its plan is ready, no earlier call waits for it
// and aapc does not carry it (on the plan's duplicate of `comm`, or on `comm` itself where the
// plan has none, whose errors return: a failure goes to `comm`'s error handler). Else an op:
// through aapc at once, or waiting for the plan (Stage::kPlan) and then started as the plan
// says, after the calls that waited before it.
int run(Plan& p, MPI_Comm comm, Call c, MPI_Request* request) {
  const bool now = settled(p);
  if (now && !c.through_aapc(p)) {
    const int rc = c.mpi(p.own(comm), c.stype, c.rtype, request);
    if (rc != MPI_SUCCESS && p.own(comm) != comm) PMPI_Comm_call_errhandler(comm, rc);
    return rc;
  }
  auto op = std::make_unique<Op>();
  if (request != nullptr) {
    if (c.sbuf != MPI_IN_PLACE) c.stype = hold_type(c.stype, op->held);
    c.rtype = hold_type(c.rtype, op->held);
  }
  c.make_sides(c);
  op->comm = comm;
  op->plan = &p;
  op->alltoall = c.alltoall;
  std::unique_lock<std::recursive_mutex> hold(process().mutex);
  enlist(*op);
  if (now) {
    start_op(*op, std::move(c.send), std::move(c.recv));
  } else {
    ++p.waiting;
    op->stage = Op::Stage::kPlan;
    op->later = [c = std::move(c)](Op& o) mutable {
      const Plan& made = *o.plan;
      if (c.through_aapc(made)) return start_op(o, std::move(c.send), std::move(c.recv));
      o.reqs.emplace_back();
      if (const int rc = c.mpi(made.own(o.comm), c.stype, c.rtype, &o.reqs.back()); rc != MPI_SUCCESS) {
        o.reqs.clear();
        mpis_own_failed(o, rc);
        o.stage = Op::Stage::kDone;
        return;
      }
      o.stage = Op::Stage::kMpi;
    };
  }
  hold.unlock();
  return carry(std::move(op), request);
}


}  // namespace

int alltoallv(const void* sbuf, const int* scounts, const int* sdispls, MPI_Datatype stype, void* rbuf, const int* rcounts, const int* rdispls,
              MPI_Datatype rtype, MPI_Comm comm, MPI_Request* request) {
  Plan& p = plan_of(comm);
  Call c;
  c.sbuf = sbuf, c.stype = stype, c.rtype = rtype;
  c.mpi = [=](MPI_Comm on, MPI_Datatype st, MPI_Datatype rt, MPI_Request* r) {
    return r != nullptr ? PMPI_Ialltoallv(sbuf, scounts, sdispls, st, rbuf, rcounts, rdispls, rt, on, r)
                        : PMPI_Alltoallv(sbuf, scounts, sdispls, st, rbuf, rcounts, rdispls, rt, on);
  };
  c.make_sides = [=](Call& self) {
    int n = 0;
    PMPI_Comm_size(comm, &n);
    auto wide = [n](const int* v) { return std::vector<std::int64_t>(v, v + n); };
    // With MPI_IN_PLACE the send arguments are ignored (they may be anything).
    const bool in_place = sbuf == MPI_IN_PLACE;
    self.send = {const_cast<void*>(sbuf), wide(in_place ? rcounts : scounts), wide(in_place ? rdispls : sdispls), self.stype};
    self.recv = {rbuf, wide(rcounts), wide(rdispls), self.rtype};
  };
  return run(p, comm, std::move(c), request);
}

int alltoall(const void* sbuf, int scount, MPI_Datatype stype, void* rbuf, int rcount, MPI_Datatype rtype, MPI_Comm comm, MPI_Request* request) {
  MPI_Count type_size = 0;  // the size alone: type_info() would also walk the type's layers
  PMPI_Type_size_x(rtype, &type_size);
  const std::uint64_t block = static_cast<std::uint64_t>(rcount) * static_cast<std::uint64_t>(type_size);
  // A zero block is the same on every rank (the call's contract): nothing to carry, and no
  // plan needed.
  if (block == 0) {
    settle_duplicate(comm);  // the MPI's own on the communicator itself
    return request != nullptr ? PMPI_Ialltoall(sbuf, scount, stype, rbuf, rcount, rtype, comm, request)
                              : PMPI_Alltoall(sbuf, scount, stype, rbuf, rcount, rtype, comm);
  }
  Plan& p = plan_of(comm);
  Call c;
  c.sbuf = sbuf, c.stype = stype, c.rtype = rtype, c.alltoall = true, c.block = block;
  c.mpi = [=](MPI_Comm on, MPI_Datatype st, MPI_Datatype rt, MPI_Request* r) {
    return r != nullptr ? PMPI_Ialltoall(sbuf, scount, st, rbuf, rcount, rt, on, r) : PMPI_Alltoall(sbuf, scount, st, rbuf, rcount, rt, on);
  };
  c.make_sides = [=](Call& self) {
    int n = 0;
    PMPI_Comm_size(comm, &n);
    auto side = [n](void* buf, int count, MPI_Datatype type) {
      Side s{buf, std::vector<std::int64_t>(static_cast<std::size_t>(n), count), std::vector<std::int64_t>(static_cast<std::size_t>(n)), type};
      for (int r = 0; r < n; ++r) s.displs[static_cast<std::size_t>(r)] = static_cast<std::int64_t>(r) * count;
      return s;
    };
    self.send = side(const_cast<void*>(sbuf), scount, self.stype);
    self.recv = side(rbuf, rcount, self.rtype);
  };
  return run(p, comm, std::move(c), request);
}


}  // namespace aapc::mpi

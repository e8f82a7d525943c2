// The MPI entry points of the all-to-alls (MPI_Alltoall(v) and MPI_Ialltoall(v), by way of
// entry.cpp): each call goes through aapc or to the MPI's own, as its communicator's plan says
// (plan.cpp), and becomes an op (op.cpp) where the library takes it.
#include <algorithm>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
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
  std::function<void(MPI_Comm)> after;  // once aapc carried it (Op::after)
  Side send, recv;
  // An MPI_Alltoallv's: the most bytes any rank of the communicator sends to one machine, once
  // its ranks have agreed on it (each knows only its own counts); a persistent one's is kept
  // from its first start (`kept`).
  std::optional<std::uint64_t> agreed;
  std::shared_ptr<std::optional<std::uint64_t>> kept;
  void agree(std::uint64_t most) {
    agreed = most;
    if (kept) *kept = most;
  }

  // An alltoallv whose size decides the way (AAPC_MPI_MIN_BLOCK above 0) needs its ranks'
  // agreement first (Op::Stage::kAgree).
  bool needs_agreement(const Plan& p) const { return !alltoall && p.aapc && min_block() > 0 && !agreed; }
  bool through_aapc(const Plan& p) const {
    if (!p.aapc) return false;
    return alltoall ? !too_small(p, block) : !agreed || !too_small_v(p, *agreed);
  }
};

// The most bytes this rank's blocks of `c` take to one machine of `p`: what it brings to the
// agreement of an alltoallv.
std::uint64_t most_to_a_machine(const Plan& p, const Call& c) {
  const Side& send = c.sbuf == MPI_IN_PLACE ? c.recv : c.send;  // in place, the send type may be anything
  MPI_Count type_size = 0;
  PMPI_Type_size_x(send.type, &type_size);
  std::vector<std::uint64_t> to(static_cast<std::size_t>(p.place.machines()), 0);
  for (std::size_t r = 0; r < send.counts.size() && r < p.place.machine_of.size(); ++r)
    to[static_cast<std::size_t>(p.place.machine_of[r])] += static_cast<std::uint64_t>(send.counts[r]) * static_cast<std::uint64_t>(type_size);
  return to.empty() ? 0 : *std::max_element(to.begin(), to.end());
}

// Whether the MPI call that returned `rc` started the op's request (reqs.back()); if not, the
// op fails with the MPI's words and is over.
bool started(Op& o, int rc) {
  if (rc == MPI_SUCCESS) return true;
  o.reqs.clear();
  mpis_own_failed(o, rc);
  o.stage = Op::Stage::kDone;
  return false;
}

// Starts `o` (its plan made, and no earlier call of the plan undecided) as its plan says:
// through aapc, or the MPI's own on the plan's duplicate. An alltoallv that needs its ranks'
// agreement starts that first (Stage::kAgree, an MPI_Iallreduce on the duplicate), and comes
// back here once it is over. Calls are decided in call order, so every rank starts its
// collectives on the duplicate in the same order.
void decide(Op& o, Call& c) {
  const Plan& made = *o.plan;
  if (c.needs_agreement(made)) {
    o.agree_mine = most_to_a_machine(made, c);
    o.reqs.emplace_back();
    if (!started(o, PMPI_Iallreduce(&o.agree_mine, &o.agree_all, 1, MPI_UINT64_T, MPI_MAX, made.own(o.comm), &o.reqs.back()))) return;
    o.stage = Op::Stage::kAgree;
    o.later = [c = std::move(c)](Op& again) mutable {
      c.agree(again.agree_all);
      decide(again, c);
    };
    return;
  }
  if (c.through_aapc(made)) return start_op(o, std::move(c.send), std::move(c.recv));
  announce_small(*o.plan);
  o.reqs.emplace_back();
  if (started(o, c.mpi(made.own(o.comm), c.stype, c.rtype, &o.reqs.back()))) o.stage = Op::Stage::kMpi;
}

// Whether calls on the plan's communicator start at once: it is ready, and no earlier call
// waits for it. Once so, so until the communicator goes (its calls come one at a time).
bool settled(const Plan& p) {
  std::lock_guard<std::recursive_mutex> hold(process().mutex);
  return p.ready() && p.waiting == 0;
}

// A call on `comm`: the MPI's own at once where its plan is ready, no earlier call waits for it
// and aapc does not carry it (on the plan's duplicate of `comm`, or on `comm` itself where the
// plan has none, whose errors return: a failure goes to `comm`'s error handler). Else an op:
// through aapc at once, or waiting for the plan and the calls before it (Stage::kPlan), and
// for an alltoallv's agreement (Stage::kAgree), then started as the plan says (decide()).
//
// A blocking call runs its MPI collectives on the duplicate (the agreement, the MPI's own
// all-to-all) as blocking calls, a nonblocking one as nonblocking calls, on every rank alike:
// MPI matches no blocking collective with a nonblocking one. So a blocking call first moves
// the earlier calls of its plan until they have all started (they are nonblocking calls the
// program has not waited for yet, or the plan is being made): a rank whose earlier MPI_Ialltoallv
// had started ran this call blocking while another rank, whose own still waited, ran it as an
// op, nonblocking, and the job hung (tests/mpi/mpi_mixed.c). Moving them here is what the
// blocking call's op would have done first anyway.
int run(Plan& p, MPI_Comm comm, Call c, MPI_Request* request) {
  if (request == nullptr && !settled(p)) drive_until(comm, [&] { return settled(p); });
  // A blocking call (settled now) agrees at once, blocking: an 8 B call took 1.68 ms with the
  // nonblocking agreement and 1.31 ms with this (Open MPI, ppn 1, docs/mpi.md).
  if (request == nullptr && c.needs_agreement(p)) {
    c.make_sides(c);
    std::uint64_t mine = most_to_a_machine(p, c), most = 0;
    if (const int rc = PMPI_Allreduce(&mine, &most, 1, MPI_UINT64_T, MPI_MAX, p.own(comm)); rc != MPI_SUCCESS) {
      if (p.own(comm) != comm) PMPI_Comm_call_errhandler(comm, rc);
      return rc;
    }
    c.agree(most);
  }
  const bool now = settled(p) && !c.needs_agreement(p);
  if (now && !c.through_aapc(p)) {
    announce_small(p);
    const int rc = c.mpi(p.own(comm), c.stype, c.rtype, request);
    if (rc != MPI_SUCCESS && p.own(comm) != comm) PMPI_Comm_call_errhandler(comm, rc);
    return rc;
  }
  auto op = std::make_unique<Op>();
  if (request != nullptr) {
    if (c.sbuf != MPI_IN_PLACE) c.stype = op->held.hold(c.stype);
    c.rtype = op->held.hold(c.rtype);
  }
  if (c.send.counts.empty()) c.make_sides(c);
  op->comm = comm;
  op->plan = &p;
  op->alltoall = c.alltoall;
  op->after = c.after;
  std::unique_lock<std::recursive_mutex> hold(process().mutex);
  enlist(*op);
  if (now) {
    start_op(*op, std::move(c.send), std::move(c.recv));
  } else {
    ++p.waiting;
    op->stage = Op::Stage::kPlan;
    op->later = [c = std::move(c)](Op& o) mutable { decide(o, c); };
    advance_op(*op);  // an agreement starts in the call, where the plan is made and no call before it waits
  }
  hold.unlock();
  return carry(std::move(op), request);
}

}  // namespace

int alltoallv(const void* sbuf, const int* scounts, const int* sdispls, MPI_Datatype stype, void* rbuf, const int* rcounts, const int* rdispls,
              MPI_Datatype rtype, MPI_Comm comm, MPI_Request* request, const std::shared_ptr<std::optional<std::uint64_t>>& agreed,
              const StandsFor* stands_for) {
  auto mpis_own = [=](MPI_Comm on, MPI_Datatype st, MPI_Datatype rt, MPI_Request* r) {
    return r != nullptr ? PMPI_Ialltoallv(sbuf, scounts, sdispls, st, rbuf, rcounts, rdispls, rt, on, r)
                        : PMPI_Alltoallv(sbuf, scounts, sdispls, st, rbuf, rcounts, rdispls, rt, on);
  };
  if (stands_for == nullptr) {  // an MPI_Alltoallw's packed bytes were judged as its own arguments
    Arguments a(comm, sbuf, rbuf);
    a.add(true, scounts, sdispls, stype), a.add(false, rcounts, rdispls, rtype);
    if (auto over = a.verdict(request != nullptr ? "MPI_Ialltoallv" : "MPI_Alltoallv", [&] { return mpis_own(comm, stype, rtype, request); }))
      return *over;
  }
  Plan& p = plan_of(comm);
  Call c;
  c.sbuf = sbuf, c.stype = stype, c.rtype = rtype;
  if (agreed) c.agreed = *agreed, c.kept = agreed;
  if (stands_for != nullptr) {
    c.mpi = [mpi = stands_for->mpi](MPI_Comm on, MPI_Datatype, MPI_Datatype, MPI_Request* r) { return mpi(on, r); };
    c.after = stands_for->after;
  } else {
    c.mpi = mpis_own;
  }
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
  auto mpis_own = [=](MPI_Comm on, MPI_Datatype st, MPI_Datatype rt, MPI_Request* r) {
    return r != nullptr ? PMPI_Ialltoall(sbuf, scount, st, rbuf, rcount, rt, on, r) : PMPI_Alltoall(sbuf, scount, st, rbuf, rcount, rt, on);
  };
  auto here = [&] { return mpis_own(comm, stype, rtype, request); };  // on the communicator itself
  Arguments a(comm, sbuf, rbuf);
  a.add(true, scount, stype), a.add(false, rcount, rtype);
  if (auto over = a.verdict(request != nullptr ? "MPI_Ialltoall" : "MPI_Alltoall", here)) return *over;
  MPI_Count type_size = 0;  // the size alone: type_info() would also walk the type's layers
  PMPI_Type_size_x(rtype, &type_size);
  const std::uint64_t block = static_cast<std::uint64_t>(rcount) * static_cast<std::uint64_t>(type_size);
  // A zero block is the same on every rank (the call's contract): nothing to carry, and no
  // plan needed.
  if (block == 0) {
    settle_duplicate(comm);
    return here();
  }
  Plan& p = plan_of(comm);
  Call c;
  c.sbuf = sbuf, c.stype = stype, c.rtype = rtype, c.alltoall = true, c.block = block;
  c.mpi = mpis_own;
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

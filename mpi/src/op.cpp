// MPI_Alltoall(v) and MPI_Ialltoall(v) through aapc, for a communicator whose plan says so
// (plan.cpp). Three steps, after MPICH's composition alpha (see aapc/mpi/layout.hpp):
//   1. each rank hands its blocks to its machine's leader;
//   2. the leaders' daemons exchange one machine-level block per pair of machines;
//   3. each leader hands its local ranks their blocks.
// The hand-overs (steps 1 and 3) are single copies made by the leader, straight between the
// local ranks' buffers and its staging, while the local ranks wait for its word in their
// mailboxes (single_copy.hpp); or, where the plan says so, messages of the MPI's intra-node
// transport.
// Predefined contiguous datatypes are carried as they are; other datatypes are packed first
// and unpacked after (datatypes.cpp). A call is an Op (op.hpp) that moves on whenever the
// process drives it (progress.cpp): at once for a blocking call, in MPI_Wait/MPI_Test for a
// nonblocking one (requests.cpp). The MPI entry points that make ops are in calls.cpp.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "aapc/mpi/env.hpp"
#include "op.hpp"
#include "single_copy.hpp"


namespace aapc::mpi {


namespace {

// Machine-level exchanges of this process running at once. The daemon runs up to 256 of all
// its clients (aapcd --max-exchanges) and refuses more: 32 processes leading communicators on
// one machine, each at this limit.
constexpr std::size_t kMostRunning = 8;

// The messages of one call between the ranks of a machine, on the plan's duplicate of the
// communicator, each with a tag of its own per call (from 1: the plan's messages use 0): calls
// in flight together finish in any order.
enum Message : int { kCountsMsg = 0, kGatherMsg, kStatusMsg, kErrorMsg, kScatterMsg, kMessages };
int tag(const Op& op, Message m) { return 1 + static_cast<int>(op.call % 4096) * kMessages + m; }

std::vector<Piece> in_order(const std::vector<Piece>& by_rank, const std::vector<int>& order) {
  std::vector<Piece> out;
  out.reserve(order.size());
  for (int r : order) out.push_back(by_rank[static_cast<std::size_t>(r)]);
  return out;
}

// A staging buffer of at least `bytes`: a spare one, or a new one of the connection that every
// group of the process shares. Throws aapc::Exception.
aapc::Buffer take_buffer(Plan& p, std::uint64_t bytes) {
  Process& pr = process();
  auto best = pr.spare.end();
  for (auto it = pr.spare.begin(); it != pr.spare.end(); ++it)
    if (it->size() >= bytes && (best == pr.spare.end() || it->size() < best->size())) best = it;
  if (best == pr.spare.end()) return p.group->allocate(std::max<std::uint64_t>(bytes, 1));
  aapc::Buffer b = std::move(*best);
  pr.spare.erase(best);
  return b;
}

// Keeps the few largest spares.
void give_back(aapc::Buffer& b) {
  Process& pr = process();
  if (b) pr.spare.push_back(std::move(b));
  if (pr.spare.size() <= 4) return;
  auto smallest = std::min_element(pr.spare.begin(), pr.spare.end(), [](const aapc::Buffer& x, const aapc::Buffer& y) { return x.size() < y.size(); });
  pr.spare.erase(smallest);
}

std::vector<std::size_t> sizes(const std::vector<std::uint64_t>& v) { return {v.begin(), v.end()}; }

// The schedule asked for with AAPC_MPI_SCHEDULE=ALGORITHM[+SYNC] (default: auto).
aapc::Options options() {
  aapc::Options o;
  // A start is one message, and the daemon's one answer comes when the exchange is over: a
  // test reads the socket and asks nothing. Against a START answered at once and WAITs after
  // it (8-two-switch, ppn 1, Open MPI, every call through aapc, medians of 6 runs per call):
  // 8 B blocking 1.41 -> 1.20 ms, persistent 1.73 -> 1.30 ms; 1 KiB 2.46 -> 2.11, 2.73 -> 2.37.
  o.one_message_start = true;
  const char* spec = std::getenv("AAPC_MPI_SCHEDULE");
  if (spec == nullptr || *spec == '\0') return o;
  const std::string s = spec;
  o.schedule = s.substr(0, s.find('+'));
  if (s.find('+') != std::string::npos) o.sync = s.substr(s.find('+') + 1);
  return o;
}

// A message of `op` between this rank and local rank `k` of its machine.
void message(Op& op, bool receive, void* buf, int count, MPI_Datatype type, int k, Message m) {
  op.reqs.emplace_back();
  const Plan& p = *op.plan;
  if (receive)
    PMPI_Irecv(buf, count, type, p.peer(k), tag(op, m), p.dup, &op.reqs.back());
  else
    PMPI_Isend(buf, count, type, p.peer(k), tag(op, m), p.dup, &op.reqs.back());
}

void post(Op& op, bool receive, void* buf, const std::vector<Piece>& pieces, int k, Message m) {
  op.types.push_back(std::make_unique<ByteType>(pieces));
  const ByteType& t = *op.types.back();
  message(op, receive, buf, t.count(), t.type(), k, m);
}

// Step 1 from every rank: its blocks to the leader, in destination order.
void send_mine(Op& op) { post(op, false, op.sb.base, in_order(op.sb.by_rank, destination_order(op.plan->place)), op.plan->leader_rank, kGatherMsg); }

// Whether every request of `op` is done; clears them if so.
// A hand-over that failed (an erroneous program: counts that differ between ranks truncate a
// message) fails the op with the MPI's words; the plan's duplicate communicator returns errors
// (plan.cpp), and the op's failure reaches the program through its own communicator.
bool all_done(Op& op) {
  int failed = MPI_SUCCESS;
  if (!test_all(op.reqs, op.statuses, failed)) return false;
  if (failed != MPI_SUCCESS && op.error.empty())
    op.error = "a hand-over between the ranks of machine " + std::to_string(op.plan->machine) + " failed: " + mpi_words(failed);
  op.types.clear();
  return true;
}

// The op's failure, where the MPI's own all-to-all (Stage::kMpi) failed with `rc`.
}  // namespace

void mpis_own_failed(Op& op, int rc) { op.error = "the MPI's own all-to-all failed: " + mpi_words(rc); }

namespace {

// Whether the MPI's own all-to-all of `op` (Stage::kMpi) is over; its failure is the op's.
bool mpi_done(Op& op) {
  int failed = MPI_SUCCESS;
  if (!test_all(op.reqs, op.statuses, failed)) return false;
  if (failed != MPI_SUCCESS) mpis_own_failed(op, failed);
  return true;
}

// Step 1 on the leader, once it knows every length: the staging, then the local ranks'
// blocks into it.
void gather(Op& op) {
  Plan& p = *op.plan;
  const std::size_t n = p.place.machine_of.size(), stride = op.counts.size();
  const std::uint64_t block = op.sb.by_rank.front().length;
  auto at = [&](int k, bool receive, int peer) {
    return op.alltoall ? block : op.all_counts[static_cast<std::size_t>(k) * stride + (receive ? n : 0) + static_cast<std::size_t>(peer)];
  };
  op.layout = std::make_unique<LeaderLayout>(leader_layout(
      p.place, p.machine, [&](int i, int j) { return at(p.place.local_index(i), false, j); },
      [&](int i, int j) { return at(p.place.local_index(j), true, i); }));
  op.t0 = seconds_now();
  try {
    op.stage_send = take_buffer(p, op.layout->send.total);
    op.stage_recv = take_buffer(p, op.layout->recv.total);
  } catch (const std::exception& e) {
    op.error = e.what();
    process().spare.clear();
  }
  if (p.single_copy) {
    single_copy::pull(op);
    op.t1 = seconds_now();
    op.stage = Op::Stage::kQueued;
    return;
  }
  // Without staging (no daemon), into a sink: the local ranks send all the same.
  if (!op.error.empty()) op.sink.resize(op.layout->send.total);
  std::uint8_t* into = op.error.empty() ? op.stage_send.data() : op.sink.data();
  for (int k = 0; k < p.local_size; ++k) post(op, true, into, op.layout->gather[static_cast<std::size_t>(k)], k, kGatherMsg);
  send_mine(op);
  op.stage = Op::Stage::kGather;
}

// Step 3 on the leader, or the failure told to the local ranks.
void finish_exchange(Op& op) {
  const Plan& p = *op.plan;
  op.t2 = seconds_now();
  if (p.single_copy) {  // the blocks, then the word that they are there
    if (op.error.empty()) single_copy::push(op);
    single_copy::tell(op);
    op.stage = Op::Stage::kFinishing;
    return;
  }
  op.length = static_cast<int>(op.error.size());
  for (int k = 0; k < p.local_size; ++k) {
    if (k == p.leader_rank) continue;
    message(op, false, &op.length, 1, MPI_INT, k, kStatusMsg);
    if (op.length == 0) continue;
    message(op, false, op.error.data(), op.length, MPI_CHAR, k, kErrorMsg);
  }
  if (op.length > 0) {
    op.stage = Op::Stage::kTelling;
    return;
  }
  for (int k = 0; k < p.local_size; ++k) post(op, false, op.stage_recv.data(), op.layout->scatter[static_cast<std::size_t>(k)], k, kScatterMsg);
  post(op, true, op.rb.base, op.rb.by_rank, p.leader_rank, kScatterMsg);
  op.stage = Op::Stage::kScatter;
}

std::size_t running_here() {
  const auto& ops = process().in_flight;
  return static_cast<std::size_t>(std::count_if(ops.begin(), ops.end(), [](const Op* o) { return o->stage == Op::Stage::kExchange; }));
}

// Whether an exchange of `p` that the daemons start with an agreement on its counts (an
// alltoallv) runs. The daemon answers a later start of the same group only once that
// agreement is over (engine/src/daemon_session.cpp, launch), and that needs every peer to
// start it: a start made meanwhile blocked this rank's thread in the call, so the rank stopped
// moving the MPI, and a peer that waited in the MPI for it never started the alltoallv (MPICH's
// coll/nonblocking3 failed at the deadline; tests/mpi/mpi_nonblocking.c, many_in_flight()).
// The next exchange of the group starts once that one is over.
bool agreeing(const Plan& p) {
  const auto& ops = process().in_flight;
  return std::any_of(ops.begin(), ops.end(), [&](const Op* o) { return o->plan == &p && o->counted && o->stage == Op::Stage::kExchange; });
}

// Step 2, in call order: the daemons pair exchanges by the order in which they start.
bool start_exchange(Op& op) {
  auto& queue = op.plan->to_start;
  if (queue.empty() || queue.front() != &op || running_here() >= kMostRunning || agreeing(*op.plan)) return false;
  queue.pop_front();
  if (!op.error.empty()) {
    finish_exchange(op);
    return true;
  }
  const LeaderLayout& l = *op.layout;
  const bool uniform = op.alltoall && op.plan->fewest == op.plan->most;
  aapc::Client& group = *op.plan->group;  // shares pr.client's connection and buffers
  Result<Request> r = uniform ? group.start_alltoall(op.stage_send, op.stage_recv, l.send.counts.front(), options())
                              : group.start_alltoallv(op.stage_send, sizes(l.send.counts), sizes(l.send.displs), op.stage_recv,
                                                           sizes(l.recv.counts), sizes(l.recv.displs), options());
  if (r) {
    op.exchange.emplace(std::move(r.value()));
    op.counted = !uniform;
    op.stage = Op::Stage::kExchange;
    return true;
  }
  op.error = r.error().message().empty() ? "the exchange failed" : r.error().message();
  finish_exchange(op);
  return true;
}

}  // namespace

bool exchange_over(Op& op, std::chrono::microseconds bound) {
  std::optional<Result<Stats>> r = op.exchange->wait_for(bound);
  if (!r) return false;
  if (!*r) {
    op.error = r->error().message().empty() ? "the exchange failed" : r->error().message();
    if (r->error().code() == Errc::kDaemonRestarted) process().spare.clear();
  }
  op.exchange.reset();
  finish_exchange(op);
  return true;
}

namespace {

void finish(Op& op);

// A member's step 3: the outcome came.
void outcome(Op& op) {
  if (op.length > 0) {
    op.error.assign(static_cast<std::size_t>(op.length), '\0');
    message(op, true, op.error.data(), op.length, MPI_CHAR, Plan::leader_rank, kErrorMsg);
    op.stage = Op::Stage::kErrorText;
    return;
  }
  post(op, true, op.rb.base, op.rb.by_rank, op.plan->leader_rank, kScatterMsg);
  op.stage = Op::Stage::kScatter;
}


}  // namespace

// An MPI_Alltoall whose machine-level blocks are smaller than AAPC_MPI_MIN_BLOCK bytes
// (default 8 KiB) runs the MPI's own: below that, aapc's per-phase frames cost more than the
// MPI's small-message algorithms (measured on the emulated cluster at 100 Mbit/s: at 1 KiB
// per rank and 1 rank per machine Open MPI alone reached 90% of the limit, aapc 38%; at
// 16 KiB machine-level blocks aapc 74%, Open MPI 12%). The block size is the same on every
// rank (the call's contract) and so is the placement: every rank decides alike.
bool too_small(const Plan& p, std::uint64_t rank_block) {
  return p.fewest * p.fewest * rank_block < min_block();
}

// An MPI_Alltoallv by the same measure: its ranks agree on the most bytes any of them sends to
// one machine (calls.cpp, decide()), and a machine holds at least `fewest` such senders. For
// an alltoallv of equal counts this is the rule above. Without it, a program of many tiny
// alltoallvs ran each through the daemons: an 8 B call took 3.6x Open MPI's time at ppn 1, and
// mpi4py's test_cco_nb_vec 239 s against Open MPI's 141 s (docs/mpi.md).
bool too_small_v(const Plan& p, std::uint64_t most_to_a_machine) { return p.fewest * most_to_a_machine < min_block(); }

namespace {

// What a rank tells its leader of its blocks, as words: for an alltoallv its send then
// receive lengths by comm rank; with single-copy hand-overs also where they are, for an
// alltoallv the offsets likewise, for an alltoall its send and receive block lengths, and
// then its send and receive bases. Empty for an alltoall handed over through the MPI.
std::vector<std::uint64_t> describe(const Op& op) {
  std::vector<std::uint64_t> d;
  auto each = [&](const Blocks& b, std::uint64_t Piece::*field) {
    for (const Piece& piece : b.by_rank) d.push_back(piece.*field);
  };
  if (!op.alltoall) each(op.sb, &Piece::length), each(op.rb, &Piece::length);
  if (!op.plan->single_copy) return d;
  if (op.alltoall) d.push_back(op.sb.by_rank.front().length), d.push_back(op.rb.by_rank.front().length);
  else each(op.sb, &Piece::offset), each(op.rb, &Piece::offset);
  d.push_back(reinterpret_cast<std::uint64_t>(op.sb.base));
  d.push_back(reinterpret_cast<std::uint64_t>(op.rb.base));
  return d;
}

// The last stage: staging back to the spares, the received blocks unpacked.
void finish(Op& op) {
  const Plan& p = *op.plan;
  // A communicator freed while the call ran is no longer the program's to name (MPI_Unpack,
  // the error handler): MPI_COMM_WORLD stands in.
  if (p.doomed) op.comm = MPI_COMM_WORLD;
  if (p.leader()) {
    give_back(op.stage_send);
    give_back(op.stage_recv);
    if (op.error.empty() && std::getenv("AAPC_MPI_TIMING") != nullptr)
      std::fprintf(stderr, "aapc-mpi: machine %d: gather %.3f ms, exchange %.3f ms, scatter %.3f ms\n", p.machine, (op.t1 - op.t0) * 1e3,
                   (op.t2 - op.t1) * 1e3, (seconds_now() - op.t2) * 1e3);
  }
  if (op.error.empty() && !op.recv_packed.empty()) unpack(op.recv, op.comm, op.rb);
  if (op.error.empty() && op.after) op.after(op.comm);
  if (op.error.empty() && !op.plan->carried && !p.doomed) {  // once per communicator, for AAPC_MPI_VERBOSE
    op.plan->carried = true;
    announce_first(*op.plan);
  }
  op.stage = Op::Stage::kDone;
}

// Whether no earlier call of `op`'s plan is still to be started (Stage::kPlan, kAgree): calls
// start in call order, so that every rank starts the same collectives on the plan's duplicate
// in the same order (an alltoallv's agreement may end at different times on different ranks).
bool first_undecided(const Op& op) {
  for (const Op* o : process().in_flight) {
    if (o == &op) return true;
    if (o->plan == op.plan && (o->stage == Op::Stage::kPlan || o->stage == Op::Stage::kAgree)) return false;
  }
  return true;
}

}  // namespace

bool advance_op(Op& op) {
  using S = Op::Stage;
  switch (op.stage) {
    case S::kPlan:
    case S::kAgree: {
      if (!op.plan->ready() || !first_undecided(op)) return false;
      if (op.stage == S::kAgree) {
        int failed = MPI_SUCCESS;
        if (!test_all(op.reqs, op.statuses, failed)) return false;
        if (failed != MPI_SUCCESS) {
          mpis_own_failed(op, failed);
          op.stage = S::kDone;
        }
      }
      if (op.stage != S::kDone) std::exchange(op.later, nullptr)(op);
      if (op.stage == S::kAgree) return true;
      --op.plan->waiting;
      if (op.for_mover()) wake_mover();  // a detached op that the progress thread may move now
      return true;
    }
    case S::kMpi:
      if (!mpi_done(op)) return false;
      op.stage = S::kDone;
      return true;
    case S::kPost:
      if (!single_copy::post(op)) return false;
      op.stage = S::kStatus;
      return true;
    case S::kCounts:
      if (op.plan->single_copy) {
        bool moved = false;
        if (!single_copy::collect(op, moved)) return moved;
      } else if (!all_done(op)) {
        return false;
      }
      gather(op);
      return true;
    case S::kGather:
      if (!all_done(op)) return false;
      op.t1 = seconds_now();
      op.stage = S::kQueued;
      return true;
    case S::kQueued: return start_exchange(op);
    case S::kExchange: return exchange_over(op);
    case S::kHandOver:  // spun for: MPICH moves a large message only while its sender calls in
      if (!all_done(op)) return false;
      message(op, true, &op.length, 1, MPI_INT, Plan::leader_rank, kStatusMsg);
      op.stage = S::kStatus;
      return true;
    case S::kStatus:
      if (op.plan->single_copy) {
        if (!single_copy::told(op)) return false;
        op.error = single_copy::told_error(op);
        finish(op);
        return true;
      }
      if (!all_done(op)) return false;
      outcome(op);
      return true;
    case S::kFinishing:
      finish(op);
      return true;
    case S::kTelling:
    case S::kErrorText:
    case S::kScatter:
      if (!all_done(op)) return false;
      finish(op);
      return true;
    case S::kDone: return false;
  }
  return false;
}

void enlist(Op& op) {
  std::lock_guard<std::recursive_mutex> hold(process().mutex);
  ++op.plan->ops;
  process().in_flight.push_back(&op);
}

void start_op(Op& op, Side send, Side recv) {
  Plan& p = *op.plan;
  if (p.doomed) op.comm = MPI_COMM_WORLD;  // freed while the call waited for its plan (see finish())
  op.call = p.calls++;
  const int n = static_cast<int>(recv.counts.size());
  if (send.buf == MPI_IN_PLACE) send = recv;  // everything is read before anything is written
  op.sb = blocks_of(send, n, op.comm, op.send_packed, true);
  op.rb = blocks_of(recv, n, op.comm, op.recv_packed, false);
  op.recv = std::move(recv);
  op.counts = describe(op);
  const std::size_t words = op.counts.size();
  if (p.leader() && words != 0) op.all_counts.resize(words * static_cast<std::size_t>(p.local_size));
  if (p.leader() && words != 0)
    std::copy(op.counts.begin(), op.counts.end(), op.all_counts.begin() + static_cast<std::ptrdiff_t>(Plan::leader_rank * words));
  if (p.single_copy && p.leader()) {  // every rank's description reaches the leader through its mailbox
    op.described.assign(static_cast<std::size_t>(p.local_size), 0);
    op.described[static_cast<std::size_t>(Plan::leader_rank)] = 1;
  } else if (!p.single_copy && words != 0) {  // ... or through the MPI
    if (p.leader()) {
      for (int k = 0; k < p.local_size; ++k)
        if (k != Plan::leader_rank) message(op, true, &op.all_counts[static_cast<std::size_t>(k) * words], static_cast<int>(words), MPI_UINT64_T, k, kCountsMsg);
    } else {
      message(op, false, op.counts.data(), static_cast<int>(words), MPI_UINT64_T, Plan::leader_rank, kCountsMsg);
    }
  }
  if (p.leader()) {
    p.to_start.push_back(&op);
    if (words == 0) gather(op);
    else op.stage = Op::Stage::kCounts;
  } else if (p.single_copy) {  // the leader copies; this rank describes its call, then waits for its word
    op.stage = single_copy::post(op) ? Op::Stage::kStatus : Op::Stage::kPost;
  } else {
    send_mine(op);
    op.stage = Op::Stage::kHandOver;
  }
}


}  // namespace aapc::mpi

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
// and unpacked after. A call is an Op (op.hpp) that moves on whenever the process drives it:
// at once for a blocking call, in MPI_Wait/MPI_Test for a nonblocking one (requests.cpp).
#include <pthread.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>
#include <thread>
#include <vector>

#include "aapc/mpi/bell.hpp"
#include "aapc/mpi/env.hpp"
#include "op.hpp"
#include "single_copy.hpp"

namespace aapc::mpi {

namespace {

constexpr std::uint64_t kChunk = 1ULL << 30;  // hindexed block lengths are ints
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
void mpis_own_failed(Op& op, int rc) { op.error = "the MPI's own all-to-all failed: " + mpi_words(rc); }

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

// Whether the daemons' exchange is over (with `block`, once it is: no polling).
bool exchange_over(Op& op, bool block = false) {
  std::optional<Result<Stats>> r = block ? std::optional<Result<Stats>>(op.exchange->wait()) : op.exchange->test();
  if (!r) return false;
  if (!*r) {
    op.error = r->error().message().empty() ? "the exchange failed" : r->error().message();
    if (r->error().code() == Errc::kDaemonRestarted) process().spare.clear();
  }
  op.exchange.reset();
  finish_exchange(op);
  return true;
}

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

// A datatype's layout: contiguous ones are carried in place.
struct TypeInfo {
  MPI_Aint extent = 0;
  std::uint64_t size = 0;
  bool contiguous = false;
};

bool in_order(MPI_Datatype t, int depth);

// Whether `t` covers its extent without gaps, from 0, with its bytes in the order of its type
// map: then packing it copies its bytes as they lie. Extent and size alone do not say so: a
// block transposed by its datatype (a vector of one element per row, resized to one element,
// made contiguous) has no gaps either, and its bytes must move.
TypeInfo type_info(MPI_Datatype t, int depth = 0) {
  MPI_Aint lb = 0, extent = 0, true_lb = 0, true_extent = 0;
  MPI_Count size = 0;
  PMPI_Type_get_extent(t, &lb, &extent);
  PMPI_Type_get_true_extent(t, &true_lb, &true_extent);
  PMPI_Type_size_x(t, &size);
  TypeInfo i;
  i.extent = extent;
  i.size = static_cast<std::uint64_t>(size);
  i.contiguous = lb == 0 && true_lb == 0 && static_cast<MPI_Count>(extent) == size && static_cast<MPI_Count>(true_extent) == size && in_order(t, depth);
  return i;
}

// Whether `t`'s type map lists its bytes in increasing order, each once: a predefined type, or
// one made of such a type, gapless, by dup, contiguous, resized, or a vector whose stride is its
// block. Others are taken as out of order (they are packed, which is always right).
bool in_order(MPI_Datatype t, int depth) {
  int ni = 0, na = 0, nd = 0, combiner = MPI_COMBINER_NAMED;
  PMPI_Type_get_envelope(t, &ni, &na, &nd, &combiner);
  if (combiner == MPI_COMBINER_NAMED) return true;
  const bool layered = combiner == MPI_COMBINER_DUP || combiner == MPI_COMBINER_CONTIGUOUS || combiner == MPI_COMBINER_RESIZED ||
                       combiner == MPI_COMBINER_VECTOR || combiner == MPI_COMBINER_HVECTOR;
  if (!layered || nd != 1 || depth > 32) return false;
  std::vector<int> ints(static_cast<std::size_t>(ni));
  std::vector<MPI_Aint> addrs(static_cast<std::size_t>(na));
  MPI_Datatype inner = MPI_DATATYPE_NULL;
  PMPI_Type_get_contents(t, ni, na, nd, ints.data(), addrs.data(), &inner);
  const TypeInfo in = type_info(inner, depth + 1);
  bool ok = in.contiguous;
  if (combiner == MPI_COMBINER_VECTOR) ok = ok && (ints[0] <= 1 || ints[1] == ints[2]);  // count, blocklength, stride (elements)
  if (combiner == MPI_COMBINER_HVECTOR) ok = ok && (ints[0] <= 1 || static_cast<MPI_Aint>(ints[1]) * in.extent == addrs[0]);  // ... stride in bytes
  int inner_ni = 0, inner_na = 0, inner_nd = 0, inner_combiner = MPI_COMBINER_NAMED;
  PMPI_Type_get_envelope(inner, &inner_ni, &inner_na, &inner_nd, &inner_combiner);
  if (inner_combiner != MPI_COMBINER_NAMED) PMPI_Type_free(&inner);  // get_contents gave a new handle
  return ok;
}

// Every block of `side` between the user's buffer and b's packed bytes (MPI_Pack, or
// MPI_Unpack when not `into_packed`), in runs of at most 2 GiB (element_runs).
void packing(const Side& side, const TypeInfo& t, MPI_Comm comm, const Blocks& b, bool into_packed) {
  for (std::size_t r = 0; r < side.counts.size(); ++r) {
    auto* user = static_cast<std::uint8_t*>(side.buf) + side.displs[r] * t.extent;
    for (const Run& run : element_runs(static_cast<std::uint64_t>(side.counts[r]), t.size)) {
      std::uint8_t* elements = user + static_cast<std::int64_t>(run.first) * t.extent;
      std::uint8_t* packed = b.base + b.by_rank[r].offset + run.first * t.size;
      const int bytes = static_cast<int>(std::min<std::uint64_t>(static_cast<std::uint64_t>(run.elements) * t.size, std::numeric_limits<int>::max()));
      int position = 0;
      if (into_packed)
        PMPI_Pack(elements, run.elements, side.type, packed, bytes, &position, comm);
      else
        PMPI_Unpack(packed, bytes, &position, elements, run.elements, side.type, comm);
    }
  }
}

// `side`'s blocks in bytes: in place for a contiguous datatype, else in `packed`
// (filled from the user's buffer if `pack`).
Blocks blocks_of(const Side& side, int n, MPI_Comm comm, std::vector<std::uint8_t>& packed, bool pack) {
  const TypeInfo t = type_info(side.type);
  Blocks b;
  b.by_rank.resize(static_cast<std::size_t>(n));
  std::uint64_t total = 0;
  for (int r = 0; r < n; ++r) {
    const auto ur = static_cast<std::size_t>(r);
    const std::uint64_t len = static_cast<std::uint64_t>(side.counts[ur]) * t.size;
    b.by_rank[ur] = t.contiguous ? Piece{static_cast<std::uint64_t>(side.displs[ur] * t.extent), len} : Piece{total, len};
    total += len;
  }
  if (t.contiguous) {
    b.base = static_cast<std::uint8_t*>(side.buf);
    return b;
  }
  packed.resize(std::max<std::uint64_t>(total, 1));
  b.base = packed.data();
  if (pack) packing(side, t, comm, b, true);
  return b;
}

void unpack(const Side& side, MPI_Comm comm, const Blocks& b) { packing(side, type_info(side.type), comm, b, false); }

// An MPI_Alltoall whose machine-level blocks are smaller than AAPC_MPI_MIN_BLOCK bytes
// (default 8 KiB) runs the MPI's own: below that, aapc's per-phase frames cost more than the
// MPI's small-message algorithms (measured on the emulated cluster at 100 Mbit/s: at 1 KiB
// per rank and 1 rank per machine Open MPI alone reached 90% of the limit, aapc 38%; at
// 16 KiB machine-level blocks aapc 74%, Open MPI 12%). The block size is the same on every
// rank (the call's contract) and so is the placement: every rank decides alike.
bool too_small(const Plan& p, std::uint64_t rank_block) {
  return p.fewest * p.fewest * rank_block < min_block();
}

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
  if (op.error.empty() && !op.plan->carried && !p.doomed) {  // once per communicator, for AAPC_MPI_VERBOSE
    op.plan->carried = true;
    announce_first(*op.plan);
  }
  op.stage = Op::Stage::kDone;
}

// One stage further, if it can. True when it moved.
bool advance(Op& op) {
  using S = Op::Stage;
  switch (op.stage) {
    case S::kPlan: {
      if (!op.plan->ready()) return false;
      --op.plan->waiting;
      std::exchange(op.later, nullptr)(op);
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

}  // namespace

ByteType::ByteType(const std::vector<Piece>& pieces) {
  std::vector<int> lengths;
  std::vector<MPI_Aint> displs;
  for (const Piece& p : pieces)
    for (std::uint64_t done = 0; done < p.length; done += kChunk) {
      lengths.push_back(static_cast<int>(std::min(kChunk, p.length - done)));
      displs.push_back(static_cast<MPI_Aint>(p.offset + done));
    }
  if (lengths.empty()) return;
  PMPI_Type_create_hindexed(static_cast<int>(lengths.size()), lengths.data(), displs.data(), MPI_BYTE, &type_);
  PMPI_Type_commit(&type_);
  count_ = 1;
}

Op::~Op() {
  for (MPI_Datatype& t : held) PMPI_Type_free(&t);
}

ByteType::~ByteType() {
  if (count_ != 0) PMPI_Type_free(&type_);
}

namespace {

// Counts an op in: in flight on its plan and in the process.
void enlist(Op& op) {
  std::lock_guard<std::recursive_mutex> hold(process().mutex);
  ++op.plan->ops;
  process().in_flight.push_back(&op);
}

// Makes `op` (enlisted, its plan ready and carrying it) move `send` -> `recv` through aapc:
// packs, and posts the first step.
void start(Op& op, Side send, Side recv) {
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

}  // namespace

bool progress(bool mover) {
  // The MPI calls below may call back into progress() (Open MPI's progress hook,
  // requests.cpp): the ops move in the outer call only.
  static thread_local bool inside = false;
  if (inside) return false;
  Process& pr = process();
  std::lock_guard<std::recursive_mutex> hold(pr.mutex);
  inside = true;
  struct Leave {
    ~Leave() { inside = false; }
  } leave;
  bool moved = !mover && advance_plans();  // the plans' fibers call the MPI
  for (std::size_t i = 0; i < pr.in_flight.size(); ++i) {
    Op& op = *pr.in_flight[i];
    while (!op.done() && (!mover || op.for_mover()) && advance(op)) moved = true;
  }
  if (mover) return moved;  // what is left of an op calls the MPI: the program's thread does it
  std::vector<Op*> done;
  std::erase_if(pr.in_flight, [&](Op* op) { return op->done() && (done.push_back(op), true); });
  for (Op* op : done) {
    op_over(*op->plan);
    // Last: the MPI may free a request that its program freed already, and the op with it.
    if (op->user != MPI_REQUEST_NULL) PMPI_Grequest_complete(op->user);
  }
  return moved;
}

double seconds_now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

namespace {

bool mover_has_work() {
  const auto& ops = process().in_flight;
  return std::any_of(ops.begin(), ops.end(), [](const Op* o) { return o->for_mover(); });
}

// The progress thread: moves the detached single-copy ops of this process's leaders while
// there are any, napping as Idle::nap does (in step 2 each look asks the daemon), and sleeps
// on Process::wake while there are none.
[[noreturn]] void mover() {
  Process& pr = process();
  Idle idle;
  for (;;) {
    bool moved = false;
    {
      std::unique_lock<std::recursive_mutex> hold(pr.mutex);
      pr.wake.wait(hold, mover_has_work);
      moved = progress(true);
    }
    idle.nap(moved);
  }
}

}  // namespace

void wake_mover() {
  Process& pr = process();
  std::lock_guard<std::recursive_mutex> hold(pr.mutex);
  if (!pr.mover_started) {
    pr.mover_started = true;
    // It lives with the process and calls no MPI function, and takes none of the program's
    // signals: they go to the program's threads as before.
    sigset_t all, was;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &was);
    std::thread(mover).detach();
    pthread_sigmask(SIG_SETMASK, &was, nullptr);
  }
  pr.wake.notify_one();
}

bool any_in_flight() {
  std::lock_guard<std::recursive_mutex> hold(process().mutex);
  return !process().in_flight.empty();
}

void Idle::rest(bool moved) {
  bool sleepy = false;
  if (!moved) {
    std::lock_guard<std::recursive_mutex> hold(process().mutex);
    const auto& ops = process().in_flight;
    sleepy = std::all_of(ops.begin(), ops.end(), [](const Op* o) { return o->may_nap(); });
  }
  if (!sleepy) {
    (void)pace_.next(true, NapPace::Clock::now());  // spins from here: the next nap starts short
    return;
  }
  nap(false);
}

void Idle::nap(bool moved) { (void)bell::pause(pace_.next(moved, NapPace::Clock::now())); }

std::chrono::microseconds Idle::longest_nap() {
  static const std::chrono::microseconds longest =
      std::chrono::microseconds(env_integer("AAPC_MPI_LONGEST_NAP_US", 0, 1'000'000).value_or(NapPace::Rule{}.longest.count()));
  return longest;
}

// Whether the program's threads may call the MPI at once (MPI_THREAD_MULTIPLE).
bool threads_call() {
  static const bool multiple = [] {
    int level = MPI_THREAD_SINGLE;
    PMPI_Query_thread(&level);
    return level == MPI_THREAD_MULTIPLE;
  }();
  return multiple;
}

std::string drive(Op& op) {
  Process& pr = process();
  Idle idle;
  for (;;) {
    const bool moved = progress();
    {
      std::lock_guard<std::recursive_mutex> hold(pr.mutex);
      if (op.done()) return op.error;
      // Alone in step 2, it waits for the daemon's word rather than asking again and again;
      // not where other threads may call the MPI. The process's lock and its connection carry
      // one request at a time, so another thread could not start the all-to-all on another
      // communicator that the peers may need first: two threads' calls, started in opposite
      // orders on two machines, waited for each other until the daemons' deadline.
      if (op.stage == Op::Stage::kExchange && pr.in_flight.size() == 1 && !threads_call()) {
        exchange_over(op, true);
        continue;
      }
    }
    idle.rest(moved);
  }
}

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

// A nonblocking call's datatype as the library keeps it: a derived one duplicated into `held`.
// The program may free its own as soon as the call returns (MPI 4.0, 5.1.5: a pending call
// keeps what it uses), and the library uses them until the call is over (packing once the
// plan is made, unpacking at the end).
MPI_Datatype hold_type(MPI_Datatype t, std::vector<MPI_Datatype>& held) {
  int ni = 0, na = 0, nd = 0, combiner = MPI_COMBINER_NAMED;
  PMPI_Type_get_envelope(t, &ni, &na, &nd, &combiner);
  if (combiner == MPI_COMBINER_NAMED) return t;
  MPI_Datatype d = MPI_DATATYPE_NULL;
  PMPI_Type_dup(t, &d);
  held.push_back(d);
  return d;
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
    start(*op, std::move(c.send), std::move(c.recv));
  } else {
    ++p.waiting;
    op->stage = Op::Stage::kPlan;
    op->later = [c = std::move(c)](Op& o) mutable {
      const Plan& made = *o.plan;
      if (c.through_aapc(made)) return start(o, std::move(c.send), std::move(c.recv));
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

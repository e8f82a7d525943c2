// MPI_Alltoall and MPI_Alltoallv through aapc, for a communicator whose plan says so
// (plan.cpp). Three steps, after MPICH's composition alpha (see aapc/mpi/layout.hpp):
//   1. each rank hands its blocks to its machine's leader (the MPI's intra-node transport);
//   2. the leaders' daemons exchange one machine-level block per pair of machines;
//   3. each leader hands its local ranks their blocks.
// Predefined contiguous datatypes are carried as they are; other datatypes are packed first
// and unpacked after.
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstdio>
#include <cstring>
#include <limits>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "plan.hpp"

namespace aapc::mpi {

namespace {

constexpr int kTag = 0x4141;  // on the plan's private local communicator
constexpr std::uint64_t kChunk = 1ULL << 30;  // hindexed block lengths are ints

// One rank's blocks: base + (offset, length) in bytes, by peer comm rank.
struct Blocks {
  std::uint8_t* base = nullptr;
  std::vector<Piece> by_rank;
};

// `pieces` of a buffer as one MPI datatype of bytes, in order (1 GiB chunks).
class ByteType {
 public:
  explicit ByteType(const std::vector<Piece>& pieces) {
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
  ~ByteType() {
    if (count_ != 0) PMPI_Type_free(&type_);
  }
  ByteType(const ByteType&) = delete;
  ByteType& operator=(const ByteType&) = delete;
  MPI_Datatype type() const { return count_ != 0 ? type_ : MPI_BYTE; }
  int count() const { return count_; }

 private:
  MPI_Datatype type_ = MPI_BYTE;
  int count_ = 0;
};

std::vector<Piece> in_order(const std::vector<Piece>& by_rank, const std::vector<int>& order) {
  std::vector<Piece> out;
  out.reserve(order.size());
  for (int r : order) out.push_back(by_rank[static_cast<std::size_t>(r)]);
  return out;
}

// The leader's connection and staging buffers of at least `send` and `recv` bytes.
std::optional<std::string> staging(std::uint64_t send, std::uint64_t recv) {
  Process& pr = process();
  try {
    if (!pr.client) pr.client.emplace(aapc::Client::connect());
    if (pr.send.size() < send || !pr.send) pr.send = pr.client->allocate(std::max<std::uint64_t>(send, 1));
    if (pr.recv.size() < recv || !pr.recv) pr.recv = pr.client->allocate(std::max<std::uint64_t>(recv, 1));
  } catch (const std::exception& e) {
    pr.client.reset();
    return e.what();
  }
  return std::nullopt;
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

// Step 2 on the leader: the machine-level exchange. Empty if it went well.
// The staging buffers are in place (staging()).
std::string machine_exchange(const LeaderLayout& l, bool uniform) {
  Process& pr = process();
  Result<Stats> r = uniform ? pr.client->alltoall(pr.send, pr.recv, l.send.counts.front(), options())
                            : pr.client->alltoallv(pr.send, sizes(l.send.counts), sizes(l.send.displs), pr.recv, sizes(l.recv.counts),
                                                   sizes(l.recv.displs), options());
  if (r) return "";
  std::string why = r.error().message();
  return why.empty() ? "the exchange failed" : why;
}

// Lengths by (source, destination) comm rank, as the leader knows them: every rank's counts
// if `all` (alltoallv, gathered), else one block length for all (alltoall).
struct Lengths {
  std::vector<std::uint64_t> all;  // local rank k: n send lengths, then n receive lengths
  std::uint64_t block = 0;
};

int leader(MPI_Comm comm, const Plan& p, const Blocks& send, const Blocks& recv, bool uniform, const Lengths& len) {
  const std::size_t n = p.place.machine_of.size();
  auto at = [&](int k, bool receive, int peer) {
    return len.all.empty() ? len.block : len.all[static_cast<std::size_t>(k) * 2 * n + (receive ? n : 0) + static_cast<std::size_t>(peer)];
  };
  const LeaderLayout l = leader_layout(
      p.place, p.machine, [&](int i, int j) { return at(p.place.local_index(i), false, j); },
      [&](int i, int j) { return at(p.place.local_index(j), true, i); });
  const double t0 = PMPI_Wtime();
  std::string error = staging(l.send.total, l.recv.total).value_or("");
  Process& pr = process();
  // Step 1. Without staging (no daemon), into a sink: the local ranks send all the same.
  std::vector<std::uint8_t> sink(error.empty() ? 0 : l.send.total);
  std::uint8_t* into_staging = error.empty() ? pr.send.data() : sink.data();
  std::vector<MPI_Request> reqs;
  std::vector<std::unique_ptr<ByteType>> types;
  for (int k = 0; k < p.local_size; ++k) {
    types.push_back(std::make_unique<ByteType>(l.gather[static_cast<std::size_t>(k)]));
    reqs.emplace_back();
    PMPI_Irecv(into_staging, types.back()->count(), types.back()->type(), k, kTag, p.local, &reqs.back());
  }
  ByteType mine(in_order(send.by_rank, destination_order(p.place)));
  PMPI_Send(send.base, mine.count(), mine.type(), p.leader_rank, kTag, p.local);
  PMPI_Waitall(static_cast<int>(reqs.size()), reqs.data(), MPI_STATUSES_IGNORE);
  const double t1 = PMPI_Wtime();
  if (error.empty()) error = machine_exchange(l, uniform);
  const double t2 = PMPI_Wtime();
  // Tell the local ranks how it went.
  const int length = static_cast<int>(error.size());
  for (int k = 0; k < p.local_size; ++k) {
    if (k == p.leader_rank) continue;
    PMPI_Send(&length, 1, MPI_INT, k, kTag, p.local);
    if (length > 0) PMPI_Send(error.data(), length, MPI_CHAR, k, kTag, p.local);
  }
  if (length > 0) return raise(comm, error);
  // Step 3.
  reqs.clear();
  types.clear();
  for (int k = 0; k < p.local_size; ++k) {
    types.push_back(std::make_unique<ByteType>(l.scatter[static_cast<std::size_t>(k)]));
    reqs.emplace_back();
    PMPI_Isend(pr.recv.data(), types.back()->count(), types.back()->type(), k, kTag, p.local, &reqs.back());
  }
  ByteType into(recv.by_rank);
  PMPI_Recv(recv.base, into.count(), into.type(), p.leader_rank, kTag, p.local, MPI_STATUS_IGNORE);
  PMPI_Waitall(static_cast<int>(reqs.size()), reqs.data(), MPI_STATUSES_IGNORE);
  if (std::getenv("AAPC_MPI_TIMING") != nullptr)
    std::fprintf(stderr, "aapc-mpi: machine %d: gather %.3f ms, exchange %.3f ms, scatter %.3f ms\n", p.machine, (t1 - t0) * 1e3, (t2 - t1) * 1e3,
                 (PMPI_Wtime() - t2) * 1e3);
  return MPI_SUCCESS;
}

// Waits for `reqs` without spinning: the MPIs poll in their waits, and a machine's ranks
// polling while its daemon moves the exchange take the cores the daemon needs.
void wait_quietly(std::vector<MPI_Request>& reqs) {
  std::chrono::microseconds nap{10};
  for (int done = 0;;) {
    PMPI_Testall(static_cast<int>(reqs.size()), reqs.data(), &done, MPI_STATUSES_IGNORE);
    if (done != 0) return;
    std::this_thread::sleep_for(nap);
    nap = std::min(nap * 2, std::chrono::microseconds(500));
  }
}

// Spins in the hand-overs with the leader (large messages move only while both sides call
// into MPI) and sleeps through the machine-level exchange, the long wait.
int member(MPI_Comm comm, const Plan& p, const Blocks& send, const Blocks& recv) {
  ByteType mine(in_order(send.by_rank, destination_order(p.place)));
  PMPI_Send(send.base, mine.count(), mine.type(), p.leader_rank, kTag, p.local);
  std::vector<MPI_Request> reqs(1);
  int length = 0;
  PMPI_Irecv(&length, 1, MPI_INT, p.leader_rank, kTag, p.local, &reqs[0]);
  wait_quietly(reqs);
  if (length > 0) {
    std::string error(static_cast<std::size_t>(length), '\0');
    PMPI_Recv(error.data(), length, MPI_CHAR, p.leader_rank, kTag, p.local, MPI_STATUS_IGNORE);
    return raise(comm, error);
  }
  ByteType into(recv.by_rank);
  PMPI_Recv(recv.base, into.count(), into.type(), p.leader_rank, kTag, p.local, MPI_STATUS_IGNORE);
  return MPI_SUCCESS;
}

// A datatype's layout: contiguous ones are carried in place.
struct TypeInfo {
  MPI_Aint extent = 0;
  std::uint64_t size = 0;
  bool contiguous = false;
};

TypeInfo type_info(MPI_Datatype t) {
  MPI_Aint lb = 0, extent = 0, true_lb = 0, true_extent = 0;
  MPI_Count size = 0;
  PMPI_Type_get_extent(t, &lb, &extent);
  PMPI_Type_get_true_extent(t, &true_lb, &true_extent);
  PMPI_Type_size_x(t, &size);
  TypeInfo i;
  i.extent = extent;
  i.size = static_cast<std::uint64_t>(size);
  i.contiguous = lb == 0 && true_lb == 0 && static_cast<MPI_Count>(extent) == size && static_cast<MPI_Count>(true_extent) == size;
  return i;
}

// Counts and displacements of one side of a call, in elements of its datatype, by comm rank.
struct Side {
  void* buf;
  std::vector<std::int64_t> counts, displs;
  MPI_Datatype type;
};

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
  for (int r = 0; pack && r < n; ++r) {
    int position = 0;
    auto* from = static_cast<std::uint8_t*>(side.buf) + side.displs[static_cast<std::size_t>(r)] * t.extent;
    PMPI_Pack(from, static_cast<int>(side.counts[static_cast<std::size_t>(r)]), side.type, b.base + b.by_rank[static_cast<std::size_t>(r)].offset,
              static_cast<int>(std::min<std::uint64_t>(b.by_rank[static_cast<std::size_t>(r)].length, std::numeric_limits<int>::max())), &position,
              comm);
  }
  return b;
}

void unpack(const Side& side, int n, MPI_Comm comm, const Blocks& b) {
  const TypeInfo t = type_info(side.type);
  for (int r = 0; r < n; ++r) {
    int position = 0;
    const Piece& piece = b.by_rank[static_cast<std::size_t>(r)];
    PMPI_Unpack(b.base + piece.offset, static_cast<int>(std::min<std::uint64_t>(piece.length, std::numeric_limits<int>::max())), &position,
                static_cast<std::uint8_t*>(side.buf) + side.displs[static_cast<std::size_t>(r)] * t.extent,
                static_cast<int>(side.counts[static_cast<std::size_t>(r)]), side.type, comm);
  }
}

// An MPI_Alltoall whose machine-level blocks are smaller than AAPC_MPI_MIN_BLOCK bytes
// (default 8 KiB) runs the MPI's own: below that, aapc's per-phase frames cost more than the
// MPI's small-message algorithms (measured on the emulated cluster at 100 Mbit/s: at 1 KiB
// per rank and 1 rank per machine Open MPI alone reached 90% of the limit, aapc 38%; at
// 16 KiB machine-level blocks aapc 74%, Open MPI 12%). The block size is the same on every
// rank (the call's contract) and so is the placement: every rank decides alike.
bool too_small(const Plan& p, std::uint64_t rank_block) {
  return p.fewest * p.fewest * rank_block < min_block();
}

// Both calls end here. `alltoall`: every block has the same length (the MPI_Alltoall
// contract), which spares the leader a gather of the counts.
int run(Plan& p, MPI_Comm comm, Side send, const Side& recv, bool alltoall) {
  const int n = static_cast<int>(recv.counts.size());
  if (send.buf == MPI_IN_PLACE) send = recv;  // everything is read before anything is written
  std::vector<std::uint8_t> spacked, rpacked;
  const Blocks sb = blocks_of(send, n, comm, spacked, true);
  Blocks rb = blocks_of(recv, n, comm, rpacked, false);
  Lengths len;
  if (alltoall) {
    len.block = sb.by_rank.front().length;
    if (len.block == 0) return MPI_SUCCESS;  // the same on every rank (the call's contract)
  } else {
    std::vector<std::uint64_t> mine;
    for (const Piece& piece : sb.by_rank) mine.push_back(piece.length);
    for (const Piece& piece : rb.by_rank) mine.push_back(piece.length);
    if (p.leader()) len.all.resize(mine.size() * static_cast<std::size_t>(p.local_size));
    PMPI_Gather(mine.data(), static_cast<int>(mine.size()), MPI_UINT64_T, len.all.data(), static_cast<int>(mine.size()), MPI_UINT64_T, p.leader_rank, p.local);
  }
  // Machine-level blocks are all alike for an alltoall on machines with equal numbers of
  // ranks; every rank knows the placement, so every daemon makes the same call.
  const bool uniform = alltoall && p.fewest == p.most;
  std::lock_guard<std::mutex> hold(process().mutex);
  const int rc = p.leader() ? leader(comm, p, sb, rb, uniform, len) : member(comm, p, sb, rb);
  if (!p.carried && rc == MPI_SUCCESS) {  // once per communicator, for AAPC_MPI_VERBOSE
    p.carried = true;
    announce_first(comm, p);
  }
  if (rc == MPI_SUCCESS && !rpacked.empty()) unpack(recv, n, comm, rb);
  return rc;
}

}  // namespace

int alltoallv(const void* sbuf, const int* scounts, const int* sdispls, MPI_Datatype stype, void* rbuf, const int* rcounts, const int* rdispls,
              MPI_Datatype rtype, MPI_Comm comm) {
  Plan& p = plan_of(comm);
  if (!p.aapc) return PMPI_Alltoallv(sbuf, scounts, sdispls, stype, rbuf, rcounts, rdispls, rtype, comm);
  int n = 0;
  PMPI_Comm_size(comm, &n);
  auto wide = [n](const int* v) { return std::vector<std::int64_t>(v, v + n); };
  // With MPI_IN_PLACE the send arguments are ignored (they may be anything).
  Side send{const_cast<void*>(sbuf), sbuf == MPI_IN_PLACE ? wide(rcounts) : wide(scounts), sbuf == MPI_IN_PLACE ? wide(rdispls) : wide(sdispls), stype};
  return run(p, comm, std::move(send), {rbuf, wide(rcounts), wide(rdispls), rtype}, false);
}

int alltoall(const void* sbuf, int scount, MPI_Datatype stype, void* rbuf, int rcount, MPI_Datatype rtype, MPI_Comm comm) {
  Plan& p = plan_of(comm);
  if (!p.aapc || too_small(p, static_cast<std::uint64_t>(rcount) * type_info(rtype).size))
    return PMPI_Alltoall(sbuf, scount, stype, rbuf, rcount, rtype, comm);
  int n = 0;
  PMPI_Comm_size(comm, &n);
  auto side = [n](void* buf, int count, MPI_Datatype type) {
    Side s{buf, std::vector<std::int64_t>(static_cast<std::size_t>(n), count), std::vector<std::int64_t>(static_cast<std::size_t>(n)), type};
    for (int r = 0; r < n; ++r) s.displs[static_cast<std::size_t>(r)] = static_cast<std::int64_t>(r) * count;
    return s;
  };
  return run(p, comm, side(const_cast<void*>(sbuf), scount, stype), side(rbuf, rcount, rtype), true);
}

}  // namespace aapc::mpi

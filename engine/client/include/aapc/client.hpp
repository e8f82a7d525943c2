// The aapc client API: start all-to-all exchanges through the local aapcd.
//
//   aapc::Client client = aapc::Client::connect();   // $AAPC_SOCKET, or /run/aapc/aapcd.sock
//   int me = client.rank(), n = client.size();
//   aapc::Buffer send = client.allocate(n * block), recv = client.allocate(n * block);
//   aapc::Result<aapc::Stats> r = client.alltoall(send, recv, block, aapc::Options{});
//   if (!r) std::cerr << r.error().message() << "\n";
//
// Exchanges are collective: every rank calls them in the same order, as with MPI. Block d of
// `send` (bytes d*block .. (d+1)*block) goes to rank d; block s of `recv` comes from rank s.
// Buffers are shared memory: the daemon reads and writes them directly, without copies. A
// collective's send and receive blocks may not share memory.
//
// One client per machine runs the whole cluster's collectives at a time: the first that starts
// one, until it disconnects. Another client's collectives fail at once with Errc::kBusy, naming
// the holder; status() and allocate() work for every client.
//
// Groups run collectives among some machines, or among all of them for several
// clients of a machine at once. Every member's client opens the group together:
//
//   aapc::Result<aapc::Client> g = client.open_group({0, 2, 5}, reduce);  // ranks of the cluster
//   g->alltoall(send, recv, block);   // among ranks 0, 2 and 5; g->rank() is 0, 1 or 2
//
// A group's collectives are numbered apart from the cluster's and from other groups', so each
// group keeps its own order, and any number of clients of a machine may each hold groups.
//
// A Client, Buffer or Request belongs to one thread at a time. Different ones of one
// connection (a Client, the groups it opened, their buffers and requests) may be used by
// different threads at once: the connection takes one request at a time.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "aapc/result.hpp"

namespace aapc {

struct Options {
  // "auto" (chosen from the topology and the block size) or an algorithm of the registry, with
  // its parameter if it takes one ("group-shuffle:8"): docs/guide.md lists them, and so does
  // `aapc-sched --help`. For alltoallv also the all-to-many decompositions ("sparse", "cgm",
  // ...): the daemons first agree on the pattern (docs/sparse.md), as `auto` does on a tree of
  // switches.
  std::string schedule = "auto";
  // The parameter of an algorithm that takes one (group-shuffle's W, at least 1) when
  // `schedule` gives none; other algorithms ignore it.
  int group = 4;
  // "auto", or one of "none", "dummy", "sender-all", "sender-partial:BS", "receiver-all",
  // "receiver-partial:BS", "barrier-all", "barrier-partial-none:BS",
  // "barrier-partial-sender:BS", "barrier-partial-receiver:BS".
  std::string sync = "auto";
  // The whole exchange. 0: a deadline derived from the exchange's size and the link rates,
  // which fails it only once it also stopped making progress (README, "Using it from a program").
  std::chrono::milliseconds timeout{0};
  // start_alltoall(v) only: the start is one message to the daemon, not a round trip, and the
  // request's wait(), test() or wait_for() reads the daemon's one answer, sent when the exchange
  // is over (test() then asks the daemon nothing). A start the daemon refuses (a bad block, an
  // unknown schedule, too many collectives) fails at the request's wait or test, and id() is 0
  // until the request has its result.
  bool one_message_start = false;
};

struct RoundTime {
  double start_s = 0;  // since the exchange started here
  double end_s = 0;    // when this node's sends of the round were done
};

struct Stats {
  std::uint32_t exchange = 0;
  std::string schedule;  // what ran, e.g. "tree"
  std::string sync;
  double seconds = 0;  // from start to completion on this node
  std::uint64_t bytes_sent = 0, bytes_received = 0;
  std::uint64_t retransmissions = 0;
  double sync_wait_seconds = 0;  // rounds waiting for sync tokens and READY, summed
  double daemon_cpu_seconds = 0; // CPU the daemon spent while the exchange ran
  std::vector<RoundTime> rounds;
};

// What the local daemon knows of the cluster.
struct ClusterInfo {
  int rank = 0;
  int size = 0;
  std::string machine;   // this machine's name in the topology
  std::string topology;  // the topology's name
  int mtu = 0;
  double peak_bps = 0;   // physical limit of the aggregate throughput (Faraj/Yuan section 3)
  std::uint32_t epoch = 0;
};

// Thrown by Client::connect() and Client::allocate(), which have no result to carry an error.
class Exception : public std::runtime_error {
 public:
  explicit Exception(Error error) : std::runtime_error(error.message()), error_(std::move(error)) {}
  const Error& error() const { return error_; }

 private:
  Error error_;
};

struct Connection;
struct StartMessage;
struct GroupHandle;

// What Client::open_group's `reduce` computes over the processes that open the group.
enum class ReduceOp : std::uint8_t { kAnd, kMax };

// Memory shared with the daemon. Move-only; released when destroyed.
class Buffer {
 public:
  Buffer() = default;
  Buffer(Buffer&& other) noexcept;
  Buffer& operator=(Buffer&& other) noexcept;
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  ~Buffer();

  std::uint8_t* data() { return data_; }
  const std::uint8_t* data() const { return data_; }
  std::size_t size() const { return size_; }
  template <typename T>
  T* as() {
    return reinterpret_cast<T*>(data_);
  }
  explicit operator bool() const { return data_ != nullptr; }

 private:
  friend class Client;
  void release();
  std::shared_ptr<Connection> conn_;
  std::uint32_t id_ = 0;
  std::uint32_t generation_ = 0;
  std::uint8_t* data_ = nullptr;
  std::size_t size_ = 0;
};

struct PostedStart;

// An exchange started with a start_* call.
class Request {
 public:
  // Blocks until the exchange finished here.
  Result<Stats> wait();
  // The result if the exchange finished, nullopt while it runs.
  std::optional<Result<Stats>> test();
  // Blocks until the exchange finished here, or for `bound` at most (to the daemon's next look
  // at its clients, about a millisecond while exchanges run): the result, or nullopt while it
  // runs. Between two such waits a caller may do other work (an MPI library moves its other
  // requests) and still learn of the end at once, not at its next test().
  std::optional<Result<Stats>> wait_for(std::chrono::microseconds bound);
  std::uint32_t id() const { return id_; }

 private:
  friend class Client;
  // A one-message start's (Options::one_message_start) answer, waited for up to `bound` (for
  // ever without one).
  std::optional<Result<Stats>> posted_result(std::optional<std::chrono::microseconds> bound);
  std::shared_ptr<Connection> conn_;
  std::uint32_t id_ = 0;
  std::shared_ptr<PostedStart> posted_;  // a one-message start's, until its answer is read
  std::optional<Result<Stats>> result_;
};

class Client {
 public:
  // Connects to `socket`, or $AAPC_SOCKET, or /run/aapc/aapcd.sock. Throws aapc::Exception.
  static Client connect(const std::string& socket = "");
  static Result<Client> try_connect(const std::string& socket = "");

  // This client's rank and the number of ranks: the cluster's, or in a group, the group's.
  int rank() const;
  int size() const;
  // The cluster (also for a group).
  const ClusterInfo& info() const;

  // Opens a group of `members` (distinct ranks of the cluster, this one's included; group rank
  // i is members[i]) and returns a Client whose collectives run among them alone; it shares
  // this one's connection and buffers. Collective over one process per member, each passing
  // the same members. `reduce(words, op)` must replace `words` by their element-wise AND or
  // maximum over those processes, as MPI_Allreduce with MPI_BAND or MPI_MAX on uint64_t does:
  // the members agree through it on a slot free at every daemon and on the group's first
  // exchange id (MPICH agrees on context ids the same way). Every member gets the same
  // outcome: the group, or an error (a member's own problem, or Errc::kBusy when no slot is
  // free on every member). The group closes when the last copy of the returned Client goes.
  using Reduce = std::function<void(std::vector<std::uint64_t>& words, ReduceOp op)>;
  Result<Client> open_group(const std::vector<int>& members, const Reduce& reduce) const;
  // The cluster ranks of this client's ranks: members[i] is rank i (0..size-1 outside groups).
  std::vector<int> members() const;

  // Shared memory of `bytes` bytes, registered with the daemon. Throws aapc::Exception.
  Buffer allocate(std::size_t bytes);

  // Every rank sends block d of `send` to rank d and receives block s of `recv` from rank s.
  Result<Stats> alltoall(const Buffer& send, Buffer& recv, std::size_t block, const Options& options = {});
  Result<Request> start_alltoall(const Buffer& send, Buffer& recv, std::size_t block, const Options& options = {});

  // All-to-many (MPI_Alltoallv): per-rank counts and displacements, in bytes. A zero count
  // sends (or expects) nothing.
  Result<Stats> alltoallv(const Buffer& send, const std::vector<std::size_t>& send_counts, const std::vector<std::size_t>& send_displs,
                          Buffer& recv, const std::vector<std::size_t>& recv_counts, const std::vector<std::size_t>& recv_displs,
                          const Options& options = {});
  Result<Request> start_alltoallv(const Buffer& send, const std::vector<std::size_t>& send_counts,
                                  const std::vector<std::size_t>& send_displs, Buffer& recv, const std::vector<std::size_t>& recv_counts,
                                  const std::vector<std::size_t>& recv_displs, const Options& options = {});

  // Returns once every rank has called it (a collective too).
  Result<void> barrier();

  // The daemon's state and counters, as JSON text.
  Result<std::string> status();

 private:
  Client() = default;
  // Checks the buffers and the blocks of `message` in them, then starts it. An alltoall
  // carries its block size once, which lets the daemons choose the schedule by block size
  // and still agree.
  Result<Request> start(const Buffer& send, Buffer& recv, StartMessage& message, bool one_message);
  Result<Request> send_start(const StartMessage& message);
  Result<void> check_blocks(const Buffer& send, const Buffer& recv, StartMessage& message) const;
  // START and WAIT in one request (RUN): a blocking collective.
  Result<Stats> run(const StartMessage& message);
  // The START of a collective of `kind` in this client's group, if any.
  StartMessage start_message(int kind, const Options& options) const;
  std::shared_ptr<Connection> conn_;
  std::shared_ptr<GroupHandle> group_;  // none: the whole cluster
};

}  // namespace aapc

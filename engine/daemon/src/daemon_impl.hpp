// The daemon's insides (private to engine/daemon/): the state Daemon::Impl keeps and its parts, one
// file per concern:
//   daemon.cpp           the public Daemon, the service loop, finished exchanges
//   daemon_port.cpp      the port, its decorators (faults, capture), the engine and its pacing
//   daemon_control.cpp   the Unix socket, clients coming and going, dispatch
//   daemon_admission.cpp who may connect: credentials and groups, limits per uid, HELLO's timeout
//   daemon_requests.cpp  the requests about buffers and results: HELLO, REGISTER, FREE, WAIT/TEST
//   daemon_session.cpp   START: blocks checked, schedule chosen and cached, the session's join
//   daemon_groups.cpp    GROUP_QUERY, GROUP_OPEN, GROUP_CLOSE: collectives among some machines
//   daemon_sparse.cpp    alltoallv: the counts agreed first, then CGM for sparse patterns
//   daemon_status.cpp    STATUS: the state and counters as JSON
//   daemon_measure.cpp   what this node's tree exchanges measured, proposed at each session's join
#pragma once

#include <sys/socket.h>
#include <sys/types.h>

#include <array>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "aapc/core/engine.hpp"
#include "aapc/daemon/daemon.hpp"
#include "aapc/nic/capture.hpp"
#include "aapc/nic/eth_port.hpp"
#include "aapc/nic/fault.hpp"
#include "aapc/proto/protocol.hpp"
#include "aapc/result.hpp"
#include "aapc/sched/algorithms.hpp"
#include "aapc/sched/alltomany.hpp"
#include "aapc/sched/choice.hpp"
#include "aapc/sched/topology.hpp"
#include "aapc/sched/tree.hpp"
#include "aapc/wire/serial.hpp"
#include "mapping.hpp"

namespace aapc::engine {

struct ClientState {
  int fd = -1;
  uid_t uid = 0;
  pid_t pid = 0;
  std::uint32_t next_buffer = 1;
  bool started = false;  // has run exchanges: part of the cluster's current session
  bool greeted = false;  // has said HELLO; until then it is closed after cfg.hello_timeout
  std::string job;       // HELLO's: the job it belongs to (empty: not known)
  Clock::time_point connected{};
  std::map<std::uint32_t, Mapping> buffers;
  std::set<std::uint32_t> exchanges;  // running or finished, not yet collected
};

struct ExchangeRecord {
  int client = -1;  // fd of the owner
  std::string schedule, sync;
  // What the cluster's alltoall measures (daemon_measure.cpp, note_measured): its block (0:
  // another collective, or a group's), and whether it ran the tree's phases with tokens (their
  // fit) or one of the schedules `auto` weighs at a size it keeps (their reach).
  std::uint64_t measured_block = 0;
  bool tree_phases = false;
  std::optional<std::size_t> reach_cell;
  std::set<std::uint32_t> buffers;
  std::int64_t cpu_ns = 0;  // process CPU time at the start, then spent during the exchange
  std::optional<ExchangeReport> report;
  std::vector<std::uint32_t> waiters;  // request ids of WAITs to answer
  // WAITs with a bound (WaitRequest::bound_us): request ids, and when RUNNING answers them.
  std::vector<std::pair<std::uint32_t, Clock::time_point>> bounded;
};

// Who runs this node's rank in the cluster's collectives. Every node must give a collective
// the same exchange id, and ids are numbered per node: a second client's START would take
// ids that the other nodes give to the first client's collectives, and both would "succeed"
// with each other's bytes. So one client at a time holds the rank, from its first START until
// it goes away. Groups (several clients sharing the rank) grow from here.
struct RankHolder {
  int client = -1;  // fd of the holder; -1 while the rank is free
  pid_t pid = 0;
  uid_t uid = 0;
  std::string job;
  bool held_by_other_than(int fd) const { return client >= 0 && client != fd; }
};

// The schedules of one tree, built once and cached: the whole cluster's tree, or the one
// that joins a group's members. Dense schedules are cached by plan spec ("algorithm+sync"),
// all-to-many ones by pattern. Not moved: the model refers to the tree.
struct TreeSchedules {
  explicit TreeSchedules(sched::Topology tree, int radix = 0, std::size_t plans = 64)
      : topo(std::move(tree)), model(topo), barrier_radix(radix), max_plans(plans) {}
  TreeSchedules(const TreeSchedules&) = delete;
  TreeSchedules& operator=(const TreeSchedules&) = delete;
  // `me`: this node's rank in `topo`; the same in every call.
  std::shared_ptr<const sched::Schedule> schedule(const sched::AlgorithmSpec& algo, const sched::SyncSpec& sync, sched::Rank me);
  std::shared_ptr<const sched::Schedule> barrier();
  sched::Topology topo;
  sched::TreeModel model;
  int barrier_radix = 0;  // DaemonConfig::barrier_radix
  std::size_t max_plans = 64;  // DaemonConfig::max_plans
  // By plan spec, with when each was last used: a client that names thousands of specs must
  // not grow the daemon without end. Exchanges hold their schedule themselves (shared_ptr).
  struct Cached {
    std::shared_ptr<const sched::Schedule> schedule;
    std::uint64_t used = 0;
  };
  std::map<std::string, Cached> cached;
  std::uint64_t uses = 0;
  // An alltoallv's agreement on its pattern (daemon_sparse.cpp): its rows to rank 0 and the
  // verdict back, and the all-to-many schedules of patterns seen, over this tree.
  std::shared_ptr<const sched::Schedule> gather, broadcast, barrier_schedule;
  sched::SparsePlanCache sparse_plans{16};
};

// Some machines of the cluster whose collectives are numbered in a slot of their own
// (serial.hpp), so that several clients of a machine can each run a group's collectives, and a
// group need not span the cluster. Its members' clients agreed on the slot and the first id.
struct Group {
  int client = -1;            // fd of the client that opened it: the only one that starts its collectives here
  std::vector<Rank> members;  // cluster ranks, by group rank
  Rank me = -1;               // this node's group rank
  std::uint32_t next_id = 0;
  std::unique_ptr<TreeSchedules> schedules;  // over the tree that joins the members
};
inline constexpr std::size_t kMaxGroupsPerClient = 64;

// A START checked and ready to run but for its id.
struct Prepared {
  int client = -1;
  std::uint32_t slot = kWorldSlot;  // the group it runs in (0: the whole cluster)
  std::uint32_t request = 0;
  std::shared_ptr<const sched::Schedule> schedule;
  std::vector<SendBlock> send;
  std::vector<RecvBlock> recv;
  std::uint32_t timeout_ms = 0;
  Collective kind = Collective::kUnspecified;  // with the block, what the ranks agree on
  std::uint64_t block = 0;
  bool run = false;  // RUN: the reply is DONE when it finished, no STARTED
  ExchangeRecord rec;
  // An alltoallv whose schedule waits for the counts of every rank (daemon_sparse.cpp); `schedule`
  // is the dense one until then (it sizes the join's deadline).
  bool counts_first = false;
  std::string spec;  // the START's "ALGORITHM[+SYNC]"
};

// An alltoallv's agreement on its pattern (daemon_sparse.cpp): every rank's row of sizes (n send
// sizes, then n receive sizes, u64 in this host's byte order: the cluster runs one build) is
// gathered at rank 0 (of the cluster, or of the group), which checks them against each other
// and broadcasts the verdict (empty, or what disagrees) and every rank's bitmap of
// destinations. Then exchange `id` runs with the schedule the pattern calls for.
struct Counting {
  Prepared p;                          // p.slot: the whole cluster's, or a group's
  std::vector<Rank> members;           // a group's, told when it fails; empty: every rank
  std::uint32_t broadcast_id = 0, id = 0;
  bool gathered = false;               // the gather is done; the broadcast runs
  std::size_t words = 0;               // of one bitmap row
  std::vector<std::uint64_t> row;      // ours
  std::vector<std::uint64_t> rows;     // rank 0's: rank r's row at r * 2n
  std::vector<std::uint64_t> verdict;  // the text's length, its kVerdictWords words, then the bitmaps
};

// Setup errors: std::runtime_error with the reason, for aapcd's main to print.
[[noreturn]] void fail(const std::string& what);
// The process's CPU time, in nanoseconds.
std::int64_t cpu_now();

struct Daemon::Impl {
  DaemonConfig cfg;
  sched::Topology topo;
  std::unique_ptr<TreeSchedules> world;  // over topo
  int rank = -1;
  std::unique_ptr<nic::EthPort> eth;
  std::unique_ptr<nic::FaultPort> faults;
  std::unique_ptr<nic::CapturePort> capture;
  std::unique_ptr<nic::OffloadPort> offload;  // with cfg.io_cores
  std::optional<FrameKey> key;                // the cluster key, which the I/O lcore's check reads
  std::unique_ptr<Engine> engine;
  std::vector<std::unique_ptr<nic::IoLcore>> io_lcores;  // stopped first, before the engine and the ports
  int listen_fd = -1;
  bool bound = false;  // the socket file is ours to remove (not another daemon's we refused)
  gid_t socket_gid = static_cast<gid_t>(-1);  // --socket-group's: its members may connect
  int epoll_fd = -1;
  int port_fd = -1;  // in epoll_fd: readable when frames wait (else the port is polled)
  std::map<int, ClientState> clients;
  RankHolder holder;
  Clock::time_point next_idle_check{};
  Clock::time_point next_refusal_log{};  // refusals are logged at most once a second
  std::map<std::uint32_t, ExchangeRecord> exchanges;
  std::set<std::uint32_t> bounded_waits;  // exchanges with bounded WAITs (ExchangeRecord::bounded)
  void expire_bounded_waits(Clock::time_point now);
  std::uint32_t next_id = 1;
  std::map<std::uint32_t, Group> groups;  // by slot
  std::vector<std::uint32_t> slot_next = std::vector<std::uint32_t>(kSlots, 1);  // by slot: the sequence after the last used here
  std::map<std::uint32_t, Counting> counting;  // by the id of its gather or broadcast running
  // Ids must grow at the engine: collectives of a slot started while an alltoallv of the slot
  // agrees on its pattern wait until its exchange has started.
  std::deque<Prepared> waiting_counts;
  bool joined = false;                // the cluster agreed on ids for the current session
  std::deque<Prepared> waiting_join;  // STARTs until it has
  std::uint64_t pace_bps = 0;
  // The switch buffer that sender-based tokens may lead by, over a schedule (token_slack): the
  // topology's smallest, found once.
  std::uint64_t slack_buffer = sched::kDefaultSwitchBufferBytes;
  // Buffers freed (or of clients gone) whose bytes frames may still carry.
  Unmapper unmapper;

  ~Impl();

  // daemon_port.cpp
  void open_port();
  int rank_of_port() const;
  nic::Port& decorate_port();
  // With cfg.io_cores: the port given to the engine is served by I/O lcores.
  void open_iface(const nic::PortOptions& po);
  // The highest rate the port sent and received at over a window of kRateWindow while
  // exchanges ran (`aapc status`: what this node reached; a port that cannot fill its link
  // shows here below the link's rate).
  static constexpr std::chrono::milliseconds kRateWindow{50};
  struct PortRates {
    Clock::time_point start{};
    std::uint64_t sent = 0, received = 0;
    double peak_send_bps = 0, peak_receive_bps = 0;
  } rates;
  void sample_rates(Clock::time_point now, bool running);
  nic::Port& offload_port(nic::Port& port);
  // Around a sleep on the port's descriptor: with an I/O lcore receiving, it rings the engine's
  // doorbell once frames arrive (false: frames wait already, do not sleep).
  bool arm_port_wait() { return offload == nullptr || offload->arm_wait(); }
  void disarm_port_wait() {
    if (offload != nullptr) offload->disarm_wait();
  }
  std::uint16_t sending_lcores() const;
  void start_io_lcores();
  void choose_pace();

  // daemon_control.cpp
  void open_socket();
  gid_t socket_dir() const;
  void bind_socket(gid_t gid);
  void watch_socket_and_port();
  static void reply_error(int fd, std::uint32_t request, Errc code, const std::string& message);
  static void reply_error(int fd, std::uint32_t request, const Error& error) { reply_error(fd, request, error.code(), error.message()); }
  void accept_clients();
  void close_client_resources(ClientState& c);
  void drop_client(int fd);
  bool serve_client(int fd);

  // daemon_admission.cpp
  bool allowed(int fd, const ucred& cred) const;
  Result<void> admission(int fd, const ucred& cred) const;
  void refuse_connection(int fd, const ucred& cred, Errc code, const std::string& why);
  void close_idle_clients();
  Result<void> rank_free_for(const ClientState& c) const;  // kBusy while another client holds it
  void claim_rank(ClientState& c);
  void release_rank(const ClientState& c);

  // daemon_quotas.cpp
  bool limited(const ClientState& c) const;  // other than root and the daemon's uid
  std::size_t in_flight(const ClientState& c) const;  // its collectives waiting, running or not yet collected
  Result<void> start_quota(const ClientState& c, const proto::StartRequest& m) const;  // kBusy past a cap
  Result<void> buffer_quota(const ClientState& c, std::uint64_t size) const;            // kBusy past a cap

  // daemon_requests.cpp
  void serve(ClientState& c, std::uint32_t request, const proto::HelloRequest& m);
  void serve(ClientState& c, std::uint32_t request, const proto::FreeRequest& m);
  void serve(ClientState& c, std::uint32_t request, const proto::StartRequest& m);
  void serve(ClientState& c, std::uint32_t request, const proto::WaitRequest& m);
  void serve(ClientState& c, std::uint32_t request, const proto::StatusRequest& m);
  void hello(ClientState& c, std::uint32_t request);
  void register_buffer(ClientState& c, std::uint32_t request, const proto::RegisterRequest& m, int fd);
  bool buffer_busy(std::uint32_t client_fd, std::uint32_t buffer) const;
  void free_buffer(ClientState& c, std::uint32_t request, const proto::FreeRequest& m);
  void send_done(int fd, std::uint32_t request, std::uint32_t id, const ExchangeRecord& rec);
  void wait(ClientState& c, std::uint32_t request, const proto::WaitRequest& m);

  // daemon_groups.cpp
  void serve(ClientState& c, std::uint32_t request, const proto::GroupQueryRequest& m);
  void serve(ClientState& c, std::uint32_t request, const proto::GroupOpenRequest& m);
  void serve(ClientState& c, std::uint32_t request, const proto::GroupCloseRequest& m);
  Result<void> open_group(const ClientState& c, const proto::GroupOpenRequest& m);
  // Closes a group; `why` tells peers waiting in its next collective (empty: nobody is told).
  void close_group(std::uint32_t slot, const std::string& why);
  // The group of a START's slot is open here and held by client `c`; kInvalidArgument if not.
  Result<void> group_held_by(const ClientState& c, std::uint32_t slot) const;
  TreeSchedules& schedules_of(std::uint32_t slot) { return slot == kWorldSlot ? *world : *groups.at(slot).schedules; }
  const TreeSchedules& schedules_of(std::uint32_t slot) const { return slot == kWorldSlot ? *world : *groups.at(slot).schedules; }
  // A slot's engine spec of `schedule` (in the slot's ranks) as exchange `id`, over the cluster's
  // ranks; and the cluster rank of the slot's rank `r`.
  ExchangeSpec slot_spec(std::uint32_t slot, const sched::Schedule& schedule, std::uint32_t id) const;
  std::size_t cluster_rank(std::uint32_t slot, std::size_t r) const;
  Rank rank_in(std::uint32_t slot) const { return slot == kWorldSlot ? rank : groups.at(slot).me; }
  // The id the next collective of `slot` gets, used up.
  std::uint32_t take_id(std::uint32_t slot);

  // daemon_session.cpp
  void start_or_join(ClientState& c, std::uint32_t request, const proto::StartRequest& m);
  void joins();
  void launch(Prepared p);
  ExchangeSpec spec_of(const Prepared& p, std::uint32_t id) const;
  // A START's checks, each kInvalidArgument with what the request got wrong.
  Result<Prepared> prepare(const ClientState& c, std::uint32_t request, const proto::StartRequest& m);
  Result<void> place_blocks(const ClientState& c, const proto::StartRequest& m, std::size_t n, Prepared& p) const;
  static Result<void> blocks_apart(const proto::StartRequest& m, std::size_t n, const Mapping& send, const Mapping& recv);
  Result<void> choose_schedule(Prepared& p);  // from p.spec; again once a join agreed

  // daemon_measure.cpp
  // The last kMeasuresKept of this node's tree exchanges, the last kReachesKept reaches of each
  // schedule `auto` weighs at each size, by exchange, and what the session's join agreed on
  // (sched::Measured, used by `auto` for the cluster's collectives).
  static constexpr std::size_t kMeasuresKept = 32;
  // One unscheduled exchange in five lost a frame and took 2.5 times as long at 200 Mbit/s on
  // 8-two-switch, and a window of 6 held none of them one time in five (docs/design.md).
  // A JOIN at MTU 1500 carries 200 of them, the newest of each cell (join_measure).
  static constexpr std::size_t kReachesKept = 32;
  std::deque<sched::TreeSample> measures;
  struct Reach {
    std::uint32_t exchange;
    double reach;
  };
  std::array<std::deque<Reach>, sched::kReachCells> reaches;
  sched::Measured agreed;
  // This session's alltoalls that `auto` chose by measurement: every kMeasureUnmeasuredEvery-th
  // runs one of the others that the session's join knew nothing of at that size, and every
  // kRemeasureEvery-th one of the others in turn, so that each is measured, and a measure taken
  // while the hosts were busy does not keep a schedule off for good. Counted alike on every rank:
  // only choices made once the session is agreed count, and every rank makes the same ones in
  // the same order.
  static constexpr std::uint64_t kMeasureUnmeasuredEvery = 16;
  static constexpr std::uint64_t kRemeasureEvery = 64;
  std::uint64_t weighed_choices = 0;
  sched::Choice measured_choice(const TreeSchedules& tree, const Prepared& p, const std::string& spec);
  sched::Choice measure_another(const sched::Choice& chosen, std::uint64_t block);
  void note_measured(const sched::Choice& choice, Prepared& p) const;
  void measure(const ExchangeRecord& rec, const ExchangeReport& rep);
  sched::Measured own_measure() const;  // fitted to `measures`, with each `reaches` together
  JoinMeasure join_measure() const;
  void take_agreed(const AgreedMeasure& m);
  std::string measures_path() const;
  void load_measures();
  void save_measures() const;

  // daemon_sparse.cpp
  static bool counts_first(const std::string& spec, const sched::Topology& tree);
  bool agreeing(std::uint32_t slot) const;  // an alltoallv of the slot agrees on its pattern
  bool still_open(const Counting& k) const;  // its group (if any) is the one it started in
  void launch_counted(Prepared p);
  Result<void> start_counts(Counting& k, std::uint32_t id, bool broadcast);
  void judge_counts(Counting& k) const;
  bool counted(const ExchangeReport& rep);
  Result<void> choose_counted_schedule(Counting& k);  // kInvalidArgument: the counts disagree, or no schedule fits
  void fail_exchange(std::uint32_t id, Errc code, const std::string& why);
  void launch_waiting();

  // daemon_status.cpp
  void status(ClientState& c, std::uint32_t request);

  // daemon.cpp
  void collect_finished();
  void finished(const ExchangeReport& rep);
  void service(int timeout_ms);
  void shut_down();
};

}  // namespace aapc::engine

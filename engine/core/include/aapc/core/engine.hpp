// The per-node packet engine: executes a node's program (schedules/) as raw Ethernet frames
// on a port (nic/), reassembles what peers send straight into the receive buffer, and recovers
// from loss. One poll loop drives everything; an Engine is used by one thread.
#pragma once

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdint>
#include <functional>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "aapc/core/types.hpp"
#include "aapc/nic/io_lcore.hpp"
#include "aapc/nic/port.hpp"
#include "aapc/result.hpp"
#include "aapc/sched/schedule.hpp"
#include "aapc/wire/descriptor.hpp"
#include "aapc/wire/wire.hpp"

namespace aapc::engine {

class Exchange;
class EngineLink;

// The hook an I/O lcore (nic/io_lcore.hpp) runs on received frames: integrity_holds() with
// `key` (nullptr: none), which must outlive the lcore. The engine then checks neither the CRC
// nor the tag of those frames again: the pass over every received byte moves to that lcore.
nic::FrameHook integrity_hook(const FrameKey* key);
// The hook an I/O lcore runs on frames to send: it seals those the engine left unsealed
// because its port has a tx_seal_flag() (their CRC, and with `key` their tag): the pass over
// every sent byte besides the copy into the frame moves to that lcore.
nic::FrameHook seal_hook(const FrameKey* key);

// Whose collectives a session runs (Engine::start_join): a uid, and a tag of its job (job_tag;
// 0: not known). A JOIN carries them in its aux and exchange fields.
struct JoinOwner {
  std::uint32_t uid = 0, job = 0;
  friend bool operator==(const JoinOwner&, const JoinOwner&) = default;
};
// A 32-bit tag of a job's name (FNV-1a; 0 only for the empty name).
std::uint32_t job_tag(const std::string& job);

class Engine final : private ParseContext {
 public:
  Engine(nic::Port& port, EngineConfig config);
  ~Engine() override;
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Posts the buffers and starts the exchange (READY goes to every peer that will send).
  Result<void> start(ExchangeSpec spec);
  // One iteration of the loop: receive a burst, run timers, send what pacing allows.
  // Returns true when it handled or sent frames.
  bool poll();
  // Aborts a running exchange here and tells the peers (ABORT frames).
  void abort(std::uint32_t id, const std::string& reason);
  // State of a running or recently finished exchange.
  std::optional<ExchangeReport> report(std::uint32_t id) const;
  // Exchanges that finished (done or failed) since the last call.
  std::vector<ExchangeReport> take_finished();
  // True when nothing is running and nothing waits to be sent.
  bool quiet() const;
  // When poll() next has something to do other than receiving: now when frames can be sent,
  // else when pacing lets the next one go or the timers are due. A caller that sleeps until
  // then (or until a frame arrives, Port::wait_fd) loses nothing.
  Clock::time_point next_event(Clock::time_point now) const;
  // Until when frames that arrive may wait in the port's ring: while every running exchange is
  // a paced round with frames left to send, which waits for nothing it receives, a sleeping
  // caller need not wake for each frame (at most kPacedWake, 300 us, from now); else now.
  Clock::time_point receive_wait_until(Clock::time_point now) const;
  // Says hello to every peer (a PING), so that peers learn this engine's epoch at once: a
  // daemon that restarted is noticed before its first exchange.
  void announce();
  // The deadline an exchange of `spec` gets when its timeout is 0 (default_timeout).
  std::chrono::milliseconds default_timeout(const ExchangeSpec& spec) const { return engine::default_timeout(spec, config_, chunk_); }
  // Tells the peers that exchange `id`, which this node will never start, is off: `ranks`, or
  // every peer when empty.
  // `ends_session`: this node's part of the cluster's session is over (its client went away),
  // so a JOIN proposal it made is void at the peers; or, for a group's id, this node's member
  // left the group, so the peers start none of its later exchanges with us (note_left). The
  // ABORT's seq says so: kAbortEndsSession.
  void abort_unstarted(std::uint32_t id, const std::string& reason, const std::vector<Rank>& ranks = {}, bool ends_session = false);
  static constexpr std::uint32_t kAbortEndsSession = 1;
  // This node will start no exchange of `slot` from id `from` on (its client, or its group,
  // went away): a peer's frame for one is answered with an ABORT naming `reason`, so that the
  // peer's collective fails at once rather than at its deadline. Only `members` are answered
  // (empty: every peer). Until reopen_slot(slot).
  void close_slot(std::uint32_t slot, std::uint32_t from, const std::string& reason, const std::vector<Rank>& members = {});
  // A new session (kWorldSlot), or a group that opens in `slot` here from id `first`: this node
  // starts the slot's exchanges again, and what the peers said of an earlier group in the slot
  // (their members that left it) is forgotten.
  void reopen_slot(std::uint32_t slot, std::uint32_t first = 0);
  // True while `peer` is remembered as dead (an exchange found it silent, and nothing came
  // from it since): start() refuses exchanges that involve it.
  bool peer_dead(Rank peer) const;
  // Called when a peer shows up with a later epoch (it restarted); running exchanges with it
  // have failed by then.
  std::function<void(Rank)> on_peer_restart;

  // Agreeing on exchange ids at the start of a session (the first exchange of new clients):
  // every engine proposes the id it would use next, and all take the largest. Ids thus only
  // grow, whatever happened before (failed exchanges, a restarted daemon), and frames of
  // earlier exchanges can never be taken for later ones. A peer whose daemon answers but
  // proposes nothing (no client there called the collective) fails the join after `deadline`
  // (0: never; the daemon gives the first waiting exchange's, default_timeout()).
  // `owner` says whose collectives the session runs (the daemon gives its client's uid and job):
  // every engine must propose the same, or the join fails naming the rank and its owner, before
  // any block leaves. Another user's client, or another job's, that took one machine's rank
  // first must not swap blocks with a job on the others (docs/design.md, "Jobs kept apart").
  // `measured`: what this node measured of its exchanges (the daemon's; the newest reaches that
  // fit a frame are sent); the join agrees on it (agreed_measure()).
  void start_join(std::uint32_t proposal, std::chrono::milliseconds deadline = std::chrono::milliseconds(0), JoinOwner owner = {},
                  JoinMeasure measured = {});
  bool joining() const { return joining_; }
  // The agreed id once every peer's proposal is in; an error when a peer stays silent.
  std::optional<Result<std::uint32_t>> join_result();
  // What the last join that succeeded agreed on, from the same proposals on every rank: the
  // lowest fill and the longest hand-over of the ranks that measured one, and for each cell what
  // its exchanges reach together, each at the lowest reach a rank saw of it; nothing if none.
  const AgreedMeasure& agreed_measure() const { return agreed_measure_; }

  const EngineCounters& counters() const;
  static constexpr std::size_t kMaxEarly = 64;  // exchanges not started yet whose frames we keep
  std::uint32_t epoch() const { return epoch_; }
  Rank rank() const { return config_.rank; }
  std::uint32_t chunk() const { return chunk_; }
  const EngineConfig& config() const { return config_; }

 private:
  // ParseContext
  Rank rank_of(const MacAddr& mac) const override;
  Expected expect_data(std::uint32_t exchange, std::uint32_t epoch, Rank src) const override;
  std::uint8_t* place_at(std::uint32_t exchange, Rank src, std::uint32_t seq) const override;

  void receive(Clock::time_point now);
  void handle(const Parsed& f, Clock::time_point now);
  void on_abort(const Parsed& f, Clock::time_point now);
  void on_join(const Parsed& f);
  bool answer_done(const Parsed& f);  // a frame of a completed, forgotten exchange: true when answered
  void on_ack_list(const Parsed& f, Clock::time_point now);
  void keep_early(const Parsed& f);
  void keep_early_data(const Parsed& f);
  EarlyFrames& early_entry(std::uint32_t id);
  // Erases an entry of early_, and its payload from early_data_bytes_.
  std::map<std::uint32_t, EarlyFrames>::iterator erase_early(std::map<std::uint32_t, EarlyFrames>::iterator it);
  // Whether frames of exchange `id`, not started here, may be kept for its start: while it
  // may still start (after the last one started), in one of kMaxEarly entries, which the
  // exchange that would start last here gives up to a nearer one (early_entry).
  bool may_keep_early(std::uint32_t id) const;
  // How far after the last exchange of its slot started here `id` comes (0 before any start).
  std::uint32_t ahead(std::uint32_t id) const;
  // Whether `id` is later than every exchange of its slot started here.
  bool after_last_started(std::uint32_t id) const;
  // The entry of early_ for the exchange that would start last here (early_ not empty).
  std::map<std::uint32_t, EarlyFrames>::const_iterator farthest_early() const;
  void timers(Clock::time_point now);
  void expire_early_data(Clock::time_point now);  // EngineConfig::early_data_expiry
  // Erases a lingering exchange and remembers it as done (done_ids_) when it completed.
  void end_linger(std::uint32_t id);
  // Exchange `id` starts to linger: those of its group now linger_max or more behind the
  // newest that lingers end (it too, when it left the poll loop after later ones).
  void bound_linger(std::uint32_t id);
  void transmit(Clock::time_point now);
  // kOk when the frame's epoch is its sender's current one (learned or moved forward here),
  // else why it must be dropped (kStaleEpoch, kFutureEpoch, kUnconfirmedEpoch).
  DropReason note_epoch(const Parsed& f, Clock::time_point now);
  // Without a cluster key, whether a later epoch of the frame's sender may be taken: once the
  // machine at the sender's MAC answered a challenge with it (epoch_challenge_).
  bool restart_confirmed(const Parsed& f, Clock::time_point now);
  struct EpochChallenge {
    std::uint32_t epoch = 0, nonce = 0;  // nonce 0: none out
    Clock::time_point sent{};
  };
  std::vector<EpochChallenge> epoch_challenge_;  // by peer
  struct ClosedSlot {  // close_slot()
    std::uint32_t from = 0;
    std::string reason;
    std::vector<Rank> members;
    std::vector<std::pair<std::uint32_t, Clock::time_point>> answered;  // by peer: the last id answered, when
  };
  std::map<std::uint32_t, ClosedSlot> closed_;  // by slot
  // A frame for an exchange of a closed slot, answered with an ABORT (at most one per id and
  // peer each rto); false when its slot is open.
  bool answer_closed(const Parsed& f, Clock::time_point now);
  // A dropped frame is of its sender's current incarnation (the epoch we know it by).
  bool alive_epoch(const Parsed& f) const;
  Exchange* find(std::uint32_t id) const;
  Exchange* in_loop(std::uint32_t id) const;  // among the exchanges in the poll loop (active_), else nullptr


  nic::Port& port_;
  EngineConfig config_;
  std::uint32_t epoch_;
  std::uint32_t chunk_;
  std::vector<std::pair<MacAddr, Rank>> mac_index_;  // sorted by MAC
  std::vector<std::uint32_t> peer_epoch_;
  std::vector<bool> peer_epoch_known_;
  // Join state.
  bool joining_ = false;
  std::uint32_t proposal_ = 0;
  Clock::time_point join_since_{}, join_retry_{};
  std::chrono::microseconds join_rto_{};
  std::chrono::milliseconds join_deadline_{0};
  JoinOwner owner_;
  std::vector<bool> join_left_;  // by peer: its session ended while we joined (its ABORT said so)
  std::vector<std::optional<std::uint32_t>> peer_proposal_;  // since our last join completed
  std::vector<JoinOwner> peer_owner_;                         // with each proposal
  std::vector<JoinMeasure> peer_measure_;                     // with each proposal
  JoinMeasure measure_;                                       // ours
  AgreedMeasure agreed_measure_;                              // the last join's
  // Which JOIN a proposal came in: its sender's epoch and join round. A JOIN is resent until
  // acknowledged, also after its sender's join completed: a copy that comes after our own join
  // used or voided its proposal (spend_proposal) is not a new session's.
  struct JoinRound {
    std::uint32_t epoch = 0;
    std::uint64_t round = 0;
  };
  std::uint64_t join_round_ = 0;                    // ours, one more for each start_join
  std::vector<JoinRound> peer_round_;               // with each proposal
  std::vector<std::optional<JoinRound>> spent_round_;  // by peer: the last JOIN spent here
  void spend_proposal(std::size_t peer);
  std::vector<bool> join_acked_;
  bool join_sending_ = false;  // our JOIN still travels to someone
  void join_timers(Clock::time_point now);
  std::optional<Error> join_owner_mismatch();  // start_join's `owner`
  AgreedMeasure agree_measure() const;
  struct AbortedBy {  // a peer's latest ABORT
    std::uint32_t exchange = 0;
    Clock::time_point when{};
    std::string reason;
    bool active = false;
  };
  // By peer, then group slot: its latest ABORT of an exchange of the slot not started here
  // (a group's close must not hide the session's).
  std::vector<std::map<std::uint32_t, AbortedBy>> aborted_by_;
  struct LeftSlot {  // a peer's holder of a group slot went away (note_left)
    std::uint32_t from = 0;  // the first id it will never start
    std::string reason;
  };
  // By peer, then group slot: the peer's member of our group there left it, so that peer starts
  // none of the group's exchanges from `from` on, nor do we with it. A client that opens the
  // slot at that peer later belongs to another group, never to ours. Until reopen_slot(slot).
  std::vector<std::map<std::uint32_t, LeftSlot>> left_;
  std::map<std::uint32_t, std::uint32_t> slot_first_;  // by group slot: the first id of our group in it
  void note_left(Rank src, std::uint32_t id, const std::string& reason);
  std::map<std::uint32_t, std::unique_ptr<Exchange>> exchanges_;  // running and lingering
  // The poll loop looks only at these: running, settling (Exchange::settling), or finished and
  // not yet reported. Reported
  // exchanges linger (they answer late frames) in `lingering_`, oldest first, until erased;
  // a benchmark leaves thousands of them, which the loop must not walk.
  std::vector<Exchange*> active_;
  std::vector<Exchange*> ready_;  // transmit()'s, kept between polls
  std::deque<std::pair<Clock::time_point, std::uint32_t>> lingering_;
  // Ids of exchanges that completed here and are no longer lingering, newest last (bounded):
  // a sender whose ACKs were all lost still polls, and learns that its block arrived.
  std::deque<std::uint32_t> done_ids_;
  std::map<std::uint32_t, EarlyFrames> early_;
  std::size_t early_data_bytes_ = 0;  // payload bytes kept in early_
  std::vector<ExchangeReport> finished_;
  // By group slot: the last exchange started here, if any.
  std::vector<std::optional<std::uint32_t>> last_started_;
  // By group slot: the newest exchange that started to linger here (bound_linger).
  std::vector<std::optional<std::uint32_t>> newest_lingering_;
  std::vector<struct rte_mbuf*> rx_;
  std::uint64_t rx_verified_ = 0;  // port_.rx_verified_flag()
  // Frames out, pacing, the peers' liveness and the counters: what exchanges use (Link).
  std::unique_ptr<EngineLink> link_;
  Clock::time_point next_timers_{};
  std::size_t rr_ = 0;  // round-robin over exchanges
  std::uint64_t handled_ = 0;  // frames of ours that passed validation
  Clock::time_point last_log_{};
};

// Backs a poll loop off when it has nothing to do: spin, then pause, then short sleeps, so
// that many engines can share two cores.
class Idler {
 public:
  void busy() { idle_ = 0; }
  void idle();

 private:
  unsigned idle_ = 0;
};

}  // namespace aapc::engine

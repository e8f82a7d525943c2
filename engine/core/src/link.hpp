// The engine's side of the wire (not installed): frames out through the pacing bucket, what
// is known of the peers' liveness, and the engine's counters. An Exchange sees the engine
// that runs it only through a Link; the Engine owns the EngineLink and drives its loop.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "aapc/core/types.hpp"
#include "aapc/nic/port.hpp"

struct rte_mbuf;

namespace aapc::engine {

// A round that sends wakes its engine about once per this, with the frames due by then, and
// frames that arrive meanwhile wait in the port's ring (Exchange::pace_frame for paced rounds,
// Link's lead for the others, Engine::receive_wait_until).
inline constexpr auto kPacedWake = std::chrono::microseconds(300);
// The most frames such a wake-up sends together: af_packet's ring holds 512, a DPDK port's 1024.
inline constexpr int kWakeFramesMost = 32;

// A peer declared silent and not heard from since (Link::peer_silent).
struct DeadPeer {
  bool dead = false;
  std::string why;
  Clock::time_point since{}, probe_at{};
};

// What an exchange may do with its engine: send frames, restart the pacing at a round's
// start, ask when a peer was last heard, report a silent peer, count a dropped frame.
class Link {
 public:
  Link(const Link&) = delete;
  Link& operator=(const Link&) = delete;

  const EngineConfig& config() const { return config_; }
  Rank rank() const { return config_.rank; }
  std::uint32_t chunk() const { return chunk_; }
  // A full frame's bytes as the pacing bucket counts them.
  double frame_bytes() const { return static_cast<double>(static_cast<std::uint64_t>(config_.mtu) + kEthHeaderLen + config_.pace_overhead_bytes); }
  // The payload room of a control frame: a DATA frame's chunk less the longer header.
  std::uint32_t control_room() const { return chunk_ - static_cast<std::uint32_t>(kControlExtra); }

  // Builds a frame to `dst` (our epoch and rank filled in, sealed with the cluster key if
  // any) and queues it behind the pacing bucket; false when no mbuf was available.
  // With `region` (that holds the payload), on a port that can and without a cluster key, the
  // payload is not copied but attached: its frames then refer to the region's
  // memory until the port frees them.
  bool send_frame(Rank dst, const Header& h, const std::uint8_t* payload, std::size_t len,
                  const nic::ExternalRegion* region = nullptr);
  bool send_control(Rank dst, FrameType type, std::uint32_t exchange, std::uint32_t seq, std::uint32_t aux,
                    std::uint64_t block_len = 0, const std::uint8_t* payload = nullptr, std::size_t len = 0);
  // Acknowledges an eager block or a token that its sender does not wait for: gathered with
  // others to `dst` for up to config().ack_delay, then sent as one frame (EngineLink::send_acks).
  void ack_later(Rank dst, const AckEntry& entry, Clock::time_point now);
  // A round starts: it may not open with the burst the bucket saved while the node waited.
  void restart_pacing(Clock::time_point now);
  // When the last frame handed to the port starts to leave it at the paced rate, that is when
  // the ones before it have left: a frame handed over then queues right behind it. Later than
  // that frame's hand-over only after the bucket let a late poll catch up in a burst, which
  // then waits in a queue downstream: sender-based tokens are handed over no earlier (README,
  // "Scale"). A lead of less than a quarter frame is the bucket's rounding, not a burst, and
  // not worth a wake-up (measured: one whole frame of slack let 64 machines resend 2,420 frames).
  Clock::time_point drained_at() const { return pace_last_start_ - pace_last_start_slack(); }
  // The last time a valid frame of `peer`'s current incarnation arrived.
  Clock::time_point last_heard(Rank peer) const { return last_heard_[static_cast<std::size_t>(peer)]; }
  // An exchange failed because `peer` stayed silent. Unless something
  // came from it within the deadline, it is remembered as dead: exchanges that involve it
  // fail at start, and it is probed with PINGs until any valid frame of it arrives.
  void peer_silent(Rank peer, const std::string& why, Clock::time_point now);
  // A frame dropped, in the engine's totals.
  void count_drop(DropReason reason) { ++counters_.drops[static_cast<std::size_t>(reason)]; }
  void count_abort_resent() { ++counters_.aborts_resent; }

 protected:
  Link(nic::Port& port, const EngineConfig& config, std::uint32_t epoch, std::uint32_t chunk);
  ~Link();

  void refill(Clock::time_point now);  // pacing tokens earned since the last refill
  // Sends the gathered acknowledgements once the oldest has waited ack_delay (all of them: one
  // frame per peer), or at once with `all`.
  void send_acks(Clock::time_point now, bool all = false);
  // A frame of our header and `len` payload bytes, copied or attached; nullptr when no mbuf
  // was to be had.
  rte_mbuf* build_copy(Rank dst, const Header& h, const std::uint8_t* payload, std::size_t len);
  rte_mbuf* build_zero_copy(Rank dst, const Header& h, const std::uint8_t* payload, std::size_t len, const nic::ExternalRegion& region);
  void encode_header(std::uint8_t* p, Rank dst, const Header& h) const;
  Clock::duration pace_last_start_slack() const {
    return pace_last_start_ - pace_last_ < pace_frame_ / 4 ? pace_last_start_ - pace_last_ : Clock::duration::zero();
  }

  nic::Port& port_;
  const EngineConfig& config_;
  std::uint32_t epoch_;
  std::uint32_t chunk_;
  MacAddr mac_;
  const FrameKey* key_;
  bool zero_copy_;  // the port can, and no key (a tag must follow the payload)
  std::uint64_t seal_flag_;  // port_.tx_seal_flag(): frames are sealed on the I/O lcore
  std::uint64_t tag_counter_ = 0;  // numbers the frames sealed with the cluster key (their nonces)
  std::vector<rte_mbuf*> txq_;
  EngineCounters counters_;
  std::vector<std::vector<AckEntry>> acks_;  // by peer: gathered, not yet sent (ack_later)
  Clock::time_point acks_due_ = Clock::time_point::max();  // when the oldest of them must go
  std::vector<Clock::time_point> last_heard_;
  std::vector<DeadPeer> dead_;
  // Pacing
  double tokens_ = 0;
  Clock::time_point pace_last_{};
  Clock::time_point pace_drained_{};     // when everything handed over has left at the paced rate
  Clock::time_point pace_last_start_{};  // when the last frame handed over starts to leave
  Clock::duration pace_frame_{};         // a full frame's time at the paced rate
  double lead_bytes_ = 0;                // how far a wake-up sends ahead of the bucket
};

// The engine loop's side of the link: the transmit queue, the bucket's state, the peers
// remembered as dead.
class EngineLink final : public Link {
 public:
  EngineLink(nic::Port& port, const EngineConfig& config, std::uint32_t epoch, std::uint32_t chunk)
      : Link(port, config, epoch, chunk) {}
  ~EngineLink() = default;
  EngineLink(const EngineLink&) = delete;
  EngineLink& operator=(const EngineLink&) = delete;

  EngineCounters& counters() { return counters_; }
  const EngineCounters& counters() const { return counters_; }

  using Link::refill;
  // Frames built and not yet taken by the port.
  std::size_t queued() const { return txq_.size(); }
  // False while the bucket holds no token: nothing more may be built now.
  bool may_send() const { return config_.pace_bps == 0 || tokens_ > 0; }
  // Once a wake-up may send, it goes on until the bucket is lead_bytes_ in debt (Link's
  // constructor); whether it ever does.
  bool may_send_ahead() const { return config_.pace_bps == 0 || tokens_ > -lead_bytes_; }
  bool sends_ahead() const { return lead_bytes_ > 0; }
  // When the bucket next holds a token (a time already past when it holds one now).
  Clock::time_point send_allowed_at() const;
  // Offers the queued frames to the port.
  void flush();

  using Link::send_acks;
  Clock::time_point acks_due() const { return acks_due_; }

  // Any valid frame of `peer` was received: it is alive.
  void heard_from(Rank peer, Clock::time_point now);
  const DeadPeer& dead(Rank peer) const { return dead_[static_cast<std::size_t>(peer)]; }
  // PINGs the dead peers that are due: one that was only cut off answers once it is back.
  void probe_dead(Clock::time_point now);
  // When probe_dead() next has something to do.
  Clock::time_point next_probe() const;
};

}  // namespace aapc::engine

// How long a process of libaapc-mpi pauses between two looks at its calls in flight while
// others move them (op.hpp's Idle): a rank waiting for its leader's word, a leader waiting
// for its daemon. No MPI here: the unit suite checks the rule.
#pragma once

#include <algorithm>
#include <chrono>
#include <optional>

namespace aapc::mpi {

// A look that moved something starts over at kFirst; one that found nothing pauses twice as
// long as the last, up to kShort, and beyond that up to 1/kShare of how long the looks have
// found nothing, at most `longest`. With 48 ranks on 12 machines of one 2-core box, the 36
// that wait for their leaders looked every 500 us, 72,000 wake-ups a second taken from the
// daemons that carry the exchange. A pause makes the waiter late by at most what it is long:
// past kShort, 1/kShare of the wait so far.
class NapPace {
 public:
  using Clock = std::chrono::steady_clock;
  static constexpr std::chrono::microseconds kFirst{10};
  static constexpr std::chrono::microseconds kShort{500};
  static constexpr std::chrono::microseconds kLongest{10000};
  static constexpr int kShare = 32;

  explicit NapPace(std::chrono::microseconds longest = kLongest) : longest_(std::max(longest, kShort)) {}

  // The pause after a look at `now` that moved something or not.
  std::chrono::microseconds next(bool moved, Clock::time_point now) {
    if (moved || !idle_since_) {
      idle_since_ = now;
      nap_ = kFirst;
      return nap_;
    }
    const auto waited = std::chrono::duration_cast<std::chrono::microseconds>(now - *idle_since_);
    nap_ = std::min(nap_ * 2, std::clamp(waited / kShare, kShort, longest_));
    return nap_;
  }

 private:
  std::chrono::microseconds longest_;
  std::optional<Clock::time_point> idle_since_;
  std::chrono::microseconds nap_ = kFirst;
};

}  // namespace aapc::mpi

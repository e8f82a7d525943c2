// How a process that polls for work pauses when it finds none, where it shares few cores with
// the processes that move its data. Header-only and without MPI, so that the unit suite checks
// the rule: libaapc-mpi's waiting ranks and leaders (op.hpp's Idle) use it, and so does
// libaapc-mpich-yield.so's idle MPICH rank on aapc-emu's cluster (tools/common/idle_wait.hpp).
#pragma once

#include <algorithm>
#include <chrono>
#include <optional>

namespace aapc::mpi {

// After each look: one that moved something starts the wait over. Looks that find nothing nap
// once they have found nothing for `spin_for` (before that the pause is zero: spin, or yield),
// `first` first, twice as long each time up to `cap`, and beyond `cap` up to 1/`share` of how
// long they have found nothing, at most `longest`. A nap makes the looker late by at most its
// length: past `cap`, 1/`share` of the wait so far.
//
// libaapc-mpi's rule (the defaults): naps at once, from 10 us, past 500 us up to 1/32 of the
// wait, at most 10 ms. With 48 ranks on 12 machines of one 2-core box, the 36 that waited for
// their leaders had looked every 500 us, 72,000 wake-ups a second taken from the daemons that
// carry the exchange; its bell (aapc/mpi/bell.hpp) ends a nap when the word is there.
class NapPace {
 public:
  using Clock = std::chrono::steady_clock;
  static constexpr std::chrono::microseconds kNever = std::chrono::microseconds::max();
  struct Rule {
    std::chrono::microseconds spin_for{0};  // kNever: never nap
    std::chrono::microseconds first{10};
    std::chrono::microseconds cap{500};
    int share = 32;  // 0: never past cap
    std::chrono::microseconds longest{10000};
  };

  NapPace() = default;
  explicit NapPace(const Rule& rule) : rule_(rule) {}

  // The pause after a look at `now` that moved something or not; zero: do not sleep.
  std::chrono::microseconds next(bool moved, Clock::time_point now) {
    if (moved) {
      idle_since_.reset();
      nap_ = rule_.spin_for.count() > 0 ? std::chrono::microseconds(0) : rule_.first;
      return nap_;
    }
    if (!idle_since_) idle_since_ = now;
    const auto waited = std::chrono::duration_cast<std::chrono::microseconds>(now - *idle_since_);
    if (rule_.spin_for == kNever || waited < rule_.spin_for) return std::chrono::microseconds(0);
    const auto beyond = rule_.share > 0 ? waited / rule_.share : std::chrono::microseconds(0);
    nap_ = nap_.count() == 0 ? rule_.first : std::min(nap_ * 2, std::clamp(beyond, rule_.cap, std::max(rule_.longest, rule_.cap)));
    return nap_;
  }

 private:
  Rule rule_;
  std::optional<Clock::time_point> idle_since_;
  std::chrono::microseconds nap_{0};
};

}  // namespace aapc::mpi

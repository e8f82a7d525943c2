// How an MPI rank that finds nothing to do waits on aapc-emu's cluster, where every emulated
// machine's ranks and daemons share this box's few cores (libaapc-mpich-yield.so,
// tools/common/mpich_yield.cpp). Header-only, so that the unit suite tests the rule itself.
#pragma once

#include <algorithm>
#include <chrono>
#include <optional>

namespace aapc::tools {

// After each pass of the progress engine: a pass that found work resets the wait; one that
// found nothing yields the CPU (as Open MPI's mpi_yield_when_idle does) until the rank has
// found nothing for `nap_after` (10 ms), and from then on sleeps, kFirstNap first, twice as long each
// time, at most kLongestNap. A yielding rank is still runnable: with 48 ranks and 12 daemons on
// 2 cores, the ranks that wait for the others' exchange took the CPUs back from the daemons
// that carry it again and again. A rank idle that long waits for something that takes long,
// and sleeping makes it late by at most what it has slept already (plus kFirstNap), and at most
// kLongestNap.
class IdleWait {
 public:
  using Clock = std::chrono::steady_clock;
  static constexpr std::chrono::microseconds kNapAfter{10000};
  static constexpr std::chrono::microseconds kFirstNap{20};
  static constexpr std::chrono::microseconds kLongestNap{1000};

  // nap_after zero: never sleep, yield only.
  explicit IdleWait(std::chrono::microseconds nap_after = kNapAfter) : nap_after_(nap_after) {}

  // After a pass that found `events` things to do, at `now`: how long to sleep (zero: yield;
  // with events, neither).
  std::chrono::microseconds after_pass(unsigned events, Clock::time_point now) {
    if (events != 0) {
      idle_since_.reset();
      nap_ = kFirstNap;
      return std::chrono::microseconds(0);
    }
    if (!idle_since_) idle_since_ = now;
    if (nap_after_.count() <= 0 || now - *idle_since_ < nap_after_) return std::chrono::microseconds(0);
    const auto nap = nap_;
    nap_ = std::min(nap_ * 2, kLongestNap);
    return nap;
  }

 private:
  std::chrono::microseconds nap_after_;
  std::optional<Clock::time_point> idle_since_;
  std::chrono::microseconds nap_ = kFirstNap;
};

}  // namespace aapc::tools

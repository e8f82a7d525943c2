// How an MPI rank that finds nothing to do waits on aapc-emu's cluster, where every emulated
// machine's ranks and daemons share this box's few cores (libaapc-mpich-yield.so,
// tools/common/mpich_yield.cpp). The rule is libaapc-mpi's NapPace (aapc/mpi/nap.hpp),
// header-only, so that the unit suite tests it.
#pragma once

#include <chrono>

#include "aapc/mpi/nap.hpp"

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
  using Clock = mpi::NapPace::Clock;
  static constexpr std::chrono::microseconds kNapAfter{10000};
  static constexpr std::chrono::microseconds kFirstNap{20};
  static constexpr std::chrono::microseconds kLongestNap{1000};

  // nap_after zero: never sleep, yield only.
  explicit IdleWait(std::chrono::microseconds nap_after = kNapAfter)
      : pace_({nap_after.count() > 0 ? nap_after : mpi::NapPace::kNever, kFirstNap, kLongestNap, 0, kLongestNap}) {}

  // After a pass that found `events` things to do, at `now`: how long to sleep (zero: yield;
  // with events, neither).
  std::chrono::microseconds after_pass(unsigned events, Clock::time_point now) { return pace_.next(events != 0, now); }

 private:
  mpi::NapPace pace_;
};

}  // namespace aapc::tools

// How an idle MPICH rank waits on aapc-emu's cluster (libaapc-mpich-yield.so): it yields until
// it has found nothing for 10 ms, then sleeps, twice as long each time up to 1 ms, and any work
// found starts the wait over.
#include <catch2/catch.hpp>

#include "idle_wait.hpp"

using aapc::tools::IdleWait;
using std::chrono::microseconds;

TEST_CASE("an idle rank yields for 10 ms, then sleeps 20 us, doubling up to 1 ms", "[mpich_yield]") {
  IdleWait idle;
  const auto t0 = IdleWait::Clock::now();
  CHECK(idle.after_pass(0, t0) == microseconds(0));
  CHECK(idle.after_pass(0, t0 + IdleWait::kNapAfter - microseconds(1)) == microseconds(0));
  std::vector<long> naps;
  for (int i = 0; i < 8; ++i) naps.push_back(idle.after_pass(0, t0 + IdleWait::kNapAfter + microseconds(i)).count());
  CHECK(naps == std::vector<long>{20, 40, 80, 160, 320, 640, 1000, 1000});
}

TEST_CASE("work found starts the wait over: yields again, then the first nap is short", "[mpich_yield]") {
  IdleWait idle;
  const auto t0 = IdleWait::Clock::now();
  const auto later = t0 + IdleWait::kNapAfter + microseconds(1000);
  idle.after_pass(0, t0);
  for (int i = 0; i < 5; ++i) CHECK(idle.after_pass(0, later + microseconds(i)) > microseconds(0));
  CHECK(idle.after_pass(1, later + microseconds(10)) == microseconds(0));  // a pass with work: neither
  CHECK(idle.after_pass(0, later + microseconds(11)) == microseconds(0));   // idle from here
  CHECK(idle.after_pass(0, later + microseconds(11) + IdleWait::kNapAfter - microseconds(1)) == microseconds(0));
  CHECK(idle.after_pass(0, later + microseconds(11) + IdleWait::kNapAfter) == IdleWait::kFirstNap);
}

TEST_CASE("with no time set (AAPC_EMU_NAP_AFTER_US=0) an idle rank only yields", "[mpich_yield]") {
  IdleWait idle(microseconds(0));
  const auto t0 = IdleWait::Clock::now();
  for (int i = 0; i < 100; ++i) CHECK(idle.after_pass(0, t0 + std::chrono::milliseconds(i)) == microseconds(0));
}

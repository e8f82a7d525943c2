// Checks shared by the vdev tests.
#pragma once

#include <catch2/catch.hpp>

#include <string>

#include "aapc/sched/algorithms.hpp"
#include "aapc/sched/sync.hpp"
#include "fabric.hpp"

namespace aapc::test {

// The schedule `algo` ("tree", "group-shuffle:3", ...) on `t` with the sync plan `sync`.
inline sched::Schedule planned(const sched::Topology& t, const std::string& algo, const std::string& sync) {
  return sched::plan_sync(t, sched::make_schedule(t, *sched::AlgorithmSpec::parse(algo)), *sched::SyncSpec::parse(sync));
}

// Every engine finished the exchange successfully and every received byte is right.
inline void expect_ok(const ExchangeRun& run, const std::string& what) {
  INFO(what);
  REQUIRE(run.finished);
  for (std::size_t r = 0; r < run.reports.size(); ++r) {
    INFO("rank " << r << ": " << run.reports[r].error);
    REQUIRE(run.reports[r].state == engine::ExchangeState::kDone);
  }
  INFO(run.first_mismatch);
  REQUIRE(run.byte_exact);
}

}  // namespace aapc::test

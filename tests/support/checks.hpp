// Checks shared by the vdev tests.
#pragma once

#include <catch2/catch.hpp>

#include <string>

#include "fabric.hpp"

namespace aapc::test {

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

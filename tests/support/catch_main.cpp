// The tests' main: Catch2's, and then the cases that were skipped (support/skip.hpp).
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include <iostream>
#include <string>
#include <utility>
#include <vector>

#include "skip.hpp"

namespace {

std::vector<std::pair<std::string, std::string>> skipped;  // case, why
int cases_run = 0;

struct CountCases : Catch::TestEventListenerBase {
  using TestEventListenerBase::TestEventListenerBase;
  void testCaseStarting(const Catch::TestCaseInfo& info) override {
    ++cases_run;
    TestEventListenerBase::testCaseStarting(info);
  }
};

}  // namespace

CATCH_REGISTER_LISTENER(CountCases)

void aapc::test::skip(const std::string& why) { skipped.emplace_back(Catch::getResultCapture().getCurrentTestName(), why); }

int main(int argc, char* argv[]) {
  const int failed = Catch::Session().run(argc, argv);
  if (skipped.empty()) return failed;
  std::cout << "SKIPPED " << skipped.size() << " of " << cases_run << " cases (they cannot run here):\n";
  for (const auto& [name, why] : skipped) std::cout << "  " << name << ": " << why << "\n";
  constexpr int kMesonSkip = 77;
  return failed != 0 ? failed : static_cast<int>(skipped.size()) == cases_run ? kMesonSkip : 0;
}

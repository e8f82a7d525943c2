// The EAL's arguments (nic/src/eal.cpp): pure functions, no EAL started.
#include <catch2/catch.hpp>

#include <algorithm>

#include "aapc/nic/eal.hpp"

using namespace aapc;

namespace {

bool has(const std::vector<std::string>& args, const std::string& a) { return std::find(args.begin(), args.end(), a) != args.end(); }

bool has_prefix(const std::vector<std::string>& args, const std::string& p) {
  return std::any_of(args.begin(), args.end(), [&](const std::string& a) { return a.rfind(p, 0) == 0; });
}

}  // namespace

TEST_CASE("cpu_list writes CPUs as taskset and the EAL read them") {
  CHECK(nic::cpu_list({}).empty());
  CHECK(nic::cpu_list({3}) == "3");
  CHECK(nic::cpu_list({0, 1}) == "0-1");
  CHECK(nic::cpu_list({0, 1, 2, 3, 6, 8, 9}) == "0-3,6,8-9");
  CHECK(nic::cpu_list({1, 3, 5}) == "1,3,5");
}

TEST_CASE("EAL arguments: the main lcore may run on every CPU of the process's set, unless the caller names lcores") {
  nic::EalOptions o;
  // Left to itself the EAL pins its main thread (the engine's) to the first CPU of the set.
  CHECK(has(o.args({0, 1, 2, 5}), "--lcores=0@(0-2,5)"));
  CHECK(has(o.args({4}), "--lcores=0@(4)"));
  CHECK_FALSE(has_prefix(o.args({}), "--lcores"));
  // The caller's own choice stands, alone.
  for (const std::vector<std::string>& own : {std::vector<std::string>{"-l", "3"}, {"-l3"}, {"-c", "0x4"}, {"--lcores=1@2"}}) {
    INFO(own.front());
    o.extra = own;
    const auto args = o.args({0, 1, 2, 3});
    CHECK_FALSE(has(args, "--lcores=0@(0-3)"));
    CHECK(has(args, own.front()));
  }
  // pin_main: one CPU of the set, by index modulo its size (benchmarks and tests).
  nic::EalOptions pinned;
  pinned.pin_main = 1;
  CHECK(has(pinned.args({2, 5, 7}), "-l5"));
  CHECK_FALSE(has_prefix(pinned.args({2, 5, 7}), "--lcores"));
  CHECK(has(pinned.args({4}), "-l4"));
  // Other extra arguments do not count as lcore options.
  o.extra = {"--log-level=pmd.net.memif:critical", "--allow=0000:03:00.0"};
  CHECK(has(o.args({0, 1}), "--lcores=0@(0-1)"));
}

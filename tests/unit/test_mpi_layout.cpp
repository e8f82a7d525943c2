// libaapc-mpi's staging layouts (aapc/mpi/layout.hpp): the three steps simulated in memory
// for random placements of ranks on machines (even, uneven, interleaved) and random block
// lengths (zeros included); every byte must reach its rank.
#include <catch2/catch.hpp>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "aapc/mpi/bell.hpp"
#include "aapc/mpi/copy.hpp"
#include "aapc/mpi/env.hpp"
#include "aapc/mpi/fiber.hpp"
#include "aapc/mpi/layout.hpp"
#include "aapc/mpi/nap.hpp"

using aapc::mpi::LeaderLayout;
using aapc::mpi::Piece;
using aapc::mpi::Placement;

namespace {

std::uint8_t byte(int s, int d, std::uint64_t k) { return static_cast<std::uint8_t>(s * 37 + d * 11 + k * 3 + 1); }

// Runs the composition for `machine_of` with lengths len[s][d]; true when every rank got
// every block right.
bool composition_delivers(const std::vector<int>& machine_of, int machines, const std::vector<std::vector<std::uint64_t>>& len) {
  const Placement p = Placement::from(machine_of, machines);
  const int n = static_cast<int>(machine_of.size());
  auto L = [&](int i, int j) { return len[static_cast<std::size_t>(i)][static_cast<std::size_t>(j)]; };
  std::vector<LeaderLayout> layouts;
  std::vector<std::vector<std::uint8_t>> send(static_cast<std::size_t>(machines)), recv(static_cast<std::size_t>(machines));
  const std::vector<int> order = aapc::mpi::destination_order(p);
  for (int m = 0; m < machines; ++m) {
    layouts.push_back(aapc::mpi::leader_layout(p, m, L, L));
    const LeaderLayout& l = layouts.back();
    send[static_cast<std::size_t>(m)].assign(l.send.total, 0);
    // Step 1: local rank k's blocks, in destination order, land at gather[k].
    const auto& on = p.ranks_on[static_cast<std::size_t>(m)];
    for (std::size_t k = 0; k < on.size(); ++k) {
      if (l.gather[k].size() != order.size()) return false;
      for (std::size_t x = 0; x < order.size(); ++x) {
        const Piece piece = l.gather[k][x];
        if (piece.length != L(on[k], order[x])) return false;
        for (std::uint64_t b = 0; b < piece.length; ++b) send[static_cast<std::size_t>(m)][piece.offset + b] = byte(on[k], order[x], b);
      }
    }
  }
  // Step 2: machine a's block to b lands in b's staging at recv.displs[a].
  for (int a = 0; a < machines; ++a)
    for (int b = 0; b < machines; ++b) {
      const auto& la = layouts[static_cast<std::size_t>(a)];
      const auto& lb = layouts[static_cast<std::size_t>(b)];
      if (la.send.counts[static_cast<std::size_t>(b)] != lb.recv.counts[static_cast<std::size_t>(a)]) return false;
      auto& into = recv[static_cast<std::size_t>(b)];
      into.resize(lb.recv.total);
      std::copy_n(send[static_cast<std::size_t>(a)].begin() + static_cast<std::ptrdiff_t>(la.send.displs[static_cast<std::size_t>(b)]),
                  la.send.counts[static_cast<std::size_t>(b)],
                  into.begin() + static_cast<std::ptrdiff_t>(lb.recv.displs[static_cast<std::size_t>(a)]));
    }
  // Step 3: rank j's block from every source i is at scatter[k][i].
  for (int j = 0; j < n; ++j) {
    const int m = machine_of[static_cast<std::size_t>(j)];
    const auto& l = layouts[static_cast<std::size_t>(m)];
    const auto& pieces = l.scatter[static_cast<std::size_t>(p.local_index(j))];
    for (int i = 0; i < n; ++i) {
      const Piece piece = pieces[static_cast<std::size_t>(i)];
      if (piece.length != L(i, j)) return false;
      for (std::uint64_t b = 0; b < piece.length; ++b)
        if (recv[static_cast<std::size_t>(m)][piece.offset + b] != byte(i, j, b)) return false;
    }
  }
  return true;
}

}  // namespace

TEST_CASE("every block reaches its rank through the leaders' staging", "[mpi]") {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 200; ++trial) {
    const int machines = 1 + static_cast<int>(rng() % 6);
    const int n = machines + static_cast<int>(rng() % 10);
    std::vector<int> machine_of(static_cast<std::size_t>(n));
    for (int r = 0; r < n; ++r) machine_of[static_cast<std::size_t>(r)] = r < machines ? r : static_cast<int>(rng() % static_cast<unsigned>(machines));
    std::shuffle(machine_of.begin(), machine_of.end(), rng);  // ranks interleaved across machines
    std::vector<std::vector<std::uint64_t>> len(static_cast<std::size_t>(n), std::vector<std::uint64_t>(static_cast<std::size_t>(n)));
    for (auto& row : len)
      for (auto& l : row) l = rng() % 4 == 0 ? 0 : rng() % 50;
    INFO("trial " << trial << ": " << n << " ranks on " << machines << " machines");
    CHECK(composition_delivers(machine_of, machines, len));
  }
}

TEST_CASE("an alltoall on machines with equal ranks gives equal machine-level blocks", "[mpi]") {
  const Placement p = Placement::from({0, 0, 1, 1, 2, 2}, 3);
  const auto l = aapc::mpi::leader_layout(p, 1, [](int, int) { return 64; }, [](int, int) { return 64; });
  CHECK(l.send.uniform());
  CHECK(l.send.counts.front() == 4 * 64);  // K^2 blocks per pair of machines
  const Placement uneven = Placement::from({0, 0, 1, 2}, 3);
  CHECK_FALSE(aapc::mpi::leader_layout(uneven, 0, [](int, int) { return 64; }, [](int, int) { return 64; }).send.uniform());
}

TEST_CASE("a placement knows whether it covers the cluster", "[mpi]") {
  CHECK(Placement::from({1, 0}, 2).covers_all());
  CHECK_FALSE(Placement::from({0, 0}, 2).covers_all());
  CHECK_THROWS(Placement::from({0, 3}, 2));
}

// A derived datatype's block of more than 2 GiB packed: MPI_Pack was given the whole block's
// count with its size cut to INT_MAX, and refused it.
TEST_CASE("packing goes in runs of whole elements of at most 2 GiB", "[mpi]") {
  using aapc::mpi::element_runs;
  CHECK(element_runs(0, 24).empty());
  auto one = element_runs(1000, 24);
  REQUIRE(one.size() == 1);
  CHECK(one[0].first == 0);
  CHECK(one[0].elements == 1000);
  // 3 GiB of 24-byte elements: INT_MAX / 24 = 89478485 elements a run.
  const std::uint64_t count = (3ULL << 30) / 24;
  auto runs = element_runs(count, 24);
  REQUIRE(runs.size() == 2);
  CHECK(runs[0].first == 0);
  CHECK(runs[0].elements == 89478485);
  CHECK(runs[1].first == 89478485);
  CHECK(runs[0].elements + runs[1].elements == static_cast<std::int64_t>(count));
  std::uint64_t covered = 0;
  for (const auto& r : element_runs(1000, 7, 100)) {  // 14 elements a run
    CHECK(r.first == covered);
    CHECK(r.elements * 7 <= 100);
    covered += static_cast<std::uint64_t>(r.elements);
  }
  CHECK(covered == 1000);
  // An element beyond the limit is a run of its own; empty elements go in one run.
  auto big = element_runs(3, 200, 100);
  REQUIRE(big.size() == 3);
  CHECK(big[2].first == 2);
  CHECK(big[2].elements == 1);
  CHECK(element_runs(5, 0).size() == 1);
}

// How long a waiting rank pauses between looks (aapc/mpi/nap.hpp): doubling to 500 us, then
// as the wait goes on up to 1/32 of it, at most the longest; a look that moved starts over.
TEST_CASE("a waiting rank's naps grow with its wait, to a share of it, and start over when something moved", "[mpi]") {
  using aapc::mpi::NapPace;
  using std::chrono::microseconds;
  using std::chrono::milliseconds;
  NapPace pace;
  auto t = NapPace::Clock::time_point{} + std::chrono::hours(1);
  CHECK(pace.next(false, t) == microseconds(10));
  std::vector<long> naps;
  for (int i = 0; i < 8; ++i) naps.push_back(pace.next(false, t += microseconds(100)).count());
  CHECK(naps == std::vector<long>{20, 40, 80, 160, 320, 500, 500, 500});  // 800 us waited: 500 us
  CHECK(pace.next(false, t += milliseconds(64)) == microseconds(1000));  // 64.8 ms / 32 = 2 ms, but twice the last
  CHECK(pace.next(false, t) == microseconds(2000));                       // twice the last, under 64.8 ms / 32
  CHECK(pace.next(false, t += milliseconds(10)) == microseconds(2337));   // 74.8 ms / 32
  CHECK(pace.next(false, t += std::chrono::seconds(10)) == microseconds(4674));
  CHECK(pace.next(false, t) == microseconds(9348));
  CHECK(pace.next(false, t) == NapPace::Rule{}.longest);
  CHECK(pace.next(false, t += std::chrono::seconds(60)) == NapPace::Rule{}.longest);
  CHECK(pace.next(true, t) == microseconds(10));
  CHECK(pace.next(false, t += microseconds(100)) == microseconds(20));
  // The longest nap is what the caller allows, never under 500 us.
  NapPace old_pace(NapPace::Rule{.longest = microseconds(500)}), tiny(NapPace::Rule{.longest = microseconds(1)});
  auto u = NapPace::Clock::time_point{} + std::chrono::hours(1);
  (void)old_pace.next(false, u);
  (void)tiny.next(false, u);
  for (int i = 0; i < 12; ++i) (void)old_pace.next(false, u += std::chrono::seconds(1)), (void)tiny.next(false, u);
  CHECK(old_pace.next(false, u += std::chrono::seconds(1)) == microseconds(500));
  CHECK(tiny.next(false, u) == microseconds(500));
}

// libaapc-mpi's settings (aapc/mpi/env.hpp): one reading of on, off and numbers for all.
TEST_CASE("settings from the environment: on, off, and numbers in range or none", "[mpi]") {
  using aapc::mpi::env_integer;
  using aapc::mpi::env_off;
  using aapc::mpi::env_on;
  const char* name = "AAPC_MPI_UNIT_SETTING";
  ::unsetenv(name);
  CHECK_FALSE(env_on(name));
  CHECK_FALSE(env_off(name));
  CHECK_FALSE(env_integer(name, 0, 10));
  for (const char* off : {"off", "0"}) {
    ::setenv(name, off, 1);
    CHECK(env_off(name));
    CHECK_FALSE(env_on(name));
  }
  ::setenv(name, "", 1);
  CHECK_FALSE(env_on(name));
  CHECK_FALSE(env_off(name));
  CHECK_FALSE(env_integer(name, 0, 10));
  ::setenv(name, "7", 1);
  CHECK(env_on(name));
  CHECK(env_integer(name, 0, 10) == 7);
  CHECK_FALSE(env_integer(name, 0, 5));
  for (const char* bad : {"abc", "-5", "7us", "99999999999999999999"}) {
    ::setenv(name, bad, 1);
    CHECK_FALSE(env_integer(name, 0, 10));
  }
  ::unsetenv(name);
}

// A process's doorbell (aapc/mpi/bell.hpp): a pause ends when the bell rings, from this
// process or another, and lasts its time when nobody rings.
TEST_CASE("a pause on the bell ends when another process rings it, and lasts its time otherwise", "[mpi]") {
  namespace bell = aapc::mpi::bell;
  using std::chrono::steady_clock;
  bell::open();
  auto t0 = steady_clock::now();
  CHECK_FALSE(bell::pause(std::chrono::microseconds(20000)));
  CHECK(steady_clock::now() - t0 >= std::chrono::milliseconds(19));
  bell::ring(static_cast<int>(::getpid()));
  bell::ring(static_cast<int>(::getpid()));
  t0 = steady_clock::now();
  CHECK(bell::pause(std::chrono::seconds(5)));
  CHECK(steady_clock::now() - t0 < std::chrono::seconds(1));
  CHECK_FALSE(bell::pause(std::chrono::microseconds(1000)));  // both rings were taken at once
  const int parent = static_cast<int>(::getpid());
  const pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    bell::ring(parent);
    ::_exit(0);
  }
  t0 = steady_clock::now();
  const bool rang = bell::pause(std::chrono::seconds(10));
  const auto took = steady_clock::now() - t0;
  int status = 0;
  ::waitpid(child, &status, 0);
  CHECK(rang);
  CHECK(took >= std::chrono::milliseconds(90));
  CHECK(took < std::chrono::seconds(5));
  bell::ring(123456789);  // nobody's: nothing happens
}

// Single-copy hand-overs (aapc/mpi/copy.hpp): a leader reads a local rank's blocks out of
// that process and writes its received blocks into it. A forked child stands in for the
// local rank: after fork its memory has the same addresses as ours.
TEST_CASE("single-copy hand-overs move every piece between processes, past IOV_MAX and zero lengths", "[mpi]") {
  std::mt19937 rng(7);
  // 3000 pieces (the kernel takes 1024 a call), some empty, scattered over the remote buffer
  // in reverse order and packed in order here.
  std::vector<Piece> remote, local;
  std::uint64_t packed = 0, spread = 0;
  for (int k = 0; k < 3000; ++k) {
    const std::uint64_t len = k % 7 == 0 ? 0 : 1 + rng() % 300;
    local.push_back({packed, len});
    packed += len;
    spread += len + rng() % 16;
    remote.push_back({spread, len});  // its end, counted from the front
  }
  for (Piece& r : remote) r.offset = spread - r.offset;  // counted from the back: reversed
  std::vector<std::uint8_t> theirs(spread + 16);  // the child's, at the same address
  for (std::size_t k = 0; k < theirs.size(); ++k) theirs[k] = static_cast<std::uint8_t>(k * 13 + 5);
  const auto base = reinterpret_cast<std::uint64_t>(theirs.data());
  int go[2];
  REQUIRE(::pipe(go) == 0);
  const pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) {  // waits, then checks what the parent wrote into it
    char c = 0;
    if (::read(go[0], &c, 1) != 1) ::_exit(2);
    for (std::size_t k = 0; k < remote.size(); ++k)
      for (std::uint64_t b = 0; b < remote[k].length; ++b)
        if (theirs[remote[k].offset + b] != static_cast<std::uint8_t>(~(local[k].offset + b))) ::_exit(1);
    ::_exit(0);
  }
  std::fill(theirs.begin(), theirs.end(), 0);  // ours changes; the child's stays
  std::vector<std::uint8_t> here(packed + 1);
  CHECK(aapc::mpi::copy_pieces(child, false, here.data(), local, base, remote).empty());
  bool same = true;
  for (std::size_t k = 0; k < local.size(); ++k)
    for (std::uint64_t b = 0; b < local[k].length; ++b)
      same = same && here[local[k].offset + b] == static_cast<std::uint8_t>((remote[k].offset + b) * 13 + 5);
  CHECK(same);
  for (std::uint64_t b = 0; b < packed; ++b) here[b] = static_cast<std::uint8_t>(~b);
  CHECK(aapc::mpi::copy_pieces(child, true, here.data(), local, base, remote).empty());
  // Refused: pieces that do not pair up, and an address the child does not have.
  CHECK(aapc::mpi::copy_pieces(child, false, here.data(), {{0, 4}}, base, {{0, 5}}).find("5 bytes there and 4 here") != std::string::npos);
  CHECK(aapc::mpi::copy_pieces(child, false, here.data(), {{0, 4}}, 8, {{0, 4}}).find("outside process") != std::string::npos);
  REQUIRE(::write(go[1], "x", 1) == 1);
  int status = -1;
  REQUIRE(::waitpid(child, &status, 0) == child);
  CHECK(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);  // every byte written landed where it belonged
  CHECK(aapc::mpi::copy_pieces(child, false, here.data(), {{0, 4}}, base, {{0, 4}}).find("is gone") != std::string::npos);
  // This process itself: memcpy, both ways.
  std::vector<std::uint8_t> a{1, 2, 3, 4}, b(4);
  CHECK(aapc::mpi::copy_pieces(::getpid(), false, b.data(), {{0, 4}}, reinterpret_cast<std::uint64_t>(a.data()), {{0, 4}}).empty());
  CHECK(b == a);
  static std::uint64_t probe = 0x5eed;
  CHECK(aapc::mpi::can_reach(::getpid(), reinterpret_cast<std::uint64_t>(&probe), 0x5eed).empty());
  CHECK(!aapc::mpi::can_reach(::getpid(), reinterpret_cast<std::uint64_t>(&probe), 0x5eee).empty());
}

namespace {

// Deep enough to need its own stack's pages, and not optimised into a loop.
int depth_sum(int n) {
  volatile char pad[512] = {};
  pad[0] = static_cast<char>(n);
  return n == 0 ? 0 : pad[0] + depth_sum(n - 1) - static_cast<char>(n) + 1;
}

}  // namespace

TEST_CASE("a fiber pauses where its body asks and goes on from there when resumed; what it throws reaches its resumer", "[mpi]") {
  using aapc::mpi::Fiber;
  std::vector<std::string> log;
  int steps = 0;
  Fiber f([&] {
    std::string kept = "kept across pauses";  // on the fiber's own stack
    for (int i = 0; i < 3; ++i) {
      log.push_back("step " + std::to_string(i));
      ++steps;
      f.pause();
    }
    log.push_back(kept + " " + std::to_string(depth_sum(200)));
  });
  CHECK_FALSE(f.ended());
  for (int i = 0; i < 3; ++i) {
    CHECK_FALSE(f.resume());
    CHECK(steps == i + 1);  // the body ran to its next pause, no further
  }
  CHECK(f.resume());
  CHECK(f.ended());
  CHECK(f.resume());  // an ended fiber stays ended
  CHECK(log == std::vector<std::string>{"step 0", "step 1", "step 2", "kept across pauses 200"});
  CHECK_THROWS_AS(f.pause(), std::logic_error);  // not from outside the body

  Fiber failing([&] {
    failing.pause();
    throw std::runtime_error("from the body");
  });
  CHECK_FALSE(failing.resume());
  CHECK_THROWS_WITH(failing.resume(), "from the body");
  CHECK(failing.ended());

  // Two fibers paused at once, resumed in turns.
  std::string order;
  Fiber a([&] { order += 'a'; a.pause(); order += 'A'; });
  Fiber b([&] { order += 'b'; b.pause(); order += 'B'; });
  a.resume(), b.resume(), b.resume(), a.resume();
  CHECK(order == "abBA");
}

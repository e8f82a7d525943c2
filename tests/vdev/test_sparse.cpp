// An alltoallv that may run sparse first agrees on every rank's sizes through
// the daemons' own small exchange. Two Daemons in this process, ranks 0 and 1 of two machines
// on one switch, joined by a pair of rings; their clients run collectives from two threads.
// (Sparse patterns of many ranks, byte by byte: the cluster suite.)
#include <catch2/catch.hpp>

#include <sys/stat.h>
#include <unistd.h>

#include <rte_eth_ring.h>
#include <rte_ethdev.h>
#include <rte_lcore.h>
#include <rte_ring.h>

#include <spdlog/spdlog.h>

#include <atomic>
#include <cstring>
#include <filesystem>
#include <optional>
#include <fstream>
#include <thread>

#include "aapc/client.hpp"
#include "aapc/daemon/daemon.hpp"
#include "fabric.hpp"
#include "group_reduce.hpp"
#include "ring_ports.hpp"

using namespace aapc;
using namespace std::chrono_literals;
namespace fs = std::filesystem;

namespace {

std::atomic<int> g_pairs{0};

const char* const kOneSwitch =
    "graph \"two\" {\n  edge [rate=\"100Mbit\"];\n  n0 [mac=\"02:00:00:00:00:01\"];\n  n1 [mac=\"02:00:00:00:00:02\"];\n"
    "  s0 [buffer=\"64K\"];\n  s0 -- n0;\n  s0 -- n1;\n}\n";
// The same two machines on two switches: a tree, where `auto` agrees on the counts.
const char* const kTwoSwitches =
    "graph \"two-tree\" {\n  edge [rate=\"100Mbit\"];\n  n0 [mac=\"02:00:00:00:00:01\"];\n  n1 [mac=\"02:00:00:00:00:02\"];\n"
    "  s0 [buffer=\"64K\"];\n  s1 [buffer=\"64K\"];\n  s0 -- n0;\n  s0 -- s1;\n  s1 -- n1;\n}\n";

// Daemons of ranks 0 and 1 serving in threads, each on its own socket.
struct Pair {
  fs::path dir;
  std::unique_ptr<engine::Daemon> daemon[2];
  std::string socket[2];
  std::atomic<bool> stop[2]{false, false};
  std::thread thread[2];

  explicit Pair(const char* dot = kOneSwitch) {
    test::start_eal();
    spdlog::set_level(spdlog::level::warn);
    char tmpl[] = "/tmp/aapc-sparse-XXXXXX";
    dir = ::mkdtemp(tmpl);
    ::chmod(dir.c_str(), 0755);
    std::ofstream(dir / "two.dot") << dot;
    const std::string base = "sp" + std::to_string(g_pairs++);
    rte_ring* to[2] = {test::ring(base + "to0"), test::ring(base + "to1")};
    for (int i = 0; i < 2; ++i) {
      engine::DaemonConfig cfg;
      cfg.topology = (dir / "two.dot").string();
      cfg.device = test::ring_port(base + "n" + std::to_string(i), to[i], to[1 - i]);
      cfg.rank = i;
      socket[i] = cfg.socket_path = (dir / ("aapcd" + std::to_string(i) + ".sock")).string();
      cfg.socket_mode = 0666;
      cfg.pace = "off";
      cfg.peer_deadline = 300ms;
      daemon[i] = engine::Daemon::create(cfg);
      thread[i] = std::thread([this, i] { daemon[i]->run(stop[i]); });
    }
  }
  void stop_daemon(int i) {
    if (!thread[i].joinable()) return;
    stop[i] = true;
    thread[i].join();
    daemon[i].reset();
  }
  ~Pair() {
    stop_daemon(0);
    stop_daemon(1);
    fs::remove_all(dir);
  }
  Pair(const Pair&) = delete;
  Pair& operator=(const Pair&) = delete;
};

// One rank's side: its client, buffers of 2 x 4 KiB, and its counts; in a group, its counts
// are by group rank and its collectives run in `group`.
struct Side {
  Client client;
  Buffer send, recv;
  std::vector<std::size_t> send_counts, recv_counts, displs{0, 4096};
  std::optional<Client> group;
  explicit Side(const std::string& socket) : client(Client::connect(socket)), send(client.allocate(8192)), recv(client.allocate(8192)) {}
  Client& in() { return group ? *group : client; }
  Result<Stats> alltoallv(const Options& o) { return in().alltoallv(send, send_counts, displs, recv, recv_counts, displs, o); }
  Result<Request> start_alltoallv(const Options& o) { return in().start_alltoallv(send, send_counts, displs, recv, recv_counts, displs, o); }
};

// Both sides open the group of both machines in reverse order: group rank 0 is machine 1.
void open_reversed(Side& m0, Side& m1) {
  auto [g0, g1] = test::open_both(m0.client, {1, 0}, m1.client, {1, 0});
  REQUIRE(g0);
  REQUIRE(g1);
  REQUIRE(g1->rank() == 0);
  m0.group.emplace(std::move(*g0));
  m1.group.emplace(std::move(*g1));
}

// The one-way pattern: rank 0 sends rank 1 3,000 bytes, rank 1 sends rank 0 nothing, and both
// keep 100 for themselves.
void one_way(Side& a, Side& b) {
  a.send_counts = {100, 3000};
  a.recv_counts = {100, 0};
  b.send_counts = {0, 100};
  b.recv_counts = {3000, 100};
}

std::uint8_t byte_of(int src, int dst, std::size_t k) { return static_cast<std::uint8_t>(src * 31 + dst * 7 + k * 13); }

void fill(Side& s, int me) {
  for (int d = 0; d < 2; ++d)
    for (std::size_t k = 0; k < 4096; ++k) s.send.data()[static_cast<std::size_t>(d) * 4096 + k] = byte_of(me, d, k);
  std::memset(s.recv.data(), 0xEE, s.recv.size());
}

// Both ranks' alltoallv at once.
std::pair<Result<Stats>, Result<Stats>> both(Side& a, Side& b, const Options& o = {}) {
  fill(a, 0);
  fill(b, 1);
  Result<Stats> other = Error(Errc::kInternal, "not run");
  std::thread t([&] { other = b.alltoallv(o); });
  auto mine = a.alltoallv(o);
  t.join();
  return {mine, other};
}

// Rank `me` received its counts' bytes exactly, and nothing past them.
bool received(const Side& s, int me) {
  for (int src = 0; src < 2; ++src)
    for (std::size_t k = 0; k < 4096; ++k) {
      const std::uint8_t want = k < s.recv_counts[static_cast<std::size_t>(src)] ? byte_of(src, me, k) : 0xEE;
      if (s.recv.data()[static_cast<std::size_t>(src) * 4096 + k] != want) return false;
    }
  return true;
}

// Both ranks' alltoallv under `schedule`, which must succeed on both, byte-exact.
std::pair<Result<Stats>, Result<Stats>> both_exact(Side& a, Side& b, const char* schedule) {
  Options o;
  o.schedule = schedule;
  auto results = both(a, b, o);
  REQUIRE(results.first);
  REQUIRE(results.second);
  CHECK(received(a, 0));
  CHECK(received(b, 1));
  return results;
}

}  // namespace

TEST_CASE("an alltoallv agrees on the counts first, runs CGM when forced and the dense schedule under auto, byte-exact") {
  Pair pair;
  Side a(pair.socket[0]), b(pair.socket[1]);
  one_way(a, b);
  Options cgm;
  cgm.schedule = "cgm";
  auto [ra, rb] = both_exact(a, b, "cgm");
  INFO(ra->schedule);
  CHECK_THAT(ra->schedule, Catch::StartsWith("cgm: 1 phases, 0 tokens (dense sync-shuffle"));
  CHECK(ra->schedule == rb->schedule);
  CHECK(ra->bytes_sent == 3000);
  CHECK(rb->bytes_received == 3000);

  // A forced all-to-many schedule uses three ids, the gather's and broadcast's of the counts and
  // the exchange's; auto on one switch runs the dense schedule at once, with one id.
  auto [ca, cb] = both(a, b, cgm);
  REQUIRE(ca);
  CHECK(ca->exchange == ra->exchange + 3);
  auto [da, db] = both(a, b);
  REQUIRE(da);
  REQUIRE(db);
  CHECK(da->exchange == ca->exchange + 1);
  CHECK(da->schedule == "sync-shuffle");
  CHECK(received(a, 0));
  CHECK(received(b, 1));
}

TEST_CASE("on a tree, auto agrees on the counts first and runs a dense pattern with the dense schedule") {
  Pair pair(kTwoSwitches);
  Side a(pair.socket[0]), b(pair.socket[1]);
  a.send_counts = {100, 3000};
  a.recv_counts = {100, 2000};
  b.send_counts = {2000, 100};
  b.recv_counts = {3000, 100};
  auto [ra, rb] = both(a, b);
  REQUIRE(ra);
  REQUIRE(rb);
  CHECK(ra->schedule == "paced-shuffle");  // one peer of one: dense, auto's schedule for blocks of any size
  CHECK(received(a, 0));
  CHECK(received(b, 1));
  auto [sa, sb] = both(a, b);
  REQUIRE(sa);
  CHECK(sa->exchange == ra->exchange + 3);
}

TEST_CASE("alltoallv counts that disagree fail on every rank, naming both ranks and sizes; the next collective runs") {
  const bool tree = GENERATE(false, true);
  Pair pair(tree ? kTwoSwitches : kOneSwitch);
  Side a(pair.socket[0]), b(pair.socket[1]);
  a.send_counts = {100, 3000};
  a.recv_counts = {100, 200};
  b.send_counts = {200, 100};
  b.recv_counts = {1000, 100};  // rank 1 expects 1,000 bytes where rank 0 sends 3,000
  for (const char* schedule : {tree ? "auto" : "sparse", "cgm"}) {
    INFO(schedule << (tree ? " on a tree" : " on one switch"));
    Options o;
    o.schedule = schedule;
    const auto t0 = std::chrono::steady_clock::now();
    auto [ra, rb] = both(a, b, o);
    CHECK(std::chrono::steady_clock::now() - t0 < 2s);
    // Rank 0 finds it among the gathered sizes, and every rank gets its verdict.
    for (const auto* r : {&ra, &rb}) {
      REQUIRE(!*r);
      CHECK(r->error().code() == Errc::kInvalidArgument);
      CHECK_THAT(r->error().message(), Catch::Contains("alltoallv counts disagree: rank 0 sends rank 1 3000 bytes; rank 1 expects 1000 bytes from rank 0"));
    }
  }
  // The ids stayed in step: the same ranks go on with a matching alltoallv.
  b.recv_counts = {3000, 100};
  auto [ra, rb] = both(a, b);
  REQUIRE(ra);
  REQUIRE(rb);
  CHECK(received(b, 1));
}

TEST_CASE("an alltoallv whose counts exchange finds its peer gone fails, naming it, without hanging") {
  Pair pair;
  Side a(pair.socket[0]), b(pair.socket[1]);
  a.send_counts = b.send_counts = a.recv_counts = b.recv_counts = {64, 64};
  Options sparse;
  sparse.schedule = "sparse";
  auto [ra, rb] = both(a, b, sparse);
  REQUIRE(ra);
  REQUIRE(rb);
  pair.stop_daemon(1);
  sparse.timeout = 5000ms;
  const auto t0 = std::chrono::steady_clock::now();
  auto r = a.alltoallv(sparse);
  REQUIRE(!r);
  INFO(r.error().message());
  CHECK_THAT(r.error().message(), Catch::Contains("the agreement on counts before it failed"));
  CHECK_THAT(r.error().message(), Catch::Contains("rank 1"));
  CHECK(std::chrono::steady_clock::now() - t0 < 6s);
}

TEST_CASE("a collective started while an alltoallv agrees on its pattern waits for it: ids still grow at the engine") {
  const bool grouped = GENERATE(false, true);
  INFO((grouped ? "in a group of both machines, reversed" : "the cluster's"));
  Pair pair;
  Side m0(pair.socket[0]), m1(pair.socket[1]);
  if (grouped) open_reversed(m0, m1);
  Side& a = grouped ? m1 : m0;  // rank 0 of the collectives
  Side& b = grouped ? m0 : m1;
  one_way(a, b);
  fill(a, 0);
  fill(b, 1);
  Options cgm;
  cgm.schedule = "cgm";
  Buffer as = a.client.allocate(128), ar = a.client.allocate(128), bs = b.client.allocate(128), br = b.client.allocate(128);
  std::memset(as.data(), 7, as.size());
  std::memset(bs.data(), 9, bs.size());
  // Each rank starts the alltoallv, then at once an alltoall, then waits for both.
  auto run = [](Side& s, Buffer& send, Buffer& recv, const Options& o) {
    auto v = s.start_alltoallv(o);
    auto t = s.in().start_alltoall(send, recv, 64);
    REQUIRE(v);
    REQUIRE(t);
    return std::make_pair(v->wait(), t->wait());
  };
  std::pair<Result<Stats>, Result<Stats>> other{Error(Errc::kInternal, "not run"), Error(Errc::kInternal, "not run")};
  std::thread t([&] { other = run(b, bs, br, cgm); });
  auto mine = run(a, as, ar, cgm);
  t.join();
  for (auto* r : {&mine.first, &mine.second, &other.first, &other.second}) {
    INFO((*r ? std::string("ok") : r->error().message()));
    CHECK(*r);
  }
  CHECK(received(a, 0));
  CHECK(received(b, 1));
  CHECK(ar.data()[64] == 9);
  CHECK(br.data()[0] == 7);
  if (mine.first && mine.second) CHECK(mine.second->exchange == mine.first->exchange + 1);
}

TEST_CASE("an all-to-many schedule with a sync variant that does not exist is refused at once") {
  Pair pair;
  Side a(pair.socket[0]);
  a.send_counts = a.recv_counts = {64, 64};
  Options o;
  o.schedule = "cgm";
  o.sync = "sideways";
  auto r = a.alltoallv(o);
  REQUIRE(!r);
  CHECK(r.error().code() == Errc::kInvalidArgument);
  CHECK_THAT(r.error().message(), Catch::Contains("unknown sync variant 'sideways'"));
  o.sync = "auto";
  auto all = a.client.alltoall(a.send, a.recv, 64, o);
  REQUIRE(!all);
  CHECK_THAT(all.error().message(), Catch::Contains("an alltoall is dense"));
}

TEST_CASE("a group's alltoallv agrees on its counts among its members, in group ranks: CGM when forced, dense under auto") {
  Pair pair(kTwoSwitches);
  Side m0(pair.socket[0]), m1(pair.socket[1]);
  open_reversed(m0, m1);
  Side& a = m1;  // group rank 0
  Side& b = m0;
  one_way(a, b);
  auto [ra, rb] = both_exact(a, b, "cgm");
  INFO(ra->schedule);
  CHECK_THAT(ra->schedule, Catch::StartsWith("cgm: "));
  CHECK(ra->schedule == rb->schedule);
  CHECK(ra->bytes_sent == 3000);
  CHECK(rb->bytes_received == 3000);
  // On a tree auto agrees too: three of the group's ids a collective, none of the cluster's.
  auto [da, db] = both_exact(a, b, "auto");
  CHECK(da->exchange == ra->exchange + 3);
  // Sizes that disagree are named in group ranks, on both members.
  b.recv_counts = {1000, 100};
  Options cgm;
  cgm.schedule = "cgm";
  auto [fa, fb] = both(a, b, cgm);
  for (const auto* r : {&fa, &fb}) {
    REQUIRE(!*r);
    CHECK_THAT(r->error().message(), Catch::Contains("alltoallv counts disagree: rank 0 sends rank 1 3000 bytes; rank 1 expects 1000 bytes from rank 0"));
  }
  // The cluster's own alltoallv, in cluster ranks, is untouched by the group's.
  Side& w0 = m0;
  Side& w1 = m1;
  w0.group.reset();
  w1.group.reset();
  one_way(w0, w1);
  both_exact(w0, w1, "cgm");
}

TEST_CASE("a group closed while its alltoallv agrees on counts fails that alltoallv there; nothing hangs, the daemons live on") {
  Pair pair(kTwoSwitches);
  Side m0(pair.socket[0]), m1(pair.socket[1]);
  open_reversed(m0, m1);
  one_way(m1, m0);
  fill(m1, 0);
  fill(m0, 1);
  Options cgm;
  cgm.schedule = "cgm";
  cgm.timeout = 5000ms;
  // Machine 0 starts and closes the group at once; machine 1 (the root of the agreement) starts
  // after it, so machine 0's daemon has the close before its gather can finish.
  auto started = m0.start_alltoallv(cgm);
  REQUIRE(started);
  m0.group.reset();
  std::this_thread::sleep_for(200ms);
  const auto t0 = std::chrono::steady_clock::now();
  auto r1 = m1.alltoallv(cgm);
  auto r0 = started->wait();
  CHECK(std::chrono::steady_clock::now() - t0 < 3s);
  REQUIRE(!r0);
  INFO(r0.error().message());
  CHECK_THAT(r0.error().message(), Catch::Contains("closed at rank 0 while its alltoallv agreed on counts"));
  // Machine 1 fails, told by machine 0, unless its small sends were all taken into machine 0's
  // eager area before the close took effect there: then its part is done, as it would be had
  // machine 0's program gone after receiving.
  if (!r1) CHECK_THAT(r1.error().message(), Catch::Contains("closed at rank 0 while its alltoallv agreed on counts"));
  // Both daemons still serve: the cluster's own collective runs.
  m1.group.reset();
  one_way(m0, m1);
  auto [wa, wb] = both(m0, m1);
  REQUIRE(wa);
  REQUIRE(wb);
  CHECK(received(m1, 1));
}

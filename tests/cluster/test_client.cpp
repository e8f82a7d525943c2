// A client for the cluster suite: exchanges checked byte by byte, requests a daemon must
// refuse, and a client that waits for a signal while its daemon is restarted.
//
//   aapc-test-client exchange SIZE SCHEDULE SYNC ITERS   all ranks; exit 0 when byte-exact
//   aapc-test-client alltoallv                            all ranks; sparse sizes, zeros included
//   aapc-test-client nonblocking SIZE                     all ranks; start, test() until done, wait()
//   aapc-test-client group DIR halves|reversed           all ranks, two clients each: groups
//   aapc-test-client hold                                 connect, allocate, wait for SIGUSR1, exchange
//   aapc-test-client bad-requests                         one rank: malformed and lying requests
//   aapc-test-client other-uid UID                        one rank: connect as UID, expect a refusal
//   aapc-test-client halves DIR mismatch|exit            all ranks: a group per half; in the lower half rank 1
//                                                          fails the second call; the upper half's calls must all pass;
//                                                          each rank prints its half's first exchange id
//   aapc-test-client occupy DIR                           ranks 0 and 1: a group of the two; rank 0 starts its
//                                                          alltoall, which rank 1 never calls, and both wait
//                                                          for DIR/release (a daemon's one slot kept busy)
//   aapc-test-client group-left DIR                       all ranks: a group of all; rank 3 leaves after one call,
//                                                          and the others' next three calls, once DIR/intruder
//                                                          exists, must fail
//   aapc-test-client intruder DIR                         rank 3, after DIR/left: opens a group of all machines
//                                                          alone (no other member agrees) and calls twice
//   aapc-test-client quotas                               all ranks (as another uid): each quota of the daemons'
//                                                          defaults is met and refused, naming its option
//   aapc-test-client calls SIZE N                         all ranks: N alltoalls, going on after errors;
//                                                          one line each: "call I ok|error END_MS TOOK_MS [why]"
//                                                          (END_MS: wall-clock ms since the epoch)
#include <signal.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <optional>
#include <thread>
#include <string>
#include <vector>

#include "aapc/client.hpp"
#include "aapc/proto/protocol.hpp"
#include "pattern.h"

namespace {

using aapc::tools::pattern;

int fail(const std::string& what) {
  std::cerr << "test-client: " << what << "\n";
  return 1;
}

int exchange(std::size_t block, const std::string& schedule, const std::string& sync, int iters) {
  aapc::Client c = aapc::Client::connect();
  const int me = c.rank(), n = c.size();
  aapc::Buffer send = c.allocate(n * block), recv = c.allocate(n * block);
  aapc::Options o;
  o.schedule = schedule;
  o.sync = sync;
  for (int it = 0; it < iters; ++it) {
    for (int d = 0; d < n; ++d)
      for (std::size_t k = 0; k < block; ++k) send.data()[d * block + k] = pattern(me, d, it, k);
    std::memset(recv.data(), 0xEE, n * block);
    auto r = c.alltoall(send, recv, block, o);
    if (!r) return fail("rank " + std::to_string(me) + ": " + r.error().message());
    for (int s = 0; s < n; ++s)
      for (std::size_t k = 0; k < block; ++k)
        if (recv.data()[s * block + k] != pattern(s, me, it, k))
          return fail("rank " + std::to_string(me) + ": byte " + std::to_string(k) + " from rank " + std::to_string(s) + " differs");
    if (me == 0 && it == iters - 1) std::cout << "ok " << r->schedule << " " << r->sync << " retransmissions " << r->retransmissions << "\n";
  }
  return 0;
}

int calls(std::size_t block, int n_calls) {
  aapc::Client c = aapc::Client::connect();
  const auto n = static_cast<std::size_t>(c.size());
  aapc::Buffer send = c.allocate(n * block), recv = c.allocate(n * block);
  for (int i = 0; i < n_calls; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    auto r = c.alltoall(send, recv, block);
    const auto took = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0).count();
    const auto end = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch()).count();
    std::cout << "call " << i << (r ? " ok " : " error ") << end << " " << took << (r ? "" : " " + r.error().message()) << std::endl;
  }
  return 0;
}

// An alltoallv in `c` (the cluster's, or a group's): block i -> j has size(i, j) bytes in
// cluster ranks, some of them empty, and every byte is checked against its cluster ranks.
int checked_alltoallv(aapc::Client& c, const aapc::Options& o, int iteration, const std::string& what) {
  const std::vector<int> members = c.members();
  const int me = c.rank(), n = c.size(), at = members[static_cast<std::size_t>(me)];
  auto size = [](int i, int j) { return static_cast<std::size_t>(i == j ? 0 : (i * 7 + j * 3) % 5 * 1000); };
  std::vector<std::size_t> sc(n), sd(n), rc(n), rd(n);
  std::size_t st = 0, rt = 0;
  for (int p = 0; p < n; ++p) {
    const int other = members[static_cast<std::size_t>(p)];
    sc[p] = size(at, other);
    sd[p] = st;
    st += sc[p];
    rc[p] = size(other, at);
    rd[p] = rt;
    rt += rc[p];
  }
  aapc::Buffer send = c.allocate(st + 1), recv = c.allocate(rt + 1);
  for (int p = 0; p < n; ++p)
    for (std::size_t k = 0; k < sc[p]; ++k) send.data()[sd[p] + k] = pattern(at, members[static_cast<std::size_t>(p)], iteration, k);
  auto r = c.alltoallv(send, sc, sd, recv, rc, rd, o);
  if (!r) return fail(what + " rank " + std::to_string(at) + ": " + r.error().message());
  for (int p = 0; p < n; ++p)
    for (std::size_t k = 0; k < rc[p]; ++k)
      if (recv.data()[rd[p] + k] != pattern(members[static_cast<std::size_t>(p)], at, iteration, k))
        return fail(what + " rank " + std::to_string(at) + ": byte " + std::to_string(k) + " from rank " + std::to_string(members[static_cast<std::size_t>(p)]) + " differs");
  return 0;
}

int alltoallv() {
  aapc::Client c = aapc::Client::connect();
  if (int rc = checked_alltoallv(c, {}, 0, "alltoallv"); rc != 0) return rc;
  if (c.rank() == 0) std::cout << "ok alltoallv\n";
  return 0;
}

int nonblocking(std::size_t block) {
  aapc::Client c = aapc::Client::connect();
  const int me = c.rank(), n = c.size();
  aapc::Buffer send = c.allocate(n * block), recv = c.allocate(n * block);
  for (int d = 0; d < n; ++d)
    for (std::size_t k = 0; k < block; ++k) send.data()[d * block + k] = pattern(me, d, 9, k);
  auto req = c.start_alltoall(send, recv, block);
  if (!req) return fail(req.error().message());
  int polls = 0;
  while (!req->test()) ++polls;
  auto r = req->wait();
  if (!r) return fail(r.error().message());
  for (int s = 0; s < n; ++s)
    for (std::size_t k = 0; k < block; ++k)
      if (recv.data()[s * block + k] != pattern(s, me, 9, k)) return fail("nonblocking byte differs");
  if (me == 0) std::cout << "ok nonblocking after " << polls << " tests\n";
  return 0;
}

// Client::open_group's reduce over the members' processes, through files in `dir` (every
// namespace of the emulated cluster sees one file system): step k's words of group rank r in
// DIR/TAG-k-r, written whole by a rename.
struct FileReduce {
  std::filesystem::path dir;
  std::string tag;
  int me = 0, n = 0, step = 0;
  void operator()(std::vector<std::uint64_t>& words, aapc::ReduceOp op) {
    auto name = [&](int r) { return dir / (tag + "-" + std::to_string(step) + "-" + std::to_string(r)); };
    {
      std::ofstream out(name(me).string() + ".tmp");
      for (auto w : words) out << w << "\n";
    }
    std::filesystem::rename(name(me).string() + ".tmp", name(me));
    std::vector<std::uint64_t> result = words;
    for (int r = 0; r < n; ++r) {
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
      while (!std::filesystem::exists(name(r))) {
        if (std::chrono::steady_clock::now() > deadline) throw std::runtime_error("no reduce file " + name(r).string());
        std::this_thread::sleep_for(std::chrono::milliseconds(2));
      }
      std::ifstream in(name(r));
      for (auto& w : result) {
        std::uint64_t v = 0;
        in >> v;
        w = op == aapc::ReduceOp::kAnd ? (w & v) : std::max(w, v);
      }
    }
    words = result;
    ++step;
  }
};

// Two clients on every machine, each in groups of its own, running at once. `halves`
// opens a group of the lower and one of the upper half of the cluster (part of the tree each);
// `reversed` one of every machine, in reverse order (group rank i is cluster rank n-1-i).
// Every block is checked against its cluster ranks, so a block in the wrong group's exchange,
// or of the wrong rank, shows.
int group(const std::string& dir, const std::string& kind) {
  aapc::Client c = aapc::Client::connect();
  const int me = c.rank(), n = c.size();
  std::vector<int> members;
  if (kind == "halves") {
    const int lo = me < n / 2 ? 0 : n / 2, hi = me < n / 2 ? n / 2 : n;
    for (int r = lo; r < hi; ++r) members.push_back(r);
  } else {
    for (int r = n - 1; r >= 0; --r) members.push_back(r);
  }
  const std::string tag = kind + std::to_string(members.front());
  FileReduce reduce{dir, tag, static_cast<int>(std::find(members.begin(), members.end(), me) - members.begin()), static_cast<int>(members.size())};
  auto opened = c.open_group(members, std::ref(reduce));
  if (!opened) return fail(tag + ": open_group: " + opened.error().message());
  aapc::Client& g = *opened;
  const int gn = g.size();
  if (g.members() != members || members[static_cast<std::size_t>(g.rank())] != me) return fail(tag + ": group ranks differ from the members");
  const std::size_t block = 3000;
  aapc::Buffer send = c.allocate(gn * block), recv = c.allocate(gn * block);
  int iteration = 0;
  for (const char* schedule : {"auto", "tree", "bruck", "pairwise"}) {
    const std::size_t len = std::string(schedule) == "bruck" ? 64 : block;
    for (int d = 0; d < gn; ++d)
      for (std::size_t k = 0; k < len; ++k) send.data()[d * len + k] = pattern(me, members[d], iteration, k);
    std::memset(recv.data(), 0xEE, gn * len);
    aapc::Options o;
    o.schedule = schedule;
    auto r = g.alltoall(send, recv, len, o);
    if (!r) return fail(tag + " rank " + std::to_string(me) + ", " + schedule + ": " + r.error().message());
    for (int s = 0; s < gn; ++s)
      for (std::size_t k = 0; k < len; ++k)
        if (recv.data()[s * len + k] != pattern(members[s], me, iteration, k))
          return fail(tag + " rank " + std::to_string(me) + ", " + schedule + ": byte " + std::to_string(k) + " from rank " + std::to_string(members[s]) + " differs");
    ++iteration;
  }
  // alltoallv agrees on its pattern among the members: forced CGM, and auto on a group that
  // spans switches.
  for (const char* schedule : {"cgm", "auto"}) {
    aapc::Options o;
    o.schedule = schedule;
    if (int rc = checked_alltoallv(g, o, iteration++, tag + " alltoallv " + schedule); rc != 0) return rc;
  }
  if (auto b = g.barrier(); !b) return fail(tag + ": barrier: " + b.error().message());
  std::cout << "ok " << tag << " group of " << gn << " as rank " << g.rank() << "\n";
  return 0;
}

volatile sig_atomic_t g_go = 0;
void on_usr1(int) { g_go = 1; }

int hold() {
  ::signal(SIGUSR1, on_usr1);
  aapc::Client c = aapc::Client::connect();
  aapc::Buffer send = c.allocate(c.size() * 1000), recv = c.allocate(c.size() * 1000);
  std::cout << "ready" << std::endl;
  while (!g_go) ::pause();
  auto r = c.alltoall(send, recv, 1000);
  if (r) return fail("the exchange succeeded, but the daemon had restarted");
  std::cout << "error " << static_cast<int>(r.error().code()) << ": " << r.error().message() << std::endl;
  return r.error().code() == aapc::Errc::kDaemonRestarted ? 0 : 1;
}

// Raw protocol: requests the client library would never send.
struct Raw {
  int fd = -1;
  std::uint32_t next = 1;
  Raw() {
    const char* path = std::getenv("AAPC_SOCKET");
    fd = ::socket(AF_UNIX, SOCK_SEQPACKET, 0);
    sockaddr_un a{};
    a.sun_family = AF_UNIX;
    std::strncpy(a.sun_path, path, sizeof a.sun_path - 1);
    if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) throw std::runtime_error("connect failed");
  }
  // Returns the reply's type and, for errors, the code.
  std::pair<aapc::proto::Type, std::uint32_t> call(const std::vector<std::uint8_t>& msg, int pass_fd = -1) {
    aapc::proto::send_message(fd, msg, pass_fd);
    std::vector<std::uint8_t> reply;
    int rfd = -1;
    bool trunc = false;
    if (aapc::proto::recv_message(fd, reply, rfd, trunc) != aapc::proto::Received::kMessage)
      throw std::runtime_error("the daemon closed the connection");
    auto h = aapc::proto::header_of(reply);
    if (!h) throw std::runtime_error("malformed reply");
    std::uint32_t code = 0;
    if (h->type == static_cast<std::uint16_t>(aapc::proto::Type::kError)) std::memcpy(&code, reply.data() + sizeof(aapc::proto::Header), 4);
    return {static_cast<aapc::proto::Type>(h->type), code};
  }
};

int bad_requests() {
  using aapc::proto::Type;
  Raw raw;
  int n = 0;
  {
    aapc::proto::Writer w(Type::kHello, raw.next++);
    w.str("raw");
    if (raw.call(w.done()).first != Type::kHelloReply) return fail("HELLO refused");
  }
  // Hello reply: rank, size, ... we need the size.
  {
    aapc::Client c = aapc::Client::connect();
    n = c.size();
  }
  int memfd = ::memfd_create("t", MFD_ALLOW_SEALING);  // aapcd seals it (or refuses it)
  if (::ftruncate(memfd, 4096) != 0) return fail("ftruncate");
  aapc::proto::Writer reg(Type::kRegister, raw.next++);
  reg.put(std::uint64_t{4096});
  auto [t, code] = raw.call(reg.done(), memfd);
  if (t != Type::kRegisterReply) return fail("REGISTER refused");
  // A buffer larger than the memory file.
  aapc::proto::Writer big(Type::kRegister, raw.next++);
  big.put(std::uint64_t{1} << 20);
  if (raw.call(big.done(), memfd).second != static_cast<std::uint32_t>(aapc::Errc::kInvalidArgument)) return fail("an oversized buffer was accepted");
  auto start = [&](std::uint64_t offset, std::uint64_t len) {
    aapc::proto::StartRequest m;
    m.kind = aapc::proto::Kind::kAlltoallv;
    m.spec = "tree";
    m.send_buffer = m.recv_buffer = 1;
    m.sends.assign(static_cast<std::size_t>(n), {offset, len});
    m.recvs = m.sends;
    return raw.call(aapc::proto::message(m, raw.next++));
  };
  if (start(4000, 200).second != static_cast<std::uint32_t>(aapc::Errc::kInvalidArgument)) return fail("a block past the buffer's end was accepted");
  if (start(~std::uint64_t{0} - 10, 100).second != static_cast<std::uint32_t>(aapc::Errc::kInvalidArgument)) return fail("an overflowing offset was accepted");
  {
    // A group's collective from a client that did not open it; a group without us.
    aapc::proto::StartRequest m;
    m.kind = aapc::proto::Kind::kBarrier;
    m.group = 7;
    if (raw.call(aapc::proto::message(m, raw.next++)).second != static_cast<std::uint32_t>(aapc::Errc::kInvalidArgument))
      return fail("a collective of a group not open was accepted");
    aapc::Client c = aapc::Client::connect();
    aapc::proto::GroupOpenRequest open{9, 1, {}};
    for (int r = 0; r < n; ++r)
      if (r != c.rank()) open.members.push_back(static_cast<std::uint32_t>(r));
    if (raw.call(aapc::proto::message(open, raw.next++)).second != static_cast<std::uint32_t>(aapc::Errc::kInvalidArgument))
      return fail("a group without this machine was opened");
    open.slot = 0;
    if (raw.call(aapc::proto::message(open, raw.next++)).second != static_cast<std::uint32_t>(aapc::Errc::kInvalidArgument))
      return fail("a group in slot 0 was opened");
  }
  // Garbage, a wrong version, a truncated START.
  if (raw.call({1, 2, 3, 4, 5}).second != static_cast<std::uint32_t>(aapc::Errc::kProtocol)) return fail("garbage was not refused as a protocol error");
  {
    aapc::proto::Writer w(Type::kStatus, raw.next++);
    auto msg = w.done();
    msg[4] = 99;  // version
    if (raw.call(msg).second != static_cast<std::uint32_t>(aapc::Errc::kProtocol)) return fail("version 99 was accepted");
  }
  {
    aapc::proto::Writer w(Type::kStart, raw.next++);
    w.put(static_cast<std::uint8_t>(2));
    if (raw.call(w.done()).second != static_cast<std::uint32_t>(aapc::Errc::kProtocol)) return fail("a truncated START was accepted");
  }
  {
    aapc::proto::Writer w(Type::kWait, raw.next++);
    w.put(std::uint32_t{424242});
    if (raw.call(w.done()).second != static_cast<std::uint32_t>(aapc::Errc::kInvalidArgument)) return fail("WAIT for a foreign exchange");
  }
  // Still serving.
  aapc::proto::Writer st(Type::kStatus, raw.next++);
  if (raw.call(st.done()).first != Type::kStatusReply) return fail("the daemon stopped serving");
  std::cout << "ok refused every bad request, still serving\n";
  return 0;
}

// Two jobs, each in a group of its own on one half of the cluster, at once: one job's failure
// must stay in it. Every rank meets every other at a file barrier before the second call; there
// rank 1 of the lower half calls with other blocks (`mismatch`) or its client exits (`exit`).
// The lower half's ranks must then fail, and the upper half's calls (the second, made at the
// same moment, and two more) must all succeed, byte-exact. Both groups number their exchanges
// alike, which the daemons told apart by their members only.
int halves(const std::string& dir, const std::string& how) {
  aapc::Client c = aapc::Client::connect();
  const int me = c.rank(), n = c.size();
  const bool lower = me < n / 2;
  std::vector<int> members;
  for (int r = lower ? 0 : n / 2; r < (lower ? n / 2 : n); ++r) members.push_back(r);
  const std::string tag = lower ? "lower" : "upper";
  FileReduce reduce{dir, tag, me - members.front(), static_cast<int>(members.size())};
  auto opened = c.open_group(members, std::ref(reduce));
  if (!opened) return fail(tag + ": open_group: " + opened.error().message());
  aapc::Client& g = *opened;
  const std::size_t gn = members.size(), block = 16384;
  aapc::Buffer send = c.allocate(gn * block), recv = c.allocate(gn * block);
  FileReduce everyone{dir, "barrier", me, n};
  for (int call = 0; call < 4; ++call) {
    std::size_t len = block;
    if (call == 1) {
      std::vector<std::uint64_t> word{1};
      everyone(word, aapc::ReduceOp::kAnd);
      if (lower && me == 1 && how == "exit") std::_Exit(3);
      if (lower && me == 1) len = block / 2;
    }
    for (std::size_t d = 0; d < gn; ++d)
      for (std::size_t k = 0; k < len; ++k) send.data()[d * len + k] = pattern(me, members[d], call, k);
    auto r = g.alltoall(send, recv, len);
    if (lower && call >= 1) {
      if (r) return fail("lower half rank " + std::to_string(me) + ": call " + std::to_string(call) + " succeeded though rank 1 failed it");
      std::cout << "lower half rank " << me << " failed as it should: " << r.error().message() << "\n";
      return 0;
    }
    if (!r) return fail(tag + " half rank " + std::to_string(me) + ", call " + std::to_string(call) + ": " + r.error().message());
    if (call == 0) std::cout << tag << " half's first exchange id " << r->exchange << std::endl;
    for (std::size_t s = 0; s < gn; ++s)
      for (std::size_t k = 0; k < len; ++k)
        if (recv.data()[s * len + k] != pattern(members[s], me, call, k))
          return fail(tag + " half rank " + std::to_string(me) + ", call " + std::to_string(call) + ": byte " + std::to_string(k) + " from rank " + std::to_string(members[s]) + " differs");
  }
  std::cout << "ok " << tag << " half rank " << me << ": 4 calls\n";
  return 0;
}

// Waits up to 60 s for `file`; false if it did not appear.
bool await_file(const std::filesystem::path& file) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (!std::filesystem::exists(file))
    if (std::chrono::steady_clock::now() > deadline) return false;
    else std::this_thread::sleep_for(std::chrono::milliseconds(10));
  return true;
}

// Keeps rank 0's daemon busy (run it with --max-exchanges 1): a group of ranks 0 and 1, whose
// alltoall rank 0 starts and rank 1 never calls, until DIR/release appears.
int occupy(const std::string& dir) {
  aapc::Client c = aapc::Client::connect();
  const int me = c.rank();
  if (me > 1) return 0;
  FileReduce reduce{dir, "occupy", me, 2};
  auto opened = c.open_group({0, 1}, std::ref(reduce));
  if (!opened) return fail("occupy: open_group: " + opened.error().message());
  aapc::Buffer send = c.allocate(2 * 64), recv = c.allocate(2 * 64);
  std::optional<aapc::Request> held;
  if (me == 0) {
    aapc::Options o;
    o.timeout = std::chrono::seconds(120);
    auto q = opened->start_alltoall(send, recv, 64, o);
    if (!q) return fail("occupy: " + q.error().message());
    held.emplace(std::move(*q));
  }
  std::cout << "rank " << me << " holds its group" << std::endl;
  await_file(std::filesystem::path(dir) / "release");
  return 0;
}


// A group of every machine whose rank 3 leaves after one call; the others go on calling once
// another client (`intruder`) has opened the slot at rank 3's machine. No call may succeed.
int group_left(const std::string& dir) {
  aapc::Client c = aapc::Client::connect();
  const int me = c.rank(), n = c.size();
  std::vector<int> members;
  for (int r = 0; r < n; ++r) members.push_back(r);
  FileReduce reduce{dir, "left", me, n};
  auto opened = c.open_group(members, std::ref(reduce));
  if (!opened) return fail("open_group: " + opened.error().message());
  const std::size_t block = 4096;
  aapc::Buffer send = c.allocate(n * block), recv = c.allocate(n * block);
  for (int call = 0; call < 4; ++call) {
    for (int d = 0; d < n; ++d)
      for (std::size_t k = 0; k < block; ++k) send.data()[d * block + k] = pattern(me, d, call, k);
    if (call == 1 && me == 3) {
      std::ofstream(std::filesystem::path(dir) / "left").put('\n');
      return 0;
    }
    if (call == 1 && !await_file(std::filesystem::path(dir) / "intruder")) return fail("the intruder did not open its group");
    auto r = opened->alltoall(send, recv, block);
    if (call == 0 && !r) return fail("rank " + std::to_string(me) + ", call 0: " + r.error().message());
    if (call > 0 && r) return fail("rank " + std::to_string(me) + ", call " + std::to_string(call) + " succeeded without rank 3's client");
    if (call > 0) std::cout << "rank " << me << " call " << call << " failed as it should: " << r.error().message() << std::endl;
  }
  return 0;
}

// At rank 3's machine once group_left's rank 3 left: a group of every machine opened alone
// (its reduce asks nobody), two calls in it.
int intruder(const std::string& dir) {
  if (!await_file(std::filesystem::path(dir) / "left")) return fail("rank 3 did not leave");
  std::this_thread::sleep_for(std::chrono::milliseconds(200));  // its daemon closed the slot
  aapc::Client c = aapc::Client::connect();
  const int me = c.rank(), n = c.size();
  std::vector<int> members;
  for (int r = 0; r < n; ++r) members.push_back(r);
  auto opened = c.open_group(members, [](std::vector<std::uint64_t>&, aapc::ReduceOp) {});
  if (!opened) return fail("intruder: open_group: " + opened.error().message());
  std::ofstream(std::filesystem::path(dir) / "intruder").put('\n');
  const std::size_t block = 4096;
  aapc::Buffer send = c.allocate(n * block), recv = c.allocate(n * block);
  // Long enough to overlap the group's next calls, which, before a member's departure was
  // remembered for good, first waited out their READYs to rank 3 (about 4 s).
  aapc::Options o;
  o.timeout = std::chrono::seconds(8);
  for (int call = 1; call < 3; ++call) {
    for (int d = 0; d < n; ++d)
      for (std::size_t k = 0; k < block; ++k) send.data()[d * block + k] = pattern(me, d, call, k);
    auto r = opened->alltoall(send, recv, block, o);
    std::cout << "intruder call " << call << (r ? " ok" : " error: " + r.error().message()) << std::endl;
  }
  return 0;
}

// Another user's probes of the quotas (docs/guide.md), with the daemons' default caps: a
// 49-day timeout, more collectives at once than one client may hold, more schedules than a
// daemon keeps, and buffers until the uid's cap. Each refusal must name its option; every
// collective that is let through must run.
int quotas() {
  aapc::Client c = aapc::Client::connect();
  const int me = c.rank(), n = c.size();
  const std::size_t block = 1024;
  aapc::Buffer send = c.allocate(n * block), recv = c.allocate(n * block);
  auto refused = [&](const std::string& what, const aapc::Error& e, const std::string& option) {
    if (e.message().find(option) == std::string::npos) return fail(what + ": refused without naming " + option + ": " + e.message());
    std::cout << "rank " << me << ": " << what << " refused: " << e.message() << std::endl;
    return 0;
  };
  aapc::Options forever;
  forever.timeout = std::chrono::milliseconds(UINT32_MAX);
  if (auto r = c.alltoall(send, recv, block, forever); r) return fail("a 49-day timeout was let through");
  else if (refused("a 49-day timeout", r.error(), "--max-timeout-ms") != 0) return 1;
  std::vector<aapc::Request> held;
  for (;;) {
    auto q = c.start_alltoall(send, recv, block);
    if (!q) {
      if (refused("collective " + std::to_string(held.size() + 1) + " at once", q.error(), "--max-exchanges-per-client") != 0) return 1;
      break;
    }
    held.push_back(std::move(*q));
    if (held.size() > 10000) return fail("10,000 collectives at once were let through");
  }
  for (auto& q : held)
    if (auto r = q.wait(); !r) return fail("a collective let through failed: " + r.error().message());
  for (int k = 1; k <= 80; ++k) {
    aapc::Options o;
    o.schedule = "tree";
    o.sync = "sender-partial:" + std::to_string(k);
    if (auto r = c.alltoall(send, recv, block, o); !r) return fail(o.sync + ": " + r.error().message());
  }
  std::cout << "rank " << me << ": 80 schedules ran" << std::endl;
  std::vector<aapc::Buffer> kept;
  try {
    while (kept.size() < 1000000) kept.push_back(c.allocate(4096));
    return fail("a million buffers were let through");
  } catch (const aapc::Exception& e) {
    return refused("buffer " + std::to_string(kept.size() + 3), e.error(), "--max-buffers-per-uid");
  }
}

int other_uid(uid_t uid) {
  if (::setgid(uid) != 0 || ::setuid(uid) != 0) return fail("cannot become uid " + std::to_string(uid));
  auto c = aapc::Client::try_connect();
  if (c) return fail("uid " + std::to_string(uid) + " was let in");
  std::cout << "refused: " << c.error().message() << "\n";
  return c.error().code() == aapc::Errc::kPermission ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> a(argv + 1, argv + argc);
  try {
    if (a.size() == 5 && a[0] == "exchange") return exchange(std::stoul(a[1]), a[2], a[3], std::stoi(a[4]));
    if (a.size() == 1 && a[0] == "alltoallv") return alltoallv();
    if (a.size() == 2 && a[0] == "nonblocking") return nonblocking(std::stoul(a[1]));
    if (a.size() == 1 && a[0] == "hold") return hold();
    if (a.size() == 3 && a[0] == "calls") return calls(std::stoul(a[1]), std::stoi(a[2]));
    if (a.size() == 3 && a[0] == "group") return group(a[1], a[2]);
    if (a.size() == 3 && a[0] == "halves") return halves(a[1], a[2]);
    if (a.size() == 2 && a[0] == "occupy") return occupy(a[1]);
    if (a.size() == 1 && a[0] == "quotas") return quotas();
    if (a.size() == 2 && a[0] == "group-left") return group_left(a[1]);
    if (a.size() == 2 && a[0] == "intruder") return intruder(a[1]);
    if (a.size() == 1 && a[0] == "bad-requests") return bad_requests();
    if (a.size() == 2 && a[0] == "other-uid") return other_uid(static_cast<uid_t>(std::stoul(a[1])));
  } catch (const std::exception& e) {
    return fail(e.what());
  }
  std::cerr << "usage: see the comment at the top of test_client.cpp\n";
  return 2;
}

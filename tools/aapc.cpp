// aapc: run exchanges through the local aapcd, or show its state.
//
//   aapc run --size 64K --schedule tree --iters 20 --check
//   aapc run --size 64K --sparse 4 --check      (alltoallv: 4 destinations per rank, Figure 7)
//   aapc status
//
// Run it on every node at once (aapc-emu run does that for an emulated cluster; on a real
// one use mpirun or srun); rank 0 prints the result.
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <iomanip>
#include <iostream>
#include <sstream>
#include <thread>

#include "aapc/client.hpp"
#include "aapc/sched/algorithms.hpp"
#include "aapc/sched/alltomany.hpp"
#include "aapc/sched/topology.hpp"
#include "pattern.h"

namespace {

using aapc::tools::pattern;

std::string human_bytes(std::uint64_t b) {
  std::ostringstream o;
  if (b >= (1ULL << 20) && b % (1ULL << 20) == 0) {
    o << (b >> 20) << " MiB";
  } else if (b >= 1024 && b % 1024 == 0) {
    o << (b >> 10) << " KiB";
  } else {
    o << b << " B";
  }
  return o.str();
}

// Runs `work` on a thread of idle priority (SCHED_IDLE: it gets a CPU only when nothing else
// wants one), and waits for it. Where the policy is refused, the thread runs at its default.
template <typename F>
void at_idle_priority(F&& work) {
  std::thread([&] {
    sched_param none{};
    pthread_setschedparam(pthread_self(), SCHED_IDLE, &none);
    work();
  }).join();
}

struct RunArgs {
  std::string size = "64K";
  aapc::Options options;
  int iters = 20, warmup = 2;
  bool check = false, json = false;
  int sparse = 0;  // > 0: an alltoallv with this many destinations per rank (Figure 7)
  std::uint64_t seed = 14;
};

// The blocks of one rank: by peer, its length (0 or the block) at offset peer x block.
struct Blocks {
  std::vector<std::size_t> send, recv, displs;
  std::size_t messages = 0;  // between ranks, over the whole cluster
};

// Every rank `block` bytes to each peer (alltoall), or to its Figure 7 destinations (--sparse).
Blocks blocks_of(const RunArgs& a, int me, int n, std::size_t block) {
  Blocks b;
  const auto un = static_cast<std::size_t>(n);
  b.displs.resize(un);
  for (std::size_t d = 0; d < un; ++d) b.displs[d] = d * block;
  if (a.sparse <= 0) {
    b.send.assign(un, block);
    b.recv.assign(un, block);
    b.messages = un * (un - 1);
    return b;
  }
  std::mt19937_64 rng(a.seed);
  const auto pattern = aapc::sched::SparsePattern::figure7(n, std::min(a.sparse, n), rng);
  b.send.assign(un, 0);
  b.recv.assign(un, 0);
  for (int i = 0; i < n; ++i)
    for (int j : pattern.dsts[static_cast<std::size_t>(i)]) {
      if (i == me) b.send[static_cast<std::size_t>(j)] = block;
      if (j == me) b.recv[static_cast<std::size_t>(i)] = block;
      if (i != j) ++b.messages;
    }
  return b;
}

// What the timed exchanges gave.
struct Tally {
  std::string schedule, sync;
  std::vector<double> times;   // exchange + barrier (the papers' measure)
  std::vector<double> inside;  // the exchange alone, as its daemon timed it (Stats::seconds)
  // What each part of a tiny exchange costs: the exchange alone and the barrier alone, as
  // this client saw them.
  std::vector<double> exchanges, barriers;
  std::uint64_t retransmissions = 0, bad = 0;
};

double median_of(std::vector<double> v) {
  if (v.empty()) return 0;
  auto mid = v.begin() + static_cast<std::ptrdiff_t>(v.size() / 2);
  std::nth_element(v.begin(), mid, v.end());
  return *mid;
}

// Rank 0's report: a table, or one JSON object.
void report(aapc::Client& client, const RunArgs& a, const Blocks& blocks, std::uint64_t block, const Tally& t) {
  const int n = client.size();
  std::vector<double> sorted = t.times;
  std::sort(sorted.begin(), sorted.end());
  double mean = 0;
  for (double x : sorted) mean += x;
  mean /= static_cast<double>(sorted.size());
  const double lo = sorted.front(), hi = sorted.back(), median = sorted[sorted.size() / 2];
  const double bits = static_cast<double>(blocks.messages) * static_cast<double>(block) * 8;
  const double aggregate = bits / mean, peak = client.info().peak_bps;
  if (a.json) {
    nlohmann::json j = {{"machines", n},         {"topology", client.info().topology}, {"block", block},       {"schedule", t.schedule},
                        {"sync", t.sync},        {"iterations", a.iters},              {"seconds", mean},      {"seconds_min", lo},
                        {"seconds_max", hi},     {"seconds_median", median},           {"aggregate_bps", aggregate},
                        {"peak_bps", peak},      {"fraction_of_peak", aggregate / peak}, {"retransmissions", t.retransmissions},
                        {"checked", a.check},    {"check_ok", t.bad == 0},             {"sparse", a.sparse},   {"messages", blocks.messages},
                        {"daemon_seconds_median", median_of(t.inside)}, {"exchange_seconds_median", median_of(t.exchanges)},
                        {"barrier_seconds_median", median_of(t.barriers)}};
    std::cout << j.dump() << "\n";
    return;
  }
  std::cout << std::fixed << std::setprecision(2);
  std::cout << "aapc run: " << n << " machines (" << client.info().topology << "), " << human_bytes(block) << " blocks, " << t.schedule
            << (t.sync.empty() || t.sync == "none" ? "" : " + " + t.sync) << ", " << a.iters << " exchanges after " << a.warmup << " warm-up\n";
  std::cout << "  time per exchange  " << mean * 1e3 << " ms (min " << lo * 1e3 << ", median " << median * 1e3 << ", max " << hi * 1e3 << ")\n";
  std::cout << "  in rank 0's daemon " << median_of(t.inside) * 1e3 << " ms (median: the exchange alone, without the barrier"
            << (a.sparse > 0 ? " and an alltoallv's counts" : "") << ")\n";
  std::cout << "  medians at rank 0  exchange " << median_of(t.exchanges) * 1e3 << " ms, barrier " << median_of(t.barriers) * 1e3 << " ms\n";
  if (a.sparse > 0) {
    std::cout << "  pattern            alltoallv, " << a.sparse << " destinations per rank (Figure 7, seed " << a.seed << "), " << blocks.messages
              << " messages; its bound: aapc-sched sparse TOPO -d " << a.sparse << "\n";
    std::cout << "  aggregate          " << aggregate / 1e6 << " Mbit/s\n";
  } else {
    std::cout << "  aggregate          " << aggregate / 1e6 << " Mbit/s = " << std::setprecision(1) << aggregate / peak * 100
              << "% of the physical limit, " << std::setprecision(2) << peak / 1e6 << " Mbit/s\n";
  }
  std::cout << "  retransmissions    " << t.retransmissions << "\n";
  if (a.check) std::cout << "  check              " << (t.bad == 0 ? "every byte as sent" : "FAILED") << "\n";
}

int run(aapc::Client& client, const RunArgs& a) {
  auto block = aapc::sched::parse_bytes(a.size);
  if (!block || *block == 0) {
    std::cerr << "aapc: --size " << a.size << " is not a size like 64K or 1M\n";
    return 2;
  }
  const int me = client.rank(), n = client.size();
  const std::size_t total = static_cast<std::size_t>(n) * *block;
  aapc::Buffer send = client.allocate(total), recv = client.allocate(total);
  auto fill = [&](int iteration) {
    for (int d = 0; d < n; ++d)
      for (std::size_t k = 0; k < *block; ++k) send.data()[static_cast<std::size_t>(d) * *block + k] = pattern(me, d, iteration, k);
  };
  const Blocks blocks = blocks_of(a, me, n, *block);
  auto exchange = [&]() {
    if (a.sparse <= 0) return client.alltoall(send, recv, *block, a.options);
    return client.alltoallv(send, blocks.send, blocks.displs, recv, blocks.recv, blocks.displs, a.options);
  };
  auto barrier = [&] {
    auto b = client.barrier();
    if (!b) std::cerr << "aapc: rank " << me << ": barrier failed: " << b.error().message() << "\n";
    return static_cast<bool>(b);
  };
  Tally t;
  auto check = [&](int iteration) {
    for (int s = 0; s < n; ++s)
      for (std::size_t k = 0; k < blocks.recv[static_cast<std::size_t>(s)]; ++k)
        if (recv.data()[static_cast<std::size_t>(s) * *block + k] != pattern(s, me, iteration, k)) ++t.bad;
  };
  fill(0);
  for (int it = -a.warmup; it < a.iters; ++it) {
    if (a.check) {
      // Checking what arrived and filling what goes next are not timed. They run at idle
      // priority, so that where machines share CPUs (an emulated cluster) they do not delay
      // the daemons and barriers of ranks still in the timed part, and a barrier after them
      // starts the timed exchange together. Without both, rank 0's exchange and barrier
      // waited for the slowest rank's check: 256 KiB at MTU 9000 measured 95% instead of 98%.
      at_idle_priority([&] {
        if (it > -a.warmup) check(it - 1 + a.warmup);
        fill(it + a.warmup);
        std::fill(recv.data(), recv.data() + total, 0xEE);
      });
      if (!barrier()) return 1;
    }
    auto t0 = std::chrono::steady_clock::now();
    auto r = exchange();
    if (!r) {
      std::cerr << "aapc: rank " << me << ": exchange failed: " << r.error().message() << "\n";
      return 1;
    }
    auto tx = std::chrono::steady_clock::now();
    // As in the papers: an exchange, then a barrier, so that exchanges do not overlap.
    if (!barrier()) return 1;
    auto t1 = std::chrono::steady_clock::now();
    t.schedule = r->schedule;
    t.sync = r->sync;
    if (it >= 0) {
      t.times.push_back(std::chrono::duration<double>(t1 - t0).count());
      t.inside.push_back(r->seconds);
      t.exchanges.push_back(std::chrono::duration<double>(tx - t0).count());
      t.barriers.push_back(std::chrono::duration<double>(t1 - tx).count());
      t.retransmissions += r->retransmissions;
    }
  }
  if (a.check) check(a.iters - 1 + a.warmup);
  if (t.bad > 0) std::cerr << "aapc: rank " << me << ": CHECK FAILED: " << t.bad << " bytes differ from what their senders sent\n";
  if (me == 0) report(client, a, blocks, *block, t);
  return t.bad > 0 ? 1 : 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"aapc: run all-to-all exchanges through the local aapcd (run on every node at once; rank 0 reports), or show its state"};
  app.require_subcommand(1);
  std::string socket;
  app.add_option("--socket", socket, "aapcd's socket (default: $AAPC_SOCKET or /run/aapc/aapcd.sock)");
  RunArgs a;
  auto* runc = app.add_subcommand("run", "exchanges of --size bytes per pair, timed as in the papers (exchange, then barrier)");
  runc->add_option("--size,-s", a.size, "block per pair of machines, e.g. 64K, 1M")->capture_default_str();
  runc->add_option("--schedule", a.options.schedule,
                   "auto, " + aapc::sched::algorithm_usages(aapc::sched::AlgorithmInput::kDense) + "; with --sparse also " +
                       aapc::sched::algorithm_usages(aapc::sched::AlgorithmInput::kPattern))
      ->capture_default_str();
  runc->add_option("--group", a.options.group, "the parameter of an algorithm that takes one (group-shuffle's W) when --schedule gives none")->capture_default_str();
  runc->add_option("--sync", a.options.sync, "auto, none, sender-all, receiver-all, barrier-all, sender-partial:4, ...")->capture_default_str();
  runc->add_option("--iters,-n", a.iters, "timed exchanges")->check(CLI::PositiveNumber)->capture_default_str();
  runc->add_option("--warmup", a.warmup, "untimed exchanges first")->check(CLI::NonNegativeNumber)->capture_default_str();
  runc->add_flag("--check", a.check, "validate every received byte");
  runc->add_option("--sparse", a.sparse, "run an alltoallv: every rank sends --size to D ranks (Ranka/Wang/Fox Figure 7 pattern)")
      ->check(CLI::NonNegativeNumber);
  runc->add_option("--seed", a.seed, "the --sparse pattern's seed (the same on every rank)")->capture_default_str();
  runc->add_flag("--json", a.json, "print one JSON object instead of a table");
  auto* statusc = app.add_subcommand("status", "the daemon's state and counters (JSON)");
  CLI11_PARSE(app, argc, argv);

  auto client = aapc::Client::try_connect(socket);
  if (!client) {
    std::cerr << "aapc: " << client.error().message() << "\n";
    return 1;
  }
  try {
    if (statusc->parsed()) {
      auto s = client->status();
      if (!s) {
        std::cerr << "aapc: " << s.error().message() << "\n";
        return 1;
      }
      std::cout << *s << "\n";
      return 0;
    }
    return run(*client, a);
  } catch (const aapc::Exception& e) {
    std::cerr << "aapc: " << e.what() << "\n";
    return 1;
  }
}

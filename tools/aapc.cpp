// aapc: run exchanges through the local aapcd, or show its state.
//
//   aapc run --size 64K --schedule tree --iters 20 --check
//   aapc status
//
// Run it on every node at once (aapc-emu run does that for an emulated cluster; on a real
// one use mpirun or srun); rank 0 prints the result.
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <iomanip>
#include <iostream>
#include <sstream>

#include "aapc/client.hpp"
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

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  auto mid = v.begin() + static_cast<std::ptrdiff_t>(v.size() / 2);
  std::nth_element(v.begin(), mid, v.end());
  return *mid;
}

struct RunArgs {
  std::string size = "64K";
  aapc::Options options;
  int iters = 20, warmup = 2;
  bool check = false, json = false;
};

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
  std::string schedule, sync;
  // Per timed exchange: exchange + barrier (the papers' measure), the exchange alone as the
  // client saw it, the barrier alone, and the exchange as the daemon timed it (issue 14: what
  // each part of a tiny exchange costs).
  std::vector<double> times, exchanges, barriers, in_daemon;
  std::uint64_t retransmissions = 0, bad = 0;
  fill(0);
  for (int it = -a.warmup; it < a.iters; ++it) {
    if (a.check) {
      fill(it + a.warmup);
      std::fill(recv.data(), recv.data() + total, 0xEE);
    }
    auto t0 = std::chrono::steady_clock::now();
    auto r = client.alltoall(send, recv, *block, a.options);
    if (!r) {
      std::cerr << "aapc: rank " << me << ": exchange failed: " << r.error().message() << "\n";
      return 1;
    }
    auto tx = std::chrono::steady_clock::now();
    // As in the papers: an exchange, then a barrier, so that exchanges do not overlap.
    if (auto b = client.barrier(); !b) {
      std::cerr << "aapc: rank " << me << ": barrier failed: " << b.error().message() << "\n";
      return 1;
    }
    auto t1 = std::chrono::steady_clock::now();
    schedule = r->schedule;
    sync = r->sync;
    if (it >= 0) {
      times.push_back(std::chrono::duration<double>(t1 - t0).count());
      exchanges.push_back(std::chrono::duration<double>(tx - t0).count());
      barriers.push_back(std::chrono::duration<double>(t1 - tx).count());
      in_daemon.push_back(r->seconds);
      retransmissions += r->retransmissions;
    }
    if (a.check) {
      for (int s = 0; s < n; ++s)
        for (std::size_t k = 0; k < *block; ++k)
          if (recv.data()[static_cast<std::size_t>(s) * *block + k] != pattern(s, me, it + a.warmup, k)) ++bad;
    }
  }
  if (bad > 0) std::cerr << "aapc: rank " << me << ": CHECK FAILED: " << bad << " bytes differ from what their senders sent\n";
  if (me != 0) return bad > 0 ? 1 : 0;

  double mean = 0;
  for (double t : times) mean += t;
  mean /= static_cast<double>(times.size());
  const double med = median(times);
  double lo = *std::min_element(times.begin(), times.end()), hi = *std::max_element(times.begin(), times.end());
  const double bits = static_cast<double>(n) * (n - 1) * static_cast<double>(*block) * 8;
  const double aggregate = bits / mean, peak = client.info().peak_bps;
  if (a.json) {
    nlohmann::json j = {{"machines", n},         {"topology", client.info().topology}, {"block", *block},     {"schedule", schedule},
                        {"sync", sync},          {"iterations", a.iters},              {"seconds", mean},      {"seconds_min", lo},
                        {"seconds_max", hi},     {"seconds_median", med},
                        {"exchange_seconds_median", median(exchanges)}, {"barrier_seconds_median", median(barriers)},
                        {"daemon_seconds_median", median(in_daemon)},     {"aggregate_bps", aggregate},         {"peak_bps", peak},     {"fraction_of_peak", aggregate / peak},
                        {"retransmissions", retransmissions}, {"checked", a.check},    {"check_ok", bad == 0}};
    std::cout << j.dump() << "\n";
  } else {
    std::cout << std::fixed << std::setprecision(2);
    std::cout << "aapc run: " << n << " machines (" << client.info().topology << "), " << human_bytes(*block) << " blocks, " << schedule
              << (sync.empty() || sync == "none" ? "" : " + " + sync) << ", " << a.iters << " exchanges after " << a.warmup << " warm-up\n";
    std::cout << "  time per exchange  " << mean * 1e3 << " ms (median " << med * 1e3 << ", min " << lo * 1e3 << ", max " << hi * 1e3 << ")\n";
    std::cout << "  of which (medians) exchange " << median(exchanges) * 1e3 << " ms (" << median(in_daemon) * 1e3 << " in the daemon), barrier "
              << median(barriers) * 1e3 << " ms\n";
    std::cout << "  aggregate          " << aggregate / 1e6 << " Mbit/s = " << std::setprecision(1) << aggregate / peak * 100
              << "% of the physical limit, " << std::setprecision(2) << peak / 1e6 << " Mbit/s\n";
    std::cout << "  retransmissions    " << retransmissions << "\n";
    if (a.check) std::cout << "  check              " << (bad == 0 ? "every byte as sent" : "FAILED") << "\n";
  }
  return bad > 0 ? 1 : 0;
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
  runc->add_option("--schedule", a.options.schedule, "auto, tree, sync-shuffle, group-shuffle, pairwise, ring, linear, ...")->capture_default_str();
  runc->add_option("--group", a.options.group, "w of group-shuffle")->capture_default_str();
  runc->add_option("--sync", a.options.sync, "auto, none, sender-all, receiver-all, barrier-all, sender-partial:4, ...")->capture_default_str();
  runc->add_option("--iters,-n", a.iters, "timed exchanges")->check(CLI::PositiveNumber)->capture_default_str();
  runc->add_option("--warmup", a.warmup, "untimed exchanges first")->check(CLI::NonNegativeNumber)->capture_default_str();
  runc->add_flag("--check", a.check, "validate every received byte");
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

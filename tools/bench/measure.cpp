// aapc-bench's measurement mode: runs on every node, against the local daemon.
#include <algorithm>
#include <chrono>
#include <iostream>
#include <numeric>
#include <random>

#include "aapc/client.hpp"
#include "aapc/sched/choice.hpp"
#include "bench/bench.hpp"
#include "pattern.h"

namespace aapc::bench {

namespace {

// --- measurement mode: runs on every node ------------------------------------------------

// Several configurations are measured interleaved, a few exchanges of each in turn, so that
// they share the machine's slow and fast moments: on a box where the daemons share two cores
// the same schedule measured a minute apart differs by 5-60% at 1 KiB, which would swamp
// the differences between schedules that `auto` is calibrated from.
struct Config {
  std::string schedule, sync;
};

std::vector<Config> parse_configs(const std::vector<std::string>& specs) {
  std::vector<Config> out;
  for (const auto& s : specs) {
    auto parts = aapc::sched::read_spec(s);  // also the old SCHEDULE:SYNC
    out.push_back({parts.algorithm, parts.sync.empty() ? "auto" : parts.sync});
  }
  return out;
}

}  // namespace

int measure(const Args& a) {
  aapc::Client c = aapc::Client::connect();
  const int me = c.rank(), n = c.size();
  const std::vector<Config> configs = a.configs.empty() ? std::vector<Config>{{a.schedule, a.sync}} : parse_configs(a.configs);
  auto fail = [&](const aapc::Error& e) {
    std::cerr << "aapc-bench: rank " << me << ": " << e.message() << "\n";
    return 1;
  };
  for (std::uint64_t block : parse_sizes(a.sizes)) {
    const int iters = iterations(block, n, c.info().peak_bps, a.point_seconds, a.max_iters);
    // In turns of a few exchanges: ten per configuration, together at least `iters`.
    const int rounds = std::min(iters, 10), per_round = (iters + rounds - 1) / rounds;
    aapc::Buffer send = c.allocate(n * block), recv = c.allocate(n * block);
    for (int d = 0; d < n; ++d)
      for (std::size_t k = 0; k < block; ++k) send.data()[static_cast<std::size_t>(d) * block + k] = aapc::tools::pattern(me, d, 0, k);
    // What each configuration measured; summed over its turns.
    struct Tally {
      std::string schedule, sync;  // what ran
      double retransmissions = 0, wait = 0, cpu = 0, busy = 0, barrier = 0, seconds = 0;
      std::vector<double> turns;  // this rank's time per exchange in each turn, in round order
      bool ok = true;
    };
    std::vector<Tally> tally(configs.size());
    std::vector<aapc::Options> options(configs.size());
    for (std::size_t i = 0; i < configs.size(); ++i) {
      options[i].schedule = configs[i].schedule;
      options[i].sync = configs[i].sync;
      for (int w = 0; w < 2; ++w) {
        auto r = c.alltoall(send, recv, block, options[i]);
        if (!r) return fail(r.error());
        tally[i].schedule = r->schedule;
        tally[i].sync = r->sync;
      }
    }
    // Every round runs the configurations in a new order, the same on every rank, so that
    // none always follows the same one: a schedule that overflows the queues leaves the next
    // one a busier machine. (Rotating one order, as before, changed which came first but kept
    // each one's predecessor.) Fisher-Yates on mt19937_64, whose output the standard fixes,
    // so that ranks built with different libraries still agree.
    std::vector<std::size_t> order(configs.size());
    for (int round = 0; round < rounds; ++round) {
      std::iota(order.begin(), order.end(), std::size_t{0});
      std::mt19937_64 draw(block * 1000 + static_cast<std::uint64_t>(round));
      for (std::size_t k = order.size(); k > 1; --k) std::swap(order[k - 1], order[draw() % k]);
      for (const std::size_t i : order) {
        Tally& t = tally[i];
        // The check below must see what this turn's exchanges delivered, nothing earlier.
        if (a.check) std::fill(recv.data(), recv.data() + n * block, std::uint8_t{0});
        if (auto b = c.barrier(); !b) return fail(b.error());
        const auto t0 = std::chrono::steady_clock::now();
        for (int k = 0; k < per_round; ++k) {
          auto r = c.alltoall(send, recv, block, options[i]);
          if (!r) return fail(r.error());
          t.retransmissions += static_cast<double>(r->retransmissions);
          t.wait += r->sync_wait_seconds;
          t.cpu += r->daemon_cpu_seconds;
          t.busy += r->seconds;
          const auto b0 = std::chrono::steady_clock::now();
          if (auto b = c.barrier(); !b) return fail(b.error());
          t.barrier += std::chrono::duration<double>(std::chrono::steady_clock::now() - b0).count();
        }
        const double turn = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        t.seconds += turn;
        t.turns.push_back(turn / per_round);
        if (a.check)
          for (int s = 0; s < n && t.ok; ++s)
            for (std::size_t k = 0; k < block; ++k)
              if (recv.data()[s * block + k] != aapc::tools::pattern(s, me, 0, k)) {
                t.ok = false;
                break;
              }
      }
    }
    const int timed = rounds * per_round;
    // Every rank's counters of every configuration to rank 0, in one small exchange of our
    // own: the figures below are the cluster's (resent frames summed, the rest averaged over
    // the ranks; the time is the slowest rank's, which is when the exchange was done
    // everywhere).
    struct Counters {
      double retransmissions, wait, cpu, busy, barrier, seconds, ok;
    };
    const std::size_t k = configs.size();
    aapc::Buffer out = c.allocate(n * k * sizeof(Counters)), in = c.allocate(n * k * sizeof(Counters));
    for (int d = 0; d < n; ++d)
      for (std::size_t i = 0; i < k; ++i) {
        const Tally& t = tally[i];
        out.as<Counters>()[static_cast<std::size_t>(d) * k + i] = {t.retransmissions, t.wait, t.cpu, t.busy, t.barrier, t.seconds, t.ok ? 1.0 : 0.0};
      }
    if (auto r = c.alltoall(out, in, k * sizeof(Counters), aapc::Options{}); !r) return fail(r.error());
    bool all_ok = true;
    for (std::size_t i = 0; i < k; ++i) {
      Tally& t = tally[i];
      t.retransmissions = t.wait = t.cpu = t.busy = t.barrier = t.seconds = 0;
      for (int s = 0; s < n; ++s) {
        const Counters& c_s = in.as<Counters>()[static_cast<std::size_t>(s) * k + i];
        t.retransmissions += c_s.retransmissions;
        t.wait += c_s.wait / n;
        t.cpu += c_s.cpu / n;
        t.busy += c_s.busy / n;
        t.barrier += c_s.barrier / n;
        t.seconds = std::max(t.seconds, c_s.seconds);
        t.ok = t.ok && c_s.ok != 0;
      }
      if (!t.ok && me == 0) std::cerr << "aapc-bench: CHECK FAILED at " << block << " bytes with " << label_of(configs[i].schedule, configs[i].sync) << "\n";
      all_ok = all_ok && t.ok;
      if (me == 0) {
        const bool is_auto = configs[i].schedule == "auto";
        Json j = {{"impl", "aapc"},
                  {"schedule", t.schedule},
                  {"sync", t.sync},
                  {"label", is_auto ? std::string("auto") : label_of(configs[i].schedule, configs[i].sync)},
                  {"size", block},
                  {"iters", timed},
                  {"seconds", t.seconds / timed},
                  {"retransmissions", static_cast<std::uint64_t>(t.retransmissions)},
                  {"sync_wait_s", t.wait / timed},
                  {"cpu_s", t.cpu / timed},
                  {"exchange_s", t.busy / timed},
                  {"barrier_s", t.barrier / timed},
                  {"turn_s", t.turns},  // rank 0's: every turn starts and ends with a barrier
                  {"checked", a.check},
                  {"check_ok", t.ok},
                  {"interleaved", configs.size()}};
        if (is_auto) j["chosen"] = label_of(t.schedule, t.sync);
        std::cout << j.dump() << std::endl;
      }
    }
    if (!all_ok) return 1;
  }
  return 0;
}

}  // namespace aapc::bench

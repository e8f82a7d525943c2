// aapc-bench's measurement mode: runs on every node, against the local daemon.
//
// Several configurations are measured interleaved, a few exchanges of each in turn, so that
// they share the machine's slow and fast moments: on a box where the daemons share two cores
// the same schedule measured a minute apart differs by 5-60% at 1 KiB, which would swamp
// the differences between schedules that `auto` is calibrated from.
#include <algorithm>
#include <chrono>
#include <iostream>
#include <map>
#include <numeric>
#include <optional>
#include <random>
#include <utility>

#include "aapc/client.hpp"
#include "aapc/sched/choice.hpp"
#include "bench/bench.hpp"
#include "pattern.h"

namespace aapc::bench {

namespace {

using Clock = std::chrono::steady_clock;

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

// What each configuration measured; summed over its turns.
struct Tally {
  std::map<std::pair<std::string, std::string>, int> ran;  // (schedule, sync) that ran, by timed turns' exchanges
  double retransmissions = 0, wait = 0, cpu = 0, busy = 0, barrier = 0, seconds = 0;
  std::vector<double> turns;  // this rank's time per exchange in each turn, in round order
  bool ok = true;
  // What ran most often in the timed turns (`auto` measures others now and then).
  const std::pair<std::string, std::string>& most_ran() const {
    return std::max_element(ran.begin(), ran.end(), [](const auto& a, const auto& b) { return a.second < b.second; })->first;
  }
};

// One block size on this node: the client, its buffers and the configurations.
struct Point {
  const Args& a;
  aapc::Client& c;
  int me, n;
  std::uint64_t block;
  aapc::Buffer send, recv;
  std::vector<aapc::Options> options;
  std::vector<Tally> tally;
};

using Failure = std::optional<aapc::Error>;

// Two exchanges of each configuration, not measured.
Failure warm_up(Point& pt) {
  for (std::size_t i = 0; i < pt.options.size(); ++i)
    for (int w = 0; w < 2; ++w)
      if (auto r = pt.c.alltoall(pt.send, pt.recv, pt.block, pt.options[i]); !r) return r.error();
  return std::nullopt;
}

// Whether the receive buffer holds what every rank sent here.
bool received_right(const Point& pt) {
  for (int s = 0; s < pt.n; ++s)
    for (std::size_t k = 0; k < pt.block; ++k)
      if (pt.recv.data()[s * pt.block + k] != aapc::tools::pattern(s, pt.me, 0, k)) return false;
  return true;
}

// One turn of configuration i: `per_round` exchanges, each followed by a barrier.
Failure turn(Point& pt, std::size_t i, int per_round) {
  Tally& t = pt.tally[i];
  // The check below must see what this turn's exchanges delivered, nothing earlier.
  if (pt.a.check) std::fill(pt.recv.data(), pt.recv.data() + pt.n * pt.block, std::uint8_t{0});
  if (auto b = pt.c.barrier(); !b) return b.error();
  const auto t0 = Clock::now();
  for (int k = 0; k < per_round; ++k) {
    auto r = pt.c.alltoall(pt.send, pt.recv, pt.block, pt.options[i]);
    if (!r) return r.error();
    ++t.ran[{r->schedule, r->sync}];
    t.retransmissions += static_cast<double>(r->retransmissions);
    t.wait += r->sync_wait_seconds;
    t.cpu += r->daemon_cpu_seconds;
    t.busy += r->seconds;
    const auto b0 = Clock::now();
    if (auto b = pt.c.barrier(); !b) return b.error();
    t.barrier += std::chrono::duration<double>(Clock::now() - b0).count();
  }
  const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  t.seconds += seconds;
  t.turns.push_back(seconds / per_round);
  if (pt.a.check && t.ok) t.ok = received_right(pt);
  return std::nullopt;
}

// Every round runs the configurations in a new order, the same on every rank, so that none
// always follows the same one: a schedule that overflows the queues leaves the next one a
// busier machine. (Rotating one order, as before, changed which came first but kept each
// one's predecessor.) Fisher-Yates on mt19937_64, whose output the standard fixes, so that
// ranks built with different libraries still agree.
Failure rounds(Point& pt, int rounds, int per_round) {
  std::vector<std::size_t> order(pt.options.size());
  for (int round = 0; round < rounds; ++round) {
    std::iota(order.begin(), order.end(), std::size_t{0});
    std::mt19937_64 draw(pt.block * 1000 + static_cast<std::uint64_t>(round));
    for (std::size_t k = order.size(); k > 1; --k) std::swap(order[k - 1], order[draw() % k]);
    for (const std::size_t i : order)
      if (auto f = turn(pt, i, per_round)) return f;
  }
  return std::nullopt;
}

// Every rank's counters of every configuration to rank 0, in one small exchange of our own:
// the figures are the cluster's (resent frames summed, the rest averaged over the ranks; the
// time is the slowest rank's, which is when the exchange was done everywhere).
Failure gather(Point& pt) {
  struct Counters {
    double retransmissions, wait, cpu, busy, barrier, seconds, ok;
  };
  const int n = pt.n;
  const std::size_t k = pt.tally.size();
  aapc::Buffer out = pt.c.allocate(n * k * sizeof(Counters)), in = pt.c.allocate(n * k * sizeof(Counters));
  for (int d = 0; d < n; ++d)
    for (std::size_t i = 0; i < k; ++i) {
      const Tally& t = pt.tally[i];
      out.as<Counters>()[static_cast<std::size_t>(d) * k + i] = {t.retransmissions, t.wait, t.cpu, t.busy, t.barrier, t.seconds, t.ok ? 1.0 : 0.0};
    }
  if (auto r = pt.c.alltoall(out, in, k * sizeof(Counters), aapc::Options{}); !r) return r.error();
  for (std::size_t i = 0; i < k; ++i) {
    Tally& t = pt.tally[i];
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
  }
  return std::nullopt;
}

// Rank 0's line of JSON for configuration i, after `timed` exchanges.
Json point_json(const Point& pt, const Config& config, const Tally& t, int timed) {
  const bool is_auto = config.schedule == "auto";
  const auto& [schedule, sync] = t.most_ran();  // iterations() gives every configuration 3 or more
  Json j = {{"impl", "aapc"},
            {"schedule", schedule},
            {"sync", sync},
            {"label", is_auto ? std::string("auto") : label_of(config.schedule, config.sync)},
            {"size", pt.block},
            {"iters", timed},
            {"seconds", t.seconds / timed},
            {"retransmissions", static_cast<std::uint64_t>(t.retransmissions)},
            {"sync_wait_s", t.wait / timed},
            {"cpu_s", t.cpu / timed},
            {"exchange_s", t.busy / timed},
            {"barrier_s", t.barrier / timed},
            {"turn_s", t.turns},  // rank 0's: every turn starts and ends with a barrier
            {"checked", pt.a.check},
            {"check_ok", t.ok},
            {"interleaved", pt.tally.size()}};
  if (is_auto) j["chosen"] = label_of(schedule, sync);
  return j;
}

// One block size, every configuration; the checks' verdict, or why it could not be measured.
Failure measure_block(Point& pt, const std::vector<Config>& configs, bool& all_ok) {
  const int iters = iterations(pt.block, pt.n, pt.c.info().peak_bps, pt.a.point_seconds, pt.a.max_iters);
  // In turns of a few exchanges: ten per configuration, together at least `iters`.
  const int rounds_n = std::min(iters, 10), per_round = (iters + rounds_n - 1) / rounds_n;
  for (int d = 0; d < pt.n; ++d)
    for (std::size_t k = 0; k < pt.block; ++k) pt.send.data()[static_cast<std::size_t>(d) * pt.block + k] = aapc::tools::pattern(pt.me, d, 0, k);
  if (auto f = warm_up(pt)) return f;
  if (auto f = rounds(pt, rounds_n, per_round)) return f;
  if (auto f = gather(pt)) return f;
  all_ok = true;
  for (std::size_t i = 0; i < configs.size(); ++i) {
    const Tally& t = pt.tally[i];
    if (!t.ok && pt.me == 0)
      std::cerr << "aapc-bench: CHECK FAILED at " << pt.block << " bytes with " << label_of(configs[i].schedule, configs[i].sync) << "\n";
    all_ok = all_ok && t.ok;
    if (pt.me == 0) std::cout << point_json(pt, configs[i], t, rounds_n * per_round).dump() << std::endl;
  }
  return std::nullopt;
}

}  // namespace

int measure(const Args& a) {
  aapc::Client c = aapc::Client::connect();
  const int me = c.rank(), n = c.size();
  const std::vector<Config> configs = a.configs.empty() ? std::vector<Config>{{a.schedule, a.sync}} : parse_configs(a.configs);
  std::vector<aapc::Options> options(configs.size());
  for (std::size_t i = 0; i < configs.size(); ++i) {
    options[i].schedule = configs[i].schedule;
    options[i].sync = configs[i].sync;
  }
  for (std::uint64_t block : parse_sizes(a.sizes)) {
    Point pt{a, c, me, n, block, c.allocate(n * block), c.allocate(n * block), options, std::vector<Tally>(configs.size())};
    bool all_ok = true;
    if (auto f = measure_block(pt, configs, all_ok)) {
      std::cerr << "aapc-bench: rank " << me << ": " << f->message() << "\n";
      return 1;
    }
    if (!all_ok) return 1;
  }
  return 0;
}

}  // namespace aapc::bench

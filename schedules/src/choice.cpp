#include "aapc/sched/choice.hpp"

#include <algorithm>
#include <span>
#include <stdexcept>

#include "aapc/sched/frame.hpp"

namespace aapc::sched {

namespace {

// Larger blocks on a tree (docs/design.md, Fast links): the paced shuffle, every block in
// flight at once at its bottleneck link's share of the rate. The tree's phases reach the
// limit only while one sender fills each bottleneck link by itself and hand-overs cost
// little against a block; as links get faster than a node can send, or a block's time on
// the wire shrinks towards a hand-over's, they fall to half of the limit and below (53% at
// 4 Gbit/s on a 16-core machine, 256 KiB on 8-two-switch). The paced shuffle needs a node to send at
// (p - 1) / load of its link and waits for no token. Measured with aapc-bench on
// 8-two-switch, every configuration interleaved, 3 repetitions, medians, % of the limit
// (2026-11-27, the 2-core development VM, otherwise idle):
//                     64 KiB              256 KiB             1 MiB
//                 tree+s-all  paced   tree+s-all  paced   tree+s-all  paced   (sync-shuffle)
//   100 Mbit/s       94.7      92.6      94.5      93.9      95.8      95.0   (87.8-92.2, 27,948+ resent)
//   300 Mbit/s       83.0      88.8      88.5      91.8      91.6      92.4   (77.6-92.5, 8,384+ resent)
//   500 Mbit/s       69.1      84.5      80.0      90.4      83.6      90.4   (86.6-90.0)
// Where the phases win (slow links, an idle host) they lead by at most 2.1 points; where they
// lose, by up to 16: on this host eight daemons share two cores, and from 300 Mbit/s a node
// no longer fills its link, as one af_packet port does not from 2 Gbit/s on a 16-core one.
// Below 32 KiB the paced shuffle's fixed cost per exchange (every rank's READY before the
// last blocks can start, all blocks ending together) weighs more than the phases' hand-overs:
// 12-three-level at 100 Mbit/s, 8 KiB: tree + sender-all 89.7%, paced 79.9% (64 KiB: 94.2%,
// 91.6%). The boundary comes from these two topologies; a node's measured send rate, agreed
// by the cluster, would draw it better (docs/design.md, Fast links).
// Nor where many nodes share the bottleneck: paced at 99% of its rate by dozens of senders
// whose hosts wake them late independently, a link's queue grows as a queue at 99% load does
// (an M/D/1 queue holds 49 frames on average, a switch port 43 here): 64-three-level at 25
// Mbit/s, 64 KiB, resent 165,637 frames and reached 77.3% where the phases reach 94.5%;
// 64-two-level 91.7% with 4 resent, against 95.2%. The paced shuffle is chosen only while each
// node's blocks are at least a quarter of its bottleneck link's load ((p - 1) x 4 >= load:
// 8-two-switch 7/16, 12-three-level 11/36; 64-two-level 63/448 is not).
//
// Both rules hold where every link runs at one rate. Where rates differ, the phases count the
// busiest link's blocks, not its time, and each block crosses at its path's slowest rate
// (TreeModel::phase_efficiency): on random trees of 50, 100 and 200 Mbit/s links the tree with
// tokens reached 55-56% of the limit at 20-300 KB blocks, as predicted (56.4%), where the paced
// shuffle reached 83% at 20 KB and 91-93% from 100 KB (2026-12-04, aapc-bench --repeat 3, every
// byte checked). So from 32 KiB, where the phases alone, at no hand-over cost, would reach less
// than 90% of the limit, the paced shuffle runs instead.
//
// Below 32 KiB the paced shuffle's fixed cost weighs there too (79-83% of the limit at 5-10 KB,
// 86-88% at 20 KB, on the trees below), and phases that reach 89% win: three trees of 25, 100
// and 300 Mbit/s links (aapc-sched generate --seed 601-603, every fourth link 25 Mbit/s, every
// third 300; 2026-12-05, --repeat 3, medians, % of the limit, every byte checked):
//                   phases   5000 B tree / paced   10000 B        20000 B
//   12 machines     88.7%      86.9 / 78.8         89.4 / 81.0    87.8 / 86.2
//   9 machines      76.6%      76.3 / 79.9         78.2 / 83.2    75.8 / 87.7
//   8 machines      63.2%      64.2 / 79.0         65.9 / 82.3    63.8 / 87.2
// So the phases run where they would reach what the paced shuffle reaches at that size: 80%
// below 16 KiB, 86% below 32 KiB (kLargeBlockFrom), 90% above.
double paced_shuffle_reaches(std::uint64_t block_bytes) {
  if (block_bytes < kLargeBlockFrom / 2) return 0.8;
  if (block_bytes < kLargeBlockFrom) return 0.86;
  return 0.9;
}

Choice paced_choice(std::string reason) { return {{Algorithm::kPacedShuffle, 4}, {SyncKind::kNone, 1}, std::move(reason)}; }
Choice phases_choice(std::string reason) { return {kWeighed[0].algorithm_spec(), kWeighed[0].sync_spec(), std::move(reason)}; }

std::string percent(double fraction) { return std::to_string(static_cast<int>(fraction * 100)) + "%"; }

// Whether an exchange's blocks are of one size (an alltoallv's are not: kAnyBlockSize).
bool one_size(std::uint64_t block_bytes) { return block_bytes != 0 && block_bytes != kAnyBlockSize; }

// The cluster's fit of the phases, in the words of `auto`'s reasons.
std::string fit_words(const Measured& measured) {
  return "the fit of their fill (" + percent(measured.fill) + ") and hand-over (" + std::to_string(static_cast<int>(measured.hand_over_s * 1e6)) +
         " us a phase)";
}

// What the two scheduled ones of kWeighed reach at blocks of `block_bytes`: each what the
// cluster measured of it at this size, else the phases what their fit (or the model) gives
// them and the paced shuffle what it reached on the trees above (paced_shuffle_reaches).
struct ScheduledReach {
  double phases = 0, paced = 0;
  double phases_measured = 0, paced_measured = 0;  // 0: not measured at this size
  std::string words;  // the reach of each and by what, for auto's reasons; empty where nothing was measured
};

ScheduledReach scheduled_reach(const TreeModel& model, std::uint64_t block_bytes, const Measured& measured) {
  ScheduledReach s;
  s.phases_measured = measured.reach_at(reach_cell(kWeighed[0], block_bytes));
  s.paced_measured = measured.reach_at(reach_cell(kWeighed[1], block_bytes));
  s.phases = s.phases_measured > 0 ? s.phases_measured : phases_reach(model, block_bytes, measured);
  s.paced = s.paced_measured > 0 ? s.paced_measured : paced_shuffle_reaches(block_bytes);
  if (!measured.known() && s.phases_measured == 0 && s.paced_measured == 0) return s;
  s.words = "the phases reach " + percent(s.phases);
  if (s.phases_measured > 0)
    s.words += " as measured at this size";
  else if (measured.known())
    s.words += " by " + fit_words(measured);
  s.words += ", the paced shuffle " + percent(s.paced) + (s.paced_measured > 0 ? " as measured" : "") + ": this cluster measured";
  return s;
}

// `best`, or in its place the unscheduled one of kWeighed that the cluster measured at this size
// ahead of `scheduled` (what the better of the phases and the paced shuffle reaches at this
// size) by kUnscheduledLead. `where` and `weighed` begin and end its reason.
Choice unscheduled_lead(Choice best, double scheduled, std::uint64_t block_bytes, const Measured& measured, const std::string& where, const std::string& weighed) {
  constexpr double kUnscheduledLead = 1.05;
  double lead = scheduled * kUnscheduledLead;
  for (const Weighed& w : std::span(kWeighed).subspan(2)) {  // the unscheduled ones
    const double r = measured.reach_at(reach_cell(w, block_bytes));
    if (r <= lead) continue;
    lead = r;
    best = {w.algorithm_spec(), w.sync_spec(),
            where + std::string(algorithm_info(w.algorithm).name) + " without tokens, measured at " + percent(r) + " of the limit at this size (" + weighed + ")"};
  }
  return best;
}

// Below 32 KiB, not where many nodes share the bottleneck: kWeighed by what each reaches for
// blocks of `block_bytes`. The phases: what the cluster measured of them at this size, else what
// its fit of their fill and hand-over (Measured) gives them, else the model's.
// On 8-two-switch at 500 Mbit/s on this 2-core VM the model alone (no hand-over) gave the
// phases 100% and ran them at 16 KiB: 78.5% of the paced shuffle's throughput. Measured (the
// daemons agreed on a fill of 0.86 and 244 us a phase), auto ran the paced shuffle at 12, 16 and
// 24 KiB, at 97.3-100% of the best; at 100 Mbit/s (0.97 and 101 us) it kept the phases, at
// 99.6-100% (2026-12-05, aapc-bench --repeat 3, medians, docs/benchmarks.md, "auto by
// measurement"). The paced shuffle: what the cluster measured of it at this size, else what it
// reached on the trees above.
// The unscheduled schedules have no model: which of them wins depends on whether the hosts send
// fast enough to overflow the switches' queues. On 8-two-switch at 16 KiB the synchronous shuffle
// resent 4,008 frames and reached 65% of the limit at 100 Mbit/s, where the phases reached 77;
// from 300 Mbit/s, where eight daemons on two cores no longer keep the queues full, it resent none
// and reached 81-89%, where the paced shuffle reached 65-72 and the phases less; the pairwise
// exchange led on 12-three-level at 400 Mbit/s, 12 KiB (76.6% against the paced shuffle's 58.4;
// docs/benchmarks.md). So one of them runs only where the cluster measured it, at this size,
// ahead of both scheduled ones by kUnscheduledLead: its losses come and go with the hosts' load.
// Weighed so, auto reached 97-100% of the best at 5-24 KB on 12-three-level at 400 Mbit/s, two
// generated trees at 300 and 8-two-switch at 300-500, where the paced shuffle it ran before
// reached 78-97% of the best, and at 100-200 Mbit/s on 8-two-switch and two more generated trees
// (2026-12-05, aapc-bench --repeat 3, medians; docs/benchmarks.md, "32 exchanges a cell"). What
// each reached is what its exchanges reached together, over the daemons' last 32: one in five
// pairwise exchanges lost a frame at 200 Mbit/s and took 2.5 times as long.
Choice weighed_choice(const TreeModel& model, std::uint64_t block_bytes, const Measured& measured) {
  const ScheduledReach s = scheduled_reach(model, block_bytes, measured);
  const double phases = s.phases, paced = s.paced;
  const std::string& weighed = s.words;  // empty: the model's alone
  Choice best;
  if (phases >= paced)
    best = phases_choice("tree of switches, blocks below 32 KiB: contention-free phases with sender-based tokens" + (weighed.empty() ? "" : " (" + weighed + ")"));
  else if (!weighed.empty())
    best = paced_choice("tree of switches, blocks below 32 KiB: paced shuffle (" + weighed + ")");
  else
    best = paced_choice("tree of switches whose links differ in rate: paced shuffle (the contention-free phases would reach " + percent(phases) + " of the limit at most)");
  best = unscheduled_lead(std::move(best), std::max(phases, paced), block_bytes, measured, "tree of switches, blocks below 32 KiB: ", weighed);
  best.weighed = true;
  return best;
}

// From 32 KiB, and where many senders share the bottleneck: the phases or the paced shuffle,
// `s` what each reaches at this size.
Choice scheduled_large_choice(const TreeModel& model, std::uint64_t block_bytes, const Measured& measured, const ScheduledReach& s, bool many_senders) {
  // The model alone decides ...
  const double phases = model.phase_efficiency();
  if (phases < paced_shuffle_reaches(block_bytes))
    return paced_choice("tree of switches whose links differ in rate: paced shuffle (the contention-free phases would reach " + percent(phases) + " of the limit at most)");
  if (many_senders)
    return phases_choice("tree of switches shared by many senders: contention-free phases with sender-based tokens (a paced link at 99% would queue)");
  // ... but where the cluster measured the phases (their fill and hand-over, Measured, or what
  // they reached at this size), they run where that gives them a clear lead over the paced
  // shuffle: on slow links and idle hosts they lead by 1-4 points from 32 KiB (8-two-switch at
  // 100 Mbit/s, 64 KiB to 1 MiB: 93.3-94.4% against 91.1-93.4; a generated star of 10 machines
  // at 120 Mbit/s, 32 KiB: 91.1 against 87.4; 2026-12-05, aapc-bench --repeat 3, medians). The
  // lead asked for, kPhasesLead, weighs the sides' costs: where the phases lose, they lose by up
  // to 16 points (the table above). An alltoallv's blocks are of no one size, which the fit
  // cannot weigh.
  if (one_size(block_bytes) && (measured.known() || s.phases_measured > 0)) {
    constexpr double kPhasesLead = 0.02;
    if (s.phases >= s.paced + kPhasesLead) return phases_choice("tree of switches: contention-free phases with sender-based tokens (" + s.words + ")");
    return paced_choice("tree of switches: paced shuffle, every block at once at its bottleneck's share of the rate (" + s.words + ")");
  }
  return paced_choice("tree of switches: paced shuffle, every block at once at its bottleneck's share of the rate (no node must fill a link, no hand-over)");
}

// From 32 KiB both scheduled ones need a node that sends at its share of the link's rate. Where
// the hosts cannot (more daemons than cores, links faster than a node sends), the unscheduled
// shuffles, which wait for nothing, take what the hosts give and lose no frame, because the
// hosts cannot fill the queues: 9 machines of a generated tree (aapc-sched generate -m 9 -n 3
// --seed 31) on this 2-core VM at 1 and 2 Gbit/s (2026-12-05, aapc-bench --repeat 3, medians, %
// of the limit, every byte checked): 64 KiB paced 56.3 / pairwise-ec 66.1 / sync-shuffle 64.3,
// 256 KiB 59.8 / 65.0 / 69.9 at 1 Gbit/s, and auto, which ran the paced shuffle, 83-86% of the
// best. So one of them runs where the cluster measured it at this size ahead of both scheduled
// ones, as below 32 KiB (unscheduled_lead). The daemon measures them (Choice::weighed) only
// where the one chosen measured below kHostsBehind here, or where one of them runs: on hosts
// that keep up the paced shuffle reached 83-94% from 32 KiB (the tables above), and there the
// unscheduled ones overflow queues (8-two-switch at 100 Mbit/s, 256 KiB: sync-shuffle resent
// 27,948 frames), which measuring them now and then would cost every job.
Choice large_block_choice(const TreeModel& model, std::uint64_t block_bytes, const Measured& measured) {
  constexpr double kHostsBehind = 0.8;
  const bool many_senders = shared_by_many_senders(model);
  if (!many_senders && block_bytes < kLargeBlockFrom) return weighed_choice(model, block_bytes, measured);
  const ScheduledReach s = scheduled_reach(model, block_bytes, measured);
  const Choice scheduled = scheduled_large_choice(model, block_bytes, measured, s, many_senders);
  if (many_senders) return scheduled;
  Choice best = unscheduled_lead(scheduled, std::max(s.phases, s.paced), block_bytes, measured, "tree of switches: ", s.words);
  const double chosen = scheduled.algorithm.algorithm == Algorithm::kTree ? s.phases_measured : s.paced_measured;
  best.weighed = best.algorithm.algorithm != scheduled.algorithm.algorithm || (chosen > 0 && chosen < kHostsBehind);
  return best;
}

// One switch (8-one-switch, limit 800): the synchronous shuffle of Tam/Wang (Alg. 2) needs no
// synchronisation (auto_choice's table). Hosts of different rates on one switch: its slots
// overrun the slower hosts' links (registry.cpp) once the queues no longer absorb what they take
// slower (`absorbed`: block x load below three switch buffers), where the paced shuffle gives
// every block the same share of the slowest host's link and so ends at the limit. Six
// machines, two at 25 Mbit/s and four at 100 (2026-12-04, aapc-bench --repeat 3, medians, % of
// the limit): 4 KiB sync-shuffle 86.8, paced 77.8; 64 KiB 89.1 (2,898 frames resent), 92.6;
// 256 KiB 87.3 (12,123 resent), 93.7.
Choice one_switch_choice(const TreeModel& model, bool absorbed) {
  if (model.uniform_rates()) return {{Algorithm::kSyncShuffle, 4}, {SyncKind::kNone, 1}, "one switch: synchronous shuffle, no synchronisation needed"};
  if (absorbed)
    return {{Algorithm::kSyncShuffle, 4}, {SyncKind::kNone, 1}, "one switch, hosts of different rates, small blocks: synchronous shuffle, the queues absorb what the slower links take slower"};
  return {{Algorithm::kPacedShuffle, 4}, {SyncKind::kNone, 1}, "one switch, hosts of different rates: paced shuffle, every block at once at the slowest link's share of the rate"};
}

// The small-block rule's count of blocks (auto_choice) was drawn on trees of one rate, where a
// link's feeders bring its blocks at about its own rate. Where a link is slower than the hosts
// that feed it, its queue fills faster than the count shows, so the fluid estimate of the
// fullest queue (TreeModel::unpaced_queue_blocks) must stay below one and a half buffers too.
// On 12 trees of 25-400 Mbit/s links (the three above, six of 50, 100 and 200 Mbit/s, --seed
// 501-506, and three more; 2,000-20,000 B), the pairwise exchange without tokens resent at
// most 225 frames wherever the estimate was at most 1.28 buffers, and 469-15,908 at every point
// from 1.65, where it lost to the tree or the paced shuffle at 8 of 14 points and tied at one
// (12 machines, 5000 B: 77.9%, 1,828 resent, against the tree's 86.9%). On one rate the count decides alone: the
// estimate does not separate there (8-two-switch lost frames at 1.7 buffers, 12-three-level not
// at 2.0).
bool queues_hold(const TreeModel& model, std::uint64_t block_bytes, std::uint64_t buffer) {
  constexpr double kBuffersHeld = 1.5;
  return static_cast<double>(block_bytes) * model.unpaced_queue_blocks() < kBuffersHeld * static_cast<double>(buffer);
}

}  // namespace

bool shared_by_many_senders(const TreeModel& model) {
  constexpr std::int64_t kMostSendersPerNode = 4;
  return kMostSendersPerNode * (model.topology().machine_count() - 1) < model.load();
}

double phases_reach(const TreeModel& model, std::uint64_t block_bytes, const Measured& measured) {
  const double modelled = model.phase_efficiency();
  if (!measured.known() || !one_size(block_bytes) || model.load() <= 0) return modelled;
  // The phases' time: the model's (the best time over its efficiency) at the measured fill,
  // plus the hand-over of each phase of the bottleneck's.
  const double best = model.best_time_s(block_bytes);
  const double phases_s = best / (modelled * measured.fill) + static_cast<double>(model.load()) * measured.hand_over_s;
  return best / phases_s;
}

std::optional<TreeSample> tree_sample(const TreeModel& model, std::uint64_t block_bytes, double took_s) {
  if (!one_size(block_bytes) || took_s <= 0 || model.load() <= 0) return std::nullopt;
  const auto phases = static_cast<double>(model.load());
  return TreeSample{model.best_time_s(block_bytes) / model.phase_efficiency() / phases, took_s / phases};
}

namespace {

double median_of(std::vector<double> v) {
  const auto mid = v.begin() + static_cast<std::ptrdiff_t>(v.size() / 2);
  std::nth_element(v.begin(), mid, v.end());
  return *mid;
}

}  // namespace

double exchange_reach(const TreeModel& model, std::uint64_t block_bytes, double took_s) {
  if (!one_size(block_bytes) || took_s <= 0) return 0;
  return model.best_time_s(block_bytes) / took_s;
}

double reach_together(const std::vector<double>& samples) {
  double inverse = 0;
  for (const double r : samples) inverse += 1 / r;
  return samples.empty() ? 0 : static_cast<double>(samples.size()) / inverse;
}

std::vector<std::pair<std::size_t, std::size_t>> reach_listing(const std::array<std::size_t, kReachCells>& kept) {
  std::vector<std::pair<std::size_t, std::size_t>> order;
  for (std::size_t age = *std::max_element(kept.begin(), kept.end()); age-- > 0;)  // age 0: a cell's newest
    for (std::size_t c = 0; c < kReachCells; ++c)
      if (kept[c] > age) order.emplace_back(c, kept[c] - 1 - age);
  return order;
}

std::optional<std::size_t> reach_octave(std::uint64_t block_bytes) {
  if (block_bytes < kReachSizeFrom || block_bytes >= (kReachSizeFrom << kReachSizes)) return std::nullopt;
  std::size_t octave = 0;
  while ((kReachSizeFrom << (octave + 1)) <= block_bytes) ++octave;
  return octave;
}

std::optional<std::size_t> reach_cell(const AlgorithmSpec& algorithm, const SyncSpec& sync, std::uint64_t block_bytes) {
  const auto octave = reach_octave(block_bytes);
  if (!octave) return std::nullopt;
  for (std::size_t w = 0; w < kWeighed.size(); ++w) {
    if (kWeighed[w].algorithm != algorithm.algorithm || kWeighed[w].sync != sync.kind) continue;
    if (*octave < kReachSmallSizes) return w * kReachSmallSizes + *octave;
    return kWeighed.size() * kReachSmallSizes + w * kReachLargeSizes + (*octave - kReachSmallSizes);
  }
  return std::nullopt;
}

namespace {

// The schedule (its index in kWeighed) and the octave of a cell: reach_cell() inverted.
std::pair<std::size_t, std::size_t> cell_parts(std::size_t cell) {
  constexpr std::size_t kSmallCells = kWeighed.size() * kReachSmallSizes;
  if (cell >= kReachCells) throw std::out_of_range("reach cell " + std::to_string(cell));
  if (cell < kSmallCells) return {cell / kReachSmallSizes, cell % kReachSmallSizes};
  return {(cell - kSmallCells) / kReachLargeSizes, kReachSmallSizes + (cell - kSmallCells) % kReachLargeSizes};
}

}  // namespace

std::string reach_cell_schedule(std::size_t cell) {
  const Weighed& w = kWeighed.at(cell_parts(cell).first);
  return format_plan_spec(w.algorithm_spec(), w.sync_spec());
}

std::uint64_t reach_cell_block(std::size_t cell) { return kReachSizeFrom << cell_parts(cell).second; }

Measured fit_measured(const std::vector<TreeSample>& samples) {
  if (samples.empty()) return {};
  // Samples of sizes that differ by less than this are of one size: their slope is noise.
  constexpr double kApart = 1.25;
  std::vector<double> slopes;
  for (std::size_t i = 0; i < samples.size(); ++i)
    for (std::size_t j = i + 1; j < samples.size(); ++j) {
      const TreeSample &a = samples[i], &b = samples[j];
      if (std::max(a.model_s, b.model_s) >= kApart * std::min(a.model_s, b.model_s)) slopes.push_back((b.took_s - a.took_s) / (b.model_s - a.model_s));
    }
  // Slower in proportion only: one size, or the fit's hand-over below 0.
  auto all_fill = [&] {
    std::vector<double> ratios;
    for (const TreeSample& s : samples) ratios.push_back(s.took_s / s.model_s);
    return Measured{1 / std::max(1.0, median_of(ratios)), 0.0};
  };
  if (slopes.empty()) return all_fill();
  const double slope = std::max(1.0, median_of(slopes));
  std::vector<double> intercepts;
  for (const TreeSample& s : samples) intercepts.push_back(s.took_s - slope * s.model_s);
  const double hand_over = median_of(intercepts);
  return hand_over >= 0 ? Measured{1 / slope, hand_over} : all_fill();
}

Choice auto_choice(const TreeModel& model, std::uint64_t block_bytes, const Measured& measured) {
  const Topology& topology = model.topology();
  // Calibrated with aapc-bench (2 cores, emulated clusters with 100 Mbit/s links, tbf, Linux
  // bridges; aggregate Mbit/s, auto's own row in parentheses where it differs):
  //
  // One switch (8-one-switch, limit 800): the synchronous shuffle of Tam/Wang (Alg. 2) needs
  // no synchronisation and was best or within noise at every size, 1 KiB to 1 MiB:
  //   1 KiB 202 (next best tree 141), 8 KiB 521 (tree 500), 64 KiB 717 (pairwise 710),
  //   1 MiB 764 (tree 763). Phased schedules pay for tokens they do not need on one switch.
  //   Interleaved at 1-8 KiB (2 sessions x 3 repetitions, ratio to the best of the same
  //   repetition, median): sync-shuffle 91-98%, every other schedule without tokens 90-99%,
  //   the order changing from run to run; the tree with tokens 65-91%.
  //
  // A tree of switches (8-two-switch limit 350, 12-three-level limit 367):
  // - While what one exchange sends over the bottleneck link, load x block (Faraj/Yuan section
  //   3: |Mu| x |Mv| blocks each way), stays below three switch buffers, the queues absorb
  //   what contends and tokens cost more than they save: the pairwise exchange of Tam/Wang
  //   with the edge colouring of Fig. 1, without tokens. Each of its phases is a perfect
  //   matching, and the colouring spreads the pairs that cross the bottleneck over the phases
  //   (the XOR pairing of 8 machines puts all four cross pairs of 8-two-switch in the same
  //   phases, and overflows at 8 KiB). Measured with aapc-bench, every configuration
  //   interleaved turn by turn, 3 repetitions (2026-11-22, 64 KiB switch buffers); each
  //   schedule's median Mbit/s over the best one's, in %:
  //                     block  load x block  pairwise-ec  group-shuffle  tree  tree+sender-all
  //     8-two-switch     1K        16K          100           97           96       76
  //     (load 16)        2K        32K           95           99          100       77
  //                      4K        64K          100           99           99       90
  //                      8K       128K          100           97           94       92
  //                     12K       192K    54.8% of the limit, 1,580 frames resent;  86.7%, none
  //     12-three-level   1K        36K           98          100           96       70
  //     (load 36)        2K        72K           98           96           92       67
  //                      4K       144K          100           95           92       79
  //                      5K       180K          100 (84.3%)   90 (37 resent)         86
  //                      6K       216K          100 (85.2%, 21 resent)                86
  //                      8K       288K           84 (1,750 resent)                    99 (best)
  //   (the group shuffle, w = 4, the rule before: 94-95% at 12-three-level 4 KiB in 4 runs).
  //   The boundary is not sharp: at 6 KiB on 12-three-level, just above it, the pairwise
  //   exchange still led the tree with tokens by 15% with 21 frames resent.
  // - Above, without sync, consecutive phases overlap, queues overflow and frames are resent
  //   (12-three-level 8 KiB: pairwise 245 with 1,781 frames resent, tree 246 with 3,308;
  //   16 KiB: tree 235 with 21,228); Faraj/Yuan/Patarasuk section 6's sender-based pair-wise
  //   tokens keep the phases apart at the lowest cost:
  //     8-two-switch   8 KiB 268 (no frame resent), 64 KiB 331, 1 MiB 336 = 96.0%
  //     12-three-level 8 KiB 298 (no frame resent), 64 KiB 349, 1 MiB 352 = 96.0%
  //   receiver-based tokens are 1-15% behind below 64 KiB (one more token round trip per
  //   phase) and equal above.
  //
  // Below 16 KiB the same schedule measured in separate runs differs by 10-50% on this 2-core
  // virtual machine; measured round by round against each other, auto and the schedule it
  // ran agree within 2.2% (6.6% once at 1 KiB while the host took CPU): what the table above
  // resolves.
  // Tiny blocks: Bruck's combining exchange (Bruck et al. 1997, the index
  // algorithm) sends ceil(log2 p) messages of about p/2 blocks each instead of p - 1 blocks:
  // it wins while those messages are what one frame costs anyway, i.e. while half the
  // cluster's blocks fit one frame's payload (the MTU less our header and a cluster key's tag).
  // Measured with aapc-bench, 3 interleaved repetitions, medians of ms per exchange + barrier
  // (2026-11-23, eager blocks): 8-one-switch (fits up to 358 B) 8 B bruck 1.92, hypercube 1.90,
  // sync-shuffle 2.08; 256 B 1.99 / 1.97 / 2.13; 1 KiB 2.92 / 2.93 / 2.45; 2 KiB 4.08 / 4.07 /
  // 3.18. Bruck rather than the hypercube: within noise of it, and for any number of machines.
  constexpr std::uint64_t kFrameHeadroom = kFrameDataHeaderBytes + kFrameTagBytes;  // the DATA header and a key's tag
  const auto half = static_cast<std::uint64_t>((model.topology().machine_count() + 1) / 2);
  const std::uint64_t payload = topology.mtu() > static_cast<int>(kFrameHeadroom) ? static_cast<std::uint64_t>(topology.mtu()) - kFrameHeadroom : 0;
  if (one_size(block_bytes) && half * block_bytes <= payload)
    return {{Algorithm::kBruck, 4}, {SyncKind::kNone, 1}, "tiny blocks: Bruck's combining exchange, log2 p messages of half the cluster's blocks, each one frame"};
  constexpr std::uint64_t kBuffersAbsorbed = 3;
  const std::uint64_t buffer = smallest_switch_buffer(topology);  // 0: two machines cabled together
  const auto load = static_cast<std::uint64_t>(model.load());
  const bool absorbed = buffer > 0 && load > 0 && block_bytes <= (kBuffersAbsorbed * buffer - 1) / load &&  // block x load < 3 buffers, without overflow
                        (model.uniform_rates() || queues_hold(model, block_bytes, buffer));
  if (topology.single_switch()) return one_switch_choice(model, absorbed);
  if (absorbed)
    return {{Algorithm::kPairwiseEc, 4}, {SyncKind::kNone, 1}, "tree of switches, small blocks: pairwise exchange without tokens, switch queues absorb the contention"};
  return large_block_choice(model, block_bytes, measured);
}

Choice auto_choice(const Topology& topology, std::uint64_t block_bytes) { return auto_choice(TreeModel(topology), block_bytes); }

SpecText read_spec(std::string_view text) {
  if (text.find(kSpecSeparator) != std::string_view::npos) return split_spec(text);
  for (char old : {':', '/'})
    for (auto at = text.find(old); at != std::string_view::npos; at = text.find(old, at + 1))
      if (AlgorithmSpec::parse(text.substr(0, at)) || text.substr(0, at) == "auto")
        if (SyncSpec::parse(text.substr(at + 1)) || text.substr(at + 1) == "auto")
          return {std::string(text.substr(0, at)), std::string(text.substr(at + 1))};
  return {std::string(text), {}};
}

PlanSpec parse_plan_spec(std::string_view text) {
  const SpecText parts = read_spec(text);
  PlanSpec out;
  if (parts.algorithm != "auto") {
    out.algorithm = AlgorithmSpec::parse(parts.algorithm);
    if (!out.algorithm) throw std::invalid_argument("unknown schedule '" + parts.algorithm + "'");
  }
  if (!parts.sync.empty() && parts.sync != "auto") {
    out.sync = SyncSpec::parse(parts.sync);
    if (!out.sync) throw std::invalid_argument("unknown sync variant '" + parts.sync + "'");
  }
  return out;
}

std::string format_plan_spec(const AlgorithmSpec& algorithm, const SyncSpec& sync) { return join_spec(algorithm.name(), sync.name()); }

Choice choose(const TreeModel& model, std::string_view spec, std::uint64_t block_bytes, const Measured& measured) {
  // Parsed whole first: a sync variant that is not one is refused after every algorithm, auto too.
  const PlanSpec plan = parse_plan_spec(spec);
  if (!plan.algorithm) return auto_choice(model, block_bytes, measured);  // its own sync, whichever was given
  if (plan.sync) return {*plan.algorithm, *plan.sync, "given"};
  const SyncSpec sync = default_sync(plan.algorithm->algorithm);
  if (sync.kind == SyncKind::kNone) return {*plan.algorithm, sync, "given; no tokens by default"};
  return {*plan.algorithm, sync, "given; the " + std::string(algorithm_info(plan.algorithm->algorithm).name) + "'s default tokens"};
}

namespace {

// A radix of N or more gives the schedule of radix N (one stage); none is below 2.
int radix_within(int machines, int radix) { return std::max(2, std::min(radix, machines)); }

// ceil(log_radix machines): the stages of a dissemination barrier.
int barrier_stages(int machines, int radix) {
  int stages = 0;
  for (std::int64_t reach = 1; reach < machines; reach *= radix) ++stages;
  return stages;
}

}  // namespace

Schedule barrier_schedule(int machines, int radix) {
  // The dissemination barrier (Hensgen, Finkel and Manber 1988), k-ary as in Hoefler et al.'s
  // n-way dissemination: in stage s node i signals i + j*k^s (j = 1..k-1, while j*k^s < N) and
  // waits for i - j*k^s before stage s + 1; after ceil(log_k N) stages every node has heard,
  // transitively, from every other. Radix N is one stage of tokens from every node to every other.
  if (radix < 2) throw std::invalid_argument("barrier radix must be at least 2");
  radix = radix_within(machines, radix);
  Schedule s;
  // The radix is in the name, which the ranks compare at the start (aapc/wire/descriptor.hpp):
  // daemons started with different --barrier-radix fail at once, naming it, where they timed
  // out after 15 s "still waiting for rank 4: a token".
  s.algorithm = name_with_param(kBarrierName, radix);
  s.machines = machines;
  s.programs.resize(static_cast<std::size_t>(machines));
  const int stages = barrier_stages(machines, radix);
  for (int i = 0; i < machines; ++i) {
    s.programs[static_cast<std::size_t>(i)].rank = i;
    s.programs[static_cast<std::size_t>(i)].rounds.resize(static_cast<std::size_t>(stages + 1));
  }
  std::int64_t unit = 1;
  for (int st = 0; st < stages; ++st, unit *= radix) {
    for (int i = 0; i < machines; ++i) {
      for (std::int64_t j = 1; j < radix && j * unit < machines; ++j) {
        const int to = static_cast<int>((i + j * unit) % machines);
        Sync sync;
        sync.id = static_cast<std::uint32_t>(s.syncs.size());
        sync.from = i;
        sync.to = to;
        sync.trigger = SyncTrigger::kAfterSend;
        sync.from_round = st;
        sync.to_round = st + 1;
        s.programs[static_cast<std::size_t>(i)].rounds[static_cast<std::size_t>(st)].emits.push_back(sync.id);
        s.programs[static_cast<std::size_t>(to)].rounds[static_cast<std::size_t>(st + 1)].waits.push_back(sync.id);
        s.syncs.push_back(sync);
      }
    }
  }
  return s;
}

int barrier_radix(int machines, int wanted) {
  if (wanted > 0) return radix_within(machines, wanted);
  // A stage costs a one-way latency L (wire, switches, a wake-up) plus k - 1 tokens sent one
  // after the other, each c: ceil(log_k N) * (L + (k - 1) c), minimised over k. Measured on
  // 8-one-switch (aapc run --size 8, 1,000 barriers each, medians; 2026-11-23): radix 2 (3
  // stages, 3 tokens a node) 0.82 ms, radix 3 (2 stages) 0.89-0.91, radix 8 (one stage of 7)
  // 1.00. A token, with its acknowledgement, costs the emulated cluster's two cores about what
  // a hop costs (c = 0.12 ms, L = 0.15 ms fitted), so L = c.
  constexpr std::int64_t kLatencyInTokens = 1;
  int best = 2;
  std::int64_t best_cost = INT64_MAX;
  for (int k = 2; k <= std::max(2, machines); ++k) {
    const std::int64_t cost = barrier_stages(machines, k) * (kLatencyInTokens + k - 1);
    if (cost < best_cost) {
      best_cost = cost;
      best = k;
    }
  }
  return best;
}

}  // namespace aapc::sched

// The tree model of Faraj/Yuan section 3 and 4.1: per-link AAPC load, bottleneck links, the
// root, the subtrees of the root, and the peak aggregate throughput.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "aapc/sched/topology.hpp"

namespace aapc::sched {

struct Subtree {
  int attach = -1;             // the node of the subtree adjacent to the root
  std::vector<Rank> machines;  // m_{i,0}, m_{i,1}, ...: ascending rank
};

class TreeModel {
 public:
  explicit TreeModel(const Topology& topology);

  const Topology& topology() const { return *topology_; }
  int machines() const { return n_; }

  // Machines on the far side of `link` seen from `from_node`.
  int machines_beyond(int link, int from_node) const;
  // AAPC load of a link (both directions carry it): |Mu| x |Mv|.
  std::int64_t link_load(int link) const;
  // Load of the AAPC pattern: the load of a bottleneck edge. Equals the number of phases of a
  // contention-free schedule.
  std::int64_t load() const { return load_; }
  const std::vector<int>& bottleneck_links() const { return bottlenecks_; }

  // Root switch (section 4.1): on a bottleneck link, every subtree has at most |M|/2 machines.
  // -1 only for two machines cabled to each other.
  int root() const { return root_; }
  // Subtrees of the root that hold machines, |M0| >= |M1| >= ... (ties: lowest rank first).
  const std::vector<Subtree>& subtrees() const { return subtrees_; }
  int subtree_of(Rank r) const { return subtree_of_[static_cast<std::size_t>(r)]; }

  // Peak aggregate throughput |M|(|M|-1)B/(|Mu||Mv|), taking each link's own rate: the
  // minimum over links of |M|(|M|-1) rate / load. In bits per second.
  double peak_aggregate_bps() const { return peak_bps_; }
  // The link that sets the peak (a bottleneck when all rates are equal).
  int limiting_link() const { return limiting_link_; }
  // Best-case time of one exchange of `block_bytes` per pair, in seconds.
  double best_time_s(std::uint64_t block_bytes) const;
  // Whether every link runs at one rate (one_rate).
  bool uniform_rates() const { return uniform_rates_; }
  // The fraction of the limit that the tree's contention-free phases reach with hand-overs
  // that cost nothing (sender-based tokens): 1 where every link runs at one rate, as Faraj/
  // Yuan's load phases of one block time each make up the bottleneck's time. Where rates
  // differ, the phases count the blocks of the busiest link, not its time, and each block
  // crosses at its path's slowest rate: a tree whose uplinks are four times its hosts' links
  // needs the uplinks' load of phases at the hosts' rate. A prediction over the phases
  // (predict.cpp), made once on first use, where rates differ.
  double phase_efficiency() const;
  // The blocks that gather in the fullest switch queue when every machine sends its blocks to
  // all others one after another without tokens, each block at the slowest rate on its path
  // (the pairwise exchange, its rounds capped by cap_round_rates), all starting together. A
  // fluid estimate over each direction of each link: its blocks x (1 - its rate / the rate its
  // feeders bring them at), where a feeder is another link into the link's tail and brings its
  // senders' share of their time, at most its own rate. Switches add no delay; it scales with
  // the block. Made once on first use. Where a link is slower than the hosts that feed it
  // (25 Mbit/s between switches of 100-300 Mbit/s hosts), its queue fills faster than its
  // count of blocks shows.
  double unpaced_queue_blocks() const;

 private:
  double find_unpaced_queue() const;  // unpaced_queue_blocks, unmemoised

  // The constructor's steps, in order.
  void count_below();    // machines below each node of the depth-first walk
  void find_loads();     // loads, bottlenecks, peak throughput
  void find_root();      // section 4.1
  void find_subtrees();  // the root's subtrees that hold machines

  const Topology* topology_;
  int n_ = 0;
  std::vector<int> parent_link_;  // rooted at node 0
  std::vector<int> below_;        // machines in the subtree of each node (rooted at node 0)
  std::vector<int> child_of_link_;
  std::int64_t load_ = 0;
  std::vector<int> bottlenecks_;
  int root_ = -1;
  std::vector<Subtree> subtrees_;
  std::vector<int> subtree_of_;
  double peak_bps_ = 0;
  int limiting_link_ = -1;
  bool uniform_rates_ = true;
  struct Lazy {
    std::once_flag once, queue_once;
    double phase_efficiency = 1.0;
    double unpaced_queue_blocks = 0.0;
  };
  std::shared_ptr<Lazy> lazy_ = std::make_shared<Lazy>();  // copies share it: the same topology
};

}  // namespace aapc::sched

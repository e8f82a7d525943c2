#include "aapc/sched/tree.hpp"

#include <algorithm>
#include <limits>

namespace aapc::sched {

TreeModel::TreeModel(const Topology& topology) : topology_(&topology), n_(topology.machine_count()), uniform_rates_(one_rate(topology)) {
  count_below();
  find_loads();
  find_root();
  find_subtrees();
}

void TreeModel::count_below() {
  const Topology& topology = *topology_;
  const auto& nodes = topology_->nodes();
  const auto& links = topology_->links();
  std::size_t count = nodes.size();
  parent_link_.assign(count, -1);
  below_.assign(count, 0);
  child_of_link_.assign(links.size(), -1);
  // Machines below each node, counted in post-order of the topology's depth-first walk.
  const std::vector<int>& order = topology.walk_order();
  for (int v : order) {
    const int l = topology.parent_link(v);
    parent_link_[static_cast<std::size_t>(v)] = l;
    if (l >= 0) child_of_link_[static_cast<std::size_t>(l)] = v;
  }
  for (auto it = order.rbegin(); it != order.rend(); ++it) {
    int u = *it;
    if (nodes[static_cast<std::size_t>(u)].kind == NodeKind::kMachine) below_[static_cast<std::size_t>(u)] += 1;
    int l = parent_link_[static_cast<std::size_t>(u)];
    if (l >= 0) below_[static_cast<std::size_t>(links[static_cast<std::size_t>(l)].other(u))] += below_[static_cast<std::size_t>(u)];
  }
}

void TreeModel::find_loads() {
  const auto& links = topology_->links();
  double pairs = static_cast<double>(n_) * static_cast<double>(n_ - 1);
  peak_bps_ = std::numeric_limits<double>::infinity();
  for (std::size_t l = 0; l < links.size(); ++l) {
    std::int64_t load = link_load(static_cast<int>(l));
    if (load > load_) {
      load_ = load;
      bottlenecks_.clear();
    }
    if (load == load_ && load > 0) bottlenecks_.push_back(static_cast<int>(l));
    if (load > 0) {
      double peak = pairs * static_cast<double>(links[l].rate_bps) / static_cast<double>(load);
      if (peak < peak_bps_) {
        peak_bps_ = peak;
        limiting_link_ = static_cast<int>(l);
      }
    }
  }
}

void TreeModel::find_root() {
  const Topology& topology = *topology_;
  const auto& nodes = topology_->nodes();
  const auto& links = topology_->links();
  // Root (section 4.1): start on a bottleneck link (u,v) with |Mu| >= |Mv| and walk towards
  // the machines while u has a single branch holding machines.
  if (n_ == 2) {
    for (int e : topology.path_between(0, 1)) {
      int node = topology.edge_to(e);
      if (nodes[static_cast<std::size_t>(node)].kind == NodeKind::kSwitch) {
        root_ = node;
        break;
      }
    }
  } else {
    int l = bottlenecks_.front();
    int u = links[static_cast<std::size_t>(l)].a;
    int v = links[static_cast<std::size_t>(l)].b;
    if (machines_beyond(l, v) < machines_beyond(l, u)) std::swap(u, v);  // |Mu| >= |Mv|
    for (;;) {
      int branches = 0;
      int next_link = -1;
      for (int b : nodes[static_cast<std::size_t>(u)].links) {
        if (b == l || machines_beyond(b, u) == 0) continue;
        ++branches;
        next_link = b;
      }
      if (branches != 1) break;
      l = next_link;
      v = u;
      u = links[static_cast<std::size_t>(l)].other(u);
    }
    root_ = u;
  }
}

void TreeModel::find_subtrees() {
  const Topology& topology = *topology_;
  const auto& nodes = topology_->nodes();
  const auto& links = topology_->links();
  subtree_of_.assign(static_cast<std::size_t>(n_), -1);
  if (root_ >= 0) {
    for (int l : nodes[static_cast<std::size_t>(root_)].links) {
      if (machines_beyond(l, root_) == 0) continue;
      Subtree st;
      st.attach = links[static_cast<std::size_t>(l)].other(root_);
      // Collect machines beyond the link.
      std::vector<int> todo{st.attach};
      std::vector<int> from{root_};
      while (!todo.empty()) {
        int x = todo.back(), p = from.back();
        todo.pop_back();
        from.pop_back();
        if (nodes[static_cast<std::size_t>(x)].kind == NodeKind::kMachine) st.machines.push_back(nodes[static_cast<std::size_t>(x)].rank);
        for (int b : nodes[static_cast<std::size_t>(x)].links) {
          int y = links[static_cast<std::size_t>(b)].other(x);
          if (y == p) continue;
          todo.push_back(y);
          from.push_back(x);
        }
      }
      std::sort(st.machines.begin(), st.machines.end());
      subtrees_.push_back(std::move(st));
    }
  } else {
    // Two machines on one cable: each is its own subtree.
    subtrees_.push_back({topology.machine_node(0), {0}});
    subtrees_.push_back({topology.machine_node(1), {1}});
  }
  std::stable_sort(subtrees_.begin(), subtrees_.end(), [](const Subtree& a, const Subtree& b) {
    if (a.machines.size() != b.machines.size()) return a.machines.size() > b.machines.size();
    return a.machines.front() < b.machines.front();
  });
  for (std::size_t i = 0; i < subtrees_.size(); ++i)
    for (Rank r : subtrees_[i].machines) subtree_of_[static_cast<std::size_t>(r)] = static_cast<int>(i);
}

int TreeModel::machines_beyond(int link, int from_node) const {
  int child = child_of_link_[static_cast<std::size_t>(link)];
  int below = below_[static_cast<std::size_t>(child)];
  return from_node == child ? n_ - below : below;
}

std::int64_t TreeModel::link_load(int link) const {
  std::int64_t a = machines_beyond(link, child_of_link_[static_cast<std::size_t>(link)]);
  return a * (n_ - a);
}

double TreeModel::unpaced_queue_blocks() const {
  std::call_once(lazy_->queue_once, [this] { lazy_->unpaced_queue_blocks = find_unpaced_queue(); });
  return lazy_->unpaced_queue_blocks;
}

double TreeModel::find_unpaced_queue() const {
  const Topology& topology = *topology_;
  const auto& nodes = topology.nodes();
  const auto& links = topology.links();
  const auto rate = [&](int l) { return static_cast<double>(links[static_cast<std::size_t>(l)].rate_bps); };
  // Each machine's send rate in bits per second of block, over all its blocks: one block to each
  // other machine at its path's slowest rate, so a machine behind slow links spreads the same
  // blocks over a longer time.
  std::vector<double> pace_below(nodes.size(), 0.0);  // summed over the machines below each node
  for (Rank s = 0; s < n_; ++s) {
    const std::vector<std::uint64_t> slowest = topology.slowest_from(s);
    double seconds = 0;  // per bit of a block, to every other machine
    for (Rank d = 0; d < n_; ++d)
      if (d != s && slowest[static_cast<std::size_t>(d)] > 0) seconds += 1.0 / static_cast<double>(slowest[static_cast<std::size_t>(d)]);
    pace_below[static_cast<std::size_t>(topology.machine_node(s))] = seconds > 0 ? 1.0 / seconds : 0.0;
  }
  const std::vector<int>& order = topology.walk_order();
  for (auto it = order.rbegin(); it != order.rend(); ++it)
    if (const int l = parent_link_[static_cast<std::size_t>(*it)]; l >= 0)
      pace_below[static_cast<std::size_t>(links[static_cast<std::size_t>(l)].other(*it))] += pace_below[static_cast<std::size_t>(*it)];
  const double pace_all = order.empty() ? 0.0 : pace_below[static_cast<std::size_t>(order.front())];
  // The senders behind link f, seen from its end u: u's subtree's complement, or f's child's.
  const auto pace_behind = [&](int f, int u) {
    const int w = links[static_cast<std::size_t>(f)].other(u);
    return f == parent_link_[static_cast<std::size_t>(u)] ? pace_all - pace_below[static_cast<std::size_t>(u)] : pace_below[static_cast<std::size_t>(w)];
  };
  double most = 0;
  for (std::size_t l = 0; l < links.size(); ++l) {
    for (const int tail : {links[l].a, links[l].b}) {
      if (nodes[static_cast<std::size_t>(tail)].kind == NodeKind::kMachine) continue;  // a sender's own link: it sends at most at its rate
      const double ahead = machines_beyond(static_cast<int>(l), tail);  // every sender behind the tail sends a block to each
      double arriving = 0;
      for (int f : nodes[static_cast<std::size_t>(tail)].links)
        if (f != static_cast<int>(l)) arriving += std::min(rate(f), ahead * pace_behind(f, tail));
      if (arriving <= rate(static_cast<int>(l))) continue;
      most = std::max(most, static_cast<double>(link_load(static_cast<int>(l))) * (1.0 - rate(static_cast<int>(l)) / arriving));
    }
  }
  return most;
}

double TreeModel::best_time_s(std::uint64_t block_bytes) const {
  double bits = static_cast<double>(n_) * static_cast<double>(n_ - 1) * static_cast<double>(block_bytes) * 8.0;
  return bits / peak_bps_;
}

}  // namespace aapc::sched

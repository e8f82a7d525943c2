// Groups: GROUP_QUERY, GROUP_OPEN and GROUP_CLOSE. A group is some machines of the
// cluster whose collectives have ids of their own: a slot, and a sequence in it (serial.hpp).
// Its members' clients agree on both before they open it (Client::open_group: a slot free on
// every member, as MPICH agrees on context ids with an allreduce of free masks, and the largest
// first sequence any member may use). Each member's daemon then runs the group's collectives
// for the client that opened it, over the tree that joins the members.
#include <spdlog/spdlog.h>

#include <algorithm>

#include "daemon_impl.hpp"

namespace aapc::engine {

void Daemon::Impl::serve(ClientState& c, std::uint32_t request, const proto::GroupQueryRequest&) {
  proto::GroupQueryReply m;
  m.free.assign(kSlots / 64, 0);
  for (std::uint32_t s = kWorldSlot + 1; s < kSlots; ++s)
    if (groups.count(s) == 0) m.free[s / 64] |= 1ULL << (s % 64);
  m.next = slot_next;
  proto::send_message(c.fd, proto::message(m, request));
}

void Daemon::Impl::serve(ClientState& c, std::uint32_t request, const proto::GroupOpenRequest& m) {
  if (auto opened = open_group(c, m); !opened) return reply_error(c.fd, request, opened.error());
  proto::send_message(c.fd, proto::message(proto::EmptyReply{proto::Type::kOk}, request));
}

void Daemon::Impl::serve(ClientState& c, std::uint32_t request, const proto::GroupCloseRequest& m) {
  auto it = groups.find(m.slot);
  if (it == groups.end() || it->second.client != c.fd)
    return reply_error(c.fd, request, Errc::kInvalidArgument, "group slot " + std::to_string(m.slot) + " is not open by this client");
  close_group(m.slot, m.tell ? "the client of rank " + std::to_string(rank) + " closed group slot " + std::to_string(m.slot) : "");
  proto::send_message(c.fd, proto::message(proto::EmptyReply{proto::Type::kOk}, request));
}

// Why `m` cannot open here, if it cannot. Busy when the slot was taken, or used, here since
// GROUP_QUERY (another client's group): the members try again with another query.
Result<void> Daemon::Impl::open_group(const ClientState& c, const proto::GroupOpenRequest& m) {
  const std::string what = "group slot " + std::to_string(m.slot) + ": ";
  auto invalid = [&](const std::string& why) { return Error(Errc::kInvalidArgument, what + why); };
  if (m.slot == kWorldSlot) return invalid("slot 0 is the whole cluster's; groups take slots 1 to " + std::to_string(kSlots - 1));
  if (auto it = groups.find(m.slot); it != groups.end())
    return Error(Errc::kBusy, what + "already open here (by client pid " +
                                  std::to_string(clients.count(it->second.client) != 0 ? clients.at(it->second.client).pid : 0) +
                                  "); agree on a slot that GROUP_QUERY reports free on every member");
  const auto owned = static_cast<std::size_t>(std::count_if(groups.begin(), groups.end(), [&](const auto& g) { return g.second.client == c.fd; }));
  if (owned >= kMaxGroupsPerClient) return invalid("this client has " + std::to_string(owned) + " groups open, the most one may; close some first");
  if (m.first > kSeqMask) return invalid("the first sequence " + std::to_string(m.first) + " does not fit in 24 bits");
  if (!later_id(make_id(m.slot, m.first), make_id(m.slot, slot_next[m.slot] - 1)))
    return Error(Errc::kBusy, what + "the first sequence " + std::to_string(m.first) + " comes before " + std::to_string(slot_next[m.slot]) +
                                  ", which this node uses next in the slot: take the largest of the members' (GROUP_QUERY)");
  Group g;
  g.client = c.fd;
  for (std::uint32_t r : m.members) {
    if (r == static_cast<std::uint32_t>(rank)) g.me = static_cast<Rank>(g.members.size());
    g.members.push_back(static_cast<Rank>(std::min<std::uint32_t>(r, kMaxRanks)));
  }
  if (g.me < 0) return invalid("the members do not include this machine (rank " + std::to_string(rank) + ")");
  try {
    g.schedules = std::make_unique<TreeSchedules>(sched::sub_topology(topo, g.members), cfg.barrier_radix, cfg.max_plans);
  } catch (const sched::TopologyError& e) {
    return invalid(e.what());
  }
  g.next_id = make_id(m.slot, m.first);
  engine->reopen_slot(m.slot, g.next_id);
  spdlog::info("client pid {} opened group slot {} of {} machines (our rank {} in it), from id {}", c.pid, m.slot, g.members.size(), g.me, g.next_id);
  groups.emplace(m.slot, std::move(g));
  return {};
}

void Daemon::Impl::close_group(std::uint32_t slot, const std::string& why) {
  auto it = groups.find(slot);
  if (it == groups.end()) return;
  // A peer may wait in the collective this node would have started next: it fails at once.
  // Its id is used up, so a group opened later in the slot starts after it.
  if (!why.empty()) {
    const std::uint32_t next = take_id(slot);
    engine->abort_unstarted(next, why, it->second.members, true);  // our members' group can never go on without us
    engine->close_slot(slot, next, why, it->second.members);  // and its later ones, until a group opens in the slot
  }
  // Its collectives that waited for an alltoallv's agreement never start (not answered yet).
  for (auto w = waiting_counts.begin(); w != waiting_counts.end();) {
    if (w->slot != slot) {
      ++w;
      continue;
    }
    reply_error(w->client, w->request, Errc::kAborted, "group slot " + std::to_string(slot) + " closed before this collective started");
    w = waiting_counts.erase(w);
  }
  spdlog::info("group slot {} closed", slot);
  groups.erase(it);
}

Result<void> Daemon::Impl::group_held_by(const ClientState& c, std::uint32_t slot) const {
  auto it = groups.find(slot);
  if (it == groups.end())
    return Error(Errc::kInvalidArgument, "group slot " + std::to_string(slot) + " is not open here; open the group first (Client::open_group)");
  if (it->second.client != c.fd) return Error(Errc::kInvalidArgument, "group slot " + std::to_string(slot) + " is another client's");
  return {};
}

}  // namespace aapc::engine

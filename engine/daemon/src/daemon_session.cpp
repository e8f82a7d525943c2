// START: the blocks checked in the client's buffers, the schedule chosen (sched::choose) and
// cached, and the session's join: the first exchange of a session waits until the cluster
// agreed on exchange ids.
#include <spdlog/spdlog.h>

#include "aapc/sched/choice.hpp"
#include "aapc/sched/sync.hpp"
#include "daemon_impl.hpp"

namespace aapc::engine {

namespace {

// What a START got wrong, in the words its client reads.
Error invalid(std::string why) { return Error(Errc::kInvalidArgument, std::move(why)); }

}  // namespace

// This node's part of the plan (sched::plan_part): the tokens are chosen over the whole
// tree, but only this node's program and tokens are kept.
std::shared_ptr<const sched::Schedule> TreeSchedules::schedule(const sched::AlgorithmSpec& algo, const sched::SyncSpec& sync, sched::Rank me) {
  std::string key = sched::format_plan_spec(algo, sync);
  auto it = cached.find(key);
  if (it != cached.end()) {
    it->second.used = ++uses;
    return it->second.schedule;
  }
  if (cached.size() >= std::max<std::size_t>(max_plans, 1)) {
    auto oldest = std::min_element(cached.begin(), cached.end(), [](const auto& a, const auto& b) { return a.second.used < b.second.used; });
    cached.erase(oldest);
  }
  auto s = std::make_shared<const sched::Schedule>(sched::plan_part(topo, algo, sync, me));
  cached[key] = {s, ++uses};
  return s;
}

std::shared_ptr<const sched::Schedule> TreeSchedules::barrier() {
  if (!barrier_schedule) {
    const int n = topo.machine_count();
    barrier_schedule = std::make_shared<const sched::Schedule>(sched::barrier_schedule(n, sched::barrier_radix(n, barrier_radix)));
  }
  return barrier_schedule;
}

// A request is checked at once; the first exchange of a session then waits until the
// cluster agreed on exchange ids.
void Daemon::Impl::start_or_join(ClientState& c, std::uint32_t request, const proto::StartRequest& m) {
  if (m.group != kWorldSlot) {
    // A group's collectives are its clients' alone, numbered from the id they agreed on.
    if (auto held = group_held_by(c, m.group); !held) return reply_error(c.fd, request, held.error());
    if (auto quota = start_quota(c, m); !quota) return reply_error(c.fd, request, quota.error());
    auto p = prepare(c, request, m);
    if (!p) return reply_error(c.fd, request, p.error());
    return launch(std::move(*p));
  }
  if (auto free = rank_free_for(c); !free) return reply_error(c.fd, request, free.error());
  if (auto quota = start_quota(c, m); !quota) return reply_error(c.fd, request, quota.error());
  auto p = prepare(c, request, m);
  if (!p) return reply_error(c.fd, request, p.error());
  claim_rank(c);
  // Part of the session from its first collective, started or refused: when it goes, this
  // node's part of the session ends (drop_client), and the next client joins anew.
  c.started = true;
  if (!joined) {
    // A rank whose client exited before its first collective must not
    // hang the others in the join; they wait as long as for the exchange itself.
    const ExchangeSpec spec = spec_of(*p, 0);
    if (!engine->joining())
      engine->start_join(next_id, p->timeout_ms != 0 ? spec.timeout : engine->default_timeout(spec), {holder.uid, job_tag(holder.job)}, join_measure());
    waiting_join.push_back(std::move(*p));
    return;
  }
  launch(std::move(*p));
}

void Daemon::Impl::joins() {
  auto result = engine->join_result();
  if (!result) return;
  auto waiting = std::move(waiting_join);
  waiting_join.clear();
  if (!*result) {
    for (const auto& p : waiting)
      if (clients.count(p.client) != 0) reply_error(p.client, p.request, result->error().code(), result->error().message());
    return;
  }
  next_id = result->value();
  joined = true;
  spdlog::info("session agreed: exchanges from id {}", next_id);
  take_agreed(engine->agreed_measure());
  weighed_choices = 0;
  for (auto& p : waiting) {
    if (clients.count(p.client) == 0) continue;
    // Chosen again with what the join agreed, as every rank does: a START that came before it
    // chose with the last session's.
    if (auto picked = p.kind == Collective::kBarrier ? Result<void>{} : choose_schedule(p); !picked) {
      reply_error(p.client, p.request, picked.error());
      continue;
    }
    launch(std::move(p));
  }
}

// The engine's spec of a prepared START. Its descriptor says what the ranks must agree on;
// with no timeout, the engine derives one from the bytes over the topology's bottleneck.
ExchangeSpec Daemon::Impl::slot_spec(std::uint32_t slot, const sched::Schedule& schedule, std::uint32_t id) const {
  if (slot == kWorldSlot) return exchange_spec(schedule, rank, id);
  const Group& g = groups.at(slot);
  return exchange_spec(schedule, g.me, id, g.members, static_cast<std::size_t>(topo.machine_count()));
}

std::size_t Daemon::Impl::cluster_rank(std::uint32_t slot, std::size_t r) const {
  return slot == kWorldSlot ? r : static_cast<std::size_t>(groups.at(slot).members.at(r));
}

ExchangeSpec Daemon::Impl::spec_of(const Prepared& p, std::uint32_t id) const {
  ExchangeSpec spec = slot_spec(p.slot, *p.schedule, id);
  for (std::size_t i = 0; i < p.send.size(); ++i) {  // by group rank: the cluster rank is the member's
    const std::size_t r = cluster_rank(p.slot, i);
    spec.send[r] = p.send[i];
    spec.recv[r] = p.recv[i];
  }
  spec.timeout = std::chrono::milliseconds(p.timeout_ms);
  spec.token_slack = token_slack(slack_buffer, p.schedule->phases.size(), pace_bps);
  if (p.schedule->block_rate_bps > 0)
    spec.paced_burst_bytes = paced_burst(slack_buffer, static_cast<std::size_t>(p.schedule->machines - 1),
                                         static_cast<std::uint64_t>(schedules_of(p.slot).model.load()), static_cast<std::uint64_t>(topo.mtu()) + kEthHeaderLen);
  spec.descriptor.kind = p.kind;
  spec.descriptor.block = p.block;
  spec.combine_block = p.block;  // a combining schedule's blocks (alltoall only, choose_schedule())
  spec.bottleneck_load = std::max<std::uint64_t>(spec.bottleneck_load, static_cast<std::uint64_t>(schedules_of(p.slot).model.load()));
  return spec;
}

std::uint32_t Daemon::Impl::take_id(std::uint32_t slot) {
  std::uint32_t& next = slot == kWorldSlot ? next_id : groups.at(slot).next_id;
  const std::uint32_t id = next;
  next = next_id_of(next);  // a collective's id is used up, started or not
  slot_next[slot] = id_seq(next);
  return id;
}

void Daemon::Impl::launch(Prepared p) {
  // A slot's ids must grow at the engine: its collectives wait while an alltoallv of the slot
  // agrees on its pattern. Other slots' ids are their own.
  if (agreeing(p.slot)) return waiting_counts.push_back(std::move(p));
  if (p.counts_first) return launch_counted(std::move(p));
  ClientState& c = clients[p.client];
  const std::uint32_t id = take_id(p.slot);
  auto started = engine->start(spec_of(p, id));
  if (!started) {
    // The id is used up here; the peers that started it must not wait for us to its deadline.
    const std::string why = "rank " + std::to_string(rank) + " could not start it: " + started.error().message();
    engine->abort_unstarted(id, why, p.slot == kWorldSlot ? std::vector<Rank>{} : groups.at(p.slot).members);
    return reply_error(c.fd, p.request, started.error().code(), started.error().message());
  }
  p.rec.cpu_ns = cpu_now();
  exchanges[id] = std::move(p.rec);
  c.exchanges.insert(id);
  if (p.run) {
    exchanges[id].waiters.push_back(p.request);  // DONE goes when it finished (collect_finished)
  } else {
    proto::send_message(c.fd, proto::message(proto::StartedReply{id, exchanges[id].schedule, exchanges[id].sync}, p.request));
  }
}

Result<Prepared> Daemon::Impl::prepare(const ClientState& c, std::uint32_t request, const proto::StartRequest& m) {
  Prepared p;
  p.client = c.fd;
  p.request = request;
  p.timeout_ms = m.timeout_ms;
  p.run = m.run;
  p.kind = m.kind == proto::Kind::kBarrier ? Collective::kBarrier : m.kind == proto::Kind::kAlltoall ? Collective::kAlltoall : Collective::kAlltoallv;
  if (m.kind == proto::Kind::kAlltoall) p.block = m.block;
  p.spec = m.spec;
  p.rec.client = c.fd;
  p.slot = m.group;
  TreeSchedules& tree = schedules_of(p.slot);
  if (m.kind == proto::Kind::kBarrier) {
    p.schedule = tree.barrier();
    p.rec.schedule = "barrier";
    p.rec.sync = "tokens";
  } else if (auto placed = place_blocks(c, m, static_cast<std::size_t>(tree.topo.machine_count()), p); !placed) {
    return placed.error();
  } else if (auto chosen = choose_schedule(p); !chosen) {
    return chosen.error();
  }
  return p;
}

// The blocks of `m` in the client's buffers, checked like wire fields; why not, if not.
Result<void> Daemon::Impl::place_blocks(const ClientState& c, const proto::StartRequest& m, std::size_t n, Prepared& p) const {
  if (m.kind == proto::Kind::kAlltoallv && m.sends.size() != n)
    return invalid("the request has " + std::to_string(m.sends.size()) + " blocks; the " + (m.group == kWorldSlot ? "cluster" : "group") + " has " +
           std::to_string(n) + " ranks");
  auto sb = c.buffers.find(m.send_buffer), rb = c.buffers.find(m.recv_buffer);
  if (sb == c.buffers.end() || rb == c.buffers.end()) return invalid("START names a buffer this client has not registered");
  const Mapping& sm = sb->second;
  const Mapping& rm = rb->second;
  for (std::size_t i = 0; i < n; ++i) {
    const proto::Block s = m.send_block(i), r = m.recv_block(i);
    if (!proto::fits(s, sm.size))
      return invalid("send block " + std::to_string(i) + " (offset " + std::to_string(s.offset) + ", " + std::to_string(s.length) +
                     " bytes) runs past the end of the " + std::to_string(sm.size) + "-byte send buffer");
    if (!proto::fits(r, rm.size))
      return invalid("receive block " + std::to_string(i) + " (offset " + std::to_string(r.offset) + ", " + std::to_string(r.length) +
                     " bytes) runs past the end of the " + std::to_string(rm.size) + "-byte receive buffer");
    p.send.push_back({sm.data + s.offset, s.length, sm.region.get()});
    p.recv.push_back({rm.data + r.offset, r.length});
  }
  if (auto apart = blocks_apart(m, n, sm, rm); !apart) return apart;
  p.rec.buffers = {m.send_buffer, m.recv_buffer};
  return {};
}

// Sends and receives that share bytes: the engine would overwrite what it has yet to send,
// and report success. (MPI forbids it too, short of MPI_IN_PLACE.) Buffers of one memory
// file are one memory, wherever the client mapped them.
Result<void> Daemon::Impl::blocks_apart(const proto::StartRequest& m, std::size_t n, const Mapping& send, const Mapping& recv) {
  if (!send.same_memory(recv)) return {};
  std::vector<proto::Range> sends(n), recvs(n);
  for (std::size_t i = 0; i < n; ++i) {
    const proto::Block s = m.send_block(i), r = m.recv_block(i);
    sends[i] = {s.offset, s.offset + s.length, i};
    recvs[i] = {r.offset, r.offset + r.length, i};
  }
  auto o = proto::find_overlap(sends, recvs);
  if (!o) return {};
  return invalid("send block " + std::to_string(o->send.block) + " (bytes " + std::to_string(o->send.begin) + ".." + std::to_string(o->send.end) +
                 ") and receive block " + std::to_string(o->recv.block) + " (bytes " + std::to_string(o->recv.begin) + ".." +
                 std::to_string(o->recv.end) + ") are the same memory" + (m.send_buffer == m.recv_buffer ? "" : " (both buffers map one memory file)") +
                 ": a collective's send and receive blocks may not overlap; use separate buffers");
}

// The schedule of `p.spec`. Every rank must pick the same one: an alltoall's block size is
// the same on all of them (the collective's contract), an alltoallv's largest block is not,
// so it gets the choice for large blocks. The cluster's collectives choose with what its ranks
// measured, as the session's join agreed (daemon_measure.cpp), so a START that came before the
// join is chosen again once it agreed; a group's, which agree on nothing of the kind, with the
// model alone.
Result<void> Daemon::Impl::choose_schedule(Prepared& p) {
  sched::Choice choice;
  try {
    const std::string algorithm = sched::read_spec(p.spec).algorithm;
    const bool sparse = sched::forced_sparse_algorithm(algorithm).has_value();
    if (sparse && p.kind != Collective::kAlltoallv) return invalid("schedule '" + algorithm + "' decomposes an alltoallv's pattern; an alltoall is dense");
    if (const auto given = sched::read_spec(p.spec).sync; sparse && !given.empty()) (void)sched::parse_plan_spec("auto+" + given);  // throws
    TreeSchedules& tree = schedules_of(p.slot);
    choice = measured_choice(tree, p, sparse ? "auto" : p.spec);
    p.schedule = tree.schedule(choice.algorithm, choice.sync, rank_in(p.slot));
    if (p.kind == Collective::kAlltoallv && counts_first(p.spec, tree.topo)) {
      p.counts_first = true;  // the schedule above only sizes the join's deadline
      p.rec.schedule = "alltoallv: agreeing on counts";
      return {};
    }
  } catch (const std::exception& e) {
    return invalid(e.what());
  }
  if (p.schedule->combining() && p.kind != Collective::kAlltoall)
    return invalid("schedule " + p.schedule->algorithm + " combines blocks into one message per step and forwards them through other ranks, which needs " +
                   "blocks of one size on every rank: it runs alltoall, not alltoallv");
  p.rec.schedule = p.schedule->algorithm;
  p.rec.sync = p.schedule->sync.name();
  note_measured(choice, p);
  return {};
}

}  // namespace aapc::engine

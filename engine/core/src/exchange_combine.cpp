// Combining exchanges (Bruck's index algorithm, Sur/Jin/Panda's hypercube; schedules/
// combine.cpp): at each step one message to one partner gathers the blocks that cross that
// step's dimension, ours and those that earlier steps brought, which this node forwards. The
// exchange keeps each step's message out and in in its own staging memory (Sur/Jin/Panda 5.3
// copy into pre-registered buffers rather than a rendezvous per block: for tiny blocks the
// copies cost less than the messages they save).
#include <cstring>
#include <unordered_set>

#include "exchange.hpp"

namespace aapc::engine {
namespace {

std::uint64_t key(const sched::CombinePiece& piece, std::size_t n) {
  return static_cast<std::uint64_t>(piece.origin) * n + static_cast<std::uint64_t>(piece.dest);
}

// The steps in bounds: distinct partners, a round per step sending its message, and every
// piece sent held by this rank at that step (its own, or received at an earlier one).
Result<void> check_steps(const ExchangeSpec& spec, Rank me) {
  const std::size_t n = spec.send.size();
  auto rank_ok = [&](Rank r) { return r >= 0 && static_cast<std::size_t>(r) < n; };
  std::vector<bool> to_seen(n, false), from_seen(n, false);
  std::unordered_set<std::uint64_t> held;
  for (Rank d = 0; rank_ok(d); ++d)
    if (d != me) held.insert(key({me, d}, n));
  for (std::size_t k = 0; k < spec.combine.size(); ++k) {
    const sched::CombineStep& step = spec.combine[k];
    const std::string where = "step " + std::to_string(k) + " of the combining schedule";
    if (!rank_ok(step.to) || !rank_ok(step.from) || step.to == me || step.from == me || to_seen[static_cast<std::size_t>(step.to)] ||
        from_seen[static_cast<std::size_t>(step.from)])
      return invalid_spec(spec, where + " needs partners that are other ranks, each once");
    to_seen[static_cast<std::size_t>(step.to)] = from_seen[static_cast<std::size_t>(step.from)] = true;
    const auto& sends = spec.program.rounds[k].sends;
    if (sends.size() != 1 || sends.front().dst != step.to)
      return invalid_spec(spec, where + ": its round does not send the step's message alone");
    for (const auto& piece : step.send)
      if (held.erase(key(piece, n)) == 0) return invalid_spec(spec, where + " sends a block this rank does not hold then");
    for (const auto& piece : step.recv) {
      if (!rank_ok(piece.origin) || !rank_ok(piece.dest) || piece.origin == piece.dest)
        return invalid_spec(spec, where + " receives a piece that is no block");
      if (piece.dest != me) held.insert(key(piece, n));
    }
  }
  return {};
}

}  // namespace

Result<void> check_combine(const ExchangeSpec& spec, Rank me) {
  if (spec.combine.empty()) return {};
  if (spec.combine.size() != spec.program.rounds.size())
    return invalid_spec(spec, "a combining schedule needs one round per step (" + std::to_string(spec.combine.size()) + " steps, " +
                                  std::to_string(spec.program.rounds.size()) + " rounds)");
  // The ranks the steps name: all of them, or a group's, whose exchange leaves the
  // other ranks of the cluster out.
  std::vector<bool> named(spec.send.size(), false);
  for (const auto& step : spec.combine)
    for (const auto* pieces : {&step.send, &step.recv})
      for (const auto& piece : *pieces)
        for (Rank r : {piece.origin, piece.dest})
          if (r >= 0 && static_cast<std::size_t>(r) < named.size()) named[static_cast<std::size_t>(r)] = true;
  for (std::size_t r = 0; r < spec.send.size(); ++r) {
    if (static_cast<Rank>(r) == me) continue;
    if (!named[r] && spec.send[r].len == 0 && spec.recv[r].len == 0) continue;
    if (spec.send[r].len != spec.combine_block || spec.recv[r].len != spec.combine_block)
      return invalid_spec(spec, "a combining schedule (" + spec.descriptor.plan +
                                    ") forwards blocks through other ranks and needs every block to be " +
                                    std::to_string(spec.combine_block) + " bytes; block " + std::to_string(r) + " sends " +
                                    std::to_string(spec.send[r].len) + " and receives " + std::to_string(spec.recv[r].len));
  }
  return check_steps(spec, me);
}

void Exchange::stage_combine() {
  const auto& steps = spec_.combine;
  const std::uint64_t block = spec_.combine_block;
  const Rank me = link_.rank();
  Staging& st = staging_.emplace();
  st.recv = spec_.recv;
  st.step_from.assign(n_, -1);
  for (const auto& step : steps) {
    st.out.emplace_back(step.send.size() * block);
    st.in.emplace_back(step.recv.size() * block);
  }
  // Where each block is when a step packs it: our own in the caller's send buffer, the others
  // in the slot of the message that brought them.
  std::unordered_map<std::uint64_t, const std::uint8_t*> at;
  for (std::size_t k = 0; k < steps.size(); ++k) {
    auto& from = st.from.emplace_back();
    for (const auto& piece : steps[k].send)
      from.push_back(piece.origin == me ? spec_.send[idx(piece.dest)].data : at.at(key(piece, n_)));
    for (std::size_t j = 0; j < steps[k].recv.size(); ++j) at[key(steps[k].recv[j], n_)] = st.in[k].data() + j * block;
    st.step_from[idx(steps[k].from)] = static_cast<int>(k);
  }
  // The rest of the exchange sees one block per partner: the step's message.
  std::vector<SendBlock> send(n_);
  std::vector<RecvBlock> recv(n_);
  send[idx(me)] = spec_.send[idx(me)];
  recv[idx(me)] = spec_.recv[idx(me)];
  for (std::size_t k = 0; k < steps.size(); ++k) {
    send[idx(steps[k].to)] = {st.out[k].data(), st.out[k].size(), nullptr};
    recv[idx(steps[k].from)] = {st.in[k].data(), st.in[k].size()};
  }
  spec_.send = std::move(send);
  spec_.recv = std::move(recv);
}

void Exchange::pack_step(std::size_t step) {
  if (step >= staging_->out.size()) return;
  const std::uint64_t block = spec_.combine_block;
  if (block == 0) return;
  std::uint8_t* out = staging_->out[step].data();
  const auto& from = staging_->from[step];
  for (std::size_t j = 0; j < from.size(); ++j) std::memcpy(out + j * block, from[j], block);
}

void Exchange::unpack_from(Rank src) {
  const int step = staging_->step_from[idx(src)];
  const std::uint64_t block = spec_.combine_block;
  if (step < 0 || block == 0) return;
  const std::uint8_t* in = staging_->in[static_cast<std::size_t>(step)].data();
  const auto& recv = spec_.combine[static_cast<std::size_t>(step)].recv;
  for (std::size_t j = 0; j < recv.size(); ++j)
    if (recv[j].dest == link_.rank()) std::memcpy(staging_->recv[idx(recv[j].origin)].data, in + j * block, block);
}

}  // namespace aapc::engine

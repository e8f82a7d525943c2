// The ranks agree on what the exchange is (descriptor.hpp). READY and
// SYNC carry the sender's descriptor, their ACKs the receiver's; a READY also says which block
// it expects. A mismatch fails the exchange at once on both sides, naming the peer and the
// difference, instead of after the polls run out (18.7 s) or never (barrier vs alltoall).
#include "exchange.hpp"

#include <utility>

namespace aapc::engine {

void Exchange::ack(Rank dst, FrameType type, std::uint32_t seq) {
  link_.send_control(dst, FrameType::kAck, spec_.id, seq, static_cast<std::uint32_t>(type), 0, descriptor_.data(), descriptor_.size());
}

bool Exchange::agrees(Rank src, std::span<const std::uint8_t> theirs, FrameType type, Clock::time_point now) {
  if (!running() || theirs.empty() || same_descriptor(theirs, descriptor_)) return true;
  const auto d = decode_descriptor(theirs);
  if (!d) {  // parse() lets only whole descriptors through
    count_drop(DropReason::kBadLength);
    return false;
  }
  tell_descriptor(type == FrameType::kAck ? src : -1);
  fail(Errc::kInvalidArgument, "rank " + std::to_string(src) + " " + descriptor_difference(*d, spec_.descriptor), src, now);
  return false;
}

// Our descriptor to every peer (but `except`) before the ABORT of fail(): each peer that runs
// another exchange than ours names the difference from its side, rather than relaying our
// view through the ABORT. An ACK of no token: it acknowledges nothing.
void Exchange::tell_descriptor(Rank except) {
  for (std::size_t r = 0; r < n_; ++r)
    if (static_cast<Rank>(r) != link_.rank() && static_cast<Rank>(r) != except) ack(static_cast<Rank>(r), FrameType::kSync, kNoToken);
}

bool Exchange::expects_ours(Rank src, std::uint64_t expected, Clock::time_point now) {
  const std::uint64_t ours = spec_.send[idx(src)].len;
  if (!running() || expected == ours) return true;
  fail(Errc::kInvalidArgument,
       "rank " + std::to_string(src) + " expects a " + std::to_string(expected) + "-byte block from this rank, which sends " +
           std::to_string(ours) + " bytes",
       src, now);
  return false;
}

bool Exchange::early_agrees(const EarlyFrames& early, Clock::time_point now) {
  for (std::size_t r = 0; r < n_ && r < early.descriptor.size(); ++r) {
    const auto& d = early.descriptor[r];
    if (d.empty() || !member_[r]) continue;
    const FrameType type = early.ready_from[r] ? FrameType::kReady : FrameType::kSync;
    if (!agrees(static_cast<Rank>(r), d, type, now)) return false;
    if (early.ready_from[r] && !expects_ours(static_cast<Rank>(r), early.ready_len[r], now)) return false;
  }
  return true;
}

std::string Exchange::waiting_for() const {
  std::vector<std::uint8_t> why(n_, 0);
  waited_on(why);
  static constexpr std::pair<Awaited, const char*> kWhat[] = {
      {kItsReady, "its READY"},          {kToken, "a token"},           {kItsBlock, "the rest of its block"},
      {kAckOfReady, "an ACK of our READY"}, {kAckOfToken, "an ACK of a token"}, {kAckOfBlock, "an ACK of our block"}};
  std::string out;
  int named = 0, more = 0;
  for (std::size_t r = 0; r < n_; ++r) {
    if (why[r] == 0) continue;
    if (named == 4) {
      ++more;
      continue;
    }
    out += (named++ == 0 ? "; still waiting for " : ", ") + peer_name(link_, static_cast<Rank>(r)) + ":";
    std::string sep = " ";
    for (const auto& [bit, text] : kWhat)
      if ((why[r] & bit) != 0) out += std::exchange(sep, " and ") + text;
  }
  if (more > 0) out += " and " + std::to_string(more) + " more";
  if (round_ < spec_.program.rounds.size())
    out += " (in round " + std::to_string(round_ + 1) + " of " + std::to_string(spec_.program.rounds.size()) + ")";
  return out;
}

}  // namespace aapc::engine

// The wire parser's seeds for replay_main.cpp: one valid frame of every type for the receiver
// of fuzz_context.hpp.
#include <algorithm>

#include "aapc/wire/descriptor.hpp"
#include "fuzz_context.hpp"
#include "replay.hpp"

namespace aapc::fuzz {

const char* const kReplayName = "fuzz_parse_replay";

namespace {

std::vector<std::uint8_t> frame(engine::FrameType type, std::uint32_t seq, std::uint64_t block_len, std::size_t payload, int src = 0,
                                std::uint8_t flags = 0) {
  std::vector<std::uint8_t> f(engine::frame_overhead(type) + payload, 0x42);
  engine::Header h;
  h.type = type;
  h.flags = flags;
  h.exchange = kExchange;
  h.epoch = 1234;
  h.src = static_cast<std::uint16_t>(src);
  h.dst = 1;
  h.seq = seq;
  h.block_len = block_len;
  h.chunk = kChunk;
  h.payload_len = static_cast<std::uint16_t>(payload);
  if (type == engine::FrameType::kAck) h.aux = static_cast<std::uint32_t>(engine::FrameType::kData);
  engine::encode(f.data(), mac(1), mac(src), engine::kDefaultEtherType, h);
  if (type == engine::FrameType::kNack)
    for (std::uint32_t i = 0; i < seq; ++i) engine::put_nack_range(f.data() + engine::kFrameOverhead, i, i * 3, 2);
  engine::seal(f.data());
  return f;
}

// An ACK that lists acknowledgements gathered for a while: a block and a token.
std::vector<std::uint8_t> ack_list() {
  auto f = frame(engine::FrameType::kAck, 0, 0, 2 * engine::kAckEntryLen, 0);
  f[engine::kEthHeaderLen + 4] = engine::kFlagAckList;
  engine::put_ack_entry(f.data() + engine::kFrameOverhead, 0, {kExchange, engine::FrameType::kData, 0, kPostedBlock});
  engine::put_ack_entry(f.data() + engine::kFrameOverhead, 1, {kExchange - 1, engine::FrameType::kSync, 7, 0});
  engine::seal(f.data());
  return f;
}

// A READY, SYNC or ACK carrying an exchange descriptor.
std::vector<std::uint8_t> described(engine::FrameType type, std::uint32_t seq, int src) {
  const auto d = engine::encode_descriptor({engine::Collective::kAlltoall, 4096, "tree+sender-all"});
  auto f = frame(type, seq, type == engine::FrameType::kReady ? 4096 : 0, d.size(), src);
  if (type == engine::FrameType::kAck) f[engine::kEthHeaderLen + 39] = static_cast<std::uint8_t>(engine::FrameType::kReady);
  std::copy(d.begin(), d.end(), f.begin() + static_cast<std::ptrdiff_t>(engine::kFrameOverhead));
  engine::seal(f.data());
  return f;
}

// A JOIN carrying what its daemon measured of its exchanges.
std::vector<std::uint8_t> join_measured() {
  const engine::JoinMeasure m{860'000, 244'000, {{40, 5, 5'690}, {41, 11, 7'190}, {42, 17, 8'870}}};
  auto f = frame(engine::FrameType::kJoin, 10, 1, m.length(), 2);
  engine::put_join_measure(f.data() + engine::kFrameOverhead, m);
  engine::seal(f.data());
  return f;
}

}  // namespace

std::vector<std::pair<std::string, std::vector<std::uint8_t>>> seeds() {
  using engine::FrameType;
  const std::uint32_t last = engine::frame_count(kPostedBlock, kChunk) - 1;
  return {
      {"data-first", frame(FrameType::kData, 0, kPostedBlock, kChunk)},
      {"data-last", frame(FrameType::kData, last, kPostedBlock, engine::frame_payload(kPostedBlock, kChunk, last), 0, engine::kFlagLast)},
      {"data-resent", frame(FrameType::kData, 5, kPostedBlock, kChunk, 0, engine::kFlagRetransmit | engine::kFlagLast)},
      {"sync", frame(FrameType::kSync, 12, 0, 0, 2)},
      {"ready", frame(FrameType::kReady, 0, 0, 0, 3)},
      {"nack", frame(FrameType::kNack, 3, kPostedBlock, 24)},
      {"ack", frame(FrameType::kAck, 0, kPostedBlock, 0)},
      {"abort", frame(FrameType::kAbort, 0, 0, 17, 2)},
      {"poll", frame(FrameType::kPoll, 0, kPostedBlock, 0)},
      {"ping", frame(FrameType::kPing, 0, 0, 0)},
      {"ready-described", described(FrameType::kReady, 0, 3)},
      {"sync-described", described(FrameType::kSync, 12, 2)},
      {"ack-described", described(FrameType::kAck, 0, 0)},
      {"ack-list", ack_list()},
      {"join-measured", join_measured()},
  };
}

// The CRC, recomputed when the mutated frame's length fields allow it.
void reseal(std::vector<std::uint8_t>& x) {
  const std::size_t n = engine::frame_header_len(x);
  // Only a frame whose header length goes with its type: seal() takes the length from the type.
  if (n == 0 || n != engine::frame_overhead(static_cast<engine::FrameType>(x[engine::kEthHeaderLen + 3]))) return;
  const std::size_t at = engine::kEthHeaderLen + (n == engine::kDataFrameOverhead ? 24 : 32);  // the payload length (wire.hpp)
  std::size_t payload = (static_cast<std::size_t>(x[at]) << 8) | x[at + 1];
  if (payload <= x.size() - n) engine::seal(x.data());
}

std::string seed_fault(const std::vector<std::uint8_t>& input) {
  static const Context ctx;
  auto p = engine::parse(input, ctx);
  return p.reason == engine::DropReason::kOk ? std::string() : std::string(engine::drop_reason_name(p.reason));
}

}  // namespace aapc::fuzz

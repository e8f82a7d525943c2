#include "aapc/engine/wire.hpp"

#include <sodium.h>

#include <cstring>

#include "aapc/engine/descriptor.hpp"
#include "crc.hpp"

namespace aapc::engine {
namespace {

inline void put16(std::uint8_t* p, std::uint16_t v) {
  p[0] = static_cast<std::uint8_t>(v >> 8);
  p[1] = static_cast<std::uint8_t>(v);
}
inline void put32(std::uint8_t* p, std::uint32_t v) {
  put16(p, static_cast<std::uint16_t>(v >> 16));
  put16(p + 2, static_cast<std::uint16_t>(v));
}
inline void put64(std::uint8_t* p, std::uint64_t v) {
  put32(p, static_cast<std::uint32_t>(v >> 32));
  put32(p + 4, static_cast<std::uint32_t>(v));
}
inline std::uint16_t get16(const std::uint8_t* p) { return static_cast<std::uint16_t>((p[0] << 8) | p[1]); }
inline std::uint32_t get32(const std::uint8_t* p) { return (static_cast<std::uint32_t>(get16(p)) << 16) | get16(p + 2); }
inline std::uint64_t get64(const std::uint8_t* p) { return (static_cast<std::uint64_t>(get32(p)) << 32) | get32(p + 4); }

constexpr std::size_t kCrcOffset = 40;  // within our header

// libsodium picks its fastest implementations for this CPU in sodium_init(). Thread-safe and
// idempotent.
[[maybe_unused]] const bool kSodiumReady = sodium_init() >= 0;

constexpr std::size_t kMacLen = crypto_aead_chacha20poly1305_ietf_ABYTES;
static_assert(kTagLen == 8 + kMacLen);
static_assert(kKeyLen == crypto_aead_chacha20poly1305_ietf_KEYBYTES);

// The nonce of a frame: source rank, epoch (both in the header) and the sender's counter (in
// the tag), so that no two frames sealed with the cluster key share one.
std::array<std::uint8_t, crypto_aead_chacha20poly1305_ietf_NPUBBYTES> nonce_of(const std::uint8_t* p, const std::uint8_t* tag) {
  std::array<std::uint8_t, crypto_aead_chacha20poly1305_ietf_NPUBBYTES> n{};
  std::memcpy(n.data(), p + 16, 2);     // source rank
  std::memcpy(n.data() + 2, p + 12, 4);  // epoch
  std::memcpy(n.data() + 6, tag + 2, 6);  // low 48 bits of the big-endian counter
  return n;
}

// Writes the tag of a frame after its payload: our header (CRC included) and the payload lie
// next to each other in the frame and are authenticated as associated data.
void put_tag(std::uint8_t* p, std::size_t payload_len, const FrameKey& key, std::uint64_t counter) {
  std::uint8_t* tag = p + kHeaderLen + payload_len;
  put64(tag, counter);
  const auto n = nonce_of(p, tag);
  std::uint8_t none[1] = {0};  // no message: libsodium's prototypes want pointers all the same
  crypto_aead_chacha20poly1305_ietf_encrypt_detached(none, tag + 8, nullptr, none, 0, p, kHeaderLen + payload_len, nullptr, n.data(),
                                                     key.bytes.data());
}

bool tag_verifies(const std::uint8_t* p, std::size_t payload_len, const FrameKey& key) {
  const std::uint8_t* tag = p + kHeaderLen + payload_len;
  const auto n = nonce_of(p, tag);
  std::uint8_t none[1] = {0};
  return crypto_aead_chacha20poly1305_ietf_decrypt_detached(none, nullptr, none, 0, tag + 8, p, kHeaderLen + payload_len, n.data(),
                                                            key.bytes.data()) == 0;
}

}  // namespace

void put_nack_range(std::uint8_t* payload, std::uint32_t index, std::uint32_t first, std::uint32_t count) {
  put32(payload + 8 * index, first);
  put32(payload + 8 * index + 4, count);
}

void put_ack_entry(std::uint8_t* payload, std::size_t index, const AckEntry& e) {
  std::uint8_t* p = payload + index * kAckEntryLen;
  put32(p, e.exchange);
  p[4] = static_cast<std::uint8_t>(e.type);
  p[5] = p[6] = p[7] = 0;
  put32(p + 8, e.seq);
  put64(p + 12, e.block_len);
}

AckEntry ack_entry(std::span<const std::uint8_t> payload, std::size_t index) {
  const std::uint8_t* p = payload.data() + index * kAckEntryLen;
  return {get32(p), static_cast<FrameType>(p[4]), get32(p + 8), get64(p + 12)};
}

std::pair<std::uint32_t, std::uint32_t> nack_range(std::span<const std::uint8_t> payload, std::uint32_t index) {
  return {get32(payload.data() + 8 * index), get32(payload.data() + 8 * index + 4)};
}

std::string_view frame_type_name(FrameType type) {
  switch (type) {
    case FrameType::kData: return "DATA";
    case FrameType::kSync: return "SYNC";
    case FrameType::kReady: return "READY";
    case FrameType::kNack: return "NACK";
    case FrameType::kAck: return "ACK";
    case FrameType::kAbort: return "ABORT";
    case FrameType::kPoll: return "POLL";
    case FrameType::kPing: return "PING";
    case FrameType::kJoin: return "JOIN";
  }
  return "?";
}

std::string_view drop_reason_name(DropReason reason) {
  static constexpr std::string_view kNames[] = {
      "ok",          "runt",        "ethertype",   "not_for_us",       "unknown_source", "bad_magic",
      "bad_version", "bad_type",    "bad_length",  "bad_crc",          "rank_mismatch",  "not_live",
      "stale_epoch", "unexpected_block", "bad_offset", "duplicate", "dummy", "future_epoch", "bad_auth"};
  auto i = static_cast<std::size_t>(reason);
  return i < std::size(kNames) ? kNames[i] : "?";
}

void encode(std::uint8_t* out, const MacAddr& dst_mac, const MacAddr& src_mac, std::uint16_t ethertype, const Header& h) {
  std::memcpy(out, dst_mac.data(), 6);
  std::memcpy(out + 6, src_mac.data(), 6);
  put16(out + 12, ethertype);
  std::uint8_t* p = out + kEthHeaderLen;
  put16(p, kMagic);
  p[2] = kVersion;
  p[3] = static_cast<std::uint8_t>(h.type);
  p[4] = h.flags;
  p[5] = static_cast<std::uint8_t>(kHeaderLen);
  put16(p + 6, h.phase);
  put32(p + 8, h.exchange);
  put32(p + 12, h.epoch);
  put16(p + 16, h.src);
  put16(p + 18, h.dst);
  put32(p + 20, h.seq);
  put64(p + 24, h.block_len);
  put16(p + 32, h.payload_len);
  put16(p + 34, h.chunk);
  put32(p + 36, h.aux);
  put32(p + kCrcOffset, 0);
}

void seal(std::uint8_t* frame, const FrameKey* key, std::uint64_t counter) {
  std::uint8_t* p = frame + kEthHeaderLen;
  std::uint16_t payload = get16(p + 32);
  if (key != nullptr) p[2] = kVersionAuth;
  std::uint32_t crc = crc32c(0, p, kCrcOffset);
  crc = crc32c(crc, p + kHeaderLen, payload);
  put32(p + kCrcOffset, crc);
  if (key != nullptr) put_tag(p, payload, *key, counter);
}

void copy_and_seal(std::uint8_t* frame, const std::uint8_t* payload, std::size_t len, const FrameKey* key, std::uint64_t counter) {
  std::uint8_t* p = frame + kEthHeaderLen;
  if (key != nullptr) p[2] = kVersionAuth;
  std::uint32_t crc = crc32c(0, p, kCrcOffset);
  crc = crc32c_copy(crc, p + kHeaderLen, payload, len);
  put32(p + kCrcOffset, crc);
  if (key != nullptr) put_tag(p, len, *key, counter);
}

void seal_apart(std::uint8_t* frame, const std::uint8_t* payload, std::size_t len) {
  std::uint8_t* p = frame + kEthHeaderLen;
  std::uint32_t crc = crc32c(0, p, kCrcOffset);
  crc = crc32c(crc, payload, len);
  put32(p + kCrcOffset, crc);
}

namespace {

// The fields of our header, of a frame known to hold one: magic, version, type and header
// length checked; not the payload length nor the CRC.
DropReason decode_fields(const std::uint8_t* p, Header& h) {
  if (get16(p) != kMagic) return DropReason::kBadMagic;
  if (p[2] != kVersion && p[2] != kVersionAuth) return DropReason::kBadVersion;
  if (p[3] == 0 || p[3] >= kFrameTypes) return DropReason::kBadType;
  if (p[5] != kHeaderLen) return DropReason::kBadLength;
  h.type = static_cast<FrameType>(p[3]);
  h.flags = p[4];
  h.phase = get16(p + 6);
  h.exchange = get32(p + 8);
  h.epoch = get32(p + 12);
  h.src = get16(p + 16);
  h.dst = get16(p + 18);
  h.seq = get32(p + 20);
  h.block_len = get64(p + 24);
  h.payload_len = get16(p + 32);
  h.chunk = get16(p + 34);
  h.aux = get32(p + 36);
  return DropReason::kOk;
}

bool crc_matches(const std::uint8_t* p, const std::uint8_t* payload, std::uint16_t payload_len) {
  std::uint32_t crc = crc32c(0, p, kCrcOffset);
  crc = crc32c(crc, payload, payload_len);
  return crc == get32(p + kCrcOffset);
}
bool crc_matches(const std::uint8_t* p, std::uint16_t payload_len) { return crc_matches(p, p + kHeaderLen, payload_len); }

// Bytes after our header: the payload, and the tag of a tagged (kVersionAuth) frame.
std::size_t tail_len(const std::uint8_t* p, std::uint16_t payload_len) { return payload_len + (p[2] == kVersionAuth ? kTagLen : 0); }

// Our header (in `head`, of our EtherType and at least kFrameOverhead long) of a frame whose
// payload and tag are `tail`: fields, lengths and CRC.
DropReason decode(std::span<const std::uint8_t> head, std::span<const std::uint8_t> tail, Header& h) {
  const std::uint8_t* p = head.data() + kEthHeaderLen;
  if (DropReason r = decode_fields(p, h); r != DropReason::kOk) return r;
  if (tail_len(p, h.payload_len) > tail.size()) return DropReason::kBadLength;
  if (!crc_matches(p, tail.data(), h.payload_len)) return DropReason::kBadCrc;
  return DropReason::kOk;
}
DropReason decode(std::span<const std::uint8_t> frame, Header& h) { return decode(frame.first(kFrameOverhead), frame.subspan(kFrameOverhead), h); }

}  // namespace

Captured peek_captured(std::span<const std::uint8_t> captured, std::size_t wire_len, std::uint16_t ethertype) {
  Captured out;
  if (captured.size() < kEthHeaderLen || get16(captured.data() + 12) != ethertype) {
    out.reason = DropReason::kEtherType;
    return out;
  }
  if (captured.size() < kFrameOverhead) {
    out.reason = DropReason::kRunt;
    return out;
  }
  const std::uint8_t* p = captured.data() + kEthHeaderLen;
  out.reason = decode_fields(p, out.h);
  if (out.reason != DropReason::kOk) return out;
  if (tail_len(p, out.h.payload_len) > wire_len - kFrameOverhead) {
    out.reason = DropReason::kBadLength;
    return out;
  }
  if (captured.size() >= kFrameOverhead + out.h.payload_len) {
    out.crc_checked = true;
    if (!crc_matches(p, out.h.payload_len)) out.reason = DropReason::kBadCrc;
  }
  return out;
}

std::optional<Header> peek(std::span<const std::uint8_t> frame, std::uint16_t ethertype) {
  if (frame.size() < kFrameOverhead || get16(frame.data() + 12) != ethertype) return std::nullopt;
  Header h;
  if (decode(frame, h) != DropReason::kOk) return std::nullopt;
  return h;
}

Parsed parse(std::span<const std::uint8_t> frame, const ParseContext& ctx) {
  if (frame.size() < kFrameOverhead) return parse(frame, {}, ctx);
  return parse(frame.first(kFrameOverhead), frame.subspan(kFrameOverhead), ctx);
}

Parsed parse(std::span<const std::uint8_t> head, std::span<const std::uint8_t> tail, const ParseContext& ctx) {
  Parsed out;
  auto drop = [&](DropReason r) {
    out.reason = r;
    return out;
  };
  if (head.size() < kEthHeaderLen) return drop(DropReason::kRunt);
  const std::uint8_t* f = head.data();
  if (get16(f + 12) != ctx.ethertype) return drop(DropReason::kEtherType);
  if (head.size() < kFrameOverhead) return drop(DropReason::kRunt);
  if (std::memcmp(f, ctx.my_mac.data(), 6) != 0) return drop(DropReason::kNotForUs);
  MacAddr src_mac;
  std::memcpy(src_mac.data(), f + 6, 6);
  Rank src_rank = ctx.rank_of(src_mac);
  if (src_rank < 0) return drop(DropReason::kUnknownSource);

  if (DropReason r = decode(head.first(kFrameOverhead), tail, out.h); r != DropReason::kOk) return drop(r);
  Header& h = out.h;
  // Issue 15, finding 4: with a cluster key nothing passes without a tag that verifies; and a
  // tagged frame at a node without the key means the cluster is configured in two ways. The
  // tag authenticates header and payload as one run of bytes: they must lie together.
  const std::uint8_t* p = f + kEthHeaderLen;
  if ((p[2] == kVersionAuth) != (ctx.key != nullptr)) return drop(DropReason::kBadAuth);
  if (ctx.key != nullptr && (tail.data() != p + kHeaderLen || !tag_verifies(p, h.payload_len, *ctx.key))) return drop(DropReason::kBadAuth);
  if (h.src != src_rank || h.dst != ctx.my_rank) return drop(DropReason::kRankMismatch);
  out.src_rank = src_rank;
  out.payload = tail.first(h.payload_len);

  switch (h.type) {
    case FrameType::kData: {
      if (h.chunk == 0 || h.block_len == 0 || h.payload_len == 0) return drop(DropReason::kBadLength);
      std::uint32_t count = frame_count(h.block_len, h.chunk);
      if (h.seq >= count || h.payload_len != frame_payload(h.block_len, h.chunk, h.seq)) return drop(DropReason::kBadOffset);
      if ((h.flags & kFlagDummy) != 0) return drop(DropReason::kDummy);  // nothing is written for dummy traffic
      ParseContext::Expected e = ctx.expect_data(h.exchange, h.epoch, src_rank);
      if (e.status != DropReason::kOk) return drop(e.status);
      if (!e.early && e.block_len != h.block_len) return drop(DropReason::kUnexpectedBlock);
      if (e.chunk != h.chunk) return drop(DropReason::kBadOffset);
      out.offset = static_cast<std::uint64_t>(h.seq) * h.chunk;
      if (out.offset + h.payload_len > h.block_len) return drop(DropReason::kBadOffset);  // implied, kept as a guard
      break;
    }
    case FrameType::kNack: {
      // seq ranges of (first, count), 8 bytes each, within the block.
      if (h.payload_len != h.seq * 8ULL || h.chunk == 0) return drop(DropReason::kBadLength);
      std::uint32_t count = frame_count(h.block_len, h.chunk);
      for (std::uint32_t i = 0; i < h.seq; ++i) {
        std::uint32_t first = get32(out.payload.data() + 8 * i), n = get32(out.payload.data() + 8 * i + 4);
        if (n == 0 || first >= count || n > count - first) return drop(DropReason::kBadOffset);
      }
      break;
    }
    case FrameType::kSync:
    case FrameType::kReady:
      // The sender's exchange descriptor (issue 15, finding 10), or nothing.
      if (h.payload_len != 0 && !descriptor_valid(out.payload)) return drop(DropReason::kBadLength);
      break;
    case FrameType::kPoll:
    case FrameType::kPing:
    case FrameType::kJoin:
      if (h.payload_len != 0) return drop(DropReason::kBadLength);
      break;
    case FrameType::kAck:
      if (h.aux == 0 || h.aux >= kFrameTypes) return drop(DropReason::kBadLength);
      if ((h.flags & kFlagAckList) != 0) {
        if (h.payload_len == 0 || h.payload_len % kAckEntryLen != 0) return drop(DropReason::kBadLength);
        for (std::size_t i = 0; i < h.payload_len / kAckEntryLen; ++i) {
          const FrameType t = ack_entry(out.payload, i).type;
          if (t != FrameType::kData && t != FrameType::kSync) return drop(DropReason::kBadLength);
        }
        break;
      }
      if (h.payload_len != 0 && !descriptor_valid(out.payload)) return drop(DropReason::kBadLength);
      break;
    case FrameType::kAbort:
      break;
  }
  return out;
}

}  // namespace aapc::engine

#include "aapc/wire/wire.hpp"

#include <sodium.h>

#include <cstring>

#include "aapc/wire/crc.hpp"
#include "aapc/wire/descriptor.hpp"

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

// Where a header of `hlen` bytes (its byte 5: kHeaderLen or kDataHeaderLen) keeps the payload
// length and the CRC: both headers end with the CRC.
constexpr std::size_t payload_len_at(std::size_t hlen) { return hlen == kDataHeaderLen ? 24 : 32; }
constexpr std::size_t crc_at(std::size_t hlen) { return hlen - 4; }
// The length of header `p` as its type gives it. The parser uses it only once byte 5 has been
// found to say the same; sealing uses it whatever byte 5 says (a test may have changed it).
std::size_t hlen_of(const std::uint8_t* p) { return header_len(static_cast<FrameType>(p[3])); }
static_assert(crc_at(kHeaderLen) == 40 && crc_at(kDataHeaderLen) == 26);

// libsodium picks its fastest implementations for this CPU in sodium_init(). Thread-safe and
// idempotent.
[[maybe_unused]] const bool kSodiumReady = sodium_init() >= 0;

constexpr std::size_t kMacLen = crypto_aead_chacha20poly1305_ietf_ABYTES;
static_assert(kTagLen == 8 + kMacLen);
static_assert(kKeyLen == crypto_aead_chacha20poly1305_ietf_KEYBYTES);
static_assert(kMacLen == crypto_aead_aes256gcm_ABYTES && kKeyLen == crypto_aead_aes256gcm_KEYBYTES);
static_assert(crypto_aead_chacha20poly1305_ietf_NPUBBYTES == crypto_aead_aes256gcm_NPUBBYTES);

// AES-256-GCM's expanded key and hash key for `key`, made once per thread and key: I/O lcores
// check frames on threads of their own, and a table per call would cost a tenth of a frame.
// The AES key is the cluster key's keyed BLAKE2b of a label, never the cluster key itself.
const crypto_aead_aes256gcm_state& gcm_state(const FrameKey& key) {
  struct Cache {
    std::array<std::uint8_t, kKeyLen> of{};
    bool made = false;
    crypto_aead_aes256gcm_state state;
  };
  thread_local Cache cache;
  if (!cache.made || cache.of != key.bytes) {
    static constexpr char kLabel[] = "aapc frame tags: AES-256-GCM";
    std::array<std::uint8_t, kKeyLen> derived{};
    crypto_generichash(derived.data(), derived.size(), reinterpret_cast<const unsigned char*>(kLabel), sizeof kLabel - 1, key.bytes.data(), key.bytes.size());
    crypto_aead_aes256gcm_beforenm(&cache.state, derived.data());
    sodium_memzero(derived.data(), derived.size());
    cache.of = key.bytes;
    cache.made = true;
  }
  return cache.state;
}

// The nonce of a frame: source rank, epoch (both in the header) and the sender's counter (in
// the tag), so that no two frames sealed with the cluster key share one.
std::array<std::uint8_t, crypto_aead_chacha20poly1305_ietf_NPUBBYTES> nonce_of(const std::uint8_t* p, const std::uint8_t* tag) {
  std::array<std::uint8_t, crypto_aead_chacha20poly1305_ietf_NPUBBYTES> n{};
  std::memcpy(n.data(), p + 16, 2);     // source rank
  std::memcpy(n.data() + 2, p + 12, 4);  // epoch
  std::memcpy(n.data() + 6, tag + 2, 6);  // low 48 bits of the big-endian counter
  return n;
}

// The version byte of a frame sealed with `key`: ChaCha20-Poly1305 on a CPU that cannot compute
// AES-256-GCM, whatever the key asks (every node checks both; aapcd refuses such a --cipher).
std::uint8_t sealed_version(const FrameKey& key) {
  return key.cipher == Cipher::kAes256Gcm && aes_gcm_available() ? kVersionAuthGcm : kVersionAuth;
}

// Writes the tag of a frame after its payload with the cipher its version byte names: our header
// (CRC included) and the payload lie next to each other in the frame and are authenticated as
// associated data.
void put_tag(std::uint8_t* p, std::size_t payload_len, const FrameKey& key, std::uint64_t counter) {
  const std::size_t ad = hlen_of(p) + payload_len;
  std::uint8_t* tag = p + ad;
  put64(tag, counter);
  const auto n = nonce_of(p, tag);
  std::uint8_t none[1] = {0};  // no message: libsodium's prototypes want pointers all the same
  if (p[2] == kVersionAuthGcm) {
    crypto_aead_aes256gcm_encrypt_detached_afternm(none, tag + 8, nullptr, none, 0, p, ad, nullptr, n.data(), &gcm_state(key));
  } else {
    crypto_aead_chacha20poly1305_ietf_encrypt_detached(none, tag + 8, nullptr, none, 0, p, ad, nullptr, n.data(), key.bytes.data());
  }
}

bool tag_verifies(const std::uint8_t* p, std::size_t payload_len, const FrameKey& key) {
  const std::size_t ad = hlen_of(p) + payload_len;
  const std::uint8_t* tag = p + ad;
  const auto n = nonce_of(p, tag);
  std::uint8_t none[1] = {0};
  if (p[2] == kVersionAuthGcm)
    return aes_gcm_available() &&
           crypto_aead_aes256gcm_decrypt_detached_afternm(none, nullptr, none, 0, tag + 8, p, ad, n.data(), &gcm_state(key)) == 0;
  return crypto_aead_chacha20poly1305_ietf_decrypt_detached(none, nullptr, none, 0, tag + 8, p, ad, n.data(), key.bytes.data()) == 0;
}

// The CRC of a header (its bytes before the CRC field) and a payload.
std::uint32_t header_crc(const std::uint8_t* p) { return crc32c(0, p, crc_at(hlen_of(p))); }

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

std::size_t JoinMeasure::length() const { return kJoinFitLen + kReachSampleLen * reaches.size(); }

void put_join_measure(std::uint8_t* payload, const JoinMeasure& m) {
  put32(payload, m.fill_ppm);
  put32(payload + 4, m.hand_over_ns);
  std::uint8_t* p = payload + kJoinFitLen;
  for (const ReachSample& r : m.reaches) {
    put32(p, r.exchange);
    p[4] = r.cell;
    put16(p + 5, r.reach);
    p += kReachSampleLen;
  }
}

namespace {

std::optional<JoinMeasure> read_join_measure(std::span<const std::uint8_t> payload) {
  if (payload.size() < kJoinFitLen || (payload.size() - kJoinFitLen) % kReachSampleLen != 0) return std::nullopt;
  JoinMeasure m{get32(payload.data()), get32(payload.data() + 4), {}};
  if (m.fill_ppm > kJoinFillWhole) return std::nullopt;
  for (const std::uint8_t* p = payload.data() + kJoinFitLen; p < payload.data() + payload.size(); p += kReachSampleLen) {
    const ReachSample r{get32(p), p[4], get16(p + 5)};
    if (r.cell >= kJoinReachCells || r.reach == 0 || r.reach > kJoinReachWhole) return std::nullopt;
    m.reaches.push_back(r);
  }
  return m;
}

}  // namespace

JoinMeasure join_measure(std::span<const std::uint8_t> payload) { return read_join_measure(payload).value_or(JoinMeasure{}); }

std::pair<std::uint32_t, std::uint32_t> nack_range(std::span<const std::uint8_t> payload, std::uint32_t index) {
  return {get32(payload.data() + 8 * index), get32(payload.data() + 8 * index + 4)};
}

std::string_view cipher_name(Cipher cipher) { return cipher == Cipher::kAes256Gcm ? "aes-256-gcm" : "chacha20-poly1305"; }

std::optional<Cipher> parse_cipher(std::string_view name) {
  for (Cipher c : {Cipher::kChaCha20Poly1305, Cipher::kAes256Gcm})
    if (name == cipher_name(c)) return c;
  return std::nullopt;
}

bool aes_gcm_available() {
  static const bool available = kSodiumReady && crypto_aead_aes256gcm_is_available() != 0;
  return available;
}

Cipher fastest_cipher() { return aes_gcm_available() ? Cipher::kAes256Gcm : Cipher::kChaCha20Poly1305; }

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
      "stale_epoch", "unexpected_block", "bad_offset", "duplicate", "dummy", "future_epoch", "bad_auth", "not_member", "unconfirmed_epoch"};
  auto i = static_cast<std::size_t>(reason);
  return i < std::size(kNames) ? kNames[i] : "?";
}

std::size_t encode(std::uint8_t* out, const MacAddr& dst_mac, const MacAddr& src_mac, std::uint16_t ethertype, const Header& h) {
  std::memcpy(out, dst_mac.data(), 6);
  std::memcpy(out + 6, src_mac.data(), 6);
  put16(out + 12, ethertype);
  std::uint8_t* p = out + kEthHeaderLen;
  put16(p, kMagic);
  p[2] = kVersion;
  p[3] = static_cast<std::uint8_t>(h.type);
  p[4] = h.flags;
  const std::size_t hlen = header_len(h.type);
  p[5] = static_cast<std::uint8_t>(hlen);
  put16(p + 6, h.phase);
  put32(p + 8, h.exchange);
  put32(p + 12, h.epoch);
  put16(p + 16, h.src);
  put16(p + 18, h.dst);
  put32(p + 20, h.seq);
  if (hlen == kHeaderLen) {
    put64(p + 24, h.block_len);
    put16(p + 34, h.chunk);
    put32(p + 36, h.aux);
  }
  put16(p + payload_len_at(hlen), h.payload_len);
  put32(p + crc_at(hlen), 0);
  return kEthHeaderLen + hlen;
}

void seal(std::uint8_t* frame, const FrameKey* key, std::uint64_t counter) {
  std::uint8_t* p = frame + kEthHeaderLen;
  const std::size_t hlen = hlen_of(p);
  std::uint16_t payload = get16(p + payload_len_at(hlen));
  if (key != nullptr) p[2] = sealed_version(*key);
  put32(p + crc_at(hlen), crc32c(header_crc(p), p + hlen, payload));
  if (key != nullptr) put_tag(p, payload, *key, counter);
}

void copy_and_seal(std::uint8_t* frame, const std::uint8_t* payload, std::size_t len, const FrameKey* key, std::uint64_t counter) {
  std::uint8_t* p = frame + kEthHeaderLen;
  if (key != nullptr) p[2] = sealed_version(*key);
  put32(p + crc_at(hlen_of(p)), crc32c_copy(header_crc(p), p + hlen_of(p), payload, len, Ahead::kSource));
  if (key != nullptr) put_tag(p, len, *key, counter);
}

void seal_later(std::uint8_t* frame, const FrameKey* key, std::uint64_t counter) {
  std::uint8_t* p = frame + kEthHeaderLen;
  if (key == nullptr) return;
  p[2] = sealed_version(*key);
  put64(p + hlen_of(p) + get16(p + payload_len_at(hlen_of(p))), counter);
}

void seal_marked(std::uint8_t* frame, const FrameKey* key) {
  const std::uint8_t* p = frame + kEthHeaderLen;
  seal(frame, key, key != nullptr ? get64(p + hlen_of(p) + get16(p + payload_len_at(hlen_of(p)))) : 0);
}

void seal_apart(std::uint8_t* frame, const std::uint8_t* payload, std::size_t len) {
  std::uint8_t* p = frame + kEthHeaderLen;
  put32(p + crc_at(hlen_of(p)), crc32c_ahead(header_crc(p), payload, len));
}

namespace {

// The fields of our header, of a frame of `avail` bytes from our header on (at least
// kDataHeaderLen): magic, version, type and header length checked, the header wholly there;
// not the payload length nor the CRC.
DropReason decode_fields(const std::uint8_t* p, std::size_t avail, Header& h) {
  if (get16(p) != kMagic) return DropReason::kBadMagic;
  if (p[2] != kVersion && !tagged_version(p[2])) return DropReason::kBadVersion;
  if (p[3] == 0 || p[3] >= kFrameTypes) return DropReason::kBadType;
  h.type = static_cast<FrameType>(p[3]);
  const std::size_t hlen = header_len(h.type);
  if (p[5] != hlen) return DropReason::kBadLength;
  if (avail < hlen) return DropReason::kRunt;
  h.flags = p[4];
  h.phase = get16(p + 6);
  h.exchange = get32(p + 8);
  h.epoch = get32(p + 12);
  h.src = get16(p + 16);
  h.dst = get16(p + 18);
  h.seq = get32(p + 20);
  if (hlen == kHeaderLen) {
    h.block_len = get64(p + 24);
    h.chunk = get16(p + 34);
    h.aux = get32(p + 36);
  }
  h.payload_len = get16(p + payload_len_at(hlen));
  return DropReason::kOk;
}

bool crc_matches(const std::uint8_t* p, const std::uint8_t* payload, std::uint16_t payload_len) {
  return crc32c(header_crc(p), payload, payload_len) == get32(p + crc_at(hlen_of(p)));
}
bool crc_matches(const std::uint8_t* p, std::uint16_t payload_len) { return crc_matches(p, p + hlen_of(p), payload_len); }

// Bytes after our header: the payload, and the tag of a tagged (kVersionAuth) frame.
std::size_t tail_len(const std::uint8_t* p, std::uint16_t payload_len) { return payload_len + (tagged_version(p[2]) ? kTagLen : 0); }

// Our header (in `head`, of our EtherType and at least kDataFrameOverhead long) of a frame
// whose payload and tag are `tail`: fields, lengths and (with `check_crc`) CRC. A `head`
// longer than its header holds the start of the payload, and then `tail` must be empty.
DropReason decode(std::span<const std::uint8_t> head, std::span<const std::uint8_t> tail, Header& h, bool check_crc = true) {
  const std::uint8_t* p = head.data() + kEthHeaderLen;
  if (DropReason r = decode_fields(p, head.size() - kEthHeaderLen, h); r != DropReason::kOk) return r;
  if (const std::size_t n = kEthHeaderLen + hlen_of(p); head.size() > n) {
    if (!tail.empty()) return DropReason::kBadLength;
    tail = head.subspan(n);
  }
  if (tail_len(p, h.payload_len) > tail.size()) return DropReason::kBadLength;
  if (check_crc && !crc_matches(p, tail.data(), h.payload_len)) return DropReason::kBadCrc;
  return DropReason::kOk;
}
DropReason decode(std::span<const std::uint8_t> frame, Header& h) { return decode(frame, {}, h); }

// A DATA frame (header and CRC checked, but for the CRC when `crc_later`) against the block
// posted for it; when `crc_later`, the CRC too, while the payload is copied into its place.
DropReason check_data(Parsed& out, const std::uint8_t* p, bool crc_later, const ParseContext& ctx) {
  Header& h = out.h;
  if (h.payload_len == 0) return DropReason::kBadLength;
  if ((h.flags & kFlagDummy) != 0) return DropReason::kDummy;  // nothing is written for dummy traffic
  ParseContext::Expected e = ctx.expect_data(h.exchange, h.epoch, out.src_rank);
  // A block from a peer that should send none is one of another length too (0 bytes).
  if (e.status != DropReason::kOk && e.status != DropReason::kUnexpectedBlock) return e.status;
  if (e.chunk == 0 || h.payload_len > e.chunk) return DropReason::kBadOffset;  // no block of ours has such a frame
  out.offset = static_cast<std::uint64_t>(h.seq) * e.chunk;
  if (!e.early) {  // else checked against the posted block when the exchange starts (data_fits)
    if (DropReason r = data_fits(h, e.status == DropReason::kOk ? e.block_len : 0, e.chunk); r != DropReason::kOk) return r;
    if (out.offset + h.payload_len > e.block_len) return DropReason::kBadOffset;  // implied, kept as a guard
  }
  if (!crc_later) return DropReason::kOk;
  // The payload is read once on receive, copied into place while its CRC is computed.
  const std::uint32_t crc = header_crc(p);
  const std::uint32_t want = get32(p + crc_at(hlen_of(p)));
  if (std::uint8_t* dst = e.early ? nullptr : ctx.place_at(h.exchange, out.src_rank, h.seq); dst != nullptr) {
    if (crc32c_copy(crc, dst, out.payload.data(), h.payload_len, e.stream ? Ahead::kStream : Ahead::kDestination) != want) return DropReason::kBadCrc;
    out.placed = true;
    return DropReason::kOk;
  }
  return crc32c(crc, out.payload.data(), h.payload_len) == want ? DropReason::kOk : DropReason::kBadCrc;
}

}  // namespace

Captured peek_captured(std::span<const std::uint8_t> captured, std::size_t wire_len, std::uint16_t ethertype) {
  Captured out;
  if (captured.size() < kEthHeaderLen || get16(captured.data() + 12) != ethertype) {
    out.reason = DropReason::kEtherType;
    return out;
  }
  if (captured.size() < kDataFrameOverhead) {
    out.reason = DropReason::kRunt;
    return out;
  }
  const std::uint8_t* p = captured.data() + kEthHeaderLen;
  out.reason = decode_fields(p, captured.size() - kEthHeaderLen, out.h);
  if (out.reason != DropReason::kOk) return out;
  const std::size_t overhead = kEthHeaderLen + hlen_of(p);
  if (wire_len < overhead || tail_len(p, out.h.payload_len) > wire_len - overhead) {
    out.reason = DropReason::kBadLength;
    return out;
  }
  if (captured.size() >= overhead + out.h.payload_len) {
    out.crc_checked = true;
    if (!crc_matches(p, out.h.payload_len)) out.reason = DropReason::kBadCrc;
  }
  return out;
}

std::optional<Header> peek(std::span<const std::uint8_t> frame, std::uint16_t ethertype) {
  if (frame.size() < kDataFrameOverhead || get16(frame.data() + 12) != ethertype) return std::nullopt;
  Header h;
  if (decode(frame, h) != DropReason::kOk) return std::nullopt;
  return h;
}

std::size_t frame_header_len(std::span<const std::uint8_t> frame) {
  if (frame.size() < kDataFrameOverhead) return 0;
  const std::size_t n = kEthHeaderLen + frame[kEthHeaderLen + 5];
  return (n == kFrameOverhead || n == kDataFrameOverhead) && frame.size() >= n ? n : 0;
}

Parsed parse(std::span<const std::uint8_t> frame, const ParseContext& ctx) {
  const std::size_t n = frame_header_len(frame);
  if (n == 0) return parse(frame, {}, ctx);  // names what is wrong with it
  return parse(frame.first(n), frame.subspan(n), ctx);
}

DropReason data_fits(Header& h, std::uint64_t posted, std::uint32_t chunk) {
  const bool ends_first_pass = (h.flags & kFlagLast) != 0 && (h.flags & kFlagRetransmit) == 0;
  h.block_len = ends_first_pass ? static_cast<std::uint64_t>(h.seq) * chunk + h.payload_len : 0;
  const std::uint32_t count = frame_count(posted, chunk);
  if (h.seq >= count || h.payload_len != frame_payload(posted, chunk, h.seq)) return DropReason::kUnexpectedBlock;
  if (ends_first_pass && h.seq + 1 != count) return DropReason::kUnexpectedBlock;  // the sender's block is shorter
  return DropReason::kOk;
}

namespace {

// A whole frame given in `head` alone is split where its header ends.
void split_whole(std::span<const std::uint8_t>& head, std::span<const std::uint8_t>& tail) {
  if (const std::size_t n = frame_header_len(head); n != 0 && head.size() > n && tail.empty()) {
    tail = head.subspan(n);
    head = head.first(n);
  }
}

}  // namespace

bool integrity_holds(std::span<const std::uint8_t> head, std::span<const std::uint8_t> tail, const FrameKey* key) {
  if (head.size() < kDataFrameOverhead) return false;
  split_whole(head, tail);
  Header h;
  if (decode(head, tail, h) != DropReason::kOk) return false;  // the CRC with the rest
  const std::uint8_t* p = head.data() + kEthHeaderLen;
  if (key == nullptr) return !tagged_version(p[2]);
  return tagged_version(p[2]) && tail.data() == p + hlen_of(p) && tag_verifies(p, h.payload_len, *key);
}

namespace {

// A control frame's payload, by its type (the CRC and tag have held).
DropReason check_control(const Header& h, std::span<const std::uint8_t> payload) {
  switch (h.type) {
    case FrameType::kData:
      break;
    case FrameType::kNack: {
      // seq ranges of (first, count), 8 bytes each, within the block.
      if (h.payload_len != h.seq * 8ULL || h.chunk == 0) return DropReason::kBadLength;
      std::uint32_t count = frame_count(h.block_len, h.chunk);
      for (std::uint32_t i = 0; i < h.seq; ++i) {
        std::uint32_t first = get32(payload.data() + 8 * i), n = get32(payload.data() + 8 * i + 4);
        if (n == 0 || first >= count || n > count - first) return DropReason::kBadOffset;
      }
      break;
    }
    case FrameType::kSync:
    case FrameType::kReady:
      // The sender's exchange descriptor, or nothing.
      if (h.payload_len != 0 && !descriptor_valid(payload)) return DropReason::kBadLength;
      break;
    case FrameType::kPoll:
    case FrameType::kPing:
      if (h.payload_len != 0) return DropReason::kBadLength;
      break;
    case FrameType::kJoin:
      // Nothing, or one measure whose fractions are fractions.
      if (h.payload_len != 0 && !read_join_measure(payload)) return DropReason::kBadLength;
      break;
    case FrameType::kAck:
      if (h.aux == 0 || h.aux >= kFrameTypes) return DropReason::kBadLength;
      if ((h.flags & kFlagAckList) != 0) {
        if (h.payload_len == 0 || h.payload_len % kAckEntryLen != 0) return DropReason::kBadLength;
        for (std::size_t i = 0; i < h.payload_len / kAckEntryLen; ++i) {
          const FrameType t = ack_entry(payload, i).type;
          if (t != FrameType::kData && t != FrameType::kSync) return DropReason::kBadLength;
        }
        break;
      }
      if (h.payload_len != 0 && !descriptor_valid(payload)) return DropReason::kBadLength;
      break;
    case FrameType::kAbort:
      break;
  }
  return DropReason::kOk;
}

}  // namespace

Parsed parse(std::span<const std::uint8_t> head, std::span<const std::uint8_t> tail, const ParseContext& ctx, bool integrity_checked) {
  Parsed out;
  auto drop = [&](DropReason r) {
    out.reason = r;
    return out;
  };
  if (head.size() < kEthHeaderLen) return drop(DropReason::kRunt);
  const std::uint8_t* f = head.data();
  if (get16(f + 12) != ctx.ethertype) return drop(DropReason::kEtherType);
  if (head.size() < kDataFrameOverhead) return drop(DropReason::kRunt);
  if (std::memcmp(f, ctx.my_mac.data(), 6) != 0) return drop(DropReason::kNotForUs);
  MacAddr src_mac;
  std::memcpy(src_mac.data(), f + 6, 6);
  Rank src_rank = ctx.rank_of(src_mac);
  if (src_rank < 0) return drop(DropReason::kUnknownSource);

  split_whole(head, tail);
  // An unkeyed DATA frame may have its CRC computed as its payload is copied into place
  // (ParseContext::place_at); every other frame has it checked here, unless integrity_holds()
  // checked it already. Either way nothing but kBadCrc is said of a frame whose CRC fails.
  const bool crc_later = !integrity_checked && ctx.key == nullptr && head.size() > kEthHeaderLen + 3 &&
                         head[kEthHeaderLen + 3] == static_cast<std::uint8_t>(FrameType::kData);
  if (DropReason r = decode(head, tail, out.h, !crc_later && !integrity_checked); r != DropReason::kOk) return drop(r);
  Header& h = out.h;
  const std::uint8_t* p = f + kEthHeaderLen;
  auto crc_ok = [&] { return crc_matches(p, tail.data(), h.payload_len); };
  auto reject = [&](DropReason r) { return drop(crc_later && !crc_ok() ? DropReason::kBadCrc : r); };
  // With a cluster key nothing passes without a tag that verifies; and a
  // tagged frame at a node without the key means the cluster is configured in two ways. The
  // tag authenticates header and payload as one run of bytes: they must lie together.
  if (tagged_version(p[2]) != (ctx.key != nullptr)) return reject(DropReason::kBadAuth);
  if (ctx.key != nullptr && (tail.data() != p + hlen_of(p) || (!integrity_checked && !tag_verifies(p, h.payload_len, *ctx.key))))
    return drop(DropReason::kBadAuth);
  if (h.src != src_rank || h.dst != ctx.my_rank) return reject(DropReason::kRankMismatch);
  out.src_rank = src_rank;
  out.payload = tail.first(h.payload_len);

  if (h.type == FrameType::kData) {
    if (DropReason r = check_data(out, p, crc_later, ctx); r != DropReason::kOk) return reject(r);
  } else if (DropReason r = check_control(h, out.payload); r != DropReason::kOk) {
    return drop(r);
  }
  return out;
}

}  // namespace aapc::engine

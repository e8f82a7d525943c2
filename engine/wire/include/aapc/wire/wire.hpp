// The wire format (docs/design.md, "The wire"): an Ethernet frame of EtherType 0x88B5 (IEEE local
// experimental, configurable) carrying one of two headers and a payload. Multi-byte fields
// are big-endian. Both headers begin alike (bytes 0..23), and both end with their CRC.
//
// Every frame but DATA: the control header, 44 bytes.
//   offset size field
//    0     2   magic 0xAA9C
//    2     1   version: 5, or 6 for a frame authenticated with the cluster key (below).
//               Versions 1 and 2 had no payload in READY, SYNC and ACK (the exchange
//               descriptor), 3 and 4 a 44-byte DATA header; their
//               frames are dropped as bad_version
//    3     1   type: DATA, SYNC, READY, NACK, ACK, ABORT, POLL, PING, JOIN
//    4     1   flags: RETRANSMIT, DUMMY, LAST, ACK_LIST (an ACK whose payload lists AckEntry)
//    5     1   header length: 44, or 30 for DATA
//    6     2   phase (of DATA, for traces; 0xFFFF when none)
//    8     4   exchange id
//   12     4   epoch of the sender
//   16     2   source rank
//   18     2   destination rank
//   20     4   seq: DATA frame index; SYNC/ACK-of-SYNC sync id; NACK number of ranges;
//               JOIN the proposed next exchange id
//   24     8   block length in bytes (POLL, NACK, ACK of a block; READY: the block the
//               sender of READY expects from the receiver); JOIN: the sender's join round
//   32     2   payload length
//   34     2   chunk: payload bytes of every full DATA frame of a block
//   36     4   aux: for ACK, the type acknowledged; for ABORT, a reason code
//   40     4   CRC32C of header bytes 0..39, then the payload (this field itself skipped)
//   44     n   payload (payload length bytes): NACK ranges, ABORT reason; for READY and SYNC
//               the sender's exchange descriptor (descriptor.hpp), for their ACKs the
//               receiver's once its exchange has started (else none); for ACK_LIST ACKs the
//               acknowledgements gathered, 20 bytes each
//
// DATA: the data header, 30 bytes (only what every frame needs; 14 more
// payload bytes a frame, 1,470 instead of 1,456 at MTU 1500).
//    0..23     as above (phase, exchange, epoch, ranks, seq = the frame's index)
//   24     2   payload length
//   26     4   CRC32C of header bytes 0..25, then the payload
//   30     n   payload: the block's bytes from seq x chunk on
// A DATA frame carries neither its block's length nor the chunk: the receiver checks it
// against the block it posted, cut in its own chunk (every node of a cluster has the same MTU
// and key, hence the same chunk). The last frame of a block's first pass (LAST without
// RETRANSMIT) tells the sender's block length all the same, seq x chunk + payload length,
// and so does every POLL: a block of another length than the posted one is named from both.
//
// Versions 6 and 7 only, after the payload of either header: 24 bytes, the tag: 8 bytes of
// frame counter, then the 16-byte MAC of the header and the payload, authenticated as
// associated data with no message; nonce: source rank (2 bytes), epoch (4), low 48 bits of the
// counter. Version 6: ChaCha20-Poly1305 IETF (libsodium) under the 32-byte cluster key.
// Version 7: AES-256-GCM (libsodium, on CPUs with AES-NI and PCLMUL: its GHASH is what a CPU
// accelerates, 1.8x ChaCha20-Poly1305's speed on the development VM) under a key derived from
// the cluster key (keyed BLAKE2b of a fixed label), so that one key never serves two ciphers.
// A sender seals with its key's cipher (aapcd --cipher); a receiver with the key checks both,
// so a cluster may mix them as long as every node can compute AES-256-GCM.
//
// Authentication: CRC32C guards against noise, not against crafted
// frames. With a cluster key every frame is version 6 (kVersionAuth) and carries the tag; the frame's chunk
// is 24 bytes smaller so that it still fits the MTU. Every sender numbers its frames, so that
// no nonce repeats under one key (ranks differ; a restart has a later epoch): a repeated
// nonce would give the one-time Poly1305 key away. (A keyed BLAKE2b tag needs no nonce but
// ran at 3 Gbit/s on the development VM against 22 for ChaCha20-Poly1305.) A node with a key drops untagged
// frames and frames whose tag does not verify (kBadAuth); a node without one drops tagged
// frames (kBadAuth too): mixed clusters fail loudly, never silently. The tag does not stop
// a replay: that is the job of the exchange ids and epochs, which the tag now protects.
//
// parse() is the only way in: it checks everything, including DATA offsets against the
// block the receiver posted, before a single byte is written anywhere, but for one pass: the
// payload of a DATA frame that passed every other check is copied into its place in the
// posted block, a place that no frame has filled yet, while its CRC is computed (the
// payload is read once; ParseContext::place_at). It does not depend on DPDK, so it can be
// fuzzed alone (the fuzz target places payloads too).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string_view>
#include <utility>
#include <vector>

#include "aapc/sched/frame.hpp"
#include "aapc/wire/crc.hpp"  // crc32c()

namespace aapc::engine {

using Rank = int;
using MacAddr = std::array<std::uint8_t, 6>;

inline constexpr std::uint16_t kDefaultEtherType = 0x88B5;
inline constexpr std::uint16_t kMagic = 0xAA9C;
inline constexpr std::uint8_t kVersion = 5;
inline constexpr std::uint8_t kVersionAuth = 6;     // a ChaCha20-Poly1305 tag follows the payload
inline constexpr std::uint8_t kVersionAuthGcm = 7;  // an AES-256-GCM tag follows the payload
inline constexpr bool tagged_version(std::uint8_t version) { return version == kVersionAuth || version == kVersionAuthGcm; }
inline constexpr std::size_t kTagLen = sched::kFrameTagBytes;  // counter (8) + MAC (16)
inline constexpr std::size_t kKeyLen = 32;
// The lengths are defined in aapc/sched/frame.hpp, where the schedules count frames too.
inline constexpr std::size_t kEthHeaderLen = sched::kFrameEthHeaderBytes;
inline constexpr std::size_t kHeaderLen = sched::kFrameControlHeaderBytes;  // the control header: every frame but DATA
inline constexpr std::size_t kDataHeaderLen = sched::kFrameDataHeaderBytes;  // the data header
inline constexpr std::size_t kFrameOverhead = kEthHeaderLen + kHeaderLen;
inline constexpr std::size_t kDataFrameOverhead = kEthHeaderLen + kDataHeaderLen;
// How much longer a control header is than a data header: a control frame's payload is that
// much smaller than a DATA frame's chunk, to fit the same MTU.
inline constexpr std::size_t kControlExtra = kHeaderLen - kDataHeaderLen;
inline constexpr std::uint16_t kNoPhase = 0xFFFF;
inline constexpr std::size_t kMaxRanks = 0xFFFF;

enum class FrameType : std::uint8_t {
  kData = 1,
  kSync = 2,   // a sync token
  kReady = 3,  // the sender has posted its receive buffer for the exchange
  kNack = 4,   // payload: (first frame, count) ranges missing from a block
  kAck = 5,    // aux says what: a complete block, a sync token, a READY, a PING
  kAbort = 6,  // payload: reason text
  kPoll = 7,   // the sender of a block asks for its state (answered by ACK or NACK)
  kPing = 8,   // is the engine there (answered by ACK)
  kJoin = 9,   // seq: the id this engine proposes for the next exchange of a new session;
               // block length: the sender's join round (Engine::start_join); payload:
               // nothing, or what it measured of its tree exchanges (JoinMeasure)
};
inline constexpr int kFrameTypes = 10;
std::string_view frame_type_name(FrameType type);
// Our header's length for a frame of `type`, and with the Ethernet header before it.
inline constexpr std::size_t header_len(FrameType type) { return type == FrameType::kData ? kDataHeaderLen : kHeaderLen; }
inline constexpr std::size_t frame_overhead(FrameType type) { return kEthHeaderLen + header_len(type); }

enum Flags : std::uint8_t {
  kFlagRetransmit = 1,
  kFlagDummy = 2,  // Faraj/Yuan 'dummy' traffic: counted and dropped by the receiver
  // The last frame of a block's first transmission, or of a burst of retransmissions: the
  // receiver answers it at once, with a NACK of what is still missing or an ACK.
  kFlagLast = 4,
  // ACK: its payload is a list of acknowledgements (AckEntry), of eager blocks and tokens
  // whose senders do not wait for them: gathered for a while, one frame for many.
  kFlagAckList = 8,
};

// One acknowledgement in a kFlagAckList ACK: exchange (4), type acknowledged (1), 3 zero
// bytes, seq (4: the sync id of a token), block length (8: of a block).
struct AckEntry {
  std::uint32_t exchange = 0;
  FrameType type = FrameType::kData;
  std::uint32_t seq = 0;
  std::uint64_t block_len = 0;
};
inline constexpr std::size_t kAckEntryLen = 20;
void put_ack_entry(std::uint8_t* payload, std::size_t index, const AckEntry& e);
AckEntry ack_entry(std::span<const std::uint8_t> payload, std::size_t index);

// A JOIN's payload: what its sender measured of its exchanges (sched::Measured), which the
// session's ranks agree on. First the fraction of its pacing rate it sent a tree phase's block
// at, in millionths (1..1,000,000; 0: not measured), and the time each phase took beyond its
// blocks', in ns (two u32s). Then its last reaches of the schedules `auto` weighs, 7 bytes each:
// the exchange's id (u32), its cell (u8: sched::reach_cell, schedule x octave of block sizes;
// 0-23 below 32 KiB, 24-51 from 32 KiB to 4 MiB)
// and the fraction of the limit it reached as this rank saw it, in ten-thousandths (u16,
// 1..10,000). Every rank saw the same exchanges: the slowest rank's view of each is the
// exchange's (one that finished early, or waited on no lost frame, reads more), so the ranks
// agree, for each cell, on what its exchanges reach together, each at the lowest reach any rank saw
// (AgreedMeasure). Not sent where nothing is known.
inline constexpr std::size_t kJoinReachCells = 52;
struct ReachSample {
  std::uint32_t exchange = 0;
  std::uint8_t cell = 0;
  std::uint16_t reach = 0;
  friend bool operator==(const ReachSample&, const ReachSample&) = default;
};
struct JoinMeasure {
  std::uint32_t fill_ppm = 0;
  std::uint32_t hand_over_ns = 0;
  std::vector<ReachSample> reaches;
  bool known() const { return fill_ppm > 0 || !reaches.empty(); }
  std::size_t length() const;  // of its payload
  friend bool operator==(const JoinMeasure&, const JoinMeasure&) = default;
};
// What a session's join agreed on: the fit, and each cell's reach (0: none measured).
struct AgreedMeasure {
  std::uint32_t fill_ppm = 0;
  std::uint32_t hand_over_ns = 0;
  std::array<std::uint16_t, kJoinReachCells> reach{};
  friend bool operator==(const AgreedMeasure&, const AgreedMeasure&) = default;
};
inline constexpr std::size_t kJoinFitLen = 8;
inline constexpr std::size_t kReachSampleLen = 7;
inline constexpr std::uint32_t kJoinFillWhole = 1'000'000;
inline constexpr std::uint16_t kJoinReachWhole = 10'000;
void put_join_measure(std::uint8_t* payload, const JoinMeasure& m);  // m.length() bytes
// Nothing known unless the payload is one JoinMeasure (parse() drops a JOIN whose is not, or
// whose fractions are above the whole, or whose cells are not cells).
JoinMeasure join_measure(std::span<const std::uint8_t> payload);

// Why a frame was dropped. Everything that is not kOk is counted per reason.
enum class DropReason : std::uint8_t {
  kOk = 0,
  kRunt,             // shorter than the headers
  kEtherType,        // another protocol
  kNotForUs,         // destination MAC is not ours
  kUnknownSource,    // source MAC is not in the cluster
  kBadMagic,
  kBadVersion,
  kBadType,
  kBadLength,        // header/payload lengths inconsistent with the frame or the block
  kBadCrc,
  kRankMismatch,     // source rank is not the rank of the source MAC, or not for our rank
  kNotLive,          // exchange id not live here (finished, forgotten or never started)
  kStaleEpoch,       // from an earlier incarnation of the sender
  kUnexpectedBlock,  // DATA for a block this node did not post, or of another length
  kBadOffset,        // frame index / chunk / payload length do not fit the posted block
  kDuplicate,        // DATA already received
  kDummy,            // dummy traffic
  // An epoch later than the receiver's clock allows (now + a bounded
  // skew). A forged frame with a far-future epoch would otherwise make every real frame of
  // the sender look stale until the receiver restarts.
  kFutureEpoch,
  // With a cluster key, a frame without a tag or whose tag does not
  // verify; without one, a frame that carries a tag (the sender has a key).
  kBadAuth,
  // A frame for an exchange from a rank that is not one of its members (ExchangeSpec::members):
  // another group's, which may use the same id on other machines, or a forgery.
  kNotMember,
  // Without a cluster key: a later epoch of its sender that the machine at the sender's MAC has
  // not confirmed yet (Engine::restart_confirmed). One forged frame must not make every real
  // frame of a peer stale.
  kUnconfirmedEpoch,
  kCount
};
inline constexpr int kDropReasons = static_cast<int>(DropReason::kCount);
std::string_view drop_reason_name(DropReason reason);

struct Header {
  FrameType type = FrameType::kData;
  std::uint8_t flags = 0;
  std::uint16_t phase = kNoPhase;
  std::uint32_t exchange = 0;
  std::uint32_t epoch = 0;
  std::uint16_t src = 0;
  std::uint16_t dst = 0;
  std::uint32_t seq = 0;
  // Not on the wire in DATA frames: encode() leaves them out there, and parse() gives a DATA
  // frame's block_len only where the frame tells it (wire format above), else 0.
  std::uint64_t block_len = 0;
  std::uint16_t payload_len = 0;
  std::uint16_t chunk = 0;
  std::uint32_t aux = 0;
};

// The frames of a block of `len` bytes cut in `chunk`-byte pieces.
inline std::uint32_t frame_count(std::uint64_t len, std::uint32_t chunk) {
  return len == 0 ? 0 : static_cast<std::uint32_t>((len + chunk - 1) / chunk);
}
inline std::uint32_t frame_payload(std::uint64_t len, std::uint32_t chunk, std::uint32_t index) {
  std::uint64_t start = static_cast<std::uint64_t>(index) * chunk;
  return static_cast<std::uint32_t>(len - start < chunk ? len - start : chunk);
}

// The AEADs a frame's tag may be computed with (versions 6 and 7 above).
enum class Cipher : std::uint8_t { kChaCha20Poly1305, kAes256Gcm };
std::string_view cipher_name(Cipher cipher);  // "chacha20-poly1305", "aes-256-gcm"
std::optional<Cipher> parse_cipher(std::string_view name);
// Whether this CPU computes AES-256-GCM (AES-NI and PCLMUL): without them it cannot seal nor
// check version 7 frames.
bool aes_gcm_available();
// The faster cipher this CPU has: AES-256-GCM where available, ChaCha20-Poly1305 otherwise.
Cipher fastest_cipher();

// The cluster key shared by every node (auth.hpp loads it from a file), and the cipher this
// node seals with (it checks both).
struct FrameKey {
  std::array<std::uint8_t, kKeyLen> bytes{};
  Cipher cipher = Cipher::kChaCha20Poly1305;
};

// Writes Ethernet header + our header (CRC left zero) into `out` (at least
// frame_overhead(h.type) bytes), and returns that length. The payload goes right after; then
// call seal().
std::size_t encode(std::uint8_t* out, const MacAddr& dst_mac, const MacAddr& src_mac, std::uint16_t ethertype, const Header& h);
// Computes the CRC over header and the payload that follows it, and stores it. With a key, the
// frame becomes kVersionAuth and the tag is written after the payload: the frame needs
// frame_overhead(type) + payload + kTagLen bytes, and `counter` must differ for every frame
// that this sender (rank and epoch) seals with the key.
void seal(std::uint8_t* frame, const FrameKey* key = nullptr, std::uint64_t counter = 0);
// Copies `len` payload bytes after the header while computing the CRC, then seals: one pass
// over the data instead of two (plus one for the tag, with a key).
void copy_and_seal(std::uint8_t* frame, const std::uint8_t* payload, std::size_t len, const FrameKey* key = nullptr,
                   std::uint64_t counter = 0);
// seal() for a frame whose `len` payload bytes are not after its header but in a segment of
// their own (sent without a copy): the CRC covers the header and `payload`, which
// is only read. No cluster key: its tag would have to follow the payload.
void seal_apart(std::uint8_t* frame, const std::uint8_t* payload, std::size_t len);
// seal() in two steps, for a frame sealed on another thread (an I/O lcore):
// seal_later() marks the frame (its version, and `counter` in the tag's place) where seal()
// would seal it; seal_marked() then seals it with the same key.
void seal_later(std::uint8_t* frame, const FrameKey* key, std::uint64_t counter);
void seal_marked(std::uint8_t* frame, const FrameKey* key);
// Bytes a frame takes after the Ethernet and our header: its payload, and the tag with a key.
inline std::size_t frame_tail(std::size_t payload, const FrameKey* key) { return payload + (key != nullptr ? kTagLen : 0); }

// What the receiver knows, to validate a frame completely.
class ParseContext {
 public:
  virtual ~ParseContext() = default;
  std::uint16_t ethertype = kDefaultEtherType;
  MacAddr my_mac{};
  Rank my_rank = 0;
  // The cluster key: when set, only tagged frames whose tag verifies pass; when not,
  // tagged frames are dropped (kBadAuth). Not owned.
  const FrameKey* key = nullptr;
  // Rank of a source MAC, or -1.
  virtual Rank rank_of(const MacAddr& mac) const = 0;
  // For DATA: the block this node posted for (exchange, src) and the epoch it accepts.
  struct Expected {
    DropReason status = DropReason::kNotLive;  // kOk when the block exists
    std::uint64_t block_len = 0;
    std::uint32_t chunk = 0;  // this node's: the sender's is the same (wire format above)
    // The exchange has not started here, and its eager frames are kept for its
    // start: the frame is checked against the chunk only here, and against the posted block
    // when the exchange starts (data_fits).
    bool early = false;
    // The block's receive area is larger than the caches would keep, and payloads are
    // written around them (EngineConfig::stream_bytes).
    bool stream = false;
  };
  virtual Expected expect_data(std::uint32_t exchange, std::uint32_t epoch, Rank src) const = 0;
  // For a DATA frame that passed every other check: where its payload goes (frame `seq` of
  // the block posted for (exchange, src)) when that frame is not in yet, else nullptr. parse()
  // then copies the payload there while it computes the CRC, one pass instead of two
  // (Parsed::placed). A frame whose CRC then fails leaves its bytes in a place that no frame
  // has filled yet, and the frame that fills it overwrites them.
  virtual std::uint8_t* place_at(std::uint32_t /*exchange*/, Rank /*src*/, std::uint32_t /*seq*/) const { return nullptr; }
};

struct Parsed {
  DropReason reason = DropReason::kOk;
  Header h;
  Rank src_rank = -1;
  std::span<const std::uint8_t> payload;
  std::uint64_t offset = 0;  // DATA: where the payload goes in the block
  bool placed = false;       // DATA: the payload is in its place already (ParseContext::place_at)
};

// Whether DATA frame `h` (its seq, payload length and flags) fits the block of `posted` bytes
// cut in `chunk`-byte frames: kOk, or kUnexpectedBlock. Sets h.block_len to the sender's
// block length where the frame tells it (the last frame of a first pass), else to 0.
DropReason data_fits(Header& h, std::uint64_t posted, std::uint32_t chunk);

// Validates a whole frame: Ethernet header, our header, lengths, CRC32C, the tag (ctx.key)
// and, for DATA, the offsets against the posted block (data_fits). Trailing bytes beyond the payload (Ethernet padding of
// short frames) are allowed.
Parsed parse(std::span<const std::uint8_t> frame, const ParseContext& ctx);
// The same for a frame in two pieces: `head` holds the Ethernet and our header (exactly, as
// frame_header_len() says), `tail` the payload (and tag) that follow them, wherever they are
// (a payload received as a segment of its own). With a cluster key, the tag
// verifies only when `tail` lies right after the header.
//
// `integrity_checked`: integrity_holds() said so of this frame with the same key (on an I/O
// lcore, nic/io_lcore.hpp); the CRC and the tag are not computed again, and a DATA payload is
// copied into place without them.
Parsed parse(std::span<const std::uint8_t> head, std::span<const std::uint8_t> tail, const ParseContext& ctx, bool integrity_checked = false);
// Whether a frame (as parse() takes it) is one of ours whose header fields and lengths make
// sense and whose CRC32C holds, and with `key`, whose tag verifies; without a key, a tagged
// frame is not. The part of parse() that reads every byte and needs no state: it may run on
// another thread.
bool integrity_holds(std::span<const std::uint8_t> head, std::span<const std::uint8_t> tail, const FrameKey* key);
// How many of a frame's first bytes are its Ethernet and our header, as its header-length
// byte says: kEthHeaderLen + 30 or + 44, or 0 when the frame is too short to say or says
// something else (parse() then names why).
std::size_t frame_header_len(std::span<const std::uint8_t> frame);

// Reads the header of a frame of ours without the receiver's context (for traces and tools):
// checks EtherType, magic, version, lengths and CRC; nullopt when any fails. The tag of a
// tagged frame is not verified (no key here).
std::optional<Header> peek(std::span<const std::uint8_t> frame, std::uint16_t ethertype = kDefaultEtherType);

// For traces: the header of a captured frame of ours that the capture's snap length may have
// cut short (`wire_len` is its length on the wire). Magic, version, type and lengths are always
// checked; the CRC only when the whole frame was captured (`crc_checked`). `reason` is kOk,
// or why the frame is not sound (kEtherType for another protocol).
struct Captured {
  DropReason reason = DropReason::kOk;
  Header h;
  bool crc_checked = false;
};
Captured peek_captured(std::span<const std::uint8_t> captured, std::size_t wire_len, std::uint16_t ethertype = kDefaultEtherType);

// NACK payload: range `index` = (first missing frame, number of frames).
void put_nack_range(std::uint8_t* payload, std::uint32_t index, std::uint32_t first, std::uint32_t count);
std::pair<std::uint32_t, std::uint32_t> nack_range(std::span<const std::uint8_t> payload, std::uint32_t index);

}  // namespace aapc::engine

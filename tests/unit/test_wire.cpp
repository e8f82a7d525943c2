// The wire format: encode/parse round trips and every validation, without DPDK.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstring>
#include <vector>

#include "../fuzz/fuzz_context.hpp"
#include "aapc/wire/crc.hpp"
#include "aapc/wire/descriptor.hpp"
#include "aapc/wire/wire.hpp"

using namespace aapc;
using namespace aapc::engine;

namespace {

std::vector<std::uint8_t> make(Header h, std::size_t payload, int src = 0, std::uint8_t fill = 0x33) {
  std::vector<std::uint8_t> f(frame_overhead(h.type) + payload);
  h.src = static_cast<std::uint16_t>(src);
  h.dst = 1;
  h.payload_len = static_cast<std::uint16_t>(payload);
  encode(f.data(), fuzz::mac(1), fuzz::mac(src), kDefaultEtherType, h);
  std::vector<std::uint8_t> body(payload, fill);
  copy_and_seal(f.data(), body.data(), payload);
  return f;
}

Header data_header(std::uint32_t seq = 0) {
  Header h;
  h.type = FrameType::kData;
  h.exchange = fuzz::kExchange;
  h.epoch = 5;
  h.seq = seq;
  h.phase = 3;
  return h;
}

DropReason reason(const std::vector<std::uint8_t>& f) {
  static const fuzz::Context ctx;
  return parse(f, ctx).reason;
}

}  // namespace

TEST_CASE("CRC32C of the standard check string") {
  const char* s = "123456789";
  CHECK(crc32c(0, s, 9) == 0xE3069283U);
  // Incremental use gives the same result.
  CHECK(crc32c(crc32c(0, s, 4), s + 4, 5) == 0xE3069283U);
}

// Every way this CPU computes the CRC (crc.cpp: a table; three lanes of the crc32 instruction;
// carry-less folding, 256 bytes a round): the same CRC as a bit at a time, at every length up
// to 1,100 bytes and around the lanes' and rounds' sizes, from every starting value and
// alignment, and a copy of exactly the bytes asked for.
TEST_CASE("CRC32C of long runs, by every path, equals the bitwise CRC; copy_and_seal copies exactly") {
  auto bitwise = [](std::uint32_t crc, const std::uint8_t* p, std::size_t len) {
    crc = ~crc;
    for (std::size_t i = 0; i < len; ++i) {
      crc ^= p[i];
      for (int k = 0; k < 8; ++k) crc = (crc & 1) != 0 ? (crc >> 1) ^ 0x82F63B78U : crc >> 1;
    }
    return ~crc;
  };
  std::vector<std::uint8_t> data(3 * 512 * 3 + 3 * 64 * 2 + 100);
  for (std::size_t i = 0; i < data.size(); ++i) data[i] = static_cast<std::uint8_t>(i * 2654435761U >> 11);
  std::vector<std::size_t> lengths;
  for (std::size_t len = 0; len <= 1100; ++len) lengths.push_back(len);
  for (std::size_t len : {1456, 1470, 1535, 1536, 1537, 3000, 8970, 8971}) lengths.push_back(len);
  lengths.push_back(data.size() - 3);
  INFO("CPU paths: " << crc32c_paths().size());
  for (const auto& path : crc32c_paths()) {
    for (std::size_t len : lengths) {
      if (len + 3 > data.size()) continue;
      for (std::size_t off : {std::size_t{0}, std::size_t{1}, std::size_t{3}}) {
        const std::uint8_t* p = data.data() + off;
        const std::uint32_t want0 = bitwise(0, p, len), want1 = bitwise(0x12345678U, p, len);
        std::vector<std::uint8_t> out(len + 2 + off, 0xA5);
        const std::uint32_t copied = path.copy(0x12345678U, out.data() + 1 + off, p, len);
        const bool ok = path.crc(0, p, len) == want0 && path.crc(0x12345678U, p, len) == want1 && copied == want1 &&
                        std::equal(p, p + len, out.begin() + 1 + static_cast<std::ptrdiff_t>(off)) && out[off] == 0xA5 &&
                        out[len + 1 + off] == 0xA5;
        if (!ok) {  // one CHECK a failure, not ten thousand passes
          INFO(path.name << ": length " << len << " at offset " << off);
          CHECK(path.crc(0, p, len) == want0);
          CHECK(path.crc(0x12345678U, p, len) == want1);
          CHECK(copied == want1);
          CHECK(std::equal(p, p + len, out.begin() + 1 + static_cast<std::ptrdiff_t>(off)));
          CHECK(out[off] == 0xA5);
          CHECK(out[len + 1 + off] == 0xA5);
        }
      }
    }
    // The functions everyone calls take the path chosen, and the fastest again after.
    use_crc32c_path(&path);
    CHECK(crc32c(0, data.data(), 1470) == bitwise(0, data.data(), 1470));
    use_crc32c_path(nullptr);
  }
  CHECK(crc32c_paths().front().name == "table");
#if defined(__x86_64__)
  if (__builtin_cpu_supports("avx512f") != 0 && __builtin_cpu_supports("vpclmulqdq") != 0 && __builtin_cpu_supports("sse4.2") != 0)
    CHECK(crc32c_paths().back().name == "avx512 vpclmulqdq");
#endif
  // copy_and_seal (copy and CRC in one pass) seals the frame as copying and then seal() does.
  for (std::size_t len : {std::size_t{1}, std::size_t{700}, std::size_t{1456}, std::size_t{1537}, std::size_t{4000}}) {
    Header h;
    h.payload_len = static_cast<std::uint16_t>(len);
    std::vector<std::uint8_t> a(kDataFrameOverhead + len), b(kDataFrameOverhead + len);
    encode(a.data(), MacAddr{2, 0, 0, 0, 0, 1}, MacAddr{2, 0, 0, 0, 0, 2}, kDefaultEtherType, h);
    std::copy(a.begin(), a.begin() + kDataFrameOverhead, b.begin());
    std::memcpy(a.data() + kDataFrameOverhead, data.data() + 5, len);
    seal(a.data());
    copy_and_seal(b.data(), data.data() + 5, len);
    CHECK(a == b);
  }
}

// Copies through a block run in pieces, the block's next lines fetched after each (crc.cpp,
// in_pieces): by every path and with either side fetched ahead, the same CRC and the same
// bytes as one pass, over lengths that end inside, at and past the pieces, and nothing
// written outside the destination.
TEST_CASE("copies that fetch the block ahead run in pieces with the CRC and bytes of one pass") {
  std::vector<std::uint8_t> data(20'011);
  for (std::size_t i = 0; i < data.size(); ++i) data[i] = static_cast<std::uint8_t>(i * 40503U >> 5);
  const std::size_t lengths[] = {0, 1, 63, 64, 1470, 1535, 1536, 1537, 3071, 3072, 3073, 4608, 8970, 9001, 20'000};
  for (const auto& path : crc32c_paths()) {
    use_crc32c_path(&path);
    for (std::size_t len : lengths) {
      const std::uint8_t* src = data.data() + 7;
      const std::uint32_t want = crc32c(0x9E3779B9U, src, len);
      for (Ahead ahead : {Ahead::kNone, Ahead::kSource, Ahead::kDestination, Ahead::kStream}) {
        INFO(path.name << ": length " << len << ", ahead " << static_cast<int>(ahead));
        std::vector<std::uint8_t> out(len + 2, 0x5A), plain(len + 2, 0x5A);
        CHECK(crc32c_copy(0x9E3779B9U, out.data() + 1, src, len, ahead) == want);
        copy_ahead(plain.data() + 1, src, len, ahead);
        stream_fence();
        CHECK(std::equal(src, src + len, out.begin() + 1));
        CHECK(std::equal(src, src + len, plain.begin() + 1));
        CHECK((out.front() == 0x5A && out.back() == 0x5A && plain.front() == 0x5A && plain.back() == 0x5A));
      }
      CHECK(crc32c_ahead(0x9E3779B9U, src, len) == want);
    }
  }
  use_crc32c_path(nullptr);
}

// Payloads streamed into a block (non-temporal stores, Ahead::kStream) go in aligned
// 64-byte lines, with cached stores before the destination's first line boundary and after its
// last; the copy must be exact at every alignment of the destination, by every path.
TEST_CASE("copies streamed around the caches are exact at every alignment of the destination") {
  std::vector<std::uint8_t> data(9100);
  for (std::size_t i = 0; i < data.size(); ++i) data[i] = static_cast<std::uint8_t>(i * 2654435761U >> 11);
  const std::size_t lengths[] = {1, 15, 16, 17, 63, 64, 65, 127, 128, 129, 191, 256, 320, 1456, 4096, 8956};
  for (const auto& path : crc32c_paths()) {
    use_crc32c_path(&path);
    for (std::size_t len : lengths)
      for (std::size_t align = 0; align < 64; align += (len > 1000 ? 7 : 1)) {
        INFO(path.name << ": length " << len << ", destination 64k+" << align);
        const std::uint8_t* src = data.data() + 3;
        // 64-byte aligned storage, the destination `align` bytes in, a guard band either side.
        std::vector<std::uint8_t> out_store(len + 256, 0xA5), plain_store(len + 256, 0xA5);
        auto aligned = [&](std::vector<std::uint8_t>& v) {
          return v.data() + ((64 - reinterpret_cast<std::uintptr_t>(v.data()) % 64) % 64) + 64 + align;
        };
        std::uint8_t* out = aligned(out_store);
        std::uint8_t* plain = aligned(plain_store);
        CHECK(crc32c_copy(0x1234567U, out, src, len, Ahead::kStream) == crc32c(0x1234567U, src, len));
        copy_ahead(plain, src, len, Ahead::kStream);
        stream_fence();
        CHECK(std::equal(src, src + len, out));
        CHECK(std::equal(src, src + len, plain));
        auto untouched = [&](const std::vector<std::uint8_t>& v, const std::uint8_t* at) {
          const auto first = static_cast<std::size_t>(at - v.data());
          return std::all_of(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(first), [](std::uint8_t b) { return b == 0xA5; }) &&
                 std::all_of(v.begin() + static_cast<std::ptrdiff_t>(first + len), v.end(), [](std::uint8_t b) { return b == 0xA5; });
        };
        CHECK(untouched(out_store, out));
        CHECK(untouched(plain_store, plain));
      }
  }
  use_crc32c_path(nullptr);
}

TEST_CASE("a DATA frame round-trips through encode and parse") {
  static const fuzz::Context ctx;
  auto f = make(data_header(2), fuzz::kChunk);
  Parsed p = parse(f, ctx);
  REQUIRE(p.reason == DropReason::kOk);
  CHECK(p.h.type == FrameType::kData);
  CHECK(p.h.exchange == fuzz::kExchange);
  CHECK(p.h.epoch == 5);
  CHECK(p.h.phase == 3);
  CHECK(p.h.seq == 2);
  CHECK(p.offset == 2ULL * fuzz::kChunk);
  CHECK(p.payload.size() == fuzz::kChunk);
  CHECK(p.src_rank == 0);
  auto peeked = peek(f);
  REQUIRE(peeked);
  CHECK(peeked->seq == 2);
  // copy_and_seal and seal agree.
  auto g = f;
  seal(g.data());
  CHECK(g == f);
}

TEST_CASE("every malformed frame is dropped for its own reason") {
  CHECK(reason(std::vector<std::uint8_t>(10, 0)) == DropReason::kRunt);
  auto f = make(data_header(), fuzz::kChunk);
  auto g = f;
  g[12] = 0x08;
  g[13] = 0x00;  // IPv4
  CHECK(reason(g) == DropReason::kEtherType);
  g = f;
  g.resize(40);
  CHECK(reason(g) == DropReason::kRunt);
  g = f;
  g[5] = 9;  // destination MAC: someone else
  CHECK(reason(g) == DropReason::kNotForUs);
  g = f;
  g[11] = 0x77;  // source MAC: nobody we know
  CHECK(reason(g) == DropReason::kUnknownSource);
  g = f;
  g[kEthHeaderLen] ^= 0xFF;
  CHECK(reason(g) == DropReason::kBadMagic);
  g = f;
  g[kEthHeaderLen + 2] = 9;
  CHECK(reason(g) == DropReason::kBadVersion);
  g = f;
  g[kEthHeaderLen + 3] = 0x40;
  CHECK(reason(g) == DropReason::kBadType);
  g = f;
  g[kEthHeaderLen + 100] ^= 1;  // a payload bit
  CHECK(reason(g) == DropReason::kBadCrc);
  g = f;
  g.pop_back();  // truncated payload
  CHECK(reason(g) == DropReason::kBadLength);
  // Rank fields that disagree with the MACs (CRC intact).
  Header h = data_header();
  auto r = make(h, fuzz::kChunk, 0);
  r[kEthHeaderLen + 17] = 2;  // claims source rank 2 from rank 0's MAC
  seal(r.data());
  CHECK(reason(r) == DropReason::kRankMismatch);
  // Against the posted block (a DATA frame does not carry its block's
  // length; a frame that does not fit the posted block is of another block).
  h = data_header();
  h.exchange = 99;
  CHECK(reason(make(h, fuzz::kChunk)) == DropReason::kNotLive);
  CHECK(reason(make(data_header(), fuzz::kChunk, 2)) == DropReason::kUnexpectedBlock);  // rank 2 sends us nothing
  const std::uint32_t frames = frame_count(fuzz::kPostedBlock, fuzz::kChunk);
  CHECK(reason(make(data_header(frames), fuzz::kChunk)) == DropReason::kUnexpectedBlock);  // beyond the block
  CHECK(reason(make(data_header(1), fuzz::kChunk - 1)) == DropReason::kUnexpectedBlock);  // short, not the block's last
  CHECK(reason(make(data_header(frames - 1), fuzz::kChunk)) == DropReason::kUnexpectedBlock);  // the last, too long
  CHECK(reason(make(data_header(), fuzz::kChunk + 1)) == DropReason::kBadOffset);  // longer than any frame of ours
  h = data_header();
  h.chunk = 1000;      // not on the wire in DATA frames: no effect
  h.block_len = 5000;  // neither
  CHECK(reason(make(h, fuzz::kChunk)) == DropReason::kOk);
  h = data_header();
  h.flags = kFlagDummy;
  CHECK(reason(make(h, fuzz::kChunk)) == DropReason::kDummy);
  // Control frames carry no payload (but ABORT).
  Header s;
  s.type = FrameType::kSync;
  s.exchange = fuzz::kExchange;
  CHECK(reason(make(s, 0)) == DropReason::kOk);
  CHECK(reason(make(s, 4)) == DropReason::kBadLength);
  Header a;
  a.type = FrameType::kAck;
  CHECK(reason(make(a, 0)) == DropReason::kBadLength);  // aux must name what is acknowledged
  a.aux = static_cast<std::uint32_t>(FrameType::kSync);
  CHECK(reason(make(a, 0)) == DropReason::kOk);
}

// DATA frames carry only what every frame needs, in 30 bytes; the others
// keep the 44-byte control header. At MTU 1500 a frame carries 1,470 payload bytes, not 1,456.
TEST_CASE("DATA frames have a 30-byte header, control frames a 44-byte one") {
  static const fuzz::Context ctx;
  Header d = data_header(4);
  d.flags = kFlagRetransmit;
  std::vector<std::uint8_t> f(kDataFrameOverhead + 10);
  CHECK(encode(f.data(), fuzz::mac(1), fuzz::mac(0), kDefaultEtherType, d) == kDataFrameOverhead);
  CHECK(f[kEthHeaderLen + 5] == kDataHeaderLen);
  CHECK(frame_header_len(f) == 44);
  CHECK(fuzz::kChunk == 1470);
  // A whole frame of payload fits an MTU of 1500 after the 30 bytes.
  auto full = make(data_header(2), fuzz::kChunk);
  CHECK(full.size() == kEthHeaderLen + 1500);
  Parsed p = parse(full, ctx);
  REQUIRE(p.reason == DropReason::kOk);
  CHECK(p.payload.data() == full.data() + kDataFrameOverhead);
  CHECK(p.h.block_len == 0);  // the frame does not tell its block's length
  // The same frame in two pieces: header, then payload elsewhere (as received without a copy).
  std::vector<std::uint8_t> payload(full.begin() + kDataFrameOverhead, full.end());
  Parsed q = parse(std::span(full).first(kDataFrameOverhead), payload, ctx);
  REQUIRE(q.reason == DropReason::kOk);
  CHECK(q.payload.data() == payload.data());
  // The last frame of a first pass tells the sender's block length: the posted one here...
  const std::uint32_t frames = frame_count(fuzz::kPostedBlock, fuzz::kChunk);
  Header last = data_header(frames - 1);
  last.flags = kFlagLast;
  Parsed l = parse(make(last, frame_payload(fuzz::kPostedBlock, fuzz::kChunk, frames - 1)), ctx);
  REQUIRE(l.reason == DropReason::kOk);
  CHECK(l.h.block_len == fuzz::kPostedBlock);
  // ...or a shorter one, which the frame names though it fits the posted block.
  last = data_header(2);
  last.flags = kFlagLast;
  l = parse(make(last, 100), ctx);
  CHECK(l.reason == DropReason::kUnexpectedBlock);
  CHECK(l.h.block_len == 2ULL * fuzz::kChunk + 100);
  last.flags = kFlagLast | kFlagRetransmit;  // the end of a burst of resent frames tells nothing
  l = parse(make(last, 100), ctx);
  CHECK(l.reason == DropReason::kUnexpectedBlock);
  CHECK(l.h.block_len == 0);
  last = data_header(2);
  last.flags = kFlagLast | kFlagRetransmit;
  CHECK(reason(make(last, fuzz::kChunk)) == DropReason::kOk);
  // A control frame keeps the long header: block length, chunk and aux.
  Header poll;
  poll.type = FrameType::kPoll;
  poll.exchange = fuzz::kExchange;
  poll.block_len = 123456789012ULL;
  poll.chunk = fuzz::kChunk;
  auto c = make(poll, 0);
  CHECK(c.size() == kFrameOverhead);
  CHECK(frame_header_len(c) == kFrameOverhead);
  Parsed pc = parse(c, ctx);
  REQUIRE(pc.reason == DropReason::kOk);
  CHECK(pc.h.block_len == 123456789012ULL);
  CHECK(pc.h.chunk == fuzz::kChunk);
  // A header length that does not go with the type.
  auto bad = full;
  bad[kEthHeaderLen + 5] = kHeaderLen;
  CHECK(reason(bad) == DropReason::kBadLength);
  bad = c;
  bad[kEthHeaderLen + 5] = kDataHeaderLen;
  CHECK(reason(bad) == DropReason::kBadLength);
  // A DATA header cut short.
  bad = full;
  bad.resize(kDataFrameOverhead - 1);
  CHECK(reason(bad) == DropReason::kRunt);
  bad = c;
  bad.resize(kFrameOverhead - 1);
  CHECK(reason(bad) == DropReason::kRunt);
}

// A DATA payload is read once on receive. parse() copies it where it goes while it
// computes the CRC; a frame whose CRC fails is dropped as such, whatever else is wrong with it.
TEST_CASE("parse places a DATA payload while it checks the CRC, and only a frame not in yet") {
  fuzz::Context ctx;
  ctx.placing = true;
  std::fill(ctx.block.begin(), ctx.block.end(), 0);
  auto f = make(data_header(3), fuzz::kChunk, 0, 0x77);
  Parsed p = parse(f, ctx);
  REQUIRE(p.reason == DropReason::kOk);
  CHECK(p.placed);
  const auto at = ctx.block.begin() + 3 * fuzz::kChunk;
  CHECK(std::all_of(at, at + fuzz::kChunk, [](std::uint8_t b) { return b == 0x77; }));
  CHECK(ctx.block[3 * fuzz::kChunk - 1] == 0);  // nothing before it
  CHECK(ctx.block[4 * fuzz::kChunk] == 0);      // nor after
  // A payload bit flipped: the copy is made, the CRC fails, the frame is dropped as bad_crc and
  // not placed (its bytes lie where no frame has been received).
  auto g = make(data_header(5), fuzz::kChunk, 0, 0x66);
  g[kDataFrameOverhead + 9] ^= 0x04;
  p = parse(g, ctx);
  CHECK(p.reason == DropReason::kBadCrc);
  CHECK_FALSE(p.placed);
  // A bad CRC is what a frame is dropped for, even when another check fails too.
  g = make(data_header(frame_count(fuzz::kPostedBlock, fuzz::kChunk)), fuzz::kChunk);  // beyond the block
  CHECK(reason(g) == DropReason::kUnexpectedBlock);
  g[kDataFrameOverhead] ^= 0x01;
  CHECK(parse(g, ctx).reason == DropReason::kBadCrc);
  g = make(data_header(), fuzz::kChunk, 0);
  g[kEthHeaderLen + 17] = 2;  // claims source rank 2 from rank 0's MAC, CRC not mended
  CHECK(parse(g, ctx).reason == DropReason::kBadCrc);
  // Where the context has no place for it (a frame in already), the CRC is checked alone.
  ctx.placing = false;
  p = parse(make(data_header(6), fuzz::kChunk, 0, 0x55), ctx);
  REQUIRE(p.reason == DropReason::kOk);
  CHECK_FALSE(p.placed);
  CHECK(ctx.block[6 * fuzz::kChunk] == 0);
  g = make(data_header(6), fuzz::kChunk, 0, 0x55);
  g.back() ^= 0x80;
  CHECK(parse(g, ctx).reason == DropReason::kBadCrc);
}

TEST_CASE("NACK ranges must lie within the block") {
  Header n;
  n.type = FrameType::kNack;
  n.exchange = fuzz::kExchange;
  n.block_len = 10 * 1456;
  n.chunk = 1456;
  n.seq = 2;
  std::vector<std::uint8_t> f(kFrameOverhead + 16);
  n.src = 0;
  n.dst = 1;
  n.payload_len = 16;
  encode(f.data(), fuzz::mac(1), fuzz::mac(0), kDefaultEtherType, n);
  put_nack_range(f.data() + kFrameOverhead, 0, 0, 3);
  put_nack_range(f.data() + kFrameOverhead, 1, 8, 2);
  seal(f.data());
  static const fuzz::Context ctx;
  Parsed p = parse(f, ctx);
  REQUIRE(p.reason == DropReason::kOk);
  CHECK(nack_range(p.payload, 1) == std::make_pair(8U, 2U));
  put_nack_range(f.data() + kFrameOverhead, 1, 8, 3);  // frames 8..10 of 10
  seal(f.data());
  CHECK(parse(f, ctx).reason == DropReason::kBadOffset);
}

TEST_CASE("frame arithmetic") {
  CHECK(frame_count(0, 1456) == 0);
  CHECK(frame_count(1, 1456) == 1);
  CHECK(frame_count(1456, 1456) == 1);
  CHECK(frame_count(1457, 1456) == 2);
  CHECK(frame_payload(1457, 1456, 1) == 1);
  CHECK(frame_payload(1457, 1456, 0) == 1456);
}

namespace {

// The ciphers this CPU can seal with: AES-256-GCM only where it has AES-NI and PCLMUL.
std::vector<Cipher> ciphers_here() {
  std::vector<Cipher> out = {Cipher::kChaCha20Poly1305};
  if (aes_gcm_available()) out.push_back(Cipher::kAes256Gcm);
  return out;
}

}  // namespace

TEST_CASE("a tagged frame passes only with the cluster key it was sealed with, by either cipher") {
  if (!aes_gcm_available()) WARN("this CPU has no AES-NI: only ChaCha20-Poly1305 is checked");
  for (Cipher cipher : ciphers_here()) {
  INFO("sealed with " << cipher_name(cipher));
  FrameKey key, other;
  key.bytes.fill(1);
  key.cipher = cipher;
  other.bytes.fill(2);
  other.cipher = cipher;
  // A node checks both ciphers with its key, whichever it seals with.
  FrameKey same = key;
  same.cipher = cipher == Cipher::kAes256Gcm ? Cipher::kChaCha20Poly1305 : Cipher::kAes256Gcm;
  fuzz::Context keyed, wrong, mixed;
  keyed.key = &key;
  wrong.key = &other;
  mixed.key = &same;
  static const fuzz::Context plain;
  Header h = data_header(1);
  h.src = 0;
  h.dst = 1;
  h.payload_len = fuzz::kChunk;
  std::vector<std::uint8_t> f(kDataFrameOverhead + frame_tail(fuzz::kChunk, &key));
  encode(f.data(), fuzz::mac(1), fuzz::mac(0), kDefaultEtherType, h);
  const std::vector<std::uint8_t> body(fuzz::kChunk, 0x44);
  copy_and_seal(f.data(), body.data(), body.size(), &key, 7);
  CHECK(f[kEthHeaderLen + 2] == (cipher == Cipher::kAes256Gcm ? kVersionAuthGcm : kVersionAuth));
  CHECK(parse(f, keyed).reason == DropReason::kOk);
  CHECK(parse(f, mixed).reason == DropReason::kOk);
  CHECK(parse(f, wrong).reason == DropReason::kBadAuth);
  CHECK(parse(f, plain).reason == DropReason::kBadAuth);  // the sender has a key, this node none
  CHECK(peek(f).has_value());                              // traces read it (unverified)
  auto g = f;
  seal(g.data(), &key, 7);
  CHECK(g == f);  // seal and copy_and_seal agree
  seal(g.data(), &key, 8);
  CHECK(g != f);  // another counter, another nonce
  CHECK(parse(g, keyed).reason == DropReason::kOk);
  // The version byte names the cipher: a frame relabelled to the other one fails.
  auto relabelled = f;
  relabelled[kEthHeaderLen + 2] = cipher == Cipher::kAes256Gcm ? kVersionAuth : kVersionAuthGcm;
  std::uint8_t* rp = relabelled.data() + kEthHeaderLen;
  const std::uint32_t rcrc = crc32c(crc32c(0, rp, 26), rp + kDataHeaderLen, fuzz::kChunk);
  for (int i = 0; i < 4; ++i) rp[26 + i] = static_cast<std::uint8_t>(rcrc >> (24 - 8 * i));
  if (aes_gcm_available()) CHECK(parse(relabelled, keyed).reason == DropReason::kBadAuth);
  // A forger changes a field, the payload, the counter or the MAC, and mends the CRC: the
  // tag catches every one.
  for (std::size_t at : {kEthHeaderLen + 8, kEthHeaderLen + 12, kEthHeaderLen + 16, kFrameOverhead + 100, f.size() - 20, f.size() - 1}) {
    INFO("byte " << at);
    auto x = f;
    x[at] ^= 0x01;
    std::uint8_t* p = x.data() + kEthHeaderLen;
    std::uint32_t crc = crc32c(crc32c(0, p, 26), p + kDataHeaderLen, fuzz::kChunk);
    for (int i = 0; i < 4; ++i) p[26 + i] = static_cast<std::uint8_t>(crc >> (24 - 8 * i));
    const DropReason r = parse(x, keyed).reason;
    CHECK((r == DropReason::kBadAuth || r == DropReason::kRankMismatch || r == DropReason::kUnknownSource));
    if (at != kEthHeaderLen + 16) CHECK(r == DropReason::kBadAuth);
  }
  // A frame without a tag, at a node with the key.
  CHECK(reason(make(data_header(1), fuzz::kChunk)) == DropReason::kOk);
  CHECK(parse(make(data_header(1), fuzz::kChunk), keyed).reason == DropReason::kBadAuth);
  }
}

TEST_CASE("ciphers are named as aapcd --cipher takes them") {
  for (Cipher c : {Cipher::kChaCha20Poly1305, Cipher::kAes256Gcm}) CHECK(parse_cipher(cipher_name(c)) == c);
  CHECK_FALSE(parse_cipher("aes-128-gcm"));
  CHECK(fastest_cipher() == (aes_gcm_available() ? Cipher::kAes256Gcm : Cipher::kChaCha20Poly1305));
}

TEST_CASE("exchange descriptors round-trip, READY, SYNC and ACK carry one or nothing, and JOIN one measure or nothing") {
  const Descriptor d{Collective::kAlltoall, 4096, "group-shuffle:3+receiver-partial:4"};
  auto bytes = encode_descriptor(d);
  CHECK(bytes.size() == kDescriptorFixed + d.plan.size());
  REQUIRE(descriptor_valid(bytes));
  CHECK(decode_descriptor(bytes) == d);
  // Cut to fit a small frame: the text is shortened, the hash still tells the plans apart.
  auto cut = encode_descriptor(d, 24);
  REQUIRE(cut.size() == 24);
  CHECK(decode_descriptor(cut)->plan == "group-");
  CHECK(same_descriptor(cut, bytes));
  CHECK_FALSE(same_descriptor(encode_descriptor({Collective::kAlltoall, 4096, "group-shuffle:3+receiver-partial:8"}, 24), bytes));
  CHECK_FALSE(same_descriptor(encode_descriptor({Collective::kAlltoall, 8192, d.plan}), bytes));
  CHECK_FALSE(same_descriptor(encode_descriptor({Collective::kAlltoallv, 4096, d.plan}), bytes));
  // Malformed: a text length that disagrees, a kind beyond barrier, too short.
  auto bad = bytes;
  bad[1] = static_cast<std::uint8_t>(bad[1] + 1);
  CHECK_FALSE(descriptor_valid(bad));
  bad = bytes;
  bad[0] = 4;
  CHECK_FALSE(descriptor_valid(bad));
  CHECK_FALSE(descriptor_valid(std::span(bytes).first(kDescriptorFixed - 1)));
  // The differences, told from this rank's side.
  const Descriptor ours{Collective::kAlltoall, 8192, "tree+sender-all"};
  CHECK(descriptor_difference({Collective::kAlltoall, 4096, "tree+sender-all"}, ours) == "called alltoall with 4096-byte blocks, this rank 8192-byte blocks");
  CHECK(descriptor_difference({Collective::kBarrier, 0, "barrier+none"}, ours) == "called barrier, this rank alltoall with 8192-byte blocks");
  CHECK(descriptor_difference({Collective::kAlltoall, 8192, "ring+none"}, ours) == "called alltoall with schedule ring+none, this rank tree+sender-all");
  CHECK(descriptor_difference({Collective::kAlltoall, 8192, "tree+sen"}, {Collective::kAlltoall, 8192, "tree+sender-partial:4"}) ==
        "called alltoall with schedule tree+sen..., this rank tree+sender-partial:4");

  // In frames: READY and SYNC with a descriptor or none, their ACKs likewise; nothing else.
  auto with = [&](FrameType type, std::span<const std::uint8_t> payload) {
    Header h;
    h.type = type;
    h.exchange = fuzz::kExchange;
    if (type == FrameType::kAck) h.aux = static_cast<std::uint32_t>(FrameType::kReady);
    std::vector<std::uint8_t> f(kFrameOverhead + payload.size());
    h.dst = 1;
    h.payload_len = static_cast<std::uint16_t>(payload.size());
    encode(f.data(), fuzz::mac(1), fuzz::mac(0), kDefaultEtherType, h);
    copy_and_seal(f.data(), payload.data(), payload.size());
    return f;
  };
  for (FrameType type : {FrameType::kReady, FrameType::kSync, FrameType::kAck}) {
    INFO(frame_type_name(type));
    CHECK(reason(with(type, bytes)) == DropReason::kOk);
    CHECK(reason(with(type, {})) == DropReason::kOk);
    CHECK(reason(with(type, bad)) == DropReason::kBadLength);
  }
  CHECK(reason(with(FrameType::kPoll, bytes)) == DropReason::kBadLength);
  CHECK(reason(with(FrameType::kPing, bytes)) == DropReason::kBadLength);
  // JOIN: nothing, or one measure (JoinMeasure) whose fractions are at most the whole and whose
  // cells are cells.
  JoinMeasure m{640'000, 278'000, {{17, 0, 1}, {18, 5, 7'190}, {19, kJoinReachCells - 1, kJoinReachWhole}}};
  std::vector<std::uint8_t> measure(m.length());
  CHECK(measure.size() == kJoinFitLen + 3 * kReachSampleLen);
  put_join_measure(measure.data(), m);
  CHECK(join_measure(measure) == m);
  CHECK(reason(with(FrameType::kJoin, {})) == DropReason::kOk);
  CHECK(reason(with(FrameType::kJoin, measure)) == DropReason::kOk);
  CHECK(reason(with(FrameType::kJoin, std::span(measure).first(kJoinFitLen))) == DropReason::kOk);  // a fit alone
  CHECK(reason(with(FrameType::kJoin, std::span(measure).first(kJoinFitLen + 3))) == DropReason::kBadLength);
  CHECK(reason(with(FrameType::kJoin, std::span(measure).first(4))) == DropReason::kBadLength);
  const JoinMeasure reach_only{0, 0, {{3, 3, 8'870}}};
  CHECK(reach_only.known());
  CHECK_FALSE(JoinMeasure{}.known());
  for (const JoinMeasure& wrong : {JoinMeasure{kJoinFillWhole + 1, 0, {}}, JoinMeasure{0, 0, {{1, 0, kJoinReachWhole + 1}}},
                                 JoinMeasure{0, 0, {{1, kJoinReachCells, 5'000}}}, JoinMeasure{0, 0, {{1, 2, 0}}}}) {
    std::vector<std::uint8_t> payload(wrong.length());
    put_join_measure(payload.data(), wrong);
    CHECK(reason(with(FrameType::kJoin, payload)) == DropReason::kBadLength);
    CHECK_FALSE(join_measure(payload).known());
  }
  // Frames of the versions before descriptors are refused as such.
  auto old = with(FrameType::kReady, {});
  old[kEthHeaderLen + 2] = 1;
  seal(old.data());
  CHECK(reason(old) == DropReason::kBadVersion);
}

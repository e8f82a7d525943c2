// The control protocol's bytes, pinned: external clients speak to aapcd over its socket
// (aapc/client.hpp and AAPC_SOCKET are stable interfaces), so every message encodes to exactly
// the bytes protocol version 2 has always sent, and its decoders accept and refuse exactly what
// they always did. The expected bytes and outcome digests below were captured from the
// encoders and decoders as first written, one function per message and direction. A message
// grows only by an optional last field that older clients never send (io.last: WAIT's bound);
// the digests of what its decoder now accepts (WAIT's and TEST's neighbours, the REGISTER
// sample's, whose type-byte neighbours include them, and the random payloads) were captured
// again with it, and the bytes of every message as sent before are unchanged.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "protocol_samples.hpp"

using namespace aapc;
using test::ProtocolSample;

namespace {

// FNV-1a, 64 bits: a digest of many outcomes, so that a test can pin thousands of them.
class Digest {
 public:
  void add(const std::string& s) {
    for (char c : s) mix(static_cast<std::uint8_t>(c));
    mix(0);
  }
  std::string text() const {
    char buf[17];
    std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(h_));
    return buf;
  }

 private:
  void mix(std::uint8_t b) {
    h_ ^= b;
    h_ *= 0x100000001b3ULL;
  }
  std::uint64_t h_ = 0xcbf29ce484222325ULL;
};

// The header's length made right again after a cut or an extension, so that the payload's
// checks are reached (messages have no checksum).
std::vector<std::uint8_t> resealed(std::vector<std::uint8_t> msg) {
  if (msg.size() < sizeof(proto::Header)) return msg;
  const auto length = static_cast<std::uint32_t>(msg.size() - sizeof(proto::Header));
  std::memcpy(msg.data() + offsetof(proto::Header, length), &length, sizeof length);
  return msg;
}

// The types of protocol version 2 when these bytes were pinned (up to GROUP_CLOSE). The sweeps
// below stay within them, so that a message added later leaves the others' digests as they are.
constexpr std::uint8_t kPinnedTypes = 20;

// What a sample's reader makes of its message's neighbours: every byte set to each of a few
// values, every pinned header type, every cut (resealed and as sent), and a few bytes more.
std::string neighbours(const ProtocolSample& s) {
  Digest d;
  const std::vector<std::uint8_t>& m = s.bytes;
  for (std::size_t at = 0; at < m.size(); ++at) {
    for (std::uint8_t v : {0x00, 0x01, 0x02, 0x03, 0x7f, 0x80, 0xfe, 0xff}) {
      if (m[at] == v) continue;
      auto x = m;
      x[at] = v;
      d.add(s.read(x));
    }
  }
  for (std::uint8_t type = 0; type <= kPinnedTypes; ++type) {
    auto x = m;
    x[offsetof(proto::Header, type)] = type;
    x[offsetof(proto::Header, type) + 1] = 0;
    d.add(s.read(x));
  }
  for (std::size_t cut = 0; cut < m.size(); ++cut) {
    const std::vector<std::uint8_t> x(m.begin(), m.begin() + static_cast<std::ptrdiff_t>(cut));
    d.add(s.read(x));
    d.add(s.read(resealed(x)));
  }
  for (std::uint8_t v : {0x00, 0x01, 0xff}) {
    for (std::size_t more : {1, 2, 4, 8}) {
      auto x = m;
      x.insert(x.end(), more, v);
      d.add(s.read(resealed(x)));
    }
  }
  return d.text();
}

struct Golden {
  const char* hex;
  const char* neighbours;  // digest of neighbours(); empty for the replies nobody decodes
};

// Captured from the encoders and decoders as first written (protocol version 2).
const std::map<std::string, Golden>& golden() {
  static const std::map<std::string, Golden> g = {
      {"hello", {"414150430200010004030201110000000d000000616170632d636c69656e742031", "1a113ee404a503c8"}},
      {"hello-job",
       {"4141504302000100040302012b0000000d000000616170632d636c69656e74203116000000706d69783a7072746572756e2d6e302d313233"
        "344031",
        "3ec513a73b1643ef"}},
      {"register", {"414150430200030004030201080000000807060504030201", "27c8fb0bb1015b97"}},
      {"free", {"41415043020005000403020104000000d0c0b0a0", "910f43b724ceee16"}},
      {"start-alltoall",
       {"41415043020006000403020128000000010f000000747265652b73656e6465722d616c6c0000000001000000020000000000010000000000",
        "40ed5f9b3ceea4c0"}},
      {"start-alltoallv",
       {"4141504302000600040302018a0000000215000000747265652b73656e6465722d7061727469616c3a34c409000003000000040000000300"
        "000000000000000000000a000000000000000a0000000000000000000000000000000a000000000000000700000000000000050000000000"
        "00000500000000000000000000000000000005000000000000000a000000000000000100000000000000",
        "5ed1ce1bf114332a"}},
      {"start-barrier", {"4141504302000600040302010d00000003040000006175746f00000000", "af2ac9726246b77e"}},
      {"start-group",
       {"4141504302000600040302018b0000000215000000747265652b73656e6465722d7061727469616c3a34c409000003000000040000000300"
        "000000000000000000000a000000000000000a0000000000000000000000000000000a000000000000000700000000000000050000000000"
        "00000500000000000000000000000000000005000000000000000a00000000000000010000000000000003",
        "ccb8446031f224e9"}},
      {"start-barrier-group", {"4141504302000600040302010e00000003040000006175746f00000000c8", "3a2290b6380396f5"}},
      {"run-alltoall",
       {"41415043020010000403020128000000010f000000747265652b73656e6465722d616c6c0000000001000000020000000000010000000000",
        "d4c0e81acff01bae"}},
      {"wait", {"4141504302000800040302010400000009000500", "525922a02834e50f"}},
      {"test", {"4141504302000900040302010400000009000500", "fb6f598d9ff842a1"}},
      {"status", {"4141504302000c000403020100000000", "258eb2cccdc3fe1c"}},
      {"group-query", {"41415043020011000403020100000000", "7da4576d2f76d7d2"}},
      {"group-open", {"4141504302001300040302011500000009d204000003000000030000000000000002000000", "79dc41be5b721341"}},
      {"group-close", {"414150430200140004030201020000000901", "638eba72ecf035a3"}},
      {"group-close-quiet", {"414150430200140004030201020000000900", "8f59c34fdc24781e"}},
      {"hello-reply",
       {"4141504302000200040302012e000000020000000800000063000000dc0500000000008093dcb441020000006d320c000000382d74776f2d"
        "737769746368",
        "30aa1726123d6c91"}},
      {"register-reply", {"4141504302000400040302010400000005000000", "9e55624ec072423b"}},
      {"started", {"4141504302000700040302011a0000000900050004000000747265650a00000073656e6465722d616c6c", "0287242e8d244958"}},
      {"done",
       {"4141504302000a0004030201770000001200050001000000000000000004000000747265650a00000073656e6465722d616c6c15cd5b0700"
        "0000000000100000000000000020000000000003000000000000000500000000000000faffffffffffffff02000000010000000000000002"
        "000000000000000300000000000000ffffffffffffff7f",
        "fb8381ed950456a0"}},
      {"done-failed",
       {"4141504302000a00040302016b0000001200050002030000001400000072616e6b2033207374617965642073696c656e7404000000747265"
        "650a00000073656e6465722d616c6c15cd5b07000000000000100000000000000020000000000003000000000000000500000000000000fa"
        "ffffffffffffff00000000",
        "db001a3047e59890"}},
      {"status-reply", {"4141504302000d00040302010f0000000b0000007b2272616e6b223a20307d", "eebdd4d79e7d54ef"}},
      {"error", {"4141504302000e000403020113000000010000000b0000006e6f206275666665722033", "7e7c12fcd7f2c608"}},
      {"group-query-reply",
       {"4141504302001200040302012004000001000000000055550100000000005555010000000000555500000000000000800700000007000000"
        "0700000007000000070000000700000007000000070000000700000007000000070000000700000007000000070000000700000007000000"
        "0700000007000000070000000700000007000000070000000700000007000000070000000700000007000000070000000700000007000000"
        "0700000007000000070000000700000007000000070000000700000007000000070000000700000007000000070000000700000007000000"
        "0700000007000000070000000700000007000000070000000700000007000000070000000700000007000000070000000700000007000000"
        "0700000007000000070000000700000007000000070000000700000007000000070000000700000007000000070000000700000007000000"
        "0700000007000000070000000700000007000000070000000700000007000000070000000700000007000000070000000700000007000000"
        "0700000007000000070000000700000007000000070000000700000007000000070000000700000007000000070000000700000007000000"
        "0700000007000000070000000700000007000000070000000700000007000000070000000700000007000000070000000700000007000000"
        "0700000007000000070000000700000007000000070000000700000007000000070000000700000007000000070000000700000007000000"
        "0700000007000000070000000700000007000000070000000700000007000000070000000700000007000000070000000700000007000000"
        "0700000007000000070000000700000007000000070000000700000007000000070000000700000007000000070000000700000007000000"
        "0700000007000000070000000700000007000000070000000700000007000000070000000700000007000000070000000700000007000000"
        "0700000007000000070000000700000007000000070000000700000007000000070000000700000007000000070000000700000007000000"
        "0700000007000000070000000700000007000000070000000700000007000000070000000700000007000000070000000700000007000000"
        "0700000007000000efcdab000700000007000000070000000700000007000000070000000700000007000000070000000700000007000000"
        "0700000007000000070000000700000007000000070000000700000007000000070000000700000007000000070000000700000007000000"
        "0700000007000000070000000700000007000000070000000700000007000000070000000700000007000000070000000700000007000000"
        "0700000007000000070000000700000007000000070000000700000007000000070000000700000007000000070000000700000007000000"
        "0700000007000000",
        "f2319fbd168bc14d"}},
      {"group-query-reply-short",
       {"4141504302001200040302012004000001000000000000000000000000000000000000000000000000000000000000000200000003000000"
        "0000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000"
        "0000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000"
        "0000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000"
        "0000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000"
        "0000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000"
        "0000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000"
        "0000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000"
        "0000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000"
        "0000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000"
        "0000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000"
        "0000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000"
        "0000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000"
        "0000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000"
        "0000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000"
        "0000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000"
        "0000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000"
        "0000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000"
        "0000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000"
        "0000000000000000",
        "a19f149b4185317e"}},
      {"ok", {"4141504302000f000403020100000000", ""}},
      {"running", {"4141504302000b000403020100000000", ""}},
  };
  return g;
}

}  // namespace

TEST_CASE("every control message encodes to the bytes protocol version 2 always sent") {
  const auto samples = test::protocol_samples();
  CHECK(samples.size() == golden().size());
  for (const ProtocolSample& s : samples) {
    INFO(s.name);
    const auto g = golden().find(s.name);
    REQUIRE(g != golden().end());
    CHECK(test::hex(s.bytes) == g->second.hex);
  }
}

TEST_CASE("the decoders accept and refuse a message's neighbours as they always did") {
  for (const ProtocolSample& s : test::protocol_samples()) {
    if (s.read == nullptr) continue;
    INFO(s.name);
    const auto g = golden().find(s.name);
    REQUIRE(g != golden().end());
    CHECK(s.read(s.bytes) == "ok " + test::hex(s.bytes));  // a message decodes to itself
    CHECK(neighbours(s) == g->second.neighbours);
  }
}

TEST_CASE("every cut of every message, and a byte too many, is refused with the request's error") {
  for (const ProtocolSample& s : test::protocol_samples()) {
    if (s.read == nullptr) continue;
    INFO(s.name);
    const bool request = !s.malformed.empty();
    const std::string not_ours = request ? "error not an aapc request" : "not ours";
    const std::string refused = request ? "error " + s.malformed : "refused";
    for (std::size_t cut = 0; cut < s.bytes.size(); ++cut) {
      INFO("cut at " << cut);
      const std::vector<std::uint8_t> x(s.bytes.begin(), s.bytes.begin() + static_cast<std::ptrdiff_t>(cut));
      CHECK(s.read(x) == not_ours);  // the header's length no longer matches
      if (cut < sizeof(proto::Header)) continue;
      if (cut == s.valid_cut) {
        CHECK(s.read(resealed(x)).starts_with("ok "));
      } else {
        CHECK(s.read(resealed(x)) == refused);
      }
    }
    auto longer = s.bytes;
    longer.push_back(0);
    CHECK(s.read(resealed(longer)) == refused);
  }
}

TEST_CASE("names and specs longer than their bounds are refused, the longest allowed is not") {
  auto error_of = [](const auto& m) { return proto::decode_request(proto::message(m, 1)).error; };
  CHECK(error_of(proto::HelloRequest{std::string(4096, 'c'), std::string(4096, 'j')}).empty());
  CHECK(error_of(proto::HelloRequest{std::string(4097, 'c'), ""}) == "malformed HELLO");
  CHECK(error_of(proto::HelloRequest{"c", std::string(4097, 'j')}) == "malformed HELLO");
  proto::StartRequest start{.kind = proto::Kind::kBarrier, .spec = std::string(256, 's'), .sends = {}, .recvs = {}};
  CHECK(error_of(start).empty());
  start.spec += 's';
  CHECK(error_of(start) == "malformed START");
  CHECK(test::read_reply<proto::ErrorReply>(proto::message(proto::ErrorReply{1, std::string(65536, 'e')}, 1)).starts_with("ok "));
  CHECK(test::read_reply<proto::ErrorReply>(proto::message(proto::ErrorReply{1, std::string(65537, 'e')}, 1)) == "refused");
  CHECK(test::read_reply<proto::StartedReply>(proto::message(proto::StartedReply{1, std::string(4097, 't'), ""}, 1)) == "refused");
}

TEST_CASE("random payloads of every type are read as they always were") {
  // Random bytes after a valid header, of every pinned type, many of them 0 (counts and lengths
  // that fit), read by the request decoder and by every pinned reply's decoder.
  const auto samples = test::protocol_samples();
  std::mt19937 rng(37);
  Digest d;
  for (int i = 0; i < 20000; ++i) {
    proto::Writer w(static_cast<proto::Type>(1 + rng() % kPinnedTypes), 5);
    const std::size_t n = rng() % 64;
    for (std::size_t k = 0; k < n; ++k) w.put(static_cast<std::uint8_t>(rng() % 3 == 0 ? 0 : rng()));
    const std::vector<std::uint8_t> msg = w.done();
    d.add(test::read_request(msg));
    for (const ProtocolSample& s : samples)
      if (s.read != nullptr && s.malformed.empty() && s.bytes[offsetof(proto::Header, type)] <= kPinnedTypes) d.add(s.read(msg));
  }
  CHECK(d.text() == "217d6edde7e01943");
}

// The Wireshark dissector (tools/wireshark/aapc.lua), checked with tshark against captures of
// real exchanges: every field of every frame of ours decodes to what the bytes say, the CRC
// verdict agrees with engine::crc32c, and headers-only captures get no verdict.
#include <catch2/catch.hpp>

#include <pcap/pcap.h>
#include <unistd.h>

#include <cstdio>
#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <optional>
#include <functional>
#include <fstream>
#include <iostream>
#include <algorithm>
#include <iomanip>
#include <sstream>

#include "aapc/sched/algorithms.hpp"
#include "aapc/sched/generate.hpp"
#include "aapc/sched/sync.hpp"
#include "checks.hpp"
#include "fabric.hpp"
#include "pcap_files.hpp"

#ifndef AAPC_DISSECTOR
#error "AAPC_DISSECTOR (the path of tools/wireshark/aapc.lua) must be defined"
#endif

using namespace aapc;
using namespace aapc::sched;
namespace fs = std::filesystem;

namespace {

using test::read_pcap;
using test::scratch_dir;
using test::write_pcap;
using Captured = test::PcapFrame;

std::optional<std::string> find_tshark() {
  const char* path = std::getenv("PATH");
  std::string dirs = path != nullptr ? path : "/usr/bin:/bin";
  std::stringstream ss(dirs);
  std::string dir;
  while (std::getline(ss, dir, ':')) {
    if (dir.empty()) continue;
    std::string candidate = dir + "/tshark";
    if (::access(candidate.c_str(), X_OK) == 0) return candidate;
  }
  return std::nullopt;
}

std::string quote(const std::string& s) {
  std::string out = "'";
  for (char c : s) {
    if (c == '\'') {
      out += "'\\''";
    } else {
      out += c;
    }
  }
  return out + "'";
}

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::size_t start = 0;
  for (;;) {
    std::size_t at = s.find(sep, start);
    if (at == std::string::npos) {
      out.push_back(s.substr(start));
      return out;
    }
    out.push_back(s.substr(start, at - start));
    start = at + 1;
  }
}

std::uint16_t get16(const std::uint8_t* p) { return static_cast<std::uint16_t>((p[0] << 8) | p[1]); }
std::uint32_t get32(const std::uint8_t* p) { return (static_cast<std::uint32_t>(get16(p)) << 16) | get16(p + 2); }
std::uint64_t get64(const std::uint8_t* p) { return (static_cast<std::uint64_t>(get32(p)) << 32) | get32(p + 4); }

// The columns asked of tshark; the numeric ones are compared as numbers (tshark prints hex
// fields as 0x..., booleans as 1/0), lists (one per occurrence) joined by ';'.
const std::vector<std::string> kFields = {
    "frame.number",   "aapc.magic",    "aapc.version",     "aapc.type",       "aapc.flags",      "aapc.flags.retransmit",
    "aapc.flags.dummy", "aapc.flags.last", "aapc.hdr_len",  "aapc.phase",      "aapc.exchange",   "aapc.epoch",
    "aapc.src",       "aapc.dst",      "aapc.seq",         "aapc.block_len",  "aapc.payload_len", "aapc.chunk",
    "aapc.aux",       "aapc.crc",      "aapc.nack.first",  "aapc.nack.count", "aapc.ack_of",
    "aapc.crc_ok",    "aapc.crc_bad",
};
const std::size_t kNumeric = kFields.size();  // the columns after these: expert messages, Info

std::string canonical(const std::string& field) {
  if (field.empty()) return field;
  std::string out;
  for (const auto& tok : split(field, ';')) {
    if (!out.empty()) out += ';';
    if (tok == "True" || tok == "true") {
      out += "1";
    } else if (tok == "False" || tok == "false") {
      out += "0";
    } else {
      try {
        out += std::to_string(std::stoull(tok, nullptr, 0));
      } catch (const std::exception&) {
        out += "<" + tok + ">";
      }
    }
  }
  return out;
}

// What the dissector must say about one captured frame, worked out from its bytes.
struct Expected {
  bool ours = false;
  std::vector<std::string> fields;  // canonical, as kFields (frame.number first)
  bool crc_verified = false, crc_bad = false, crc_unverified_note = false, malformed = false;
  std::string info_prefix;  // "DATA 3->1 ex 1 frame 4"
  bool retransmit = false;
  std::uint8_t type = 0;
};

Expected expect(const Captured& c, std::size_t number) {
  Expected e;
  e.fields.assign(kFields.size(), "");
  e.fields[0] = std::to_string(number);
  const auto& b = c.bytes;
  if (b.size() < engine::kEthHeaderLen || get16(b.data() + 12) != engine::kDefaultEtherType) return e;
  e.ours = true;
  // Every frame of the engine carries a whole header (DATA the 30-byte one, the others the
  // 44-byte one, wire.hpp); the captures keep at least 58 bytes.
  const std::uint8_t* h = b.data() + engine::kEthHeaderLen;
  const bool data = b.size() > engine::kEthHeaderLen + 3 && h[3] == static_cast<std::uint8_t>(engine::FrameType::kData);
  const std::size_t hl = data ? engine::kDataHeaderLen : engine::kHeaderLen, overhead = engine::kEthHeaderLen + hl;
  REQUIRE(c.len >= overhead);
  REQUIRE(b.size() >= overhead);
  const std::uint16_t magic = get16(h);
  const std::uint8_t version = h[2], type = h[3], flags = h[4], hdr_len = h[5];
  const std::uint32_t seq = get32(h + 20), crc = get32(h + hl - 4);
  const std::uint32_t aux = data ? 0 : get32(h + 36);
  const std::uint16_t payload_len = get16(h + (data ? 24 : 32));
  auto n = [](std::uint64_t v) { return std::to_string(v); };
  e.type = type;
  e.retransmit = (flags & engine::kFlagRetransmit) != 0;
  e.fields[1] = n(magic);
  e.fields[2] = n(version);
  e.fields[3] = n(type);
  e.fields[4] = n(flags);
  e.fields[5] = n(flags & engine::kFlagRetransmit ? 1 : 0);
  e.fields[6] = n(flags & engine::kFlagDummy ? 1 : 0);
  e.fields[7] = n(flags & engine::kFlagLast ? 1 : 0);
  e.fields[8] = n(hdr_len);
  e.fields[9] = n(get16(h + 6));
  e.fields[10] = n(get32(h + 8));
  e.fields[11] = n(get32(h + 12));
  e.fields[12] = n(get16(h + 16));
  e.fields[13] = n(get16(h + 18));
  e.fields[14] = n(seq);
  if (!data) {  // not in a DATA header
    e.fields[15] = n(get64(h + 24));
    e.fields[17] = n(get16(h + 34));
    e.fields[18] = n(aux);
  }
  e.fields[16] = n(payload_len);
  e.fields[19] = n(crc);
  const std::size_t captured_payload = std::min<std::size_t>(payload_len, b.size() - overhead);
  if (type == static_cast<std::uint8_t>(engine::FrameType::kNack)) {
    std::string first, count;
    for (std::uint32_t i = 0; i < seq && 8 * (i + 1) <= captured_payload; ++i) {
      auto [f, k] = engine::nack_range(std::span<const std::uint8_t>(h + hl, captured_payload), i);
      first += (first.empty() ? "" : ";") + n(f);
      count += (count.empty() ? "" : ";") + n(k);
    }
    e.fields[20] = first;
    e.fields[21] = count;
  }
  if (type == static_cast<std::uint8_t>(engine::FrameType::kAck)) e.fields[22] = n(aux);
  const std::size_t tag = engine::tagged_version(version) ? engine::kTagLen : 0;  // a cluster key's tag follows the payload
  const bool fits = overhead + payload_len + tag <= c.len;
  const bool whole = fits && overhead + payload_len <= b.size();
  if (whole) {
    std::uint32_t computed = engine::crc32c(0, h, hl - 4);
    computed = engine::crc32c(computed, h + hl, payload_len);
    e.crc_verified = true;
    e.crc_bad = computed != crc;
    e.fields[23] = e.crc_bad ? "0" : "1";
    if (e.crc_bad) e.fields[24] = "1";
  }
  e.crc_unverified_note = fits && !whole;
  e.malformed = magic != engine::kMagic || (version != engine::kVersion && !engine::tagged_version(version)) || hdr_len != hl || !fits;
  if (type >= 1 && type < engine::kFrameTypes) {
    std::ostringstream info;
    info << engine::frame_type_name(static_cast<engine::FrameType>(type)) << ' ' << get16(h + 16) << "->" << get16(h + 18) << " ex "
         << get32(h + 8);
    if (type == static_cast<std::uint8_t>(engine::FrameType::kData)) info << " frame " << seq;
    if (type == static_cast<std::uint8_t>(engine::FrameType::kSync)) info << " id " << seq;
    if (type == static_cast<std::uint8_t>(engine::FrameType::kJoin)) {
      info << " id " << seq;
      const engine::JoinMeasure m = engine::join_measure(std::span<const std::uint8_t>(h + hl, whole ? payload_len : 0));
      if (m.known())  // what the engine reads of it
        info << std::fixed << std::setprecision(1) << " fill " << m.fill_ppm / 1e4 << "% hand-over " << m.hand_over_ns / 1e3 << " us reaches " << m.reaches.size();
    }
    e.info_prefix = info.str();
  }
  // The engine's own reader agrees: peek() accepts exactly the sound frames captured whole.
  if (whole) {
    auto peeked = engine::peek(std::span<const std::uint8_t>(b.data(), b.size()));
    const bool sound = !e.crc_bad && !e.malformed && type >= 1 && type < engine::kFrameTypes;
    CHECK(peeked.has_value() == sound);
    if (peeked && sound) {
      CHECK(static_cast<std::uint8_t>(peeked->type) == type);
      CHECK(peeked->seq == seq);
      CHECK(peeked->payload_len == payload_len);
    }
  }
  return e;
}

struct Tally {
  std::size_t frames = 0, ours = 0, compared_ok = 0, bad_crc = 0, bad_crc_decoded = 0, verified = 0, unverified = 0;
  std::size_t retransmitted = 0, nack = 0, ack = 0, sync = 0;
  std::vector<std::string> mismatches;
};

std::string run_command(const std::string& cmd, int& status) {
  std::FILE* p = ::popen(cmd.c_str(), "r");
  REQUIRE(p != nullptr);
  std::string out;
  char buf[65536];
  std::size_t got = 0;
  while ((got = std::fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, got);
  status = ::pclose(p);
  return out;
}

// Runs tshark with the dissector on `pcap` and compares every frame with expect().
void check_capture(const fs::path& pcap, const fs::path& home, Tally& t) {
  auto tshark = find_tshark();
  if (!tshark) FAIL("tshark is not installed: apt-get install tshark (tools/setup installs it)");
  const auto frames = read_pcap(pcap);
  REQUIRE(!frames.empty());
  // A private HOME: a copy of the dissector in ~/.local/lib/wireshark/plugins would be loaded
  // as well and clash with this one, and personal preferences could change the output.
  std::string cmd = "HOME=" + quote(home.string()) + " XDG_CONFIG_HOME=" + quote((home / ".config").string()) + " " + quote(*tshark) +
                    " -n -X lua_script:" + quote(AAPC_DISSECTOR) + " -r " + quote(pcap.string()) + " -T fields";
  for (const auto& f : kFields) cmd += " -e " + f;
  cmd += " -e _ws.expert.message -e _ws.col.Info -E separator=/t -E aggregator=';' -E occurrence=a";
  const fs::path err = home / "tshark.err";
  cmd += " 2>" + quote(err.string());
  int status = 0;
  const std::string out = run_command(cmd, status);
  std::ifstream errf(err);
  std::string stderr_text((std::istreambuf_iterator<char>(errf)), std::istreambuf_iterator<char>());
  INFO(cmd);
  INFO("tshark stderr: " << stderr_text);
  REQUIRE(status == 0);
  CHECK(stderr_text.find("Lua") == std::string::npos);  // the script loaded without errors
  auto lines = split(out, '\n');
  while (!lines.empty() && lines.back().empty()) lines.pop_back();
  REQUIRE(lines.size() == frames.size());

  for (std::size_t i = 0; i < frames.size(); ++i) {
    ++t.frames;
    Expected e = expect(frames[i], i + 1);
    auto cols = split(lines[i], '\t');
    std::string where = pcap.filename().string() + " frame " + std::to_string(i + 1);
    if (cols.size() != kNumeric + 2) {
      t.mismatches.push_back(where + ": " + std::to_string(cols.size()) + " columns: " + lines[i]);
      continue;
    }
    const std::string& experts = cols[kNumeric];
    const std::string& info = cols[kNumeric + 1];
    std::string problems;
    for (std::size_t k = 0; k < kNumeric; ++k) {
      std::string got = canonical(cols[k]);
      if (got != e.fields[k]) problems += " " + kFields[k] + "='" + cols[k] + "' expected '" + e.fields[k] + "';";
    }
    if (experts.find("Lua Error") != std::string::npos) problems += " Lua error: " + experts + ";";
    if (e.ours) {
      ++t.ours;
      const bool bad_msg = experts.find("bad CRC32C") != std::string::npos;
      const bool note_msg = experts.find("CRC not verified: frame truncated by the capture") != std::string::npos;
      const bool malformed_msg = experts.find("bad magic") != std::string::npos || experts.find("bad version") != std::string::npos ||
                                 experts.find("bad header length") != std::string::npos ||
                                 experts.find("beyond the frame") != std::string::npos;
      if (bad_msg != e.crc_bad) problems += " bad-CRC expert info: '" + experts + "';";
      if (note_msg != e.crc_unverified_note) problems += " truncation note: '" + experts + "';";
      if (malformed_msg != e.malformed) problems += " malformed expert info: '" + experts + "';";
      if (!e.info_prefix.empty() && info.rfind(e.info_prefix, 0) != 0) problems += " Info '" + info + "' expected '" + e.info_prefix + "...';";
      if ((info.find("RETRANSMIT") != std::string::npos) != e.retransmit) problems += " Info '" + info + "' and the RETRANSMIT flag;";
      if ((info.find("BAD CRC") != std::string::npos) != e.crc_bad) problems += " Info '" + info + "' and the CRC;";
      if (e.crc_bad) ++t.bad_crc;
      if (canonical(cols[24]) == "1") ++t.bad_crc_decoded;
      if (e.crc_verified) ++t.verified;
      if (e.crc_unverified_note) ++t.unverified;
      if (e.retransmit && e.type == static_cast<std::uint8_t>(engine::FrameType::kData)) ++t.retransmitted;
      if (e.type == static_cast<std::uint8_t>(engine::FrameType::kNack)) ++t.nack;
      if (e.type == static_cast<std::uint8_t>(engine::FrameType::kAck)) ++t.ack;
      if (e.type == static_cast<std::uint8_t>(engine::FrameType::kSync)) ++t.sync;
    }
    if (problems.empty()) {
      ++t.compared_ok;
    } else {
      t.mismatches.push_back(where + ":" + problems);
    }
  }
}

std::string report(const std::vector<std::string>& mismatches) {
  std::string out;
  for (std::size_t i = 0; i < mismatches.size() && i < 20; ++i) out += mismatches[i] + "\n";
  if (mismatches.size() > 20) out += "... " + std::to_string(mismatches.size() - 20) + " more\n";
  return out;
}

// Captures of every node of a 4-node exchange (tree with sender-side sync: DATA, SYNC,
// READY, ACK, and with loss NACK, POLL and retransmissions).
void capture_exchange(const fs::path& dir, const nic::FaultOptions& faults, int snaplen) {
  Topology topo = single_switch_topology(4);
  Schedule s = plan_sync(topo, make_schedule(topo, {Algorithm::kTree, 0}), {SyncKind::kSenderAll, 1});
  auto opts = test::nodes(4);
  opts.faults = faults;
  opts.capture_dir = dir.string();
  opts.capture_snaplen = snaplen;
  test::Fabric fabric(opts);
  test::expect_ok(test::run_exchange(fabric, s, 1, 20'000), "the captured exchange");
  fabric.settle();
}

}  // namespace

TEST_CASE("the Wireshark dissector decodes every captured frame as the engine wrote it") {
  if (!find_tshark()) FAIL("tshark is not installed: apt-get install tshark (tools/setup installs it)");
  REQUIRE(fs::exists(AAPC_DISSECTOR));

  SECTION("whole frames, with loss and corruption on receive: every field, and the CRC verdict") {
    // Loss makes retransmissions, NACKs and POLLs; corruption on receive is captured (the tap
    // sits above the fault injector), so some captured frames fail their CRC. Seeds are tried
    // until a capture has all of them, so that nothing below passes vacuously.
    Tally t;
    std::optional<test::ScratchDir> dir;
    for (std::uint64_t seed = 1; seed <= 8; ++seed) {
      dir.emplace("dissector-" + std::to_string(seed));
      nic::FaultOptions faults = nic::FaultOptions::parse("drop=0.04,corrupt=0.03:rx");
      faults.seed = seed;
      capture_exchange(*dir, faults, 65535);
      t = Tally{};
      for (int i = 0; i < 4; ++i) check_capture(*dir / ("node" + std::to_string(i) + ".pcap"), *dir, t);
      if (t.bad_crc > 0 && t.retransmitted > 0 && t.nack > 0 && t.ack > 0) break;
    }
    std::cout << "dissector, whole frames: " << t.frames << " frames compared (" << t.ours << " aapc), " << t.compared_ok
              << " decoded as expected; " << t.verified << " CRCs verified, " << t.bad_crc << " bad (tshark flagged " << t.bad_crc_decoded
              << "); " << t.retransmitted << " retransmitted DATA, " << t.nack << " NACK, " << t.ack << " ACK, " << t.sync << " SYNC\n";
    INFO(report(t.mismatches));
    CHECK(t.mismatches.empty());
    CHECK(t.compared_ok == t.frames);
    CHECK(t.bad_crc_decoded == t.bad_crc);
    CHECK(t.bad_crc > 0);
    CHECK(t.retransmitted > 0);
    CHECK(t.nack > 0);
    CHECK(t.ack > 0);
    CHECK(t.sync > 0);
    CHECK(t.unverified == 0);
  }

  SECTION("forged frames: every type, and malformed ones reported rather than thrown") {
    auto dir = scratch_dir("dissector-forged");
    const engine::MacAddr m0 = test::Fabric::mac(0), m1 = test::Fabric::mac(1);
    auto make = [&](engine::FrameType type, std::uint32_t seq, std::uint32_t aux, const std::vector<std::uint8_t>& payload,
                    const std::function<void(std::uint8_t*)>& tamper = {}) {
      engine::Header h;
      h.type = type;
      h.exchange = 10;
      h.epoch = 77;
      h.src = 0;
      h.dst = 1;
      h.seq = seq;
      h.aux = aux;
      h.block_len = 20'000;
      h.chunk = 1456;
      h.payload_len = static_cast<std::uint16_t>(payload.size());
      std::vector<std::uint8_t> f(engine::frame_overhead(type) + payload.size());
      const std::size_t at = engine::encode(f.data(), m1, m0, engine::kDefaultEtherType, h);
      std::copy(payload.begin(), payload.end(), f.begin() + static_cast<std::ptrdiff_t>(at));
      if (tamper) tamper(f.data() + engine::kEthHeaderLen);
      engine::seal(f.data());
      return f;
    };
    using FT = engine::FrameType;
    std::vector<std::uint8_t> nack(16);
    engine::put_nack_range(nack.data(), 0, 3, 2);
    engine::put_nack_range(nack.data(), 1, 10, 1);
    const std::string reason = "test over";
    const engine::JoinMeasure measured{830'000, 142'000, {{7, 3, 7'190}, {9, 9, 8'870}}};
    std::vector<std::uint8_t> join_measure(measured.length());
    engine::put_join_measure(join_measure.data(), measured);
    std::vector<std::vector<std::uint8_t>> frames = {
        make(FT::kData, 4, 0, std::vector<std::uint8_t>(1470, 0x5A)),
        make(FT::kSync, 9, 0, {}),
        make(FT::kReady, 0, 0, {}),
        make(FT::kNack, 2, 0, nack),
        make(FT::kAck, 9, static_cast<std::uint32_t>(FT::kSync), {}),
        make(FT::kAbort, 0, static_cast<std::uint32_t>(Errc::kAborted), std::vector<std::uint8_t>(reason.begin(), reason.end())),
        make(FT::kPoll, 0, 0, {}),
        make(FT::kPing, 0, 0, {}),
        make(FT::kJoin, 11, 0, {}),
        make(FT::kJoin, 12, 0, join_measure),
        make(FT::kData, 5, 0, std::vector<std::uint8_t>(100, 1), [](std::uint8_t* h) { h[4] = engine::kFlagRetransmit | engine::kFlagLast; }),
        make(FT::kData, 1, 0, std::vector<std::uint8_t>(100, 1), [](std::uint8_t* h) { h[0] ^= 0x01; }),  // bad magic
        make(FT::kData, 1, 0, std::vector<std::uint8_t>(100, 1), [](std::uint8_t* h) { h[2] = 1; }),     // bad version (1: before descriptors)
        make(FT::kData, 1, 0, std::vector<std::uint8_t>(100, 1), [](std::uint8_t* h) { h[5] = 44; }),    // bad header length (a control frame's)
        make(FT::kPing, 0, 0, {}, [](std::uint8_t* h) { h[3] = 12; }),                                   // unknown type
    };
    auto bad_crc = make(FT::kData, 6, 0, std::vector<std::uint8_t>(100, 1));
    bad_crc.back() ^= 0x10;  // the payload changed after sealing
    frames.push_back(bad_crc);
    auto beyond = make(FT::kData, 7, 0, std::vector<std::uint8_t>(600, 1));
    beyond.resize(engine::kDataFrameOverhead + 100);  // claims 600 payload bytes, carries 100
    frames.push_back(beyond);
    // Frames of a cluster with a key: a tag after the payload, by either cipher (versions 6, 7).
    for (engine::Cipher cipher : {engine::Cipher::kChaCha20Poly1305, engine::Cipher::kAes256Gcm}) {
      if (cipher == engine::Cipher::kAes256Gcm && !engine::aes_gcm_available()) continue;
      const engine::FrameKey key{{}, cipher};
      for (auto tagged : {make(FT::kData, 8, 0, std::vector<std::uint8_t>(100, 2)), make(FT::kPing, 0, 0, {})}) {
        tagged.resize(tagged.size() + engine::kTagLen);
        engine::seal(tagged.data(), &key);
        frames.push_back(tagged);
      }
    }
    write_pcap(dir / "forged.pcap", frames);
    Tally t;
    check_capture(dir / "forged.pcap", dir, t);
    INFO(report(t.mismatches));
    CHECK(t.mismatches.empty());
    CHECK(t.compared_ok == frames.size());
    CHECK(t.bad_crc == 1);
    CHECK(t.bad_crc_decoded == 1);
    CHECK(t.verified == frames.size() - 1);  // all but the one whose payload is beyond the frame
    CHECK(t.retransmitted == 1);
  }

  SECTION("headers only (snap length 64): headers decoded, no CRC verdict for frames cut short") {
    auto dir = scratch_dir("dissector-snap64");
    capture_exchange(dir, nic::FaultOptions::parse("drop=0.04,seed=3"), 64);
    Tally t;
    for (int i = 0; i < 4; ++i) check_capture(dir / ("node" + std::to_string(i) + ".pcap"), dir, t);
    std::cout << "dissector, snap length 64: " << t.frames << " frames compared (" << t.ours << " aapc), " << t.compared_ok
              << " decoded as expected; " << t.unverified << " cut short (no verdict), " << t.verified << " whole (verified), "
              << t.retransmitted << " retransmitted DATA\n";
    INFO(report(t.mismatches));
    CHECK(t.mismatches.empty());
    CHECK(t.compared_ok == t.frames);
    CHECK(t.unverified > 0);  // DATA frames: the payload is not in the capture
    CHECK(t.bad_crc == 0);
    CHECK(t.bad_crc_decoded == 0);
  }
}

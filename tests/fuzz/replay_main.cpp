// Runs the fuzz target without libFuzzer: every file of the corpus, then deterministic
// mutations of each (bit flips, byte changes, cuts and extensions). Also writes the seed
// corpus (--write-seeds DIR). Exit 0 when nothing trapped and every seed parses.
#include <filesystem>
#include <fstream>
#include <iostream>
#include <random>
#include <string>
#include <vector>

#include "fuzz_context.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size);

namespace {

namespace fs = std::filesystem;
using namespace aapc;

std::vector<std::uint8_t> frame(engine::FrameType type, std::uint32_t seq, std::uint64_t block_len, std::size_t payload, int src = 0) {
  std::vector<std::uint8_t> f(engine::kFrameOverhead + payload, 0x42);
  engine::Header h;
  h.type = type;
  h.exchange = fuzz::kExchange;
  h.epoch = 1234;
  h.src = static_cast<std::uint16_t>(src);
  h.dst = 1;
  h.seq = seq;
  h.block_len = block_len;
  h.chunk = fuzz::kChunk;
  h.payload_len = static_cast<std::uint16_t>(payload);
  if (type == engine::FrameType::kAck) h.aux = static_cast<std::uint32_t>(engine::FrameType::kData);
  engine::encode(f.data(), fuzz::mac(1), fuzz::mac(src), engine::kDefaultEtherType, h);
  if (type == engine::FrameType::kNack)
    for (std::uint32_t i = 0; i < seq; ++i) engine::put_nack_range(f.data() + engine::kFrameOverhead, i, i * 3, 2);
  engine::seal(f.data());
  return f;
}

std::vector<std::pair<std::string, std::vector<std::uint8_t>>> seeds() {
  using engine::FrameType;
  const std::uint32_t last = engine::frame_count(fuzz::kPostedBlock, fuzz::kChunk) - 1;
  return {
      {"data-first", frame(FrameType::kData, 0, fuzz::kPostedBlock, fuzz::kChunk)},
      {"data-last", frame(FrameType::kData, last, fuzz::kPostedBlock, engine::frame_payload(fuzz::kPostedBlock, fuzz::kChunk, last))},
      {"sync", frame(FrameType::kSync, 12, 0, 0, 2)},
      {"ready", frame(FrameType::kReady, 0, 0, 0, 3)},
      {"nack", frame(FrameType::kNack, 3, fuzz::kPostedBlock, 24)},
      {"ack", frame(FrameType::kAck, 0, fuzz::kPostedBlock, 0)},
      {"abort", frame(FrameType::kAbort, 0, 0, 17, 2)},
      {"poll", frame(FrameType::kPoll, 0, fuzz::kPostedBlock, 0)},
      {"ping", frame(FrameType::kPing, 0, 0, 0)},
  };
}

// Recomputes the CRC of a mutated frame when its length fields allow it, so that mutations
// also reach the checks after the CRC.
void reseal(std::vector<std::uint8_t>& x) {
  if (x.size() < engine::kFrameOverhead) return;
  std::size_t payload = (static_cast<std::size_t>(x[engine::kEthHeaderLen + 32]) << 8) | x[engine::kEthHeaderLen + 33];
  if (payload <= x.size() - engine::kFrameOverhead) engine::seal(x.data());
}

std::vector<std::uint8_t> read(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  if (args.size() == 2 && args[0] == "--write-seeds") {
    fs::create_directories(args[1]);
    for (const auto& [name, bytes] : seeds()) {
      std::ofstream out(fs::path(args[1]) / name, std::ios::binary);
      out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
    }
    return 0;
  }
  int mutations = 0;
  std::vector<fs::path> dirs;
  for (std::size_t i = 0; i < args.size(); ++i) {
    if (args[i] == "--mutate" && i + 1 < args.size()) {
      mutations = std::stoi(args[++i]);
    } else {
      dirs.emplace_back(args[i]);
    }
  }
  if (dirs.empty()) {
    std::cerr << "usage: fuzz_parse_replay [--mutate N] CORPUS_DIR...   |   --write-seeds DIR\n";
    return 2;
  }
  // Every seed is a valid frame for the fuzz context.
  static const fuzz::Context ctx;
  for (const auto& [name, bytes] : seeds()) {
    auto p = engine::parse(bytes, ctx);
    if (p.reason != engine::DropReason::kOk) {
      std::cerr << "seed " << name << " does not parse: " << engine::drop_reason_name(p.reason) << "\n";
      return 1;
    }
  }
  std::mt19937_64 rng(20261121);
  std::size_t inputs = 0;
  for (const auto& dir : dirs) {
    for (const auto& entry : fs::directory_iterator(dir)) {
      if (!entry.is_regular_file()) continue;
      auto bytes = read(entry.path());
      LLVMFuzzerTestOneInput(bytes.data(), bytes.size());
      ++inputs;
      for (int m = 0; m < mutations; ++m) {
        auto x = bytes;
        int edits = 1 + static_cast<int>(rng() % 4);
        for (int e = 0; e < edits && !x.empty(); ++e) {
          std::size_t at = rng() % x.size();
          switch (rng() % 5) {
            case 0: x[at] ^= static_cast<std::uint8_t>(1U << (rng() % 8)); break;
            case 1: x[at] = static_cast<std::uint8_t>(rng()); break;
            case 2: x.resize(at); break;
            case 3: x.resize(x.size() + rng() % 64, static_cast<std::uint8_t>(rng())); break;
            default: break;
          }
          if (rng() % 2 == 0) reseal(x);
        }
        LLVMFuzzerTestOneInput(x.data(), x.size());
        ++inputs;
      }
    }
  }
  std::cout << "fuzz_parse_replay: " << inputs << " inputs, no fault\n";
  return 0;
}

// Runs a fuzz target without libFuzzer: every file of the corpus, then deterministic
// mutations of each (bit flips, byte changes, cuts and extensions). Also writes the seed
// corpus (--write-seeds DIR). Exit 0 when nothing trapped and every seed is valid input.
// The target's seeds come from replay.hpp (parse_seeds.cpp, request_seeds.cpp).
#include <filesystem>
#include <fstream>
#include <iostream>
#include <random>
#include <string>
#include <vector>

#include "replay.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size);

namespace {

namespace fs = std::filesystem;
using namespace aapc::fuzz;

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
    std::cerr << "usage: " << kReplayName << " [--mutate N] CORPUS_DIR...   |   --write-seeds DIR\n";
    return 2;
  }
  // Every seed is valid input for the target.
  for (const auto& [name, bytes] : seeds()) {
    if (auto why = seed_fault(bytes); !why.empty()) {
      std::cerr << "seed " << name << " is not valid input: " << why << "\n";
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
  std::cout << kReplayName << ": " << inputs << " inputs, no fault\n";
  return 0;
}

// Scratch directories and pcap files for the tests that capture, replay or forge frames.
#pragma once

#include <catch2/catch.hpp>
#include <pcap/pcap.h>
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

namespace aapc::test {

// An empty directory of this test process, under the system's temporary directory, removed
// with everything in it when the object goes (a failed REQUIRE unwinds through it too).
class ScratchDir {
 public:
  explicit ScratchDir(const std::string& name)
      : path_(std::filesystem::temp_directory_path() / ("aapc-test-" + std::to_string(::getpid()) + "-" + name)) {
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  ScratchDir(ScratchDir&& other) noexcept : path_(std::exchange(other.path_, {})) {}
  ScratchDir& operator=(ScratchDir&& other) noexcept {
    if (this != &other) {
      remove();
      path_ = std::exchange(other.path_, {});
    }
    return *this;
  }
  ~ScratchDir() { remove(); }

  const std::filesystem::path& path() const { return path_; }
  operator const std::filesystem::path&() const { return path_; }
  std::filesystem::path operator/(const std::filesystem::path& name) const { return path_ / name; }
  std::string string() const { return path_.string(); }

 private:
  void remove() {
    std::error_code ec;
    if (!path_.empty()) std::filesystem::remove_all(path_, ec);
  }
  std::filesystem::path path_;
};

inline ScratchDir scratch_dir(const std::string& name) { return ScratchDir(name); }

struct PcapFrame {
  std::vector<std::uint8_t> bytes;  // what the capture holds (caplen)
  std::uint32_t len = 0;            // the frame's length on the wire
  std::int64_t ns = 0;              // capture timestamp
};

inline std::vector<PcapFrame> read_pcap(const std::filesystem::path& path) {
  char err[PCAP_ERRBUF_SIZE] = {};
  pcap_t* p = pcap_open_offline_with_tstamp_precision(path.c_str(), PCAP_TSTAMP_PRECISION_NANO, err);
  INFO(path.string() << ": " << err);
  REQUIRE(p != nullptr);
  std::vector<PcapFrame> out;
  pcap_pkthdr* h = nullptr;
  const u_char* data = nullptr;
  while (pcap_next_ex(p, &h, &data) == 1)
    out.push_back({std::vector<std::uint8_t>(data, data + h->caplen), h->len,
                   static_cast<std::int64_t>(h->ts.tv_sec) * 1'000'000'000 + static_cast<std::int64_t>(h->ts.tv_usec)});
  pcap_close(p);
  return out;
}

// Whole frames, each at its own time (nanoseconds from the capture's first second).
inline void write_pcap_at(const std::filesystem::path& path, const std::vector<std::pair<std::int64_t, std::vector<std::uint8_t>>>& frames,
                          int linktype = DLT_EN10MB) {
  pcap_t* p = pcap_open_dead_with_tstamp_precision(linktype, 65535, PCAP_TSTAMP_PRECISION_NANO);
  pcap_dumper_t* d = pcap_dump_open(p, path.c_str());
  REQUIRE(d != nullptr);
  for (const auto& [ns, f] : frames) {
    pcap_pkthdr h{};
    h.ts.tv_sec = static_cast<time_t>(1 + ns / 1'000'000'000);
    h.ts.tv_usec = static_cast<suseconds_t>(ns % 1'000'000'000);  // nanoseconds, with this precision
    h.caplen = h.len = static_cast<bpf_u_int32>(f.size());
    pcap_dump(reinterpret_cast<u_char*>(d), &h, f.data());
  }
  pcap_dump_close(d);
  pcap_close(p);
}

// Whole frames, 1 us apart, with nanosecond timestamps.
inline void write_pcap(const std::filesystem::path& path, const std::vector<std::vector<std::uint8_t>>& frames, int linktype = DLT_EN10MB) {
  std::vector<std::pair<std::int64_t, std::vector<std::uint8_t>>> at;
  std::int64_t ns = 0;
  for (const auto& f : frames) at.emplace_back(ns += 1000, f);
  write_pcap_at(path, at, linktype);
}

}  // namespace aapc::test

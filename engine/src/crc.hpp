// CRC32C of the wire format (not installed): crc32c() is in wire.hpp; this adds the copy.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>

namespace aapc::engine {

// Copies `len` bytes from `src` to `dst` and returns crc32c(crc, src, len): one pass.
std::uint32_t crc32c_copy(std::uint32_t crc, std::uint8_t* dst, const std::uint8_t* src, std::size_t len);

// One way of computing the CRC (crc.cpp), with and without the copy.
struct Crc32cPath {
  std::string_view name;
  std::uint32_t (*crc)(std::uint32_t crc, const void* data, std::size_t len);
  std::uint32_t (*copy)(std::uint32_t crc, std::uint8_t* dst, const std::uint8_t* src, std::size_t len);
};

// The ways this CPU can run, slowest first. crc32c() and crc32c_copy() take the last.
std::span<const Crc32cPath> crc32c_paths();

// For tests and benchmarks: crc32c() and crc32c_copy() take `path` from now on (null: the
// last of crc32c_paths() again). Not to be called while another thread computes a CRC.
void use_crc32c_path(const Crc32cPath* path);

}  // namespace aapc::engine

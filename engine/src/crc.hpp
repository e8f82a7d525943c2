// CRC32C of the wire format (not installed): crc32c() is in wire.hpp; this adds the copy.
#pragma once

#include <cstddef>
#include <cstdint>

namespace aapc::engine {

// Copies `len` bytes from `src` to `dst` and returns crc32c(crc, src, len): one pass.
std::uint32_t crc32c_copy(std::uint32_t crc, std::uint8_t* dst, const std::uint8_t* src, std::size_t len);

}  // namespace aapc::engine

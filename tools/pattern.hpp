// The bytes every measuring tool puts in block src -> dst at an iteration, so the receiver can
// check each one without being told: aapc run, aapc-bench and the cluster suite's test client.
#pragma once

#include <cstddef>
#include <cstdint>

namespace aapc::tools {

inline std::uint8_t pattern(int src, int dst, int iteration, std::size_t k) {
  return static_cast<std::uint8_t>(k * 131 + (k >> 8) * 7 + static_cast<std::size_t>(src) * 17 + static_cast<std::size_t>(dst) * 29 +
                                   static_cast<std::size_t>(iteration) * 53);
}

}  // namespace aapc::tools

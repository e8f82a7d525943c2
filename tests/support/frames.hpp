// Frames of ours built by hand for the vdev tests (forgers, replays, traces).
#pragma once

#include <algorithm>
#include <span>
#include <vector>

#include "aapc/wire/wire.hpp"
#include "fabric.hpp"

namespace aapc::test {

// A sealed frame from rank `src` to rank `dst` of a Fabric: header `h` (its ranks and payload
// length set here), then `payload`, then the tag of `key` when one is given.
inline std::vector<std::uint8_t> fabric_frame(engine::Header h, int src, int dst, std::span<const std::uint8_t> payload = {},
                                              const engine::FrameKey* key = nullptr) {
  h.src = static_cast<std::uint16_t>(src);
  h.dst = static_cast<std::uint16_t>(dst);
  h.payload_len = static_cast<std::uint16_t>(payload.size());
  std::vector<std::uint8_t> f(engine::frame_overhead(h.type) + engine::frame_tail(payload.size(), key));
  const std::size_t at = engine::encode(f.data(), Fabric::mac(dst), Fabric::mac(src), engine::kDefaultEtherType, h);
  std::copy(payload.begin(), payload.end(), f.begin() + static_cast<std::ptrdiff_t>(at));
  engine::seal(f.data(), key);
  return f;
}

}  // namespace aapc::test

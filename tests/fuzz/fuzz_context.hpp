// The receiver the fuzz target parses for: rank 1 of four, with exchange 7 live and a block of
// kPostedBlock bytes posted from rank 0, into which parse() places DATA payloads (place_at) when
// `placing` (none of its frames counts as received: every frame is placed again).
#pragma once

#include <vector>

#include "aapc/wire/wire.hpp"

namespace aapc::fuzz {

inline constexpr std::uint64_t kPostedBlock = 100'000;
inline constexpr std::uint16_t kChunk = 1500 - engine::kDataHeaderLen;
inline constexpr std::uint32_t kExchange = 7;

inline engine::MacAddr mac(int rank) { return {0x02, 0, 0, 0, 0, static_cast<std::uint8_t>(rank + 1)}; }

class Context final : public engine::ParseContext {
 public:
  Context() {
    my_mac = mac(1);
    my_rank = 1;
  }
  engine::Rank rank_of(const engine::MacAddr& m) const override {
    for (int r = 0; r < 4; ++r)
      if (m == mac(r)) return r;
    return -1;
  }
  Expected expect_data(std::uint32_t exchange, std::uint32_t, engine::Rank src) const override {
    if (exchange != kExchange) return {engine::DropReason::kNotLive, 0, 0};
    if (src != 0) return {engine::DropReason::kUnexpectedBlock, 0, kChunk};
    return {engine::DropReason::kOk, kPostedBlock, kChunk};
  }
  std::uint8_t* place_at(std::uint32_t exchange, engine::Rank src, std::uint32_t seq) const override {
    if (!placing || exchange != kExchange || src != 0 || seq >= engine::frame_count(kPostedBlock, kChunk)) return nullptr;
    return block.data() + static_cast<std::size_t>(seq) * kChunk;
  }
  bool placing = false;
  mutable std::vector<std::uint8_t> block = std::vector<std::uint8_t>(kPostedBlock);
};

}  // namespace aapc::fuzz

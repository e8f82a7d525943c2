// libFuzzer target for the wire parser: whatever the bytes, parse() must not read outside the
// frame, and anything it accepts must fit the block the receiver posted.
#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "aapc/wire/wire.hpp"
#include "fuzz_context.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static const aapc::fuzz::Context ctx = [] {
    aapc::fuzz::Context c;
    c.placing = true;  // DATA payloads copied into the posted block while their CRC is computed
    return c;
  }();
  std::span<const std::uint8_t> frame(data, size);
  aapc::engine::Parsed p = aapc::engine::parse(frame, ctx);
  if (p.reason == aapc::engine::DropReason::kOk) {
    if (p.payload.data() < data || p.payload.data() + p.payload.size() > data + size) __builtin_trap();
    if (p.h.type == aapc::engine::FrameType::kData && p.offset + p.payload.size() > aapc::fuzz::kPostedBlock) __builtin_trap();
    if (p.placed && !std::equal(p.payload.begin(), p.payload.end(), ctx.block.begin() + static_cast<std::ptrdiff_t>(p.offset))) __builtin_trap();
  }
  (void)aapc::engine::peek(frame);
  return 0;
}

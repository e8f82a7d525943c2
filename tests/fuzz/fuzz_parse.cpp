// libFuzzer target for the wire parser: whatever the bytes, parse() must not read outside the
// frame, and anything it accepts must fit the block the receiver posted.
#include <cstddef>
#include <cstdint>

#include "aapc/engine/wire.hpp"
#include "fuzz_context.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static const aapc::fuzz::Context ctx;
  std::span<const std::uint8_t> frame(data, size);
  aapc::engine::Parsed p = aapc::engine::parse(frame, ctx);
  if (p.reason == aapc::engine::DropReason::kOk) {
    if (p.payload.data() < data || p.payload.data() + p.payload.size() > data + size) __builtin_trap();
    if (p.h.type == aapc::engine::FrameType::kData && p.offset + p.payload.size() > aapc::fuzz::kPostedBlock) __builtin_trap();
  }
  (void)aapc::engine::peek(frame);
  return 0;
}

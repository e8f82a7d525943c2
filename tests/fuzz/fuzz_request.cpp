// libFuzzer target for aapcd's request decoder: whatever a client sends, decode_request() names
// an error or returns a request, never crashes, and what it accepts encodes back to exactly the
// bytes it came from (one encode and one decode per message, in agreement).
#include <cstddef>
#include <cstdint>
#include <variant>
#include <vector>

#include "aapc/proto/protocol.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::vector<std::uint8_t> msg(data, data + size);
  const aapc::proto::DecodedRequest d = aapc::proto::decode_request(msg);
  if (!d.request) {
    if (d.error.empty()) __builtin_trap();
    return 0;
  }
  auto again = std::visit([&](const auto& m) { return aapc::proto::message(m, d.header.request); }, *d.request);
  if (again != msg) __builtin_trap();
  return 0;
}

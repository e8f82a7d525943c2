// The request decoder's seeds for replay_main.cpp: one valid request of every type and kind.
#include <cstring>

#include "aapc/proto/protocol.hpp"
#include "protocol_samples.hpp"
#include "replay.hpp"

namespace aapc::fuzz {

const char* const kReplayName = "fuzz_request_replay";

// The requests of the protocol tests' samples: every request type, every optional and
// conditional part present and absent.
std::vector<std::pair<std::string, std::vector<std::uint8_t>>> seeds() {
  std::vector<std::pair<std::string, std::vector<std::uint8_t>>> out;
  for (const test::ProtocolSample& s : test::protocol_samples())
    if (!s.malformed.empty()) out.emplace_back(s.name, s.bytes);
  return out;
}

std::string seed_fault(const std::vector<std::uint8_t>& input) {
  auto d = proto::decode_request(input);
  return d.request ? std::string() : d.error;
}

// The header's length field, made right again after a cut or an extension, so mutations reach
// the payload's checks (requests have no checksum).
void reseal(std::vector<std::uint8_t>& input) {
  if (input.size() < sizeof(proto::Header)) return;
  const auto length = static_cast<std::uint32_t>(input.size() - sizeof(proto::Header));
  std::memcpy(input.data() + offsetof(proto::Header, length), &length, sizeof length);
}

}  // namespace aapc::fuzz

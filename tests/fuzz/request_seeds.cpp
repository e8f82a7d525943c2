// The request decoder's seeds for replay_main.cpp: one valid request of every type and kind.
#include <cstring>

#include "aapc/proto/protocol.hpp"
#include "replay.hpp"

namespace aapc::fuzz {

const char* const kReplayName = "fuzz_request_replay";

std::vector<std::pair<std::string, std::vector<std::uint8_t>>> seeds() {
  using namespace aapc::proto;
  StartRequest alltoall;
  alltoall.spec = "tree+sender-all";
  alltoall.send_buffer = 1;
  alltoall.recv_buffer = 2;
  alltoall.block = 4096;
  StartRequest alltoallv = alltoall;
  alltoallv.kind = Kind::kAlltoallv;
  alltoallv.spec = "group-shuffle:4";
  alltoallv.timeout_ms = 1000;
  alltoallv.sends = {{0, 100}, {100, 0}, {100, 50}};
  alltoallv.recvs = {{0, 10}, {10, 20}, {30, 0}};
  StartRequest barrier;
  barrier.kind = Kind::kBarrier;
  StartRequest run = alltoall;  // START and WAIT in one (issue 14)
  run.run = true;
  StartRequest grouped = alltoallv;  // in a group (issue 13)
  grouped.sends.resize(2);
  grouped.recvs.resize(2);
  grouped.group = 5;
  return {
      {"hello", message(HelloRequest{"aapc-client 1", ""}, 1)},
      {"register", message(RegisterRequest{1 << 16}, 2)},
      {"free", message(FreeRequest{1}, 3)},
      {"start-alltoall", message(alltoall, 4)},
      {"start-alltoallv", message(alltoallv, 5)},
      {"start-barrier", message(barrier, 6)},
      {"run-alltoall", message(run, 10)},
      {"wait", message(WaitRequest{7, true}, 7)},
      {"test", message(WaitRequest{7, false}, 8)},
      {"status", message(StatusRequest{}, 9)},
      {"start-group", message(grouped, 11)},
      {"group-query", message(GroupQueryRequest{}, 12)},
      {"group-open", message(GroupOpenRequest{5, 17, {2, 0, 1}}, 13)},
      {"group-close", message(GroupCloseRequest{5, true}, 14)},
  };
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

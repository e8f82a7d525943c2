// What an exchange is, as the ranks tell each other at its start: the
// collective called, an alltoall's block size, the schedule and sync as resolved. A rank that
// called another collective, or the same with other blocks or another schedule, used to be
// found out only when its peers gave up on it (18.7 s, "did not acknowledge its block after 41
// polls"), or never (barrier against alltoall hung). READY and SYNC frames carry the sender's
// descriptor, the ACKs of them the receiver's: both sides of a mismatch see it at once.
//
// Layout (the payload of READY, SYNC and their ACKs; big-endian):
//   offset size field
//    0     1   kind: 0 unspecified, 1 alltoall, 2 alltoallv, 3 barrier
//    1     1   n, the bytes of plan text that follow the fixed part
//    2     8   block size of an alltoall (0 for the others)
//   10     8   FNV-1a 64 of the whole plan text
//   18     n   the plan text, cut to fit the frame (the hash tells cut texts apart)
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace aapc::engine {

enum class Collective : std::uint8_t { kUnspecified = 0, kAlltoall = 1, kAlltoallv = 2, kBarrier = 3 };
std::string_view collective_name(Collective kind);

struct Descriptor {
  Collective kind = Collective::kUnspecified;
  std::uint64_t block = 0;  // an alltoall's block size in bytes; 0 for the others
  std::string plan;         // schedule and sync as resolved, ALGORITHM+SYNC ("tree+sender-all")
  friend bool operator==(const Descriptor&, const Descriptor&) = default;
};

inline constexpr std::size_t kDescriptorFixed = 18;
inline constexpr std::size_t kMaxDescriptor = 64;

// The descriptor in at most `room` bytes (at least kDescriptorFixed): the plan text is cut to fit.
std::vector<std::uint8_t> encode_descriptor(const Descriptor& d, std::size_t room = kMaxDescriptor);
// True when `payload` is one whole descriptor (parse() checks READY, SYNC and ACK payloads).
bool descriptor_valid(std::span<const std::uint8_t> payload);
// The descriptor (its plan text maybe cut), or nullopt when `payload` is not one.
std::optional<Descriptor> decode_descriptor(std::span<const std::uint8_t> payload);
// Whether two encoded descriptors describe the same exchange: kind, block and plan hash.
bool same_descriptor(std::span<const std::uint8_t> a, std::span<const std::uint8_t> b);
// What differs, told from this rank's side after "rank 3 ": "called barrier, this rank
// alltoall with 4096-byte blocks", "called alltoall with 4096-byte blocks, this rank 8192-byte
// blocks", "called alltoall with schedule ring+none, this rank tree+sender-all".
std::string descriptor_difference(const Descriptor& theirs, const Descriptor& ours);

}  // namespace aapc::engine

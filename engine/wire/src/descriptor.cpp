#include "aapc/wire/descriptor.hpp"

#include <algorithm>
#include <cstring>

namespace aapc::engine {
namespace {

void put64(std::uint8_t* p, std::uint64_t v) {
  for (int i = 7; i >= 0; --i, v >>= 8) p[i] = static_cast<std::uint8_t>(v);
}
std::uint64_t get64(const std::uint8_t* p) {
  std::uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v = (v << 8) | p[i];
  return v;
}

std::uint64_t fnv1a(std::string_view s) {
  std::uint64_t h = 0xcbf29ce484222325ULL;
  for (char c : s) h = (h ^ static_cast<std::uint8_t>(c)) * 0x100000001b3ULL;
  return h;
}

// "alltoall with 4096-byte blocks", "barrier", ...
std::string what(const Descriptor& d) {
  std::string s(collective_name(d.kind));
  if (d.kind == Collective::kAlltoall) s += " with " + std::to_string(d.block) + "-byte blocks";
  return s;
}

}  // namespace

std::string_view collective_name(Collective kind) {
  switch (kind) {
    case Collective::kUnspecified: return "an exchange";
    case Collective::kAlltoall: return "alltoall";
    case Collective::kAlltoallv: return "alltoallv";
    case Collective::kBarrier: return "barrier";
  }
  return "?";
}

std::vector<std::uint8_t> encode_descriptor(const Descriptor& d, std::size_t room) {
  const std::size_t text = std::min({d.plan.size(), room > kDescriptorFixed ? room - kDescriptorFixed : 0, kMaxDescriptor - kDescriptorFixed});
  std::vector<std::uint8_t> out(kDescriptorFixed + text);
  out[0] = static_cast<std::uint8_t>(d.kind);
  out[1] = static_cast<std::uint8_t>(text);
  put64(out.data() + 2, d.block);
  put64(out.data() + 10, fnv1a(d.plan));
  std::memcpy(out.data() + kDescriptorFixed, d.plan.data(), text);
  return out;
}

bool descriptor_valid(std::span<const std::uint8_t> payload) {
  return payload.size() >= kDescriptorFixed && payload.size() <= kMaxDescriptor && payload[0] <= static_cast<std::uint8_t>(Collective::kBarrier) &&
         payload.size() == kDescriptorFixed + payload[1];
}

std::optional<Descriptor> decode_descriptor(std::span<const std::uint8_t> payload) {
  if (!descriptor_valid(payload)) return std::nullopt;
  Descriptor d;
  d.kind = static_cast<Collective>(payload[0]);
  d.block = get64(payload.data() + 2);
  d.plan.assign(payload.begin() + kDescriptorFixed, payload.end());
  return d;
}

bool same_descriptor(std::span<const std::uint8_t> a, std::span<const std::uint8_t> b) {
  if (a.size() < kDescriptorFixed || b.size() < kDescriptorFixed) return false;
  return a[0] == b[0] && std::memcmp(a.data() + 2, b.data() + 2, kDescriptorFixed - 2) == 0;
}

std::string descriptor_difference(const Descriptor& theirs, const Descriptor& ours) {
  if (theirs.kind != ours.kind) return "called " + what(theirs) + ", this rank " + what(ours);
  if (theirs.block != ours.block)
    return "called " + what(theirs) + ", this rank " + std::to_string(ours.block) + "-byte blocks";
  // Their plan text may be cut to fit the frame; ours is whole.
  const bool cut = ours.plan.size() > theirs.plan.size() && ours.plan.compare(0, theirs.plan.size(), theirs.plan) == 0;
  // Barriers differ only in their radix ("barrier:4"), which aapcd is told per node.
  const std::string_view hint = theirs.kind == Collective::kBarrier ? " (another barrier radix: aapcd --barrier-radix must match on every node)" : "";
  return "called " + std::string(collective_name(theirs.kind)) + " with schedule " + theirs.plan + (cut ? "..." : "") + ", this rank " + ours.plan +
         std::string(hint);
}

}  // namespace aapc::engine

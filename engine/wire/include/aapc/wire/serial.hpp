// Epochs and exchange ids, compared as serial numbers: the executor, the daemon and the
// protocol's tests share them (not installed).
#pragma once

#include <chrono>
#include <cstdint>

namespace aapc::engine {

inline std::uint32_t clock_epoch() {
  // Milliseconds of wall-clock time: a restarted daemon gets a later epoch.
  auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch()).count();
  auto e = static_cast<std::uint32_t>(ms);
  return e == 0 ? 1 : e;
}

// Serial-number comparison (RFC 1982): is a later than b?
inline bool later(std::uint32_t a, std::uint32_t b) { return static_cast<std::int32_t>(a - b) > 0; }

// Exchange ids: a group slot in the top 8 bits (kWorldSlot: the cluster-wide
// session), a sequence below, numbered per slot. Ids of one slot compare as 24-bit serial
// numbers; ids of different slots are unordered.
inline constexpr unsigned kSlotShift = 24;
inline constexpr std::uint32_t kSeqMask = (1U << kSlotShift) - 1;
inline constexpr std::uint32_t kWorldSlot = 0;
inline constexpr std::uint32_t kSlots = 256;
inline std::uint32_t id_slot(std::uint32_t id) { return id >> kSlotShift; }
inline std::uint32_t id_seq(std::uint32_t id) { return id & kSeqMask; }
inline std::uint32_t make_id(std::uint32_t slot, std::uint32_t seq) { return (slot << kSlotShift) | (seq & kSeqMask); }
// The id after `id` in its slot.
inline std::uint32_t next_id_of(std::uint32_t id) { return make_id(id_slot(id), id_seq(id) + 1); }
// Is a later than b? False for ids of different slots.
inline bool later_id(std::uint32_t a, std::uint32_t b) {
  return id_slot(a) == id_slot(b) && static_cast<std::int32_t>((a - b) << (32 - kSlotShift)) > 0;
}
// How far a comes after b in their slot (0 for different slots or when a is not later).
inline std::uint32_t id_distance(std::uint32_t a, std::uint32_t b) { return later_id(a, b) ? id_seq(a - b) : 0; }

}  // namespace aapc::engine

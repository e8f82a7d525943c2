// Helpers shared by the engine's sources (not installed).
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

}  // namespace aapc::engine

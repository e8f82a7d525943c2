// libaapc-mpi's settings from the environment (AAPC_MPI, AAPC_MPI_BELL, AAPC_MPI_VERBOSE,
// AAPC_MPI_LONGEST_NAP_US, and libaapc-mpich-yield.so's AAPC_EMU_NAP_AFTER_US): one reading of
// "on", "off" and a number for all of them. Header-only and without MPI.
#pragma once

#include <cstdlib>
#include <cstring>
#include <optional>

namespace aapc::mpi {

// Set to "off" or "0".
inline bool env_off(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr && (std::strcmp(v, "off") == 0 || std::strcmp(v, "0") == 0);
}

// Set to anything but "", "off" or "0".
inline bool env_on(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' && !env_off(name);
}

// A whole decimal number in [lo, hi]; nothing when unset, not a number, or out of range.
inline std::optional<long long> env_integer(const char* name, long long lo, long long hi) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return std::nullopt;
  char* end = nullptr;
  const long long n = std::strtoll(v, &end, 10);
  if (*end != '\0' || n < lo || n > hi) return std::nullopt;
  return n;
}

}  // namespace aapc::mpi

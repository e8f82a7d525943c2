// Where tests find the shipped topologies.
#pragma once
#include <string>

namespace aapc::test {
inline std::string topology_path(const std::string& name) { return std::string(AAPC_TEST_TOPOLOGIES) + "/" + name + ".dot"; }
}  // namespace aapc::test

#include <cstdlib>

namespace aapc::test {
// Iteration counts of the randomised tests, times $AAPC_TEST_SCALE (default 1). The sanitizer
// pass of tools/run-tests runs a tenth: it looks for memory errors, not for rare trees.
inline int scaled(int n) {
  const char* env = std::getenv("AAPC_TEST_SCALE");
  double scale = env != nullptr ? std::atof(env) : 1.0;
  if (!(scale > 0)) scale = 1.0;
  int out = static_cast<int>(n * scale);
  return out < 1 ? 1 : out;
}
}  // namespace aapc::test

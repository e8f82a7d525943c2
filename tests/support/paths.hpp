// Where tests find the shipped topologies.
#pragma once
#include <string>

namespace aapc::test {
inline std::string topology_path(const std::string& name) { return std::string(AAPC_TEST_TOPOLOGIES) + "/" + name + ".dot"; }
}  // namespace aapc::test

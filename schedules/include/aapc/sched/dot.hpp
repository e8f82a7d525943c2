// Reading topology files (Graphviz DOT, parsed with graphviz's cgraph).
//
// The format: an undirected `graph`; a node with a `mac` attribute is a machine, every other
// node a switch; each edge is a full-duplex link with an optional `rate` ("100Mbit", "1Gbit";
// default 1Gbit); optional graph attribute `mtu` (default 1500); optional switch attribute
// `buffer` (bytes per port, used by emulation); machine rank = order of declaration unless
// every machine has a `rank` attribute.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "aapc/sched/topology.hpp"

namespace aapc::sched {

// Parses DOT text into a spec (no validation beyond DOT syntax). Throws TopologyError.
TopologySpec read_dot(std::string_view text, const std::string& source);

// Reads and validates a topology file. `path` may also name a shipped topology ("8-two-switch"
// finds <topologies>/8-two-switch.dot). Throws TopologyError with the file name.
Topology load_topology(const std::string& path);

// Where shipped topologies are looked up: $AAPC_TOPOLOGIES, else the directory compiled in.
std::string topologies_dir();

// Writes a topology back as DOT (used by tools that generate topologies); with `rate`, every
// link runs at that rate instead.
std::string to_dot(const Topology& topology, std::optional<std::uint64_t> rate = std::nullopt);

}  // namespace aapc::sched

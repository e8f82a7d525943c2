// net_ring ports for tests that run daemons in-process (vdev daemon and sparse): a ring, and
// an ethdev that receives from one ring and sends into another. Call after test::start_eal().
#pragma once

#include <rte_eth_ring.h>
#include <rte_ethdev.h>
#include <rte_lcore.h>
#include <rte_ring.h>

#include <catch2/catch.hpp>

#include <cstdint>
#include <string>

namespace aapc::test {

inline rte_ring* ring(const std::string& name) {
  rte_ring* r = rte_ring_create(name.c_str(), 1024, static_cast<int>(rte_socket_id()), RING_F_SP_ENQ | RING_F_SC_DEQ);
  REQUIRE(r != nullptr);
  return r;
}

// An ethdev receiving from `rx` and sending into `tx`; its name.
inline std::string ring_port(const std::string& name, rte_ring* rx, rte_ring* tx) {
  const int port = rte_eth_from_rings(name.c_str(), &rx, 1, &tx, 1, rte_socket_id());
  REQUIRE(port >= 0);
  char full[RTE_ETH_NAME_MAX_LEN];
  rte_eth_dev_get_name_by_port(static_cast<std::uint16_t>(port), full);
  return full;
}

}  // namespace aapc::test

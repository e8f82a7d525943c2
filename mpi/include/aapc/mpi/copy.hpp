// Single-copy hand-overs between the ranks of a machine: the leader copies a local
// rank's blocks straight from that process's memory into its staging, and back, with Linux's
// process_vm_readv/process_vm_writev (cross-memory attach, as Open MPI's shared-memory
// transport does for large messages). One copy, made by the leader alone: the other process
// need not run meanwhile. No MPI here: the unit suite runs it against its own process.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "aapc/mpi/layout.hpp"

namespace aapc::mpi {

// Copies between this process and process `pid`: local[i] (at local_base + offset) and
// remote[i] (at remote_base + offset in `pid`), for every i; each pair has one length.
// `into_remote`: from here to there (process_vm_writev), else from there to here. With `pid`
// this process, memcpy. Empty on success, else what failed, in words.
std::string copy_pieces(int pid, bool into_remote, std::uint8_t* local_base, const std::vector<Piece>& local, std::uint64_t remote_base,
                        const std::vector<Piece>& remote);

// Whether this process may read process `pid`'s memory: it reads the 8 bytes at `address`
// there and compares them with `expected`. Empty if so, else why not (e.g. the kernel's
// ptrace rules: Yama's ptrace_scope, a container's seccomp profile).
std::string can_reach(int pid, std::uint64_t address, std::uint64_t expected);

}  // namespace aapc::mpi

// A process's doorbell: a datagram socket in Linux's abstract namespace, named
// after the process's pid, that the other processes of its machine ring when they have left
// it something to read in its own memory (single_copy.hpp: a rank's description for its
// leader, the leader's word that a call is over). A waiting process pauses on its bell rather
// than sleeping, and wakes as soon as it rings; the pause still ends when it is due, so a bell
// that cannot be made (AAPC_MPI_BELL=off), or a ring that is lost, costs what the pause would
// have anyway. Anyone in the machine's network namespace may ring it: a ring is a reason to
// look, nothing more. No MPI here: the unit suite checks it.
#pragma once

#include <chrono>

namespace aapc::mpi::bell {

// Makes this process's bell now, if it can: rings before it exists are lost.
void open();

// Rings process `pid`'s bell; never blocks, and does nothing where it has none.
void ring(int pid);

// Waits until this process's bell rings or `most` has passed. True when it rang (every ring
// so far is taken).
bool pause(std::chrono::microseconds most);

}  // namespace aapc::mpi::bell

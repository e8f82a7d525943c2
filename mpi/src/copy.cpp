// The single-copy hand-overs of aapc/mpi/copy.hpp.
#include "aapc/mpi/copy.hpp"

#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>

namespace aapc::mpi {

namespace {

// One call moves at most this much: the kernel caps a call's total at MAX_RW_COUNT (2 GiB
// less a page) and then moves less than asked.
constexpr std::uint64_t kMostPerCall = 1ULL << 30;
constexpr std::size_t kMostPieces = IOV_MAX;  // per side and call

std::string why(int err, int pid) {
  switch (err) {
    case EPERM:
      return "the kernel does not let this process reach process " + std::to_string(pid) +
             "'s memory (ptrace rules: Yama's ptrace_scope, seccomp; AAPC_MPI_HANDOVER=mpi hands over through the MPI instead)";
    case ESRCH: return "process " + std::to_string(pid) + " is gone";
    case EFAULT: return "an address outside process " + std::to_string(pid) + "'s memory (a buffer shorter than its counts say?)";
    case ENOSYS: return "this kernel has no process_vm_readv";
    default: return std::string("process_vm_readv/writev of process ") + std::to_string(pid) + ": " + std::strerror(err);
  }
}

}  // namespace

std::string copy_pieces(int pid, bool into_remote, std::uint8_t* local_base, const std::vector<Piece>& local, std::uint64_t remote_base,
                        const std::vector<Piece>& remote) {
  if (local.size() != remote.size()) return "a hand-over of " + std::to_string(local.size()) + " blocks into " + std::to_string(remote.size());
  for (std::size_t i = 0; i < local.size(); ++i)
    if (local[i].length != remote[i].length)
      return "a hand-over's block " + std::to_string(i) + " is " + std::to_string(remote[i].length) + " bytes there and " +
             std::to_string(local[i].length) + " here";
  if (pid == ::getpid()) {
    for (std::size_t i = 0; i < local.size(); ++i) {
      if (local[i].length == 0) continue;
      auto* here = local_base + local[i].offset;
      auto* there = reinterpret_cast<std::uint8_t*>(remote_base + remote[i].offset);  // NOLINT(performance-no-int-to-ptr)
      std::memcpy(into_remote ? there : here, into_remote ? here : there, local[i].length);
    }
    return "";
  }
  std::vector<iovec> here, there;
  here.reserve(std::min(local.size(), kMostPieces));
  there.reserve(here.capacity());
  std::size_t i = 0;   // the piece where the next call starts
  std::uint64_t at = 0;  // ... and how much of it has moved
  for (;;) {
    while (i < local.size() && at == local[i].length) ++i, at = 0;
    if (i == local.size()) return "";
    here.clear();
    there.clear();
    std::uint64_t asked = 0;
    for (std::size_t k = i; k < local.size() && here.size() < kMostPieces && asked < kMostPerCall; ++k) {
      const std::uint64_t from = k == i ? at : 0;
      const std::uint64_t len = std::min(local[k].length - from, kMostPerCall - asked);
      if (len == 0) continue;
      here.push_back({local_base + local[k].offset + from, len});
      there.push_back({reinterpret_cast<void*>(remote_base + remote[k].offset + from), len});  // NOLINT(performance-no-int-to-ptr)
      asked += len;
    }
    const ssize_t moved = into_remote ? ::process_vm_writev(pid, here.data(), here.size(), there.data(), there.size(), 0)
                                      : ::process_vm_readv(pid, here.data(), here.size(), there.data(), there.size(), 0);
    if (moved < 0) return why(errno, pid);
    if (moved == 0) return why(EFAULT, pid);  // the first piece could not move at all
    // A partial move stops at a piece's end, or at the kernel's cap: go on from there.
    for (auto left = static_cast<std::uint64_t>(moved); left > 0;) {
      const std::uint64_t step = std::min(left, local[i].length - at);
      at += step;
      left -= step;
      while (i < local.size() && at == local[i].length) ++i, at = 0;
    }
  }
}

std::string can_reach(int pid, std::uint64_t address, std::uint64_t expected) {
  std::uint64_t got = 0;
  std::uint8_t* base = reinterpret_cast<std::uint8_t*>(&got);
  std::string failed = copy_pieces(pid, false, base, {{0, sizeof got}}, address, {{0, sizeof got}});
  if (!failed.empty()) return failed;
  return got == expected ? "" : "process " + std::to_string(pid) + "'s probe read back wrong";
}

}  // namespace aapc::mpi

// The client buffers the daemon maps (not installed), and their release: a buffer whose bytes
// frames still carry (payload sent without a copy, nic/extmem.hpp) stays mapped until those
// frames are gone, whenever the client freed it or left. Header-only: tests use it alone.
#pragma once

#include <sys/mman.h>
#include <sys/types.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <vector>

#include "aapc/nic/extmem.hpp"

namespace aapc::engine {

// A client's buffer, mapped from the memory file it passed (from its start), sealed against
// shrinking and growing. Two buffers of one file (device and inode) are the same memory.
struct Mapping {
  std::uint8_t* data = nullptr;
  std::uint64_t size = 0;
  dev_t dev = 0;
  ino_t ino = 0;
  // The buffer as memory that frames may carry without a copy.
  std::unique_ptr<nic::ExternalRegion> region;
  bool same_memory(const Mapping& o) const { return dev == o.dev && ino == o.ino; }
  bool in_flight() const { return region && region->in_flight() > 0; }
};

// Unmaps buffers, at once or once no frame refers to them any more.
class Unmapper {
 public:
  Unmapper() = default;
  Unmapper(const Unmapper&) = delete;
  Unmapper& operator=(const Unmapper&) = delete;
  // What still has frames in flight now stays mapped: the process is going away, and a
  // frame read from unmapped memory would crash it first.
  ~Unmapper() {
    reap();
    for (auto& m : held_) (void)m.region.release();  // their frames' callbacks still count on it
  }

  void release(Mapping m) {
    if (m.in_flight()) {
      held_.push_back(std::move(m));
    } else {
      ::munmap(m.data, m.size);
    }
  }
  // Unmaps the held buffers whose frames are gone; cheap when none is held.
  void reap() {
    if (held_.empty()) return;
    auto gone = std::stable_partition(held_.begin(), held_.end(), [](const Mapping& m) { return m.in_flight(); });
    for (auto it = gone; it != held_.end(); ++it) ::munmap(it->data, it->size);
    held_.erase(gone, held_.end());
  }
  // Buffers freed but still mapped for their frames.
  std::size_t held() const { return held_.size(); }

 private:
  std::vector<Mapping> held_;
};

}  // namespace aapc::engine

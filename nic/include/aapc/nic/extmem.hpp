// Memory that frames carry without a copy: the payload of a frame is an
// mbuf attached to the sender's own buffer (rte_pktmbuf_attach_extbuf), chained behind a
// header mbuf. The buffer must then stay mapped, and unchanged, until every frame that
// refers to it has left the port: in_flight() says how many still may.
//
// Only ports that take chained frames and move them without DMA use it (Port::zero_copy_tx:
// net_ring, af_packet, memif). A PCI NIC would also need the region registered with
// rte_extmem_register and mapped with rte_dev_dma_map; that is not done here.
//
// Thread safety: attach() is called by one thread (the engine's); the frames may be freed
// on any thread (a net_ring receiver), which in_flight() sees.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

struct rte_mbuf;
struct rte_mempool;

namespace aapc::nic {

class ExternalRegion {
 public:
  ExternalRegion(const void* addr, std::size_t len) : addr_(static_cast<const std::uint8_t*>(addr)), len_(len) {}
  ExternalRegion(const ExternalRegion&) = delete;
  ExternalRegion& operator=(const ExternalRegion&) = delete;
  ~ExternalRegion() = default;  // the owner waits for in_flight() == 0 first

  const std::uint8_t* data() const { return addr_; }
  std::size_t size() const { return len_; }
  bool contains(const std::uint8_t* p, std::size_t n) const { return p >= addr_ && n <= len_ && p - addr_ <= static_cast<std::ptrdiff_t>(len_ - n); }
  // Frames attached to this region and not yet freed.
  std::uint64_t in_flight() const {
    const std::uint64_t freed = freed_.load(std::memory_order_acquire);
    return attached_.load(std::memory_order_acquire) - freed;
  }
  // Frames ever attached to this region.
  std::uint64_t attached() const { return attached_.load(std::memory_order_relaxed); }

  // An mbuf (of external_pool()) whose data is [p, p + n) of this region, n > 0; nullptr when
  // the pool is empty or the bytes are not all in the region.
  rte_mbuf* attach(const std::uint8_t* p, std::uint16_t n) const;

 private:
  static void release(void* addr, void* opaque);

  const std::uint8_t* addr_;
  std::size_t len_;
  // Two counters, not one: only the attaching thread writes attached_ (no locked instruction
  // per frame), the threads that free frames count freed_.
  mutable std::atomic<std::uint64_t> attached_{0};
  mutable std::atomic<std::uint64_t> freed_{0};
};

// The pool of the mbufs that carry external buffers: no data room of their own, a private
// area that holds their buffer's shared info (refcount and free callback). Made on first use.
rte_mempool* external_pool();

}  // namespace aapc::nic

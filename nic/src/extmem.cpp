#include "aapc/nic/extmem.hpp"

#include <rte_eal.h>
#include <rte_lcore.h>
#include <rte_mbuf.h>
#include <rte_mempool.h>

#include <mutex>

namespace aapc::nic {
namespace {

constexpr unsigned kPoolSize = 16383;
constexpr std::uint16_t kPrivSize = RTE_ALIGN(sizeof(rte_mbuf_ext_shared_info), RTE_MBUF_PRIV_ALIGN);

}  // namespace

rte_mempool* external_pool() {
  static std::mutex mutex;
  static rte_mempool* pool = nullptr;
  const std::lock_guard<std::mutex> lock(mutex);
  if (pool == nullptr) pool = rte_mempool_lookup("aapc_ext_pool");
  if (pool == nullptr) pool = rte_pktmbuf_pool_create("aapc_ext_pool", kPoolSize, 256, kPrivSize, 0, static_cast<int>(rte_socket_id()));
  return pool;
}

void ExternalRegion::release(void* /*addr*/, void* opaque) {
  static_cast<const ExternalRegion*>(opaque)->freed_.fetch_add(1, std::memory_order_acq_rel);
}

rte_mbuf* ExternalRegion::attach(const std::uint8_t* p, std::uint16_t n) const {
  if (n == 0 || !contains(p, n)) return nullptr;
  rte_mempool* pool = external_pool();
  rte_mbuf* m = pool != nullptr ? rte_pktmbuf_alloc(pool) : nullptr;
  if (m == nullptr) return nullptr;
  // The shared info lives in the mbuf's own private area: one per frame, so that its 16-bit
  // refcount never counts more than one frame, and it stays valid until the callback ran
  // (the mbuf returns to its pool only after that).
  auto* shinfo = static_cast<rte_mbuf_ext_shared_info*>(rte_mbuf_to_priv(m));
  shinfo->free_cb = &ExternalRegion::release;
  shinfo->fcb_opaque = const_cast<ExternalRegion*>(this);
  rte_mbuf_ext_refcnt_set(shinfo, 1);
  attached_.store(attached_.load(std::memory_order_relaxed) + 1, std::memory_order_release);  // one writer
  void* addr = const_cast<std::uint8_t*>(p);  // frames only read it
  const rte_iova_t iova = rte_eal_iova_mode() == RTE_IOVA_VA ? reinterpret_cast<rte_iova_t>(addr) : RTE_BAD_IOVA;
  rte_pktmbuf_attach_extbuf(m, addr, iova, n, shinfo);
  m->data_len = n;
  m->pkt_len = n;
  return m;
}

}  // namespace aapc::nic

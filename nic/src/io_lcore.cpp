#include "aapc/nic/io_lcore.hpp"

#include <pthread.h>
#include <rte_lcore.h>
#include <rte_mbuf.h>
#include <rte_mbuf_dyn.h>
#include <rte_ring.h>
#include <sched.h>
#include <sys/prctl.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <mutex>

#include "aapc/nic/eal.hpp"

namespace aapc::nic {
namespace {

constexpr std::uint16_t kBurst = 32;

// A dynamic ol_flags bit (registered once per process, the same for every port): that a
// received frame's integrity was checked, or that a frame to send is still to be sealed.
std::uint64_t dynflag(const char* name) {
  static std::mutex mutex;
  const std::lock_guard<std::mutex> lock(mutex);
  rte_mbuf_dynflag desc{};
  std::strncpy(desc.name, name, sizeof desc.name - 1);
  const int bit = rte_mbuf_dynflag_register(&desc);  // the same bit again for a name registered before
  if (bit < 0) throw NicError(std::string("cannot register DPDK's dynamic mbuf flag ") + name + " for I/O lcores");
  return 1ULL << static_cast<unsigned>(bit);
}

std::atomic<unsigned> g_ring_serial{0};

rte_ring* make_ring(const std::string& what, unsigned size) {
  const std::string name = "aapc_io" + what + std::to_string(g_ring_serial.fetch_add(1));
  rte_ring* r = rte_ring_create(name.c_str(), size, static_cast<int>(rte_socket_id()), RING_F_SP_ENQ | RING_F_SC_DEQ);
  if (r == nullptr) throw NicError("cannot create ring " + name + " for an I/O lcore (is the EAL's memory exhausted? raise -m)");
  return r;
}

void free_all(rte_ring* ring) {
  if (ring == nullptr) return;
  rte_mbuf* m[kBurst];
  while (unsigned n = rte_ring_sc_dequeue_burst(ring, reinterpret_cast<void**>(m), kBurst, nullptr)) rte_pktmbuf_free_bulk(m, n);
}

}  // namespace

OffloadPort::OffloadPort(Port& inner, unsigned ring_size) : PortDecorator(inner, "+io-lcore") {
  if (!eal_running()) throw NicError("an I/O lcore needs the DPDK EAL running (open the port first)");
  if (ring_size < 64 || (ring_size & (ring_size - 1)) != 0) throw NicError("I/O lcore ring size must be a power of two, at least 64");
  rx_ring_ = make_ring("rx", ring_size);
  tx_ring_ = make_ring("tx", ring_size);
  rx_flag_ = dynflag("aapc_rx_verified");
  tx_flag_ = dynflag("aapc_tx_seal");
}

OffloadPort::~OffloadPort() {
  free_all(rx_ring_);
  free_all(tx_ring_);
  rte_ring_free(rx_ring_);
  rte_ring_free(tx_ring_);
}

std::uint16_t OffloadPort::rx_burst(rte_mbuf** pkts, std::uint16_t n) {
  if (rx_.lcore == nullptr) return inner_.rx_burst(pkts, n);
  return static_cast<std::uint16_t>(rte_ring_sc_dequeue_burst(rx_ring_, reinterpret_cast<void**>(pkts), n, nullptr));
}

std::uint16_t OffloadPort::tx_burst(rte_mbuf** pkts, std::uint16_t n) {
  if (tx_.lcore == nullptr) return inner_.tx_burst(pkts, n);
  return static_cast<std::uint16_t>(rte_ring_sp_enqueue_burst(tx_ring_, reinterpret_cast<void**>(pkts), n, nullptr));
}

std::uint32_t OffloadPort::tx_pending() const { return rte_ring_count(tx_ring_) + lcore_held_.load(std::memory_order_acquire); }

IoLcore::IoLcore(IoLcoreOptions options) : options_(std::move(options)) {}

IoLcore::~IoLcore() { stop(); }

void IoLcore::claim(OffloadPort& port, OffloadPort::Side& side, const OffloadPort::Side& other, FrameHook hook, const char* what) {
  if (thread_.joinable()) throw NicError("I/O lcore " + options_.name + ": ports are added before it starts");
  if (side.lcore != nullptr) throw NicError(port.name() + ": its " + what + " side is served by an I/O lcore already");
  if (other.lcore != nullptr && other.lcore != this && !port.inner_.directions_apart())
    throw NicError(port.inner_.name() + " keeps state across its two directions: serve both by one I/O lcore");
  side.lcore = this;
  side.hooked = hook.fn != nullptr;
}

void IoLcore::serve_rx(OffloadPort& port, FrameHook hook) {
  claim(port, port.rx_, port.tx_, hook, "receive");
  rx_.push_back({&port, hook, {}});
}

void IoLcore::serve_tx(OffloadPort& port, FrameHook hook) {
  claim(port, port.tx_, port.rx_, hook, "transmit");
  tx_.push_back({&port, hook, {}});
}

void IoLcore::start() {
  if (thread_.joinable()) return;
  if (!eal_running()) throw NicError("I/O lcore " + options_.name + ": the DPDK EAL is not running");
  const int cpus = static_cast<int>(std::thread::hardware_concurrency());
  if (options_.core >= cpus) throw NicError("I/O lcore " + options_.name + ": no CPU " + std::to_string(options_.core) + " (this machine has " + std::to_string(cpus) + ")");
  if (options_.core >= 0) {
    // A CPU outside the process's set (taskset, a batch job's binding) belongs to someone
    // else: spinning there would take another job's core, or fail in a cpuset. The set as it
    // was before the EAL started, not the calling thread's: with -l the EAL pins that thread.
    const std::vector<int> allowed = allowed_cpus();
    if (!allowed.empty() && std::find(allowed.begin(), allowed.end(), options_.core) == allowed.end())
      throw NicError("I/O lcore " + options_.name + ": CPU " + std::to_string(options_.core) +
                     " is outside this process's CPU set; give one that taskset -p (or the job's allocation) allows");
  }
  stop_.store(false);
  thread_ = std::thread([this] { run(); });
  pthread_setname_np(thread_.native_handle(), options_.name.substr(0, 15).c_str());
  if (options_.core >= 0) {
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(static_cast<unsigned>(options_.core), &set);
    if (const int rc = pthread_setaffinity_np(thread_.native_handle(), sizeof set, &set); rc != 0) {
      stop();
      throw NicError("I/O lcore " + options_.name + ": cannot run on CPU " + std::to_string(options_.core) + " (" + std::strerror(rc) +
                     "): is it outside this process's cpuset? Give a CPU that taskset -p or the job's allocation allows");
    }
  }
}

bool IoLcore::poll_rx(Rx& rx) {
  if (rx.held.empty()) {
    rte_mbuf* m[kBurst];
    const std::uint16_t got = rx.port->inner_.rx_burst(m, kBurst);
    if (got == 0) return false;
    const std::uint64_t flag = rx.port->rx_flag_;
    for (std::uint16_t i = 0; i < got; ++i) m[i]->ol_flags &= ~flag;  // only our hook says so
    if (rx.hook.fn != nullptr) rx.hook.fn(m, got, flag, rx.hook.context);
    rx.held.assign(m, m + got);
  }
  // A full ring holds the burst here, and the device's own ring fills behind it: the engine
  // is behind, and the device drops what it cannot keep, as it would without this lcore.
  const unsigned put = rte_ring_sp_enqueue_burst(rx.port->rx_ring_, reinterpret_cast<void**>(rx.held.data()), static_cast<unsigned>(rx.held.size()), nullptr);
  rx.held.erase(rx.held.begin(), rx.held.begin() + put);
  return put > 0;
}

bool IoLcore::poll_tx(Tx& tx) {
  bool busy = false;
  if (tx.held.size() < kBurst) {
    rte_mbuf* m[kBurst];
    const unsigned want = kBurst - static_cast<unsigned>(tx.held.size());
    const unsigned got = rte_ring_sc_dequeue_burst(tx.port->tx_ring_, reinterpret_cast<void**>(m), want, nullptr);
    if (got > 0 && tx.hook.fn != nullptr) tx.hook.fn(m, static_cast<std::uint16_t>(got), tx.port->tx_flag_, tx.hook.context);
    tx.held.insert(tx.held.end(), m, m + got);
    busy = got > 0;
  }
  tx.port->lcore_held_.store(static_cast<std::uint32_t>(tx.held.size()), std::memory_order_release);
  if (tx.held.empty()) return busy;
  const std::uint16_t sent = tx.port->inner_.tx_burst(tx.held.data(), static_cast<std::uint16_t>(tx.held.size()));
  tx.held.erase(tx.held.begin(), tx.held.begin() + sent);
  tx.port->lcore_held_.store(static_cast<std::uint32_t>(tx.held.size()), std::memory_order_release);
  return busy || sent > 0;
}

void IoLcore::run() {
  // A DPDK lcore id of its own: mempool caches then serve this thread (frames freed after
  // sending, frames allocated by the driver on receive). Without a free id it still works.
  const bool registered = rte_thread_register() == 0;
  ::prctl(PR_SET_TIMERSLACK, 1000UL, 0, 0, 0);  // its short sleeps when idle stay short
  unsigned idle = 0;
  while (!stop_.load(std::memory_order_acquire)) {
    bool busy = false;
    for (Rx& rx : rx_) busy = poll_rx(rx) || busy;
    for (Tx& tx : tx_) busy = poll_tx(tx) || busy;
    if (busy) {
      idle = 0;
    } else if (++idle > 4096) {
      // Long idle (no exchange runs): yield the core now and then rather than spin on it.
      std::this_thread::sleep_for(std::chrono::microseconds(idle > 65536 ? 100 : 10));
    }
  }
  // What the engine sent before stopping still leaves, for up to a second.
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(1);
  for (Tx& tx : tx_) {
    while ((!tx.held.empty() || rte_ring_count(tx.port->tx_ring_) > 0) && std::chrono::steady_clock::now() < until) poll_tx(tx);
    rte_pktmbuf_free_bulk(tx.held.data(), static_cast<unsigned>(tx.held.size()));
    tx.held.clear();
    tx.port->lcore_held_.store(0, std::memory_order_release);
  }
  for (Rx& rx : rx_) {
    rte_pktmbuf_free_bulk(rx.held.data(), static_cast<unsigned>(rx.held.size()));
    rx.held.clear();
  }
  if (registered) rte_thread_unregister();
}

void IoLcore::stop() {
  if (!thread_.joinable()) return;
  stop_.store(true, std::memory_order_release);
  thread_.join();
}

}  // namespace aapc::nic

#include "aapc/nic/io_lcore.hpp"

#include <pthread.h>
#include <rte_lcore.h>
#include <rte_mbuf.h>
#include <rte_mbuf_dyn.h>
#include <rte_ring.h>
#include <poll.h>
#include <sched.h>
#include <sys/eventfd.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <mutex>

#include "aapc/nic/eal.hpp"

namespace aapc::nic {
namespace {

constexpr std::uint16_t kBurst = 32;
// Rounds of polling with nothing done before an lcore sleeps (a few hundred microseconds:
// frames paced at 100 Mbit/s, one every 120 us at MTU 1500, keep it awake), and how long it
// sleeps at most: a safety net, since frames and the doorbell end the sleep.
constexpr unsigned kSpinRounds = 4096;
constexpr int kNapMs = 50;

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

// Doorbells: an eventfd one thread writes to wake another from poll(2).
int make_bell(const std::string& whose) {
  const int fd = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (fd < 0) throw NicError("cannot make the doorbell of " + whose + " (eventfd: " + std::strerror(errno) + ")");
  return fd;
}

void ring(int bell) {
  const std::uint64_t one = 1;
  (void)!::write(bell, &one, sizeof one);  // EAGAIN: rung already, and not yet heard
}

void hush(int bell) {
  std::uint64_t count = 0;
  (void)!::read(bell, &count, sizeof count);
}

void free_all(rte_ring* ring) {
  if (ring == nullptr) return;
  rte_mbuf* m[kBurst];
  while (unsigned n = rte_ring_sc_dequeue_burst(ring, reinterpret_cast<void**>(m), kBurst, nullptr)) rte_pktmbuf_free_bulk(m, n);
}

}  // namespace

OffloadPort::OffloadPort(Port& inner, unsigned ring_size)
    : PortDecorator(inner, "+io-lcore"), tx_queues_(std::max<std::uint16_t>(inner.tx_queue_count(), 1)) {
  if (!eal_running()) throw NicError("an I/O lcore needs the DPDK EAL running (open the port first)");
  if (ring_size < 64 || (ring_size & (ring_size - 1)) != 0) throw NicError("I/O lcore ring size must be a power of two, at least 64");
  tx_ = std::make_unique<TxQueue[]>(tx_queues_);
  rx_ring_ = make_ring("rx", ring_size);
  for (std::uint16_t q = 0; q < tx_queues_; ++q) tx_[q].ring = make_ring("tx", ring_size);
  rx_flag_ = dynflag("aapc_rx_verified");
  tx_flag_ = dynflag("aapc_tx_seal");
  rx_bell_ = make_bell("the engine of " + inner.name());
}

OffloadPort::~OffloadPort() {
  if (rx_bell_ >= 0) ::close(rx_bell_);
  free_all(rx_ring_);
  rte_ring_free(rx_ring_);
  for (std::uint16_t q = 0; q < tx_queues_; ++q) {
    free_all(tx_[q].ring);
    rte_ring_free(tx_[q].ring);
  }
}

std::uint16_t OffloadPort::rx_burst(rte_mbuf** pkts, std::uint16_t n) {
  if (rx_.lcore == nullptr) return inner_.rx_burst(pkts, n);
  if (rx_rung_.load(std::memory_order_acquire)) {  // heard: quiet the doorbell for the next sleep
    rx_rung_.store(false, std::memory_order_relaxed);
    hush(rx_bell_);
  }
  return static_cast<std::uint16_t>(rte_ring_sc_dequeue_burst(rx_ring_, reinterpret_cast<void**>(pkts), n, nullptr));
}

std::uint16_t OffloadPort::tx_queue_of(const std::uint8_t* dst, std::uint16_t queues) {
  // The MAC's bytes folded: MACs handed out in sequence (aapc-emu's, a cluster's inventory)
  // differ in their last byte, and consecutive ones then fill the queues evenly.
  const unsigned folded = dst[0] ^ dst[1] ^ dst[2] ^ dst[3] ^ dst[4] ^ dst[5];
  return static_cast<std::uint16_t>(folded % queues);
}

std::uint16_t OffloadPort::spread(rte_mbuf** pkts, std::uint16_t n, std::uint64_t& touched) {
  std::uint16_t done = 0;
  while (done < n) {
    // A run of frames for one queue, into its ring at once.
    const std::uint16_t q = tx_queue_of(rte_pktmbuf_mtod(pkts[done], const std::uint8_t*), tx_queues_);
    std::uint16_t end = done + 1;
    while (end < n && tx_queue_of(rte_pktmbuf_mtod(pkts[end], const std::uint8_t*), tx_queues_) == q) ++end;
    const unsigned put = rte_ring_sp_enqueue_burst(tx_[q].ring, reinterpret_cast<void**>(pkts + done), end - done, nullptr);
    if (put > 0) touched |= 1ULL << (q % 64);
    done = static_cast<std::uint16_t>(done + put);
    if (done < end) break;  // that ring is full: the rest waits, in order
  }
  return done;
}

std::uint16_t OffloadPort::tx_burst(rte_mbuf** pkts, std::uint16_t n) {
  if (tx_[0].side.lcore == nullptr) return inner_.tx_burst(pkts, n);
  if (tx_queues_ == 1) {
    const auto put = static_cast<std::uint16_t>(rte_ring_sp_enqueue_burst(tx_[0].ring, reinterpret_cast<void**>(pkts), n, nullptr));
    if (put > 0) wake(0);
    return put;
  }
  std::uint64_t touched = 0;
  const std::uint16_t put = spread(pkts, n, touched);
  for (std::uint16_t q = 0; q < tx_queues_; ++q)
    if ((touched >> (q % 64) & 1) != 0) wake(q);
  return put;
}

void OffloadPort::wake(std::uint16_t q) const {
  // Orders the enqueue before the look at whether the lcore sleeps; nap() orders the other
  // way (its flag before its look at the rings), so one of the two sees the other.
  std::atomic_thread_fence(std::memory_order_seq_cst);
  if (const IoLcore* lcore = tx_[q].side.lcore; lcore != nullptr) lcore->wake();
}

bool OffloadPort::arm_wait() {
  if (rx_.lcore == nullptr) return true;
  engine_asleep_.store(true, std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_seq_cst);  // the flag, then the look at the ring: see wake_engine
  if (rte_ring_count(rx_ring_) == 0) return true;
  engine_asleep_.store(false, std::memory_order_relaxed);
  return false;
}

void OffloadPort::wake_engine() {
  std::atomic_thread_fence(std::memory_order_seq_cst);  // the frames, then the look at the flag
  if (!engine_asleep_.load(std::memory_order_relaxed) || !engine_asleep_.exchange(false)) return;
  ring(rx_bell_);
  rx_rung_.store(true, std::memory_order_release);  // after the write: rx_burst's read then finds it
}

std::uint64_t OffloadPort::tx_seal_flag() const {
  for (std::uint16_t q = 0; q < tx_queues_; ++q)
    if (!tx_[q].side.hooked) return 0;
  return tx_flag_;
}

std::uint32_t OffloadPort::tx_pending() const {
  std::uint32_t n = 0;
  for (std::uint16_t q = 0; q < tx_queues_; ++q) n += rte_ring_count(tx_[q].ring) + tx_[q].held.load(std::memory_order_acquire);
  return n;
}

IoLcore::IoLcore(IoLcoreOptions options) : options_(std::move(options)) {}

IoLcore::~IoLcore() {
  stop();
  if (bell_ >= 0) ::close(bell_);
}

void IoLcore::wake() const {
  if (asleep_.load(std::memory_order_relaxed) && bell_ >= 0) ring(bell_);
}

void IoLcore::nap() {
  asleep_.store(true, std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_seq_cst);  // see OffloadPort::wake
  // Frames the engine put into a ring before it could see this lcore asleep, frames a full
  // ring or a busy device holds back: no sleep, or a short one.
  bool waiting = false, held = false;
  for (const Tx& tx : tx_) {
    waiting = waiting || rte_ring_count(tx.port->tx_[tx.queue].ring) > 0;
    held = held || !tx.held.empty();
  }
  for (const Rx& rx : rx_) held = held || !rx.held.empty();
  if (!waiting) {
    if (held || polled_only_) {
      std::this_thread::sleep_for(std::chrono::microseconds(held ? 10 : 100));
    } else {
      naps_.fetch_add(1, std::memory_order_relaxed);
      if (::poll(nap_fds_.data(), nap_fds_.size(), kNapMs) > 0 && (nap_fds_[0].revents & POLLIN) != 0) {
        hush(bell_);
        doorbells_.fetch_add(1, std::memory_order_relaxed);
      }
    }
  }
  asleep_.store(false, std::memory_order_relaxed);
}

void IoLcore::claim(OffloadPort& port, OffloadPort::Side& side, const OffloadPort::Side& other, FrameHook hook, const char* what) {
  if (thread_.joinable()) throw NicError("I/O lcore " + options_.name + ": ports are added before it starts");
  if (side.lcore != nullptr) throw NicError(port.name() + ": its " + what + " side is served by an I/O lcore already");
  if (other.lcore != nullptr && other.lcore != this && !port.inner_.directions_apart())
    throw NicError(port.inner_.name() + " keeps state across its two directions: serve both by one I/O lcore");
  side.lcore = this;
  side.hooked = hook.fn != nullptr;
}

void IoLcore::serve_rx(OffloadPort& port, FrameHook hook) {
  claim(port, port.rx_, port.tx_[0].side, hook, "receive");  // a port of several queues keeps no state across them
  rx_.push_back({&port, hook, {}});
}

void IoLcore::serve_tx(OffloadPort& port, FrameHook hook, std::uint16_t queue) {
  if (queue >= port.tx_queues_)
    throw NicError(port.inner_.name() + " has " + std::to_string(port.tx_queues_) + " transmit queue(s): no queue " + std::to_string(queue));
  claim(port, port.tx_[queue].side, port.rx_, hook, "transmit");
  tx_.push_back({&port, hook, queue, {}});
}

void IoLcore::start() {
  if (thread_.joinable()) return;
  if (!eal_running()) throw NicError("I/O lcore " + options_.name + ": the DPDK EAL is not running");
  for (const Tx& tx : tx_)
    for (std::uint16_t q = 0; q < tx.port->tx_queues_; ++q)
      if (tx.port->tx_[q].side.lcore == nullptr)
        throw NicError("I/O lcore " + options_.name + ": transmit queue " + std::to_string(q) + " of " + tx.port->inner_.name() +
                       " has no I/O lcore, and frames for it would never leave; serve every queue, or open the port with fewer");
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
  if (bell_ < 0) bell_ = make_bell("I/O lcore " + options_.name);
  // Where it naps: its doorbell, and each device it receives from. A device without
  // descriptors (a ring, a pcap file) is polled: short sleeps instead.
  nap_fds_.assign(1, {bell_, POLLIN, 0});
  polled_only_ = false;
  for (const Rx& rx : rx_) {
    const std::vector<int> wait = rx.port->inner_.wait_fds();
    polled_only_ = polled_only_ || wait.empty();
    for (int fd : wait) nap_fds_.push_back({fd, POLLIN, 0});
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
  if (put > 0) rx.port->wake_engine();
  return put > 0;
}

bool IoLcore::poll_tx(Tx& tx) {
  OffloadPort::TxQueue& queue = tx.port->tx_[tx.queue];
  bool busy = false;
  if (tx.held.size() < kBurst) {
    rte_mbuf* m[kBurst];
    const unsigned want = kBurst - static_cast<unsigned>(tx.held.size());
    const unsigned got = rte_ring_sc_dequeue_burst(queue.ring, reinterpret_cast<void**>(m), want, nullptr);
    if (got > 0 && tx.hook.fn != nullptr) tx.hook.fn(m, static_cast<std::uint16_t>(got), tx.port->tx_flag_, tx.hook.context);
    tx.held.insert(tx.held.end(), m, m + got);
    busy = got > 0;
  }
  queue.held.store(static_cast<std::uint32_t>(tx.held.size()), std::memory_order_release);
  if (tx.held.empty()) return busy;
  const std::uint16_t sent = tx.port->inner_.tx_burst_on(tx.queue, tx.held.data(), static_cast<std::uint16_t>(tx.held.size()));
  tx.held.erase(tx.held.begin(), tx.held.begin() + sent);
  queue.held.store(static_cast<std::uint32_t>(tx.held.size()), std::memory_order_release);
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
    } else if (++idle > kSpinRounds) {
      // Idle (no exchange runs, or it waits for peers): leave the core to others.
      nap();
      idle = 0;
    }
  }
  // What the engine sent before stopping still leaves, for up to a second.
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(1);
  for (Tx& tx : tx_) {
    OffloadPort::TxQueue& queue = tx.port->tx_[tx.queue];
    while ((!tx.held.empty() || rte_ring_count(queue.ring) > 0) && std::chrono::steady_clock::now() < until) poll_tx(tx);
    rte_pktmbuf_free_bulk(tx.held.data(), static_cast<unsigned>(tx.held.size()));
    tx.held.clear();
    queue.held.store(0, std::memory_order_release);
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
  ring(bell_);  // out of a nap now
  thread_.join();
}

}  // namespace aapc::nic

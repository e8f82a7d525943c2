#include "aapc/daemon/daemon.hpp"

#include <poll.h>
#include <sys/epoll.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <spdlog/spdlog.h>

#include <ctime>
#include <stdexcept>
#include <thread>

#include "aapc/sched/dot.hpp"
#include "daemon_impl.hpp"

namespace aapc::engine {

[[noreturn]] void fail(const std::string& what) { throw std::runtime_error(what); }

std::int64_t cpu_now() {
  timespec t{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return static_cast<std::int64_t>(t.tv_sec) * 1'000'000'000 + t.tv_nsec;
}

Daemon::Impl::~Impl() {
  io_lcores.clear();  // they send what is queued, then nothing touches the port or the buffers
  for (auto& [fd, c] : clients) close_client_resources(c);
  if (epoll_fd >= 0) ::close(epoll_fd);
  if (listen_fd >= 0) ::close(listen_fd);
  if (bound) ::unlink(cfg.socket_path.c_str());
  engine.reset();
  offload.reset();
  capture.reset();
  faults.reset();
  eth.reset();
}

// --- the loop -------------------------------------------------------------------------------
void Daemon::Impl::collect_finished() {
  for (auto& rep : engine->take_finished()) {
    const auto& k = rep.counters;  // once per exchange, the daemon's own (a pattern's agreement) too
    spdlog::debug("exchange {} ended: {} data frames sent ({} resent), {} received; control {} sent, {} received; NACKs {} sent, "
                  "{} received; polls {}, pings {}, tokens {} ({} resent), READYs resent {}; {:.3f} ms, {:.3f} ms of it waiting for peers, "
                  "{:.3f} ms of pacing lost to late wake-ups",
                  rep.id, k.data_frames_sent, k.retransmitted_frames, k.data_frames_received, k.control_frames_sent, k.control_frames_received,
                  k.nacks_sent, k.nacks_received, k.polls_sent, k.pings_sent, k.syncs_sent, k.syncs_resent, k.readies_resent, static_cast<double>(rep.duration_ns) / 1e6,
                  static_cast<double>(k.wait_ns) / 1e6, static_cast<double>(k.pace_lost_ns) / 1e6);
    if (!counted(rep)) finished(rep);
  }
  launch_waiting();
  joins();
  unmapper.reap();
  if (!bounded_waits.empty()) expire_bounded_waits(Clock::now());
}

// The client's exchange `rep.id` is over: its waiters are answered.
void Daemon::Impl::finished(const ExchangeReport& rep) {
  auto it = exchanges.find(rep.id);
  if (it == exchanges.end()) return;  // its client went away
  if (rep.state == ExchangeState::kFailed) spdlog::warn("exchange {} failed: {}", rep.id, rep.error);
  it->second.report = rep;
  measure(it->second, rep);
  it->second.cpu_ns = cpu_now() - it->second.cpu_ns;
  for (std::uint32_t request : it->second.waiters) send_done(it->second.client, request, rep.id, it->second);
  for (const auto& [request, until] : it->second.bounded) send_done(it->second.client, request, rep.id, it->second);
  bounded_waits.erase(rep.id);
  if (!it->second.waiters.empty() || !it->second.bounded.empty()) {
    clients[it->second.client].exchanges.erase(rep.id);
    exchanges.erase(it);
  }
}

void Daemon::Impl::service(int timeout_ms) {
  epoll_event events[16];
  int n = ::epoll_wait(epoll_fd, events, 16, timeout_ms);
  // Clients that left first (what they sent before leaving is still served): a session
  // must end before the next one's requests are.
  for (int i = 0; i < n; ++i) {
    int fd = events[i].data.fd;
    if (fd == listen_fd || (events[i].events & (EPOLLHUP | EPOLLRDHUP | EPOLLERR)) == 0) continue;
    while (clients.count(fd) != 0 && serve_client(fd)) {
    }  // ends with the client dropped
  }
  for (int i = 0; i < n; ++i) {
    int fd = events[i].data.fd;
    if (fd == listen_fd) {
      accept_clients();
    } else if (clients.count(fd) != 0) {
      serve_client(fd);
    }
  }
  close_idle_clients();
}

// Abort what runs and let the ABORT frames leave.
void Daemon::Impl::shut_down() {
  spdlog::info("shutting down");
  for (auto& [id, ex] : exchanges)
    if (!ex.report) engine->abort(id, "aapcd of rank " + std::to_string(rank) + " is shutting down");
  for (int i = 0; i < 200 && !engine->quiet(); ++i) engine->poll();
  for (int i = 0; i < 50; ++i) engine->poll();
  collect_finished();
  save_measures();
}

Daemon::Daemon() : impl_(std::make_unique<Impl>()) {}
Daemon::~Daemon() = default;

std::unique_ptr<Daemon> Daemon::create(const DaemonConfig& config) {
  std::unique_ptr<Daemon> d(new Daemon());
  Impl& m = *d->impl_;
  m.cfg = config;
  m.topo = sched::load_topology(config.topology);
  m.world = std::make_unique<TreeSchedules>(m.topo, m.cfg.barrier_radix, m.cfg.max_plans);
  // Where link rates differ, auto weighs what the tree's phases reach (a prediction over the
  // plan, seconds at 4,096 machines) and how full a queue gets without tokens (0.14 s there):
  // made here, before any peer waits on this daemon, rather than while the first exchange's
  // peers do.
  if (!m.world->model.uniform_rates()) {
    m.world->model.phase_efficiency();
    m.world->model.unpaced_queue_blocks();
  }
  if (config.rank && (*config.rank < 0 || *config.rank >= m.topo.machine_count()))
    fail("--rank " + std::to_string(*config.rank) + ": " + m.topo.source() + " has ranks 0.." + std::to_string(m.topo.machine_count() - 1));
  m.open_port();
  m.load_measures();
  m.open_socket();
  return d;
}

namespace {

std::string io_lcores_text(const std::vector<int>& cores) {
  if (cores.empty()) return "";
  if (cores.size() == 1) return ", I/O lcore on CPU " + std::to_string(cores[0]);
  return ", receive lcore on CPU " + std::to_string(cores[0]) + ", send lcore on CPU " + std::to_string(cores[1]);
}

}  // namespace

int Daemon::rank() const { return impl_->rank; }

std::string Daemon::describe() const {
  const Impl& m = *impl_;
  return "rank " + std::to_string(m.rank) + " of " + std::to_string(m.topo.machine_count()) + " (" + m.topo.machine(m.rank).name + ", " +
         m.topo.machine(m.rank).mac.str() + ") on " + m.cfg.device + ", epoch " + std::to_string(m.engine->epoch()) + ", pacing " +
         (m.pace_bps > 0 ? sched::format_rate(m.pace_bps) : "off") +
         (m.key ? ", frames tagged with " + std::string(cipher_name(m.key->cipher)) : ", frames not authenticated (no cluster key)") + (m.port_fd >= 0 ? ", idles in poll(2) on the port" : ", idles polling the port") + io_lcores_text(m.cfg.io_cores) +
         ", socket " + m.cfg.socket_path;
}

namespace {

// Sleeps until the epoll set (clients, and the port when it has a descriptor) has something,
// or `until`; nanosecond timeouts, which epoll_wait lacks, through ppoll on the epoll fd
// (none: until `until` alone).
void sleep_in(int epoll_fd, Clock::time_point until) {
  const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(until - Clock::now()).count();
  if (ns <= 0) return;
  pollfd p{epoll_fd, POLLIN, 0};
  timespec ts{static_cast<time_t>(ns / 1'000'000'000), static_cast<long>(ns % 1'000'000'000)};
  ::ppoll(&p, epoll_fd >= 0 ? 1 : 0, &ts, nullptr);
}

}  // namespace

int Daemon::run(const std::atomic<bool>& stop) {
  Impl& m = *impl_;
  // Short sleeps must be short: the default 50 us of timer slack would double them.
  ::prctl(PR_SET_TIMERSLACK, 1000UL, 0, 0, 0);
  unsigned idle = 0;
  auto next_service = Clock::now();
  while (!stop.load(std::memory_order_relaxed)) {
    bool busy = m.engine->poll();
    m.collect_finished();
    const auto now = Clock::now();
    if (m.engine->quiet()) {
      idle = 0;
      m.sample_rates(now, false);
      // Nothing to send: wait for a client or a frame (without a port fd, polled every 5 ms).
      m.service(m.arm_port_wait() ? 5 : 0);
      m.disarm_port_wait();
      continue;
    }
    // An exchange runs: look at the clients once a millisecond (sooner when woken by one).
    if (now >= next_service) {
      m.sample_rates(now, true);  // once a millisecond, not on every poll of the port
      m.service(0);
      next_service = now + std::chrono::milliseconds(1);
    }
    if (busy) {
      idle = 0;
      continue;
    }
    if (m.port_fd >= 0) {
      // Sleep until a frame or a client comes, or the engine has something to send or time
      // out: many daemons share few cores in emulation, and spinning ones starve the rest.
      // Clients are in the epoll set: they wake it, so the sleep need not end for them.
      // While the engine lets arrivals wait (a paced round), only its clock wakes it: neither
      // frames nor clients, for at most kPacedWake.
      const auto t = Clock::now();
      const auto until = m.engine->next_event(t), deaf = m.engine->receive_wait_until(t);
      if (deaf > t) sleep_in(-1, std::min(until, deaf));
      else if (m.arm_port_wait()) sleep_in(m.epoll_fd, until);
      m.disarm_port_wait();
      next_service = std::min(next_service, Clock::now());
    } else if (++idle > 16) {
      std::this_thread::sleep_for(std::chrono::microseconds(idle > 2000 ? 200 : 30));
    }
  }
  m.shut_down();
  return 0;
}

}  // namespace aapc::engine

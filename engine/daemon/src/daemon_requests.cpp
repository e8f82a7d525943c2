// The daemon's requests about buffers and results: HELLO, REGISTER, FREE, WAIT and TEST, and
// the DONE reply.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "daemon_impl.hpp"

namespace aapc::engine {

namespace {

// A memory file the client could shrink under our mapping would kill the daemon with SIGBUS
// at the next access: it must be sealed against shrinking (and growing), by the client
// (aapc::Client does) or here, when the file allows sealing. Why not, if it is not.
Result<void> sealed(int fd) {
  constexpr int kNeeded = F_SEAL_SHRINK | F_SEAL_GROW;
  const int seals = ::fcntl(fd, F_GET_SEALS);
  if (seals < 0)
    return Error(Errc::kInvalidArgument, std::string("the descriptor cannot be sealed (F_GET_SEALS: ") + std::strerror(errno) +
                                             "); pass a memfd made with memfd_create(name, MFD_ALLOW_SEALING) and sealed with F_SEAL_SHRINK | F_SEAL_GROW");
  if ((seals & kNeeded) == kNeeded) return {};
  if (::fcntl(fd, F_ADD_SEALS, kNeeded) != 0)
    return Error(Errc::kInvalidArgument,
                 std::string("the memory file is not sealed against shrinking and growing, and cannot be sealed (F_ADD_SEALS: ") + std::strerror(errno) +
                     "); make it with memfd_create(name, MFD_ALLOW_SEALING) and seal it with F_SEAL_SHRINK | F_SEAL_GROW after sizing it");
  return {};
}

}  // namespace

void Daemon::Impl::serve(ClientState& c, std::uint32_t request, const proto::HelloRequest& m) {
  if (!c.started) c.job = m.job;  // a client in the session stays in its job
  hello(c, request);
}
void Daemon::Impl::serve(ClientState& c, std::uint32_t request, const proto::FreeRequest& m) { free_buffer(c, request, m); }
void Daemon::Impl::serve(ClientState& c, std::uint32_t request, const proto::StartRequest& m) { start_or_join(c, request, m); }
void Daemon::Impl::serve(ClientState& c, std::uint32_t request, const proto::WaitRequest& m) { wait(c, request, m); }
void Daemon::Impl::serve(ClientState& c, std::uint32_t request, const proto::StatusRequest&) { status(c, request); }

void Daemon::Impl::hello(ClientState& c, std::uint32_t request) {
  c.greeted = true;
  proto::HelloReply m;
  m.rank = static_cast<std::uint32_t>(rank);
  m.size = static_cast<std::uint32_t>(topo.machine_count());
  m.epoch = engine->epoch();
  m.mtu = static_cast<std::uint32_t>(topo.mtu());
  m.peak_bps = world->model.peak_aggregate_bps();
  m.machine = topo.machine(rank).name;
  m.topology = topo.name();
  proto::send_message(c.fd, proto::message(m, request));
}

void Daemon::Impl::register_buffer(ClientState& c, std::uint32_t request, const proto::RegisterRequest& m, int fd) {
  const std::uint64_t size = m.size;
  auto refuse = [&](const Error& why) {
    if (fd >= 0) ::close(fd);
    reply_error(c.fd, request, why);
  };
  if (fd < 0) return refuse(Error(Errc::kInvalidArgument, "REGISTER without a memory file descriptor"));
  if (size == 0 || size > cfg.max_buffer_bytes)
    return refuse(Error(Errc::kInvalidArgument, "buffer size " + std::to_string(size) + " is not between 1 and " + std::to_string(cfg.max_buffer_bytes)));
  if (auto quota = buffer_quota(c, size); !quota) return refuse(quota.error());
  if (auto seal = sealed(fd); !seal) return refuse(seal.error());
  // Sized after sealing: it can no longer change under the mapping.
  struct stat st{};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || static_cast<std::uint64_t>(st.st_size) < size)
    return refuse(Error(Errc::kInvalidArgument, "the descriptor is not a memory file of at least " + std::to_string(size) + " bytes"));
  void* p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  ::close(fd);
  if (p == MAP_FAILED) return refuse(Error(Errc::kIo, std::string("cannot map the buffer: ") + std::strerror(errno)));
  std::uint32_t id = c.next_buffer++;
  Mapping& buf = c.buffers[id];
  buf = {static_cast<std::uint8_t*>(p), size, st.st_dev, st.st_ino, std::make_unique<nic::ExternalRegion>(p, size)};
  proto::send_message(c.fd, proto::message(proto::RegisterReply{id}, request));
}

bool Daemon::Impl::buffer_busy(std::uint32_t client_fd, std::uint32_t buffer) const {
  for (const auto& [id, ex] : exchanges)
    if (ex.client == static_cast<int>(client_fd) && !ex.report && ex.buffers.count(buffer) != 0) return true;
  return false;
}

void Daemon::Impl::free_buffer(ClientState& c, std::uint32_t request, const proto::FreeRequest& m) {
  const std::uint32_t id = m.buffer;
  auto it = c.buffers.find(id);
  if (it == c.buffers.end()) return reply_error(c.fd, request, Errc::kInvalidArgument, "no buffer " + std::to_string(id));
  if (buffer_busy(static_cast<std::uint32_t>(c.fd), id))
    return reply_error(c.fd, request, Errc::kBusy, "buffer " + std::to_string(id) + " is in use by a running exchange");
  // Frames of a finished exchange (retransmissions, duplicates) may still carry its bytes:
  // then it is unmapped once they are gone.
  unmapper.release(std::move(it->second));
  c.buffers.erase(it);
  proto::send_message(c.fd, proto::message(proto::EmptyReply{proto::Type::kOk}, request));
}

void Daemon::Impl::send_done(int fd, std::uint32_t request, std::uint32_t id, const ExchangeRecord& rec) {
  const ExchangeReport& rep = *rec.report;
  proto::DoneReply m;
  m.exchange = id;
  m.ok = rep.state == ExchangeState::kDone;
  m.code = static_cast<std::uint32_t>(rep.code);
  m.message = rep.error;
  m.schedule = rec.schedule;
  m.sync = rec.sync;
  m.duration_ns = rep.duration_ns;
  m.bytes_sent = rep.counters.data_bytes_sent;
  m.bytes_received = rep.counters.data_bytes_received;
  m.retransmissions = rep.counters.retransmitted_frames;
  m.wait_ns = rep.counters.wait_ns;
  m.cpu_ns = rec.cpu_ns;
  for (const auto& rt : rep.counters.rounds) m.rounds.emplace_back(rt.start_ns, rt.end_ns);
  proto::send_message(fd, proto::message(m, request));
}

void Daemon::Impl::wait(ClientState& c, std::uint32_t request, const proto::WaitRequest& m) {
  const std::uint32_t id = m.exchange;
  auto it = exchanges.find(id);
  if (it == exchanges.end() || it->second.client != c.fd)
    return reply_error(c.fd, request, Errc::kInvalidArgument, "no exchange " + std::to_string(id) + " of this client");
  if (it->second.report) {
    send_done(c.fd, request, id, it->second);
    exchanges.erase(it);
    c.exchanges.erase(id);
    return;
  }
  if (m.block && m.bound_us > 0) {
    it->second.bounded.emplace_back(request, Clock::now() + std::chrono::microseconds(m.bound_us));
    bounded_waits.insert(id);
  } else if (m.block) {
    it->second.waiters.push_back(request);
  } else {
    proto::send_message(c.fd, proto::message(proto::EmptyReply{proto::Type::kRunning}, request));
  }
}

// Bounded WAITs past their bound, of exchanges still running: answered RUNNING.
void Daemon::Impl::expire_bounded_waits(Clock::time_point now) {
  for (auto id = bounded_waits.begin(); id != bounded_waits.end();) {
    auto it = exchanges.find(*id);
    if (it == exchanges.end()) {  // its client went away
      id = bounded_waits.erase(id);
      continue;
    }
    auto& bounded = it->second.bounded;
    std::erase_if(bounded, [&](const auto& w) {
      if (now < w.second) return false;
      proto::send_message(it->second.client, proto::message(proto::EmptyReply{proto::Type::kRunning}, w.first));
      return true;
    });
    id = bounded.empty() ? bounded_waits.erase(id) : std::next(id);
  }
}

}  // namespace aapc::engine

// libaapc-mpich-yield.so: Debian's MPICH made to behave on aapc-emu's cluster. aapc-emu mpirun
// and aapc-bench preload it into every rank of an MPICH job (with and without libaapc-mpi.so,
// so that both columns of a comparison run alike). It does two things, both through UCX calls
// that MPICH makes through the PLT:
//
// 1. Idle ranks yield, and then sleep. Every emulated machine shares this box's few cores.
//    Debian's MPICH (ch4:ucx) spins in its waits and has no setting to yield
//    (MPIR_CVAR_POLLS_BEFORE_YIELD is ch3's), so a rank waiting in MPI_Barrier takes the CPU
//    from the rank whose message it waits for: one barrier of 16 ranks took 79 ms on 2 cores,
//    Open MPI's (run with mpi_yield_when_idle) 1.9 ms. When a pass of UCX's progress engine
//    found nothing to do, the rank yields, as mpi_yield_when_idle does; once it has found
//    nothing for 10 ms, it sleeps between passes (IdleWait, tools/common/idle_wait.hpp), since
//    48 yielding ranks on 2 cores still took them from the daemons. AAPC_EMU_NAP_AFTER_US sets
//    the 10 ms (0: yield only). On a real cluster, where every rank has a core, nothing needs it.
//
// 2. MPI_Finalize ends. MPICH 4.0's finalize closes every UCX endpoint (ucp_disconnect_nb, a
//    flushing close) and spins until each close has completed, and a close over UCX's TCP
//    transport can need the peer's answer. A peer that has finished its own closes already
//    waits in a blocking PMI barrier and answers nothing more, so the rank spins for ever (seen
//    on a rank or two of most MPICH jobs here: 2 to 5 of 6 jobs of 8 to 32 ranks, every one of
//    them a trivial program, hung until their timeout). Newer MPICHs put a PMI barrier before
//    the closes; this one cannot. So the closes are given kCloseWait to complete, counted from
//    the first; then the ones still waiting count as completed, and MPICH goes on to destroy
//    its worker, which releases them. Finalize comes after every message of the program has
//    been received (MPI requires it), so what such a close waits for is the transport's own
//    bookkeeping, not data.
#include <dlfcn.h>
#include <sched.h>

#include <chrono>
#include <cstdlib>
#include <optional>
#include <thread>

#include "aapc/mpi/env.hpp"
#include "idle_wait.hpp"

namespace {

// How long MPI_Finalize's endpoint closes may take together. Those that complete do so
// within milliseconds here; the stuck ones never do.
constexpr std::chrono::milliseconds kCloseWait{1000};

template <typename F>
F next(const char* name) {
  return reinterpret_cast<F>(dlsym(RTLD_NEXT, name));
}

using Progress = unsigned (*)(void*);
using Disconnect = void* (*)(void*);
using IsCompleted = int (*)(void*);

// When MPI_Finalize began to close the endpoints (ucp_disconnect_nb has no other caller in
// MPICH's ch4:ucx).
std::optional<std::chrono::steady_clock::time_point> closing_since;

// How long a rank finds nothing to do before it sleeps between passes: AAPC_EMU_NAP_AFTER_US,
// or IdleWait's 10 ms.
std::chrono::microseconds nap_after() {
  return std::chrono::microseconds(aapc::mpi::env_integer("AAPC_EMU_NAP_AFTER_US", 0, std::chrono::microseconds::max().count())
                                       .value_or(aapc::tools::IdleWait::kNapAfter.count()));
}

}  // namespace

// UCX's `unsigned ucp_worker_progress(ucp_worker_h)`.
extern "C" __attribute__((visibility("default"))) unsigned ucp_worker_progress(void* worker) {
  static const auto real = next<Progress>("ucp_worker_progress");
  if (real == nullptr) return 0;  // no UCX in this process: nobody calls this
  const unsigned events = real(worker);
  static const std::chrono::microseconds after = nap_after();
  thread_local aapc::tools::IdleWait idle(after);
  const auto nap = idle.after_pass(events, aapc::tools::IdleWait::Clock::now());
  if (nap.count() > 0) std::this_thread::sleep_for(nap);
  else if (events == 0) sched_yield();
  return events;
}

// UCX's `ucs_status_ptr_t ucp_disconnect_nb(ucp_ep_h)`, unchanged but for the time it starts.
extern "C" __attribute__((visibility("default"))) void* ucp_disconnect_nb(void* ep) {
  static const auto real = next<Disconnect>("ucp_disconnect_nb");
  if (real == nullptr) return nullptr;
  if (!closing_since) closing_since = std::chrono::steady_clock::now();
  return real(ep);
}

// UCX's `int ucp_request_is_completed(void*)`: the truth, except for closes past kCloseWait.
extern "C" __attribute__((visibility("default"))) int ucp_request_is_completed(void* request) {
  static const auto real = next<IsCompleted>("ucp_request_is_completed");
  if (real == nullptr) return 1;
  const int done = real(request);
  if (done != 0 || !closing_since) return done;
  return std::chrono::steady_clock::now() - *closing_since >= kCloseWait ? 1 : 0;
}

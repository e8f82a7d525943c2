// libaapc-mpich-yield.so: MPICH's idle ranks give up the CPU, for MPI jobs on aapc-emu's
// cluster. aapc-emu mpirun and aapc-bench preload it into every rank of an MPICH job (with
// and without libaapc-mpi.so, so that both columns of a comparison run alike).
//
// Why: every emulated machine shares this box's few cores. Debian's MPICH (ch4:ucx) spins in
// its waits and has no setting to yield (MPIR_CVAR_POLLS_BEFORE_YIELD is ch3's), so a rank
// waiting in MPI_Barrier takes the CPU from the rank whose message it waits for: one barrier of
// 16 ranks took 79 ms on 2 cores, Open MPI's (run with mpi_yield_when_idle) 1.9 ms. This does
// what mpi_yield_when_idle does: when a pass of UCX's progress engine found nothing to do,
// yield. On a real cluster, where every rank has a core, nothing needs it.
#include <dlfcn.h>
#include <sched.h>

namespace {

using Progress = unsigned (*)(void*);

Progress real_progress() {
  static const Progress real = reinterpret_cast<Progress>(dlsym(RTLD_NEXT, "ucp_worker_progress"));
  return real;
}

}  // namespace

// UCX's `unsigned ucp_worker_progress(ucp_worker_h)`; MPICH calls it through the PLT.
extern "C" __attribute__((visibility("default"))) unsigned ucp_worker_progress(void* worker) {
  const Progress real = real_progress();
  if (real == nullptr) return 0;  // no UCX in this process: nobody calls this
  const unsigned events = real(worker);
  if (events == 0) sched_yield();
  return events;
}

// How the process's ops move (op.hpp): progress() takes each a step, the progress thread of a
// single-copy leader moves what needs no MPI call, and drive() and Idle pace a waiting thread.
#include <pthread.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "aapc/mpi/bell.hpp"
#include "aapc/mpi/env.hpp"
#include "op.hpp"

namespace aapc::mpi {

bool progress(bool mover) {
  // The MPI calls below may call back into progress() (Open MPI's progress hook,
  // requests.cpp): the ops move in the outer call only.
  static thread_local bool inside = false;
  if (inside) return false;
  Process& pr = process();
  std::lock_guard<std::recursive_mutex> hold(pr.mutex);
  inside = true;
  struct Leave {
    ~Leave() { inside = false; }
  } leave;
  bool moved = !mover && advance_plans();  // the plans' fibers call the MPI
  for (std::size_t i = 0; i < pr.in_flight.size(); ++i) {
    Op& op = *pr.in_flight[i];
    while (!op.done() && (!mover || op.for_mover()) && advance_op(op)) moved = true;
  }
  if (mover) return moved;  // what is left of an op calls the MPI: the program's thread does it
  std::vector<Op*> done;
  std::erase_if(pr.in_flight, [&](Op* op) { return op->done() && (done.push_back(op), true); });
  for (Op* op : done) {
    op_over(*op->plan);
    // Last: the MPI may free a request that its program freed already, and the op with it.
    if (op->user != MPI_REQUEST_NULL) PMPI_Grequest_complete(op->user);
  }
  return moved;
}

double seconds_now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

namespace {

bool mover_has_work() {
  const auto& ops = process().in_flight;
  return std::any_of(ops.begin(), ops.end(), [](const Op* o) { return o->for_mover(); });
}

// The progress thread: moves the detached single-copy ops of this process's leaders while
// there are any, napping as Idle::nap does (in step 2 each look reads the daemon's socket),
// and sleeps on Process::wake while there are none.
[[noreturn]] void mover() {
  Process& pr = process();
  Idle idle;
  for (;;) {
    bool moved = false;
    {
      std::unique_lock<std::recursive_mutex> hold(pr.mutex);
      pr.wake.wait(hold, mover_has_work);
      moved = progress(true);
    }
    idle.nap(moved);
  }
}

}  // namespace

void wake_mover() {
  Process& pr = process();
  std::lock_guard<std::recursive_mutex> hold(pr.mutex);
  if (!pr.mover_started) {
    pr.mover_started = true;
    // It lives with the process and calls no MPI function, and takes none of the program's
    // signals: they go to the program's threads as before.
    sigset_t all, was;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &was);
    std::thread(mover).detach();
    pthread_sigmask(SIG_SETMASK, &was, nullptr);
  }
  pr.wake.notify_one();
}

bool any_in_flight() {
  std::lock_guard<std::recursive_mutex> hold(process().mutex);
  return !process().in_flight.empty();
}

void Idle::rest(bool moved) {
  bool sleepy = false;
  if (!moved) {
    std::lock_guard<std::recursive_mutex> hold(process().mutex);
    const auto& ops = process().in_flight;
    sleepy = std::all_of(ops.begin(), ops.end(), [](const Op* o) { return o->may_nap(); });
  }
  if (!sleepy) {
    (void)pace_.next(true, NapPace::Clock::now());  // spins from here: the next nap starts short
    return;
  }
  nap(false);
}

void Idle::nap(bool moved) { (void)bell::pause(pace_.next(moved, NapPace::Clock::now())); }

std::chrono::microseconds Idle::longest_nap() {
  static const std::chrono::microseconds longest =
      std::chrono::microseconds(env_integer("AAPC_MPI_LONGEST_NAP_US", 0, 1'000'000).value_or(NapPace::Rule{}.longest.count()));
  return longest;
}

// Whether the program's threads may call the MPI at once (MPI_THREAD_MULTIPLE).
bool threads_call() {
  static const bool multiple = [] {
    int level = MPI_THREAD_SINGLE;
    PMPI_Query_thread(&level);
    return level == MPI_THREAD_MULTIPLE;
  }();
  return multiple;
}

bool await_exchange(Op& op) {
  Process& pr = process();
  std::lock_guard<std::recursive_mutex> hold(pr.mutex);
  // Alone in step 2, it waits for the daemon's answer rather than looking again and again;
  // not where other threads may call the MPI. The process's lock and its connection carry
  // one request at a time, so another thread could not start the all-to-all on another
  // communicator that the peers may need first: two threads' calls, started in opposite
  // orders on two machines, waited for each other until the daemons' deadline.
  if (op.stage != Op::Stage::kExchange || pr.in_flight.size() != 1 || pr.in_flight.front() != &op || threads_call()) return false;
  // A bounded wait: between two, the caller moves the MPI that the program's other requests
  // need (a large MPI_Isend whose receiver calls this all-to-all only once it has the
  // message): a completion call (requests.cpp, wait_driving) tests, drive() probes.
  exchange_over(op, std::chrono::milliseconds(2));
  return true;
}

namespace {

// MPI's progress rule: a request the program started before a blocking call still completes
// while the call waits. A probe, which matches and takes nothing, runs the MPI's progress
// engine between two bounded waits in the daemon and between two rests of a rank that waits
// for its machine's other ranks: a large MPI_Isend to a rank that calls the all-to-all only
// once it has the message then goes on (tests/mpi/mpi_progress.c), across machines and,
// with MPICH, whose shared memory moves a large message only while its sender's MPI runs,
// within one.
void move_mpi(MPI_Comm comm) {
  int flag = 0;
  (void)PMPI_Iprobe(MPI_ANY_SOURCE, MPI_ANY_TAG, comm != MPI_COMM_NULL ? comm : MPI_COMM_WORLD, &flag, MPI_STATUS_IGNORE);
}

}  // namespace

void drive_until(MPI_Comm comm, const std::function<bool()>& over, const std::function<bool()>& wait) {
  Process& pr = process();
  Idle idle;
  // Probes only once the call has waited as long as one bounded wait: a probe a pass made
  // small all-to-alls 7% slower (8 B and 1 KiB on 8-two-switch), and what needs the MPI to
  // move has kept the all-to-all from ending by then.
  const auto probe_from = std::chrono::steady_clock::now() + std::chrono::milliseconds(2);
  for (;;) {
    const bool moved = progress();
    {
      std::lock_guard<std::recursive_mutex> hold(pr.mutex);
      if (over()) return;
    }
    if (!wait || !wait()) idle.rest(moved);
    if (std::chrono::steady_clock::now() >= probe_from) move_mpi(comm);
  }
}

std::string drive(Op& op) {
  drive_until(op.comm, [&] { return op.done(); }, [&] { return await_exchange(op); });
  std::lock_guard<std::recursive_mutex> hold(process().mutex);
  return op.error;
}

}  // namespace aapc::mpi

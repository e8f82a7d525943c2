// MPI_Ialltoall(v) through aapc: the call returns a generalized request (MPI 4.0, section
// 13.2) at once, and its Op (op.hpp) moves on whenever the process calls MPI_Wait*, MPI_Test*
// or another all-to-all, which the library takes over for that, and with Open MPI in every
// call that waits (its progress loop calls progress_hook). progress() completes the
// request when the op is done; the MPI's own wait then returns it. A failed op raises its
// error on its communicator, as a blocking call does, when the program collects the request.
#include <dlfcn.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <mutex>
#include <string>
#include <vector>

#include "op.hpp"
#include "persistent.hpp"
#include "requests.hpp"

namespace aapc::mpi {

namespace {

// The ops that own a request the program has not collected yet.
std::vector<Op*>& requests() {
  static auto* r = new std::vector<Op*>;  // never destroyed, as process()
  return *r;
}

// Set while a completion call of ours is in the MPI's: the ops must not complete there
// (through Open MPI's progress hook), after failures() looked at them and before the MPI
// collects their requests, or a failure would pass as a success.
thread_local bool collecting = false;

int query([[maybe_unused]] void* extra, MPI_Status* status) {
  PMPI_Status_set_elements(status, MPI_BYTE, 0);
  PMPI_Status_set_cancelled(status, 0);
  status->MPI_SOURCE = MPI_UNDEFINED;
  status->MPI_TAG = MPI_UNDEFINED;
#ifndef OPEN_MPI
  // Collected by MPICH's own completion call, not the library's (poll_op, below): a failed op
  // is raised here, as the library's calls raise it (outcome()), not passed as a success.
  // MPICH calls this as it collects the request. (Open MPI's Fortran bindings run its own
  // nonblocking all-to-alls, so only the library's calls collect the library's requests.)
  if (const auto* op = static_cast<const Op*>(extra); !collecting && op->done() && !op->error.empty())
    return status->MPI_ERROR = raise(op->comm, op->error);
#endif
  return MPI_SUCCESS;
}

// The ops whose requests the MPI freed, not yet deleted.
struct Freed {
  std::mutex mutex;  // taken with nothing else held, or inside the process's lock
  std::vector<Op*> ops;
};

Freed& freed() {
  static auto* f = new Freed;  // never destroyed, as process()
  return *f;
}

// The MPI calls it inside its own call that freed the request, and MPICH holds its lock
// there: waiting for the process's lock, which progress() holds while it calls the MPI, two
// threads of an MPI_THREAD_MULTIPLE program could each wait for the other's lock for ever
// (tests/mpi/mpi_threads.c, nonblocking). So the op is only marked here, and deleted by
// drop_freed().
int free_op(void* extra) {
  auto* op = static_cast<Op*>(extra);
  Freed& f = freed();
  std::lock_guard<std::mutex> hold(f.mutex);
  op->freed.store(true, std::memory_order_release);
  f.ops.push_back(op);
  return MPI_SUCCESS;
}

// With the process's lock held: the ops that free_op marked leave requests() and are deleted.
void drop_freed() {
  std::vector<Op*> gone;
  {
    Freed& f = freed();
    std::lock_guard<std::mutex> hold(f.mutex);
    gone.swap(f.ops);
  }
  for (Op* op : gone) {
    std::erase(requests(), op);
    delete op;
  }
}

// Cancelling a collective is erroneous (MPI 4.0, 3.8.4); the request completes as it would.
int cancel_op(void*, int) { return MPI_SUCCESS; }

bool none_outstanding() {
  std::lock_guard<std::recursive_mutex> hold(process().mutex);
  drop_freed();
  return requests().empty() && process().in_flight.empty();
}

// A failed op whose request is among those a completion call may collect.
struct Failure {
  int index;
  MPI_Comm comm;
  std::string error;
};

std::vector<Failure> failures(int count, const MPI_Request* reqs) {
  std::lock_guard<std::recursive_mutex> hold(process().mutex);
  drop_freed();
  std::vector<Failure> f;
  for (const Op* op : requests())
    if (!op->freed.load(std::memory_order_acquire) && op->done() && !op->error.empty())
      for (int i = 0; i < count; ++i)
        if (reqs[i] == op->user) f.push_back({i, op->comm, op->error});
  return f;
}

// Where a completion call of many requests (MPI_Waitall, MPI_Testsome, ...) leaves each
// completed request's status: one per request (all), or one per completion, in the order of
// `indices` (some).
struct Statuses {
  MPI_Status* statuses;          // MPI_STATUSES_IGNORE, or the program's array
  int count;                      // the requests
  const int* outcount = nullptr;  // some: how many completed (MPI_UNDEFINED: none active)
  const int* indices = nullptr;   // some: which request each completion is

  int completed() const { return outcount == nullptr ? count : std::max(*outcount, 0); }
  MPI_Status* of(int request) const {
    if (statuses == MPI_STATUSES_IGNORE) return nullptr;
    if (indices == nullptr) return &statuses[request];
    for (int k = 0; k < completed(); ++k)
      if (indices[k] == request) return &statuses[k];
    return nullptr;
  }
};

// `rc` of the MPI's call, or the error of a failed op whose request it collected, raised on
// the op's communicator: its error handler runs, MPI_Error_string gives aapc's words. A call
// of one request (`many` nullptr) returns that error; a call of many returns
// MPI_ERR_IN_STATUS with the error in the request's status, and MPI_SUCCESS in the others'
// (MPI 4.0, 3.7.5), as the MPI does for its own requests.
int outcome(int rc, const std::vector<Failure>& f, const MPI_Request* reqs, const Statuses* many = nullptr) {
  bool failed = false;
  for (const Failure& x : f) {
    if (reqs[x.index] != MPI_REQUEST_NULL) continue;
    const int code = raise(x.comm, x.error);
    if (many == nullptr) {
      rc = code;
      continue;
    }
    if (!failed && rc != MPI_ERR_IN_STATUS && many->statuses != MPI_STATUSES_IGNORE)
      for (int k = 0; k < many->completed(); ++k) many->statuses[k].MPI_ERROR = MPI_SUCCESS;  // set only with MPI_ERR_IN_STATUS
    failed = true;
    if (MPI_Status* s = many->of(x.index); s != nullptr) s->MPI_ERROR = code;
  }
  return failed ? MPI_ERR_IN_STATUS : rc;
}

// The MPI's completion call `f`, with `collecting` set.
template <typename F>
int collect(F f) {
  collecting = true;
  const int rc = f();
  collecting = false;
  return rc;
}

// The process's one op in flight, where the completion call waits for its request (and for
// no other but MPI_REQUEST_NULL): the call may then wait for the op in its daemon, a moment at
// a time (await_exchange), as a blocking all-to-all does. Else nullptr.
Op* only_op_waited(int count, const MPI_Request* reqs) {
  std::lock_guard<std::recursive_mutex> hold(process().mutex);
  const auto& ops = process().in_flight;
  if (ops.size() != 1 || ops.front()->user == MPI_REQUEST_NULL) return nullptr;
  bool found = false;
  for (int i = 0; i < count; ++i) {
    if (reqs[i] == MPI_REQUEST_NULL) continue;
    if (reqs[i] != ops.front()->user) return nullptr;
    found = true;
  }
  return found ? ops.front() : nullptr;
}

// A completion call that waits: the MPI's nonblocking `test` (which sets `done`) in a loop
// that drives the process's ops, or its blocking `wait` once none is in flight. Waiting for
// one op alone, it waits in its daemon between two tests (a persistent all-to-all's
// MPI_Start and MPI_Wait then cost what the blocking call does).
template <typename Test, typename Wait>
int wait_driving(int count, MPI_Request* reqs, Test test, Wait wait, const Statuses* many = nullptr) {
  Idle idle;
  for (;;) {
    const bool moved = progress();
    const std::vector<Failure> f = failures(count, reqs);
    if (!any_in_flight()) return outcome(collect(wait), f, reqs, many);
    bool done = false;
    const int rc = collect([&] { return test(done); });
    if (done) return outcome(rc, f, reqs, many);
    if (Op* op = only_op_waited(count, reqs); op != nullptr && await_exchange(*op)) continue;
    idle.rest(moved);
  }
}

// A completion call that does not wait.
template <typename Test>
int test_driving(int count, MPI_Request* reqs, Test test, const Statuses* many = nullptr) {
  progress();
  const std::vector<Failure> f = failures(count, reqs);
  return outcome(collect(test), f, reqs, many);
}

#ifndef OPEN_MPI
// MPICH's own completion calls move an op whose request they wait for or test (MPICH's
// extended generalized request, carry()): poll_op in MPI_Wait, MPI_Test and the any/some
// calls, wait_op in MPI_Waitall, each called again until the request is complete, outside
// MPICH's lock. The program's completion call is then not the library's: MPICH's mpi_f08
// bindings (mpi_wait_f08_ and the rest) call PMPI_Wait and the like, past it, and waited for
// ever on an MPI_Ialltoall that the library carried (MPICH's f08/coll/nonblockingf08).
// Inside the library's own completion calls (`collecting`) they do nothing: those move the
// ops themselves, and look at their failures before the MPI collects the requests.
int poll_op(void*, MPI_Status*) {
  if (collecting) return MPI_SUCCESS;
  static thread_local Idle idle;
  idle.rest(progress());
  return MPI_SUCCESS;
}

int wait_op(int, void**, double, MPI_Status* status) { return poll_op(nullptr, status); }
#endif

#ifdef OPEN_MPI
// Open MPI calls this from its progress loop, in every call that waits (MPI_Recv,
// MPI_Barrier, ...), as its own nonblocking collectives move (coll/libnbc). At most every
// 200 us: a step may look for the daemon's answer. Another thread's progress is not
// waited for.
int progress_hook() {
  static std::atomic<std::int64_t> last{0};
  const std::int64_t now = std::chrono::steady_clock::now().time_since_epoch() / std::chrono::microseconds(1);
  if (collecting || now - last.load(std::memory_order_relaxed) < 200) return 0;
  last.store(now, std::memory_order_relaxed);
  std::unique_lock<std::recursive_mutex> hold(process().mutex, std::try_to_lock);
  if (!hold.owns_lock() || process().in_flight.empty()) return 0;
  return progress() ? 1 : 0;
}
#endif

// Whether the program's blocking point-to-point calls must move the process's ops (recv()
// and the rest, requests.hpp).
bool p2p_must_move() {
#ifdef OPEN_MPI
  return false;
#else
  Process& pr = process();
  std::lock_guard<std::recursive_mutex> hold(pr.mutex);
  return !pr.making.empty() || std::any_of(pr.in_flight.begin(), pr.in_flight.end(), [](const Op* o) { return o->waits_for_calls(); });
#endif
}

}  // namespace

int recv(void* buf, int count, MPI_Datatype type, int source, int tag, MPI_Comm comm, MPI_Status* status) {
  if (!p2p_must_move()) return PMPI_Recv(buf, count, type, source, tag, comm, status);
  MPI_Request r = MPI_REQUEST_NULL;
  if (const int rc = PMPI_Irecv(buf, count, type, source, tag, comm, &r); rc != MPI_SUCCESS) return rc;
  return wait(&r, status);
}

int send(const void* buf, int count, MPI_Datatype type, int dest, int tag, MPI_Comm comm, bool synchronous) {
  if (!p2p_must_move())
    return synchronous ? PMPI_Ssend(buf, count, type, dest, tag, comm) : PMPI_Send(buf, count, type, dest, tag, comm);
  MPI_Request r = MPI_REQUEST_NULL;
  const int rc = synchronous ? PMPI_Issend(buf, count, type, dest, tag, comm, &r) : PMPI_Isend(buf, count, type, dest, tag, comm, &r);
  return rc != MPI_SUCCESS ? rc : wait(&r, MPI_STATUS_IGNORE);
}

int sendrecv(const void* sbuf, int scount, MPI_Datatype stype, int dest, int stag, void* rbuf, int rcount, MPI_Datatype rtype, int source,
             int rtag, MPI_Comm comm, MPI_Status* status) {
  if (!p2p_must_move()) return PMPI_Sendrecv(sbuf, scount, stype, dest, stag, rbuf, rcount, rtype, source, rtag, comm, status);
  MPI_Request r[2] = {MPI_REQUEST_NULL, MPI_REQUEST_NULL};
  if (const int rc = PMPI_Irecv(rbuf, rcount, rtype, source, rtag, comm, &r[0]); rc != MPI_SUCCESS) return rc;
  if (const int rc = PMPI_Isend(sbuf, scount, stype, dest, stag, comm, &r[1]); rc != MPI_SUCCESS) {
    PMPI_Cancel(&r[0]);
    PMPI_Request_free(&r[0]);
    return rc;
  }
  MPI_Status both[2];
  const int rc = waitall(2, r, both);
  if (status != MPI_STATUS_IGNORE) *status = both[0];
  if (rc != MPI_ERR_IN_STATUS) return rc;
  return both[0].MPI_ERROR != MPI_SUCCESS ? both[0].MPI_ERROR : both[1].MPI_ERROR;  // MPI_Sendrecv's own code, not MPI_ERR_IN_STATUS
}

int probe(int source, int tag, MPI_Comm comm, MPI_Status* status) {
  if (!p2p_must_move()) return PMPI_Probe(source, tag, comm, status);
  int rc = MPI_SUCCESS;
  drive_until(comm, [&] {
    int flag = 0;
    rc = PMPI_Iprobe(source, tag, comm, &flag, status);
    return rc != MPI_SUCCESS || flag != 0;
  });
  return rc;
}

void hook_progress() {
#ifdef OPEN_MPI
  // Low priority: called when the MPI's own callbacks found nothing to do.
  using Register = int (*)(int (*)());
  if (auto reg = reinterpret_cast<Register>(dlsym(RTLD_DEFAULT, "opal_progress_register_lp")); reg != nullptr) reg(progress_hook);
#endif
}

int carry(std::unique_ptr<Op> op, MPI_Request* request) {
  if (request == nullptr) {
    const std::string error = drive(*op);
    return error.empty() ? MPI_SUCCESS : raise(op->comm, error);
  }
  std::lock_guard<std::recursive_mutex> hold(process().mutex);
  drop_freed();
  Op* raw = op.release();  // deleted once the program has collected the request (free_op)
#ifdef OPEN_MPI
  PMPI_Grequest_start(query, free_op, cancel_op, raw, request);
#else
  PMPIX_Grequest_start(query, free_op, cancel_op, poll_op, wait_op, raw, request);
#endif
  raw->user = *request;
  requests().push_back(raw);
  // With MPI_THREAD_MULTIPLE another thread's progress pass may have finished the op since its
  // start (run() lets go of the lock before this), when it had no request to complete: an
  // MPI_Wait for it then waited for ever, and the peers' next exchanges ran out their deadline
  // (tests/mpi/mpi_threads.c, nonblocking, Open MPI).
  const auto& flying = process().in_flight;
  if (raw->done() && std::find(flying.begin(), flying.end(), raw) == flying.end()) PMPI_Grequest_complete(raw->user);
  progress();  // a done op is completed at once
  raw->detached = true;
  if (raw->for_mover()) wake_mover();
  return MPI_SUCCESS;
}

int wait(MPI_Request* req, MPI_Status* status) {
  const StandIns started(1, req);
  if (none_outstanding()) return PMPI_Wait(req, status);
  return wait_driving(
      1, req,
      [&](bool& done) {
        int flag = 0;
        const int rc = PMPI_Test(req, &flag, status);
        done = flag != 0;
        return rc;
      },
      [&] { return PMPI_Wait(req, status); });
}

int waitall(int count, MPI_Request* reqs, MPI_Status* statuses) {
  const StandIns started(count, reqs);
  if (none_outstanding()) return PMPI_Waitall(count, reqs, statuses);
  const Statuses many{statuses, count};
  return wait_driving(
      count, reqs,
      [&](bool& done) {
        int flag = 0;
        const int rc = PMPI_Testall(count, reqs, &flag, statuses);
        done = flag != 0;
        return rc;
      },
      [&] { return PMPI_Waitall(count, reqs, statuses); }, &many);
}

int waitany(int count, MPI_Request* reqs, int* index, MPI_Status* status) {
  const StandIns started(count, reqs);
  if (none_outstanding()) return PMPI_Waitany(count, reqs, index, status);
  return wait_driving(
      count, reqs,
      [&](bool& done) {
        int flag = 0;
        const int rc = PMPI_Testany(count, reqs, index, &flag, status);
        done = flag != 0;
        return rc;
      },
      [&] { return PMPI_Waitany(count, reqs, index, status); });
}

int waitsome(int count, MPI_Request* reqs, int* outcount, int* indices, MPI_Status* statuses) {
  const StandIns started(count, reqs);
  if (none_outstanding()) return PMPI_Waitsome(count, reqs, outcount, indices, statuses);
  const Statuses many{statuses, count, outcount, indices};
  return wait_driving(
      count, reqs,
      [&](bool& done) {
        const int rc = PMPI_Testsome(count, reqs, outcount, indices, statuses);
        done = *outcount != 0;  // MPI_UNDEFINED when none is active
        return rc;
      },
      [&] { return PMPI_Waitsome(count, reqs, outcount, indices, statuses); }, &many);
}

int test(MPI_Request* req, int* flag, MPI_Status* status) {
  const StandIns started(1, req);
  if (none_outstanding()) return PMPI_Test(req, flag, status);
  return test_driving(1, req, [&] { return PMPI_Test(req, flag, status); });
}

int testall(int count, MPI_Request* reqs, int* flag, MPI_Status* statuses) {
  const StandIns started(count, reqs);
  if (none_outstanding()) return PMPI_Testall(count, reqs, flag, statuses);
  const Statuses many{statuses, count};
  return test_driving(count, reqs, [&] { return PMPI_Testall(count, reqs, flag, statuses); }, &many);
}

int testany(int count, MPI_Request* reqs, int* index, int* flag, MPI_Status* status) {
  const StandIns started(count, reqs);
  if (none_outstanding()) return PMPI_Testany(count, reqs, index, flag, status);
  return test_driving(count, reqs, [&] { return PMPI_Testany(count, reqs, index, flag, status); });
}

int testsome(int count, MPI_Request* reqs, int* outcount, int* indices, MPI_Status* statuses) {
  const StandIns started(count, reqs);
  if (none_outstanding()) return PMPI_Testsome(count, reqs, outcount, indices, statuses);
  const Statuses many{statuses, count, outcount, indices};
  return test_driving(count, reqs, [&] { return PMPI_Testsome(count, reqs, outcount, indices, statuses); }, &many);
}

// A program may poll with this alone: the ops must move (MPICH has no progress hook).
int request_get_status(MPI_Request req, int* flag, MPI_Status* status) {
  const StandIns started(1, &req);  // a started persistent all-to-all: its running start's
  if (none_outstanding()) return PMPI_Request_get_status(req, flag, status);
  progress();
  return collect([&] { return PMPI_Request_get_status(req, flag, status); });  // a failure is raised where the request is collected
}

}  // namespace aapc::mpi

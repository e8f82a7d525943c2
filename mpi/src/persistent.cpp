// MPI-4's persistent all-to-alls (MPI 4.0, 6.13): MPI_Alltoall_init, MPI_Alltoallv_init and
// MPI_Alltoallw_init (MPICH 4), and Open MPI 4.1's MPIX_* (its pcollreq extension).
//
// The init call starts the communicator's plan (plan.cpp), once for every start after it, and
// keeps the call's arguments. The program's handle is a request of the MPI's own that stands
// for it: an inactive persistent receive from MPI_PROC_NULL on the call's communicator, which
// the MPI completes at once and keeps after completion, as a persistent request is kept.
// MPI_Start and MPI_Startall run the exchange as an MPI_Ialltoall(v,w) of the library
// (op.cpp: through aapc where the plan says so, with the plan's group and its staging buffers,
// else the MPI's own on the plan's duplicate), whose request the completion calls
// (requests.cpp) put in the handle's place while they wait or test, and take out again after:
// a completed start leaves the handle inactive, not MPI_REQUEST_NULL. MPI_Request_free frees
// it.
#include "persistent.hpp"

#include <algorithm>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include "op.hpp"

namespace aapc::mpi {

namespace {

struct Persistent {
  MPI_Request handle = MPI_REQUEST_NULL;  // the program's: the stand-in
  MPI_Request active = MPI_REQUEST_NULL;  // the running start's, until it is collected
  std::function<int(MPI_Request*)> start;
};

std::vector<std::unique_ptr<Persistent>>& all() {
  static auto* a = new std::vector<std::unique_ptr<Persistent>>;  // never destroyed, as process()
  return *a;
}

Persistent* find(MPI_Request handle) {
  if (handle == MPI_REQUEST_NULL) return nullptr;
  for (auto& p : all())
    if (p->handle == handle) return p.get();
  return nullptr;
}

// The stand-in is a request on the call's communicator, so that the MPI keeps the communicator,
// and with it the plan (its attribute), for every start until MPI_Request_free, as it keeps it
// for its own persistent requests: the program may free the communicator once the init
// returned (MPI 4.0, 6.4.3: freed when no request uses it). On MPI_COMM_SELF, MPICH destroyed
// the communicator at MPI_Comm_free and the next start failed: "Invalid communicator".
int make(std::function<int(MPI_Request*)> start, MPI_Comm comm, MPI_Request* request) {
  auto p = std::make_unique<Persistent>();
  p->start = std::move(start);
  if (const int rc = PMPI_Recv_init(nullptr, 0, MPI_BYTE, MPI_PROC_NULL, 0, comm, &p->handle); rc != MPI_SUCCESS) return rc;
  *request = p->handle;
  std::lock_guard<std::recursive_mutex> hold(process().mutex);
  all().push_back(std::move(p));
  return MPI_SUCCESS;
}

// The program may free its datatypes once an init returned (MPI 4.0, 5.1.9): the request keeps
// its own, derived ones duplicated, until MPI_Request_free. In place, the send type may be
// anything and is not kept.
struct Types {
  HeldTypes held;
  MPI_Datatype send, recv;
  Types(const void* sbuf, MPI_Datatype s, MPI_Datatype r) : send(sbuf == MPI_IN_PLACE ? s : held.hold(s)), recv(held.hold(r)) {}
};

}  // namespace

int alltoall_init(const void* sbuf, int scount, MPI_Datatype stype, void* rbuf, int rcount, MPI_Datatype rtype, MPI_Comm comm,
                  MPI_Request* request) {
  plan_of(comm);  // made once, for every start
  auto t = std::make_shared<Types>(sbuf, stype, rtype);
  return make([=](MPI_Request* r) { return alltoall(sbuf, scount, t->send, rbuf, rcount, t->recv, comm, r); }, comm, request);
}

int alltoallv_init(const void* sbuf, const int* scounts, const int* sdispls, MPI_Datatype stype, void* rbuf, const int* rcounts,
                   const int* rdispls, MPI_Datatype rtype, MPI_Comm comm, MPI_Request* request) {
  const int n = peers_of(comm);
  // The arrays are the program's to change once the call returns: kept here.
  auto keep = [n](const int* v) { return std::make_shared<std::vector<int>>(v, v + n); };
  const bool in_place = sbuf == MPI_IN_PLACE;
  auto sc = keep(in_place ? rcounts : scounts), sd = keep(in_place ? rdispls : sdispls), rc = keep(rcounts), rd = keep(rdispls);
  plan_of(comm);
  auto agreed = std::make_shared<std::optional<std::uint64_t>>();  // by the first start, for all
  auto t = std::make_shared<Types>(sbuf, stype, rtype);
  return make(
      [=](MPI_Request* r) { return alltoallv(sbuf, sc->data(), sd->data(), t->send, rbuf, rc->data(), rd->data(), t->recv, comm, r, agreed); },
      comm, request);
}

int alltoallw_init(const void* sbuf, const int* scounts, const int* sdispls, const MPI_Datatype* stypes, void* rbuf, const int* rcounts,
                   const int* rdispls, const MPI_Datatype* rtypes, MPI_Comm comm, MPI_Request* request) {
  const int n = peers_of(comm);
  // The arrays are the program's to change, and its types to free, once the call returns:
  // kept here, derived types duplicated, until MPI_Request_free.
  auto k = std::make_shared<AlltoallwArgs>(n, sbuf == MPI_IN_PLACE, scounts, sdispls, stypes, rcounts, rdispls, rtypes, true);
  plan_of(comm);
  return make(
      [=](MPI_Request* r) {
        return alltoallw(sbuf, k->scounts.data(), k->sdispls.data(), k->stypes.data(), rbuf, k->rcounts.data(), k->rdispls.data(),
                         k->rtypes.data(), comm, r);
      },
      comm, request);
}

int start(MPI_Request* request) {
  Persistent* p = nullptr;
  {
    std::lock_guard<std::recursive_mutex> hold(process().mutex);
    p = find(*request);
  }
  if (p == nullptr) return PMPI_Start(request);
  return p->start(&p->active);
}

int startall(int count, MPI_Request* requests) {
  for (int i = 0; i < count; ++i)
    if (const int rc = start(&requests[i]); rc != MPI_SUCCESS) return rc;
  return MPI_SUCCESS;
}

int request_free(MPI_Request* request) {
  std::unique_ptr<Persistent> gone;
  {
    std::lock_guard<std::recursive_mutex> hold(process().mutex);
    auto& a = all();
    auto it = std::find_if(a.begin(), a.end(), [&](const auto& p) { return *request != MPI_REQUEST_NULL && p->handle == *request; });
    if (it == a.end()) return PMPI_Request_free(request);
    gone = std::move(*it);
    a.erase(it);
  }
  if (gone->active != MPI_REQUEST_NULL) PMPI_Request_free(&gone->active);  // the start goes on, and frees itself when over
  return PMPI_Request_free(request);
}

StandIns::StandIns(int count, MPI_Request* reqs) : reqs_(reqs) {
  std::lock_guard<std::recursive_mutex> hold(process().mutex);
  if (all().empty()) return;
  for (int i = 0; i < count; ++i)
    if (Persistent* p = find(reqs[i]); p != nullptr && p->active != MPI_REQUEST_NULL) {
      swapped_.push_back({i, p->handle});
      reqs[i] = p->active;
    }
}

StandIns::~StandIns() {
  if (swapped_.empty()) return;
  std::lock_guard<std::recursive_mutex> hold(process().mutex);
  for (const auto& [i, handle] : swapped_) {
    Persistent* p = find(handle);
    if (p != nullptr) p->active = reqs_[i];  // MPI_REQUEST_NULL once complete: inactive again
    reqs_[i] = handle;
  }
}

}  // namespace aapc::mpi

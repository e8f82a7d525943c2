// libaapc-mpi.so: the MPI profiling-interface interposer that programs preload or link
// (issue 13). It defines MPI_Init(_thread), MPI_(I)alltoall(v), the completion calls
// (MPI_Wait*, MPI_Test*, MPI_Request_get_status, which drive the nonblocking ones) and the
// Fortran all-to-alls,
// finds out which MPI the process runs (Open MPI or MPICH, whose ABIs differ), and forwards to libaapc-mpi-openmpi.so or libaapc-mpi-mpich.so beside it, which are built
// against that MPI's mpi.h. Without one, it calls the MPI's own PMPI_* so that a program
// never breaks because of aapc.
//
// Built without an mpi.h: every handle is taken as a machine word (an int handle arrives in
// the low half of its register) and passed on unchanged.
#include <dlfcn.h>
#include <link.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <type_traits>

namespace {

using Word = std::uintptr_t;
using Alltoall = int (*)(const void*, int, Word, void*, int, Word, Word);
using Alltoallv = int (*)(const void*, const int*, const int*, Word, void*, const int*, const int*, Word, Word);
using Alltoallw = int (*)(const void*, const int*, const int*, const void*, void*, const int*, const int*, const void*, Word);
using Init = int (*)(int*, char***);
using InitThread = int (*)(int*, char***, int, int*);
// Requests and statuses by address: their layout is the MPI's business.
using Ialltoall = int (*)(const void*, int, Word, void*, int, Word, Word, void*);
using Ialltoallv = int (*)(const void*, const int*, const int*, Word, void*, const int*, const int*, Word, Word, void*);
using Wait = int (*)(void*, void*);
using Waitall = int (*)(int, void*, void*);
using Waitany = int (*)(int, void*, int*, void*);
using Waitsome = int (*)(int, void*, int*, int*, void*);  // and MPI_Testsome
using Test = int (*)(void*, int*, void*);
using Testall = int (*)(int, void*, int*, void*);
using Testany = int (*)(int, void*, int*, int*, void*);
using RequestGetStatus = int (*)(Word, int*, void*);
using AlltoallInit = int (*)(const void*, int, Word, void*, int, Word, Word, Word, void*);
using AlltoallvInit = int (*)(const void*, const int*, const int*, Word, void*, const int*, const int*, Word, Word, Word, void*);
using Start = int (*)(void*);  // and MPI_Request_free
using Startall = int (*)(int, void*);
// Fortran (mpif.h, use mpi): every argument by reference, handles as MPI_Fint (int).
using FAlltoall = void (*)(const void*, const int*, const int*, void*, const int*, const int*, const int*, int*);
using FAlltoallv = void (*)(const void*, const int*, const int*, const int*, void*, const int*, const int*, const int*, const int*, int*);

struct Target {
  Init init = nullptr;
  InitThread init_thread = nullptr;
  Alltoall alltoall = nullptr;
  Alltoallv alltoallv = nullptr;
  Alltoallw alltoallw = nullptr;  // the datatypes: an array of the MPI's handles
  Ialltoall ialltoall = nullptr;
  Ialltoallv ialltoallv = nullptr;
  // The completion calls drive aapc's nonblocking all-to-alls (requests.cpp).
  Wait wait = nullptr;
  Waitall waitall = nullptr;
  Waitany waitany = nullptr;
  Waitsome waitsome = nullptr;
  Test test = nullptr;
  Testall testall = nullptr;
  Testany testany = nullptr;
  Waitsome testsome = nullptr;
  RequestGetStatus request_get_status = nullptr;
  // MPI-4's persistent all-to-alls (persistent.cpp); Open MPI 4.1 has MPIX_* inits only.
  AlltoallInit alltoall_init = nullptr;
  AlltoallvInit alltoallv_init = nullptr;
  Start start = nullptr;
  Startall startall = nullptr;
  Start request_free = nullptr;
  FAlltoall f_alltoall = nullptr;
  FAlltoallv f_alltoallv = nullptr;
  // Open MPI's mpi_f08 bindings call these (libmpi_mpifh's), past mpi_alltoall_ too.
  FAlltoall ompi_f_alltoall = nullptr;
  FAlltoallv ompi_f_alltoallv = nullptr;
  // Before the program's other collectives on a communicator (the guarded calls below).
  void (*before_collective)(Word) = nullptr;
  void* mpi = RTLD_NEXT;  // where the MPI's PMPI_* are found
};

struct Loaded {
  const char* flavour = nullptr;
  std::string path;
};

int find_mpi(dl_phdr_info* info, std::size_t, void* data) {
  auto* found = static_cast<Loaded*>(data);
  const std::string path = info->dlpi_name != nullptr ? info->dlpi_name : "";
  const std::string base = path.substr(path.rfind('/') + 1);
  if (base.rfind("libmpi.so", 0) == 0) *found = {"openmpi", path};
  if (base.rfind("libmpich.so", 0) == 0) *found = {"mpich", path};
  return found->flavour != nullptr ? 1 : 0;
}

// Which MPI is loaded: by a symbol only it defines, or by its library's name among those
// loaded (Python's mpi4py loads it where RTLD_DEFAULT does not look).
Loaded loaded_mpi() {
  Loaded l;
  if (dlsym(RTLD_DEFAULT, "ompi_mpi_comm_world") != nullptr) l.flavour = "openmpi";
  else if (dlsym(RTLD_DEFAULT, "MPIR_Err_create_code") != nullptr) l.flavour = "mpich";
  else dl_iterate_phdr(find_mpi, &l);
  return l;
}

std::string own_directory() {
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&loaded_mpi), &info) == 0 || info.dli_fname == nullptr) return "";
  std::string path = info.dli_fname;
  const auto slash = path.rfind('/');
  return slash == std::string::npos ? "" : path.substr(0, slash + 1);
}

template <typename F>
F symbol(void* lib, const char* name) {
  return reinterpret_cast<F>(dlsym(lib, name));
}

// Fortran entry points. Open MPI's Fortran bindings call PMPI_Alltoall, past a C
// interposer, so its calls are taken here and converted (libaapc-mpi-openmpi.so). MPICH's
// call the C MPI_Alltoall, which is ours already: its own bindings are called. Open MPI's
// mpi_f08 module calls ompi_alltoall_f with the same arguments (each handle's MPI_VAL), and
// MPICH's the C MPI_Alltoall.
void fortran_targets(Target& t, const char* mpi, void* lib) {
  if (lib != nullptr && mpi != nullptr && std::string(mpi) == "openmpi") {
    t.f_alltoall = t.ompi_f_alltoall = symbol<FAlltoall>(lib, "aapc_mpi_f_alltoall");
    t.f_alltoallv = t.ompi_f_alltoallv = symbol<FAlltoallv>(lib, "aapc_mpi_f_alltoallv");
  }
  if (t.f_alltoall == nullptr) t.f_alltoall = symbol<FAlltoall>(RTLD_NEXT, "mpi_alltoall_");
  if (t.f_alltoallv == nullptr) t.f_alltoallv = symbol<FAlltoallv>(RTLD_NEXT, "mpi_alltoallv_");
  if (t.ompi_f_alltoall == nullptr) t.ompi_f_alltoall = symbol<FAlltoall>(RTLD_NEXT, "ompi_alltoall_f");
  if (t.ompi_f_alltoallv == nullptr) t.ompi_f_alltoallv = symbol<FAlltoallv>(RTLD_NEXT, "ompi_alltoallv_f");
}

// The C entry points: all of libaapc-mpi-<mpi>.so's (`ours`), or all of the MPI's PMPI_*.
// False when one is missing.
bool bind_c(Target& t, void* lib, bool ours) {
  bool all = true;
  auto bind = [&](auto& slot, const char* aapc_name, const char* pmpi_name) {
    slot = symbol<std::remove_reference_t<decltype(slot)>>(lib, ours ? aapc_name : pmpi_name);
    all = all && slot != nullptr;
  };
  bind(t.init, "aapc_mpi_init", "PMPI_Init");
  bind(t.init_thread, "aapc_mpi_init_thread", "PMPI_Init_thread");
  bind(t.alltoall, "aapc_mpi_alltoall", "PMPI_Alltoall");
  bind(t.alltoallv, "aapc_mpi_alltoallv", "PMPI_Alltoallv");
  bind(t.alltoallw, "aapc_mpi_alltoallw", "PMPI_Alltoallw");
  bind(t.ialltoall, "aapc_mpi_ialltoall", "PMPI_Ialltoall");
  bind(t.ialltoallv, "aapc_mpi_ialltoallv", "PMPI_Ialltoallv");
  bind(t.wait, "aapc_mpi_wait", "PMPI_Wait");
  bind(t.waitall, "aapc_mpi_waitall", "PMPI_Waitall");
  bind(t.waitany, "aapc_mpi_waitany", "PMPI_Waitany");
  bind(t.waitsome, "aapc_mpi_waitsome", "PMPI_Waitsome");
  bind(t.test, "aapc_mpi_test", "PMPI_Test");
  bind(t.testall, "aapc_mpi_testall", "PMPI_Testall");
  bind(t.testany, "aapc_mpi_testany", "PMPI_Testany");
  bind(t.testsome, "aapc_mpi_testsome", "PMPI_Testsome");
  bind(t.request_get_status, "aapc_mpi_request_get_status", "PMPI_Request_get_status");
  bind(t.start, "aapc_mpi_start", "PMPI_Start");
  bind(t.startall, "aapc_mpi_startall", "PMPI_Startall");
  bind(t.request_free, "aapc_mpi_request_free", "PMPI_Request_free");
  if (ours) {
    bind(t.alltoall_init, "aapc_mpi_alltoall_init", "");
    bind(t.alltoallv_init, "aapc_mpi_alltoallv_init", "");
  } else {  // MPICH 4's, or Open MPI's extension's; neither in older MPIs
    t.alltoall_init = symbol<AlltoallInit>(lib, "PMPI_Alltoall_init");
    if (t.alltoall_init == nullptr) t.alltoall_init = symbol<AlltoallInit>(lib, "PMPIX_Alltoall_init");
    t.alltoallv_init = symbol<AlltoallvInit>(lib, "PMPI_Alltoallv_init");
    if (t.alltoallv_init == nullptr) t.alltoallv_init = symbol<AlltoallvInit>(lib, "PMPIX_Alltoallv_init");
  }
  return all;
}

Target load() {
  Target t;
  const Loaded found = loaded_mpi();
  const char* mpi = found.flavour;
  const bool verbose = std::getenv("AAPC_MPI_VERBOSE") != nullptr;
  void* lib = nullptr;
  std::string path;
  if (mpi != nullptr) {
    path = own_directory() + "libaapc-mpi-" + mpi + ".so";
    lib = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  }
  if (!found.path.empty())
    if (void* h = dlopen(found.path.c_str(), RTLD_NOW | RTLD_NOLOAD)) t.mpi = h;
  if (lib != nullptr && bind_c(t, lib, true)) {
    t.before_collective = symbol<void (*)(Word)>(lib, "aapc_mpi_before_collective");
  } else {
    if (verbose)
      std::fprintf(stderr, "aapc-mpi: %s; the MPI's own all-to-all runs\n",
                   mpi == nullptr ? "neither Open MPI nor MPICH is loaded" : ("cannot load " + path + ": " + dlerror()).c_str());
    if (!bind_c(t, t.mpi, false)) {
      std::fprintf(stderr, "aapc-mpi: libaapc-mpi.so is loaded in a process without an MPI library (no PMPI_Init); remove it from LD_PRELOAD\n");
      std::abort();
    }
  }
  fortran_targets(t, mpi, lib);
  return t;
}

const Target& target() {
  static const Target t = load();
  return t;
}

}  // namespace

extern "C" {

// MPI_Init makes MPI_COMM_WORLD's plan: which process leads each machine (plan.cpp).
__attribute__((visibility("default"))) int MPI_Init(int* argc, char*** argv) { return target().init(argc, argv); }

__attribute__((visibility("default"))) int MPI_Init_thread(int* argc, char*** argv, int required, int* provided) {
  return target().init_thread(argc, argv, required, provided);
}

__attribute__((visibility("default"))) int MPI_Alltoall(const void* sbuf, int scount, Word stype, void* rbuf, int rcount, Word rtype, Word comm) {
  return target().alltoall(sbuf, scount, stype, rbuf, rcount, rtype, comm);
}

__attribute__((visibility("default"))) int MPI_Alltoallv(const void* sbuf, const int* scounts, const int* sdispls, Word stype, void* rbuf,
                                                         const int* rcounts, const int* rdispls, Word rtype, Word comm) {
  return target().alltoallv(sbuf, scounts, sdispls, stype, rbuf, rcounts, rdispls, rtype, comm);
}

__attribute__((visibility("default"))) int MPI_Alltoallw(const void* sbuf, const int* scounts, const int* sdispls, const void* stypes, void* rbuf,
                                                         const int* rcounts, const int* rdispls, const void* rtypes, Word comm) {
  return target().alltoallw(sbuf, scounts, sdispls, stypes, rbuf, rcounts, rdispls, rtypes, comm);
}

__attribute__((visibility("default"))) int MPI_Ialltoall(const void* sbuf, int scount, Word stype, void* rbuf, int rcount, Word rtype, Word comm,
                                                         void* request) {
  return target().ialltoall(sbuf, scount, stype, rbuf, rcount, rtype, comm, request);
}

__attribute__((visibility("default"))) int MPI_Ialltoallv(const void* sbuf, const int* scounts, const int* sdispls, Word stype, void* rbuf,
                                                          const int* rcounts, const int* rdispls, Word rtype, Word comm, void* request) {
  return target().ialltoallv(sbuf, scounts, sdispls, stype, rbuf, rcounts, rdispls, rtype, comm, request);
}

// MPI-4's persistent all-to-alls (MPICH 4), and Open MPI 4.1's (its pcollreq extension).
// An MPI without them never has its programs call them.
__attribute__((visibility("default"))) int MPI_Alltoall_init(const void* sbuf, int scount, Word stype, void* rbuf, int rcount, Word rtype, Word comm,
                                                             Word info, void* request) {
  return target().alltoall_init(sbuf, scount, stype, rbuf, rcount, rtype, comm, info, request);
}
__attribute__((visibility("default"))) int MPI_Alltoallv_init(const void* sbuf, const int* scounts, const int* sdispls, Word stype, void* rbuf,
                                                              const int* rcounts, const int* rdispls, Word rtype, Word comm, Word info, void* request) {
  return target().alltoallv_init(sbuf, scounts, sdispls, stype, rbuf, rcounts, rdispls, rtype, comm, info, request);
}
__attribute__((visibility("default"))) int MPIX_Alltoall_init(const void* sbuf, int scount, Word stype, void* rbuf, int rcount, Word rtype, Word comm,
                                                              Word info, void* request) {
  return target().alltoall_init(sbuf, scount, stype, rbuf, rcount, rtype, comm, info, request);
}
__attribute__((visibility("default"))) int MPIX_Alltoallv_init(const void* sbuf, const int* scounts, const int* sdispls, Word stype, void* rbuf,
                                                               const int* rcounts, const int* rdispls, Word rtype, Word comm, Word info, void* request) {
  return target().alltoallv_init(sbuf, scounts, sdispls, stype, rbuf, rcounts, rdispls, rtype, comm, info, request);
}
__attribute__((visibility("default"))) int MPI_Start(void* request) { return target().start(request); }
__attribute__((visibility("default"))) int MPI_Startall(int count, void* requests) { return target().startall(count, requests); }
__attribute__((visibility("default"))) int MPI_Request_free(void* request) { return target().request_free(request); }

__attribute__((visibility("default"))) int MPI_Wait(void* req, void* status) { return target().wait(req, status); }
__attribute__((visibility("default"))) int MPI_Waitall(int count, void* reqs, void* statuses) { return target().waitall(count, reqs, statuses); }
__attribute__((visibility("default"))) int MPI_Waitany(int count, void* reqs, int* index, void* status) {
  return target().waitany(count, reqs, index, status);
}
__attribute__((visibility("default"))) int MPI_Waitsome(int count, void* reqs, int* outcount, int* indices, void* statuses) {
  return target().waitsome(count, reqs, outcount, indices, statuses);
}
__attribute__((visibility("default"))) int MPI_Test(void* req, int* flag, void* status) { return target().test(req, flag, status); }
__attribute__((visibility("default"))) int MPI_Testall(int count, void* reqs, int* flag, void* statuses) {
  return target().testall(count, reqs, flag, statuses);
}
__attribute__((visibility("default"))) int MPI_Testany(int count, void* reqs, int* index, int* flag, void* status) {
  return target().testany(count, reqs, index, flag, status);
}
__attribute__((visibility("default"))) int MPI_Testsome(int count, void* reqs, int* outcount, int* indices, void* statuses) {
  return target().testsome(count, reqs, outcount, indices, statuses);
}
__attribute__((visibility("default"))) int MPI_Request_get_status(Word req, int* flag, void* status) {
  return target().request_get_status(req, flag, status);
}

// The program's other collectives on a communicator whose plan may still be duplicating it
// (plan.cpp, Planner::finish_duplicate): the library's hook first, then the MPI's own. The
// nonblocking collectives, and the calls that make a communicator from another (Open MPI 4.1
// agrees on a new context id with nonblocking allreduces on the old communicator).
// MPI_Ialltoall(v) are the library's own above. C only: Open MPI's Fortran bindings call
// PMPI_* past these.
#define AAPC_GUARDED(name, comm, params, args)                                  \
  __attribute__((visibility("default"))) int name params {                      \
    using F = int(*) params;                                                    \
    static const F pmpi = symbol<F>(target().mpi, "P" #name);                   \
    if (target().before_collective != nullptr) target().before_collective(comm); \
    return pmpi args;                                                           \
  }

using V = void*;
using C = const void*;
using I = const int*;
AAPC_GUARDED(MPI_Ibarrier, comm, (Word comm, V req), (comm, req))
AAPC_GUARDED(MPI_Ibcast, comm, (V buf, int count, Word type, int root, Word comm, V req), (buf, count, type, root, comm, req))
AAPC_GUARDED(MPI_Igather, comm, (C sb, int sc, Word st, V rb, int rc, Word rt, int root, Word comm, V req), (sb, sc, st, rb, rc, rt, root, comm, req))
AAPC_GUARDED(MPI_Igatherv, comm, (C sb, int sc, Word st, V rb, I rc, I rd, Word rt, int root, Word comm, V req),
             (sb, sc, st, rb, rc, rd, rt, root, comm, req))
AAPC_GUARDED(MPI_Iscatter, comm, (C sb, int sc, Word st, V rb, int rc, Word rt, int root, Word comm, V req), (sb, sc, st, rb, rc, rt, root, comm, req))
AAPC_GUARDED(MPI_Iscatterv, comm, (C sb, I sc, I sd, Word st, V rb, int rc, Word rt, int root, Word comm, V req),
             (sb, sc, sd, st, rb, rc, rt, root, comm, req))
AAPC_GUARDED(MPI_Iallgather, comm, (C sb, int sc, Word st, V rb, int rc, Word rt, Word comm, V req), (sb, sc, st, rb, rc, rt, comm, req))
AAPC_GUARDED(MPI_Iallgatherv, comm, (C sb, int sc, Word st, V rb, I rc, I rd, Word rt, Word comm, V req), (sb, sc, st, rb, rc, rd, rt, comm, req))
AAPC_GUARDED(MPI_Ialltoallw, comm, (C sb, I sc, I sd, C st, V rb, I rc, I rd, C rt, Word comm, V req), (sb, sc, sd, st, rb, rc, rd, rt, comm, req))
AAPC_GUARDED(MPI_Ireduce, comm, (C sb, V rb, int n, Word t, Word op, int root, Word comm, V req), (sb, rb, n, t, op, root, comm, req))
AAPC_GUARDED(MPI_Iallreduce, comm, (C sb, V rb, int n, Word t, Word op, Word comm, V req), (sb, rb, n, t, op, comm, req))
AAPC_GUARDED(MPI_Ireduce_scatter, comm, (C sb, V rb, I rc, Word t, Word op, Word comm, V req), (sb, rb, rc, t, op, comm, req))
AAPC_GUARDED(MPI_Ireduce_scatter_block, comm, (C sb, V rb, int rc, Word t, Word op, Word comm, V req), (sb, rb, rc, t, op, comm, req))
AAPC_GUARDED(MPI_Iscan, comm, (C sb, V rb, int n, Word t, Word op, Word comm, V req), (sb, rb, n, t, op, comm, req))
AAPC_GUARDED(MPI_Iexscan, comm, (C sb, V rb, int n, Word t, Word op, Word comm, V req), (sb, rb, n, t, op, comm, req))
AAPC_GUARDED(MPI_Comm_dup, comm, (Word comm, V out), (comm, out))
AAPC_GUARDED(MPI_Comm_dup_with_info, comm, (Word comm, Word info, V out), (comm, info, out))
AAPC_GUARDED(MPI_Comm_idup, comm, (Word comm, V out, V req), (comm, out, req))
AAPC_GUARDED(MPI_Comm_split, comm, (Word comm, int color, int key, V out), (comm, color, key, out))
AAPC_GUARDED(MPI_Comm_split_type, comm, (Word comm, int type, int key, Word info, V out), (comm, type, key, info, out))
AAPC_GUARDED(MPI_Comm_create, comm, (Word comm, Word group, V out), (comm, group, out))
AAPC_GUARDED(MPI_Cart_create, comm, (Word comm, int nd, I dims, I periods, int reorder, V out), (comm, nd, dims, periods, reorder, out))
AAPC_GUARDED(MPI_Graph_create, comm, (Word comm, int nn, I index, I edges, int reorder, V out), (comm, nn, index, edges, reorder, out))
#undef AAPC_GUARDED

// gfortran's names (Debian's Fortran compiler): lower case, one trailing underscore.
__attribute__((visibility("default"))) void mpi_alltoall_(const void* sbuf, const int* scount, const int* stype, void* rbuf, const int* rcount,
                                                          const int* rtype, const int* comm, int* ierr) {
  target().f_alltoall(sbuf, scount, stype, rbuf, rcount, rtype, comm, ierr);
}

__attribute__((visibility("default"))) void mpi_alltoallv_(const void* sbuf, const int* scounts, const int* sdispls, const int* stype, void* rbuf,
                                                           const int* rcounts, const int* rdispls, const int* rtype, const int* comm, int* ierr) {
  target().f_alltoallv(sbuf, scounts, sdispls, stype, rbuf, rcounts, rdispls, rtype, comm, ierr);
}

// Open MPI's mpi_f08 (use mpi_f08): its mpi_alltoall_f08_ calls these across libraries.
__attribute__((visibility("default"))) void ompi_alltoall_f(const void* sbuf, const int* scount, const int* stype, void* rbuf, const int* rcount,
                                                            const int* rtype, const int* comm, int* ierr) {
  target().ompi_f_alltoall(sbuf, scount, stype, rbuf, rcount, rtype, comm, ierr);
}

__attribute__((visibility("default"))) void ompi_alltoallv_f(const void* sbuf, const int* scounts, const int* sdispls, const int* stype, void* rbuf,
                                                             const int* rcounts, const int* rdispls, const int* rtype, const int* comm, int* ierr) {
  target().ompi_f_alltoallv(sbuf, scounts, sdispls, stype, rbuf, rcounts, rdispls, rtype, comm, ierr);
}

}  // extern "C"

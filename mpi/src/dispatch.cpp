// libaapc-mpi.so: the MPI profiling-interface interposer that programs preload or link. It
// defines the calls of interposed.def (MPI_Init(_thread), the all-to-alls, the completion
// calls that drive the nonblocking ones), the persistent all-to-alls' inits, the guarded
// collectives below and the Fortran all-to-alls,
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
// Short names for interposed.def's parameter lists.
using V = void*;
using C = const void*;
using I = const int*;
// MPI-4's persistent inits; Open MPI 4.1 has MPIX_* ones only.
using AlltoallInit = int (*)(const void*, int, Word, void*, int, Word, Word, Word, void*);
using AlltoallvInit = int (*)(const void*, const int*, const int*, Word, void*, const int*, const int*, Word, Word, Word, void*);
using AlltoallwInit = int (*)(const void*, const int*, const int*, const void*, void*, const int*, const int*, const void*, Word, Word, void*);
// Fortran (mpif.h, use mpi): every argument by reference, handles as MPI_Fint (int).
using FAlltoall = void (*)(const void*, const int*, const int*, void*, const int*, const int*, const int*, int*);
using FAlltoallv = void (*)(const void*, const int*, const int*, const int*, void*, const int*, const int*, const int*, const int*, int*);

struct Target {
  // Every call of interposed.def, by its slot.
#define AAPC_FORWARDED(name, slot, params, args) int(*slot) params = nullptr;
#define AAPC_GUARDED(name, comm, params, args)
#include "interposed.def"
#undef AAPC_GUARDED
#undef AAPC_FORWARDED
  AlltoallInit alltoall_init = nullptr;
  AlltoallvInit alltoallv_init = nullptr;
  AlltoallwInit alltoallw_init = nullptr;
  // The MPI's own, for the inits of its Fortran bindings (from_fortran_bindings).
  AlltoallInit own_alltoall_init = nullptr;
  AlltoallvInit own_alltoallv_init = nullptr;
  AlltoallwInit own_alltoallw_init = nullptr;
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

std::string file_name(const std::string& path) { return path.substr(path.rfind('/') + 1); }

int find_mpi(dl_phdr_info* info, std::size_t, void* data) {
  auto* found = static_cast<Loaded*>(data);
  const std::string path = info->dlpi_name != nullptr ? info->dlpi_name : "";
  const std::string base = file_name(path);
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
#define AAPC_FORWARDED(name, slot, params, args) bind(t.slot, "aapc_mpi_" #slot, "P" #name);
#define AAPC_GUARDED(name, comm, params, args)
#include "interposed.def"
#undef AAPC_GUARDED
#undef AAPC_FORWARDED
  if (ours) {
    bind(t.alltoall_init, "aapc_mpi_alltoall_init", "");
    bind(t.alltoallv_init, "aapc_mpi_alltoallv_init", "");
    bind(t.alltoallw_init, "aapc_mpi_alltoallw_init", "");
  } else {
    t.alltoall_init = t.own_alltoall_init;
    t.alltoallv_init = t.own_alltoallv_init;
    t.alltoallw_init = t.own_alltoallw_init;
  }
  return all;
}

// The MPI's own persistent inits: MPICH 4's, or Open MPI's extension's; neither in older MPIs.
void own_inits(Target& t) {
  auto either = [&]<typename F>(F& slot, const std::string& name) {
    slot = symbol<F>(t.mpi, ("PMPI_" + name).c_str());
    if (slot == nullptr) slot = symbol<F>(t.mpi, ("PMPIX_" + name).c_str());
  };
  either(t.own_alltoall_init, "Alltoall_init");
  either(t.own_alltoallv_init, "Alltoallv_init");
  either(t.own_alltoallw_init, "Alltoallw_init");
}

// Whether `caller`, a return address, lies in MPICH's Fortran bindings (libmpichfort). Its
// mpi_f08 bindings start and complete requests by PMPI_Start, PMPI_Wait and the like, past
// the library: a persistent all-to-all that the library made for their init never ran, since
// MPICH's own start ran the library's stand-in (persistent.cpp), which completes at once, and
// the program read its receive buffer unchanged. So the inits of those bindings, and of
// mpif.h's beside them, are the MPI's own. Open MPI's Fortran bindings call its PMPI_* inits.
bool from_fortran_bindings(const void* caller) {
  Dl_info info{};
  return dladdr(caller, &info) != 0 && info.dli_fname != nullptr && file_name(info.dli_fname).rfind("libmpichfort.so", 0) == 0;
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
  // An MPI found by its name alone was loaded where RTLD_DEFAULT does not look: with
  // RTLD_LOCAL, as Python loads mpi4py's MPI module and the MPI with it. Debian's MPICH 4.0.2
  // (UCX) loaded that way hangs in its first exchange between machines, with or without this
  // library (tests/mpi/mpi_plugin.c). So the MPI and what it links are made global here, before
  // the program's MPI_Init reaches them, as mpi4py itself does for Open MPI. This library
  // stays ahead of them in the global scope: the program's calls still come here.
  if (!found.path.empty())
    if (void* h = dlopen(found.path.c_str(), RTLD_NOW | RTLD_NOLOAD | RTLD_GLOBAL)) t.mpi = h;
  own_inits(t);
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

// The persistent init that a call from `caller` runs: the library's, or the MPI's own for
// the MPI's Fortran bindings (from_fortran_bindings).
template <typename F>
F init_of(F Target::*ours, F Target::*own, const void* caller) {
  const Target& t = target();
  return t.*own != nullptr && from_fortran_bindings(caller) ? t.*own : t.*ours;
}

}  // namespace

extern "C" {

#define AAPC_FORWARDED(name, slot, params, args) \
  __attribute__((visibility("default"))) int name params { return target().slot args; }
#define AAPC_GUARDED(name, comm, params, args)
#include "interposed.def"
#undef AAPC_GUARDED
#undef AAPC_FORWARDED

// MPI-4's persistent all-to-alls (MPICH 4), and Open MPI 4.1's (its pcollreq extension), each
// under both names: MPI_<kind>_init and MPIX_<kind>_init. An MPI without them never has its
// programs call them. The caller's return address is read here, in the function the program
// (or its Fortran bindings) called (init_of).
#define AAPC_PERSISTENT_NAMED(name, slot, params, args)                                                   \
  __attribute__((visibility("default"))) int name params {                                                \
    return init_of(&Target::slot, &Target::own_##slot, __builtin_return_address(0)) args;                  \
  }
#define AAPC_PERSISTENT(kind, slot, params, args)            \
  AAPC_PERSISTENT_NAMED(MPI_##kind##_init, slot, params, args) \
  AAPC_PERSISTENT_NAMED(MPIX_##kind##_init, slot, params, args)

AAPC_PERSISTENT(Alltoall, alltoall_init,
                (const void* sbuf, int scount, Word stype, void* rbuf, int rcount, Word rtype, Word comm, Word info, void* request),
                (sbuf, scount, stype, rbuf, rcount, rtype, comm, info, request))
AAPC_PERSISTENT(Alltoallv, alltoallv_init,
                (const void* sbuf, const int* scounts, const int* sdispls, Word stype, void* rbuf, const int* rcounts, const int* rdispls,
                 Word rtype, Word comm, Word info, void* request),
                (sbuf, scounts, sdispls, stype, rbuf, rcounts, rdispls, rtype, comm, info, request))
AAPC_PERSISTENT(Alltoallw, alltoallw_init,
                (const void* sbuf, const int* scounts, const int* sdispls, const void* stypes, void* rbuf, const int* rcounts,
                 const int* rdispls, const void* rtypes, Word comm, Word info, void* request),
                (sbuf, scounts, sdispls, stypes, rbuf, rcounts, rdispls, rtypes, comm, info, request))
#undef AAPC_PERSISTENT
#undef AAPC_PERSISTENT_NAMED

// interposed.def's guarded calls: the library's hook on the communicator first, then the
// MPI's own.
#define AAPC_GUARDED(name, comm, params, args)                                  \
  __attribute__((visibility("default"))) int name params {                      \
    using F = int(*) params;                                                    \
    static const F pmpi = symbol<F>(target().mpi, "P" #name);                   \
    if (target().before_collective != nullptr) target().before_collective(comm); \
    return pmpi args;                                                           \
  }

#define AAPC_FORWARDED(name, slot, params, args)
#include "interposed.def"
#undef AAPC_FORWARDED
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

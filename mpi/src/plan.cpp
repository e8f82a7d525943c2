// The per-communicator decision of libaapc-mpi: which machine every rank is on (from its
// daemon), whether aapc can carry the communicator's all-to-alls, and the local communicator
// of each machine.
#include "plan.hpp"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <set>
#include <thread>

#include "aapc/mpi/bell.hpp"
#include "aapc/mpi/copy.hpp"
#include "aapc/mpi/env.hpp"
#include "op.hpp"
#include "single_copy.hpp"

namespace aapc::mpi {

namespace {

// What a rank reports about itself to the others when a plan is made.
enum Local : int { kNoDaemon = -1, kOff = -2 };

// This process's machine (its daemon's rank), or why there is none.
int my_machine(int& cluster_size) {
  Process& pr = process();
  cluster_size = 0;
  if (env_off("AAPC_MPI")) return kOff;
  if (!pr.info) {
    // Every rank of a machine asks at once; a daemon at its per-uid connection limit says
    // busy, and a moment later has room again (these connections last a few milliseconds).
    auto c = aapc::Client::try_connect();
    for (int attempt = 0; !c && c.error().code() == Errc::kBusy && attempt < 100; ++attempt) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5 + (::getpid() + attempt * 7) % 20));
      c = aapc::Client::try_connect();
    }
    if (!c) return kNoDaemon;
    pr.info = c.value().info();  // the connection closes here; leaders open theirs when they exchange
  }
  cluster_size = pr.info->size;
  return pr.info->rank;
}

void destroy(Plan* p) {
  if (p->local != MPI_COMM_NULL) PMPI_Comm_free(&p->local);
  delete p;
}

// A communicator may be freed while its nonblocking all-to-alls run (MPI_Comm_free): their
// plan then lives until the last of them is over.
int delete_plan(MPI_Comm, int, void* attr, void*) {
  auto* p = static_cast<Plan*>(attr);
  std::lock_guard<std::recursive_mutex> hold(process().mutex);
  p->doomed = true;
  if (p->ops == 0) destroy(p);
  return MPI_SUCCESS;
}

// The same verdict on every rank: it is computed from what all of them reported, and the
// machines they are on.
std::string verdict(const std::vector<int>& report, const std::set<int>& machines) {
  const int n = static_cast<int>(report.size() / 2);
  if (n < 2) return "a communicator of one rank";
  int cluster = -1;
  for (int r = 0; r < n; ++r) {
    const int m = report[2 * static_cast<std::size_t>(r)], c = report[2 * static_cast<std::size_t>(r) + 1];
    if (m == kOff) return "AAPC_MPI=off on rank " + std::to_string(r);
    if (m == kNoDaemon) return "rank " + std::to_string(r) + " reaches no aapcd (set AAPC_SOCKET, or start aapcd)";
    if (cluster < 0) cluster = c;
    if (c != cluster) return "ranks 0 and " + std::to_string(r) + " are in different aapc clusters";
  }
  if (machines.size() < 2) return "its ranks are all on one machine (the MPI's shared memory carries it)";
  return "";
}

std::string name_of(MPI_Comm comm) {
  char name[MPI_MAX_OBJECT_NAME] = {0};
  int len = 0;
  PMPI_Comm_get_name(comm, name, &len);
  return len > 0 ? name : "a communicator";
}

void say(MPI_Comm comm, const Plan& p, int rank, int size) {
  if (!env_on("AAPC_MPI_VERBOSE") || rank != 0) return;
  const std::string what = name_of(comm);
  if (p.aapc) {
    const std::size_t lo = p.fewest, hi = p.most;
    std::fprintf(stderr,
                 "aapc-mpi: %s (%d ranks on %d machines, %zu-%zu per machine): all-to-all through aapc (MPI_Alltoall of machine-level "
                 "blocks under %llu bytes: the MPI's own); hand-overs between a machine's ranks: %s\n",
                 what.c_str(), size, p.place.machines(), lo, hi, static_cast<unsigned long long>(min_block()),
                 p.single_copy_everywhere ? "single copy (process_vm_readv)" : "through the MPI on some machines (AAPC_MPI_HANDOVER=mpi, or the kernel refused single copy)");
  } else {
    std::fprintf(stderr, "aapc-mpi: %s (%d ranks): the MPI's own all-to-all, because %s\n", what.c_str(), size, p.why.c_str());
  }
}

// How this machine's ranks hand their blocks to the leader and back (issue 13): single copy
// where the leader can reach every local rank's memory (aapc/mpi/copy.hpp), else through the
// MPI. The leader reads a probe word of every local rank and tells them all the outcome, so
// the machine's ranks agree. Single copy needs no other rank to run while the leader copies;
// the MPIs' large-message transports move only while both sides call in, which on a node
// with more processes than cores (MPICH's ranks spin in their waits) costs tens of ms.
// With single copy every rank keeps a mailbox for the leader (single_copy.hpp), whose address
// goes with the probe.
void choose_handover(Plan& p) {
  static std::uint64_t probe = 0;
  probe = 0x6161706300000000ULL | static_cast<std::uint32_t>(::getpid());
  const char* how = std::getenv("AAPC_MPI_HANDOVER");
  const bool mpi_asked = how != nullptr && std::strcmp(how, "mpi") == 0;
  if (!mpi_asked) p.mailbox = std::make_unique<single_copy::Mailbox>();
  const std::uint64_t mine[4] = {static_cast<std::uint64_t>(::getpid()), reinterpret_cast<std::uint64_t>(&probe), mpi_asked ? 0 : probe,
                                 reinterpret_cast<std::uint64_t>(p.mailbox.get())};
  std::vector<std::uint64_t> all(p.leader() ? 4 * static_cast<std::size_t>(p.local_size) : 0);
  PMPI_Gather(mine, 4, MPI_UINT64_T, all.data(), 4, MPI_UINT64_T, Plan::leader_rank, p.local);
  int single = 1;
  if (p.leader()) {
    for (int k = 0; k < p.local_size; ++k) {
      const std::uint64_t* r = &all[4 * static_cast<std::size_t>(k)];
      p.pids.push_back(static_cast<int>(r[0]));
      p.mailboxes.push_back(r[3]);
      if (r[2] == 0 || !can_reach(static_cast<int>(r[0]), r[1], r[2]).empty()) single = 0;
    }
  }
  int told[2] = {single, static_cast<int>(::getpid())};  // and whose bell to ring
  PMPI_Bcast(told, 2, MPI_INT, Plan::leader_rank, p.local);
  p.single_copy = told[0] != 0;
  p.leader_pid = told[1];
  if (p.single_copy) bell::open();  // before anyone rings it
  if (!p.single_copy) {
    p.pids.clear();
    p.mailboxes.clear();
    p.mailbox.reset();
  }
}

// The leaders of the communicator's machines open the aapc group of its machines (issue 13):
// its exchanges have ids of their own, so each communicator keeps its own order, and leaders of
// different communicators on one machine do not mix theirs up. The leaders agree on the group
// through the MPI (an allreduce among them, Client::open_group), and every rank of the
// communicator learns the outcome; empty when the group opened on every machine.
std::string open_group(MPI_Comm comm, Plan& p) {
  Process& pr = process();
  MPI_Comm leaders = MPI_COMM_NULL;
  int rank = 0;
  PMPI_Comm_rank(comm, &rank);
  PMPI_Comm_split(comm, p.leader() ? 0 : MPI_UNDEFINED, rank, &leaders);
  std::string why;
  if (p.leader()) {
    if (!pr.client) {
      auto c = aapc::Client::try_connect();
      if (c) pr.client.emplace(std::move(c.value()));
      else why = c.error().message();
    }
    int connected = why.empty() ? 1 : 0, everywhere = 0;  // every leader calls open_group, or none
    PMPI_Allreduce(&connected, &everywhere, 1, MPI_INT, MPI_MIN, leaders);
    if (everywhere == 0 && why.empty()) why = "a machine's leader could not connect to its aapcd";
    if (everywhere != 0) {
      auto g = pr.client->open_group(p.members, [&](std::vector<std::uint64_t>& words, aapc::ReduceOp op) {
        PMPI_Allreduce(MPI_IN_PLACE, words.data(), static_cast<int>(words.size()), MPI_UINT64_T, op == aapc::ReduceOp::kAnd ? MPI_BAND : MPI_MAX,
                       leaders);
      });
      if (g) p.group.emplace(std::move(g.value()));
      else why = "opening its aapc group: " + g.error().message();
    }
    PMPI_Comm_free(&leaders);
  }
  // Every rank learns whether every leader has the group (the leaders agree among themselves),
  // and whether every machine hands over by single copy.
  int ok[2] = {why.empty() ? 1 : 0, p.single_copy ? 1 : 0}, all[2] = {0, 0};
  PMPI_Allreduce(ok, all, 2, MPI_INT, MPI_MIN, comm);
  p.single_copy_everywhere = all[1] != 0;
  if (all[0] != 0) return "";
  p.group.reset();
  return why.empty() ? "a machine's leader could not open the communicator's aapc group" : why;
}

Plan* make_plan(MPI_Comm comm) {
  auto* p = new Plan;
  int inter = 0, rank = 0, size = 0;
  PMPI_Comm_test_inter(comm, &inter);
  PMPI_Comm_rank(comm, &rank);
  PMPI_Comm_size(comm, &size);
  if (inter != 0) {  // every rank of it sees the same
    p->why = "it is an intercommunicator";
    say(comm, *p, rank, size);
    return p;
  }
  int cluster = 0;
  int mine[2] = {my_machine(cluster), 0};
  mine[1] = cluster;
  std::vector<int> report(2 * static_cast<std::size_t>(size));
  PMPI_Allgather(mine, 2, MPI_INT, report.data(), 2, MPI_INT, comm);
  // The communicator's machines, numbered by their cluster ranks: the group's ranks.
  std::set<int> machines;
  for (int r = 0; r < size; ++r) machines.insert(report[2 * static_cast<std::size_t>(r)]);
  p->why = verdict(report, machines);
  if (p->why.empty()) {
    p->members.assign(machines.begin(), machines.end());
    auto index = [&](int cluster_rank) { return static_cast<int>(std::lower_bound(p->members.begin(), p->members.end(), cluster_rank) - p->members.begin()); };
    std::vector<int> machine_of(static_cast<std::size_t>(size));
    for (int r = 0; r < size; ++r) machine_of[static_cast<std::size_t>(r)] = index(report[2 * static_cast<std::size_t>(r)]);
    p->place = Placement::from(machine_of, static_cast<int>(p->members.size()));
    p->fewest = p->most = p->place.ranks_on.front().size();
    for (const auto& on : p->place.ranks_on) p->fewest = std::min(p->fewest, on.size()), p->most = std::max(p->most, on.size());
    p->machine = index(mine[0]);
    PMPI_Comm_split(comm, p->machine, rank, &p->local);
    PMPI_Comm_set_errhandler(p->local, MPI_ERRORS_RETURN);  // a hand-over's failure is the call's (exchange.cpp, all_done)
    PMPI_Comm_rank(p->local, &p->local_rank);
    PMPI_Comm_size(p->local, &p->local_size);
    choose_handover(*p);
    p->why = open_group(comm, *p);
    p->aapc = p->why.empty();
    if (!p->aapc) PMPI_Comm_free(&p->local);
  }
  say(comm, *p, rank, size);
  return p;
}

}  // namespace

Process& process() {
  static Process* pr = new Process;  // never destroyed: MPI may call in after exit handlers
  return *pr;
}

Plan& plan_of(MPI_Comm comm) {
  Process& pr = process();
  if (pr.keyval == MPI_KEYVAL_INVALID) PMPI_Comm_create_keyval(MPI_COMM_NULL_COPY_FN, delete_plan, &pr.keyval, nullptr);
  void* attr = nullptr;
  int found = 0;
  PMPI_Comm_get_attr(comm, pr.keyval, &attr, &found);
  if (found != 0) return *static_cast<Plan*>(attr);
  Plan* p = make_plan(comm);
  PMPI_Comm_set_attr(comm, pr.keyval, p);
  return *p;
}

void on_init() {
  plan_of(MPI_COMM_WORLD);
  hook_progress();
}

void op_over(Plan& p) {
  if (--p.ops == 0 && p.doomed) destroy(&p);
}

std::uint64_t min_block() {
  static const std::uint64_t least = [] {
    const char* v = std::getenv("AAPC_MPI_MIN_BLOCK");
    return v != nullptr && *v != '\0' ? std::strtoull(v, nullptr, 10) : 8192ULL;
  }();
  return least;
}

void announce_first(MPI_Comm comm, const Plan& p) {
  int rank = 0;
  PMPI_Comm_rank(comm, &rank);
  if (env_on("AAPC_MPI_VERBOSE") && rank == 0)
    std::fprintf(stderr, "aapc-mpi: %s: its first all-to-all was carried by aapc (%d machines)\n", name_of(comm).c_str(), p.place.machines());
}

int raise(MPI_Comm comm, const std::string& message) {
  Process& pr = process();
  if (pr.error_class < 0) {
    PMPI_Add_error_class(&pr.error_class);
    PMPI_Add_error_code(pr.error_class, &pr.error_code);
  }
  std::string text = "aapc: " + message;
  if (text.size() >= MPI_MAX_ERROR_STRING) text.resize(MPI_MAX_ERROR_STRING - 1);
  PMPI_Add_error_string(pr.error_code, text.c_str());
  PMPI_Comm_call_errhandler(comm, pr.error_code);
  return pr.error_code;
}

}  // namespace aapc::mpi

// The per-communicator decision of libaapc-mpi: which machine every rank is on (from its
// daemon), whether aapc can carry the communicator's all-to-alls, how each machine's ranks hand
// over their blocks, and the aapc group of the communicator's machines; made without blocking
// (plan.hpp).
#include "plan.hpp"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <set>
#include <utility>
#include <thread>

#include "aapc/mpi/bell.hpp"
#include "aapc/mpi/copy.hpp"
#include "aapc/mpi/env.hpp"
#include "aapc/mpi/fiber.hpp"
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

// Plan messages between two ranks on the plan's duplicate communicator: a tag that no call's
// hand-overs use (op.cpp numbers theirs from 1).
constexpr int kPlanTag = 0;

}  // namespace

// The fiber a plan is made in, and the nonblocking MPI operations it waits for. Its body
// calls await() where the blocking code would call a collective; the driver (step(), from
// plan_of() and progress(), with the process's mutex held) starts those operations on its own
// stack and resumes the body once they are complete.
struct PlanMaker {
  using Start = std::function<void(std::vector<MPI_Request>&)>;
  Fiber fiber;
  Start next;  // what the body waits for, to be started by the driver
  std::vector<MPI_Request> reqs;
  std::vector<MPI_Status> statuses;
  int rc = MPI_SUCCESS;
  bool running = false;  // in step(): Open MPI's progress hook may call in again
  bool on_comm = false;  // `reqs` is the duplication, which uses the program's communicator

  explicit PlanMaker(std::function<void()> body) : fiber(std::move(body)) {}

  // In the body: `start` posts nonblocking MPI operations into its vector; returns once all
  // are complete, with the MPI's error code or MPI_SUCCESS.
  int await(Start start) {
    next = std::move(start);
    rc = MPI_SUCCESS;
    fiber.pause();
    return rc;
  }

  // With Open MPI, a duplication still in flight is waited for before the program's next
  // operation on the communicator that may clash with it (settle_duplicate()): MPI_Comm_free
  // (Open MPI 4.1 crashes in it otherwise), another nonblocking collective, or a communicator
  // made from it. Open MPI 4.1 agrees on the duplicate's context id in rounds of nonblocking
  // allreduces on the communicator, each started from its progress engine once the one before
  // is over; a nonblocking collective takes the communicator's next tag when it starts. A rank
  // that tested the all-to-all before its MPI_Ibcast had started the next round, another had
  // not: the two ranks' tags crossed, and the job hung or failed with MPI_ERR_TRUNCATE
  // (tests/mpi/mpi_nonblocking.c). Its other ranks move the duplication in any MPI call that
  // waits, as the MPI's own nonblocking collectives move. MPICH orders the duplication with
  // the communicator's other collectives, keeps a freed communicator until it is over, and
  // calls back from its completion.
  void finish_duplicate() {
#ifdef OPEN_MPI
    if (!on_comm || reqs.empty() || running) return;
    statuses.resize(reqs.size());
    if (const int e = PMPI_Waitall(static_cast<int>(reqs.size()), reqs.data(), statuses.data()); e != MPI_SUCCESS) rc = e;
#endif
  }

  // The driver: true once the plan is made.
  bool step() {
    if (running) return false;
    running = true;
    struct Leave {
      bool& flag;
      ~Leave() { flag = false; }
    } leave{running};
    for (;;) {
      if (next) {
        reqs.clear();
        std::exchange(next, nullptr)(reqs);
      }
      int failed = MPI_SUCCESS;
      if (!test_all(reqs, statuses, failed)) return false;
      if (failed != MPI_SUCCESS) rc = failed;
      if (fiber.resume()) return true;
    }
  }
};

namespace {

void destroy(Plan* p) {
  if (p->dup != MPI_COMM_NULL) PMPI_Comm_free(&p->dup);
  delete p;
}

// A communicator may be freed while its nonblocking all-to-alls run (MPI_Comm_free): their
// plan then lives until the last of them is over (a plan being made has one: the call that
// started it).
int delete_plan(MPI_Comm, int, void* attr, void*) {
  auto* p = static_cast<Plan*>(attr);
  std::lock_guard<std::recursive_mutex> hold(process().mutex);
  p->doomed = true;
  if (p->making != nullptr) p->making->finish_duplicate();
  if (p->ops == 0 && p->ready()) destroy(p);
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

void say(const Plan& p, int size) {
  if (!env_on("AAPC_MPI_VERBOSE") || p.rank != 0) return;
  const char* what = p.name.c_str();
  if (p.aapc) {
    const std::size_t lo = p.fewest, hi = p.most;
    // AAPC_MPI_MIN_BLOCK=0: every call through aapc, and no alltoallv agrees on its size first.
    const std::string small = min_block() == 0 ? "every all-to-all, however small"
                                               : "all-to-alls of machine-level blocks under " + std::to_string(min_block()) +
                                                     " bytes: the MPI's own; an alltoallv's ranks agree on its largest first";
    std::fprintf(stderr, "aapc-mpi: %s (%d ranks on %d machines, %zu-%zu per machine): all-to-all through aapc (%s); hand-overs between a machine's ranks: %s\n",
                 what, size, p.place.machines(), lo, hi, small.c_str(),
                 p.single_copy_everywhere ? "single copy (process_vm_readv)" : "through the MPI on some machines (AAPC_MPI_HANDOVER=mpi, or the kernel refused single copy)");
  } else {
    std::fprintf(stderr, "aapc-mpi: %s (%d ranks): the MPI's own all-to-all, because %s\n", what, size, p.why.c_str());
  }
}

// Among the leaders of the communicator's machines alone (the other ranks take no part, so the
// leaders may call it as often as they need): replaces `words` by their element-wise AND or
// maximum over the leaders, as the first leader gathers them and sends the result back.
int leaders_reduce(PlanMaker& m, const Plan& p, std::vector<std::uint64_t>& words, bool max) {
  const int machines = p.place.machines(), n = static_cast<int>(words.size());
  auto leader_of = [&](int i) { return p.place.ranks_on[static_cast<std::size_t>(i)][Plan::leader_rank]; };
  if (machines < 2) return MPI_SUCCESS;
  if (p.machine != 0) {
    std::vector<std::uint64_t> mine = words;
    return m.await([&](std::vector<MPI_Request>& r) {
      r.resize(2);
      PMPI_Isend(mine.data(), n, MPI_UINT64_T, leader_of(0), kPlanTag, p.dup, &r[0]);
      PMPI_Irecv(words.data(), n, MPI_UINT64_T, leader_of(0), kPlanTag, p.dup, &r[1]);
    });
  }
  std::vector<std::uint64_t> theirs(static_cast<std::size_t>(machines - 1) * words.size());
  int rc = m.await([&](std::vector<MPI_Request>& r) {
    r.resize(static_cast<std::size_t>(machines - 1));
    for (int i = 1; i < machines; ++i)
      PMPI_Irecv(&theirs[static_cast<std::size_t>(i - 1) * words.size()], n, MPI_UINT64_T, leader_of(i), kPlanTag, p.dup, &r[static_cast<std::size_t>(i - 1)]);
  });
  for (std::size_t k = 0; k < theirs.size(); ++k) {
    std::uint64_t& w = words[k % words.size()];
    w = max ? std::max(w, theirs[k]) : (w & theirs[k]);
  }
  const int sent = m.await([&](std::vector<MPI_Request>& r) {
    r.resize(static_cast<std::size_t>(machines - 1));
    for (int i = 1; i < machines; ++i) PMPI_Isend(words.data(), n, MPI_UINT64_T, leader_of(i), kPlanTag, p.dup, &r[static_cast<std::size_t>(i - 1)]);
  });
  return rc != MPI_SUCCESS ? rc : sent;
}

// How this machine's ranks hand their blocks to the leader and back: single copy
// where the leader can reach every local rank's memory (aapc/mpi/copy.hpp), else through the
// MPI. The leader reads a probe word of every local rank and tells them all the outcome, so
// the machine's ranks agree. Single copy needs no other rank to run while the leader copies;
// the MPIs' large-message transports move only while both sides call in, which on a node
// with more processes than cores (MPICH's ranks spin in their waits) costs tens of ms.
// With single copy every rank keeps a mailbox for the leader (single_copy.hpp), whose address
// goes with the probe.
int choose_handover(PlanMaker& m, Plan& p) {
  static std::uint64_t probe = 0;
  probe = 0x6161706300000000ULL | static_cast<std::uint32_t>(::getpid());
  const char* how = std::getenv("AAPC_MPI_HANDOVER");
  const bool mpi_asked = how != nullptr && std::strcmp(how, "mpi") == 0;
  if (!mpi_asked) p.mailbox = std::make_unique<single_copy::Mailbox>();
  const std::uint64_t mine[4] = {static_cast<std::uint64_t>(::getpid()), reinterpret_cast<std::uint64_t>(&probe), mpi_asked ? 0 : probe,
                                 reinterpret_cast<std::uint64_t>(p.mailbox.get())};
  int told[2] = {1, static_cast<int>(::getpid())};  // single copy, and whose bell to ring
  int rc = MPI_SUCCESS;
  if (p.leader()) {
    std::vector<std::uint64_t> all(4 * static_cast<std::size_t>(p.local_size));
    std::copy(mine, mine + 4, all.begin());
    rc = m.await([&](std::vector<MPI_Request>& r) {
      for (int k = 1; k < p.local_size; ++k) {
        r.emplace_back();
        PMPI_Irecv(&all[4 * static_cast<std::size_t>(k)], 4, MPI_UINT64_T, p.peer(k), kPlanTag, p.dup, &r.back());
      }
    });
    for (int k = 0; k < p.local_size; ++k) {
      const std::uint64_t* w = &all[4 * static_cast<std::size_t>(k)];
      p.pids.push_back(static_cast<int>(w[0]));
      p.mailboxes.push_back(w[3]);
      if (w[2] == 0 || !can_reach(static_cast<int>(w[0]), w[1], w[2]).empty()) told[0] = 0;
    }
    const int sent = m.await([&](std::vector<MPI_Request>& r) {
      for (int k = 1; k < p.local_size; ++k) {
        r.emplace_back();
        PMPI_Isend(told, 2, MPI_INT, p.peer(k), kPlanTag, p.dup, &r.back());
      }
    });
    if (rc == MPI_SUCCESS) rc = sent;
  } else {
    rc = m.await([&](std::vector<MPI_Request>& r) {
      r.resize(2);
      PMPI_Isend(mine, 4, MPI_UINT64_T, p.peer(Plan::leader_rank), kPlanTag, p.dup, &r[0]);
      PMPI_Irecv(told, 2, MPI_INT, p.peer(Plan::leader_rank), kPlanTag, p.dup, &r[1]);
    });
  }
  p.single_copy = told[0] != 0;
  p.leader_pid = told[1];
  if (p.single_copy) bell::open();  // before anyone rings it
  if (!p.single_copy) {
    p.pids.clear();
    p.mailboxes.clear();
    p.mailbox.reset();
  }
  return rc;
}

// The leaders of the communicator's machines open the aapc group of its machines:
// its exchanges have ids of their own, so each communicator keeps its own order, and leaders of
// different communicators on one machine do not mix theirs up. The leaders agree on the group
// among themselves (leaders_reduce, Client::open_group); then every rank of the communicator
// learns the outcome, and whether every rank's hand-over messages (`handed`, the MPI's code)
// went well. Empty when the group opened on every machine and nothing failed anywhere.
std::string open_group(PlanMaker& m, Plan& p, int handed) {
  Process& pr = process();
  std::string why;
  if (p.leader()) {
    if (!pr.client) {
      auto c = aapc::Client::try_connect();
      if (c) pr.client.emplace(std::move(c.value()));
      else why = c.error().message();
    }
    std::vector<std::uint64_t> everywhere{why.empty() ? 1ULL : 0ULL};  // every leader calls open_group, or none
    if (const int rc = leaders_reduce(m, p, everywhere, false); rc != MPI_SUCCESS) why = "the leaders' messages failed: " + mpi_words(rc);
    if (everywhere[0] == 0 && why.empty()) why = "a machine's leader could not connect to its aapcd";
    if (everywhere[0] != 0 && why.empty()) {
      auto g = pr.client->open_group(p.members, [&](std::vector<std::uint64_t>& words, aapc::ReduceOp op) {
        if (leaders_reduce(m, p, words, op == aapc::ReduceOp::kMax) != MPI_SUCCESS) std::fill(words.begin(), words.end(), 0);  // no slot, no success
      });
      if (g) p.group.emplace(std::move(g.value()));
      else why = "opening its aapc group: " + g.error().message();
    }
  }
  // Every rank learns whether every leader has the group (the leaders agree among themselves),
  // and whether every machine hands over by single copy.
  if (handed != MPI_SUCCESS && why.empty()) why = "the plan's messages between a machine's ranks failed: " + mpi_words(handed);
  int ok[2] = {why.empty() ? 1 : 0, p.single_copy ? 1 : 0}, all[2] = {0, 0};
  const int rc = m.await([&](std::vector<MPI_Request>& r) {
    r.emplace_back();
    PMPI_Iallreduce(ok, all, 2, MPI_INT, MPI_MIN, p.dup, &r.back());
  });
  if (rc != MPI_SUCCESS) all[0] = 0, why = "the plan's allreduce failed: " + mpi_words(rc);
  p.single_copy_everywhere = all[1] != 0;
  if (all[0] != 0) return "";
  p.group.reset();
  return why.empty() ? "a machine's leader could not open the communicator's aapc group, or another rank's plan messages failed" : why;
}

// The body of a plan's fiber (PlanMaker): the steps that a blocking plan would take with
// collectives, each as nonblocking messages on the plan's duplicate of `comm`, which the first
// step makes (MPI_Comm_idup is the one collective on `comm` itself, started in the call that
// started the plan, so in the program's order of collectives on it).
void make(PlanMaker& m, Plan& p, MPI_Comm comm, int size) {
  m.on_comm = true;
  int rc = m.await([&](std::vector<MPI_Request>& r) {
    r.emplace_back();
    PMPI_Comm_idup(comm, &p.dup, &r.back());
  });
  m.on_comm = false;
  if (rc != MPI_SUCCESS) {  // no duplicate: the same on every rank, or the MPI is broken
    p.dup = MPI_COMM_NULL;
    p.why = "MPI_Comm_idup failed: " + mpi_words(rc);
    return;
  }
  PMPI_Comm_set_errhandler(p.dup, MPI_ERRORS_RETURN);  // a hand-over's failure is the call's (op.cpp, all_done)
  int cluster = 0;
  int mine[2] = {my_machine(cluster), 0};
  mine[1] = cluster;
  std::vector<int> report(2 * static_cast<std::size_t>(size));
  rc = m.await([&](std::vector<MPI_Request>& r) {
    r.emplace_back();
    PMPI_Iallgather(mine, 2, MPI_INT, report.data(), 2, MPI_INT, p.dup, &r.back());
  });
  if (rc != MPI_SUCCESS) {
    p.why = "the plan's allgather failed: " + mpi_words(rc);
    return;
  }
  // The communicator's machines, numbered by their cluster ranks: the group's ranks.
  std::set<int> machines;
  for (int r = 0; r < size; ++r) machines.insert(report[2 * static_cast<std::size_t>(r)]);
  p.why = verdict(report, machines);
  if (!p.why.empty()) return;
  p.members.assign(machines.begin(), machines.end());
  auto index = [&](int cluster_rank) { return static_cast<int>(std::lower_bound(p.members.begin(), p.members.end(), cluster_rank) - p.members.begin()); };
  std::vector<int> machine_of(static_cast<std::size_t>(size));
  for (int r = 0; r < size; ++r) machine_of[static_cast<std::size_t>(r)] = index(report[2 * static_cast<std::size_t>(r)]);
  p.place = Placement::from(machine_of, static_cast<int>(p.members.size()));
  p.fewest = p.most = p.place.ranks_on.front().size();
  for (const auto& on : p.place.ranks_on) p.fewest = std::min(p.fewest, on.size()), p.most = std::max(p.most, on.size());
  p.machine = index(mine[0]);
  const auto& here = p.place.ranks_on[static_cast<std::size_t>(p.machine)];
  p.local_size = static_cast<int>(here.size());
  p.local_rank = static_cast<int>(std::find(here.begin(), here.end(), p.rank) - here.begin());
  p.why = open_group(m, p, choose_handover(m, p));
  p.aapc = p.why.empty();
}

// Starts the plan of `comm` (its first all-to-all calls this, with the process's mutex held).
// An intercommunicator and a communicator of one rank are decided at once, alike on every rank.
Plan* start_plan(MPI_Comm comm) {
  auto* p = new Plan;
  int inter = 0, size = 0;
  PMPI_Comm_test_inter(comm, &inter);
  PMPI_Comm_rank(comm, &p->rank);
  PMPI_Comm_size(comm, &size);
  p->name = name_of(comm);
  if (inter != 0 || size < 2) {
    p->why = inter != 0 ? "it is an intercommunicator" : "a communicator of one rank";
    say(*p, size);
    return p;
  }
  p->making = new PlanMaker([p, comm, size] {
    make(*p->making, *p, comm, size);
    say(*p, size);
  });
  process().making.push_back(p);
  progress();  // the duplicate is started here, in the program's call
  return p;
}

}  // namespace

Process& process() {
  static Process* pr = new Process;  // never destroyed: MPI may call in after exit handlers
  return *pr;
}

Plan& plan_of(MPI_Comm comm) {
  Process& pr = process();
  std::lock_guard<std::recursive_mutex> hold(pr.mutex);
  if (pr.keyval == MPI_KEYVAL_INVALID) PMPI_Comm_create_keyval(MPI_COMM_NULL_COPY_FN, delete_plan, &pr.keyval, nullptr);
  void* attr = nullptr;
  int found = 0;
  PMPI_Comm_get_attr(comm, pr.keyval, &attr, &found);
  if (found != 0) return *static_cast<Plan*>(attr);
  Plan* p = start_plan(comm);
  PMPI_Comm_set_attr(comm, pr.keyval, p);
  return *p;
}

bool advance_plans() {
  Process& pr = process();
  std::lock_guard<std::recursive_mutex> hold(pr.mutex);
  bool moved = false;
  for (std::size_t i = 0; i < pr.making.size();) {
    Plan* p = pr.making[i];
    bool made = false;
    try {
      made = p->making->step();
    } catch (const std::exception& e) {  // the body let it out: a plan that no call can use
      p->why = std::string("making the plan failed: ") + e.what();
      p->aapc = false;
      made = true;
    }
    if (!made) {
      ++i;
      continue;
    }
    moved = true;
    delete std::exchange(p->making, nullptr);
    pr.making.erase(pr.making.begin() + static_cast<std::ptrdiff_t>(i));
    if (p->doomed && p->ops == 0) destroy(p);
  }
  return moved;
}

void settle_duplicate(MPI_Comm comm) {
#ifdef OPEN_MPI
  Process& pr = process();
  std::lock_guard<std::recursive_mutex> hold(pr.mutex);
  if (pr.making.empty() || pr.keyval == MPI_KEYVAL_INVALID || comm == MPI_COMM_NULL) return;
  void* attr = nullptr;
  int found = 0;
  PMPI_Comm_get_attr(comm, pr.keyval, &attr, &found);
  if (found != 0 && static_cast<Plan*>(attr)->making != nullptr) static_cast<Plan*>(attr)->making->finish_duplicate();
#else
  (void)comm;
#endif
}

void on_init() {
  Plan& world = plan_of(MPI_COMM_WORLD);
  while (!world.ready()) progress();
  hook_progress();
}

void op_over(Plan& p) {
  if (--p.ops == 0 && p.doomed && p.ready()) destroy(&p);
}

std::uint64_t min_block() {
  static const std::uint64_t least = [] {
    const char* v = std::getenv("AAPC_MPI_MIN_BLOCK");
    return v != nullptr && *v != '\0' ? std::strtoull(v, nullptr, 10) : 8192ULL;
  }();
  return least;
}

void announce_small(Plan& p) {
  if (p.handed || !p.aapc) return;
  p.handed = true;
  if (env_on("AAPC_MPI_VERBOSE") && p.rank == 0)
    std::fprintf(stderr, "aapc-mpi: %s: its first all-to-all under AAPC_MPI_MIN_BLOCK (%llu bytes) ran the MPI's own\n", p.name.c_str(),
                 static_cast<unsigned long long>(min_block()));
}

void announce_first(const Plan& p) {
  if (env_on("AAPC_MPI_VERBOSE") && p.rank == 0)
    std::fprintf(stderr, "aapc-mpi: %s: its first all-to-all was carried by aapc (%d machines)\n", p.name.c_str(), p.place.machines());
}

std::string mpi_words(int rc) {
  char text[MPI_MAX_ERROR_STRING] = "";
  int len = 0;
  PMPI_Error_string(rc, text, &len);
  return text;
}

bool test_all(std::vector<MPI_Request>& reqs, std::vector<MPI_Status>& statuses, int& failed) {
  failed = MPI_SUCCESS;
  if (reqs.empty()) return true;
  int done = 0;
  statuses.resize(reqs.size());
  if (const int rc = PMPI_Testall(static_cast<int>(reqs.size()), reqs.data(), &done, statuses.data()); rc != MPI_SUCCESS) {
    failed = rc;
    for (const MPI_Status& st : statuses)
      if (st.MPI_ERROR != MPI_SUCCESS) {
        failed = st.MPI_ERROR;
        break;
      }
    done = 1;  // MPI_ERR_IN_STATUS: every request is complete
  }
  if (done == 0) return false;
  reqs.clear();
  return true;
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

// libaapc-mpi's per-communicator plan and per-process state (compiled once per MPI: Open
// MPI's and MPICH's mpi.h differ in their ABI). Not installed.
#pragma once

#include <mpi.h>

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "aapc/client.hpp"
#include "aapc/mpi/layout.hpp"

namespace aapc::mpi {

// What one communicator does with its all-to-alls: decided once, by messages among its ranks,
// with the same outcome on every rank (a rank that falls back alone while the others go
// through aapc would deadlock: Open MPI PR #13656). Cached on the communicator as an attribute
// and freed with it.
//
// A plan is made without blocking (plan.cpp): its communicator's first all-to-all starts it
// (MPI_Comm_idup, in the call) and returns, MPI_Ialltoall included, and the rest moves
// wherever the ops move (progress()), in a fiber of its own. Calls made before it is ready
// wait for it as ops (Op::Stage::kPlan) and start, in call order, once it is.
struct Op;
struct PlanMaker;
namespace single_copy {
struct Mailbox;
}

struct Plan {
  PlanMaker* making = nullptr;  // while it is being made (plan.cpp)
  bool ready() const { return making == nullptr; }  // made: what follows is known on this rank
  bool aapc = false;
  std::string why;  // the reason for the decision, for AAPC_MPI_VERBOSE
  std::string name;  // the communicator's, when its plan was started (AAPC_MPI_VERBOSE)
  // The library's own duplicate of the communicator (errors return): the plan's messages,
  // the hand-overs between a machine's ranks, and the MPI's own all-to-all where aapc does
  // not carry a call (there, whatever the timing, because calls that waited for the plan run
  // it late). Null where the plan needed no messages (an intercommunicator, one rank).
  MPI_Comm dup = MPI_COMM_NULL;
  MPI_Comm own(MPI_Comm comm) const { return dup != MPI_COMM_NULL ? dup : comm; }
  int waiting = 0;  // calls that wait for the plan, the calls before them, or an agreement (Op::Stage::kPlan, kAgree)
  // The communicator's machines are numbered 0..M-1 by their cluster ranks, `members`.
  Placement place;
  std::vector<int> members;  // cluster rank of each of the communicator's machines, increasing
  std::size_t fewest = 0, most = 0;  // ranks on a machine, at least and at most
  int rank = 0;      // this process's, in the communicator
  int machine = -1;  // this rank's, in 0..M-1
  // This machine's ranks are its local ranks 0..local_size-1, in the order of their comm ranks.
  int local_rank = 0;
  int local_size = 1;
  // Local rank k's rank in the communicator (and in `dup`).
  int peer(int k) const { return place.ranks_on[static_cast<std::size_t>(machine)][static_cast<std::size_t>(k)]; }
  // The process that leads the machine for this communicator, its first local rank. It alone
  // starts the communicator's exchanges on the machine, in the aapc group of its machines
  // (`group`), whose exchanges are numbered apart from every other's.
  static constexpr int leader_rank = 0;
  bool leader() const { return local_rank == leader_rank; }
  std::optional<aapc::Client> group;  // the leader's
  // Hand-overs between this machine's ranks: single copy, by the leader alone
  // (aapc/mpi/copy.hpp), or through the MPI's own transport where the kernel refuses that or
  // AAPC_MPI_HANDOVER=mpi. The same on every rank of the machine.
  bool single_copy = false;
  bool single_copy_everywhere = false;  // ... on every machine of the communicator (for AAPC_MPI_VERBOSE)
  std::vector<int> pids;  // the leader's: every local rank's process, by local rank
  int leader_pid = 0;     // with single copy: the leader's process, whose bell a rank rings (aapc/mpi/bell.hpp)
  std::unique_ptr<single_copy::Mailbox> mailbox;  // this rank's, with single copy
  std::vector<std::uint64_t> mailboxes;  // the leader's: where every local rank's is, by local rank
  // The leader's ops that have yet to start their machine-level exchange, in call order: the
  // daemons pair a group's exchanges by the order in which they start.
  std::deque<Op*> to_start;
  bool carried = false;  // an all-to-all of it went through aapc
  bool handed = false;   // ... one went to the MPI's own by AAPC_MPI_MIN_BLOCK
  std::uint32_t calls = 0;  // all-to-alls carried so far: the same count on every rank
  int ops = 0;              // its calls in flight (Op): the plan outlives its communicator until 0
  bool doomed = false;      // its communicator was freed
};

// One per process.
struct Process {
  std::recursive_mutex mutex;  // guards what follows and every Op
  std::condition_variable_any wake;  // the progress thread waits on it for work (wake_mover())
  bool mover_started = false;
  std::optional<aapc::Client> client;  // kept by processes that lead a machine in some plan: their groups' connection
  std::optional<aapc::ClusterInfo> info;
  std::vector<aapc::Buffer> spare;  // staging buffers of finished calls, for the next ones
  std::vector<Op*> in_flight;       // every op not yet done (owned by its call or request)
  std::vector<Plan*> making;        // plans being made, in the order they were started
  int keyval = MPI_KEYVAL_INVALID;
  int error_class = -1;
  int error_code = -1;
};

Process& process();

// The plan of `comm`, started on first use (collective: every rank of comm calls it at the same
// collective, which all-to-all guarantees); it may not be ready yet.
Plan& plan_of(MPI_Comm comm);

// Takes every plan being made one step further where it can (progress(), with the process's
// mutex held). True when any moved.
bool advance_plans();

// Before the program's other collectives on `comm` that may clash with its plan's duplication
// (a nonblocking collective, a communicator made from it): with Open MPI, waits for the
// duplication if it is in flight (plan.cpp, PlanMaker::finish_duplicate). Nothing with MPICH.
void settle_duplicate(MPI_Comm comm);

// An op of `p` is over: frees a doomed plan with its last op.
void op_over(Plan& p);

// At MPI_Init: the world's plan.
void on_init();

// AAPC_MPI_MIN_BLOCK: an MPI_Alltoall with smaller machine-level blocks runs the MPI's own.
std::uint64_t min_block();

// With AAPC_MPI_VERBOSE, rank 0 of the plan's communicator says that aapc carried its first
// all-to-all.
void announce_first(const Plan& p);
// ... and, once, that one of its all-to-alls was too small for aapc (AAPC_MPI_MIN_BLOCK).
void announce_small(Plan& p);

// The MPI's words for its error code `rc`.
std::string mpi_words(int rc);

// PMPI_Testall of `reqs`, their statuses into `statuses`: true once all are complete, a failed
// one counting as complete (MPI_ERR_IN_STATUS); `failed` is then the first failure's code,
// else MPI_SUCCESS. Clears `reqs` once all are complete.
bool test_all(std::vector<MPI_Request>& reqs, std::vector<MPI_Status>& statuses, int& failed);

// Turns an aapc failure into an MPI error code whose MPI_Error_string is `message`, and
// hands it to the communicator's error handler.
int raise(MPI_Comm comm, const std::string& message);

// The ranks at the other end of `comm`'s all-to-alls: its size, an intercommunicator's remote
// group's.
int peers_of(MPI_Comm comm);

// An all-to-all's arguments, judged on the calling rank before anything is planned or sent
// (arguments.cpp): each peer's counts and datatypes are added, then verdict() says whether the
// call goes on. Arguments that MPI calls erroneous and both MPIs check on the calling rank
// (a null communicator, a negative count, a null datatype that moves data, MPI_IN_PLACE as the
// receive buffer) go to the MPI's own, which reports them as it always does.
class Arguments {
 public:
  Arguments(MPI_Comm comm, const void* sbuf, const void* rbuf);
  // One side's blocks: every peer's alike (MPI_Alltoall's), or a count and a displacement for
  // each peer with one datatype for all (displacements in its extents) or one each
  // (`types`, displacements in bytes). The send side is skipped in place: its arguments may be
  // anything then.
  void add(bool send, int count, MPI_Datatype type);
  void add(bool send, const int* counts, const int* displs, MPI_Datatype type);
  void add(bool send, const int* counts, const int* displs, const MPI_Datatype* types);
  // Nothing where the call goes on; else what it returns: `mpis_own()` for the arguments above,
  // MPI_ERR_BUFFER (through the communicator's error handler) where a peer's send and receive
  // blocks have bytes and start at one address.
  std::optional<int> verdict(const char* call, const std::function<int()>& mpis_own) const;

 private:
  struct Block {
    std::uint64_t bytes = 0;
    std::int64_t at = 0;  // from the buffer, in bytes
  };
  struct Shape {
    std::uint64_t size = 0;
    MPI_Aint lb = 0, extent = 0;
  };
  static Shape shape(MPI_Datatype type);
  // `count` of `type` (of shape `of`) from `at` bytes into the buffer, where its first byte lies.
  Block block(int count, MPI_Datatype type, const Shape& of, std::int64_t at);
  void blocks(bool send, const int* counts, const int* displs, MPI_Datatype type, const MPI_Datatype* types);
  MPI_Comm comm_;
  const void* sbuf_;
  const void* rbuf_;
  bool for_the_mpi_;
  std::vector<Block> sends_, recvs_;  // by peer; MPI_Alltoall's: peer 0's, at 0
};

// MPI_Alltoall and MPI_Alltoallv: through aapc where the plan says so, else PMPI_*. With a
// `request`, MPI_Ialltoall and MPI_Ialltoallv.
int alltoall(const void* sbuf, int scount, MPI_Datatype stype, void* rbuf, int rcount, MPI_Datatype rtype, MPI_Comm comm,
             MPI_Request* request = nullptr);
// What an alltoallv of packed bytes stands for (MPI_Alltoallw, alltoallw.cpp): the MPI's own
// call in its place where aapc does not carry it (on a communicator; blocking without a
// request), and what follows once aapc carried it (the blocks unpacked, on the call's
// communicator).
struct StandsFor {
  std::function<int(MPI_Comm, MPI_Request*)> mpi;
  std::function<void(MPI_Comm)> after;
};
// `agreed`: a persistent alltoallv's size, agreed by its ranks at its first start and kept
// for the others (its counts do not change).
int alltoallv(const void* sbuf, const int* scounts, const int* sdispls, MPI_Datatype stype, void* rbuf, const int* rcounts, const int* rdispls,
              MPI_Datatype rtype, MPI_Comm comm, MPI_Request* request = nullptr,
              const std::shared_ptr<std::optional<std::uint64_t>>& agreed = nullptr, const StandsFor* stands_for = nullptr);

// MPI_Alltoallw, and with a `request` MPI_Ialltoallw: packed, carried as an alltoallv of bytes,
// unpacked (alltoallw.cpp).
int alltoallw(const void* sbuf, const int* scounts, const int* sdispls, const MPI_Datatype* stypes, void* rbuf, const int* rcounts,
              const int* rdispls, const MPI_Datatype* rtypes, MPI_Comm comm, MPI_Request* request = nullptr);

}  // namespace aapc::mpi

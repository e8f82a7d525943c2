// One all-to-all of libaapc-mpi in flight (op.cpp): the steps of a blocking call and of
// an MPI_Ialltoall(v) alike, as a state machine that every MPI_Wait/MPI_Test of the process
// drives (requests.cpp). Not installed.
#pragma once

#include <mpi.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "aapc/mpi/nap.hpp"
#include "plan.hpp"

namespace aapc::mpi {

// Counts and displacements of one side of a call, in elements of its datatype, by comm rank.
struct Side {
  void* buf = nullptr;
  std::vector<std::int64_t> counts, displs;
  MPI_Datatype type = MPI_BYTE;
};

// One rank's blocks: base + (offset, length) in bytes, by peer comm rank.
struct Blocks {
  std::uint8_t* base = nullptr;
  std::vector<Piece> by_rank;
};

// `pieces` of a buffer as one MPI datatype of bytes, in order (1 GiB chunks).
class ByteType {
 public:
  explicit ByteType(const std::vector<Piece>& pieces);
  ~ByteType();
  ByteType(const ByteType&) = delete;
  ByteType& operator=(const ByteType&) = delete;
  MPI_Datatype type() const { return count_ != 0 ? type_ : MPI_BYTE; }
  int count() const { return count_; }

 private:
  MPI_Datatype type_ = MPI_BYTE;
  int count_ = 0;
};

// A call's duplicates of the program's derived datatypes, freed with it. The program may free
// its own as soon as a nonblocking or persistent call returns (MPI 4.0, 5.1.5: a pending call
// keeps what it uses), and the library uses them until the call is over (packing once the
// plan is made, unpacking at the end).
class HeldTypes {
 public:
  HeldTypes() = default;
  HeldTypes(const HeldTypes&) = delete;
  HeldTypes& operator=(const HeldTypes&) = delete;
  ~HeldTypes();
  // `t` as the call keeps it: a derived one duplicated, a named one as it is.
  MPI_Datatype hold(MPI_Datatype t);

 private:
  std::vector<MPI_Datatype> dups_;
};

// An MPI_Alltoallw's arrays kept past the call (alltoallw.cpp): copies, with `hold` its
// derived datatypes duplicated. In place, the send side's are not kept (they may be anything).
struct AlltoallwArgs {
  std::vector<int> scounts, sdispls, rcounts, rdispls;
  std::vector<MPI_Datatype> stypes, rtypes;
  HeldTypes held;
  AlltoallwArgs(int n, bool in_place, const int* sc, const int* sd, const MPI_Datatype* st, const int* rc, const int* rd,
                const MPI_Datatype* rt, bool hold);
};

struct Op {
  enum class Stage {
    kPlan,       // waits for its plan to be made; then `later` starts it as the plan says
    kAgree,      // an alltoallv's ranks agree on its size (reqs[0], calls.cpp); then `later` starts it
    kMpi,        // the MPI's own all-to-all on the plan's duplicate communicator (reqs[0])
    kCounts,     // leader: the local ranks' descriptions of their blocks are coming (describe())
    kGather,     // leader: the local ranks' blocks are coming into staging
    kQueued,     // leader: waits for its turn to start the machine-level exchange
    kExchange,   // leader: the daemons exchange
    kTelling,    // leader: the local ranks are told of a failure
    kPost,       // member, single copy: waits for its slot in its mailbox (a call kSlots back is in flight)
    kHandOver,   // member: its blocks (and counts) go to the leader
    kStatus,     // member: waits for the outcome
    kErrorText,  // member: the leader's words on a failure are coming
    kScatter,    // both: the blocks come back from staging
    kFinishing,  // both, single copy: the blocks are in place; what is left calls the MPI
    kDone,
  };
  MPI_Comm comm = MPI_COMM_NULL;
  Plan* plan = nullptr;
  std::function<void(Op&)> later;  // Stage::kPlan's and Stage::kAgree's
  std::uint64_t agree_mine = 0, agree_all = 0;  // Stage::kAgree's: this rank's figure, and the most of all ranks'
  bool alltoall = false;
  std::uint32_t call = 0;  // the plan's count of carried calls: tags this call's messages
  Side recv;
  std::vector<std::uint8_t> send_packed, recv_packed;
  Blocks sb, rb;
  std::vector<std::uint64_t> counts;      // this rank's description of its blocks (op.cpp, describe())
  std::vector<std::uint64_t> all_counts;  // ... the leader's of every local rank
  Stage stage = Stage::kDone;
  std::vector<MPI_Request> reqs;
  std::vector<MPI_Status> statuses;  // all_done()'s, kept: it is polled while the hand-overs spin
  std::vector<std::unique_ptr<ByteType>> types;
  std::unique_ptr<LeaderLayout> layout;
  aapc::Buffer stage_send, stage_recv;  // the leader's staging
  std::vector<std::uint8_t> sink;        // gathered into when there is no staging
  std::optional<aapc::Request> exchange;
  bool counted = false;  // the exchange is an alltoallv: the daemons agree on its counts first (op.cpp, agreeing)
  int length = 0;  // of `error`, as told to the members
  std::string error;
  std::vector<char> described;  // single copy, the leader's: whose description it has read, by local rank
  double t0 = 0, t1 = 0, t2 = 0;  // AAPC_MPI_TIMING, seconds (seconds_now())
  MPI_Request user = MPI_REQUEST_NULL;  // MPI_Ialltoall(v)'s generalized request
  // Set once the MPI freed `user` (requests.cpp, free_op): the handle may name another request
  // from then on, and the op is deleted by the next thread that holds the process's lock.
  std::atomic<bool> freed{false};
  // A nonblocking call's, once returned to the program: nobody drives it but the completion
  // calls and, on a single-copy leader, the progress thread (mover()).
  bool detached = false;
  HeldTypes held;  // a nonblocking call's duplicates of its derived datatypes
  // What follows once aapc carried it, on its communicator: an MPI_Alltoallw's blocks unpacked
  // (StandsFor::after).
  std::function<void(MPI_Comm)> after;

  Op() = default;
  Op(const Op&) = delete;
  Op& operator=(const Op&) = delete;
  ~Op() = default;

  bool done() const { return stage == Stage::kDone; }
  // Whether its waiters may nap rather than spin: while only the daemons move it, or when its
  // hand-overs are single copies (the MPI then carries a few words at a time, which arrive
  // whether or not their receiver is in a call; spinning for large messages is what the
  // MPI's own hand-overs need).
  // The plan's messages and the MPI's own all-to-all move only inside MPI calls: spun for.
  bool may_nap() const {
    if (stage == Stage::kPlan || stage == Stage::kAgree || stage == Stage::kMpi) return false;
    return plan->single_copy || stage == Stage::kExchange || stage == Stage::kStatus;
  }
  // Whether its next step is an MPI call that only the process's calls into the library make:
  // it waits for its plan or its agreement, a member's post of its description, or any step
  // of hand-overs through the MPI. Not the MPI's own all-to-all (kMpi), which the MPI moves,
  // nor a single-copy op's other steps, which the progress thread and the daemons move.
  bool waits_for_calls() const {
    if (stage == Stage::kDone || stage == Stage::kMpi) return false;
    return stage == Stage::kPlan || stage == Stage::kAgree || stage == Stage::kPost || !plan->single_copy;
  }
  // Whether the progress thread may take it a step on: a detached single-copy op of a leader,
  // in a stage that needs no MPI call (single_copy.hpp).
  bool for_mover() const {
    return detached && plan->single_copy && plan->leader() && (stage == Stage::kCounts || stage == Stage::kQueued || stage == Stage::kExchange);
  }
};

// --- op.cpp: the op's steps

// Takes `op` one stage further, if it can. True when it moved.
bool advance_op(Op& op);
// Whether the daemons' exchange of `op` is over: asked once, or waited for up to `bound`.
bool exchange_over(Op& op, std::chrono::microseconds bound = std::chrono::microseconds(0));
// Counts an op in: in flight on its plan and in the process.
void enlist(Op& op);
// Makes `op` (enlisted, its plan ready and carrying it) move `send` -> `recv` through aapc:
// packs, and posts the first step.
void start_op(Op& op, Side send, Side recv);
// The op's failure, where the MPI's own all-to-all (Stage::kMpi) failed with `rc`.
void mpis_own_failed(Op& op, int rc);
// An MPI_Alltoall whose machine-level blocks are smaller than AAPC_MPI_MIN_BLOCK bytes runs
// the MPI's own (op.cpp says why).
bool too_small(const Plan& p, std::uint64_t rank_block);
// ... and an MPI_Alltoallv whose ranks send at most `most_to_a_machine` bytes to one machine.
bool too_small_v(const Plan& p, std::uint64_t most_to_a_machine);

// --- datatypes.cpp

// `side`'s blocks in bytes: in place for a contiguous datatype, else in `packed` (filled from
// the user's buffer if `pack`).
Blocks blocks_of(const Side& side, int n, MPI_Comm comm, std::vector<std::uint8_t>& packed, bool pack);
// The received blocks `b` unpacked into `side`'s buffer.
void unpack(const Side& side, MPI_Comm comm, const Blocks& b);
// MPI_Pack from, and MPI_Unpack into, `count` `type`s at the program's `user`, which may be
// MPI_BOTTOM (MPICH 4.0's own calls refuse that).
int pack_from(const void* user, int count, MPI_Datatype type, void* packed, int size, int* position, MPI_Comm comm);
int unpack_into(const void* packed, int size, int* position, void* user, int count, MPI_Datatype type, MPI_Comm comm);

// --- progress.cpp

// Seconds on a steady clock: the times of AAPC_MPI_TIMING, taken where no MPI may be called.
double seconds_now();

// Takes every op of the process that is not done one step further where it can. True when
// any moved. Holds the process's mutex. With `mover`, on the progress thread: only the ops
// for_mover() admits, never into a step that calls the MPI.
bool progress(bool mover = false);

// The progress thread of a process that leads a machine in a single-copy plan: a
// nonblocking all-to-all moves on while the program computes or waits in another MPI call
// (MPICH has no progress hook, and neither MPI runs one while the program computes). It
// calls no MPI function. Started with the first detached op that may use it; woken by each.
void wake_mover();

// The pause between two looks at the ops in flight. The MPIs poll in their waits, and a
// machine's ranks polling while its daemon moves the exchange take the cores the daemon
// needs: while only the daemons or the leader move the data, naps (NapPace: from 10 us, and
// as long waits go on, up to 1/32 of the wait so far, at most AAPC_MPI_LONGEST_NAP_US, 10 ms),
// which end early when the process's bell rings (aapc/mpi/bell.hpp: with single copy, a rank
// rings its leader's when it has described its call, the leader a rank's when the call is
// over there). None after a step moved something, or while an op hands over through the MPI
// (large messages move only while both sides call in).
class Idle {
 public:
  void rest(bool moved);
  // Pauses whatever the ops are (the progress thread's pace, mover()).
  void nap(bool moved);

 private:
  NapPace pace_{NapPace::Rule{.longest = longest_nap()}};
  static std::chrono::microseconds longest_nap();
};

// Moves the process's ops (progress()) until `over()` holds (asked with the process's mutex
// held), pausing as Idle does, or in one bounded `wait` where that returns true; from 2 ms on,
// between two passes, it also probes `comm`, so that the MPI moves the program's own requests
// (MPI's progress rule).
void drive_until(MPI_Comm comm, const std::function<bool()>& over, const std::function<bool()>& wait = nullptr);

// Drives `op` to done (and every other op with it), pausing as Idle does. The op's error, or
// empty.
std::string drive(Op& op);

// Where `op` is the process's only op in flight and only its daemons move it (step 2), and no
// other thread may call the MPI: waits for the daemon's word on its exchange for a moment (a
// bounded wait, then the caller moves the MPI again) and returns true. Else false at once.
bool await_exchange(Op& op);

// Whether the process has any op in flight.
bool any_in_flight();

// At MPI_Init (requests.cpp): with Open MPI, its progress loop drives the ops too.
void hook_progress();

// A call's end (requests.cpp): a blocking one is driven to done and its failure raised; a
// nonblocking one becomes `*request`, a generalized request that progress() completes.
int carry(std::unique_ptr<Op> op, MPI_Request* request);

}  // namespace aapc::mpi

// The cluster suite's MPI part: unmodified MPI programs (tests/mpi/mpi_check.c
// built with each MPI's compiler, and an mpi4py script) run by `aapc-emu mpirun` on an
// emulated cluster of 4 machines on 2 switches, with 1, 2 and an uneven number of ranks per
// machine, with and without libaapc-mpi.so; every value is checked by the programs. Needs
// root; skipped (exit 77) otherwise.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <fstream>
#include <iostream>
#include <string>

#include "common/mpilaunch.hpp"
#include "common/procutil.hpp"

namespace fs = std::filesystem;

namespace {

const std::string kEmu = std::string(AAPC_TOOLS_DIR) + "/aapc-emu";
const fs::path kDir = fs::temp_directory_path() / ("aapc-mpi-tests-" + std::to_string(::getpid()));

using Sh = aapc::tools::Output;  // status, and stdout with stderr as text

Sh sh(const std::string& cmd) { return aapc::tools::run_shell(cmd); }

// 4 machines, 2 per switch: the inter-switch link is shared, so schedules matter.
fs::path topology() {
  fs::create_directories(kDir);
  const fs::path t = kDir / "mpi-4.dot";
  std::ofstream(t) << "graph \"mpi-4\" {\n  edge [rate=\"100Mbit\"];\n"
                      "  m0 [mac=\"02:00:00:00:10:01\"]; m1 [mac=\"02:00:00:00:10:02\"];\n"
                      "  m2 [mac=\"02:00:00:00:10:03\"]; m3 [mac=\"02:00:00:00:10:04\"];\n"
                      "  s0 [buffer=\"64K\"]; s1 [buffer=\"64K\"];\n"
                      "  s0 -- m0; s0 -- m1; s1 -- m2; s1 -- m3; s0 -- s1;\n}\n";
  return t;
}

// aapc-emu mpirun on the cluster that is up. Every all-to-all goes through aapc, however
// small (AAPC_MPI_MIN_BLOCK=0), unless `args` sets AAPC_MPI_MIN_BLOCK itself.
// `outer_env`: NAME=VALUE ... in aapc-emu's own environment (the box's, not the ranks').
Sh mpirun(const std::string& args, const std::string& program, const std::string& outer_env = "") {
  const std::string every = args.find("AAPC_MPI_MIN_BLOCK=") == std::string::npos ? " --env AAPC_MPI_MIN_BLOCK=0" : "";
  return sh((outer_env.empty() ? "" : "env " + outer_env + " ") + kEmu + " mpirun " + aapc::tools::shell_quote(topology().string()) + " --timeout 240" + every + " " + args + " -- " +
            program);
}

std::string check_program(const std::string& mpi) { return std::string(AAPC_TESTS_DIR) + "/mpi-check-" + mpi; }

// How many times `line` is in `text`.
std::size_t occurrences(const std::string& text, const std::string& line) {
  std::size_t n = 0;
  for (std::size_t at = 0; (at = text.find(line, at)) != std::string::npos; at += line.size()) ++n;
  return n;
}

bool have(const std::string& mpi) { return fs::exists(check_program(mpi)) && !aapc::tools::MpiCluster::launcher(mpi).empty(); }

// mpi_check.c's figure: how long the other ranks waited for an MPI_Ialltoall while rank 0
// computed for 2000 ms without calling MPI; -1 when it is not in `text`.
double waited_ms(const std::string& text) {
  const std::string mark = "the others waited at most ";
  const auto at = text.find(mark);
  return at == std::string::npos ? -1 : std::stod(text.substr(at + mark.size()));
}

const char* kThroughAapc = "MPI_COMM_WORLD";
// What AAPC_MPI_VERBOSE prints once aapc has carried one of MPI_COMM_WORLD's all-to-alls.
const char* kCarried = "MPI_COMM_WORLD: its first all-to-all was carried by aapc";
// ... and one of mpi_check.c's communicator that has nothing but MPI_Ialltoall calls.
const char* kCarriedNonblocking = "ialltoall-b: its first all-to-all was carried by aapc";

}  // namespace

TEST_CASE("an unmodified C MPI program is right with the library, ppn 1, 2 and uneven (Open MPI)", "[mpi]") {
  REQUIRE(have("openmpi"));  // tools/setup installs it
  // The hand-overs between a machine's ranks: single copy by default, through the MPI on request.
  for (const auto& [ppn, handover] : {std::pair{"1", ""}, {"2", ""}, {"2,1,3,1", ""}, {"2,1,3,1", "mpi"}}) {
    INFO("--ppn " << ppn << (*handover != '\0' ? " AAPC_MPI_HANDOVER=mpi" : ""));
    const std::string env = *handover != '\0' ? " --env AAPC_MPI_HANDOVER=" + std::string(handover) : "";
    Sh r = mpirun("--ppn " + std::string(ppn) + " --env AAPC_MPI_VERBOSE=1" + env, check_program("openmpi") + " 4096");
    INFO(r.text);
    CHECK(r.status == 0);
    CHECK(r.text.find("all cases ok") != std::string::npos);
    CHECK(r.text.find(std::string(kThroughAapc) + " (") != std::string::npos);
    // mpirun() sets AAPC_MPI_MIN_BLOCK=0: no size rule, and no alltoallv agrees on its size.
    CHECK(r.text.find("all-to-all through aapc (every all-to-all, however small)") != std::string::npos);
    CHECK(r.text.find(*handover != '\0' ? "hand-overs between a machine's ranks: through the MPI" : "hand-overs between a machine's ranks: single copy") !=
          std::string::npos);
    // With single copy the leaders' progress threads move an MPI_Ialltoall while rank 0
    // computes; through the MPI it moves only when rank 0 calls in again.
    if (*handover != '\0') CHECK(waited_ms(r.text) >= 1900);
    else CHECK((waited_ms(r.text) >= 0 && waited_ms(r.text) < 1000));
    CHECK(r.text.find(kCarried) != std::string::npos);
    CHECK(r.text.find(kCarriedNonblocking) != std::string::npos);
    // Communicators over part of the machines (each half), and one whose ranks do
    // not include the world's first rank on a machine (the odd ranks), each in an aapc group.
    for (const char* part : {"half-low", "half-high", "parity-odd"}) CHECK(r.text.find(std::string(part) + ": its first all-to-all was carried by aapc") != std::string::npos);
  }
}

TEST_CASE("the same program with MPICH, ppn 2 and uneven", "[mpi]") {
  REQUIRE(have("mpich"));
  for (const char* ppn : {"2", "2,1,3,1"}) {
    INFO("--ppn " << ppn);
    Sh r = mpirun("--mpi mpich --ppn " + std::string(ppn) + " --env AAPC_MPI_VERBOSE=1", check_program("mpich") + " 4096");
    INFO(r.text);
    // The job ends by itself: MPI_Finalize no longer hangs (libaapc-mpich-yield.so, below).
    CHECK(r.status == 0);
    CHECK(r.text.find(" ranks, all cases ok") != std::string::npos);
    CHECK(r.text.find(kCarried) != std::string::npos);
    CHECK(r.text.find(kCarriedNonblocking) != std::string::npos);
    CHECK(r.text.find("hand-overs between a machine's ranks: single copy") != std::string::npos);
    // MPICH has no progress hook: the leaders' progress threads move it (and in MPI_Recv).
    CHECK((waited_ms(r.text) >= 0 && waited_ms(r.text) < 1000));
  }
}

// Debian's MPICH spins in its waits: on 2 cores shared by 16 ranks and the daemons one
// MPI_Barrier took 79 ms, and MPICH + aapc reached 77% of the limit where Open MPI + aapc, whose
// ranks yield, reached 92%. aapc-emu preloads libaapc-mpich-yield.so into MPICH's ranks, with
// the library and without (the MPI alone), and not into Open MPI's.
TEST_CASE("MPICH's ranks yield when idle: every rank of an MPICH job has the yield library, with and without libaapc-mpi", "[mpi]") {
  REQUIRE(have("mpich"));
  // Every rank (a shell, which the wrapper starts as it starts MPI programs) says which of the
  // two libraries it has mapped.
  const std::string which = "/bin/sh -c 'for l in libaapc-mpich-yield.so libaapc-mpi.so; do grep -q $l /proc/$$/maps && echo has $l; done; true'";
  for (const char* preload : {"", " --no-preload"}) {
    Sh r = mpirun("--mpi mpich --ppn 2,1,1,1" + std::string(preload), which);
    INFO(r.text);
    REQUIRE(r.status == 0);
    CHECK(occurrences(r.text, "has libaapc-mpich-yield.so") == 5);
    CHECK(occurrences(r.text, "has libaapc-mpi.so") == (std::string(preload).empty() ? 5U : 0U));
  }
  Sh ompi = mpirun("--ppn 2", which);
  INFO(ompi.text);
  CHECK(ompi.status == 0);
  CHECK(occurrences(ompi.text, "has libaapc-mpi.so") == 8);
  CHECK(occurrences(ompi.text, "has libaapc-mpich-yield.so") == 0);
}

// Debian's MPICH 4.0 hung in MPI_Finalize in most jobs here, with the library and without: a
// rank or two spun for ever closing a UCX endpoint whose peer already waited in a PMI barrier
// (seen: 4 of 6 jobs of 8 ranks, 5 of 6 of 32, a trivial program). libaapc-mpich-yield.so
// gives those closes a second. Each job must end by itself, well within its timeout; with the
// library its all-to-alls go through aapc, however small.
TEST_CASE("unmodified MPI jobs end by themselves: MPICH's MPI_Finalize does not hang, ppn 2 and 4, with the library and without", "[mpi]") {
  REQUIRE(have("mpich"));
  const std::string program = std::string(AAPC_TESTS_DIR) + "/mpi-finalize-mpich";
  REQUIRE(fs::exists(program));
  for (const auto& [how, ranks] : {std::pair{"--ppn 2", 8}, {"--ppn 4", 16}, {"--ppn 4 --no-preload", 16}})
    for (int round = 0; round < 2; ++round) {
      INFO(how << ", round " << round);
      const auto t0 = std::chrono::steady_clock::now();
      Sh r = sh(kEmu + " mpirun " + aapc::tools::shell_quote(topology().string()) + " --timeout 60 --env AAPC_MPI_MIN_BLOCK=0 --mpi mpich " + how + " -- " + program);
      INFO(r.text);
      CHECK(r.status == 0);
      CHECK(r.text.find("mpi-finalize: " + std::to_string(ranks) + " ranks exchanged\n") != std::string::npos);
      CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(30));
    }
}

// A job that hangs says where: past its timeout, aapc-emu shows each of its processes' threads
// (gdb's backtraces) before it ends them. A hang seen once in a hundred jobs is otherwise
// nothing but "timed out".
TEST_CASE("a job past its timeout is shown before it is ended: where each of its ranks waits", "[mpi]") {
  REQUIRE(have("openmpi"));
  REQUIRE(fs::exists("/usr/bin/gdb"));  // tools/setup installs it
  const auto t0 = std::chrono::steady_clock::now();
  Sh r = sh(kEmu + " mpirun " + aapc::tools::shell_quote(topology().string()) + " --timeout 5 --no-preload -- sleep 600");
  INFO(r.text);
  CHECK(r.status != 0);
  CHECK(r.text.find("did not finish within 5 s; where its processes wait:") != std::string::npos);
  for (const char* m : {"m0: sleep (pid ", "m1: sleep (pid ", "m2: sleep (pid ", "m3: sleep (pid "}) CHECK(r.text.find(m) != std::string::npos);
  CHECK(r.text.find("nanosleep") != std::string::npos);  // the frame each one waits in
  CHECK(r.text.find("exited with 124 (timed out)") != std::string::npos);
  CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(90));
}

// tests/mpi/mpi_threads.c: two threads of every rank run MPI_Alltoall on two communicators,
// started in opposite orders on even and odd ranks. A leader waited for its daemon in one
// request, holding the process's lock and connection, so the other thread could not start the
// exchange that the peers waited for: every call failed at the daemons' deadline, and the job
// with them.
// The same with MPI_Ialltoall and MPI_Wait, 400 rounds a thread. With MPICH, which calls the
// request's free callback inside its own lock, the callback waited for the process's lock,
// which another thread's progress pass held while it waited for MPICH's: every run hung
// (requests.cpp, free_op). With Open MPI, another thread's progress pass finished an op
// before its call had made its request, which then was never completed: 4 runs in 5 failed
// (requests.cpp, carry).
TEST_CASE("an MPI_THREAD_MULTIPLE program's two threads run MPI_Ialltoall and MPI_Wait on two communicators, ppn 1 and 2", "[mpi]") {
  for (const std::string mpi : {"openmpi", "mpich"}) {
    REQUIRE(have(mpi));
    for (const auto& [ppn, ranks] : {std::pair{"1", 4}, {"2", 8}}) {
      INFO(mpi << ", --ppn " << ppn);
      Sh r = mpirun("--mpi " + mpi + " --ppn " + ppn, std::string(AAPC_TESTS_DIR) + "/mpi-threads-" + mpi + " 1024 400 nonblocking");
      INFO(r.text);
      CHECK(r.status == 0);
      CHECK(r.text.find("mpi-threads: " + std::to_string(ranks) + " ranks, all calls ok") != std::string::npos);
    }
  }
}

TEST_CASE("an MPI_THREAD_MULTIPLE program's two threads run all-to-alls on two communicators in opposite orders, ppn 1 and 2", "[mpi]") {
  for (const char* mpi : {"openmpi", "mpich"}) {
    REQUIRE(have(mpi));
    const std::string program = std::string(AAPC_TESTS_DIR) + "/mpi-threads-" + mpi;
    REQUIRE(fs::exists(program));
    for (const auto& [ppn, ranks] : {std::pair{"1", 4}, {"2", 8}}) {
      INFO(mpi << ", --ppn " << ppn);
      const auto t0 = std::chrono::steady_clock::now();
      Sh r = mpirun("--mpi " + std::string(mpi) + " --ppn " + ppn + " --env AAPC_MPI_VERBOSE=1", program + " 65536 2");
      INFO(r.text);
      CHECK(r.status == 0);
      CHECK(r.text.find("mpi-threads: " + std::to_string(ranks) + " ranks, all calls ok") != std::string::npos);
      CHECK(r.text.find("a communicator: its first all-to-all was carried by aapc") != std::string::npos);
      CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(60));
    }
  }
}

// `program` (tests/mpi/, built for each MPI as PROGRAM-openmpi and PROGRAM-mpich) run with
// `args` by both MPIs at ppn 1, 2 and uneven, every rank saying through what its all-to-alls
// went; `check` looks at each run's output.
// `env`: further --env NAME=VALUE for aapc-emu mpirun.
void with_both_mpis_at_every_ppn(const std::string& program, const std::string& args, const std::function<void(const Sh&)>& check,
                                 const std::string& env = "") {
  for (const char* mpi : {"openmpi", "mpich"}) {
    const std::string path = std::string(AAPC_TESTS_DIR) + "/" + program + "-" + mpi;
    if (!fs::exists(path) || aapc::tools::MpiCluster::launcher(mpi).empty()) continue;
    for (const char* ppn : {"1", "2", "2,1,3,1"}) {
      INFO(mpi << ", --ppn " << ppn);
      const Sh r = mpirun("--mpi " + std::string(mpi) + " --ppn " + ppn + " --env AAPC_MPI_VERBOSE=1" + env, path + " " + args);
      INFO(r.text);
      CHECK(r.status == 0);
      check(r);
    }
  }
}

bool carried(const Sh& r, const std::string& comm) { return r.text.find(comm + ": its first all-to-all was carried by aapc") != std::string::npos; }

// mpi_nonblocking.c: a fresh communicator's first MPI_Ialltoall(v), then MPI_Ibcast,
// MPI_Iallreduce, MPI_Iallgather and MPI_Ibarrier on it before any wait, with the even ranks
// testing the first request in between. With Open MPI the plan's duplication of the
// communicator and the program's collectives took the communicator's tags in different orders
// on different ranks: the job hung, or failed with MPI_ERR_TRUNCATE (plan.cpp,
// Planner::finish_duplicate). Then 2000 nonblocking collectives on 4 communicators, 16 in
// flight, completed in each rank's own order: a leader that started an exchange behind its
// group's running alltoallv waited in the daemon's call and stopped moving the MPI, and the
// alltoallv failed at its deadline (op.cpp, agreeing). A cartesian communicator's first
// MPI_Ialltoall followed by MPI_Cart_sub and MPI_Ineighbor_alltoall on it before the wait hung
// with Open MPI until the dispatcher guarded those calls too (interposed.def). A rank that
// hangs says so and exits (its watchdog, 60 s).
TEST_CASE("a new communicator's first MPI_Ialltoall(v) and other nonblocking collectives on it before any wait, ppn 1, 2 and uneven, both MPIs", "[mpi]") {
  with_both_mpis_at_every_ppn("mpi-nonblocking", "4096 6", [](const Sh& r) {
    CHECK(r.text.find("HUNG") == std::string::npos);
    CHECK(r.text.find("rounds, all results ok") != std::string::npos);
    CHECK(carried(r, "first-ialltoall"));
    CHECK(carried(r, "first-ialltoallv"));
  });
}

// mpi_mixed.c: a nonblocking all-to-all, then blocking all-to-alls on the same communicator
// while the odd ranks still hold the nonblocking one (the even ranks wait for it at once), on
// fresh communicators and on the world; small calls below AAPC_MPI_MIN_BLOCK and large ones
// through aapc. A rank whose earlier call had started ran a blocking call's agreement and the
// MPI's own all-to-all as blocking MPI calls on the plan's duplicate, a rank whose earlier call
// still waited ran them nonblocking, which MPI does not match: every rank hung in round 0
// (calls.cpp, run()).
TEST_CASE("blocking all-to-alls while some ranks still hold an earlier nonblocking one of the communicator, ppn 1, 2 and uneven, both MPIs", "[mpi]") {
  with_both_mpis_at_every_ppn(
      "mpi-mixed", "65536 8",
      [](const Sh& r) {
        CHECK(r.text.find("HUNG") == std::string::npos);
        CHECK(r.text.find("8 rounds, all results ok") != std::string::npos);
        CHECK(carried(r, "mixed-large"));
      },
      " --env AAPC_MPI_MIN_BLOCK=8192 --env WATCHDOG_S=40");
}

// mpi_progress.c: rank 0's large MPI_Isend to rank 1 pending while it waits in MPI_Alltoall,
// which rank 1 calls only once it has the message. The message goes by rendezvous, so it moves
// only while rank 0's MPI runs: the blocking all-to-all waited in its daemon without calling the
// MPI, and the job hung until the watchdog (progress.cpp, drive()): at ppn 1 with both MPIs,
// the two ranks on different machines, and with MPICH at ppn 2 too, whose shared memory moves
// a large message only while its sender's MPI runs (Open MPI's single copy needs no sender).
TEST_CASE("a blocking all-to-all moves the program's pending MPI_Isend that its peer waits for before the all-to-all, both MPIs", "[mpi]") {
  with_both_mpis_at_every_ppn("mpi-progress", "4194304 4096 3", [](const Sh& r) {
    CHECK(r.text.find("HUNG") == std::string::npos);
    CHECK(r.text.find("rounds, all results ok") != std::string::npos);
    CHECK(carried(r, "MPI_COMM_WORLD"));
  });
}

// mpi_persistent.c: MPI-4's persistent all-to-all, all-to-allv and all-to-allw (Open MPI
// 4.1: MPIX_*), each initialized once and started 30 times (MPI_Start with MPI_Wait or
// MPI_Test, and MPI_Startall with MPI_Waitall), every value checked after every start, the
// handles kept after completion (persistent.cpp). Each call's derived datatypes are freed
// right after its init and a new type made: the alltoall's and alltoallv's starts used the
// freed handles, and the job crashed with both MPIs (Open MPI 4.1's own MPIX_Alltoall_init,
// without the library, crashes the same way; MPICH's alone passes).
TEST_CASE("persistent all-to-alls through aapc: initialized once, started many times, ppn 1, 2 and uneven, both MPIs", "[mpi]") {
  with_both_mpis_at_every_ppn("mpi-persistent", "1024 30", [](const Sh& r) {
    CHECK(r.text.find("30 starts, all results ok") != std::string::npos);
    CHECK(carried(r, "persistent-alltoall"));
    CHECK(carried(r, "persistent-alltoallv"));
    CHECK(carried(r, "persistent-alltoallw"));
  });
}

// mpi_alltoallw.c: MPI_Alltoallw and MPI_Ialltoallw (on a communicator of its own, its
// types freed before the wait) with a datatype of its own per peer on each side (ints or
// doubles, contiguous or strided), counts that differ by pair, some zero; every value and
// every gap checked (alltoallw.cpp: packed, carried as a byte alltoallv, unpacked).
TEST_CASE("MPI_Alltoallw and MPI_Ialltoallw with differing datatypes per peer through aapc, ppn 1, 2 and uneven, both MPIs", "[mpi]") {
  with_both_mpis_at_every_ppn("mpi-alltoallw", "3", [](const Sh& r) {
    CHECK(r.text.find("3 rounds, all values ok") != std::string::npos);
    CHECK(carried(r, "alltoallw"));
    CHECK(carried(r, "w-nonblocking"));
    CHECK(r.text.find(std::string(kCarried)) != std::string::npos);
  });
}

// mpi_small_alltoallv.c at the default AAPC_MPI_MIN_BLOCK: alltoallvs whose counts each rank
// alone knows. Tiny ones ran through the daemons, every one (mpi4py's vector tests at ppn 1
// took 3.3x Open MPI's time, at ppn 2 more than 600 s): the ranks now agree on the largest
// (calls.cpp, decide()). One rank's large block makes every rank choose aapc; tiny and large
// nonblocking calls, small MPI_Ialltoalls and MPI_Ibcasts in flight together, completed in
// each rank's own order, stay right.
TEST_CASE("tiny alltoallvs run the MPI's own and one rank's large block sends every rank through aapc, ppn 1, 2 and uneven, both MPIs", "[mpi]") {
  with_both_mpis_at_every_ppn(
      "mpi-small-alltoallv", "65536 2",
      [](const Sh& r) {
        CHECK(r.text.find("HUNG") == std::string::npos);
        CHECK(r.text.find("2 rounds, all results ok") != std::string::npos);
        CHECK_FALSE(carried(r, "tiny-v"));
        CHECK(r.text.find("tiny-v: its first all-to-all under AAPC_MPI_MIN_BLOCK (8192 bytes) ran the MPI's own") != std::string::npos);
        CHECK(carried(r, "one-large-v"));
        CHECK(carried(r, "mixed"));
      },
      " --env AAPC_MPI_MIN_BLOCK=8192");
}

TEST_CASE("without the library, and with AAPC_MPI=off, the MPI's own all-to-all runs", "[mpi]") {
  REQUIRE(have("openmpi"));
  Sh alone = mpirun("--ppn 2 --no-preload", check_program("openmpi") + " 1024");
  INFO(alone.text);
  CHECK(alone.status == 0);
  CHECK(alone.text.find("all cases ok") != std::string::npos);
  Sh off = mpirun("--ppn 2 --env AAPC_MPI=off --env AAPC_MPI_VERBOSE=1", check_program("openmpi") + " 1024");
  INFO(off.text);
  CHECK(off.status == 0);
  CHECK(off.text.find("AAPC_MPI=off on rank 0") != std::string::npos);
  CHECK(off.text.find("through aapc") == std::string::npos);
}

TEST_CASE("aapc-emu mpirun inside a container's or a batch job's environment: the emulated machines are the allocation", "[mpi]") {
  // Found on a 16-core machine whose environment had OMPI_MCA_plm=isolated: Open MPI started
  // no daemon on the other machines and found "not enough slots". Inside a SLURM job it read
  // SLURM's allocation and refused the hostfile's machines.
  const std::string slurm = "SLURM_JOBID=7 SLURM_JOB_ID=7 SLURM_NODELIST=elsewhere SLURM_JOB_NODELIST=elsewhere SLURM_TASKS_PER_NODE=2 SLURM_NNODES=1";
  for (const std::string mpi : {"openmpi", "mpich"}) {
    if (!have(mpi)) continue;
    for (const std::string& outer : {std::string("OMPI_MCA_plm=isolated"), slurm}) {
      INFO(mpi << " with " << outer);
      Sh r = mpirun("--ppn 2 --mpi " + mpi, std::string(AAPC_TOOLS_DIR) + "/mpi-alltoall-" + mpi + " --check 4096:2", outer);
      INFO(r.text);
      CHECK(r.status == 0);
      CHECK(r.text.find("\"check_ok\": true") != std::string::npos);
    }
  }
}

TEST_CASE("an unmodified mpi4py program, ppn 2", "[mpi]") {
  REQUIRE(have("openmpi"));
  REQUIRE(sh("/usr/bin/python3 -c 'import mpi4py, numpy'").status == 0);  // python3-mpi4py, python3-numpy
  Sh r = mpirun("--ppn 2 --env AAPC_MPI_VERBOSE=1", "/usr/bin/python3 " + std::string(AAPC_TESTS_SOURCE) + "/mpi/mpi_check.py 256");
  INFO(r.text);
  CHECK(r.status == 0);
  CHECK(r.text.find("mpi-check.py: 8 ranks, all cases ok") != std::string::npos);
  CHECK(r.text.find(kCarried) != std::string::npos);
}

// Python loads mpi4py's MPI module, and the MPI library with it, with RTLD_LOCAL: outside the
// process's global scope. Debian's MPICH loaded that way hangs in its first exchange between
// machines, alone too (mpi_plugin.c); the library makes the MPI global before its init.
TEST_CASE("an MPI program that its host loads with RTLD_LOCAL, as Python loads mpi4py, runs through aapc, ppn 1 and 2, both MPIs", "[mpi]") {
  const std::string host = std::string(AAPC_TESTS_DIR) + "/mpi-plugin-host";
  REQUIRE(fs::exists(host));
  for (const std::string mpi : {"openmpi", "mpich"}) {
    REQUIRE(have(mpi));
    for (const auto& [ppn, ranks] : {std::pair{"1", 4}, {"2", 8}}) {
      INFO(mpi << ", --ppn " << ppn);
      const Sh r = mpirun("--mpi " + mpi + " --ppn " + ppn + " --env AAPC_MPI_VERBOSE=1 --env WATCHDOG_S=40",
                          host + " " + std::string(AAPC_TESTS_DIR) + "/mpi-plugin-" + mpi + ".so 3000");
      INFO(r.text);
      CHECK(r.status == 0);
      CHECK(r.text.find("mpi-plugin: " + std::to_string(ranks) + " ranks, all cases ok") != std::string::npos);
      CHECK(r.text.find(kCarried) != std::string::npos);
    }
  }
}

TEST_CASE("by default small all-to-alls run the MPI's own, large ones aapc; both right", "[mpi]") {
  REQUIRE(have("openmpi"));
  const std::string program = std::string(AAPC_TOOLS_DIR) + "/mpi-alltoall-openmpi --check 1024:20 65536:5";
  Sh r = sh(kEmu + " mpirun " + aapc::tools::shell_quote(topology().string()) + " --timeout 240 --env AAPC_MPI_VERBOSE=1 -- " + program);
  INFO(r.text);
  CHECK(r.status == 0);
  CHECK(r.text.find("blocks under 8192 bytes: the MPI's own") != std::string::npos);
  CHECK(r.text.find("MPI_COMM_WORLD: its first all-to-all under AAPC_MPI_MIN_BLOCK (8192 bytes) ran the MPI's own") != std::string::npos);
  CHECK(r.text.find(kCarried) != std::string::npos);  // the 64 KiB ones
  CHECK(r.text.find("\"size\": 1024") != std::string::npos);
  CHECK(r.text.find("\"check_ok\": false") == std::string::npos);
  CHECK(r.text.find("\"check_ok\": true") != std::string::npos);
}

TEST_CASE("an aapc failure reaches the program through the error handler, with aapc's message, on every rank", "[mpi]") {
  for (const std::string mpi : {"openmpi", "mpich"}) {
    REQUIRE(have(mpi));
    INFO(mpi);
    Sh r = mpirun("--mpi " + mpi + " --ppn 2 --env AAPC_MPI_SCHEDULE=no-such-schedule", std::string(AAPC_TESTS_DIR) + "/mpi-error-" + mpi);
    INFO(r.text);
    CHECK(r.status == 0);
    CHECK(r.text.find("MPI_Alltoall: every rank got aapc's error") != std::string::npos);
    CHECK(r.text.find("MPI_Wait of MPI_Ialltoall: every rank got aapc's error") != std::string::npos);
    // A call of many requests says MPI_ERR_IN_STATUS, the error in the failed one's status.
    CHECK(r.text.find("MPI_Waitall of MPI_Ialltoall and a receive: every rank got aapc's error") != std::string::npos);
    CHECK(r.text.find("MPI_Waitsome of MPI_Ialltoall and a receive: every rank got aapc's error") != std::string::npos);
    CHECK(r.text.find("no-such-schedule") != std::string::npos);  // the daemon's words reach the program
    // The program goes on after the errors, without the setting: its calls succeed again, the
    // 33rd and 34th in the hand-over slots of the two that failed included.
    CHECK(r.text.find("after the errors, 40 all-to-alls: every rank got its blocks") != std::string::npos);
  }
}

TEST_CASE("an erroneous MPI_Ialltoall (one rank's count differs) returns an error on every rank, and nothing aborts or hangs", "[mpi]") {
  REQUIRE(have("openmpi"));
  // Rank 1 (machine 0) has 512-byte blocks, the others 256. Machine 0's ranks name the
  // hand-over that failed; the others, the daemon that never started. The single-copy leader
  // names the ranks and their blocks (and reads nothing past what rank 1 has); the MPI's
  // transport says its message was truncated. Rank 2 (machine 0 too) calls a second after the
  // others.
  for (const auto& [handover, words] : {std::pair{"", "failed: rank 1 called the all-to-all with 512-byte blocks to send and 512 to receive, rank 0 with 256"},
                                        {"mpi", "failed: MPI_ERR_TRUNCATE"}}) {
    INFO("AAPC_MPI_HANDOVER=" << handover);
    Sh r = mpirun("--ppn 3 --env AAPC_MPI_HANDOVER=" + std::string(handover), std::string(AAPC_TESTS_DIR) + "/mpi-error-openmpi mismatch");
    INFO(r.text);
    CHECK(r.status == 0);
    CHECK(r.text.find("MPI_Wait of MPI_Ialltoall: every rank got aapc's error") != std::string::npos);
    CHECK(r.text.find(std::string("hand-over between the ranks of machine 0 ") + words) != std::string::npos);
  }
}

TEST_CASE("an erroneous MPI_Ialltoall (one rank calls MPI_Ialltoallv) fails on every rank, the late rank of the leader's machine included", "[mpi]") {
  REQUIRE(have("openmpi"));
  // Rank 1 describes an alltoallv to its single-copy leader, which fails the call as soon as it
  // reads that; rank 2, on the same machine, calls a second later. The leader must tell rank 2
  // the outcome of its own call: it used to tell it at once, and rank 2's call then waited for
  // ever for a mailbox slot that looked taken (the job hit its timeout).
  Sh r = mpirun("--ppn 3", std::string(AAPC_TESTS_DIR) + "/mpi-error-openmpi mixed");
  INFO(r.text);
  CHECK(r.status == 0);
  CHECK(r.text.find("MPI_Wait of MPI_Ialltoall: every rank got aapc's error") != std::string::npos);
  CHECK(r.text.find("rank 2: MPI_Wait of MPI_Ialltoall returned") != std::string::npos);
  CHECK(r.text.find("hand-over between the ranks of machine 0 failed: rank 1 described its blocks in") != std::string::npos);
}

TEST_CASE("all-to-alls with erroneous arguments return MPI's error class on every rank, and the job goes on", "[mpi]") {
  // As MPICH's errors/coll tests call them, with MPI_ERRORS_RETURN: one buffer for sending and
  // receiving, negative counts, a null datatype, MPI_IN_PLACE to receive into. The library
  // carried the aliased calls and returned success, and crashed both MPIs' jobs on a negative
  // count (arguments.cpp).
  for (const std::string mpi : {"openmpi", "mpich"}) {
    INFO(mpi);
    REQUIRE(have(mpi));
    Sh r = mpirun("--mpi " + mpi + " --ppn 2", std::string(AAPC_TESTS_DIR) + "/mpi-arguments-" + mpi);
    INFO(r.text);
    CHECK(r.status == 0);
    for (const char* call : {"MPI_Alltoall with one buffer for both", "MPI_Ialltoall with one buffer for both", "MPI_Alltoallv with one buffer for both",
                             "MPI_Alltoallw with one buffer for both", "MPI_Alltoall with a negative count", "MPI_Alltoallv with a negative count",
                             "MPI_Alltoall of MPI_DATATYPE_NULL", "MPI_Alltoall into MPI_IN_PLACE"})
      CHECK(r.text.find(std::string(call) + ": every rank got the error") != std::string::npos);
    CHECK(r.text.find("pass MPI_IN_PLACE as the send buffer instead") != std::string::npos);  // the library's words, on stderr
    CHECK(r.text.find("MPI_Alltoallv within one buffer, blocks apart: every rank got its blocks") != std::string::npos);
    CHECK(r.text.find("after the errors, an MPI_Alltoall: every rank got its blocks") != std::string::npos);
  }
}

TEST_CASE("unmodified Fortran programs (use mpi, use mpi_f08) through aapc, blocking, nonblocking and persistent, ppn 2", "[mpi]") {
  // MPICH's mpi_f08 starts the library's MPI_Ialltoall but completes it with PMPI_Wait,
  // PMPI_Test and PMPI_Waitall, past the library: each waited for ever until MPICH's own calls
  // moved the op (requests.cpp, poll_op). Its persistent MPI_Alltoall_init is started by
  // PMPI_Start: made by the library, it never ran, and the program read its buffer unchanged
  // ("WRONG"); the Fortran bindings' inits are now the MPI's own (dispatch.cpp).
  // Open MPI's Fortran bindings pass by the C interposer: `use mpi` through mpi_alltoall_,
  // `use mpi_f08` through ompi_alltoall_f. MPICH's mpi_f08 calls the C MPI_Alltoall. An
  // MPI_ALLTOALL from MPI_BOTTOM with types of absolute addresses failed with each: Open MPI's
  // Fortran MPI_BOTTOM (a common block's address) went on as a buffer, and MPICH's MPI_Pack
  // refused the null buffer that the C MPI_BOTTOM is (entry.cpp, datatypes.cpp at_user).
  for (const auto& [program, mpi] : {std::pair{"mpi-check-fortran", "openmpi"}, {"mpi-check-f08", "openmpi"}, {"mpi-check-f08-mpich", "mpich"}}) {
    INFO(program);
    REQUIRE(fs::exists(std::string(AAPC_TESTS_DIR) + "/" + program));
    Sh r = mpirun("--mpi " + std::string(mpi) + " --ppn 2 --env AAPC_MPI_VERBOSE=1", std::string(AAPC_TESTS_DIR) + "/" + program);
    INFO(r.text);
    CHECK(r.status == 0);
    CHECK(r.text.find("mpi-check-fortran: 8 ranks, all cases ok") != std::string::npos);
    CHECK(r.text.find(kCarried) != std::string::npos);
  }
}

TEST_CASE("a failed MPI_IALLTOALL reaches an mpi_f08 program's MPI_WAIT, which MPICH runs past the library, on every rank", "[mpi]") {
  // The wait is MPICH's own PMPI_Wait: the library's poll function moves the op and its query
  // raises the failure as MPICH collects the request (requests.cpp). Before, the wait never
  // returned.
  const std::string program = std::string(AAPC_TESTS_DIR) + "/mpi-error-f08-mpich";
  REQUIRE(fs::exists(program));
  Sh r = mpirun("--mpi mpich --ppn 2", program);
  INFO(r.text);
  CHECK(r.status == 0);
  CHECK(occurrences(r.text, "MPI_WAIT returned an error") == 8);  // 4 machines, 2 ranks each
  CHECK(r.text.find("MPI_WAIT returned MPI_SUCCESS") == std::string::npos);
}

TEST_CASE("FFTW's MPI interface runs unmodified with the library and gives serial FFTW's result, ppn 2", "[mpi]") {
  REQUIRE(fs::exists(std::string(AAPC_TESTS_DIR) + "/fftw-check"));  // libfftw3-mpi-dev (tools/setup)
  Sh r = mpirun("--ppn 2 --env AAPC_MPI_VERBOSE=1", std::string(AAPC_TESTS_DIR) + "/fftw-check 256");
  INFO(r.text);
  CHECK(r.status == 0);
  CHECK(r.text.find("256 x 256 on 8 ranks") != std::string::npos);
  CHECK(r.text.find("DIFFERENT") == std::string::npos);
  CHECK(r.text.find("transpose (") != std::string::npos);
  // The library was in the job. FFTW's planner picks its transposes itself (here it measured
  // its pairwise ones faster); those that are all-to-alls go through aapc.
  CHECK(r.text.find("all-to-all through aapc") != std::string::npos);
}

int main(int argc, char** argv) {
  if (::geteuid() != 0) {
    std::cerr << "the cluster suite needs root (network namespaces, bridges); skipped\n";
    return 77;
  }
  if (Sh up = sh(kEmu + " up " + aapc::tools::shell_quote(topology().string())); up.status != 0) {
    std::cerr << "aapc-emu up failed:\n" << up.text;
    sh(kEmu + " down");
    return 1;
  }
  const int rc = Catch::Session().run(argc, argv);
  sh(kEmu + " down");
  fs::remove_all(kDir);
  return rc;
}

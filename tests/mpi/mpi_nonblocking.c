/* mpi-nonblocking: an ordinary MPI program (nothing of aapc in it) whose fresh communicators'
 * first collective is an MPI_Ialltoall (even rounds) or an MPI_Ialltoallv (odd rounds), and
 * which starts other nonblocking collectives on the same communicator before any wait:
 * MPI_Ibcast, MPI_Iallreduce, MPI_Iallgather and MPI_Ibarrier. Even ranks poll the first
 * request with MPI_Test between the calls; odd ranks compute (sleep) instead. MPI allows it:
 * every rank starts the same collectives on the communicator in the same order. Every byte
 * of every result is checked.
 *
 * With libaapc-mpi a communicator's first all-to-all starts the duplicate of the communicator
 * that its plan is made on (docs/design.md, "Plans"); in Open MPI 4.1 that duplication runs
 * rounds of nonblocking allreduces on the program's communicator from its progress engine,
 * which must not interleave with the program's own nonblocking collectives there.
 *
 * Every other round a cartesian communicator's first MPI_Ialltoall is followed, before any
 * wait, by MPI_Cart_sub and MPI_Ineighbor_alltoall on it (cart_round()).
 *
 * Last, many nonblocking collectives of several kinds (all-to-alls among them) in flight on 4
 * communicators at once, completed in each rank's own order (many_in_flight()): a leader that
 * started an exchange while an alltoallv of the same group still agreed on its counts waited
 * in the daemon's call, stopped moving the MPI, and a peer that waited in the MPI for it never
 * started that alltoallv (op.cpp, agreeing()).
 *
 * A rank that waits longer than the watchdog (WATCHDOG_S, default 60) says where it hangs and
 * exits with status 3, so a hang fails the job rather than its launcher's timeout.
 *
 *   mpi-nonblocking [BLOCK_BYTES] [ROUNDS] [COLLECTIVES_IN_FLIGHT_TOTAL]
 *       rank 0 prints "mpi-nonblocking: N ranks, R rounds, all results ok"
 */
#include <mpi.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "watchdog.h"

static unsigned char value(int s, int d, size_t k, int round) { return (unsigned char)(s * 131 + d * 31 + k * 7 + round * 17 + 1); }

/* Bytes from rank s to rank d in an MPI_Ialltoallv round: they differ by pair. */
static int vcount(int s, int d, int block) { return block / 2 + ((s + 2 * d) % 3) * (block / 4); }

static void pause_ms(int ms) {
  const struct timespec t = {ms / 1000, (long)(ms % 1000) * 1000000L};
  nanosleep(&t, NULL);
}

/* Between two calls: even ranks poll the first request for `ms`, odd ranks do no MPI call. */
static void between(MPI_Request* first, int me, int ms) {
  if (me % 2 != 0) {
    pause_ms(ms / 2);
    return;
  }
  const double until = MPI_Wtime() + ms / 1000.0;
  int done = 0;
  while (!done && MPI_Wtime() < until) MPI_Test(first, &done, MPI_STATUS_IGNORE);
}

struct bufs {
  unsigned char *s, *r, *gather, *bcast;
  int *scounts, *sdispls, *rcounts, *rdispls;
};

/* The all-to-all of `round`, started. */
static void start_exchange(const struct bufs* b, int me, int n, int block, int round, MPI_Comm comm, MPI_Request* req) {
  const int v = round % 2 != 0;
  int at = 0;
  for (int d = 0; d < n; ++d) {
    b->scounts[d] = v ? vcount(me, d, block) : block;
    b->sdispls[d] = v ? at : d * block;
    for (int k = 0; k < b->scounts[d]; ++k) b->s[b->sdispls[d] + k] = value(me, d, (size_t)k, round);
    at += b->scounts[d];
  }
  at = 0;
  for (int s = 0; s < n; ++s) {
    b->rcounts[s] = v ? vcount(s, me, block) : block;
    b->rdispls[s] = v ? at : s * block;
    at += b->rcounts[s];
  }
  memset(b->r, 0, (size_t)n * (size_t)block);
  if (v)
    MPI_Ialltoallv(b->s, b->scounts, b->sdispls, MPI_BYTE, b->r, b->rcounts, b->rdispls, MPI_BYTE, comm, req);
  else
    MPI_Ialltoall(b->s, block, MPI_BYTE, b->r, block, MPI_BYTE, comm, req);
}

/* One round on a fresh communicator; the number of wrong values. */
static long one_round(const struct bufs* b, int block, int round) {
  MPI_Comm comm;
  MPI_Comm_dup(MPI_COMM_WORLD, &comm);
  MPI_Comm_set_name(comm, round % 2 != 0 ? "first-ialltoallv" : "first-ialltoall");  /* AAPC_MPI_VERBOSE names it */
  int me = 0, n = 0;
  MPI_Comm_rank(comm, &me);
  MPI_Comm_size(comm, &n);
  MPI_Request req[5];
  MPI_Status statuses[5];
  step_now = "the all-to-all";
  start_exchange(b, me, n, block, round, comm, &req[0]);
  between(&req[0], me, 40);
  const int root = round % n;
  for (int k = 0; k < block; ++k) b->bcast[k] = me == root ? value(root, 0, (size_t)k, round) : 0;
  MPI_Ibcast(b->bcast, block, MPI_BYTE, root, comm, &req[1]);
  between(&req[0], me, 20);
  long mine = me + round, sum = 0;
  MPI_Iallreduce(&mine, &sum, 1, MPI_LONG, MPI_SUM, comm, &req[2]);
  between(&req[0], me, 20);
  unsigned char* own = b->gather + (size_t)n * (size_t)block;  /* this rank's block, apart */
  for (int k = 0; k < block; ++k) own[k] = value(me, me, (size_t)k, round + 1);
  MPI_Iallgather(own, block, MPI_BYTE, b->gather, block, MPI_BYTE, comm, &req[3]);
  between(&req[0], me, 20);
  MPI_Ibarrier(comm, &req[4]);
  step_now = "MPI_Waitall";
  MPI_Waitall(5, req, statuses);
  long wrong = 0;
  for (int s = 0; s < n; ++s)
    for (int k = 0; k < b->rcounts[s]; ++k) wrong += b->r[b->rdispls[s] + k] != value(s, me, (size_t)k, round);
  for (int k = 0; k < block; ++k) wrong += b->bcast[k] != value(root, 0, (size_t)k, round);
  wrong += sum != (long)n * (n - 1) / 2 + (long)n * round;
  for (int s = 0; s < n; ++s)
    for (int k = 0; k < block; ++k) wrong += b->gather[(size_t)s * (size_t)block + (size_t)k] != value(s, s, (size_t)k, round + 1);
  step_now = "MPI_Comm_free";
  MPI_Comm_free(&comm);
  return wrong;
}

/* Many nonblocking collectives of several kinds in flight on several communicators at once,
 * started in the same order on every rank (a generator seeded alike) and completed in an order
 * of each rank's own (MPI_Waitall, MPI_Testsome, MPI_Waitany, MPI_Testany, MPI_Test, MPI_Wait),
 * with an occasional nap. The all-to-alls' values and the allreduces' sums are checked. */
enum { kWindow = 16, kComms = 4, kInts = 10 };

struct slot {
  int kind, round, ints[2][kInts * 64];
};

static unsigned next_rand(unsigned* x) { return *x = *x * 1103515245u + 12345u, (*x >> 8) % 1000003u; }

static void post(struct slot* sl, int kind, int round, MPI_Comm comm, MPI_Request* req) {
  int me = 0, n = 0, counts[64], displs[64];
  MPI_Comm_rank(comm, &me);
  MPI_Comm_size(comm, &n);
  sl->kind = kind, sl->round = round;
  for (int i = 0; i < n * kInts; ++i) sl->ints[0][i] = me * 7919 + i * 31 + round, sl->ints[1][i] = -1;
  for (int p = 0; p < n; ++p) counts[p] = kInts, displs[p] = p * kInts;
  switch (kind) {
    case 0: MPI_Ialltoallv(sl->ints[0], counts, displs, MPI_INT, sl->ints[1], counts, displs, MPI_INT, comm, req); break;
    case 1: MPI_Ialltoall(sl->ints[0], kInts, MPI_INT, sl->ints[1], kInts, MPI_INT, comm, req); break;
    case 2: MPI_Iallreduce(sl->ints[0], sl->ints[1], kInts, MPI_INT, MPI_SUM, comm, req); break;
    case 3: MPI_Ibcast(sl->ints[0], kInts, MPI_INT, 0, comm, req); break;
    default: MPI_Ibarrier(comm, req); break;
  }
}

static long slot_wrong(const struct slot* sl, MPI_Comm comm) {
  int me = 0, n = 0;
  long wrong = 0;
  MPI_Comm_rank(comm, &me);
  MPI_Comm_size(comm, &n);
  if (sl->kind <= 1) /* block k of rank s's send buffer is s's to rank k */
    for (int s = 0; s < n; ++s)
      for (int i = 0; i < kInts; ++i) wrong += sl->ints[1][s * kInts + i] != s * 7919 + (me * kInts + i) * 31 + sl->round;
  if (sl->kind == 2)
    for (int i = 0; i < kInts; ++i) wrong += sl->ints[1][i] != 7919 * n * (n - 1) / 2 + n * (i * 31 + sl->round);
  return wrong;
}

/* Completes some of `reqs` as `how` says; the indices completed into `done`, their count returned. */
static int complete_some(int how, MPI_Request* reqs, int* done) {
  int count = 0, index = 0, flag = 0;
  MPI_Status st[kWindow];
  switch (how % 6) {
    case 0: MPI_Waitall(kWindow, reqs, st); for (int i = 0; i < kWindow; ++i) done[count++] = i; return count;
    case 1: MPI_Testsome(kWindow, reqs, &count, done, st); return count == MPI_UNDEFINED ? 0 : count;
    case 2: MPI_Waitany(kWindow, reqs, &index, st); done[0] = index; return index == MPI_UNDEFINED ? 0 : 1;
    case 3: MPI_Testany(kWindow, reqs, &index, &flag, st); done[0] = index; return flag && index != MPI_UNDEFINED ? 1 : 0;
    case 4: index = (how / 6) % kWindow; MPI_Test(&reqs[index], &flag, st); done[0] = index; return flag ? 1 : 0;
    default: index = (how / 6) % kWindow; MPI_Wait(&reqs[index], st); done[0] = index; return 1;
  }
}

static long many_in_flight(int iterations) {
  MPI_Comm comms[kComms];
  int me = 0, n = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &me);
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  if (n > 64) return 0;
  for (int c = 0; c < kComms; ++c) MPI_Comm_dup(MPI_COMM_WORLD, &comms[c]);
  static struct slot slots[kWindow];
  MPI_Request reqs[kWindow];
  int used[kWindow], done[kWindow], posted = 0, finished = 0;
  unsigned order = 0x10bc, mine = 0x5eed + (unsigned)me * 977u;
  long wrong = 0;
  for (int i = 0; i < kWindow; ++i, ++posted) used[i] = (int)(next_rand(&order) % kComms), post(&slots[i], (int)(next_rand(&order) % 5), posted, comms[used[i]], &reqs[i]);
  while (finished < iterations) {
    const int k = complete_some((int)next_rand(&mine), reqs, done);
    for (int j = 0; j < k; ++j) {
      const int i = done[j];
      if (slots[i].kind < 0) continue;
      wrong += slot_wrong(&slots[i], comms[used[i]]);
      slots[i].kind = -1, ++finished;
      if (posted < iterations) used[i] = (int)(next_rand(&order) % kComms), post(&slots[i], (int)(next_rand(&order) % 5), posted++, comms[used[i]], &reqs[i]);
    }
    if (next_rand(&mine) % 200 == 0) pause_ms(20);
  }
  for (int c = 0; c < kComms; ++c) MPI_Comm_free(&comms[c]);
  return wrong;
}

/* A cartesian communicator's first MPI_Ialltoall, then, before any wait, MPI_Cart_sub and an
 * MPI_Ineighbor_alltoall on it (a halo exchange), the even ranks testing the all-to-all in
 * between. Open MPI 4.1 agrees on the sub-communicator's context id, and runs the neighbour
 * collective, with nonblocking operations on the cartesian communicator: with the plan's
 * duplication in flight there the job hung. The number of wrong values. */
static long cart_round(const struct bufs* b, int block, int round) {
  int n = 0, me = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  int dims[2] = {0, 0}, periods[2] = {1, 1}, remain[2] = {1, 0};
  MPI_Dims_create(n, 2, dims);
  MPI_Comm cart, sub;
  MPI_Cart_create(MPI_COMM_WORLD, 2, dims, periods, 0, &cart);
  MPI_Comm_set_name(cart, "first-ialltoall-cart");
  MPI_Comm_rank(cart, &me);
  MPI_Request req[2];
  step_now = "the cartesian all-to-all";
  start_exchange(b, me, n, block, 2 * round, cart, &req[0]);
  if (me % 2 == 0) { /* a few quick tests, which may move the duplication part of the way */
    int done = 0;
    for (int k = 0; k < 50 && !done; ++k) MPI_Test(&req[0], &done, MPI_STATUS_IGNORE);
  } else {
    pause_ms(20);
  }
  step_now = "MPI_Cart_sub";
  MPI_Cart_sub(cart, remain, &sub);
  /* Four neighbours (two per dimension), one int each way: each sends its rank. */
  int halo_out[4], halo_in[4] = {-1, -1, -1, -1}, nb[4];
  for (int d = 0; d < 2; ++d) MPI_Cart_shift(cart, d, 1, &nb[2 * d], &nb[2 * d + 1]);
  for (int k = 0; k < 4; ++k) halo_out[k] = me;
  step_now = "MPI_Ineighbor_alltoall";
  MPI_Ineighbor_alltoall(halo_out, 1, MPI_INT, halo_in, 1, MPI_INT, cart, &req[1]);
  step_now = "MPI_Waitall (cartesian)";
  MPI_Status statuses[2];
  MPI_Waitall(2, req, statuses);
  long wrong = 0;
  for (int s = 0; s < n; ++s)
    for (int k = 0; k < b->rcounts[s]; ++k) wrong += b->r[b->rdispls[s] + k] != value(s, me, (size_t)k, 2 * round);
  for (int k = 0; k < 4; ++k) wrong += halo_in[k] != nb[k];
  int sub_size = 0;
  MPI_Comm_size(sub, &sub_size);
  wrong += sub_size != dims[0];
  MPI_Comm_free(&sub);
  MPI_Comm_free(&cart);
  return wrong;
}

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int n = 0;
  int me = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &me);
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  start_watchdog("mpi-nonblocking", me);
  const int block = argc > 1 ? atoi(argv[1]) : 4096;
  const int rounds = argc > 2 ? atoi(argv[2]) : 6;
  struct bufs b;
  b.s = malloc((size_t)n * (size_t)block);
  b.r = malloc((size_t)n * (size_t)block);
  b.gather = malloc((size_t)(n + 1) * (size_t)block);
  b.bcast = malloc((size_t)block);
  b.scounts = malloc(4 * sizeof(int) * (size_t)n);
  if (b.s == NULL || b.r == NULL || b.gather == NULL || b.bcast == NULL || b.scounts == NULL) MPI_Abort(MPI_COMM_WORLD, 1);
  b.sdispls = b.scounts + n, b.rcounts = b.scounts + 2 * n, b.rdispls = b.scounts + 3 * n;
  long wrong = 0;
  for (int round = 0; round < rounds; ++round) {
    round_now = round;
    wrong += one_round(&b, block, round);
    if (round % 2 == 0) wrong += cart_round(&b, block, round);
  }
  round_now = rounds;
  step_now = "many nonblocking collectives in flight";
  wrong += many_in_flight(argc > 3 ? atoi(argv[3]) : 2000);
  alarm(0);
  long all = 0;
  MPI_Allreduce(&wrong, &all, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
  if (me_world == 0) printf("mpi-nonblocking: %d ranks, %d rounds, %s (%ld wrong values)\n", n, rounds, all == 0 ? "all results ok" : "WRONG", all);
  free(b.s), free(b.r), free(b.gather), free(b.bcast), free(b.scounts);
  MPI_Finalize();
  return all == 0 ? 0 : 1;
}

/* mpi-mixed: an ordinary MPI program (nothing of aapc in it) that starts a nonblocking
 * all-to-all, and then blocking all-to-alls on the same communicator while some of its ranks
 * still hold the nonblocking one: even ranks wait for it at once, odd ranks compute (sleep,
 * no MPI call) and wait for it only after the blocking calls. MPI allows it: every rank
 * starts the same collectives on the communicator in the same order, and a pending
 * nonblocking collective moves while its rank waits in a blocking one (MPI 4.0, 6.12).
 *
 * With libaapc-mpi a call that waits for its communicator's plan, or for an alltoallv's
 * agreement on its size, runs later than the program made it. A rank whose earlier calls had
 * all started ran the next blocking call's work (the MPI's own all-to-all, the agreement) as
 * blocking MPI calls on the plan's duplicate, while a rank whose earlier call still waited ran
 * the same call's as nonblocking ones. MPI does not match a blocking collective with a
 * nonblocking one: the job hung.
 *
 * Each round runs on a fresh communicator and on the world, alternately:
 *   even rounds: a small MPI_Ialltoallv (its ranks agree on its size first), then a small
 *                MPI_Alltoall and a small MPI_Alltoallv;
 *   odd rounds:  a large MPI_Ialltoall (through aapc), then a small MPI_Alltoall and a large
 *                MPI_Alltoallv.
 * and in every round a nonblocking all-to-all that ranks blocked in point-to-point calls must
 * move (blocked_in_p2p()).
 * Every value is checked. A rank that waits longer than the watchdog (WATCHDOG_S, default 60)
 * says where it hangs and exits with status 3.
 *
 *   mpi-mixed [LARGE_BYTES] [ROUNDS]
 *       rank 0 prints "mpi-mixed: N ranks, R rounds, all results ok"
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "watchdog.h"

enum { kSmall = 4 }; /* ints a small call sends each peer: far below AAPC_MPI_MIN_BLOCK */

static int value(int s, int d, int k, int call) { return s * 100003 + d * 1009 + k * 7 + call * 131; }

static void pause_ms(int ms) {
  const struct timespec t = {ms / 1000, (long)(ms % 1000) * 1000000L};
  nanosleep(&t, NULL);
}

/* One all-to-all's buffers: `ints` ints to every peer (alltoallv: ints + (s + d) % 3, so the
 * counts differ by pair). */
struct call {
  int id, ints, v;
  int *s, *r, *sc, *sd, *rc, *rd;
};

static void prepare(struct call* c, int id, int ints, int v, int me, int n) {
  c->id = id, c->ints = ints, c->v = v;
  c->sc = malloc(4 * (size_t)n * sizeof(int));
  c->sd = c->sc + n, c->rc = c->sd + n, c->rd = c->rc + n;
  int sat = 0, rat = 0;
  for (int p = 0; p < n; ++p) {
    c->sc[p] = v ? ints + (me + p) % 3 : ints, c->sd[p] = sat, sat += c->sc[p];
    c->rc[p] = v ? ints + (p + me) % 3 : ints, c->rd[p] = rat, rat += c->rc[p];
  }
  c->s = malloc((size_t)sat * sizeof(int));
  c->r = malloc((size_t)rat * sizeof(int));
  for (int p = 0; p < n; ++p)
    for (int k = 0; k < c->sc[p]; ++k) c->s[c->sd[p] + k] = value(me, p, k, id);
  for (int i = 0; i < rat; ++i) c->r[i] = -1;
}

static void run(struct call* c, MPI_Comm comm, MPI_Request* req) {
  if (c->v && req != NULL)
    MPI_Ialltoallv(c->s, c->sc, c->sd, MPI_INT, c->r, c->rc, c->rd, MPI_INT, comm, req);
  else if (c->v)
    MPI_Alltoallv(c->s, c->sc, c->sd, MPI_INT, c->r, c->rc, c->rd, MPI_INT, comm);
  else if (req != NULL)
    MPI_Ialltoall(c->s, c->ints, MPI_INT, c->r, c->ints, MPI_INT, comm, req);
  else
    MPI_Alltoall(c->s, c->ints, MPI_INT, c->r, c->ints, MPI_INT, comm);
}

static long checked(struct call* c, int me, int n) {
  long wrong = 0;
  for (int p = 0; p < n; ++p)
    for (int k = 0; k < c->rc[p]; ++k) wrong += c->r[c->rd[p] + k] != value(p, me, k, c->id);
  free(c->s), free(c->r), free(c->sc);
  return wrong;
}

static long one_round(int large, int round) {
  MPI_Comm comm = MPI_COMM_WORLD;
  const int fresh = round % 4 < 2;
  if (fresh) {
    MPI_Comm_dup(MPI_COMM_WORLD, &comm);
    MPI_Comm_set_name(comm, round % 2 == 0 ? "mixed-small" : "mixed-large"); /* AAPC_MPI_VERBOSE names it */
  }
  int me = 0, n = 0;
  MPI_Comm_rank(comm, &me);
  MPI_Comm_size(comm, &n);
  const int big = large / (int)sizeof(int);
  struct call first, second, third;
  prepare(&first, 3 * round, round % 2 == 0 ? kSmall : big, round % 2 == 0, me, n);
  prepare(&second, 3 * round + 1, kSmall, 0, me, n);
  prepare(&third, 3 * round + 2, round % 2 == 0 ? kSmall : big, 1, me, n);
  MPI_Request req;
  step_now = "the nonblocking all-to-all";
  run(&first, comm, &req);
  if (me % 2 == 0) {
    step_now = "MPI_Wait at once";
    MPI_Wait(&req, MPI_STATUS_IGNORE);
  } else {
    pause_ms(30);
  }
  step_now = "the blocking MPI_Alltoall";
  run(&second, comm, NULL);
  step_now = "the blocking MPI_Alltoallv";
  run(&third, comm, NULL);
  if (me % 2 != 0) {
    step_now = "MPI_Wait after the blocking calls";
    MPI_Wait(&req, MPI_STATUS_IGNORE);
  }
  const long wrong = checked(&first, me, n) + checked(&second, me, n) + checked(&third, me, n);
  if (fresh) MPI_Comm_free(&comm);
  return wrong;
}

/* A nonblocking all-to-all, then ranks that block in a point-to-point call whose partner sends
 * only once its own wait for the all-to-all returned: rank 0 in MPI_Recv from rank 1 (which
 * sends by MPI_Send), rank 2 in MPI_Probe and MPI_Recv from rank 3 (MPI_Ssend), rank 4 in
 * MPI_Sendrecv with rank 5 (MPI_Sendrecv). The blocked ranks' all-to-all must move while they
 * wait in the MPI (MPI 4.0, 6.12): with MPICH, which has no progress hook, one that waited for
 * its plan (a fresh communicator) or its agreement (a small alltoallv) did not, and the job
 * hung. */
static long blocked_in_p2p(int large, int round) {
  MPI_Comm comm = MPI_COMM_WORLD;
  const int fresh = round % 2 != 0;
  if (fresh) {
    MPI_Comm_dup(MPI_COMM_WORLD, &comm);
    MPI_Comm_set_name(comm, "mixed-p2p");
  }
  int me = 0, n = 0;
  MPI_Comm_rank(comm, &me);
  MPI_Comm_size(comm, &n);
  struct call c;
  prepare(&c, 1000 + round, fresh ? large / (int)sizeof(int) : kSmall, !fresh, me, n);
  MPI_Request req;
  step_now = "the nonblocking all-to-all before the point-to-point calls";
  run(&c, comm, &req);
  const int pair = me / 2, partner = me ^ 1, blocked = me % 2 == 0;
  int got = -1, sent = me * 10 + round;
  MPI_Status st;
  long wrong = 0;
  if (pair <= 2 && partner < n) {
    if (!blocked) {
      step_now = "MPI_Wait before the point-to-point call";
      MPI_Wait(&req, MPI_STATUS_IGNORE);
    }
    step_now = "the point-to-point call";
    if (pair == 0 && blocked) MPI_Recv(&got, 1, MPI_INT, partner, 9, MPI_COMM_WORLD, &st);
    if (pair == 0 && !blocked) MPI_Send(&sent, 1, MPI_INT, partner, 9, MPI_COMM_WORLD);
    if (pair == 1 && blocked) {
      MPI_Probe(partner, 9, MPI_COMM_WORLD, &st);
      MPI_Recv(&got, 1, MPI_INT, st.MPI_SOURCE, st.MPI_TAG, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    }
    if (pair == 1 && !blocked) MPI_Ssend(&sent, 1, MPI_INT, partner, 9, MPI_COMM_WORLD);
    if (pair == 2) MPI_Sendrecv(&sent, 1, MPI_INT, partner, 9, &got, 1, MPI_INT, partner, 9, MPI_COMM_WORLD, &st);
    if (blocked || pair == 2) wrong += got != partner * 10 + round || st.MPI_SOURCE != partner;
  }
  step_now = "MPI_Wait after the point-to-point calls";
  if (req != MPI_REQUEST_NULL) MPI_Wait(&req, MPI_STATUS_IGNORE);
  wrong += checked(&c, me, n);
  if (fresh) MPI_Comm_free(&comm);
  return wrong;
}

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int me = 0, n = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &me);
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  const int large = argc > 1 ? atoi(argv[1]) : 65536;
  const int rounds = argc > 2 ? atoi(argv[2]) : 8;
  if (large < (int)sizeof(int) || rounds < 1) {
    if (me == 0) fprintf(stderr, "usage: mpi-mixed [LARGE_BYTES] [ROUNDS]\n");
    MPI_Finalize();
    return 2;
  }
  start_watchdog("mpi-mixed", me);
  long wrong = 0;
  for (int round = 0; round < rounds; ++round) {
    round_now = round;
    wrong += one_round(large, round);
    wrong += blocked_in_p2p(large, round);
  }
  alarm(0);
  long all = 0;
  MPI_Allreduce(&wrong, &all, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
  if (me == 0) {
    if (all == 0)
      printf("mpi-mixed: %d ranks, %d rounds, all results ok\n", n, rounds);
    else
      printf("mpi-mixed: %ld wrong values\n", all);
  }
  MPI_Finalize();
  return all == 0 ? 0 : 1;
}

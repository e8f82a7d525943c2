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
 * A rank that waits longer than the watchdog (WATCHDOG_S, default 60) says where it hangs and
 * exits with status 3, so a hang fails the job rather than its launcher's timeout.
 *
 *   mpi-nonblocking [BLOCK_BYTES] [ROUNDS]
 *       rank 0 prints "mpi-nonblocking: N ranks, R rounds, all results ok"
 */
#include <mpi.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static volatile sig_atomic_t round_now = -1;
static volatile const char* step_now = "starting";
static int me_world = 0;

static void hung(int sig) {
  (void)sig;
  char text[200];
  const int n = snprintf(text, sizeof text, "mpi-nonblocking: rank %d HUNG in round %d at %s (watchdog)\n", me_world, (int)round_now, (const char*)step_now);
  if (n > 0) (void)!write(2, text, (size_t)n);
  _exit(3);
}

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

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int n = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &me_world);
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  const int block = argc > 1 ? atoi(argv[1]) : 4096;
  const int rounds = argc > 2 ? atoi(argv[2]) : 6;
  const char* limit = getenv("WATCHDOG_S");
  signal(SIGALRM, hung);
  alarm(limit != NULL ? (unsigned)atoi(limit) : 60U);
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
  }
  alarm(0);
  long all = 0;
  MPI_Allreduce(&wrong, &all, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
  if (me_world == 0) printf("mpi-nonblocking: %d ranks, %d rounds, %s (%ld wrong values)\n", n, rounds, all == 0 ? "all results ok" : "WRONG", all);
  free(b.s), free(b.r), free(b.gather), free(b.bcast), free(b.scounts);
  MPI_Finalize();
  return all == 0 ? 0 : 1;
}

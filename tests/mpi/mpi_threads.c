/* mpi-threads: an ordinary MPI_THREAD_MULTIPLE program (nothing of aapc in it) whose two
 * threads each run MPI_Alltoall on a communicator of their own, in opposite orders on even and
 * odd ranks: an even rank's first thread starts on `a` and its second on `b` 200 ms later, an
 * odd rank's the other way round. MPI allows it: each communicator sees one call per rank.
 * With libaapc-mpi a leader waited for its daemon's word in one request, holding the process's
 * lock and its connection to the daemon, so the thread that should start the peers' other
 * exchange could not: every call failed at the daemons' deadline.
 *
 * With `nonblocking`, each call is an MPI_Ialltoall and its MPI_Wait.
 *
 *   mpi-threads [BLOCK_BYTES] [ROUNDS] [nonblocking]
 *                                        rank 0 prints "mpi-threads: N ranks, all calls ok"
 */
#include <mpi.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

struct call {
  MPI_Comm comm;
  size_t block;
  int delay_ms, rounds, ok;
};

static int nonblocking = 0; /* MPI_Ialltoall and MPI_Wait in place of MPI_Alltoall */

static unsigned char value(int s, int d, size_t k, int salt) { return (unsigned char)(s * 131 + d * 31 + k * 7 + salt * 17 + 1); }

static void* run(void* arg) {
  struct call* c = arg;
  int me = 0, n = 0;
  MPI_Comm_rank(c->comm, &me);
  MPI_Comm_size(c->comm, &n);
  unsigned char* s = malloc((size_t)n * c->block);
  unsigned char* r = malloc((size_t)n * c->block);
  if (s == NULL || r == NULL) MPI_Abort(MPI_COMM_WORLD, 1);
  const struct timespec pause = {c->delay_ms / 1000, (long)(c->delay_ms % 1000) * 1000000L};
  nanosleep(&pause, NULL);
  for (int round = 0; round < c->rounds; ++round) {
    for (int d = 0; d < n; ++d)
      for (size_t k = 0; k < c->block; ++k) s[(size_t)d * c->block + k] = value(me, d, k, round);
    if (nonblocking) {
      MPI_Request req;
      if (MPI_Ialltoall(s, (int)c->block, MPI_BYTE, r, (int)c->block, MPI_BYTE, c->comm, &req) != MPI_SUCCESS ||
          MPI_Wait(&req, MPI_STATUS_IGNORE) != MPI_SUCCESS)
        c->ok = 0;
    } else if (MPI_Alltoall(s, (int)c->block, MPI_BYTE, r, (int)c->block, MPI_BYTE, c->comm) != MPI_SUCCESS) {
      c->ok = 0;
    }
    for (int src = 0; src < n; ++src)
      for (size_t k = 0; k < c->block; ++k) c->ok &= r[(size_t)src * c->block + k] == value(src, me, k, round);
  }
  free(s);
  free(r);
  return NULL;
}

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  int me = 0, n = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &me);
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  if (provided < MPI_THREAD_MULTIPLE) {
    if (me == 0) printf("mpi-threads: the MPI gives thread level %d, not MPI_THREAD_MULTIPLE\n", provided);
    MPI_Finalize();
    return 2;
  }
  const size_t block = argc > 1 ? (size_t)atol(argv[1]) : 65536;
  const int rounds = argc > 2 ? atoi(argv[2]) : 2;
  nonblocking = argc > 3 && strcmp(argv[3], "nonblocking") == 0;
  MPI_Comm a, b;
  MPI_Comm_dup(MPI_COMM_WORLD, &a);
  MPI_Comm_dup(MPI_COMM_WORLD, &b);
  /* One call on each first, from this thread, so that both threads' calls find their
   * communicators' plans made (making one is a collective of its own). */
  struct call first[2] = {{a, block, 0, 1, 1}, {b, block, 0, 1, 1}};
  run(&first[0]);
  run(&first[1]);
  const int even = me % 2 == 0;
  struct call calls[2] = {{a, block, even ? 0 : 200, rounds, 1}, {b, block, even ? 200 : 0, rounds, 1}};
  pthread_t threads[2];
  for (int i = 0; i < 2; ++i) pthread_create(&threads[i], NULL, run, &calls[i]);
  for (int i = 0; i < 2; ++i) pthread_join(threads[i], NULL);
  int ok = first[0].ok & first[1].ok & calls[0].ok & calls[1].ok, all = 0;
  MPI_Allreduce(&ok, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  if (me == 0) printf("mpi-threads: %d ranks, %s\n", n, all ? "all calls ok" : "WRONG");
  MPI_Comm_free(&a);
  MPI_Comm_free(&b);
  MPI_Finalize();
  return all ? 0 : 1;
}

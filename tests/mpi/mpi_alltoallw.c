/* mpi-alltoallw: an ordinary MPI program (nothing of aapc in it) whose MPI_Alltoallw has a
 * datatype of its own for every peer, on each side: ints or doubles by pair, contiguous or
 * strided (a vector of stride 2 on the sending side, 3 on the receiving one), counts that
 * differ by pair (some zero), byte displacements. Every received value is checked, and the
 * gaps between strided elements must stay untouched. Each round runs it blocking and as
 * MPI_Ialltoallw, and an in-place MPI_Alltoallw whose types include one of size zero.
 *
 *   mpi-alltoallw [ROUNDS]    rank 0 prints "mpi-alltoallw: N ranks, R rounds, all values ok"
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { kRegion = 128 }; /* bytes per peer: 4 doubles at stride 3 fit */

static double value(int s, int d, int k, int round) { return s * 1000.0 + d * 10.0 + k + round * 0.5; }
static int elements(int s, int d) { return (s * d) % 5 == 4 ? 0 : 1 + (s + 2 * d) % 4; }
static MPI_Datatype basic(int s, int d) { return (s + d) % 2 == 0 ? MPI_INT : MPI_DOUBLE; }

/* The datatype of pair (s, d) on one side: `peer` odd makes it strided by `stride`. */
static MPI_Datatype side_type(int s, int d, int peer, int stride, int* count) {
  MPI_Datatype t = basic(s, d);
  *count = elements(s, d);
  if (peer % 2 == 0 || *count == 0) return t;
  MPI_Datatype v;
  MPI_Type_vector(*count, 1, stride, t, &v);
  MPI_Type_commit(&v);
  *count = 1;
  return v;
}

static void put(unsigned char* region, MPI_Datatype t, int stride, int k, double x) {
  if (t == MPI_INT)
    ((int*)region)[k * stride] = (int)(x * 2);
  else
    ((double*)region)[k * stride] = x;
}

static int same(const unsigned char* region, MPI_Datatype t, int stride, int k, double x) {
  return t == MPI_INT ? ((const int*)region)[k * stride] == (int)(x * 2) : ((const double*)region)[k * stride] == x;
}

/* The types of one side made for the call, freed through copies of their handles: the arrays
 * of a nonblocking call stay as they were until it is over. */
static void free_types(int n, const MPI_Datatype* t) {
  for (int p = 0; p < n; ++p) {
    MPI_Datatype copy = t[p];
    if (copy != MPI_INT && copy != MPI_DOUBLE) MPI_Type_free(&copy);
  }
}

/* With `nonblocking`, MPI_Ialltoallw: the types are freed as soon as the call returns (the call
 * keeps what it uses, MPI 4.0 5.1.5), and odd ranks test until it is over, even ones wait. */
static long one_round(MPI_Comm comm, int round, int nonblocking) {
  int me = 0, n = 0;
  MPI_Comm_rank(comm, &me);
  MPI_Comm_size(comm, &n);
  unsigned char* s = malloc((size_t)n * kRegion);
  unsigned char* r = malloc((size_t)n * kRegion);
  int* args = malloc(sizeof(int) * 4 * (size_t)n);
  MPI_Datatype* types = malloc(sizeof(MPI_Datatype) * 2 * (size_t)n);
  if (s == NULL || r == NULL || args == NULL || types == NULL) MPI_Abort(MPI_COMM_WORLD, 1);
  int *sc = args, *sd = args + n, *rc = args + 2 * n, *rd = args + 3 * n;
  MPI_Datatype *st = types, *rt = types + n;
  memset(s, 0, (size_t)n * kRegion);
  memset(r, 0xee, (size_t)n * kRegion);
  for (int p = 0; p < n; ++p) {
    st[p] = side_type(me, p, p, 2, &sc[p]);
    rt[p] = side_type(p, me, p, 3, &rc[p]);
    sd[p] = rd[p] = p * kRegion;
    const int stride = p % 2 != 0 ? 2 : 1;
    for (int k = 0; k < elements(me, p); ++k) put(s + sd[p], basic(me, p), stride, k, value(me, p, k, round));
  }
  if (nonblocking) {
    MPI_Request req;
    MPI_Ialltoallw(s, sc, sd, st, r, rc, rd, rt, comm, &req);
    free_types(n, st);
    free_types(n, rt);
    if (me % 2 != 0) {
      int flag = 0;
      while (!flag) MPI_Test(&req, &flag, MPI_STATUS_IGNORE);
    } else {
      MPI_Wait(&req, MPI_STATUS_IGNORE);
    }
  } else {
    MPI_Alltoallw(s, sc, sd, st, r, rc, rd, rt, comm);
    free_types(n, st);
    free_types(n, rt);
  }
  long wrong = 0;
  for (int p = 0; p < n; ++p) {
    const int stride = p % 2 != 0 ? 3 : 1, size = basic(p, me) == MPI_INT ? 4 : 8;
    for (int k = 0; k < elements(p, me); ++k) wrong += !same(r + rd[p], basic(p, me), stride, k, value(p, me, k, round));
    if (stride == 3) /* the gaps between strided elements */
      for (int k = 0; k + 1 < elements(p, me); ++k)
        for (int b = size; b < 3 * size; ++b) wrong += r[rd[p] + k * 3 * size + b] != 0xee;
  }
  free(s), free(r), free(args), free(types);
  return wrong;
}

/* MPI_IN_PLACE, each peer's block one element of a contiguous type of (me + p) % 4 ints, as
 * MPICH's alltoallw2 does: a type of zero ints (size 0) where me + p is a multiple of 4. What
 * was sent to p is replaced by what p sent. */
static long in_place_round(MPI_Comm comm, int round) {
  int me = 0, n = 0;
  MPI_Comm_rank(comm, &me);
  MPI_Comm_size(comm, &n);
  int* r = malloc(sizeof(int) * 4 * (size_t)n);
  int* args = malloc(sizeof(int) * 2 * (size_t)n);
  MPI_Datatype* types = malloc(sizeof(MPI_Datatype) * (size_t)n);
  if (r == NULL || args == NULL || types == NULL) MPI_Abort(MPI_COMM_WORLD, 1);
  int *counts = args, *displs = args + n;
  for (int p = 0; p < n; ++p) {
    MPI_Type_contiguous((me + p) % 4, MPI_INT, &types[p]);
    MPI_Type_commit(&types[p]);
    counts[p] = 1;
    displs[p] = p * 4 * (int)sizeof(int);
    for (int k = 0; k < 4; ++k) r[p * 4 + k] = (int)(value(me, p, k, round) * 2);
  }
  MPI_Alltoallw(MPI_IN_PLACE, NULL, NULL, NULL, r, counts, displs, types, comm);
  long wrong = 0;
  for (int p = 0; p < n; ++p) {
    for (int k = 0; k < 4; ++k) /* beyond the block: untouched */
      wrong += r[p * 4 + k] != (int)(value(k < (me + p) % 4 ? p : me, k < (me + p) % 4 ? me : p, k, round) * 2);
    MPI_Type_free(&types[p]);
  }
  free(r), free(args), free(types);
  return wrong;
}

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int me = 0, n = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &me);
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  const int rounds = argc > 1 ? atoi(argv[1]) : 3;
  MPI_Comm dup;
  MPI_Comm_dup(MPI_COMM_WORLD, &dup);
  MPI_Comm_set_name(dup, "alltoallw"); /* AAPC_MPI_VERBOSE names it */
  MPI_Comm idup;                        /* MPI_Ialltoallw's alone */
  MPI_Comm_dup(MPI_COMM_WORLD, &idup);
  MPI_Comm_set_name(idup, "w-nonblocking");
  long wrong = 0;
  for (int round = 0; round < rounds; ++round) {
    wrong += one_round(round % 2 != 0 ? MPI_COMM_WORLD : dup, round, 0);
    wrong += one_round(idup, round, 1);
    wrong += in_place_round(round % 2 != 0 ? dup : MPI_COMM_WORLD, round);
  }
  long all = 0;
  MPI_Allreduce(&wrong, &all, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
  if (me == 0) printf("mpi-alltoallw: %d ranks, %d rounds, %s (%ld wrong)\n", n, rounds, all == 0 ? "all values ok" : "WRONG", all);
  MPI_Comm_free(&dup);
  MPI_Comm_free(&idup);
  MPI_Finalize();
  return all == 0 ? 0 : 1;
}

/* mpi-check: an ordinary MPI program (nothing of aapc in it) that calls MPI_Alltoall and
 * MPI_Alltoallv the ways applications do, on the world and on derived communicators, and
 * checks every value it receives. The cluster suite runs it with and without libaapc-mpi.so.
 *
 *   mpi-check [BLOCK_BYTES]     exit status 0 when every case received what it should
 */
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int failures = 0;

/* The byte that world rank s sends to world rank d at offset k. */
static unsigned char value(int s, int d, size_t k) { return (unsigned char)(s * 131 + d * 31 + k * 7 + (k >> 8) + 1); }

static void expect(const char* name, int ok, MPI_Comm comm) {
  int all = 0, me = 0;
  MPI_Allreduce(&ok, &all, 1, MPI_INT, MPI_MIN, comm);
  MPI_Comm_rank(MPI_COMM_WORLD, &me);
  if (!all) ++failures;
  if (me == 0 || !all) printf("mpi-check: %-32s %s\n", name, all ? "ok" : "WRONG");
}

/* An all-to-all of `block` bytes per rank on `comm`: its buffers, filled, and their check. */
struct bytes_case {
  MPI_Comm comm;
  int n, wme;
  size_t block;
  int* world; /* world rank of each comm rank */
  unsigned char *s, *r;
};

static struct bytes_case bytes_begin(MPI_Comm comm, size_t block) {
  struct bytes_case c = {comm, 0, 0, block, NULL, NULL, NULL};
  MPI_Comm_size(comm, &c.n);
  MPI_Comm_rank(MPI_COMM_WORLD, &c.wme);
  c.world = malloc(sizeof(int) * (size_t)c.n);
  MPI_Allgather(&c.wme, 1, MPI_INT, c.world, 1, MPI_INT, comm);
  c.s = malloc((size_t)c.n * block + 1);
  c.r = calloc((size_t)c.n * block + 1, 1);
  for (int d = 0; d < c.n; ++d)
    for (size_t k = 0; k < block; ++k) c.s[(size_t)d * block + k] = value(c.wme, c.world[d], k);
  return c;
}

/* Whether every received byte is right; the case's buffers are freed. */
static int bytes_ok(struct bytes_case* c) {
  int ok = 1;
  for (int src = 0; src < c->n; ++src)
    for (size_t k = 0; k < c->block; ++k) ok &= c->r[(size_t)src * c->block + k] == value(c->world[src], c->wme, k);
  free(c->world), free(c->s), free(c->r);
  return ok;
}

static void bytes_end(const char* name, struct bytes_case* c) {
  const MPI_Comm comm = c->comm;
  expect(name, bytes_ok(c), comm);
}

/* MPI_Alltoall of `block` bytes on `comm`, every byte checked. */
static void alltoall_bytes(const char* name, MPI_Comm comm, size_t block) {
  struct bytes_case c = bytes_begin(comm, block);
  MPI_Alltoall(c.s, (int)block, MPI_BYTE, c.r, (int)block, MPI_BYTE, comm);
  bytes_end(name, &c);
}

/* MPI_Ialltoall(v) as programs overlap them: two in flight on two communicators, collected
 * together; one polled with MPI_Test; one under a blocking all-to-all on the same
 * communicator; one whose communicator is freed before it completes; MPI_Waitany/Waitsome. */
static void nonblocking(size_t block) {
  MPI_Comm a, b;
  MPI_Comm_dup(MPI_COMM_WORLD, &a);
  MPI_Comm_dup(MPI_COMM_WORLD, &b);
  MPI_Comm_set_name(a, "ialltoall-a"); /* AAPC_MPI_VERBOSE names it */
  MPI_Comm_set_name(b, "ialltoall-b");
  MPI_Status statuses[2];
  struct bytes_case x = bytes_begin(a, block), y = bytes_begin(b, block * 2);
  MPI_Request two[2];
  MPI_Ialltoall(x.s, (int)block, MPI_BYTE, x.r, (int)block, MPI_BYTE, a, &two[0]);
  MPI_Ialltoall(y.s, (int)block * 2, MPI_BYTE, y.r, (int)block * 2, MPI_BYTE, b, &two[1]);
  MPI_Waitall(2, two, statuses);
  expect("MPI_Ialltoall, two at once", two[0] == MPI_REQUEST_NULL && two[1] == MPI_REQUEST_NULL, a);
  bytes_end("MPI_Ialltoall, first of two", &x);
  bytes_end("MPI_Ialltoall, second of two", &y);

  x = bytes_begin(a, block);
  MPI_Request one;
  MPI_Ialltoall(x.s, (int)block, MPI_BYTE, x.r, (int)block, MPI_BYTE, a, &one);
  long polls = 0;
  for (int flag = 0; !flag; ++polls) MPI_Test(&one, &flag, MPI_STATUS_IGNORE);
  bytes_end("MPI_Ialltoall, MPI_Test", &x);

  x = bytes_begin(a, block);
  y = bytes_begin(a, block);
  MPI_Ialltoall(x.s, (int)block, MPI_BYTE, x.r, (int)block, MPI_BYTE, a, &one);
  MPI_Alltoall(y.s, (int)block, MPI_BYTE, y.r, (int)block, MPI_BYTE, a);
  MPI_Wait(&one, MPI_STATUS_IGNORE);
  bytes_end("MPI_Ialltoall under MPI_Alltoall", &x);
  bytes_end("MPI_Alltoall over MPI_Ialltoall", &y);

  MPI_Comm freed;
  MPI_Comm_dup(MPI_COMM_WORLD, &freed);
  x = bytes_begin(freed, block);
  MPI_Ialltoall(x.s, (int)block, MPI_BYTE, x.r, (int)block, MPI_BYTE, freed, &one);
  x.comm = MPI_COMM_WORLD;  /* for the check's vote */
  MPI_Comm_free(&freed);
  MPI_Wait(&one, MPI_STATUS_IGNORE);
  bytes_end("MPI_Ialltoall, its comm freed", &x);

  x = bytes_begin(a, block);
  y = bytes_begin(b, block);
  MPI_Ialltoall(x.s, (int)block, MPI_BYTE, x.r, (int)block, MPI_BYTE, a, &two[0]);
  MPI_Ialltoall(y.s, (int)block, MPI_BYTE, y.r, (int)block, MPI_BYTE, b, &two[1]);
  int index = -1, outcount = 0, indices[2];
  MPI_Waitany(2, two, &index, MPI_STATUS_IGNORE);
  MPI_Waitsome(2, two, &outcount, indices, statuses);
  expect("MPI_Waitany, then MPI_Waitsome", index >= 0 && outcount == 1 && indices[0] == 1 - index, a);
  bytes_end("MPI_Ialltoall by MPI_Waitany", &x);
  bytes_end("MPI_Ialltoall by MPI_Waitsome", &y);
  MPI_Comm_free(&a), MPI_Comm_free(&b);
}

/* A communicator's first MPI_Ialltoall returns at once, as MPI requires of every nonblocking
 * call, although the library has yet to learn where the communicator's ranks are: even world
 * ranks start it and then enter a collective on another communicator, odd ranks enter that
 * collective first (legal: MPI 4.0, 6.12). A barrier, and an MPI_Alltoall of a communicator
 * that has had one before. (Not another communicator's first: Open MPI 4.1 hangs in two
 * communicator creations pending in opposite orders, docs/mpi.md.) */
static void first_call_nonblocking(size_t block) {
  int me = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &me);
  for (int blocking_alltoall = 0; blocking_alltoall < 2; ++blocking_alltoall) {
    MPI_Comm fresh, other;
    MPI_Comm_dup(MPI_COMM_WORLD, &fresh);
    MPI_Comm_dup(MPI_COMM_WORLD, &other);
    if (blocking_alltoall) alltoall_bytes("an MPI_Alltoall before", other, block);
    struct bytes_case x = bytes_begin(fresh, block), y = bytes_begin(other, block);
    MPI_Request req;
    for (int turn = 0; turn < 2; ++turn) {
      if (turn == me % 2) MPI_Ialltoall(x.s, (int)block, MPI_BYTE, x.r, (int)block, MPI_BYTE, fresh, &req);
      else if (blocking_alltoall) MPI_Alltoall(y.s, (int)block, MPI_BYTE, y.r, (int)block, MPI_BYTE, other);
      else MPI_Barrier(other);
    }
    MPI_Wait(&req, MPI_STATUS_IGNORE);
    bytes_end(blocking_alltoall ? "first MPI_Ialltoall, an MPI_Alltoall in two orders" : "first MPI_Ialltoall, a barrier in two orders", &x);
    if (blocking_alltoall) bytes_end("... the other communicator's MPI_Alltoall", &y);
    else free(y.world), free(y.s), free(y.r);
    MPI_Comm_free(&fresh), MPI_Comm_free(&other);
  }
}

/* One int per rank (the counts exchange before an alltoallv), then that alltoallv with
 * uneven counts, zero counts and gaps between the blocks. */
/* Every rank starts an MPI_Ialltoall; world rank 0 then waits in MPI_Recv for the last rank,
 * which sends once its own MPI_Wait has returned. The all-to-all must move while rank 0 sits in
 * MPI_Recv, as Open MPI's own do. With MPICH and libaapc-mpi it moves on the leader's progress
 * thread, which single-copy hand-overs allow: not with AAPC_MPI_HANDOVER=mpi (skipped there). */
static void progress_in_recv(size_t block) {
#ifndef OPEN_MPI
  const char* how = getenv("AAPC_MPI_HANDOVER");
  if (how != NULL && strcmp(how, "mpi") == 0) return;
#endif
  int me = 0, n = 0, token = 7;
  MPI_Comm_rank(MPI_COMM_WORLD, &me);
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  struct bytes_case x = bytes_begin(MPI_COMM_WORLD, block);
  MPI_Request req;
  MPI_Ialltoall(x.s, (int)block, MPI_BYTE, x.r, (int)block, MPI_BYTE, MPI_COMM_WORLD, &req);
  if (me == 0) MPI_Recv(&token, 1, MPI_INT, n - 1, 77, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
  MPI_Wait(&req, MPI_STATUS_IGNORE);
  if (me == n - 1) MPI_Send(&token, 1, MPI_INT, 0, 77, MPI_COMM_WORLD);
  bytes_end("MPI_Ialltoall moves in MPI_Recv", &x);
}

/* Every rank starts an MPI_Ialltoall; world rank 0 then computes for 2 s without calling MPI
 * (a sleep stands for it), the others wait at once. How long the slowest of them waited is
 * printed: an all-to-all that moves only inside MPI calls keeps them waiting for rank 0's
 * computation, one that moves on its own (libaapc-mpi's progress thread) does not. The cluster
 * suite reads the figure where the library runs with single-copy hand-overs. */
static void progress_while_computing(size_t block) {
  int me = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &me);
  struct bytes_case x = bytes_begin(MPI_COMM_WORLD, block);
  MPI_Barrier(MPI_COMM_WORLD);
  MPI_Request req;
  const double t0 = MPI_Wtime();
  MPI_Ialltoall(x.s, (int)block, MPI_BYTE, x.r, (int)block, MPI_BYTE, MPI_COMM_WORLD, &req);
  if (me == 0) sleep(2);
  MPI_Wait(&req, MPI_STATUS_IGNORE);
  double waited = me == 0 ? 0 : MPI_Wtime() - t0, most = 0;
  MPI_Reduce(&waited, &most, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
  if (me == 0) printf("mpi-check: while rank 0 computed for 2000 ms, the others waited at most %.0f ms\n", most * 1e3);
  bytes_end("MPI_Ialltoall while rank 0 computes", &x);
}

static void counts_then_alltoallv(MPI_Comm comm, int nonblocking) {
  int n = 0, me = 0;
  MPI_Comm_size(comm, &n);
  MPI_Comm_rank(comm, &me);
  int *sc = malloc(sizeof(int) * (size_t)n), *rc = malloc(sizeof(int) * (size_t)n);
  int *sd = malloc(sizeof(int) * (size_t)n), *rd = malloc(sizeof(int) * (size_t)n);
  for (int d = 0; d < n; ++d) sc[d] = ((me + d) % 3) * 100 + (d == me ? 7 : 0);
  MPI_Alltoall(sc, 1, MPI_INT, rc, 1, MPI_INT, comm);
  int ok = 1;
  for (int s = 0; s < n; ++s) ok &= rc[s] == ((s + me) % 3) * 100 + (s == me ? 7 : 0);
  expect("alltoall of one int", ok, comm);
  int st = 0, rt = 0;
  for (int d = 0; d < n; ++d) sd[d] = st, st += sc[d] + 5, rd[d] = rt, rt += rc[d] + 3;
  unsigned char* s = malloc((size_t)st + 1);
  unsigned char* r = calloc((size_t)rt + 1, 1);
  for (int d = 0; d < n; ++d)
    for (int k = 0; k < sc[d]; ++k) s[sd[d] + k] = value(me, d, (size_t)k);
  if (nonblocking) {
    MPI_Request req;
    MPI_Ialltoallv(s, sc, sd, MPI_BYTE, r, rc, rd, MPI_BYTE, comm, &req);
    MPI_Wait(&req, MPI_STATUS_IGNORE);
  } else {
    MPI_Alltoallv(s, sc, sd, MPI_BYTE, r, rc, rd, MPI_BYTE, comm);
  }
  ok = 1;
  for (int src = 0; src < n; ++src) {
    for (int k = 0; k < rc[src]; ++k) ok &= r[rd[src] + k] == value(src, me, (size_t)k);
    for (int k = rc[src]; k < rc[src] + 3; ++k) ok &= r[rd[src] + k] == 0; /* the gaps stay untouched */
  }
  expect(nonblocking ? "ialltoallv, uneven and zero counts" : "alltoallv, uneven and zero counts", ok, comm);
  free(sc), free(rc), free(sd), free(rd), free(s), free(r);
}

static void in_place(MPI_Comm comm) {
  int n = 0, me = 0;
  MPI_Comm_size(comm, &n);
  MPI_Comm_rank(comm, &me);
  long* b = malloc(sizeof(long) * 3 * (size_t)n);
  for (int d = 0; d < n; ++d)
    for (int k = 0; k < 3; ++k) b[3 * d + k] = 1000L * me + 10L * d + k;
  MPI_Alltoall(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, b, 3, MPI_LONG, comm);
  int ok = 1;
  for (int s = 0; s < n; ++s)
    for (int k = 0; k < 3; ++k) ok &= b[3 * s + k] == 1000L * s + 10L * me + k;
  expect("MPI_IN_PLACE, MPI_LONG", ok, comm);
  free(b);
}

/* A strided datatype on the send side (every other double), contiguous on the receive side. */
static void derived(MPI_Comm comm) {
  int n = 0, me = 0;
  MPI_Comm_size(comm, &n);
  MPI_Comm_rank(comm, &me);
  MPI_Datatype strided, every_other;
  MPI_Type_vector(4, 1, 2, MPI_DOUBLE, &strided);
  MPI_Type_create_resized(strided, 0, 8 * sizeof(double), &every_other);
  MPI_Type_commit(&every_other);
  double* s = malloc(sizeof(double) * 8 * (size_t)n);
  double* r = calloc(4 * (size_t)n, sizeof(double));
  for (int d = 0; d < n; ++d)
    for (int k = 0; k < 8; ++k) s[8 * d + k] = k % 2 ? -1.0 : me * 100.0 + d + k / 2 * 0.25;
  MPI_Alltoall(s, 1, every_other, r, 4, MPI_DOUBLE, comm);
  int ok = 1;
  for (int src = 0; src < n; ++src)
    for (int k = 0; k < 4; ++k) ok &= r[4 * src + k] == src * 100.0 + me + k * 0.25;
  expect("derived datatype (strided)", ok, comm);
  MPI_Type_free(&every_other), MPI_Type_free(&strided);
  free(s), free(r);
}

/* A contiguous type made of a parameterized predefined type (MPI_Type_create_f90_real, as
 * Fortran's REAL(KIND=...) gives): the library must not free what MPI_Type_get_contents
 * returns for it, a predefined type whose combiner is not MPI_COMBINER_NAMED. */
static void f90_based(MPI_Comm comm) {
  int n = 0, me = 0;
  MPI_Comm_size(comm, &n);
  MPI_Comm_rank(comm, &me);
  MPI_Datatype real8, four;
  MPI_Type_create_f90_real(15, MPI_UNDEFINED, &real8);
  MPI_Type_contiguous(4, real8, &four);
  MPI_Type_commit(&four);
  double* s = malloc(sizeof(double) * 4 * (size_t)n);
  double* r = calloc(4 * (size_t)n, sizeof(double));
  for (int d = 0; d < n; ++d)
    for (int k = 0; k < 4; ++k) s[4 * d + k] = me * 100.0 + d + k * 0.25;
  MPI_Alltoall(s, 1, four, r, 1, four, comm);
  int ok = 1;
  for (int src = 0; src < n; ++src)
    for (int k = 0; k < 4; ++k) ok &= r[4 * src + k] == src * 100.0 + me + k * 0.25;
  expect("derived datatype of an f90 real", ok, comm);
  MPI_Type_free(&four);
  free(s), free(r);
}

/* MPI_Ialltoall with derived datatypes that the program frees at once, before MPI_Wait, and
 * then makes other datatypes (which may take the freed ones' handles): legal, as a pending
 * call keeps what it uses (MPI 4.0, 5.1.5). On a communicator whose first call it is (the
 * library packs once its plan is made) and on one that has had calls. */
static void derived_freed_early(MPI_Comm comm, const char* name) {
  int n = 0, me = 0;
  MPI_Comm_size(comm, &n);
  MPI_Comm_rank(comm, &me);
  MPI_Datatype strided, every_other, strided2, every_other2, decoy, decoy2;
  MPI_Type_vector(4, 1, 2, MPI_DOUBLE, &strided);
  MPI_Type_create_resized(strided, 0, 8 * sizeof(double), &every_other);
  MPI_Type_commit(&every_other);
  MPI_Type_vector(4, 1, 2, MPI_DOUBLE, &strided2);
  MPI_Type_create_resized(strided2, 0, 8 * sizeof(double), &every_other2);
  MPI_Type_commit(&every_other2);
  double* s = malloc(sizeof(double) * 8 * (size_t)n);
  double* r = malloc(sizeof(double) * 8 * (size_t)n);
  for (int d = 0; d < n; ++d)
    for (int k = 0; k < 8; ++k) s[8 * d + k] = k % 2 ? -1.0 : me * 100.0 + d + k / 2 * 0.25, r[8 * d + k] = -2.0;
  MPI_Request req;
  MPI_Ialltoall(s, 1, every_other, r, 1, every_other2, comm, &req);
  MPI_Type_free(&every_other), MPI_Type_free(&strided), MPI_Type_free(&every_other2), MPI_Type_free(&strided2);
  MPI_Type_contiguous(8, MPI_DOUBLE, &decoy);
  MPI_Type_commit(&decoy);
  MPI_Type_contiguous(3, MPI_INT, &decoy2);
  MPI_Type_commit(&decoy2);
  MPI_Wait(&req, MPI_STATUS_IGNORE);
  int ok = 1;
  for (int src = 0; src < n; ++src)
    for (int k = 0; k < 8; ++k) ok &= r[8 * src + k] == (k % 2 ? -2.0 : src * 100.0 + me + k / 2 * 0.25);
  expect(name, ok, comm);
  MPI_Type_free(&decoy), MPI_Type_free(&decoy2);
  free(s), free(r);
}

/* A datatype that transposes: each block is a 3x3 matrix of ints, sent with a type that lists
 * it column by column (a vector of one int per row, resized to one int, three of them, resized
 * to the matrix). It has no gaps, so its extent and size alone pass it for contiguous; the
 * receiver must get the transpose. And a vector whose stride is its block, which is contiguous. */
static void transposed(MPI_Comm comm) {
  int n = 0, me = 0;
  MPI_Comm_size(comm, &n);
  MPI_Comm_rank(comm, &me);
  MPI_Datatype column, one, columns, matrix_t, rows;
  MPI_Type_vector(3, 1, 3, MPI_INT, &column);
  MPI_Type_create_resized(column, 0, sizeof(int), &one);
  MPI_Type_contiguous(3, one, &columns);
  MPI_Type_create_resized(columns, 0, 9 * sizeof(int), &matrix_t);
  MPI_Type_commit(&matrix_t);
  MPI_Type_vector(3, 3, 3, MPI_INT, &rows);
  MPI_Type_commit(&rows);
  int* s = malloc(sizeof(int) * 9 * (size_t)n);
  int* r = calloc(9 * (size_t)n, sizeof(int));
  int* q = calloc(9 * (size_t)n, sizeof(int));
  for (int d = 0; d < n; ++d)
    for (int k = 0; k < 9; ++k) s[9 * d + k] = 1000 * me + 10 * d + k;
  MPI_Alltoall(s, 1, matrix_t, r, 9, MPI_INT, comm);
  MPI_Alltoall(s, 1, rows, q, 9, MPI_INT, comm);
  int ok = 1, same = 1;
  for (int src = 0; src < n; ++src)
    for (int i = 0; i < 3; ++i)
      for (int j = 0; j < 3; ++j) {
        ok &= r[9 * src + 3 * i + j] == 1000 * src + 10 * me + 3 * j + i;
        same &= q[9 * src + 3 * i + j] == 1000 * src + 10 * me + 3 * i + j;
      }
  expect("derived datatype (transposing)", ok, comm);
  expect("derived datatype (vector, gapless)", same, comm);
  MPI_Type_free(&matrix_t), MPI_Type_free(&columns), MPI_Type_free(&one), MPI_Type_free(&column), MPI_Type_free(&rows);
  free(s), free(r), free(q);
}

/* MPI_Request_get_status polled alone until the call is over (it completes nothing; the
 * program then collects the request with MPI_Wait). At most 30 s, then WRONG. */
static void polled_status(size_t block) {
  struct bytes_case x = bytes_begin(MPI_COMM_WORLD, block);
  MPI_Request r;
  MPI_Ialltoall(x.s, (int)block, MPI_BYTE, x.r, (int)block, MPI_BYTE, MPI_COMM_WORLD, &r);
  int flag = 0;
  MPI_Status status;
  const double t0 = MPI_Wtime();
  while (!flag && MPI_Wtime() - t0 < 30) MPI_Request_get_status(r, &flag, &status);
  expect("MPI_Request_get_status polled alone", flag, MPI_COMM_WORLD);
  if (flag) {
    MPI_Wait(&r, MPI_STATUS_IGNORE);
    bytes_end("... its data came", &x);
  }
  /* A request still running is left (its buffers too): the job fails, and ends at MPI_Finalize. */
}

/* Every machine's k-th rank in one communicator, all of them at once, each with several
 * MPI_Ialltoall in flight: the column communicators of a 2-D decomposition. On each machine
 * every rank leads one, so its daemon runs ranks-per-machine times the calls at once (it
 * refused more than 16). A rank's machine is its processor name (the emulated
 * machines share one host, so MPI_COMM_TYPE_SHARED would join them all). Each call has a
 * block size of its own, so that calls paired wrongly fail. */
static void column_communicators(size_t block) {
  enum { kCalls = 6 };
  int me = 0, n = 0, len = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &me);
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  char name[MPI_MAX_PROCESSOR_NAME] = {0};
  MPI_Get_processor_name(name, &len);
  char* names = malloc((size_t)n * MPI_MAX_PROCESSOR_NAME);
  MPI_Allgather(name, MPI_MAX_PROCESSOR_NAME, MPI_CHAR, names, MPI_MAX_PROCESSOR_NAME, MPI_CHAR, MPI_COMM_WORLD);
  int local = 0;
  for (int r = 0; r < me; ++r) local += strcmp(names + (size_t)r * MPI_MAX_PROCESSOR_NAME, name) == 0;
  free(names);
  MPI_Comm column;
  MPI_Comm_split(MPI_COMM_WORLD, local, me, &column);
  struct bytes_case c[kCalls];
  MPI_Request requests[kCalls];
  MPI_Status statuses[kCalls];
  for (int i = 0; i < kCalls; ++i) c[i] = bytes_begin(column, block + 8 * (size_t)i);
  for (int i = 0; i < kCalls; ++i)
    MPI_Ialltoall(c[i].s, (int)c[i].block, MPI_BYTE, c[i].r, (int)c[i].block, MPI_BYTE, column, &requests[i]);
  MPI_Waitall(kCalls, requests, statuses);
  for (int i = 0; i < kCalls; ++i) {
    char what[64];
    snprintf(what, sizeof what, "every column at once, call %d of %d", i + 1, (int)kCalls);
    bytes_end(what, &c[i]);
  }
  MPI_Comm_free(&column);
}

/* As benchmark suites run it: a communicator of the first k ranks for k = 2, 4, 8, ... and
 * all, while the others wait in MPI_Barrier; in each, blocks of 0 and 1 bytes, `block` and 4 x
 * `block`, each call's bytes checked. */
static void growing_subsets(size_t block) {
  int me = 0, n = 0, ok = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &me);
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  const size_t sizes[] = {0, 1, block, 4 * block};
  for (int k = 2;; k = k * 2 < n ? k * 2 : n) {
    MPI_Comm sub;
    MPI_Comm_split(MPI_COMM_WORLD, me < k ? 0 : MPI_UNDEFINED, me, &sub);
    if (sub != MPI_COMM_NULL) {
      for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; ++i) {
        struct bytes_case c = bytes_begin(sub, sizes[i]);
        MPI_Alltoall(c.s, (int)sizes[i], MPI_BYTE, c.r, (int)sizes[i], MPI_BYTE, sub);
        ok &= bytes_ok(&c);
      }
      MPI_Comm_free(&sub);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    if (k == n) break;
  }
  expect("the first 2, 4, ... ranks, the rest waiting", ok, MPI_COMM_WORLD);
}

/* A communicator of every rank but world rank 0 (MPI_Comm_create), where rank 0 gets
 * MPI_COMM_NULL and takes no part. */
static void all_but_one(size_t block) {
  int me = 0, ok = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &me);
  MPI_Group world, rest;
  MPI_Comm_group(MPI_COMM_WORLD, &world);
  const int first[1] = {0};
  MPI_Group_excl(world, 1, first, &rest);
  MPI_Comm comm;
  MPI_Comm_create(MPI_COMM_WORLD, rest, &comm);
  if (comm != MPI_COMM_NULL) {
    struct bytes_case c = bytes_begin(comm, block);
    MPI_Alltoall(c.s, (int)block, MPI_BYTE, c.r, (int)block, MPI_BYTE, comm);
    ok &= bytes_ok(&c);
    MPI_Comm_free(&comm);
  }
  MPI_Group_free(&rest), MPI_Group_free(&world);
  expect("MPI_Comm_create of all but rank 0", ok, MPI_COMM_WORLD);
}

/* An intercommunicator between the lower and the upper half: the MPI's own all-to-all (aapc
 * carries intracommunicators), each rank's blocks to every rank of the other half. */
static void intercommunicator(size_t block) {
  int me = 0, n = 0, ok = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &me);
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  if (n < 2) return;
  const int low = me < n / 2;
  MPI_Comm half, inter;
  MPI_Comm_split(MPI_COMM_WORLD, low, me, &half);
  MPI_Intercomm_create(half, 0, MPI_COMM_WORLD, low ? n / 2 : 0, 7, &inter);
  int remote = 0;
  MPI_Comm_remote_size(inter, &remote);
  const int base = low ? n / 2 : 0; /* world rank of the other half's rank 0 */
  unsigned char* s = malloc((size_t)remote * block + 1);
  unsigned char* r = calloc((size_t)remote * block + 1, 1);
  for (int d = 0; d < remote; ++d)
    for (size_t k = 0; k < block; ++k) s[(size_t)d * block + k] = value(me, base + d, k);
  MPI_Alltoall(s, (int)block, MPI_BYTE, r, (int)block, MPI_BYTE, inter);
  for (int src = 0; src < remote; ++src)
    for (size_t k = 0; k < block; ++k) ok &= r[(size_t)src * block + k] == value(base + src, me, k);
  free(s), free(r);
  MPI_Comm_free(&inter), MPI_Comm_free(&half);
  expect("an intercommunicator of the halves", ok, MPI_COMM_WORLD);
}

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  size_t block = argc > 1 ? (size_t)strtoull(argv[1], NULL, 10) : 4096;
  int me = 0, n = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &me);
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  alltoall_bytes("MPI_COMM_WORLD", MPI_COMM_WORLD, block);
  counts_then_alltoallv(MPI_COMM_WORLD, 0);
  counts_then_alltoallv(MPI_COMM_WORLD, 1);
  nonblocking(block);
  first_call_nonblocking(block);
  progress_in_recv(block);
  progress_while_computing(block);
  in_place(MPI_COMM_WORLD);
  derived(MPI_COMM_WORLD);
  f90_based(MPI_COMM_WORLD);
  derived_freed_early(MPI_COMM_WORLD, "derived datatypes freed at once");
  MPI_Comm fresh;
  MPI_Comm_dup(MPI_COMM_WORLD, &fresh);
  derived_freed_early(fresh, "... in a communicator's first call");
  MPI_Comm_free(&fresh);
  transposed(MPI_COMM_WORLD);
  polled_status(block);
  column_communicators(block);
  growing_subsets(block);
  all_but_one(block);
  intercommunicator(block);
  MPI_Comm dup, half, parity, row;
  MPI_Comm_dup(MPI_COMM_WORLD, &dup);
  alltoall_bytes("MPI_Comm_dup", dup, block);
  MPI_Comm_split(MPI_COMM_WORLD, me % 2, -me, &parity); /* reversed order within */
  MPI_Comm_set_name(parity, me % 2 ? "parity-odd" : "parity-even"); /* AAPC_MPI_VERBOSE names them */
  alltoall_bytes("MPI_Comm_split (parity)", parity, block);
  MPI_Comm_split(MPI_COMM_WORLD, me < n / 2, me, &half);
  MPI_Comm_set_name(half, me < n / 2 ? "half-low" : "half-high");
  alltoall_bytes("MPI_Comm_split (halves)", half, block);
  /* Both halves at once, each on part of the machines, with nonblocking calls in two orders:
   * each communicator's exchanges are numbered in a group of its own. */
  MPI_Comm other;
  MPI_Comm_split(MPI_COMM_WORLD, me % 2, me, &other);
  struct bytes_case hx = bytes_begin(half, block), ox = bytes_begin(other, block);
  MPI_Request both[2];
  MPI_Status both_statuses[2]; /* not MPI_STATUSES_IGNORE: MPICH's header makes GCC warn of it */
  if (me % 2) {
    MPI_Ialltoall(hx.s, (int)block, MPI_BYTE, hx.r, (int)block, MPI_BYTE, half, &both[0]);
    MPI_Ialltoall(ox.s, (int)block, MPI_BYTE, ox.r, (int)block, MPI_BYTE, other, &both[1]);
  } else {
    MPI_Ialltoall(ox.s, (int)block, MPI_BYTE, ox.r, (int)block, MPI_BYTE, other, &both[1]);
    MPI_Ialltoall(hx.s, (int)block, MPI_BYTE, hx.r, (int)block, MPI_BYTE, half, &both[0]);
  }
  MPI_Waitall(2, both, both_statuses);
  bytes_end("MPI_Ialltoall on a half and on a parity split, started in two orders", &hx);
  bytes_end("... the parity split's", &ox);
  MPI_Comm_free(&other);
  int dims[2] = {0, 0}, periods[2] = {0, 0}, keep[2] = {0, 1};
  MPI_Dims_create(n, 2, dims);
  MPI_Comm cart;
  MPI_Cart_create(MPI_COMM_WORLD, 2, dims, periods, 0, &cart);
  MPI_Cart_sub(cart, keep, &row);
  alltoall_bytes("MPI_Cart_sub (rows)", row, block);
  MPI_Comm_free(&row), MPI_Comm_free(&cart), MPI_Comm_free(&half), MPI_Comm_free(&parity), MPI_Comm_free(&dup);
  if (me == 0) printf("mpi-check: %d ranks, %s\n", n, failures ? "FAILED" : "all cases ok");
  MPI_Finalize();
  return failures ? 1 : 0;
}

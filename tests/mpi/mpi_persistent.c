/* mpi-persistent: an ordinary MPI program (nothing of aapc in it) with MPI-4's persistent
 * all-to-alls: MPI_Alltoall_init, MPI_Alltoallv_init and MPI_Alltoallw_init (MPICH 4), and
 * Open MPI 4.1's MPIX_* (its pcollreq extension), each on a fresh communicator, then started
 * many times: alone and completed by MPI_Wait, polled by MPI_Test, or all at once by
 * MPI_Startall and MPI_Waitall. The alltoall and alltoallv send and receive a derived type
 * of their own, and the alltoallw's odd peers have one, each freed (with the alltoallw's
 * arrays) right after the init: the request keeps what it needs (MPI 4.0, 5.1.9). The send buffer changes before every start;
 * every received value is checked after every start. The handles must stay valid (inactive)
 * after each completion and become MPI_REQUEST_NULL at MPI_Request_free. With MPICH, the
 * alltoall's communicator is freed right after its init, before any start.
 *
 *   mpi-persistent [INTS_PER_RANK] [STARTS]
 *       rank 0 prints "mpi-persistent: N ranks, S starts, all results ok"
 */
#include <mpi.h>
#if defined(OPEN_MPI) && OPEN_MPI
#include <mpi-ext.h>
#define ALLTOALL_INIT MPIX_Alltoall_init
#define ALLTOALLV_INIT MPIX_Alltoallv_init
#define ALLTOALLW_INIT MPIX_Alltoallw_init
#else
#define ALLTOALL_INIT MPI_Alltoall_init
#define ALLTOALLV_INIT MPI_Alltoallv_init
#define ALLTOALLW_INIT MPI_Alltoallw_init
#endif
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void hung(int sig) {
  (void)sig;
  static const char text[] = "mpi-persistent: HUNG (watchdog)\n";
  (void)!write(2, text, sizeof text - 1);
  _exit(3);
}

static int value(int s, int d, int k, int start, int v) { return s * 1000003 + d * 7919 + k * 31 + start * 101 + v * 7; }

/* Ints from rank s to rank d in the alltoallv: they differ by pair (zero for some). */
static int vcount(int s, int d, int block) { return ((s + 2 * d) % 3) * block / 2; }

struct side {
  int *buf, *counts, *displs;
};

enum { kCalls = 3 };

struct call {
  int v;  /* 1: the alltoallv, 2: the alltoallw (the alltoallv's blocks) */
  struct side s, r;
  MPI_Request req;
};

static void layout(struct call* c, int me, int n, int block) {
  int at_s = 0, at_r = 0;
  for (int p = 0; p < n; ++p) {
    c->s.counts[p] = c->v ? vcount(me, p, block) : block;
    c->r.counts[p] = c->v ? vcount(p, me, block) : block;
    c->s.displs[p] = c->v ? at_s + p : p * block; /* a gap of one int between blocks */
    c->r.displs[p] = c->v ? at_r + 2 * p : p * block;
    at_s += c->s.counts[p], at_r += c->r.counts[p];
  }
}

static void fill(struct call* c, int me, int n, int start, int total) {
  for (int d = 0; d < n; ++d)
    for (int k = 0; k < c->s.counts[d]; ++k) c->s.buf[c->s.displs[d] + k] = value(me, d, k, start, c->v);
  for (int i = 0; i < total; ++i) c->r.buf[i] = -1;
}

static long wrong_values(const struct call* c, int me, int n, int start) {
  long wrong = 0;
  for (int s = 0; s < n; ++s)
    for (int k = 0; k < c->r.counts[s]; ++k) wrong += c->r.buf[c->r.displs[s] + k] != value(s, me, k, start, c->v);
  return wrong;
}

static MPI_Datatype decoy[2];

static void make(struct call* c, int v, int n, int block, MPI_Comm comm, int me) {
  const int total = n * block + 2 * n;
  c->v = v;
  c->s.buf = malloc(sizeof(int) * (size_t)total);
  c->r.buf = malloc(sizeof(int) * (size_t)total);
  c->s.counts = malloc(sizeof(int) * 4 * (size_t)n);
  if (c->s.buf == NULL || c->r.buf == NULL || c->s.counts == NULL) MPI_Abort(MPI_COMM_WORLD, 1);
  c->s.displs = c->s.counts + n, c->r.counts = c->s.counts + 2 * n, c->r.displs = c->s.counts + 3 * n;
  layout(c, me, n, block);
  if (v == 2) { /* byte displacements, and a derived type (one int) for odd peers */
    int* bytes = malloc(sizeof(int) * 2 * (size_t)n);
    MPI_Datatype* types = malloc(sizeof(MPI_Datatype) * (size_t)n);
    MPI_Datatype one_int;
    if (bytes == NULL || types == NULL) MPI_Abort(MPI_COMM_WORLD, 1);
    MPI_Type_contiguous(1, MPI_INT, &one_int);
    MPI_Type_commit(&one_int);
    for (int p = 0; p < n; ++p) {
      bytes[p] = c->s.displs[p] * (int)sizeof(int), bytes[n + p] = c->r.displs[p] * (int)sizeof(int);
      types[p] = p % 2 != 0 ? one_int : MPI_INT;
    }
    ALLTOALLW_INIT(c->s.buf, c->s.counts, bytes, types, c->r.buf, c->r.counts, bytes + n, types, comm, MPI_INFO_NULL, &c->req);
    MPI_Type_free(&one_int);
    free(bytes), free(types);
  } else { /* a derived type (one int), freed right after the init: the request keeps it */
    MPI_Datatype one_int;
    MPI_Type_contiguous(1, MPI_INT, &one_int);
    MPI_Type_commit(&one_int);
    if (v)
      ALLTOALLV_INIT(c->s.buf, c->s.counts, c->s.displs, one_int, c->r.buf, c->r.counts, c->r.displs, one_int, comm, MPI_INFO_NULL, &c->req);
    else
      ALLTOALL_INIT(c->s.buf, block, one_int, c->r.buf, block, one_int, comm, MPI_INFO_NULL, &c->req);
    MPI_Type_free(&one_int);
    /* A type made after it may take what it leaves (MPICH hands the handle out again): a call
     * that kept only the handle would use this one. Kept until the end of the program. */
    MPI_Type_contiguous(3, MPI_DOUBLE, &decoy[v]);
    MPI_Type_commit(&decoy[v]);
  }
}

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int me = 0, n = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &me);
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  const int block = argc > 1 ? atoi(argv[1]) : 1024;
  const int starts = argc > 2 ? atoi(argv[2]) : 30;
  signal(SIGALRM, hung);
  alarm(120);
  MPI_Comm comm[kCalls];
  struct call calls[kCalls];
  static const char* const names[kCalls] = {"persistent-alltoall", "persistent-alltoallv", "persistent-alltoallw"};
  for (int v = 0; v < kCalls; ++v) {
    MPI_Comm_dup(MPI_COMM_WORLD, &comm[v]);
    MPI_Comm_set_name(comm[v], names[v]); /* AAPC_MPI_VERBOSE names it */
    make(&calls[v], v, n, block, comm[v], me);
  }
#if !(defined(OPEN_MPI) && OPEN_MPI)
  /* The program may free a communicator once its persistent request is made: the MPI keeps it
   * for the request until MPI_Request_free (MPI 4.0, 6.4.3). MPICH alone does; Open MPI 4.1's
   * own MPIX_* crash so (their requests keep no communicator), so with MPICH only. */
  MPI_Comm_free(&comm[0]);
#endif
  const int total = n * block + 2 * n;
  long wrong = 0, lost = 0;
  for (int i = 0; i < starts; ++i) {
    for (int v = 0; v < kCalls; ++v) fill(&calls[v], me, n, i, total);
    MPI_Status st[kCalls];
    if (i % 3 == 2) { /* all at once */
      MPI_Request all[kCalls];
      for (int v = 0; v < kCalls; ++v) all[v] = calls[v].req;
      MPI_Startall(kCalls, all);
      MPI_Waitall(kCalls, all, st);
      for (int v = 0; v < kCalls; ++v) lost += all[v] != calls[v].req;
    } else {
      for (int v = 0; v < kCalls; ++v) {
        MPI_Request r = calls[v].req;
        MPI_Start(&r);
        int done = 0;
        if (i % 3 == 1)
          while (!done) MPI_Test(&r, &done, &st[0]);
        else
          MPI_Wait(&r, &st[0]);
        lost += r != calls[v].req;
      }
    }
    for (int v = 0; v < kCalls; ++v) wrong += wrong_values(&calls[v], me, n, i);
  }
  for (int v = 0; v < kCalls; ++v) {
    MPI_Request_free(&calls[v].req);
    lost += calls[v].req != MPI_REQUEST_NULL;
    if (comm[v] != MPI_COMM_NULL) MPI_Comm_free(&comm[v]);
    free(calls[v].s.buf), free(calls[v].r.buf), free(calls[v].s.counts);
  }
  for (int v = 0; v < 2; ++v) MPI_Type_free(&decoy[v]);
  alarm(0);
  long mine[2] = {wrong, lost}, all[2] = {0, 0};
  MPI_Allreduce(mine, all, 2, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
  const int ok = all[0] == 0 && all[1] == 0;
  if (me == 0)
    printf("mpi-persistent: %d ranks, %d starts, %s (%ld wrong values, %ld handles lost)\n", n, starts, ok ? "all results ok" : "WRONG", all[0], all[1]);
  MPI_Finalize();
  return ok ? 0 : 1;
}

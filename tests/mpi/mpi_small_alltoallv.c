/* mpi-small-alltoallv: an ordinary MPI program (nothing of aapc in it) of MPI_Alltoallv and
 * MPI_Ialltoallv calls whose counts each rank alone knows, as mpi4py's and IMB's tests make
 * them. Run with libaapc-mpi at its default AAPC_MPI_MIN_BLOCK, its ranks must agree on a
 * call's size before they choose aapc or the MPI's own (mpi/src/calls.cpp, decide()):
 *
 * - "tiny-v": alltoallvs of a few bytes per pair (some pairs none, counts differing by rank),
 *   blocking, nonblocking and in place: the MPI's own should carry them;
 * - "one-large-v": every rank sends a few bytes, except that rank 1 sends BIG bytes to the
 *   last rank: every rank must choose aapc, though only two ranks know of the large block;
 * - "mixed": 64 nonblocking calls in flight at a time, tiny and large alltoallvs, small
 *   MPI_Ialltoalls and MPI_Ibcasts, completed in each rank's own order (even ranks wait for
 *   them last to first, odd ranks test them in turn): the ranks must start the same
 *   collectives on the library's duplicate communicator in the same order, whenever their
 *   agreements end.
 *
 * Every byte of every result is checked. The communicators are named, so that AAPC_MPI_VERBOSE
 * says which of them aapc carried. A rank that hangs says where (watchdog.h) and exits 3.
 *
 *   mpi-small-alltoallv [BIG_BYTES] [ROUNDS]
 *       rank 0 prints "mpi-small-alltoallv: N ranks, R rounds, all results ok"
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "watchdog.h"

static int bad = 0;

static unsigned char value(int s, int d, int k, int call) { return (unsigned char)(s * 131 + d * 31 + k * 7 + call * 17 + 1); }

/* Bytes from rank s to rank d of a tiny call: 0 to 6, differing by pair and call. */
static int tiny(int s, int d, int call) { return (s * 5 + d * 3 + call) % 7; }

/* Bytes from s to d in call `call` of kind `large` (only rank 1 to the last rank is big). */
static int count_of(int s, int d, int n, int call, int large, int big) { return large && s == 1 && d == n - 1 ? big : tiny(s, d, call); }

struct vcall {
  unsigned char *s, *r;
  int *sc, *sd, *rc, *rd;
  int call, large;
};

static void vcall_make(struct vcall* v, int me, int n, int call, int large, int big) {
  v->call = call, v->large = large;
  v->sc = malloc(4 * sizeof(int) * (size_t)n);
  v->sd = v->sc + n, v->rc = v->sc + 2 * n, v->rd = v->sc + 3 * n;
  int st = 0, rt = 0;
  for (int d = 0; d < n; ++d) {
    v->sc[d] = count_of(me, d, n, call, large, big), v->sd[d] = st, st += v->sc[d] + 1; /* a gap of one byte */
    v->rc[d] = count_of(d, me, n, call, large, big), v->rd[d] = rt, rt += v->rc[d] + 1;
  }
  v->s = malloc((size_t)st + 1), v->r = malloc((size_t)rt + 1);
  memset(v->r, 0xEE, (size_t)rt + 1);
  for (int d = 0; d < n; ++d)
    for (int k = 0; k < v->sc[d]; ++k) v->s[v->sd[d] + k] = value(me, d, k, call);
}

static void vcall_check(struct vcall* v, int me, int n, const char* what) {
  for (int s = 0; s < n; ++s) {
    for (int k = 0; k < v->rc[s]; ++k)
      if (v->r[v->rd[s] + k] != value(s, me, k, v->call)) {
        if (bad++ < 5) fprintf(stderr, "mpi-small-alltoallv: rank %d, %s call %d: byte %d from rank %d wrong\n", me, what, v->call, k, s);
        break;
      }
    if (v->r[v->rd[s] + v->rc[s]] != 0xEE && bad++ < 5) fprintf(stderr, "mpi-small-alltoallv: rank %d, %s call %d: gap after rank %d written\n", me, what, v->call, s);
  }
  free(v->s), free(v->r), free(v->sc);
}

static MPI_Comm named(MPI_Comm from, const char* name) {
  MPI_Comm c;
  MPI_Comm_dup(from, &c);
  MPI_Comm_set_name(c, name);
  return c;
}

/* Blocking and nonblocking calls of one kind on `comm`, one after another. */
static void one_by_one(MPI_Comm comm, int me, int n, int rounds, int large, int big, const char* what) {
  step_now = what;
  for (int i = 0; i < rounds; ++i) {
    struct vcall v;
    vcall_make(&v, me, n, i, large, big);
    if (i % 2 == 0) {
      MPI_Alltoallv(v.s, v.sc, v.sd, MPI_BYTE, v.r, v.rc, v.rd, MPI_BYTE, comm);
    } else {
      MPI_Request q;
      MPI_Ialltoallv(v.s, v.sc, v.sd, MPI_BYTE, v.r, v.rc, v.rd, MPI_BYTE, comm, &q);
      MPI_Wait(&q, MPI_STATUS_IGNORE);
    }
    vcall_check(&v, me, n, what);
  }
}

/* MPI_IN_PLACE with MPI_DATATYPE_NULL as the send type (MPI ignores the send arguments):
 * counts alike both ways, tiny, or `big` between rank 1 and the last rank. */
static void in_place(MPI_Comm comm, int me, int n, int call, int big) {
  step_now = "in-place";
  int* c = calloc(2 * (size_t)n, sizeof(int));
  int* d = c + n;
  int total = 0;
  for (int p = 0; p < n; ++p) {
    const int lo = p < me ? p : me, hi = p < me ? me : p;
    c[p] = big > 0 && lo == 1 && hi == n - 1 ? big : (p + me + call) % 7, d[p] = total, total += c[p];
  }
  unsigned char* b = malloc((size_t)total + 1);
  for (int p = 0; p < n; ++p)
    for (int k = 0; k < c[p]; ++k) b[d[p] + k] = value(me, p, k, call);
  MPI_Alltoallv(MPI_IN_PLACE, c, d, MPI_DATATYPE_NULL, b, c, d, MPI_BYTE, comm); /* the send counts are ignored too */
  for (int p = 0; p < n; ++p)
    for (int k = 0; k < c[p]; ++k)
      if (b[d[p] + k] != value(p, me, k, call)) {
        if (bad++ < 5) fprintf(stderr, "mpi-small-alltoallv: rank %d, in-place call %d: byte %d from rank %d wrong\n", me, call, k, p);
        break;
      }
  free(b), free(c);
}

enum { kInFlight = 64 };

/* kInFlight nonblocking calls of four kinds at once, completed in each rank's own order. */
static void mixed(MPI_Comm comm, int me, int n, int round, int big) {
  step_now = "mixed";
  struct vcall v[kInFlight];
  unsigned char* small_s[kInFlight] = {0};
  unsigned char* small_r[kInFlight] = {0};
  int bcast[kInFlight];
  MPI_Request q[kInFlight];
  for (int i = 0; i < kInFlight; ++i) {
    const int call = round * kInFlight + i;
    switch (i % 4) {
      case 0:
      case 2:  /* an alltoallv: large every eighth call */
        vcall_make(&v[i], me, n, call, i % 8 == 2, big);
        MPI_Ialltoallv(v[i].s, v[i].sc, v[i].sd, MPI_BYTE, v[i].r, v[i].rc, v[i].rd, MPI_BYTE, comm, &q[i]);
        break;
      case 1:  /* a small MPI_Ialltoall: the MPI's own */
        small_s[i] = malloc((size_t)n * 4), small_r[i] = malloc((size_t)n * 4);
        for (int d = 0; d < n; ++d)
          for (int k = 0; k < 4; ++k) small_s[i][d * 4 + k] = value(me, d, k, call);
        MPI_Ialltoall(small_s[i], 4, MPI_BYTE, small_r[i], 4, MPI_BYTE, comm, &q[i]);
        break;
      default:
        bcast[i] = me == i % n ? call : -1;
        MPI_Ibcast(&bcast[i], 1, MPI_INT, i % n, comm, &q[i]);
    }
  }
  if (me % 2 == 0) {
    for (int i = kInFlight - 1; i >= 0; --i) MPI_Wait(&q[i], MPI_STATUS_IGNORE);
  } else {
    for (int left = kInFlight; left > 0;)
      for (int i = 0; i < kInFlight; ++i) {
        int done = 0;
        if (q[i] == MPI_REQUEST_NULL) continue;
        MPI_Test(&q[i], &done, MPI_STATUS_IGNORE);
        left -= done;
      }
  }
  for (int i = 0; i < kInFlight; ++i) {
    const int call = round * kInFlight + i;
    if (i % 4 == 0 || i % 4 == 2) {
      vcall_check(&v[i], me, n, "mixed");
    } else if (i % 4 == 1) {
      for (int s = 0; s < n; ++s)
        for (int k = 0; k < 4; ++k)
          if (small_r[i][s * 4 + k] != value(s, me, k, call) && bad++ < 5) fprintf(stderr, "mpi-small-alltoallv: rank %d, small call %d wrong\n", me, call);
      free(small_s[i]), free(small_r[i]);
    } else if (bcast[i] != call && bad++ < 5) {
      fprintf(stderr, "mpi-small-alltoallv: rank %d, bcast %d wrong\n", me, call);
    }
  }
}

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int me = 0, n = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &me);
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  const int big = argc > 1 ? atoi(argv[1]) : 65536;
  const int rounds = argc > 2 ? atoi(argv[2]) : 3;
  start_watchdog("mpi-small-alltoallv", me);
  if (n < 2) {
    if (me == 0) fprintf(stderr, "mpi-small-alltoallv: needs at least 2 ranks\n");
    MPI_Finalize();
    return 2;
  }
  MPI_Comm tiny_v = named(MPI_COMM_WORLD, "tiny-v"), large_v = named(MPI_COMM_WORLD, "one-large-v"), mix = named(MPI_COMM_WORLD, "mixed");
  for (int r = 0; r < rounds; ++r) {
    round_now = r;
    one_by_one(tiny_v, me, n, 20, 0, big, "tiny-v");
    in_place(tiny_v, me, n, r, 0);
    one_by_one(large_v, me, n, 4, 1, big, "one-large-v");
    in_place(large_v, me, n, r, big);
    mixed(mix, me, n, r, big);
  }
  step_now = "finishing";
  int all_bad = 0;
  MPI_Allreduce(&bad, &all_bad, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  if (me == 0) {
    if (all_bad == 0) printf("mpi-small-alltoallv: %d ranks, %d rounds, all results ok\n", n, rounds);
    else printf("mpi-small-alltoallv: %d wrong results\n", all_bad);
  }
  MPI_Comm_free(&tiny_v), MPI_Comm_free(&large_v), MPI_Comm_free(&mix);
  alarm(0);
  MPI_Finalize();
  return all_bad == 0 ? 0 : 1;
}

/* fftw-check: FFTW's MPI interface, unmodified: a distributed 2-D complex DFT whose
 * transposes are FFTW's own MPI all-to-alls, checked against FFTW's serial DFT of the same
 * input on rank 0. Exit status 0 when they agree.
 *
 *   fftw-check [N]    an N x N transform (default 256)
 */
#include <fftw3-mpi.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static double input_re(ptrdiff_t i, ptrdiff_t j) { return sin(0.1 * (double)i) + cos(0.3 * (double)j) + 0.01 * (double)((i * 7 + j * 3) % 11); }
static double input_im(ptrdiff_t i, ptrdiff_t j) { return 0.5 * cos(0.2 * (double)(i + 2 * j)); }

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  fftw_mpi_init();
  const ptrdiff_t n = argc > 1 ? atol(argv[1]) : 256;
  int me = 0, size = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &me);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  ptrdiff_t local_n0 = 0, local_0 = 0;
  const ptrdiff_t alloc = fftw_mpi_local_size_2d(n, n, MPI_COMM_WORLD, &local_n0, &local_0);
  fftw_complex* data = fftw_alloc_complex((size_t)alloc);
  fftw_complex* out = fftw_alloc_complex((size_t)alloc);
  /* Out of place, the way FFTW's all-to-all transpose (mpi/transpose-alltoall.c) applies,
   * and measured: FFTW times its transposes (all-to-all, pairwise, ...) and keeps the
   * fastest. FFTW_MPI_TRANSPOSED_OUT is not asked for: FFTW transposes there and back. */
  fftw_plan plan = fftw_mpi_plan_dft_2d(n, n, data, out, MPI_COMM_WORLD, FFTW_FORWARD, FFTW_MEASURE);
  if (me == 0) {
    char* how = fftw_sprint_plan(plan);
    printf("fftw-check: FFTW chose %s transposes\n", strstr(how, "mpi-transpose-alltoall") ? "all-to-all" : "other");
    free(how);
  }
  for (ptrdiff_t i = 0; i < local_n0; ++i)
    for (ptrdiff_t j = 0; j < n; ++j) {
      data[i * n + j][0] = input_re(local_0 + i, j);
      data[i * n + j][1] = input_im(local_0 + i, j);
    }
  fftw_execute(plan);
  /* Rows to rank 0, in order. */
  int* counts = malloc(sizeof(int) * (size_t)size);
  int* displs = malloc(sizeof(int) * (size_t)size);
  int mine = (int)(local_n0 * n * 2);
  MPI_Gather(&mine, 1, MPI_INT, counts, 1, MPI_INT, 0, MPI_COMM_WORLD);
  fftw_complex* all = me == 0 ? fftw_alloc_complex((size_t)(n * n)) : NULL;
  if (me == 0)
    for (int r = 0, at = 0; r < size; at += counts[r], ++r) displs[r] = at;
  MPI_Gatherv(out, mine, MPI_DOUBLE, all, counts, displs, MPI_DOUBLE, 0, MPI_COMM_WORLD);
  int ok = 1;
  if (me == 0) {
    fftw_complex* ref = fftw_alloc_complex((size_t)(n * n));
    fftw_plan serial = fftw_plan_dft_2d((int)n, (int)n, ref, ref, FFTW_FORWARD, FFTW_ESTIMATE);
    for (ptrdiff_t i = 0; i < n; ++i)
      for (ptrdiff_t j = 0; j < n; ++j) ref[i * n + j][0] = input_re(i, j), ref[i * n + j][1] = input_im(i, j);
    fftw_execute(serial);
    double worst = 0, scale = 0;
    for (ptrdiff_t k = 0; k < n * n; ++k) {
      worst = fmax(worst, fabs(all[k][0] - ref[k][0]) + fabs(all[k][1] - ref[k][1]));
      scale = fmax(scale, fabs(ref[k][0]) + fabs(ref[k][1]));
    }
    ok = worst <= 1e-9 * scale;
    printf("fftw-check: %td x %td on %d ranks: largest difference from serial FFTW %.3g (of %.3g): %s\n", n, n, size, worst, scale,
           ok ? "same result" : "DIFFERENT");
    fftw_destroy_plan(serial);
    fftw_free(ref);
    fftw_free(all);
  }
  MPI_Bcast(&ok, 1, MPI_INT, 0, MPI_COMM_WORLD);
  /* FFTW's distributed transpose of real numbers, out of place: element (i, j) must arrive
   * at (j, i). */
  {
    ptrdiff_t ln0 = 0, l0 = 0, ln1 = 0, l1 = 0;
    const ptrdiff_t talloc = fftw_mpi_local_size_2d_transposed(n, n, MPI_COMM_WORLD, &ln0, &l0, &ln1, &l1);
    double* tin = fftw_alloc_real((size_t)talloc);
    double* tout = fftw_alloc_real((size_t)talloc);
    fftw_plan t = fftw_mpi_plan_transpose(n, n, tin, tout, MPI_COMM_WORLD, FFTW_ESTIMATE);
    for (ptrdiff_t i = 0; i < ln0; ++i)
      for (ptrdiff_t j = 0; j < n; ++j) tin[i * n + j] = (double)((l0 + i) * n + j);
    fftw_execute(t);
    int tok = 1, all_tok = 0;
    for (ptrdiff_t j = 0; j < ln1; ++j)
      for (ptrdiff_t i = 0; i < n; ++i) tok &= tout[j * n + i] == (double)(i * n + (l1 + j));
    MPI_Allreduce(&tok, &all_tok, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    if (me == 0) {
      char* how = fftw_sprint_plan(t);
      printf("fftw-check: transpose (%s): %s\n", strstr(how, "mpi-transpose-alltoall") ? "all-to-all" : "other", all_tok ? "same result" : "DIFFERENT");
      free(how);
    }
    ok = ok && all_tok;
    fftw_destroy_plan(t);
    fftw_free(tin);
    fftw_free(tout);
  }
  fftw_destroy_plan(plan);
  fftw_free(data);
  fftw_free(out);
  free(counts), free(displs);
  MPI_Finalize();
  return ok ? 0 : 1;
}

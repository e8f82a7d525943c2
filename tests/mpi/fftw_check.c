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
  /* FFTW_MPI_TRANSPOSED_OUT is not asked for: FFTW transposes there and back. */
  fftw_plan plan = fftw_mpi_plan_dft_2d(n, n, data, data, MPI_COMM_WORLD, FFTW_FORWARD, FFTW_ESTIMATE);
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
  MPI_Gatherv(data, mine, MPI_DOUBLE, all, counts, displs, MPI_DOUBLE, 0, MPI_COMM_WORLD);
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
  fftw_destroy_plan(plan);
  fftw_free(data);
  free(counts), free(displs);
  MPI_Finalize();
  return ok ? 0 : 1;
}

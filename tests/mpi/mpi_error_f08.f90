! mpi-error-f08: an mpi_f08 program (MPICH: its MPI_WAIT calls PMPI_Wait, past the library)
! whose MPI_IALLTOALL cannot run (rank 1 sends twice the others' count) under
! MPI_ERRORS_RETURN. Each rank prints whether its MPI_WAIT returned an error; the wait must
! return, neither hang nor pass the failure as a success.
program mpi_error_f08
  use mpi_f08
  implicit none
  integer :: ierr, me, n, count
  integer, allocatable, asynchronous :: sbuf(:), rbuf(:)
  type(MPI_Request) :: req

  call MPI_INIT(ierr)
  call MPI_COMM_RANK(MPI_COMM_WORLD, me, ierr)
  call MPI_COMM_SIZE(MPI_COMM_WORLD, n, ierr)
  call MPI_COMM_SET_ERRHANDLER(MPI_COMM_WORLD, MPI_ERRORS_RETURN, ierr)
  allocate(sbuf(200 * n), rbuf(200 * n))
  sbuf = me
  count = 100
  if (me == 1) count = 200
  call MPI_IALLTOALL(sbuf, count, MPI_INTEGER, rbuf, count, MPI_INTEGER, MPI_COMM_WORLD, req, ierr)
  call MPI_WAIT(req, MPI_STATUS_IGNORE, ierr)
  if (ierr /= MPI_SUCCESS) then
    print '(A,I0,A)', 'mpi-error-f08: rank ', me, ': MPI_WAIT returned an error'
  else
    print '(A,I0,A)', 'mpi-error-f08: rank ', me, ': MPI_WAIT returned MPI_SUCCESS'
  end if
  call MPI_FINALIZE(ierr)
end program mpi_error_f08

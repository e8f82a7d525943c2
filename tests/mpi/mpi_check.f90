! mpi-check-fortran: an ordinary Fortran MPI program (use mpi; use mpi_f08 when preprocessed
! with -DUSE_MPI_F08) that calls MPI_ALLTOALL, with and without MPI_IN_PLACE, and with
! MPI_BOTTOM and types of absolute addresses, and MPI_ALLTOALLV, and checks every value. Prints "mpi-check-fortran: all cases ok" on rank 0
! when they all are.
program mpi_check_fortran
#ifdef USE_MPI_F08
  use mpi_f08
#else
  use mpi
#endif
  implicit none
  integer :: ierr, me, n, d, s, k, ok, all_ok
  integer, allocatable :: sbuf(:), rbuf(:), counts(:), displs(:)
  integer, parameter :: per = 100
  integer :: blocklen(1)
  integer(kind=MPI_ADDRESS_KIND) :: disp(1)
#ifdef USE_MPI_F08
  type(MPI_Datatype) :: stype, rtype
#else
  integer :: stype, rtype
#endif

  call MPI_INIT(ierr)
  call MPI_COMM_RANK(MPI_COMM_WORLD, me, ierr)
  call MPI_COMM_SIZE(MPI_COMM_WORLD, n, ierr)
  allocate(sbuf(per * n), rbuf(per * n), counts(n), displs(n))
  ok = 1

  do d = 0, n - 1
    do k = 1, per
      sbuf(d * per + k) = me * 100000 + d * 1000 + k
    end do
  end do
  call MPI_ALLTOALL(sbuf, per, MPI_INTEGER, rbuf, per, MPI_INTEGER, MPI_COMM_WORLD, ierr)
  do s = 0, n - 1
    do k = 1, per
      if (rbuf(s * per + k) /= s * 100000 + me * 1000 + k) ok = 0
    end do
  end do

  rbuf = sbuf
  call MPI_ALLTOALL(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, rbuf, per, MPI_INTEGER, MPI_COMM_WORLD, ierr)
  do s = 0, n - 1
    do k = 1, per
      if (rbuf(s * per + k) /= s * 100000 + me * 1000 + k) ok = 0
    end do
  end do

  do d = 0, n - 1
    counts(d + 1) = per / 2
    displs(d + 1) = d * per
  end do
  rbuf = 0
  call MPI_ALLTOALLV(sbuf, counts, displs, MPI_INTEGER, rbuf, counts, displs, MPI_INTEGER, MPI_COMM_WORLD, ierr)
  do s = 0, n - 1
    do k = 1, per / 2
      if (rbuf(s * per + k) /= s * 100000 + me * 1000 + k) ok = 0
    end do
    if (rbuf(s * per + per / 2 + 1) /= 0) ok = 0
  end do

  ! MPI_BOTTOM on both sides, with types whose one block lies at the buffers' addresses.
  blocklen(1) = per
  call MPI_GET_ADDRESS(sbuf, disp(1), ierr)
  call MPI_TYPE_CREATE_HINDEXED(1, blocklen, disp, MPI_INTEGER, stype, ierr)
  call MPI_GET_ADDRESS(rbuf, disp(1), ierr)
  call MPI_TYPE_CREATE_HINDEXED(1, blocklen, disp, MPI_INTEGER, rtype, ierr)
  call MPI_TYPE_COMMIT(stype, ierr)
  call MPI_TYPE_COMMIT(rtype, ierr)
  rbuf = 0
  call MPI_ALLTOALL(MPI_BOTTOM, 1, stype, MPI_BOTTOM, 1, rtype, MPI_COMM_WORLD, ierr)
  call MPI_F_SYNC_REG(rbuf)
  if (ierr /= MPI_SUCCESS) ok = 0
  do s = 0, n - 1
    do k = 1, per
      if (rbuf(s * per + k) /= s * 100000 + me * 1000 + k) ok = 0
    end do
  end do
  call MPI_TYPE_FREE(stype, ierr)
  call MPI_TYPE_FREE(rtype, ierr)

  call MPI_ALLREDUCE(ok, all_ok, 1, MPI_INTEGER, MPI_MIN, MPI_COMM_WORLD, ierr)
  if (me == 0) then
    if (all_ok == 1) then
      print '(A,I0,A)', 'mpi-check-fortran: ', n, ' ranks, all cases ok'
    else
      print '(A)', 'mpi-check-fortran: WRONG'
    end if
  end if
  call MPI_FINALIZE(ierr)
  if (all_ok /= 1) stop 1
end program mpi_check_fortran


! mpi-check-fortran: an ordinary Fortran MPI program (use mpi; use mpi_f08 when preprocessed
! with -DUSE_MPI_F08) that calls MPI_ALLTOALL, with and without MPI_IN_PLACE, and with
! MPI_BOTTOM and types of absolute addresses, and MPI_ALLTOALLV, MPI_IALLTOALL with MPI_WAIT
! and MPI_WAITALL, MPI_IALLTOALLV with an MPI_TEST loop, and (with -DHAVE_ALLTOALL_INIT, MPI 4)
! a persistent MPI_ALLTOALL_INIT started three times, and checks every value. Prints
! "mpi-check-fortran: all cases ok" on rank 0 when they all are.
program mpi_check_fortran
#ifdef USE_MPI_F08
  use mpi_f08
#else
  use mpi
#endif
  implicit none
  integer :: ierr, me, n, d, s, k, ok, all_ok
  ! asynchronous: the nonblocking calls below read and write them after they return.
  integer, allocatable, asynchronous :: sbuf(:), rbuf(:), counts(:), displs(:)
  integer, parameter :: per = 100
  integer :: blocklen(1)
  integer(kind=MPI_ADDRESS_KIND) :: disp(1)
  logical :: flag
#ifdef HAVE_ALLTOALL_INIT
  integer :: round
#endif
#ifdef USE_MPI_F08
  type(MPI_Datatype) :: stype, rtype
  type(MPI_Request) :: req, reqs(2)
#else
  integer :: stype, rtype
  integer :: req, reqs(2)
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

  ! Nonblocking: the requests are completed by the bindings' own MPI_WAIT, MPI_WAITALL and
  ! MPI_TEST (MPICH's mpi_f08 calls PMPI_Wait and the like, past the library).
  rbuf = 0
  call MPI_IALLTOALL(sbuf, per, MPI_INTEGER, rbuf, per, MPI_INTEGER, MPI_COMM_WORLD, req, ierr)
  call MPI_WAIT(req, MPI_STATUS_IGNORE, ierr)
  call MPI_F_SYNC_REG(rbuf)
  call check_all(rbuf, 0)
  rbuf = 0
  call MPI_IALLTOALLV(sbuf, counts, displs, MPI_INTEGER, rbuf, counts, displs, MPI_INTEGER, MPI_COMM_WORLD, req, ierr)
  flag = .false.
  do while (.not. flag)
    call MPI_TEST(req, flag, MPI_STATUS_IGNORE, ierr)
  end do
  call MPI_F_SYNC_REG(rbuf)
  do s = 0, n - 1
    do k = 1, per / 2
      if (rbuf(s * per + k) /= s * 100000 + me * 1000 + k) ok = 0
    end do
  end do
  rbuf = 0
  call MPI_IALLTOALL(sbuf, per, MPI_INTEGER, rbuf, per, MPI_INTEGER, MPI_COMM_WORLD, reqs(1), ierr)
  call MPI_IBARRIER(MPI_COMM_WORLD, reqs(2), ierr)
  call MPI_WAITALL(2, reqs, MPI_STATUSES_IGNORE, ierr)
  call MPI_F_SYNC_REG(rbuf)
  call check_all(rbuf, 0)

#ifdef HAVE_ALLTOALL_INIT
  ! Persistent: made once, started three times with new values each time.
  call MPI_ALLTOALL_INIT(sbuf, per, MPI_INTEGER, rbuf, per, MPI_INTEGER, MPI_COMM_WORLD, MPI_INFO_NULL, req, ierr)
  do round = 1, 3
    do d = 0, n - 1
      do k = 1, per
        sbuf(d * per + k) = me * 100000 + d * 1000 + k + round * 10000000
      end do
    end do
    rbuf = 0
    call MPI_START(req, ierr)
    call MPI_WAIT(req, MPI_STATUS_IGNORE, ierr)
  call MPI_F_SYNC_REG(rbuf)
    call check_all(rbuf, round * 10000000)
  end do
  call MPI_REQUEST_FREE(req, ierr)
#endif

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

contains

  ! Every block of an all-to-all of `per` from each rank, each value offset by `plus`.
  subroutine check_all(got, plus)
    integer, intent(in) :: got(:), plus
    integer :: src, j
    do src = 0, n - 1
      do j = 1, per
        if (got(src * per + j) /= src * 100000 + me * 1000 + j + plus) ok = 0
      end do
    end do
  end subroutine check_all
end program mpi_check_fortran


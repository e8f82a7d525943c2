"""mpi-check.py: an ordinary mpi4py program (nothing of aapc in it): Alltoall of numpy
arrays and of Python objects' counts, Alltoallv, Ialltoall, on the world and on a split communicator,
every value checked. Prints 'mpi-check.py: all cases ok' on rank 0 when they all are."""
import sys

import numpy as np
from mpi4py import MPI

world = MPI.COMM_WORLD
me, n = world.Get_rank(), world.Get_size()
failures = 0


def expect(name, ok, comm):
    global failures
    ok = comm.allreduce(bool(ok), op=MPI.LAND)
    if not ok:
        failures += 1
    if me == 0 or not ok:
        print(f"mpi-check.py: {name:32} {'ok' if ok else 'WRONG'}", flush=True)


def world_ranks(comm):
    return comm.allgather(me)


def alltoall(name, comm, per_rank, nonblocking=False):
    ranks = world_ranks(comm)
    send = np.array([[me * 1000 + d * 10 + k for k in range(per_rank)] for d in ranks], dtype=np.int64)
    recv = np.zeros_like(send)
    if nonblocking:
        comm.Ialltoall(send, recv).Wait()
    else:
        comm.Alltoall(send, recv)
    want = np.array([[s * 1000 + me * 10 + k for k in range(per_rank)] for s in ranks], dtype=np.int64)
    expect(name, np.array_equal(recv, want), comm)


def alltoallv(comm):
    ranks = world_ranks(comm)
    size = comm.Get_size()
    counts = np.array([(me + d) % 4 for d in ranks], dtype=np.int32)
    rcounts = np.empty(size, dtype=np.int32)
    comm.Alltoall(counts, rcounts)
    sdispl = np.concatenate(([0], np.cumsum(counts)[:-1])).astype(np.int32)
    rdispl = np.concatenate(([0], np.cumsum(rcounts)[:-1])).astype(np.int32)
    send = np.concatenate([np.full(c, me * 100 + d, dtype=np.float64) for c, d in zip(counts, ranks)] + [np.zeros(0)])
    recv = np.zeros(int(rcounts.sum()), dtype=np.float64)
    comm.Alltoallv([send, counts, sdispl, MPI.DOUBLE], [recv, rcounts, rdispl, MPI.DOUBLE])
    want = np.concatenate([np.full(c, s * 100 + me, dtype=np.float64) for c, s in zip(rcounts, ranks)] + [np.zeros(0)])
    expect("Alltoallv (numpy, doubles)", np.array_equal(recv, want), comm)


per_rank = int(sys.argv[1]) if len(sys.argv) > 1 else 512
alltoall("Alltoall (COMM_WORLD)", world, per_rank)
alltoallv(world)
alltoall("Ialltoall (COMM_WORLD)", world, per_rank, nonblocking=True)
half = world.Split(me % 2, me)
alltoall("Alltoall (Split)", half, per_rank)
half.Free()
if me == 0:
    print(f"mpi-check.py: {n} ranks, {'FAILED' if failures else 'all cases ok'}", flush=True)
sys.exit(1 if failures else 0)

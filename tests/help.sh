#!/bin/sh
# Every tool and script answers --help at once, with exit status 0, and does nothing else:
# the scripts run-tests, run-demo and setup used to take --help for an argument and start
# their job (run-tests the whole suite).
# Usage: help.sh BUILD_TOOLS_DIR SOURCE_DIR
tools=$1
src=$2
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1  # the MPI baselines, as singletons
failed=0
for t in "$tools"/aapc "$tools"/aapc-bench "$tools"/aapc-emu "$tools"/aapc-sched "$tools"/aapc-trace "$tools"/aapcd \
  "$tools"/aapc-engine-bench "$tools"/aapc-sched-bench "$tools"/aapc-simgrid-check "$tools"/mpi-alltoall-openmpi "$tools"/mpi-alltoall-mpich \
  "$src"/tools/run-tests "$src"/tools/run-demo "$src"/tools/setup "$src"/tests/others/run-suites "$src"/tools/mpi4py-alltoall; do
  case $t in *mpi-alltoall-* | *aapc-simgrid-check) [ -x "$t" ] || continue ;; esac  # built where that MPI (SimGrid) is installed
  out=$(timeout 30 "$t" --help 2>&1)
  rc=$?
  if [ $rc -ne 0 ] || [ -z "$out" ]; then
    echo "FAILED: $t --help: exit status $rc"
    echo "$out" | tail -5
    failed=1
  elif echo "$out" | grep -q -e '^== tests' -e 'aapc setup: built'; then
    echo "FAILED: $t --help started its job"
    failed=1
  else
    echo "ok: $t --help"
  fi
done
exit $failed

#!/usr/bin/env bash
# The ranks over MPI on the device machine's host (issue "Ranks"; no GPU used): 16 cores give
# each rank's workers and communication thread cores of their own, which the 2-core
# development machine cannot. Here, first:
#   PACK_MPI=1 bash benches/device/pack.sh
# then run with carry [".devbin"] from the repository root: `bash .devbin/ranks_call.sh`.
# Prints the bench's tables (2 and 4 ranks, and the DAG on 1) and the CI program's lines.
source "$(dirname "$0")/lib.sh"
unset BOUNDPOOL_REQUIRE_GPU
nproc; mpirun --version | head -n 1
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
M="mpirun --bind-to none"
step bench_ranks_2 150 $M -np 2 $B/bench_ranks --workers 2 ${RANKS_ARGS:-}; cat $LOGS/bench_ranks_2.log; finish
step bench_ranks_4 150 $M -np 4 $B/bench_ranks --workers 2 --no-edge --no-big ${RANKS_ARGS:-}; grep '^|' $LOGS/bench_ranks_4.log; finish
step bench_ranks_1 60 $M -np 1 $B/bench_ranks --workers 2 ${RANKS_ARGS:-}; grep '^|' $LOGS/bench_ranks_1.log; finish
step ranks_ci_4 120 $M --oversubscribe -np 4 $B/ranks_ci graphs 200; grep '^rank' $LOGS/ranks_ci_4.log; finish
step ranks_ci_faults 60 $M --oversubscribe -np 4 $B/ranks_ci faults; grep '^rank' $LOGS/ranks_ci_faults.log; finish

#!/usr/bin/env bash
# The ranks over MPI on the device machine's host (issue "Ranks" item 6; no GPU used): 16 cores
# give each rank's workers and communication thread cores of their own, which the 2-core
# development machine cannot, so the two targets are judged here: the 8-byte edge at most
# 1.5x raw MPI's half round trip, the 64 MiB value at least 0.9x raw MPI's bandwidth into a
# reused buffer. Here, first:
#   PACK_MPI=1 bash benches/device/pack.sh
# then run with carry [".devbin"] from the repository root: `bash .devbin/ranks_call.sh`.
# Prints each run's placement lines (every rank: its workers' and communication thread's cores,
# whether each thread has a core, the spins), the bench's tables (2 ranks with the runtime's
# placement; 2 ranks with the spins off, the hand-off's cost when every wait is a yield or a
# park; 2 ranks of 1 worker; 4 ranks; the DAG on 1), and the CI program's lines; at most 570 s (lib.sh's budget).
source "$(dirname "$0")/lib.sh"
unset BOUNDPOOL_REQUIRE_GPU
nproc; mpirun --version | head -n 1
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# Unbound: the runtime shares the host's cores out by local rank itself (Ranks::placement).
M="mpirun --bind-to none"
SUMMARY='^\| (8-byte|64 MiB)|landed in recycled|panicked|FAILED'
step bench_ranks_2 130 $M -np 2 $B/bench_ranks --workers 2 ${RANKS_ARGS:-}; cat $LOGS/bench_ranks_2.log; finish
step bench_ranks_2_nospin 70 $M -np 2 $B/bench_ranks --workers 2 --dag 0 --comm-spin-us 0 --idle-spin-us 20 ${RANKS_ARGS:-}; grep -E '^\||^placement|recycled' $LOGS/bench_ranks_2_nospin.log; finish
step bench_ranks_2w1 70 $M -np 2 $B/bench_ranks --workers 1 --dag 0 ${RANKS_ARGS:-}; grep -E '^\||^placement|recycled' $LOGS/bench_ranks_2w1.log; finish
step bench_ranks_4 120 $M -np 4 $B/bench_ranks --workers 2 --no-edge --no-big ${RANKS_ARGS:-}; grep -E '^\||^placement' $LOGS/bench_ranks_4.log; finish
step bench_ranks_1 45 $M -np 1 $B/bench_ranks --workers 2 ${RANKS_ARGS:-}; grep -E '^\||^placement' $LOGS/bench_ranks_1.log; finish
step ranks_ci_4 90 $M --oversubscribe -np 4 $B/ranks_ci graphs 200; grep '^rank' $LOGS/ranks_ci_4.log; finish
step ranks_ci_faults 45 $M --oversubscribe -np 4 $B/ranks_ci faults; grep '^rank' $LOGS/ranks_ci_faults.log; finish

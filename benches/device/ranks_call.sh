#!/usr/bin/env bash
# The ranks over MPI on the device machine's host (issue "Ranks" item 6; no GPU used): 16 cores
# give each rank's workers and communication thread cores of their own, which the 2-core
# development machine cannot, so the two targets are judged here: the 8-byte edge at most
# 1.5x raw MPI's half round trip, the 64 MiB value at least 0.9x raw MPI's bandwidth into a
# reused buffer. Here, first:
#   PACK_MPI=1 bash benches/device/pack.sh
# (PACK_REVS="old=REV" as well: that revision's ranks bench is alternated with this build's in
# the edge's steps; a REV from the edge stamps on, 81db095, prints its breakdown too)
# then run with carry [".devbin"] from the repository root: `bash .devbin/ranks_call.sh`.
# Prints the host's cores (SMT siblings share a core's pipeline: two spinning threads on
# siblings slow each other), each run's placement lines (every rank: its workers' and
# communication thread's cores, whether each thread has a core, the spins), then:
#   edge_<build>_<round>  2 ranks of 2 workers, the 8-byte edge with its hop-by-hop breakdown
#                         (--edge-breakdown: medians over every edge) and the 64 MiB value,
#                         this build (`new`) and each packed revision alternated, 2 rounds;
#   edge_new_viacomm      the same, this build with every send handed to the communication
#                         thread (--no-worker-sends: the hand-off the worker's own post saves);
#   bench_ranks_2         2 ranks, the DAG too; bench_ranks_4 4 ranks, the DAG only;
#   ranks_ci_4, ranks_ci_faults  the CI program (random graphs equal to one process; faults).
# At most 570 s (lib.sh's budget).
source "$(dirname "$0")/lib.sh"
unset BOUNDPOOL_REQUIRE_GPU
nproc; mpirun --version | head -n 1
lscpu | grep -E '^(Model name|CPU\(s\)|Thread\(s\) per core|Core\(s\) per socket|Socket\(s\)|NUMA node\(s\))'
for c in 0 1 2 8 9 10; do
  echo "cpu$c siblings: $(cat /sys/devices/system/cpu/cpu$c/topology/thread_siblings_list 2>/dev/null)"
done
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# Unbound: the runtime shares the host's cores out by local rank itself (Ranks::placement).
M="mpirun --bind-to none"
SUMMARY='^\| (8-byte|64 MiB)|landed in recycled|panicked|FAILED'
show() { grep -E '^\||^placement|recycled' "$LOGS/$1.log"; }
bins="new=$B/bench_ranks"
for n in $(ls revs 2>/dev/null); do
  [ -x "revs/$n/bench_ranks" ] && bins="$bins $n=$PWD/revs/$n/bench_ranks"
done
for r in 1 2; do
  for spec in $bins; do
    step edge_${spec%%=*}_$r 60 $M -np 2 ${spec#*=} --workers 2 --dag 0 --runs 5 --edge-breakdown ${RANKS_ARGS:-}
    show edge_${spec%%=*}_$r; finish
  done
done
step edge_new_viacomm 60 $M -np 2 $B/bench_ranks --workers 2 --dag 0 --no-big --runs 5 --edge-breakdown --no-worker-sends ${RANKS_ARGS:-}; show edge_new_viacomm; finish
step bench_ranks_2 100 $M -np 2 $B/bench_ranks --workers 2 --runs 3 ${RANKS_ARGS:-}; show bench_ranks_2; finish
step bench_ranks_4 90 $M -np 4 $B/bench_ranks --workers 2 --no-edge --no-big --runs 3 ${RANKS_ARGS:-}; show bench_ranks_4; finish
step ranks_ci_4 90 $M --oversubscribe -np 4 $B/ranks_ci graphs 200; grep '^rank' $LOGS/ranks_ci_4.log; finish
step ranks_ci_faults 45 $M --oversubscribe -np 4 $B/ranks_ci faults; grep '^rank' $LOGS/ranks_ci_faults.log; finish

#!/usr/bin/env bash
# Stop 41's first device call: the graph-template tests (the description now
# asserted free of attributes the driver refuses; the refusals of a stream not capturing in a
# test of their own, which memcheck skips: its API errors are the point of that test), memcheck
# over the rest; where the high client's tail comes from beside 32 batch clients on the
# partitioned pool with clients placed (`--tail-probe`), and the same rounds
# with 32 hardware queues (CUDA_DEVICE_MAX_CONNECTIONS; the driver's default is 8, so more
# streams than that share queues, and a latency-critical kernel can wait behind a batch one).
# Then the ranks: the 8-byte edge with and without workers looking at the network, the 64 MiB
# value and the DAG, the CI program's graphs and faults with workers spinning.
# Here: `PACK_MPI=1 bash benches/device/pack.sh`, then with carry [".devbin"]:
# `bash .devbin/stop41_call.sh` (about 330 s).
source .devbin/lib.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; nproc
logs_in /tmp/bp-gt gt.tgz fresh; deadline 50
step t_gpu_graph_template 20 $B/t_gpu_graph_template --test-threads=1
grep -E "description reads|=err" $LOGS/t_gpu_graph_template.log | cut -c1-600 | head -3
BOUNDPOOL_WATCHDOG_SCALE=20 step mc_graph_template 35 $CS --tool memcheck $B/t_gpu_graph_template --test-threads=1 --skip refused
grep -hE "Program hit" $LOGS/mc_graph_template.log | sort | uniq -c | cut -c1-200
finish
# The 8-byte edge with spinning workers looking at the network (RanksBuilder::worker_polls,
# on by default) against the communication thread alone (--no-worker-polls), alternated, with
# the hops; then the 64 MiB value and the 100k DAG on this build (worker polls on).
logs_in /tmp/bp-rk rk.tgz fresh; deadline 150
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
SUMMARY='^\| (8-byte|64 MiB|100k)|taken by|panicked|FAILED'
for r in 1 2; do
  for f in "" --no-worker-polls; do
    step edge${f:+_off}_$r 18 mpirun --bind-to none -np 2 $B/bench_ranks --workers 2 --dag 0 --no-big --runs 3 --edge-breakdown $f
    [ $r = 1 ] && grep -E "^\| (send|arrival|all bytes|Completer|producer)" $LOGS/edge${f:+_off}_$r.log | cut -c1-150
  done
  finish
done
step big 25 mpirun --bind-to none -np 2 $B/bench_ranks --workers 2 --dag 100000 --no-edge --runs 3
finish
# The CI program where workers spin (a core each): random graphs and the fault cases.
SUMMARY='^rank|panicked|FAILED|HUNG'
step ci4 30 mpirun --bind-to none --oversubscribe -np 4 $B/ranks_ci graphs 100
finish
step ci_faults 35 mpirun --bind-to none --oversubscribe -np 4 $B/ranks_ci faults
finish
logs_in /tmp/bp-tl tl.tgz fresh; deadline 95
SUMMARY='panicked|Error'
P="--isolate high --high-partition 16 --batch-clients 32 --no-torch"
step probe 30 $B/bench_serve --tail-probe --seconds 1 $P
grep -E "^\||beside|alone" $LOGS/probe.log | cut -c1-200
finish
for c in 32 8; do
  CUDA_DEVICE_MAX_CONNECTIONS=$c step conn$c 32 $B/bench_serve --priority-only --rounds 2 --seconds 1 $P
  echo "-- CUDA_DEVICE_MAX_CONNECTIONS=$c"; grep -E "^\| (bf16|f32) " $LOGS/conn$c.log | cut -d'|' -f1-12
  finish
done

#!/usr/bin/env bash
# Stop 41's device call, in order of need, all within TOTAL seconds (default 300; each part
# packs its logs, so a call cut short brings back what ran):
# 1. the graph-template tests (the description asserted free of attributes the driver
#    refuses; the refusals of a stream not capturing in a test of their own, which memcheck
#    skips: its API errors are that test's point) and memcheck over the rest;
# 2. the 8-byte edge with spinning workers looking at the network (RanksBuilder::worker_polls,
#    the default) against the communication thread alone (--no-worker-polls), with its hops;
# 3. the CI program's random graphs where workers spin (a core each);
# 4. the high client beside 32 batch clients, partitioned and placed, with 32 hardware queues
#    (CUDA_DEVICE_MAX_CONNECTIONS; the driver's default is 8, so more streams than that share
#    queues and a latency-critical kernel can wait behind a batch one) and with the default;
# 5. the edge again, the 64 MiB value and the DAG, the CI program's faults, the tail's probe.
# Here: `PACK_MPI=1 bash benches/device/pack.sh`, then with carry [".devbin"]:
# `bash .devbin/stop41_call.sh`.
source .devbin/lib.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; nproc
deadline ${TOTAL:-300}
logs_in /tmp/bp-gt gt.tgz fresh
step t_gpu_graph_template 20 $B/t_gpu_graph_template --test-threads=1
grep -E "description reads|=err" $LOGS/t_gpu_graph_template.log | cut -c1-600 | head -3
BOUNDPOOL_WATCHDOG_SCALE=20 step mc_graph_template 35 $CS --tool memcheck $B/t_gpu_graph_template --test-threads=1 --skip refused
grep -hE "Program hit" $LOGS/mc_graph_template.log | sort | uniq -c | cut -c1-200
finish
logs_in /tmp/bp-rk rk.tgz fresh
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
edge() { for f in "" --no-worker-polls; do
    step edge${f:+_off}_$1 18 mpirun --bind-to none -np 2 $B/bench_ranks --workers 2 --dag 0 --no-big --runs 3 --edge-breakdown $f
    grep -E "^\| (send|arrival|all bytes|Completer|producer)" $LOGS/edge${f:+_off}_$1.log | cut -c1-150
  done; finish; }
SUMMARY='^\| (8-byte|64 MiB|100k)|taken by|panicked|FAILED'
edge 1
SUMMARY='^rank|panicked|FAILED|HUNG'
step ci4 30 mpirun --bind-to none --oversubscribe -np 4 $B/ranks_ci graphs 100
finish
logs_in /tmp/bp-tl tl.tgz fresh
SUMMARY='panicked|Error'
P="--isolate high --high-partition 16 --batch-clients 32 --no-torch"
for c in 32 8; do
  CUDA_DEVICE_MAX_CONNECTIONS=$c step conn$c 32 $B/bench_serve --priority-only --rounds 2 --seconds 1 $P
  echo "-- CUDA_DEVICE_MAX_CONNECTIONS=$c"; grep -E "^\| (bf16|f32) " $LOGS/conn$c.log | cut -d'|' -f1-12
  finish
done
logs_in /tmp/bp-rk rk.tgz
SUMMARY='^\| (8-byte|64 MiB|100k)|taken by|panicked|FAILED'
edge 2
step big 25 mpirun --bind-to none -np 2 $B/bench_ranks --workers 2 --dag 100000 --no-edge --runs 3
finish
SUMMARY='^rank|panicked|FAILED|HUNG'
step ci_faults 35 mpirun --bind-to none --oversubscribe -np 4 $B/ranks_ci faults
finish
logs_in /tmp/bp-tl tl.tgz
SUMMARY='panicked|Error'
step probe 30 $B/bench_serve --tail-probe --seconds 1 $P
grep -E "^\||beside|alone" $LOGS/probe.log | cut -c1-200
finish

#!/usr/bin/env bash
# Stop 41's first device call (about 200 s): the graph-template tests (the description now
# asserted free of attributes the driver refuses; the refusals of a stream not capturing in a
# test of their own, which memcheck skips: its API errors are the point of that test), memcheck
# over the rest; where the high client's tail comes from beside 32 batch clients on the
# partitioned pool with clients placed (`--tail-probe`, `--tail-trace`), and the same rounds
# with 32 hardware queues (CUDA_DEVICE_MAX_CONNECTIONS; the driver's default is 8, so more
# streams than that share queues, and a latency-critical kernel can wait behind a batch one).
# Here: `bash benches/device/pack.sh`, then with carry [".devbin"]: `bash .devbin/stop41_call.sh`.
source .devbin/lib.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; nproc
logs_in /tmp/bp-gt gt.tgz fresh; deadline 60
step t_gpu_graph_template 20 $B/t_gpu_graph_template --test-threads=1
grep -E "description reads|=err" $LOGS/t_gpu_graph_template.log | cut -c1-600 | head -3
BOUNDPOOL_WATCHDOG_SCALE=20 step mc_graph_template 35 $CS --tool memcheck $B/t_gpu_graph_template --test-threads=1 --skip refused
grep -hE "Program hit" $LOGS/mc_graph_template.log | sort | uniq -c | cut -c1-200
finish
logs_in /tmp/bp-tl tl.tgz fresh; deadline 200
SUMMARY='panicked|Error'
P="--isolate high --high-partition 16 --batch-clients 32 --no-torch"
step probe 40 $B/bench_serve --tail-probe --seconds 1 $P
grep -E "^\||beside|alone" $LOGS/probe.log | cut -c1-200
finish
step trace 40 $B/bench_serve --tail-trace --seconds 1 $P
grep -E "^\||beside" $LOGS/trace.log | cut -c1-200
finish
for c in 32 8; do
  CUDA_DEVICE_MAX_CONNECTIONS=$c step conn$c 40 $B/bench_serve --priority-only --rounds 3 --seconds 1 $P
  echo "-- CUDA_DEVICE_MAX_CONNECTIONS=$c"; grep -E "^\| (bf16|f32) " $LOGS/conn$c.log | cut -d'|' -f1-12
  finish
done

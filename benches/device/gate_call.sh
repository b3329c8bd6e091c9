#!/usr/bin/env bash
# The GPU-machine call for the capture gate (captures of one thread broken by another thread's
# device-wide calls, issue 33 items 2 and 4). Here, first:
#   bash benches/device/pack.sh
#   mkdir -p .devbin/extra && cp /work/team/gate-old/t_gpu_capture_concurrent_old .devbin/extra/
# (the second line is optional: the diagnostic test built on the code before the gate, whose
# CONCURRENT CASE lines say which calls break a capture of another thread). Then, with carry
# [".devbin"]: `bash .devbin/gate_call.sh`. Every test binary runs with BOUNDPOOL_REQUIRE_GPU=1
# and the harness's default threads (tests in parallel in one process: the point). Inside BUDGET
# seconds (default 570), in order of importance. Logs: $OUT/logs.tgz.
source "$(dirname "$0")/lib.sh"
logs_in /tmp/boundpool-logs logs.tgz fresh
SUMMARY='test result|FAILED|panicked|SKIPPED|HUNG|INTERFERES'
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; nproc
step gate_unit 30 $B/t_boundpool_gpu gate
step concurrent 150 $B/t_gpu_capture_concurrent --nocapture
grep -h "CONCURRENT CASE" $LOGS/concurrent.log
finish
for i in 1 2 3 4 5; do
  for t in t_gpu_cudarc t_gpu_capture_cudarc t_gpu_replay_take; do
    step ${t}_par$i 60 $B/$t
  done
  finish
done
if [ -x extra/t_gpu_capture_concurrent_old ]; then
  step concurrent_old 150 extra/t_gpu_capture_concurrent_old --nocapture
  grep -h "CONCURRENT CASE" $LOGS/concurrent_old.log
  finish
fi
# The other replay binaries, which final_call.sh runs one test at a time, in parallel once.
for t in t_gpu_replay t_gpu_replay_runs t_gpu_partitions t_gpu_blas; do step ${t}_par 90 $B/$t; done
finish

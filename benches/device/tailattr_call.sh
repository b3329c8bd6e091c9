#!/usr/bin/env bash
# Where the high client's slowest 1% lose their time beside the batch (issue 33, item 5: bf16
# beside 32 batch clients, partitioned and placed), in one call of at most TOTAL seconds
# (default 120): the tail's probe (`bench_serve --tail-probe`), whose second table cuts each
# request at its GPU segment's launch (`Replayable::probe_launches`): the driver's launch call
# (hypothesis a: the driver's locks), the device's time between events around the launch
# (b: the batch's traffic stretching the graph), and the device's end to the worker seeing it
# done (c). Alone, beside 32 and beside 8 batch clients, bf16 then f32; twice, since the cell
# misses in some rounds only. First the probe's GPU test. Each step packs its logs, so a call
# cut short brings back what ran.
# Here: `PACK_MPI=1 bash benches/device/pack.sh`, then with carry [".devbin"]:
# `bash .devbin/tailattr_call.sh`.
source .devbin/lib.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; nproc
deadline ${TOTAL:-120}
logs_in /tmp/bp-ta ta.tgz fresh
# The probe's own GPU test first (its records read in order, device times within the run).
step t_probe 15 $B/t_gpu_replay_runs the_launch_probe --test-threads=1
SUMMARY='panicked|Error'
P="--isolate high --high-partition 16 --no-torch"
for r in 1 2; do
  step probe$r 48 $B/bench_serve --tail-probe --seconds 1 --batch-clients 32,8 $P
  grep -E "^\||beside|alone" $LOGS/probe$r.log | cut -c1-420
  finish
done

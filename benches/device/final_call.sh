#!/usr/bin/env bash
# One GPU-machine call for a stop whose device time is short: every GPU test binary with
# BOUNDPOOL_REQUIRE_GPU=1 (each under its own limit), the high client's tail (`bench_serve
# --priority-only`, 5 rounds of 8, 16 and 32 batch clients), memcheck over the capture cases, and
# the GPU subcommands' smoke runs, in that order of importance, inside BUDGET seconds (default
# 400). Here first: `bash benches/device/pack.sh`; there, with carry [".devbin"]:
#   bash .devbin/final_call.sh
# Extra binaries dropped into .devbin/extra/ (e.g. another build's t_gpu_cudarc, named
# t_gpu_cudarc_old) run after the tests, for comparison. Logs: $OUT/logs.tgz.
source "$(dirname "$0")/lib.sh"
logs_in /tmp/boundpool-logs logs.tgz fresh; deadline ${BUDGET:-400}
SUMMARY='test result|FAILED|panicked|SKIPPED|ERROR SUMMARY'
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader; nproc
for t in $B/t_*; do
  n=$(basename $t); a=; case $n in t_gpu_replay|t_gpu_replay_runs) a=--test-threads=1;; esac
  step $n 45 $t $a
done
finish
step tail 130 $B/bench_serve --priority-only --rounds 5 --batch-clients 8,16,32 --seconds 1 --no-torch
grep -E "^\| (bf16|f32)" $LOGS/tail.log
finish
for x in extra/*; do [ -x "$x" ] && step "$(basename $x)" 60 "$x"; done
step cudarc_parallel_again 60 $B/t_gpu_cudarc
finish
step memcheck_capture 80 $CS --tool memcheck --report-api-errors no $B/t_gpu_capture_cudarc --test-threads=1
finish
step run_gpu 30 $B/boundpool run --gpu --shape chain --size 2000 --quiet
step run_gpu_too_large 20 $B/boundpool run --gpu --size 99999999999999 --quiet
tail -n 3 $LOGS/run_gpu.log $LOGS/run_gpu_too_large.log
finish

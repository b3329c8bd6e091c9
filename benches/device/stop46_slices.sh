#!/usr/bin/env bash
# Stop 46's third device call (issue 33 item 5): bench_serve's priority rounds (ROUNDS, 5, in
# one process each) with each phase cut into SLICES (5) alternated slices, then one process
# with the phases one after another (--slices 1), then sliced again: the same build, the
# two ways of measuring it in one call. Then, with TESTS="t_gpu_priority ...", those GPU test
# binaries.
# Here: `bash benches/device/pack.sh`, then with carry [".devbin"]:
# `bash .devbin/stop46_slices.sh`.
cd "$(dirname "$0")/.."
source .devbin/lib.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; nproc
deadline ${TOTAL:-560}
logs_in /tmp/bp-s46s s46s.tgz fresh
SUMMARY='panicked|Error'
P="--priority-only --rounds ${ROUNDS:-5} --isolate high --high-partition 16 --no-torch --batch-clients 8,16,32 --seconds 1"
run() { step rounds_$1 150 $B/bench_serve $P "${@:2}"
  grep -E "^\| (bf16|f32) " $LOGS/rounds_$1.log | cut -d'|' -f2-12; finish; }
run sliced_1 --slices ${SLICES:-5}
run whole_2 --slices 1
run sliced_3 --slices ${SLICES:-5}
SUMMARY='test result|FAILED|panicked|SKIPPED'
for n in ${TESTS:-}; do
  step $n 60 $B/$n; grep -hE "test result|FAILED|panicked" $LOGS/$n.log | head -2
done
finish

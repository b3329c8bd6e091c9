#!/usr/bin/env bash
# Stop 46's third device call (issue 33 item 5): bench_serve's priority rounds (ROUNDS, 5, in
# one process each) for each entry of RUNS (default: sliced,whole,sliced): `sliced` cuts each
# phase into SLICES (5) alternated slices, `whole` runs the phases one after another
# (--slices 1); a suffix `20` adds --idle-spin-us 20 (the library's idle spin; the bench's
# is 200), and then `ns` --spinning-waiters 0 (only the high client's waiter spins). The same build, measured several ways in one call. Then, with
# TESTS="t_gpu_priority ...", those GPU test binaries (TESTS=all: `gpu_tests`, every one).
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
  grep -E "^\| (bf16|f32) " $LOGS/rounds_$1.log | cut -d'|' -f2-12,15-17; finish; }
i=0
for r in $(echo ${RUNS:-sliced,whole,sliced} | tr , ' '); do
  i=$((i+1)); args="--slices 1"
  case $r in sliced*) args="--slices ${SLICES:-5}" ;; esac
  case $r in *20*) args="$args --idle-spin-us 20" ;; esac
  case $r in *ns) args="$args --spinning-waiters 0" ;; esac
  run ${r}_$i $args
done
[ "${TESTS:-}" = all ] && { gpu_tests; exit; }
SUMMARY='test result|FAILED|panicked|SKIPPED'
for n in ${TESTS:-}; do
  step $n 60 $B/$n; grep -hE "test result|FAILED|panicked" $LOGS/$n.log | head -2
done
finish

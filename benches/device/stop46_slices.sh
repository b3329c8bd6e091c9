#!/usr/bin/env bash
# Stop 46's third device call (issue 33 item 5): bench_serve's priority rounds (ROUNDS, 5, in
# one process each) for each entry of RUNS (default: sliced,whole,sliced): `sliced` cuts each
# phase into SLICES (5) alternated slices, `whole` runs the phases one after another
# (--slices 1); a suffix `20` adds --idle-spin-us 20 (the library's idle spin; the bench's
# is 200), and then `ns` --spinning-waiters 0 (only the high client's waiter spins); a suffix
# `+bw`, `+bc`, `+hp`, `+lw` or `+hc` injects stalls (--inject-stalls, STALL: MS:PER_S, default
# 2:20) on the batch workers', the batch clients', the high path's, the latency workers' or the
# high client's cores. The same build, measured
# several ways in one call. Logs to S46_LOGS (/tmp/bp-s46s), packed as S46_TGZ (s46s.tgz). Then, with TESTS="t_gpu_priority ...",
# those GPU test binaries (TESTS=all: `gpu_tests`, every one).
# Here: `bash benches/device/pack.sh`, then with carry [".devbin"]:
# `bash .devbin/stop46_slices.sh`.
cd "$(dirname "$0")/.."
source .devbin/lib.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; nproc
deadline ${TOTAL:-560}
logs_in ${S46_LOGS:-/tmp/bp-s46s} ${S46_TGZ:-s46s.tgz} fresh
SUMMARY='panicked|Error'
P="--priority-only --rounds ${ROUNDS:-5} --isolate high --high-partition 16 --no-torch --batch-clients 8,16,32 --seconds 1"
# Per cell, the rounds within each part of the target (p99 loaded ≤ 1.5x alone and ≤ 250 µs,
# batch kept ≥ 0.95), and the rounds within all three, split by the loaded phases' steal
# (≤ 30 ms: judged; more: the host's, as stop 45 set); then the rounds whose p99 missed, and
# how many of them had no steal on the high path's cores in their loaded phase.
within() { python3 - "$1" <<'PY'
import re, sys
cells, judged, stolen, missed, slow = {}, [0, 0], [0, 0], [], [0, 0]
for line in open(sys.argv[1]):
    f = [x.strip() for x in line.strip().strip('|').split('|')]
    if len(f) < 15 or f[0] not in ('bf16', 'f32'):
        continue
    a99, l99, kept = float(f[4]), float(f[7]), float(f[10])
    p99, kept = l99 <= 1.5 * a99 and l99 <= 250, kept >= 0.95
    steal = [int(x) for x in re.findall(r'\d+', f[13])]
    c = cells.setdefault(f'{f[0]} x{f[1]}', [0, 0, 0])
    c[0] += 1; c[1] += p99; c[2] += kept
    b = judged if steal[1] <= 30 else stolen
    b[0] += 1; b[1] += p99 and kept
    if not p99 and len(steal) == 4:
        missed.append(steal[3])
    slow[0] += int(f[11].split()[0]); slow[1] += int(f[12].split()[0])
print('within:', '; '.join(f'{k} p99 {v[1]}/{v[0]} kept {v[2]}/{v[0]}' for k, v in cells.items()))
print(f'within all three: {judged[1]} of {judged[0]} rounds with loaded steal <= 30 ms, {stolen[1]} of {stolen[0]} with more')
print(f'requests over 500 us, summed over the rounds: {slow[0]} alone, {slow[1]} loaded')
if missed:
    print(f'p99 missed in {len(missed)} rounds; {sum(m == 0 for m in missed)} of them had no steal on the high path\'s cores in the loaded phase (ms there: {sorted(missed)})')
PY
}
run() { step rounds_$1 150 $B/bench_serve $P "${@:2}"
  grep -E "^\| (bf16|f32) " $LOGS/rounds_$1.log | cut -d"|" -f2-12,15-19; within $LOGS/rounds_$1.log; finish; }
i=0
for r in $(echo ${RUNS:-sliced,whole,sliced} | tr , ' '); do
  i=$((i+1)); args="--slices 1"
  case $r in sliced*) args="--slices ${SLICES:-5}" ;; esac
  case $r in *20*) args="$args --idle-spin-us 20" ;; esac
  case $r in *ns|*ns+*) args="$args --spinning-waiters 0" ;; esac
  case $r in *+bw) args="$args --inject-stalls batch-workers:${STALL:-2:20}" ;;
    *+bc) args="$args --inject-stalls batch-clients:${STALL:-2:20}" ;;
    *+hp) args="$args --inject-stalls high-path:${STALL:-2:20}" ;;
    *+lw) args="$args --inject-stalls latency-workers:${STALL:-2:20}" ;;
    *+hc) args="$args --inject-stalls high-client:${STALL:-2:20}" ;; esac
  run ${r}_$i $args
done
[ "${TESTS:-}" = all ] && { gpu_tests; exit; }
SUMMARY='test result|FAILED|panicked|SKIPPED'
for n in ${TESTS:-}; do
  step $n 60 $B/$n; grep -hE "test result|FAILED|panicked" $LOGS/$n.log | head -2
done
finish

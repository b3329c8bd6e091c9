#!/usr/bin/env bash
# Stop 52's call (issue 33 item 5): the rounds as the target judges them, then the same rounds
# with stalls injected (bench_serve --inject-stalls, SCHED_FIFO threads that hold chosen cores
# off their threads 2 ms at a time, 20 times a second) on the batch workers', the high path's
# and the batch clients' cores, then stop 51's probe (with and without stalls on the batch
# workers' cores), strace count and no-trim rounds.
# Reading it: a loaded tail that grows with stalls on the batch's cores, while the alone one
# does not, comes from something user-space the high client shares with the batch (the
# probe's "launch call (cuGraphLaunch)" column then says whether it is the driver's lock); a
# tail that steal on those cores moves (stop 50) but stalls do not, from the hypervisor or the
# kernel (a stalled core still answers IPIs; the kernel never holds a thread off in a spinlock).
# Here: `bash benches/device/pack.sh`, then with carry [".devbin"]:
# `TOTAL=560 bash .devbin/stop52_call.sh` (timeout 580; the parts run in this order, each cut
# short where TOTAL runs out).
cd "$(dirname "$0")"
source ./lib.sh
deadline ${TOTAL:-560}
RUNS=sliced20 TOTAL=$(( ${TOTAL:-560} < 110 ? ${TOTAL:-560} : 110 )) bash ./stop46_slices.sh
left=$((END-SECONDS))
[ $left -gt 40 ] && RUNS=sliced20+bw,sliced20+hp,sliced20+bc ROUNDS=2 S46_LOGS=/tmp/bp-s52s \
  S46_TGZ=s52s.tgz TOTAL=$(( left < 160 ? left : 160 )) bash ./stop46_slices.sh
logs_in /tmp/bp-s52 s52.tgz fresh
SUMMARY='panicked|Error'
R="--isolate high --high-partition 16 --no-torch --idle-spin-us 20 --seconds 1"
for p in "stalls --inject-stalls batch-workers:${STALL:-2:20}" "plain"; do
  set -- $p; name=probe_$1; shift
  step $name 45 $B/bench_serve --tail-probe --batch-clients 32 $R "$@"
  grep -E "slowest|p45|beside|alone|placed|injected" $LOGS/$name.log | cut -c1-300; finish
done
if [ -n "$STRACE" ]; then
  step strace 40 $STRACE -f --seccomp-bpf -c -e trace=%memory,munmap,madvise -o $LOGS/strace.txt \
    $B/bench_serve --priority-only --rounds 1 --batch-clients 32 --slices 5 $R
  head -20 $LOGS/strace.txt; finish
fi
NOTRIM='glibc.malloc.trim_threshold=4294967295:glibc.malloc.mmap_threshold=33554432'
step rounds_notrim 110 env GLIBC_TUNABLES=$NOTRIM $B/bench_serve --priority-only --rounds 5 \
  --batch-clients 8,16,32 --slices 5 $R
grep -E "^\| (bf16|f32) " $LOGS/rounds_notrim.log | cut -d"|" -f2-12,15-19; finish
# The host pool alone on this 16-core host: stalls on the batch group's cores against the
# latency group's chain (bench_isolation; runs over half a stall are the test).
step isolation 30 $B/bench_isolation --seconds 1 --rounds 3 --stall 2:20
grep -E "^\||stalls|latency group" $LOGS/isolation.log; finish

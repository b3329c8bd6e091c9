#!/usr/bin/env bash
# Stop 52's call (issue 33 item 5): the rounds as the target judges them, then the same rounds
# with stalls injected (bench_serve --inject-stalls: SCHED_FIFO threads that hold chosen cores
# off their threads 2 ms at a time, 20 times a second) on the batch workers', the latency
# workers', the high client's and the batch clients' cores; the probe with and without stalls
# on the batch workers' cores; the memory system calls of one loaded round (the packed
# strace); the rounds under a glibc that never unmaps; bench_isolation on this host.
# Reading it: a loaded tail that grows with stalls on the batch's cores, while the alone one
# does not, comes from something user-space the high client shares with the batch (the
# probe's "launch call (cuGraphLaunch)" column then says whether it is the driver's lock); a
# tail that steal on those cores moves (stop 50) but stalls do not, from the hypervisor or the
# kernel (a stalled core still answers IPIs; the kernel never holds a thread off in a
# spinlock). Stalls on the latency workers' cores against the high client's: which of the
# high path's own cores a steal there costs the most (a worker holds its launched segment's
# completion until it polls it again).
# Here: `bash benches/device/pack.sh`, then with carry [".devbin"]:
# `TOTAL=560 bash .devbin/stop52_call.sh` (timeout 580; the parts run in this order, each cut
# short where TOTAL runs out).
cd "$(dirname "$0")"
source ./lib.sh
deadline ${TOTAL:-560}
RUNS=sliced20 TOTAL=$(( ${TOTAL:-560} < 110 ? ${TOTAL:-560} : 110 )) bash ./stop46_slices.sh
stalled() { local left=$((END-SECONDS)); [ $left -gt 40 ] || return 0
  RUNS=$1 ROUNDS=2 S46_LOGS=/tmp/bp-$2 S46_TGZ=$2.tgz TOTAL=$(( left < $3 ? left : $3 )) \
    bash ./stop46_slices.sh; }
stalled sliced20+bw,sliced20+lw,sliced20+hc s52s 155
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
stalled sliced20+bc s52c 52
logs_in /tmp/bp-s52 s52.tgz
NOTRIM='glibc.malloc.trim_threshold=4294967295:glibc.malloc.mmap_threshold=33554432'
step rounds_notrim 52 env GLIBC_TUNABLES=$NOTRIM $B/bench_serve --priority-only --rounds 2 \
  --batch-clients 8,16,32 --slices 5 $R
grep -E "^\| (bf16|f32) " $LOGS/rounds_notrim.log | cut -d"|" -f2-12,15-19; finish
# The host pool alone on this 16-core host: stalls on the batch group's cores, then on one of
# two latency workers', against the latency group's chain and against a request shaped as a
# GPU node makes it, its completion polled by its worker or sent by another thread (runs over
# half a stall).
step isolation 16 $B/bench_isolation --seconds 1 --rounds 2 --stall 2:20
for fg in chain device-poll device-completer; do
  step isolation_own_$fg 12 $B/bench_isolation --seconds 1 --rounds 2 --stall 2:20 \
    --latency-workers 2 --stall-on latency --fg $fg
done
grep -hE "^\| [0-9]|latency group" $LOGS/isolation*.log; finish

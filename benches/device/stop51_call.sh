#!/usr/bin/env bash
# Stop 51's call (issue 33 item 5): what carries the hypervisor's steal on the batch's cores to
# the high client. One process of priority rounds (stop46_slices.sh's sliced20), with each
# phase's TLB shootdowns and function-call IPIs; the tail probe; the memory system calls of one
# loaded round counted by the packed strace; then the rounds again with glibc's allocator
# told never to give memory back (GLIBC_TUNABLES: no trim, no mmap'd chunks), which removes the
# allocator's unmaps and so its TLB shootdowns.
# Here: `bash benches/device/pack.sh`, then with carry [".devbin"]: `bash .devbin/stop51_call.sh`.
cd "$(dirname "$0")"
source ./lib.sh
deadline ${TOTAL:-330}
RUNS=sliced20 TOTAL=110 bash ./stop46_slices.sh
logs_in /tmp/bp-s51 s51.tgz fresh
SUMMARY='panicked|Error'
R="--isolate high --high-partition 16 --no-torch --idle-spin-us 20 --seconds 1"
step probe 45 $B/bench_serve --tail-probe --batch-clients 32 $R
grep -E "slowest|p45|beside|alone|placed" $LOGS/probe.log | cut -c1-260; finish
if [ -n "$STRACE" ]; then
  step strace 40 $STRACE -f --seccomp-bpf -c -e trace=%memory,munmap,madvise -o $LOGS/strace.txt \
    $B/bench_serve --priority-only --rounds 1 --batch-clients 32 --slices 5 $R
  head -20 $LOGS/strace.txt; finish
fi
NOTRIM='glibc.malloc.trim_threshold=4294967295:glibc.malloc.mmap_threshold=33554432'
step rounds_notrim 110 env GLIBC_TUNABLES=$NOTRIM $B/bench_serve --priority-only --rounds 5 \
  --batch-clients 8,16,32 --slices 5 $R
grep -E "^\| (bf16|f32) " $LOGS/rounds_notrim.log | cut -d"|" -f2-12,15-18; finish

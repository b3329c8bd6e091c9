#!/usr/bin/env bash
# Issue 33 item 5: the high client's slowest 1% was a parked worker's wake-up. The launch probe
# (stop 43, first call) put it before the launch (submit -> launch begins: 150-290 µs in the
# slowest 1%, alone as beside the batch, against 12-27 µs at the median), with no thread waiting
# for a core: the high client sleeps 200 µs between requests, past the pool's idle spin, so its
# workers had parked by the next request. The paced spin (`PoolBuilder::paced_spin`, since
# stop 44 on by default where the pool leaves two cores to other threads, as here) keeps one worker of each group watching through pauses at its work's pace. Here, in
# one call of at most TOTAL seconds (default 330): the priority rounds with it on
# (`--paced-spin-us PACED_US`, default 1000; ON_ROUNDS, default 5: the target is 5 of 5; first,
# so that a call cut short keeps them) and off (`--paced-spin-us 0`; OFF_ROUNDS, default 2), then the
# probe with it on. Here: pack.sh, then with carry [".devbin"]: `bash .devbin/spin_call.sh`.
source .devbin/lib.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; nproc
deadline ${TOTAL:-330}
logs_in /tmp/bp-spin spin.tgz fresh
SUMMARY='panicked|Error'
P="--isolate high --high-partition 16 --no-torch --batch-clients 8,16,32 --seconds 1"
step on 150 $B/bench_serve --priority-only --rounds ${ON_ROUNDS:-5} --paced-spin-us ${PACED_US:-1000} $P
grep -E "^\| (bf16|f32) " $LOGS/on.log | cut -d'|' -f2-12
finish
step off 70 $B/bench_serve --priority-only --rounds ${OFF_ROUNDS:-2} --paced-spin-us 0 $P
grep -E "^\| (bf16|f32) " $LOGS/off.log | cut -d'|' -f2-12
finish
step probe 48 $B/bench_serve --tail-probe --seconds 1 --batch-clients 32 --isolate high --high-partition 16 --no-torch --paced-spin-us ${PACED_US:-1000}
grep -hE "^\| (p45|slowest)|beside|alone" $LOGS/probe.log | cut -c1-200
finish

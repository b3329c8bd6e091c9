#!/usr/bin/env bash
# The spare wake-up (branch `spare-wake`: a high source's placement, and a high task pushed
# from outside the pool, wake one worker more, where the paced spin is on) against this build,
# alternated on the 16-core host: bench_isolation with one of two latency workers stalled (a
# chain, and a request whose completion another thread sends), the host latency bench, and
# bench_serve's priority rounds (2 rounds of bf16 and f32 beside 8 and 32).
# Here: `PACK_REVS="spare=spare-wake" bash benches/device/pack.sh`, then with carry
# [".devbin"]: `bash .devbin/spare_ab.sh` (timeout 580).
cd "$(dirname "$0")"
source ./lib.sh
deadline ${TOTAL:-560}
logs_in /tmp/bp-spare spare.tgz fresh
SUMMARY='panicked|Error'
I="--seconds 1 --rounds 2 --latency-workers 2 --stall-on latency --stall 2:20"
alternate iso_chain bench_isolation spare 2 20 $I
alternate iso_completer bench_isolation spare 2 20 $I --fg device-completer
grep -HE "^\| [0-9]" $LOGS/iso_*.log | sed 's|.*/||' | cut -c1-200
alternate latency boundpool spare 2 30 bench --latency --seconds 2 --quiet --threads 8
grep -HE "alone \(high\)|loaded, high" $LOGS/latency_*.log | sed 's|.*/||'
alternate serve bench_serve spare 2 80 --priority-only --rounds 2 --isolate high \
  --high-partition 16 --no-torch --batch-clients 8,32 --seconds 1 --slices 5 --idle-spin-us 20
for f in $LOGS/serve_*.log; do echo "${f##*/}"; grep -E "^\| (bf16|f32) " $f | cut -d"|" -f2-12,15-19; done
finish

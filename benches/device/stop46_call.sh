#!/usr/bin/env bash
# Stop 46's device calls (issue 33 item 5): bench_serve's priority rounds, ROUNDS (5) in one
# process per entry of ORDER (a list of builds: `new` is this pack's, any other NAME is
# .devbin/v/NAME/bench_serve, copied there by hand), then, with CROWDED="32 64",
# benches/examples/crowded_clients of the same builds (v/NAME/crowded_clients; `new`:
# $B/crowded_clients) alternated three times with CROWDED_WORKERS (8) workers, then, unless
# NO_PROBE, the launch probe beside 32 on the new build, then with TESTS every GPU test binary.
# EXTRA: more bench_serve arguments for every round (e.g. --spinning-waiters 0).
# Here: `bash benches/device/pack.sh` (or a .devbin with lib.sh, this script and b.tar.xz
# holding what it runs), then with carry [".devbin"]: `ORDER=new,base bash .devbin/stop46_call.sh`.
cd "$(dirname "$0")/.."
source .devbin/lib.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; nproc
deadline ${TOTAL:-560}
logs_in /tmp/bp-s46 s46.tgz fresh
SUMMARY='panicked|Error'
# The scheduler's placement tests where a machine has the cores for them (t_placement, copied
# in by hand from target/release/deps/placement-*).
if [ -x t_placement ]; then
  SUMMARY='test result|FAILED|panicked|skipped'; step placement 20 ./t_placement --nocapture
  SUMMARY='panicked|Error'
fi
P="--isolate high --high-partition 16 --no-torch --batch-clients 8,16,32 --seconds 1 ${EXTRA:-}"
bin_of() { if [ "$1" = new ]; then echo "$B/$2"; else echo "$PWD/v/$1/$2"; fi; }
i=0
for v in $(echo ${ORDER:-new} | tr , ' '); do
  i=$((i+1))
  step rounds_${v}_$i 150 $(bin_of $v bench_serve) --priority-only --rounds ${ROUNDS:-5} $P
  grep -E "^\| (bf16|f32) " $LOGS/rounds_${v}_$i.log | cut -d'|' -f2-12
  finish
done
if [ -n "${CROWDED:-}" ]; then
  # crowded_clients: host work only, each build of ORDER once per round.
  for r in 1 2 3; do for v in $(echo ${ORDER:-new} | tr , '\n' | sort -u); do
    for c in ${CROWDED}; do
      step crowded_${v}_${c}_$r 10 $(bin_of $v crowded_clients) $c 2 ${CROWDED_WORKERS:-8}
      cat $LOGS/crowded_${v}_${c}_$r.log
    done
  done; done
  finish
fi
if [ -z "${NO_PROBE:-}" ]; then
  step probe 48 $B/bench_serve --tail-probe --seconds 1 --batch-clients 32 --isolate high --high-partition 16 --no-torch
  grep -hE "^\| (p45|slowest)|beside|alone" $LOGS/probe.log | cut -c1-220
  finish
fi
[ -n "${TESTS:-}" ] && gpu_tests

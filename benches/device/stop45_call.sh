#!/usr/bin/env bash
# Stop 45's first device call (issue 33 item 5): the sharded active-run table (`active.rs`,
# build 5c4bf84) against the build before it (b394845, `OLD_SERVE`, copied into .devbin/old/).
# bench_serve's priority rounds, 5 in one process each, new then old (ORDER: any list of new
# and old, e.g. old,new,new),
# then the launch probe beside 32 on the new build, then every GPU test binary if time is left.
# CROWDED="32 64": also benches/examples/crowded_clients of both builds (the old one built from
# b394845 with the example copied in), alternated three times, with CROWDED_WORKERS (8) workers.
# Here: `bash benches/device/pack.sh`, copy the old bench_serve to .devbin/old/bench_serve,
# then with carry [".devbin"]: `bash .devbin/stop45_call.sh`.
cd "$(dirname "$0")/.."
source .devbin/lib.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; nproc
deadline ${TOTAL:-560}
logs_in /tmp/bp-s45 s45.tgz fresh
SUMMARY='panicked|Error'
P="--isolate high --high-partition 16 --no-torch --batch-clients 8,16,32 --seconds 1"
i=0
for v in $(echo ${ORDER:-new,old} | tr , ' '); do
  i=$((i+1)); bin=$B/bench_serve; [ $v = old ] && bin=$PWD/old/bench_serve
  step rounds_${v}_$i 150 $bin --priority-only --rounds ${ROUNDS:-5} $P
  grep -E "^\| (bf16|f32) " $LOGS/rounds_${v}_$i.log | cut -d'|' -f2-12
  finish
done
if [ -n "${CROWDED:-}" ]; then
  # crowded_clients (benches/examples) of both builds, alternated: host work only.
  for r in 1 2 3; do for v in new old; do
    bin=$PWD/crowded_clients_new; [ $v = old ] && bin=$PWD/old/crowded_clients
    for c in ${CROWDED}; do
      step crowded_${v}_${c}_$r 10 $bin $c 2 ${CROWDED_WORKERS:-8}; cat $LOGS/crowded_${v}_${c}_$r.log
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

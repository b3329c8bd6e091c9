#!/usr/bin/env bash
# On the GPU machine, after `PACK_REVS="old=REV" bash benches/device/pack.sh` here: the replay bench
# of this build and of the packed revisions named in REPLAY_REVS (default: every revs/NAME with
# a bench_replay), alternated ROUNDS times
# (default 3), `--shapes independent,chain --rounds 3 --per-round 20`: tells a change of the
# code from a change of the machine (the chain replay ran at 0.85x raw on one H100 machine and
# 0.96-0.98x on others). Then the graph variants once more. Logs: $OUT/logs.tgz.
source "$(dirname "$0")/lib.sh"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
alternate replay bench_replay "${REPLAY_REVS:-}" ${ROUNDS:-3} 60 \
  --shapes independent,chain --rounds 3 --per-round 20
for f in $LOGS/replay_*.log; do
  echo "-- $(basename $f .log):"
  tr '\r' '\n' < $f | grep -v "rounds$" | grep -iE "independent|chain" | tail -n 6 | cut -c1-150
done
step variants 60 $B/bench_replay --variants --shapes independent,chain --rounds 5 --runs 100
grep -vE "^\s*$" $LOGS/variants.log | tail -n 24 | cut -c1-150
finish

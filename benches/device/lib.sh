#!/usr/bin/env bash
# Sourced on the GPU machine for ad-hoc runs: `source .devbin/lib.sh; step NAME SECS CMD...`.
# Unpacks the binaries to $B, logs each step to $LOGS/NAME.log, prints a one-line summary, and
# `finish` packs the logs into $OUT/logs.tgz. BUDGET (default 570) bounds all steps together.
cd "$(dirname "${BASH_SOURCE[0]}")"; [ -d b ] || tar xJf b.tar.xz; B=$PWD/b
# The binaries of other revisions (pack.sh's PACK_REVS), as revs/NAME/{boundpool,bench_replay}.
for f in revs/*/*.xz; do [ -f "$f" ] && xz -dkf "$f" && chmod +x "${f%.xz}"; done
LOGS=/tmp/boundpool-logs; mkdir -p $LOGS
export BOUNDPOOL_REQUIRE_GPU=1
END=$((SECONDS+${BUDGET:-570}))
CS="compute-sanitizer --error-exitcode 99 --print-limit 20"
step() { local name=$1 lim=$2; shift 2; local left=$((END-SECONDS)); [ $left -lt $lim ] && lim=$left
  if [ $lim -le 5 ]; then echo "== $name: SKIPPED (no time)"; return; fi
  timeout -k 5 $lim "$@" > $LOGS/$name.log 2>&1; local rc=$?
  echo "== $name rc=$rc @${SECONDS}s: $(grep -hE 'ERROR SUMMARY|RACECHECK SUMMARY|test result|FAILED|panicked|HUNG' $LOGS/$name.log | sort | uniq -c | tr '\n' ' ' | cut -c1-300)"; }
finish() { tar czf $OUT/logs.tgz -C $LOGS .; }
# `alternate NAME FILE "REVS" ROUNDS SECS ARGS...`: $B/FILE (as `new`) and revs/R/FILE for each R
# in REVS (empty: every packed revision that has FILE), alternated ROUNDS times, each run with
# ARGS as step NAME_<which>_<round>; the logs are packed after every step, so a cut-off call
# still brings back what ran.
alternate() { local name=$1 file=$2 revs=$3 rounds=$4 secs=$5; shift 5
  local bins="new=$B/$file" n r spec
  for n in ${revs:-$(ls revs 2>/dev/null)}; do
    [ -x revs/$n/$file ] && bins="$bins $n=$PWD/revs/$n/$file"
  done
  for r in $(seq 1 $rounds); do
    for spec in $bins; do step ${name}_${spec%%=*}_$r $secs ${spec#*=} "$@"; finish; done
  done; }

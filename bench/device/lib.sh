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

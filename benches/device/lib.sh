#!/usr/bin/env bash
# The library every device script sources (and ad-hoc runs on the GPU machine:
# `source .devbin/lib.sh; step NAME SECS CMD...; finish`). Sourcing it moves into .devbin,
# unpacks the binaries to $B (and other revisions' to revs/NAME/, see pack.sh's PACK_REVS),
# exports BOUNDPOOL_REQUIRE_GPU=1 and sets CS (the compute-sanitizer command), STRACE (the
# packed strace, when there is one) and:
#   logs_in DIR TGZ [fresh]   logs go to DIR, `finish` packs them into $OUT/TGZ; `fresh` empties
#                             DIR first (default: /tmp/boundpool-logs, logs.tgz, kept)
#   deadline SECS             every later step ends within SECS from now (default: BUDGET, 570)
#   step NAME SECS CMD...     runs CMD into $LOGS/NAME.log under `timeout` (SECS, or less when
#                             the deadline is nearer; skipped under 6 s) and prints a line with
#                             its exit status and `summary` of the log; with STEP_START=1 also a
#                             line as it starts
#   summary FILE              the log's lines matching SUMMARY (an extended regex; empty: none),
#                             counted; a script may define its own after sourcing this
#   finish                    packs $LOGS into $OUT/$TGZ (call it after every step worth keeping:
#                             a call cut off at its limit still brings back what ran)
#   alternate ...             A/B runs of this build and the packed revisions, below
#   gpu_tests                 every GPU test binary but NCCL's, one step each, then `finish`
cd "$(dirname "${BASH_SOURCE[0]}")"
# Unpacked once per pack: a new b.tar.xz (a new carry) replaces b/.
if [ ! -f b/.unpacked ] || [ b.tar.xz -nt b/.unpacked ]; then
  rm -rf b; tar xJf b.tar.xz && touch b/.unpacked
fi
B=$PWD/b
# The binaries of other revisions (pack.sh's PACK_REVS), as revs/NAME/{boundpool,bench_*,gpu_probe}.
for f in revs/*/*.xz; do [ -f "$f" ] && xz -dkf "$f" && chmod +x "${f%.xz}"; done
export BOUNDPOOL_REQUIRE_GPU=1
CS="compute-sanitizer --error-exitcode 99 --print-limit 20"
# The packed strace (pack.sh), empty where none was packed.
STRACE=; [ -x strace/strace ] && STRACE="env LD_LIBRARY_PATH=$PWD/strace $PWD/strace/strace"
SUMMARY='ERROR SUMMARY|RACECHECK SUMMARY|test result|FAILED|panicked|HUNG'
STEP_START=
logs_in() { LOGS=$1; TGZ=$2; [ "${3:-}" = fresh ] && rm -rf "$LOGS"; mkdir -p "$LOGS"; }
deadline() { END=$((SECONDS+$1)); }
logs_in /tmp/boundpool-logs logs.tgz
deadline "${BUDGET:-570}"
summary() { [ -n "$SUMMARY" ] && grep -hE "$SUMMARY" "$1" | sort | uniq -c | tr '\n' ' ' | cut -c1-300; }
step() { local name=$1 lim=$2; shift 2; local left=$((END-SECONDS)); [ $left -lt $lim ] && lim=$left
  if [ $lim -le 5 ]; then echo "== $name: SKIPPED (no time)"; return; fi
  [ -n "$STEP_START" ] && echo "== $name (limit ${lim}s) @${SECONDS}s"
  timeout -k 5 $lim "$@" > "$LOGS/$name.log" 2>&1; local rc=$? s
  s=$(summary "$LOGS/$name.log")
  echo "== $name rc=$rc @${SECONDS}s${s:+: $s}"; }
finish() { tar czf "$OUT/$TGZ" -C "$LOGS" .; }
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
# `gpu_tests`: every packed GPU test binary except the NCCL ones (ranks_gpu_call.sh runs
# those), one step of up to 60 s each (t_gpu_replay one test at a time), then `finish`.
gpu_tests() { local SUMMARY='test result|FAILED|panicked|SKIPPED' t n a
  for t in $B/t_gpu_* $B/t_boundpool_gpu $B/t_prometheus_gpu; do
    n=$(basename $t); a=; [ $n = t_gpu_replay ] && a=--test-threads=1
    case $n in t_gpu_nccl|t_gpu_ranks_nccl) continue ;; esac
    step $n 60 $t $a; grep -hE "test result|FAILED|panicked" $LOGS/$n.log | head -2
  done
  finish; }

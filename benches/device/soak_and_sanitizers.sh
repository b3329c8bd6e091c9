#!/usr/bin/env bash
# On the GPU machine: `SOAK_S=570 bash .devbin/soak_and_sanitizers.sh` (after benches/device/pack.sh
# here). `boundpool soak --gpu` for SOAK_S seconds (default 450), and meanwhile compute-sanitizer
# (memcheck, racecheck, synccheck) over the GPU test binaries and examples, started after the
# soak has taken its warm-up level and ended before the soak ends (the soak checks that device
# free memory returns to that level, and a sanitizer process holds device memory). Logs: $OUT/logs2.tgz.
# A soak longer than one call: `DETACH=1 SOAK_S=600 bash .devbin/soak_and_sanitizers.sh` starts it
# in its own session (it outlives the call), runs the sanitizers and returns; then, within the
# machine's idle window, `bash .devbin/soak_collect.sh` waits for it and returns its logs.
source "$(dirname "$0")/lib.sh"
# Kept across calls (not emptied): a detached soak writes here, and soak_collect.sh packs it.
logs_in /tmp/boundpool-logs2 logs2.tgz
SUMMARY='ERROR SUMMARY|RACECHECK SUMMARY|test result|HUNG'
# Each sanitizer line as it is, and the count of API errors ("Invalid"), see below.
summary() { echo "$(grep -hE "$SUMMARY" "$1" | tr '\n' ' ') invalid=$(grep -c Invalid "$1")"; }
if [ -n "$DETACH" ]; then
  setsid bash -c "$B/boundpool soak --gpu --seconds ${SOAK_S:-450} --json > $LOGS/soak.json 2> $LOGS/soak.err; echo \$? > $LOGS/soak.rc" < /dev/null > /dev/null 2>&1 &
  sleep 1; pgrep -f "boundpool soak" | head -1 > $LOGS/soak.pid
else
  $B/boundpool soak --gpu --seconds ${SOAK_S:-450} --json > $LOGS/soak.json 2> $LOGS/soak.err & SOAK=$!
fi
sleep 12   # after the soak's warm-up level is taken
deadline $((${SOAK_S:-450}-40))   # the sanitizers end before the soak does
# Under a sanitizer every call is many times slower: the tests' hang watchdogs get 20 times
# their limit, and gpu_graphs runs one test at a time (seven at once starved each other past the
# watchdog on an H100) without its 100,000-launch throughput test. Every test binary deliberately
# provokes some driver errors, which the sanitizer lists as API errors (an out-of-memory
# allocation, a missing kernel, a refused cuGraphExecUpdate): grep the logs for "Invalid" and
# "hazard" to tell them from memory errors and races. gpu_sticky is left out of memcheck: it
# plants a write through a null pointer, which memcheck reports (and turns into a launch failure
# the test does not expect).
export BOUNDPOOL_WATCHDOG_SCALE=20
G="--test-threads=1 --skip counting_kernel_from_100k_nodes"
step mc_gpu_graphs 150 $CS --tool memcheck $B/t_gpu_graphs $G
step mc_gpu_replay 90 $CS --tool memcheck $B/t_gpu_replay --test-threads=1
step racecheck_pipeline 40 $CS --tool racecheck $B/gpu_pipeline
step synccheck_pipeline 25 $CS --tool synccheck $B/gpu_pipeline
step mc_cholesky 40 $CS --tool memcheck $B/cholesky --n 2048 --tile 512
step mc_pipeline 25 $CS --tool memcheck $B/gpu_pipeline
for t in gpu_blas gpu_priority gpu_leak gpu_placement gpu_trace gpu_threads gpu_release; do step mc_$t 40 $CS --tool memcheck $B/t_$t; done
step racecheck_cholesky 90 $CS --tool racecheck $B/cholesky --n 512 --tile 128
step racecheck_graphs 150 $CS --tool racecheck $B/t_gpu_graphs $G
for tool in synccheck; do step ${tool}_graphs 40 $CS --tool $tool $B/t_gpu_graphs; step ${tool}_replay 40 $CS --tool $tool $B/t_gpu_replay --test-threads=1; step ${tool}_cholesky 40 $CS --tool $tool $B/cholesky --n 2048 --tile 512; done
step racecheck_replay 120 $CS --tool racecheck $B/t_gpu_replay --test-threads=1
echo "== sanitizers done @${SECONDS}s"
if [ -z "$DETACH" ]; then
  wait $SOAK; echo "== soak rc=$? @${SECONDS}s"; tail -c 2500 $LOGS/soak.json; tail -n 5 $LOGS/soak.err
fi
for f in $LOGS/*.log; do grep -lE "FAILED|panicked" $f; done | head; grep -h -B2 -A12 "panicked" $LOGS/mc_*.log $LOGS/racecheck_*.log $LOGS/synccheck_*.log 2>/dev/null | head -60
finish

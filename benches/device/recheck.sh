#!/usr/bin/env bash
# On the GPU machine, after benches/device/pack.sh here: every GPU test, the GPU and replay benches,
# then the compute-sanitizer runs that need more time than soak_and_sanitizers.sh gives them
# (memcheck over gpu_graphs and gpu_replay, racecheck over the pipeline, Cholesky and gpu_graphs),
# the observe bench and the host scaling bench (new binary, and revs/old/boundpool of
# `PACK_REVS="old=REV" pack.sh` if present, alternated), all within BUDGET seconds (default 490). Logs: $OUT/logs3.tgz.
REAL_OUT=$OUT; OUT=/tmp/boundpool-logs3; rm -rf $OUT; mkdir -p $OUT
cd "$(dirname "$0")"; tar xJf b.tar.xz; B=$PWD/b
for f in revs/*/*.xz; do [ -f "$f" ] && xz -dkf "$f" && chmod +x "${f%.xz}"; done
export BOUNDPOOL_REQUIRE_GPU=1
END=$((SECONDS+${BUDGET:-490}))
step() { local name=$1 lim=$2; shift 2; local left=$((END-SECONDS)); [ $left -lt $lim ] && lim=$left
  if [ $lim -le 5 ]; then echo "== $name: SKIPPED (no time)"; return; fi
  timeout -k 5 $lim "$@" > $OUT/$name.log 2>&1; local rc=$?
  echo "== $name rc=$rc @${SECONDS}s: $(grep -hE 'ERROR SUMMARY|HAZARD|test result|FAILED|panicked|MISMATCH|all sums' $OUT/$name.log | sort | uniq -c | tr '\n' ' ' | cut -c1-400)"; }
nvidia-smi --query-gpu=name --format=csv,noheader
for t in $B/t_*; do n=$(basename $t); a=; [ $n = t_gpu_replay ] && a=--test-threads=1; step $n 60 $t $a; done
step bench_gpu 40 $B/bench_gpu --runs 3; grep -E "ratio|submitters|chain across|PASS|MISS" $OUT/bench_gpu.log | cut -c1-150
step replay 40 $B/bench_replay --rounds 5 --per-round 20; tr '\r' '\n' < $OUT/replay.log | grep -v "rounds$" | tail -n 8 | cut -c1-150
CS="compute-sanitizer --error-exitcode 99 --print-limit 20"
step mc_gpu_graphs 130 $CS --tool memcheck $B/t_gpu_graphs
step mc_gpu_replay 130 $CS --tool memcheck $B/t_gpu_replay --test-threads=1
step racecheck_pipeline 40 $CS --tool racecheck $B/gpu_pipeline
step racecheck_cholesky 60 $CS --tool racecheck $B/cholesky --n 1024 --tile 256
step observe 40 env BOUNDPOOL_BENCH_RUNS=5 $B/bench_observe; grep -E "tracing on|baseline|wavefront|chain" $OUT/observe.log | head -12
for r in 1 2; do
  step scaling_new$r 25 $B/boundpool bench --scaling --scale 0.3 --runs 3
  [ -x revs/old/boundpool ] && step scaling_old$r 25 revs/old/boundpool bench --scaling --scale 0.3 --runs 3
done
for f in $OUT/scaling_*.log; do echo "-- $f"; grep -E " (1|16) " $f | cut -c1-100; done
step racecheck_graphs 200 $CS --tool racecheck $B/t_gpu_graphs
tar czf $REAL_OUT/logs3.tgz -C $OUT .

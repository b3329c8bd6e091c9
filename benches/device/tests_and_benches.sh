#!/usr/bin/env bash
# On the GPU machine, from the repository root: `bash .devbin/tests_and_benches.sh` (after
# benches/device/pack.sh here). Every GPU test with BOUNDPOOL_REQUIRE_GPU=1, then the GPU benches
# and the host scaling bench, each under its own time limit inside BUDGET seconds (default 560).
# Prints a summary; the full logs come back as $OUT/logs.tgz.
source "$(dirname "$0")/lib.sh"
logs_in /tmp/boundpool-logs logs.tgz fresh; deadline ${BUDGET:-560}
SUMMARY=; STEP_START=1   # a line as each step starts; each step's lines of note after it
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader; nproc
for t in $B/t_*; do
  n=$(basename $t); a=; [ $n = t_gpu_replay ] && a=--test-threads=1   # it checks free memory
  step $n 120 $t $a; grep -hE "test result|FAILED|panicked|SKIPPED" $LOGS/$n.log | head -8
done
step bench_gpu 90 $B/bench_gpu --runs 3; tail -n 30 $LOGS/bench_gpu.log | cut -c1-140
step chol 120 $B/bench_cholesky --n 4096,8192,16384 --tiles 512,1024,2048 --runs ${CHOL_RUNS:-2}; grep -vE "^\s*$" $LOGS/chol.log | tail -n 16 | cut -c1-140
step chol16k 100 $B/bench_cholesky --n 16384 --tiles 2048,3072,4096 --runs 3; grep -vE "^\s*$" $LOGS/chol16k.log | tail -n 8 | cut -c1-140
step chol16k_merged 100 $B/bench_cholesky --n 16384 --tiles 1024,2048,4096 --runs 3 --merge; grep -vE "^\s*$" $LOGS/chol16k_merged.log | tail -n 8 | cut -c1-140
step chol32k 70 $B/bench_cholesky --n 32768 --tiles 1024,2048 --runs 1; tail -n 5 $LOGS/chol32k.log | cut -c1-140
step replay 70 $B/bench_replay --rounds 5 --per-round 20; tr '\r' '\n' < $LOGS/replay.log | grep -v "rounds$" | tail -n 10 | cut -c1-140
step latency 60 $B/boundpool bench --latency --gpu --json --threads 8 --seconds 2; tail -c 1000 $LOGS/latency.log; echo
step latency_host 30 $B/boundpool bench --latency --json --seconds 2; tail -c 700 $LOGS/latency_host.log; echo
step scaling 110 $B/boundpool bench --scaling --scale 0.3 --runs 3; tail -n 21 $LOGS/scaling.log | cut -c1-140
step cholex 25 $B/cholesky --n 8192 --tile 1024 --trace $LOGS/chol_trace.json; tail -n 4 $LOGS/cholex.log
# The tiled Cholesky's SM-partition sweep (issue "SM partitions"): the DAG's panel group on a
# partition of S SMs, its updates on the rest, a row per S and tile beside the DAG column and the
# cuSOLVER call (targets: N = 16384 >= 1.0x, 8192 >= 0.9x, 32768 no slower than the DAG). Last,
# so that it takes only the time the steps above leave; a cut-off run keeps the rows it printed.
# CHOL_PART_SMS picks the sizes (multiples of 8).
step chol_part 200 $B/bench_cholesky --n 8192,16384,32768 --tiles 1024,2048,4096 --runs ${CHOL_RUNS:-2} --partition-sms ${CHOL_PART_SMS:-16,32,48,64,96}
grep -E "^ *[0-9]+ +[0-9-]+ +[0-9]+(\+[0-9]+)? \|" $LOGS/chol_part.log | grep -E "\+|skipped" | cut -c1-110
finish

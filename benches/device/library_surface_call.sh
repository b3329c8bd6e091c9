#!/usr/bin/env bash
# The GPU-machine call for issue 36 items 2, 3 and 6 (one library surface: the Cholesky's f64
# routines on cudarc's handles in the bench crate; the raw baselines and the probe on cudarc's
# types; the tests on boundpool-test-support). Here, first:
#   PACK_REVS="base=main" bash benches/device/pack.sh      # this build, and main's
# then run with carry [".devbin"]: `bash .devbin/library_surface_call.sh`. Every GPU test of this
# build (BOUNDPOOL_REQUIRE_GPU=1, one test at a time), the probe (plain and --sticky, separate
# processes), the Cholesky example (its residual, <= 1e-12), then this build's and main's raw
# baselines (`gpu_probe --baselines`), tiled Cholesky and eager bench alternated ROUNDS times
# (default 2): the baselines' figures, the Cholesky's GFLOP/s and spot checks, and bench_gpu's
# raw columns must match main's within run-to-run noise. Logs: $OUT/logs.tgz.
source "$(dirname "$0")/lib.sh"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; nproc
for t in $B/t_*; do n=$(basename $t); step $n 120 $t --test-threads=1; finish; done
step probe 60 $B/gpu_probe; grep -E "WRONG|FAILED|ok\)" $LOGS/probe.log | head -8
step probe_sticky 60 $B/gpu_probe --sticky; tail -n 4 $LOGS/probe_sticky.log
step cholex 60 $B/cholesky --n 8192 --tile 1024; tail -n 3 $LOGS/cholex.log; finish
alternate baselines gpu_probe "" ${ROUNDS:-2} 60 --baselines
alternate chol bench_cholesky "" ${ROUNDS:-2} 60 --n 4096,8192 --tiles 512,1024 --runs 2
alternate gpu bench_gpu "" ${ROUNDS:-2} 60 --runs 3
echo "-- raw baselines (call costs; raw k=1..16; thread per task; server; chains):"
for f in $LOGS/baselines_*.log; do
  echo "$(basename $f .log): $(grep -E '^(call costs|raw k=|thread per task|server thread|event edge|host sync)' $f | sed -E 's/ launches\/s|\/s|us\/edge//' | tr '\n' ';')"
done
echo "-- Cholesky (rows with GFLOP/s; any spot-check failure says so):"
for f in $LOGS/chol_*.log; do echo "$(basename $f .log):"; grep -E "^ *[0-9]+ +[0-9]+ |above 1e-12|Error" $f | head -8; done
echo "-- bench_gpu raw columns (independent k: raw launches/s; 8 submitters; chains):"
for f in $LOGS/gpu_*.log; do
  echo "$(basename $f .log): $(grep -E '^independent k=' $f | sed -E 's/.*raw +([0-9]+) launches.*/\1/' | tr '\n' ' ')"
  grep -E '^8 submitters|^chain runs' $f | cut -c1-200
done
finish

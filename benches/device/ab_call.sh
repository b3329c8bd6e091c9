#!/usr/bin/env bash
# One GPU-machine call for a change to the GPU crate: every GPU test of this build (with
# BOUNDPOOL_REQUIRE_GPU=1), the examples, then the eager and replay benches of this build and of
# a baseline build alternated in the same call (ROUNDS times, default 2), then a short GPU soak
# (SOAK_S seconds, default 60) and memcheck over the given test binaries (MEMCHECK, default
# "t_gpu_cudarc"). Here, first:
#   cp -r <an older .devbin> .devbin-base      # the baseline's pack (benches/device/pack.sh)
#   bash benches/device/pack.sh                # this build
# then run with carry [".devbin", ".devbin-base"]: `bash .devbin/ab_call.sh`. Logs: $OUT/logs.tgz.
source "$(dirname "$0")/lib.sh"
BASE=$(cd ../.devbin-base && ([ -d b ] || tar xJf b.tar.xz) && echo "$PWD/b")  # lib.sh left us in .devbin
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; nproc
for t in $B/t_*; do n=$(basename $t); step $n 120 $t --test-threads=1; done; finish
step ex_cudarc_nodes 60 $B/cudarc_nodes 64; tail -n 2 $LOGS/ex_cudarc_nodes.log
step ex_gpu_pipeline 60 $B/gpu_pipeline; tail -n 2 $LOGS/ex_gpu_pipeline.log; finish
for r in $(seq 1 ${ROUNDS:-2}); do
  for side in base new; do
    bin=$B; [ $side = base ] && bin=$BASE
    step gpu_${side}_$r 60 $bin/bench_gpu --runs 3
    step replay_${side}_$r 60 $bin/bench_replay --rounds 5 --per-round 20
    finish
  done
done
echo "-- eager (independent k=1,2,4,8,16: ratio to raw; chain us/edge):"
for f in $LOGS/gpu_*.log; do
  echo "$(basename $f .log): $(grep -E '^independent k=' $f | sed -E 's/.*ratio ([0-9.]+) .*/\1/' | tr '\n' ' ')chain $(grep -E '^chain across workers' $f | sed -E 's/.*boundpool ([0-9.]+) us.*/\1/')"
  echo "  cudarc launch / own launch: $(grep -E '^cudarc launch k=' $f | sed -E 's/.*raw, ([0-9.]+)x.*/\1/' | tr '\n' ' ')"
done
echo "-- replay (shape vs-raw):"
for f in $LOGS/replay_*.log; do echo "$(basename $f .log): $(tr '\r' '\n' < $f | grep -E '^(independent|chain|wavefront) ' | awk '{print $1 $2 "=" $(NF-5)}' | tr '\n' ' ')"; done
step soak $((${SOAK_S:-60}+30)) $B/boundpool soak --gpu --seconds ${SOAK_S:-60} --json; tail -c 600 $LOGS/soak.log; echo; finish
for t in ${MEMCHECK:-t_gpu_cudarc}; do
  BOUNDPOOL_WATCHDOG_SCALE=20 step mc_$t 120 $CS --tool memcheck $B/$t --test-threads=1
done
finish

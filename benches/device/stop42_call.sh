#!/usr/bin/env bash
# Stop 42's device call, at most TOTAL seconds (default 120), parts in order of need:
# 1. the launch probe's GPU test and one `--tail-probe` beside 32 and 8 batch clients (issue
#    33, item 5: where bf16 beside 32's slowest 1% lose their time; see tailattr_call.sh);
# 2. the 8-byte edge, the engine before this stop (x/bench_ranks_base) against this build,
#    alternated, with its hops and the floor of the runtime's own MPI calls (see edge_call.sh).
# Here: `PACK_MPI=1 bash benches/device/pack.sh`; the base build (`git checkout 423e091 --
# ranks/ Cargo.lock`, `cargo bench -p boundpool-bench --features mpi --bench ranks --no-run`,
# the binary stripped into .devbin/x/bench_ranks_base, `git checkout HEAD -- ranks/
# Cargo.lock`; without it only this build runs); then with carry [".devbin"]:
# `bash .devbin/stop42_call.sh`.
source .devbin/lib.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; nproc
deadline ${TOTAL:-120}
logs_in /tmp/bp-ta ta.tgz fresh
step t_probe 15 $B/t_gpu_replay_runs the_launch_probe --test-threads=1
SUMMARY='panicked|Error'
step probe1 48 $B/bench_serve --tail-probe --seconds 1 --batch-clients 32,8 --isolate high --high-partition 16 --no-torch
finish
logs_in /tmp/bp-edge edge.tgz fresh
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
SUMMARY='^\| (8-byte|\(floor\))|taken by|panicked|FAILED'
i=0
bins=$B/bench_ranks; [ -x x/bench_ranks_base ] && bins="$PWD/x/bench_ranks_base $bins"
for r in 1 2 3; do for R in $bins; do
  i=$((i+1)); echo "-- ${R#$PWD/}"
  step edge_$i 15 mpirun --bind-to none -np 2 $R --workers 2 --dag 0 --no-big --runs 3 --edge-breakdown
  grep -E "^\| (send node body -> send posted|send posted|arrival seen|all bytes|Completer|producer)" $LOGS/edge_$i.log | cut -c1-150
  finish
done; done
grep -hE "^\||beside|alone" /tmp/bp-ta/probe1.log | cut -c1-420

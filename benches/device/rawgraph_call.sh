#!/usr/bin/env bash
# The GPU-machine call for the raw baselines' CUDA graphs on boundpool-gpu's CudaGraphTemplate
# and CaptureExt (driver/graph.rs shared with the replay's capture), and the node path split
# by role (node.rs: run_gpu_node). Here, first:
#   PACK_REVS="base=main" bash benches/device/pack.sh      # this build, and main's
# (PACK_MPI=1 too for t_gpu_nccl, the one test of the node path's NCCL join), then run with
# carry [".devbin"]: `bash .devbin/rawgraph_call.sh`, or in two calls `PHASE=tests bash
# .devbin/rawgraph_call.sh` and `PHASE=benches bash .devbin/rawgraph_call.sh`.
#   tests:   every GPU test binary of this build, one test at a time (BOUNDPOOL_REQUIRE_GPU=1:
#            every GPU node runs through run_gpu_node; gpu_graph_template is the new public
#            API; the replay and capture tests, driver/graph.rs), memcheck over
#            gpu_graph_template and gpu_replay, the probe plain and --sticky.
#   benches: this build's and main's raw baselines (`gpu_probe --baselines`) and replay bench
#            (its `raw us` column is raw_graph, `captured` captured_graph) alternated ROUNDS
#            times (default 2), then the graph variants (every template call: built, captured
#            with dependencies set, root removed, cloned, rebuilt from kernel parameters) of
#            both builds.
# Pass: every step rc=0 with `test result: ok` and no FAILED/panicked/HUNG; memcheck `ERROR
# SUMMARY: 0 errors`; the probe without WRONG, its sticky line `(sticky: true)`; the baselines,
# replay `raw us` / `vs raw` and variants of this build within run-to-run noise of main's.
# Logs: $OUT/logs.tgz.
source "$(dirname "$0")/lib.sh"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; nproc
if [ "${PHASE:-tests}" != benches ]; then
  for t in $(cd $B && ls t_*); do step $t 150 $B/$t --test-threads=1; finish; done
  BOUNDPOOL_WATCHDOG_SCALE=20 step mc_graph_template 120 $CS --tool memcheck \
    $B/t_gpu_graph_template --test-threads=1
  BOUNDPOOL_WATCHDOG_SCALE=20 step mc_replay 180 $CS --tool memcheck \
    $B/t_gpu_replay --test-threads=1
  finish
  step probe 60 $B/gpu_probe; grep -E "WRONG|FAILED|ok\)" $LOGS/probe.log | head -8
  step probe_sticky 60 $B/gpu_probe --sticky; grep -E "sticky|after" $LOGS/probe_sticky.log
  finish
fi
if [ "${PHASE:-benches}" != tests ]; then
  alternate baselines gpu_probe "" ${ROUNDS:-2} 60 --baselines
  alternate replay bench_replay "" ${ROUNDS:-2} 90 --shapes independent,chain --rounds 3 \
    --per-round 20
  alternate variants bench_replay "" 1 90 --variants --shapes independent,chain --rounds 3 \
    --runs 50
  echo "-- raw baselines (call costs; raw k=1..16; thread per task; server; chains):"
  for f in $LOGS/baselines_*.log; do
    echo "$(basename $f .log): $(grep -E '^(call costs|raw k=|thread per task|server thread|event edge|host sync)' $f | sed -E 's/ launches\/s|\/s|us\/edge//' | tr '\n' ';')"
  done
  for f in $LOGS/replay_*.log $LOGS/variants_*.log; do
    echo "-- $(basename $f .log):"
    tr '\r' '\n' < $f | grep -v "rounds$" | grep -iE "independent|chain|error" | tail -n 14 | cut -c1-160
  done
  finish
fi

#!/usr/bin/env bash
# The GPU-machine call for in-place writes under replay and the project's code moved to them
# (issue 33 item 3: `ReplayCtx::take`; the tiled Cholesky, the served model, the cudarc and
# cuBLAS tests). Here, first:
#   PACK_REVS="base=main" bash benches/device/pack.sh      # this build, and main's
# then run with carry [".devbin"]: `bash .devbin/take_call.sh`. The take tests and those of the
# code moved to takes (BOUNDPOOL_REQUIRE_GPU=1, one test at a time), memcheck over the replayed
# takes and the cudarc chains, the Cholesky example per plan (residual <= 1e-12) and the serve
# example, the serving bench's variants (every request checked against the host reference:
# copies in the graph as kernels or as copy nodes, around it as eager nodes, cuBLAS GEMMs), then
# this build's and main's tiled Cholesky and serving bench alternated ROUNDS times (default 2):
# GFLOP/s, requests/s and p50/p99 must match main's within run-to-run noise. In order of
# importance, inside BUDGET seconds (default 570). Logs: $OUT/logs.tgz.
source "$(dirname "$0")/lib.sh"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; nproc
for t in t_gpu_replay_take t_gpu_take t_gpu_cudarc t_gpu_blas t_gpu_cholesky t_gpu_replay_runs t_gpu_replay; do
  step $t 120 $B/$t --test-threads=1; finish
done
BOUNDPOOL_WATCHDOG_SCALE=20 step mc_replay_take 120 $CS --tool memcheck $B/t_gpu_replay_take --test-threads=1
BOUNDPOOL_WATCHDOG_SCALE=20 step mc_cudarc 150 $CS --tool memcheck --report-api-errors no $B/t_gpu_cudarc --test-threads=1
finish
step cholex 60 $B/cholesky --n 8192 --tile 1024; tail -n 3 $LOGS/cholex.log
step cholex_merge 60 $B/cholesky --n 8192 --tile 1024 --merge; tail -n 3 $LOGS/cholex_merge.log
step ex_serve 90 $B/serve; tail -n 6 $LOGS/ex_serve.log; finish
for v in "--copy-nodes" "--eager-copies" "--gemm cublas"; do
  name=serve_$(echo "$v" | tr -dc 'a-z_'); step $name 60 $B/bench_serve --seconds 0.5 --clients 1,8 --no-torch $v
  grep -E '^\| (bf16|f32) \|' $LOGS/$name.log | head -8
done
finish
alternate chol bench_cholesky "" ${ROUNDS:-2} 60 --n 4096,8192 --tiles 512,1024 --runs 2
alternate serve bench_serve "" ${ROUNDS:-2} 60 --seconds 1 --clients 1,8 --no-torch
echo "-- Cholesky (rows with GFLOP/s; any spot-check failure says so):"
for f in $LOGS/chol_*.log; do echo "$(basename $f .log):"; grep -E "^ *[0-9]+ +[0-9]+ |above 1e-12|Error" $f | head -8; done
echo "-- serving (graph and eager rows):"
for f in $LOGS/serve_*_[0-9]*.log; do echo "$(basename $f .log):"; grep -E '^\| (bf16|f32) \|' $f | head -8; done
finish

#!/usr/bin/env bash
# One GPU-machine call for the command line's GPU subcommands and the benches whose flags are
# clap parsers (branch cli: the workloads crate, the CLI's modules, bench flags), about 8 min.
# Here, first:
#   bash benches/device/pack.sh
# then run with carry [".devbin"] from the repository root: `bash .devbin/cli_call.sh`.
# Each step prints its exit status; expected: rc=0 everywhere but `run_too_large` (rc=2, the
# graph refused before the pool is built), `verified` / `violations 0` in the soak, and the
# replay targets printed by `bench_gpu_cli`. Logs: $OUT/cli_logs.tgz.
source "$(dirname "$0")/lib.sh"
logs_in /tmp/boundpool-logs cli_logs.tgz fresh; deadline ${BUDGET:-560}
STEP_START=
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; nproc
# The workloads crate's unit tests (the probe's GPU test moved there).
step t_boundpool_workloads 60 $B/t_boundpool_workloads; grep -hE "test result|FAILED|SKIPPED" $LOGS/t_boundpool_workloads.log
step run_eager 30 $B/boundpool run --gpu --shape wavefront --size 1024 --json; tail -c 600 $LOGS/run_eager.log; echo
step run_replay 30 $B/boundpool run --gpu --replay --max-width 8 --shape chain --size 1000 --json; tail -c 600 $LOGS/run_replay.log; echo
step run_partitions 30 $B/boundpool run --gpu --shape wavefront --size 1000 --partitions latency:8:1,bulk:rest:3 --json; tail -c 800 $LOGS/run_partitions.log; echo
step run_too_large 10 $B/boundpool run --gpu --size 99999999999999; cat $LOGS/run_too_large.log
step bench_gpu_cli 110 $B/boundpool bench --gpu --runs 3; tail -n 12 $LOGS/bench_gpu_cli.log | cut -c1-140; finish
step soak_gpu 60 $B/boundpool soak --gpu --seconds 45; tail -n 12 $LOGS/soak_gpu.log; finish
step latency_gpu 40 $B/boundpool bench --latency --gpu --json --threads 8 --seconds 2; tail -c 700 $LOGS/latency_gpu.log; echo; finish
step bench_gpu 90 $B/bench_gpu --runs 3; tail -n 12 $LOGS/bench_gpu.log | cut -c1-140
step bench_replay 70 $B/bench_replay --rounds 5 --per-round 20; tr '\r' '\n' < $LOGS/bench_replay.log | grep -v "rounds$" | tail -n 10 | cut -c1-140
step variants 60 $B/bench_replay --variants --shapes independent,chain --rounds 5 --runs 100; tail -n 8 $LOGS/variants.log | cut -c1-140; finish
# The bench reads benches/serve/torch_serve.py from the repository root (skipped here).
(cd .. && step bench_serve 100 $B/bench_serve --seconds 2 --clients 1,8 --no-torch); grep -E '^\||high-priority' $LOGS/bench_serve.log | head -12
finish

#!/usr/bin/env bash
# The device runs stop 39 could not make (no machine came after its first call), in one call
# of at most ~560 s, most important first: every GPU test binary with its tests in parallel
# (BOUNDPOOL_REQUIRE_GPU=1: the node path split and CudaGraphTemplate, issue "The house"), the
# probe and the raw baselines on CudaGraphTemplate, the ranks' 8-byte edge with its per-hop
# breakdown and the 64 MiB value on the 16-core host (issue "Ranks"), the latency-critical
# client's rounds with the clients placed off the workers' cores (issue "Safe means safe",
# item 5), the 32k Cholesky recording for `boundpool sim check-cholesky` (issue "A cluster on
# paper"), memcheck over the graph-template test. Here: `PACK_MPI=1 bash benches/device/pack.sh`,
# then with carry [".devbin"]: `bash .devbin/owed_call.sh`. Logs: $OUT/*.tgz; the recording
# $OUT/sim32k.tgz (unpack beside the earlier 8k/16k recordings and run check-cholesky there).
source .devbin/lib.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; nproc
logs_in /tmp/bp-tests tests.tgz fresh; deadline 95
SUMMARY='test result|FAILED|panicked|HUNG'
for t in $B/t_*; do case $(basename $t) in t_gpu_ranks_nccl|t_gpu_nccl|t_gpu_peer) continue;; esac; step $(basename $t) 95 $t & done; wait
finish
logs_in /tmp/bp-probe probe.tgz fresh; deadline 80
SUMMARY='WRONG|FAILED|panicked'
step probe 40 $B/gpu_probe; grep -E "WRONG|FAILED|ok\)" $LOGS/probe.log | head -5
step baselines 40 $B/gpu_probe --baselines; grep -E '^(call costs|raw k=|thread per task|server thread|event edge|host sync)' $LOGS/baselines.log | cut -c1-200
finish
logs_in /tmp/bp-mc mc.tgz fresh; deadline 45
SUMMARY='ERROR SUMMARY|test result'
BOUNDPOOL_WATCHDOG_SCALE=20 step mc_graph_template 44 $CS --tool memcheck $B/t_gpu_graph_template --test-threads=1
finish
logs_in /tmp/bp-edge edge.tgz fresh; deadline 150
(unset BOUNDPOOL_REQUIRE_GPU; export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
 SUMMARY='^\| (8-byte|64 MiB)|panicked|FAILED'
 step edge 45 mpirun --bind-to none -np 2 $B/bench_ranks --workers 2 --dag 0 --runs 3 --edge-breakdown
 grep -E '^\||^placement|recycled|hop|µs' $LOGS/edge.log | head -40
 # The 64 MiB value's gap to raw MPI: message size, the comm thread's spin, the single copy.
 ompi_info --param btl vader --level 9 2>/dev/null | grep -iE 'single_copy_mechanism' | head -3
 for v in "m1:--max-message-bytes 1048576" "m16:--max-message-bytes 16777216" \
          "spin:--comm-spin-us 20000" "m1spin:--max-message-bytes 1048576 --comm-spin-us 20000"; do
   n=${v%%:*}; f=${v#*:}
   step big_$n 12 mpirun --bind-to none -np 2 $B/bench_ranks --workers 2 --dag 0 --no-edge --runs 5 $f
   echo "-- big_$n: $(grep -E '^\| 64 MiB' $LOGS/big_$n.log | cut -d'|' -f3-5)"
 done
 # The comm thread that never parks while a long message moves (bench_ranks_bulk, if packed),
 # against this build, with one 64 MiB message and with 4 MiB ones.
 if [ -x bench_ranks_bulk ]; then
   for v in "old1:$B/bench_ranks:--max-message-bytes 1073741824" \
            "bulk1:$PWD/bench_ranks_bulk:--max-message-bytes 1073741824" "bulk4:$PWD/bench_ranks_bulk:"; do
     n=${v%%:*}; r=${v#*:}; bin=${r%%:*}; f=${r#*:}
     step big_$n 12 mpirun --bind-to none -np 2 $bin --workers 2 --dag 0 --no-edge --runs 5 $f
     echo "-- big_$n: $(grep -E '^\| 64 MiB' $LOGS/big_$n.log | cut -d'|' -f3-5)"
   done
 fi
 OMPI_MCA_btl_vader_single_copy_mechanism=none step big_nocma 12 mpirun --bind-to none -np 2 \
   $B/bench_ranks --workers 2 --dag 0 --no-edge --runs 5
 echo "-- big_nocma: $(grep -E '^\| 64 MiB' $LOGS/big_nocma.log | cut -d'|' -f3-5)")
finish
logs_in /tmp/bp-tail tail.tgz fresh; deadline 120
SUMMARY='panicked|Error'
F="--priority-only --rounds 2 --batch-clients 8,16,32 --seconds 1 --no-torch"
for v in "isohigh:--isolate high" "isohigh_part16:--isolate high --high-partition 16"; do
  n=${v%%:*}; f=${v#*:}
  step $n 75 $B/bench_serve $F $f; echo "-- $n"; grep -E "^\| (bf16|f32) |^clients placed" $LOGS/$n.log | cut -d'|' -f1-12
  finish
done
logs_in /tmp/bp-sim sim.tgz fresh; deadline 95
REC=/tmp/boundpool-sim; rm -rf $REC; mkdir -p $REC
step chol32k 115 $B/sim_record cholesky --n 32768 --tile 2048 --runs 2 --out $REC; tail -5 $LOGS/chol32k.log
tar czf $OUT/sim32k.tgz -C $REC .; finish

#!/usr/bin/env bash
# Stop 40's last device call (about 300 s): the graph-template test again (its empty template
# now on a bound worker; the description reading only the graph-node launch attributes) with
# memcheck; the GPU programs across ranks after "one copy a host" (every MPI start now gathers
# the host map; device values are never relayed): the NCCL and peer tests, ranks_gpu's values
# (staged and NCCL) and collectives, the 2-rank Cholesky; the 64 MiB value and the edge of this
# build; bf16 beside 32 batch clients with 16, 24 and 32 SMs for the latency-critical graphs. Here:
# `PACK_MPI=1 bash benches/device/pack.sh`, then with carry [".devbin"]:
# `bash .devbin/stop40_call.sh`. Logs: $OUT/*.tgz.
source .devbin/lib.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; nproc
logs_in /tmp/bp-gt gt.tgz fresh; deadline 60
SUMMARY='ERROR SUMMARY|test result|FAILED|panicked'
step t_gpu_graph_template 20 $B/t_gpu_graph_template --test-threads=1
BOUNDPOOL_WATCHDOG_SCALE=20 step mc_graph_template 35 $CS --tool memcheck $B/t_gpu_graph_template --test-threads=1
finish
logs_in /tmp/bp-rg rg.tgz fresh; deadline 150
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 BOUNDPOOL_REQUIRE_NCCL=1 NCCL_NVLS_ENABLE=0
SUMMARY='test result|FAILED|panicked|SKIPPED|HUNG'
M="mpirun --bind-to none --oversubscribe"
H=/tmp/boundpool-nccl-hostid.sh
printf '#!/usr/bin/env bash\nNCCL_HOSTID=boundpool-rank$OMPI_COMM_WORLD_RANK exec "$@"\n' > $H; chmod +x $H
show() { grep -hE "^rank |SKIPPED|FAILED|test result|panicked|^\|" "$LOGS/$1.log" | cut -c1-200 | head -8; }
for t in t_gpu_nccl t_gpu_ranks_nccl t_gpu_peer; do step $t 40 $B/$t & done; wait; finish
step values_staged 25 $M -np 2 $B/ranks_gpu values; show values_staged
step values_nccl 25 $M -np 2 $H $B/ranks_gpu values nccl; show values_nccl
step collectives_2 25 $M -np 2 $H $B/ranks_gpu collectives; show collectives_2
step cholesky_2 40 $M -np 2 $B/ranks_cholesky --n 1536 --tile 256; show cholesky_2
finish
logs_in /tmp/bp-rk rk.tgz fresh; deadline 30
(unset BOUNDPOOL_REQUIRE_NCCL; SUMMARY='^\| (8-byte|64 MiB)|panicked|FAILED'
 step ranks 28 mpirun --bind-to none -np 2 $B/bench_ranks --workers 2 --dag 0 --runs 3)
finish
# bf16 beside 32 batch clients, the one cell still over 1.5x: more SMs for the
# latency-critical graphs.
logs_in /tmp/bp-tl tl.tgz fresh; deadline 80
SUMMARY='panicked|Error'
for s in 16 24 32; do
  step part$s 26 $B/bench_serve --priority-only --rounds 2 --batch-clients 32 --seconds 1 --no-torch --isolate high --high-partition $s
  echo "-- part$s"; grep -E "^\| (bf16|f32) " $LOGS/part$s.log | cut -d'|' -f1-12
  finish
done

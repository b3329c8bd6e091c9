#!/usr/bin/env bash
# Stop 44's second device call. (1) The paced spin's default (on here: 8 workers on 16 cores):
# bench_serve's priority rounds with no --paced-spin-us, 5 rounds (issue 33 item 5). (2) The
# posted lane (`RanksBuilder::posted_receives`) against the probed path, the 8-byte edge
# alternated twice (issue 34). (3) GPU work across ranks (the NCCL id and small values now go
# on the lane): the in-process NCCL and peer tests, two ranks' device values staged and over
# NCCL, collectives, the distributed Cholesky. (4) Every other GPU test binary (the scheduler's
# default changed). Here: `PACK_MPI=1 bash benches/device/pack.sh`, then with carry
# [".devbin"]: `bash .devbin/stop44b_call.sh`.
cd "$(dirname "$0")/.."
source .devbin/lib.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; nproc
deadline ${TOTAL:-420}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
logs_in /tmp/bp-def def.tgz fresh
SUMMARY='panicked|Error'
P="--isolate high --high-partition 16 --no-torch --batch-clients 8,16,32 --seconds 1"
step default 150 $B/bench_serve --priority-only --rounds ${ROUNDS:-5} $P
grep -E "^\| (bf16|f32) " $LOGS/default.log | cut -d'|' -f2-12
finish
logs_in /tmp/bp-lane lane.tgz fresh
for r in 1 2; do
  for v in on off; do
    f=; [ $v = off ] && f=--no-posted-receives
    step edge_${v}_$r 30 mpirun --bind-to none -np 2 $B/bench_ranks --workers 2 --dag 0 --no-big --runs 3 --edge-breakdown $f
    grep -hE "^\| (8-byte|send posted ->|arrival seen|all bytes in ->|producer body end -> consumer)" $LOGS/edge_${v}_$r.log | cut -c1-150
    finish
  done
done
logs_in /tmp/bp-rg rg.tgz fresh
(export BOUNDPOOL_REQUIRE_NCCL=1 NCCL_NVLS_ENABLE=0
SUMMARY='test result|FAILED|panicked|SKIPPED|HUNG'
M="mpirun --bind-to none --oversubscribe"
H=/tmp/boundpool-nccl-hostid.sh
printf '#!/usr/bin/env bash\nNCCL_HOSTID=boundpool-rank$OMPI_COMM_WORLD_RANK exec "$@"\n' > $H; chmod +x $H
show() { grep -hE "^rank |SKIPPED|FAILED|test result|panicked" "$LOGS/$1.log" | cut -c1-200 | head -6; }
for t in t_gpu_nccl t_gpu_ranks_nccl t_gpu_peer t_gpu_ranks; do step $t 40 $B/$t; show $t; done; finish
step values_staged 25 $M -np 2 $B/ranks_gpu values; show values_staged
step values_nccl 25 $M -np 2 $H $B/ranks_gpu values nccl; show values_nccl
step collectives_2 25 $M -np 2 $H $B/ranks_gpu collectives; show collectives_2
step cholesky_2 40 $M -np 2 $B/ranks_cholesky --n 1536 --tile 256; show cholesky_2
finish)
logs_in /tmp/bp-tests tests.tgz fresh
SUMMARY='test result|FAILED|panicked|SKIPPED'
for t in $B/t_gpu_* $B/t_boundpool_gpu $B/t_prometheus_gpu; do
  n=$(basename $t); a=; [ $n = t_gpu_replay ] && a=--test-threads=1
  case $n in t_gpu_nccl|t_gpu_ranks_nccl|t_gpu_peer|t_gpu_ranks) continue ;; esac
  step $n 60 $t $a; grep -hE "test result|FAILED|panicked" $LOGS/$n.log | head -2
done
finish

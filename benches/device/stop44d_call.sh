#!/usr/bin/env bash
# Stop 44's fourth device call: the GPU nodes marked as such (a host node placed on a device
# waits for its GPU predecessors' work) and the served model's host nodes on its device. First
# every GPU test binary (the GPU backend's successor rule changed), then the priority rounds with
# the host nodes on the device (the default) against anywhere (`--host-nodes-anywhere`), then the
# probe. Here: `PACK_MPI=1 bash benches/device/pack.sh`, then with carry [".devbin"]:
# `bash .devbin/stop44d_call.sh`.
cd "$(dirname "$0")/.."
source .devbin/lib.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; nproc
deadline ${TOTAL:-480}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 NCCL_NVLS_ENABLE=0
logs_in /tmp/bp-tests tests.tgz fresh
SUMMARY='test result|FAILED|panicked|SKIPPED'
for t in $B/t_gpu_* $B/t_boundpool_gpu $B/t_prometheus_gpu; do
  n=$(basename $t); a=; [ $n = t_gpu_replay ] && a=--test-threads=1
  step $n 60 $t $a; grep -hE "test result|FAILED|panicked" $LOGS/$n.log | head -2
done
M="mpirun --bind-to none --oversubscribe"
H=/tmp/boundpool-nccl-hostid.sh
printf '#!/usr/bin/env bash\nNCCL_HOSTID=boundpool-rank$OMPI_COMM_WORLD_RANK exec "$@"\n' > $H; chmod +x $H
step values_nccl 25 $M -np 2 $H $B/ranks_gpu values nccl
grep -hE "^rank " $LOGS/values_nccl.log | head -2
step cholesky_2 40 $M -np 2 $B/ranks_cholesky --n 1536 --tile 256
grep -hE "^rank " $LOGS/cholesky_2.log | head -2
finish
logs_in /tmp/bp-place place.tgz fresh
SUMMARY='panicked|Error'
P="--isolate high --high-partition 16 --no-torch --seconds 1"
step placed 130 $B/bench_serve --priority-only --rounds 5 --batch-clients 8,16,32 $P
grep -E "^\| (bf16|f32) " $LOGS/placed.log | cut -d'|' -f2-12
finish
step anywhere 90 $B/bench_serve --priority-only --rounds 5 --batch-clients 16,32 --host-nodes-anywhere $P
grep -E "^\| (bf16|f32) " $LOGS/anywhere.log | cut -d'|' -f2-12
finish
step probe 40 $B/bench_serve --tail-probe --batch-clients 32 $P
grep -hE "^\| (p45|slowest)|beside|alone" $LOGS/probe.log | cut -c1-200
finish

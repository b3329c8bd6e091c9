#!/usr/bin/env bash
# Stop 44's third device call (issue 33 item 5, bf16 beside 16 and 32 batch clients): the
# served model's host nodes on its device's workers (`ReplayBuilder::host_node_on`, the
# default) against anywhere (`--host-nodes-anywhere`: the batch's staging and read-out nodes
# then run on the latency partition's idle workers too), the priority rounds of each in one
# call, then the probe, then the GPU tests the change touches. Here: `PACK_MPI=1 bash
# benches/device/pack.sh`, then with carry [".devbin"]: `bash .devbin/stop44c_call.sh`.
cd "$(dirname "$0")/.."
source .devbin/lib.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; nproc
deadline ${TOTAL:-330}
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
SUMMARY='test result|FAILED|panicked|SKIPPED'
for t in t_gpu_partitions t_gpu_replay t_gpu_replay_runs t_gpu_replay_take t_boundpool_gpu; do
  a=; [ $t = t_gpu_replay ] && a=--test-threads=1
  step $t 60 $B/$t $a; grep -hE "test result|FAILED|panicked" $LOGS/$t.log | head -3
done
finish

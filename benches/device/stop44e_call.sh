#!/usr/bin/env bash
# Stop 44's last device call: `gpu_partitions` after its launcher's refactor, and the new test
# of a host node placed on a device against a build without the fix (`.devbin/prefix/`, made by
# hand: the GPU backend's successor rule by placement), where it must fail. Here: `PACK_MPI=1
# bash benches/device/pack.sh`, the pre-fix test binary copied to .devbin/prefix/, then with
# carry [".devbin"]: `bash .devbin/stop44e_call.sh`.
cd "$(dirname "$0")/.."
source .devbin/lib.sh
deadline ${TOTAL:-120}
logs_in /tmp/bp-fix fix.tgz fresh
SUMMARY='test result|FAILED|panicked'
step fixed 60 $B/t_gpu_partitions
grep -hE "test result|FAILED|panicked" $LOGS/fixed.log | head -3
if [ -x prefix/t_gpu_partitions ]; then
  step prefix 60 prefix/t_gpu_partitions a_host_node_placed_on_a_device_waits
  grep -hE "test result|FAILED|panicked|left|right|run " $LOGS/prefix.log | head -6
fi
finish

#!/usr/bin/env bash
# GPU-machine call for issue 33's capture work (cudarc calls in a captured node, failed
# captures, DeviceBuffer's cudarc traits). Here, first:
#   bash benches/device/pack.sh
# then, with carry [".devbin"], from the repository root:
#   bash .devbin/capture_call.sh
# Every GPU test binary one test at a time, the capture cases' table (`CAPTURE CASE` lines),
# memcheck over them with API errors off (a refused call is an API error by design: the
# capture's refusals and the pageable-memory check's `cuPointerGetAttribute`), and gpu_cudarc
# three more times with its tests in parallel (seen failing 2 of 10 in a capture on this branch
# that way, passing one at a time; compare main's binary the same way). About 2 min.
# Logs: $OUT/logs.tgz.
source "$(dirname "$0")/lib.sh"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
for t in $(cd $B && ls t_*); do
  step $t 150 $B/$t --test-threads=1
done
grep -h "CAPTURE CASE" $LOGS/t_gpu_capture_cudarc.log | cut -c1-240; finish
step memcheck_capture 180 $CS --tool memcheck --report-api-errors no \
  $B/t_gpu_capture_cudarc --test-threads=1; finish
for i in 1 2 3; do step cudarc_parallel_$i 90 $B/t_gpu_cudarc; done; finish

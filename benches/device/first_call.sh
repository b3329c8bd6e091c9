#!/usr/bin/env bash
# The first call of a session on the GPU machine, after (here)
#   PACK_REVS="old=REV [exp=BRANCH ...]" bash benches/device/pack.sh
# run with carry [".devbin"]: `bash .devbin/first_call.sh`. Every GPU test binary with
# BOUNDPOOL_REQUIRE_GPU=1 (one test at a time), the replay bench's graph variants (why a captured
# graph launches slower than one built node by node), then the host scaling bench at full size
# (`boundpool bench --scaling --runs 3`), the new binary and the packed revisions named in
# SCALING_REVS (default: every revs/NAME) alternated ROUNDS times (default 2),
# then the 16-worker rows of each side by side. Logs: $OUT/logs.tgz
# (packed again after every step, so a cut-off call still brings back what ran: $OUT returns
# 8 files at most, so not one file a step).
source "$(dirname "$0")/lib.sh"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; nproc; uptime
for t in $B/t_*; do n=$(basename $t); step $n 90 $t --test-threads=1; finish; done
step variants 60 $B/bench_replay --variants --shapes independent,chain --rounds 5 --runs 100
finish; grep -vE "^\s*$" $LOGS/variants.log | tail -n 24 | cut -c1-150
alternate scaling boundpool "${SCALING_REVS:-}" ${ROUNDS:-2} 75 bench --scaling --runs 3
echo "-- 16 workers (shape workers nodes ns speedup rayon speedup vs-rayon):"
for f in $LOGS/scaling_*.log; do echo "$(basename $f .log):"; grep -E "^\S+ +(1|16) " $f; done
finish

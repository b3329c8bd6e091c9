#!/usr/bin/env bash
# One GPU-machine call for the simulator's checks (issue "A cluster on paper", item 3), about
# four minutes: records the tiled Cholesky at N = 8192, 16384, 32768, tile 2048 (a one-worker
# run's trace: the costs; the bench's 8-worker configuration timed 3 times, and one traced run
# of it for the diagnosis) and the served model at 1, 8 and 32 clients (traced), then compares
# them with their simulation, and runs the random host DAG check on the machine's 16-core host:
#   check_cholesky      the held share calibrated on N = 8192, 16384 and 32768 predicted
#   check_cholesky_16k  calibrated on 16384 instead (8192 and 32768 predicted)
#   check_cholesky_held every N predicted with SmShare::H100_HELD (0.54, SIM_HELD; calibrated
#                       on an earlier recording: nothing fitted to this call's runs)
#   check_serve         occupancy and interference from the 8-client trace, 1 and 32 predicted
#   check_serve_32      the same from the 32-client trace
#   check_host          random host DAGs on 1, 2 and 4 ranks
# Here, first:
#   bash benches/device/pack.sh
# then run with carry [".devbin"] from the repository root: `bash .devbin/sim_call.sh`.
# Logs: $OUT/logs.tgz; the recordings: $OUT/sim.tgz (unpack it here and rerun the comparisons
# with `boundpool sim check-cholesky DIR` / `check-serve DIR`: they need only these files).
# SIM_N, SIM_TILE, SIM_CLIENTS change the sizes.
source "$(dirname "$0")/lib.sh"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; nproc
REC=/tmp/boundpool-sim; rm -rf $REC; mkdir -p $REC
STEP_START=1
step chol_record 240 $B/sim_record cholesky --n ${SIM_N:-8192,16384,32768} --tile ${SIM_TILE:-2048} --runs 3 --out $REC
tar czf $OUT/sim.tgz -C $REC .; finish
step serve_record 100 $B/sim_record serve --clients ${SIM_CLIENTS:-1,8,32} --seconds 2 --out $REC
tar czf $OUT/sim.tgz -C $REC .; finish
step check_cholesky 30 $B/boundpool sim check-cholesky $REC
step check_cholesky_16k 30 $B/boundpool sim check-cholesky $REC --calibrate-on 16384
step check_cholesky_held 30 $B/boundpool sim check-cholesky $REC --held ${SIM_HELD:-0.54}
step check_serve 30 $B/boundpool sim check-serve $REC
step check_serve_32 30 $B/boundpool sim check-serve $REC --calibrate-on 32
step check_host 100 $B/boundpool sim check-host --ranks 1,2,4 --workers 1 --nodes 2000 --rounds 2
for s in chol_record serve_record check_cholesky check_cholesky_16k check_cholesky_held check_serve check_serve_32 check_host; do
  echo "== $s"; tail -n 30 $LOGS/$s.log
done
finish

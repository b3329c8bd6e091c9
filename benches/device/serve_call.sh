#!/usr/bin/env bash
# One GPU-machine call for serving (issue "Serve a model"): the replay-run tests and the replay
# tests of this build, the serve example, then the serving bench with its PyTorch peer in the
# same call (SERVE_S seconds per configuration, default 2; SERVE_ARGS added). Here, first:
#   bash benches/device/pack.sh
# then run with carry [".devbin"] from the repository root: `bash .devbin/serve_call.sh`.
# Logs: $OUT/logs.tgz; the bench's table is printed.
source "$(dirname "$0")/lib.sh"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; nproc
python3 -c 'import torch; print("torch", torch.__version__)' 2>&1 | tail -1
for t in ${SERVE_TESTS:-$(cd $B && ls t_*)}; do step $t 150 $B/$t --test-threads=1; done; finish
step ex_serve 90 $B/serve; tail -n 6 $LOGS/ex_serve.log; finish
# The bench reads benches/serve/torch_serve.py from the repository root.
(cd .. && step bench_serve ${SERVE_LIMIT:-400} $B/bench_serve --seconds ${SERVE_S:-2} --json ${SERVE_ARGS:-})
grep -E '^\||x PyTorch|high-priority' $LOGS/bench_serve.log; tail -n 3 $LOGS/bench_serve.log; finish
# Variants, 1 and 8 clients: cuBLAS GEMMs and a bias + GELU kernel instead of cuBLASLt; workers
# watching 200 us before they park.
(cd .. && step bench_serve_cublas 80 $B/bench_serve --seconds ${SERVE_S:-2} --clients 1,8 --gemm cublas --no-torch)
grep -E '^\| (bf16|f32) \| graph' $LOGS/bench_serve_cublas.log; finish
(cd .. && step bench_serve_idle 80 $B/bench_serve --seconds ${SERVE_S:-2} --clients 1,8 --idle-spin-us 200 --no-torch)
grep -E '^\| (bf16|f32) \| graph|high-priority' $LOGS/bench_serve_idle.log; finish

#!/usr/bin/env bash
# GPU work across ranks on the one-GPU device machine (issue "Ranks": device buffers across
# ranks, NCCL collectives as GPU nodes, peer copies, the distributed Cholesky, the staging
# bench). Here, first:
#   PACK_MPI=1 bash benches/device/pack.sh
# then run with carry [".devbin"] from the repository root: `bash .devbin/ranks_gpu_call.sh`.
# Two ranks share the GPU: the staged path needs nothing; NCCL needs a distinct NCCL_HOSTID per
# rank (else "Duplicate GPU detected"), set below from Open MPI's rank. Prints a line per step
# and the programs' lines; the logs come back as $OUT/ranks_gpu.tgz. Look for: every step
# rc=0; "rank r/2: ..." lines, no FAILED; the tests' "test result: ok"; the bench's table
# (staged 4 MiB chunks >= 0.7x raw MPI hot is the target).
source "$(dirname "$0")/lib.sh"
logs_in /tmp/boundpool-logs ranks_gpu.tgz fresh
deadline "${BUDGET:-570}"
SUMMARY='test result|FAILED|panicked|SKIPPED|HUNG'
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 BOUNDPOOL_REQUIRE_NCCL=1
# NVLink multicast stays off on these machines (KINDS.md); nothing here asks for it.
export NCCL_NVLS_ENABLE=0
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader; nproc
mpirun --version | head -n 1
# cudarc loads libnccl.so (or .so.13, .so.12): where only PyPI's libnccl.so.2 exists, link it.
if ! ldconfig -p | grep -qE 'libnccl\.so(\.1[23])? '; then
  so=$(python3 -c 'import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], "lib", "libnccl.so.2"))' 2>/dev/null)
  if [ -n "$so" ] && [ -f "$so" ]; then
    mkdir -p /tmp/nccl-lib && ln -sf "$so" /tmp/nccl-lib/libnccl.so
    export LD_LIBRARY_PATH=/tmp/nccl-lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
    echo "libnccl.so -> $so"
  fi
fi
ldconfig -p | grep -i 'libnccl' | head -n 3
M="mpirun --bind-to none --oversubscribe"
# `$H CMD...` under mpirun: CMD with an NCCL_HOSTID of its rank's own.
H=/tmp/boundpool-nccl-hostid.sh
printf '#!/usr/bin/env bash\nNCCL_HOSTID=boundpool-rank$OMPI_COMM_WORLD_RANK exec "$@"\n' > $H
chmod +x $H
show() { grep -hE "^rank |SKIPPED|FAILED|test result|panicked|^\|" "$LOGS/$1.log" | cut -c1-220; }

# In-process tests: peer reads (two pools on the GPU), one-rank NCCL collectives, device values
# between two in-process ranks (staged), a missing libnccl's error (skipped: it is there).
for t in t_gpu_peer t_gpu_nccl t_gpu_ranks_nccl; do
  step $t 120 $B/$t; show $t
done
finish
# Two ranks on the GPU: device values staged, then over NCCL; NCCL collectives and
# send/receive against the host, on 2 ranks and on 1.
step values_staged 90 $M -np 2 $B/ranks_gpu values; show values_staged; finish
step values_nccl 90 $M -np 2 $H $B/ranks_gpu values nccl; show values_nccl; finish
step collectives_2 90 $M -np 2 $H $B/ranks_gpu collectives; show collectives_2; finish
step collectives_1 60 $M -np 1 $H $B/ranks_gpu collectives; show collectives_1; finish
# The distributed Cholesky: 2 ranks staged (the target), 1 rank, 2 ranks over NCCL.
step cholesky_2 120 $M -np 2 $B/ranks_cholesky --n 1536 --tile 256; show cholesky_2; finish
step cholesky_1 90 $M -np 1 $B/ranks_cholesky --n 1536 --tile 256; show cholesky_1; finish
step cholesky_2_nccl 120 $M -np 2 $H $B/ranks_cholesky --n 1536 --tile 256 --nccl; show cholesky_2_nccl; finish
# The staging bench: 64 MiB device buffer staged (4 MiB and 64 MiB chunks) vs raw host MPI,
# then over NCCL.
step bench_staged 120 $M -np 2 $B/bench_ranks_gpu --runs 7; show bench_staged; finish
step bench_nccl 90 $M -np 2 $H $B/bench_ranks_gpu --runs 7 --nccl; show bench_nccl; finish

#!/usr/bin/env bash
# Builds every binary the GPU machine needs (it has no Rust toolchain) and packs them, with the
# device scripts of this folder, into .devbin/ (ignored by git): carry `.devbin` and run
#   bash .devbin/tests_and_benches.sh      # GPU tests, GPU benches, host scaling (~2 min)
#   SOAK_S=570 bash .devbin/soak_and_sanitizers.sh   # GPU soak with compute-sanitizer meanwhile
# (one command may run 600 s at most: give the soak less, or start it in one call and collect
# it in the next with soak_collect.sh), ranks_call.sh and ranks_gpu_call.sh (PACK_MPI=1: the
# ranks over MPI, and GPU work across ranks with NCCL), or ab_call.sh (a GPU-crate change against a baseline
# pack), replay_ab.sh or first_call.sh (A/B runs against PACK_REVS, below), cli_call.sh (the
# command line's GPU subcommands and the benches' flags), sim_call.sh (the simulator's checks), owed_call.sh (the runs stop 39 owes). Every one of them
# sources lib.sh (`step`, `finish`, `alternate`); so can an ad-hoc command there. This script
# runs here, not there, and does not.
# PACK_REVS="old=REV exp=BRANCH ..." also builds the `boundpool` CLI, the replay, eager,
# Cholesky and serving benches (and with PACK_MPI the ranks bench) and the `gpu_probe` example (whose `--baselines` prints every raw baseline)
# at each git revision (a detached worktree under target/revs/, each with a target directory of its own:
# cargo names a workspace crate's artifacts alike in every checkout, so a shared one can link a
# stale copy) into
# .devbin/revs/NAME/ (xz-packed; lib.sh unpacks them), for A/B runs in one call: first_call.sh
# alternates every revs/*/boundpool with the new one.
set -euo pipefail
cd "$(dirname "$0")/../.."
out=.devbin; rm -rf "$out"; mkdir -p "$out/b"
exes=$(mktemp)
{
  cargo test --workspace --release --no-run --message-format=json
  cargo bench -p boundpool-bench --no-run --message-format=json
  cargo build --release -p boundpool-cli -p boundpool --features boundpool/prometheus --examples --bins --message-format=json
  cargo build --release -p boundpool-bench --example gpu_probe --example sim_record --example crowded_clients --message-format=json
} 2>/dev/null | python3 -c '
import json, sys
for line in sys.stdin:
    try: m = json.loads(line)
    except ValueError: continue
    if m.get("reason") == "compiler-artifact" and m.get("executable"):
        t = m["target"]; print(t["kind"][0], t["name"], m["executable"])
' > "$exes"
while read -r kind name path; do
  case "$kind:$name" in
    test:gpu_*|test:prometheus_gpu) cp "$path" "$out/b/t_$name" ;;
    lib:boundpool_gpu) cp "$path" "$out/b/t_boundpool_gpu" ;;
    lib:boundpool_bench) cp "$path" "$out/b/t_boundpool_bench" ;;
    lib:boundpool_workloads) cp "$path" "$out/b/t_boundpool_workloads" ;;
    bench:gpu|bench:cholesky|bench:replay|bench:scheduler|bench:observe|bench:serve|bench:partition|bench:isolation) cp "$path" "$out/b/bench_$name" ;;
    bin:boundpool|example:cholesky|example:gpu_pipeline|example:cudarc_nodes|example:serve|example:gpu_probe|example:sim_record|example:crowded_clients) cp "$path" "$out/b/$name" ;;
  esac
done < "$exes"
# PACK_MPI=1: the ranks' MPI programs too (needs Open MPI and libclang here; the device machine
# runs them under its own Open MPI 4.1.6, which provides the same libmpi.so.40).
# With them, the GPU ranks' programs (ranks_gpu_call.sh), built with NCCL (libnccl is loaded at
# run time): the ranks_gpu example and bench, the distributed Cholesky, and the NCCL tests.
if [ -n "${PACK_MPI:-}" ]; then
  {
    cargo bench -p boundpool-bench --features nccl --bench ranks --bench ranks_gpu --no-run --message-format=json
    cargo build --release -p boundpool-ranks --features mpi,nccl --example ranks_ci --example ranks_gpu --message-format=json
    cargo build --release -p boundpool-bench --features nccl --example ranks_cholesky --message-format=json
    cargo build --release --features mpi --example ranks_matvec --message-format=json
    cargo test --release -p boundpool-gpu --features nccl --test gpu_nccl --no-run --message-format=json
    cargo test --release -p boundpool-ranks --features nccl --test gpu_ranks --no-run --message-format=json
  } 2>/dev/null | python3 -c '
import json, sys
for line in sys.stdin:
    try: m = json.loads(line)
    except ValueError: continue
    if m.get("reason") == "compiler-artifact" and m.get("executable"):
        t = m["target"]; print(t["kind"][0], t["name"], m["executable"])
' | while read -r kind name path; do
    case "$kind:$name" in
      bench:ranks|bench:ranks_gpu) cp "$path" "$out/b/bench_$name" ;;
      example:ranks_ci|example:ranks_matvec|example:ranks_gpu|example:ranks_cholesky) cp "$path" "$out/b/$name" ;;
      test:gpu_nccl) cp "$path" "$out/b/t_gpu_nccl" ;;
      test:gpu_ranks) cp "$path" "$out/b/t_gpu_ranks_nccl" ;;
    esac
  done
fi
rm -f "$exes"
strip "$out"/b/*
(cd "$out" && tar cJf b.tar.xz b && rm -rf b)
for spec in ${PACK_REVS:-}; do
  name=${spec%%=*}; rev=${spec#*=}; src=target/revs/src-$name
  git worktree remove --force "$src" 2>/dev/null || rm -rf "$src"
  git worktree add --detach -q "$src" "$rev"
  mkdir -p "$out/revs/$name"
  ( cd "$src"
    cargo build --release -p boundpool-cli --target-dir ../t-$name -q
    cp ../t-$name/release/boundpool "../../../$out/revs/$name/boundpool"
    # The replay, eager, Cholesky, serving and isolation benches and the probe, where that
    # revision has them.
    for bench in replay gpu cholesky serve isolation; do
      r=$(cargo bench -p boundpool-bench --bench $bench --no-run --target-dir ../t-$name \
            --message-format=json 2>/dev/null | python3 -c '
import json, sys
for line in sys.stdin:
    try: m = json.loads(line)
    except ValueError: continue
    if m.get("reason") == "compiler-artifact" and m.get("executable"): print(m["executable"])
' | tail -n 1) || true
      if [ -n "$r" ]; then cp "$r" "../../../$out/revs/$name/bench_$bench"; fi
    done
    if cargo build --release -p boundpool-bench --example gpu_probe --target-dir ../t-$name -q; then
      cp ../t-$name/release/examples/gpu_probe "../../../$out/revs/$name/gpu_probe"
    fi
    # With PACK_MPI, the ranks bench too (ranks_call.sh alternates it with this build's).
    if [ -n "${PACK_MPI:-}" ]; then
      r=$(cargo bench -p boundpool-bench --features mpi --bench ranks --no-run \
            --target-dir ../t-$name --message-format=json 2>/dev/null | python3 -c '
import json, sys
for line in sys.stdin:
    try: m = json.loads(line)
    except ValueError: continue
    if m.get("reason") == "compiler-artifact" and m.get("executable"): print(m["executable"])
' | tail -n 1) || true
      if [ -n "$r" ]; then cp "$r" "../../../$out/revs/$name/bench_ranks"; fi
    fi )
  git rev-parse "$rev" > "$out/revs/$name/REV"
  strip "$out/revs/$name"/* 2>/dev/null || true
  xz -9 "$out/revs/$name"/boundpool "$out/revs/$name"/bench_* "$out/revs/$name"/gpu_probe 2>/dev/null || true
  git worktree remove --force "$src"
done
cp benches/device/*.sh "$out/"
# This machine's strace and the libraries it needs beyond libc (the GPU machine has none), for
# counting a run's system calls there: lib.sh sets STRACE to run it.
if command -v strace >/dev/null; then
  mkdir -p "$out/strace"; cp "$(command -v strace)" "$out/strace/"
  ldd "$(command -v strace)" | awk '/=> \// {print $3}' | grep -vE '/libc\.so' \
    | xargs -r cp -L -t "$out/strace/"
fi
ls -la "$out"; tar tJf "$out/b.tar.xz" | tr '\n' ' '; echo

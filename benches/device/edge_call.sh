#!/usr/bin/env bash
# The 8-byte cross-rank edge on the 16-core host, by worker count (2 ranks), with its hops and
# the floor of the runtime's own MPI calls (bench_ranks prints it beside raw MPI). Uses
# .devbin/x/NAME when present (a newer build than the pack's), NAME the first word of each
# line of EDGE_VARIANTS (bench_ranks otherwise: the pack's). Here: carry [".devbin"],
# `bash .devbin/edge_call.sh` (about 60 s; EDGE_VARIANTS overrides the list).
source .devbin/lib.sh
nproc; cat /sys/devices/system/clocksource/clocksource0/current_clocksource
python3 -c "
import time
t=time.perf_counter_ns()
for _ in range(1000000): time.monotonic_ns()
print((time.perf_counter_ns()-t)/1e6, 'ns per time.monotonic_ns() in Python (a loop of 1e6)')"
deadline ${TOTAL:-150}
logs_in /tmp/bp-edge edge.tgz fresh
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
SUMMARY='^\| (8-byte|\(floor\))|taken by|panicked|FAILED'
i=0
while read -r args; do
  [ -z "$args" ] && continue
  i=$((i+1))
  bin=${args%% *}; args=${args#* }
  R=$B/bench_ranks; [ -x x/$bin ] && R=$PWD/x/$bin
  echo "-- ${R#$PWD/} $args"
  step edge_$i 20 mpirun --bind-to none -np 2 $R --dag 0 --no-big --runs 3 --edge-breakdown $args
  grep -E "^\| (send node body -> send posted|send posted|arrival seen|all bytes|Completer|producer)" $LOGS/edge_$i.log | cut -c1-150
  finish
done <<< "${EDGE_VARIANTS:-"bench_ranks_base --workers 2
bench_ranks --workers 2
bench_ranks_base --workers 1
bench_ranks --workers 1
bench_ranks_base --workers 2
bench_ranks --workers 2
bench_ranks_base --workers 4
bench_ranks --workers 4"}"

#!/usr/bin/env bash
# Stop 46's second device call (issue 33 item 5): this pack's bench_serve priority rounds
# (ROUNDS, 5, in one process per variant) under several settings, alternated twice:
#   plain     the bench's settings (wait_spin and idle_spin 200 µs, the library's budget of
#             spinning waiters)
#   nospin    --spinning-waiters 0: only the latency-critical client's waiter spins
#   apart     --batch-cores: the batch clients off the SMT siblings of the latency workers'
#             cores and of the latency-critical client's core (read from the first run's
#             placement line and sysfs); where no core has a sibling, --idle-spin-us 20 instead
# The host's CPU topology is printed first. Then, with TESTS, every GPU test binary.
# Here: `bash benches/device/pack.sh`, then with carry [".devbin"]:
# `bash .devbin/stop46_variants.sh`.
cd "$(dirname "$0")/.."
source .devbin/lib.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; nproc
lscpu | grep -iE "model name|thread|core|socket|numa" | tr -s ' '
deadline ${TOTAL:-560}
logs_in /tmp/bp-s46v s46v.tgz fresh
SUMMARY='panicked|Error'
P="--priority-only --rounds ${ROUNDS:-5} --isolate high --high-partition 16 --no-torch --batch-clients 8,16,32 --seconds 1"
run() { step rounds_$1 150 $B/bench_serve $P "${@:2}"
  grep -E "^clients placed|^SMT" $LOGS/rounds_$1.log | head -2
  grep -E "^\| (bf16|f32) " $LOGS/rounds_$1.log | cut -d'|' -f2-12; finish; }
run plain_1
apart=$(python3 - "$LOGS/rounds_plain_1.log" <<'PY'
import re, sys
log = open(sys.argv[1]).read()
m = re.search(r'workers on (\[.*?\]), batch clients on \[(.*?)\], the latency-critical client on \[(\d+)\]', log)
if not m:
    sys.exit(0)
groups = eval(m.group(1))
lat = [c for g, cores in groups if 'latency' in g for c in cores]
free = [int(c) for c in m.group(2).split(',') if c.strip()]
high = int(m.group(3))
def sib(c):
    try:
        s = open(f'/sys/devices/system/cpu/cpu{c}/topology/thread_siblings_list').read().strip()
    except OSError:
        return set()
    out = set()
    for part in s.split(','):
        a, _, b = part.partition('-')
        out.update(range(int(a), int(b or a) + 1))
    return out - {c}
avoid = set().union(*(sib(c) for c in lat + [high]))
batch = [c for c in free if c not in avoid]
if batch != free and len(batch) >= 2:
    print(','.join(map(str, batch)))
PY
)
if [ -n "$apart" ]; then third="--batch-cores $apart"; echo "apart: batch clients on $apart"
else third="--idle-spin-us 20"; echo "no SMT sibling to avoid: the third variant is $third"; fi
run nospin_1 --spinning-waiters 0
run third_1 $third
run plain_2
run nospin_2 --spinning-waiters 0
run third_2 $third
[ -n "${TESTS:-}" ] && gpu_tests

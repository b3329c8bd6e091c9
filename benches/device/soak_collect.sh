#!/usr/bin/env bash
# On the GPU machine, after `DETACH=1 ... soak_and_sanitizers.sh`: waits for the detached soak,
# prints its figures and returns every log as $OUT/logs2.tgz.
L=/tmp/boundpool-logs2
while [ ! -f $L/soak.rc ]; do sleep 1; done
echo "== soak rc=$(cat $L/soak.rc) @${SECONDS}s"; tail -c 2500 $L/soak.json; echo; tail -n 5 $L/soak.err
tar czf $OUT/logs2.tgz -C $L .

#!/usr/bin/env bash
# On the GPU machine, after `DETACH=1 ... soak_and_sanitizers.sh`: waits for the detached soak,
# prints its figures and returns every log as $OUT/logs2.tgz.
source "$(dirname "$0")/lib.sh"
logs_in /tmp/boundpool-logs2 logs2.tgz   # soak_and_sanitizers.sh's, kept
while [ ! -f $LOGS/soak.rc ]; do sleep 1; done
echo "== soak rc=$(cat $LOGS/soak.rc) @${SECONDS}s"; tail -c 2500 $LOGS/soak.json; echo; tail -n 5 $LOGS/soak.err
finish

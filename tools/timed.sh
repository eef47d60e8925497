#!/usr/bin/env bash
# Run a stage and say how long it took (CI's log shows where its 90 minutes go).
stage=$1; shift
start=$(date +%s)
echo "=== stage $stage: start $(date -u +%H:%M:%S)"
"$@"; rc=$?
echo "=== stage $stage: $(( $(date +%s) - start )) s, exit $rc"
exit $rc

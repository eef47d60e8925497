#!/usr/bin/env bash
# Run a stage and say how long it took (CI's log shows where its 90 minutes go). When the stage fails, repeat its last
# failed tasks at the end: CI keeps only the tail of a long log, and a molecule failure ends in pages of destroy output.
stage=$1; shift
start=$(date +%s)
log=$(mktemp "${TMPDIR:-/tmp}/stage-$stage.XXXXXX.log")
echo "=== stage $stage: start $(date -u +%H:%M:%S)"
"$@" 2>&1 | tee "$log"; rc=${PIPESTATUS[0]}
echo "=== stage $stage: $(( $(date +%s) - start )) s, exit $rc"
summary='^=== stage .* failed; its last failed tasks'
if ((rc != 0)) && ! grep -q "$summary" "$log"; then  # a nested stage already said it
  echo "=== stage $stage failed; its last failed tasks (whole log: $log):"
  sed 's/\x1b\[[0-9;]*m//g' "$log" \
    | grep -n -B2 -A20 -E '(^|│ )(fatal|failed): \[|\[ERROR\]|^ERROR|Traceback \(most recent call last\)' | tail -n 120
else
  rm -f "$log"
fi
exit $rc

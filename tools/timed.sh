#!/usr/bin/env bash
# tools/timed.sh [--budget SECONDS] STAGE COMMAND...
# Run a stage and say how long it took (CI's log shows where its 90 minutes go). With --budget, or when
# TIMED_DEADLINE (epoch seconds; .ci/run sets it short of CI's hard limit) comes first, a stage that runs longer is
# stopped and fails with a message naming it, instead of CI's limit ending the run without a word.
# When the outermost stage fails, end the log with a short account of what failed: CI shows only the last few
# dozen lines of a long log, and a molecule failure ends in pages of destroy output.
budget=
if [[ ${1:-} == --budget ]]; then budget=$2; shift 2; fi
stage=$1; shift
start=$(date +%s)
limit=$budget
if [[ -n ${TIMED_DEADLINE:-} ]]; then
  left=$(( TIMED_DEADLINE - start ))
  if [[ -z $limit ]] || (( left < limit )); then limit=$left; fi
fi
log=$(mktemp "${TMPDIR:-/tmp}/stage-$stage.XXXXXX.log")
outermost=$([[ -z ${TIMED_STAGE_OUTER:-} ]] && echo yes)
export TIMED_STAGE_OUTER=${TIMED_STAGE_OUTER:-$stage}
echo "=== stage $stage: start $(date -u +%H:%M:%S)${limit:+, budget $limit s}"
if [[ -n $limit ]]; then
  if (( limit <= 0 )); then
    echo "=== stage $stage: not started, the test run's deadline has passed (TIMED_DEADLINE)"; exit 124
  fi
  # timeout signals the stage's whole process group (molecule, ansible-playbook and their children).
  set -- timeout --kill-after=30 "$limit" "$@"
fi
"$@" 2>&1 | tee "$log"; rc=${PIPESTATUS[0]}
echo "=== stage $stage: $(( $(date +%s) - start )) s, exit $rc"
if [[ -n $limit ]] && (( rc == 124 || rc == 137 )); then
  echo "=== stage $stage exceeded its budget of $limit s and was stopped: see where its time went above" \
       "(molecule logs each task's duration), or raise its --budget in tools/test.sh if it grew on purpose"
fi
if ((rc != 0)) && [[ $outermost ]]; then
  echo "=== stage $stage failed (whole log: $log). Its last failed tasks (earlier ones may have been rescued):"
  # A failed task prints `TASK [name]`, then `fatal: [host]: FAILED! =>` and its result indented below (YAML
  # results). A rescued one is followed by its rescue tasks and an ignored one by `...ignoring`: the last one not
  # ignored is what stopped the play.
  sed 's/\x1b\[[0-9;]*m//g' "$log" | awk '
    /^TASK \[/ { task = $0; body = 0 }
    body && /^[ \t]/ && kept[n] < 12 { text[n] = text[n] "\n    " substr($0, 1, 300); kept[n]++; next }
    { body = 0 }
    /^(fatal|failed): \[/ { n++; tasks[n] = task; text[n] = "  " substr($0, 1, 600); ignored[n] = 0; kept[n] = 0; body = 1 }
    /^\.\.\.ignoring/ { if (n) ignored[n] = 1 }
    /^ERROR|Traceback \(most recent call last\)/ { e++; errors[e] = substr($0, 1, 300) }
    END {
      shown = 0
      for (i = n; i >= 1 && shown < 2; i--) if (!ignored[i]) { pick[++shown] = i }
      for (j = shown; j >= 1; j--) { print "  " tasks[pick[j]]; print text[pick[j]] }
      for (i = (e > 2 ? e - 1 : 1); i <= e; i++) print "  " errors[i]
    }'
  docker_root=$(docker info -f '{{.DockerRootDir}}' 2>/dev/null | grep ^/ || echo /)
  echo "  disk free under $docker_root: $(df -h --output=avail "$docker_root" | tail -1)"
else
  rm -f "$log"
fi
exit $rc

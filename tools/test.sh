#!/usr/bin/env bash
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# `make test`: the venv, lint, sanity and unit tests, then the molecule scenarios on lab workstations. The lab's
# artifacts (base image, serving image, tarballs, gateway image, image store) build in the background meanwhile: that
# is mostly network and disk. The rest keeps both cores busy: run beside the first group of scenarios, lint and the
# unit tests took 236 s and 562 s instead of 142 s and 234 s, and gpu_stack ran past its 900 s budget (419 s alone).
# Each stage has a budget (tools/timed.sh --budget): a stage that hangs or grows fails with its name, long before
# CI's 90-minute limit. The budgets are 1.5-2x what a stage takes on a fresh 2-core machine (the three scenarios
# that run at once slow each other down).
set -uo pipefail
cd "$(dirname "$0")/.."
export PATH=$PWD/.venv/bin:$PATH
scenarios=(${MOLECULE_SCENARIOS:?the Makefile names the scenarios: run make test})
declare -A budget=([venv]=600 [lint]=300 [sanity]=420 [unit]=600 [lab-artifacts]=1200 [unit-lab-share]=900
                   [molecule-default]=600 [molecule-gpu_stack]=900 [molecule-gpu_workstation]=1200
                   [molecule-vllm_server]=1200 [molecule-fleet]=4500)
t0=$(date +%s)
summary=()
run() {  # run STAGE COMMAND...: one timed stage, its time kept for the summary
  local stage=$1 started rc; shift
  started=$(date +%s)
  tools/timed.sh --budget "${budget[$stage]:-900}" "$stage" "$@"; rc=$?
  summary+=("$(printf '%-26s %5d s  exit %d' "$stage" $(( $(date +%s) - started )) "$rc")")
  return $rc
}
finish() {
  local failed
  failed=$(printf '%s\n' "${summary[@]}" | grep -vc 'exit 0$')
  echo "=== test summary ($(( $(date +%s) - t0 )) s in all)"
  printf '  %s\n' "${summary[@]}"
  echo "stages: $(( ${#summary[@]} - failed )) passed, $failed failed"
  exit "$1"
}

# A stage in the background: its output goes to .cache/STAGE.log, printed when it is collected.
start_background() {  # start_background STAGE COMMAND...; sets $background_pid
  local stage=$1; shift
  (run "$stage" "$@"; rc=$?; echo "${summary[-1]}" > ".cache/$stage.summary"; exit $rc) > ".cache/$stage.log" 2>&1 &
  background_pid=$!
}
collect() {  # collect STAGE PID: wait for it, print its log, keep its summary line; returns its exit status
  local stage=$1 rc
  wait "$2"; rc=$?
  echo "=== $stage (ran in the background) log:"; cat ".cache/$stage.log"
  summary+=("$(cat ".cache/$stage.summary" 2>/dev/null || echo "$stage: no summary")")
  return $rc
}
# ansible-lint and ansible-test sanity are single-threaded for most of their time: on 2 cores they run at once; then
# the unit tests. Each keeps its own stage line and budget.
static_checks() {
  local rc=0 sanity
  start_background sanity make --no-print-directory sanity
  sanity=$background_pid
  run lint make --no-print-directory lint || rc=1
  collect sanity $sanity || rc=1
  ((rc == 0)) && { run unit make --no-print-directory unit UNIT_ARGS="-m 'not needs_lab_share'" || rc=1; }
  return $rc
}
run_group() {  # run_group GROUP: one scenario, or scenarios joined by '+' at once; returns non-zero when one failed
  local group=$1 members pids=() i rc=0
  IFS=+ read -ra members <<<"$group"
  if ((${#members[@]} == 1)); then
    run "molecule-$group" molecule test -s "$group"
    return
  fi
  for scenario in "${members[@]}"; do
    start_background "molecule-$scenario" molecule test -s "$scenario"
    pids+=("$background_pid")
  done
  echo "=== molecule scenarios ${members[*]} run at once (logs: .cache/molecule-<scenario>.log)"
  for i in "${!members[@]}"; do
    collect "molecule-${members[$i]}" "${pids[$i]}" || rc=1
  done
  return $rc
}

mkdir -p .cache
start_background lab-artifacts make --no-print-directory lab-artifacts
artifacts=$background_pid
trap 'kill $artifacts 2>/dev/null' EXIT
echo "=== lab artifacts build in the background (log: .cache/lab-artifacts.log)"

status=0
if run venv make --no-print-directory venv; then
  static_checks || status=1
else
  status=1
fi
collect lab-artifacts $artifacts || status=1
trap - EXIT
((status == 0)) || finish 1

# The unit tests that need the lab share's model tarball: on a fresh machine it was still building during the unit
# stage, and there they would have been skipped. Here a missing tarball fails them. One process: ~26 s, and the
# vision-language server's start (tests/unit/lab/test_tiny_vl.py: a minute alone, longer beside the scenarios). It
# runs beside the first scenario group, whose last minute leaves a core idle, instead of before it.
start_background unit-lab-share env ONPREM_VLLM_REQUIRE_LAB_SHARE=1 pytest tests/unit -q -m needs_lab_share
lab_share_units=$background_pid
trap 'kill $lab_share_units 2>/dev/null' EXIT

# A group of scenarios joined by '+' runs at once (no speed limit decides a scenario). vllm_server cannot join the
# first group: its hosts have default's names (molecule-ws1, molecule-ws2).
for i in "${!scenarios[@]}"; do
  run_group "${scenarios[$i]}" || status=1
  if ((i == 0)); then collect unit-lab-share $lab_share_units || status=1; trap - EXIT; fi
  ((status == 0)) || finish 1
done
finish 0

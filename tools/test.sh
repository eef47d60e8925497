#!/usr/bin/env bash
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# `make test`: the venv, lint, sanity and unit tests, then the molecule scenarios on lab workstations. The lab's
# artifacts (base image, serving image, tarballs, gateway image, image store) build in the background meanwhile: that
# is mostly network and disk. The rest keeps both cores busy: run beside the first group of scenarios, lint and the
# unit tests took 236 s and 562 s instead of 142 s and 234 s, and gpu_stack ran past its 900 s budget (419 s alone).
# Where the lab's artifacts are cached (no build to wait for), the static stages need the cores more than the time:
# they run beside the deploys of vllm_server and fleet instead, which start one vLLM server at a time and left ~40 %
# of the 2 cores idle (measured: vllm_server alone, /proc/stat over its deploy). Those scenarios' timed checks
# (benchmark gates, the prober's counts) wait until the stages beside them ended (LAB_QUIET_FILE,
# molecule/default/quiet.yml), so they measure the same machine as before.
# Each stage has a budget (tools/timed.sh --budget): a stage that hangs or grows fails with its name, long before
# CI's 90-minute limit. The budgets are 1.5-2x what a stage takes on a fresh 2-core machine (the three scenarios
# that run at once slow each other down; a static stage beside a deploy shares the cores with it).
set -uo pipefail
cd "$(dirname "$0")/.."
export PATH=$PWD/.venv/bin:$PATH
scenarios=(${MOLECULE_SCENARIOS:?the Makefile names the scenarios: run make test})
declare -A budget=([venv]=600 [lint]=450 [sanity]=600 [unit]=900 [lab-artifacts]=1200
                   [molecule-default]=600 [molecule-gpu_stack]=900 [molecule-gpu_workstation]=1200
                   [molecule-vllm_server]=1200 [molecule-fleet]=3600)
# The static stages, and the scenario each runs beside when they are not run first.
static_stages=(lint sanity unit)
declare -A beside=([lint]=vllm_server [sanity]=vllm_server [unit]=fleet)
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
  ((rc == 0)) && { run unit make --no-print-directory unit || rc=1; }
  return $rc
}
start_fillers() {  # start_fillers SCENARIO: the deferred static stages that run beside it; sets filler_pids
  local stage done_files=()
  filler_pids=() filler_stages=()
  for stage in "${deferred[@]}"; do
    [[ ${beside[$stage]} == "$1" ]] || continue
    rm -f ".cache/$stage.summary"
    start_background "$stage" make --no-print-directory "$stage"
    filler_pids+=("$background_pid") filler_stages+=("$stage") done_files+=(".cache/$stage.summary")
  done
  ((${#filler_stages[@]})) || return 0
  deferred=($(printf '%s\n' "${deferred[@]}" | grep -vxF -f <(printf '%s\n' "${filler_stages[@]}")))
  echo "=== ${filler_stages[*]} run beside molecule-$1 (logs: .cache/<stage>.log)"
  # The scenario's timed checks wait for this file: it appears once every stage beside it wrote its summary line.
  export LAB_QUIET_FILE=$PWD/.cache/quiet-$1
  rm -f "$LAB_QUIET_FILE"
  (while ! ls "${done_files[@]}" >/dev/null 2>&1; do sleep 2; done; touch "$LAB_QUIET_FILE") &
}
collect_fillers() {  # collect_fillers: wait for the stages start_fillers started; returns non-zero when one failed
  local i rc=0
  for i in "${!filler_stages[@]}"; do
    collect "${filler_stages[$i]}" "${filler_pids[$i]}" || rc=1
  done
  unset LAB_QUIET_FILE
  return $rc
}
run_group() {  # run_group GROUP: one scenario, or scenarios joined by '+' at once; returns non-zero when one failed
  local group=$1 members pids=() i rc=0
  IFS=+ read -ra members <<<"$group"
  if ((${#members[@]} == 1)); then
    start_fillers "$group"
    run "molecule-$group" molecule test -s "$group" || rc=1
    collect_fillers || rc=1
    return $rc
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
artifacts_ready_within() {  # artifacts_ready_within SECONDS: whether the background artifacts build ends by then
  local until=$(( $(date +%s) + $1 ))
  while kill -0 "$artifacts" 2>/dev/null; do
    (( $(date +%s) < until )) || return 1
    sleep 1
  done
}

mkdir -p .cache
start_background lab-artifacts make --no-print-directory lab-artifacts
artifacts=$background_pid
trap 'kill $artifacts 2>/dev/null' EXIT
echo "=== lab artifacts build in the background (log: .cache/lab-artifacts.log)"

status=0
deferred=()
if run venv make --no-print-directory venv; then
  # A fresh machine builds the lab's images for ~15 minutes: the static stages fill that wait. A cached one has them
  # in seconds: the static stages go beside the scenarios' deploys.
  if artifacts_ready_within 60; then
    deferred=("${static_stages[@]}")
    echo "=== lab artifacts ready: ${deferred[*]} run beside the scenarios' deploys"
  else
    static_checks || status=1
  fi
else
  status=1
fi
collect lab-artifacts $artifacts || status=1
trap - EXIT
((status == 0)) || finish 1

# A group of scenarios joined by '+' runs at once: none measures speed (the scenarios whose gates benchmark a server
# run alone).
for group in "${scenarios[@]}"; do
  run_group "$group" || finish 1
done
# Static stages whose scenario is not in MOLECULE_SCENARIOS run last, on their own.
for stage in "${deferred[@]}"; do
  run "$stage" make --no-print-directory "$stage" || finish 1
done
finish 0

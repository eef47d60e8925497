#!/usr/bin/env bash
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# `make test`: the venv, lint and sanity, then the molecule scenarios on lab workstations; the unit tests run beside
# the last scenario group. The lab's artifacts (base image, serving image, tarballs, gateway image, image store) build
# in the background meanwhile: that is mostly network and disk. Lint, sanity and the first scenario group keep both
# cores busy (beside that group, lint and the unit tests took 236 s and 562 s instead of 142 s and 234 s, and gpu_stack
# ran past its 900 s budget); the fleet scenario leaves about a third of the CPU idle while it waits on vLLM starts
# one host at a time, and the unit tests (CPU-bound, at the lowest priority) take that instead of a stage of their own.
# Each stage has a budget (tools/timed.sh --budget): a stage that hangs or grows fails with its name, long before
# CI's 90-minute limit. The budgets are 1.5-2x what a stage takes on a fresh 2-core machine (the three scenarios
# that run at once slow each other down).
set -uo pipefail
cd "$(dirname "$0")/.."
export PATH=$PWD/.venv/bin:$PATH
scenarios=(${MOLECULE_SCENARIOS:?the Makefile names the scenarios: run make test})
declare -A budget=([venv]=600 [lint]=300 [sanity]=420 [unit]=1800 [lab-artifacts]=1200
                   [molecule-default]=600 [molecule-gpu_stack]=900 [molecule-gpu_workstation]=1200
                   [molecule-vllm_server-setup]=1200 [molecule-fleet-setup]=1200
                   [molecule-vllm_server]=1200 [molecule-fleet]=3000)
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
# ansible-lint and ansible-test sanity are single-threaded for most of their time: on 2 cores they run at once. Each
# keeps its own stage line and budget.
static_checks() {
  local rc=0 sanity
  start_background sanity make --no-print-directory sanity
  sanity=$background_pid
  run lint make --no-print-directory lint || rc=1
  collect sanity $sanity || rc=1
  return $rc
}
at_once() {  # at_once SUFFIX COMMAND SCENARIO...: "COMMAND SCENARIO" for every scenario at once, each a stage
  local suffix=$1 command=$2 pids=() i rc=0 scenario; shift 2
  local members=("$@")
  for scenario in "${members[@]}"; do
    # shellcheck disable=SC2086  # COMMAND is a word list
    start_background "molecule-$scenario$suffix" $command "$scenario"
    pids+=("$background_pid")
  done
  echo "=== molecule scenarios ${members[*]} at once: $command (logs: .cache/molecule-<scenario>$suffix.log)"
  for i in "${!members[@]}"; do
    collect "molecule-${members[$i]}$suffix" "${pids[$i]}" || rc=1
  done
  return $rc
}
# Scenarios joined by '/' (those whose gates benchmark a server): their hosts are set up at once (destroy, create,
# prepare, converge, idempotence: tools/molecule-phase.sh), then each finishes alone, in order (side effects, verify,
# destroy), so a benchmark never shares the machine with another scenario's work. Set up one after the other, the
# vllm_server and fleet scenarios left 40 % and 30 % of the CPU idle, waiting on vLLM starts one host at a time.
run_pipelined() {  # run_pipelined GROUP: scenarios joined by '/'; returns non-zero when one failed
  local members rc=0 scenario
  IFS=/ read -ra members <<<"$1"
  at_once -setup "tools/molecule-phase.sh setup" "${members[@]}" || rc=1
  for scenario in "${members[@]}"; do
    if ((rc == 0)); then
      run "molecule-$scenario" tools/molecule-phase.sh finish "$scenario" || rc=1
    else  # a failed setup destroyed its own hosts; the others' go too
      molecule destroy -s "$scenario" >/dev/null 2>&1
    fi
  done
  return $rc
}
run_group() {  # run_group GROUP: one scenario, or scenarios joined by '+' at once; returns non-zero when one failed
  local members
  [[ $1 == */* ]] && { run_pipelined "$1"; return; }
  IFS=+ read -ra members <<<"$1"
  if ((${#members[@]} == 1)); then
    run "molecule-$1" molecule test -s "$1"
  else
    at_once "" "molecule test -s" "${members[@]}"
  fi
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

# A group of scenarios joined by '+' runs at once: none measures speed. The unit tests start with the last group at
# the lowest priority (tools/idle-priority.sh): they get only the CPU its scenarios leave idle, so the benchmark gates
# there (the old and the new server measured the same way, thresholds of 40-60 %) keep their margin.
last=$((${#scenarios[@]} - 1))
for i in "${!scenarios[@]}"; do
  if ((i == last)); then
    start_background unit tools/idle-priority.sh make --no-print-directory unit
    unit=$background_pid
    trap 'kill $unit 2>/dev/null' EXIT
  fi
  run_group "${scenarios[$i]}" || status=1
  ((status == 0)) || break
done
if [[ -n ${unit:-} ]]; then
  collect unit "$unit" || status=1
  trap - EXIT
fi
finish $status

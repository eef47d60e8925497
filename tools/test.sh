#!/usr/bin/env bash
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# `make test`: the venv, then the molecule scenarios on lab workstations once the lab's artifacts are built (base
# image, serving image, tarballs, gateway image, image store: in the background from the start, mostly network and
# disk). Lint, sanity and the unit tests run in the background at the lowest priority from the venv to the end: on 2
# cores the scenarios keep the CPU busy only part of the time (vllm_server and fleet wait on vLLM starts one host at a
# time), and as stages of their own the checks took 200-500 s of the run. At normal priority beside the first scenario
# group they slowed it down (lint 236 s, unit 562 s, gpu_stack past its 900 s budget).
# Each stage has a budget (tools/timed.sh --budget): a stage that hangs or grows fails with its name, long before
# CI's 90-minute limit. The budgets are 1.5-2x what a stage takes on a fresh 2-core machine (the three scenarios
# that run at once slow each other down); the background checks' budgets cover the whole run, as they mostly wait.
set -uo pipefail
cd "$(dirname "$0")/.."
export PATH=$PWD/.venv/bin:$PATH
scenarios=(${MOLECULE_SCENARIOS:?the Makefile names the scenarios: run make test})
declare -A budget=([venv]=600 [lint]=3000 [sanity]=3000 [unit]=3000 [lab-artifacts]=1200
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
background=("$artifacts")
trap 'kill "${background[@]}" 2>/dev/null' EXIT
echo "=== lab artifacts build in the background (log: .cache/lab-artifacts.log)"

status=0
run venv make --no-print-directory venv || status=1
# Lint, sanity and the unit tests need no lab host: from here to the end they run in the background at the lowest
# priority (tools/idle-priority.sh), on the CPU the artifacts' build and the scenarios leave idle (a third of it while
# vllm_server and fleet wait on vLLM starts one host at a time). The scenarios' benchmark gates (the old and the new
# server measured the same way, thresholds of 40-60 %) keep their margin; each check keeps its own stage line.
checks=(lint sanity unit)
check_pids=()
if ((status == 0)); then
  for check in "${checks[@]}"; do
    start_background "$check" tools/idle-priority.sh make --no-print-directory "$check"
    check_pids+=("$background_pid")
    background+=("$background_pid")
  done
  echo "=== ${checks[*]} in the background at the lowest priority (logs: .cache/<stage>.log)"
fi
collect lab-artifacts "$artifacts" || status=1

# A group of scenarios joined by '+' runs at once: none measures speed; '/' sets up hosts at once (run_pipelined).
if ((status == 0)); then
  for group in "${scenarios[@]}"; do
    run_group "$group" || { status=1; break; }
  done
fi
for i in "${!check_pids[@]}"; do
  collect "${checks[$i]}" "${check_pids[$i]}" || status=1
done
trap - EXIT
finish $status

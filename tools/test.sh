#!/usr/bin/env bash
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# `make test`: the venv, lint, sanity and unit tests, then the molecule scenarios on lab workstations. The lab's
# artifacts (base image, serving image, tarballs, gateway image, image store) build in the background meanwhile: that
# is mostly network and disk, the rest mostly CPU, and on a fresh machine each side takes about seven minutes.
# Each stage has a budget (tools/timed.sh --budget): a stage that hangs or grows fails with its name, long before
# CI's 90-minute limit. The budgets are about 1.5x what a stage takes on a fresh 2-core machine.
set -uo pipefail
cd "$(dirname "$0")/.."
export PATH=$PWD/.venv/bin:$PATH
scenarios=(${MOLECULE_SCENARIOS:?the Makefile names the scenarios: run make test})
declare -A budget=([venv]=600 [lint]=300 [sanity]=420 [unit]=600 [lab-artifacts]=1200
                   [molecule-default]=420 [molecule-gpu_stack]=720 [molecule-gpu_workstation]=900
                   [molecule-vllm_server]=1200 [molecule-monitoring]=720 [molecule-fleet]=1500)
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

mkdir -p .cache
artifacts_log=.cache/lab-artifacts.log
(run lab-artifacts make --no-print-directory lab-artifacts; echo "${summary[-1]}" \
  > .cache/lab-artifacts.summary) > "$artifacts_log" 2>&1 &
artifacts=$!
trap 'kill $artifacts 2>/dev/null' EXIT
echo "=== lab artifacts build in the background (log: $artifacts_log)"

status=0
for stage in venv lint sanity unit; do
  run "$stage" make --no-print-directory "$stage" || { status=1; break; }
done
wait $artifacts; artifacts_rc=$?
trap - EXIT
echo "=== lab artifacts (background) log:"; cat "$artifacts_log"
summary+=("$(cat .cache/lab-artifacts.summary 2>/dev/null || echo 'lab-artifacts: no summary')")
((status == 0 && artifacts_rc == 0)) || finish 1

# A group of scenarios joined by '+' runs at once: they wait mostly on package downloads and dpkg, not the CPU, and
# none measures speed (the scenarios whose gates benchmark a server run alone).
for group in "${scenarios[@]}"; do
  IFS=+ read -ra members <<<"$group"
  if ((${#members[@]} == 1)); then
    run "molecule-$group" molecule test -s "$group" || finish 1
    continue
  fi
  pids=()
  for scenario in "${members[@]}"; do
    (run "molecule-$scenario" molecule test -s "$scenario"; rc=$?; echo "${summary[-1]}" > ".cache/molecule-$scenario.summary"
     exit $rc) > ".cache/molecule-$scenario.log" 2>&1 &
    pids+=($!)
  done
  echo "=== molecule scenarios ${members[*]} run at once (logs: .cache/molecule-<scenario>.log)"
  group_rc=0
  for i in "${!members[@]}"; do
    wait "${pids[$i]}" || group_rc=1
    echo "=== molecule-${members[$i]} log:"; cat ".cache/molecule-${members[$i]}.log"
    summary+=("$(cat ".cache/molecule-${members[$i]}.summary" 2>/dev/null || echo "molecule-${members[$i]}: no summary")")
  done
  ((group_rc == 0)) || finish 1
done
finish 0

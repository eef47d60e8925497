#!/usr/bin/env bash
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# The rollout benchmark on the embedded lab: 3 workstations + a gateway, a steady prober through the gateway, a rolling
# upgrade to the second image tag; prints the total rollout time, each host's time out of rotation and the prober's
# success rate (results in .cache/rollout-bench/). Run from the repository root:  bash benchmarks/rollout_bench.sh
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$PWD/.venv/bin:$PATH"
FROM_TAG="${FROM_TAG:-v0.32.0}"
TO_TAG="${TO_TAG:-v0.32.0-lab2}"
python3 lab/labctl.py up --workstations 3 --gateway
python3 lab/build_artifacts.py
python3 lab/build_gateway_image.py
# The fleet on FROM_TAG first (a no-op when it already is), then the measured rollout to TO_TAG.
ansible-playbook site.yml -i inventories/lab -e onprem_vllm_image_tag="$FROM_TAG" -e onprem_vllm_rollout_require_gateway=true
ansible-playbook benchmarks/rollout_bench.yml -i inventories/lab -e fleet_bench_tag="$TO_TAG" -e fleet_bench_name=bench

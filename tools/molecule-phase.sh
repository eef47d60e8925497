#!/usr/bin/env bash
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# molecule-phase.sh setup|finish SCENARIO: a scenario's test sequence (molecule.yml) in two halves, so that the hosts
# of several scenarios can be set up at once while nothing measures a server (tools/test.sh). setup runs the actions
# before side_effect (or before verify where there is none): destroy, create, prepare, converge, idempotence; finish
# runs the rest: side_effect, verify, destroy. As in `molecule test`, a failed action destroys the scenario's hosts.
set -uo pipefail
cd "$(dirname "$0")/.."
half=${1:?setup or finish} scenario=${2:?scenario}
mapfile -t actions < <(python - "$scenario" "$half" <<'PY'
import sys
import yaml
scenario, half = sys.argv[1:]
with open(f"molecule/{scenario}/molecule.yml", encoding="utf-8") as f:
    sequence = yaml.safe_load(f)["scenario"]["test_sequence"]
cut = sequence.index("side_effect" if "side_effect" in sequence else "verify")
print("\n".join({"setup": sequence[:cut], "finish": sequence[cut:]}[half]))
PY
)
((${#actions[@]} > 0)) || { echo "molecule-phase: no $half actions for scenario $scenario" >&2; exit 2; }
for action in "${actions[@]}"; do
  if ! molecule "${action//_/-}" -s "$scenario"; then
    echo "molecule-phase: $scenario: $action failed; destroying its hosts" >&2
    molecule destroy -s "$scenario"
    exit 1
  fi
done

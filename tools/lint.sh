#!/usr/bin/env bash
# ansible-lint, production profile, offline (Galaxy is unreachable; the bundled collections satisfy galaxy.yml).
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
cd "$repo"
PATH=${VENV:-$repo/.venv}/bin:$PATH exec ansible-lint --offline "$@"

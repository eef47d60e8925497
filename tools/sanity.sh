#!/usr/bin/env bash
# ansible-test sanity on the collection. ansible-test needs the tree at .../ansible_collections/onprem/vllm, so the
# checkout's files (tracked + untracked-not-ignored) are copied into a scratch tree of that shape first.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
venv=${VENV:-$repo/.venv}
scratch=${SANITY_TREE:-$repo/.cache/sanity}
dest=$scratch/ansible_collections/onprem/vllm
rm -rf "$dest" && mkdir -p "$dest"
(cd "$repo" && git ls-files -co --exclude-standard | grep -v '^\.collections/' | while read -r f; do
  [ -f "$f" ] && printf '%s\0' "$f"; done | xargs -0 cp --parents -t "$dest")
"$repo/tools/ansible-test-pip-bootstrap.sh" "$venv"
cd "$dest" && git init -q .  # ansible-test lists files with git; the scratch tree lies inside our ignored .cache
PATH=$venv/bin:$PATH exec ansible-test sanity --venv --python "$("$venv/bin/python" -c 'import sys; print("%d.%d" % sys.version_info[:2])')" "$@"

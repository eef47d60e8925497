#!/usr/bin/env bash
# Print a Python 3.12 interpreter for the controller venv (ansible-core 2.21 needs >= 3.12 on the controller).
for candidate in "${PYTHON:-}" python3.12 "$HOME"/.pyenv/versions/3.12*/bin/python3.12 /usr/local/bin/python3.12; do
  [ -n "$candidate" ] || continue
  if "$candidate" -c 'import sys, venv; sys.exit(sys.version_info[:2] != (3, 12))' 2>/dev/null; then
    command -v "$candidate" || echo "$candidate"
    exit 0
  fi
done
echo "find-python: Python 3.12 with venv is needed for the controller (apt-get install python3.12-venv on Ubuntu 24.04," \
     "or pyenv install 3.12); set PYTHON=/path/to/python3.12 to choose one" >&2
exit 1

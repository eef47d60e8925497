#!/usr/bin/env bash
# ansible-test bootstraps pip in its venvs with a get-pip script downloaded from a host that offline and locked-down
# build machines cannot reach. Put a stand-in at the path it caches that script under: it installs pip from the pip
# wheel (from PyPI, or any index pip is configured with), which is what the real script does.
set -euo pipefail
venv=$1
pip_version=$("$venv/bin/python" - <<'PY'
import re, pathlib, ansible_test
src = (pathlib.Path(ansible_test.__file__).parent / "_internal" / "python_requirements.py").read_text()
print(re.search(r"pip='([0-9.]+)'", src).group(1))
PY
)
cache=$HOME/.ansible/test/cache
script=$cache/get_pip_${pip_version//./_}.py
wheel=$cache/pip-$pip_version-py3-none-any.whl
mkdir -p "$cache"
[ -f "$wheel" ] || "$venv/bin/pip" download -q --no-deps --only-binary=:all: -d "$cache" "pip==$pip_version"
cat > "$script" <<PY
# Stand-in for get-pip.py $pip_version (written by onprem.vllm tools/ansible-test-pip-bootstrap.sh).
import subprocess, sys
args = [a for a in sys.argv[1:] if a not in ("--no-setuptools", "--no-wheel")]
sys.exit(subprocess.call([sys.executable, "$wheel/pip", "install", "--no-index", "--find-links", "$cache", *args]))
PY

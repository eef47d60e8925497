# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""`ansible-galaxy collection build` gives a tarball that installs and resolves like the checkout does."""
from __future__ import annotations

import os
import subprocess
import sys
import tarfile

ROOT = os.path.normpath(os.path.join(os.path.dirname(__file__), "..", ".."))
BIN = os.path.dirname(sys.executable)


def run(*argv, **env):
    proc = subprocess.run([os.path.join(BIN, argv[0]), *argv[1:]], cwd=env.pop("cwd", ROOT), check=False,
                          capture_output=True, text=True, env=dict(os.environ, **env), timeout=300)
    assert proc.returncode == 0 and proc.stdout.strip(), proc.stdout[-2000:] + proc.stderr[-2000:]
    return proc.stdout


def test_built_collection_installs_and_resolves_its_content(tmp_path):
    run("ansible-galaxy", "collection", "build", "--output-path", str(tmp_path))
    tarball = tmp_path / "onprem-vllm-0.1.0.tar.gz"
    with tarfile.open(tarball) as tar:
        names = tar.getnames()
    assert "plugins/modules/kv_headroom.py" in names and "roles/vllm_server/tasks/main.yml" in names
    assert not [n for n in names if n.startswith(("lab/build/", ".collections", ".venv", ".whl"))]

    installed = tmp_path / "installed"
    elsewhere = tmp_path / "elsewhere"  # away from the checkout's ansible.cfg: only the installed copy can answer
    elsewhere.mkdir()
    env = {"ANSIBLE_COLLECTIONS_PATH": str(installed), "PAGER": "cat"}
    run("ansible-galaxy", "collection", "install", "--offline", "--no-deps", "-p", str(installed), str(tarball),
        cwd=str(elsewhere), **env)
    env["cwd"] = str(elsewhere)
    doc = run("ansible-doc", "onprem.vllm.kv_headroom", **env)
    assert "kv_cache_tokens" in doc
    inventory = os.path.join(ROOT, "inventories", "example")
    # The steps site.yml imports are the collection's playbooks: onprem.vllm.plan, .provision, .preflight, .rollout,
    # .monitoring (site.yml itself is the checkout's entry point, beside the inventories).
    out = run("ansible-playbook", "onprem.vllm.rollout", "-i", inventory, "--syntax-check", **env)
    assert "onprem.vllm.rollout" in out or "rollout.yml" in out

# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""A production secret encrypted from this checkout never gets the lab's committed vault password."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.normpath(os.path.join(os.path.dirname(__file__), "..", ".."))
ANSIBLE_VAULT = os.path.join(os.path.dirname(sys.executable), "ansible-vault")


def encrypt(*args):
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANSIBLE_")}
    return subprocess.run([ANSIBLE_VAULT, "encrypt_string", "--name", "vault_vllm_api_key", *args, "s3cret"],
                          cwd=ROOT, env=env, capture_output=True, text=True, check=False)


@pytest.mark.skipif(not shutil.which(ANSIBLE_VAULT), reason="ansible-vault is not installed beside this Python")
def test_encrypt_without_the_operators_vault_id_stops():
    proc = encrypt()
    assert proc.returncode != 0
    assert "encrypt-vault-id=operator" in proc.stderr
    assert "$ANSIBLE_VAULT" not in proc.stdout


@pytest.mark.skipif(not shutil.which(ANSIBLE_VAULT), reason="ansible-vault is not installed beside this Python")
def test_encrypt_with_the_operators_vault_id_uses_it(tmp_path):
    password = tmp_path / "operator.pw"
    password.write_text("not the lab password\n")
    proc = encrypt("--vault-id", f"operator@{password}")
    assert proc.returncode == 0, proc.stderr
    assert "$ANSIBLE_VAULT;1.2;AES256;operator" in proc.stdout
    assert ";lab" not in proc.stdout

# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""What a killed `hf download` leaves (its helper container, the token file) does not outlive the next run, and the
token is never in the helper's environment or the play's output.

Runs hf_cache's hub download (tasks/stage_hub.yml) through ansible-playbook against this machine's real Docker engine
(local connection). No hub is reachable here: the helper image is an empty one made for the test (its `hf` does not
exist, so the download fails at once), which is all the clean-up needs.
"""
from __future__ import annotations

import json
import subprocess

import pytest

pytestmark = pytest.mark.needs_docker

PLAYBOOK = """
- name: hf_cache hub download under test
  hosts: all
  gather_facts: false
  tasks:
    - name: Download
      ansible.builtin.include_role:
        name: hf_cache
        tasks_from: stage_hub.yml
"""
TOKEN = "hf_TestTokenThatMustNeverShow0123456789"
IMAGE = "onprem-test/empty:1"
HELPER = "hf-cache-download-onprem-test--killed-download"


def _docker(*args, check=True):
    return subprocess.run(["docker", *args], capture_output=True, text=True, check=check)


@pytest.fixture(scope="module")
def killed_then_rerun(playbook_cases, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("hf-download")
    token_dir = tmp / "run" / "onprem-hf-cache"
    token_dir.mkdir(parents=True, mode=0o700)
    leftover_token = token_dir / "onprem-test--killed-download.token"
    leftover_token.write_text(TOKEN + "\n")
    subprocess.run(["docker", "import", "-", IMAGE], input=b"\0" * 1024, capture_output=True, check=True)
    _docker("rm", "-f", HELPER, check=False)
    leftover = _docker("create", "--name", HELPER, IMAGE, "hf").stdout.strip()
    variables = {"hf_cache_model": "onprem-test/killed-download", "hf_cache_revision": "a" * 40,
                 "hf_cache_path": str(tmp / "hf"), "hf_cache_image": IMAGE, "hf_cache_token": TOKEN,
                 "hf_cache_token_dir": str(token_dir), "hf_cache_hub_endpoint": "http://127.0.0.1:9"}
    (tmp / "hf").mkdir()
    try:
        run = playbook_cases(PLAYBOOK, {"rerun": variables}, str(tmp))["rerun"]
        helper = _docker("inspect", HELPER, check=False)
        yield run, leftover, helper, token_dir
    finally:
        _docker("rm", "-f", HELPER, check=False)
        _docker("image", "rm", IMAGE, check=False)


def test_the_next_run_removes_the_killed_runs_helper_and_token_file(killed_then_rerun):
    run, leftover, helper, token_dir = killed_then_rerun
    assert leftover and helper.returncode != 0, "a helper container outlived the run"
    assert list(token_dir.iterdir()) == [], "a token file outlived the run"


def test_the_failure_says_what_to_check_and_the_token_shows_nowhere(killed_then_rerun):
    run = killed_then_rerun[0]
    assert "hf_cache: downloading onprem-test/killed-download" in run.failure()
    assert TOKEN not in json.dumps(run.results)

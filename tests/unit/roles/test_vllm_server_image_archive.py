# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""An image archive that holds another image than the pinned one is loaded, then refused with both names, before any
server is touched: vllm_server's image step (tasks_from image, as the rollout stages images) through ansible-playbook
against this machine's real Docker engine, with a one-file image made for the test (`docker import`, `docker save`)."""
from __future__ import annotations

import subprocess

import pytest

pytestmark = pytest.mark.needs_docker

PLAYBOOK = """
- name: vllm_server's image step under test
  hosts: localhost
  gather_facts: false
  tasks:
    - name: Stage the pinned image
      ansible.builtin.include_role:
        name: vllm_server
        tasks_from: image
"""
ARCHIVED = "onprem-test/archived-image:1"
PINNED = "onprem-test/pinned-image"


def _docker(*args, check=True, **kwargs):
    return subprocess.run(["docker", *args], capture_output=True, check=check, **kwargs)


def test_an_archive_of_another_image_is_refused_with_both_names(run_playbook, tmp_path):
    archive = tmp_path / "other-image.tar"
    _docker("rmi", "-f", ARCHIVED, PINNED + ":1", check=False)
    _docker("import", "-", ARCHIVED, input=b"\0" * 1024)
    try:
        _docker("save", "-o", str(archive), ARCHIVED)
        _docker("rmi", "-f", ARCHIVED)
        run = run_playbook(PLAYBOOK, {"vllm_server_image": PINNED, "vllm_server_image_tag": "1",
                                      "vllm_server_image_digest": "", "vllm_server_image_archive": str(archive)})
        message = run.failure()
        assert message, "the archive of another image was accepted"
        assert ARCHIVED in message and PINNED + ":1" in message and "fix vllm_server_image_tag or the archive" in message, \
            message
        assert _docker("image", "inspect", PINNED + ":1", check=False).returncode != 0
    finally:
        _docker("rmi", "-f", ARCHIVED, check=False)

# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The vllm_host_info module against this machine's real Docker engine: a real (never started) container and
image, a real listener, real files; each question answered in one run, the same in check mode."""
from __future__ import annotations

import io
import json
import socket
import subprocess
import tarfile
import uuid

import pytest

from ansible_collections.onprem.vllm.plugins.modules import vllm_host_info

pytestmark = pytest.mark.needs_docker


@pytest.fixture
def docker_objects():
    """(container name, image) created for the test: an image without layers, a container created from it."""
    suffix = uuid.uuid4().hex[:10]
    image, name = "onprem-test/host-state:%s" % suffix, "onprem-test-host-state-%s" % suffix
    empty = io.BytesIO()
    tarfile.open(fileobj=empty, mode="w").close()
    subprocess.run(["docker", "import", "-", image], input=empty.getvalue(), check=True, capture_output=True)
    subprocess.run(["docker", "create", "--name", name, image, "/none"], check=True, capture_output=True)
    yield name, image
    subprocess.run(["docker", "rm", "-f", name], check=False, capture_output=True)
    subprocess.run(["docker", "rmi", "-f", image], check=False, capture_output=True)


@pytest.fixture
def host_state(call_module):
    return lambda **args: call_module(vllm_host_info, **args)


def test_containers_image_port_and_files_in_one_run(host_state, docker_objects, tmp_path):
    name, image = docker_objects
    marker = tmp_path / "vllm.rollout.json"
    marker.write_text(json.dumps({"new": {"image": image}, "replaced": None, "deployment": "d1"}))
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        runs = [host_state(container_names=[name, name + "-previous"], image=image, port=port,
                           deployment_records={"config_dir": str(tmp_path), "name": "vllm"},
                           paths=[str(marker), str(tmp_path / "absent")], _ansible_check_mode=mode)
                for mode in (True, False)]
    for rc, result in runs:
        assert rc == 0 and result["changed"] is False
        assert result["containers"][name]["exists"] and result["containers"][name]["container"]["Config"]["Image"] == image
        assert result["containers"][name + "-previous"] == {"exists": False, "container": None}
        assert [i["RepoTags"] for i in result["images"]] == [[image]]
        assert result["port_listening"] is True
        assert result["deployment_records"] == {"current": None, "previous": None,
                                                "marker": {"new": {"image": image}, "replaced": None, "deployment": "d1"}}
        assert result["paths"] == {str(marker): True, str(tmp_path / "absent"): False}
        assert "archive" not in result  # the image is there: no need to look at its archive


def test_a_closed_port_and_nothing_asked(host_state, free_port):
    rc, result = host_state(port=free_port())
    assert rc == 0 and result["port_listening"] is False
    assert result["containers"] == {} and result["images"] == [] and "deployment_records" not in result


def test_a_missing_image_reports_its_archive_and_the_room_under_docker_s_data_root(host_state, tmp_path):
    archive = tmp_path / "image.tar"
    with archive.open("wb") as handle:
        handle.truncate(5 * 1024**3)  # sparse: takes no space
    rc, result = host_state(image="onprem-test/not-an-image:v0", image_archive=str(archive))
    root = subprocess.run(["docker", "info", "--format", "{{.DockerRootDir}}"], capture_output=True, text=True,
                          check=True).stdout.strip()
    assert rc == 0 and result["images"] == []
    assert result["archive"] == {"exists": True, "size": 5 * 1024**3}
    assert result["docker_root_dir"] == root and result["docker_root_free_bytes"] > 0

    rc, result = host_state(image="onprem-test/not-an-image:v0", image_archive=str(tmp_path / "absent.tar"))
    assert result["archive"] == {"exists": False, "size": 0} and "docker_root_dir" not in result


def test_a_record_that_is_not_json_fails_with_its_path(host_state, tmp_path):
    broken = tmp_path / "vllm.rollout.json"
    broken.write_text("{half")
    rc, result = host_state(deployment_records={"config_dir": str(tmp_path), "name": "vllm"})
    assert rc == 1 and result["msg"].startswith("cannot read %s as JSON" % broken)


def test_the_rollback_target_comes_from_the_previous_record(host_state, tmp_path):
    records = {"config_dir": str(tmp_path), "name": "chat", "rollback_target": True}
    rc, result = host_state(deployment_records=records)
    assert rc == 0 and result["deployment_records"]["rollback_target"] is None  # nothing to roll back to
    previous = {"image": "vllm/vllm-openai:v0.26.0@sha256:" + "a" * 64, "model": "m/x", "model_revision": "c" * 40,
                "served_model_name": "x", "version": "v0.26.0", "args": ["--port", "8000"], "env": {}, "gpu_uuids": []}
    (tmp_path / "chat.deployment.previous.json").write_text(json.dumps(previous))
    rc, result = host_state(deployment_records=records)
    assert rc == 0 and result["deployment_records"]["rollback_target"]["image_tag"] == "v0.26.0"
    (tmp_path / "chat.deployment.previous.json").write_text(json.dumps({"image": "vllm/vllm-openai:v0.26.0"}))
    rc, result = host_state(deployment_records=records)
    assert rc == 1 and "lacks model, model_revision" in result["msg"]

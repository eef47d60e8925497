# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Reading `docker inspect`: missing objects are answers, other Docker errors are errors. The stderr lines are what
Docker 20.10.24 (this machine's engine, 2026-12-02) printed, and Docker 27's spelling of the same."""
from __future__ import annotations

import json

import pytest

from ansible_collections.onprem.vllm.plugins.module_utils import docker_inspect

MISSING_CONTAINERS = ("Error response from daemon: No such container: vllm\n"
                      "Error response from daemon: No such container: vllm-previous\n")
MISSING_IMAGE = "Error response from daemon: no such image: nonexist:1: No such image: nonexist:1\n"
NO_DAEMON = "Cannot connect to the Docker daemon at unix:///nonexist. Is the docker daemon running?\n"
SERVER = {"Id": "3f2a", "Name": "/vllm", "State": {"Running": True}}


def test_everything_missing_is_an_empty_answer():
    assert docker_inspect.found_objects(1, "[]\n", MISSING_CONTAINERS) == []
    assert docker_inspect.found_objects(1, "[]\n", MISSING_IMAGE) == []
    assert docker_inspect.found_objects(1, "[]\n", "Error: No such object: vllm\n") == []


def test_found_and_missing_together():
    objects = docker_inspect.found_objects(1, json.dumps([SERVER]),
                                           "Error response from daemon: No such container: vllm-previous\n")
    assert docker_inspect.containers_by_name(objects, ["vllm", "vllm-previous"]) == {
        "vllm": {"exists": True, "container": SERVER},
        "vllm-previous": {"exists": False, "container": None},
    }


def test_a_daemon_that_does_not_answer_is_an_error_not_a_missing_container():
    with pytest.raises(docker_inspect.InspectError, match="Is the docker daemon running"):
        docker_inspect.found_objects(1, "[]\n", NO_DAEMON)


def test_output_that_is_not_a_list_is_an_error():
    with pytest.raises(docker_inspect.InspectError, match="no JSON list"):
        docker_inspect.found_objects(0, "Template parsing error", "")
    with pytest.raises(docker_inspect.InspectError, match="not a list"):
        docker_inspect.found_objects(0, "{}", "")


def test_names_match_without_docker_s_leading_slash_and_only_exactly():
    objects = [dict(SERVER, Name="/vllm-previous")]
    assert docker_inspect.containers_by_name(objects, ["vllm"]) == {"vllm": {"exists": False, "container": None}}

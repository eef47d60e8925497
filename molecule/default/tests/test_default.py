"""Verify the engine docker_engine set up on each lab workstation, through the workstation itself."""
import json

import pytest

testinfra_hosts = ["ansible://all"]


def daemon_json(host):
    return json.loads(host.file("/etc/docker/daemon.json").content_string)


def test_docker_service_is_enabled_and_running(host):
    service = host.service("docker")
    assert service.is_enabled
    assert service.is_running


def test_daemon_json_has_the_keys_docker_engine_owns(host):
    config = daemon_json(host)
    assert config["live-restore"] is True
    assert config["log-driver"] == "json-file"
    assert config["log-opts"]["max-size"] == "50m"
    assert config["log-opts"]["max-file"] == "5"
    assert "default-runtime" not in config


def test_daemon_json_merge_kept_foreign_keys(host):
    config = daemon_json(host)
    assert config["runtimes"]["nvidia"]["path"] == "nvidia-container-runtime"
    assert config["log-opts"]["compress"] == "true"


def test_running_daemon_uses_the_merged_settings(host):
    info = json.loads(host.check_output("docker info --format '{{json .}}'"))
    assert info["LiveRestoreEnabled"] is True
    assert info["LoggingDriver"] == "json-file"
    assert "nvidia" in info["Runtimes"]


def test_engine_packages_are_held(host):
    held = host.check_output("apt-mark showhold").split()
    assert "docker.io" in held


@pytest.fixture(scope="module")
def nested_image(host):
    """An image made from the workstation's own root filesystem: no registry is needed (or reachable)."""
    tag = "lab/selfcopy:verify"
    if host.run(f"docker image inspect {tag}").rc != 0:
        host.check_output(
            "tar --one-file-system -C / -c --exclude=./var/lib/docker --exclude=./proc --exclude=./sys . "
            f"| docker import -c 'CMD [\"/bin/true\"]' - {tag}"
        )
    return tag


def test_nested_engine_runs_a_container_and_publishes_a_port(host, nested_image):
    host.run("docker rm -f verify-http")
    host.check_output(
        f"docker run -d --name verify-http -p 127.0.0.1:18080:8080 {nested_image} python3 -m http.server 8080"
    )
    try:
        body = host.check_output(
            "python3 -c 'import time, urllib.request as u\n"
            "for _ in range(50):\n"
            "    try:\n"
            "        print(u.urlopen(\"http://127.0.0.1:18080/etc/hostname\").read().decode()); break\n"
            "    except OSError: time.sleep(0.2)'"
        )
        assert body.strip()
    finally:
        host.run("docker rm -f verify-http")

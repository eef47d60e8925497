# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""What docker_engine + nvidia_driver + container_toolkit left on the lab workstation. The NVIDIA packages are the
TEST DOUBLES of molecule/gpu_stack/files/make_test_repo.py (empty, named and versioned like NVIDIA's)."""
import json

testinfra_hosts = ["ansible://all"]


def version(host, package):
    return host.check_output("dpkg-query -W -f='${Version}' %s" % package)


def test_cuda_repository_and_keyring(host):
    sources = host.file("/etc/apt/sources.list.d/nvidia-cuda.sources").content_string
    assert "URIs: http://127.0.0.1:8080/cuda/debian12/x86_64/" in sources
    assert "Signed-By: /usr/share/keyrings/cuda-archive-keyring.gpg" in sources
    assert host.file("/usr/share/keyrings/cuda-archive-keyring.gpg").is_file
    # cuda-keyring's own list (pointing at NVIDIA's servers on a real host) is replaced by the role's file.
    assert not host.file("/etc/apt/sources.list.d/cuda-debian12-x86_64.list").exists


def test_container_toolkit_repository_and_keyring(host):
    sources = host.file("/etc/apt/sources.list.d/nvidia-container-toolkit.sources").content_string
    assert "http://127.0.0.1:8080/libnvidia-container/stable/deb/$(ARCH)" in sources
    key = host.file("/etc/apt/keyrings/nvidia-container-toolkit.asc")
    assert key.is_file and "BEGIN PGP PUBLIC KEY BLOCK" in key.content_string


def test_branch_pin_and_fabric_manager_pin(host):
    prefs = host.file("/etc/apt/preferences.d/onprem-vllm-nvidia-driver").content_string
    assert "Pin: version 580.*" in prefs
    assert "Package: nvidia-fabricmanager\nPin: version 580.105.08-*\nPin-Priority: 1001" in prefs
    # The repository offers 590.44.01 too: the pin keeps the candidate on the branch.
    assert "Candidate: 580.105.08-1" in host.check_output("apt-cache policy nvidia-driver")


def test_driver_is_newest_of_branch_and_fabric_manager_matches_it(host):
    assert version(host, "nvidia-driver") == "580.105.08-1"
    assert version(host, "nvidia-kernel-open-dkms") == "580.105.08-1"  # open module (auto, no GPU)
    assert host.run("dpkg-query -W nvidia-kernel-dkms").rc != 0
    # 580.126.09 is offered and newer: Fabric Manager must still equal the driver.
    assert version(host, "nvidia-fabricmanager") == "580.105.08-1"


def test_toolkit_pinned_version(host):
    for package in ("nvidia-container-toolkit", "nvidia-container-toolkit-base", "libnvidia-container-tools",
                    "libnvidia-container1"):
        assert version(host, package) == "1.18.0-1"  # 1.18.1 is offered


def test_packages_are_held(host):
    held = set(host.check_output("apt-mark showhold").split())
    assert {"nvidia-driver", "nvidia-kernel-open-dkms", "nvidia-kernel-support", "nvidia-persistenced",
            "nvidia-fabricmanager", "nvidia-container-toolkit", "nvidia-container-toolkit-base",
            "libnvidia-container-tools", "libnvidia-container1", "docker.io"} <= held


def test_nouveau_blacklisted_and_initramfs_rebuilt_once(host):
    conf = host.file("/etc/modprobe.d/blacklist-nouveau.conf").content_string
    assert "blacklist nouveau" in conf and "options nouveau modeset=0" in conf
    # The update-initramfs TEST DOUBLE logs each call: once at converge, none at idempotence or check mode.
    calls = host.file("/var/log/test-double-update-initramfs.log").content_string.strip().splitlines()
    assert len(calls) == 1 and calls[0].endswith("-u -k all")


def test_services_enabled(host):
    assert host.service("nvidia-persistenced").is_enabled
    assert host.service("nvidia-fabricmanager").is_enabled


def test_daemon_json_has_the_toolkit_runtime_merged_by_its_owner(host):
    config = json.loads(host.file("/etc/docker/daemon.json").content_string)
    assert config["runtimes"]["nvidia"] == {"path": "nvidia-container-runtime", "args": []}
    assert config["live-restore"] is True and config["log-driver"] == "json-file"
    assert config["log-opts"] == {"max-size": "50m", "max-file": "5"}
    assert "default-runtime" not in config


def test_running_daemon_knows_the_nvidia_runtime_but_keeps_runc_default(host):
    info = json.loads(host.check_output("docker info --format '{{json .}}'"))
    assert "nvidia" in info["Runtimes"]
    assert info["DefaultRuntime"] == "runc"


def test_cdi_spec_generated_once_for_the_installed_driver(host):
    assert "TEST DOUBLE CDI spec" in host.file("/etc/cdi/nvidia.yaml").content_string
    assert host.file("/etc/cdi/.onprem-vllm-nvidia-driver").content_string == "loaded= installed=580.105.08\n"
    assert len(host.file("/var/log/test-double-nvidia-ctk.log").content_string.split()) == 1

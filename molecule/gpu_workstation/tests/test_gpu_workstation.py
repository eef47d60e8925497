# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""What site.yml left on a bare lab workstation that took the GPU path: the TEST DOUBLE driver pinned and held, the
nvidia runtime registered but not the default, the vLLM container with both replayed GPUs in its device requests
and the NCCL setting GPU preflight chose for consumer cards without P2P, the model commit hf_cache resolved from
`main`, and a server that answers."""
import json

testinfra_hosts = ["ansible://all"]

UUIDS = ["GPU-00000000-0000-4000-8000-000000000001", "GPU-00000000-0000-4000-8000-000000000002"]
COMMIT = "d77141a471636dda364651d872c8e1075b8947d5"


def test_driver_branch_pinned_and_held(host):
    assert host.check_output("dpkg-query -W -f='${Version}' nvidia-driver").startswith("580.")
    assert "Pin: version 580.*" in host.file("/etc/apt/preferences.d/onprem-vllm-nvidia-driver").content_string
    assert "nvidia-driver" in host.check_output("apt-mark showhold").split()


def test_replaying_nvidia_smi_says_test_double(host):
    out = host.run("nvidia-smi -L")
    assert out.rc == 0 and "TEST DOUBLE" in out.stderr
    assert [line.split("UUID: ")[1].rstrip(")") for line in out.stdout.splitlines()] == UUIDS


def test_nvidia_runtime_registered_not_default(host):
    daemon = json.loads(host.file("/etc/docker/daemon.json").content_string)
    assert daemon["runtimes"]["nvidia"]["path"] == "nvidia-container-runtime"
    assert "default-runtime" not in daemon
    info = json.loads(host.check_output("docker info --format '{{json .}}'"))
    assert info["DefaultRuntime"] == "runc" and "nvidia" in info["Runtimes"]


def test_container_requests_both_gpus_with_the_nccl_env(host):
    inspect = json.loads(host.check_output("docker inspect vllm"))[0]
    (request,) = inspect["HostConfig"]["DeviceRequests"]
    assert request["Driver"] == "nvidia" and request["DeviceIDs"] == UUIDS and request["Capabilities"] == [["gpu"]]
    assert "NCCL_P2P_DISABLE=1" in inspect["Config"]["Env"]
    args = inspect["Config"]["Cmd"] or inspect["Args"]
    assert args[args.index("--tensor-parallel-size") + 1] == "2"
    assert args[args.index("--revision") + 1] == COMMIT
    assert inspect["State"]["Health"]["Status"] == "healthy"


def test_runtime_hook_ran_for_the_container(host):
    assert "TEST DOUBLE nvidia-container-runtime-hook prestart" in host.file("/var/log/test-double-nvidia-hook.log").content_string


def test_deployment_record_holds_the_gpus_and_the_commit(host):
    record = json.loads(host.file("/etc/onprem-vllm/vllm.deployment.json").content_string)
    assert record["gpu_uuids"] == UUIDS
    assert record["model_revision"] == COMMIT and record["model"] == "onprem-lab/tiny-qwen3"


def test_server_answers(host):
    out = host.check_output(
        "curl -sf -H \"Authorization: Bearer $(cat /etc/onprem-vllm/vllm.secrets/api-key)\" "
        "-H 'Content-Type: application/json' -d '{\"model\": \"qwen3-lab\", \"max_tokens\": 2, "
        "\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}]}' http://127.0.0.1:8000/v1/chat/completions")
    assert json.loads(out)["usage"]["completion_tokens"] >= 1

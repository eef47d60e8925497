"""What the vllm_server role left on each workstation after deploy, upgrade and a rolled-back upgrade."""
import json
import time

import pytest

testinfra_hosts = ["ansible://vllm_servers"]


@pytest.fixture(scope="module")
def container(host):
    return json.loads(host.check_output("docker inspect vllm"))[0]


@pytest.fixture(scope="module")
def api_key(host):
    key = host.file("/etc/onprem-vllm/vllm.secrets/api-key").content_string.strip()
    assert len(key) >= 16
    return key


def test_the_rolled_back_server_is_the_upgraded_one(host, container):
    assert container["Config"]["Image"] == "vllm/vllm-openai:v0.32.0-lab2"
    # Docker checks every interval (15 s): a server restored moments ago may not have had its first check yet (the
    # gate ran the check's command itself).
    deadline = time.monotonic() + 40
    while (health := host.check_output("docker inspect -f '{{.State.Health.Status}}' vllm")) == "starting" \
            and time.monotonic() < deadline:
        time.sleep(2)
    assert container["State"]["Running"] and health == "healthy"


def test_no_server_is_left_set_aside(host):
    assert host.run("docker inspect vllm-previous").rc != 0


def test_restart_policy_and_log_rotation(container):
    assert container["HostConfig"]["RestartPolicy"]["Name"] == "unless-stopped"
    log = container["HostConfig"]["LogConfig"]
    assert log["Type"] == "json-file"
    assert (log["Config"]["max-size"], log["Config"]["max-file"]) == ("50m", "5")


def test_published_on_loopback_only(container):
    bindings = container["HostConfig"]["PortBindings"]["8000/tcp"]
    assert bindings == [{"HostIp": "127.0.0.1", "HostPort": "8000"}]


def test_host_ipc_offline_hub_and_cpu_kv_space(container):
    env = dict(item.split("=", 1) for item in container["Config"]["Env"])
    assert container["HostConfig"]["IpcMode"] == "host"
    assert env["HF_HUB_OFFLINE"] == "1" and env["VLLM_CPU_KVCACHE_SPACE"] == "1"


def test_secret_files_are_private(host):
    assert host.file("/etc/onprem-vllm").mode == 0o700
    assert host.file("/etc/onprem-vllm/vllm.secrets/api-key").mode == 0o600
    assert host.file("/etc/onprem-vllm/vllm.deployment.json").mode == 0o600


def test_api_key_is_not_a_process_argument(host, container, api_key):
    assert api_key not in host.check_output("ps -eo args")
    assert api_key not in " ".join(container["Args"] + container["Config"]["Cmd"])
    assert api_key not in " ".join(container["Config"]["Env"])


def test_api_key_is_not_in_the_server_log(host, api_key):
    log = host.check_output("docker logs vllm 2>&1")
    assert "Application startup complete" in log  # the log is really there
    assert api_key not in log


def test_the_key_is_enforced(host, api_key):
    probe = ("python3 -c \"import urllib.request as u, sys; r = u.Request('http://127.0.0.1:8000/v1/models', "
             "headers={'Authorization': 'Bearer ' + sys.argv[1]}); print(u.urlopen(r).status)\" ")
    assert host.check_output(probe + api_key) == "200"
    assert host.run(probe + "wrong-key").rc != 0


def logged_kv_tokens(log):
    """N of the last `CPU KV cache size: N tokens` line of a vLLM server log."""
    line = [entry for entry in log.splitlines() if " KV cache size: " in entry][-1]
    return int(line.split(" KV cache size: ", 1)[1].split(" tokens", 1)[0].replace(",", ""))


def test_the_record_holds_the_kv_plan_and_what_vllm_allocated_and_they_agree(host):
    """vllm_server's KV check after the gate: predicted (the preflight's plan) against /metrics' cache config."""
    for name in ("vllm.deployment.json", "vllm.deployment.previous.json"):  # the upgrade's and site.yml's
        kv = json.loads(host.file("/etc/onprem-vllm/" + name).content_string)["kv_cache"]
        predicted, actual = kv["predicted"], kv["actual"]
        assert predicted["kv_cache_tokens"] == actual["kv_cache_tokens"] > 0
        # the CPU backend's blocks hold 128 tokens, the plan counts 16-token blocks: the same tokens either way
        assert actual["num_gpu_blocks"] * actual["block_size"] == predicted["num_gpu_blocks"] * 16
        assert predicted["max_concurrency"] == actual["max_concurrency"] and predicted["max_model_len"] == 2048
        assert kv["difference_tokens"] == 0 and kv["within_limit"] is True
        # VLLM_CPU_KVCACHE_SPACE=1 is the pool vLLM's CPU platform pins
        assert actual["kv_cache_memory_bytes"] == predicted["available_kv_cache_bytes"] == 1 << 30
    # what /metrics said is what the server logged at startup
    assert actual["kv_cache_tokens"] == logged_kv_tokens(host.check_output("docker logs vllm 2>&1"))


def test_deployment_records_for_rollback(host):
    current = json.loads(host.file("/etc/onprem-vllm/vllm.deployment.json").content_string)
    previous = json.loads(host.file("/etc/onprem-vllm/vllm.deployment.previous.json").content_string)
    assert current["image"] == "vllm/vllm-openai:v0.32.0-lab2"
    assert previous["image"] == "vllm/vllm-openai:v0.32.0"
    assert "VLLM_API_KEY" not in json.dumps(current)
